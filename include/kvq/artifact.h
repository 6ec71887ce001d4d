/*
 * kvq/artifact.h — the .kvq artifact: one file, shipped next to the weights.
 *
 * Layout (docs/format.md is the full specification):
 *   1. a zstd skippable frame (magic 0x184D2A5B, u32 LE size = 24; a later minor
 *      version may append fields, so readers accept >= 24 and skip the rest) whose
 *      content is "KVQA" (4 bytes), u32 LE major version, u32 LE minor version,
 *      u32 LE flags (0), u64 LE payload size (bytes of the decompressed payload);
 *   2. one zstd frame with the content checksum on, holding a safetensors file:
 *      tensors plus __metadata__ (model identity, method settings, provenance).
 * A reader refuses a major version it does not know (KVQ_E_VERSION) and accepts a
 * higher minor version (minor versions only add tensors or metadata keys).
 * `zstd -d` plus any safetensors reader can open an artifact.
 */
#ifndef KVQ_ARTIFACT_H
#define KVQ_ARTIFACT_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/common.h"
#ifdef KVQ_UNSTABLE_API
#include "kvq/safetensors.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_ARTIFACT_SKIPPABLE_MAGIC 0x184D2A5Bu
#define KVQ_ARTIFACT_TAG "KVQA"
#define KVQ_ARTIFACT_MAJOR 1
#define KVQ_ARTIFACT_MINOR 1 /* 1.1: model.attention.*; 1.0 files are read too */
#define KVQ_ARTIFACT_MAX_PAYLOAD ((uint64_t)64 << 30) /* 64 GiB sanity bound */

/* ---- names (docs/format.md, "Metadata" and "Tensors") --------------------------
 * Metadata values are strings: integers in decimal, floats printed with "%.17g". */
#define KVQ_META_MODEL_PREFIX     "model."  /* kvq_model_id_set_meta / _from_meta prefix */
#define KVQ_META_ARCH             "model.architecture"      /* required */
#define KVQ_META_N_LAYERS         "model.n_layers"          /* required */
#define KVQ_META_N_HEADS          "model.n_heads"           /* required */
#define KVQ_META_N_KV_HEADS       "model.n_kv_heads"        /* required */
#define KVQ_META_HEAD_DIM         "model.head_dim"          /* required */
#define KVQ_META_ROPE_BASE        "model.rope.base"         /* required */
#define KVQ_META_MODEL_PATH       "model.path"              /* the model's file name (no directories) */
#define KVQ_META_MODEL_NAME       "model.name"              /* GGUF general.name or the file name */
#define KVQ_META_MODEL_FINGERPRINT "model.fingerprint"      /* weight fingerprint, 32 hex digits */
#define KVQ_META_ROPE_LAYOUT      "model.rope.layout"       /* required: interleaved|half */
#define KVQ_META_ROPE_SCALING     "model.rope.scaling"      /* required: none|linear|llama3 */
#define KVQ_META_ROPE_FACTOR      "model.rope.factor"       /* linear, llama3 */
#define KVQ_META_ROPE_LOW_FREQ    "model.rope.low_freq_factor"  /* llama3 */
#define KVQ_META_ROPE_HIGH_FREQ   "model.rope.high_freq_factor" /* llama3 */
#define KVQ_META_ROPE_ORIG_MAX    "model.rope.original_max_pos" /* llama3 */
#define KVQ_META_METHOD           "method"                  /* required: see KVQ_METHOD_* */
#define KVQ_META_CODEBOOK_SIZE    "codebook_size"           /* required unless method none */
#define KVQ_META_GROUPS           "groups"                  /* required unless method none */
#define KVQ_META_WROPE_W          "wrope.w"                 /* required unless method none */
#define KVQ_META_WROPE_B          "wrope.b"                 /* required unless method none */
#define KVQ_META_SEED             "seed"                    /* required unless method none */
#define KVQ_META_LAYERS           "layers"                  /* optional: "0-3,5"; default all */
#define KVQ_META_CORPUS_HASH      "provenance.corpus_hash"
#define KVQ_META_N_TOKENS         "provenance.n_tokens"
#define KVQ_META_TOOL_VERSION     "provenance.tool_version" /* required */
#define KVQ_META_BACKEND          "provenance.backend"
#define KVQ_META_DATE             "provenance.date"         /* UTC calendar date, YYYY-MM-DD */
#define KVQ_META_CORPUS_SEED      "provenance.corpus_seed"  /* seed of the corpus generators */
#define KVQ_META_SEQ_LEN          "provenance.seq_len"      /* tokens per calibration sequence */
#define KVQ_META_N_SEQUENCES      "provenance.n_sequences"  /* calibration sequences */
/* Present only when the tokenizer was approximated (--accept-approx-tokenizer): what
 * kvq_tokenizer_approx said, e.g. "pre-tokenizer 'foo' approximated by the GPT-2 split". */
