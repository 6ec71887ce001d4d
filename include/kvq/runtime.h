/*
 * kvq/runtime.h — decoding with VQ retrieval attention.
 *
 * Three layers, bottom up:
 *
 *   kernels       kvq_rk_* (runtime/kernels/rk.h, internal): LUT build, score gather,
 *                 top-k selection and sparse attention over an f16 or f32 cache. Each
 *                 has a scalar reference and AVX2 / AVX-512 paths chosen at run time
 *                 (kvq_isa); tests check fast == scalar within the named tolerances below.
 *   kvq_codebook_set   an opened .kvq artifact, validated against the model, with one
 *                 kvq_codebook per (layer, KV head). Immutable once opened; several
 *                 decoding contexts may share it.
 *   kvq_retrieval a decoding context: the per-sequence KV cache (K and V in f16 or
 *                 f32: the keys pre-RoPE, or under positions ROPE rotated by their
 *                 positions before the rounding, as llama.cpp's cache holds them; the
 *                 codes of every key, selector metadata) and the
 *                 attention step. It plugs into the forward pass as a kvq_attn_backend
 *                 (kvq/model.h), so kvq run / kvq eval decode with it unchanged.
 *
 * Retrieval attention (docs/design.md "Decode step"). For a query row at position i
 * that sees n cached tokens (itself included), per KV head h:
 *   - the first S sink tokens and the last w window tokens are always attended;
 *   - the C = n - S - w tokens between them are the candidates; the selector scores
 *     them and keeps the top K (the budget, a count or a fraction of n; sinks and
 *     window come on top); ties go to the earlier token (one exception under "Row
 *     order");
 *   - exact attention over the union. Positions (kvq_positions): ROPE rotates every
 *     attended key by its own position (q R_i . k_j R_j); WROPE (a2ats) does so for the
 *     window only and scores the other attended tokens as q R_b . k_j.
 * Sliding windows (kvq_model_config.sliding_window): in a layer with a window of W
 * tokens a query sees only the last W (kvq_model_window_start), as full attention
 * does; sinks are the first S of those, the candidates lie between them and the recent
 * window, and the rows stay in token order. That is when every layer has the window
 * (mistral, phi3); the windowed layers of a model that also has global layers are
 * local: attended exactly, without retrieval (kvq_retrieval_layers_note below).
 * GQA: the query heads of a group share one selection. Scores are linear in the query,
 * so by default (KVQ_GROUP_SUM) the selector scores with the sum of the group's
 * scoring queries: one LUT and one pass over the codes per KV head, ranking tokens by
 * the sum (equivalently the mean) of the heads' approximate logits. KVQ_GROUP_MAX
 * scores every head separately and ranks by the largest of the heads' scores.
 *
 * Selectors (kvq_selector):
 *   full      every candidate (no selection; with ROPE this is exact attention)
 *   oracle    the top K by exact scores under the position mode (q R_b . k_j for WROPE,
 *             q R_i . k_j R_j for ROPE), summed (or maxed) over the group
 *   codebook  the artifact's method: LUT of the scoring query (q R_b, or q R_i for
 *             vq-postrope; q' = q~ L^-T for the query-aware methods) over the codes
 *   fier      fier paper: post-RoPE keys quantized to 1 bit per channel, per group of
 *             32 consecutive tokens (round to nearest of the group's per-channel min and
 *             max); score q R_i . dequantized key
 *   quest     quest pages of 16 consecutive tokens: per-channel min / max of the
 *             post-RoPE keys; page score sum_c max(q_c min_c, q_c max_c) (per head,
 *             summed or maxed over the group); the best pages are taken whole, the last
 *             one partly, until K tokens
 *   mass      hcattention's rule on the codebook's scores: the smallest set of
 *             candidates whose approximate softmax mass (scores / sqrt(d), over the
 *             candidates) reaches tau, at most K of them
 *
 * Chunks. The forward pass hands the backend chunks of tokens. With prefill_full (the
 * default) a chunk of more than one token is attended exactly (exact RoPE, every
 * earlier token), which is how a prompt fills the cache, and a chunk of one token (a
 * decode step) uses retrieval. With prefill_full = 0 every query row of every chunk
 * uses retrieval over the tokens before it and itself, which is what `kvq eval`
 * uses to measure perplexity under retrieval at every evaluated position.
 *
 * Row order. With a single-group codebook (vq, qavq, vq-postrope), the codebook or mass
 * selector, the CPU backend and code_order = 1 (the default), each KV head keeps the
 * cached rows that can no longer enter any window, [S, e) with e = the chunk's first
 * position + 1 - w, sorted by code (stably: within a code, token order), re-sorting
 * [S, e) as the unsorted part grows (below). All tokens of a code have the same approximate score, so the rows a step
 * selects are a few hundred contiguous runs (whole codes) instead of thousands of
 * scattered rows, which one core reads at about twice the rate (docs/BENCHMARKS.md
 * "Decode"). Selections are the same sets either way; the attention sums them in row
 * order, so outputs differ from token order by rounding only. Ties between tokens of
 * different codes whose scores are bit-identical go by row order. A sort waits until
 * the unsorted far rows number 4 K (K the codebook size) and a quarter of the sorted
 * ones; it copies the head's K and V rows into new arrays in the new order (so while
 * it runs the head's K and V exist twice: 2 d x 2 or 4 bytes per cached row; heads
 * sort in parallel on params.threads) and reorders the codes. After a long prompt the
 * first decode step sorts (bench_decode prints the time: about 40 ms per head at 128K
 * tokens of d = 128 on one core here); later sorts come at geometrically growing
 * lengths.
 *
 * Threads: a decoding context is used by one thread at a time; params.threads > 1 runs
 * the KV heads of a row in parallel (OpenMP) with per-thread scratch.
 */
