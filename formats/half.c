/*
 * half.c — f32 <-> f16 / bf16 scalar references and the run-time dispatch.
 *
 * The references work on the bit patterns with integer arithmetic only, so they do not
 * depend on the FPU's rounding mode, FTZ/DAZ flags or the compiler's float contraction.
 * NaN rules (the SIMD kernels do exactly the same, which is what F16C does):
 *   f32 -> f16   sign | 0x7e00 | top 9 payload bits (mantissa >> 13): quiet, payload kept
 *   f16 -> f32   sign | 0x7fc00000 | (mantissa << 13): quiet, payload kept
 *   f32 -> bf16  sign | 0x7fc0 | top 6 payload bits (bits >> 16 | 0x40)
 *   bf16 -> f32  (bits << 16) | 0x00400000: quiet, payload kept
 */
#include "kvq/half.h"

#include <string.h>

#include "kvq/common.h"
#include "formats/half_simd.h"


static uint32_t f32_bits(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static float bits_f32(uint32_t b)
{
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* ==========================================================================
 * scalar references
 * ========================================================================== */

uint16_t kvq_f32_to_f16_ref(float x)
{
    const uint32_t b = f32_bits(x);
    const uint32_t sign = (b >> 16) & 0x8000u;
    const uint32_t exp = (b >> 23) & 0xffu;
    const uint32_t man = b & 0x7fffffu;

    if (exp == 0xff) /* Inf or NaN */
        return (uint16_t)(sign | (man ? 0x7e00u | (man >> 13) : 0x7c00u));
    if (exp >= 143) /* |x| >= 2^16: beyond 65504 + half an ulp, so Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (exp >= 113) { /* f16 normal range, |x| >= 2^-14 */
        uint32_t h = ((exp - 112) << 10) | (man >> 13);
        const uint32_t rem = man & 0x1fffu;
        /* round to nearest even; a carry may step into the exponent, up to Inf */
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    if (exp < 102) /* |x| < 2^-25 (half the smallest subnormal): signed zero */
        return (uint16_t)sign;
    /* f16 subnormal: |x| = m * 2^(exp - 150), counted in units of 2^-24 */
    const uint32_t m = man | 0x800000u;
    const uint32_t shift = 126 - exp; /* 14..24 */
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u)))
        h++; /* may become 0x400, the smallest normal: still the right encoding */
    return (uint16_t)(sign | h);
}

float kvq_f16_to_f32_ref(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;

    if (exp == 0x1f)
        return bits_f32(sign | (man ? 0x7fc00000u | (man << 13) : 0x7f800000u));
    if (exp != 0)
        return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
    if (man == 0)
        return bits_f32(sign);
    /* subnormal: normalize so the leading one becomes the implicit bit */
    uint32_t e = 113;
    while (!(man & 0x400u)) {
        man <<= 1;
        e--;
    }
    return bits_f32(sign | (e << 23) | ((man & 0x3ffu) << 13));
}

uint16_t kvq_f32_to_bf16_ref(float x)
{
    const uint32_t b = f32_bits(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) /* NaN */
        return (uint16_t)((b >> 16) | 0x40u);
    /* round to nearest even on the low 16 bits; overflow carries into Inf */
    const uint32_t r = b + 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(r >> 16);
}

float kvq_bf16_to_f32_ref(uint16_t h)
{
    uint32_t b = (uint32_t)h << 16;
    if ((b & 0x7fffffffu) > 0x7f800000u)
        b |= 0x00400000u;
    return bits_f32(b);
}

/* ==========================================================================
 * array versions
 * ========================================================================== */

void kvq_f32_to_f16_scalar(const float *in, uint16_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = kvq_f32_to_f16_ref(in[i]);
}

void kvq_f16_to_f32_scalar(const uint16_t *in, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = kvq_f16_to_f32_ref(in[i]);
}

void kvq_f32_to_bf16_scalar(const float *in, uint16_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = kvq_f32_to_bf16_ref(in[i]);
}

void kvq_bf16_to_f32_scalar(const uint16_t *in, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = kvq_bf16_to_f32_ref(in[i]);
}

/* The CPU's features do not change while we run, so the answer is computed once
 * (cpuid can be slow under a hypervisor). Concurrent first calls compute the same
 * value; relaxed atomic loads and stores keep that race defined. */
int kvq_half_simd_level(void)
{
#if KVQ_HAVE_X86_SIMD
    static int cached = -1;
    int level = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (level < 0) {
        level = KVQ_SIMD_SCALAR;
        if (kvq_cpu_has_avx2()) /* includes F16C */
            level = kvq_cpu_has_avx512() ? KVQ_SIMD_AVX512 : KVQ_SIMD_AVX2;
        __atomic_store_n(&cached, level, __ATOMIC_RELAXED);
    }
    return level;
#else
    return KVQ_SIMD_SCALAR;
#endif
}

#if KVQ_HAVE_X86_SIMD
#define KVQ_DISPATCH(name, in, out, n)                                                   \
    do {                                                                                 \
        switch (kvq_half_simd_level()) {                                                 \
        case KVQ_SIMD_AVX512: name##_avx512(in, out, n); return;                         \
        case KVQ_SIMD_AVX2: name##_avx2(in, out, n); return;                             \
        default: name##_scalar(in, out, n); return;                                      \
        }                                                                                \
    } while (0)
#else
#define KVQ_DISPATCH(name, in, out, n) name##_scalar(in, out, n)
#endif

void kvq_f32_to_f16(const float *in, uint16_t *out, size_t n)
{
    KVQ_DISPATCH(kvq_f32_to_f16, in, out, n);
}

void kvq_f16_to_f32(const uint16_t *in, float *out, size_t n)
{
    KVQ_DISPATCH(kvq_f16_to_f32, in, out, n);
}

void kvq_f32_to_bf16(const float *in, uint16_t *out, size_t n)
{
    KVQ_DISPATCH(kvq_f32_to_bf16, in, out, n);
}

void kvq_bf16_to_f32(const uint16_t *in, float *out, size_t n)
{
    KVQ_DISPATCH(kvq_bf16_to_f32, in, out, n);
}
