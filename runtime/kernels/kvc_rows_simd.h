/*
 * runtime/kernels/kvc_rows_simd.h — internal: the AVX2 and AVX-512 readers of the
 * compressed caches' rows (kvc_rows_avx2.c, kvc_rows_avx512.c) behind kvq_rk_lkq_logits,
 * kvq_rk_lkq_mix, kvq_rk_pats_logits and kvq_rk_pats_mix (kvc_rows.h, which states the
 * arithmetic they reproduce bit for bit). Called only for n a multiple of 16, n <= 512.
 */
#ifndef KVQ_RUNTIME_KVC_ROWS_SIMD_H
#define KVQ_RUNTIME_KVC_ROWS_SIMD_H

#include <stddef.h>
#include <stdint.h>

#define KVQ_KVC_DECLARE(X)                                                                        \
    void kvq_kvc_lkq_logits_##X(const float *q, int32_t nq, int64_t ldq, const float *qsum,                \
                        const uint8_t *const *row, const int8_t *bits, int64_t m, int32_t n,       \
                        float scale, float *out, int64_t ldo);                                     \
    void kvq_kvc_lkq_mix_##X(const float *p, int32_t nq, int64_t ldp, const uint8_t *const *row,           \
                     const int8_t *bits, int64_t m, int32_t n, float *y, int64_t ldy);             \
    void kvq_kvc_pats_logits_##X(const float *q, int32_t nq, int64_t ldq, const uint8_t *const *row,       \
                         const int8_t *bits, int64_t m, int32_t n, float scale, float *out,        \
                         int64_t ldo);                                                             \
    void kvq_kvc_pats_mix_##X(const float *p, int32_t nq, int64_t ldp, const uint8_t *const *row,          \
                      const int8_t *bits, int64_t m, int32_t n, float *y, int64_t ldy);

KVQ_KVC_DECLARE(avx2)
KVQ_KVC_DECLARE(avx512)

/* Tests only: the AVX-512 PATS reader uses vpermi2b when on and the CPU has
 * AVX512-VBMI, else gathers (the default: on). Returns whether the CPU has it. Not
 * thread-safe against running readers. */
int kvq_kvc_avx512_vbmi(int on);

/* Code t of a LeanKV row's codes (bits 1..8: at most two bytes hold it). */
static inline float kvq_kvc_code_at(const uint8_t *codes, int32_t t, int32_t bits)
{
    const uint64_t off = (uint64_t)t * (uint64_t)bits;
    uint32_t v = codes[off >> 3];
    if ((off & 7u) + (uint64_t)bits > 8)
        v |= (uint32_t)codes[(off >> 3) + 1] << 8;
    return (float)((v >> (off & 7u)) & ((1u << bits) - 1u));
}

/* The fast paths' mix (kvc_rows_avx2.c, kvc_rows_avx512.c), generic over the vector:
 * V its type of W floats, NQ queries (<= 8), NC vectors a row, column passes of CB (<= 4)
 * vectors over blocks of 64 rows (in L1 between the passes); the NQ CB sums of a pass in
 * registers, loaded from y and stored back; rows with every weight 0 skipped, a zero
 * weight's query skipped, each sum's multiply-adds in increasing row order (the general
 * paths' rule, so the same bits). DECODE(rp, b, k): vector k of row rp at width b.
 * Expects p, ldp, row, bits, m, y, ldy in scope. */
#define KVQ_KVC_MIX_FAST(V, W, NQ, NC, CB, LOADU, STOREU, SET1, FMA, PREFETCH, DECODE)            \
    do {                                                                                         \
        for (int64_t i0 = 0; i0 < m; i0 += 64) {                                                 \
            const int64_t i1 = i0 + 64 < m ? i0 + 64 : m;                                        \
            for (int32_t k0 = 0; k0 < (NC); k0 += (CB)) {                                        \
                V acc[8][4];                                                                     \
                _Pragma("GCC unroll 8") for (int32_t g = 0; g < (NQ); g++)                       \
                    _Pragma("GCC unroll 4") for (int32_t c = 0; c < (CB); c++)                   \
                        acc[g][c] = LOADU(y + (size_t)g * (size_t)ldy + (W) * (k0 + c));         \
                for (int64_t i = i0; i < i1; i++) {                                              \
                    if (k0 == 0 && i + 8 < m)                                                    \
                        PREFETCH(row[i + 8]);                                                    \
                    float w[8];                                                                  \
                    int any = 0;                                                                 \
                    _Pragma("GCC unroll 8") for (int32_t g = 0; g < (NQ); g++)                   \
                        any |= (w[g] = p[(size_t)g * (size_t)ldp + (size_t)i]) != 0;             \
                    if (!any)                                                                    \
                        continue;                                                                \
                    const uint8_t *rp = row[i];                                                  \
                    V x[4];                                                                      \
                    _Pragma("GCC unroll 4") for (int32_t c = 0; c < (CB); c++) x[c] =            \
                        DECODE(rp, bits[i], k0 + c);                                             \
                    _Pragma("GCC unroll 8") for (int32_t g = 0; g < (NQ); g++) {                 \
                        if (w[g] == 0)                                                           \
                            continue;                                                            \
                        const V av = SET1(w[g]);                                                 \
                        _Pragma("GCC unroll 4") for (int32_t c = 0; c < (CB); c++)               \
                            acc[g][c] = FMA(av, x[c], acc[g][c]);                                \
                    }                                                                            \
                }                                                                                \
                _Pragma("GCC unroll 8") for (int32_t g = 0; g < (NQ); g++)                       \
                    _Pragma("GCC unroll 4") for (int32_t c = 0; c < (CB); c++)                   \
                        STOREU(y + (size_t)g * (size_t)ldy + (W) * (k0 + c), acc[g][c]);         \
            }                                                                                    \
        }                                                                                        \
    } while (0)

#endif /* KVQ_RUNTIME_KVC_ROWS_SIMD_H */
