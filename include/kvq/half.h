/*
 * kvq/half.h — f32 <-> f16 (IEEE binary16) and f32 <-> bf16 conversions.
 *
 * The *_ref functions are the specification: round-to-nearest-even, NaN stays
 * NaN (quiet, sign kept), Inf stays Inf, f16 subnormals handled exactly, f32 values
 * below half the smallest f16 subnormal round to signed zero. The array versions
 * choose an F16C/AVX-512 path at run time and must agree with the references bit
 * for bit on every input (tests run all 65,536 16-bit patterns and f32 edge cases;
 * all 2^32 f32 patterns were checked once by hand). The references use integer
 * arithmetic only, so MXCSR rounding/FTZ/DAZ settings do not change them.
 *
 * NaN payloads, exactly (what F16C does, and what the SIMD bf16 paths copy):
 *   f32 -> f16    sign | 0x7e00 | (f32 mantissa >> 13)     quiet bit set, top 9 bits kept
 *   f16 -> f32    sign | 0x7fc00000 | (f16 mantissa << 13)  quiet bit set, payload kept
 *   f32 -> bf16   (f32 bits >> 16) | 0x0040                 quiet bit set, top 6 bits kept
 *   bf16 -> f32   (bf16 bits << 16) | 0x00400000            quiet bit set, payload kept
 * Overflow: f32 >= 65520 in magnitude becomes f16 Inf (65504 is the largest finite);
 * f32 values that round past bf16's largest finite (0x7f7f) become bf16 Inf.
 */
#ifndef KVQ_HALF_H
#define KVQ_HALF_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/half.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

uint16_t kvq_f32_to_f16_ref(float x);
float kvq_f16_to_f32_ref(uint16_t h);
uint16_t kvq_f32_to_bf16_ref(float x);
float kvq_bf16_to_f32_ref(uint16_t h);

/* Array conversions (fast path chosen at run time; n may be 0). */
void kvq_f32_to_f16(const float *in, uint16_t *out, size_t n);
void kvq_f16_to_f32(const uint16_t *in, float *out, size_t n);
void kvq_f32_to_bf16(const float *in, uint16_t *out, size_t n);
void kvq_bf16_to_f32(const uint16_t *in, float *out, size_t n);

/* The same with the scalar references only (for tests and benchmarks). */
void kvq_f32_to_f16_scalar(const float *in, uint16_t *out, size_t n);
void kvq_f16_to_f32_scalar(const uint16_t *in, float *out, size_t n);
void kvq_f32_to_bf16_scalar(const float *in, uint16_t *out, size_t n);
void kvq_bf16_to_f32_scalar(const uint16_t *in, float *out, size_t n);

#ifdef __cplusplus
}
#endif
#endif
