/*
 * kernels_avx512.c — AVX-512 (F, BW, VL, DQ) paths of the retrieval kernels.
 *
 * Same contracts as the scalar references in kernels.c (see kernels_simd.h): score
 * gather, keys, compaction and emission give the same bits; LUT, logits, softmax and
 * mix agree within the tolerances of kvq/runtime.h (float sums in a different order,
 * a polynomial exp). Tails are handled with masked loads and stores.
 */
#include "runtime/kernels/kernels_simd.h"

#if KVQ_RK_HAVE_X86
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "runtime/kernels/kernels.h"

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

static inline TARGET __mmask16 tail16(int64_t left)
{
    return left <= 0    ? (__mmask16)0
           : left >= 16 ? (__mmask16)0xffff
                        : (__mmask16)((1u << left) - 1u);
}

/* Loads and stores of 16 lanes under a tail mask, plain where the mask is full. On AMD
 * Zen 5 (the CI machine since session 10) a masked load of a streamed row is several
 * times slower than a plain one, and the hardware prefetcher does not follow a stream of
 * them: full attention's logits over a 128K-token f16 cache ran at 3 GB/s with every
 * load masked, below the AVX2 path (bench_decode, docs/BENCHMARKS.md "A new machine:
 * masked loads on AMD Zen 5"). The lanes read are the same either way, so the results are the same bits. */
static inline TARGET __m512 ldu_ps(__mmask16 m, const float *p)
{
    return m == (__mmask16)0xffff ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}
static inline TARGET __m256i ldu_epi16(__mmask16 m, const uint16_t *p)
{
    return m == (__mmask16)0xffff ? _mm256_loadu_si256((const __m256i *)(const void *)p)
                                  : _mm256_maskz_loadu_epi16(m, p);
}
static inline TARGET __m512i ldu_epi32(__mmask16 m, const void *p)
{
    return m == (__mmask16)0xffff ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi32(m, p);
}
static inline TARGET void stu_ps(float *p, __mmask16 m, __m512 v)
{
    if (m == (__mmask16)0xffff)
        _mm512_storeu_ps(p, v);
    else
        _mm512_mask_storeu_ps(p, m, v);
}
static inline TARGET void stu_epi32(void *p, __mmask16 m, __m512i v)
{
    if (m == (__mmask16)0xffff)
        _mm512_storeu_si512(p, v);
    else
        _mm512_mask_storeu_epi32(p, m, v);
}

/* 16 elements of a row (f16 or f32) starting at t, masked, as f32. */
static inline TARGET __m512 load16(const void *row, int f16, int64_t t, __mmask16 m)
{
    if (f16)
        return _mm512_cvtph_ps(ldu_epi16(m, (const uint16_t *)row + t));
    return ldu_ps(m, (const float *)row + t);
}

static inline TARGET const void *row_ptr(const void *base, int f16, int64_t ld, int64_t r)
{
    return f16 ? (const void *)((const uint16_t *)base + r * ld)
               : (const void *)((const float *)base + r * ld);
}

/* ---- LUT ------------------------------------------------------------------------------ */

TARGET void kvq_rk_lut_avx512(const float *qp, const uint16_t *CT, int32_t G, int32_t dg, int32_t K,
                              float *lut)
{
    for (int32_t g = 0; g < G; g++) {
        float *L = lut + (size_t)g * K;
        const uint16_t *T = CT + (size_t)g * dg * K;
        const float *q = qp + (size_t)g * dg;
        memset(L, 0, sizeof(float) * (size_t)K);
        /* Four table rows per sweep over the K accumulators (in L1). */
        int32_t t = 0;
        for (; t < dg; t += 4) {
            const int nr = dg - t < 4 ? dg - t : 4;
            const __m512 q0 = _mm512_set1_ps(q[t]);
            const __m512 q1 = _mm512_set1_ps(nr > 1 ? q[t + 1] : 0.0f);
            const __m512 q2 = _mm512_set1_ps(nr > 2 ? q[t + 2] : 0.0f);
            const __m512 q3 = _mm512_set1_ps(nr > 3 ? q[t + 3] : 0.0f);
            const uint16_t *r0 = T + (size_t)t * K;
            const uint16_t *r1 = nr > 1 ? r0 + K : r0, *r2 = nr > 2 ? r0 + 2 * (size_t)K : r0;
            const uint16_t *r3 = nr > 3 ? r0 + 3 * (size_t)K : r0;
            for (int32_t c = 0; c < K; c += 16) {
                const __mmask16 m = tail16(K - c);
                __m512 a = ldu_ps(m, L + c);
                a = _mm512_fmadd_ps(q0, _mm512_cvtph_ps(ldu_epi16(m, r0 + c)), a);
                a = _mm512_fmadd_ps(q1, _mm512_cvtph_ps(ldu_epi16(m, r1 + c)), a);
                a = _mm512_fmadd_ps(q2, _mm512_cvtph_ps(ldu_epi16(m, r2 + c)), a);
                a = _mm512_fmadd_ps(q3, _mm512_cvtph_ps(ldu_epi16(m, r3 + c)), a);
                stu_ps(L + c, m, a);
            }
        }
    }
}

/* kvq_rk_lut_avx512 for nq queries, eight at a time with their accumulators in
 * registers: per 16 codes, every table row converted once and multiplied into the
 * eight, in the order (and with the zero rows past dg) of the single-query loop. */
