/*
 * runtime/kernels/kvc_rows.h — the rows of the compressed KV caches (runtime/cache/kvc.h)
 * and the kernels that read them in place: a logit (q . row) and a value mix
 * (y += a row) straight from the stored bits, never a dequantized copy of the cache.
 * Scalar references; the formats are specified here.
 *
 * LeanKV row (leankv paper eq. 2, per-vector asymmetric quantization), n elements at
 * `bits` (1..8) bits, kvq_rk_lkq_row_bytes(n, bits) = 4 + ceil(n bits / 8) bytes:
 *     bytes 0..1  s16, the scale (f16, little-endian)
 *     bytes 2..3  z16, the zero point (f16)
 *     bytes 4..   the codes q_t, element t at bits [t bits, t bits + bits) of the
 *                 little-endian bit stream (bit k of the stream is bit k % 8 of byte
 *                 k / 8)
 * and element t reads back as x^_t = s16 * q_t - z16 (float). How s16, z16 and q_t are
 * chosen is kvq_rt_lkq_quantize's (runtime/cache/kvc.h).
 *
 * PATS row (pats paper), n f16 elements truncated by b (0..10) low mantissa bits:
 * each element keeps its top w = 16 - b bits (h >> b); B = floor(512 / w) elements go
 * in one 64-byte block, element c at bits [(c % B) w, + w) of block c / B (the same
 * little-endian bit stream within the block); kvq_rk_pats_row_bytes(n, b) =
 * 64 ceil(n / B). Element c reads back as the f16 (field << b).
 *
 * Memory read per call: the row's bytes. The SIMD readers may load up to 3 bytes past
 * the end of a PATS row: a buffer of PATS rows has KVQ_RK_PATS_PAD more bytes after its
 * last one.
 *
 * ---- Arithmetic (the scalar code is the specification; SIMD gives the same bits) ----
 * lanesum(a, b) over n elements: 16 float accumulators acc[l] = 0, element t (in
 * increasing order) into acc[t % 16] = fmaf(a_t, b_t, acc[t % 16]); then for w = 8, 4,
 * 2, 1: acc[l] = acc[l] + acc[l + w] for l < w; the result is acc[0]. qsum(q) is the same
 * with acc[t % 16] = acc[t % 16] + q_t.
 *   LeanKV logit  scale * ((s16 * lanesum(q, c)) - (z16 * qsum(q)))   (c: the codes)
 *   LeanKV mix    y_t = fmaf(a, s16 * c_t - z16, y_t)                 (a = 0: skipped)
 *   PATS logit    scale * lanesum(q, x)                                (x: the f16 values)
 *   PATS mix      y_t = fmaf(a, x_t, y_t)                              (a = 0: skipped)
 * Every product and sum is rounded to float as written (no other contraction). The
 * AVX2 and AVX-512 paths (kvc_rows_avx2.c, kvc_rows_avx512.c, chosen by kvq_isa_clamp)
 * keep the 16 lanes (two vectors of 8 on AVX2) and the reduction order, so their results
 * are the scalar ones bit for bit (tests/test_kvc_rows.c); a row whose n is not a
 * multiple of 16 (or over 512) is read by the scalar code, LeanKV bits other than 2, 4,
 * 8 element by element inside the SIMD readers. On AVX-512, rows of 64 and 128 elements
 * with 1..8 queries (every GQA group of SmolLM2- and 7B-like models) are decoded straight
 * into registers, dequantization fused into the multiply-adds (no row buffer), the mix's
 * sums held in registers across rows (bench/bench_kvcache.c measures them).
 */
#ifndef KVQ_RUNTIME_KVC_ROWS_H
#define KVQ_RUNTIME_KVC_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_RK_LKQ_MAX_BITS 8
#define KVQ_RK_PATS_MAX_B 10 /* f16's mantissa bits */
#define KVQ_RK_PATS_PAD 4

/* ---- LeanKV rows ---- */
size_t kvq_rk_lkq_row_bytes(int32_t n, int32_t bits);
/* Code t of a row (no bounds check). */
uint32_t kvq_rk_lkq_code(const uint8_t *row, int32_t t, int32_t bits);
/* Writes code c (< 2^bits) as element t of a row whose code bytes were zeroed. */
void kvq_rk_lkq_put_code(uint8_t *row, int32_t t, int32_t bits, uint32_t c);
/* x^ [n] of a row. */
void kvq_rk_lkq_dequant(const uint8_t *row, int32_t n, int32_t bits, float *out);
/* q [n] . x^, read from the row: the LeanKV logit with scale 1. */
float kvq_rk_lkq_dot(const float *q, const uint8_t *row, int32_t n, int32_t bits);
/* y [n] += a x^ (the LeanKV mix of one row). */
void kvq_rk_lkq_axpy(float a, const uint8_t *row, int32_t n, int32_t bits, float *y);

/* ---- PATS rows ---- */
size_t kvq_rk_pats_row_bytes(int32_t n, int32_t b);
/* Packs the f16 bit patterns h [n] (truncated: their low b bits are dropped) into row
 * (kvq_rk_pats_row_bytes bytes, all written). */
void kvq_rk_pats_pack(const uint16_t *h, int32_t n, int32_t b, uint8_t *row);
/* The f16 bit pattern of element c. */
uint16_t kvq_rk_pats_elem(const uint8_t *row, int32_t c, int32_t b);
/* The elements as f32 [n]. */
void kvq_rk_pats_unpack(const uint8_t *row, int32_t n, int32_t b, float *out);
/* q [n] . row (the PATS logit with scale 1). */
float kvq_rk_pats_dot(const float *q, const uint8_t *row, int32_t n, int32_t b);
/* y [n] += a row (the PATS mix of one row). */
void kvq_rk_pats_axpy(float a, const uint8_t *row, int32_t n, int32_t b, float *y);
/* ---- Many rows, several queries (the attention's readers) ----
 * m rows row[i] (i < m) of n elements, row i at bits[i] (LeanKV) or truncated by
 * bits[i] (PATS); nq queries q + g ldq (g < nq):
 *   logits  out[g ldo + i] = the logit of query g against row i (arithmetic above);
 *           qsum [nq]: qsum(q_g) (kvq_rk_qsum), for LeanKV only
 *   mix     y + g ldy += p[g ldp + i] x^_i for every row i, in increasing i
 * Reads each row once. */
float kvq_rk_qsum(const float *q, int32_t n);
void kvq_rk_lkq_logits(kvq_isa isa, const float *q, int32_t nq, int64_t ldq, const float *qsum,
                       const uint8_t *const *row, const int8_t *bits, int64_t m, int32_t n,
                       float scale, float *out, int64_t ldo);
void kvq_rk_lkq_mix(kvq_isa isa, const float *p, int32_t nq, int64_t ldp,
                    const uint8_t *const *row, const int8_t *bits, int64_t m, int32_t n,
                    float *y, int64_t ldy);
void kvq_rk_pats_logits(kvq_isa isa, const float *q, int32_t nq, int64_t ldq,
                        const uint8_t *const *row, const int8_t *bits, int64_t m, int32_t n,
                        float scale, float *out, int64_t ldo);
void kvq_rk_pats_mix(kvq_isa isa, const float *p, int32_t nq, int64_t ldp,
                     const uint8_t *const *row, const int8_t *bits, int64_t m, int32_t n,
                     float *y, int64_t ldy);

#ifdef __cplusplus
}
#endif

#endif /* KVQ_RUNTIME_KVC_ROWS_H */
