/*
 * model/q8gemm.h — the q8 activation path's GEMM for prefill chunks (decision 019):
 * several tokens' 8-bit activation rows (q8dot.h's quantizer) times Q4_1 or Q8_0
 * weights in integer dot products, tiled over 16 weight rows so that each weight block
 * is unpacked once per tile for all the chunk's tokens. Not a public header.
 *
 * The specification (kvq_q8gemm_ref, on the weights as the file packs them): the product
 * of weight row w with one quantized activation row (d, s, q per block of 32) is
 *     acc = 0, macc = 0
 *     per block b:  L = sum_{j<32} w_j q_j            (exact integer; u for Q4_1, v for Q8_0)
 *                   acc  = fmaf((float)L, d_w[b] * d[b], acc)   (the product rounded first)
 *                   macc = fmaf(m_w[b], s[b], macc)             (Q4_1 only)
 *     y = acc + macc  (Q4_1), acc (Q8_0);  with beta 1, y_out = y_in + y.
 * One accumulator per (row, token): the lanes of a SIMD register are 16 rows, so the
 * block scales apply per block and row. It differs from kvq_q8dot_ref's order (eight
 * lane sums, a reduction tree): prefill and decode are separate specifications, each
 * exact on every CPU. The tile (kvq_q8gemm_pack): per block, eight groups of four values,
 * each 16 rows x 4 bytes (one 512-bit vector: u for Q4_1, v ^ 0x80 for Q8_0), then 16
 * d_w and 16 m_w as f32; rows past the weight's end are zero.
 * Kernels: 0 scalar (the tile read in the specification's order), 1 AVX2 (vpmaddubsw +
 * vpmaddwd, 8 rows a register), 2 AVX-512 VNNI (vpdpbusd, 16 rows a register, four
 * tokens at once); all give kvq_q8gemm_ref's bits.
 */
#ifndef KVQ_MODEL_Q8GEMM_H
#define KVQ_MODEL_Q8GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "model/q8dot.h"

#define KVQ_Q8G_ROWS 16

/* Bytes of one tile of nb blocks (64-byte aligned pieces). */
size_t kvq_q8gemm_tile_bytes(size_t nb);
/* Packs rows [0, nr) (nr <= 16) of a weight of this type (row_bytes apart, nb blocks each)
 * into tile (kvq_q8gemm_tile_bytes(nb), 64-byte aligned). */
void kvq_q8gemm_pack(uint32_t type, const uint8_t *rows, size_t row_bytes, int nr, size_t nb,
                     void *tile);

/* y[t * ldy + r] (r < nr, t < n) = the tile's row r times a[t] (+ y with beta != 0). */
typedef void (*kvq_q8gemm_fn)(uint32_t type, const void *tile, size_t nb, const kvq_q8row *a,
                              int64_t n, float *y, int64_t ldy, int nr, float beta);
/* The kernel of a level (0, 1, 2 as kvq_q8dot_level); NULL where this CPU has none. */
kvq_q8gemm_fn kvq_q8gemm_kernel(int level);

/* The specification for one weight row (nb blocks, as the file packs it) and one token. */
float kvq_q8gemm_ref(uint32_t type, const uint8_t *row, const kvq_q8row *a, size_t nb);

/* m[i].y [n, ldy] = W_i a^T (+ y with beta 1) for weights that share the input a[0..n):
 * tiles of 16 rows over this thread's OpenMP team (dynamic), each tile packed once for
 * all n tokens by the thread that takes it; each value as kvq_q8gemm_ref's, so the
 * same bytes for any thread count. Returns 0, or -1 when a tile scratch could not be
 * allocated (y then incomplete). */
int kvq_q8gemm_multi(const kvq_q8_mat *m, int count, int64_t cols, const kvq_q8row *a,
                     int64_t n, float beta);

#if defined(__x86_64__) && defined(__GNUC__)
void kvq_q8gemm_avx2(uint32_t type, const void *tile, size_t nb, const kvq_q8row *a, int64_t n,
                     float *y, int64_t ldy, int nr, float beta);
void kvq_q8gemm_avx512(uint32_t type, const void *tile, size_t nb, const kvq_q8row *a,
                       int64_t n, float *y, int64_t ldy, int nr, float beta);
#endif

#endif
