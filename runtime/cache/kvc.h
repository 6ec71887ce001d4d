/*
 * runtime/cache/kvc.h — the compressed KV caches of one (layer, KV head): LeanKV
 * (leankv paper) and PATS (pats paper). Their rows are kvc_rows.h's; attention reads
 * them in place (kvq_rk_lkq_logits / _mix, kvq_rk_pats_logits / _mix: SIMD by isa), the
 * prompt's exact rows with kvq_rk_logits / _mix, probabilities by kvq_rk_softmax. The
 * quantizer and the policies are the ones the profile measures (kvq/thresholds.h states
 * them; thresholds/ sits above runtime/ and calls these: one copy of the formulas).
 * Not a public header.
 *
 * ---- LeanKV quantization (kvq_rt_lkq_quantize) -----------------------------------
 * x [n] finite, lo = min x, hi = max x, L = 2^bits - 1:
 *     s   = (float)((double)hi - (double)lo) / L)
 *     z16 = f16(0 - lo) (round to nearest even), s16 = the smallest f16 >= s (0 if s = 0)
 *     q_t = clamp(floor((x_t + z16) / s16 + 1/2), 0, L)  (float arithmetic; 0 if s16 = 0)
 * A non-finite x_t, |lo| > 65504 or s > 65504 is refused (KVQ_E_NUMERIC).
 *
 * ---- LeanKV policy (kvq_rt_lk_*) ----------------------------------------------
 * Classes PRUNED 0 < LOW 1 < HIGH 2. Prompt phase: the last `window` tokens are HIGH,
 * token j (0-based) otherwise HIGH if sig_j >= alpha_h / (j + 1), LOW if >= alpha_l /
 * (j + 1), else PRUNED. Generation (Algorithm 1) after token n - 1 was appended: it is
 * HIGH (window); when n > window the token c = n - 1 - window leaves the window and is
 * classified with alpha / n; if it is kept, the least significant token v of its
 * section among 0..c (ties: the earliest) is classified again with alpha / n and moved
 * down (HIGH -> LOW, HIGH -> PRUNED, LOW -> PRUNED) when its class is lower.
 * Significance sig_j: max over the group's query heads of the mean probability token j
 * received from the queries counted after it (+inf when none).
 *
 * ---- PATS (kvq_rt_pats_*) ------------------------------------------------------
 * Token t in 1..T keeps its f16 K and V with the low b(t) mantissa bits dropped, b(t) =
 * max(b_min, min(b_max, f(t, T))), D = b_max - b_min, den = max(T - 1, 1), round(x) =
 * floor(x + 1/2) in integers:
 *     old-heavy     f = b_max - round(D (t - 1) / den)
 *     new-heavy     f = b_min + round(D (t - 1) / den)
 *     middle-heavy  f = b_max - round(D |2t - T - 1| / den)
 * T is the sequence length the cache is made for (the schedule is static).
 */
#ifndef KVQ_RUNTIME_KVC_H
#define KVQ_RUNTIME_KVC_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/common.h"
#include "runtime/kernels/kvc_rows.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==========================================================================
 * Rows from f32
 * ========================================================================== */

/* Quantizes x [n] (n >= 1, bits 1..8) into row (kvq_rk_lkq_row_bytes(n, bits) bytes).
 * Errors: KVQ_E_INVALID_ARG, KVQ_E_NUMERIC (rule above). */
kvq_status kvq_rt_lkq_quantize(const float *x, int32_t n, int32_t bits, uint8_t *row,
                               kvq_err *err);
/* The same rule's scale, zero point and codes, one code a byte (codes [n]): the
 * profile's quantizer (thresholds/quant.c) is this one. */
kvq_status kvq_rt_lkq_codes(const float *x, int32_t n, int32_t bits, uint8_t *codes,
                            uint16_t *s16, uint16_t *z16, kvq_err *err);
/* Rounds x [n] to f16 (nearest even), drops b (0..10) low mantissa bits and packs the
 * row (kvq_rk_pats_row_bytes(n, b) bytes). Errors: KVQ_E_INVALID_ARG (b), KVQ_E_NUMERIC
 * (a value that is not finite in f16: NaN, Inf, |x| rounding above 65504). */
kvq_status kvq_rt_pats_pack_f32(const float *x, int32_t n, int32_t b, uint8_t *row,
                                kvq_err *err);

/* x [n] as a PATS row holds it: rounded to f16, its low b mantissa bits dropped, back
 * to f32 (kvq_rt_pats_pack_f32 then kvq_rk_pats_unpack: the same values); y may alias x.
 * The leankv+pats cache quantizes these. Errors: those of kvq_rt_pats_pack_f32. */
