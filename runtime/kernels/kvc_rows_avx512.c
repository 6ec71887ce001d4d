/*
 * runtime/kernels/kvc_rows_avx512.c — the AVX-512 readers of LeanKV and PATS rows
 * (kvc_rows_simd.h): one vector of 16 floats is the 16 lanes of kvc_rows.h's sums, so
 * the results are the scalar specification's bit for bit. Codes are widened straight
 * from the stored bytes (shifts by lane); PATS fields are gathered from the 64-byte
 * blocks and converted as f16.
 */
#include "runtime/kernels/kernels_simd.h"

#if KVQ_RK_HAVE_X86
#include <immintrin.h>
#include <string.h>

#include "runtime/kernels/kvc_rows_simd.h"

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define AHEAD 8 /* rows prefetched ahead */
#define KVQ_PATS_WIDTHS 11 /* b = 0..10 */

TARGET static inline float reduce16(__m512 acc)
{
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* The 16 sums of rows A[0..15] at once, each by reduce16's tree (s8 = lanes l + l+8,
 * then +4, +2, +1, the same additions): out lane r = reduce16(A[r]). */
TARGET static inline __m512 reduce16x16(const __m512 *A)
{
    __m512 B[8], C[4], D[2];
    for (int j = 0; j < 8; j++) /* row 2j in lanes 0..7, row 2j+1 in 8..15 */
        B[j] = _mm512_add_ps(_mm512_shuffle_f32x4(A[2 * j], A[2 * j + 1], 0x44),
                             _mm512_shuffle_f32x4(A[2 * j], A[2 * j + 1], 0xee));
    for (int k = 0; k < 4; k++) /* quad i: row 4k + i */
        C[k] = _mm512_add_ps(_mm512_shuffle_f32x4(B[2 * k], B[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(B[2 * k], B[2 * k + 1], 0xdd));
    for (int m = 0; m < 2; m++) /* quad i: rows 8m + i (lanes 0, 1) and 8m + 4 + i (2, 3) */
        D[m] = _mm512_add_ps(_mm512_shuffle_ps(C[2 * m], C[2 * m + 1], 0x44),
                             _mm512_shuffle_ps(C[2 * m], C[2 * m + 1], 0xee));
    /* lane 4i + k: row i + 4k */
    const __m512 E = _mm512_add_ps(_mm512_shuffle_ps(D[0], D[1], 0x88),
                                   _mm512_shuffle_ps(D[0], D[1], 0xdd));
    const __m512i back = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(back, E);
}

TARGET static inline void meta(const uint8_t *r, float *s, float *z)
{
    uint16_t h[2];
    memcpy(h, r, 4);
    *s = _cvtsh_ss(h[0]);
    *z = _cvtsh_ss(h[1]);
}

/* Codes t0 .. t0 + 15 of a LeanKV row (bits 2, 4 or 8; else the bit stream). */
TARGET static inline __m512 codes16(const uint8_t *p, int32_t t0, int32_t bits)
{
    if (bits == 8)
        return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + t0))));
    if (bits == 4) { /* byte t / 2 to lane t (one shuffle), then its nibble */
        const __m128i x = _mm_loadl_epi64((const __m128i *)(p + t0 / 2));
        const __m128i d = _mm_shuffle_epi8(x, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6,
                                                            6, 7, 7));
        const __m512i sh = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
        return _mm512_cvtepi32_ps(
            _mm512_and_si512(_mm512_srlv_epi32(_mm512_cvtepu8_epi32(d), sh), _mm512_set1_epi32(15)));
    }
    uint32_t w; /* bits 2: byte t / 4 to lane t */
    memcpy(&w, p + t0 / 4, 4);
    const __m128i d = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)w),
                                       _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
    const __m512i sh = _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6);
    return _mm512_cvtepi32_ps(
        _mm512_and_si512(_mm512_srlv_epi32(_mm512_cvtepu8_epi32(d), sh), _mm512_set1_epi32(3)));
}

/* The row's codes as floats into c [n]; bits other than 2, 4, 8 element by element. */
TARGET static inline void lkq_decode(const uint8_t *r, int32_t n, int32_t bits, float *c)
{
    const uint8_t *p = r + 4;
    if (bits == 8 || bits == 4 || bits == 2) {
        for (int32_t t = 0; t < n; t += 16)
            _mm512_store_ps(c + t, codes16(p, t, bits));
        return;
    }
    for (int32_t t = 0; t < n; t++) {
        const uint64_t off = (uint64_t)t * (uint64_t)bits;
        uint32_t v = p[off >> 3]; /* bits <= 8: at most two bytes hold the code */
        if ((off & 7u) + (uint64_t)bits > 8)
            v |= (uint32_t)p[(off >> 3) + 1] << 8;
        c[t] = (float)((v >> (off & 7u)) & ((1u << bits) - 1u));
    }
}

TARGET static inline void prefetch_row(const uint8_t *r)
{
    _mm_prefetch((const char *)r, _MM_HINT_T0);
    _mm_prefetch((const char *)r + 64, _MM_HINT_T0);
}

#define BLK_NQ 8 /* queries of the 16-row blocks */

