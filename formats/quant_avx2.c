/*
 * quant_avx2.c — AVX2 dequantization of every supported ggml block type, the AVX2 f32
 * dot product of the fused matrix-vector product, and fused dequantize-and-dot tiles
 * for Q4_1, Q8_0, Q4_K and Q6_K.
 *
 * Each dequantizer equals its scalar reference (quant_legacy.c, quant_k.c) bit for
 * bit: integer codes are assembled in bytes, converted exactly to f32, and combined
 * with the block's f32 scales by the same products and sums, each rounded once
 * (separate mul and add/sub; never an FMA). Scales are decoded by the same scalar
 * code as the reference. Blocks are loaded unaligned.
 */
#include "formats/quant_simd.h"

#if KVQ_HAVE_X86_SIMD
#include <immintrin.h>
#include <string.h>

#include "kvq/half.h"

#define TARGET __attribute__((target("avx2,fma,f16c")))

enum { OP_MUL = 0, OP_MUL_ADD = 1, OP_MUL_SUB = 2 };

static inline float f16_at(const uint8_t *p)
{
    return kvq_f16_to_f32_ref((uint16_t)(p[0] | (p[1] << 8)));
}

/* out[0..7] = d * q (op MUL), d * q + m (MUL_ADD) or d * q - m (MUL_SUB) for the low 8
 * signed bytes of q. */
static inline TARGET void store8(float *out, __m128i q, __m256 d, __m256 m, int op)
{
    const __m256 v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    _mm256_storeu_ps(out, op == OP_MUL_ADD   ? _mm256_add_ps(v, m)
                          : op == OP_MUL_SUB ? _mm256_sub_ps(v, m)
                                             : v);
}

static inline TARGET void store16(float *out, __m128i q, float d, float m, int op)
{
    const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
    store8(out, q, dv, mv, op);
    store8(out + 8, _mm_srli_si128(q, 8), dv, mv, op);
}

static inline TARGET void store32(float *out, __m256i q, float d, float m, int op)
{
    store16(out, _mm256_castsi256_si128(q), d, m, op);
    store16(out + 16, _mm256_extracti128_si256(q, 1), d, m, op);
}

/* 16 bytes of packed nibbles -> 32 bytes: the low nibbles, then the high ones. */
static inline TARGET __m256i nibbles32(const uint8_t *qs)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)qs);
    const __m128i m = _mm_set1_epi8(0xF);
    const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* Byte i = 0x10 if bit i of qh is set, else 0 (the fifth bit of Q5_0 / Q5_1). */
static inline TARGET __m256i bit5_32(const uint8_t *p)
{
    uint32_t qh;
    memcpy(&qh, p, 4);
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                          2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10));
}

/* (v >> shift) & mask in each byte, for a run-time shift. */
static inline TARGET __m256i shr_and(__m256i v, int shift, int mask)
{
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)),
                            _mm256_set1_epi8((char)mask));
}

/* 0xFF in each byte of v that has bit b set, else 0. */
static inline TARGET __m256i has_bit(__m256i v, int b)
{
    const __m256i m = _mm256_set1_epi8((char)(1 << b));
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, m), m);
}

/* ---- 32-value blocks ---------------------------------------------------------------- */

TARGET void kvq_dequant_q4_0_avx2(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 32; b++, p += 18, out += 32)
        store32(out, _mm256_sub_epi8(nibbles32(p + 2), _mm256_set1_epi8(8)), f16_at(p), 0.0f,
                OP_MUL);
}

TARGET void kvq_dequant_q4_1_avx2(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 32; b++, p += 20, out += 32)
        store32(out, nibbles32(p + 4), f16_at(p), f16_at(p + 2), OP_MUL_ADD);
}

TARGET void kvq_dequant_q5_0_avx2(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 32; b++, p += 22, out += 32) {
        const __m256i q = _mm256_or_si256(nibbles32(p + 6), bit5_32(p + 2));
        store32(out, _mm256_sub_epi8(q, _mm256_set1_epi8(16)), f16_at(p), 0.0f, OP_MUL);
    }
}

TARGET void kvq_dequant_q5_1_avx2(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 32; b++, p += 24, out += 32) {
        const __m256i q = _mm256_or_si256(nibbles32(p + 8), bit5_32(p + 4));
        store32(out, q, f16_at(p), f16_at(p + 2), OP_MUL_ADD);
    }
}

/* Q8_0: blocks of 34 bytes (f16 d, int8 q[32]); value = d * q. */
TARGET void kvq_dequant_q8_0_avx2(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 32; b++, p += 34, out += 32)
        store32(out, _mm256_loadu_si256((const __m256i *)(p + 2)), f16_at(p), 0.0f, OP_MUL);
}

/* ---- fused dequantize-and-dot tiles (decode) ------------------------------------------
 * dot(dequantize(blocks), x) over n values (whole blocks) without the buffer, equal bit
 * for bit to the type's dequantizer followed by kvq_dot_f32_avx2: the same values (d q,
 * d q + m, d q - m: mul, then add or sub; F16C gives the reference's f32 of every f16),
 * the same FMAs into the same two accumulators (values [0, 8) of each 16 into acc0,
 * [8, 16) into acc1, in order), the same reduction. Machines without AVX-512 decode
 * through these (Q4_K and Q6_K below, with their dequantizers). */

