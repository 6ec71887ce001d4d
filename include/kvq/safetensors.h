/*
 * kvq/safetensors.h — safetensors reader (mmap, zero-copy) and streaming writer.
 *
 * File layout: u64 little-endian header length N, N bytes of UTF-8 JSON header
 * ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {"key": "string value", ...}}), then the data section; offsets are
 * relative to the start of the data section.
 *
 * The reader validates everything before handing out a view, and reports the first
 * problem found, checking in this order:
 *   1. file shorter than 8 bytes, or than 8 + N            KVQ_E_TRUNCATED_HEADER
 *      (N > KVQ_ST_MAX_HEADER is checked first:            KVQ_E_TOO_LARGE)
 *   2. header not valid UTF-8                              KVQ_E_BAD_UTF8
 *   3. header not strict JSON (raw control characters, bad escapes, malformed
 *      numbers, trailing non-whitespace), not an object, an entry that is not
 *      {"dtype": string, "shape": [ints], "data_offsets": [begin, end]} (unknown keys
 *      included), a negative or fractional dim or offset, __metadata__ not an
 *      object of strings                                   KVQ_E_BAD_JSON
 *      "\u0000" in a string (names are C strings)          KVQ_E_UNSUPPORTED
 *   4. per tensor, in header order: unknown dtype (named) or ndim > KVQ_MAX_DIMS
 *                                                          KVQ_E_UNSUPPORTED
 *      a dim or offset >= 2^53 (the JSON integer limit), or shape x dtype size
 *      overflows                                           KVQ_E_TOO_LARGE
 *      begin > end                                         KVQ_E_CORRUPT
 *      shape x dtype size != end - begin                   KVQ_E_SHAPE_MISMATCH
 *   5. duplicate tensor names or __metadata__ keys         KVQ_E_CORRUPT
 *   6. layout: tensors sorted by (begin, end) must tile [0, T) with no hole:
 *      a tensor starting before the previous one's end     KVQ_E_OVERLAP
 *      (a zero-size tensor inside another tensor counts as overlapping)
 *      a hole before a tensor that ends past the data section
 *                                                          KVQ_E_OUT_OF_BOUNDS
 *      any other hole before a tensor                      KVQ_E_CORRUPT
 *   7. the tiled size T against the data section size D = file size - 8 - N:
 *      T > D: the file ends before the data it promises    KVQ_E_TRUNCATED_DATA
 *      T < D: unreferenced bytes after the last tensor     KVQ_E_CORRUPT
 * Leading/trailing JSON whitespace (the writer's space padding) is accepted.
 * Numbers are parsed as doubles, so an integral value written as 16.0 or 1.6e1 is
 * accepted. Tensor views point into the mapping: they stay valid until close.
 *
 * Cost: open reads only the header (the data pages are not touched); memory is the
 * parsed JSON tree while opening (a few tens of bytes per JSON value) and, kept until
 * close, one view per tensor plus a copy of the names and metadata strings.
 */
#ifndef KVQ_SAFETENSORS_H
#define KVQ_SAFETENSORS_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/safetensors.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include "kvq/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_MAX_DIMS 8
#define KVQ_ST_MAX_HEADER (100u << 20) /* 100 MiB, as the reference implementation */

typedef enum kvq_dtype {
    KVQ_DT_BOOL = 0,
    KVQ_DT_U8, KVQ_DT_I8,
    KVQ_DT_F8_E4M3, KVQ_DT_F8_E5M2, /* readable and viewable; no arithmetic in kvq */
    KVQ_DT_I16, KVQ_DT_U16, KVQ_DT_F16, KVQ_DT_BF16,
    KVQ_DT_I32, KVQ_DT_U32, KVQ_DT_F32,
    KVQ_DT_I64, KVQ_DT_U64, KVQ_DT_F64,
    KVQ_DT_COUNT
} kvq_dtype;

size_t kvq_dtype_size(kvq_dtype t);             /* bytes per element */
const char *kvq_dtype_name(kvq_dtype t);        /* "F32" as in the format */
/* Parses a format dtype name; returns 0 and sets *t, or -1 if unknown. */
int kvq_dtype_from_name(const char *name, kvq_dtype *t);

typedef struct kvq_tensor_view {
    const char *name;           /* NUL-terminated, owned by the file handle */
    kvq_dtype dtype;
    int ndim;                   /* 0 = scalar */
    int64_t shape[KVQ_MAX_DIMS];
    const void *data;           /* into the mapping; may be unaligned for dtype */
    size_t nbytes;
    uint64_t offset;            /* begin offset within the data section */
} kvq_tensor_view;

/* ---- reader ------------------------------------------------------------------ */
typedef struct kvq_st kvq_st;

/* Maps and validates `path`. Errors: NOT_FOUND, IO, TRUNCATED_HEADER, TOO_LARGE,
 * BAD_UTF8, BAD_JSON, UNSUPPORTED (dtype), SHAPE_MISMATCH, OUT_OF_BOUNDS, OVERLAP,
 * TRUNCATED_DATA, CORRUPT. Messages start with "path: ". */
