/*
 * lk_kernels_avx512.c — AVX-512 versions of the LeanKV grid kernels
 * (thresholds/lk_kernels.h), equal to the scalar ones bit for bit: separate multiplies
 * and adds, tails by the scalar rule. The gather keeps AVX2's four lanes (its partial
 * sums are defined per j mod 4).
 */
#include "thresholds/lk_kernels.h"

#if THR_LK_X86
#include <immintrin.h>
#include <math.h>

#define TARGET __attribute__((target("avx512f,avx512dq,avx512vl,avx2")))

TARGET static void significance_avx512(double *sig, const double *acc, int64_t n, int32_t gs,
                                       const int64_t *qcum, int64_t nq, int64_t len)
{
    const __m512i vnq = _mm512_set1_epi64(nq);
    const __m512d inf = _mm512_set1_pd(INFINITY);
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) {
        const __m512i cnt = _mm512_sub_epi64(vnq, _mm512_loadu_si512(qcum + j));
        const __mmask8 pos = _mm512_cmpgt_epi64_mask(cnt, _mm512_setzero_si512());
        __m512d best = _mm512_set1_pd(-INFINITY);
        for (int32_t g = 0; g < gs; g++) /* max_pd(a, b) = a > b ? a : b, the scalar rule */
            best = _mm512_max_pd(_mm512_loadu_pd(acc + (size_t)g * n + j), best);
        _mm512_storeu_pd(sig + j, _mm512_mask_div_pd(inf, pos, best, _mm512_cvtepi64_pd(cnt)));
    }
    for (; j < len; j++) {
        const int64_t cnt = nq - qcum[j];
        double best = -INFINITY;
        for (int32_t g = 0; g < gs && cnt > 0; g++) {
            const double a = acc[(size_t)g * n + j];
            best = a > best ? a : best;
        }
        sig[j] = cnt > 0 ? best / (double)cnt : INFINITY;
    }
}

TARGET static void daxpy_avx512(double *acc, double a, const double *w, int64_t len)
{
    const __m512d va = _mm512_set1_pd(a);
    int64_t j = 0;
    for (; j + 8 <= len; j += 8)
        _mm512_storeu_pd(acc + j, _mm512_add_pd(_mm512_loadu_pd(acc + j),
                                                _mm512_mul_pd(_mm512_loadu_pd(w + j), va)));
    for (; j < len; j++)
        acc[j] += w[j] * a;
}

TARGET static void mix_avx512(float *o, const double *w, double inv, const uint8_t *ver,
                              const float *const v[4], int64_t len, int32_t d)
{
    int32_t c0 = 0;
    for (; c0 + 64 <= d; c0 += 64) { /* 64 columns in registers over every row */
        __m512 o0 = _mm512_setzero_ps(), o1 = o0, o2 = o0, o3 = o0;
        for (int64_t j = 0; j < len; j++)
            if (ver[j]) {
                const __m512 a = _mm512_set1_ps((float)(w[j] * inv));
                const float *x = v[ver[j]] + (size_t)j * d + c0;
                o0 = _mm512_add_ps(o0, _mm512_mul_ps(a, _mm512_loadu_ps(x)));
                o1 = _mm512_add_ps(o1, _mm512_mul_ps(a, _mm512_loadu_ps(x + 16)));
                o2 = _mm512_add_ps(o2, _mm512_mul_ps(a, _mm512_loadu_ps(x + 32)));
                o3 = _mm512_add_ps(o3, _mm512_mul_ps(a, _mm512_loadu_ps(x + 48)));
            }
        _mm512_storeu_ps(o + c0, o0);
        _mm512_storeu_ps(o + c0 + 16, o1);
        _mm512_storeu_ps(o + c0 + 32, o2);
        _mm512_storeu_ps(o + c0 + 48, o3);
    }
    thr_lk_mix_cols(o, w, inv, ver, v, len, d, c0);
}

const thr_lk_kernels thr_lk_avx512 = {"avx512", significance_avx512, thr_lk_gather_avx2,
                                      daxpy_avx512, mix_avx512};
#endif
