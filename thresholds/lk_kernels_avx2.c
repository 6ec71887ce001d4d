/*
 * lk_kernels_avx2.c — AVX2 versions of the LeanKV grid kernels (thresholds/lk_kernels.h),
 * equal to the scalar ones bit for bit: separate multiplies and adds (the output's fused
 * as the scalar fmaf), the gather's partial sum of j mod 8 in lane j mod 4 of one of two
 * registers, tails by the scalar rule or masked lanes.
 */
#include "thresholds/lk_kernels.h"
#include "thresholds/thresholds_internal.h"

#if THR_LK_X86
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define TARGET __attribute__((target("avx2,fma")))

/* Exact int64 -> double for 0 <= x < 2^52 (the counts of query rows). */
TARGET static inline __m256d small_i64_to_pd(__m256i x)
{
    const __m256d magic = _mm256_set1_pd(4503599627370496.0); /* 2^52 */
    return _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(x, _mm256_castpd_si256(magic))),
                         magic);
}

TARGET static void significance_avx2(double *sig, const double *acc, int64_t n, int32_t gs,
                                     const int64_t *qcum, int64_t nq, int64_t len)
{
    const __m256i vnq = _mm256_set1_epi64x(nq), one = _mm256_set1_epi64x(1);
    const __m256d inf = _mm256_set1_pd(INFINITY);
    int64_t j = 0;
    for (; j + 4 <= len; j += 4) {
        const __m256i cnt = _mm256_sub_epi64(vnq, _mm256_loadu_si256((const __m256i *)(qcum + j)));
        const __m256i pos = _mm256_cmpgt_epi64(cnt, _mm256_setzero_si256());
        __m256d best = _mm256_set1_pd(-INFINITY);
        for (int32_t g = 0; g < gs; g++) /* max_pd(a, b) = a > b ? a : b, the scalar rule */
            best = _mm256_max_pd(_mm256_loadu_pd(acc + (size_t)g * n + j), best);
        const __m256d c = small_i64_to_pd(_mm256_blendv_epi8(one, cnt, pos));
        _mm256_storeu_pd(sig + j, _mm256_blendv_pd(inf, _mm256_div_pd(best, c),
                                                   _mm256_castsi256_pd(pos)));
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

/* Tokens j .. j + 3 of e (versions v: 4 bytes of ver). */
TARGET static inline __m128 gather4(const float *const e[4], size_t off, __m128i v)
{
    const __m128i v1 = _mm_set1_epi32(1), v2 = _mm_set1_epi32(2), v3 = _mm_set1_epi32(3);
    __m128 x = _mm_setzero_ps();
    x = _mm_blendv_ps(x, _mm_loadu_ps(e[1] + off), _mm_castsi128_ps(_mm_cmpeq_epi32(v, v1)));
    x = _mm_blendv_ps(x, _mm_loadu_ps(e[2] + off), _mm_castsi128_ps(_mm_cmpeq_epi32(v, v2)));
    x = _mm_blendv_ps(x, _mm_loadu_ps(e[3] + off), _mm_castsi128_ps(_mm_cmpeq_epi32(v, v3)));
    return x;
}

/* One head, 8 tokens at a time: partial sums j mod 8 = 0..3 in lo, 4..7 in hi. */
TARGET static void gather_avx2(const float *const e[4], size_t es, const uint8_t *ver,
                               int64_t len, int32_t gs, float *w, size_t ws, double *z)
{
    for (int32_t g = 0; g < gs; g++) {
        const size_t off = (size_t)g * es;
        float *wg = w + (size_t)g * ws;
        __m256d lo = _mm256_setzero_pd(), hi = lo;
        int64_t j = 0;
        for (; j + 8 <= len; j += 8) {
            int32_t b0, b1;
            memcpy(&b0, ver + j, 4);
            memcpy(&b1, ver + j + 4, 4);
            const __m128 w0 = gather4(e, off + (size_t)j, _mm_cvtepu8_epi32(_mm_cvtsi32_si128(b0)));
            const __m128 w1 =
                gather4(e, off + (size_t)j + 4, _mm_cvtepu8_epi32(_mm_cvtsi32_si128(b1)));
            _mm_storeu_ps(wg + j, w0);
            _mm_storeu_ps(wg + j + 4, w1);
            lo = _mm256_add_pd(lo, _mm256_cvtps_pd(w0));
            hi = _mm256_add_pd(hi, _mm256_cvtps_pd(w1));
        }
        double p[8];
        _mm256_storeu_pd(p, lo);
        _mm256_storeu_pd(p + 4, hi);
        thr_lk_gather_tail(e, off, ver, j, len, wg, p);
        z[g] = thr_lk_sum8(p);
    }
}

TARGET static void daxpy_avx2(double *acc, double a, const float *w, int64_t len)
{
    const __m256d va = _mm256_set1_pd(a);
    int64_t j = 0;
    for (; j + 4 <= len; j += 4)
        _mm256_storeu_pd(acc + j, _mm256_add_pd(_mm256_loadu_pd(acc + j),
                                                _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(w + j)), va)));
    for (; j < len; j++)
        acc[j] += (double)w[j] * a;
}

/* The mix of heads [g0, g0 + ng), ng <= 2, columns [c0, c0 + 32) masked by k[4] (lanes
 * past d off): one fused multiply-add per term, rows in order, as the scalar fmaf. */
