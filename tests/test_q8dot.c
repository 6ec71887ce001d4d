/* test_q8dot.c — the q8 activation path (model/q8dot.h): the activation quantizer
 * against its definition; the scalar reference against the product computed in double
 * from the weights as kvq_dequantize_ref gives them (golden-tested against the `gguf`
 * package in test_quant.c) and the dequantized activations d * q; every SIMD kernel
 * this CPU runs equal to the reference bit for bit, on random blocks and on the
 * extremes (u = 15, v = -128 / 127, q = +-127); the driver's bytes independent of the
 * thread count. The same for the prefill GEMM (model/q8gemm.h): its specification
 * against double arithmetic, every level's tiles equal to it bit for bit, the driver's
 * bytes independent of the thread count. The model's logits on this path are compared
 * with llama.cpp's in test_smollm2.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/gguf.h"
#include "kvq/half.h"
#include "kvq/quant.h"
#include "kvq/util.h"
#include "model/q8dot.h"
#include "model/q8gemm.h"

#define COLS 1536
#define ROWS 40

static void random_x(kvq_rng *r, float *x, int n, float scale)
{
    for (int i = 0; i < n; i++)
        x[i] = (float)((kvq_rng_uniform(r) * 2 - 1) * scale);
}

/* Random rows of a type: random quant bytes, d (and m) small random f16. */
static void random_rows(kvq_rng *r, uint32_t type, uint8_t *w, int rows, int extreme)
{
    const int bb = type == KVQ_GGML_Q4_1 ? 20 : 34, head = type == KVQ_GGML_Q4_1 ? 4 : 2;
    for (int b = 0; b < rows * COLS / 32; b++) {
        uint8_t *p = w + (size_t)b * bb;
        const uint16_t d = kvq_f32_to_f16_ref((float)(kvq_rng_uniform(r) * 0.02 + 1e-4));
        const uint16_t m = kvq_f32_to_f16_ref((float)(kvq_rng_uniform(r) * -0.1));
        memcpy(p, &d, 2);
        if (head == 4)
            memcpy(p + 2, &m, 2);
        for (int j = head; j < bb; j++)
            p[j] = extreme ? (type == KVQ_GGML_Q4_1 ? 0xFF : (b % 2 ? 0x80 : 0x7F))
                           : (uint8_t)(kvq_rng_u64(r) & 0xFF);
    }
}

/* The extreme activations: the first of every block +-4 (q = +-127 in every block). */
static void extremes_x(float *x, int n)
{
    for (int i = 0; i < n; i += 32)
        x[i] = i % 64 ? -4.0f : 4.0f;
}

/* Dequantized row wf [COLS] times a's dequantized values in double arithmetic; *mag the
 * sum of the products' magnitudes (the scale of the rounding bounds). */
static double dot_f64(const float *wf, const kvq_q8row *a, double *mag)
{
    double want = 0, m = 0;
    for (int i = 0; i < COLS; i++) {
        const double t = (double)wf[i] * a->ds[2 * (i / 32)] * a->q[i];
        want += t;
        m += fabs(t);
    }
    *mag = m;
    return want;
}

static void test_quantize(void **state)
{
    (void)state;
    kvq_rng r;
    kvq_rng_seed(&r, 7);
    float x[COLS];
    random_x(&r, x, COLS, 3.0f);
    memset(x + 64, 0, 32 * sizeof(float)); /* an all-zero block: d = 0, q = 0 */
    void *buf = aligned_alloc(64, kvq_q8_row_bytes(COLS));
    kvq_q8row a;
    kvq_q8_quantize(x, COLS, buf, &a);
    for (int b = 0; b < COLS / 32; b++) {
        float amax = 0;
        int sum = 0;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[b * 32 + i]));
        const float d = amax / 127.0f;
        assert_true(a.ds[2 * b] == d);
        for (int i = 0; i < 32; i++) {
            const int q = a.q[b * 32 + i];
            assert_true(q >= -127 && q <= 127);
            /* q is the nearest integer to x / d (x * (1 / d) in f32: within 1 ulp) */
            if (d > 0)
                assert_true(fabs(x[b * 32 + i] / d - q) <= 0.5 + 1e-5);
            else
                assert_int_equal(q, 0);
            sum += q;
        }
        assert_true(a.ds[2 * b + 1] == d * (float)sum);
        for (int k = 0; k < 8; k++) {
            const int8_t *q = a.q + b * 32 + 4 * k;
            assert_int_equal(a.c4[b * 8 + k], 128 * (q[0] + q[1] + q[2] + q[3]));
        }
        assert_int_equal(a.c32[b], 128 * sum);
    }
    free(buf);
}

