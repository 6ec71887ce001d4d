/*
 * kvq/engine.h — retrieval attention for an inference engine that has its own forward
 * pass: the embedding API. Separate from the toolchain headers (kvq.h): it needs only
 * kvq/common.h (status codes, kvq_err) and this file, and it exposes no kvq model,
 * codebook or kernel type. Link with `pkg-config --cflags --libs kvq`.
 *
 * What the engine does per sequence, for every layer of every token (docs/runtime.md
 * "Embedding"):
 *
 *   kvq_engine_open(artifact, &model, 0, &eng, &err);    once per model
 *   kvq_engine_seq_create(eng, &params, &seq, &err);      once per sequence
 *   prompt rows:  kvq_engine_seq_append(seq, layer, n, pos, k, v, dtype, &err)
 *                 (the engine attends the prompt itself, as it always did)
 *   decode step:  kvq_engine_seq_decode(seq, layer, pos, q, k, v, dtype, out, &err)
 *                 appends the token's K and V and writes the attention output of every
 *                 query head of the layer, with kvq's selection (sinks, recent window,
 *                 the artifact's codebook top-k) and exact attention over the union.
 *
 * Vectors are PRE-RoPE, as the engine's projections produce them (kvq applies RoPE
 * itself, with the model's base and pair layout, at the positions given):
 *   q    [n_heads, head_dim]      float
 *   k, v [n, n_kv_heads, head_dim] rows of f32 or f16 (IEEE binary16), kvq_engine_dtype
 *   out  [n_heads, head_dim]      float, the attention output before the output
 *                                 projection (softmax(q k^T * scale) v per head, the
 *                                 scores capped c tanh(s / c) under a softcap c; scale
 *                                 1/sqrt(d) unless the model says: kvq_engine_layer)
 * Query head h uses KV head h / (n_heads / n_kv_heads) (GQA). Layers may be fed in any
 * order, but every layer must see the same tokens in the same order.
 *
 * Memory and ownership. The engine owns its inputs; they are read during the call
 * only. kvq_engine owns the artifact's codebooks (kvq_engine_bytes; shared, read-only,
 * by every sequence of it: sequences of one engine may run on different threads). A
 * sequence owns its own copy of the cached rows in the storage params.cache_f16 picks:
 * per token, layer and KV head 2 * head_dim * (2 or 4) bytes of K and V plus 2 bytes
 * of code (kvq_engine_seq_bytes tells the current total; a local layer,
 * kvq_engine_layer_window > 0, holds only its window's rows, 8 * head_dim bytes per
 * KV head each, f32), and scratch of about
 * n * (n_heads / n_kv_heads + 3) floats for n cached tokens. The engine may drop its
 * own K/V for the layers it runs through kvq, or keep it (kvq never reads it). A
 * sequence is used by one thread at a time. Nothing here prints, exits or reads the
 * environment; errors come back as kvq_status with err->msg naming the problem.
 */
#ifndef KVQ_ENGINE_H
#define KVQ_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One layer's attention, when layers differ (kvq_engine_model.layers): Gemma 3's local
 * layers (window, RoPE base 10000, no scaling) and global ones (base 1e6, linear 8),
 * Gemma 2's softcap and query_pre_attn_scalar, Qwen 2's max_window_layers. */
typedef struct kvq_engine_layer {
    int32_t window;           /* > 0: the layer attends only the last `window` tokens, its
                                 own included (transformers' sliding_window: a query at
                                 token t sees t - window + 1 .. t); 0: every token */
    int no_rope;              /* 1: the layer applies no RoPE (kvq refuses such a layer:
                                 none of the models it reads has one) */
    double rope_base;         /* this layer's theta; 0: the model's rope_base */
    const char *rope_scaling; /* NULL: the model's scaling; "none", "linear", "llama3" */
    double rope_factor;       /* under a scaling of its own; 0: the model's rope_factor
                                 (llama3's other parameters are always the model's) */
    double attn_scale;        /* score scale; 0: 1/sqrt(head_dim) */
    double attn_softcap;      /* > 0: scores become c tanh(s / c); 0: none */
} kvq_engine_layer;

/* The model as the engine knows it: its attention shape, RoPE and weight fingerprint,
 * and (since the per-layer attention) how each layer attends. The artifact records how
 * its model attends (docs/format.md "model.attention"); kvq_engine_open compares the
 * description with it layer by layer. A caller that fills only the fields before
 * attn_scale (all later ones 0 / NULL, as a zero-initialized struct has them) gives no
 * description: the artifact's is taken as it is (what kvq did before). */
