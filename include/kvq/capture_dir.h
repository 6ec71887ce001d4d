/*
 * kvq/capture_dir.h — reading a capture directory's capture.json (docs/capture.md).
 *
 * A capture directory holds capture.json (model identity, corpus provenance, token
 * counts, the list of layer files) and one safetensors file per captured layer. This
 * header gives the parsed capture.json as a plain struct and the reader of one layer
 * file (kvq_capture_layer, calib/capture_layer.c). The model identity it records is
 * kvq_model_id (kvq/model_id.h).
 *
 * The capture engineer's writer produces the same JSON; this side only reads.
 */
#ifndef KVQ_CAPTURE_DIR_H
#define KVQ_CAPTURE_DIR_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/capture_dir.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include "kvq/common.h"
#include "kvq/model_id.h"
#include "kvq/rope.h"
#include "kvq/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_CAPTURE_FORMAT "kvq-capture"
#define KVQ_CAPTURE_VERSION 2 /* 2: model.attention; version 1 files are read too */
#define KVQ_CAPTURE_JSON "capture.json"
#define KVQ_CAPTURE_MAX_JSON (64u << 20) /* capture.json larger than 64 MiB is refused */
#define KVQ_CAPTURE_MAX_LAYERS 65536     /* model.n_layers above this is refused */


/* Parsed capture.json. Owned by the caller of kvq_capture_info_read; free with
 * kvq_capture_info_free. Every array has the length stated next to it. */
typedef struct kvq_capture_info {
    char *dir;                /* the directory as given (malloc'd) */
    int32_t version;          /* KVQ_CAPTURE_VERSION */
    char tool[64];            /* "kvq 0.1.0" */
    kvq_model_id model;
    char corpus_spec[256];
    uint64_t corpus_seed;
    char corpus_hash[64];     /* hex string as written */
    int64_t n_documents;
    kvq_dtype dtype;          /* storage of q, k, v: KVQ_DT_F32 | F16 | BF16 */
    int64_t seq_len;
    int64_t n_tokens;         /* rows of k, v, pos, seq, tokens */
    int64_t n_sequences;
    int64_t *sequences;       /* [n_sequences, 2]: first row, length (inside [0, n_tokens)) */
    int32_t n_files;          /* captured layers */
    int32_t *layers;          /* [n_files]: model layer index of each file, unique, < n_layers */
    char **files;             /* [n_files]: plain file names inside dir (no '/', not "..") */
    int64_t n_queries;        /* "queries": 0 for "all", else the sample size N */
    int has_values;
    char tokenizer_approx[192]; /* "tokenizer_approx": what kvq_tokenizer_approx said
                                   when the model's tokenizer was approximated, else "" */
    uint64_t *checksums;      /* [n_files] "checksums": XXH64 of each file's bytes, checked
                                 when the file is opened; NULL for a capture written
                                 before kvq recorded them (accepted, docs/capture.md) */
} kvq_capture_info;

/* Reads and validates DIR/capture.json. Cost: reads the JSON only (no layer file is
 * opened); time and memory linear in its size plus n_layers bytes.
 * Errors (messages start with "DIR/capture.json: "):
 *   KVQ_E_NOT_FOUND   no capture.json (or DIR does not exist)
 *   KVQ_E_IO          it cannot be read
 *   KVQ_E_TOO_LARGE   larger than KVQ_CAPTURE_MAX_JSON, or model.n_layers above
 *                     KVQ_CAPTURE_MAX_LAYERS
 *   KVQ_E_BAD_JSON    not JSON, or a key missing or of the wrong type (the key is named)
 *   KVQ_E_BAD_MAGIC   "format" is not "kvq-capture"
 *   KVQ_E_VERSION     "version" is not 1
 *   KVQ_E_UNSUPPORTED unknown dtype, rope layout or rope scaling
 *   KVQ_E_CORRUPT     inconsistent values: n_heads not a multiple of n_kv_heads, odd
 *                     head_dim, layers/files of different lengths, a layer out of range
 *                     or repeated, a file name with a path in it, a sequence outside
 *                     [0, n_tokens), a count out of range
 *   KVQ_E_NOMEM */
kvq_status kvq_capture_info_read(const char *dir, kvq_capture_info **out, kvq_err *err);
/* The same from memory: json[0..size) is the text of DIR/capture.json (any bytes; it
 * need not be NUL-terminated, json may be NULL when size is 0). dir is recorded in
 * ci->dir and used for messages and kvq_capture_info_file_path; nothing is read from
 * it. Errors: those of kvq_capture_info_read except KVQ_E_NOT_FOUND and KVQ_E_IO. */
kvq_status kvq_capture_info_read_memory(const char *dir, const void *json, size_t size,
                                        kvq_capture_info **out, kvq_err *err);
