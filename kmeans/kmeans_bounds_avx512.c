/*
 * kmeans_bounds_avx512.c — AVX-512 versions of the two dot-product kernels of the
 * Lloyd iterations with bounds (kmeans_bounds.c). Each output is one fused
 * multiply-add chain over the dims in ascending order, so these equal the scalar
 * references (kvq_km_panel_dots_ref, kvq_km_pair_dots_ref) bit for bit; test_kmeans
 * checks it.
 *
 * Built with the AVX-512 flags (Makefile: *_avx512.c); call only when
 * kvq_cpu_has_avx512().
 */
#include "kmeans/kmeans_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <math.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

/* Eight points against 32 columns: 16 accumulators in registers (named, so the
 * compiler keeps them there), two panel loads and eight broadcasts per dim. */
#define ROW2(P)                                                                            \
    do {                                                                                   \
        const __m512 xv = _mm512_set1_ps(x##P[t]);                                         \
        a##P##0 = _mm512_fmadd_ps(xv, c0, a##P##0);                                        \
        a##P##1 = _mm512_fmadd_ps(xv, c1, a##P##1);                                        \
    } while (0)
#define STORE2(P)                                                                          \
    do {                                                                                   \
        _mm512_storeu_ps(out + (size_t)(P) * ldo, a##P##0);                                \
        _mm512_storeu_ps(out + (size_t)(P) * ldo + 16, a##P##1);                           \
    } while (0)

static inline TARGET void dots_8x32(const float *const *xp, int32_t d, const float *panel,
                                    int32_t ncols, float *out, int32_t ldo)
{
    const float *x0 = xp[0], *x1 = xp[1], *x2 = xp[2], *x3 = xp[3];
    const float *x4 = xp[4], *x5 = xp[5], *x6 = xp[6], *x7 = xp[7];
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
    __m512 a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
    __m512 a60 = a00, a61 = a00, a70 = a00, a71 = a00;
    for (int32_t t = 0; t < d; t++) {
        const __m512 c0 = _mm512_loadu_ps(panel + (size_t)t * ncols);
        const __m512 c1 = _mm512_loadu_ps(panel + (size_t)t * ncols + 16);
        ROW2(0);
        ROW2(1);
        ROW2(2);
        ROW2(3);
        ROW2(4);
        ROW2(5);
        ROW2(6);
        ROW2(7);
    }
    STORE2(0);
    STORE2(1);
    STORE2(2);
    STORE2(3);
    STORE2(4);
    STORE2(5);
    STORE2(6);
    STORE2(7);
}

#define ROW1(P) a##P = _mm512_fmadd_ps(_mm512_set1_ps(x##P[t]), c0, a##P)

/* Eight points against 16 columns. */
static inline TARGET void dots_8x16(const float *const *xp, int32_t d, const float *panel,
                                    int32_t ncols, float *out, int32_t ldo)
{
    const float *x0 = xp[0], *x1 = xp[1], *x2 = xp[2], *x3 = xp[3];
    const float *x4 = xp[4], *x5 = xp[5], *x6 = xp[6], *x7 = xp[7];
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0;
    __m512 a7 = a0;
    for (int32_t t = 0; t < d; t++) {
        const __m512 c0 = _mm512_loadu_ps(panel + (size_t)t * ncols);
        ROW1(0);
        ROW1(1);
        ROW1(2);
        ROW1(3);
        ROW1(4);
        ROW1(5);
        ROW1(6);
        ROW1(7);
    }
    _mm512_storeu_ps(out, a0);
    _mm512_storeu_ps(out + (size_t)ldo, a1);
    _mm512_storeu_ps(out + (size_t)2 * ldo, a2);
    _mm512_storeu_ps(out + (size_t)3 * ldo, a3);
    _mm512_storeu_ps(out + (size_t)4 * ldo, a4);
    _mm512_storeu_ps(out + (size_t)5 * ldo, a5);
    _mm512_storeu_ps(out + (size_t)6 * ldo, a6);
    _mm512_storeu_ps(out + (size_t)7 * ldo, a7);
}

TARGET void kvq_km_panel_dots_avx512(const float *const *xp, int32_t np, int32_t d,
                                     const float *panel, int32_t ncols, float *out)
{
    const float *pp[8];
    float tmp[8 * 32];
    for (int p = 0; p < 8; p++)
        pp[p] = xp[p < np ? p : 0];
    int32_t c = 0;
    for (; c + 32 <= ncols; c += 32) {
        if (np == 8) {
            dots_8x32(pp, d, panel + c, ncols, out + c, ncols);
            continue;
        }
        dots_8x32(pp, d, panel + c, ncols, tmp, 32);
        for (int p = 0; p < np; p++)
            for (int q = 0; q < 32; q++)
                out[(size_t)p * ncols + c + q] = tmp[p * 32 + q];
    }
    if (c < ncols) { /* ncols is a multiple of 16: one 16-column tail */
        dots_8x16(pp, d, panel + c, ncols, tmp, 16);
        for (int p = 0; p < np; p++)
            for (int q = 0; q < 16; q++)
                out[(size_t)p * ncols + c + q] = tmp[p * 16 + q];
    }
}

/* Eight independent chains at a time (scalar fused multiply-adds: the chains hide each
 * other's latency). */
TARGET void kvq_km_pair_dots_avx512(const float *x, int64_t m, int32_t d, const float *cent,
                                    const int32_t *a, float *out)
{
    int64_t i = 0;
    for (; i + 8 <= m; i += 8) {
#define PAIR_ROWS(Q) const float *x##Q = x + (size_t)(i + Q) * d, *c##Q = cent + (size_t)a[i + Q] * d
        PAIR_ROWS(0);
        PAIR_ROWS(1);
        PAIR_ROWS(2);
        PAIR_ROWS(3);
        PAIR_ROWS(4);
        PAIR_ROWS(5);
        PAIR_ROWS(6);
        PAIR_ROWS(7);
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, s4 = 0.0f, s5 = 0.0f, s6 = 0.0f;
        float s7 = 0.0f;
        for (int32_t t = 0; t < d; t++) {
            s0 = fmaf(x0[t], c0[t], s0);
            s1 = fmaf(x1[t], c1[t], s1);
            s2 = fmaf(x2[t], c2[t], s2);
            s3 = fmaf(x3[t], c3[t], s3);
            s4 = fmaf(x4[t], c4[t], s4);
            s5 = fmaf(x5[t], c5[t], s5);
            s6 = fmaf(x6[t], c6[t], s6);
            s7 = fmaf(x7[t], c7[t], s7);
        }
        out[i] = s0;
        out[i + 1] = s1;
        out[i + 2] = s2;
        out[i + 3] = s3;
        out[i + 4] = s4;
        out[i + 5] = s5;
        out[i + 6] = s6;
        out[i + 7] = s7;
    }
    for (; i < m; i++) {
        const float *xr = x + (size_t)i * d, *cr = cent + (size_t)a[i] * d;
        float s = 0.0f;
        for (int32_t t = 0; t < d; t++)
            s = fmaf(xr[t], cr[t], s);
        out[i] = s;
    }
}
/* Smallest of gs distances kvq_km_dist_from_dot(xn, cn[u], o[u]): per lane the two
 * smallest and the first position of the smallest, then across lanes. */
TARGET void kvq_km_group_min_avx512(const float *o, const float *cn, float xn, int32_t gs,
                                    float *m1, int32_t *pos, float *m2)
{
    const __m512 vxn = _mm512_set1_ps(xn), two = _mm512_set1_ps(2.0f);
    const __m512 zero = _mm512_setzero_ps(), inf = _mm512_set1_ps(INFINITY);
    const __m512i sixteen = _mm512_set1_epi32(16);
    __m512 b1 = inf, b2 = inf;
    __m512i bi = _mm512_set1_epi32(INT32_MAX);
    __m512i jv = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int32_t c = 0; c < gs; c += 16) {
        const __mmask16 live =
            gs - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (gs - c)) - 1u);
        const __m512 t = _mm512_add_ps(vxn, _mm512_maskz_loadu_ps(live, cn + c));
        const __m512 u = _mm512_mul_ps(two, _mm512_maskz_loadu_ps(live, o + c));
        const __m512 v = _mm512_mask_blend_ps(live, inf, _mm512_max_ps(_mm512_sub_ps(t, u), zero));
        const __mmask16 lt = _mm512_cmp_ps_mask(v, b1, _CMP_LT_OQ);
        b2 = _mm512_min_ps(b2, _mm512_max_ps(v, b1));
        b1 = _mm512_mask_mov_ps(b1, lt, v);
        bi = _mm512_mask_mov_epi32(bi, lt, jv);
        jv = _mm512_add_epi32(jv, sixteen);
    }
    const float best = _mm512_reduce_min_ps(b1);
    const __mmask16 at = _mm512_cmp_ps_mask(b1, _mm512_set1_ps(best), _CMP_EQ_OQ);
    const int32_t p = _mm512_mask_reduce_min_epi32(at, bi);
    const __mmask16 win = _mm512_mask_cmpeq_epi32_mask(at, bi, _mm512_set1_epi32(p));
    const float other = _mm512_reduce_min_ps(_mm512_mask_blend_ps(win, b1, inf));
    const float second = _mm512_reduce_min_ps(b2);
    *m1 = best;
    *pos = p;
    *m2 = other < second ? other : second;
}

