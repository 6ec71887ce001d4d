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
 *
 * The size rule. A count or length n (key/value count, tensor count, string length,
 * array length) is checked as soon as it is read, assuming each item takes at least
 * its minimum encoded size m (1 byte for u8, 8 for a string, 12 for an array, 14 for
 * a key/value, 33 for a tensor info):
 *   n * m > 2^48 (or overflows)      -> KVQ_E_TOO_LARGE: the number itself is absurd
 *   n * m > bytes left in the file   -> KVQ_E_TRUNCATED_HEADER: the file was cut short
 * so a string length of 2^60 fails before any allocation, and a file cut anywhere
 * inside its header fails with TRUNCATED_HEADER whatever the cut point. Allocations
 * are therefore bounded by a small multiple of the file size (at most 32 bytes of
 * kvq_gguf_value per byte of array data). Arrays may nest KVQ_GGUF_MAX_NESTING deep;
 * deeper is KVQ_E_TOO_LARGE. A tensor shape whose element count overflows int64, or
 * whose byte size exceeds 2^48, is KVQ_E_TOO_LARGE.
 *
 * The data-section rule. Tensors may appear in any order and with gaps, but each must
 * start at a multiple of the alignment (else KVQ_E_CORRUPT) and no two may share a
 * byte (KVQ_E_OVERLAP; empty tensors overlap nothing). Taken in offset order, a
 * tensor that runs past the end of the file is KVQ_E_OUT_OF_BOUNDS when it starts
 * past the end after a gap (its offset points nowhere), and KVQ_E_TRUNCATED_DATA
 * otherwise (the file was cut inside the data or its padding). Bytes after the last
 * tensor are allowed.
 *
 * Metadata values are not checked for UTF-8 (tokenizer vocabularies hold arbitrary
 * bytes; use str.len); keys and tensor names must be non-empty UTF-8 without NUL
 * bytes (KVQ_E_BAD_UTF8 / KVQ_E_CORRUPT). A bool must be 0 or 1 (else CORRUPT).
 * general.alignment, when present, must be an integer that is a non-zero power of two
 * no larger than 2^31 (else KVQ_E_CORRUPT). split.count > 1 is KVQ_E_UNSUPPORTED.
 * Version 2 and 3 files have the same little-endian layout; version 1 (32-bit counts)
 * and versions above 3 are KVQ_E_VERSION; a version field whose low 16 bits are zero
 * (a byte-swapped 2 or 3) is taken as big-endian and is KVQ_E_UNSUPPORTED.
 */
#ifndef KVQ_GGUF_H
#define KVQ_GGUF_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/gguf.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

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

#define KVQ_GGUF_DEFAULT_ALIGNMENT 32
#define KVQ_GGUF_MAX_NESTING 16 /* arrays of arrays, deepest accepted level */

/* ggml tensor types kvq knows by name. F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q2_K, Q3_K, Q4_K, Q5_K and Q6_K convert and compute (kvq/quant.h). The
 * name table also knows ggml's IQ*, TQ*, MXFP4 types (ids 16..23, 29, 34, 35, 39)
 * with their block sizes, so files holding them open and can be listed. */
enum {
    KVQ_GGML_F32 = 0, KVQ_GGML_F16 = 1, KVQ_GGML_Q4_0 = 2, KVQ_GGML_Q4_1 = 3,
    KVQ_GGML_Q5_0 = 6, KVQ_GGML_Q5_1 = 7, KVQ_GGML_Q8_0 = 8, KVQ_GGML_Q8_1 = 9,
    KVQ_GGML_Q2_K = 10, KVQ_GGML_Q3_K = 11, KVQ_GGML_Q4_K = 12, KVQ_GGML_Q5_K = 13,
    KVQ_GGML_Q6_K = 14, KVQ_GGML_Q8_K = 15, KVQ_GGML_I8 = 24, KVQ_GGML_I16 = 25,
    KVQ_GGML_I32 = 26, KVQ_GGML_I64 = 27, KVQ_GGML_F64 = 28, KVQ_GGML_BF16 = 30
};
/* Name of a ggml type ("Q8_0"), or NULL for an id kvq does not know. */
const char *kvq_ggml_type_name(uint32_t type);
/* Block layout of a ggml type: elements per block (1 for F32/F16/BF16, 32 for Q4_0..Q8_0,
 * 256 for the K types) and bytes per block. 0 if known, -1 (outputs untouched) if not. */
int kvq_ggml_type_layout(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes);

typedef struct kvq_gguf_tensor {
    const char *name;
    uint32_t ndim;          /* 1..4 */
    int64_t ne[4];          /* ne[0] is the contiguous dimension; unused dims are 1 */
    uint32_t type;          /* ggml type id */
    uint64_t offset;        /* relative to the data section */
    size_t nbytes;
    const void *data;       /* view into the mapping */
} kvq_gguf_tensor;