/* Logits of 16 rows [i0, i0 + 16) whose decoded values decode(r, x) writes (x [n]):
 * per query the 16 lane sums, reduced together; then fin(g, sums) the finished logits. */
#define LOGITS16(DECODE, FIN)                                                                    \
    do {                                                                                         \
        _Alignas(64) float xb[512];                                                              \
        __m512 A[BLK_NQ][16];                                                                    \
        for (int r = 0; r < 16; r++) {                                                           \
            if (i0 + r + AHEAD < m)                                                              \
                prefetch_row(row[i0 + r + AHEAD]);                                               \
            DECODE;                                                                              \
            for (int32_t g = 0; g < nq; g++) {                                                   \
                const float *qg = q + (size_t)g * (size_t)ldq;                                   \
                __m512 acc = _mm512_setzero_ps();                                                \
                for (int32_t t = 0; t < n; t += 16)                                              \
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + t), _mm512_load_ps(xb + t), acc); \
                A[g][r] = acc;                                                                   \
            }                                                                                    \
        }                                                                                        \
        for (int32_t g = 0; g < nq; g++) {                                                       \
            const __m512 sums = reduce16x16(A[g]);                                               \
            _mm512_storeu_ps(out + (size_t)g * (size_t)ldo + (size_t)i0, FIN);                   \
        }                                                                                        \
    } while (0)


/* ---- Rows of 64 or 128 elements, up to 8 queries: the decoded values stay in registers
 * (no row-sized buffer), the loops unrolled by the compile-time chunk count NC and query
 * count NQ (always_inline bodies instantiated per pair). The same fused multiply-adds in
 * the same order as the general paths, so the same bits. */
#define INL static inline __attribute__((always_inline))
#define FAST_NQ 8

/* Chunk k of a LeanKV row's codes as floats into c[k], k < NC: bits 8, 4, 2 from
 * registers, else element by element through a buffer. */
TARGET INL void lkq_chunks(const uint8_t *r, int32_t bits, int32_t NC, __m512 *c)
{
    const uint8_t *p = r + 4;
    if (bits == 8) {
        _Pragma("GCC unroll 8") for (int32_t k = 0; k < NC; k++) c[k] = codes16(p, 16 * k, 8);
    } else if (bits == 4) {
        _Pragma("GCC unroll 8") for (int32_t k = 0; k < NC; k++) c[k] = codes16(p, 16 * k, 4);
    } else if (bits == 2) {
        _Pragma("GCC unroll 8") for (int32_t k = 0; k < NC; k++) c[k] = codes16(p, 16 * k, 2);
    } else {
        _Alignas(64) float x[128];
        lkq_decode(r, 16 * NC, bits, x);
        _Pragma("GCC unroll 8") for (int32_t k = 0; k < NC; k++) c[k] = _mm512_load_ps(x + 16 * k);
    }
}

/* Row r of a 16-row block at width BITS (the sums into A[.][r]). */
TARGET INL void lkq_logits_row(const float *q, int32_t NQ, int64_t ldq, const uint8_t *rp,
                               int32_t BITS, int32_t NC, int r, __m512 (*A)[16], float *sv,
                               float *zv)
{
    meta(rp, &sv[r], &zv[r]);
    __m512 c[8];
    lkq_chunks(rp, BITS, NC, c);
    _Pragma("GCC unroll 8") for (int32_t g = 0; g < NQ; g++) {
        const float *qg = q + (size_t)g * (size_t)ldq;
        __m512 acc = _mm512_setzero_ps();
        _Pragma("GCC unroll 8") for (int32_t k = 0; k < NC; k++)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * k), c[k], acc);
        A[g][r] = acc;
    }
}

/* Logits of rows [i0, i0 + 16): per query the 16 rows' lane sums, reduced together. The
 * rows of width 8, then 4, then the others (each row's sums are its own: the order of
 * the rows does not change them), so that rows of mixed widths (LeanKV's HIGH and LOW
 * keys) do not branch on each row's width. */
TARGET INL void lkq_logits16(const float *q, int32_t NQ, int64_t ldq, const float *qsum,
                             const uint8_t *const *row, const int8_t *bits, int64_t i0,
                             int64_t m, int32_t NC, float scale, float *out, int64_t ldo)
{
    __m512 A[FAST_NQ][16];
    _Alignas(64) float sv[16], zv[16];
    for (int r = 0; r < 16; r++)
        if (i0 + r + AHEAD < m)
            prefetch_row(row[i0 + r + AHEAD]);
    const __m128i bv = _mm_loadu_si128((const __m128i *)(bits + i0));
    unsigned m8 = _mm_cmpeq_epi8_mask(bv, _mm_set1_epi8(8));
    unsigned m4 = _mm_cmpeq_epi8_mask(bv, _mm_set1_epi8(4));
    unsigned mo = 0xffffu & ~(m8 | m4);
    for (; m8; m8 &= m8 - 1) {
        const int r = __builtin_ctz(m8);
        lkq_logits_row(q, NQ, ldq, row[i0 + r], 8, NC, r, A, sv, zv);
    }
    for (; m4; m4 &= m4 - 1) {
        const int r = __builtin_ctz(m4);
        lkq_logits_row(q, NQ, ldq, row[i0 + r], 4, NC, r, A, sv, zv);
    }
    for (; mo; mo &= mo - 1) {
        const int r = __builtin_ctz(mo);
        lkq_logits_row(q, NQ, ldq, row[i0 + r], bits[i0 + r], NC, r, A, sv, zv);
    }
    const __m512 s = _mm512_load_ps(sv), z = _mm512_load_ps(zv), sc = _mm512_set1_ps(scale);
    _Pragma("GCC unroll 8") for (int32_t g = 0; g < NQ; g++) {
        const __m512 sums = reduce16x16(A[g]);
        _mm512_storeu_ps(out + (size_t)g * (size_t)ldo + (size_t)i0,
                         _mm512_mul_ps(sc, _mm512_sub_ps(_mm512_mul_ps(s, sums),
                                                         _mm512_mul_ps(z, _mm512_set1_ps(qsum[g])))));
    }
}