#ifndef KVQ_RUNTIME_H
#define KVQ_RUNTIME_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/runtime.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kvq/codebook.h"
#include "kvq/common.h"
#include "kvq/model.h"
#include "kvq/rope.h"
#include "kvq/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==========================================================================
 * Kernels
 * ========================================================================== */

/* Instruction set of a kernel call. A request above what the CPU supports is lowered
 * to the best the CPU has, so any value is safe to pass. */
typedef enum kvq_isa {
    KVQ_ISA_SCALAR = 0,
    KVQ_ISA_AVX2 = 1,  /* AVX2 + FMA + F16C */
    KVQ_ISA_AVX512 = 2 /* AVX-512 F/BW/VL/DQ (and AVX2) */
} kvq_isa;

kvq_isa kvq_isa_best(void);            /* what this CPU runs */
kvq_isa kvq_isa_clamp(kvq_isa want);   /* min(want, best) */
const char *kvq_isa_name(kvq_isa isa); /* "scalar" | "avx2" | "avx512" */


/* The kernels themselves (kvq_rk_*: LUT build, score gather, top-k, sparse attention)
 * are internal to the library, its tests and benchmarks: runtime/kernels/rk.h. */

/* ==========================================================================
 * The artifact at run time
 * ========================================================================== */

typedef struct kvq_codebook_set kvq_codebook_set;

/* Opens the artifact at `path` for the model `model` (kvq_model_identity; the label
 * names it in messages) and loads a codebook for every (layer in "layers", KV head).
 * Checks, in order:
 *   1. every error of kvq_artifact_open (BAD_MAGIC, TRUNCATED_*, VERSION, CHECKSUM,
 *      CORRUPT, ...) and of kvq_artifact_validate (CORRUPT, UNSUPPORTED,
 *      SHAPE_MISMATCH): a truncated or corrupted file is refused here;
 *   2. method "none": KVQ_E_UNSUPPORTED (the artifact has no codebooks);
 *   3. the model identity, field by field in this order: n_layers, n_heads,
 *      n_kv_heads, head_dim, rope.base, rope.layout, rope.scaling and the scaling
 *      parameters, then (when the artifact records them) the rest of the identity
 *      (kvq_model_id_compare). A difference is KVQ_E_MISMATCH with the message
 *      "PATH vs LABEL: model.FIELD differs (ARTIFACT vs MODEL)". Nothing falls back;
 *   4. every codebook: the errors of kvq_codebook_load.
 * Cost: decompression plus a copy of every codebook. Memory: the codebooks (K d floats
 * per head, twice for qavq, plus 2 d^2 for the query-aware methods); the payload is
 * released before returning. */
