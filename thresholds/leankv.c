/*
 * leankv.c — the LeanKV policy (leankv paper, section 4): token significance, the
 * prompt-phase rule, the generation-phase Algorithm 1, bytes per token, and the LeanKV
 * side of the per-head cache simulator (thresholds/thresholds_internal.h).
 */
#include <math.h>
#include <string.h>

#include "runtime/cache/kvc.h"
#include "thresholds/thresholds_internal.h"

/* ==========================================================================
 * Parameters
 * ========================================================================== */

/* One default and one check: the runtime cache's (runtime/cache/kvc.h), so the profile
 * proposes only what `--kv leankv` accepts. */
static kvq_rt_lk_params rt_params(const kvq_leankv_params *p)
{
    return (kvq_rt_lk_params){p->alpha_h, p->alpha_l, p->window,
                              p->k_high,  p->v_high,  p->k_low, p->v_low};
}

kvq_leankv_params kvq_leankv_params_default(void)
{
    const kvq_rt_lk_params r = kvq_rt_lk_params_default();
    kvq_leankv_params p = {.alpha_h = r.alpha_h, .alpha_l = r.alpha_l, .window = r.window,
                           .k_high = r.k_high, .v_high = r.v_high, .k_low = r.k_low,
                           .v_low = r.v_low};
    return p;
}

kvq_status kvq_leankv_check(const kvq_leankv_params *p, kvq_err *err)
{
    const kvq_rt_lk_params r = rt_params(p);
    return kvq_rt_lk_check(&r, err);
}

/* ==========================================================================
 * Significance and the rules
 * ========================================================================== */

void kvq_leankv_significance(const double *attn, int32_t gs, int64_t n, double *sig)
{
    for (int64_t j = 0; j < n; j++) {
        if (j == n - 1) {
            sig[j] = INFINITY; /* no later query */
            continue;
        }
        double best = -INFINITY;
        for (int32_t g = 0; g < gs; g++) {
            const double *a = attn + (size_t)g * n * n;
            double s = 0;
            for (int64_t r = j + 1; r < n; r++)
                s += a[(size_t)r * n + j];
            s /= (double)(n - 1 - j);
            best = s > best ? s : best;
        }
        sig[j] = best;
    }
}

/* The prompt rule and its classification are the runtime cache's (runtime/cache/kvc.h):
 * the profile simulates exactly what `--kv leankv` applies. */
_Static_assert((int)KVQ_LEANKV_PRUNED == KVQ_RT_LK_PRUNED &&
                   (int)KVQ_LEANKV_LOW == KVQ_RT_LK_LOW &&
                   (int)KVQ_LEANKV_HIGH == KVQ_RT_LK_HIGH, "LeanKV classes agree with the runtime's");

kvq_leankv_class kvq_leankv_rule(double sig, int64_t i, const kvq_leankv_params *p)
{
    const kvq_rt_lk_params r = rt_params(p);
    return (kvq_leankv_class)kvq_rt_lk_rule(sig, i, &r);
}

void kvq_leankv_classify_prompt(const double *sig, int64_t n, const kvq_leankv_params *p,
                                uint8_t *cls)
{
    const kvq_rt_lk_params r = rt_params(p);
    kvq_rt_lk_classify_prompt(sig, n, &r, cls);
}

int64_t thr_leankv_argmin_scalar(const double *sig, const uint8_t *cls, uint8_t sec, int64_t len)
{
    return kvq_rt_lk_argmin(sig, cls, sec, len);
}

int64_t kvq_leankv_generation_step(const double *sig, int64_t n, const kvq_leankv_params *p,
                                   uint8_t *cls)
{
    return thr_leankv_step(sig, n, p, cls, kvq_rt_lk_argmin);
}

/* Algorithm 1 is the runtime cache's (kvq_rt_lk_generation_step_with). */
int64_t thr_leankv_step(const double *sig, int64_t n, const kvq_leankv_params *p, uint8_t *cls,
                        thr_argmin_fn argmin)
{
    const kvq_rt_lk_params r = rt_params(p);
    return kvq_rt_lk_generation_step_with(sig, n, &r, cls, argmin);
}

uint64_t kvq_leankv_token_bytes(int32_t d, kvq_leankv_class c, const kvq_leankv_params *p)
{
    switch (c) {
    case KVQ_LEANKV_HIGH: return kvq_asymq_bytes(d, p->k_high) + kvq_asymq_bytes(d, p->v_high);
    case KVQ_LEANKV_LOW: return kvq_asymq_bytes(d, p->k_low) + kvq_asymq_bytes(d, p->v_low);
    default: return 0;
    }
}

/* ==========================================================================
 * The simulator's LeanKV side
 * ========================================================================== */

