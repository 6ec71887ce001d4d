/*
 * quant.c — ggml Q8_0 blocks: the scalar reference dequantizer, the dispatching fast
 * path, and the reference quantizer used to write test models.
 *
 * Block layout (34 bytes, no padding, any alignment):
 *   bytes 0..1   d, an IEEE binary16 scale (little-endian)
 *   bytes 2..33  q[32], int8
 * value[i] = f32(d) * q[i], rounded once to f32.
 */
#include <math.h>
#include <string.h>

#include "kvq/gguf.h"
#include "kvq/half.h"
#include "formats/half_simd.h"

enum { Q8_0_BLOCK = 32, Q8_0_BYTES = 34 };

void kvq_dequant_q8_0_ref(const void *blocks, float *out, size_t n)
{
    const uint8_t *p = blocks;
    for (size_t b = 0; b < n / Q8_0_BLOCK; b++, p += Q8_0_BYTES, out += Q8_0_BLOCK) {
        const float d = kvq_f16_to_f32_ref((uint16_t)(p[0] | (p[1] << 8)));
        for (int i = 0; i < Q8_0_BLOCK; i++)
            out[i] = d * (float)(int8_t)p[2 + i];
    }
}

void kvq_dequant_q8_0(const void *blocks, float *out, size_t n)
{
#if KVQ_HAVE_X86_SIMD
    switch (kvq_half_simd_level()) {
    case KVQ_SIMD_AVX512: kvq_dequant_q8_0_avx512(blocks, out, n); return;
    case KVQ_SIMD_AVX2: kvq_dequant_q8_0_avx2(blocks, out, n); return;
    default: break;
    }
#endif
    kvq_dequant_q8_0_ref(blocks, out, n);
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
