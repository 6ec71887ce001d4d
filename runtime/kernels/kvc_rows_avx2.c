/*
 * runtime/kernels/kvc_rows_avx2.c — the AVX2 readers of LeanKV and PATS rows
 * (kvc_rows_simd.h): two vectors of 8 floats (elements t % 16 < 8 and >= 8) are the 16
 * lanes of kvc_rows.h's sums, so the results are the scalar specification's bit for
 * bit. Codes are widened straight from the stored bytes (shifts by lane); PATS fields
 * are gathered from the 64-byte blocks and converted as f16.
 */
#include "runtime/kernels/kernels_simd.h"

#if KVQ_RK_HAVE_X86
#include <immintrin.h>
#include <string.h>

#include "runtime/kernels/kvc_rows_simd.h"

#define TARGET __attribute__((target("avx2,fma,f16c")))
#define AHEAD 8 /* rows prefetched ahead */

/* lanes 0..7 in lo, 8..15 in hi: kvc_rows.h's reduction */
TARGET static inline float reduce16(__m256 lo, __m256 hi)
{
    const __m256 s8 = _mm256_add_ps(lo, hi);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

TARGET static inline void meta(const uint8_t *r, float *s, float *z)
{
    uint16_t h[2];
    memcpy(h, r, 4);
    *s = _cvtsh_ss(h[0]);
    *z = _cvtsh_ss(h[1]);
}

/* Codes t0 .. t0 + 7 of a LeanKV row (bits 2, 4 or 8; t0 a multiple of 8). */
TARGET static inline __m256 codes8(const uint8_t *p, int32_t t0, int32_t bits)
{
    if (bits == 8)
        return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + t0))));
    if (bits == 4) {
        uint32_t w;
        memcpy(&w, p + t0 / 2, 4);
        const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        return _mm256_cvtepi32_ps(
            _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh), _mm256_set1_epi32(15)));
    }
    uint16_t w;
    memcpy(&w, p + t0 / 4, 2);
    const __m256i sh = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    return _mm256_cvtepi32_ps(
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh), _mm256_set1_epi32(3)));
}

/* The row's codes as floats into c [n]; bits other than 2, 4, 8 element by element. */
TARGET static inline void lkq_decode(const uint8_t *r, int32_t n, int32_t bits, float *c)
{
    const uint8_t *p = r + 4;
    if (bits == 8 || bits == 4 || bits == 2) {
        for (int32_t t = 0; t < n; t += 8)
            _mm256_store_ps(c + t, codes8(p, t, bits));
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

/* lanesum(q, x) over n (a multiple of 16). */
TARGET static inline float lanesum(const float *q, const float *x, int32_t n)
{
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int32_t t = 0; t < n; t += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + t), _mm256_load_ps(x + t), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + t + 8), _mm256_load_ps(x + t + 8), hi);
    }
    return reduce16(lo, hi);
}


/* ---- Rows of 64 or 128 elements, up to 8 queries: each row decoded into registers and
 * multiplied in (no row buffer), the loops unrolled per query count NQ and vector count
 * NV (always_inline bodies instantiated per pair); the same multiply-adds in the same
 * order as the general paths above. */
#define INL static inline __attribute__((always_inline))

/* Vector k (8 values s16 c - z16) of a LeanKV row. */
TARGET INL __m256 lkq_value8(const uint8_t *r, int32_t bits, int32_t k)
{
    float s, z;
    meta(r, &s, &z);
    __m256 c;
    if (bits == 8 || bits == 4 || bits == 2) {
        c = codes8(r + 4, 8 * k, bits);
    } else {
        _Alignas(32) float x[8];
        for (int32_t t = 0; t < 8; t++)
            x[t] = kvq_kvc_code_at(r + 4, 8 * k + t, bits);
        c = _mm256_load_ps(x);
    }
    return _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(s), c), _mm256_set1_ps(z));
}