kvq_status kvq_codebook_set_open(const char *path, const kvq_model_id *model, const char *label,
                                  kvq_codebook_set **out, kvq_err *err);
/* kvq_codebook_set_open with flags, and the weight check (docs/runtime.md "Weights"):
 * after step 3, when the artifact records a weight fingerprint (model.fingerprint),
 * model->fingerprint must be the same. A different one, or none, is KVQ_E_MISMATCH
 * with a message naming both fingerprints and the weights' names, unless flags has
 * KVQ_OPEN_ACCEPT_MODEL_MISMATCH: then the set opens and kvq_codebook_set_weights says
 * KVQ_WEIGHTS_MISMATCH_ACCEPTED (the caller warns with kvq_codebook_set_weights_note;
 * the library prints nothing). An artifact without a fingerprint (written before
 * fingerprints existed, or by hand) opens with KVQ_WEIGHTS_UNRECORDED.
 * kvq_codebook_set_open is this with flags 0. */
#define KVQ_OPEN_ACCEPT_MODEL_MISMATCH 1u
kvq_status kvq_codebook_set_open_ex(const char *path, const kvq_model_id *model,
                                     const char *label, unsigned flags, kvq_codebook_set **out,
                                     kvq_err *err);
typedef enum kvq_weights_check {
    KVQ_WEIGHTS_MATCH = 0,             /* same fingerprint */
    KVQ_WEIGHTS_UNRECORDED = 1,        /* the artifact records none: not checked */
    KVQ_WEIGHTS_MISMATCH_ACCEPTED = 2  /* different or missing, accepted by the flag */
} kvq_weights_check;
kvq_weights_check kvq_codebook_set_weights(const kvq_codebook_set *rt);
/* The message behind a check other than MATCH (both fingerprints); "" for MATCH. */
const char *kvq_codebook_set_weights_note(const kvq_codebook_set *rt);
void kvq_codebook_set_close(kvq_codebook_set *rt); /* NULL is fine */

kvq_codebook_method kvq_codebook_set_method(const kvq_codebook_set *rt);
int32_t kvq_codebook_set_size(const kvq_codebook_set *rt); /* K */
int32_t kvq_codebook_set_groups(const kvq_codebook_set *rt);        /* G */
int32_t kvq_codebook_set_wrope_w(const kvq_codebook_set *rt);
int64_t kvq_codebook_set_wrope_b(const kvq_codebook_set *rt);
const kvq_model_id *kvq_codebook_set_model(const kvq_codebook_set *rt); /* the artifact's identity */
/* The codebook of (layer, KV head), or NULL for a layer without codebooks (those
 * layers attend fully, as the format specifies). */
const kvq_codebook *kvq_codebook_set_at(const kvq_codebook_set *rt, int32_t layer, int32_t head);
uint64_t kvq_codebook_set_bytes(const kvq_codebook_set *rt); /* codebook memory */

/* ==========================================================================
 * Decoding context
 * ========================================================================== */

typedef enum kvq_selector {
    KVQ_SELECT_FULL = 0,
    KVQ_SELECT_ORACLE = 1,
    KVQ_SELECT_CODEBOOK = 2,
    KVQ_SELECT_FIER = 3,
    KVQ_SELECT_QUEST = 4,
    KVQ_SELECT_MASS = 5
} kvq_selector;
#define KVQ_SELECT_COUNT 6

