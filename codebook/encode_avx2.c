/*
 * encode_avx2.c — kvq_codebook_encode's per-key work with AVX2 (codebook/encode_simd.h):
 * the fit-space map of the query-aware methods (k L in double) and the nearest
 * centroid. Each lane does the scalar code's operations in its order, without fused
 * multiply-adds: the same bits (tests/test_encode_simd.c).
 */
#include <immintrin.h>
#include <math.h>

#include "codebook/encode_simd.h"
#include "codebook/nearest.h"

void kvq_cb_mul_lower_d_avx2(const float *k, const double *Ld, int32_t d, float *z)
{
    int32_t b0 = 0;
    /* four blocks of four columns side by side, each from its own first row */
    for (; b0 + 16 <= d; b0 += 16) {
        __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                          _mm256_setzero_pd()};
        for (int32_t a = b0; a < d; a++) {
            const __m256d ka = _mm256_set1_pd((double)k[a]);
            const double *row = Ld + (size_t)a * d + b0;
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
                if (a >= b0 + 4 * q)
                    acc[q] = _mm256_add_pd(acc[q], _mm256_mul_pd(ka, _mm256_loadu_pd(row + 4 * q)));
        }
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
            _mm_storeu_ps(z + b0 + 4 * q, _mm256_cvtpd_ps(acc[q]));
    }
    for (; b0 + 4 <= d; b0 += 4) {
        __m256d acc = _mm256_setzero_pd();
        for (int32_t a = b0; a < d; a++)
            acc = _mm256_add_pd(acc, _mm256_mul_pd(_mm256_set1_pd((double)k[a]),
                                                   _mm256_loadu_pd(Ld + (size_t)a * d + b0)));
        _mm_storeu_ps(z + b0, _mm256_cvtpd_ps(acc));
    }
    for (; b0 < d; b0++) {
        double s = 0;
        for (int32_t a = b0; a < d; a++)
            s += (double)k[a] * Ld[(size_t)a * d + b0];
        z[b0] = (float)s;
    }
}

/* 8x8 transpose: r[i] lane j <- r[j] lane i. */
static inline void transpose8(__m256 r[8])
{
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* The eight centroids [c0, c0 + 8) against x: per lane l (centroid c0 + l) the
 * distance of kvq_km_dot's lane sums (lane j mod 8, then lanes 0 .. 7 in order), and the
 * lane's running first minimum updated (strict <: the earlier index stays on ties). */
static inline __attribute__((always_inline)) void block8(const float *x, float xn, const float *W, const float *cn, int32_t c0,
                          int32_t dg, __m256 *bestv, __m256i *besti)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    /* unrolled: the eight sums in registers (a loop over c kept them on the stack, each
     * add waiting on a store and a reload; the same operations in the same order) */
    __m256 acc[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++)
        acc[c] = _mm256_setzero_ps();
    for (int32_t j = 0; j < dg; j += 8) {
        const __m256 xv = _mm256_loadu_ps(x + j);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++)
            acc[c] = _mm256_add_ps(acc[c],
                                   _mm256_mul_ps(xv, _mm256_loadu_ps(W + (size_t)(c0 + c) * dg + j)));
    }
    /* then lane 0, 1, ... added in order, eight centroids side by side */
    transpose8(acc);
    __m256 dot = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int l = 0; l < 8; l++)
        dot = _mm256_add_ps(dot, acc[l]);
    __m256 v = _mm256_sub_ps(_mm256_add_ps(_mm256_set1_ps(xn), _mm256_loadu_ps(cn + c0)),
                             _mm256_mul_ps(_mm256_set1_ps(2.0f), dot));
    v = _mm256_max_ps(v, _mm256_setzero_ps()); /* v > 0 ? v : 0 (NaN -> 0 too) */
    /* better as kvq_km_better: smaller, or the lane's first (any value beats none) */
    const __m256 lt = _mm256_or_ps(
        _mm256_cmp_ps(v, *bestv, _CMP_LT_OQ),
        _mm256_castsi256_ps(_mm256_cmpeq_epi32(*besti, _mm256_set1_epi32(INT32_MAX))));
    *bestv = _mm256_blendv_ps(*bestv, v, lt);
    *besti = _mm256_blendv_epi8(*besti, _mm256_add_epi32(lane, _mm256_set1_epi32(c0)),
                                _mm256_castps_si256(lt));
}

/* The lanes' minima by kvq_km_better (order-independent), then the centroids [c0, K) one
 * by one in order. */
static int32_t finish(const float *x, float xn, const float *W, const float *cn, int32_t c0,
                      int32_t K, int32_t dg, __m256 bestv, __m256i besti)
{
    float bv[8];
    int32_t bx[8];
    _mm256_storeu_ps(bv, bestv);
    _mm256_storeu_si256((__m256i *)bx, besti);
    float best = INFINITY;
    int32_t bi = INT32_MAX;
    for (int l = 0; l < 8; l++)
        if (bx[l] != INT32_MAX && kvq_km_better(bv[l], bx[l], best, bi)) {
            best = bv[l];
            bi = bx[l];
        }
    for (; c0 < K; c0++) {
        const float v = kvq_km_dist_from_dot(xn, cn[c0], kvq_km_dot(x, W + (size_t)c0 * dg, dg));
        if (kvq_km_better(v, c0, best, bi)) {
            best = v;
            bi = c0;
        }
    }
    return bi == INT32_MAX ? 0 : bi;
}

int32_t kvq_cb_nearest_avx2(const float *x, float xn, const float *W, const float *cn, int32_t K,
                            int32_t dg)
{
    __m256 bestv = _mm256_set1_ps(INFINITY);
    __m256i besti = _mm256_set1_epi32(INT32_MAX);
    int32_t c0 = 0;
    for (; c0 + 8 <= K; c0 += 8)
        block8(x, xn, W, cn, c0, dg, &bestv, &besti);
    return finish(x, xn, W, cn, c0, K, dg, bestv, besti);
}

void kvq_cb_nearest_tile_avx2(const float *x, int64_t ldx, const float *xn, int32_t n,
                              const float *W, const float *cn, int32_t K, int32_t dg,
                              int32_t *out, int64_t ldo)
{
    __m256 bestv[KVQ_CB_TILE];
    __m256i besti[KVQ_CB_TILE];
    for (int32_t i = 0; i < n; i++) {
        bestv[i] = _mm256_set1_ps(INFINITY);
        besti[i] = _mm256_set1_epi32(INT32_MAX);
    }
    /* centroids outer, keys inner: a block of eight centroids (8 dg floats) is read
     * from L1 by every key of the tile, where key by key all K dg floats (64 KiB at K 256,
     * dg 64: more than L1) stream from L2 once per key */
    int32_t c0 = 0;
    for (; c0 + 8 <= K; c0 += 8)
        for (int32_t i = 0; i < n; i++)
            block8(x + (size_t)i * ldx, xn[i], W, cn, c0, dg, &bestv[i], &besti[i]);
    for (int32_t i = 0; i < n; i++)
        out[(size_t)i * ldo] = finish(x + (size_t)i * ldx, xn[i], W, cn, c0, K, dg, bestv[i], besti[i]);
}