/* kvq_dot_f32_avx2's reduction of its two accumulators. */
static inline TARGET float reduce2(__m256 acc0, __m256 acc1)
{
    const __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* d * q (op MUL), d * q + m (MUL_ADD) or d * q - m (MUL_SUB) of the low 8 signed bytes
 * of q, as store8 writes them. */
static inline TARGET __m256 vals8(__m128i q, __m256 d, __m256 m, int op)
{
    const __m256 v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    return op == OP_MUL_ADD ? _mm256_add_ps(v, m) : op == OP_MUL_SUB ? _mm256_sub_ps(v, m) : v;
}

/* acc0, acc1 += 32 values (signed bytes q [32]: d q op m) times x [32], in the dot
 * kernel's order: values [0, 8) and [16, 24) into acc0, [8, 16) and [24, 32) into acc1. */
static inline TARGET void fma32(__m256i q, __m256 d, __m256 m, int op, const float *x,
                                __m256 *acc0, __m256 *acc1)
{
    const __m128i a = _mm256_castsi256_si128(q), b = _mm256_extracti128_si256(q, 1);
    *acc0 = _mm256_fmadd_ps(vals8(a, d, m, op), _mm256_loadu_ps(x), *acc0);
    *acc1 =
        _mm256_fmadd_ps(vals8(_mm_srli_si128(a, 8), d, m, op), _mm256_loadu_ps(x + 8), *acc1);
    *acc0 = _mm256_fmadd_ps(vals8(b, d, m, op), _mm256_loadu_ps(x + 16), *acc0);
    *acc1 =
        _mm256_fmadd_ps(vals8(_mm_srli_si128(b, 8), d, m, op), _mm256_loadu_ps(x + 24), *acc1);
}

TARGET float kvq_qdot_q4_1_avx2(const void *blocks, const float *x, size_t n)
{
    const uint8_t *p = blocks;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (size_t b = 0; b < n / 32; b++, p += 20, x += 32) {
        uint32_t dm;
        memcpy(&dm, p, 4);
        const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm)); /* d, m, 0, 0 */
        const __m256 d = _mm256_broadcastss_ps(f), m = _mm256_broadcastss_ps(_mm_movehdup_ps(f));
        fma32(nibbles32(p + 4), d, m, OP_MUL_ADD, x, &acc0, &acc1);
    }
    return reduce2(acc0, acc1);
}

TARGET float kvq_qdot_q8_0_avx2(const void *blocks, const float *x, size_t n)
{
    const uint8_t *p = blocks;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (size_t b = 0; b < n / 32; b++, p += 34, x += 32) {
        uint16_t h;
        memcpy(&h, p, 2);
        const __m256 d = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
        fma32(_mm256_loadu_si256((const __m256i *)(p + 2)), d, d, OP_MUL, x, &acc0, &acc1);
    }
    return reduce2(acc0, acc1);
}

/* ---- 256-value K blocks ---------------------------------------------------------- */

TARGET void kvq_dequant_q2_k_avx2(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 256; b++, p += 84, out += 256) {
        const float d = f16_at(p + 80), dmin = f16_at(p + 82);
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * h));
            for (int s = 0; s < 4; s++) {
                const __m256i q = shr_and(v, 2 * s, 3);
                const int j = 8 * h + 2 * s; /* sub-blocks j, j + 1 */
                float *o = out + 128 * h + 32 * s;
                store16(o, _mm256_castsi256_si128(q), d * (float)(p[j] & 0xF),
                        dmin * (float)(p[j] >> 4), OP_MUL_SUB);
                store16(o + 16, _mm256_extracti128_si256(q, 1), d * (float)(p[j + 1] & 0xF),
                        dmin * (float)(p[j + 1] >> 4), OP_MUL_SUB);
            }
        }
    }
}

TARGET void kvq_dequant_q3_k_avx2(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 256; b++, p += 110, out += 256) {
        const float d = f16_at(p + 108);
        int8_t sc[16];
        kvq_q3k_scales(p + 96, sc);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)p);
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 32 + 32 * h));
            for (int s = 0; s < 4; s++) {
                const __m256i clear = _mm256_andnot_si256(has_bit(hm, 4 * h + s),
                                                          _mm256_set1_epi8(4));
                const __m256i q = _mm256_sub_epi8(shr_and(v, 2 * s, 3), clear);
                const int j = 8 * h + 2 * s;
                float *o = out + 128 * h + 32 * s;
                store16(o, _mm256_castsi256_si128(q), d * (float)sc[j], 0.0f, OP_MUL);
                store16(o + 16, _mm256_extracti128_si256(q, 1), d * (float)sc[j + 1], 0.0f,
                        OP_MUL);
            }
        }
    }
}