TARGET void kvq_rk_lut_multi_avx512(const float *qp, int32_t nq, const uint16_t *CT, int32_t G,
                                    int32_t dg, int32_t K, float *lut)
{
    const int32_t d = G * dg;
    for (int32_t g = 0; g < G; g++) {
        const uint16_t *T = CT + (size_t)g * dg * K;
        for (int32_t i0 = 0; i0 < nq; i0 += 8) {
            const int32_t m = nq - i0 < 8 ? nq - i0 : 8;
            const float *q[8];
            for (int32_t i = 0; i < 8; i++) /* past m: a repeat of the last, not stored */
                q[i] = qp + (size_t)(i0 + (i < m ? i : m - 1)) * d + (size_t)g * dg;
            for (int32_t c = 0; c < K; c += 16) {
                const __mmask16 mk = tail16(K - c);
                __m512 a[8];
                for (int32_t i = 0; i < 8; i++)
                    a[i] = _mm512_setzero_ps();
                for (int32_t t = 0; t < dg; t += 4) {
                    const int nr = dg - t < 4 ? dg - t : 4;
                    const uint16_t *r0 = T + (size_t)t * K + c;
                    const uint16_t *r1 = nr > 1 ? r0 + K : r0;
                    const uint16_t *r2 = nr > 2 ? r0 + 2 * (size_t)K : r0;
                    const uint16_t *r3 = nr > 3 ? r0 + 3 * (size_t)K : r0;
                    const __m512 w0 = _mm512_cvtph_ps(ldu_epi16(mk, r0));
                    const __m512 w1 = _mm512_cvtph_ps(ldu_epi16(mk, r1));
                    const __m512 w2 = _mm512_cvtph_ps(ldu_epi16(mk, r2));
                    const __m512 w3 = _mm512_cvtph_ps(ldu_epi16(mk, r3));
                    for (int32_t i = 0; i < 8; i++) {
                        a[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][t]), w0, a[i]);
                        a[i] = _mm512_fmadd_ps(_mm512_set1_ps(nr > 1 ? q[i][t + 1] : 0.0f), w1, a[i]);
                        a[i] = _mm512_fmadd_ps(_mm512_set1_ps(nr > 2 ? q[i][t + 2] : 0.0f), w2, a[i]);
                        a[i] = _mm512_fmadd_ps(_mm512_set1_ps(nr > 3 ? q[i][t + 3] : 0.0f), w3, a[i]);
                    }
                }
                for (int32_t i = 0; i < m; i++)
                    stu_ps(lut + (size_t)(i0 + i) * G * K + (size_t)g * K + c, mk, a[i]);
            }
        }
    }
}

/* ---- score gather ------------------------------------------------------------------------ */

TARGET void kvq_rk_score_avx512(const float *lut, int32_t G, int32_t K, const uint16_t *codes,
                                int64_t n, float *scores)
{
    int64_t j = 0;
    if (G == 1) {
        for (; j + 16 <= n; j += 16) {
            const __m512i ix =
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(codes + j)));
            /* 0 + x, as the reference sums from 0 (turns -0 into +0 like it does) */
            const __m512 s = _mm512_add_ps(_mm512_setzero_ps(), _mm512_i32gather_ps(ix, lut, 4));
            _mm512_storeu_ps(scores + j, s);
        }
    } else {
        int32_t ix[16] __attribute__((aligned(64)));
        for (; j + 16 <= n; j += 16) {
            __m512 s = _mm512_setzero_ps();
            for (int32_t g = 0; g < G; g++) {
                for (int l = 0; l < 16; l++)
                    ix[l] = g * K + codes[(size_t)(j + l) * G + g];
                s = _mm512_add_ps(s, _mm512_i32gather_ps(_mm512_load_si512(ix), lut, 4));
            }
            _mm512_storeu_ps(scores + j, s);
        }
    }
    for (; j < n; j++)
        scores[j] = kvq_rk_score_one(lut, G, K, codes + (size_t)j * G);
}

/* ---- top-k scans ---------------------------------------------------------------------------- */

/* Stores the lanes of x selected by sel, packed, at out (popcount(sel) elements): a
 * compress in registers and a masked store, which on the cores measured runs several
 * times faster than the compress-to-memory form. Returns the count. */
static inline TARGET int64_t compress_store(uint32_t *out, __mmask16 sel, __m512i x)
{
    const int c = __builtin_popcount((unsigned)sel);
    stu_epi32(out, (__mmask16)((1u << c) - 1u), _mm512_maskz_compress_epi32(sel, x));
    return c;
}

static inline TARGET __m512i keys16(__m512 x)
{
    const __m512i u = _mm512_castps_si512(_mm512_add_ps(x, _mm512_setzero_ps()));
    const __m512i flip =
        _mm512_or_si512(_mm512_srai_epi32(u, 31), _mm512_set1_epi32((int)0x80000000u));
    return _mm512_xor_si512(u, flip);
}

TARGET void kvq_rk_keyhist_avx512(const float *scores, int64_t n, uint32_t *keys, uint32_t *hist)
{
    int64_t j = 0;
    for (; j < n; j += 16) {
        const __mmask16 m = tail16(n - j);
        stu_epi32(keys + j, m, keys16(ldu_ps(m, scores + j)));
    }
    kvq_rk_hist_top(keys, n, hist);
}

TARGET int64_t kvq_rk_compact_avx512(const uint32_t *keys, int64_t n, uint32_t digit, int shift,
                                     uint32_t mask, uint32_t *out)
{
    const __m512i want = _mm512_set1_epi32((int)digit), msk = _mm512_set1_epi32((int)mask);
    const __m128i sh = _mm_cvtsi32_si128(shift);
    int64_t m = 0;
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 valid = tail16(n - j);
        const __m512i k = ldu_epi32(valid, keys + j);
        const __m512i dg = _mm512_and_si512(_mm512_srl_epi32(k, sh), msk);
        const __mmask16 hit = _mm512_mask_cmpeq_epi32_mask(valid, dg, want);
        m += compress_store(out + m, hit, k);
    }
    return m;
}

