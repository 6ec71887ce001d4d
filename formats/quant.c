/*
 * quant.c — the ggml type table, kernel dispatch, and the kvq/quant.h entry points:
 * dequantization of n values, of a tile of rows, and the fused matrix-vector product.
 *
 * The per-type kernels live in quant_legacy.c / quant_k.c (scalar references) and
 * quant_avx2.c / quant_avx512.c (fast paths); this file only picks one and loops.
 */
#include "kvq/quant.h"

#include <stdint.h>
#include <string.h>

#include "formats/quant_simd.h"
#include "kvq/half.h"
#include "kvq/util.h"

/* Block layouts as ggml defines them (QK_K = 256). Ids 4, 5, 31..33 and 36..38 were
 * removed from ggml and stay unknown. The last field says whether kvq computes. */
static const kvq_quant_info quant_types[] = {
    [KVQ_GGML_F32] = {KVQ_GGML_F32, "F32", 1, 4, 1},
    [KVQ_GGML_F16] = {KVQ_GGML_F16, "F16", 1, 2, 1},
    [KVQ_GGML_Q4_0] = {KVQ_GGML_Q4_0, "Q4_0", 32, 18, 1},
    [KVQ_GGML_Q4_1] = {KVQ_GGML_Q4_1, "Q4_1", 32, 20, 1},
    [KVQ_GGML_Q5_0] = {KVQ_GGML_Q5_0, "Q5_0", 32, 22, 1},
    [KVQ_GGML_Q5_1] = {KVQ_GGML_Q5_1, "Q5_1", 32, 24, 1},
    [KVQ_GGML_Q8_0] = {KVQ_GGML_Q8_0, "Q8_0", 32, 34, 1},
    [KVQ_GGML_Q8_1] = {KVQ_GGML_Q8_1, "Q8_1", 32, 36, 0},
    [KVQ_GGML_Q2_K] = {KVQ_GGML_Q2_K, "Q2_K", 256, 84, 1},
    [KVQ_GGML_Q3_K] = {KVQ_GGML_Q3_K, "Q3_K", 256, 110, 1},
    [KVQ_GGML_Q4_K] = {KVQ_GGML_Q4_K, "Q4_K", 256, 144, 1},
    [KVQ_GGML_Q5_K] = {KVQ_GGML_Q5_K, "Q5_K", 256, 176, 1},
    [KVQ_GGML_Q6_K] = {KVQ_GGML_Q6_K, "Q6_K", 256, 210, 1},
    [KVQ_GGML_Q8_K] = {KVQ_GGML_Q8_K, "Q8_K", 256, 292, 0},
    [16] = {16, "IQ2_XXS", 256, 66, 0},
    [17] = {17, "IQ2_XS", 256, 74, 0},
    [18] = {18, "IQ3_XXS", 256, 98, 0},
    [19] = {19, "IQ1_S", 256, 50, 0},
    [20] = {20, "IQ4_NL", 32, 18, 0},
    [21] = {21, "IQ3_S", 256, 110, 0},
    [22] = {22, "IQ2_S", 256, 82, 0},
    [23] = {23, "IQ4_XS", 256, 136, 0},
    [KVQ_GGML_I8] = {KVQ_GGML_I8, "I8", 1, 1, 0},
    [KVQ_GGML_I16] = {KVQ_GGML_I16, "I16", 1, 2, 0},
    [KVQ_GGML_I32] = {KVQ_GGML_I32, "I32", 1, 4, 0},
    [KVQ_GGML_I64] = {KVQ_GGML_I64, "I64", 1, 8, 0},
    [KVQ_GGML_F64] = {KVQ_GGML_F64, "F64", 1, 8, 0},
    [29] = {29, "IQ1_M", 256, 56, 0},
    [KVQ_GGML_BF16] = {KVQ_GGML_BF16, "BF16", 1, 2, 1},
    [34] = {34, "TQ1_0", 256, 54, 0},
    [35] = {35, "TQ2_0", 256, 66, 0},
    [39] = {39, "MXFP4", 32, 17, 0},
};

#define SUPPORTED_LIST "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K"

const kvq_quant_info *kvq_quant_info_of(uint32_t type)
{
    if (type >= sizeof quant_types / sizeof quant_types[0] || !quant_types[type].name)
        return NULL;
    return &quant_types[type];
}

int kvq_quant_supported(uint32_t type)
{
    const kvq_quant_info *qi = kvq_quant_info_of(type);
    return qi && qi->supported;
}

