/*
 * kvq/thresholds.h — the thresholds stage (`kvq profile`): LeanKV precision classes,
 * PATS mantissa-truncation schedules and retrieval budgets, profiled as memory versus
 * quality on a capture (and optionally perplexity on held-out text), with the least
 * memory within a tolerance written into the artifact.
 *
 * Four levels, each usable on its own:
 *
 *   per-vector quantization   kvq_asymq_*: asymmetric b-bit codes with an f16 scale and
 *                             zero point per vector (the LeanKV storage), scalar reference
 *   policies                  kvq_leankv_* (significance, the prompt rule, Algorithm 1 of
 *                             the generation phase, bytes per token) and kvq_pats_*
 *                             (b(t) schedules, truncation, 64-byte block packing)
 *   simulated caches          kvq_simcache: a kvq_attn_backend (kvq/model.h) that runs
 *                             exact attention over a cache compressed by LeanKV or PATS,
 *                             so the forward pass measures perplexity with it
 *   profiling                 kvq_profile_*: the grids over a capture directory (and a
 *                             model + corpus), the selection, and the artifact writer
 *
 * ---- LeanKV (leankv paper, section 4) -----------------------------------------------
 * Tokens are counted from 1: token i of a sequence is the one at position i - 1, so
 * 1/i is the uniform share of attention a query at position i - 1 gives each of the i
 * tokens it sees. Significance of token i in a sequence of N tokens:
 *     sig_i = max over the query heads g of the KV head's GQA group of
 *             (1 / (N - i)) * sum_{r = i+1 .. N} a_g(r, i)
 * the mean attention it receives from the N - i later queries (a_g(r, i) = softmax over
 * j <= r of q_r R_r . k_j R_j / sqrt(d)). Token N has no later query: sig = +inf.
 * When a capture stores only a sample of the queries, the mean is over the stored later
 * queries, and a token with none has sig = +inf (it is kept).
 * Prompt phase: the last W tokens (W = window, default 64) are HIGH; any other token i is
 *     HIGH (K8V4)   if sig_i >= alpha_h / i
 *     LOW  (K4V2)   else if sig_i >= alpha_l / i
 *     PRUNED        otherwise.
 * Generation phase (the paper's Algorithm 1, thresholds T_h = alpha_h / N and
 * T_l = alpha_l / N with N the current length): each new token enters the window as
 * HIGH; the token that leaves the window, t_c, becomes HIGH if sig >= T_h, LOW if
 * sig >= T_l, else it is pruned; when it went to HIGH (LOW), the least significant token
 * t_v of that section (outside the window; ties to the earliest) is moved to LOW when
 * T_l <= sig < T_h, pruned when sig < T_l (a LOW victim is pruned when sig < T_l).
 * Storage (kvq_leankv_token_bytes): K and V quantized per vector (kvq_asymq), each with
 * an f16 scale and an f16 zero point: HIGH costs ceil(8d/8) + ceil(4d/8) + 8 bytes per
 * token and KV head, LOW ceil(4d/8) + ceil(2d/8) + 8, PRUNED 0; the f16 reference cache
 * costs 4d. The paper's per-page token scores and positions are not counted.
 *
 * ---- PATS (pats paper) -----------------------------------------------------------------
 * The token at position t in 1..T of a sequence of T tokens keeps its K and V entries
 * in the cache dtype (f16: 10 mantissa bits, bf16: 7) with the low b(t) mantissa bits
 * set to zero, b(t) = max(b_min, min(b_max, f(t, T))). The paper describes the three
 * schedules in words (linear in t; the middle one peaking mid-context); kvq uses, with
 * D = b_max - b_min, den = max(T - 1, 1) and round(x) = floor(x + 1/2) (exact integer
 * arithmetic):
 *     old-heavy     f = b_max - round(D (t - 1) / den)          oldest tokens lose most
 *     new-heavy     f = b_min + round(D (t - 1) / den)          sink tokens keep most
 *     middle-heavy  f = b_max - round(D |2t - T - 1| / den)     both ends keep most
 * b_max may not exceed the dtype's mantissa bits: truncation never reaches the exponent.
 * Memory (the paper's packing): K and V are per-head [T, d] tensors; row t is stored
 * with w = 16 - b(t) bits per element in 64-byte blocks of B = floor(512 / w) elements
 * (the paper writes ceil(512 / w), which does not fit a block when w does not divide
 * 512), each row starting a new block: 64 * ceil(d / B) bytes per row, so a token costs
 * 2 * 64 * ceil(d / B) bytes per KV head against 4d for the f16 cache. With d <= 32 a
 * row costs a whole block, at least f16's 2d bytes, and no schedule saves anything: a
 * setting whose packed memory is not below the f16 cache's is never chosen, so there
 * the PATS table chooses none. kvq also reports the unpacked bits, sum over tokens of
 * 2 d (16 - b(t)).
 *
 * ---- Quality ---------------------------------------------------------------------------
 * Every capture sequence of N tokens is split into a prompt (the first
 * P = floor(prompt_fraction * N) tokens) and a continuation. The evaluated queries are
 * the stored queries at rows P .. N-1. Their exact output o = sum_j a(r, j) v_j (f32
 * data, RoPE at the captured positions, double sums) is compared with the output over
 * the compressed cache:
 *     LeanKV   prompt attention is exact and fills the significance sums; at the end of
 *              the prompt the prompt rule classifies and quantizes the cache; each
 *              continuation token then runs the generation phase, and its query attends
 *              over the dequantized, unpruned tokens (its own token included, K8V4) and
 *              adds its attention to the significance sums;
 *     PATS     every token's post-RoPE key and value are rounded to the dtype and
 *              truncated by b(t) with T = N;
 *     budget   the runtime (kvq/runtime.h) attends each evaluated row by retrieval with
 *              its `measure` statistics, over the cache of every token before it (the
 *              rows before it go in as prefill chunks: a step reads the cache, never
 *              earlier outputs); only continuation rows count.
 * The error of a setting is the mean over evaluated (row, query head) of
 * ||o~ - o|| / ||o|| (rows with o = 0 are skipped), the same figure as the runtime's
 * out_rel_err. Memory is the cache at the end of each sequence (LeanKV, PATS) as a
 * fraction of the f16 cache of the same tokens; for budgets it is the fraction of the
 * visible tokens attended (kvq_retrieval_stats.attended / visible).
 * Sampling (kvq_profile_params.sample_rows, sample_jobs): the figures above are
 * estimated from sampled rows of each sequence and, for the LeanKV/PATS grid and the
 * budget/tau pass, first from a random share of each layer's jobs ((sequence, KV head);
 * the budget pass: sequences), each with its 95% interval (over jobs where the job
 * sample left a setting). A setting that may be within tolerance or the best by the job
 * sample is measured on every job, and one whose choice the row sample leaves open on
 * every row, so the choice is the one every row of every job would make (tested on the
 * demo model); only settings that can be neither keep the sample's figures.
 * Perplexity (with a model and a corpus): the corpus is cut into sequences; the prompt
 * part runs exactly, and the perplexity is over the predictions made at positions
 * P .. n-2 (those whose query sees the compressed cache), against the same positions
 * with full attention.
 *
 * ---- Selection -----------------------------------------------------------------------
 * The metric is perplexity when it was measured, else the capture error. A setting is
 * within tolerance when err <= tol (default 0.05) or ppl <= ppl_full * (1 + tol)
 * (default tol 0.01). Among those, the least memory wins (ties: fewer unpacked bits for
 * PATS, then the lower error, then the earlier row). When no setting is within
 * tolerance, the best quality found is kept (ties: less memory), `met` is 0, and a
 * warning goes to the log; the artifact says so in its metadata.
 */