/* The lowest `t` set bits of x (t < popcount(x)). */
static inline uint32_t lowest_bits(uint32_t x, int64_t t)
{
    uint32_t r = 0;
    for (; t > 0; t--) {
        const uint32_t b = x & (~x + 1u);
        r |= b;
        x ^= b;
    }
    return r;
}

/* The lanes of eq taken as ties: the lowest *ties of them (all when fewer); *ties goes
 * down by as many. */
static inline uint32_t take_ties(uint32_t eq, int64_t *ties)
{
    if (!eq || *ties <= 0)
        return 0;
    const int cnt = __builtin_popcount(eq);
    if (cnt > *ties)
        eq = lowest_bits(eq, *ties);
    *ties -= cnt > *ties ? *ties : cnt;
    return eq;
}

/* The emission step of the 16 keys k (lanes `valid`) of tokens j .. j+15 against the
 * threshold tv: every key above it, and keys equal to it while *ties lasts, appended to
 * idx[m..]; returns the new count. */
static inline TARGET int64_t emit16(__m512i k, __mmask16 valid, __m512i tv, int64_t j,
                                    int64_t *ties, int32_t *idx, int64_t m)
{
    const uint32_t sel = _mm512_mask_cmpgt_epu32_mask(valid, k, tv) |
                         take_ties(_mm512_mask_cmpeq_epu32_mask(valid, k, tv), ties);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return m + compress_store((uint32_t *)idx + m, (__mmask16)sel,
                              _mm512_add_epi32(_mm512_set1_epi32((int)j), iota));
}

TARGET int64_t kvq_rk_emit_avx512(const uint32_t *keys, int64_t n, uint32_t T, int64_t ties,
                                  int32_t *idx)
{
    const __m512i tv = _mm512_set1_epi32((int)T);
    int64_t m = 0;
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 valid = tail16(n - j);
        const __m512i k = ldu_epi32(valid, keys + j);
        m = emit16(k, valid, tv, j, &ties, idx, m);
    }
    return m;
}

TARGET int64_t kvq_rk_bracket_avx512(const float *scores, int64_t n, uint32_t lo, uint32_t hi,
                                     uint32_t *out, int64_t *above)
{
    const __m512i lov = _mm512_set1_epi32((int)lo), hiv = _mm512_set1_epi32((int)hi);
    int64_t m = 0, a = 0;
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 valid = tail16(n - j);
        const __m512i k = keys16(ldu_ps(valid, scores + j));
        const __mmask16 gt = _mm512_mask_cmpgt_epu32_mask(valid, k, hiv);
        const __mmask16 in = _mm512_mask_cmpge_epu32_mask(valid, k, lov) & ~gt;
        a += __builtin_popcount((unsigned)gt);
        m += compress_store(out + m, in, k);
    }
    *above = a;
    return m;
}

TARGET int64_t kvq_rk_emit_scores_avx512(const float *scores, int64_t n, uint32_t T, int64_t ties,
                                         int32_t *idx)
{
    const __m512i tv = _mm512_set1_epi32((int)T);
    int64_t m = 0;
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 valid = tail16(n - j);
        const __m512i k = keys16(ldu_ps(valid, scores + j));
        m = emit16(k, valid, tv, j, &ties, idx, m);
    }
    return m;
}

/* Emission from codes through a gather of each token's key: any K. */
static TARGET int64_t emit_codes_gather(const uint32_t *ktab, const uint16_t *codes, int64_t n,
                                        uint32_t T, int64_t ties, int32_t *idx)
{
    const __m512i tv = _mm512_set1_epi32((int)T);
    int64_t m = 0;
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 valid = tail16(n - j);
        const __m512i c = _mm512_cvtepu16_epi32(ldu_epi16(valid, codes + j));
        const __m512i k =
            _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, c, (const int *)ktab, 4);
        m = emit16(k, valid, tv, j, &ties, idx, m);
    }
    return m;
}

/* Codes per register-held bitmap: 8 registers of 16 words hold one bit per code for
 * K <= 4096. */
#define EMIT_BITMAP_MAX_K 4096

/* Emission from codes for K <= 4096 with at most one code whose key equals T: a bitmap
 * of the codes whose key exceeds T lives in 8 registers (128 words), and each token's
 * bit is found with two-table permutes (word = code >> 5, its bits 0-4 within a pair of
 * registers, bits 5-6 choosing the pair) and a variable shift; the tokens of the
 * boundary code bc (-1: none) are matched by comparing the codes. No memory access per
 * token besides its code: gathers run several times slower on the cores measured. */