typedef struct kvq_engine_model {
    int32_t n_layers;
    int32_t n_heads;          /* query heads */
    int32_t n_kv_heads;       /* divides n_heads */
    int32_t head_dim;         /* even */
    double rope_base;         /* theta, e.g. 10000 */
    int rope_interleaved;     /* 1: RoPE pairs (2i, 2i+1) (GGUF llama rows); 0: pairs
                                 (i, i + d/2) (HF checkpoints, GGUF qwen2) */
    const char *rope_scaling; /* NULL or "none", "linear", "llama3" */
    double rope_factor;       /* linear, llama3 */
    double rope_low_freq_factor, rope_high_freq_factor, rope_original_max_pos; /* llama3 */
    const char *fingerprint;  /* the weights' fingerprint (32 hex digits, `kvq inspect
                                 MODEL` prints it), or NULL when the engine cannot tell */
    /* Per-layer attention (see above). With layers NULL every layer attends as these
     * say: */
    double attn_scale;        /* score scale; 0: 1/sqrt(head_dim) */
    double attn_softcap;      /* > 0: scores become c tanh(s / c) (gemma2); 0: none */
    int32_t sliding_window;   /* > 0: every layer attends only the last W tokens */
    const kvq_engine_layer *layers; /* NULL, or [n_layers]: layer l attends as layers[l]
                                 says (the fields above then unused) */
} kvq_engine_model;

/* Open flags. */
#define KVQ_ENGINE_ACCEPT_MODEL_MISMATCH 1u /* open an artifact calibrated on other
                                               weights (or with no fingerprint given);
                                               kvq_engine_weights_note says so */

typedef struct kvq_engine kvq_engine;

/* Opens the artifact for the model. Errors: every error of reading and validating the
 * artifact (NOT_FOUND, BAD_MAGIC, CHECKSUM, CORRUPT, VERSION, ...); INVALID_ARG (a field
 * of model: named); UNSUPPORTED (an artifact without codebooks, an unknown scaling, a
 * layer without RoPE); MISMATCH when the artifact was made for another attention shape
 * or RoPE ("ARTIFACT vs engine model: model.FIELD differs (A vs B)"), for a model whose
 * layers attend otherwise ("ARTIFACT vs engine model: layer L's attention differs:
 * FIELD A vs B": window, use_rope, rope.base, rope.scaling, rope.factor, scale,
 * softcap) or, unless flags accept it, for other
 * weights: a different fingerprint, or none given while the artifact records one (the
 * message names both). NOMEM. */
kvq_status kvq_engine_open(const char *artifact_path, const kvq_engine_model *model,
                           unsigned flags, kvq_engine **out, kvq_err *err);
void kvq_engine_close(kvq_engine *e); /* NULL is fine; after every sequence is freed */

/* "" when the weights were checked and match; otherwise why they were not (an artifact
 * without a fingerprint, or a mismatch accepted by the flag): an engine shows it. */
const char *kvq_engine_weights_note(const kvq_engine *e);
/* The weights the artifact was calibrated on: fingerprint and name ("" when the
 * artifact records none). */
const char *kvq_engine_artifact_fingerprint(const kvq_engine *e);
const char *kvq_engine_artifact_model_name(const kvq_engine *e);
uint64_t kvq_engine_bytes(const kvq_engine *e); /* codebook memory */

/* How layer `layer` is attended: W > 0 when it is a local layer, a sliding-window layer
 * of a model that also has global layers (Gemma 2 and 3, Qwen 2 with max_window_layers):
 * it needs no retrieval and has no codebook, and kvq attends its last W tokens exactly
 * (decode: every query head over the window, with the layer's own RoPE, scale and
 * softcap; the sequence keeps only its last W rows plus a chunk's, in f32). 0 for a
 * retrieval layer (sinks, codebook top-k, window), and for a layer out of range. */
int32_t kvq_engine_layer_window(const kvq_engine *e, int32_t layer);