kvq_status kvq_quant_check(uint32_t type, int64_t cols, size_t *row_bytes, kvq_err *err)
{
    const kvq_quant_info *qi = kvq_quant_info_of(type);
    if (!qi)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                           "unknown ggml type %u (kvq computes with " SUPPORTED_LIST ")", type);
    if (!qi->supported)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                           "ggml type %s is not supported (kvq computes with " SUPPORTED_LIST ")",
                           qi->name);
    size_t bytes;
    if (cols < 0 || (uint64_t)cols % qi->block_elems != 0 ||
        !kvq_size_mul((size_t)((uint64_t)cols / qi->block_elems), qi->block_bytes, &bytes))
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "%s: %lld values are not a whole number of %u-value blocks", qi->name,
                           (long long)cols, qi->block_elems);
    if (row_bytes)
        *row_bytes = bytes;
    return KVQ_OK;
}

/* ---- float types ----------------------------------------------------------------- */

static void f32_copy(const void *src, float *out, size_t n) { memcpy(out, src, n * sizeof *out); }

static void f16_ref(const void *src, float *out, size_t n)
{
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++)
        out[i] = kvq_f16_to_f32_ref((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
}

static void bf16_ref(const void *src, float *out, size_t n)
{
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++)
        out[i] = kvq_bf16_to_f32_ref((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
}

/* The array converters take uint16_t pointers: odd addresses go through a buffer. */
static void halves_fast(const uint8_t *src, float *out, size_t n,
                        void (*conv)(const uint16_t *, float *, size_t))
{
    if (((uintptr_t)src & 1u) == 0) {
        conv((const uint16_t *)(const void *)src, out, n);
        return;
    }
    uint16_t tmp[512]; // [chunk]
    for (size_t i = 0; i < n; i += 512) {
        const size_t k = n - i < 512 ? n - i : 512;
        memcpy(tmp, src + 2 * i, 2 * k);
        conv(tmp, out + i, k);
    }
}

static void f16_fast(const void *src, float *out, size_t n) { halves_fast(src, out, n, kvq_f16_to_f32); }
static void bf16_fast(const void *src, float *out, size_t n) { halves_fast(src, out, n, kvq_bf16_to_f32); }

/* ---- dispatch ---------------------------------------------------------------------- */

typedef struct kernels {
    kvq_dequant_fn ref, avx2, avx512;
} kernels;

static kernels kernels_of(uint32_t type)
{
    kernels k = {NULL, NULL, NULL};
    switch (type) {
    case KVQ_GGML_F32: k.ref = f32_copy; break;
    /* F16 / BF16: the array converters of kvq/half.h, which dispatch themselves */
    case KVQ_GGML_F16: k.ref = f16_ref; k.avx2 = f16_fast; break;
    case KVQ_GGML_BF16: k.ref = bf16_ref; k.avx2 = bf16_fast; break;
    case KVQ_GGML_Q4_0: k.ref = kvq_dequant_q4_0_ref; break;
    case KVQ_GGML_Q4_1: k.ref = kvq_dequant_q4_1_ref; break;
    case KVQ_GGML_Q5_0: k.ref = kvq_dequant_q5_0_ref; break;
    case KVQ_GGML_Q5_1: k.ref = kvq_dequant_q5_1_ref; break;
    case KVQ_GGML_Q8_0: k.ref = kvq_dequant_q8_0_ref; break;
    case KVQ_GGML_Q2_K: k.ref = kvq_dequant_q2_k_ref; break;
    case KVQ_GGML_Q3_K: k.ref = kvq_dequant_q3_k_ref; break;
    case KVQ_GGML_Q4_K: k.ref = kvq_dequant_q4_k_ref; break;
    case KVQ_GGML_Q5_K: k.ref = kvq_dequant_q5_k_ref; break;
    case KVQ_GGML_Q6_K: k.ref = kvq_dequant_q6_k_ref; break;
    default: return k;
    }
#if KVQ_HAVE_X86_SIMD
    switch (type) {
    case KVQ_GGML_Q4_0: k.avx2 = kvq_dequant_q4_0_avx2; break;
    case KVQ_GGML_Q4_1: k.avx2 = kvq_dequant_q4_1_avx2; break;
    case KVQ_GGML_Q5_0: k.avx2 = kvq_dequant_q5_0_avx2; break;
    case KVQ_GGML_Q5_1: k.avx2 = kvq_dequant_q5_1_avx2; break;
    case KVQ_GGML_Q8_0: k.avx2 = kvq_dequant_q8_0_avx2; k.avx512 = kvq_dequant_q8_0_avx512; break;
    case KVQ_GGML_Q2_K: k.avx2 = kvq_dequant_q2_k_avx2; break;
    case KVQ_GGML_Q3_K: k.avx2 = kvq_dequant_q3_k_avx2; break;
    case KVQ_GGML_Q4_K: k.avx2 = kvq_dequant_q4_k_avx2; break;
    case KVQ_GGML_Q5_K: k.avx2 = kvq_dequant_q5_k_avx2; break;
    case KVQ_GGML_Q6_K: k.avx2 = kvq_dequant_q6_k_avx2; break;
    default: break;
    }
#endif
    return k;
}

kvq_dequant_fn kvq_quant_kernel(uint32_t type, int level)
{
    const kernels k = kernels_of(type);
    switch (level) {
    case KVQ_SIMD_SCALAR: return k.ref;
    case KVQ_SIMD_AVX2: return k.avx2;
    case KVQ_SIMD_AVX512: return k.avx512;
    default: return NULL;
    }
}

kvq_dequant_fn kvq_quant_fast_kernel(uint32_t type)
{
    const kernels k = kernels_of(type);
    const int level = kvq_half_simd_level();
    if (level >= KVQ_SIMD_AVX512 && k.avx512)
        return k.avx512;
    if (level >= KVQ_SIMD_AVX2 && k.avx2)
        return k.avx2;
    return k.ref;
}

kvq_qdot_fn kvq_quant_qdot_kernel(uint32_t type, int level)
{
#if KVQ_HAVE_X86_SIMD
    if (level == KVQ_SIMD_AVX512)
        switch (type) {
        case KVQ_GGML_Q4_1: return kvq_qdot_q4_1_avx512;
        case KVQ_GGML_Q8_0: return kvq_qdot_q8_0_avx512;
        case KVQ_GGML_Q4_K: return kvq_qdot_q4_k_avx512;
        case KVQ_GGML_Q6_K: return kvq_qdot_q6_k_avx512;
        default: break;
        }
    if (level == KVQ_SIMD_AVX2)
        switch (type) {
        case KVQ_GGML_Q4_1: return kvq_qdot_q4_1_avx2;
        case KVQ_GGML_Q8_0: return kvq_qdot_q8_0_avx2;
        case KVQ_GGML_Q4_K: return kvq_qdot_q4_k_avx2;
        case KVQ_GGML_Q6_K: return kvq_qdot_q6_k_avx2;
        default: break;
        }
#endif
    (void)type, (void)level;
    return NULL;
}

static float dot_scalar(const float *a, const float *b, size_t n)
{
    float s = 0.0f;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

kvq_dot_fn kvq_quant_dot_kernel(int level)
{
    switch (level) {
    case KVQ_SIMD_SCALAR: return dot_scalar;
#if KVQ_HAVE_X86_SIMD
    case KVQ_SIMD_AVX2: return kvq_dot_f32_avx2;
    case KVQ_SIMD_AVX512: return kvq_dot_f32_avx512;
#endif
    default: return NULL;
    }
}

static kvq_dot_fn fast_dot(void)
{
    kvq_dot_fn f = kvq_quant_dot_kernel(kvq_half_simd_level());
    return f ? f : dot_scalar;
}

/* ---- entry points ------------------------------------------------------------------ */

static kvq_status dequantize(uint32_t type, const void *src, float *out, size_t n, int fast,
                             kvq_err *err)
{
    kvq_status st;
    const kvq_quant_info *qi = kvq_quant_info_of(type);
    if ((st = kvq_quant_check(type, 0, NULL, err)))
        return st;
    if (n % qi->block_elems != 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "%s: %zu values are not a whole number of %u-value blocks", qi->name,
                           n, qi->block_elems);
    if (n == 0)
        return KVQ_OK;
    if (!src || !out)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "dequantize %s: NULL input or output",
                           qi->name);
    (fast ? kvq_quant_fast_kernel(type) : kvq_quant_kernel(type, KVQ_SIMD_SCALAR))(src, out, n);
    return KVQ_OK;
}

kvq_status kvq_dequantize_ref(uint32_t type, const void *src, float *out, size_t n, kvq_err *err)
{
    return dequantize(type, src, out, n, 0, err);
}

kvq_status kvq_dequantize(uint32_t type, const void *src, float *out, size_t n, kvq_err *err)
{
    return dequantize(type, src, out, n, 1, err);
}

kvq_status kvq_dequantize_rows(uint32_t type, const void *w, int64_t rows, int64_t cols,
                               int64_t r0, int64_t r1, float *out, kvq_err *err)
{
    size_t row_bytes, n;
    kvq_status st = kvq_quant_check(type, cols, &row_bytes, err);
    if (st)
        return st;
    const char *name = kvq_quant_info_of(type)->name;
    if (rows < 0 || r0 < 0 || r1 < r0 || r1 > rows)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "dequantize %s rows [%lld, %lld) of a %lld-row weight", name,
                           (long long)r0, (long long)r1, (long long)rows);
    if (!kvq_size_mul((size_t)(r1 - r0), (size_t)cols, &n))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "dequantize %s: too many values", name);
    if (n == 0)
        return KVQ_OK;
    if (!w || !out)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "dequantize %s rows: NULL input or output",
                           name);
    kvq_quant_fast_kernel(type)((const uint8_t *)w + (size_t)r0 * row_bytes, out, n);
    return KVQ_OK;
}

