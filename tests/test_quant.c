/* test_quant.c — kvq/quant.h: every supported ggml block type dequantized by the
 * scalar reference and by every fast path this CPU runs, bit for bit against the
 * `gguf` PyPI package's numpy dequantization (tests/data/quant_golden.bin, written by
 * scripts/gen_quant_golden.py; never by kvq); the rows API; the fused matvec against
 * dequantize-then-dot within its documented bound; unsupported types refused by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/quant_simd.h"
#include "kvq/gguf.h"
#include "kvq/half.h"
#include "kvq/quant.h"
#include "kvq/util.h"

#define GOLDEN "tests/data/quant_golden.bin"

typedef struct golden {
    uint32_t type, nblocks, block_bytes, block_elems;
    uint8_t *blocks;  /* [nblocks * block_bytes] */
    float *values;    /* [nblocks * block_elems], gguf's dequantization */
} golden;

static golden g_types[16];
static int g_count;

static uint32_t rd_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int load_golden(void **state)
{
    FILE *f = fopen(GOLDEN, "rb");
    if (!f) {
        fprintf(stderr, "test_quant: cannot open %s (run from the repository root)\n", GOLDEN);
        return -1;
    }
    static uint8_t buf[1 << 17];
    const size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    if (len < 12 || memcmp(buf, "KVQQGLD1", 8) != 0)
        return -1;
    size_t off = 12;
    g_count = (int)rd_u32(buf + 8);
    for (int i = 0; i < g_count && i < 16; i++) {
        golden *g = &g_types[i];
        if (off + 16 > len)
            return -1;
        g->type = rd_u32(buf + off), g->nblocks = rd_u32(buf + off + 4);
        g->block_bytes = rd_u32(buf + off + 8), g->block_elems = rd_u32(buf + off + 12);
        off += 16;
        const size_t nb = (size_t)g->nblocks * g->block_bytes;
        const size_t nv = (size_t)g->nblocks * g->block_elems;
        if (off + nb + 4 * nv > len)
            return -1;
        g->blocks = malloc(nb);
        g->values = malloc(4 * nv);
        memcpy(g->blocks, buf + off, nb);
        for (size_t k = 0; k < nv; k++) { /* little-endian f32 */
            const uint32_t u = rd_u32(buf + off + nb + 4 * k);
            memcpy(&g->values[k], &u, 4);
        }
        off += nb + 4 * nv;
    }
    return off == len ? 0 : -1;
}

static int free_golden(void **state)
{
    for (int i = 0; i < g_count; i++)
        free(g_types[i].blocks), free(g_types[i].values);
    return 0;
}

static size_t n_values(const golden *g) { return (size_t)g->nblocks * g->block_elems; }

/* The file holds the ten block types, with ggml's block layouts. */
static void test_table(void **state)
{
    static const uint32_t want[] = {KVQ_GGML_Q4_0, KVQ_GGML_Q4_1, KVQ_GGML_Q5_0, KVQ_GGML_Q5_1,
                                    KVQ_GGML_Q8_0, KVQ_GGML_Q2_K, KVQ_GGML_Q3_K, KVQ_GGML_Q4_K,
                                    KVQ_GGML_Q5_K, KVQ_GGML_Q6_K};
    assert_int_equal(g_count, 10);
    for (int i = 0; i < 10; i++) {
        const kvq_quant_info *qi = kvq_quant_info_of(want[i]);
        assert_non_null(qi);
        assert_int_equal(g_types[i].type, want[i]);
        assert_int_equal(qi->type, want[i]);
        assert_true(qi->supported);
        assert_int_equal(qi->block_elems, g_types[i].block_elems);
        assert_int_equal(qi->block_bytes, g_types[i].block_bytes);
        assert_string_equal(kvq_ggml_type_name(want[i]), qi->name);
    }
    static const uint32_t floats[] = {KVQ_GGML_F32, KVQ_GGML_F16, KVQ_GGML_BF16};
    for (int i = 0; i < 3; i++)
        assert_true(kvq_quant_supported(floats[i]));
    static const uint32_t refused[] = {KVQ_GGML_Q8_1, KVQ_GGML_Q8_K, 16, 20, 23, 29, 34, 39,
                                       KVQ_GGML_I8, KVQ_GGML_F64};
    for (int i = 0; i < 10; i++) {
        assert_non_null(kvq_quant_info_of(refused[i]));
        assert_false(kvq_quant_supported(refused[i]));
    }
    assert_null(kvq_quant_info_of(4));
    assert_null(kvq_quant_info_of(1000));
    assert_false(kvq_quant_supported(1000));
}

