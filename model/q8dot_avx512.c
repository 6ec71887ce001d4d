/* q8dot_avx512.c — AVX-512 VNNI kernels of the q8 activation path (q8dot.h): two
 * weight blocks per 512-bit vpdpbusd, sixteen int32 lane sums converted and scaled into
 * sixteen f32 lanes, the same bits as kvq_q8dot_ref. Called only where
 * kvq_q8dot_level() is 2 (AVX-512 F/BW/VL/DQ and VNNI). */
#include "model/q8dot.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <string.h>

#define TARGET \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

/* The reference's reduction: lanes i + (i + 8), + (i + 4), + (i + 2), then 0 + 1. */
static inline TARGET float hsum16(__m512 acc)
{
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

/* The 64 nibbles of two Q4_1 blocks at p, as bytes in the activations' order:
 * [lo | hi] of the first block in the low 256 bits, of the second in the high. */
static inline TARGET __m512i nibbles2(const uint8_t *p, __m512i low4)
{
    const __m256i qa = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + 4)));
    const __m256i qb = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + 24)));
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(qa), qb, 1);
    return _mm512_and_si512(_mm512_mask_blend_epi64(0xCC, v, _mm512_srli_epi16(v, 4)), low4);
}

/* Q4_1: [lo nibbles | hi nibbles] of each block in one 256-bit half, so the bytes
 * follow the activations' order; d, m of both blocks converted by one vcvtph2ps and
 * multiplied by (d, s) of the activations at once. */
TARGET float kvq_q8dot_q4_1_avx512(const uint8_t *row, const kvq_q8row *a, size_t nb)
{
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i lane02 = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 acc = _mm512_setzero_ps();
    __m128 macc = _mm_setzero_ps();
    const uint8_t *p = row;
    for (size_t b = 0; b < nb; b += 2, p += 40) {
        const __m512i v = nibbles2(p, low4);
        const __m512i y = _mm512_loadu_si512((const void *)(a->q + b * 32));
        const __m512i l = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v, y);
        /* d, m of both blocks: da ma db mb */
        const __m128i dm = _mm_set_epi32(0, 0, (int)kvq_q8_u32_at(p + 20), (int)kvq_q8_u32_at(p));
        const __m128 s4 = _mm_mul_ps(_mm_cvtph_ps(dm), _mm_loadu_ps(a->ds + 2 * b));
        macc = _mm_add_ps(macc, s4);
        const __m512 sc = _mm512_permutexvar_ps(lane02, _mm512_castps128_ps512(s4));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(l), sc, acc);
    }
    const float m = _mm_cvtss_f32(_mm_shuffle_ps(macc, macc, 1)) +
                    _mm_cvtss_f32(_mm_shuffle_ps(macc, macc, 3));
    return hsum16(acc) + m;
}

/* Four tokens at once (prefill): the weights' nibbles unpacked once per block pair for
 * all four; each token's lanes, scales and reduction exactly as the one-token kernel
 * (so the same bits as kvq_q8dot_ref for each). */
TARGET void kvq_q8dot4_q4_1_avx512(const uint8_t *row, const kvq_q8row *a, size_t nb,
                                   float out[4])
{
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i lane02 = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    __m128 macc[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
    const uint8_t *p = row;
    for (size_t b = 0; b < nb; b += 2, p += 40) {
        const __m512i v = nibbles2(p, low4);
        const __m128 dm =
            _mm_cvtph_ps(_mm_set_epi32(0, 0, (int)kvq_q8_u32_at(p + 20), (int)kvq_q8_u32_at(p)));
        for (int t = 0; t < 4; t++) {
            const __m512i y = _mm512_loadu_si512((const void *)(a[t].q + b * 32));
            const __m512i l = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v, y);
            const __m128 s4 = _mm_mul_ps(dm, _mm_loadu_ps(a[t].ds + 2 * b));
            macc[t] = _mm_add_ps(macc[t], s4);
            const __m512 sc = _mm512_permutexvar_ps(lane02, _mm512_castps128_ps512(s4));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(l), sc, acc[t]);
        }
    }
    for (int t = 0; t < 4; t++)
        out[t] = hsum16(acc[t]) + (_mm_cvtss_f32(_mm_shuffle_ps(macc[t], macc[t], 1)) +
                                   _mm_cvtss_f32(_mm_shuffle_ps(macc[t], macc[t], 3)));
}

/* Q8_0: v + 128 (unsigned) times the activations, less 128 times their four-value
 * sums (c4): the signed products' sums exactly. */
TARGET float kvq_q8dot_q8_0_avx512(const uint8_t *row, const kvq_q8row *a, size_t nb)
{
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    const __m512i lane02 = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 acc = _mm512_setzero_ps();
    const uint8_t *p = row;
    for (size_t b = 0; b < nb; b += 2, p += 68) {
        const __m256i va = _mm256_loadu_si256((const __m256i *)(p + 2));
        const __m256i vb = _mm256_loadu_si256((const __m256i *)(p + 36));
        const __m512i v = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(va), vb, 1),
                                           bias);
        const __m512i y = _mm512_loadu_si512((const void *)(a->q + b * 32));
        __m512i l = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v, y);
        l = _mm512_sub_epi32(l, _mm512_loadu_si512((const void *)(a->c4 + b * 8)));
        /* d of both blocks: da 0 db 0 */
        const __m128i d = _mm_set_epi32(0, 0, kvq_q8_u16_at(p + 34), kvq_q8_u16_at(p));
        const __m128 s4 = _mm_mul_ps(_mm_cvtph_ps(d), _mm_loadu_ps(a->ds + 2 * b));
        const __m512 sc = _mm512_permutexvar_ps(lane02, _mm512_castps128_ps512(s4));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(l), sc, acc);
    }
    return hsum16(acc);
}
#endif