/* "full", "oracle", "codebook", "fier", "quest", "mass"; "unknown" otherwise. */
const char *kvq_selector_name(kvq_selector s);
/* Parses the names above, plus "artifact" and the codebook method names (vq, qavq, pq,
 * qapq, vq-postrope) for KVQ_SELECT_CODEBOOK; *method (may be NULL) receives the method
 * named, or -1. KVQ_E_INVALID_ARG naming the text otherwise. */
kvq_status kvq_selector_parse(const char *s, kvq_selector *sel, int *method, kvq_err *err);
int kvq_selector_needs_artifact(kvq_selector s); /* codebook, mass */

/* How the query heads of a GQA group share one selection. */
typedef enum kvq_group_score {
    KVQ_GROUP_SUM = 0, /* score with the sum of the group's queries (default) */
    KVQ_GROUP_MAX = 1  /* per-head scores, ranked by their maximum */
} kvq_group_score;

/* The retrieval budget K for n visible tokens: `count` tokens when count > 0, else
 * ceil(fraction * n) with fraction in (0, 1]; fraction 1 keeps every candidate. */
typedef struct kvq_budget {
    int64_t count;
    double fraction;
} kvq_budget;

/* "256" (count), "0.06" or "6%" (fraction of n), "all" (fraction 1). Counts are
 * 1 .. 2^40; fractions in (0, 1]. KVQ_E_INVALID_ARG naming the text otherwise. */
kvq_status kvq_budget_parse(const char *s, kvq_budget *b, kvq_err *err);
/* K for n visible tokens (>= 1 for n >= 1). */
int64_t kvq_budget_tokens(const kvq_budget *b, int64_t n);
/* "256", "6%", "all" into buf (always NUL-terminated). */
void kvq_budget_format(const kvq_budget *b, char *buf, size_t cap);

/* Where the decode step's selection runs (the LUT of the scoring query, the score
 * gather over the codes and the top-k). CPU: the kvq_rk_* kernels. CUDA: the kernels of
 * runtime/cuda/retrieval_cuda.cu, for the codebook selector with KVQ_GROUP_SUM (other
 * selectors and KVQ_GROUP_MAX stay on the CPU); the exact attention over the selected
 * tokens stays on the CPU either way (docs/runtime.md). AUTO = CUDA when usable, else the
 * CPU, silently. CUDA in a build without the CUDA backend, on a machine without a device
 * or for a configuration the CUDA step does not cover logs one KVQ_LOG_WARN line (the
 * reason) when the context is created and runs on the CPU, with the CPU's results. */
typedef enum kvq_retrieval_device {
    KVQ_RETRIEVAL_DEVICE_AUTO = 0,
    KVQ_RETRIEVAL_DEVICE_CPU = 1,
    KVQ_RETRIEVAL_DEVICE_CUDA = 2
} kvq_retrieval_device;

/* "auto", "cpu", "cuda"; "unknown" otherwise. */
const char *kvq_retrieval_device_name(kvq_retrieval_device dev);
/* Parses the names above. KVQ_E_INVALID_ARG naming the text otherwise. */
kvq_status kvq_retrieval_device_parse(const char *s, kvq_retrieval_device *dev, kvq_err *err);
/* The device a request gets on this build and machine: CPU or CUDA, never AUTO. CUDA
 * when requested (or AUTO) and kvq_cuda_available(); a CUDA request that cannot be met
 * logs one KVQ_LOG_WARN line through cb (may be NULL) naming why. A caller creating
 * several contexts resolves once and passes the result, so the warning comes once. */
kvq_retrieval_device kvq_retrieval_device_resolve(kvq_retrieval_device want,
                                                  const kvq_callbacks *cb);