/* Row i's logits for NQ queries, its codes in registers (NV vectors of 8). */
TARGET INL void lkq_logits_row(const float *q, int32_t NQ, int64_t ldq, const float *qsum,
                               const uint8_t *r, int32_t bits, int32_t NV, float scale,
                               float *out, int64_t ldo, int64_t i)
{
    float s, z;
    meta(r, &s, &z);
    __m256 c[16];
    if (bits == 8 || bits == 4 || bits == 2) {
        _Pragma("GCC unroll 16") for (int32_t k = 0; k < NV; k++) c[k] = codes8(r + 4, 8 * k, bits);
    } else {
        _Alignas(32) float x[128];
        lkq_decode(r, 8 * NV, bits, x);
        _Pragma("GCC unroll 16") for (int32_t k = 0; k < NV; k++) c[k] = _mm256_load_ps(x + 8 * k);
    }
    _Pragma("GCC unroll 8") for (int32_t g = 0; g < NQ; g++) {
        const float *qg = q + (size_t)g * (size_t)ldq;
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
        _Pragma("GCC unroll 8") for (int32_t k = 0; k < NV; k += 2) {
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(qg + 8 * k), c[k], lo);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(qg + 8 * k + 8), c[k + 1], hi);
        }
        const float t1 = s * reduce16(lo, hi), t2 = z * qsum[g];
        out[(size_t)g * (size_t)ldo + (size_t)i] = scale * (t1 - t2);
    }
}

/* The logits of rows [0, m): in blocks of 16, a block's rows of width 8, then 4, then
 * the others (each row's logits are its own: the order does not change them), so that
 * rows of mixed widths (LeanKV's HIGH and LOW keys) do not branch on each row's width. */
TARGET INL void lkq_logits_rows(const float *q, int32_t NQ, int64_t ldq, const float *qsum,
                                const uint8_t *const *row, const int8_t *bits, int64_t m,
                                int32_t NV, float scale, float *out, int64_t ldo)
{
    int64_t i0 = 0;
    for (; i0 + 16 <= m; i0 += 16) {
        for (int r = 0; r < 16; r++)
            if (i0 + r + AHEAD < m)
                prefetch_row(row[i0 + r + AHEAD]);
        const __m128i bv = _mm_loadu_si128((const __m128i *)(bits + i0));
        unsigned m8 = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(bv, _mm_set1_epi8(8)));
        unsigned m4 = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(bv, _mm_set1_epi8(4)));
        unsigned mo = 0xffffu & ~(m8 | m4);
        for (; m8; m8 &= m8 - 1) {
            const int64_t i = i0 + __builtin_ctz(m8);
            lkq_logits_row(q, NQ, ldq, qsum, row[i], 8, NV, scale, out, ldo, i);
        }
        for (; m4; m4 &= m4 - 1) {
            const int64_t i = i0 + __builtin_ctz(m4);
            lkq_logits_row(q, NQ, ldq, qsum, row[i], 4, NV, scale, out, ldo, i);
        }
        for (; mo; mo &= mo - 1) {
            const int64_t i = i0 + __builtin_ctz(mo);
            lkq_logits_row(q, NQ, ldq, qsum, row[i], bits[i], NV, scale, out, ldo, i);
        }
    }
    for (int64_t i = i0; i < m; i++) {
        if (i + AHEAD < m)
            prefetch_row(row[i + AHEAD]);
        lkq_logits_row(q, NQ, ldq, qsum, row[i], bits[i], NV, scale, out, ldo, i);
    }
}