enum { TILE = 256 };                  /* values per dequantized tile; every block size divides it */
#define MATVEC_PARALLEL_MIN (1 << 18) /* rows * cols from which rows are split across threads */

static float row_ref(kvq_dequant_fn deq, const uint8_t *row, size_t tile_bytes, size_t cols,
                     const float *x)
{
    float buf[TILE];
    double s = 0.0;
    for (size_t i = 0; i < cols; i += TILE, row += tile_bytes) {
        const size_t k = cols - i < TILE ? cols - i : TILE;
        deq(row, buf, k);
        for (size_t j = 0; j < k; j++)
            s += (double)buf[j] * (double)x[i + j];
    }
    return (float)s;
}

static float row_fast(kvq_dequant_fn deq, kvq_dot_fn dot, const uint8_t *row,
                      size_t tile_bytes, size_t cols, const float *x)
{
    float buf[TILE];
    float s = 0.0f;
    for (size_t i = 0; i < cols; i += TILE, row += tile_bytes) {
        const size_t k = cols - i < TILE ? cols - i : TILE;
        deq(row, buf, k);
        s += dot(buf, x + i, k);
    }
    return s;
}

static float row_fused(kvq_qdot_fn qdot, const uint8_t *row, size_t tile_bytes, size_t cols,
                       const float *x)
{
    float s = 0.0f;
    for (size_t i = 0; i < cols; i += TILE, row += tile_bytes)
        s += qdot(row, x + i, cols - i < TILE ? cols - i : TILE);
    return s;
}