TARGET static void lkq_logits_fast(const float *q, int32_t nq, int64_t ldq, const float *qsum,
                                   const uint8_t *const *row, const int8_t *bits, int64_t m,
                                   int32_t n, float scale, float *out, int64_t ldo)
{
#define LKQ_LOGITS_CASE(NQ, NC)                                                                  \
    for (int64_t i = 0; i + 16 <= m; i += 16)                                                    \
        lkq_logits16(q, NQ, ldq, qsum, row, bits, i, m, NC, scale, out, ldo);                    \
    break
#define LKQ_LOGITS_NC(NQ)                                                                        \
    case NQ:                                                                                     \
        if (n == 64) {                                                                           \
            LKQ_LOGITS_CASE(NQ, 4);                                                              \
        } else {                                                                                 \
            LKQ_LOGITS_CASE(NQ, 8);                                                              \
        }
    switch (nq) {
        LKQ_LOGITS_NC(1) LKQ_LOGITS_NC(2) LKQ_LOGITS_NC(3) LKQ_LOGITS_NC(4)
        LKQ_LOGITS_NC(5) LKQ_LOGITS_NC(6) LKQ_LOGITS_NC(7) LKQ_LOGITS_NC(8)
    default: break;
    }
#undef LKQ_LOGITS_NC
#undef LKQ_LOGITS_CASE
}

/* The value s16 c - z16 of chunk k of a LeanKV row. */
TARGET INL __m512 lkq_value16(const uint8_t *r, int32_t bits, int32_t k)
{
    float s, z;
    meta(r, &s, &z);
    __m512 c;
    if (bits == 8 || bits == 4 || bits == 2) {
        c = codes16(r + 4, 16 * k, bits);
    } else {
        _Alignas(64) float x[16];
        for (int32_t t = 0; t < 16; t++)
            x[t] = kvq_kvc_code_at(r + 4, 16 * k + t, bits);
        c = _mm512_load_ps(x);
    }
    return _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(s), c), _mm512_set1_ps(z));
}

/* Codes of widths 2, 4 and 8 without a branch on the width (w = bits / 4: 0, 1, 2):
 * chunk k's 2 bits bytes (a masked load: nothing read past them), byte t bits / 8 to
 * lane t (one shuffle), shifted by t bits % 8 and masked; the values of codes16. */
static const uint8_t bl_ctl[3][16] = {
    {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3},
    {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
};
static const uint32_t bl_sh[3][16] = {
    {0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6},
    {0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4},
    {0},
};

/* The value s16 c - z16 of chunk k of a LeanKV row of width 2, 4 or 8 (lkq_value16's). */
TARGET INL __m512 lkq_value16_bl(const uint8_t *r, int32_t bits, int32_t k)
{
    float s, z;
    meta(r, &s, &z);
    const int w = bits >> 2;
    const __m128i x = _mm_maskz_loadu_epi8((__mmask16)((1u << (2 * bits)) - 1u),
                                           r + 4 + 2 * k * bits);
    const __m128i d = _mm_shuffle_epi8(x, _mm_loadu_si128((const __m128i *)bl_ctl[w]));
    const __m512i v = _mm512_and_si512(
        _mm512_srlv_epi32(_mm512_cvtepu8_epi32(d), _mm512_loadu_si512(bl_sh[w])),
        _mm512_set1_epi32((int)((1u << bits) - 1u)));
    const __m512 c = _mm512_cvtepi32_ps(v);
    return _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(s), c), _mm512_set1_ps(z));
}

/* The value s16 c - z16 of chunk k of a LeanKV row of width 4, from the 64 codes of
 * chunks k & ~3 .. (k & ~3) + 3 decoded together (one 32-byte load, the nibbles split
 * and interleaved): the mix's unrolled calls for the chunks of one group share that
 * work. */
TARGET INL __m512 lkq_value16_4b(const uint8_t *r, int32_t bits, int32_t k)
{
    (void)bits;
    float s, z;
    meta(r, &s, &z);
    const __m256i x = _mm256_loadu_si256((const __m256i *)(r + 4 + 8 * (k & ~3)));
    const __m256i f = _mm256_set1_epi8(15);
    const __m256i lo = _mm256_and_si256(x, f), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), f);
    /* per 128-bit half: codes 0..15 (a) and 16..31 (b) of its 16 bytes */
    const __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi);
    const __m256i ab = k & 1 ? b : a;
    const __m128i src = k & 2 ? _mm256_extracti128_si256(ab, 1) : _mm256_castsi256_si128(ab);
    const __m512 c = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(src));
    return _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(s), c), _mm512_set1_ps(z));
}