/* The reference against double arithmetic on the dequantized values: f32 rounding of
 * 48 block products and 16 lanes only. */
static void check_type(uint32_t type)
{
    kvq_rng r;
    kvq_rng_seed(&r, 11 + type);
    size_t row_bytes;
    assert_int_equal(kvq_quant_check(type, COLS, &row_bytes, NULL), KVQ_OK);
    uint8_t *w = malloc(row_bytes * ROWS);
    float *x = malloc(sizeof(float) * COLS), *wf = malloc(sizeof(float) * COLS);
    void *buf = aligned_alloc(64, kvq_q8_row_bytes(COLS));
    for (int extreme = 0; extreme < 2; extreme++) {
        random_rows(&r, type, w, ROWS, extreme);
        random_x(&r, x, COLS, 2.0f);
        if (extreme)
            extremes_x(x, COLS);
        kvq_q8row a;
        kvq_q8_quantize(x, COLS, buf, &a);
        for (int row = 0; row < ROWS; row++) {
            const uint8_t *p = w + (size_t)row * row_bytes;
            assert_int_equal(kvq_dequantize_ref(type, p, wf, COLS, NULL), KVQ_OK);
            double mag;
            const double want = dot_f64(wf, &a, &mag);
            const float ref = kvq_q8dot_ref(type, p, &a, COLS / 32);
            assert_true(fabs(ref - want) <= 64 * 0x1p-24 * mag + 1e-30);
            for (int level = 0; level <= 2; level++) {
                kvq_q8dot_fn fn = kvq_q8dot_kernel(type, level);
                if (!fn)
                    continue;
                const float got = fn(p, &a, COLS / 32);
                if (memcmp(&got, &ref, sizeof got) != 0)
                    fail_msg("type %u level %d row %d extreme %d: %.9g != ref %.9g", type, level,
                             row, extreme, got, ref);
            }
        }
    }
    free(buf);
    free(w);
    free(x);
    free(wf);
}

static void test_q4_1(void **state)
{
    (void)state;
    check_type(KVQ_GGML_Q4_1);
}

static void test_q8_0(void **state)
{
    (void)state;
    check_type(KVQ_GGML_Q8_0);
}

static void test_levels_present(void **state)
{
    (void)state;
    assert_non_null(kvq_q8dot_kernel(KVQ_GGML_Q4_1, 0));
    assert_null(kvq_q8dot_kernel(KVQ_GGML_Q4_0, 0));
    for (int level = 0; level <= kvq_q8dot_level(); level++)
        assert_non_null(kvq_q8dot_kernel(KVQ_GGML_Q8_0, level));
    assert_true(kvq_q8_supported(KVQ_GGML_Q4_1, 576));
    assert_false(kvq_q8_supported(KVQ_GGML_Q4_1, 544)); /* an odd number of blocks */
    assert_false(kvq_q8_supported(KVQ_GGML_Q4_K, 576));
}

/* The driver (the four-token kernel where the CPU has one): every (token, row) equal
 * to the reference's, with 1 and 2 threads, beta 1 adding into y, and several
 * matrices in one region (kvq_q8_matmul_multi). */