static TARGET int64_t emit_codes_bitmap(const uint32_t *words, const uint16_t *codes, int64_t n,
                                        int32_t bc, int64_t ties, int64_t room, int32_t *idx)
{
    __m512i B[8];
    for (int i = 0; i < 8; i++)
        B[i] = _mm512_loadu_si512(words + 16 * i);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i b5 = _mm512_set1_epi32(32), b6 = _mm512_set1_epi32(64);
    const __m512i low5 = _mm512_set1_epi32(31), one = _mm512_set1_epi32(1);
    const __m512i bcv = _mm512_set1_epi32(bc);
    int64_t m = 0;
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 valid = tail16(n - j);
        const __m512i c = _mm512_cvtepu16_epi32(ldu_epi16(valid, codes + j));
        const __m512i w = _mm512_srli_epi32(c, 5);
        const __m512i p0 = _mm512_permutex2var_epi32(B[0], w, B[1]);
        const __m512i p1 = _mm512_permutex2var_epi32(B[2], w, B[3]);
        const __m512i p2 = _mm512_permutex2var_epi32(B[4], w, B[5]);
        const __m512i p3 = _mm512_permutex2var_epi32(B[6], w, B[7]);
        const __mmask16 m5 = _mm512_test_epi32_mask(w, b5), m6 = _mm512_test_epi32_mask(w, b6);
        const __m512i word = _mm512_mask_blend_epi32(m6, _mm512_mask_blend_epi32(m5, p0, p1),
                                                     _mm512_mask_blend_epi32(m5, p2, p3));
        const __m512i bit = _mm512_srlv_epi32(word, _mm512_and_si512(c, low5));
        uint32_t sel = _mm512_mask_test_epi32_mask(valid, bit, one);
        if (ties > 0)
            sel |= take_ties(_mm512_mask_cmpeq_epi32_mask(valid, c, bcv), &ties);
        const __m512i ix = _mm512_add_epi32(_mm512_set1_epi32((int)j), iota);
        if (m + 16 <= room) /* a plain store: masked ones cost more, and idx has room */
            _mm512_storeu_si512(idx + m, _mm512_maskz_compress_epi32((__mmask16)sel, ix));
        else
            compress_store((uint32_t *)idx + m, (__mmask16)sel, ix);
        m += __builtin_popcount(sel);
    }
    return m;
}

TARGET int64_t kvq_rk_emit_codes_avx512(const uint32_t *ktab, int32_t K, const uint16_t *codes,
                                        int64_t n, uint32_t T, int64_t ties, int64_t room,
                                        int32_t *idx)
{
    if (K <= EMIT_BITMAP_MAX_K) {
        /* the bitmap of the keys above T, and the codes whose key equals T */
        uint32_t words[EMIT_BITMAP_MAX_K / 32];
        memset(words, 0, sizeof words);
        const __m512i tv = _mm512_set1_epi32((int)T);
        int32_t bc = -1, n_eq = 0;
        for (int32_t c = 0; c < K; c += 16) {
            const __mmask16 v = tail16(K - c);
            const __m512i k = ldu_epi32(v, ktab + c);
            const uint32_t gt = _mm512_mask_cmpgt_epu32_mask(v, k, tv);
            const uint32_t eq = _mm512_mask_cmpeq_epu32_mask(v, k, tv);
            words[c >> 5] |= gt << (c & 16);
            if (eq) {
                bc = c + __builtin_ctz(eq);
                n_eq += __builtin_popcount(eq);
            }
        }
        if (n_eq <= 1)
            return emit_codes_bitmap(words, codes, n, bc, ties, room, idx);
    }
    return emit_codes_gather(ktab, codes, n, T, ties, idx);
}

/* ---- logits ---------------------------------------------------------------------------------- */

/* The four horizontal sums of a, b, c, d as one vector [sa, sb, sc, sd]. */
static inline TARGET __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d)
{
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    const __m512 y =
        _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
    const __m256 z = _mm256_add_ps(_mm512_castps512_ps256(y), _mm512_extractf32x8_ps(y, 1));
    return _mm_add_ps(_mm256_castps256_ps128(z), _mm256_extractf128_ps(z, 1));
}

#define PREFETCH_ROWS 16

/* The prefetch helpers are always inlined: GCC 12 judged a helper whose only statement
 * is __builtin_prefetch free of side effects, and where it was not inlined early (into
 * the always_inline mix_block) it deleted the calls as dead code: the weighted sum had
 * no prefetch at all (objdump), and read its scattered value rows at about half the
 * rate (the 128K bench_decode step, docs/BENCHMARKS.md, session 8). */
#define PF_INLINE __attribute__((always_inline))

static inline TARGET PF_INLINE void prefetch_row(const void *row, int64_t bytes)
{
    for (int64_t b = 0; b < bytes; b += 64)
        _mm_prefetch((const char *)row + b, _MM_HINT_T0);
}

/* Rows this far ahead go to L2 only (_MM_HINT_T1): scattered rows (the rerank's
 * candidates, the kept value rows, in sub-runs of a code's run) then have many more
 * misses in flight than the L1 fill buffers allow, and the near prefetch above finds
 * them in L2. In the 128K bench_decode step with the rerank (--preset smollm2) the
 * weighted sum over the kept value rows went from 3.5 to 2.4 ms with it. */
#define LOGITS_FAR 64
#define MIX_FAR 64

static inline TARGET PF_INLINE void prefetch_row_l2(const void *row, int64_t bytes)
{
    for (int64_t b = 0; b < bytes; b += 64)
        _mm_prefetch((const char *)row + b, _MM_HINT_T1);
}

/* Four rows against four query heads: acc[r][h] = the 16-lane partial sums of row r's
 * dot with head h's query, each K chunk loaded once and each q chunk once per four
 * rows (always inlined, so the arrays stay in registers). */
