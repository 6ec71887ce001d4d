/*
 * runtime/cache/pats.c — the PATS cache (pats paper): b(t) schedules, truncation and
 * packing from f32, and the cache of one KV head whose attention reads the packed rows
 * (kvc.h states the rules, kvc_rows.h the row format).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/half.h"
#include "runtime/cache/kvc.h"
#include "runtime/kernels/rk.h"
#include "runtime/runtime_internal.h"

static const char *const schedule_names[KVQ_RT_PATS_N_SCHEDULES] = {
    "old-heavy", "new-heavy", "middle-heavy",
};

const char *kvq_rt_pats_schedule_name(int32_t s)
{
    return s >= 0 && s < KVQ_RT_PATS_N_SCHEDULES ? schedule_names[s] : "unknown";
}

int kvq_rt_pats_schedule_parse(const char *name, int32_t *s)
{
    for (int32_t i = 0; name && i < KVQ_RT_PATS_N_SCHEDULES; i++)
        if (!strcmp(name, schedule_names[i])) {
            *s = i;
            return 0;
        }
    return -1;
}

kvq_status kvq_rt_pats_check(const kvq_rt_pats_params *p, kvq_err *err)
{
    if (p->schedule < 0 || p->schedule >= KVQ_RT_PATS_N_SCHEDULES)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "pats: unknown schedule %d", (int)p->schedule);
    if (p->b_min < 0 || p->b_min > p->b_max)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "pats: need 0 <= b_min <= b_max (%d, %d)",
                           (int)p->b_min, (int)p->b_max);
    if (p->b_max > KVQ_RK_PATS_MAX_B)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "pats: b_max %d would truncate into the "
                           "exponent (f16 has 10 mantissa bits)", (int)p->b_max);
    return KVQ_OK;
}

/* floor(a / b + 1/2) for a >= 0, b > 0. */
static int64_t round_div(int64_t a, int64_t b)
{
    return (2 * a + b) / (2 * b);
}

int32_t kvq_rt_pats_bits(const kvq_rt_pats_params *p, int64_t t, int64_t T)
{
    T = T < 1 ? 1 : T;
    t = t < 1 ? 1 : t > T ? T : t;
    const int64_t D = p->b_max - p->b_min, den = T > 1 ? T - 1 : 1;
    int64_t f;
    switch (p->schedule) {
    case KVQ_RT_PATS_OLD_HEAVY: f = p->b_max - round_div(D * (t - 1), den); break;
    case KVQ_RT_PATS_NEW_HEAVY: f = p->b_min + round_div(D * (t - 1), den); break;
    default: {
        const int64_t a = 2 * t - T - 1;
        f = p->b_max - round_div(D * (a < 0 ? -a : a), den);
        break;
    }
    }
    f = f > p->b_max ? p->b_max : f;
    return (int32_t)(f < p->b_min ? p->b_min : f);
}

kvq_status kvq_rt_pats_pack_f32(const float *x, int32_t n, int32_t b, uint8_t *row,
                                kvq_err *err)
{
    uint16_t h[512];
    if (n < 1 || n > 512 || b < 0 || b > KVQ_RK_PATS_MAX_B)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "pats: n %d, b %d (need 1..512, 0..10)",
                           (int)n, (int)b);
    for (int32_t t = 0; t < n; t++) {
        h[t] = kvq_f32_to_f16_ref(x[t]);
        if ((h[t] & 0x7c00u) == 0x7c00u)
            return kvq_err_set(err, KVQ_E_NUMERIC, "pats: value %g at element %d is not a "
                               "finite f16", (double)x[t], (int)t);
    }
    kvq_rk_pats_pack(h, n, b, row);
    return KVQ_OK;
}

kvq_status kvq_rt_pats_truncate(const float *x, int32_t n, int32_t b, float *y, kvq_err *err)
{
    uint8_t row[1024 + KVQ_RK_PATS_PAD];
    kvq_status s = kvq_rt_pats_pack_f32(x, n, b, row, err);
    if (!s)
        kvq_rk_pats_unpack(row, n, b, y);
    return s;
}

