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

#endif /* KVQ_RUNTIME_KVC_ROWS_SIMD_H */