static inline TARGET __attribute__((always_inline)) void
dot4x4_acc(const float *const qh[4], const void *const row[4], int f16, int32_t d,
           __m512 acc[4][4])
{
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++)
            acc[r][h] = _mm512_setzero_ps();
    for (int32_t t = 0; t < d; t += 16) {
        const __mmask16 mk = tail16(d - t);
        __m512 k[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            k[r] = f16 ? _mm512_cvtph_ps(ldu_epi16(mk, (const uint16_t *)row[r] + t))
                       : ldu_ps(mk, (const float *)row[r] + t);
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            const __m512 q = ldu_ps(mk, qh[h] + t);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
                acc[r][h] = _mm512_fmadd_ps(q, k[r], acc[r][h]);
        }
    }
}

/* Four rows against four query heads (dot4x4_acc): logits [4 heads][4 rows] into s. */
static inline TARGET void dot4x4(const float *const qh[4], const void *const row[4], int f16,
                                 int32_t d, float s[4][4])
{
    __m512 acc[4][4];
    dot4x4_acc(qh, row, f16, d, acc);
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
        _mm_storeu_ps(s[r], hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
}

/* dot4x4's sums, reduced for four rows at once: each (row, head) sum is the tree of hsum4
 * (the same adds of the same operands, so the same bits), the rows' four vectors
 * combined across 128-bit lanes with two shuffles and an add per level instead of
 * narrowing each row's vector (extract, add, extract, add), and returned head-major:
 * lanes 4 h .. 4 h + 3 = rows 0..3 of head h, so the caller stores each head's four
 * logits as one 128-bit vector (not sixteen scalar stores). At d 64 (SmolLM2) the
 * reductions and stores were as much work as the multiply-adds: the rerank's logits
 * went from 1.6 to 1.3 ms in a stand-alone run of the 128K step's rows (docs/BENCHMARKS.md,
 * "The two-stage step against its floor"). */
static inline TARGET __m512 dot4x4_heads(const float *const qh[4], const void *const row[4],
                                         int f16, int32_t d)
{
    __m512 acc[4][4];
    dot4x4_acc(qh, row, f16, d, acc);
    /* per row, hsum4's first two levels: y[r] lane L (128 bits) = the four heads' sums
     * of their lanes 4 L .. 4 L + 3 */
    __m512 y[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(acc[r][0], acc[r][1]),
                                        _mm512_unpackhi_ps(acc[r][0], acc[r][1]));
        const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(acc[r][2], acc[r][3]),
                                        _mm512_unpackhi_ps(acc[r][2], acc[r][3]));
        y[r] = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
    }
    /* hsum4's z = lanes (0, 1) + lanes (2, 3), two rows a vector: [z0, z1] of rows 0, 1 */
    const __m512 z01 = _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x44),
                                     _mm512_shuffle_f32x4(y[0], y[1], 0xEE));
    const __m512 z23 = _mm512_add_ps(_mm512_shuffle_f32x4(y[2], y[3], 0x44),
                                     _mm512_shuffle_f32x4(y[2], y[3], 0xEE));
    /* and z's lane 0 + lane 1: lane r = row r's four heads */
    const __m512 rows = _mm512_add_ps(_mm512_shuffle_f32x4(z01, z23, 0x88),
                                      _mm512_shuffle_f32x4(z01, z23, 0xDD));
    return _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), rows);
}

TARGET void kvq_rk_logits_avx512(const float *q, int32_t nq, int32_t d, const void *K, int f16,
                                 int64_t ld_k, const int32_t *idx, int64_t m, float scale,
                                 float *logits, int64_t ld_l)
{
    const int64_t row_bytes = (int64_t)d * (f16 ? 2 : 4);
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int32_t hb = 0; hb < nq; hb += 4) {
        const int nh = nq - hb < 4 ? nq - hb : 4;
        /* Missing heads of a block repeat the first one; their sums are dropped. */
        const float *qh[4];
        for (int h = 0; h < 4; h++)
            qh[h] = q + (size_t)(hb + (h < nh ? h : 0)) * d;
        for (int64_t j = 0; j < m; j += 4) {
            const int nr = m - j < 4 ? (int)(m - j) : 4;
            const void *row[4];
            for (int r = 0; r < 4; r++) {
                const int64_t jj = j + (r < nr ? r : 0);
                row[r] = row_ptr(K, f16, ld_k, idx ? idx[jj] : jj);
            }
            if (idx)
                for (int64_t p = j + PREFETCH_ROWS; p < j + PREFETCH_ROWS + 4 && p < m; p++)
                    prefetch_row(row_ptr(K, f16, ld_k, idx[p]), row_bytes);
            else if (j + PREFETCH_ROWS < m) /* consecutive rows: the four a block ahead */
                prefetch_row(row_ptr(K, f16, ld_k, j + PREFETCH_ROWS),
                             (m - j - PREFETCH_ROWS < 4 ? m - j - PREFETCH_ROWS : 4) * row_bytes);
            if (idx && hb == 0)
                for (int64_t p = j + LOGITS_FAR; p < j + LOGITS_FAR + 4 && p < m; p++)
                    prefetch_row_l2(row_ptr(K, f16, ld_k, idx[p]), row_bytes);
            /* each logit times the scale, as one float multiply */
            const __m512 s = _mm512_mul_ps(dot4x4_heads(qh, row, f16, d), vscale);
            const __mmask8 rows_mask = (__mmask8)((1u << nr) - 1u);
            float *o = logits + (size_t)hb * ld_l + j;
            const __m128 s4[4] = {_mm512_castps512_ps128(s), _mm512_extractf32x4_ps(s, 1),
                                  _mm512_extractf32x4_ps(s, 2), _mm512_extractf32x4_ps(s, 3)};
            for (int h = 0; h < nh; h++) {
                if (nr == 4)
                    _mm_storeu_ps(o + (size_t)h * ld_l, s4[h]);
                else
                    _mm_mask_storeu_ps(o + (size_t)h * ld_l, rows_mask, s4[h]);
            }
        }
    }
}