/* The mix's decoding for widths bits [m]: 2 all of width 4, 1 more than one width, all of
 * them 2, 4 or 8 (decoded without a branch on each row's width), 0 otherwise. */
TARGET static int mix_widths(const int8_t *bits, int64_t m)
{
    if (m < 1)
        return 0;
    const int8_t b0 = bits[0];
    int mixed = 0;
    for (int64_t i = 0; i < m; i++) {
        const int8_t b = bits[i];
        if (b != 2 && b != 4 && b != 8)
            return 0;
        mixed |= b != b0;
    }
    return mixed ? 1 : b0 == 4 ? 2 : 0;
}

/* NQ queries, NC chunks of 16: column passes of CB chunks (NQ CB <= 16 sums in
 * registers; kvc_rows_simd.h). */
#define MIX_FAST(NQ, NC, DECODE)                                                                 \
    KVQ_KVC_MIX_FAST(__m512, 16, NQ, NC, (NQ) <= 4 ? 4 : 2, _mm512_loadu_ps, _mm512_storeu_ps,  \
                     _mm512_set1_ps, _mm512_fmadd_ps, prefetch_row, DECODE)

TARGET static void lkq_mix_fast(const float *p, int32_t nq, int64_t ldp,
                                const uint8_t *const *row, const int8_t *bits, int64_t m,
                                int32_t n, float *y, int64_t ldy)
{
    const int wd = mix_widths(bits, m);
#define LKQ_MIX_NC(NQ)                                                                           \
    case NQ:                                                                                     \
        if (n == 64 && wd == 2)                                                                  \
            MIX_FAST(NQ, 4, lkq_value16_4b);                                                     \
        else if (n == 64 && wd == 1)                                                             \
            MIX_FAST(NQ, 4, lkq_value16_bl);                                                     \
        else if (n == 64)                                                                        \
            MIX_FAST(NQ, 4, lkq_value16);                                                        \
        else if (wd == 2)                                                                        \
            MIX_FAST(NQ, 8, lkq_value16_4b);                                                     \
        else if (wd == 1)                                                                        \
            MIX_FAST(NQ, 8, lkq_value16_bl);                                                     \
        else                                                                                     \
            MIX_FAST(NQ, 8, lkq_value16);                                                        \
        break;
    switch (nq) {
        LKQ_MIX_NC(1) LKQ_MIX_NC(2) LKQ_MIX_NC(3) LKQ_MIX_NC(4)
        LKQ_MIX_NC(5) LKQ_MIX_NC(6) LKQ_MIX_NC(7) LKQ_MIX_NC(8)
    default: break;
    }
#undef LKQ_MIX_NC
}

/* The fast paths' shapes. */
static int fast_shape(int32_t nq, int32_t n)
{
    return (n == 64 || n == 128) && nq >= 1 && nq <= FAST_NQ;
}

TARGET void kvq_kvc_lkq_logits_avx512(const float *q, int32_t nq, int64_t ldq, const float *qsum,
                                      const uint8_t *const *row, const int8_t *bits, int64_t m,
                                      int32_t n, float scale, float *out, int64_t ldo)
{
    _Alignas(64) float c[512];
    float s, z;
    int64_t i = 0;
    if (fast_shape(nq, n)) {
        lkq_logits_fast(q, nq, ldq, qsum, row, bits, m, n, scale, out, ldo);
        i = m - m % 16;
    }
    if (nq <= BLK_NQ)
        for (; i + 16 <= m; i += 16) {
            const int64_t i0 = i;
            _Alignas(64) float sv[16], zv[16];
            LOGITS16(({
                         meta(row[i0 + r], &sv[r], &zv[r]);
                         lkq_decode(row[i0 + r], n, bits[i0 + r], xb);
                     }),
                     _mm512_mul_ps(_mm512_set1_ps(scale),
                                   _mm512_sub_ps(_mm512_mul_ps(_mm512_load_ps(sv), sums),
                                                 _mm512_mul_ps(_mm512_load_ps(zv),
                                                               _mm512_set1_ps(qsum[g])))));
        }
    for (; i < m; i++) {
        if (i + AHEAD < m)
            prefetch_row(row[i + AHEAD]);
        meta(row[i], &s, &z);
        lkq_decode(row[i], n, bits[i], c);
        for (int32_t g = 0; g < nq; g++) {
            const float *qg = q + (size_t)g * (size_t)ldq;
            __m512 acc = _mm512_setzero_ps();
            for (int32_t t = 0; t < n; t += 16)
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + t), _mm512_load_ps(c + t), acc);
            const float t1 = s * reduce16(acc), t2 = z * qsum[g];
            out[(size_t)g * (size_t)ldo + (size_t)i] = scale * (t1 - t2);
        }
    }
}