/* Per-sequence settings (docs/runtime.md "Decode step"). */
typedef struct kvq_engine_seq_params {
    int64_t budget_tokens;    /* K: candidates selected per step when > 0 */
    double budget_fraction;   /* else K = ceil(fraction * visible tokens), (0, 1];
                                 default 0.06 */
    int32_t sink;             /* first tokens always attended (default 4) */
    int32_t window;           /* recent tokens always attended; 0 = the artifact's */
    int cache_f16;            /* 1 (default): cache rows in f16, 0: f32 */
    int64_t max_tokens;       /* longest sequence (default 1 << 20) */
    int32_t threads;          /* KV heads in parallel (default 1) */
    /* ---- the compressed KV caches (docs/kvcache.md) ----
     * kv_cache 0 (the default, and a zeroed struct): the rows as cache_f16 says, with
     * the selection. KVQ_ENGINE_KV_LEANKV, _PATS or _LEANKV_PATS: that compressed cache,
     * kvq_engine_seq_bytes the bytes it holds (with a selection other than full, plus
     * the retrieval context's data per token: codes, residual bits and scales,
     * positions, the RoPE table; it holds no rows of its own, kvq/runtime.h
     * kvq_retrieval_held_get); how it is attended is the selector's:
     *  - selector KVQ_ENGINE_SELECT_FULL: full attention over the compressed cache (its
     *    own backend; budget, sink, window unused; kvq_engine_seq_stats all zero);
     *  - any other selector (the default codebook included): retrieval over it, as
     *    kvq run --kv and kvq eval do (kvq/kvcache.h kvq_retrieval_set_kvcache): the
     *    selection as with kv_cache 0 (codes and residuals kept as they are), the rerank
     *    and the attention reading the compressed rows, LeanKV's significance from the
     *    step's probabilities. It needs the artifact's positions rope (the cache holds
     *    rotated keys): with wrope (the default) kvq_engine_seq_create refuses
     *    (INVALID_ARG naming positions rope); use selector full there.
     * Its settings: the fields below
     * where >= 0, else the artifact's profile (leankv.alpha_h, leankv.alpha_l,
     * leankv.window, pats.schedule, pats.b_min, pats.b_max); one in neither, or out of
     * range, is an INVALID_ARG naming it. Rows appended (the prompt) enter as generated
     * tokens do; PATS lays its schedule over max_tokens (set it to the sequence's length:
     * the cache is made for that many tokens). */
    int32_t kv_cache;
    double kv_alpha_h, kv_alpha_l;     /* LeanKV thresholds (default -1: the artifact's) */
    int32_t kv_window;                 /* LeanKV recent window (-1: the artifact's, else 64) */
    int32_t kv_pats_schedule;          /* 0 old-heavy, 1 new-heavy, 2 middle-heavy (-1) */
    int32_t kv_pats_b_min, kv_pats_b_max; /* 0..10 (-1: the artifact's) */
    /* ---- selectors and measurement (kvq eval's rows from an engine) ----
     * With kv_cache 0. 0 in each (a zeroed struct) keeps the defaults. The position
     * mode and codebook scoring query are the artifact's (positions.mode,
     * positions.score: what kvq calibrate chose, as kvq run applies them), else wrope
     * and mean. */
    int32_t selector;         /* KVQ_ENGINE_SELECT_*: 0 the artifact's codebook */
    double tau;               /* mass selector: the share of mass kept, (0, 1]; 0: 0.9 */
    int32_t fier_group;       /* fier: tokens per quantization group; 0: 32 */
    int32_t quest_page;       /* quest: tokens per page; 0: 16 */
    int measure;              /* 1: each step also attends exactly over every visible
                                 token and sums kvq eval's quality figures
                                 (kvq_engine_seq_stats; slow) */
} kvq_engine_seq_params;

/* kvq_engine_seq_params.selector: who picks the candidates (docs/runtime.md). */
#define KVQ_ENGINE_SELECT_CODEBOOK 0 /* the artifact's codebook (default) */
#define KVQ_ENGINE_SELECT_FULL 1     /* every candidate (exact attention, the window's
                                        positions rule applied) */
#define KVQ_ENGINE_SELECT_ORACLE 2   /* the exact top-K scores (reads every key) */
#define KVQ_ENGINE_SELECT_FIER 3     /* 1-bit keys with per-group min / max */
#define KVQ_ENGINE_SELECT_QUEST 4    /* per-page min / max bounds */
#define KVQ_ENGINE_SELECT_MASS 5     /* the codebook's scores, top-p by tau */

