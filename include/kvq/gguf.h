/*
 * kvq/gguf.h — GGUF reader (versions 2 and 3) and a small writer.
 *
 * Layout: magic "GGUF", u32 version, u64 tensor count, u64 metadata count, the
 * metadata key/values, the tensor infos (name, n_dims, ne[], ggml type, offset), then
 * padding to general.alignment (default 32) and the tensor data. Little-endian only
 * (a big-endian file fails with KVQ_E_UNSUPPORTED).
 *
 * Every count and length is checked against the bytes remaining before anything is
 * allocated. Strings are copied into NUL-terminated storage owned by the handle;
 * tensor data is a zero-copy view into the mapping.
 */
#ifndef KVQ_GGUF_H
#define KVQ_GGUF_H

#include "kvq/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvq_gguf_type {
    KVQ_GGUF_UINT8 = 0, KVQ_GGUF_INT8 = 1, KVQ_GGUF_UINT16 = 2, KVQ_GGUF_INT16 = 3,
    KVQ_GGUF_UINT32 = 4, KVQ_GGUF_INT32 = 5, KVQ_GGUF_FLOAT32 = 6, KVQ_GGUF_BOOL = 7,
    KVQ_GGUF_STRING = 8, KVQ_GGUF_ARRAY = 9, KVQ_GGUF_UINT64 = 10, KVQ_GGUF_INT64 = 11,
    KVQ_GGUF_FLOAT64 = 12
} kvq_gguf_type;

const char *kvq_gguf_type_name(kvq_gguf_type t); /* "u32", "str", "arr", ... */

typedef struct kvq_gguf_value {
    kvq_gguf_type type;
    union {
        uint64_t u;       /* UINT8..UINT64 and BOOL */
        int64_t i;        /* INT8..INT64 */
        double f;         /* FLOAT32, FLOAT64 */
        struct { const char *s; uint64_t len; } str;               /* NUL-terminated too */
        struct { kvq_gguf_type type; uint64_t n; const struct kvq_gguf_value *items; } arr;
    } v;
} kvq_gguf_value;

typedef struct kvq_gguf_kv {
    const char *key;
    kvq_gguf_value value;
} kvq_gguf_kv;

/* ggml tensor types kvq knows by name. Only F32, F16, BF16 and Q8_0 convert. */
enum {
    KVQ_GGML_F32 = 0, KVQ_GGML_F16 = 1, KVQ_GGML_Q4_0 = 2, KVQ_GGML_Q4_1 = 3,
    KVQ_GGML_Q5_0 = 6, KVQ_GGML_Q5_1 = 7, KVQ_GGML_Q8_0 = 8, KVQ_GGML_Q8_1 = 9,
    KVQ_GGML_Q2_K = 10, KVQ_GGML_Q3_K = 11, KVQ_GGML_Q4_K = 12, KVQ_GGML_Q5_K = 13,
    KVQ_GGML_Q6_K = 14, KVQ_GGML_Q8_K = 15, KVQ_GGML_BF16 = 30
};
/* Name of a ggml type ("Q8_0"), or NULL for an id kvq does not know. */
const char *kvq_ggml_type_name(uint32_t type);

typedef struct kvq_gguf_tensor {
    const char *name;
    uint32_t ndim;          /* 1..4 */
    int64_t ne[4];          /* ne[0] is the contiguous dimension; unused dims are 1 */
    uint32_t type;          /* ggml type id */
    uint64_t offset;        /* relative to the data section */
    size_t nbytes;
    const void *data;       /* view into the mapping */
} kvq_gguf_tensor;

typedef struct kvq_gguf kvq_gguf;

/* Errors: NOT_FOUND, IO, BAD_MAGIC, VERSION (not 2 or 3), TRUNCATED_HEADER,
 * TOO_LARGE, BAD_UTF8, CORRUPT (bad value type, duplicate key or tensor, bad ndim,
 * misaligned offset), UNSUPPORTED (unknown ggml type id, big-endian), OUT_OF_BOUNDS,
 * OVERLAP, TRUNCATED_DATA. A split (sharded) file fails with UNSUPPORTED. */