/* Runs kernel fn on the golden blocks at an odd address for the first k blocks and
 * checks the bits and that nothing past k values was written. */
static void check_kernel(kvq_dequant_fn fn, const golden *g, const char *what)
{
    const size_t nv = n_values(g), nb = (size_t)g->nblocks * g->block_bytes;
    uint8_t *src = malloc(nb + 1);
    float *out = malloc(4 * (nv + 1));
    memcpy(src + 1, g->blocks, nb);
    for (uint32_t k = 0; k <= g->nblocks; k++) {
        const size_t n = (size_t)k * g->block_elems;
        memset(out, 0xee, 4 * (nv + 1));
        fn(src + 1, out, n);
        if (memcmp(out, g->values, 4 * n) != 0) {
            for (size_t i = 0; i < n; i++)
                if (memcmp(&out[i], &g->values[i], 4) != 0)
                    fail_msg("%s %s: value %zu is %.9g, gguf says %.9g", kvq_ggml_type_name(g->type),
                             what, i, out[i], g->values[i]);
        }
        uint32_t sentinel;
        memcpy(&sentinel, &out[n], 4);
        assert_int_equal(sentinel, 0xeeeeeeeeu);
    }
    free(src);
    free(out);
}

/* Reference, dispatching entry point and every kernel the CPU runs == gguf, bit for bit. */
static void test_golden_dequant(void **state)
{
    for (int i = 0; i < g_count; i++) {
        const golden *g = &g_types[i];
        const size_t nv = n_values(g);
        float *out = malloc(4 * nv);
        kvq_err err = {0};
        assert_int_equal(kvq_dequantize_ref(g->type, g->blocks, out, nv, &err), KVQ_OK);
        assert_memory_equal(out, g->values, 4 * nv);
        memset(out, 0, 4 * nv);
        assert_int_equal(kvq_dequantize(g->type, g->blocks, out, nv, &err), KVQ_OK);
        assert_memory_equal(out, g->values, 4 * nv);
        check_kernel(kvq_quant_kernel(g->type, KVQ_SIMD_SCALAR), g, "reference");
        check_kernel(kvq_quant_fast_kernel(g->type), g, "fast path");
        if (kvq_half_simd_level() >= KVQ_SIMD_AVX2 && kvq_quant_kernel(g->type, KVQ_SIMD_AVX2))
            check_kernel(kvq_quant_kernel(g->type, KVQ_SIMD_AVX2), g, "avx2");
        if (kvq_half_simd_level() >= KVQ_SIMD_AVX512 && kvq_quant_kernel(g->type, KVQ_SIMD_AVX512))
            check_kernel(kvq_quant_kernel(g->type, KVQ_SIMD_AVX512), g, "avx512");
        /* a partial block is refused, not truncated */
        assert_int_equal(kvq_dequantize(g->type, g->blocks, out, g->block_elems + 1, &err),
                         KVQ_E_INVALID_ARG);
        assert_non_null(strstr(err.msg, kvq_ggml_type_name(g->type)));
        free(out);
    }
}