/* y + g ldy += a[g] x for the nonzero a[g]; x [n] in xs. */
TARGET static inline void mix_rows(const float *a, int32_t nq, const float *xs, int32_t n,
                                   float *y, int64_t ldy)
{
    for (int32_t g = 0; g < nq; g++) {
        if (a[g] == 0)
            continue;
        const __m512 av = _mm512_set1_ps(a[g]);
        float *yg = y + (size_t)g * (size_t)ldy;
        for (int32_t t = 0; t < n; t += 16)
            _mm512_storeu_ps(yg + t, _mm512_fmadd_ps(av, _mm512_load_ps(xs + t),
                                                     _mm512_loadu_ps(yg + t)));
    }
}

/* The sums y [nq <= 4, 64] held in registers over all the rows (the same fused
 * multiply-adds in the same order as mix_rows on memory): decode(i, x) writes row i's
 * values into x and returns 0 for a row every weight skips. */
#define MIX64_REGS(...)                                                                   \
    do {                                                                                         \
        __m512 acc[4][4];                                                                        \
        for (int32_t g = 0; g < 4; g++)                                                          \
            for (int c = 0; c < 4; c++)                                                          \
                acc[g][c] = g < nq ? _mm512_loadu_ps(y + (size_t)g * (size_t)ldy + 16 * c)       \
                                   : _mm512_setzero_ps();                                        \
        for (int64_t i = 0; i < m; i++) {                                                        \
            if (i + AHEAD < m)                                                                   \
                prefetch_row(row[i + AHEAD]);                                                    \
            float w4[4] = {0, 0, 0, 0};                                                          \
            int any = 0;                                                                         \
            for (int32_t g = 0; g < nq; g++)                                                     \
                any |= (w4[g] = p[(size_t)g * (size_t)ldp + (size_t)i]) != 0;                    \
            if (!any)                                                                            \
                continue;                                                                        \
            __VA_ARGS__;                                                                         \
            _Pragma("GCC unroll 4") for (int32_t g = 0; g < 4; g++) {                            \
                if (w4[g] == 0)                                                                  \
                    continue;                                                                    \
                const __m512 av = _mm512_set1_ps(w4[g]);                                         \
                _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)                              \
                    acc[g][c] = _mm512_fmadd_ps(av, _mm512_load_ps(x + 16 * c), acc[g][c]);      \
            }                                                                                    \
        }                                                                                        \
        for (int32_t g = 0; g < nq; g++)                                                         \
            for (int c = 0; c < 4; c++)                                                          \
                _mm512_storeu_ps(y + (size_t)g * (size_t)ldy + 16 * c, acc[g][c]);               \
    } while (0)

TARGET void kvq_kvc_lkq_mix_avx512(const float *p, int32_t nq, int64_t ldp,
                                   const uint8_t *const *row, const int8_t *bits, int64_t m,
                                   int32_t n, float *y, int64_t ldy)
{
    _Alignas(64) float x[512];
    float a[64], s, z;
    if (fast_shape(nq, n)) {
        lkq_mix_fast(p, nq, ldp, row, bits, m, n, y, ldy);
        return;
    }
    if (n == 64 && nq <= 4) {
        MIX64_REGS({
            meta(row[i], &s, &z);
            lkq_decode(row[i], n, bits[i], x);
            const __m512 sv = _mm512_set1_ps(s), zv = _mm512_set1_ps(z);
            for (int32_t t = 0; t < n; t += 16)
                _mm512_store_ps(x + t, _mm512_sub_ps(_mm512_mul_ps(sv, _mm512_load_ps(x + t)), zv));
        });
        return;
    }
    for (int64_t i = 0; i < m; i++) {
        if (i + AHEAD < m)
            prefetch_row(row[i + AHEAD]);
        int any = 0;
        for (int32_t g = 0; g < nq; g++)
            any |= (a[g] = p[(size_t)g * (size_t)ldp + (size_t)i]) != 0;
        if (!any)
            continue;
        meta(row[i], &s, &z);
        lkq_decode(row[i], n, bits[i], x);
        const __m512 sv = _mm512_set1_ps(s), zv = _mm512_set1_ps(z);
        for (int32_t t = 0; t < n; t += 16)
            _mm512_store_ps(x + t, _mm512_sub_ps(_mm512_mul_ps(sv, _mm512_load_ps(x + t)), zv));
        mix_rows(a, nq, x, n, y, ldy);
    }
}

/* ---- PATS ---- */

/* Where the fields of one width lie: per 16 elements, the byte offsets of the 32-bit
 * words that hold them and the shifts. c / B by (c * ceil(2^16 / B)) >> 16, exact for
 * c < 512 and B >= 32 (w <= 16). */
typedef struct pats_layout {
    int32_t b, vbmi;
    __m512i off[32], sh[32];
    /* with AVX512-VBMI, no gather: the chunk's 16 words are permuted out of its first
     * block blk0[k] and the next (when two[k]) by byte indices idx[k] */
    __m512i idx[32];
    int32_t blk0[32], two[32];
} pats_layout;

static int vbmi_cached = -1;

