/*
 * kvq/capture.h — recording pre-RoPE Q, K, V per layer over a calibration corpus.
 *
 * A capture is a directory (docs/capture.md): capture.json plus one safetensors file
 * per captured layer holding k, v, q (all rows or a seeded sample), q_rows, pos, seq,
 * tokens and the float64 query moments (raw sums over every row, plus counts).
 *
 * Three levels, each usable on its own:
 *   kvq_capture_writer   states in, directory out: any source of pre-RoPE rows (the
 *                        forward pass, a test, another framework) appends rows per
 *                        layer in order; finish assembles the files.
 *   kvq_capture_tokens   a model and tokenized sequences: runs the forward pass with an
 *                        observer that feeds a writer.
 *   kvq_capture_run      a model and a corpus spec (kvq/corpus.h): tokenizes, then
 *                        kvq_capture_tokens.
 * and kvq_capture_merge, which concatenates captures of the same model.
 *
 * Streaming: nothing is held per token except the token ids (4 bytes each) and, with
 * a query sample, the sampled row indices. Rows go to per-layer temporary raw files in
 * the output's temporary directory as they arrive, and are copied into the layer's
 * safetensors file in bounded chunks at the end, when the row counts are known. Memory:
 * 2 * n_captured_layers * n_heads * head_dim^2 * 8 bytes of moment accumulators (running
 * total and current sequence), one chunk of converted rows, plus the forward pass. Disk:
 * the final size plus, at the peak, one more copy of the largest layer.
 *
 * Output is always whole: everything is written into "<dir>.tmp.<random>/" and renamed
 * to <dir> at the end; on any failure the temporary directory is removed and nothing is
 * left behind. Same inputs, seed, dtype and chunk size give byte-identical files,
 * whatever the thread count (docs/capture.md says in which order the moments are summed).
 */
#ifndef KVQ_CAPTURE_H
#define KVQ_CAPTURE_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/capture.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include "kvq/capture_dir.h"
#include "kvq/common.h"
#include "kvq/corpus.h"
#include "kvq/dist.h"
#include "kvq/model.h"
#include "kvq/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==========================================================================
 * capture.json writer
 * ========================================================================== */

/* Writes ci as DIR-independent capture.json text to `path` (atomically; overwrite as in
 * kvq_atomic_open). Fields as in docs/capture.md: every field of kvq_capture_info except
 * `dir`; `tool` is replaced by "kvq <version>"; `queries` is "all" when n_queries is 0;
 * `files` must be set (n_files names). `seed` (the query sample seed) is written when
 * sample_seed is non-NULL. The reader kvq_capture_info_read gives back the same values.
 * Errors: KVQ_E_INVALID_ARG (a NULL array where a count says there are elements),
 * KVQ_E_EXISTS, KVQ_E_IO, KVQ_E_NOMEM. */
kvq_status kvq_capture_info_write(const kvq_capture_info *ci, const uint64_t *sample_seed,
                                  const char *path, int overwrite, kvq_err *err);

/* ==========================================================================
 * Writer: rows in, capture directory out
 * ========================================================================== */

typedef struct kvq_capture_writer kvq_capture_writer;

typedef struct kvq_capture_writer_params {
    uint64_t seed;            /* query sample seed (used when info->n_queries > 0) */
    int32_t threads;          /* moment accumulation threads; 0 = OpenMP's default */
    int overwrite;            /* 1: replace an existing `dir` at finish */
    kvq_callbacks cb;         /* progress of the assembly ("capture: assemble") */
} kvq_capture_writer_params;

kvq_capture_writer_params kvq_capture_writer_params_default(void);

