/*
 * kmeans_argmin_avx2.c — AVX2 version of the fused argmin of the CPU backend.
 *
 * Equals kvq_km_row_argmin_ref bit for bit: every distance is formed by the same
 * float operations as kvq_km_dist_from_dot (add, multiply by 2, subtract, clamp at
 * +0; no FMA), each of the 8 lanes keeps its first minimum, and the lanes are merged
 * with kvq_km_better, which yields the sequential first minimum whatever the lane
 * layout. tests/test_kmeans.c compares the two on rows with many ties.
 *
 * kvq_km_assign_direct_avx2 is the small-d path: exact distances, eight centroids per
 * register, each the same float operations in the same order as kvq_km_l2sq (lane
 * l of the reference sums the terms t = l mod 8; the lanes are then added in order),
 * so it equals the scalar reference (kvq_km_l2sq + first minimum) bit for bit.
 *
 * kvq_km_cand_eval_avx2 is the seeding kernel (distances to up to 16 candidates by one
 * fused multiply-add chain per lane), equal to kvq_km_cand_eval_ref bit for bit.
 *
 * The functions carry a target attribute so they also build where -mavx2 is not passed.
 */
#include "kmeans/kmeans_internal.h"
#include "kmeans/kmeans_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define TARGET __attribute__((target("avx2")))

TARGET void kvq_km_row_argmin_avx2(const float *s, const float *cn, float xn, int32_t kc,
                                   int32_t *out_idx, float *out_dist)
{
    const __m256 vxn = _mm256_set1_ps(xn), two = _mm256_set1_ps(2.0f);
    const __m256 zero = _mm256_setzero_ps();
    const __m256i eight = _mm256_set1_epi32(8);
    __m256 best = _mm256_set1_ps(INFINITY);
    __m256i bi = _mm256_set1_epi32(INT32_MAX);
    __m256i jv = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int32_t j = 0;
    for (; j + 8 <= kc; j += 8) {
        const __m256 t = _mm256_add_ps(vxn, _mm256_loadu_ps(cn + j));
        const __m256 u = _mm256_mul_ps(two, _mm256_loadu_ps(s + j));
        /* max(v, +0) returns +0 for -0 and NaN, as the ternary in the reference */
        const __m256 v = _mm256_max_ps(_mm256_sub_ps(t, u), zero);
        const __m256 lt = _mm256_cmp_ps(v, best, _CMP_LT_OQ);
        best = _mm256_blendv_ps(best, v, lt);
        bi = _mm256_castps_si256(
            _mm256_blendv_ps(_mm256_castsi256_ps(bi), _mm256_castsi256_ps(jv), lt));
        jv = _mm256_add_epi32(jv, eight);
    }
    float bl[8];
    int32_t il[8];
    _mm256_storeu_ps(bl, best);
    _mm256_storeu_si256((__m256i *)il, bi);
    for (int l = 0; j < kc; j++, l++) {
        const float v = kvq_km_dist_from_dot(xn, cn[j], s[j]);
        if (kvq_km_better(v, j, bl[l], il[l])) {
            bl[l] = v;
            il[l] = j;
        }
    }
    float b = bl[0];
    int32_t i = il[0];
    for (int l = 1; l < 8; l++)
        if (kvq_km_better(bl[l], il[l], b, i)) {
            b = bl[l];
            i = il[l];
        }
    *out_idx = i == INT32_MAX ? 0 : i; /* every distance overflowed: as the reference */
    *out_dist = b;
}

/* DP = 8 or 16 padded dims: the padding (zeros in x and ct) adds +0 to lanes that
 * are already >= 0, which changes no bit, so each lane equals kvq_km_l2sq's. */