/* Whether the CPU has AVX512-VBMI (vpermi2b), computed once. */
static int has_vbmi(void)
{
    int v = __atomic_load_n(&vbmi_cached, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512vbmi") ? 1 : 0;
        __atomic_store_n(&vbmi_cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

int kvq_kvc_avx512_vbmi(int on)
{
    vbmi_cached = -1;
    const int have = has_vbmi();
    __atomic_store_n(&vbmi_cached, on && have, __ATOMIC_RELAXED);
    return have;
}

TARGET static void pats_layout_make(pats_layout *L, int32_t b, int32_t n)
{
    const int32_t w = 16 - b, B = 512 / w, M = (65536 + B - 1) / B;
    L->b = b;
    for (int32_t k = 0; k < n / 16; k++) {
        const __m512i c = _mm512_add_epi32(_mm512_set1_epi32(16 * k),
                                           _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                             11, 12, 13, 14, 15));
        const __m512i blk = _mm512_srli_epi32(_mm512_mullo_epi32(c, _mm512_set1_epi32(M)), 16);
        const __m512i i = _mm512_sub_epi32(c, _mm512_mullo_epi32(blk, _mm512_set1_epi32(B)));
        const __m512i bit = _mm512_mullo_epi32(i, _mm512_set1_epi32(w));
        L->off[k] = _mm512_add_epi32(_mm512_slli_epi32(blk, 6), _mm512_srli_epi32(bit, 3));
        L->sh[k] = _mm512_and_si512(bit, _mm512_set1_epi32(7));
        /* bytes off - 64 blk0 + 0..3 of the two blocks (<= 130: no carry between bytes; a
         * field's own bytes are below 128, the rest is masked off) */
        L->blk0[k] = 16 * k / B;
        L->two[k] = (16 * k + 15) / B != L->blk0[k];
        const __m512i rel = _mm512_sub_epi32(L->off[k], _mm512_set1_epi32(64 * L->blk0[k]));
        L->idx[k] = _mm512_add_epi32(_mm512_mullo_epi32(rel, _mm512_set1_epi32(0x01010101)),
                                     _mm512_set1_epi32(0x03020100));
    }
    L->vbmi = has_vbmi();
}

#define TARGET_VBMI                                                                                \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx2,fma,f16c")))

TARGET_VBMI static void pats_decode_vbmi(const pats_layout *L, const uint8_t *r, int32_t n,
                                         float *x)
{
    const __m512i mask = _mm512_set1_epi32((1 << (16 - L->b)) - 1);
    const __m128i bs = _mm_cvtsi32_si128(L->b);
    for (int32_t k = 0; k < n / 16; k++) {
        const uint8_t *blk = r + 64 * (size_t)L->blk0[k];
        const __m512i b0 = _mm512_loadu_si512((const void *)blk);
        const __m512i b1 = L->two[k] ? _mm512_loadu_si512((const void *)(blk + 64))
                                     : _mm512_setzero_si512();
        const __m512i v = _mm512_permutex2var_epi8(b0, L->idx[k], b1);
        const __m512i f = _mm512_sll_epi32(_mm512_and_si512(_mm512_srlv_epi32(v, L->sh[k]), mask), bs);
        _mm512_store_ps(x + 16 * k, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(f)));
    }
}

/* The row's values as f32 into x [n]. */
TARGET static inline void pats_decode(const pats_layout *L, const uint8_t *r, int32_t n, float *x)
{
    if (L->vbmi) {
        pats_decode_vbmi(L, r, n, x);
        return;
    }
    const __m512i mask = _mm512_set1_epi32((1 << (16 - L->b)) - 1);
    const __m128i bs = _mm_cvtsi32_si128(L->b);
    for (int32_t k = 0; k < n / 16; k++) {
        const __m512i v = _mm512_i32gather_epi32(L->off[k], (const void *)r, 1);
        const __m512i f = _mm512_sll_epi32(_mm512_and_si512(_mm512_srlv_epi32(v, L->sh[k]), mask), bs);
        _mm512_store_ps(x + 16 * k, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(f)));
    }
}


/* ---- PATS rows of 64 or 128 elements, up to 8 queries, in registers (as LeanKV's
 * above): chunk k of a row decoded by vpermi2b (VBMI) or a gather, for the layout of
 * the row's width (made again when the width changes from one row to the next). */
/* Byte-aligned widths read as such: w = 8 (b = 8: element c is byte c of the row, its
 * f16 the byte << 8) and w = 16 (b = 0: the f16 values themselves, 32 to a block). */
#define PATS_CHUNK_ALIGNED(L, r, k)                                                              \
    ((L)->b == 8 ? _mm512_cvtph_ps(_mm256_slli_epi16(                                            \
                       _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)((r) + 16 * (k)))), \
                       8))                                                                       \
                 : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((r) + 32 * (k)))))
/* The layout of one width for rows of up to 128 elements (8 chunks). */
typedef struct pats_lay8 {
    int32_t b, blk0[8], two[8];
    __m512i off[8], sh[8], idx[8];
} pats_lay8;

/* T[b] for every width b among bits [m] (0..10), rows of n <= 128 elements: made before
 * the loops, so that no call inside them spills the sums held in registers. */