/* An f32 row needs no tile buffer: the same tile-wise dot row_fast takes after its
 * copy, so the bits match that path. */
static float row_f32(kvq_dot_fn dot, const uint8_t *row, size_t cols, const float *x)
{
    const float *w = (const float *)(const void *)row;
    float s = 0.0f;
    for (size_t i = 0; i < cols; i += TILE)
        s += dot(w + i, x + i, cols - i < TILE ? cols - i : TILE);
    return s;
}

static kvq_status matvec(uint32_t type, const void *w, int64_t rows, int64_t cols,
                         const float *x, float *y, int fast, kvq_err *err)
{
    size_t row_bytes;
    kvq_status st = kvq_quant_check(type, cols, &row_bytes, err);
    if (st)
        return st;
    const kvq_quant_info *qi = kvq_quant_info_of(type);
    if (rows < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "matvec %s: %lld rows", qi->name,
                           (long long)rows);
    if (rows == 0)
        return KVQ_OK;
    if (!y || (cols > 0 && (!w || !x)))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "matvec %s: NULL weight, x or y", qi->name);
    const size_t tile_bytes = TILE / qi->block_elems * qi->block_bytes;
    const kvq_dequant_fn deq = fast ? kvq_quant_fast_kernel(type) : kvq_quant_kernel(type, 0);
    const kvq_dot_fn dot = fast_dot();
    /* the fused tile, where the type has one at the dot kernel's level (same bits) */
    const kvq_qdot_fn qdot = fast && kvq_quant_dot_kernel(kvq_half_simd_level()) == dot
                                 ? kvq_quant_qdot_kernel(type, kvq_half_simd_level()) : NULL;
    const uint8_t *base = w;
    const int f32 = fast && type == KVQ_GGML_F32 && (uintptr_t)w % sizeof(float) == 0;
    const int par = fast && (double)rows * (double)cols >= MATVEC_PARALLEL_MIN;
    (void)par; /* unused where OpenMP pragmas are ignored */
#pragma omp parallel for schedule(static) if (par)
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = base + (size_t)r * row_bytes;
        y[r] = f32    ? row_f32(dot, row, (size_t)cols, x)
               : qdot ? row_fused(qdot, row, tile_bytes, (size_t)cols, x)
               : fast ? row_fast(deq, dot, row, tile_bytes, (size_t)cols, x)
                      : row_ref(deq, row, tile_bytes, (size_t)cols, x);
    }
    return KVQ_OK;
}

kvq_status kvq_quant_matvec_ref(uint32_t type, const void *w, int64_t rows, int64_t cols,
                                const float *x, float *y, kvq_err *err)
{
    return matvec(type, w, rows, cols, x, y, 0, err);
}

kvq_status kvq_quant_matvec(uint32_t type, const void *w, int64_t rows, int64_t cols,
                            const float *x, float *y, kvq_err *err)
{
    return matvec(type, w, rows, cols, x, y, 1, err);
}