/* Starts a capture into `dir`. info describes the result and is copied:
 *   model, corpus_*, n_documents      provenance written to capture.json
 *   dtype                             KVQ_DT_F32 | KVQ_DT_F16 | KVQ_DT_BF16 for q, k, v
 *   seq_len, n_tokens (>= 1, < 2^31)  and sequences [n_sequences, 2] (first row, length),
 *                                     which must tile [0, n_tokens) in order, lengths >= 1
 *   layers [n_files]                  model layers to store, each < model.n_layers,
 *                                     unique (stored in ascending order); files ignored
 *   n_queries                         0: q at every row; N: a sample of min(N, n_tokens)
 *                                     rows drawn with p->seed (selection sampling, so the
 *                                     rows come out sorted); N >= n_tokens stores "all"
 *   has_values                        0: no v tensor
 * tokens: [n_tokens] token ids (copied).
 * Creates "<dir>.tmp.<random>/" at once. Errors: KVQ_E_EXISTS (dir exists and not
 * overwrite), KVQ_E_IO (cannot create: message names dir and the reason),
 * KVQ_E_INVALID_ARG (inconsistent info, named), KVQ_E_TOO_LARGE, KVQ_E_NOMEM. */
kvq_status kvq_capture_writer_create(const char *dir, const kvq_capture_info *info,
                                     const int32_t *tokens,
                                     const kvq_capture_writer_params *p,
                                     kvq_capture_writer **out, kvq_err *err);

/* Appends the next n rows of model layer `layer` (rows go in order, per layer; layers may
 * interleave freely). Pre-RoPE, in the model's pair layout:
 *   q: [n, n_heads, head_dim]   k, v: [n, n_kv_heads, head_dim]   (v ignored, may be
 *   NULL, when has_values is 0). A layer that is not captured is checked for non-finite
 * values and otherwise ignored. The moments of the n rows are summed from zero in blocks
 * (split at sequence starts, then every 256 rows) and added to the sequence's sum, so
 * the float64 sums depend on how the rows are cut into appends, not on threads.
 * Cost: O(n * n_heads * head_dim^2) for the moments plus the conversion and the writes.
 * Errors: KVQ_E_NUMERIC (NaN or Inf: "layer L sequence S position P (row R): non-finite
 * q|k|v"), KVQ_E_INVALID_ARG (more than n_tokens rows, unknown layer, NULL), KVQ_E_IO
 * (message names the temporary file), KVQ_E_NOMEM. After an error the writer can only
 * be freed. */
kvq_status kvq_capture_writer_append(kvq_capture_writer *w, int32_t layer, int64_t n,
                                     const float *q, const float *k, const float *v,
                                     kvq_err *err);

/* Rows appended so far to a captured layer (0 for other layers). */
int64_t kvq_capture_writer_rows(const kvq_capture_writer *w, int32_t layer);

/* Checks every captured layer has n_tokens rows (KVQ_E_INVALID_ARG otherwise), writes
 * the layer files and capture.json into the temporary directory and renames it to dir.
 * Cost: one sequential copy of the raw rows. Errors: KVQ_E_INVALID_ARG, KVQ_E_IO,
 * KVQ_E_EXISTS (dir appeared meanwhile), KVQ_E_CANCELLED (progress said stop),
 * KVQ_E_NOMEM. On error the temporary directory is removed. */
kvq_status kvq_capture_writer_finish(kvq_capture_writer *w, kvq_err *err);

/* Frees w; before a successful finish this also removes the temporary directory.
 * NULL is fine. */
void kvq_capture_writer_free(kvq_capture_writer *w);

/* ==========================================================================
 * Capture from a model
 * ========================================================================== */

typedef struct kvq_capture_params {
    int64_t seq_len;          /* tokens per sequence, BOS included (default 256, >= 2);
                                 above the model's context length: a warning */
    int64_t max_tokens;       /* stop the corpus after this many tokens (0 = all) */
    const int32_t *layers;    /* [n_layers] layers to store; NULL = every layer */
    size_t n_layers;
    kvq_dtype dtype;          /* KVQ_DT_F16 (default), KVQ_DT_BF16 or KVQ_DT_F32 */
    int values;               /* 1 (default): store v; 0: do not */
    int64_t n_queries;        /* 0 (default): q at every row; N: a seeded sample of N */
    uint64_t seed;            /* query sample seed (default 0) */
    int32_t threads;          /* BLAS and moment threads; 0 = leave the defaults */
    int32_t chunk;            /* tokens per forward chunk (default 256) */
    int overwrite;            /* 1: replace an existing output directory */
    kvq_callbacks cb;         /* memory/disk needs, warnings, progress ("capture") */
    const kvq_dist *dist;     /* NULL (default): one process; else kvq_capture_tokens
                                 splits the sequences among its ranks and rank 0 merges
                                 them (kvq/dist.h; same bytes for any rank count) */
} kvq_capture_params;

