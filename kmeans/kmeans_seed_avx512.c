/*
 * kmeans_seed_avx512.c — the seeding's candidate pass with a bf16 filter (AVX-512 BF16).
 *
 * The candidate pass of (greedy) k-means++ (kvq_km_cand_eval_ref) needs, per point i and
 * candidate c, min(s(i, c), D_i): s exactly only where the candidate can lower D_i. This
 * pass first computes every distance from a bf16 copy of the points, centred on a fixed
 * vector mu (vdpbf16ps: two dims per instruction, half the bytes), and proves for most
 * lanes that s(i, c) > D_i, without the f32 chain. Only the tiles with a lane it cannot
 * prove run the exact f32 tile (the same fused chain as kvq_km_cand_eval_avx512). A
 * proved lane adds w_i D_i to its potential, which is what min(s, D_i) gives, at the
 * same place in the same double sum; its dist is +inf instead of s, and every consumer
 * of dist takes min(dist, D_i), which is D_i either way. So the seeds, D and the block
 * sums are the same bits as the plain pass, for any thread count.
 *
 * The proof, per lane (y = x_i - mu, z = c - mu as reals, so y - z = x_i - c):
 *   xb, cb      bf16 of fl(x - mu): |xb - y| <= EPS_B |y| elementwise (RNE to 8 bits of
 *               an f32 within 2^-24 of y; values under 2^-100 are flushed to 0, covered
 *               by the absolute slack), so ||xb - y|| <= EPS_B ||y|| + slack
 *   sb          (bn_i + bnc) - 2 xb.cb in f32 with bf16 products: within
 *               KAPPA (bn_i + bnc) of ||xb - cb||^2 (4x the (d + 4) 2^-24 of the sums)
 *   a           sqrt(max(sb - KAPPA (bn_i + bnc), 0)) <= ||xb - cb|| (up to 2 ulps)
 *   proved when a > (1 + 2^-16) (yr_i + zr + sqrt(D_i + eta (xn_i + cn)) + slack),
 *               yr = EPS_B ||y|| rounded up: then ||x_i - c||^2 > D_i + eta (xn_i + cn)
 *               and the computed s >= ||x_i - c||^2 - eta (xn_i + cn) > D_i (eta: the
 *               rounding bound of the expanded form, kmeans_bounds.c).
 * NaN or +inf anywhere makes the comparison false: the lane is computed exactly.
 * Built with the AVX-512 flags: call anything here only when kvq_km_seed_bf16_ok()
 * (kmeans_seed.c, built for any x86-64).
 */
#include "kmeans/kmeans_internal.h"

#include <math.h>
#include <string.h>

#define EPS_B (0.00390625f + 1.2e-7f) /* 2^-8 + 2^-23, rounded up */
#define FLUSH 7.9e-31f /* 2^-100: smaller |values| become 0 in the bf16 copy */

/* bf16 of v by round to nearest even; |v| < FLUSH gives 0. v finite or not: an inf or
 * NaN stays one, and the lanes that meet it are computed exactly. */
static uint16_t to_bf16(float v)
{
    if (fabsf(v) < FLUSH)
        return 0;
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) /* inf or NaN: keep it one */
        return (uint16_t)((u >> 16) | ((u & 0xffffu) ? 0x40u : 0u));
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static double bf16_val(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return (double)f;
}

void kvq_km_seed_bf16_row(const float *x, const float *mu, int32_t d, uint16_t *out,
                          int64_t stride, float *bn, float *yr)
{
    double b2 = 0.0, y2 = 0.0;
    for (int32_t j = 0; j < d; j++) {
        const uint16_t h = to_bf16(x[j] - mu[j]);
        out[(size_t)(j / 2) * (size_t)stride + (j & 1)] = h;
        const double v = bf16_val(h), y = (double)x[j] - (double)mu[j];
        b2 += v * v;
        y2 += y * y;
    }
    if (d & 1)
        out[(size_t)(d / 2) * (size_t)stride + 1] = 0;
    *bn = (float)b2;
    /* EPS_B ||y||, rounded up past the double sums' and the casts' rounding */
    *yr = nextafterf((float)(sqrt(y2) * (1.0 + 1e-9) * (double)EPS_B), INFINITY);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#define CL KVQ_KM_CAND_LANES
#define SLACK 1e-20f

/* A tile's 16 lanes from P consecutive per-point dwords at a: lane l gets a[l % P]. */
static inline TARGET __attribute__((always_inline)) __m512i tile16i(const uint32_t *a, int P)
{
    switch (P) {
    case 1:
        return _mm512_set1_epi32((int)a[0]);
    case 2: {
        long long v;
        memcpy(&v, a, sizeof v);
        return _mm512_set1_epi64(v);
    }
    case 4:
        return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)a));
    case 8:
        return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)a));
    default:
        return _mm512_loadu_si512(a);
    }
}