kvq_status kvq_rt_pats_truncate(const float *x, int32_t n, int32_t b, float *y, kvq_err *err);

/* ==========================================================================
 * LeanKV policy
 * ========================================================================== */

enum { KVQ_RT_LK_PRUNED = 0, KVQ_RT_LK_LOW = 1, KVQ_RT_LK_HIGH = 2 };

typedef struct kvq_rt_lk_params {
    double alpha_h, alpha_l;     /* >= 0, finite */
    int32_t window;              /* >= 0 */
    int32_t k_high, v_high;      /* 1..8 (8, 4) */
    int32_t k_low, v_low;        /* 1..8 (4, 2) */
} kvq_rt_lk_params;

/* alpha_h 1, alpha_l 0.02, window 64, K8V4 / K4V2 (the paper's). */
kvq_rt_lk_params kvq_rt_lk_params_default(void);
/* KVQ_E_INVALID_ARG naming the value out of range. */
kvq_status kvq_rt_lk_check(const kvq_rt_lk_params *p, kvq_err *err);
/* The class of significance sig against alpha / i (i >= 1). NaN: PRUNED. */
int kvq_rt_lk_rule(double sig, int64_t i, const kvq_rt_lk_params *p);
void kvq_rt_lk_classify_prompt(const double *sig, int64_t n, const kvq_rt_lk_params *p,
                               uint8_t *cls);
/* One generation step for n tokens (sig, cls [n]); returns the victim or -1. */
int64_t kvq_rt_lk_generation_step(const double *sig, int64_t n, const kvq_rt_lk_params *p,
                                  uint8_t *cls);
/* The first j < len with cls[j] == sec whose sig[j] is least (ties: the earliest; -1 if
 * none): Algorithm 1's choice of the victim. */
typedef int64_t (*kvq_rt_lk_argmin_fn)(const double *sig, const uint8_t *cls, uint8_t sec,
                                       int64_t len);
int64_t kvq_rt_lk_argmin(const double *sig, const uint8_t *cls, uint8_t sec, int64_t len);
/* The generation step with the victim chosen by argmin (equal to kvq_rt_lk_argmin: the
 * profile's SIMD kernels). */
int64_t kvq_rt_lk_generation_step_with(const double *sig, int64_t n, const kvq_rt_lk_params *p,
                                       uint8_t *cls, kvq_rt_lk_argmin_fn argmin);

/* ==========================================================================
 * PATS schedule
 * ========================================================================== */

enum { KVQ_RT_PATS_OLD_HEAVY = 0, KVQ_RT_PATS_NEW_HEAVY = 1, KVQ_RT_PATS_MIDDLE_HEAVY = 2,
       KVQ_RT_PATS_N_SCHEDULES = 3 };

typedef struct kvq_rt_pats_params {
    int32_t schedule;     /* KVQ_RT_PATS_* */
    int32_t b_min, b_max; /* 0 <= b_min <= b_max <= 10 */
} kvq_rt_pats_params;

/* "old-heavy", "new-heavy", "middle-heavy"; 0 / -1 for an unknown name. */
const char *kvq_rt_pats_schedule_name(int32_t s);
int kvq_rt_pats_schedule_parse(const char *name, int32_t *s);
kvq_status kvq_rt_pats_check(const kvq_rt_pats_params *p, kvq_err *err);
/* b(t), t clamped into 1..T. */
int32_t kvq_rt_pats_bits(const kvq_rt_pats_params *p, int64_t t, int64_t T);

/* ==========================================================================
 * The caches of one KV head
 * ========================================================================== */

/* Rows of one precision: slots of `row` bytes (K row then V row), reused when freed. */
typedef struct kvq_rt_lk_pool {
    uint8_t *data;   /* [cap, row] */
    int32_t *free_;  /* [cap] free slots (a stack) */
    int64_t cap, used, n_free;
    size_t row, krow; /* bytes of a slot, of its K row */
    int32_t kb, vb;
} kvq_rt_lk_pool;

#define KVQ_RT_LK_MAX_GROUP 64 /* query heads per KV head */

/* A LeanKV cache of one KV head with `gs` query heads: the prompt's tokens are held
 * exactly (f32) until kvq_rt_lk_end_prompt, then every token in its class's pool. */
