/*
 * kmeans_first_avx512.c — the first, dense assignment pass of the bounded Lloyd loop
 * (kmeans_bounds.c) with a bf16 filter (AVX-512 BF16; call only when
 * kvq_km_seed_bf16_ok()).
 *
 * Every distance of a point to every centroid is first computed from bf16 copies centred
 * on a fixed mu (vdpbf16ps, two dims per instruction), as an interval that provably
 * holds the true distance (the proof of kmeans_seed_avx512.c: the bf16 rounding of each
 * side, EPS_B ||x - mu||, and the f32 sums', kappa (bn + bnc)). Every centroid whose
 * lower end, less the expanded form's rounding bound e_i, is above the smallest upper
 * end plus e_i, has a computed s(i, j) above some other centroid's: it can neither win
 * nor tie. The chunks of 32 centroids holding the others are computed exactly by the
 * f32 kernel (the same bits as the plain pass), and the point's nearest centroid comes
 * from them. The per-group lower bounds are the bf16 lower ends, or the exact ones
 * where computed: valid, slightly looser than the plain pass's, so later iterations
 * may examine a few more groups; no assignment changes.
 * Built with the AVX-512 flags: call anything here only when kvq_km_seed_bf16_ok();
 * kvq_km_first_free is in kmeans_bounds.c (built for any x86-64).
 */
#include "kmeans/kmeans_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EPS_B (0.00390625f + 1.2e-7f) /* 2^-8 + 2^-23, as kmeans_seed_avx512.c */
#define ABS_SLACK 1e-20f
#define RSLACK (1.0f / 65536.0f)

int kvq_km_first_prep(kvq_km_first *f, const float *x, int64_t m, int32_t d, const float *cent,
                      const int32_t *gmem, int32_t k, int32_t kpad, int32_t threads)
{
    const int32_t dp = (d + 1) / 2 * 2, dh = dp / 2;
    memset(f, 0, sizeof *f);
    double *sum = calloc((size_t)d, sizeof *sum);
    float *mu = malloc((size_t)d * sizeof *mu);
    f->xb = malloc((size_t)m * dp * sizeof *f->xb);
    f->bn = malloc((size_t)m * sizeof *f->bn);
    f->yr = malloc((size_t)m * sizeof *f->yr);
    f->cpan = calloc((size_t)kpad * dp, sizeof *f->cpan);
    f->cbn = calloc((size_t)kpad, sizeof *f->cbn);
    f->czr = calloc((size_t)kpad, sizeof *f->czr);
    if (!sum || !mu || !f->xb || !f->bn || !f->yr || !f->cpan || !f->cbn || !f->czr) {
        free(sum);
        free(mu);
        kvq_km_first_free(f);
        return 0;
    }
    for (int64_t i = 0; i < m; i++) /* mu only decides what is computed, never a value */
        for (int32_t j = 0; j < d; j++)
            sum[j] += x[(size_t)i * d + j];
    for (int32_t j = 0; j < d; j++)
        mu[j] = (float)(sum[j] / (double)(m > 0 ? m : 1));
#pragma omp parallel for num_threads(threads) schedule(static) if (m > 4096)
    for (int64_t i = 0; i < m; i++)
        kvq_km_seed_bf16_row(x + (size_t)i * d, mu, d, f->xb + (size_t)i * dp, 2, &f->bn[i],
                             &f->yr[i]);
    for (int32_t q = 0; q < k; q++) /* centroids in group order, 32 a chunk, by lane */
        kvq_km_seed_bf16_row(cent + (size_t)gmem[q] * d, mu, d,
                             f->cpan + ((size_t)(q / 32) * dh * 32 + (size_t)(q % 32)) * 2, 64,
                             &f->cbn[q], &f->czr[q]);
    free(sum);
    free(mu);
    for (int32_t q = 0; q < k; q++)
        f->czmax = f->czr[q] > f->czmax ? f->czr[q] : f->czmax;
    f->dp = dp;
    f->kappa = (float)(dp + 16) / 4194304.0f;
    return 1;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))

/* The bf16 dots of points i0 .. i0 + np - 1 (np <= 8) with every centroid, in group
 * order: row [np, kpad]. */