static inline TARGET __attribute__((always_inline)) __m512 tile16f(const float *a, int P)
{
    return _mm512_castsi512_ps(tile16i((const uint32_t *)a, P));
}

/* The lanes of one tile the filter cannot prove (see the top of the file). */
static inline TARGET __attribute__((always_inline)) __mmask16
tile_unproved(__m512 dotb, const kvq_km_cand_bf16 *f, int64_t i0, const float *xn,
              const float *dmin, __m512 vcn, int P)
{
    const __m512 bsum = _mm512_add_ps(tile16f(f->bn + i0, P), _mm512_loadu_ps(f->bnc));
    const __m512 sb = _mm512_fnmadd_ps(_mm512_set1_ps(2.0f), dotb, bsum);
    const __m512 lo = _mm512_fnmadd_ps(_mm512_set1_ps(f->kappa), bsum, sb);
    const __m512 a = _mm512_sqrt_ps(_mm512_max_ps(lo, _mm512_setzero_ps()));
    const __m512 e = _mm512_mul_ps(_mm512_set1_ps(f->eta), _mm512_add_ps(tile16f(xn + i0, P), vcn));
    const __m512 r = _mm512_sqrt_ps(_mm512_add_ps(tile16f(dmin + i0, P), e));
    __m512 rhs = _mm512_add_ps(_mm512_add_ps(tile16f(f->yr + i0, P), _mm512_loadu_ps(f->zr)), r);
    rhs = _mm512_mul_ps(_mm512_add_ps(rhs, _mm512_set1_ps(SLACK)), _mm512_set1_ps(1.0f + 1.0f / 65536));
    const __mmask16 proved = _mm512_cmp_ps_mask(a, rhs, _CMP_GT_OQ);
    return (__mmask16)(~proved & f->live);
}

/* pot += w * m per lane, in double, as kvq_km_cand_eval_avx512's tile finish. */
static inline TARGET __attribute__((always_inline)) void
pot_add(__m512 m, __m512 wv, __m512d *p0, __m512d *p1)
{
    const __m256 mlo = _mm512_castps512_ps256(m), wlo = _mm512_castps512_ps256(wv);
    const __m256 mhi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(m), 1));
    const __m256 whi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(wv), 1));
    *p0 = _mm512_add_pd(*p0, _mm512_mul_pd(_mm512_cvtps_pd(wlo), _mm512_cvtps_pd(mlo)));
    *p1 = _mm512_add_pd(*p1, _mm512_mul_pd(_mm512_cvtps_pd(whi), _mm512_cvtps_pd(mhi)));
}

/* The exact dots of NT tiles (indices tq) of the group at xg: one fused chain per lane. */
static inline TARGET __attribute__((always_inline)) void
exact_tiles(const float *xg, const int *tq, int NT, int32_t d, int P, const float *ct,
            __m512 *out)
{
    __m512 acc[8];
#pragma GCC unroll 8
    for (int q = 0; q < NT; q++)
        acc[q] = _mm512_setzero_ps();
    for (int32_t j = 0; j < d; j++) {
        const __m512 c = _mm512_loadu_ps(ct + (size_t)j * CL);
#pragma GCC unroll 8
        for (int q = 0; q < NT; q++)
            acc[q] = _mm512_fmadd_ps(tile16f(xg + ((size_t)tq[q] * d + j) * P, P), c, acc[q]);
    }
#pragma GCC unroll 8
    for (int q = 0; q < NT; q++)
        out[q] = acc[q];
}

static inline TARGET __attribute__((always_inline)) void
exact_some(const float *xg, const int *tq, int nt, int32_t d, int P, const float *ct,
           __m512 *out)
{
    switch (nt) {
    case 1: exact_tiles(xg, tq, 1, d, P, ct, out); break;
    case 2: exact_tiles(xg, tq, 2, d, P, ct, out); break;
    case 3: exact_tiles(xg, tq, 3, d, P, ct, out); break;
    case 4: exact_tiles(xg, tq, 4, d, P, ct, out); break;
    case 5: exact_tiles(xg, tq, 5, d, P, ct, out); break;
    case 6: exact_tiles(xg, tq, 6, d, P, ct, out); break;
    case 7: exact_tiles(xg, tq, 7, d, P, ct, out); break;
    default: exact_tiles(xg, tq, 8, d, P, ct, out); break;
    }
}

