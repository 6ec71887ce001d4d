/*
 * kmeans_avx512.c — AVX-512 versions of the CPU backend's hot loops, sixteen lanes per
 * register. Each equals its scalar reference bit for bit, as the AVX2 versions do
 * (kmeans_argmin_avx2.c explains why), and tests/test_kmeans.c checks that:
 *
 *   kvq_km_row_argmin_avx512     fused argmin of one SGEMM distance row
 *                                (= kvq_km_row_argmin_ref)
 *   kvq_km_assign_direct_avx512  small-d Lloyd assignment by exact distances
 *                                (= kvq_km_l2sq + first minimum)
 *   kvq_km_cand_eval_avx512      seeding distances, one tile of 16 lanes per register
 *                                (= kvq_km_cand_eval_ref)
 *
 * Built with the AVX-512 flags (Makefile: *_avx512.c); call only when
 * kvq_cpu_has_avx512() (F, BW, VL; nothing here needs DQ).
 */
#include "kmeans/kmeans_internal.h"
#include "kmeans/kmeans_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

/* First minimum of 16 lanes (value, index): the smallest value, and among the lanes
 * holding it the smallest index, which is what merging them with kvq_km_better gives.
 * Values are >= +0 or +inf (never NaN), so equality picks exactly those lanes. */
static inline TARGET void merge16(__m512 best, __m512i bi, float *out_b, int32_t *out_i)
{
    const float b = _mm512_reduce_min_ps(best);
    const __mmask16 at = _mm512_cmp_ps_mask(best, _mm512_set1_ps(b), _CMP_EQ_OQ);
    *out_i = _mm512_mask_reduce_min_epi32(at, bi);
    *out_b = b;
}

/* ---- fused argmin of an SGEMM distance row ----------------------------------------- */

TARGET void kvq_km_row_argmin_avx512(const float *s, const float *cn, float xn, int32_t kc,
                                     int32_t *out_idx, float *out_dist)
{
    const __m512 vxn = _mm512_set1_ps(xn), two = _mm512_set1_ps(2.0f);
    const __m512 zero = _mm512_setzero_ps();
    const __m512i sixteen = _mm512_set1_epi32(16);
    __m512 best = _mm512_set1_ps(INFINITY);
    __m512i bi = _mm512_set1_epi32(INT32_MAX);
    __m512i jv = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int32_t j = 0;
    for (; j + 16 <= kc; j += 16) {
        const __m512 t = _mm512_add_ps(vxn, _mm512_loadu_ps(cn + j));
        const __m512 u = _mm512_mul_ps(two, _mm512_loadu_ps(s + j));
        /* max(v, +0) gives +0 for -0 and NaN, as the ternary of the reference */
        const __m512 v = _mm512_max_ps(_mm512_sub_ps(t, u), zero);
        const __mmask16 lt = _mm512_cmp_ps_mask(v, best, _CMP_LT_OQ);
        best = _mm512_mask_mov_ps(best, lt, v);
        bi = _mm512_mask_mov_epi32(bi, lt, jv);
        jv = _mm512_add_epi32(jv, sixteen);
    }
    if (j < kc) { /* the tail, masked: lanes past kc never win */
        const __mmask16 live = (__mmask16)((1u << (kc - j)) - 1u);
        const __m512 t = _mm512_add_ps(vxn, _mm512_maskz_loadu_ps(live, cn + j));
        const __m512 u = _mm512_mul_ps(two, _mm512_maskz_loadu_ps(live, s + j));
        const __m512 v = _mm512_max_ps(_mm512_sub_ps(t, u), zero);
        const __mmask16 lt = _mm512_mask_cmp_ps_mask(live, v, best, _CMP_LT_OQ);
        best = _mm512_mask_mov_ps(best, lt, v);
        bi = _mm512_mask_mov_epi32(bi, lt, jv);
    }
    float b;
    int32_t i;
    merge16(best, bi, &b, &i);
    *out_idx = i == INT32_MAX ? 0 : i; /* every distance overflowed: as the reference */
    *out_dist = b;
}

/* ---- small-d direct assignment ------------------------------------------------------ */

/* NP rows against every centroid, DP = 8 or 16 padded dims. The centroid registers of
 * one group of 16 are loaded once and used for all NP rows. (c - x)^2 has the bits of
 * (x - c)^2, so the row value can be the broadcast operand. Per lane the operations
 * are kvq_km_l2sq's: lane l of the reference holds term l (and l + 8 when d > 8), and
 * the lanes are added 0, 1, ..., 7 in order; padded dims add +0, which changes no bit. */