#define KVQ_META_TOKENIZER_APPROX "provenance.tokenizer_approx"

/* Written by kvq fit and kvq profile (docs/format.md "Metadata", "Tensors"): every
 * writer and reader uses these names. */
#define KVQ_META_CORPUS               "provenance.corpus"               /* provenance: the corpus spec */
#define KVQ_META_FIT_METHOD           "fit.method"                      /* kvq fit: method name (kvq_codebook_method_name) */
#define KVQ_META_FIT_TOL              "fit.tol"
#define KVQ_META_FIT_HOLDOUT          "fit.holdout"
#define KVQ_META_FIT_REFERENCE        "fit.reference"
#define KVQ_META_FIT_POSITIONS        "fit.positions"
#define KVQ_META_FIT_N_TRAIN          "fit.n_train"
#define KVQ_META_FIT_N_HELDOUT_KEYS   "fit.n_heldout_keys"
#define KVQ_DIAG_FIT_SCORE_MSE        "diag.fit.score_mse"              /* metadata (mean) and tensor [n_layers, n_kv_heads] */
#define KVQ_DIAG_FIT_SCORE_POWER      "diag.fit.score_power"            /* metadata (mean) and tensor */
#define KVQ_DIAG_FIT_SCORE_MSE_REF    "diag.fit.score_mse_ref"          /* metadata (mean) and tensor */
#define KVQ_META_KMEANS_INIT          "kmeans.init"                     /* kvq fit: seeding (kvq_kmeans_init_name) */
#define KVQ_META_KMEANS_ITERS         "kmeans.iters"
#define KVQ_META_KMEANS_SAMPLE        "kmeans.sample"                   /* training keys per head; 0 = all */
#define KVQ_META_PREFIX_PROVENANCE    "provenance."
#define KVQ_META_PREFIX_KMEANS        "kmeans."
#define KVQ_META_PREFIX_LEANKV        "leankv."
#define KVQ_META_PREFIX_PATS          "pats."
#define KVQ_META_PREFIX_THRESHOLDS    "thresholds."                     /* the profile's keys and tensors */
#define KVQ_META_PREFIX_PROFILE       "profile."
#define KVQ_META_PREFIX_BUDGET        "budget."
#define KVQ_META_PREFIX_MASS          "mass."
#define KVQ_META_PREFIX_DIAG_PROFILE  "diag.profile."
#define KVQ_META_THR_METRIC           "thresholds.metric"               /* kvq profile: perplexity | attn_rel_err */
#define KVQ_META_THR_TOLERANCE        "thresholds.tolerance"
#define KVQ_META_THR_PROMPT_FRACTION  "thresholds.prompt_fraction"
#define KVQ_META_DIAG_PPL_FULL        "diag.profile.ppl_full"
#define KVQ_META_LEANKV_WINDOW        "leankv.window"
#define KVQ_META_LEANKV_ALPHA_H       "leankv.alpha_h"
#define KVQ_META_LEANKV_ALPHA_L       "leankv.alpha_l"
#define KVQ_META_LEANKV_BITS          "leankv.bits"
#define KVQ_META_PATS_SCHEDULE        "pats.schedule"
#define KVQ_META_PATS_B_MIN           "pats.b_min"
#define KVQ_META_PATS_B_MAX           "pats.b_max"
#define KVQ_META_PATS_DTYPE           "pats.dtype"
#define KVQ_META_BUDGET_SELECTOR      "budget.selector"
#define KVQ_META_BUDGET_SINK          "budget.sink"
#define KVQ_META_BUDGET_POSITIONS     "budget.positions"
#define KVQ_META_BUDGET_FRACTION      "budget.fraction"
#define KVQ_META_MASS_TAU             "mass.tau"
/* Written by kvq calibrate's positions stage (docs/format.md "Metadata"): the position
 * mode and codebook scoring query it measured and chose, the defaults of kvq run / eval. */