TARGET static void pats_lay8_all(const int8_t *bits, int64_t m, int32_t n, pats_lay8 *T)
{
    int seen[KVQ_PATS_WIDTHS] = {0};
    for (int64_t i = 0; i < m; i++)
        seen[bits[i]] = 1;
    for (int32_t b = 0; b < KVQ_PATS_WIDTHS; b++) {
        if (!seen[b])
            continue;
        pats_layout L;
        pats_layout_make(&L, b, n);
        T[b].b = b;
        for (int32_t k = 0; k < n / 16; k++) {
            T[b].blk0[k] = L.blk0[k], T[b].two[k] = L.two[k];
            T[b].off[k] = L.off[k], T[b].sh[k] = L.sh[k], T[b].idx[k] = L.idx[k];
        }
    }
}

/* The f16 field bits (32-bit lanes, shifted by sh) of a width as f32. */
#define PATS_F16(L, v, sh)                                                                       \
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_sll_epi32(                                      \
        _mm512_and_si512(_mm512_srlv_epi32(v, sh), _mm512_set1_epi32((1 << (16 - (L)->b)) - 1)), \
        _mm_cvtsi32_si128((L)->b))))

TARGET_VBMI INL __m512 pats_chunk_vbmi(const pats_lay8 *L, const uint8_t *r, int32_t k)
{
    if (L->b == 8 || L->b == 0)
        return PATS_CHUNK_ALIGNED(L, r, k);
    const uint8_t *blk = r + 64 * (size_t)L->blk0[k];
    const __m512i b0 = _mm512_loadu_si512((const void *)blk);
    const __m512i b1 = L->two[k] ? _mm512_loadu_si512((const void *)(blk + 64)) : _mm512_setzero_si512();
    return PATS_F16(L, _mm512_permutex2var_epi8(b0, L->idx[k], b1), L->sh[k]);
}

TARGET INL __m512 pats_chunk_gather(const pats_lay8 *L, const uint8_t *r, int32_t k)
{
    if (L->b == 8 || L->b == 0)
        return PATS_CHUNK_ALIGNED(L, r, k);
    return PATS_F16(L, _mm512_i32gather_epi32(L->off[k], (const void *)r, 1), L->sh[k]);
}

/* Defines the logits and mix of one decoding (SUF: vbmi or gather, under attribute ATTR). */
#define PATS_FAST(SUF, ATTR)                                                                     \
    ATTR INL void pats_logits16_##SUF(const pats_lay8 *T, const float *q, int32_t NQ,            \
                                      int64_t ldq, const uint8_t *const *row,                    \
                                      const int8_t *bits, int64_t i0, int64_t m, int32_t NC,     \
                                      float scale, float *out, int64_t ldo)                      \
    {                                                                                            \
        __m512 A[FAST_NQ][16];                                                                   \
        for (int r = 0; r < 16; r++) {                                                           \
            if (i0 + r + AHEAD < m)                                                              \
                prefetch_row(row[i0 + r + AHEAD]);                                               \
            const pats_lay8 *L = &T[bits[i0 + r]];                                               \
            const uint8_t *rp = row[i0 + r];                                                     \
            __m512 c[8];                                                                         \
            _Pragma("GCC unroll 8") for (int32_t k = 0; k < NC; k++) c[k] =                      \
                pats_chunk_##SUF(L, rp, k);                                                      \
            _Pragma("GCC unroll 8") for (int32_t g = 0; g < NQ; g++) {                           \
                const float *qg = q + (size_t)g * (size_t)ldq;                                   \
                __m512 acc = _mm512_setzero_ps();                                                \
                _Pragma("GCC unroll 8") for (int32_t k = 0; k < NC; k++)                         \
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * k), c[k], acc);              \
                A[g][r] = acc;                                                                   \
            }                                                                                    \
        }                                                                                        \
        _Pragma("GCC unroll 8") for (int32_t g = 0; g < NQ; g++)                                 \
            _mm512_storeu_ps(out + (size_t)g * (size_t)ldo + (size_t)i0,                         \
                             _mm512_mul_ps(_mm512_set1_ps(scale), reduce16x16(A[g])));          \
    }                                                                                            \
    ATTR static void pats_logits_fast_##SUF(const pats_lay8 *T, const float *q, int32_t nq,      \
                                            int64_t ldq, const uint8_t *const *row,              \
                                            const int8_t *bits, int64_t m, int32_t n,            \
                                            float scale, float *out, int64_t ldo)                \
    {                                                                                            \
        switch (nq) {                                                                            \
            PATS_LOGITS_NC(SUF, 1) PATS_LOGITS_NC(SUF, 2) PATS_LOGITS_NC(SUF, 3)                 \
            PATS_LOGITS_NC(SUF, 4) PATS_LOGITS_NC(SUF, 5) PATS_LOGITS_NC(SUF, 6)                 \
            PATS_LOGITS_NC(SUF, 7) PATS_LOGITS_NC(SUF, 8)                                        \
        default: break;                                                                          \
        }                                                                                        \
    }                                                                                            \
    ATTR static void pats_mix_fast_##SUF(const pats_lay8 *T, const float *p, int32_t nq,         \
                                         int64_t ldp, const uint8_t *const *row,                 \
                                         const int8_t *bits, int64_t m, int32_t n, float *y,     \
                                         int64_t ldy)                                            \
    {                                                                                            \
        switch (nq) {                                                                            \
            PATS_MIX_NC(SUF, 1) PATS_MIX_NC(SUF, 2) PATS_MIX_NC(SUF, 3) PATS_MIX_NC(SUF, 4)      \
            PATS_MIX_NC(SUF, 5) PATS_MIX_NC(SUF, 6) PATS_MIX_NC(SUF, 7) PATS_MIX_NC(SUF, 8)      \
        default: break;                                                                          \
        }                                                                                        \
    }

