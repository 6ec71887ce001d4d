/*
 * runtime/cache/lk_policy.c — LeanKV's per-vector quantization and its policy (the
 * prompt rule, Algorithm 1 of the generation phase): kvc.h states both.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/half.h"
#include "runtime/cache/kvc.h"

#define F16_MAX 65504.0f

/* The smallest f16 >= x, for finite 0 <= x <= F16_MAX. */
static uint16_t f16_round_up(float x)
{
    uint16_t h = kvq_f32_to_f16_ref(x);
    if (kvq_f16_to_f32_ref(h) < x)
        h++; /* positive f16 bit patterns are ordered like their values */
    return h;
}

/* The codes of x [n] at zero point z and scale sc > 0: IEEE divisions, adds and floors
 * only, so the AVX2 clone (floor as one instruction, vectors) gives the scalar bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static void lkq_codes(const float *x, int32_t n, float z, float sc, float levels, uint8_t *codes)
{
    for (int32_t t = 0; t < n; t++) {
        float q = floorf((x[t] + z) / sc + 0.5f);
        q = q < 0 ? 0 : q > levels ? levels : q;
        codes[t] = (uint8_t)q;
    }
}

kvq_status kvq_rt_lkq_codes(const float *x, int32_t n, int32_t bits, uint8_t *codes,
                            uint16_t *s16, uint16_t *z16, kvq_err *err)
{
    if (n < 1 || bits < 1 || bits > KVQ_RK_LKQ_MAX_BITS)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "leankv: n %d, bits %d (need n >= 1, "
                           "bits 1..8)", (int)n, (int)bits);
    float lo = x[0], hi = x[0];
    for (int32_t t = 0; t < n; t++) {
        if (!isfinite(x[t]))
            return kvq_err_set(err, KVQ_E_NUMERIC, "leankv: non-finite value %g at element %d",
                               (double)x[t], (int)t);
        lo = x[t] < lo ? x[t] : lo;
        hi = x[t] > hi ? x[t] : hi;
    }
    const float levels = (float)((1u << bits) - 1u);
    const float s = (float)(((double)hi - (double)lo) / (double)levels);
    if (fabsf(lo) > F16_MAX || s > F16_MAX)
        return kvq_err_set(err, KVQ_E_NUMERIC, "leankv: range [%g, %g] does not fit an f16 "
                           "scale and zero point", (double)lo, (double)hi);
    *z16 = kvq_f32_to_f16_ref(0.0f - lo); /* +0, not -0, for lo = 0 */
    *s16 = s > 0 ? f16_round_up(s) : 0;
    const float z = kvq_f16_to_f32_ref(*z16), sc = kvq_f16_to_f32_ref(*s16);
    if (sc > 0)
        lkq_codes(x, n, z, sc, levels, codes);
    else
        memset(codes, 0, (size_t)n);
    return KVQ_OK;
}

kvq_status kvq_rt_lkq_quantize(const float *x, int32_t n, int32_t bits, uint8_t *row,
                               kvq_err *err)
{
    uint8_t stack[512], *codes = stack;
    uint16_t s16, z16;
    if (n > (int32_t)sizeof stack && !(codes = (uint8_t *)malloc((size_t)n)))
        return kvq_err_set(err, KVQ_E_NOMEM, "leankv: out of memory");
    kvq_status s = kvq_rt_lkq_codes(x, n, bits, codes, &s16, &z16, err);
    if (!s) {
        memset(row, 0, kvq_rk_lkq_row_bytes(n, bits));
        row[0] = (uint8_t)(s16 & 0xffu);
        row[1] = (uint8_t)(s16 >> 8);
        row[2] = (uint8_t)(z16 & 0xffu);
        row[3] = (uint8_t)(z16 >> 8);
        for (int32_t t = 0; t < n; t++)
            kvq_rk_lkq_put_code(row, t, bits, codes[t]);
    }
    if (codes != stack)
        free(codes);
    return s;
}

/* ==========================================================================
 * Policy
 * ========================================================================== */

kvq_rt_lk_params kvq_rt_lk_params_default(void)
{
    kvq_rt_lk_params p = {.alpha_h = 1.0, .alpha_l = 0.02, .window = 64,
                          .k_high = 8, .v_high = 4, .k_low = 4, .v_low = 2};
    return p;
}

kvq_status kvq_rt_lk_check(const kvq_rt_lk_params *p, kvq_err *err)
{
    if (!(p->alpha_h >= 0) || !isfinite(p->alpha_h))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "leankv: alpha_h %g must be finite and >= 0",
                           p->alpha_h);
    if (!(p->alpha_l >= 0) || !isfinite(p->alpha_l))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "leankv: alpha_l %g must be finite and >= 0",
                           p->alpha_l);
    if (p->alpha_l > p->alpha_h)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "leankv: alpha_l %g above alpha_h %g",
                           p->alpha_l, p->alpha_h);
    if (p->window < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "leankv: window %d must be >= 0",
                           (int)p->window);
    const int32_t b[4] = {p->k_high, p->v_high, p->k_low, p->v_low};
    for (int i = 0; i < 4; i++)
        if (b[i] < 1 || b[i] > KVQ_RK_LKQ_MAX_BITS)
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "leankv: %d bits (need 1..8)",
                               (int)b[i]);
    return KVQ_OK;
}

int kvq_rt_lk_rule(double sig, int64_t i, const kvq_rt_lk_params *p)
{
    const double n = (double)(i > 0 ? i : 1);
    if (sig >= p->alpha_h / n)
        return KVQ_RT_LK_HIGH;
    if (sig >= p->alpha_l / n)
        return KVQ_RT_LK_LOW;
    return KVQ_RT_LK_PRUNED;
}

void kvq_rt_lk_classify_prompt(const double *sig, int64_t n, const kvq_rt_lk_params *p,
                               uint8_t *cls)
{
    for (int64_t j = 0; j < n; j++)
        cls[j] = (uint8_t)(j >= n - p->window ? KVQ_RT_LK_HIGH
                                              : kvq_rt_lk_rule(sig[j], j + 1, p));
}

int64_t kvq_rt_lk_argmin(const double *sig, const uint8_t *cls, uint8_t sec, int64_t len)
{
    int64_t v = -1;
    for (int64_t j = 0; j < len; j++)
        if (cls[j] == sec && (v < 0 || sig[j] < sig[v]))
            v = j;
    return v;
}

int64_t kvq_rt_lk_generation_step_with(const double *sig, int64_t n, const kvq_rt_lk_params *p,
                                       uint8_t *cls, kvq_rt_lk_argmin_fn argmin)
{
    if (n < 1)
        return -1;
    cls[n - 1] = KVQ_RT_LK_HIGH; /* the new token enters the window */
    if (n <= p->window)
        return -1;
    const int64_t c = n - 1 - p->window; /* leaves the window */
    const int sec = kvq_rt_lk_rule(sig[c], n, p);
    cls[c] = (uint8_t)sec;
    if (sec == KVQ_RT_LK_PRUNED)
        return -1;
    /* the least significant token of that section (ties: the earliest) */
    const int64_t v = argmin(sig, cls, (uint8_t)sec, c + 1);
    const int now = kvq_rt_lk_rule(sig[v], n, p);
    if (now < sec)
        cls[v] = (uint8_t)now; /* HIGH -> LOW or PRUNED; LOW -> PRUNED */
    return v;
}

int64_t kvq_rt_lk_generation_step(const double *sig, int64_t n, const kvq_rt_lk_params *p,
                                  uint8_t *cls)
{
    return kvq_rt_lk_generation_step_with(sig, n, p, cls, kvq_rt_lk_argmin);
}