#define KVQ_META_POS_MODE             "positions.mode"                  /* wrope | rope */
#define KVQ_META_POS_SCORE            "positions.score"                 /* rb | mean | bands */
#define KVQ_META_POS_TOLERANCE        "positions.tolerance"             /* relative perplexity */
#define KVQ_META_POS_BUDGET           "positions.budget"                /* the selector's budget */
#define KVQ_META_POS_N_TOKENS         "positions.n_tokens"              /* held-out tokens measured */
#define KVQ_META_POS_PPL_EXACT        "positions.ppl_exact"             /* full attention, exact RoPE */
#define KVQ_META_POS_PPL              "positions.ppl.%s"                /* format taking the candidate */
#define KVQ_META_PROFILE_SKIPPED      "profile.%s.skipped"              /* format taking the table name */
#define KVQ_META_PROFILE_COLUMNS      "profile.%s.columns"              /* format taking the table name */
#define KVQ_META_THR_MET              "thresholds.%s.met"               /* format taking the table name */
#define KVQ_META_DIAG_PROFILE         "diag.profile.%s.%s"              /* format taking table and column */
#define KVQ_TENSOR_PROFILE            "profile.%s"                      /* format taking the table name */
#define KVQ_TENSOR_PROFILE_ERR_CI     "profile.%s.err_ci95"             /* format taking the table name */
#define KVQ_TENSOR_PROFILE_JOB_SAMPLED "profile.%s.job_sampled"         /* format taking the table name */
#define KVQ_META_PROFILE_SAMPLE_ROWS  "profile.sample_rows"             /* rows per sequence; 0 = every row */
#define KVQ_META_PROFILE_SAMPLE_JOBS  "profile.sample_jobs"             /* the job sample's share */
#define KVQ_META_PROFILE_JOBS         "profile.jobs"                    /* grid jobs, then those sampled: "N,M" */
#define KVQ_META_PROFILE_BUDGET_JOBS  "profile.budget_jobs"             /* budget/tau jobs, then those sampled */
#define KVQ_TENSOR_THR_BUDGET         "thresholds.budget"
#define KVQ_TENSOR_THR_MASS_TAU       "thresholds.mass.tau"
#define KVQ_TENSOR_DIAG_HEAD          "diag.layer.%d.head.%d.%s"        /* format taking (layer, kv head, what) */
#define KVQ_TENSOR_DIAG_GROUP         "diag.layer.%d.head.%d.group.%d.%s" /* format taking (layer, kv head, group, what) */

#define KVQ_METHOD_NONE          "none"          /* thresholds/schedules only */
#define KVQ_METHOD_VQ            "vq"            /* plain VQ of pre-RoPE keys (L = I) */
#define KVQ_METHOD_QAVQ          "qavq"          /* query-aware VQ in z = k L space */
#define KVQ_METHOD_VQ_POSTROPE   "vq-postrope"   /* baseline: VQ of post-RoPE keys */
/* The spellings artifacts used before the method names were unified: readers accept
 * them as KVQ_METHOD_QAVQ / KVQ_METHOD_VQ_POSTROPE; writers never write them. */
#define KVQ_METHOD_QAVQ_OLD          "qa-vq"
#define KVQ_METHOD_VQ_POSTROPE_OLD   "post-rope-vq"

/* Tensor names: printf formats taking (layer, kv head[, group]). */
#define KVQ_TENSOR_CODEBOOK       "layer.%d.head.%d.codebook"          /* [K, d] */
#define KVQ_TENSOR_GROUP_CODEBOOK "layer.%d.head.%d.group.%d.codebook" /* [K, d/G] */
#define KVQ_TENSOR_CZ             "layer.%d.head.%d.Cz"                /* [K, d] */
#define KVQ_TENSOR_GROUP_CZ       "layer.%d.head.%d.group.%d.Cz"       /* [K, d/G] */
#define KVQ_TENSOR_L              "layer.%d.head.%d.L"                 /* [d, d] */
#define KVQ_TENSOR_LINV           "layer.%d.head.%d.Linv"              /* [d, d] */
#define KVQ_TENSOR_LEANKV_ALPHA_H "thresholds.leankv.alpha_h" /* [] or [n_layers, n_kv_heads] */
#define KVQ_TENSOR_LEANKV_ALPHA_L "thresholds.leankv.alpha_l" /* [] or [n_layers, n_kv_heads] */