/* G (<= 8) tiles from g: the bf16 dots, the lanes to compute exactly, then the finish in
 * tile order. Returns the tiles computed exactly. */
static inline TARGET __attribute__((always_inline)) int
group_tiles(const float *xi, const float *xn, const float *w, const float *dmin, int64_t g,
            int G, int32_t d, int P, const float *ct, __m512 vcn, const kvq_km_cand_bf16 *f,
            float *dist, __m512d *p0, __m512d *p1)
{
    const int32_t dh = (f->dp) / 2;
    const uint32_t *xb = (const uint32_t *)f->xb + (size_t)g * dh * P;
    const uint32_t *cb = (const uint32_t *)f->cb;
    __m512 acc[8];
#pragma GCC unroll 8
    for (int q = 0; q < 8; q++)
        acc[q] = _mm512_setzero_ps();
    for (int32_t j = 0; j < dh; j++) {
        const __m512bh c = (__m512bh)_mm512_loadu_si512(cb + (size_t)j * CL);
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++)
            if (q < G)
                acc[q] = _mm512_dpbf16_ps(acc[q], (__m512bh)tile16i(xb + ((size_t)q * dh + j) * P, P), c);
    }
    int tq[8], nt = 0;
    __mmask16 need[8];
    for (int q = 0; q < G; q++) {
        need[q] = tile_unproved(acc[q], f, (g + q) * P, xn, dmin, vcn, P);
        if (need[q])
            tq[nt++] = q;
    }
    __m512 ex[8];
    if (nt)
        exact_some(xi + (size_t)g * d * P, tq, nt, d, P, ct, ex);
    const __m512 two = _mm512_set1_ps(2.0f), inf = _mm512_set1_ps(INFINITY);
    for (int q = 0, e = 0; q < G; q++) {
        const int64_t i0 = (g + q) * P;
        const __m512 dm = tile16f(dmin + i0, P);
        __m512 m;
        if (need[q]) {
            const __m512 v = _mm512_max_ps(
                _mm512_sub_ps(_mm512_add_ps(tile16f(xn + i0, P), vcn), _mm512_mul_ps(two, ex[e++])),
                _mm512_setzero_ps());
            _mm512_storeu_ps(dist + (size_t)(g + q) * CL, v);
            m = _mm512_min_ps(v, dm);
        } else {
            _mm512_storeu_ps(dist + (size_t)(g + q) * CL, inf);
            m = dm; /* min(s, D) = D on every proved lane */
        }
        pot_add(m, tile16f(w + i0, P), p0, p1);
    }
    return nt;
}

static inline TARGET __attribute__((always_inline)) int64_t
cand_bf16_P(const float *xi, const float *xn, const float *w, const float *dmin, int64_t ntiles,
            int32_t d, const int P, const float *ct, const float *cn, const kvq_km_cand_bf16 *f,
            float *dist, double *pot)
{
    __m512d p0 = _mm512_loadu_pd(pot), p1 = _mm512_loadu_pd(pot + 8);
    const __m512 vcn = _mm512_loadu_ps(cn);
    int64_t exact = 0;
    int64_t g = 0;
    for (; g + 8 <= ntiles; g += 8) /* G constant: the dot loop without branches */
        exact += group_tiles(xi, xn, w, dmin, g, 8, d, P, ct, vcn, f, dist, &p0, &p1);
    if (g < ntiles)
        exact += group_tiles(xi, xn, w, dmin, g, (int)(ntiles - g), d, P, ct, vcn, f, dist,
                             &p0, &p1);
    _mm512_storeu_pd(pot, p0);
    _mm512_storeu_pd(pot + 8, p1);
    return exact;
}

TARGET int64_t kvq_km_cand_eval_bf16_avx512(const float *xi, const float *xn, const float *w,
                                            const float *dmin, int64_t ntiles, int32_t d,
                                            int32_t P, const float *ct, const float *cn,
                                            const kvq_km_cand_bf16 *f, float *dist, double *pot)
{
    switch (P) {
    case 1:
        return cand_bf16_P(xi, xn, w, dmin, ntiles, d, 1, ct, cn, f, dist, pot);
    case 2:
        return cand_bf16_P(xi, xn, w, dmin, ntiles, d, 2, ct, cn, f, dist, pot);
    case 4:
        return cand_bf16_P(xi, xn, w, dmin, ntiles, d, 4, ct, cn, f, dist, pot);
    case 8:
        return cand_bf16_P(xi, xn, w, dmin, ntiles, d, 8, ct, cn, f, dist, pot);
    default:
        return cand_bf16_P(xi, xn, w, dmin, ntiles, d, 16, ct, cn, f, dist, pot);
    }
}

#endif
