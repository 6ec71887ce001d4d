/*
 * runtime/kernels/kernels.h — per-element logic of retrieval decoding, shared by the CPU
 * kernels (runtime/kernels/kernels*.c, runtime/select/select.c) and the CUDA kernels
 * (runtime/cuda/retrieval_cuda.cu). KVQ_HD is __host__ __device__ under nvcc and
 * nothing in C. Not a public header.
 *
 * These functions are the specification of the small steps: the CPU tests call them
 * directly (tests/test_runtime.c), the scalar references are written with them, and
 * the CUDA kernels call the same text. Plain C99/C++ only (no restrict, no libm
 * except where noted), so one text compiles in both.
 */
#ifndef KVQ_RUNTIME_KERNELS_H
#define KVQ_RUNTIME_KERNELS_H

#include <stdint.h>
#include <string.h>

#include "common/hd.h"

/* ---- f16 ----------------------------------------------------------------------- */

/* IEEE binary16 -> binary32, exact for every pattern (subnormals, Inf; NaN quieted with
 * its payload kept, as F16C does). Equal to kvq_f16_to_f32_ref bit for bit; written
 * here so that device code has it. */
KVQ_HD static inline float kvq_rk_h2f(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1fu) {
        bits = sign | (man ? 0x7fc00000u | (man << 13) : 0x7f800000u); /* NaN (quiet), Inf */
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13); /* normal: rebias 15 -> 127 */
    } else if (man == 0) {
        bits = sign; /* signed zero */
    } else {         /* subnormal: normalize */
        uint32_t e = 113u;
        while (!(man & 0x400u)) {
            man <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ---- ordering keys for selection ------------------------------------------------ */

/* Order-preserving map of a finite float to an unsigned key: a > b exactly when
 * key(a) > key(b); -0 and +0 get the same key. */
KVQ_HD static inline uint32_t kvq_rk_key(float x)
{
    uint32_t u;
    x += 0.0f; /* -0 -> +0 */
    memcpy(&u, &x, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Radix digits of a key for the three selection passes: bits 31..21, 20..10, 9..0. */
#define KVQ_RK_DIGIT_BITS0 11
#define KVQ_RK_DIGIT_BITS1 11
#define KVQ_RK_DIGIT_BITS2 10
#define KVQ_RK_HIST 2048 /* bins of the widest digit */

KVQ_HD static inline int kvq_rk_digit_shift(int pass)
{
    return pass == 0 ? 21 : pass == 1 ? 10 : 0;
}
KVQ_HD static inline uint32_t kvq_rk_digit_mask(int pass) { return pass == 2 ? 0x3ffu : 0x7ffu; }

/* ---- RoPE ------------------------------------------------------------------------- */

/* Dimensions of pair m of a head of d dims: layout 0 interleaved (2m, 2m+1), 1 half
 * (m, m + d/2); the kvq_rope_layout values. */
KVQ_HD static inline int kvq_rk_pair0(int layout, int d, int m) { return layout == 0 ? 2 * m : m; }
KVQ_HD static inline int kvq_rk_pair1(int layout, int d, int m)
{
    return layout == 0 ? 2 * m + 1 : m + d / 2;
}

/* Rotates x [d] by the cos/sin of one position (c, s: [d/2], the angle p * theta_m
 * rounded to float) into y [d] (may alias x): the arithmetic of kvq_rope_apply, so
 * rotated vectors equal the full-attention backend's bit for bit. */
KVQ_HD static inline void kvq_rk_rotate(const float *x, const float *c, const float *s, int layout,
                                        int d, float *y)
{
    for (int m = 0; m < d / 2; m++) {
        const int i0 = kvq_rk_pair0(layout, d, m), i1 = kvq_rk_pair1(layout, d, m);
        const float a = x[i0], b = x[i1];
        y[i0] = a * c[m] - b * s[m];
        y[i1] = a * s[m] + b * c[m];
    }
}

/* ---- scoring ------------------------------------------------------------------------ */

/* Approximate score of one token from its G codes and a LUT [G, K], summed over the
 * groups in order 0 .. G-1 in float: the sum kvq_codebook_score computes. */
KVQ_HD static inline float kvq_rk_score_one(const float *lut, int32_t G, int32_t K,
                                            const uint16_t *code)
{
    float s = 0.0f;
    for (int32_t g = 0; g < G; g++)
        s += lut[(int64_t)g * K + code[g]];
    return s;
}

/* Quest: the largest value q_c * k_c can take for k_c in [lo, hi]. */
KVQ_HD static inline float kvq_rk_quest_term(float q, float lo, float hi)
{
    const float a = q * lo, b = q * hi;
    return a > b ? a : b;
}

/* Fier: the 1-bit round-to-nearest code of x in a group whose channel spans
 * [lo, hi]: 1 for the upper level hi (x at least the midpoint), 0 for lo. */
KVQ_HD static inline int kvq_rk_fier_bit(float x, float lo, float hi)
{
    return (x - lo) * 2.0f >= (hi - lo);
}

/* Fier: score of one token from its packed bits [d/8] given the group's offset
 * a = q . lo and the per-channel step qs[c] = q_c (hi_c - lo_c): a + sum of qs over
 * the set bits, in channel order. Bit c is byte c/8, bit c%8. */
KVQ_HD static inline float kvq_rk_fier_score(const uint8_t *bits, const float *qs, float a, int d)
{
    float s = 0.0f;
    for (int c = 0; c < d; c++)
        if (bits[c >> 3] & (1u << (c & 7)))
            s += qs[c];
    return a + s;
}

#endif /* KVQ_RUNTIME_KERNELS_H */