TARGET static void mix2_avx2(float *o, const float *w, size_t ws, const double *inv,
                             const uint8_t *ver, const float *const v[4], int64_t len, int32_t d,
                             int32_t g0, int32_t ng, int32_t c0, const __m256i k[4])
{
    __m256 a[2][4];
    for (int h = 0; h < 2; h++)
        for (int q = 0; q < 4; q++)
            a[h][q] = _mm256_setzero_ps();
    for (int64_t j = 0; j < len; j++) {
        if (!ver[j])
            continue;
        const float *x = v[ver[j]] + (size_t)j * d + c0;
        const __m256 x0 = _mm256_maskload_ps(x, k[0]), x1 = _mm256_maskload_ps(x + 8, k[1]),
                     x2 = _mm256_maskload_ps(x + 16, k[2]), x3 = _mm256_maskload_ps(x + 24, k[3]);
        for (int32_t h = 0; h < 2; h++) {
            if (h >= ng)
                break;
            const __m256 b =
                _mm256_set1_ps((float)((double)w[(size_t)(g0 + h) * ws + j] * inv[g0 + h]));
            a[h][0] = _mm256_fmadd_ps(b, x0, a[h][0]);
            a[h][1] = _mm256_fmadd_ps(b, x1, a[h][1]);
            a[h][2] = _mm256_fmadd_ps(b, x2, a[h][2]);
            a[h][3] = _mm256_fmadd_ps(b, x3, a[h][3]);
        }
    }
    for (int32_t h = 0; h < ng; h++)
        for (int q = 0; q < 4; q++)
            _mm256_maskstore_ps(o + (size_t)(g0 + h) * d + c0 + 8 * q, k[q], a[h][q]);
}

TARGET static void mix_avx2(float *o, const float *w, size_t ws, const double *inv,
                            const uint8_t *ver, const float *const v[4], int64_t len, int32_t d,
                            int32_t gs)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int32_t c0 = 0; c0 < d; c0 += 32) {
        __m256i k[4];
        for (int q = 0; q < 4; q++) /* lane i on when c0 + 8 q + i < d */
            k[q] = _mm256_cmpgt_epi32(_mm256_set1_epi32(d - c0 - 8 * q), lane);
        for (int32_t g0 = 0; g0 < gs; g0 += 2)
            mix2_avx2(o, w, ws, inv, ver, v, len, d, g0, gs - g0 < 2 ? gs - g0 : 2, c0, k);
    }
}

/* thr_lk_exp1 on 8 lanes, the same operations in the same order. */
TARGET static inline __m256 exp8(__m256 x)
{
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 in = _mm256_cmp_ps(x, _mm256_set1_ps(THR_EXP_LO), _CMP_GE_OQ);
    const __m256 xn = x;
    x = _mm256_min_ps(x, _mm256_set1_ps(THR_EXP_HI)); /* x < HI ? x : HI */
    const __m256 magic = _mm256_set1_ps(THR_EXP_MAGIC);
    const __m256 n = _mm256_sub_ps(
        _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(THR_EXP_LOG2E)), magic), magic);
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(THR_EXP_C1)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(THR_EXP_C2)));
    __m256 p = _mm256_set1_ps(THR_EXP_P0);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(THR_EXP_P1));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(THR_EXP_P2));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(THR_EXP_P3));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(THR_EXP_P4));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(THR_EXP_P5));
    __m256 y = _mm256_mul_ps(p, _mm256_mul_ps(r, r));
    y = _mm256_add_ps(_mm256_add_ps(y, r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), in);
    return _mm256_blendv_ps(y, xn, nan);
}

TARGET static double expsum_avx2(float *out, const float *s, float mx, int64_t len)
{
    const __m256 vm = _mm256_set1_ps(mx);
    __m256d z0 = _mm256_setzero_pd(), z1 = z0;
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) {
        const __m256 y = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(out + j, y);
        z0 = _mm256_add_pd(z0, _mm256_cvtps_pd(_mm256_castps256_ps128(y)));
        z1 = _mm256_add_pd(z1, _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1)));
    }
    double z[8];
    _mm256_storeu_pd(z, z0);
    _mm256_storeu_pd(z + 4, z1);
    thr_lk_expsum_tail(out, s, mx, j, len, z);
    return thr_lk_sum8(z);
}

TARGET static float maxf_avx2(const float *s, int64_t len)
{
    __m256 m = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) /* max_ps(a, b) = a > b ? a : b: a NaN a is ignored */
        m = _mm256_max_ps(_mm256_loadu_ps(s + j), m);
    float l[8], mx = -INFINITY;
    _mm256_storeu_ps(l, m);
    for (int i = 0; i < 8; i++)
        mx = l[i] > mx ? l[i] : mx;
    for (; j < len; j++)
        mx = s[j] > mx ? s[j] : mx;
    return mx;
}

static int64_t sigmin_avx2(const double *acc, int64_t n, int32_t gs, const int64_t *qcum,
                           int64_t nq, const uint8_t *cls, uint8_t sec, int64_t len, double *key)
{
    significance_avx2(key, acc, n, gs, qcum, nq, len);
    return thr_leankv_argmin_scalar(key, cls, sec, len);
}

const thr_lk_kernels thr_lk_avx2 = {"avx2", significance_avx2, gather_avx2, daxpy_avx2,
                                    mix_avx2, expsum_avx2, maxf_avx2,
                                    thr_leankv_argmin_scalar, sigmin_avx2};
#endif
