/*
 * resid_avx512.c — AVX-512 path of kvq_rk_resid_scores_max (runtime/kernels/rk.h,
 * resid.c): the residual stage by the best head, 16 candidates per vector.
 *
 * As kvq_rk_resid_scores_avx512 (kernels_avx512.c), per head: each byte's table entry
 * formed from that head's two 16-entry nibble tables (_mm512_permutexvar_ps on the
 * nibble) with the float add that built the byte table, summed over the bytes from 0.0f
 * in order, times the scale, plus the head's first-stage score: the scalar path's
 * operations, so its bits. What differs is that the 16 rows' bytes are gathered once
 * (four bytes a gather, kept for every head) and the scale once, and the heads run in
 * blocks of up to four (four sums in flight); the best head kept by a strict compare in
 * head order, as the reference. Where the 16 candidates are 16 consecutive records (a
 * run of rows in code order, as a selection over runs or the stage over every candidate
 * hands them over) their bytes come from one block of memory, transposed in registers
 * (contiguous: d 64 or 128 at 1 bit), instead of the gathers, and where they share one
 * group index (one (code, band) run) each head's first-stage entry is broadcast instead
 * of gathered: the same values, so the same bits; and each head's running sum takes e
 * as the FMA e 1 + s (exact product, one rounding: the add's bits) so that the adds that
 * form e and the sums' adds use different units (session 8: 8.2 -> 4.5 ns a candidate
 * at gs 4, d 128 over runs of rows, docs/BENCHMARKS.md).
 */
#include "runtime/kernels/kernels_simd.h"

#if KVQ_RK_HAVE_X86
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/kernels/rk.h"

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

/* Most gathers of one vector of candidates kept for the heads: nb8 / 4 <= 32 (d 512 at
 * 2 bits); larger rows are left to the caller's loop. */
#define MAX_X 32

/* Heads h0 .. h0 + hc - 1 (hc <= 4) of NV vectors of 16 candidates (hc and NV constants
 * after inlining), vector v's gathered bytes x[v] [nb8 / 4]: each head's score, the best
 * kept in best[v]. Each head's two nibble tables of a byte are loaded once for the NV
 * vectors (with one vector at a time the table loads, not the permutes, were the
 * kernel's limit: 128 of them per 16 candidates at gs 4, d 128); per (candidate, head)
 * the operations and their order do not depend on NV, so neither do the bits. */
static inline TARGET __attribute__((always_inline)) void
heads_nv(const float *nib0, size_t tl, int32_t nb8, __m512i x[][MAX_X], const __m512 *sc,
         const float *first, size_t fs, const int32_t *grp, const __m512i *g, const int64_t *g0,
         int64_t a, int32_t h0, const int hc, const int NV, __m512 *best)
{
    __m512 s[4][4];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            s[v][j] = _mm512_setzero_ps();
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int32_t p4 = 0; p4 < nb8 / 4; p4++) {
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m512i lo[4], hi[4];
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) {
                lo[v] = _mm512_srli_epi32(x[v][p4], 8 * i);
                hi[v] = _mm512_srli_epi32(x[v][p4], 8 * i + 4);
            }
#pragma GCC unroll 4
            for (int j = 0; j < hc; j++) {
                const float *nb = nib0 + (size_t)(h0 + j) * tl + (size_t)p4 * 128 + 32 * i;
                const __m512 tlo = _mm512_loadu_ps(nb), thi = _mm512_loadu_ps(nb + 16);
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++) {
                    const __m512 e = _mm512_add_ps(_mm512_permutexvar_ps(lo[v], tlo),
                                                   _mm512_permutexvar_ps(hi[v], thi));
                    s[v][j] = _mm512_fmadd_ps(e, one, s[v][j]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++)
#pragma GCC unroll 4
        for (int j = 0; j < hc; j++) {
            const float *fh = first + (size_t)(h0 + j) * fs;
            const __m512 f = g0[v] >= 0 ? _mm512_set1_ps(fh[g0[v]])
                             : grp     ? _mm512_i32gather_ps(g[v], fh, 4)
                                       : _mm512_loadu_ps(fh + a + 16 * v);
            const __m512 w = _mm512_add_ps(f, _mm512_mul_ps(sc[v], s[v][j]));
            const __mmask16 gt = _mm512_cmp_ps_mask(w, best[v], _CMP_GT_OQ);
            best[v] = h0 + j == 0 ? w : _mm512_mask_mov_ps(best[v], gt, w);
        }
}

/* The records of 16 consecutive rows p [16 nb8] (nb8 8 or 16: d 64 or 128 at 1 bit) as
 * the gathers lay them out: x[p4] lane r = bytes 4 p4 .. 4 p4 + 3 of row r (a transpose
 * of dwords in registers instead of nb8 / 4 gathers). */