#ifndef KVQ_THRESHOLDS_H
#define KVQ_THRESHOLDS_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/thresholds.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kvq/artifact.h"
#include "kvq/capture_dir.h"
#include "kvq/common.h"
#include "kvq/dist.h"
#include "kvq/model.h"
#include "kvq/runtime.h"
#include "kvq/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==========================================================================
 * Per-vector asymmetric quantization (scalar reference)
 * ==========================================================================
 *
 * For a vector x[0..n): s = (max - min) / (2^bits - 1), z = -min (leankv eq. 2). Both
 * are stored as f16: z16 = f16(z) rounded to nearest even, s16 = the smallest f16 >= s
 * (rounded up, so the codes span the range). Codes q_t = clamp(floor((x_t + z16) / s16
 * + 1/2), 0, 2^bits - 1) in float; dequantized x^_t = s16 * q_t - z16 (float). A
 * constant vector gets s16 = 0 and codes 0. Error bound, for every t:
 *     |x_t - x^_t| <= s16 / 2 + |min + z16| (+ float rounding of a few ulps)
 */
#define KVQ_ASYMQ_MAX_BITS 8

typedef struct kvq_asymq_meta {
    uint16_t scale; /* f16 bits of s16 */
    uint16_t zero;  /* f16 bits of z16 */
} kvq_asymq_meta;