/* kvq_km_plan_row_ref, 16 groups a step: the same operations per lane, and the examined
 * groups appended in ascending order from the mask's set bits. */
TARGET void kvq_km_plan_row_avx512(float *lb, const float *mv, int32_t T, float thr, float *mk,
                                   uint16_t *list, int32_t ldl, int32_t *cnt, uint16_t p)
{
    const __m512 keep = _mm512_set1_ps(1.0f - 1.0f / 1048576.0f), zero = _mm512_setzero_ps();
    const __m512 vthr = _mm512_set1_ps(thr), neg = _mm512_set1_ps(-1.0f);
    const __m512 inf = _mm512_set1_ps(INFINITY);
    for (int32_t g0 = 0; g0 < T; g0 += 16) {
        const __mmask16 live = T - g0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (T - g0)) - 1u);
        const __m512 v0 = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, lb + g0),
                                                      _mm512_maskz_loadu_ps(live, mv + g0)),
                                        keep);
        /* v0 > 0 ? v0 : 0, as the reference (NaN gives 0) */
        const __m512 v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v0, zero, _CMP_GT_OQ), v0);
        _mm512_mask_storeu_ps(lb + g0, live, v);
        const __mmask16 skip =
            _mm512_cmp_ps_mask(_mm512_mul_ps(_mm512_mul_ps(v, v), keep), vthr, _CMP_GT_OQ);
        _mm512_mask_storeu_ps(mk + g0, live, _mm512_mask_mov_ps(inf, skip, neg));
        for (unsigned m = (unsigned)(live & ~skip); m; m &= m - 1) {
            const int32_t g = g0 + __builtin_ctz(m);
            list[(size_t)g * ldl + cnt[g]++] = p;
        }
    }
}

#endif