static inline TARGET __attribute__((always_inline)) void contiguous(const uint8_t *p, int32_t nb8,
                                                                   __m512i *x)
{
    const __m512i r0 = _mm512_loadu_si512((const void *)p),
                  r1 = _mm512_loadu_si512((const void *)(p + 64));
    if (nb8 == 8) { /* row r's dwords at 2 r, 2 r + 1 of r0 | r1 */
        const __m512i e = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        x[0] = _mm512_permutex2var_epi32(r0, e, r1);
        x[1] = _mm512_permutex2var_epi32(r0, _mm512_add_epi32(e, _mm512_set1_epi32(1)), r1);
        return;
    }
    /* nb8 16: row r's dwords at 4 r .. 4 r + 3 of r0 | r1 (rows 0-7), r2 | r3 (rows 8-15);
     * pairs of dwords p gathered per half, then the halves' 256-bit lanes joined */
    const __m512i r2 = _mm512_loadu_si512((const void *)(p + 128)),
                  r3 = _mm512_loadu_si512((const void *)(p + 192));
    const __m512i i01 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29),
                  i23 = _mm512_add_epi32(i01, _mm512_set1_epi32(2));
    const __m512i a01 = _mm512_permutex2var_epi32(r0, i01, r1),
                  c01 = _mm512_permutex2var_epi32(r2, i01, r3),
                  a23 = _mm512_permutex2var_epi32(r0, i23, r1),
                  c23 = _mm512_permutex2var_epi32(r2, i23, r3);
    x[0] = _mm512_shuffle_i64x2(a01, c01, 0x44);
    x[1] = _mm512_shuffle_i64x2(a01, c01, 0xee);
    x[2] = _mm512_shuffle_i64x2(a23, c23, 0x44);
    x[3] = _mm512_shuffle_i64x2(a23, c23, 0xee);
}

/* One vector's inputs, candidates a .. a + 15: their records' bytes x [nb8 / 4] (one
 * block of memory for 16 consecutive records, else gathers), scales, groups g and the
 * one group g0 they share (-1 if not). 0 where a record's offset would pass INT32_MAX
 * (the caller's loop stops). */
static inline TARGET __attribute__((always_inline)) int
prep(int32_t nb8, const uint8_t *bits, const float *scale, const int32_t *tok, const int32_t *grp,
     int64_t n, int64_t a, __m512i *x, __m512 *sc, __m512i *g, int64_t *g0)
{
    const __m512i stride = _mm512_set1_epi32(nb8), lim = _mm512_set1_epi32(INT32_MAX / nb8 - 1);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i t = _mm512_loadu_si512((const void *)(tok + a));
    if (_mm512_cmpgt_epi32_mask(t, lim))
        return 0;
    const int32_t t0 = tok[a];
    if ((nb8 == 8 || nb8 == 16) &&
        _mm512_cmpeq_epi32_mask(t, _mm512_add_epi32(_mm512_set1_epi32(t0), iota)) == 0xffff) {
        /* 16 consecutive records (a run of rows): one block of memory */
        contiguous(bits + (size_t)t0 * nb8, nb8, x);
        *sc = _mm512_loadu_ps(scale + t0);
    } else {
        for (int64_t l = a + 64; l < a + 80 && l < n; l++) { /* the rows 4 vectors ahead */
            __builtin_prefetch(bits + (size_t)tok[l] * nb8);
            __builtin_prefetch(scale + tok[l]);
        }
        const __m512i off = _mm512_mullo_epi32(t, stride);
        for (int32_t p4 = 0; p4 < nb8 / 4; p4++)
            x[p4] = _mm512_i32gather_epi32(off, (const void *)(bits + 4 * p4), 1);
        *sc = _mm512_i32gather_ps(t, scale, 4);
    }
    *g = grp ? _mm512_loadu_si512((const void *)(grp + a)) : _mm512_setzero_si512();
    /* one group for the 16 (rows of one (code, band) run): its entries broadcast */
    *g0 = grp && _mm512_cmpeq_epi32_mask(*g, _mm512_set1_epi32(grp[a])) == 0xffff ? grp[a] : -1;
    return 1;
}

/* Vectors of candidates taken at once by heads_nv, where they are NV 16 consecutive
 * records (the stage over every candidate hands over runs of rows): 3.3 -> 2.3 ns a
 * candidate at gs 4, d 128 and 1.7 -> 1.3 at gs 3, d 64 (bench_resid, runs, Zen 5).
 * Gathered vectors stay one at a time (their gathers, not the table loads, dominate). */
