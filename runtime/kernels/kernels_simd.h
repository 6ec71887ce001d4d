/*
 * runtime/kernels/kernels_simd.h — internal: the AVX2 and AVX-512 paths behind the kvq_rk_*
 * kernels of kvq/runtime.h. Not a public header.
 *
 * runtime/kernels/kernels.c dispatches to these with kvq_isa_clamp(); calling a path the CPU
 * cannot run is undefined. The intrinsics live only in kernels_avx2.c and
 * kernels_avx512.c, whose functions carry target attributes so that they also build
 * where the SIMD flags are not passed (the clang fuzz build compiles all sources in
 * one command).
 */
#ifndef KVQ_RUNTIME_KERNELS_SIMD_H
#define KVQ_RUNTIME_KERNELS_SIMD_H

#include <stddef.h>
#include <stdint.h>

#include <string.h>

/* hist[keys[j] >> 21] += 1 for j < n, counting into four interleaved copies: scores
 * crowd into a few bins, and one counter incremented back to back waits for its own
 * previous store. hist: [2048], added to. */
static inline void kvq_rk_hist_top(const uint32_t *keys, int64_t n, uint32_t *hist)
{
    uint32_t h4[4][2048];
    memset(h4, 0, sizeof h4);
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        h4[0][keys[j] >> 21]++;
        h4[1][keys[j + 1] >> 21]++;
        h4[2][keys[j + 2] >> 21]++;
        h4[3][keys[j + 3] >> 21]++;
    }
    for (; j < n; j++)
        h4[0][keys[j] >> 21]++;
    for (int b = 0; b < 2048; b++)
        hist[b] += h4[0][b] + h4[1][b] + h4[2][b] + h4[3][b];
}

#if defined(__x86_64__) && defined(__GNUC__)
#define KVQ_RK_HAVE_X86 1

/* One set per ISA X in {avx2, avx512}; the contracts are those of the public kernels,
 * on raw arrays:
 *   lut       lut[g*K + c] = sum_t qp[g*dg + t] * h2f(CT[(g*dg + t)*K + c])
 *   score     kvq_rk_score
 *   keyhist   keys[j] = kvq_rk_key(scores[j]); hist[keys[j] >> 21]++ (hist [2048],
 *             zeroed by the caller)
 *   compact   appends keys[j] with ((keys[j] >> shift) & mask) == digit to out, in
 *             order; returns the count (out may alias keys: it never runs ahead)
 *   emit      idx <- every j with keys[j] > T, and the first `ties` j with keys[j] == T,
 *             in increasing j; returns the count
 *   bracket   with key = kvq_rk_key(scores[j]): *above = #{key > hi}; appends the keys
 *             in [lo, hi] to out in order; returns their count
 *   emit_scores  emit with the keys computed from scores on the fly
 *   logits, softmax, mix, attend: kvq_rk_logits / kvq_rk_softmax / kvq_rk_mix /
 *             kvq_rk_attend_rows with f16 = 1 for f16 rows and 0 for f32 rows.
 * The attend state layout (kernels.c): per head h, state[h] = running max,
 * state[nq + h] = running sum, state[2 nq + h d ..] = running output [d]. */