static inline TARGET __attribute__((always_inline)) void
direct_rows(const float *x, int np, int dp, int32_t d, const float *ct, int32_t kc,
            int32_t *assign, float *dist2)
{
    const int32_t kc16 = (kc + 15) & ~15;
    const __m512i sixteen = _mm512_set1_epi32(16);
    const __mmask16 last = (__mmask16)(kc % 16 ? (1u << (kc % 16)) - 1u : 0xffffu);
    float xp[4][16];
    __m512 best[4];
    __m512i bi[4];
    for (int q = 0; q < np; q++) {
        memset(xp[q], 0, sizeof xp[q]);
        memcpy(xp[q], x + (size_t)q * d, (size_t)d * sizeof(float));
        best[q] = _mm512_set1_ps(INFINITY);
        bi[q] = _mm512_set1_epi32(INT32_MAX);
    }
    __m512i jv = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int32_t j = 0; j < kc16; j += 16) {
        const __mmask16 live = j + 16 < kc16 ? (__mmask16)0xffffu : last;
        __m512 c[16];
#pragma GCC unroll 16
        for (int l = 0; l < dp; l++)
            c[l] = _mm512_loadu_ps(ct + (size_t)l * kc16 + j);
#pragma GCC unroll 16
        for (int q = 0; q < np; q++) {
            __m512 acc[8];
#pragma GCC unroll 16
            for (int l = 0; l < 8; l++) {
                const __m512 df = _mm512_sub_ps(c[l], _mm512_set1_ps(xp[q][l]));
                acc[l] = _mm512_mul_ps(df, df);
            }
#pragma GCC unroll 16
            for (int l = 8; l < dp; l++) {
                const __m512 df = _mm512_sub_ps(c[l], _mm512_set1_ps(xp[q][l]));
                acc[l - 8] = _mm512_add_ps(acc[l - 8], _mm512_mul_ps(df, df));
            }
            __m512 v = acc[0];
#pragma GCC unroll 16
            for (int l = 1; l < 8; l++)
                v = _mm512_add_ps(v, acc[l]);
            const __mmask16 lt = _mm512_mask_cmp_ps_mask(live, v, best[q], _CMP_LT_OQ);
            best[q] = _mm512_mask_mov_ps(best[q], lt, v);
            bi[q] = _mm512_mask_mov_epi32(bi[q], lt, jv);
        }
        jv = _mm512_add_epi32(jv, sixteen);
    }
    for (int q = 0; q < np; q++) {
        float b;
        int32_t i;
        merge16(best[q], bi[q], &b, &i);
        assign[q] = i == INT32_MAX ? 0 : i;
        if (dist2)
            dist2[q] = b;
    }
}

static TARGET void direct_8(const float *x, int64_t nr, int32_t d, const float *ct,
                            int32_t kc, int32_t *assign, float *dist2)
{
    int64_t r = 0;
    for (; r + 4 <= nr; r += 4)
        direct_rows(x + (size_t)r * d, 4, 8, d, ct, kc, assign + r, dist2 ? dist2 + r : NULL);
    for (; r < nr; r++)
        direct_rows(x + (size_t)r * d, 1, 8, d, ct, kc, assign + r, dist2 ? dist2 + r : NULL);
}

static TARGET void direct_16(const float *x, int64_t nr, int32_t d, const float *ct,
                             int32_t kc, int32_t *assign, float *dist2)
{
    int64_t r = 0;
    for (; r + 2 <= nr; r += 2)
        direct_rows(x + (size_t)r * d, 2, 16, d, ct, kc, assign + r, dist2 ? dist2 + r : NULL);
    for (; r < nr; r++)
        direct_rows(x + (size_t)r * d, 1, 16, d, ct, kc, assign + r, dist2 ? dist2 + r : NULL);
}

TARGET void kvq_km_assign_direct_avx512(const float *x, int64_t nr, int32_t d,
                                        const float *ct, int32_t kc, int32_t *assign,
                                        float *dist2)
{
    if (d <= 8)
        direct_8(x, nr, d, ct, kc, assign, dist2);
    else
        direct_16(x, nr, d, ct, kc, assign, dist2);
}

/* ---- seeding: tiles of P points x 16 / P candidates (kvq_km_cand_eval_ref) ---------- */

#define CL KVQ_KM_CAND_LANES