static void test_matmul_threads(void **state)
{
    (void)state;
    enum { N = 6 }; /* one four-token group and two alone */
    kvq_rng r;
    kvq_rng_seed(&r, 5);
    size_t row_bytes;
    kvq_quant_check(KVQ_GGML_Q4_1, COLS, &row_bytes, NULL);
    const int rows = 256;
    uint8_t *w = malloc(row_bytes * rows);
    random_rows(&r, KVQ_GGML_Q4_1, w, rows, 0);
    float *x = malloc(sizeof(float) * N * COLS);
    random_x(&r, x, N * COLS, 1.0f);
    void *buf = aligned_alloc(64, N * kvq_q8_row_bytes(COLS));
    kvq_q8row a[N];
    for (int t = 0; t < N; t++)
        kvq_q8_quantize(x + t * COLS, COLS, (uint8_t *)buf + t * kvq_q8_row_bytes(COLS), &a[t]);
    float *y1 = malloc(sizeof(float) * N * rows), *y2 = malloc(sizeof(float) * N * rows);
    const int prev = omp_get_max_threads();
    omp_set_num_threads(1);
    kvq_q8_matmul(KVQ_GGML_Q4_1, w, row_bytes, rows, COLS, a, N, y1, rows, 0.0f);
    omp_set_num_threads(2);
    for (int i = 0; i < N * rows; i++)
        y2[i] = 1.0f;
    kvq_q8_matmul(KVQ_GGML_Q4_1, w, row_bytes, rows, COLS, a, N, y2, rows, 1.0f);
    /* the same rows as two matrices of 100 and 156 rows in one region */
    float *ya = malloc(sizeof(float) * N * 100), *yb = malloc(sizeof(float) * N * 156);
    const kvq_q8_mat mats[2] = {{KVQ_GGML_Q4_1, w, row_bytes, 100, ya, 100},
                                {KVQ_GGML_Q4_1, w + 100 * row_bytes, row_bytes, 156, yb, 156}};
    kvq_q8_matmul_multi(mats, 2, COLS, a, N, 0.0f);
    omp_set_num_threads(prev);
    for (int t = 0; t < N; t++)
        for (int i = 0; i < rows; i++) {
            const float ref = kvq_q8dot_ref(KVQ_GGML_Q4_1, w + i * row_bytes, &a[t], COLS / 32);
            assert_true(y1[t * rows + i] == ref);
            assert_true(y2[t * rows + i] == 1.0f + ref);
            assert_true((i < 100 ? ya[t * 100 + i] : yb[t * 156 + i - 100]) == ref);
        }
    free(ya);
    free(yb);
    free(buf);
    free(w);
    free(x);
    free(y1);
    free(y2);
}

/* The prefill GEMM (q8gemm.h): its specification against double arithmetic on the
 * dequantized values (f32 rounding of 48 block products and one sum), every level's
 * kernel on packed tiles equal to it bit for bit: ROWS 40 = two whole tiles and one of
 * 8 rows, 7 tokens = one group of four and three alone, beta 0 and 1, random blocks and
 * the extremes. */
static void check_gemm(uint32_t type)
{
    enum { N = 7 };
    kvq_rng r;
    kvq_rng_seed(&r, 23 + type);
    size_t row_bytes;
    assert_int_equal(kvq_quant_check(type, COLS, &row_bytes, NULL), KVQ_OK);
    const size_t nb = COLS / 32, rb = kvq_q8_row_bytes(COLS);
    uint8_t *w = malloc(row_bytes * ROWS);
    float *x = malloc(sizeof(float) * N * COLS), *wf = malloc(sizeof(float) * COLS);
    float *ref = malloc(sizeof(float) * N * ROWS), *y = malloc(sizeof(float) * N * ROWS);
    void *buf = aligned_alloc(64, N * rb), *tile = aligned_alloc(64, kvq_q8gemm_tile_bytes(nb));
    kvq_q8row a[N];
    for (int extreme = 0; extreme < 2; extreme++) {
        random_rows(&r, type, w, ROWS, extreme);
        random_x(&r, x, N * COLS, 2.0f);
        if (extreme)
            extremes_x(x, N * COLS);
        for (int t = 0; t < N; t++)
            kvq_q8_quantize(x + t * COLS, COLS, (uint8_t *)buf + t * rb, &a[t]);
        for (int row = 0; row < ROWS; row++) {
            const uint8_t *p = w + (size_t)row * row_bytes;
            assert_int_equal(kvq_dequantize_ref(type, p, wf, COLS, NULL), KVQ_OK);
            for (int t = 0; t < N; t++) {
                double mag;
                const double want = dot_f64(wf, &a[t], &mag);
                ref[t * ROWS + row] = kvq_q8gemm_ref(type, p, &a[t], nb);
                assert_true(fabs(ref[t * ROWS + row] - want) <= 64 * 0x1p-24 * mag + 1e-30);
            }
        }
        for (int level = 0; level <= 2; level++) {
            kvq_q8gemm_fn fn = kvq_q8gemm_kernel(level);
            for (int beta = 0; fn && beta < 2; beta++) {
                for (int i = 0; i < N * ROWS; i++)
                    y[i] = beta ? 0.25f * (float)(i % 7) : NAN;
                for (int r0 = 0; r0 < ROWS; r0 += KVQ_Q8G_ROWS) {
                    const int nr = ROWS - r0 < KVQ_Q8G_ROWS ? ROWS - r0 : KVQ_Q8G_ROWS;
                    kvq_q8gemm_pack(type, w + (size_t)r0 * row_bytes, row_bytes, nr, nb, tile);
                    fn(type, tile, nb, a, N, y + r0, ROWS, nr, beta ? 1.0f : 0.0f);
                }
                for (int i = 0; i < N * ROWS; i++) {
                    const float want = beta ? 0.25f * (float)(i % 7) + ref[i] : ref[i];
                    if (memcmp(&y[i], &want, sizeof want) != 0)
                        fail_msg("gemm type %u level %d extreme %d beta %d token %d row %d: "
                                 "%.9g != ref %.9g", type, level, extreme, beta, i / ROWS,
                                 i % ROWS, y[i], want);
                }
            }
        }
    }
    free(tile);
    free(buf);
    free(w);
    free(x);
    free(wf);
    free(ref);
    free(y);
}