/* How the codebook and mass selectors put positions into the scoring query of the
 * candidates (distances delta = i - p_j in [a, b], the tokens between sinks and window);
 * vq-postrope always scores with q R_i. Exact scores are q R_delta . k_j.
 *   RB     q R_b, one fixed rotation (a2ats; b = the artifact's wrope.b)
 *   MEAN   q M with M the mean of R_delta over the candidates' distances: per pair m,
 *          rotation by the centre (a + b) / 2 times sin(N t/2) / (N sin(t/2)), N = b - a
 *          + 1, t = theta_m (the linear estimate that is right on average over the
 *          distances: fast pairs, whose rotation is unknown, are damped instead of
 *          rotated arbitrarily). One LUT per step, like RB.
 *   BANDS  MEAN over distance bands [a, 2a), [2a, 4a), ...: one LUT per band, each
 *          candidate scored with its band's (log2(b / a) + 1 LUTs per step). With
 *          increasing positions, in token order each band is a range of rows (one SIMD
 *          score gather per range with its band's LUT); in code order ("Row order")
 *          each code's run of sorted rows keeps token order, so it splits into one
 *          sub-run per band whose rows share a score, and the unsorted rows are ranges
 *          as in token order: under the group sum the top-k comes from those (code,
 *          band) groups without a score per row when the candidates outnumber them
 *          four to one, else each run is walked per band filling scores, then top-k.
 *          The same set every way (rows out of position order fall back to a scalar
 *          per-row band lookup). */
typedef enum kvq_score_pos {
    KVQ_SCORE_RB = 0,
    KVQ_SCORE_MEAN = 1,
    KVQ_SCORE_BANDS = 2
} kvq_score_pos;
const char *kvq_score_pos_name(kvq_score_pos s);          /* "rb" | "mean" | "bands" */
int kvq_score_pos_parse(const char *s, kvq_score_pos *out); /* 0 ok, -1 unknown */
/* The position mode and scoring query kvq calibrate measured and recorded
 * (KVQ_META_POS_MODE, KVQ_META_POS_SCORE): 1 and both set when recorded, 0 (untouched)
 * for an artifact without them. kvq run / eval use them unless given explicitly. */
int kvq_codebook_set_positions(const kvq_codebook_set *rt, kvq_positions *pos, kvq_score_pos *score);

typedef struct kvq_retrieval_params {
    kvq_selector selector;   /* default KVQ_SELECT_CODEBOOK */
    kvq_budget budget;       /* default 6% */
    int32_t sink;            /* S, >= 0 (default 4) */
    int32_t window;          /* w, >= 1; 0 = the artifact's wrope.w, 64 without one */
    int64_t wrope_b;         /* b of the exact step, >= 0; -1 = the artifact's wrope.b
                                 (2048 without one). The codebook's scoring query always
                                 uses the artifact's b. */
    kvq_positions positions; /* exact step: KVQ_POSITIONS_WROPE (default) or ROPE */
    kvq_score_pos score_pos; /* codebook scoring query (kvq_score_pos; default MEAN) */
    kvq_group_score group;   /* default KVQ_GROUP_SUM */
    double rerank;           /* codebook selector, two stages: R > 1 picks ceil(R k)
                                candidates (k the budget) by codebook score, reads their
                                keys and keeps the k with the best exact scores (the
                                oracle's: same position mode and GQA rule); 0 or 1 = no
                                such rule (one stage unless rerank_extra > 0). 0 or 1 ..
                                64 (default 0: the default reranks by rerank_extra). KV
                                read per step: codes + the candidates' key rows + k value
                                rows (+ sinks, window) */
    int32_t resid_bits;      /* codebook selector, residual stage (runtime/select/codebook/resid.c):
                                each key's residual from its centroid kept at 1, 2, 4 or
                                8 bits per channel plus an f32 scale (rotated by the
                                token's position under ROPE); 0 = off (default 1). At 1
                                and 2 bits a candidate scores its first-stage score +
                                q . r^ through a sign table (2 bits: two sign planes;
                                under resid_group MAX per head, the best kept); 4 and 8
                                bits the slower q . (R c + r^) */
    double resid_wide;       /* with resid_bits: the codebook picks ceil(W k2) candidates
                                (k2 = the rerank's count, or k without the rerank), at
                                most resid_share of them but k2 or more; their
                                residual scores keep k2; 0 (off) or W in [1, 64]
                                (default 64: with resid_share 1, every candidate) */
    kvq_group_score resid_group; /* with resid_bits: the stage's rule over the GQA group:
                                KVQ_GROUP_SUM (the summed query) or KVQ_GROUP_MAX (the
                                default: each head scores with its own first-stage LUT
                                and query, the best head's score kept; always under
                                group MAX) */
    double tau;              /* mass selector, (0, 1] (default 0.9) */
    int32_t fier_group;      /* tokens per fier quantization group, >= 1 (default 32) */
    int32_t quest_page;      /* tokens per quest page, >= 1 (default 16) */
    kvq_dtype cache_dtype;   /* KVQ_DT_F16 (default) or KVQ_DT_F32, for K and V (under
                                ROPE the keys are rotated in f32, then rounded to it) */
    int prefill_full;        /* 1 (default): chunks of more than one token attend
                                 exactly; 0: every query row uses retrieval */
    int measure;             /* 1: also compute exact attention per step and collect
                                 the quality figures of kvq_retrieval_stats (slow) */
    int code_order;          /* 1 (default): keep the far rows of single-group codebooks
                                 in code order (see "Row order" above); 0: token order */
    int64_t max_tokens;      /* longest sequence, >= 1 (default 1 << 20) */
    int32_t threads;         /* KV heads in parallel, >= 1 (default 1) */
    kvq_isa isa;             /* kernels (default kvq_isa_best(); lowered as needed) */
    kvq_retrieval_device device; /* selection kernels (default KVQ_RETRIEVAL_DEVICE_CPU) */
    kvq_callbacks cb;
    double rerank_extra;     /* codebook selector, two stages: E > 0 also reranks when
                                R <= 1; the candidates are then the larger of ceil(R k)
                                and k + ceil(E nc) (nc the far candidates): the budget
                                plus a fixed share of the cache, so the rerank's extra
                                key rows cost the same bytes per token at every budget.
                                [0, 1) (default 0.08; 0 with rerank <= 1: one stage) */
    double resid_share;      /* with resid_bits: the largest share of the candidates the
                                residual stage scores at 1 bit (at 2 bits the share that
                                reads as many bytes); (0, 1] (default 1) */
} kvq_retrieval_params;

