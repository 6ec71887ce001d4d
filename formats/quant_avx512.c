/*
 * quant_avx512.c — AVX-512 (F, BW, VL) kernels of kvq/quant.h: Q8_0 dequantization
 * (equal bit for bit to kvq_dequant_q8_0_ref), the 16-lane f32 dot product of the
 * fused matrix-vector product, and fused dequantize-and-dot tiles for Q4_1 and Q8_0.
 * The other block types use their AVX2 kernels on AVX-512 machines.
 */
#include "formats/quant_simd.h"

#if KVQ_HAVE_X86_SIMD
#include <immintrin.h>
#include <string.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

/* Q8_0, 34-byte blocks: two 16-lane halves per block, value = d * q. */
TARGET void kvq_dequant_q8_0_avx512(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 32; b++, p += 34, out += 32) {
        uint16_t d16;
        memcpy(&d16, p, 2);
        const __m512 d = _mm512_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(d16))));
        const __m128i lo = _mm_loadu_si128((const __m128i *)(p + 2));
        const __m128i hi = _mm_loadu_si128((const __m128i *)(p + 18));
        _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), d));
        _mm512_storeu_ps(out + 16,
                         _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), d));
    }
}

/* Fused tile products for decode: dot(dequantize(blocks), x) over n values (a multiple
 * of 32), without the buffer. Equal bit for bit to dequantizing with the fast kernel
 * and then kvq_dot_f32_avx512: the same values (d * q, d * q + m; mul then add), the
 * same FMAs into the same two accumulators (values [0, 16) of each 32 into acc0,
 * [16, 32) into acc1), the same final reduction. */
static inline TARGET float f16_to_f32_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

/* Per block: d and m converted by one vcvtph2ps (they are adjacent), and the 16 bytes of
 * nibbles widened to dwords once, the low nibble masked and the high one shifted out
 * there: 1.2x over converting d and m apart and widening the two nibble vectors
 * (bench_qdot --rows 1536: 30-31 -> 25-26 ns a 576-value row on Zen 5;
 * docs/BENCHMARKS.md "Fused tiles on AVX2"). */
TARGET float kvq_qdot_q4_1_avx512(const void *blocks, const float *x, size_t n)
{
    const uint8_t *p = blocks;
    const __m512i low4 = _mm512_set1_epi32(0xF);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (size_t b = 0; b < n / 32; b++, p += 20, x += 32) {
        uint32_t dm;
        memcpy(&dm, p, 4);
        const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm)); /* d, m, 0, 0 */
        const __m512 d = _mm512_broadcastss_ps(f), m = _mm512_broadcastss_ps(_mm_movehdup_ps(f));
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 4)));
        const __m512 wlo = _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(v, low4))), m);
        const __m512 whi = _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4))), m);
        acc0 = _mm512_fmadd_ps(wlo, _mm512_loadu_ps(x), acc0);
        acc1 = _mm512_fmadd_ps(whi, _mm512_loadu_ps(x + 16), acc1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

TARGET float kvq_qdot_q8_0_avx512(const void *blocks, const float *x, size_t n)
{
    const uint8_t *p = blocks;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (size_t b = 0; b < n / 32; b++, p += 34, x += 32) {
        const __m512 d = _mm512_set1_ps(f16_to_f32_at(p));
        const __m128i lo = _mm_loadu_si128((const __m128i *)(p + 2));
        const __m128i hi = _mm_loadu_si128((const __m128i *)(p + 18));
        const __m512 wlo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), d);
        const __m512 whi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), d);
        acc0 = _mm512_fmadd_ps(wlo, _mm512_loadu_ps(x), acc0);
        acc1 = _mm512_fmadd_ps(whi, _mm512_loadu_ps(x + 16), acc1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/* Two 16-lane FMA accumulators, a masked tail, one reduction. */
TARGET float kvq_dot_f32_avx512(const float *a, const float *b, size_t n)
{
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i),
                               acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

#endif