/* The golden blocks as a [rows x cols] weight: every row range == the golden slice. */
static void test_rows(void **state)
{
    for (int i = 0; i < g_count; i++) {
        const golden *g = &g_types[i];
        const int64_t cols = 2 * (int64_t)g->block_elems;
        const int64_t rows = (int64_t)n_values(g) / cols;
        float *out = malloc(4 * n_values(g));
        kvq_err err = {0};
        for (int64_t r0 = 0; r0 <= rows; r0++)
            for (int64_t r1 = r0; r1 <= rows; r1++) {
                memset(out, 0xee, 4 * n_values(g));
                assert_int_equal(kvq_dequantize_rows(g->type, g->blocks, rows, cols, r0, r1, out,
                                                     &err),
                                 KVQ_OK);
                assert_memory_equal(out, g->values + r0 * cols, 4 * (size_t)((r1 - r0) * cols));
            }
        assert_int_equal(kvq_dequantize_rows(g->type, g->blocks, rows, cols, 1, rows + 1, out, &err),
                         KVQ_E_INVALID_ARG);
        assert_int_equal(kvq_dequantize_rows(g->type, g->blocks, rows, cols, 2, 1, out, &err),
                         KVQ_E_INVALID_ARG);
        assert_int_equal(kvq_dequantize_rows(g->type, g->blocks, rows, cols + 1, 0, 1, out, &err),
                         KVQ_E_INVALID_ARG);
        /* kvq_gguf_rows_to_f32 goes through the same kernels */
        const kvq_gguf_tensor t = {.name = "w", .ndim = 2, .ne = {cols, rows, 1, 1},
                                   .type = g->type, .nbytes = (size_t)g->nblocks * g->block_bytes,
                                   .data = g->blocks};
        assert_int_equal(kvq_gguf_rows_to_f32(&t, 1, rows - 1, out, &err), KVQ_OK);
        assert_memory_equal(out, g->values + cols, 4 * (size_t)((rows - 1) * cols));
        free(out);
    }
}

/* Fast paths == reference on unrestricted random bytes: every f16 scale, NaN and Inf
 * included (payloads too), at an odd address. */
static void test_random_bytes(void **state)
{
    kvq_rng rng;
    kvq_rng_seed(&rng, 23);
    for (int i = 0; i < g_count; i++) {
        const golden *g = &g_types[i];
        const size_t nb = 64, nv = nb * g->block_elems, bytes = nb * g->block_bytes;
        uint8_t *raw = malloc(bytes + 1);
        float *ref = malloc(4 * nv), *out = malloc(4 * nv);
        for (int round = 0; round < 8; round++) {
            for (size_t k = 0; k < bytes + 1; k++)
                raw[k] = (uint8_t)kvq_rng_u64(&rng);
            kvq_quant_kernel(g->type, KVQ_SIMD_SCALAR)(raw + 1, ref, nv);
            for (int level = KVQ_SIMD_AVX2; level <= kvq_half_simd_level(); level++) {
                const kvq_dequant_fn fn = kvq_quant_kernel(g->type, level);
                if (!fn)
                    continue;
                fn(raw + 1, out, nv);
                for (size_t k = 0; k < nv; k++)
                    if (memcmp(&out[k], &ref[k], 4) != 0)
                        fail_msg("%s level %d: value %zu is %.9g, reference %.9g",
                                 kvq_ggml_type_name(g->type), level, k, out[k], ref[k]);
            }
        }
        free(raw), free(ref), free(out);
    }
}

/* ---- matvec ---------------------------------------------------------------------- */

typedef struct err_stats {
    double max_rel;  /* max over rows of |y - exact| / sum |w x| */
    double max_abs;  /* max |y - exact| */
    double max_bound_ratio; /* max |y_fast - y_ref| / documented bound */
} err_stats;

/* exact: dot in double of the given dequantized values (the spec); s: sum |w x|. */
static void dot_exact(const float *w, const float *x, int64_t cols, double *exact, double *s)
{
    double d = 0, a = 0;
    for (int64_t i = 0; i < cols; i++) {
        d += (double)w[i] * (double)x[i];
        a += fabs((double)w[i] * (double)x[i]);
    }
    *exact = d;
    *s = a;
}

/* values: [rows x cols] dequantized (gguf's, or the verified reference's). Checks the
 * reference matvec bit for bit and the fast one within the bound of kvq/quant.h. */
