/*
 * resid.c — the residual stage scored by the best head of the GQA group
 * (kvq_rk_resid_scores_max, runtime/kernels/rk.h; select/codebook/resid.c under --resid-group max).
 *
 * Session 6 scored that rule as gs passes of kvq_rk_resid_scores, one per query head,
 * each reading every candidate's packed signs and scale again (gathered rows: the
 * reads are most of the cost). Here one pass reads a candidate's record once and looks
 * its bytes up in each head's sign table, each head's sum in the order of
 * kvq_rk_resid_scores (so the same bits), and keeps the best head's score as
 * select/codebook/resid.c did (strictly greater replaces). The scalar loop is the reference;
 * the interleaved loop (every ISA but scalar where the vector paths do not apply: eight
 * candidates, blocks of candidates scored head after head while their rows are in L1)
 * and the AVX2 and AVX-512 paths (resid_avx2.c, resid_avx512.c: nibble
 * tables in registers) give its bits (tests/test_resid_max.c).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvq/runtime.h"
#include "runtime/kernels/kernels_simd.h"
#include "runtime/kernels/rk.h"

/* Head h's first-stage score of candidate a. */
static inline float first_of(const float *first, size_t fs, const int32_t *grp, int32_t h,
                             int64_t a)
{
    return first[(size_t)h * fs + (size_t)(grp ? grp[a] : a)];
}

static void max_scalar(const float *tab, int32_t gs, int32_t nb8, const uint8_t *bits,
                       const float *scale, const int32_t *tok, const float *first, size_t fs,
                       const int32_t *grp, int64_t n, float *out)
{
    const size_t tl = KVQ_RK_SIGN_TABLE_LEN(8 * (size_t)nb8);
    for (int64_t a = 0; a < n; a++) {
        const uint8_t *b = bits + (size_t)tok[a] * nb8;
        float best = 0.0f;
        for (int32_t h = 0; h < gs; h++) {
            const float *th = tab + (size_t)h * tl;
            float s = 0.0f;
            for (int32_t p = 0; p < nb8; p++)
                s += th[(size_t)p * 256 + b[p]];
            const float w = scale[tok[a]] * s;
            const float v = first_of(first, fs, grp, h, a) + w;
            best = h == 0 || v > best ? v : best;
        }
        out[a] = best;
    }
}

/* Candidates in blocks of BLK, each block scored head after head, eight candidates at
 * a time (eight sums in flight, each in the reference's order; the rows prefetched 32
 * candidates ahead on the first head's pass), the best so far kept in a block array.
 * The block's rows (BLK nb8 bytes) and one head's byte table (nb8 KiB) stay in L1
 * together, where the gs heads' tables (64 KiB at d 128, gs 4) would not. */
#define BLK 256
#define IL 8
static void max_il(const float *tab, int32_t gs, int32_t nb8, const uint8_t *bits,
                   const float *scale, const int32_t *tok, const float *first, size_t fs,
                   const int32_t *grp, int64_t n, float *out)
{
    const size_t tl = KVQ_RK_SIGN_TABLE_LEN(8 * (size_t)nb8);
    float best[BLK];
    for (int64_t a0 = 0; a0 < n; a0 += BLK) {
        const int64_t m = n - a0 < BLK ? n - a0 : BLK;
        for (int32_t h = 0; h < gs; h++) {
            const float *th = tab + (size_t)h * tl;
            int64_t i = 0;
            for (; i + IL <= m; i += IL) {
                const int64_t a = a0 + i;
                for (int64_t l = a + 32; h == 0 && l < a + 32 + IL && l < n; l++) {
                    __builtin_prefetch(bits + (size_t)tok[l] * nb8);
                    __builtin_prefetch(scale + tok[l]);
                }
                /* named sums (not an array): kept in registers at -O2 */
                const uint8_t *b0 = bits + (size_t)tok[a] * nb8,
                              *b1 = bits + (size_t)tok[a + 1] * nb8,
                              *b2 = bits + (size_t)tok[a + 2] * nb8,
                              *b3 = bits + (size_t)tok[a + 3] * nb8,
                              *b4 = bits + (size_t)tok[a + 4] * nb8,
                              *b5 = bits + (size_t)tok[a + 5] * nb8,
                              *b6 = bits + (size_t)tok[a + 6] * nb8,
                              *b7 = bits + (size_t)tok[a + 7] * nb8;
                float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, s4 = 0.0f, s5 = 0.0f,
                      s6 = 0.0f, s7 = 0.0f;
                for (int32_t p = 0; p < nb8; p++) {
                    const float *t = th + (size_t)p * 256;
                    s0 += t[b0[p]];
                    s1 += t[b1[p]];
                    s2 += t[b2[p]];
                    s3 += t[b3[p]];
                    s4 += t[b4[p]];
                    s5 += t[b5[p]];
                    s6 += t[b6[p]];
                    s7 += t[b7[p]];
                }
                const float sm[IL] = {s0, s1, s2, s3, s4, s5, s6, s7};
                for (int c = 0; c < IL; c++) {
                    const float w = scale[tok[a + c]] * sm[c];
                    const float v = first_of(first, fs, grp, h, a + c) + w;
                    best[i + c] = h == 0 || v > best[i + c] ? v : best[i + c];
                }
            }
            for (; i < m; i++) {
                const int64_t a = a0 + i;
                const uint8_t *bb = bits + (size_t)tok[a] * nb8;
                float s1 = 0.0f;
                for (int32_t p = 0; p < nb8; p++)
                    s1 += th[(size_t)p * 256 + bb[p]];
                const float w = scale[tok[a]] * s1;
                const float v = first_of(first, fs, grp, h, a) + w;
                best[i] = h == 0 || v > best[i] ? v : best[i];
            }
        }
        memcpy(out + a0, best, sizeof(float) * (size_t)m);
    }
}
#undef IL
#undef BLK

void kvq_rk_resid_scores_max(kvq_isa isa, const float *tab, int32_t gs, int32_t nb8,
                             const uint8_t *bits, const float *scale, const int32_t *tok,
                             const float *first, size_t fs, const int32_t *grp, int64_t n,
                             float *out)
{
    if (n <= 0 || gs <= 0)
        return;
    int64_t a = 0;
#if KVQ_RK_HAVE_X86
    if (kvq_isa_clamp(isa) == KVQ_ISA_AVX512)
        a = kvq_rk_resid_scores_max_avx512(tab, gs, nb8, bits, scale, tok, first, fs, grp, n,
                                           out);
    if (kvq_isa_clamp(isa) == KVQ_ISA_AVX2)
        a = kvq_rk_resid_scores_max_avx2(tab, gs, nb8, bits, scale, tok, first, fs, grp, n, out);
#endif
    /* the rest from candidate a: without grp, candidate a's scores are column a */
    const float *f = first + (grp ? 0 : a);
    const int32_t *g = grp ? grp + a : NULL;
    if (kvq_isa_clamp(isa) == KVQ_ISA_SCALAR)
        max_scalar(tab, gs, nb8, bits, scale, tok + a, f, fs, g, n - a, out + a);
    else
        max_il(tab, gs, nb8, bits, scale, tok + a, f, fs, g, n - a, out + a);
}