/* Quantizes x [n] to codes [n] (one code per byte, < 2^bits). n >= 1, bits 1..8.
 * Errors: KVQ_E_INVALID_ARG (n, bits), KVQ_E_NUMERIC (a non-finite value, or a range or
 * minimum too large for f16: |min| or s above 65504). Cost: 2n. */
kvq_status kvq_asymq_quantize_ref(const float *x, int32_t n, int32_t bits, uint8_t *codes,
                                  kvq_asymq_meta *meta, kvq_err *err);
/* x^ [n] from codes [n] and meta. */
void kvq_asymq_dequantize_ref(const uint8_t *codes, int32_t n, kvq_asymq_meta meta, float *out);
/* Quantize then dequantize: out [n] (may alias x). Errors as quantize. */
kvq_status kvq_asymq_roundtrip(const float *x, int32_t n, int32_t bits, float *out,
                               kvq_err *err);
/* Bytes of one stored vector: ceil(n * bits / 8) packed codes + 4 (f16 scale, zero). */
uint64_t kvq_asymq_bytes(int32_t n, int32_t bits);

/* ==========================================================================
 * LeanKV
 * ========================================================================== */

typedef enum kvq_leankv_class {
    KVQ_LEANKV_PRUNED = 0,
    KVQ_LEANKV_LOW = 1,   /* K4V2 by default */
    KVQ_LEANKV_HIGH = 2   /* K8V4 by default */
} kvq_leankv_class;

typedef struct kvq_leankv_params {
    double alpha_h;       /* HIGH threshold factor, >= 0 (default 1) */
    double alpha_l;       /* LOW threshold factor, >= 0 (default 0.02) */
    int32_t window;       /* W recent tokens kept HIGH, >= 0 (default 64) */
    int32_t k_high, v_high; /* bits of HIGH keys / values, 1..8 (default 8, 4) */
    int32_t k_low, v_low;   /* bits of LOW keys / values, 1..8 (default 4, 2) */
} kvq_leankv_params;

kvq_leankv_params kvq_leankv_params_default(void);
/* KVQ_E_INVALID_ARG naming the field (negative or non-finite alpha, alpha_l above
 * alpha_h, bits, window): the runtime cache's check (kvq/kvcache.h refuses the same). */
kvq_status kvq_leankv_check(const kvq_leankv_params *p, kvq_err *err);

/* Significance from attention probabilities.
 *   attn [gs, n, n]: attn[(g*n + r)*n + j] = a_g(r, j), row r a causal distribution
 *   sig  [n]: sig[j] = max_g mean_{r > j} attn(g, r, j); sig[n-1] = +inf
 * (0-based j here is token i = j + 1 of the contract above). Cost: gs n^2 / 2. */
void kvq_leankv_significance(const double *attn, int32_t gs, int64_t n, double *sig);

/* The threshold rule for one token: HIGH if sig >= alpha_h / i, LOW if >= alpha_l / i,
 * else PRUNED (i >= 1: the token's 1-based index in the prompt phase, the current length
 * N in the generation phase). NaN significance is PRUNED. */
kvq_leankv_class kvq_leankv_rule(double sig, int64_t i, const kvq_leankv_params *p);