#define NV 4

/* Whether candidates a .. a + 16 NV - 1 are NV 16 consecutive records whose byte
 * offsets stay under INT32_MAX (prep's contiguous case for each). */
static inline TARGET int consecutive(const int32_t *tok, int32_t nb8, int64_t a)
{
    const int32_t t0 = tok[a];
    if ((nb8 != 8 && nb8 != 16) || t0 < 0 || t0 > INT32_MAX / nb8 - 16 * NV)
        return 0;
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int v = 0; v < NV; v++) {
        const __m512i want = _mm512_add_epi32(_mm512_set1_epi32(t0 + 16 * v), iota);
        if (_mm512_cmpeq_epi32_mask(_mm512_loadu_si512((const void *)(tok + a + 16 * v)), want) !=
            0xffff)
            return 0;
    }
    return 1;
}

/* Every head of the group for nv vectors (heads_nv in blocks of four). */
static inline TARGET __attribute__((always_inline)) void
all_heads(const float *nib0, size_t tl, int32_t nb8, __m512i x[][MAX_X], const __m512 *sc,
          const float *first, size_t fs, const int32_t *grp, const __m512i *g, const int64_t *g0,
          int64_t a, int32_t gs, const int nv, __m512 *best)
{
    int32_t h0 = 0;
    for (; h0 + 4 <= gs; h0 += 4)
        heads_nv(nib0, tl, nb8, x, sc, first, fs, grp, g, g0, a, h0, 4, nv, best);
    switch (gs - h0) {
    case 3:
        heads_nv(nib0, tl, nb8, x, sc, first, fs, grp, g, g0, a, h0, 3, nv, best);
        break;
    case 2:
        heads_nv(nib0, tl, nb8, x, sc, first, fs, grp, g, g0, a, h0, 2, nv, best);
        break;
    case 1:
        heads_nv(nib0, tl, nb8, x, sc, first, fs, grp, g, g0, a, h0, 1, nv, best);
        break;
    default:
        break;
    }
}

TARGET int64_t kvq_rk_resid_scores_max_avx512(const float *tab, int32_t gs, int32_t nb8,
                                              const uint8_t *bits, const float *scale,
                                              const int32_t *tok, const float *first, size_t fs,
                                              const int32_t *grp, int64_t n, float *out)
{
    if (nb8 % 4 != 0 || nb8 <= 0 || nb8 / 4 > MAX_X || gs <= 0)
        return 0;
    const size_t tl = KVQ_RK_SIGN_TABLE_LEN(8 * (size_t)nb8);
    const float *nib0 = tab + (size_t)nb8 * 256; /* head h's nibble tables at nib0 + h tl */
    __m512i x[NV][MAX_X], g[NV];
    __m512 sc[NV], best[NV];
    int64_t g0[NV];
    int64_t a = 0;
    while (a + 16 <= n) {
        if (a + 16 * NV <= n && consecutive(tok, nb8, a)) {
            /* the block after next: its records, scales, groups and tokens (a cold cache's
             * rows arrive while this block is scored; the long loop body leaves the
             * hardware too little look-ahead of its own: without these the stage of the
             * 128K bench_decode step was slower than with one vector at a time). Each
             * address is a candidate's own record, scale or entry: none past an array. */
            const int64_t c0 = a + 2 * 16 * NV, c1 = c0 + 16 * NV < n ? c0 + 16 * NV : n;
            for (int64_t c = c0; c < c1; c += 64 / nb8)
                __builtin_prefetch(bits + (size_t)tok[c] * nb8);
            for (int64_t c = c0; c < c1; c += 16) {
                __builtin_prefetch(scale + tok[c]);
                __builtin_prefetch(tok + c);
                if (grp)
                    __builtin_prefetch(grp + c);
            }
            for (int v = 0; v < NV; v++)
                prep(nb8, bits, scale, tok, grp, n, a + 16 * v, x[v], &sc[v], &g[v], &g0[v]);
            all_heads(nib0, tl, nb8, x, sc, first, fs, grp, g, g0, a, gs, NV, best);
            for (int v = 0; v < NV; v++)
                _mm512_storeu_ps(out + a + 16 * v, best[v]);
            a += 16 * NV;
            continue;
        }
        if (!prep(nb8, bits, scale, tok, grp, n, a, x[0], &sc[0], &g[0], &g0[0]))
            break;
        all_heads(nib0, tl, nb8, x, sc, first, fs, grp, g, g0, a, gs, 1, best);
        _mm512_storeu_ps(out + a, best[0]);
        a += 16;
    }
    return a;
}

#endif /* KVQ_RK_HAVE_X86 */