#define LKQ_DEC(rp, b, k) lkq_value8(rp, b, k)
#define LKQ_FAST_CASE(NQ)                                                                        \
    case NQ:                                                                                     \
        if (mix) {                                                                               \
            if (n == 64)                                                                         \
                KVQ_KVC_MIX_FAST(__m256, 8, NQ, 8, 4, _mm256_loadu_ps, _mm256_storeu_ps,        \
                                 _mm256_set1_ps, _mm256_fmadd_ps, prefetch_row, LKQ_DEC);        \
            else                                                                                 \
                KVQ_KVC_MIX_FAST(__m256, 8, NQ, 16, 4, _mm256_loadu_ps, _mm256_storeu_ps,       \
                                 _mm256_set1_ps, _mm256_fmadd_ps, prefetch_row, LKQ_DEC);        \
            break;                                                                               \
        }                                                                                        \
        if (n == 64)                                                                             \
            lkq_logits_rows(q, NQ, ldq, qsum, row, bits, m, 8, scale, out, ldo);                 \
        else                                                                                     \
            lkq_logits_rows(q, NQ, ldq, qsum, row, bits, m, 16, scale, out, ldo);                \
        break;

/* The logits (mix 0: q, qsum, scale, out) of rows of 64 or 128 elements for 1..8
 * queries, or their mix (1: p, y) for 1..3; 0 when the shape is not one of these. */
TARGET static int lkq_fast(int mix, const float *q, const float *p, int32_t nq, int64_t ldq,
                           const float *qsum, const uint8_t *const *row, const int8_t *bits,
                           int64_t m, int32_t n, float scale, float *out, int64_t ldo, float *y)
{
    const int64_t ldp = ldq, ldy = ldo;
    if ((n != 64 && n != 128) || nq < 1 || nq > (mix ? 3 : 8))
        return 0; /* the mix of 4 or more queries: 16 registers hold too few sums */
    switch (nq) {
        LKQ_FAST_CASE(1) LKQ_FAST_CASE(2) LKQ_FAST_CASE(3) LKQ_FAST_CASE(4)
        LKQ_FAST_CASE(5) LKQ_FAST_CASE(6) LKQ_FAST_CASE(7) LKQ_FAST_CASE(8)
    default: break;
    }
    return 1;
}

TARGET void kvq_kvc_lkq_logits_avx2(const float *q, int32_t nq, int64_t ldq, const float *qsum,
                                    const uint8_t *const *row, const int8_t *bits, int64_t m,
                                    int32_t n, float scale, float *out, int64_t ldo)
{
    _Alignas(32) float c[512];
    float s, z;
    if (lkq_fast(0, q, NULL, nq, ldq, qsum, row, bits, m, n, scale, out, ldo, NULL))
        return;
    for (int64_t i = 0; i < m; i++) {
        if (i + AHEAD < m)
            prefetch_row(row[i + AHEAD]);
        meta(row[i], &s, &z);
        lkq_decode(row[i], n, bits[i], c);
        for (int32_t g = 0; g < nq; g++) {
            const float t1 = s * lanesum(q + (size_t)g * (size_t)ldq, c, n), t2 = z * qsum[g];
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
        const __m256 av = _mm256_set1_ps(a[g]);
        float *yg = y + (size_t)g * (size_t)ldy;
        for (int32_t t = 0; t < n; t += 8)
            _mm256_storeu_ps(yg + t, _mm256_fmadd_ps(av, _mm256_load_ps(xs + t),
                                                     _mm256_loadu_ps(yg + t)));
    }
}

TARGET void kvq_kvc_lkq_mix_avx2(const float *p, int32_t nq, int64_t ldp,
                                 const uint8_t *const *row, const int8_t *bits, int64_t m,
                                 int32_t n, float *y, int64_t ldy)
{
    _Alignas(32) float x[512];
    float a[64], s, z;
    if (lkq_fast(1, NULL, p, nq, ldp, NULL, row, bits, m, n, 0, NULL, ldy, y))
        return;
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
        const __m256 sv = _mm256_set1_ps(s), zv = _mm256_set1_ps(z);
        for (int32_t t = 0; t < n; t += 8)
            _mm256_store_ps(x + t, _mm256_sub_ps(_mm256_mul_ps(sv, _mm256_load_ps(x + t)), zv));
        mix_rows(a, nq, x, n, y, ldy);
    }
}