/* Rows of a tensor: ne[1] * ne[2] * ne[3] (-1 if that overflows). */
int64_t kvq_gguf_tensor_rows(const kvq_gguf_tensor *t);

typedef struct kvq_gguf kvq_gguf;

/* Errors: NOT_FOUND, IO, BAD_MAGIC, VERSION (not 2 or 3), TRUNCATED_HEADER,
 * TOO_LARGE, BAD_UTF8, CORRUPT (bad value type, bad bool, duplicate key or tensor,
 * bad ndim, empty name, misaligned offset, bad general.alignment, ne[0] not a multiple
 * of the type's block size), UNSUPPORTED (unknown ggml type id, big-endian, split),
 * OUT_OF_BOUNDS, OVERLAP, TRUNCATED_DATA, NOMEM. The message names the file (or
 * `label`), the offset or key/tensor, and the problem. See the rules above.
 * Cost: one pass over the header, O(kv + tensors) memory on top of the strings and
 * arrays; tensor data is not read. open maps the file (read-only); open_memory reads
 * `data`, which must stay valid and unchanged until kvq_gguf_close (label may be NULL).
 * The handle is immutable after opening and may be shared between threads. */
kvq_status kvq_gguf_open(const char *path, kvq_gguf **out, kvq_err *err);
kvq_status kvq_gguf_open_memory(const void *data, size_t size, const char *label,
                                kvq_gguf **out, kvq_err *err);
void kvq_gguf_close(kvq_gguf *g); /* NULL is fine; every pointer it handed out dies */

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
/* 1 if a and b have the same type and value (arrays element by element, floats bit
 * for bit, so NaN payloads count), else 0. */
int kvq_gguf_value_equal(const kvq_gguf_value *a, const kvq_gguf_value *b);

size_t kvq_gguf_tensor_count(const kvq_gguf *g);
const kvq_gguf_tensor *kvq_gguf_tensor_at(const kvq_gguf *g, size_t i); /* file order */
const kvq_gguf_tensor *kvq_gguf_find_tensor(const kvq_gguf *g, const char *name);

/* Converts rows [row0, row0 + nrows) of t (rows of ne[0] elements) to f32.
 * out: [nrows, ne[0]] floats. Every type kvq_quant_supported() accepts (fast paths,
 * equal bit for bit to the scalar references of kvq/quant.h); other types:
 * KVQ_E_UNSUPPORTED naming the type. Rows outside
 * the tensor: KVQ_E_INVALID_ARG. Works for any data alignment. */
kvq_status kvq_gguf_rows_to_f32(const kvq_gguf_tensor *t, int64_t row0, int64_t nrows,
                                float *out, kvq_err *err);

/* Q8_0 blocks (32 values: f16 scale d, 32 x int8 q; value = d * q) to f32.
 * n must be a multiple of 32 (a partial last block is ignored). blocks: n / 32 blocks
 * of 34 bytes, any alignment; out: [n]. The _ref version is the specification; the
 * other picks AVX-512 / AVX2 at run time and gives the same bits. */
void kvq_dequant_q8_0_ref(const void *blocks, float *out, size_t n);
void kvq_dequant_q8_0(const void *blocks, float *out, size_t n);
/* f32 -> Q8_0 (for writing test models): d = max|x| / 127 (f32, stored as f16),
 * q = round-half-away(x / d) clamped to [-127, 127]; an all-zero block gets d = 0.
 * A block holding NaN or Inf gets a NaN scale and zero quants (it reads back as NaN).
 * |x| beyond about 8.3e6 overflows the f16 scale to Inf. */
void kvq_quant_q8_0_ref(const float *in, void *blocks, size_t n);

/* ---- writer (tests, fuzz round trips, model conversion) ---------------------------
 * Collect metadata and tensors, then write a version-3 file atomically. Tensor data
 * is copied. Output is deterministic: keys and tensors in insertion order (setting an
 * existing key replaces its value in place), tensor data packed in insertion order,
 * each tensor padded with zeros to the alignment (general.alignment if set, a u32
 * power of two; else 32). FLOAT32 values are stored from the double with one rounding;
 * NaN payloads are kept bit-exact, so a file read and rewritten gives the same bytes.
 * Errors: INVALID_ARG (empty key or name, value out of range for its type, array item
 * of the wrong type, duplicate tensor, bad ndim or negative ne), BAD_UTF8 (key or
 * name), UNSUPPORTED (unknown ggml type), SHAPE_MISMATCH (nbytes does not match
 * shape and type, or ne[0] not a multiple of the block size), NOMEM, IO, EXISTS. */
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