static void check_matvec(uint32_t type, const void *w, const float *values, int64_t rows,
                         int64_t cols, const float *x, err_stats *st)
{
    float *yr = malloc(4 * (size_t)rows), *yf = malloc(4 * (size_t)rows);
    kvq_err err = {0};
    assert_int_equal(kvq_quant_matvec_ref(type, w, rows, cols, x, yr, &err), KVQ_OK);
    assert_int_equal(kvq_quant_matvec(type, w, rows, cols, x, yf, &err), KVQ_OK);
    for (int64_t r = 0; r < rows; r++) {
        double exact, s;
        dot_exact(values + r * cols, x, cols, &exact, &s);
        assert_true(yr[r] == (float)exact);
        const double bound = (double)(cols + 2) * ldexp(1.0, -24) * s;
        const double e = fabs((double)yf[r] - (double)yr[r]);
        if (e > bound)
            fail_msg("%s matvec row %lld: fast %.9g, reference %.9g, bound %.3g",
                     kvq_ggml_type_name(type), (long long)r, yf[r], yr[r], bound);
        const double ea = fabs((double)yf[r] - exact);
        if (s > 0 && ea / s > st->max_rel)
            st->max_rel = ea / s;
        if (ea > st->max_abs)
            st->max_abs = ea;
        if (bound > 0 && e / bound > st->max_bound_ratio)
            st->max_bound_ratio = e / bound;
    }
    free(yr);
    free(yf);
}

/* Offsets of the f16 scale fields in a block (as in scripts/gen_quant_golden.py). */
static int scale_offsets(uint32_t type, int off[2])
{
    switch (type) {
    case KVQ_GGML_Q4_1: case KVQ_GGML_Q5_1: case KVQ_GGML_Q4_K: case KVQ_GGML_Q5_K:
        off[0] = 0, off[1] = 2; return 2;
    case KVQ_GGML_Q2_K: off[0] = 80, off[1] = 82; return 2;
    case KVQ_GGML_Q3_K: off[0] = 108; return 1;
    case KVQ_GGML_Q6_K: off[0] = 208; return 1;
    default: off[0] = 0; return 1;
    }
}

/* Random blocks with finite scales, for sizes beyond the golden file. */
static uint8_t *random_blocks(uint32_t type, size_t nblocks, kvq_rng *rng)
{
    const kvq_quant_info *qi = kvq_quant_info_of(type);
    uint8_t *b = malloc(nblocks * qi->block_bytes);
    for (size_t i = 0; i < nblocks * qi->block_bytes; i++)
        b[i] = (uint8_t)kvq_rng_u64(rng);
    int off[2];
    const int nf = scale_offsets(type, off);
    for (size_t i = 0; i < nblocks; i++)
        for (int f = 0; f < nf; f++) {
            const float v = (float)(kvq_rng_normal(rng) * 0.05);
            const uint16_t h = kvq_f32_to_f16_ref(v);
            b[i * qi->block_bytes + off[f]] = (uint8_t)h;
            b[i * qi->block_bytes + off[f] + 1] = (uint8_t)(h >> 8);
        }
    return b;
}

static void test_matvec(void **state)
{
    kvq_rng rng;
    kvq_rng_seed(&rng, 11);
    for (int i = 0; i < g_count; i++) {
        const golden *g = &g_types[i];
        err_stats st = {0};
        /* golden: [rows x 2 blocks], values from gguf */
        const int64_t cols = 2 * (int64_t)g->block_elems;
        const int64_t rows = (int64_t)n_values(g) / cols;
        float *x = malloc(4 * 4096);
        for (int k = 0; k < 4096; k++)
            x[k] = (float)kvq_rng_normal(&rng);
        check_matvec(g->type, g->blocks, g->values, rows, cols, x, &st);
        /* larger: 64 x 4096 (split across threads), values from the verified reference */
        const int64_t R = 64, C = 4096;
        const size_t nb = (size_t)(R * C) / g->block_elems;
        uint8_t *w = random_blocks(g->type, nb, &rng);
        float *ref = malloc(4 * (size_t)(R * C)), *fast = malloc(4 * (size_t)(R * C));
        kvq_err err = {0};
        assert_int_equal(kvq_dequantize_ref(g->type, w, ref, (size_t)(R * C), &err), KVQ_OK);
        assert_int_equal(kvq_dequantize(g->type, w, fast, (size_t)(R * C), &err), KVQ_OK);
        assert_memory_equal(ref, fast, 4 * (size_t)(R * C));
        check_matvec(g->type, w, ref, R, C, x, &st);
        printf("matvec %-5s fast vs dequantize-then-dot: max |err| / sum|w x| = %.2e, "
               "max |err| = %.2e, max |fast - ref| / bound = %.2e\n",
               kvq_ggml_type_name(g->type), st.max_rel, st.max_abs, st.max_bound_ratio);
        free(w), free(ref), free(fast), free(x);
    }
}