kvq_status kvq_st_open(const char *path, kvq_st **out, kvq_err *err);
/* The same over caller-owned memory (not copied: keep it alive until close).
 * `label` names the source in messages. */
kvq_status kvq_st_open_memory(const void *data, size_t size, const char *label, kvq_st **out,
                              kvq_err *err);
void kvq_st_close(kvq_st *st); /* NULL is fine */

size_t kvq_st_count(const kvq_st *st);
/* Tensors in data-offset order. */
const kvq_tensor_view *kvq_st_tensor(const kvq_st *st, size_t i);
const kvq_tensor_view *kvq_st_find(const kvq_st *st, const char *name); /* NULL if absent */

/* __metadata__ (string -> string), in key order. */
size_t kvq_st_meta_count(const kvq_st *st);
const char *kvq_st_meta_key(const kvq_st *st, size_t i);
const char *kvq_st_meta_value(const kvq_st *st, size_t i);
const char *kvq_st_meta_get(const kvq_st *st, const char *key); /* NULL if absent */

/* Bytes before the data section: 8 + N (the length field and the JSON header,
 * padding included). The file size is kvq_st_header_size + kvq_st_data_size. */
size_t kvq_st_header_size(const kvq_st *st);
/* Size of the data section in bytes (== the end offset of the last tensor). */
size_t kvq_st_data_size(const kvq_st *st);

/* ---- writer --------------------------------------------------------------------
 * Declare every tensor (and metadata), begin, then write each tensor's bytes in
 * declaration order (a tensor may be written in several chunks), then finish.
 * Output bytes depend only on the declarations, metadata and data: tensors are laid
 * out in declaration order, metadata keys sorted, the header padded with spaces to a
 * multiple of 8 (the JSON is compact: {"__metadata__":{..},"name":{"dtype":"F32",
 * "shape":[2,2],"data_offsets":[0,16]},..}; __metadata__ only when set). File output
 * goes to a temporary name renamed by finish; free without finish removes it.
 *
 * Errors (the writer stays usable after each INVALID_ARG; nothing is written):
 *   declare: NULL name, name "__metadata__", not UTF-8, declared twice, bad dtype,
 *            ndim outside [0, KVQ_MAX_DIMS], negative dim             INVALID_ARG
 *            a dim >= 2^53, or the data section would reach 2^53 bytes   TOO_LARGE
 *   set_meta: key or value not UTF-8 (setting a key again replaces it) INVALID_ARG
 *   declare/set_meta after begin, begin twice, write before begin
 *   or after finish, finish twice                                      INVALID_ARG
 *   begin: header over KVQ_ST_MAX_HEADER TOO_LARGE; file: EXISTS, IO; buffer: NOMEM
 *   write: more bytes than the declarations have left                  INVALID_ARG
 *   finish: fewer bytes written than declared (message names the tensor) INVALID_ARG
 *   an I/O failure in write/finish is sticky: later calls return it again.
 * Cost: declare is O(1) (hashed names); buffer mode holds the whole file in memory,
 * file mode only the header. */
typedef struct kvq_st_writer kvq_st_writer;

/* Records XXH64 of the data section in the metadata key KVQ_ST_META_DATA_XXH64
 * ("xxh64:<16 hex>"; call before begin). Every reader (kvq_st_open, _open_memory)
 * verifies a file that records it: KVQ_E_CHECKSUM naming the file on a mismatch. */
#define KVQ_ST_META_DATA_XXH64 "data.xxh64"
kvq_status kvq_st_writer_checksum(kvq_st_writer *w, kvq_err *err);

kvq_st_writer *kvq_st_writer_new(void); /* NULL on out of memory */
void kvq_st_writer_free(kvq_st_writer *w);
kvq_status kvq_st_writer_declare(kvq_st_writer *w, const char *name, kvq_dtype dtype, int ndim,
                                 const int64_t *shape, kvq_err *err);
kvq_status kvq_st_writer_set_meta(kvq_st_writer *w, const char *key, const char *value,
                                  kvq_err *err);
kvq_status kvq_st_writer_begin_file(kvq_st_writer *w, const char *path, int overwrite,
                                    kvq_err *err);
kvq_status kvq_st_writer_begin_buffer(kvq_st_writer *w, kvq_err *err);
kvq_status kvq_st_writer_write(kvq_st_writer *w, const void *data, size_t nbytes, kvq_err *err);
kvq_status kvq_st_writer_finish(kvq_st_writer *w, kvq_err *err);
/* Buffer mode, after finish: the serialized bytes (owned by the writer, valid until
 * free). NULL (and *size = 0) in file mode or before a successful finish. */
const void *kvq_st_writer_buffer(const kvq_st_writer *w, size_t *size);

#ifdef __cplusplus
}
#endif
#endif