/* ---- PATS ---- */

/* Where the fields of one width lie (as in kvc_rows_avx512.c), per 8 elements. */
typedef struct pats_layout {
    int32_t b;
    __m256i off[64], sh[64];
} pats_layout;

TARGET static void pats_layout_make(pats_layout *L, int32_t b, int32_t n)
{
    const int32_t w = 16 - b, B = 512 / w, M = (65536 + B - 1) / B;
    L->b = b;
    for (int32_t k = 0; k < n / 8; k++) {
        const __m256i c = _mm256_add_epi32(_mm256_set1_epi32(8 * k),
                                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256i blk = _mm256_srli_epi32(_mm256_mullo_epi32(c, _mm256_set1_epi32(M)), 16);
        const __m256i i = _mm256_sub_epi32(c, _mm256_mullo_epi32(blk, _mm256_set1_epi32(B)));
        const __m256i bit = _mm256_mullo_epi32(i, _mm256_set1_epi32(w));
        L->off[k] = _mm256_add_epi32(_mm256_slli_epi32(blk, 6), _mm256_srli_epi32(bit, 3));
        L->sh[k] = _mm256_and_si256(bit, _mm256_set1_epi32(7));
    }
}

TARGET static inline void pats_decode(const pats_layout *L, const uint8_t *r, int32_t n, float *x)
{
    if (L->b == 8) { /* one byte a field, in order: element c is byte c, its f16 byte << 8 */
        for (int32_t k = 0; k < n / 8; k++)
            _mm256_store_ps(x + 8 * k, _mm256_cvtph_ps(_mm_slli_epi16(
                                           _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(r + 8 * k))), 8)));
        return;
    }
    if (L->b == 0) { /* the f16 values themselves, 32 to a block */
        for (int32_t k = 0; k < n / 8; k++)
            _mm256_store_ps(x + 8 * k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 16 * k))));
        return;
    }
    const __m256i mask = _mm256_set1_epi32((1 << (16 - L->b)) - 1);
    const __m128i bs = _mm_cvtsi32_si128(L->b);
    for (int32_t k = 0; k < n / 8; k++) {
        const __m256i v = _mm256_i32gather_epi32((const int *)(const void *)r, L->off[k], 1);
        const __m256i f = _mm256_sll_epi32(_mm256_and_si256(_mm256_srlv_epi32(v, L->sh[k]), mask), bs);
        const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(f), _mm256_extracti128_si256(f, 1));
        _mm256_store_ps(x + 8 * k, _mm256_cvtph_ps(h));
    }
}

TARGET void kvq_kvc_pats_logits_avx2(const float *q, int32_t nq, int64_t ldq,
                                     const uint8_t *const *row, const int8_t *bits, int64_t m,
                                     int32_t n, float scale, float *out, int64_t ldo)
{
    _Alignas(32) float x[512];
    pats_layout L;
    L.b = -1;
    for (int64_t i = 0; i < m; i++) {
        if (i + AHEAD < m)
            prefetch_row(row[i + AHEAD]);
        if (bits[i] != L.b)
            pats_layout_make(&L, bits[i], n);
        pats_decode(&L, row[i], n, x);
        for (int32_t g = 0; g < nq; g++)
            out[(size_t)g * (size_t)ldo + (size_t)i] =
                scale * lanesum(q + (size_t)g * (size_t)ldq, x, n);
    }
}

TARGET void kvq_kvc_pats_mix_avx2(const float *p, int32_t nq, int64_t ldp,
                                  const uint8_t *const *row, const int8_t *bits, int64_t m,
                                  int32_t n, float *y, int64_t ldy)
{
    _Alignas(32) float x[512];
    float a[64];
    pats_layout L;
    L.b = -1;
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
