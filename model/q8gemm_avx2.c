/* q8gemm_avx2.c — the prefill GEMM's AVX2 kernel (q8gemm.h): each 16-row tile as two
 * halves of 8 rows in the lanes, four tokens at once. Q4_1: the eight groups' vpmaddubsw
 * pairs summed in int16 (|sum| <= 8 * 2 * 15 * 127 = 30,480, no saturation), one
 * vpmaddwd to int32; Q8_0: v = byte ^ 0x80 as |v| times q with v's sign (pairs <=
 * 2 * 128 * 127), vpmaddwd per group. Then the specification's scale FMAs: the same
 * bits as kvq_q8gemm_ref. Called only where kvq_q8dot_level() >= 1. */
#include "model/q8gemm.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <string.h>

#include "kvq/gguf.h"

#define TARGET __attribute__((target("avx2,fma")))
#define INLINE static inline __attribute__((always_inline)) TARGET

static inline int32_t i32_at(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The eight rows' integer block sums of one token (the block's eight groups at wb). */
INLINE __m256i block_sums(int q41, const uint8_t *wb, const int8_t *q)
{
    const __m256i ones = _mm256_set1_epi16(1);
    if (q41) {
        __m256i p = _mm256_setzero_si256();
        #pragma GCC unroll 8
        for (int g = 0; g < 8; g++)
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(
                                        _mm256_load_si256((const __m256i *)(wb + g * 64)),
                                        _mm256_set1_epi32(i32_at(q + 4 * g))));
        return _mm256_madd_epi16(p, ones);
    }
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    __m256i l = _mm256_setzero_si256();
    #pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        const __m256i v = _mm256_xor_si256(_mm256_load_si256((const __m256i *)(wb + g * 64)), bias);
        const __m256i y = _mm256_sign_epi8(_mm256_set1_epi32(i32_at(q + 4 * g)), v);
        l = _mm256_add_epi32(l, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v), y), ones));
    }
    return l;
}

/* NT tokens (1..4), rows h * 8 .. h * 8 + 7 of the tile (nr8 of them stored). */
INLINE void tokens(int q41, const uint8_t *w, const float *dm, size_t nb, const kvq_q8row *a,
                   int NT, float *y, int64_t ldy, int nr8, float beta)
{
    __m256 acc[4], macc[4];
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++)
        acc[t] = macc[t] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; b++) {
        const __m256 dw = _mm256_loadu_ps(dm + b * 32);
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const __m256i l = block_sums(q41, w + b * 512, a[t].q + b * 32);
            const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(a[t].ds[2 * b]));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), sc, acc[t]);
            if (q41)
                macc[t] = _mm256_fmadd_ps(_mm256_loadu_ps(dm + b * 32 + 16),
                                          _mm256_set1_ps(a[t].ds[2 * b + 1]), macc[t]);
        }
    }
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        float v[8];
        _mm256_storeu_ps(v, q41 ? _mm256_add_ps(acc[t], macc[t]) : acc[t]);
        float *yt = y + t * ldy;
        for (int r = 0; r < nr8; r++)
            yt[r] = beta != 0.0f ? yt[r] + v[r] : v[r];
    }
}

INLINE void run(int q41, const void *tile, size_t nb, const kvq_q8row *a, int64_t n, float *y,
                int64_t ldy, int nr, float beta)
{
    const uint8_t *w = tile;
    const float *dm = (const float *)(const void *)(w + nb * 512);
    for (int h = 0; h < 2 && h * 8 < nr; h++) {
        const int nr8 = nr - h * 8 < 8 ? nr - h * 8 : 8;
        int64_t t = 0;
        for (; t + 4 <= n; t += 4)
            tokens(q41, w + h * 32, dm + h * 8, nb, a + t, 4, y + t * ldy + h * 8, ldy, nr8, beta);
        for (; t < n; t++)
            tokens(q41, w + h * 32, dm + h * 8, nb, a + t, 1, y + t * ldy + h * 8, ldy, nr8, beta);
    }
}

TARGET void kvq_q8gemm_avx2(uint32_t type, const void *tile, size_t nb, const kvq_q8row *a,
                            int64_t n, float *y, int64_t ldy, int nr, float beta)
{
    if (type == KVQ_GGML_Q4_1)
        run(1, tile, nb, a, n, y, ldy, nr, beta);
    else
        run(0, tile, nb, a, n, y, ldy, nr, beta);
}
#endif