/* Every dot kernel the CPU runs (the matvec uses the best one only) within the bound,
 * at every length 0..300 including ragged tails. */
/* Each fused dequantize-and-dot tile equals the level's dequantizer followed by its
 * dot kernel, bit for bit, and kvq_quant_matvec equals that row by row. */
static void test_fused_tiles(void **state)
{
    kvq_rng rng;
    kvq_rng_seed(&rng, 23);
    /* tiles of 256, 256, 256 and a short one of 64 for 32-value blocks; five whole
     * tiles (blocks) for the 256-value K blocks */
    enum { C32 = 576 + 256, C256 = 1280 };
    float x[C256], buf[256];
    for (int k = 0; k < C256; k++)
        x[k] = (float)kvq_rng_normal(&rng);
    int found = 0;
    for (uint32_t type = 0; type < 64; type++) {
        if (!kvq_quant_supported(type))
            continue;
        const kvq_quant_info *qi = kvq_quant_info_of(type);
        const int C = qi->block_elems == 256 ? C256 : C32;
        for (int level = KVQ_SIMD_SCALAR; level <= kvq_half_simd_level(); level++) {
            const kvq_qdot_fn qdot = kvq_quant_qdot_kernel(type, level);
            if (!qdot || C % qi->block_elems)
                continue;
            found++;
            const kvq_dequant_fn deq = kvq_quant_fast_kernel(type);
            const kvq_dot_fn dot = kvq_quant_dot_kernel(level);
            const int R = 7;
            const size_t row_bytes = C / qi->block_elems * qi->block_bytes;
            uint8_t *w = random_blocks(type, (size_t)R * C / qi->block_elems, &rng);
            float y[7];
            kvq_err err = {0};
            assert_int_equal(kvq_quant_matvec(type, w, R, C, x, y, &err), KVQ_OK);
            for (int r = 0; r < R; r++) {
                float want = 0.0f;
                for (int i = 0; i < C; i += 256) {
                    const int k = C - i < 256 ? C - i : 256;
                    const uint8_t *t = w + r * row_bytes + (size_t)i / qi->block_elems * qi->block_bytes;
                    deq(t, buf, (size_t)k);
                    const float d = dot(buf, x + i, (size_t)k), f = qdot(t, x + i, (size_t)k);
                    assert_memory_equal(&d, &f, sizeof f);
                    want += d;
                }
                if (level == kvq_half_simd_level())
                    assert_memory_equal(&want, &y[r], sizeof want);
            }
            free(w);
        }
    }
    printf("fused dequantize-and-dot tiles checked: %d (type, level) pairs\n", found);
    /* Q4_1, Q8_0, Q4_K and Q6_K have one at each SIMD level: none skipped by its shape */
    assert_true(found >= 4 * kvq_half_simd_level());
}

static void test_dot_kernels(void **state)
{
    kvq_rng rng;
    kvq_rng_seed(&rng, 17);
    enum { N = 300 };
    float a[N], b[N];
    for (int k = 0; k < N; k++)
        a[k] = (float)kvq_rng_normal(&rng), b[k] = (float)kvq_rng_normal(&rng);
    for (int level = KVQ_SIMD_SCALAR; level <= kvq_half_simd_level(); level++) {
        const kvq_dot_fn dot = kvq_quant_dot_kernel(level);
        assert_non_null(dot);
        for (int n = 0; n <= N; n++) {
            double exact, s;
            dot_exact(a, b, n, &exact, &s);
            const double e = fabs((double)dot(a, b, (size_t)n) - exact);
            assert_true(e <= (double)(n + 2) * ldexp(1.0, -24) * s);
        }
    }
}

