/*
 * pats.c — PATS (pats paper): b(t) truncation schedules, mantissa truncation in f16 /
 * bf16, the 64-byte block packing, and the PATS side of the per-head cache simulator.
 * The formulas are in kvq/thresholds.h.
 */
#include <string.h>

#include "kvq/half.h"
#include "runtime/cache/kvc.h"
#include "thresholds/thresholds_internal.h"

static const char *const schedule_names[KVQ_PATS_N_SCHEDULES] = {
    "old-heavy", "new-heavy", "middle-heavy",
};

const char *kvq_pats_schedule_name(kvq_pats_schedule s)
{
    return (unsigned)s < KVQ_PATS_N_SCHEDULES ? schedule_names[s] : "unknown";
}

int kvq_pats_schedule_parse(const char *name, kvq_pats_schedule *s)
{
    for (int i = 0; name && i < KVQ_PATS_N_SCHEDULES; i++)
        if (!strcmp(name, schedule_names[i])) {
            *s = (kvq_pats_schedule)i;
            return 0;
        }
    return -1;
}

kvq_pats_params kvq_pats_params_default(void)
{
    kvq_pats_params p = {.schedule = KVQ_PATS_MIDDLE_HEAVY, .b_min = 2, .b_max = 8,
                         .dtype = KVQ_DT_F16};
    return p;
}

int32_t kvq_pats_mantissa_bits(kvq_dtype dt)
{
    return dt == KVQ_DT_F16 ? 10 : dt == KVQ_DT_BF16 ? 7 : -1;
}

kvq_status kvq_pats_check(const kvq_pats_params *p, kvq_err *err)
{
    const int32_t mant = kvq_pats_mantissa_bits(p->dtype);
    if ((unsigned)p->schedule >= KVQ_PATS_N_SCHEDULES)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "pats: unknown schedule %d", (int)p->schedule);
    if (mant < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "pats: cache dtype %s is not F16 or BF16",
                           kvq_dtype_name(p->dtype));
    if (p->b_min < 0 || p->b_min > p->b_max)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "pats: need 0 <= b_min <= b_max (%d, %d)",
                           (int)p->b_min, (int)p->b_max);
    if (p->b_max > mant)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "pats: b_max %d would truncate into the exponent (%s has %d mantissa "
                           "bits)", (int)p->b_max, kvq_dtype_name(p->dtype), (int)mant);
    return KVQ_OK;
}

/* The schedule is the runtime cache's (runtime/cache/kvc.h): the profile simulates
 * exactly what `--kv pats` applies. */
_Static_assert((int)KVQ_PATS_OLD_HEAVY == KVQ_RT_PATS_OLD_HEAVY &&
                   (int)KVQ_PATS_NEW_HEAVY == KVQ_RT_PATS_NEW_HEAVY &&
                   (int)KVQ_PATS_MIDDLE_HEAVY == KVQ_RT_PATS_MIDDLE_HEAVY,
               "PATS schedules agree with the runtime's");

int32_t kvq_pats_bits(const kvq_pats_params *p, int64_t t, int64_t T)
{
    const kvq_rt_pats_params r = {(int32_t)p->schedule, p->b_min, p->b_max};
    return kvq_rt_pats_bits(&r, t, T);
}

void kvq_pats_truncate(const float *x, int32_t n, kvq_dtype dt, int32_t bits, float *out)
{
    const uint16_t mask = (uint16_t)~((1u << bits) - 1u);
    const int bf = dt == KVQ_DT_BF16;
    const uint16_t expo = bf ? 0x7f80u : 0x7c00u;
    for (int32_t t = 0; t < n; t++) {
        uint16_t h = bf ? kvq_f32_to_bf16_ref(x[t]) : kvq_f32_to_f16_ref(x[t]);
        if ((h & expo) != expo) /* Inf and NaN stay as they are */
            h &= mask;
        out[t] = bf ? kvq_bf16_to_f32_ref(h) : kvq_f16_to_f32_ref(h);
    }
}

uint64_t kvq_pats_row_bytes(int32_t d, int32_t bits)
{
    const uint64_t w = (uint64_t)(16 - bits), B = 512u / w;
    return 64u * (((uint64_t)d + B - 1u) / B);
}

void thr_pats_push(thr_head *h, const float *q, float *out)
{
    const int64_t t = h->n - 1;
    const int64_t T = h->seq_len > t + 1 ? h->seq_len : t + 1;
    const int32_t b = kvq_pats_bits(&h->pt, t + 1, T), d = h->d;
    float *kc = h->kc + (size_t)t * d, *vc = h->vc + (size_t)t * d;
    kvq_pats_truncate(kc, d, h->pt.dtype, b, kc);
    kvq_pats_truncate(vc, d, h->pt.dtype, b, vc);
    h->pats_bytes += 2.0 * (double)kvq_pats_row_bytes(d, b);
    h->pats_bits += 2.0 * d * (16 - b);
    if (q)
        thr_attend(q, h->gs, d, h->kc, h->vc, t + 1, NULL, h->p, out);
}