kvq_retrieval_params kvq_retrieval_params_default(void);

/* Bits of selector metadata per cached token and KV head that a selector scores
 * from, amortized over its groups: codebook / mass G log2 K (stored as G u16 codes;
 * the codebook's plus d b + 32 with the residual stage of b bits), fier
 * d + 2 d 32 / fier_group (1-bit keys and the group's f32 min / max), quest
 * 2 d 32 / quest_page (the page's f32 min / max), oracle 16 d (the f16 key itself),
 * full 0. rt is needed for codebook and mass (0 without it). */
double kvq_selector_bits_per_key(kvq_selector s, const kvq_retrieval_params *p,
                                 const kvq_codebook_set *rt, int32_t head_dim);

typedef struct kvq_retrieval kvq_retrieval;

/* Creates a context for a model with configuration cfg. rt (may be NULL) must have
 * been opened for the same model: its layers, heads, head dim and RoPE are checked
 * again (KVQ_E_MISMATCH naming the field); it must outlive the context. The codebook
 * and mass selectors need rt (KVQ_E_INVALID_ARG without one).
 * Errors: INVALID_ARG (a parameter, named), MISMATCH, NOMEM, BACKEND (device memory or
 * an upload failed with device CUDA).
 * Memory per cached token and (layer, KV head): 2 d x 2 or 4 bytes of K and V (the
 * cache dtype's, for the rotated keys of ROPE as for pre-RoPE keys: 256 bytes at
 * d 64 in f16), plus
 * 2 G bytes of codes (codebook, mass), ceil(d b / 8) + 4 bytes with the codebook's
 * residual stage of b bits (packed), d/8 + 8d/fier_group bytes (fier) or 8d/quest_page bytes (quest); plus
 * per-thread scratch of about n (nq + 3) floats (n (nq + 3 + d) with ROPE, measure
 * or prefill). */
kvq_status kvq_retrieval_create(const kvq_model_config *cfg, const kvq_codebook_set *rt,
                                const kvq_retrieval_params *p, kvq_retrieval **out, kvq_err *err);
