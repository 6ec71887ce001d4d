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
 * Memory read per call: the row's bytes.
 */
#ifndef KVQ_RUNTIME_KVC_ROWS_H
#define KVQ_RUNTIME_KVC_ROWS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_RK_LKQ_MAX_BITS 8
#define KVQ_RK_PATS_MAX_B 10 /* f16's mantissa bits */

/* ---- LeanKV rows ---- */
size_t kvq_rk_lkq_row_bytes(int32_t n, int32_t bits);
/* Code t of a row (no bounds check). */
uint32_t kvq_rk_lkq_code(const uint8_t *row, int32_t t, int32_t bits);
/* Writes code c (< 2^bits) as element t of a row whose code bytes were zeroed. */
void kvq_rk_lkq_put_code(uint8_t *row, int32_t t, int32_t bits, uint32_t c);
/* x^ [n] of a row. */
void kvq_rk_lkq_dequant(const uint8_t *row, int32_t n, int32_t bits, float *out);
/* q [n] . x^, read from the row: s16 sum_t q_t c_t - z16 sum_t q_t (double sums). */
float kvq_rk_lkq_dot(const float *q, const uint8_t *row, int32_t n, int32_t bits);
/* y [n] += a x^ (each element a (s16 q_t - z16)). */
void kvq_rk_lkq_axpy(float a, const uint8_t *row, int32_t n, int32_t bits, float *y);

/* Several queries at once, each row decoded once (into a buffer of one row):
 *   dot_n   out[g] = q_g . x^ for the nq queries q + g ldq (as kvq_rk_lkq_dot)
 *   axpy_n  y + g ldy += a[g] x^ for the na weights (a[g] = 0 skipped) */
void kvq_rk_lkq_dot_n(const float *q, int32_t nq, int64_t ldq, const uint8_t *row, int32_t n,
                      int32_t bits, float *out);
void kvq_rk_lkq_axpy_n(const float *a, int32_t na, const uint8_t *row, int32_t n, int32_t bits,
                       float *y, int64_t ldy);

/* ---- PATS rows ---- */
size_t kvq_rk_pats_row_bytes(int32_t n, int32_t b);
/* Packs the f16 bit patterns h [n] (truncated: their low b bits are dropped) into row
 * (kvq_rk_pats_row_bytes bytes, all written). */
void kvq_rk_pats_pack(const uint16_t *h, int32_t n, int32_t b, uint8_t *row);
/* The f16 bit pattern of element c. */
uint16_t kvq_rk_pats_elem(const uint8_t *row, int32_t c, int32_t b);
/* The elements as f32 [n]. */
void kvq_rk_pats_unpack(const uint8_t *row, int32_t n, int32_t b, float *out);
/* q [n] . row (double sum). */
float kvq_rk_pats_dot(const float *q, const uint8_t *row, int32_t n, int32_t b);
/* y [n] += a row. */
void kvq_rk_pats_axpy(float a, const uint8_t *row, int32_t n, int32_t b, float *y);
/* As kvq_rk_lkq_dot_n / _axpy_n for a PATS row. */
void kvq_rk_pats_dot_n(const float *q, int32_t nq, int64_t ldq, const uint8_t *row, int32_t n,
                       int32_t b, float *out);
void kvq_rk_pats_axpy_n(const float *a, int32_t na, const uint8_t *row, int32_t n, int32_t b,
                        float *y, int64_t ldy);

#ifdef __cplusplus
}
#endif

#endif /* KVQ_RUNTIME_KVC_ROWS_H */