/* Prompt phase for n tokens: cls[j] = HIGH for j >= n - window, else
 * kvq_leankv_rule(sig[j], j + 1, p).   sig, cls: [n] */
void kvq_leankv_classify_prompt(const double *sig, int64_t n, const kvq_leankv_params *p,
                                uint8_t *cls);

/* One generation step (Algorithm 1) after token n-1 was appended (cls[n-1] is set to
 * HIGH here). When n > window, the token c = n - 1 - window leaves the window and is
 * classified with the thresholds alpha / n, and then the victim of its section among
 * tokens 0..c as described above. sig [n] holds the current significance of every
 * token; cls [n] the current classes (updated). Returns the victim's index, or -1 when
 * there was none (c pruned, or n <= window). Cost: O(n). */
int64_t kvq_leankv_generation_step(const double *sig, int64_t n, const kvq_leankv_params *p,
                                   uint8_t *cls);

/* Bytes of one token of one KV head (K and V) with head dim d in class c. */
uint64_t kvq_leankv_token_bytes(int32_t d, kvq_leankv_class c, const kvq_leankv_params *p);

/* ==========================================================================
 * PATS
 * ========================================================================== */

typedef enum kvq_pats_schedule {
    KVQ_PATS_OLD_HEAVY = 0,
    KVQ_PATS_NEW_HEAVY = 1,
    KVQ_PATS_MIDDLE_HEAVY = 2
} kvq_pats_schedule;
#define KVQ_PATS_N_SCHEDULES 3

/* "old-heavy", "new-heavy", "middle-heavy"; "unknown" otherwise. */
const char *kvq_pats_schedule_name(kvq_pats_schedule s);
/* 0 and *s set, or -1 for an unknown name. */
int kvq_pats_schedule_parse(const char *name, kvq_pats_schedule *s);

typedef struct kvq_pats_params {
    kvq_pats_schedule schedule; /* default middle-heavy */
    int32_t b_min;              /* >= 0 (default 2, as the paper's perplexity runs) */
    int32_t b_max;              /* b_min .. mantissa bits of dtype (default 8) */
    kvq_dtype dtype;            /* cache dtype: KVQ_DT_F16 (default) or KVQ_DT_BF16 */
} kvq_pats_params;

kvq_pats_params kvq_pats_params_default(void);
/* Mantissa bits of a 16-bit float dtype: 10 (F16), 7 (BF16), -1 otherwise. */
int32_t kvq_pats_mantissa_bits(kvq_dtype dt);
/* KVQ_E_INVALID_ARG naming the problem: unknown schedule, dtype not F16/BF16,
 * b_min < 0, b_min > b_max, b_max above the mantissa bits ("would truncate into the
 * exponent"). */
kvq_status kvq_pats_check(const kvq_pats_params *p, kvq_err *err);

/* b(t) for 1 <= t <= T (values outside are clamped into 1..T). p must pass check. */
int32_t kvq_pats_bits(const kvq_pats_params *p, int64_t t, int64_t T);

/* Rounds x [n] to dtype (nearest even) and zeroes the low `bits` mantissa bits:
 * out [n] (may alias x). bits 0 .. mantissa bits. */
void kvq_pats_truncate(const float *x, int32_t n, kvq_dtype dt, int32_t bits, float *out);

/* Bytes of one packed row of d elements of w = 16 - bits bits: 64 * ceil(d / B),
 * B = floor(512 / w). */
uint64_t kvq_pats_row_bytes(int32_t d, int32_t bits);

/* ==========================================================================
 * Simulated compressed cache: an attention backend for the forward pass
 * ========================================================================== */

typedef enum kvq_simcache_kind {
    KVQ_SIMCACHE_LEANKV = 1,
    KVQ_SIMCACHE_PATS = 2
} kvq_simcache_kind;

typedef struct kvq_simcache kvq_simcache;

/* A backend for a model with configuration cfg that keeps, per (layer, KV head), the
 * post-RoPE keys and values of the sequence and attends exactly over the cache as the
 * policy compresses it (see "Quality" above). lk is used for LEANKV, pt for PATS (the
 * other may be NULL); both are copied. threads >= 1: KV heads in parallel.
 * Errors: KVQ_E_INVALID_ARG (kind, params, config), KVQ_E_NOMEM.
 * Memory per cached token and (layer, KV head): 4 d floats plus (LeanKV) gs + 2
 * doubles. */
