/* q8dot_avx2.c — AVX2 kernels of the q8 activation path (q8dot.h): one weight block per
 * 256-bit vpmaddubsw + vpmaddwd (the same eight four-value lane sums as vpdpbusd, no
 * int16 saturation: |u q| + |u q| <= 2 * 15 * 127, |v| |q| * 2 <= 2 * 128 * 127), even
 * and odd blocks into two eight-lane accumulators: the same bits as kvq_q8dot_ref.
 * Called only where kvq_q8dot_level() >= 1 (AVX2, FMA, F16C). */
#include "model/q8dot.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <string.h>

#define TARGET __attribute__((target("avx2,fma,f16c")))

/* The reference's reduction over (even lanes 0-7, odd lanes 8-15). */
static inline TARGET float hsum8x2(__m256 even, __m256 odd)
{
    const __m256 h = _mm256_add_ps(even, odd);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

/* Eight int32 four-value sums of unsigned w times signed y, as f32. */
static inline TARGET __m256 lanes(__m256i w, __m256i y)
{
    const __m256i p = _mm256_maddubs_epi16(w, y);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

static inline TARGET __m256i nibbles(const uint8_t *qs)
{
    const __m128i low4 = _mm_set1_epi8(0x0F), q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low4), _mm_and_si128(q, low4));
}

TARGET float kvq_q8dot_q4_1_avx2(const uint8_t *row, const kvq_q8row *a, size_t nb)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m128 macc = _mm_setzero_ps();
    const uint8_t *p = row;
    for (size_t b = 0; b < nb; b += 2, p += 40) {
        const __m256i y0 = _mm256_loadu_si256((const __m256i *)(a->q + b * 32));
        const __m256i y1 = _mm256_loadu_si256((const __m256i *)(a->q + b * 32 + 32));
        /* d, m of both blocks: da ma db mb */
        const __m128i dm = _mm_set_epi32(0, 0, (int)kvq_q8_u32_at(p + 20), (int)kvq_q8_u32_at(p));
        const __m128 s4 = _mm_mul_ps(_mm_cvtph_ps(dm), _mm_loadu_ps(a->ds + 2 * b));
        macc = _mm_add_ps(macc, s4);
        acc0 = _mm256_fmadd_ps(lanes(nibbles(p + 4), y0), _mm256_broadcastss_ps(s4), acc0);
        acc1 = _mm256_fmadd_ps(lanes(nibbles(p + 24), y1),
                               _mm256_broadcastss_ps(_mm_movehl_ps(s4, s4)), acc1);
    }
    const float m = _mm_cvtss_f32(_mm_shuffle_ps(macc, macc, 1)) +
                    _mm_cvtss_f32(_mm_shuffle_ps(macc, macc, 3));
    return hsum8x2(acc0, acc1) + m;
}

/* Q8_0: |v| (unsigned) times y with v's sign, as ggml's AVX2 path does. */
TARGET float kvq_q8dot_q8_0_avx2(const uint8_t *row, const kvq_q8row *a, size_t nb)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const uint8_t *p = row;
    for (size_t b = 0; b < nb; b += 2, p += 68) {
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(p + 2));
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(p + 36));
        const __m256i y0 = _mm256_loadu_si256((const __m256i *)(a->q + b * 32));
        const __m256i y1 = _mm256_loadu_si256((const __m256i *)(a->q + b * 32 + 32));
        /* d of both blocks: da 0 db 0 */
        const __m128i d = _mm_set_epi32(0, 0, kvq_q8_u16_at(p + 34), kvq_q8_u16_at(p));
        const __m128 s4 = _mm_mul_ps(_mm_cvtph_ps(d), _mm_loadu_ps(a->ds + 2 * b));
        acc0 = _mm256_fmadd_ps(lanes(_mm256_abs_epi8(v0), _mm256_sign_epi8(y0, v0)),
                               _mm256_broadcastss_ps(s4), acc0);
        acc1 = _mm256_fmadd_ps(lanes(_mm256_abs_epi8(v1), _mm256_sign_epi8(y1, v1)),
                               _mm256_broadcastss_ps(_mm_movehl_ps(s4, s4)), acc1);
    }
    return hsum8x2(acc0, acc1);
}
#endif
