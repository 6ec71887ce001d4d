/*
 * kvq/quant.h — ggml weight types: the per-type table, dequantization to f32 (scalar
 * reference and run-time dispatched fast path, equal bit for bit), row tiles for
 * prefill, and a fused quantized matrix-vector product for single-token decode.
 *
 * Supported (computable) types: F32, F16, BF16 and the ggml block quantizations
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32 values per block) and Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
 * (256 values per block), with exactly ggml's block layouts. Every other ggml type
 * kvq knows by name (Q8_1, Q8_K, IQ*, TQ*, MXFP4, the integer types, F64) is in the
 * table with its block size, so files holding it can be opened and listed, but any
 * computation on it fails with KVQ_E_UNSUPPORTED and a message naming the type.
 *
 * Values: each type's dequantization is exact f32 arithmetic on the block's fields,
 * in ggml's order of operations, rounded to f32 at each step:
 *   Q4_0, Q5_0, Q8_0   d * q                 (q signed)
 *   Q4_1, Q5_1         d * q + m
 *   Q2_K, Q4_K, Q5_K   (d * sc) * q - (dmin * mn)
 *   Q3_K, Q6_K         (d * sc) * q          (sc, q signed)
 * where d, m, dmin are the block's f16 fields converted exactly to f32. The results
 * equal the `gguf` PyPI package's numpy dequantization bit for bit
 * (tests/test_quant.c against tests/data/quant_golden.bin).
 *
 * Layouts are unaligned byte streams: every function reads blocks at any address.
 * Sizes are element counts; a row of `cols` values of type T takes
 * cols / block_elems * block_bytes bytes and cols must be a multiple of block_elems.
 */
#ifndef KVQ_QUANT_H
#define KVQ_QUANT_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/quant.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kvq/common.h"
#include "kvq/gguf.h"

typedef struct kvq_quant_info {
    uint32_t type;        /* ggml type id (KVQ_GGML_*, or the raw id for IQ* etc.) */
    const char *name;     /* ggml's name: "Q4_K" */
    uint32_t block_elems; /* values per block: 1 (F32, F16, BF16), 32, or 256 */
    uint32_t block_bytes; /* bytes per block */
    int supported;        /* 1 if kvq dequantizes and multiplies this type */
} kvq_quant_info;

/* The table entry of a ggml type id, or NULL for an id kvq does not know. */
const kvq_quant_info *kvq_quant_info_of(uint32_t type);
/* 1 if type is computable (see the list above), else 0 (unknown ids included). */
int kvq_quant_supported(uint32_t type);
/* KVQ_OK if type is supported and cols >= 0 is a multiple of its block size; else
 * KVQ_E_UNSUPPORTED ("type IQ2_XXS is not supported (kvq computes with F32, ...)";
 * unknown ids by number) or KVQ_E_INVALID_ARG (cols). *row_bytes (may be NULL) gets
 * the bytes of one row of cols values. */
kvq_status kvq_quant_check(uint32_t type, int64_t cols, size_t *row_bytes, kvq_err *err);

/* Dequantizes n values (n / block_elems blocks, read from src at any address) into
 * out[n]. n must be a multiple of the block size. _ref is the scalar specification;
 * kvq_dequantize picks AVX-512 / AVX2 at run time and gives the same bits.
 * Errors: KVQ_E_UNSUPPORTED (type), KVQ_E_INVALID_ARG (n, NULL pointers with n > 0). */
kvq_status kvq_dequantize_ref(uint32_t type, const void *src, float *out, size_t n,
                              kvq_err *err);
kvq_status kvq_dequantize(uint32_t type, const void *src, float *out, size_t n, kvq_err *err);

/* Rows [r0, r1) of a row-major [rows x cols] weight of type `type` (w: rows * row_bytes
 * bytes) into out[(r1 - r0) * cols] f32, through the fast path (equal bit for bit to
 * the reference). For prefill: dequantize a tile of rows, then SGEMM it.
 * Errors: as kvq_quant_check, and KVQ_E_INVALID_ARG for 0 <= r0 <= r1 <= rows
 * violated or NULL pointers. Cost: O((r1 - r0) * cols), no allocation. */
kvq_status kvq_dequantize_rows(uint32_t type, const void *w, int64_t rows, int64_t cols,
                               int64_t r0, int64_t r1, float *out, kvq_err *err);

/* y[rows] = W x for a row-major [rows x cols] weight W of type `type` kept packed
 * (w: rows * row_bytes bytes, any alignment) and x[cols] f32. For single-token decode:
 * each row is dequantized on the fly, a tile of up to 256 values at a time in a stack
 * buffer, and dotted with x; W is never expanded as a whole.
 *
 *   kvq_quant_matvec_ref: the specification. Each row's values are exactly those of
 *     kvq_dequantize_ref; the dot product sums the products w_i * x_i (exact in
 *     double) in double, in order i = 0..cols-1, and rounds once to f32. So it equals
 *     "dequantize, then dot in double" bit for bit.
 *   kvq_quant_matvec: the fast path. Same dequantized values (bit for bit); the dot
 *     product is f32 FMA in 8 (AVX2) or 16 (AVX-512) lanes per 256-value tile, lanes
 *     reduced pairwise, tiles summed in f32 (Q4_1 and Q8_0 on AVX-512: dequantized and
 *     multiplied in registers, no buffer, the same bits). Guaranteed accuracy, per row:
 *         |y_fast - y_ref| <= (cols + 2) * 2^-24 * sum_i |w_i * x_i|
 *     (the worst-case bound of f32 summation; measured errors are about two orders
 *     of magnitude below it, see tests/test_quant.c). Rows are split across OpenMP
 *     threads when the matrix is large; each row's result does not depend on the
 *     thread count. y must not alias x.
 * Errors: as kvq_quant_check, KVQ_E_INVALID_ARG for rows < 0 or NULL pointers.
 * Cost: O(rows * cols), reads each weight byte once, no allocation. */
kvq_status kvq_quant_matvec_ref(uint32_t type, const void *w, int64_t rows, int64_t cols,
                                const float *x, float *y, kvq_err *err);
kvq_status kvq_quant_matvec(uint32_t type, const void *w, int64_t rows, int64_t cols,
                            const float *x, float *y, kvq_err *err);

#endif