kvq_status kvq_simcache_create(const kvq_model_config *cfg, kvq_simcache_kind kind,
                               const kvq_leankv_params *lk, const kvq_pats_params *pt,
                               int32_t threads, kvq_simcache **out, kvq_err *err);
void kvq_simcache_free(kvq_simcache *s); /* NULL is fine */

/* The shape of the next sequence: its length T (PATS's T; 0 = unknown: the schedule
 * then uses the tokens seen so far, i.e. t = T for the new token) and its prompt length
 * P (LeanKV: tokens 0..P-1 attend exactly; 0 = no prompt phase). Call after
 * kvq_forward_reset (whose reset clears the cache and the shape). */
void kvq_simcache_begin(kvq_simcache *s, int64_t seq_len, int64_t prompt_len);
/* The backend (user = s). attend errors: KVQ_E_INVALID_ARG (layer out of range, a
 * position outside [0, 2^31)), KVQ_E_NUMERIC (a value LeanKV cannot quantize in f16),
 * KVQ_E_UNSUPPORTED (a layer with a sliding window asked to attend past it: the
 * simulation does not apply windows), KVQ_E_NOMEM. */
kvq_attn_backend kvq_simcache_backend(kvq_simcache *s);

/* Memory of the cache now, summed over layers and KV heads. */
typedef struct kvq_simcache_memory {
    double bytes;       /* compressed cache (LeanKV classes, PATS packed rows) */
    double bytes_f16;   /* the f16 cache of the same tokens: 4 d per token and head */
    double bits;        /* PATS: unpacked bits 2 d (16 - b); LeanKV: 8 * bytes */
    double n_high, n_low, n_pruned; /* LeanKV token counts (x heads); PATS: 0 */
} kvq_simcache_memory;
void kvq_simcache_memory_get(const kvq_simcache *s, kvq_simcache_memory *m);

/* ==========================================================================
 * Profiling
 * ========================================================================== */

/* Which knobs to profile (bit set). */
#define KVQ_KNOB_LEANKV 1u
#define KVQ_KNOB_PATS 2u
#define KVQ_KNOB_BUDGET 4u  /* retrieval budget of the artifact's codebook selector */
#define KVQ_KNOB_MASS 8u    /* hcattention's tau for the mass selector */
#define KVQ_KNOB_ALL 15u

/* One table of a profile: rows of doubles under named columns (NaN = not measured). */
#define KVQ_PROFILE_MAX_COLS 8
typedef struct kvq_profile_table {
    const char *name;                        /* "leankv", "pats", "budget", "mass" */
    int32_t n_cols;
    const char *cols[KVQ_PROFILE_MAX_COLS];  /* static strings */
    int64_t n_rows;
    double *rows;                            /* [n_rows, n_cols], owned by the result */
    int64_t chosen;                          /* selected row, -1 when not profiled */
    int met;                                 /* 1: the chosen row is within tolerance */
    char skipped[256];                       /* why it was not profiled, or "" */
    double *err_ci;                          /* [n_rows] half-width of the 95% interval
                                                of the err column from the measured rows
                                                (normal approximation over the (row,
                                                query head) pairs); 0 where every
                                                evaluated row was measured; NULL when the
                                                table has no err column measured; for a
                                                row of job_sampled, over jobs */
    uint8_t *job_sampled;                    /* [n_rows] 1: the row's figures (err and
                                                the token shares) come from the job sample
                                                alone (kvq_profile_params.sample_jobs) */
} kvq_profile_table;

/* Column layouts (indices into a row). memory: fraction of the f16 cache; attended:
 * fraction of visible tokens attended; err: mean relative attention-output error;
 * ppl: perplexity (NaN without a model). */
enum { KVQ_PL_ALPHA_H, KVQ_PL_ALPHA_L, KVQ_PL_MEMORY, KVQ_PL_HIGH, KVQ_PL_LOW, KVQ_PL_PRUNED,
       KVQ_PL_ERR, KVQ_PL_PPL, KVQ_PL_NCOLS };           /* high/low/pruned: token shares */