#define DIRECT_KERNEL(DP)                                                                  \
    static TARGET void direct_##DP(const float *x, int64_t nr, int32_t d, const float *ct,  \
                                   int32_t kc, int32_t *assign, float *dist2)               \
    {                                                                                      \
        const int32_t kc8 = (kc + 7) & ~7;                                                 \
        const __m256i eight = _mm256_set1_epi32(8), vkc = _mm256_set1_epi32(kc);           \
        for (int64_t r = 0; r < nr; r++) {                                                 \
            float xp[DP] = {0};                                                            \
            memcpy(xp, x + (size_t)r * d, (size_t)d * sizeof(float));                      \
            __m256 xb[DP];                                                                 \
            for (int t = 0; t < DP; t++)                                                   \
                xb[t] = _mm256_set1_ps(xp[t]);                                             \
            __m256 best = _mm256_set1_ps(INFINITY);                                        \
            __m256i bi = _mm256_set1_epi32(INT32_MAX);                                     \
            __m256i jv = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);                        \
            for (int32_t j = 0; j < kc8; j += 8) {                                         \
                __m256 acc[8];                                                             \
                for (int l = 0; l < 8; l++) {                                              \
                    const __m256 df =                                                      \
                        _mm256_sub_ps(xb[l], _mm256_loadu_ps(ct + (size_t)l * kc8 + j));   \
                    acc[l] = _mm256_mul_ps(df, df);                                        \
                }                                                                          \
                for (int l = 8; l < DP; l++) {                                             \
                    const __m256 df =                                                      \
                        _mm256_sub_ps(xb[l], _mm256_loadu_ps(ct + (size_t)l * kc8 + j));   \
                    acc[l - 8] = _mm256_add_ps(acc[l - 8], _mm256_mul_ps(df, df));         \
                }                                                                          \
                __m256 v = acc[0];                                                         \
                for (int l = 1; l < 8; l++)                                                \
                    v = _mm256_add_ps(v, acc[l]);                                          \
                /* padding lanes (j + l >= kc) never win */                                \
                const __m256 lt = _mm256_and_ps(_mm256_cmp_ps(v, best, _CMP_LT_OQ),        \
                                                _mm256_castsi256_ps(_mm256_cmpgt_epi32(vkc, jv))); \
                best = _mm256_blendv_ps(best, v, lt);                                      \
                bi = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(bi),         \
                                                          _mm256_castsi256_ps(jv), lt));   \
                jv = _mm256_add_epi32(jv, eight);                                          \
            }                                                                              \
            float bl[8];                                                                   \
            int32_t il[8];                                                                 \
            _mm256_storeu_ps(bl, best);                                                    \
            _mm256_storeu_si256((__m256i *)il, bi);                                        \
            float b = bl[0];                                                               \
            int32_t i = il[0];                                                             \
            for (int l = 1; l < 8; l++)                                                    \
                if (kvq_km_better(bl[l], il[l], b, i)) {                                   \
                    b = bl[l];                                                             \
                    i = il[l];                                                             \
                }                                                                          \
            assign[r] = i == INT32_MAX ? 0 : i;                                            \
            if (dist2)                                                                     \
                dist2[r] = b;                                                              \
        }                                                                                  \
    }

DIRECT_KERNEL(8)
DIRECT_KERNEL(16)

void kvq_km_assign_direct_avx2(const float *x, int64_t nr, int32_t d, const float *ct,
                               int32_t kc, int32_t *assign, float *dist2)
{
    if (d <= 8)
        direct_8(x, nr, d, ct, kc, assign, dist2);
    else
        direct_16(x, nr, d, ct, kc, assign, dist2);
}

/* ---- seeding: tiles of P points x 16 / P candidates (kvq_km_cand_eval_ref) ----------
 * A tile is two registers of 8 lanes (lanes 0-7, 8-15); for P <= 8 both take the same
 * broadcast of the tile's P point values, for P = 16 each its own 8. Every lane is the
 * reference's fused chain. Four tiles at a time give 8 independent chains. */

#define TARGET_FMA __attribute__((target("avx2,fma")))
#define CL KVQ_KM_CAND_LANES

/* 8 lanes of half h of a tile from P consecutive per-point floats at a. */
static inline TARGET_FMA __attribute__((always_inline)) __m256 tile_half(const float *a, int P,
                                                                         int h)
{
    switch (P) {
    case 1:
        return _mm256_set1_ps(a[0]);
    case 2: {
        double v;
        memcpy(&v, a, sizeof v);
        return _mm256_castpd_ps(_mm256_set1_pd(v));
    }
    case 4:
        return _mm256_broadcast_ps((const __m128 *)a);
    case 8:
        return _mm256_loadu_ps(a);
    default:
        return _mm256_loadu_ps(a + 8 * h);
    }
}

