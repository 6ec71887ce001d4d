/*
 * quant_legacy.c — scalar reference dequantizers of ggml's 32-value block types
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and the reference Q8_0 quantizer used to write test
 * models. These loops are the specification the fast paths (quant_avx2.c,
 * quant_avx512.c) match bit for bit.
 *
 * Block layouts (no padding, any alignment; f16 fields little-endian):
 *   Q4_0  18 bytes: d f16, qs[16]            value[j] = d * ((qs[j] & 15) - 8),
 *                                            value[j + 16] = d * ((qs[j] >> 4) - 8)
 *   Q4_1  20 bytes: d f16, m f16, qs[16]     value = d * q + m, q as in Q4_0 without -8
 *   Q5_0  22 bytes: d f16, qh u32, qs[16]    q[j] = nibble as Q4_0 | bit j of qh << 4,
 *                                            value = d * (q - 16)
 *   Q5_1  24 bytes: d f16, m f16, qh u32, qs[16]   value = d * q + m
 *   Q8_0  34 bytes: d f16, q[32] int8        value = d * q
 * Each product and sum is rounded to f32 once, as in ggml.
 */
#include <math.h>
#include <string.h>

#include "formats/quant_simd.h"
#include "kvq/gguf.h"
#include "kvq/half.h"

enum { Q8_0_BLOCK = 32, Q8_0_BYTES = 34 };

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* d * q + m is two roundings, as in ggml; gcc -std=c11 never fuses */
#endif

static float f16_at(const uint8_t *p)
{
    return kvq_f16_to_f32_ref((uint16_t)(p[0] | (p[1] << 8)));
}

static uint32_t u32_at(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void kvq_dequant_q4_0_ref(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 32; b++, p += 18, out += 32) {
        const float d = f16_at(p);
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)((p[2 + j] & 0xF) - 8);
            out[j + 16] = d * (float)((p[2 + j] >> 4) - 8);
        }
    }
}

void kvq_dequant_q4_1_ref(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 32; b++, p += 20, out += 32) {
        const float d = f16_at(p), m = f16_at(p + 2);
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)(p[4 + j] & 0xF) + m;
            out[j + 16] = d * (float)(p[4 + j] >> 4) + m;
        }
    }
}

void kvq_dequant_q5_0_ref(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 32; b++, p += 22, out += 32) {
        const float d = f16_at(p);
        const uint32_t qh = u32_at(p + 2);
        for (int j = 0; j < 16; j++) {
            const int lo = (p[6 + j] & 0xF) | (int)((qh >> j) & 1) << 4;
            const int hi = (p[6 + j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            out[j] = d * (float)(lo - 16);
            out[j + 16] = d * (float)(hi - 16);
        }
    }
}

void kvq_dequant_q5_1_ref(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 32; b++, p += 24, out += 32) {
        const float d = f16_at(p), m = f16_at(p + 2);
        const uint32_t qh = u32_at(p + 4);
        for (int j = 0; j < 16; j++) {
            const int lo = (p[8 + j] & 0xF) | (int)((qh >> j) & 1) << 4;
            const int hi = (p[8 + j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            out[j] = d * (float)lo + m;
            out[j + 16] = d * (float)hi + m;
        }
    }
}

void kvq_dequant_q8_0_ref(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 32; b++, p += 34, out += 32) {
        const float d = f16_at(p);
        for (int i = 0; i < 32; i++)
            out[i] = d * (float)(int8_t)p[2 + i];
    }
}

void kvq_dequant_q8_0(const void *blocks, float *out, size_t n)
{
    kvq_quant_fast_kernel(KVQ_GGML_Q8_0)(blocks, out, n);
}
/* d = max|x| / 127 in f32, stored as f16; q = round-half-away(x / d) with the f32 d,
 * clamped to [-127, 127]. A block holding a NaN or Inf gets a NaN scale and zero
 * quants, so it dequantizes to NaN rather than to a plausible number. */
void kvq_quant_q8_0_ref(const float *in, void *blocks, size_t n)
{
    uint8_t *p = blocks;
    for (size_t b = 0; b < n / Q8_0_BLOCK; b++, p += Q8_0_BYTES, in += Q8_0_BLOCK) {
        float amax = 0.0f;
        int finite = 1;
        for (int i = 0; i < Q8_0_BLOCK; i++) {
            const float a = fabsf(in[i]);
            if (!isfinite(a))
                finite = 0;
            else if (a > amax)
                amax = a;
        }
        const float d = finite ? amax / 127.0f : NAN;
        const uint16_t d16 = finite ? kvq_f32_to_f16_ref(d) : (uint16_t)0x7e00;
        p[0] = (uint8_t)(d16 & 0xff);
        p[1] = (uint8_t)(d16 >> 8);
        for (int i = 0; i < Q8_0_BLOCK; i++) {
            long q = 0;
            if (finite && d > 0.0f) {
                q = lroundf(in[i] / d);
                q = q > 127 ? 127 : q < -127 ? -127 : q;
            }
            p[2 + i] = (uint8_t)(int8_t)q;
        }
    }
}