#define PATS_LOGITS_NC(SUF, NQ)                                                                  \
    case NQ:                                                                                     \
        for (int64_t i = 0; i + 16 <= m; i += 16)                                                \
            if (n == 64)                                                                         \
                pats_logits16_##SUF(T, q, NQ, ldq, row, bits, i, m, 4, scale, out, ldo);         \
            else                                                                                 \
                pats_logits16_##SUF(T, q, NQ, ldq, row, bits, i, m, 8, scale, out, ldo);         \
        break;
#define PATS_MIX_NC(SUF, NQ)                                                                     \
    case NQ:                                                                                     \
        if (n == 64)                                                                             \
            MIX_FAST(NQ, 4, PATS_DEC_##SUF);                                                     \
        else                                                                                     \
            MIX_FAST(NQ, 8, PATS_DEC_##SUF);                                                     \
        break;
#define PATS_DEC_vbmi(rp, b, k) pats_chunk_vbmi(&T[b], rp, k)
#define PATS_DEC_gather(rp, b, k) pats_chunk_gather(&T[b], rp, k)
PATS_FAST(vbmi, TARGET_VBMI)
PATS_FAST(gather, TARGET)

TARGET void kvq_kvc_pats_logits_avx512(const float *q, int32_t nq, int64_t ldq,
                                       const uint8_t *const *row, const int8_t *bits, int64_t m,
                                       int32_t n, float scale, float *out, int64_t ldo)
{
    _Alignas(64) float x[512];
    pats_layout L;
    L.b = -1;
    int64_t i = 0;
    if (fast_shape(nq, n)) {
        pats_lay8 T[KVQ_PATS_WIDTHS];
        pats_lay8_all(bits, m - m % 16, n, T);
        if (has_vbmi())
            pats_logits_fast_vbmi(T, q, nq, ldq, row, bits, m, n, scale, out, ldo);
        else
            pats_logits_fast_gather(T, q, nq, ldq, row, bits, m, n, scale, out, ldo);
        i = m - m % 16;
    }
    if (nq <= BLK_NQ)
        for (; i + 16 <= m; i += 16) {
            const int64_t i0 = i;
            LOGITS16(({
                         if (bits[i0 + r] != L.b)
                             pats_layout_make(&L, bits[i0 + r], n);
                         pats_decode(&L, row[i0 + r], n, xb);
                     }),
                     _mm512_mul_ps(_mm512_set1_ps(scale), sums));
        }
    for (; i < m; i++) {
        if (i + AHEAD < m)
            prefetch_row(row[i + AHEAD]);
        if (bits[i] != L.b)
            pats_layout_make(&L, bits[i], n);
        pats_decode(&L, row[i], n, x);
        for (int32_t g = 0; g < nq; g++) {
            const float *qg = q + (size_t)g * (size_t)ldq;
            __m512 acc = _mm512_setzero_ps();
            for (int32_t t = 0; t < n; t += 16)
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + t), _mm512_load_ps(x + t), acc);
            out[(size_t)g * (size_t)ldo + (size_t)i] = scale * reduce16(acc);
        }
    }
}

TARGET void kvq_kvc_pats_mix_avx512(const float *p, int32_t nq, int64_t ldp,
                                    const uint8_t *const *row, const int8_t *bits, int64_t m,
                                    int32_t n, float *y, int64_t ldy)
{
    _Alignas(64) float x[512];
    float a[64];
    pats_layout L;
    L.b = -1;
    if (fast_shape(nq, n)) {
        pats_lay8 T[KVQ_PATS_WIDTHS];
        pats_lay8_all(bits, m, n, T);
        if (has_vbmi())
            pats_mix_fast_vbmi(T, p, nq, ldp, row, bits, m, n, y, ldy);
        else
            pats_mix_fast_gather(T, p, nq, ldp, row, bits, m, n, y, ldy);
        return;
    }
    if (n == 64 && nq <= 4) {
        MIX64_REGS({
            if (bits[i] != L.b)
                pats_layout_make(&L, bits[i], n);
            pats_decode(&L, row[i], n, x);
        });
        return;
    }
    for (int64_t i = 0; i < m; i++) {
        if (i + AHEAD < m)
            prefetch_row(row[i + AHEAD]);
        int any = 0;
        for (int32_t g = 0; g < nq; g++)
            any |= (a[g] = p[(size_t)g * (size_t)ldp + (size_t)i]) != 0;
        if (!any)
            continue;
        if (bits[i] != L.b)
            pats_layout_make(&L, bits[i], n);
        pats_decode(&L, row[i], n, x);
        mix_rows(a, nq, x, n, y, ldy);
    }
}

#endif /* KVQ_RK_HAVE_X86 */