enum { KVQ_PP_SCHEDULE, KVQ_PP_B_MIN, KVQ_PP_B_MAX, KVQ_PP_MEMORY, KVQ_PP_BITS, KVQ_PP_ERR,
       KVQ_PP_PPL, KVQ_PP_NCOLS };                      /* bits: unpacked fraction of 16 */
enum { KVQ_PB_VALUE, KVQ_PB_ATTENDED, KVQ_PB_MASS, KVQ_PB_ERR, KVQ_PB_PPL, KVQ_PB_NCOLS };
                                                        /* value: fraction or tau; mass:
                                                           exact attention mass kept */
enum { KVQ_PROFILE_LEANKV, KVQ_PROFILE_PATS, KVQ_PROFILE_BUDGET, KVQ_PROFILE_MASS,
       KVQ_PROFILE_N_TABLES };

typedef struct kvq_profile_params {
    unsigned knobs;            /* KVQ_KNOB_* (default KVQ_KNOB_ALL) */
    double tolerance;          /* < 0 (default): 0.05 for the error, 0.01 for perplexity */
    double prompt_fraction;    /* P / N, in [0, 1) (default 0.5) */
    kvq_leankv_params leankv;  /* window and bits (alphas come from the grids) */
    const double *alpha_h;     /* grid [n_alpha_h]; NULL: 0, 1, 2, 3, 4, 5 */
    size_t n_alpha_h;
    const double *alpha_l;     /* grid [n_alpha_l]; NULL: 0, 0.02, 0.04, 0.06, 0.08, 0.1 */
    size_t n_alpha_l;
    int32_t pats_b_min;        /* >= 0 (default 2) */
    kvq_dtype pats_dtype;      /* KVQ_DT_F16 (default) or BF16; b_max runs b_min ..
                                  mantissa bits for every schedule */
    const double *budgets;     /* fractions in (0, 1] [n_budgets]; NULL: 1, 2, 3, 5, 8,
                                  10, 15, 20, 25 % */
    size_t n_budgets;
    const double *taus;        /* in (0, 1] [n_taus]; NULL: 0.5 .. 0.99 (7 values) */
    size_t n_taus;
    kvq_retrieval_params retrieval; /* sink, window, positions, group, cache dtype of the
                                  budget runs (selector, budget, tau, measure and
                                  prefill_full are set per run) */
    const char *model;         /* GGUF or HF path for perplexity; NULL: capture only */
    const char *corpus;        /* corpus spec (required with model) */
    uint64_t corpus_seed;      /* synthetic corpus sources (default 0) */
    uint32_t ppl_seq_len;      /* tokens per sequence (default 0: the capture's seq_len) */
    uint64_t ppl_max_tokens;   /* held-out tokens (default 4096) */
    int32_t threads;           /* >= 1 (default 1); results do not depend on it */
    kvq_callbacks cb;          /* progress ("profile: leankv", ...) and warnings */
    int64_t sample_rows;       /* the error (LeanKV, PATS, budgets) is measured on this
                                  many evenly spaced continuation query rows of each
                                  sequence (default 32; 0 = every row); settings whose
                                  interval straddles the tolerance where it could change
                                  the choice are measured again on every row; PATS
                                  settings that save no memory against the f16 cache
                                  (never chosen) on a quarter of the sampled rows */
    double sample_jobs;        /* with sample_rows > 0: every LeanKV/PATS setting is
                                  first measured on this fraction of each layer's
                                  (sequence, KV head) jobs, a random sample by a fixed
                                  seed (default 1/3; 1 = every job); the settings that
                                  may be within the tolerance or the best are then
                                  measured on the other jobs, the others keep the
                                  sample's figures with an interval over jobs. Every
                                  job when the sample would have fewer than 2 jobs a
                                  layer or 20 in all */
    int reference;             /* 1: LeanKV and PATS by the reference path (one
                                  simulated cache per setting, every row; slow), which
                                  the tests compare the default path with (default 0) */
    const kvq_dist *dist;      /* NULL (default): one process; else the LeanKV/PATS grid
                                  and the budget/tau passes are split among its ranks by
                                  layers (kvq/dist.h, the same bytes for any rank count);
                                  rank 0 runs the perplexity (model) and writes
                                  (docs/mpi.md) */
} kvq_profile_params;