#define KVQ_ENGINE_KV_LEANKV 1
#define KVQ_ENGINE_KV_PATS 2
#define KVQ_ENGINE_KV_LEANKV_PATS 3 /* LeanKV over PATS-truncated rows: both kinds' settings */

kvq_engine_seq_params kvq_engine_seq_params_default(void);

typedef enum kvq_engine_dtype { KVQ_ENGINE_F32 = 0, KVQ_ENGINE_F16 = 1 } kvq_engine_dtype;

typedef struct kvq_engine_seq kvq_engine_seq;

/* Errors: INVALID_ARG (a parameter, named), NOMEM. */
kvq_status kvq_engine_seq_create(kvq_engine *e, const kvq_engine_seq_params *p,
                                 kvq_engine_seq **out, kvq_err *err);
void kvq_engine_seq_free(kvq_engine_seq *s); /* NULL is fine */
/* Forgets the tokens (the sequence can be reused for another one). */
void kvq_engine_seq_reset(kvq_engine_seq *s);
int64_t kvq_engine_seq_length(const kvq_engine_seq *s, int32_t layer); /* tokens cached */
uint64_t kvq_engine_seq_bytes(const kvq_engine_seq *s); /* cached rows and codes (or the
                                                           compressed cache's bytes, plus
                                                           the retrieval context's held
                                                           bytes when it selects) */

/* Appends n rows of layer `layer` at positions pos[0..n): k, v [n, n_kv_heads,
 * head_dim] of dtype dt, pre-RoPE. Each key is encoded with the layer's codebook.
 * Errors: INVALID_ARG (layer out of range, n < 1, a position outside [0, 2^31), more
 * than max_tokens), NOMEM. */
kvq_status kvq_engine_seq_append(kvq_engine_seq *s, int32_t layer, int32_t n, const int64_t *pos,
                                 const void *k, const void *v, kvq_engine_dtype dt, kvq_err *err);

/* One decode step of one layer: appends the token (k, v: one row each, [n_kv_heads,
 * head_dim] of dtype dt) at position pos and writes out [n_heads, head_dim]: retrieval
 * attention of q [n_heads, head_dim] (pre-RoPE, float) over every cached token of the
 * layer, itself included. Errors: those of kvq_engine_seq_append. */
kvq_status kvq_engine_seq_decode(kvq_engine_seq *s, int32_t layer, int64_t pos, const float *q,
                                 const void *k, const void *v, kvq_engine_dtype dt, float *out,
                                 kvq_err *err);

/* kvq eval's statistics of a sequence since it was created (kept across
 * kvq_engine_seq_reset), summed over retrieval steps: one step is one (decode token,
 * layer, KV head) with candidates beyond sinks and window. kvq eval's figures:
 * attended_fraction = attended / visible, kv_read_fraction = bytes_read / bytes_full;
 * with params.measure, recall_topk, recall_mass and out_rel_err are these sums divided
 * by measured (docs/runtime.md, kvq/runtime.h kvq_retrieval_stats). All zero for a
 * compressed cache attended in full (kv_cache != 0 with selector full). */
typedef struct kvq_engine_stats {
    uint64_t steps;
    double visible;     /* tokens each step saw */
    double attended;    /* tokens attended (sinks + window + selected) */
    double bytes_read;  /* selector metadata plus the K and V rows read */
    double bytes_full;  /* K and V bytes full attention reads in the same steps */
    uint64_t measured;  /* params.measure: steps measured against exact attention */
    double recall_topk; /* sum of |selected ∩ oracle's top-K| / K */
    double recall_mass; /* sum of the exact attention mass on the attended tokens */
    double out_rel_err; /* sum of ||o - o_exact|| / ||o_exact|| (group means) */
} kvq_engine_stats;
void kvq_engine_seq_stats(const kvq_engine_seq *s, kvq_engine_stats *out);

/* For inspection (tests, tools): the candidate tokens the last decode step of (layer,
 * KV head) selected, as token indices ascending (sinks and window not included: they
 * are always attended), and their count in *count; NULL and 0 when that step attended
 * every token (no candidates beyond sinks and window) or the arguments are out of
 * range. Valid until the next append, decode or call of this function on s. */
const int32_t *kvq_engine_seq_last_selection(const kvq_engine_seq *s, int32_t layer,
                                             int32_t kv_head, int64_t *count);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_ENGINE_H */
