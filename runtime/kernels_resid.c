/*
 * kernels_resid.c — the residual stage scored by the best head of the GQA group
 * (kvq_rk_resid_scores_max, runtime/rk.h; rerank_resid.c under --resid-group max).
 *
 * Session 6 scored that rule as gs passes of kvq_rk_resid_scores, one per query head,
 * each reading every candidate's packed signs and scale again (gathered rows: the
 * reads are most of the cost). Here one pass reads a candidate's record once and looks
 * its bytes up in each head's sign table, each head's sum in the order of
 * kvq_rk_resid_scores (so the same bits), and keeps the best head's score as
 * rerank_resid.c did (strictly greater replaces). The scalar loop is the reference;
 * the interleaved loop (every ISA but scalar) and the AVX-512 path
 * (kernels_resid_avx512.c) give its bits (tests/test_resid_max.c).
 */
#include <stddef.h>
#include <stdint.h>

#include "kvq/runtime.h"
#include "runtime/kernels_simd.h"
#include "runtime/rk.h"

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

/* Two candidates at a time, up to four heads per pass over their bytes (eight sums in
 * flight, each in the reference's order), rows prefetched 16 candidates ahead. */
#define HB 4
static void max_x2(const float *tab, int32_t gs, int32_t nb8, const uint8_t *bits,
                   const float *scale, const int32_t *tok, const float *first, size_t fs,
                   const int32_t *grp, int64_t n, float *out)
{
    const size_t tl = KVQ_RK_SIGN_TABLE_LEN(8 * (size_t)nb8);
    int64_t a = 0;
    for (; a + 2 <= n; a += 2) {
        for (int64_t l = a + 16; l < a + 18 && l < n; l++) {
            __builtin_prefetch(bits + (size_t)tok[l] * nb8);
            __builtin_prefetch(scale + tok[l]);
        }
        const uint8_t *b0 = bits + (size_t)tok[a] * nb8, *b1 = bits + (size_t)tok[a + 1] * nb8;
        const float a0 = scale[tok[a]], a1 = scale[tok[a + 1]];
        float best0 = 0.0f, best1 = 0.0f;
        for (int32_t h0 = 0; h0 < gs; h0 += HB) {
            const int32_t hc = gs - h0 < HB ? gs - h0 : HB;
            float s0[HB] = {0.0f, 0.0f, 0.0f, 0.0f}, s1[HB] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int32_t p = 0; p < nb8; p++) {
                const float *tp = tab + (size_t)h0 * tl + (size_t)p * 256;
                const uint8_t v0 = b0[p], v1 = b1[p];
                for (int32_t i = 0; i < hc; i++) {
                    s0[i] += tp[(size_t)i * tl + v0];
                    s1[i] += tp[(size_t)i * tl + v1];
                }
            }
            for (int32_t i = 0; i < hc; i++) {
                const int32_t h = h0 + i;
                const float w0 = a0 * s0[i], w1 = a1 * s1[i];
                const float v0 = first_of(first, fs, grp, h, a) + w0,
                            v1 = first_of(first, fs, grp, h, a + 1) + w1;
                best0 = h == 0 || v0 > best0 ? v0 : best0;
                best1 = h == 0 || v1 > best1 ? v1 : best1;
            }
        }
        out[a] = best0;
        out[a + 1] = best1;
    }
    if (a < n)
        max_scalar(tab, gs, nb8, bits, scale, tok + a, first + (grp ? 0 : a), fs,
                   grp ? grp + a : NULL, n - a, out + a);
}
#undef HB

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
#endif
    /* the rest from candidate a: without grp, candidate a's scores are column a */
    const float *f = first + (grp ? 0 : a);
    const int32_t *g = grp ? grp + a : NULL;
    if (kvq_isa_clamp(isa) == KVQ_ISA_SCALAR)
        max_scalar(tab, gs, nb8, bits, scale, tok + a, f, fs, g, n - a, out + a);
    else
        max_x2(tab, gs, nb8, bits, scale, tok + a, f, fs, g, n - a, out + a);
}