static void test_gemm_q4_1(void **state)
{
    (void)state;
    check_gemm(KVQ_GGML_Q4_1);
}

static void test_gemm_q8_0(void **state)
{
    (void)state;
    check_gemm(KVQ_GGML_Q8_0);
}

/* kvq_q8gemm_multi: two matrices (100 and 156 rows: partial tiles) in one region, with 1
 * and 2 threads and beta 1; every value the specification's. */
static void test_gemm_threads(void **state)
{
    (void)state;
    enum { N = 9 };
    kvq_rng r;
    kvq_rng_seed(&r, 6);
    size_t row_bytes;
    kvq_quant_check(KVQ_GGML_Q4_1, COLS, &row_bytes, NULL);
    const int rows = 256;
    uint8_t *w = malloc(row_bytes * rows);
    random_rows(&r, KVQ_GGML_Q4_1, w, rows, 0);
    float *x = malloc(sizeof(float) * N * COLS);
    random_x(&r, x, N * COLS, 1.0f);
    const size_t rb = kvq_q8_row_bytes(COLS);
    void *buf = aligned_alloc(64, N * rb);
    kvq_q8row a[N];
    for (int t = 0; t < N; t++)
        kvq_q8_quantize(x + t * COLS, COLS, (uint8_t *)buf + t * rb, &a[t]);
    float *y[2][2];
    const int prev = omp_get_max_threads();
    for (int th = 0; th < 2; th++) {
        y[th][0] = malloc(sizeof(float) * N * 100);
        y[th][1] = malloc(sizeof(float) * N * 156);
        for (int i = 0; i < N * 100; i++)
            y[th][0][i] = th ? 1.0f : 0.0f;
        for (int i = 0; i < N * 156; i++)
            y[th][1][i] = th ? 1.0f : 0.0f;
        const kvq_q8_mat mats[2] = {
            {KVQ_GGML_Q4_1, w, row_bytes, 100, y[th][0], 100},
            {KVQ_GGML_Q4_1, w + 100 * row_bytes, row_bytes, 156, y[th][1], 156}};
        omp_set_num_threads(th + 1);
        assert_int_equal(kvq_q8gemm_multi(mats, 2, COLS, a, N, th ? 1.0f : 0.0f), 0);
    }
    omp_set_num_threads(prev);
    for (int t = 0; t < N; t++)
        for (int i = 0; i < rows; i++) {
            const float ref = kvq_q8gemm_ref(KVQ_GGML_Q4_1, w + i * row_bytes, &a[t], COLS / 32);
            for (int th = 0; th < 2; th++) {
                const float got = i < 100 ? y[th][0][t * 100 + i] : y[th][1][t * 156 + i - 100];
                assert_true(got == (th ? 1.0f + ref : ref));
            }
        }
    for (int th = 0; th < 2; th++) {
        free(y[th][0]);
        free(y[th][1]);
    }
    free(buf);
    free(w);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize),       cmocka_unit_test(test_q4_1),
        cmocka_unit_test(test_q8_0),           cmocka_unit_test(test_levels_present),
        cmocka_unit_test(test_matmul_threads), cmocka_unit_test(test_gemm_q4_1),
        cmocka_unit_test(test_gemm_q8_0),      cmocka_unit_test(test_gemm_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