/* ---- softmax --------------------------------------------------------------------------------- */

/* exp(x) for x <= 0 (inputs below -87 give exp(-87)): range reduction by ln 2 and a
 * degree-7 Taylor polynomial on |r| <= ln2/2 (truncation below 1e-8 relative). */
static inline TARGET __m512 exp16(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

TARGET void kvq_rk_softmax_avx512(float *x, int32_t rows, int64_t m, int64_t ld)
{
    for (int32_t r = 0; r < rows; r++) {
        float *v = x + (size_t)r * ld;
        __m512 mx = _mm512_set1_ps(v[0]);
        for (int64_t j = 0; j < m; j += 16) {
            const __mmask16 mk = tail16(m - j);
            mx = _mm512_mask_max_ps(mx, mk, mx, ldu_ps(mk, v + j));
        }
        const __m512 mxv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        __m512 sum = _mm512_setzero_ps();
        for (int64_t j = 0; j < m; j += 16) {
            const __mmask16 mk = tail16(m - j);
            const __m512 e = exp16(_mm512_sub_ps(ldu_ps(mk, v + j), mxv));
            stu_ps(v + j, mk, e);
            sum = _mm512_mask_add_ps(sum, mk, sum, e);
        }
        const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
        for (int64_t j = 0; j < m; j += 16) {
            const __mmask16 mk = tail16(m - j);
            stu_ps(v + j, mk, _mm512_mul_ps(ldu_ps(mk, v + j), inv));
        }
    }
}

/* ---- mix -------------------------------------------------------------------------------------- */

/* Blocks: 16 rows (they stay in L1 across the passes below), 4 heads, 64 dims: 16
 * accumulators live in registers while the block's rows stream through. */
#define MIX_ROWS 16

/* One block of rows [j0, j0 + jn) for the heads hb .. hb + NH - 1 (NH constant after
 * inlining: a group of 3 heads runs 12 multiply-adds a row, not 16 with a copy of the
 * first). Each head's accumulators take the same fused multiply-adds in the same order
 * whatever NH, so the outputs are the same bits. */
static inline TARGET __attribute__((always_inline)) void
mix_block(const float *p0, int64_t ld_p, const void *V, int f16, int64_t ld_v, const int32_t *idx,
          int64_t m, int64_t j0, int64_t jn, int32_t d, int32_t hb, int nh, const int NH,
          int64_t row_bytes, float *out)
{
    const float *ph[4];
    for (int h = 0; h < 4; h++)
        ph[h] = p0 + (size_t)(h < nh ? h : 0) * ld_p;
    for (int32_t t0 = 0; t0 < d; t0 += 64) {
        const __mmask16 m0 = tail16(d - t0), m1 = tail16(d - t0 - 16);
        const __mmask16 m2 = tail16(d - t0 - 32), m3 = tail16(d - t0 - 48);
        /* the 16 sums as named variables: an array of them (acc[h][c]) was kept on the
         * stack by the compiler, stored back every row */
        __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
        __m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
        __m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
        __m512 a30 = a00, a31 = a00, a32 = a00, a33 = a00;
        for (int64_t j = j0; j < j0 + jn; j++) {
            /* the row a block ahead, one per row consumed: prefetches spread
             * over the loop keep the fill buffers busy without bursts */
            if (idx && hb == 0 && t0 == 0 && j + MIX_ROWS < m)
                prefetch_row(row_ptr(V, f16, ld_v, idx[j + MIX_ROWS]), row_bytes);
            if (idx && hb == 0 && t0 == 0 && j + MIX_FAR < m)
                prefetch_row_l2(row_ptr(V, f16, ld_v, idx[j + MIX_FAR]), row_bytes);
            if (!idx && hb == 0 && t0 == 0 && j + MIX_ROWS < m)
                prefetch_row(row_ptr(V, f16, ld_v, j + MIX_ROWS), row_bytes);
            const void *row = row_ptr(V, f16, ld_v, idx ? idx[j] : j);
            const __m512 v0 = load16(row, f16, t0, m0);
            const __m512 v1 = d - t0 > 16 ? load16(row, f16, t0 + 16, m1) : v0;
            const __m512 v2 = d - t0 > 32 ? load16(row, f16, t0 + 32, m2) : v0;
            const __m512 v3 = d - t0 > 48 ? load16(row, f16, t0 + 48, m3) : v0;
            const __m512 w0 = _mm512_set1_ps(ph[0][j]);
            a00 = _mm512_fmadd_ps(w0, v0, a00);
            a01 = _mm512_fmadd_ps(w0, v1, a01);
            a02 = _mm512_fmadd_ps(w0, v2, a02);
            a03 = _mm512_fmadd_ps(w0, v3, a03);
            const __m512 w1 = _mm512_set1_ps(ph[1][j]);
            a10 = _mm512_fmadd_ps(w1, v0, a10);
            a11 = _mm512_fmadd_ps(w1, v1, a11);
            a12 = _mm512_fmadd_ps(w1, v2, a12);
            a13 = _mm512_fmadd_ps(w1, v3, a13);
            const __m512 w2 = _mm512_set1_ps(ph[2][j]);
            a20 = _mm512_fmadd_ps(w2, v0, a20);
            a21 = _mm512_fmadd_ps(w2, v1, a21);
            a22 = _mm512_fmadd_ps(w2, v2, a22);
            a23 = _mm512_fmadd_ps(w2, v3, a23);
            if (NH > 3) {
                const __m512 w3 = _mm512_set1_ps(ph[3][j]);
                a30 = _mm512_fmadd_ps(w3, v0, a30);
                a31 = _mm512_fmadd_ps(w3, v1, a31);
                a32 = _mm512_fmadd_ps(w3, v2, a32);
                a33 = _mm512_fmadd_ps(w3, v3, a33);
            }
        }
        const __mmask16 mk[4] = {m0, m1, m2, m3};
        /* out[h] += the head's sums (named: no array of them on the stack) */
#define MIX_OUT(h, c, acc)                                                                       \
    if ((h) < nh && (h) < NH && t0 + 16 * (c) < d) {                                             \
        float *o_ = out + (size_t)(hb + (h)) * d + t0 + 16 * (c);                                \
        stu_ps(o_, mk[c], _mm512_add_ps(ldu_ps(mk[c], o_), acc)); \
    }
        MIX_OUT(0, 0, a00) MIX_OUT(0, 1, a01) MIX_OUT(0, 2, a02) MIX_OUT(0, 3, a03)
        MIX_OUT(1, 0, a10) MIX_OUT(1, 1, a11) MIX_OUT(1, 2, a12) MIX_OUT(1, 3, a13)
        MIX_OUT(2, 0, a20) MIX_OUT(2, 1, a21) MIX_OUT(2, 2, a22) MIX_OUT(2, 3, a23)
        MIX_OUT(3, 0, a30) MIX_OUT(3, 1, a31) MIX_OUT(3, 2, a32) MIX_OUT(3, 3, a33)
#undef MIX_OUT
    }
}

TARGET void kvq_rk_mix_avx512(const float *p, int32_t nq, int64_t ld_p, const void *V, int f16,
                              int64_t ld_v, const int32_t *idx, int64_t m, int32_t d, float *out)
{
    const int64_t row_bytes = (int64_t)d * (f16 ? 2 : 4);
    memset(out, 0, sizeof(float) * (size_t)nq * d);
    for (int64_t j0 = 0; j0 < m; j0 += MIX_ROWS) {
        const int64_t jn = m - j0 < MIX_ROWS ? m - j0 : MIX_ROWS;
        for (int32_t hb = 0; hb < nq; hb += 4) {
            const int nh = nq - hb < 4 ? nq - hb : 4;
            const float *p0 = p + (size_t)hb * ld_p;
            if (nh == 3) /* gs 3 (SmolLM2): no fourth head computed and dropped */
                mix_block(p0, ld_p, V, f16, ld_v, idx, m, j0, jn, d, hb, nh, 3, row_bytes, out);
            else
                mix_block(p0, ld_p, V, f16, ld_v, idx, m, j0, jn, d, hb, nh, 4, row_bytes, out);
        }
    }
}

/* ---- fused attention ----------------------------------------------------------------------- */

/* Blocks of 16 rows: logits by dot4x4, the block's exponentials as one vector per head,
 * then the value rows (in L1 by then) into the running outputs. The next block's K and
 * V rows are prefetched while this one is computed. */
#define ATT_ROWS 16

TARGET void kvq_rk_attend_avx512(float *state, const float *q, int32_t nq, int32_t d, const void *K,
                                 int kf16, int64_t ld_k, const int32_t *kidx, const void *V,
                                 int vf16, int64_t ld_v, const int32_t *vidx, int64_t m,
                                 float scale)
{
    float *mx = state, *l = state + nq, *acc = state + 2 * nq;
    const int64_t kbytes = (int64_t)d * (kf16 ? 2 : 4), vbytes = (int64_t)d * (vf16 ? 2 : 4);
    float pw[4][ATT_ROWS] __attribute__((aligned(64)));
    for (int64_t j0 = 0; j0 < m; j0 += ATT_ROWS) {
        const int jn = m - j0 < ATT_ROWS ? (int)(m - j0) : ATT_ROWS;
        const __mmask16 valid = tail16(jn);
        const void *kr[ATT_ROWS], *vr[ATT_ROWS];
        for (int r = 0; r < ATT_ROWS; r++) {
            const int64_t jj = j0 + (r < jn ? r : 0);
            kr[r] = row_ptr(K, kf16, ld_k, kidx ? kidx[jj] : jj);
            vr[r] = row_ptr(V, vf16, ld_v, vidx ? vidx[jj] : jj);
        }
        for (int64_t p = j0 + ATT_ROWS; p < j0 + 2 * ATT_ROWS && p < m; p++) {
            if (kidx)
                prefetch_row(row_ptr(K, kf16, ld_k, kidx[p]), kbytes);
            if (vidx)
                prefetch_row(row_ptr(V, vf16, ld_v, vidx[p]), vbytes);
        }
        for (int32_t hb = 0; hb < nq; hb += 4) {
            const int nh = nq - hb < 4 ? nq - hb : 4;
            const float *qh[4];
            for (int h = 0; h < 4; h++)
                qh[h] = q + (size_t)(hb + (h < nh ? h : 0)) * d;
            float s[ATT_ROWS][4];
            for (int r = 0; r < ATT_ROWS; r += 4)
                dot4x4(qh, kr + r, kf16, d, s + r);
            for (int h = 0; h < 4; h++) {
                float lg[ATT_ROWS] __attribute__((aligned(64)));
                for (int r = 0; r < ATT_ROWS; r++)
                    lg[r] = s[r][h] * scale;
                if (h >= nh) {
                    _mm512_store_ps(pw[h], _mm512_setzero_ps());
                    continue;
                }
                const __m512 x = _mm512_load_ps(lg);
                const float bm = _mm512_mask_reduce_max_ps(valid, x);
                const float old = mx[hb + h], M = bm > old ? bm : old;
                const __m512 p =
                    _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(x, _mm512_set1_ps(M))));
                _mm512_store_ps(pw[h], p);
                if (M > old) { /* rescale what was summed under the old max */
                    const float f = old == -INFINITY ? 0.0f : expf(old - M);
                    l[hb + h] *= f;
                    float *o = acc + (size_t)(hb + h) * d;
                    const __m512 fv = _mm512_set1_ps(f);
                    for (int32_t t = 0; t < d; t += 16) {
                        const __mmask16 mk = tail16(d - t);
                        stu_ps(o + t, mk,
                                              _mm512_mul_ps(ldu_ps(mk, o + t), fv));
                    }
                    mx[hb + h] = M;
                }
                l[hb + h] += _mm512_reduce_add_ps(p);
            }
            float *o[4];
            for (int h = 0; h < 4; h++)
                o[h] = acc + (size_t)(hb + (h < nh ? h : 0)) * d;
            for (int32_t t = 0; t < d; t += 16) {
                const __mmask16 mk = tail16(d - t);
                __m512 a0 = ldu_ps(mk, o[0] + t),
                       a1 = ldu_ps(mk, o[1] + t);
                __m512 a2 = ldu_ps(mk, o[2] + t),
                       a3 = ldu_ps(mk, o[3] + t);
                for (int r = 0; r < jn; r++) {
                    const __m512 v = vf16 ? _mm512_cvtph_ps(ldu_epi16(
                                                mk, (const uint16_t *)vr[r] + t))
                                          : ldu_ps(mk, (const float *)vr[r] + t);
                    a0 = _mm512_fmadd_ps(_mm512_set1_ps(pw[0][r]), v, a0);
                    a1 = _mm512_fmadd_ps(_mm512_set1_ps(pw[1][r]), v, a1);
                    a2 = _mm512_fmadd_ps(_mm512_set1_ps(pw[2][r]), v, a2);
                    a3 = _mm512_fmadd_ps(_mm512_set1_ps(pw[3][r]), v, a3);
                }
                const __m512 a[4] = {a0, a1, a2, a3};
                for (int h = 0; h < nh; h++)
                    stu_ps(o[h] + t, mk, a[h]);
            }
        }
    }
}

