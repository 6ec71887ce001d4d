/*
 * formats/half_simd.h — internal: the SIMD kernels behind kvq/half.h and the Q8_0
 * dequantizer of kvq/gguf.h (defined in quant_avx2.c / quant_avx512.c; the other
 * quant kernels are in formats/quant_simd.h). Not a public header.
 *
 * Each kernel computes exactly what the matching scalar reference computes, bit for
 * bit (tests/test_half.c and tests/test_gguf.c check every path the CPU can run).
 * Callers choose one at run time with kvq_half_simd_level(); calling a kernel the CPU
 * cannot run is undefined. Intrinsics live only in the formats *_avx2.c and *_avx512.c files;
 * those files mark their functions with target attributes so that they also build
 * where the SIMD flags are not passed (the clang fuzz build compiles all sources in
 * one command).
 */
#ifndef KVQ_FORMATS_HALF_SIMD_H
#define KVQ_FORMATS_HALF_SIMD_H

#include <stddef.h>
#include <stdint.h>

/* 0: scalar only, 1: AVX2 + FMA + F16C, 2: AVX-512 F/BW/VL (and level 1). */
enum { KVQ_SIMD_SCALAR = 0, KVQ_SIMD_AVX2 = 1, KVQ_SIMD_AVX512 = 2 };
int kvq_half_simd_level(void);

#if defined(__x86_64__) && defined(__GNUC__)
#define KVQ_HAVE_X86_SIMD 1

void kvq_f32_to_f16_avx2(const float *in, uint16_t *out, size_t n);
void kvq_f16_to_f32_avx2(const uint16_t *in, float *out, size_t n);
void kvq_f32_to_bf16_avx2(const float *in, uint16_t *out, size_t n);
void kvq_bf16_to_f32_avx2(const uint16_t *in, float *out, size_t n);
void kvq_dequant_q8_0_avx2(const void *blocks, float *out, size_t n);

void kvq_f32_to_f16_avx512(const float *in, uint16_t *out, size_t n);
void kvq_f16_to_f32_avx512(const uint16_t *in, float *out, size_t n);
void kvq_f32_to_bf16_avx512(const float *in, uint16_t *out, size_t n);
void kvq_bf16_to_f32_avx512(const uint16_t *in, float *out, size_t n);
void kvq_dequant_q8_0_avx512(const void *blocks, float *out, size_t n);
#else
#define KVQ_HAVE_X86_SIMD 0
#endif

#endif