void kvq_capture_info_free(kvq_capture_info *ci); /* NULL is fine */
/* 1 when dir is a directory whose capture.json kvq_capture_info_read accepts and which
 * holds only what kvq writes there (kvq_capture_dir_check_own): the only directories
 * --force lets capture replace (kvq_output_owned_fn). */
int kvq_capture_dir_is_capture(const char *dir);
/* KVQ_E_EXISTS "DIR/NAME: not written by kvq; kvq does not delete files it did not
 * write ..." for the first entry of the directory dir that kvq does not write there
 * (capture.json, layer_N.safetensors, its temporaries); KVQ_OK when there is none or
 * dir is not a directory. */
kvq_status kvq_capture_dir_check_own(const char *dir, kvq_err *err);
/* kvq_output_check for a capture directory, naming a file of dir that kvq did not
 * write (overwrite = 1) rather than refusing the directory as a whole. */
kvq_status kvq_capture_output_check(const char *dir, int overwrite, kvq_err *err);

/* Index i in [0, n_files) of model layer `layer` in the capture, or -1. */
int32_t kvq_capture_info_find_layer(const kvq_capture_info *ci, int32_t layer);

/* "DIR/FILE" for file i, malloc'd into *path (free()). KVQ_E_NOMEM. */
kvq_status kvq_capture_info_file_path(const kvq_capture_info *ci, int32_t i, char **path,
                                      kvq_err *err);

/* ---- one layer file ------------------------------------------------------------- */

/* An open layer file of a capture (docs/capture.md, "layer_LLL.safetensors"): the one
 * reader every stage uses (moments, fit, profile, merge). Each tensor is checked
 * against capture.json when it is asked for, so a stage that needs only some tensors
 * works on files without the others. Every message starts with "DIR/FILE: ". */
typedef struct kvq_capture_layer {
    const kvq_capture_info *ci; /* not owned; outlives the layer */
    int32_t layer;              /* model layer index of the file */
    int64_t n_q;                /* stored query rows: n_queries, or n_tokens for "all" */
    char *path;                 /* "DIR/FILE" (malloc'd) */
    kvq_st *st;
} kvq_capture_layer;

/* Opens file i in [0, ci->n_files) and checks its "layer" metadata (when present)
 * against ci->layers[i]. Errors: those of kvq_st_open, KVQ_E_CORRUPT (another layer),
 * KVQ_E_NOMEM. *L is zeroed on failure. */
kvq_status kvq_capture_layer_open(const kvq_capture_info *ci, int32_t i, kvq_capture_layer *L,
                                  kvq_err *err);
void kvq_capture_layer_close(kvq_capture_layer *L); /* zeroes *L; zeroed or closed is fine */

/* The tensor `name` with the dtype and shape capture.json gives it:
 *   k, v                         ci->dtype [n_tokens, n_kv_heads, head_dim]
 *   q                            ci->dtype [n_q, n_heads, head_dim]
 *   q_rows                       I32 [n_q]
 *   pos, seq, tokens             I32 [n_tokens]
 *   q_moment_sum, q_moment_count F64 [n_heads, head_dim, head_dim], F64 [n_heads]
 * Errors: KVQ_E_NOT_FOUND (missing), KVQ_E_SHAPE_MISMATCH (dtype or shape, both named),
 * KVQ_E_INVALID_ARG (a name not in the table). */
kvq_status kvq_capture_layer_tensor(const kvq_capture_layer *L, const char *name,
                                    const kvq_tensor_view **out, kvq_err *err);

/* Values [first, first + n) of the I32 column t (q_rows, pos, seq or tokens, from
 * kvq_capture_layer_tensor) into out[n], each checked: q_rows ascending inside
 * [0, n_tokens), pos inside [0, n_tokens), seq inside [0, n_sequences), tokens inside
 * [0, vocab_size). Streams: a column may be read in any number of consecutive pieces.
 * Errors: KVQ_E_CORRUPT (the first bad value, named with its index). */
kvq_status kvq_capture_layer_ints(const kvq_capture_layer *L, const kvq_tensor_view *t,
                                  int64_t first, int64_t n, int32_t *out, kvq_err *err);
/* The whole checked column `name`, malloc'd into *out (free()). Errors: those of
 * kvq_capture_layer_tensor and kvq_capture_layer_ints, KVQ_E_NOMEM. */
kvq_status kvq_capture_layer_column(const kvq_capture_layer *L, const char *name,
                                    int32_t **out, kvq_err *err);

/* Elements [first, first + n) of an f32/f16/bf16 tensor as f32 (exact). */
void kvq_capture_read_f32(const kvq_tensor_view *t, size_t first, size_t n, float *out);
/* Row `row`, heads [h0, h0 + nh) of a [rows, heads, d] tensor (k, v, q) as f32:
 * out [nh, d]. */
void kvq_capture_read_heads(const kvq_tensor_view *t, int64_t row, int32_t h0, int32_t nh,
                            float *out);

#ifdef __cplusplus
}
#endif
#endif
