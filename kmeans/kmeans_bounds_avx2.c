/*
 * kmeans_bounds_avx2.c — AVX2 versions of the kernels of the Lloyd iterations with
 * bounds (kmeans_bounds.c), eight lanes per register: each output is one fused
 * multiply-add chain over the dims in ascending order, so they equal the scalar
 * references bit for bit (test_kmeans_bounds checks it), as the AVX-512 ones do.
 *
 * Built with the AVX2 flags (Makefile: *_avx2.c); call only when kvq_cpu_has_avx2().
 */
#include "kmeans/kmeans_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <math.h>

#define TARGET __attribute__((target("avx2,fma")))

#define ROW2(P)                                                                            \
    do {                                                                                   \
        const __m256 xv = _mm256_set1_ps(x##P[t]);                                         \
        a##P##0 = _mm256_fmadd_ps(xv, c0, a##P##0);                                        \
        a##P##1 = _mm256_fmadd_ps(xv, c1, a##P##1);                                        \
    } while (0)
#define STORE2(P)                                                                          \
    do {                                                                                   \
        _mm256_storeu_ps(out + (size_t)(P) * ldo, a##P##0);                                \
        _mm256_storeu_ps(out + (size_t)(P) * ldo + 8, a##P##1);                            \
    } while (0)

/* Six points against 16 columns: 12 accumulators, two panel loads and six broadcasts per
 * dim (16 registers in all). */
static inline TARGET void dots_6x16(const float *const *xp, int32_t d, const float *panel,
                                    int32_t ncols, float *out, int32_t ldo)
{
    const float *x0 = xp[0], *x1 = xp[1], *x2 = xp[2], *x3 = xp[3], *x4 = xp[4], *x5 = xp[5];
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
    __m256 a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
    for (int32_t t = 0; t < d; t++) {
        const __m256 c0 = _mm256_loadu_ps(panel + (size_t)t * ncols);
        const __m256 c1 = _mm256_loadu_ps(panel + (size_t)t * ncols + 8);
        ROW2(0);
        ROW2(1);
        ROW2(2);
        ROW2(3);
        ROW2(4);
        ROW2(5);
    }
    STORE2(0);
    STORE2(1);
    STORE2(2);
    STORE2(3);
    STORE2(4);
    STORE2(5);
}

TARGET void kvq_km_panel_dots_avx2(const float *const *xp, int32_t np, int32_t d,
                                   const float *panel, int32_t ncols, float *out)
{
    float tmp[6 * 16];
    for (int32_t p0 = 0; p0 < np; p0 += 6) {
        const int32_t nq = np - p0 < 6 ? np - p0 : 6;
        const float *pp[6];
        for (int q = 0; q < 6; q++)
            pp[q] = xp[p0 + (q < nq ? q : 0)];
        for (int32_t c = 0; c < ncols; c += 16) { /* ncols is a multiple of 16 */
            if (nq == 6) {
                dots_6x16(pp, d, panel + c, ncols, out + (size_t)p0 * ncols + c, ncols);
                continue;
            }
            dots_6x16(pp, d, panel + c, ncols, tmp, 16);
            for (int32_t q = 0; q < nq; q++)
                for (int u = 0; u < 16; u++)
                    out[(size_t)(p0 + q) * ncols + c + u] = tmp[q * 16 + u];
        }
    }
}

TARGET void kvq_km_pair_dots_avx2(const float *x, int64_t m, int32_t d, const float *cent,
                                  const int32_t *a, float *out)
{
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
        const float *x0 = x + (size_t)i * d, *x1 = x0 + d, *x2 = x1 + d, *x3 = x2 + d;
        const float *c0 = cent + (size_t)a[i] * d, *c1 = cent + (size_t)a[i + 1] * d;
        const float *c2 = cent + (size_t)a[i + 2] * d, *c3 = cent + (size_t)a[i + 3] * d;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int32_t t = 0; t < d; t++) {
            s0 = fmaf(x0[t], c0[t], s0);
            s1 = fmaf(x1[t], c1[t], s1);
            s2 = fmaf(x2[t], c2[t], s2);
            s3 = fmaf(x3[t], c3[t], s3);
        }
        out[i] = s0;
        out[i + 1] = s1;
        out[i + 2] = s2;
        out[i + 3] = s3;
    }
    for (; i < m; i++) {
        const float *xr = x + (size_t)i * d, *cr = cent + (size_t)a[i] * d;
        float s = 0.0f;
        for (int32_t t = 0; t < d; t++)
            s = fmaf(xr[t], cr[t], s);
        out[i] = s;
    }
}
#endif