/* ==========================================================================
 * The cache of one KV head
 * ========================================================================== */

kvq_status kvq_rt_pats_head_init(kvq_rt_pats_head *H, int32_t d, int32_t gs, int64_t T,
                                 const kvq_rt_pats_params *p, kvq_err *err)
{
    kvq_status s;
    memset(H, 0, sizeof *H);
    if ((s = kvq_rt_pats_check(p, err)))
        return s;
    if (d < 1 || d > 512 || gs < 1 || gs > KVQ_RT_LK_MAX_GROUP || T < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "pats: d %d, gs %d, T %lld", (int)d, (int)gs,
                           (long long)T);
    H->p = *p;
    H->d = d;
    H->gs = gs;
    H->T = T;
    int64_t total = 0;
    H->off = (int64_t *)malloc(sizeof(int64_t) * (size_t)T);
    H->b = (int8_t *)malloc((size_t)T);
    H->p_ = (float *)malloc(sizeof(float) * (size_t)gs * (size_t)T);
    if (H->off && H->b)
        for (int64_t t = 0; t < T; t++) {
            H->b[t] = (int8_t)kvq_rt_pats_bits(p, t + 1, T);
            H->off[t] = total;
            total += 2 * (int64_t)kvq_rk_pats_row_bytes(d, H->b[t]);
        }
    H->data = (uint8_t *)kvq_rt_cache_alloc((size_t)total + KVQ_RK_PATS_PAD); /* huge pages */
    H->kr = (const uint8_t **)malloc(sizeof(void *) * (size_t)T);
    H->vr = (const uint8_t **)malloc(sizeof(void *) * (size_t)T);
    H->isa = kvq_isa_best();
    if (H->off && H->b && H->data && H->kr && H->vr)
        for (int64_t t = 0; t < T; t++) {
            H->kr[t] = H->data + H->off[t];
            H->vr[t] = H->kr[t] + kvq_rk_pats_row_bytes(d, H->b[t]);
        }
    if (!H->off || !H->b || !H->p_ || !H->data || !H->kr || !H->vr) {
        kvq_rt_pats_head_free(H);
        return kvq_err_set(err, KVQ_E_NOMEM, "pats: out of memory (%lld tokens)", (long long)T);
    }
    return KVQ_OK;
}

void kvq_rt_pats_head_free(kvq_rt_pats_head *H)
{
    free(H->data);
    free(H->off);
    free(H->b);
    free(H->p_);
    free((void *)H->kr);
    free((void *)H->vr);
    memset(H, 0, sizeof *H);
}

kvq_status kvq_rt_pats_append(kvq_rt_pats_head *H, const float *k, const float *v,
                              kvq_err *err)
{
    if (H->n >= H->T)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "pats: the cache holds %lld tokens",
                           (long long)H->T);
    const int64_t t = H->n;
    const size_t rb = kvq_rk_pats_row_bytes(H->d, H->b[t]);
    kvq_status s = kvq_rt_pats_pack_f32(k, H->d, H->b[t], H->data + H->off[t], err);
    if (!s)
        s = kvq_rt_pats_pack_f32(v, H->d, H->b[t], H->data + H->off[t] + rb, err);
    if (s)
        return s;
    H->n++;
    H->bytes += 2 * (int64_t)rb;
    return KVQ_OK;
}

void kvq_rt_pats_attend(kvq_rt_pats_head *H, const float *q, float scale, float *o)
{
    const int32_t d = H->d, gs = H->gs;
    const int64_t n = H->n, ld = H->T;
    memset(o, 0, sizeof(float) * (size_t)gs * d);
    if (n < 1)
        return;
    kvq_rk_pats_logits(H->isa, q, gs, d, H->kr, H->b, n, d, scale, H->p_, ld);
    kvq_rk_softmax(H->isa, H->p_, gs, n, ld);
    kvq_rk_pats_mix(H->isa, H->p_, gs, ld, H->vr, H->b, n, d, o, d);
}