void kvq_retrieval_free(kvq_retrieval *r); /* NULL is fine */

/* The attention backend of this context (user = r). Its attend() appends the chunk to
 * the cache (encoding every key with the layer's codebook) and attends as described
 * above; errors: INVALID_ARG (a sequence longer than max_tokens, a position out of
 * [0, 2^31)), NOMEM, and those of kvq_codebook_encode. Its reset() forgets the
 * sequence (the statistics stay). */
kvq_attn_backend kvq_retrieval_backend(kvq_retrieval *r);
/* Appends n tokens (pre-RoPE k, v [n, n_kv_heads, head_dim], positions pos) to the
 * cache of one layer without attending: what an engine that attends the prompt itself
 * gives kvq (kvq/engine.h). The next attend() of that layer sees them as earlier
 * tokens. Errors: those of attend(). */
kvq_status kvq_retrieval_append(kvq_retrieval *r, int32_t layer, int32_t n, const int64_t *pos,
                                const float *k, const float *v, kvq_err *err);
void kvq_retrieval_reset(kvq_retrieval *r);
int64_t kvq_retrieval_length(const kvq_retrieval *r); /* tokens cached (every layer) */

/* Per-layer attention (archs-rt). The local layers of a model, the sliding-window
 * layers of a model that also has global layers (gemma2, gemma3, qwen2 with
 * max_window_layers), need no retrieval: the context attends each exactly over its
 * window (the last W tokens, the query's own included, as transformers and llama.cpp
 * define it) with the layer's own RoPE, score scale and softcap (kvq_model_layer_attn),
 * keeping only those rows (f32), and kvq fit fits them no codebook. The other layers
 * are retrieved with the model's score scale and softcap. kvq_retrieval_layers_note
 * writes what that means for c into buf[cap]: "layers 0-4 of 6 slide over 8 tokens:
 * attended exactly, no retrieval" (the layers as ranges), or "" when c has no local
 * layer; returns 1 when it has. */
int kvq_retrieval_layers_note(const kvq_model_config *c, char *buf, size_t cap);
/* 1 when layer `layer` of c is local (above), else 0. */
int kvq_retrieval_layer_local(const kvq_model_config *c, int32_t layer);
const kvq_retrieval_params *kvq_retrieval_get_params(const kvq_retrieval *r);
/* The device the context's selection runs on: CPU or CUDA (never AUTO). */
kvq_retrieval_device kvq_retrieval_device_used(const kvq_retrieval *r);

/* Statistics since creation or the last stats_reset, summed over retrieval steps: one
 * step is one (query row, layer, KV head) attended by retrieval with at least one
 * candidate (n > S + w). Divide the sums by `steps` (or `measured`) for means. */
typedef struct kvq_retrieval_stats {
    uint64_t steps;
    double visible;        /* sum of n (the tokens each query sees: at most W under a
                              sliding window) */
    double attended;       /* sum of attended tokens (sinks + window + selected) */
    double bytes_read;     /* selector metadata (codes, bits, page bounds) plus the
                                K and V rows attended, plus the key rows of rerank
                                candidates not kept, in the cache's storage */
    double bytes_full;     /* K and V bytes full attention reads in the same steps */
    double bytes_codebook; /* codebook bytes read to build LUTs (not KV cache) */
    /* measure = 1 only: */
    uint64_t measured;
    double recall_topk; /* |selected ∩ oracle's selection| / K (1 when every
                                candidate fits the budget) */
    double recall_mass; /* exact attention mass on the attended tokens (exact
                                RoPE, mean over the group's query heads) */
    double out_rel_err; /* ||o - o_exact|| / ||o_exact||, mean over the group */
} kvq_retrieval_stats;

void kvq_retrieval_stats_get(const kvq_retrieval *r, kvq_retrieval_stats *out);
void kvq_retrieval_stats_reset(kvq_retrieval *r);
/* a += b, field by field (the one place the sums are added: a new field goes here). */
void kvq_retrieval_stats_add(kvq_retrieval_stats *a, const kvq_retrieval_stats *b);