/* Residual stage scores, 16 candidates per vector: per byte p of the packed signs, the
 * byte table's entry tab[p][v] = nib[2p][v & 15] + nib[2p + 1][v >> 4] is formed from the
 * two 16-entry nibble tables (one register each, _mm512_permutexvar_ps on the nibble: a
 * lane's index is its low four bits) with the same float add that built the byte table,
 * then summed over p from 0.0f in order, times the scale, plus first: the scalar path's
 * operations, so its bits. Four bytes of each of 16 rows per gather (nb8 % 4 == 0);
 * rows whose byte offset would pass INT32_MAX stop the vector loop. */
TARGET int64_t kvq_rk_resid_scores_avx512(const float *tab, int32_t nb8, const uint8_t *bits,
                                          const float *scale, const int32_t *tok,
                                          const float *first, int64_t n, float *out)
{
    if (nb8 % 4 != 0 || nb8 <= 0)
        return 0;
    const float *nib = tab + (size_t)nb8 * 256;
    const __m512i stride = _mm512_set1_epi32(nb8), lim = _mm512_set1_epi32(INT32_MAX / nb8 - 1);
    int64_t a = 0;
    for (; a + 16 <= n; a += 16) {
        const __m512i t = _mm512_loadu_si512((const void *)(tok + a));
        if (_mm512_cmpgt_epi32_mask(t, lim))
            break;
        for (int64_t l = a + 64; l < a + 80 && l < n; l++) { /* the rows 4 vectors ahead */
            __builtin_prefetch(bits + (size_t)tok[l] * nb8);
            __builtin_prefetch(scale + tok[l]);
        }
        const __m512i off = _mm512_mullo_epi32(t, stride);
        __m512 s = _mm512_setzero_ps();
        for (int32_t p4 = 0; p4 < nb8 / 4; p4++) {
            const __m512i x = _mm512_i32gather_epi32(off, (const void *)(bits + 4 * p4), 1);
            const float *nb = nib + (size_t)p4 * 128; /* bytes 4 p4 .. 4 p4 + 3: 8 nibbles */
#define KVQ_RESID_BYTE(i)                                                                       \
    do {                                                                                        \
        const __m512 lo = _mm512_permutexvar_ps(_mm512_srli_epi32(x, 8 * (i)),                  \
                                                _mm512_loadu_ps(nb + 32 * (i)));                \
        const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(x, 8 * (i) + 4),             \
                                                _mm512_loadu_ps(nb + 32 * (i) + 16));           \
        s = _mm512_add_ps(s, _mm512_add_ps(lo, hi));                                            \
    } while (0)
            KVQ_RESID_BYTE(0);
            KVQ_RESID_BYTE(1);
            KVQ_RESID_BYTE(2);
            KVQ_RESID_BYTE(3);
#undef KVQ_RESID_BYTE
        }
        const __m512 w = _mm512_mul_ps(_mm512_i32gather_ps(t, scale, 4), s);
        _mm512_storeu_ps(out + a, _mm512_add_ps(_mm512_loadu_ps(first + a), w));
    }
    return a;
}

#endif /* KVQ_RK_HAVE_X86 */
