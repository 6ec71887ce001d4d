/*
 * model/q8dot.h — integer dot products of packed weights with 8-bit activations (the
 * forward pass's q8 activation path, decision 019). Not a public header.
 *
 * Activations: each row of x is cut into blocks of 32 values and quantized as ggml's
 * Q8_1 does, except that d and s stay f32:
 *     amax = max |x_i|, d = amax / 127, id = d ? 1 / d : 0,
 *     q_i = round-half-even(x_i * id)  (in [-127, 127]),  s = d * (float)sum_i q_i.
 * Weights: Q4_1 (w = d_w * u + m_w, u in [0, 15]) and Q8_0 (w = d_w * v, v signed),
 * packed as in the file.
 *
 * The product of one weight row with one quantized activation row, the specification
 * (kvq_q8dot_ref; every SIMD kernel returns exactly its bits):
 *   per block b, eight integer lane sums  L[b][k] = sum_{j<4} u[32b+4k+j] q[32b+4k+j]
 *   (exact); sixteen f32 accumulators, block b into lanes (b % 2) * 8 + k:
 *       acc[lane] = fmaf((float)L[b][k], d_w[b] * d[b], acc[lane])
 *   (d_w * d rounded to f32 first); for Q4_1 two more, even and odd blocks:
 *       macc[b % 2] += m_w[b] * s[b]
 *   then  r[i] = acc[i] + acc[i + 8],  r[i] += r[i + 4],  r[i] += r[i + 2],  r0 + r1,
 *   plus (macc[0] + macc[1]) for Q4_1. The number of blocks must be even (cols a
 *   multiple of 64); kvq_q8_supported says when a weight can take this path.
 * Q8_0 weights on AVX-512 VNNI multiply v + 128 (unsigned) and subtract 128 times the
 * activations' four-value sums (c4 below): the same integers.
 */
#ifndef KVQ_MODEL_Q8DOT_H
#define KVQ_MODEL_Q8DOT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvq/common.h"

#define KVQ_Q8_BLOCK 32

/* One quantized activation row of n values (n a multiple of 64): q [n], ds [n / 16]
 * (d, s per block), c4 [n / 4] (128 * the sum of each four q's), c32 [n / 32] (128 *
 * the sum of each block's q's: q8gemm.h's Q8_0 correction). */
typedef struct kvq_q8row {
    const int8_t *q;
    const float *ds;
    const int32_t *c4;
    const int32_t *c32;
} kvq_q8row;

/* Bytes of scratch a quantized row of n values takes (q, ds, c4 and c32, each aligned). */
size_t kvq_q8_row_bytes(int64_t n);
/* Quantizes x [n] into the scratch buf (kvq_q8_row_bytes(n) bytes, 64-byte aligned)
 * and points *out into it. Plain C: the same bits on every CPU. */
void kvq_q8_quantize(const float *x, int64_t n, void *buf, kvq_q8row *out);

/* 1 if a weight of this ggml type and width takes the q8 path (Q4_1 or Q8_0, cols a
 * multiple of 64). */
int kvq_q8_supported(uint32_t type, int64_t cols);

/* The dot product of one packed weight row (nb blocks, nb even) with a's row. */
typedef float (*kvq_q8dot_fn)(const uint8_t *row, const kvq_q8row *a, size_t nb);
float kvq_q8dot_ref(uint32_t type, const uint8_t *row, const kvq_q8row *a, size_t nb);
/* The kernel for a type at a level: 0 scalar (the reference), 1 AVX2, 2 AVX-512 VNNI;
 * NULL where the CPU or the type has none. */
kvq_q8dot_fn kvq_q8dot_kernel(uint32_t type, int level);
/* Four tokens' products with one row (a[0..4)), each equal to the one-token kernel's;
 * NULL where the level has none (the driver then calls the one-token kernel). */
typedef void (*kvq_q8dot4_fn)(const uint8_t *row, const kvq_q8row *a, size_t nb, float out[4]);
kvq_q8dot4_fn kvq_q8dot4_kernel(uint32_t type, int level);
/* The fastest level this CPU runs (0, 1 or 2). */
int kvq_q8dot_level(void);

/* y [n, rows] = W [rows, cols] times each of the n activation rows a[t] (a row of W
 * read once for all n; rows split over this thread's OpenMP team when there is work
 * for several, each y value computed alone: the same bytes for any thread count).
 * beta 1 adds into y. */
void kvq_q8_matmul(uint32_t type, const void *w, size_t row_bytes, int64_t rows,
                   int64_t cols, const kvq_q8row *a, int64_t n, float *y, int64_t ldy,
                   float beta);

/* Several products of the same input a[0..n) (q, k and v; gate and up) in one parallel
 * region: m[i].y [n, ldy] = W_i a^T (+ y with beta 1). Each value as kvq_q8_matmul's. */
typedef struct kvq_q8_mat {
    uint32_t type;
    const void *w;
    size_t row_bytes;
    int64_t rows;
    float *y;
    int64_t ldy;
} kvq_q8_mat;
void kvq_q8_matmul_multi(const kvq_q8_mat *m, int count, int64_t cols, const kvq_q8row *a,
                         int64_t n, float beta);

/* Unaligned little-endian fields of a block (the SIMD kernels' scale loads). */
static inline uint32_t kvq_q8_u32_at(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline int kvq_q8_u16_at(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

#if defined(__x86_64__) && defined(__GNUC__)
float kvq_q8dot_q4_1_avx2(const uint8_t *row, const kvq_q8row *a, size_t nb);
float kvq_q8dot_q8_0_avx2(const uint8_t *row, const kvq_q8row *a, size_t nb);
float kvq_q8dot_q4_1_avx512(const uint8_t *row, const kvq_q8row *a, size_t nb);
float kvq_q8dot_q8_0_avx512(const uint8_t *row, const kvq_q8row *a, size_t nb);
void kvq_q8dot4_q4_1_avx512(const uint8_t *row, const kvq_q8row *a, size_t nb, float out[4]);
#endif

#endif