kvq_capture_params kvq_capture_params_default(void);

/* What a corpus was: provenance for capture.json. */
typedef struct kvq_capture_corpus {
    const char *spec;         /* e.g. "uuid:64" (copied; at most 255 bytes kept) */
    uint64_t seed;
    uint64_t hash;            /* written as 16 hex digits */
    int64_t n_documents;
} kvq_capture_corpus;

/* Captures model m over already tokenized sequences: tokens [n_tokens], sequences
 * [n_sequences, 2] (first row, length) tiling [0, n_tokens) in order; each sequence is
 * run from position 0 (a fresh context). p->seq_len is recorded, not enforced (a
 * sequence may be shorter). Logs the memory and disk the run needs, reports progress
 * ("capture", tokens) and warns when a sequence is longer than the model's context.
 * Errors: those of kvq_capture_writer_*, of the forward pass (KVQ_E_NUMERIC names the
 * layer, sequence and position of a non-finite state), KVQ_E_INVALID_ARG (no tokens,
 * a layer out of range, a bad dtype or count), KVQ_E_CANCELLED. Nothing is left behind
 * on error. */
kvq_status kvq_capture_tokens(const kvq_model *m, const int32_t *tokens, int64_t n_tokens,
                              const int64_t *sequences, int64_t n_sequences,
                              const kvq_capture_corpus *corpus, const kvq_capture_params *p,
                              const char *dir, kvq_err *err);

/* Opens the corpus `spec` (kvq/corpus.h syntax; cp NULL = defaults, cp->seed seeds the
 * synthetic generators), tokenizes it with the model's tokenizer (a model without one
 * reads ids: corpora only) into packed sequences of p->seq_len tokens, each starting
 * with BOS when the model adds one (kvq_tokenizer_add_bos; partial last sequence kept), up to
 * p->max_tokens, then kvq_capture_tokens. The token ids are held in memory (4 bytes
 * each); the corpus hash covers the documents read.
 * Errors: those of kvq_corpus_open/tokenize (an empty corpus is KVQ_E_INVALID_ARG
 * "corpus 'SPEC' contains no text"), KVQ_E_INVALID_ARG (seq_len < 2), KVQ_E_TOO_LARGE
 * (2^31 tokens or more), and those of kvq_capture_tokens. */
kvq_status kvq_capture_run(const kvq_model *m, const char *spec, const kvq_corpus_params *cp,
                           const kvq_capture_params *p, const char *dir, kvq_err *err);

/* ==========================================================================
 * Merge
 * ========================================================================== */

/* Merges captures of the same model into `dir`: rows concatenated in input order,
 * sequences renumbered, q_rows offset, moment sums and counts added (left to right),
 * corpus specs joined with " + ", document counts added, corpus hash combined.
 * The inputs must agree on the model identity, dtype, seq_len, layers and has_values:
 * otherwise KVQ_E_MISMATCH "A vs B: FIELD differs (...)". "queries" is "all" when every
 * input stored all rows, else the total number of stored queries.
 * The result equals a capture of the concatenated token sequences tensor by tensor; the
 * moment sums bit for bit when each input after the first holds one sequence, else up
 * to float64 rounding of the sums (see docs/capture.md).
 * Cost: one sequential copy of every input; memory: one layer's moments.
 * Errors: those of kvq_capture_info_read and the safetensors reader (a missing or
 * malformed tensor is KVQ_E_CORRUPT naming file and tensor), KVQ_E_MISMATCH,
 * KVQ_E_TOO_LARGE (more than 2^31 - 1 rows), KVQ_E_EXISTS, KVQ_E_IO, KVQ_E_INVALID_ARG
 * (fewer than 2 inputs is fine: 1 copies), KVQ_E_CANCELLED, KVQ_E_NOMEM. */
kvq_status kvq_capture_merge(const char *const *inputs, size_t n_inputs, const char *dir,
                             int overwrite, const kvq_callbacks *cb, kvq_err *err);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_CAPTURE_H */
