/*
 * half_avx2.c — AVX2 + F16C kernels for f16/bf16 conversion (the Q8_0 kernel is in
 * quant_avx2.c).
 *
 * Each function equals its scalar reference bit for bit (see half.c for the NaN
 * rules): f16 goes through F16C's vcvtps2ph / vcvtph2ps with the rounding mode given
 * as an immediate (nearest even, whatever MXCSR says); bf16 uses integer arithmetic.
 * Tails shorter than one vector use the scalar reference.
 */
#include "formats/half_simd.h"

#if KVQ_HAVE_X86_SIMD
#include <immintrin.h>
#include <string.h>

#include "kvq/half.h"

#define TARGET __attribute__((target("avx2,fma,f16c")))

TARGET void kvq_f32_to_f16_avx2(const float *in, uint16_t *out, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m128i a = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
        const __m128i b =
            _mm256_cvtps_ph(_mm256_loadu_ps(in + i + 8), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(out + i), a);
        _mm_storeu_si128((__m128i *)(out + i + 8), b);
    }
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        out[i] = kvq_f32_to_f16_ref(in[i]);
}

TARGET void kvq_f16_to_f32_avx2(const uint16_t *in, float *out, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m128i a = _mm_loadu_si128((const __m128i *)(in + i));
        const __m128i b = _mm_loadu_si128((const __m128i *)(in + i + 8));
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(a));
        _mm256_storeu_ps(out + i + 8, _mm256_cvtph_ps(b));
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i))));
    for (; i < n; i++)
        out[i] = kvq_f16_to_f32_ref(in[i]);
}

/* 8 f32 bit patterns -> 8 bf16 patterns in the low 16 bits of each 32-bit lane. */
TARGET static inline __m256i bf16_round8(__m256i b)
{
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), one);
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)),
                          16);
    const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
    const __m256i is_nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

TARGET void kvq_f32_to_bf16_avx2(const float *in, uint16_t *out, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i r = bf16_round8(_mm256_loadu_si256((const __m256i *)(in + i)));
        /* values fit 16 bits, so unsigned saturation is exact */
        const __m128i packed =
            _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
        _mm_storeu_si128((__m128i *)(out + i), packed);
    }
    for (; i < n; i++)
        out[i] = kvq_f32_to_bf16_ref(in[i]);
}

TARGET void kvq_bf16_to_f32_avx2(const uint16_t *in, float *out, size_t n)
{
    const __m256i mask = _mm256_set1_epi32(0x7fffffff);
    const __m256i inf = _mm256_set1_epi32(0x7f800000);
    const __m256i qbit = _mm256_set1_epi32(0x00400000);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(in + i));
        const __m256i b = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
        const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, mask), inf);
        const __m256i r = _mm256_or_si256(b, _mm256_and_si256(is_nan, qbit));
        _mm256_storeu_si256((__m256i *)(out + i), r);
    }
    for (; i < n; i++)
        out[i] = kvq_bf16_to_f32_ref(in[i]);
}

#endif