typedef struct kvq_artifact kvq_artifact;

/* Reads, checks and decompresses an artifact, checking in this order (the first
 * problem found is reported; messages start with "path: " or "label: "):
 *   1. fewer than 4 bytes that match the skippable magic    KVQ_E_TRUNCATED_HEADER
 *      a first u32 that is not 0x184D2A5B (or a short prefix that differs)
 *                                                           KVQ_E_BAD_MAGIC
 *   2. the tag "KVQA" missing or different                  KVQ_E_BAD_MAGIC
 *      (TRUNCATED_HEADER when the file ends inside a matching tag)
 *   3. major version != KVQ_ARTIFACT_MAJOR (named in the message)
 *                                                           KVQ_E_VERSION
 *      (a higher minor version is accepted)
 *   4. header frame size < 24                               KVQ_E_CORRUPT
 *      file ends inside the header frame                    KVQ_E_TRUNCATED_HEADER
 *   5. flags != 0                                           KVQ_E_UNSUPPORTED
 *   6. payload size > KVQ_ARTIFACT_MAX_PAYLOAD              KVQ_E_TOO_LARGE
 *   7. the zstd frame: missing or ends early                KVQ_E_TRUNCATED_DATA
 *      not a zstd frame, bytes after it, no content checksum, no content size,
 *      content size != header payload size, content size impossible for the
 *      compressed size (more than 128 KiB per 3 bytes)      KVQ_E_CORRUPT
 *   (only now is the payload buffer allocated:              KVQ_E_NOMEM)
 *   8. decompression: content checksum mismatch             KVQ_E_CHECKSUM
 *      any other error zstd reports                         KVQ_E_CORRUPT
 *   9. the payload as safetensors: every kvq_st_open_memory error.
 * Errors: NOT_FOUND, IO and those above. open_memory does not keep `data`.
 * Cost: one pass of zstd decompression; memory is the decompressed payload (held
 * until close; tensor views point into it) plus the safetensors index. */
kvq_status kvq_artifact_open(const char *path, kvq_artifact **out, kvq_err *err);
kvq_status kvq_artifact_open_memory(const void *data, size_t size, const char *label,
                                    kvq_artifact **out, kvq_err *err);
void kvq_artifact_close(kvq_artifact *a); /* NULL is fine */

uint32_t kvq_artifact_major(const kvq_artifact *a);
uint32_t kvq_artifact_minor(const kvq_artifact *a);
#ifdef KVQ_UNSTABLE_API
/* The payload: tensors and __metadata__ through the safetensors API (unstable tier;
 * the stable accessors are below). Valid until close. */
const kvq_st *kvq_artifact_payload(const kvq_artifact *a);
#endif
/* The decompressed payload itself (a safetensors file of payload_size bytes), e.g.
 * to save it or re-encode it. Owned by the artifact; valid until close. */
const void *kvq_artifact_payload_data(const kvq_artifact *a);
size_t kvq_artifact_payload_size(const kvq_artifact *a);

/* Checks the content against the version-1 rules of docs/format.md ("Metadata",
 * "Tensors"): required metadata keys present and well-formed, known method, and
 * for each layer listed in "layers" (default all) and each KV head, the tensors the
 * method needs with dtype F32 and the documented shape; LeanKV thresholds, when
 * present, shaped [] or [n_layers, n_kv_heads]. open() does not call it (a reader
 * that only lists tensors need not care); loaders and `kvq inspect` do.
 * Errors: KVQ_E_CORRUPT (a required key or tensor missing, a malformed value),
 * KVQ_E_UNSUPPORTED (unknown method, layout or scaling), KVQ_E_SHAPE_MISMATCH (a
 * tensor with the wrong dtype or shape). The message names the key or tensor. */
kvq_status kvq_artifact_validate(const kvq_artifact *a, kvq_err *err);