#define KVQ_RK_DECLARE(X)                                                                          \
    void kvq_rk_lut_##X(const float *qp, const uint16_t *CT, int32_t G, int32_t dg, int32_t K,     \
                        float *lut);                                                               \
    void kvq_rk_score_##X(const float *lut, int32_t G, int32_t K, const uint16_t *codes,           \
                          int64_t n, float *scores);                                               \
    void kvq_rk_keyhist_##X(const float *scores, int64_t n, uint32_t *keys, uint32_t *hist);       \
    int64_t kvq_rk_compact_##X(const uint32_t *keys, int64_t n, uint32_t digit, int shift,         \
                               uint32_t mask, uint32_t *out);                                      \
    int64_t kvq_rk_emit_##X(const uint32_t *keys, int64_t n, uint32_t T, int64_t ties,             \
                            int32_t *idx);                                                         \
    int64_t kvq_rk_bracket_##X(const float *scores, int64_t n, uint32_t lo, uint32_t hi,           \
                               uint32_t *out, int64_t *above);                                     \
    int64_t kvq_rk_emit_scores_##X(const float *scores, int64_t n, uint32_t T, int64_t ties,       \
                                   int32_t *idx);                                                  \
    void kvq_rk_logits_##X(const float *q, int32_t nq, int32_t d, const void *K, int f16,          \
                           int64_t ld_k, const int32_t *idx, int64_t m, float scale,               \
                           float *logits, int64_t ld_l);                                           \
    void kvq_rk_softmax_##X(float *x, int32_t rows, int64_t m, int64_t ld);                        \
    void kvq_rk_mix_##X(const float *p, int32_t nq, int64_t ld_p, const void *V, int f16,          \
                        int64_t ld_v, const int32_t *idx, int64_t m, int32_t d, float *out);       \
    void kvq_rk_attend_##X(float *state, const float *q, int32_t nq, int32_t d, const void *K,     \
                           int kf16, int64_t ld_k, const int32_t *kidx, const void *V, int vf16,   \
                           int64_t ld_v, const int32_t *vidx, int64_t m, float scale);

KVQ_RK_DECLARE(avx2)
KVQ_RK_DECLARE(avx512)
#undef KVQ_RK_DECLARE

/* lut for nq queries at once (qp [nq, G dg] -> lut [nq, G K]): each entry computed as the
 * single-query lut computes it (the same multiply-adds in the same order, so the same
 * bits), the table converted once for all of them. The AVX2 path needs K % 8 == 0. */
void kvq_rk_lut_multi_avx2(const float *qp, int32_t nq, const uint16_t *CT, int32_t G,
                           int32_t dg, int32_t K, float *lut);
void kvq_rk_lut_multi_avx512(const float *qp, int32_t nq, const uint16_t *CT, int32_t G,
                             int32_t dg, int32_t K, float *lut);

/* AVX-512 only (AVX2 runs the scalar loop, kernels.c): emit with the key of token j
 * looked up as ktab[codes[j]] (ktab: [K]); idx holds `room` entries (at least the count
 * emitted), which lets it store whole vectors while they fit. */
int64_t kvq_rk_emit_codes_avx512(const uint32_t *ktab, int32_t K, const uint16_t *codes,
                                 int64_t n, uint32_t T, int64_t ties, int64_t room, int32_t *idx);

/* AVX-512 only: kvq_rk_resid_scores through the nibble tables that kvq_rk_sign_table
 * writes after the byte tables (the same bits as the scalar path; kernels.c). Returns
 * the candidates done (a multiple of 16 from the start; the caller does the rest). */
int64_t kvq_rk_resid_scores_avx512(const float *tab, int32_t nb8, const uint8_t *bits,
                                   const float *scale, const int32_t *tok, const float *first,
                                   int64_t n, float *out);
/* AVX-512 only: kvq_rk_resid_scores_max from the heads' nibble tables (resid.c
 * for the contract). Returns the candidates done, a multiple of 16 from the start. */
int64_t kvq_rk_resid_scores_max_avx512(const float *tab, int32_t gs, int32_t nb8,
                                       const uint8_t *bits, const float *scale,
                                       const int32_t *tok, const float *first, size_t fs,
                                       const int32_t *grp, int64_t n, float *out);
/* AVX2 only: the same through the nibble tables, 8 candidates a vector, nb8 == 8 or
 * nb8 % 16 == 0 (resid_avx2.c). Returns the candidates done, a multiple of 8. */
int64_t kvq_rk_resid_scores_max_avx2(const float *tab, int32_t gs, int32_t nb8,
                                     const uint8_t *bits, const float *scale, const int32_t *tok,
                                     const float *first, size_t fs, const int32_t *grp, int64_t n,
                                     float *out);

#else
#define KVQ_RK_HAVE_X86 0
#endif

#endif /* KVQ_RUNTIME_KERNELS_SIMD_H */
