/*
 * half_avx512.c — AVX-512 (F, BW, VL) kernels for f16/bf16 conversion (the Q8_0 kernel
 * is in quant_avx512.c).
 *
 * Same contract as half_avx2.c: bit-for-bit equal to the scalar references. Tails are
 * handled with masked loads and stores, so no scalar loop is needed. The bf16 paths
 * use integer arithmetic, not VCVTNEPS2BF16, because that instruction flushes
 * subnormal inputs to zero and would disagree with the reference.
 */
#include "formats/half_simd.h"

#if KVQ_HAVE_X86_SIMD
#include <immintrin.h>
#include <string.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

static inline TARGET __mmask16 tail_mask(size_t left)
{
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

TARGET void kvq_f32_to_f16_avx512(const float *in, uint16_t *out, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i a = _mm512_cvtps_ph(_mm512_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
        const __m256i b =
            _mm512_cvtps_ph(_mm512_loadu_ps(in + i + 16), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_si256((__m256i *)(out + i), a);
        _mm256_storeu_si256((__m256i *)(out + i + 16), b);
    }
    for (; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 x = _mm512_maskz_loadu_ps(m, in + i);
        _mm256_mask_storeu_epi16(out + i, m, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    }
}

TARGET void kvq_f16_to_f32_avx512(const uint16_t *in, float *out, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(in + i));
        const __m256i b = _mm256_loadu_si256((const __m256i *)(in + i + 16));
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(a));
        _mm512_storeu_ps(out + i + 16, _mm512_cvtph_ps(b));
    }
    for (; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m256i h = _mm256_maskz_loadu_epi16(m, in + i);
        _mm512_mask_storeu_ps(out + i, m, _mm512_cvtph_ps(h));
    }
}

/* 16 f32 bit patterns -> 16 bf16 patterns (round to nearest even, NaN quieted). */
static inline TARGET __m256i bf16_round16(__m512i b)
{
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, bias), 16);
    const __m512i mag = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7f800000));
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
    r = _mm512_mask_mov_epi32(r, is_nan, quiet);
    return _mm512_cvtepi32_epi16(r); /* truncating narrow: values already fit 16 bits */
}

TARGET void kvq_f32_to_bf16_avx512(const float *in, uint16_t *out, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) /* plain loads and stores: a masked one is slow on Zen 5 */
        _mm256_storeu_si256((__m256i *)(out + i), bf16_round16(_mm512_loadu_si512(in + i)));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm256_mask_storeu_epi16(out + i, m, bf16_round16(_mm512_maskz_loadu_epi32(m, in + i)));
    }
}

TARGET void kvq_bf16_to_f32_avx512(const uint16_t *in, float *out, size_t n)
{
    const __m512i mask = _mm512_set1_epi32(0x7fffffff);
    const __m512i inf = _mm512_set1_epi32(0x7f800000);
    const __m512i qbit = _mm512_set1_epi32(0x00400000);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i); /* plain where full: masked is slow on Zen 5 */
        const __m256i h = m == (__mmask16)0xffff ? _mm256_loadu_si256((const __m256i *)(in + i))
                                                 : _mm256_maskz_loadu_epi16(m, in + i);
        const __m512i b = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
        const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, mask), inf);
        const __m512i r = _mm512_mask_or_epi32(b, is_nan, b, qbit);
        if (m == (__mmask16)0xffff)
            _mm512_storeu_si512(out + i, r);
        else
            _mm512_mask_storeu_epi32(out + i, m, r);
    }
}

#endif
