/*
 * quant_k.c — scalar reference dequantizers of ggml's 256-value "K" block types
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (QK_K = 256). These loops are the specification the
 * fast paths (quant_avx2.c) match bit for bit.
 *
 * Block layouts (no padding, any alignment; f16 fields little-endian). "Element e"
 * is value e of the block, 0..255.
 *   Q2_K  84 bytes: scales[16], qs[64], d f16, dmin f16
 *         e = 128h + 32s + l (h < 2, s < 4, l < 32): q = (qs[32h + l] >> 2s) & 3;
 *         sub-block e / 16 has scale byte sc: value = (d * (sc & 15)) * q - dmin * (sc >> 4)
 *   Q3_K  110 bytes: hmask[32], qs[64], scales[12], d f16
 *         low 2 bits as Q2_K; bit (e / 32) of hmask[l] clear subtracts 4;
 *         16 six-bit scales (kvq_q3k_scales), minus 32: value = (d * sc) * q
 *   Q4_K  144 bytes: d f16, dmin f16, scales[12], qs[128]
 *         e = 64c + 32k + l (c < 4, k < 2): q = (qs[32c + l] >> 4k) & 15; sub-block
 *         e / 32 has 6-bit sc, mn (kvq_q4k_scale_min): value = (d * sc) * q - dmin * mn
 *   Q5_K  176 bytes: d f16, dmin f16, scales[12], qh[32], qs[128]
 *         as Q4_K, q |= ((qh[l] >> (e / 32)) & 1) << 4
 *   Q6_K  210 bytes: ql[128], qh[64], scales[16] int8, d f16
 *         e = 128h + 64k + l (l < 64): low = (ql[64h + l] >> 4k) & 15; e = 128h + 32s + l
 *         (l < 32): high = (qh[32h + l] >> 2s) & 3; q = (low | high << 4) - 32;
 *         value = (d * scales[e / 16]) * q
 * Each product and difference is rounded to f32 once, in that order, as in ggml.
 */
#include <string.h>

#include "formats/quant_simd.h"
#include "kvq/half.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* a * q - b is two roundings, as in ggml */
#endif

static float f16_at(const uint8_t *p)
{
    return kvq_f16_to_f32_ref((uint16_t)(p[0] | (p[1] << 8)));
}

void kvq_dequant_q2_k_ref(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 256; b++, p += 84, out += 256) {
        const uint8_t *sc = p, *qs = p + 16;
        const float d = f16_at(p + 80), dmin = f16_at(p + 82);
        for (int e = 0; e < 256; e++) {
            const int h = e >> 7, s = (e >> 5) & 3, l = e & 31;
            const int q = (qs[32 * h + l] >> (2 * s)) & 3;
            const float dl = d * (float)(sc[e >> 4] & 0xF);
            const float ml = dmin * (float)(sc[e >> 4] >> 4);
            out[e] = dl * (float)q - ml;
        }
    }
}

void kvq_dequant_q3_k_ref(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 256; b++, p += 110, out += 256) {
        const uint8_t *hm = p, *qs = p + 32;
        const float d = f16_at(p + 108);
        int8_t sc[16];
        kvq_q3k_scales(p + 96, sc);
        for (int e = 0; e < 256; e++) {
            const int h = e >> 7, s = (e >> 5) & 3, l = e & 31;
            const int low = (qs[32 * h + l] >> (2 * s)) & 3;
            const int q = low - (((hm[l] >> (e >> 5)) & 1) ? 0 : 4);
            const float dl = d * (float)sc[e >> 4];
            out[e] = dl * (float)q;
        }
    }
}

/* Q4_K and Q5_K share everything but the fifth bit (qh NULL for Q4_K). */
static void dequant_q45_k(const uint8_t *p, const uint8_t *qh, const uint8_t *qs, float *out)
{
    const float d = f16_at(p), dmin = f16_at(p + 2);
    for (int e = 0; e < 256; e++) {
        const int c = e >> 6, k = (e >> 5) & 1, l = e & 31;
        int q = (qs[32 * c + l] >> (4 * k)) & 0xF;
        if (qh)
            q |= ((qh[l] >> (e >> 5)) & 1) << 4;
        uint8_t sc, mn;
        kvq_q4k_scale_min(p + 4, e >> 5, &sc, &mn);
        const float d1 = d * (float)sc, m1 = dmin * (float)mn;
        out[e] = d1 * (float)q - m1;
    }
}

void kvq_dequant_q4_k_ref(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 256; b++, p += 144, out += 256)
        dequant_q45_k(p, NULL, p + 16, out);
}

void kvq_dequant_q5_k_ref(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 256; b++, p += 176, out += 256)
        dequant_q45_k(p, p + 16, p + 48, out);
}

void kvq_dequant_q6_k_ref(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / 256; b++, p += 210, out += 256) {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        const float d = f16_at(p + 208);
        for (int e = 0; e < 256; e++) {
            const int h = e >> 7, k = (e >> 6) & 1, s = (e >> 5) & 3;
            const int low = (ql[64 * h + (e & 63)] >> (4 * k)) & 0xF;
            const int high = (qh[32 * h + (e & 31)] >> (2 * s)) & 3;
            const float dl = d * (float)sc[(e >> 4) + 0];
            out[e] = dl * (float)((low | high << 4) - 32);
        }
    }
}
