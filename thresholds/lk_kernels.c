/*
 * lk_kernels.c — the scalar LeanKV grid kernels (thresholds/lk_kernels.h) and the
 * choice among them and the SIMD versions.
 */
#include <math.h>

#include "kvq/common.h"
#include "thresholds/lk_kernels.h"
#include "thresholds/thresholds_internal.h"

static void significance_scalar(double *sig, const double *acc, int64_t n, int32_t gs,
                                const int64_t *qcum, int64_t nq, int64_t len)
{
    for (int64_t j = 0; j < len; j++) {
        const int64_t cnt = nq - qcum[j];
        if (cnt <= 0) {
            sig[j] = INFINITY;
            continue;
        }
        double best = -INFINITY;
        for (int32_t g = 0; g < gs; g++) {
            const double a = acc[(size_t)g * n + j];
            best = a > best ? a : best;
        }
        sig[j] = best / (double)cnt;
    }
}

static void gather_scalar(const float *const e[4], size_t es, const uint8_t *ver, int64_t len,
                          int32_t gs, float *w, size_t ws, double *z)
{
    for (int32_t g = 0; g < gs; g++) {
        double p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        thr_lk_gather_tail(e, (size_t)g * es, ver, 0, len, w + (size_t)g * ws, p);
        z[g] = thr_lk_sum8(p);
    }
}

static void daxpy_scalar(double *restrict acc, double a, const float *restrict w, int64_t len)
{
    for (int64_t j = 0; j < len; j++)
        acc[j] += (double)w[j] * a;
}

static void mix_scalar(float *restrict o, const float *w, size_t ws, const double *inv,
                       const uint8_t *ver, const float *const v[4], int64_t len, int32_t d,
                       int32_t gs)
{
    for (int32_t g = 0; g < gs; g++)
        thr_lk_mix_cols(o + (size_t)g * d, w + (size_t)g * ws, inv[g], ver, v, len, d, 0);
}

static double expsum_scalar(float *out, const float *s, float mx, int64_t len)
{
    double z[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    thr_lk_expsum_tail(out, s, mx, 0, len, z);
    return thr_lk_sum8(z);
}

static float maxf_scalar(const float *s, int64_t len)
{
    float mx = -INFINITY;
    for (int64_t j = 0; j < len; j++)
        mx = s[j] > mx ? s[j] : mx;
    return mx;
}

static int64_t sigmin_scalar(const double *acc, int64_t n, int32_t gs, const int64_t *qcum,
                             int64_t nq, const uint8_t *cls, uint8_t sec, int64_t len,
                             double *key)
{
    significance_scalar(key, acc, n, gs, qcum, nq, len);
    return thr_leankv_argmin_scalar(key, cls, sec, len);
}

static const thr_lk_kernels scalar = {"scalar", significance_scalar, gather_scalar,
                                      daxpy_scalar, mix_scalar, expsum_scalar, maxf_scalar,
                                      thr_leankv_argmin_scalar, sigmin_scalar};

const thr_lk_kernels *thr_lk_kernels_get(int level)
{
#if THR_LK_X86
    if ((level < 0 || level >= 2) && kvq_cpu_has_avx512())
        return &thr_lk_avx512;
    if ((level < 0 || level >= 1) && kvq_cpu_has_avx2())
        return &thr_lk_avx2;
#else
    (void)level;
#endif
    return &scalar;
}