/* Distances and potential terms of half h of tile g (points i0 = g * P ...). */
static inline TARGET_FMA __attribute__((always_inline)) void
tile_finish8(__m256 dot, const float *xn, const float *w, const float *dmin, const float *cn,
             int P, int h, float *drow, __m256d *p0, __m256d *p1)
{
    const __m256 v = _mm256_max_ps(
        _mm256_sub_ps(_mm256_add_ps(tile_half(xn, P, h), _mm256_loadu_ps(cn + 8 * h)),
                      _mm256_mul_ps(_mm256_set1_ps(2.0f), dot)),
        _mm256_setzero_ps());
    _mm256_storeu_ps(drow + 8 * h, v);
    const __m256 m = _mm256_min_ps(v, tile_half(dmin, P, h));
    const __m256 wv = tile_half(w, P, h);
    *p0 = _mm256_add_pd(*p0, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(wv)),
                                           _mm256_cvtps_pd(_mm256_castps256_ps128(m))));
    *p1 = _mm256_add_pd(*p1, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(wv, 1)),
                                           _mm256_cvtps_pd(_mm256_extractf128_ps(m, 1))));
}

static inline TARGET_FMA __attribute__((always_inline)) void
cand_tiles(const float *xi, const float *xn, const float *w, const float *dmin, int64_t ntiles,
           int32_t d, const int P, const float *ct, const float *cn, float *dist, double *pot)
{
    __m256d ps[4];
    for (int q = 0; q < 4; q++)
        ps[q] = _mm256_loadu_pd(pot + 4 * q);
    int64_t g = 0;
    for (; g + 4 <= ntiles; g += 4) {
        __m256 acc[4][2];
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
            acc[q][0] = acc[q][1] = _mm256_setzero_ps();
        const float *xg = xi + (size_t)g * d * P;
        for (int32_t j = 0; j < d; j++) {
            const __m256 c0 = _mm256_loadu_ps(ct + (size_t)j * CL);
            const __m256 c1 = _mm256_loadu_ps(ct + (size_t)j * CL + 8);
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                const float *a = xg + ((size_t)q * d + j) * P;
                acc[q][0] = _mm256_fmadd_ps(tile_half(a, P, 0), c0, acc[q][0]);
                acc[q][1] = _mm256_fmadd_ps(tile_half(a, P, 1), c1, acc[q][1]);
            }
        }
        for (int q = 0; q < 4; q++) {
            const int64_t i0 = (g + q) * P;
            float *drow = dist + (size_t)(g + q) * CL;
            for (int h = 0; h < 2; h++)
                tile_finish8(acc[q][h], xn + i0, w + i0, dmin + i0, cn, P, h, drow,
                             &ps[2 * h], &ps[2 * h + 1]);
        }
    }
    for (; g < ntiles; g++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        const float *xg = xi + (size_t)g * d * P;
        for (int32_t j = 0; j < d; j++) {
            a0 = _mm256_fmadd_ps(tile_half(xg + (size_t)j * P, P, 0),
                                 _mm256_loadu_ps(ct + (size_t)j * CL), a0);
            a1 = _mm256_fmadd_ps(tile_half(xg + (size_t)j * P, P, 1),
                                 _mm256_loadu_ps(ct + (size_t)j * CL + 8), a1);
        }
        const int64_t i0 = g * P;
        tile_finish8(a0, xn + i0, w + i0, dmin + i0, cn, P, 0, dist + (size_t)g * CL, &ps[0],
                     &ps[1]);
        tile_finish8(a1, xn + i0, w + i0, dmin + i0, cn, P, 1, dist + (size_t)g * CL, &ps[2],
                     &ps[3]);
    }
    for (int q = 0; q < 4; q++)
        _mm256_storeu_pd(pot + 4 * q, ps[q]);
}

TARGET_FMA void kvq_km_cand_eval_avx2(const float *xi, const float *xn, const float *w,
                                      const float *dmin, int64_t ntiles, int32_t d, int32_t P,
                                      const float *ct, const float *cn, float *dist,
                                      double *pot)
{
    switch (P) {
    case 1:
        cand_tiles(xi, xn, w, dmin, ntiles, d, 1, ct, cn, dist, pot);
        break;
    case 2:
        cand_tiles(xi, xn, w, dmin, ntiles, d, 2, ct, cn, dist, pot);
        break;
    case 4:
        cand_tiles(xi, xn, w, dmin, ntiles, d, 4, ct, cn, dist, pot);
        break;
    case 8:
        cand_tiles(xi, xn, w, dmin, ntiles, d, 8, ct, cn, dist, pot);
        break;
    default:
        cand_tiles(xi, xn, w, dmin, ntiles, d, 16, ct, cn, dist, pot);
        break;
    }
}
#endif