/* Compresses a serialized safetensors payload (e.g. from a kvq_st_writer in buffer
 * mode) into an artifact at `path`, atomically: the bytes go to a temporary name in
 * the same directory, renamed over `path` only when complete; on any failure nothing
 * is left. overwrite = 0: KVQ_E_EXISTS if `path` exists. zstd_level 0 = default (3);
 * otherwise within [ZSTD_minCLevel(), ZSTD_maxCLevel()] (KVQ_E_INVALID_ARG).
 * The payload must open as safetensors (KVQ_E_INVALID_ARG naming the problem): the
 * writer never produces a file the reader refuses. Compression is single-threaded
 * with the content checksum and content size on, so the output depends only on the
 * payload, the level and the libzstd version.
 * Errors: INVALID_ARG, TOO_LARGE, EXISTS, IO, NOMEM, BACKEND.
 * Cost: random-normal F32 data compresses 1.08x at every level, at about 3 MB/s at
 * level 19 and 300 MB/s at level 3 (one core; `zstd -19` 4.1 s and `zstd -3` 0.04 s
 * on 12.6 MB, level 3 the smaller output): hence the default 3, which keeps the write
 * of a fit or profile from being a serial stage of its own. Memory is the payload's
 * compress bound plus zstd's context (a few MiB at low levels, about 81 MiB at 19). */
/* 1 when path is a regular file that begins with an artifact's magic and "KVQA" tag:
 * the files --force lets a stage replace (kvq_output_owned_fn). */
int kvq_artifact_is_artifact(const char *path);

kvq_status kvq_artifact_write(const char *path, int overwrite, const void *payload,
                              size_t payload_size, int zstd_level, kvq_err *err);
/* The same into a malloc'd buffer (free()); *out is NULL on failure. */
kvq_status kvq_artifact_encode(const void *payload, size_t payload_size, int zstd_level,
                               void **out, size_t *out_size, kvq_err *err);

/* ---- stable accessors (formats/artifact_api.c): plain types, for tools and bindings --
 * Every pointer returned is owned by the artifact and valid until close. */

/* The __metadata__ entries, in the file's order (all values are strings). */
size_t kvq_artifact_meta_count(const kvq_artifact *a);
const char *kvq_artifact_meta_key(const kvq_artifact *a, size_t i);   /* NULL: out of range */
const char *kvq_artifact_meta_value(const kvq_artifact *a, size_t i); /* NULL: out of range */
const char *kvq_artifact_meta_get(const kvq_artifact *a, const char *key); /* NULL: absent */

#define KVQ_ARTIFACT_MAX_DIMS 8
/* One tensor of the payload: little-endian data of dtype ("F32", "F16", "BF16", "F64",
 * "I8" .. "I64", "U8" .. "U64", "BOOL": the safetensors names), row-major, maybe
 * unaligned for its dtype. */
typedef struct kvq_artifact_tensor {
    const char *name;
    const char *dtype;
    int32_t ndim;                         /* 0 = scalar */
    int64_t shape[KVQ_ARTIFACT_MAX_DIMS];
    size_t nbytes;
    const void *data;
} kvq_artifact_tensor;

size_t kvq_artifact_tensor_count(const kvq_artifact *a);
/* Tensor i (file order). INVALID_ARG when i is out of range. */
kvq_status kvq_artifact_tensor_at(const kvq_artifact *a, size_t i, kvq_artifact_tensor *out,
                                  kvq_err *err);
/* The tensor named `name`. NOT_FOUND (naming it) when absent. */
kvq_status kvq_artifact_tensor_find(const kvq_artifact *a, const char *name,
                                    kvq_artifact_tensor *out, kvq_err *err);
/* The codebook of (layer, KV head): KVQ_TENSOR_CODEBOOK, or with group >= 0
 * KVQ_TENSOR_GROUP_CODEBOOK ([K, d] or [K, d/G] F32). NOT_FOUND when absent. */
kvq_status kvq_artifact_codebook(const kvq_artifact *a, int32_t layer, int32_t kv_head,
                                 int32_t group, kvq_artifact_tensor *out, kvq_err *err);

/* The artifact described as one JSON object (UTF-8, no newline):
 *   {"format": "kvq", "major": M, "minor": m, "payload_bytes": N,
 *    "metadata": {KEY: VALUE, ...}, "tensors": [{"name": ..., "dtype": ...,
 *    "shape": [...], "nbytes": N}, ...]}
 * metadata values are the strings stored; tensors in file order. Written to the
 * caller's buf of cap bytes, NUL-terminated; *len (may be NULL) gets the length
 * without the NUL, also when it did not fit (KVQ_E_TOO_LARGE; call again with
 * *len + 1 bytes). buf may be NULL with cap 0 to ask the length. */
kvq_status kvq_artifact_describe_json(const kvq_artifact *a, char *buf, size_t cap, size_t *len,
                                      kvq_err *err);

#ifdef __cplusplus
}
#endif
#endif