kvq_profile_params kvq_profile_params_default(void);

typedef struct kvq_profile_result {
    int metric_ppl;            /* 1: selection by perplexity, 0: by the capture error */
    double tolerance;          /* as applied */
    double ppl_full;           /* full-attention perplexity (NaN without a model) */
    int64_t n_sequences;       /* capture sequences evaluated */
    int64_t n_queries;         /* evaluated query rows (x layers) */
    int64_t n_measured;        /* of those, the rows whose error was measured (LeanKV
                                  and PATS; x layers) */
    int64_t n_nosave;          /* PATS settings that save no memory against the f16
                                  cache (never chosen) */
    int64_t n_measured_nosave; /* the rows their error was measured on: a quarter of
                                  the sampled ones (all of them when every row is) */
    int64_t n_jobs;            /* (layer, sequence, KV head) jobs of the LeanKV/PATS grid */
    int64_t n_jobs_sampled;    /* those of the job sample (n_jobs when there is none) */
    int64_t n_seq_jobs;        /* (layer, sequence) jobs of the budget/tau pass */
    int64_t n_seq_jobs_sampled; /* those of its job sample (n_seq_jobs without one) */
    kvq_profile_table table[KVQ_PROFILE_N_TABLES];
} kvq_profile_result;

void kvq_profile_result_free(kvq_profile_result *r); /* NULL is fine; frees r too */

/* Profiles the capture at capture_dir. artifact_path (may be NULL: no budget profile)
 * is the codebook artifact whose method the budget knobs use; its model identity must
 * match the capture's, and so must the model's when p->model is set.
 * Errors: those of kvq_capture_info_read, kvq_artifact_open and the safetensors reader
 * (naming the file); KVQ_E_MISMATCH (artifact or model from another model, naming the
 * field); KVQ_E_INVALID_ARG (bad parameters; a capture without values; no captured
 * layer; no sequence with a continuation to evaluate); KVQ_E_CORRUPT /
 * KVQ_E_SHAPE_MISMATCH (a layer file whose tensors disagree with capture.json); those of
 * kvq_model_open, kvq_corpus_*, kvq_codebook_set_open; KVQ_E_CANCELLED; KVQ_E_NOMEM.
 * A knob that cannot run (budget: no artifact, method none, sampled queries) is skipped
 * with the reason in its table's `skipped` and a log line. Cost: per knob setting one
 * pass over the capture, O(sum over sequences of N^2 d) per (layer, query head); with a
 * model, one forward pass over the held-out tokens per setting. *out is freed with
 * kvq_profile_result_free. */
kvq_status kvq_profile_capture(const char *capture_dir, const char *artifact_path,
                               const kvq_profile_params *p, kvq_profile_result **out,
                               kvq_err *err);

/* Writes a new artifact at out_path: every tensor and metadata key of `in` except
 * earlier profile output (tensors "thresholds.*", "profile.*"; keys "thresholds.*",
 * "profile.*", "leankv.*", "pats.*", "budget.*", "mass.*", "diag.profile.*"), plus the
 * chosen values and the full profile (docs/format.md, "Thresholds"). Atomic; overwrite
 * 0: KVQ_E_EXISTS when out_path exists. Errors: those of kvq_st_writer_* and
 * kvq_artifact_write. */
kvq_status kvq_profile_write(const kvq_artifact *in, const kvq_profile_result *r,
                             const kvq_profile_params *p, const char *out_path, int overwrite,
                             kvq_err *err);

/* Both: opens in_path, profiles, writes out_path. *out (may be NULL) receives the result.
 * Errors: those of kvq_artifact_open and the two functions above. */
kvq_status kvq_profile_run(const char *capture_dir, const char *in_path, const char *out_path,
                           int overwrite, const kvq_profile_params *p,
                           kvq_profile_result **out, kvq_err *err);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_THRESHOLDS_H */
