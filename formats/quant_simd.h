/*
 * formats/quant_simd.h — internal: the per-type kernels behind kvq/quant.h. Not a
 * public header.
 *
 * A dequantization kernel turns n values (n / block_elems whole blocks, read at any
 * address) into out[n]. The _ref kernels are the specification (quant_legacy.c,
 * quant_k.c); the _avx2 / _avx512 ones (quant_avx2.c, quant_avx512.c) compute the
 * same bits and may only be called where kvq_half_simd_level() says the CPU can run
 * them. kvq_quant_kernel() is how quant.c dispatches and how the tests reach every
 * path the CPU has.
 */
#ifndef KVQ_FORMATS_QUANT_SIMD_H
#define KVQ_FORMATS_QUANT_SIMD_H

#include <stddef.h>
#include <stdint.h>

#include "formats/half_simd.h"

typedef void (*kvq_dequant_fn)(const void *blocks, float *out, size_t n);
/* f32 dot product of n values, in whatever order the kernel likes (see quant.h). */
typedef float (*kvq_dot_fn)(const float *a, const float *b, size_t n);

/* The kernel of a supported type at a SIMD level (KVQ_SIMD_*): SCALAR gives the
 * reference; a level with no kernel of its own for that type gives NULL. NULL for
 * unsupported types. */
kvq_dequant_fn kvq_quant_kernel(uint32_t type, int level);
/* The fastest kernel of a supported type this CPU runs (the reference if none). */
kvq_dequant_fn kvq_quant_fast_kernel(uint32_t type);
/* The dot kernel at a level (SCALAR: sequential f32), NULL if the level has none. */
kvq_dot_fn kvq_quant_dot_kernel(int level);
/* A fused tile product: dot(dequantize(blocks), x) over n values (whole blocks), equal
 * bit for bit to the level's fast dequantizer followed by its dot kernel. */
typedef float (*kvq_qdot_fn)(const void *blocks, const float *x, size_t n);
/* The fused kernel of a type at a level, NULL where there is none (then matvec
 * dequantizes a tile into a buffer and calls the dot kernel). */
kvq_qdot_fn kvq_quant_qdot_kernel(uint32_t type, int level);

/* scalar references: quant_legacy.c */
void kvq_dequant_q4_0_ref(const void *blocks, float *out, size_t n);
void kvq_dequant_q4_1_ref(const void *blocks, float *out, size_t n);
void kvq_dequant_q5_0_ref(const void *blocks, float *out, size_t n);
void kvq_dequant_q5_1_ref(const void *blocks, float *out, size_t n);
/* kvq_dequant_q8_0_ref is public (kvq/gguf.h) */

/* scalar references: quant_k.c */
void kvq_dequant_q2_k_ref(const void *blocks, float *out, size_t n);
void kvq_dequant_q3_k_ref(const void *blocks, float *out, size_t n);
void kvq_dequant_q4_k_ref(const void *blocks, float *out, size_t n);
void kvq_dequant_q5_k_ref(const void *blocks, float *out, size_t n);
void kvq_dequant_q6_k_ref(const void *blocks, float *out, size_t n);

/* Q4_K / Q5_K: the 8 six-bit scales and mins packed in 12 bytes (ggml's
 * get_scale_min_k4); shared by the reference and the fast paths. */
static inline void kvq_q4k_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *mn)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *mn = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Q3_K: the 16 six-bit scales packed in 12 bytes, as signed values (scale - 32). */
static inline void kvq_q3k_scales(const uint8_t *s, int8_t out[16])
{
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
        const int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        out[j] = (int8_t)((lo | hi << 4) - 32);
    }
}

#if KVQ_HAVE_X86_SIMD
void kvq_dequant_q4_0_avx2(const void *blocks, float *out, size_t n);
void kvq_dequant_q4_1_avx2(const void *blocks, float *out, size_t n);
void kvq_dequant_q5_0_avx2(const void *blocks, float *out, size_t n);
void kvq_dequant_q5_1_avx2(const void *blocks, float *out, size_t n);
void kvq_dequant_q2_k_avx2(const void *blocks, float *out, size_t n);
void kvq_dequant_q3_k_avx2(const void *blocks, float *out, size_t n);
void kvq_dequant_q4_k_avx2(const void *blocks, float *out, size_t n);
void kvq_dequant_q5_k_avx2(const void *blocks, float *out, size_t n);
void kvq_dequant_q6_k_avx2(const void *blocks, float *out, size_t n);
float kvq_dot_f32_avx2(const float *a, const float *b, size_t n);
float kvq_dot_f32_avx512(const float *a, const float *b, size_t n);
float kvq_qdot_q4_1_avx512(const void *blocks, const float *x, size_t n);
float kvq_qdot_q8_0_avx512(const void *blocks, const float *x, size_t n);
float kvq_qdot_q4_1_avx2(const void *blocks, const float *x, size_t n);
float kvq_qdot_q8_0_avx2(const void *blocks, const float *x, size_t n);
float kvq_qdot_q4_k_avx2(const void *blocks, const float *x, size_t n);
float kvq_qdot_q6_k_avx2(const void *blocks, const float *x, size_t n);
float kvq_qdot_q4_k_avx512(const void *blocks, const float *x, size_t n);
float kvq_qdot_q6_k_avx512(const void *blocks, const float *x, size_t n);
/* kvq_dequant_q8_0_avx2 / _avx512 are declared in formats/half_simd.h */
#endif

#endif