/* Current significance of tokens 0..n-1 from the running sums. */
static void current_significance(thr_head *h, int64_t n)
{
    for (int64_t j = 0; j < n; j++) {
        const int64_t cnt = h->nq - h->qcum[j];
        if (cnt <= 0) {
            h->sig[j] = INFINITY;
            continue;
        }
        double best = -INFINITY;
        for (int32_t g = 0; g < h->gs; g++) {
            const double a = h->acc[(size_t)j * h->gs + g];
            best = a > best ? a : best;
        }
        h->sig[j] = best / (double)cnt;
    }
}

/* Stores row j of the cache in class c: quantized from `from` rows (exact or current). */
static kvq_status store_class(thr_head *h, int64_t j, const float *kfrom, const float *vfrom,
                              kvq_err *err)
{
    const int32_t d = h->d;
    float *kc = h->kc + (size_t)j * d, *vc = h->vc + (size_t)j * d;
    kvq_status s = KVQ_OK;
    switch ((kvq_leankv_class)h->cls[j]) {
    case KVQ_LEANKV_HIGH:
        if (!(s = kvq_asymq_roundtrip(kfrom, d, h->lk.k_high, kc, err)))
            s = kvq_asymq_roundtrip(vfrom, d, h->lk.v_high, vc, err);
        break;
    case KVQ_LEANKV_LOW:
        if (!(s = kvq_asymq_roundtrip(kfrom, d, h->lk.k_low, kc, err)))
            s = kvq_asymq_roundtrip(vfrom, d, h->lk.v_low, vc, err);
        break;
    default:
        memset(kc, 0, sizeof(float) * (size_t)d);
        memset(vc, 0, sizeof(float) * (size_t)d);
        break;
    }
    return s;
}

kvq_status thr_leankv_finish_prompt(thr_head *h, kvq_err *err)
{
    kvq_status s = KVQ_OK;
    const int64_t n = h->n;
    current_significance(h, n);
    kvq_leankv_classify_prompt(h->sig, n, &h->lk, h->cls);
    for (int64_t j = 0; j < n && !s; j++)
        s = store_class(h, j, h->k + (size_t)j * h->d, h->v + (size_t)j * h->d, err);
    h->classified = 1;
    return s;
}

/* Adds the probabilities of the query just attended (row t) to the sums of the rows
 * before it, and counts the query. */
static void count_query(thr_head *h, int64_t t)
{
    const int64_t n = t + 1;
    for (int64_t j = 0; j < t; j++)
        for (int32_t g = 0; g < h->gs; g++)
            h->acc[(size_t)j * h->gs + g] += h->p[(size_t)g * n + j];
    h->nq++;
}

kvq_status thr_leankv_push(thr_head *h, const float *q, float *out, kvq_err *err)
{
    const int64_t t = h->n - 1;
    const int32_t d = h->d;
    kvq_status s;
    for (int32_t g = 0; g < h->gs; g++)
        h->acc[(size_t)t * h->gs + g] = 0;
    h->qcum[t] = h->nq;
    if (!h->classified && t < h->prompt_len) {
        /* prompt phase: exact attention; the cache is compressed when it ends */
        h->cls[t] = KVQ_LEANKV_HIGH;
        if (q) {
            thr_attend(q, h->gs, d, h->k, h->v, t + 1, NULL, h->p, out);
            count_query(h, t);
            h->qcum[t] = h->nq;
        }
        return KVQ_OK;
    }
    if (!h->classified) {
        /* the prompt ended with row t - 1: classify and compress it */
        h->n = t;
        s = thr_leankv_finish_prompt(h, err);
        h->n = t + 1;
        if (s)
            return s;
    }
    /* generation phase: the new token enters the window at high precision */
    h->cls[t] = KVQ_LEANKV_HIGH;
    if ((s = store_class(h, t, h->k + (size_t)t * d, h->v + (size_t)t * d, err)))
        return s;
    current_significance(h, t + 1);
    const int64_t c = t - h->lk.window;
    const uint8_t old_c = c >= 0 ? h->cls[c] : 0;
    const int64_t victim = kvq_leankv_generation_step(h->sig, t + 1, &h->lk, h->cls);
    /* re-quantize what moved down, from what the cache held (K8V4) */
    if (c >= 0 && h->cls[c] != old_c &&
        (s = store_class(h, c, h->kc + (size_t)c * d, h->vc + (size_t)c * d, err)))
        return s;
    if (victim >= 0 && victim != c && h->cls[victim] != h->cls[c] &&
        (s = store_class(h, victim, h->kc + (size_t)victim * d, h->vc + (size_t)victim * d,
                         err)))
        return s;
    if (q) {
        thr_attend(q, h->gs, d, h->kc, h->vc, t + 1, h->cls, h->p, out);
        count_query(h, t);
        h->qcum[t] = h->nq;
    }
    return KVQ_OK;
}