TARGET void kvq_km_first_dots_avx512(const kvq_km_first *f, int64_t i0, int32_t np,
                                     int32_t kpad, float *row)
{
    const int32_t dh = f->dp / 2;
    const uint32_t *xr[8];
    for (int q = 0; q < 8; q++)
        xr[q] = (const uint32_t *)f->xb + (size_t)(i0 + (q < np ? q : 0)) * dh;
    for (int32_t c = 0; c < kpad; c += 32) {
        const uint32_t *pan = (const uint32_t *)f->cpan + (size_t)(c / 32) * dh * 32;
        __m512 acc[16];
#pragma GCC unroll 16
        for (int u = 0; u < 16; u++)
            acc[u] = _mm512_setzero_ps();
        for (int32_t j = 0; j < dh; j++) {
            const __m512bh c0 = (__m512bh)_mm512_loadu_si512(pan + (size_t)j * 32);
            const __m512bh c1 = (__m512bh)_mm512_loadu_si512(pan + (size_t)j * 32 + 16);
#pragma GCC unroll 8
            for (int q = 0; q < 8; q++) {
                const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xr[q][j]);
                acc[2 * q] = _mm512_dpbf16_ps(acc[2 * q], xv, c0);
                acc[2 * q + 1] = _mm512_dpbf16_ps(acc[2 * q + 1], xv, c1);
            }
        }
        for (int q = 0; q < np; q++) {
            _mm512_storeu_ps(row + (size_t)q * kpad + c, acc[2 * q]);
            _mm512_storeu_ps(row + (size_t)q * kpad + c + 16, acc[2 * q + 1]);
        }
    }
}

/* Point i's interval per centroid from its bf16 dots in r [k] (group order): r gets the
 * lower ends (>= 0) of the true distances; every chunk of 32 holding a centroid that may
 * be the nearest gets its bit in chunks. e: the point's e_i. */
TARGET void kvq_km_first_filter_avx512(const kvq_km_first *f, int64_t i, int32_t k, float e,
                                       float *r, uint64_t *chunks)
{
    const __m512 vbn = _mm512_set1_ps(f->bn[i]), kap = _mm512_set1_ps(f->kappa);
    const __m512 two = _mm512_set1_ps(2.0f), zero = _mm512_setzero_ps();
    const __m512 er0 = _mm512_set1_ps(f->yr[i] + ABS_SLACK);
    const __m512 lo_s = _mm512_set1_ps(1.0f - RSLACK);
    __m512 umin = _mm512_set1_ps(INFINITY);
    for (int32_t q = 0; q < k; q += 16) {
        const __mmask16 live = k - q >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (k - q)) - 1u);
        const __m512 bsum = _mm512_add_ps(vbn, _mm512_maskz_loadu_ps(live, f->cbn + q));
        const __m512 sb = _mm512_fnmadd_ps(two, _mm512_maskz_loadu_ps(live, r + q), bsum);
        const __m512 rad = _mm512_mul_ps(kap, bsum);
        const __m512 lo = _mm512_sqrt_ps(_mm512_max_ps(_mm512_sub_ps(sb, rad), zero));
        const __m512 er = _mm512_add_ps(er0, _mm512_maskz_loadu_ps(live, f->czr + q));
        const __m512 lt = _mm512_max_ps(_mm512_mul_ps(_mm512_sub_ps(lo, er), lo_s), zero);
        _mm512_mask_storeu_ps(r + q, live, lt);
        /* the smallest sb + rad; a NaN lane is left out */
        umin = _mm512_mask_min_ps(umin, live, _mm512_add_ps(sb, rad), umin);
    }
    /* an upper end of the true distance to the centroid of the smallest sb + rad, with
     * the largest centroid radius (one square root per point, not per centroid) */
    const float u = (sqrtf(fmaxf(_mm512_reduce_min_ps(umin), 0.0f)) + f->yr[i] + f->czmax +
                     ABS_SLACK) * (1.0f + RSLACK);
    /* s(i, j*) <= ut^2 + e for the j* of the smallest upper end */
    const __m512 ustar = _mm512_set1_ps((u * u + e) * (1.0f + RSLACK) + e);
    for (int32_t q = 0; q < k; q += 16) {
        const __mmask16 live = k - q >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (k - q)) - 1u);
        const __m512 lt = _mm512_maskz_loadu_ps(live, r + q);
        /* proved out: lt^2 - e > s(i, j*), i.e. lt^2 > ustar; NaN: not proved */
        const __mmask16 out =
            _mm512_cmp_ps_mask(_mm512_mul_ps(_mm512_mul_ps(lt, lt), lo_s), ustar, _CMP_GT_OQ);
        if ((__mmask16)(live & ~out))
            chunks[(q / 32) / 64] |= 1ull << ((q / 32) % 64);
    }
}

#endif