/* F32 / F16 / BF16 through the same API (odd address, odd sizes). */
static void test_float_types(void **state)
{
    kvq_rng rng;
    kvq_rng_seed(&rng, 3);
    enum { N = 777 };
    uint8_t *raw = malloc(4 * N + 1);
    float *want = malloc(4 * N), *out = malloc(4 * N), *x = malloc(4 * N);
    for (int k = 0; k < N; k++)
        x[k] = (float)kvq_rng_normal(&rng);
    kvq_err err = {0};
    static const uint32_t types[] = {KVQ_GGML_F32, KVQ_GGML_F16, KVQ_GGML_BF16};
    for (int t = 0; t < 3; t++) {
        for (int k = 0; k < N; k++) {
            const float v = (float)kvq_rng_normal(&rng);
            const uint16_t h = types[t] == KVQ_GGML_F16 ? kvq_f32_to_f16_ref(v) : kvq_f32_to_bf16_ref(v);
            if (types[t] == KVQ_GGML_F32)
                memcpy(raw + 1 + 4 * k, &v, 4), want[k] = v;
            else
                raw[1 + 2 * k] = (uint8_t)h, raw[2 + 2 * k] = (uint8_t)(h >> 8),
                want[k] = types[t] == KVQ_GGML_F16 ? kvq_f16_to_f32_ref(h) : kvq_bf16_to_f32_ref(h);
        }
        assert_int_equal(kvq_dequantize_ref(types[t], raw + 1, out, N, &err), KVQ_OK);
        assert_memory_equal(out, want, 4 * N);
        assert_int_equal(kvq_dequantize(types[t], raw + 1, out, N, &err), KVQ_OK);
        assert_memory_equal(out, want, 4 * N);
        err_stats st = {0};
        check_matvec(types[t], raw + 1, want, 7, N / 7, x, &st);
    }
    free(raw), free(want), free(out), free(x);
}

/* IQ2_XXS (and every other type kvq does not compute) is refused by name. */
static void test_unsupported(void **state)
{
    kvq_err err = {0};
    uint8_t blocks[66 * 2] = {0};
    float out[512], x[512] = {0}, y[2];
    assert_int_equal(kvq_quant_check(16, 256, NULL, &err), KVQ_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "IQ2_XXS"));
    memset(&err, 0, sizeof err);
    assert_int_equal(kvq_dequantize(16, blocks, out, 256, &err), KVQ_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "IQ2_XXS"));
    assert_int_equal(kvq_dequantize_ref(16, blocks, out, 256, &err), KVQ_E_UNSUPPORTED);
    assert_int_equal(kvq_dequantize_rows(16, blocks, 2, 256, 0, 2, out, &err), KVQ_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "IQ2_XXS"));
    memset(&err, 0, sizeof err);
    assert_int_equal(kvq_quant_matvec(16, blocks, 2, 256, x, y, &err), KVQ_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "IQ2_XXS"));
    assert_int_equal(kvq_quant_matvec_ref(KVQ_GGML_Q8_K, blocks, 0, 256, x, y, &err),
                     KVQ_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "Q8_K"));
    assert_int_equal(kvq_quant_check(4, 32, NULL, &err), KVQ_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "unknown ggml type 4"));
    /* through the GGUF tensor conversion, naming the tensor and the type */
    const kvq_gguf_tensor t = {.name = "blk.0.attn_q.weight", .ndim = 2, .ne = {256, 2, 1, 1},
                               .type = 16, .nbytes = sizeof blocks, .data = blocks};
    assert_int_equal(kvq_gguf_rows_to_f32(&t, 0, 2, out, &err), KVQ_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "IQ2_XXS"));
    assert_non_null(strstr(err.msg, "blk.0.attn_q.weight"));
    /* bad sizes of a supported type */
    size_t rb = 0;
    assert_int_equal(kvq_quant_check(KVQ_GGML_Q4_K, 255, &rb, &err), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_quant_check(KVQ_GGML_Q4_K, 512, &rb, &err), KVQ_OK);
    assert_int_equal(rb, 288);
    assert_int_equal(kvq_quant_matvec(KVQ_GGML_Q4_0, blocks, -1, 32, x, y, &err),
                     KVQ_E_INVALID_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),       cmocka_unit_test(test_golden_dequant),
        cmocka_unit_test(test_random_bytes), cmocka_unit_test(test_rows),
        cmocka_unit_test(test_matvec),
        cmocka_unit_test(test_dot_kernels), cmocka_unit_test(test_fused_tiles), cmocka_unit_test(test_float_types),
        cmocka_unit_test(test_unsupported),
    };
    return cmocka_run_group_tests(tests, load_golden, free_golden);
}