kvq_status kvq_gguf_open(const char *path, kvq_gguf **out, kvq_err *err);
kvq_status kvq_gguf_open_memory(const void *data, size_t size, const char *label,
                                kvq_gguf **out, kvq_err *err);
void kvq_gguf_close(kvq_gguf *g);

uint32_t kvq_gguf_version(const kvq_gguf *g);
uint64_t kvq_gguf_alignment(const kvq_gguf *g);
uint64_t kvq_gguf_data_offset(const kvq_gguf *g); /* file offset of the data section */

size_t kvq_gguf_kv_count(const kvq_gguf *g);
const kvq_gguf_kv *kvq_gguf_kv_at(const kvq_gguf *g, size_t i);      /* file order */
const kvq_gguf_value *kvq_gguf_get(const kvq_gguf *g, const char *key); /* NULL if absent */
/* Typed getters: 0 on success, -1 if absent or of an incompatible type.
 * get_u64 accepts any non-negative integer, get_f64 any integer or float. */
int kvq_gguf_get_u64(const kvq_gguf *g, const char *key, uint64_t *out);
int kvq_gguf_get_f64(const kvq_gguf *g, const char *key, double *out);
const char *kvq_gguf_get_str(const kvq_gguf *g, const char *key); /* NULL if absent */

size_t kvq_gguf_tensor_count(const kvq_gguf *g);
const kvq_gguf_tensor *kvq_gguf_tensor_at(const kvq_gguf *g, size_t i); /* file order */
const kvq_gguf_tensor *kvq_gguf_find_tensor(const kvq_gguf *g, const char *name);

/* Converts rows [row0, row0 + nrows) of t (rows of ne[0] elements) to f32.
 * F32/F16/BF16/Q8_0; other types: KVQ_E_UNSUPPORTED naming the type. */
kvq_status kvq_gguf_rows_to_f32(const kvq_gguf_tensor *t, int64_t row0, int64_t nrows,
                                float *out, kvq_err *err);

/* Q8_0 blocks (32 values: f16 scale d, 32 x int8 q; value = d * q) to f32.
 * n must be a multiple of 32. The _ref version is the specification. */
void kvq_dequant_q8_0_ref(const void *blocks, float *out, size_t n);
void kvq_dequant_q8_0(const void *blocks, float *out, size_t n);
/* f32 -> Q8_0 (for writing test models): d = max|x| / 127, q = round(x / d). */
void kvq_quant_q8_0_ref(const float *in, void *blocks, size_t n);

/* ---- writer (tests, fuzz round trips, model conversion) ---------------------------
 * Collect metadata and tensors, then write a version-3 file atomically. Tensor data
 * is copied. */
typedef struct kvq_gguf_writer kvq_gguf_writer;
kvq_gguf_writer *kvq_gguf_writer_new(void);
void kvq_gguf_writer_free(kvq_gguf_writer *w);
kvq_status kvq_gguf_writer_set(kvq_gguf_writer *w, const char *key, const kvq_gguf_value *v,
                               kvq_err *err); /* deep copy; arrays may nest */
kvq_status kvq_gguf_writer_add_tensor(kvq_gguf_writer *w, const char *name, uint32_t type,
                                      uint32_t ndim, const int64_t *ne, const void *data,
                                      size_t nbytes, kvq_err *err);
kvq_status kvq_gguf_writer_write(kvq_gguf_writer *w, const char *path, int overwrite,
                                 kvq_err *err);
/* Serializes to a malloc'd buffer (free()). */
kvq_status kvq_gguf_writer_to_buffer(kvq_gguf_writer *w, void **data, size_t *size,
                                     kvq_err *err);

#ifdef __cplusplus
}
#endif
#endif