/* Q4_K and Q5_K: qh is NULL for Q4_K. */
static inline TARGET void q45_k(const uint8_t *p, const uint8_t *qh, const uint8_t *qs,
                                float *out)
{
    const float d = f16_at(p), dmin = f16_at(p + 2);
    const __m256i hv = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        for (int k = 0; k < 2; k++) {
            const int j = 2 * c + k; /* sub-block */
            __m256i q = shr_and(v, 4 * k, 0xF);
            if (qh)
                q = _mm256_or_si256(q, _mm256_and_si256(has_bit(hv, j), _mm256_set1_epi8(0x10)));
            uint8_t sc, mn;
            kvq_q4k_scale_min(p + 4, j, &sc, &mn);
            store32(out + 32 * j, q, d * (float)sc, dmin * (float)mn, OP_MUL_SUB);
        }
    }
}

TARGET void kvq_dequant_q4_k_avx2(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 256; b++, p += 144, out += 256)
        q45_k(p, NULL, p + 16, out);
}

TARGET void kvq_dequant_q5_k_avx2(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 256; b++, p += 176, out += 256)
        q45_k(p, p + 16, p + 48, out);
}

/* Q6_K: the codes q - 32 (signed bytes) of values 32 s .. 32 s + 31 of a half block
 * whose low bits are ql [2] (its 64 bytes) and high bits qh (its 32 bytes). */
static inline TARGET __m256i q6_k_codes32(const __m256i *ql, __m256i qh, int s)
{
    const __m256i low = shr_and(ql[s & 1], 4 * (s >> 1), 0xF);
    const __m256i high = _mm256_slli_epi16(shr_and(qh, 2 * s, 3), 4);
    return _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32));
}

TARGET void kvq_dequant_q6_k_avx2(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 256; b++, p += 210, out += 256) {
        const int8_t *sc = (const int8_t *)(p + 192);
        const float d = f16_at(p + 208);
        for (int h = 0; h < 2; h++) {
            const __m256i ql[2] = {_mm256_loadu_si256((const __m256i *)(p + 64 * h)),
                                   _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32))};
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
            for (int s = 0; s < 4; s++) {
                const __m256i q = q6_k_codes32(ql, qh, s);
                const int j = 8 * h + 2 * s;
                float *o = out + 128 * h + 32 * s;
                store16(o, _mm256_castsi256_si128(q), d * (float)sc[j], 0.0f, OP_MUL);
                store16(o + 16, _mm256_extracti128_si256(q, 1), d * (float)sc[j + 1], 0.0f,
                        OP_MUL);
            }
        }
    }
}

/* Fused K tiles (see "fused dequantize-and-dot tiles" above): the dequantizers' values
 * in block order, 32 at a time through fma32. */
TARGET float kvq_qdot_q4_k_avx2(const void *blocks, const float *x, size_t n)
{
    const uint8_t *p = blocks;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (size_t b = 0; b < n / 256; b++, p += 144) {
        uint32_t dm;
        memcpy(&dm, p, 4);
        const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm)); /* d, dmin, 0, 0 */
        const float d = _mm_cvtss_f32(f), dmin = _mm_cvtss_f32(_mm_movehdup_ps(f));
        for (int c = 0; c < 4; c++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * c));
            for (int k = 0; k < 2; k++, x += 32) {
                uint8_t sc, mn;
                kvq_q4k_scale_min(p + 4, 2 * c + k, &sc, &mn);
                fma32(shr_and(v, 4 * k, 0xF), _mm256_set1_ps(d * (float)sc),
                      _mm256_set1_ps(dmin * (float)mn), OP_MUL_SUB, x, &acc0, &acc1);
            }
        }
    }
    return reduce2(acc0, acc1);
}

TARGET float kvq_qdot_q6_k_avx2(const void *blocks, const float *x, size_t n)
{
    const uint8_t *p = blocks;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
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
                const __m256i q = q6_k_codes32(ql, qh, s);
                const int j = 8 * h + 2 * s;
                /* the two halves have their own scales: 16 values each */
                const __m256 d0 = _mm256_set1_ps(d * (float)sc[j]),
                             d1 = _mm256_set1_ps(d * (float)sc[j + 1]);
                const __m128i a = _mm256_castsi256_si128(q), c = _mm256_extracti128_si256(q, 1);
                acc0 = _mm256_fmadd_ps(vals8(a, d0, d0, OP_MUL), _mm256_loadu_ps(x), acc0);
                acc1 = _mm256_fmadd_ps(vals8(_mm_srli_si128(a, 8), d0, d0, OP_MUL),
                                       _mm256_loadu_ps(x + 8), acc1);
                acc0 = _mm256_fmadd_ps(vals8(c, d1, d1, OP_MUL), _mm256_loadu_ps(x + 16), acc0);
                acc1 = _mm256_fmadd_ps(vals8(_mm_srli_si128(c, 8), d1, d1, OP_MUL),
                                       _mm256_loadu_ps(x + 24), acc1);
            }
        }
    }
    return reduce2(acc0, acc1);
}

/* ---- dot product -------------------------------------------------------------------- */

TARGET float kvq_dot_f32_avx2(const float *a, const float *b, size_t n)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    float r = reduce2(acc0, acc1);
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

#endif