typedef struct kvq_rt_lk_head {
    kvq_rt_lk_params p;
    int32_t d, gs;
    int64_t n, cap, nq;  /* tokens, capacity, queries counted */
    int prompt_done;
    uint8_t *cls;        /* [cap] */
    int32_t *slot;       /* [cap] slot in its class's pool; -1 pruned */
    double *acc;         /* [cap, gs] attention received */
    int32_t *qcum;       /* [cap] queries counted before the token came */
    double *sig;         /* [cap] every token's significance at the last policy step */
    float *exact;        /* [cap, 2d] the prompt's K, V (freed at end_prompt) */
    float *p_;           /* [gs, cap] probabilities scratch */
    float *row_;         /* [2d] scratch */
    kvq_rt_lk_pool pool[3]; /* [LOW], [HIGH] used */
    kvq_isa isa;         /* the readers' (kvq_isa_best() at init) */
    /* The kept-row list (generation phase), kept between steps: the kept tokens in
     * token order and their rows, updated where a token is appended, downgraded or
     * pruned (a pruned token's entry removed, the tail moved down), made again when a
     * pool moved (its rows' addresses changed). */
    int64_t m;           /* entries */
    int list_stale;      /* a pool moved: made again before the next read */
    int32_t *col;        /* [cap] the kept tokens, ascending */
    const uint8_t **kr, **vr; /* [cap] their K and V rows */
    int8_t *kb, *vb;     /* [cap] and their bits */
    int32_t *pruned;     /* [cap] the pruned tokens (their sums no longer change) */
    int64_t npruned;
    /* Algorithm 1's inputs, counted by kvq_rt_lk_attend in its pass over the sums (for
     * the step at n tokens, nq queries; any other step recomputes them): per section
     * (LOW, HIGH) the least significant token before c = n - 1 - window (ties: the
     * earliest; -1 if none) and its significance. */
    int64_t at_n, at_nq;
    int64_t least[3];
    double least_sig[3];
} kvq_rt_lk_head;

kvq_status kvq_rt_lk_head_init(kvq_rt_lk_head *H, int32_t d, int32_t gs,
                               const kvq_rt_lk_params *p, kvq_err *err);
void kvq_rt_lk_head_free(kvq_rt_lk_head *H);
/* Appends token n's key (rotated) and value [d]; in the generation phase it is
 * quantized HIGH. Errors: KVQ_E_NOMEM, KVQ_E_NUMERIC. */
kvq_status kvq_rt_lk_append(kvq_rt_lk_head *H, const float *k, const float *v, kvq_err *err);
/* Attention of q [gs, d] (rotated) over every kept token, scaled logits (scale), into
 * o [gs, d]; the prompt's rows exactly, the others read from their rows (the kept-row
 * list). The probabilities are counted into the significance; in the generation phase
 * the same pass leaves each kept token's significance and Algorithm 1's candidates for
 * the kvq_rt_lk_step that follows (any other step recomputes every significance). */
void kvq_rt_lk_attend(kvq_rt_lk_head *H, const float *q, float scale, float *o);
/* Ends the prompt: classifies the prompt's tokens and stores them in their classes. */
kvq_status kvq_rt_lk_end_prompt(kvq_rt_lk_head *H, kvq_err *err);
/* Generation phase after a token was appended and attended: Algorithm 1. */
kvq_status kvq_rt_lk_step(kvq_rt_lk_head *H, kvq_err *err);
/* Bytes held: per class (LOW, HIGH) and the exact prompt rows. */
void kvq_rt_lk_bytes(const kvq_rt_lk_head *H, double *low, double *high, double *exact);

/* A PATS cache of one KV head for a sequence of T tokens. */
typedef struct kvq_rt_pats_head {
    kvq_rt_pats_params p;
    int32_t d, gs;
    int64_t T, n, bytes;
    uint8_t *data;   /* rows packed one after another: K row then V row per token */
    int64_t *off;    /* [T] offset of token t's K row */
    int8_t *b;       /* [T] */
    float *p_;       /* [gs, T] */
    const uint8_t **kr, **vr; /* [T] token t's K and V rows */
    kvq_isa isa;     /* the readers' (kvq_isa_best() at init) */
} kvq_rt_pats_head;

kvq_status kvq_rt_pats_head_init(kvq_rt_pats_head *H, int32_t d, int32_t gs, int64_t T,
                                 const kvq_rt_pats_params *p, kvq_err *err);
void kvq_rt_pats_head_free(kvq_rt_pats_head *H);
/* Appends token n (< T): K (rotated) and V [d]. */
kvq_status kvq_rt_pats_append(kvq_rt_pats_head *H, const float *k, const float *v,
                              kvq_err *err);
void kvq_rt_pats_attend(kvq_rt_pats_head *H, const float *q, float scale, float *o);

#ifdef __cplusplus
}
#endif

#endif /* KVQ_RUNTIME_KVC_H */
