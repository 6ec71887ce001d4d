/* q8gemm_avx512.c — the prefill GEMM's AVX-512 VNNI kernel (q8gemm.h): 16 weight rows in
 * the lanes, four tokens at once; per block and token eight vpdpbusd (two chains of four)
 * with the token's four activation bytes broadcast, the block's integer sums converted
 * and scaled by d_w * d in one FMA: the same bits as kvq_q8gemm_ref. Called only where
 * kvq_q8dot_level() is 2. */
#include "model/q8gemm.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <string.h>

#include "kvq/gguf.h"

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")))
#define INLINE static inline __attribute__((always_inline)) TARGET

static inline int32_t i32_at(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* NT tokens (1..4) of a[0..NT) against the tile, stored in y rows t * ldy. */
INLINE void tokens(int q41, const uint8_t *w, const float *dm, size_t nb, const kvq_q8row *a,
                   int NT, float *y, int64_t ldy, __mmask16 mask, float beta)
{
    __m512 acc[4], macc[4];
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++)
        acc[t] = macc[t] = _mm512_setzero_ps();
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * 512;
        __m512i wv[8];
        #pragma GCC unroll 8
        for (int g = 0; g < 8; g++)
            wv[g] = _mm512_load_si512((const void *)(wb + g * 64));
        const __m512 dw = _mm512_load_ps(dm + b * 32);
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const int8_t *q = a[t].q + b * 32;
            __m512i l0 = _mm512_setzero_si512(), l1 = _mm512_setzero_si512();
            #pragma GCC unroll 8
            for (int g = 0; g < 8; g += 2) {
                l0 = _mm512_dpbusd_epi32(l0, wv[g], _mm512_set1_epi32(i32_at(q + 4 * g)));
                l1 = _mm512_dpbusd_epi32(l1, wv[g + 1], _mm512_set1_epi32(i32_at(q + 4 * g + 4)));
            }
            __m512i l = _mm512_add_epi32(l0, l1);
            if (!q41)
                l = _mm512_sub_epi32(l, _mm512_set1_epi32(a[t].c32[b]));
            const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(a[t].ds[2 * b]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(l), sc, acc[t]);
            if (q41)
                macc[t] = _mm512_fmadd_ps(_mm512_load_ps(dm + b * 32 + 16),
                                          _mm512_set1_ps(a[t].ds[2 * b + 1]), macc[t]);
        }
    }
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        __m512 v = q41 ? _mm512_add_ps(acc[t], macc[t]) : acc[t];
        float *yt = y + t * ldy;
        if (beta != 0.0f)
            v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, yt), v);
        _mm512_mask_storeu_ps(yt, mask, v);
    }
}

INLINE void run(int q41, const void *tile, size_t nb, const kvq_q8row *a, int64_t n, float *y,
                int64_t ldy, int nr, float beta)
{
    const uint8_t *w = tile;
    const float *dm = (const float *)(const void *)(w + nb * 512);
    const __mmask16 mask = (__mmask16)((1u << nr) - 1);
    int64_t t = 0;
    for (; t + 4 <= n; t += 4)
        tokens(q41, w, dm, nb, a + t, 4, y + t * ldy, ldy, mask, beta);
    for (; t < n; t++)
        tokens(q41, w, dm, nb, a + t, 1, y + t * ldy, ldy, mask, beta);
}

TARGET void kvq_q8gemm_avx512(uint32_t type, const void *tile, size_t nb, const kvq_q8row *a,
                              int64_t n, float *y, int64_t ldy, int nr, float beta)
{
    if (type == KVQ_GGML_Q4_1)
        run(1, tile, nb, a, n, y, ldy, nr, beta);
    else
        run(0, tile, nb, a, n, y, ldy, nr, beta);
}
#endif