/* One selector setting of kvq_retrieval_probe: the selector, its budget and (mass) tau. */
typedef struct kvq_retrieval_setting {
    kvq_selector selector;
    kvq_budget budget;
    double tau;
} kvq_retrieval_setting;

/* Measures the last token cached in `layer` (appended by attend or kvq_retrieval_append)
 * as a query row under n_set settings at once: stats[c] (overwritten) gets what a
 * context with r's parameters but setting c's selector, budget and tau would add to its
 * statistics attending that row alone by retrieval, summed over the KV heads, except
 * recall_topk (0: no oracle selection). q: [n_heads, head_dim] the row's pre-RoPE
 * queries. The keys are encoded once (by the append) and the row's exact attention is
 * computed once for every setting. r must have been created with measure = 1; a
 * setting's selector is r's own, or codebook / mass when r's is either (the same codes
 * and row order).
 * The cache and r's statistics are unchanged. Runs on the calling thread.
 * Errors: INVALID_ARG (naming the setting), NOMEM, BACKEND (device selection),
 * UNSUPPORTED with a compressed KV cache attached (kvq/kvcache.h: no rows of its own). */
kvq_status kvq_retrieval_probe(kvq_retrieval *r, int32_t layer, const float *q, int32_t n_set,
                               const kvq_retrieval_setting *set, kvq_retrieval_stats *stats,
                               kvq_err *err);

/* The selection of the last retrieval step of (layer, KV head): the candidate token
 * indices chosen (ascending, sinks and window not included) and the count, valid until
 * the next attend call or the next call of this function. For tests. NULL / 0 when
 * there was none. */
const int32_t *kvq_retrieval_last_selection(const kvq_retrieval *r, int32_t layer, int32_t head,
                                            int64_t *count);
/* The codes of cached token j of (layer, KV head): G values, or NULL when the
 * context keeps no codes or j is out of range. For tests (a linear search while the
 * rows are in code order). */
const uint16_t *kvq_retrieval_codes(const kvq_retrieval *r, int32_t layer, int32_t head, int64_t j);
/* How many far rows of (layer, KV head) are in code order ("Row order"); 0 when the
 * rows are in token order. */
int64_t kvq_retrieval_sorted_rows(const kvq_retrieval *r, int32_t layer, int32_t head);

/* What a context holds for the KV (docs/kvcache.md "With retrieval"): bytes per cached
 * token, over its retrieval layers and KV heads (local layers' rings not included), at
 * the formats' sizes (the growth's spare capacity not counted):
 *   rows       its own K and V rows, 2 head_dim x the cache dtype's bytes a layer and KV
 *              head; 0 while a compressed cache is attached (kvq_retrieval_set_kvcache:
 *              the context then allocates none)
 *   selector   the selector's data: codebook / mass codes (2 bytes a group), the residual
 *              stage's packed bits and f32 scale; Quest's page bounds (2 head_dim f32 a
 *              page of quest_page tokens); FIER's bits (head_dim / 8 bytes) and group
 *              ranges (2 head_dim f32 a group of fier_group)
 *   positions  the positions (8 bytes a layer) and, for heads whose rows are in code
 *              order (kvq_retrieval_sorted_rows > 0), the rows' tokens (4 bytes)
 *   rope       the RoPE table's cos and sin of a position (4 head_dim bytes)
 *   total      their sum
 * and scratch: the bytes its per-thread scratch holds now (O(tokens) per thread, for one
 * head at a time; the selectors' own scratch not included). A compressed cache's own
 * bytes are kvq_kvcache_bytes (kvq/kvcache.h): the two together are what the process
 * holds for the KV. */
typedef struct kvq_retrieval_held {
    double rows, selector, positions, rope, total;
    double scratch;
} kvq_retrieval_held;
void kvq_retrieval_held_get(const kvq_retrieval *r, kvq_retrieval_held *out);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_RUNTIME_H */