/* A tile's 16 lanes from P consecutive per-point floats at a: lane l gets a[l % P]. */
static inline TARGET __attribute__((always_inline)) __m512 tile16(const float *a, int P)
{
    switch (P) {
    case 1:
        return _mm512_set1_ps(a[0]);
    case 2: {
        double v;
        memcpy(&v, a, sizeof v);
        return _mm512_castpd_ps(_mm512_set1_pd(v));
    }
    case 4:
        return _mm512_broadcast_f32x4(_mm_loadu_ps(a));
    case 8:
        return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd((const double *)a)));
    default:
        return _mm512_loadu_ps(a);
    }
}

static inline TARGET __attribute__((always_inline)) void
tile_finish16(__m512 dot, const float *xn, const float *w, const float *dmin, __m512 cn, int P,
              float *drow, __m512d *p0, __m512d *p1)
{
    const __m512 v = _mm512_max_ps(_mm512_sub_ps(_mm512_add_ps(tile16(xn, P), cn),
                                                 _mm512_mul_ps(_mm512_set1_ps(2.0f), dot)),
                                   _mm512_setzero_ps());
    _mm512_storeu_ps(drow, v);
    const __m512 m = _mm512_min_ps(v, tile16(dmin, P));
    const __m512 wv = tile16(w, P);
    const __m256 mlo = _mm512_castps512_ps256(m), wlo = _mm512_castps512_ps256(wv);
    const __m256 mhi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(m), 1));
    const __m256 whi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(wv), 1));
    *p0 = _mm512_add_pd(*p0, _mm512_mul_pd(_mm512_cvtps_pd(wlo), _mm512_cvtps_pd(mlo)));
    *p1 = _mm512_add_pd(*p1, _mm512_mul_pd(_mm512_cvtps_pd(whi), _mm512_cvtps_pd(mhi)));
}

static inline TARGET __attribute__((always_inline)) void
cand_tiles16(const float *xi, const float *xn, const float *w, const float *dmin,
             int64_t ntiles, int32_t d, const int P, const float *ct, const float *cn,
             float *dist, double *pot)
{
    __m512d p0 = _mm512_loadu_pd(pot), p1 = _mm512_loadu_pd(pot + 8);
    const __m512 vcn = _mm512_loadu_ps(cn);
    int64_t g = 0;
    for (; g + 8 <= ntiles; g += 8) {
        __m512 acc[8];
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++)
            acc[q] = _mm512_setzero_ps();
        const float *xg = xi + (size_t)g * d * P;
        for (int32_t j = 0; j < d; j++) {
            const __m512 c = _mm512_loadu_ps(ct + (size_t)j * CL);
#pragma GCC unroll 8
            for (int q = 0; q < 8; q++)
                acc[q] = _mm512_fmadd_ps(tile16(xg + ((size_t)q * d + j) * P, P), c, acc[q]);
        }
        for (int q = 0; q < 8; q++) {
            const int64_t i0 = (g + q) * P;
            tile_finish16(acc[q], xn + i0, w + i0, dmin + i0, vcn, P,
                          dist + (size_t)(g + q) * CL, &p0, &p1);
        }
    }
    for (; g < ntiles; g++) {
        __m512 a = _mm512_setzero_ps();
        const float *xg = xi + (size_t)g * d * P;
        for (int32_t j = 0; j < d; j++)
            a = _mm512_fmadd_ps(tile16(xg + (size_t)j * P, P), _mm512_loadu_ps(ct + (size_t)j * CL),
                                a);
        const int64_t i0 = g * P;
        tile_finish16(a, xn + i0, w + i0, dmin + i0, vcn, P, dist + (size_t)g * CL, &p0, &p1);
    }
    _mm512_storeu_pd(pot, p0);
    _mm512_storeu_pd(pot + 8, p1);
}

TARGET void kvq_km_cand_eval_avx512(const float *xi, const float *xn, const float *w,
                                    const float *dmin, int64_t ntiles, int32_t d, int32_t P,
                                    const float *ct, const float *cn, float *dist, double *pot)
{
    switch (P) {
    case 1:
        cand_tiles16(xi, xn, w, dmin, ntiles, d, 1, ct, cn, dist, pot);
        break;
    case 2:
        cand_tiles16(xi, xn, w, dmin, ntiles, d, 2, ct, cn, dist, pot);
        break;
    case 4:
        cand_tiles16(xi, xn, w, dmin, ntiles, d, 4, ct, cn, dist, pot);
        break;
    case 8:
        cand_tiles16(xi, xn, w, dmin, ntiles, d, 8, ct, cn, dist, pot);
        break;
    default:
        cand_tiles16(xi, xn, w, dmin, ntiles, d, 16, ct, cn, dist, pot);
        break;
    }
}
#endif
