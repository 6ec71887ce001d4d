/*
 * quant_avx512.c — AVX-512 (F, BW, VL) kernels of kvq/quant.h: Q8_0 dequantization
 * (equal bit for bit to kvq_dequant_q8_0_ref), the 16-lane f32 dot product of the
 * fused matrix-vector product, and fused dequantize-and-dot tiles for Q4_1, Q8_0, Q4_K
 * and Q6_K. The other block types use their AVX2 kernels on AVX-512 machines.
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
 * docs/BENCHMARKS.md "Fused tiles on AVX2 and for Q4_K / Q6_K"). */
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
        const __m512 wlo =
            _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(v, low4))), m);
        const __m512 whi =
            _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4))), m);
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

/* Q4_K (144-byte blocks of 256, formats/quant_k.c): sub-block j of 32 values is
 * (d sc_j) q - dmin mn_j (mul then sub), its first 16 values into acc0 and the rest into
 * acc1, j in order: the dot kernel's order over the dequantized block. */
TARGET float kvq_qdot_q4_k_avx512(const void *blocks, const float *x, size_t n)
{
    const uint8_t *p = blocks;
    const __m512i low4 = _mm512_set1_epi32(0xF);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (size_t b = 0; b < n / 256; b++, p += 144) {
        uint32_t dm;
        memcpy(&dm, p, 4);
        const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm)); /* d, dmin, 0, 0 */
        const float d = _mm_cvtss_f32(f), dmin = _mm_cvtss_f32(_mm_movehdup_ps(f));
        for (int c = 0; c < 4; c++, x += 64) {
            const uint8_t *q = p + 16 + 32 * c;
            const __m512i v0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q)),
                          v1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)));
            for (int k = 0; k < 2; k++) {
                uint8_t sc, mn;
                kvq_q4k_scale_min(p + 4, 2 * c + k, &sc, &mn);
                const __m512 dv = _mm512_set1_ps(d * (float)sc),
                             mv = _mm512_set1_ps(dmin * (float)mn);
                const __m512i q0 = k ? _mm512_srli_epi32(v0, 4) : _mm512_and_si512(v0, low4),
                              q1 = k ? _mm512_srli_epi32(v1, 4) : _mm512_and_si512(v1, low4);
                const __m512 w0 = _mm512_sub_ps(_mm512_mul_ps(dv, _mm512_cvtepi32_ps(q0)), mv),
                             w1 = _mm512_sub_ps(_mm512_mul_ps(dv, _mm512_cvtepi32_ps(q1)), mv);
                acc0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + 32 * k), acc0);
                acc1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 32 * k + 16), acc1);
            }
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/* Q6_K (210-byte blocks of 256): values 32 s .. 32 s + 31 of half h are
 * (d sc_j) ((low | high << 4) - 32), j = 8 h + 2 s for the first 16 (acc0) and j + 1 for
 * the rest (acc1), in order; the 32 codes assembled in bytes as quant_avx2.c's
 * q6_k_codes32 does (its inline helpers are not shared across the two files' targets),
 * then widened 16 at a time. */
static inline TARGET __m256i shr_and8(__m256i v, int shift, int mask)
{
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)),
                            _mm256_set1_epi8((char)mask));
}

TARGET float kvq_qdot_q6_k_avx512(const void *blocks, const float *x, size_t n)
{
    const uint8_t *p = blocks;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (size_t b = 0; b < n / 256; b++, p += 210) {
        const int8_t *sc = (const int8_t *)(p + 192);
        uint16_t h16;
        memcpy(&h16, p + 208, 2);
        const float d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h16)));
        for (int h = 0; h < 2; h++) {
            const __m256i ql[2] = {_mm256_loadu_si256((const __m256i *)(p + 64 * h)),
                                   _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32))};
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
            for (int s = 0; s < 4; s++, x += 32) {
                const __m256i q = _mm256_sub_epi8(
                    _mm256_or_si256(shr_and8(ql[s & 1], 4 * (s >> 1), 0xF),
                                    _mm256_slli_epi16(shr_and8(qh, 2 * s, 3), 4)),
                    _mm256_set1_epi8(32));
                const int j = 8 * h + 2 * s;
                const __m128i q0 = _mm256_castsi256_si128(q), q1 = _mm256_extracti128_si256(q, 1);
                const __m512 w0 = _mm512_mul_ps(_mm512_set1_ps(d * (float)sc[j]),
                                                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0))),
                             w1 = _mm512_mul_ps(_mm512_set1_ps(d * (float)sc[j + 1]),
                                                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)));
                acc0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x), acc0);
                acc1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 16), acc1);
            }
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

#endif
