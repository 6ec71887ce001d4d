/* test_rope.c — RoPE against its matrix form, layouts, scaling. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "kvq.h"
#include "kvq/rope.h"

/* apply() and matrix() are written independently; they must agree, per layout. */
static void test_apply_equals_matrix(void **state)
{
    for (int layout = 0; layout < 2; layout++) {
        kvq_rope r = kvq_rope_default(16);
        r.layout = (kvq_rope_layout)layout;
        double theta[8], R[16 * 16];
        kvq_rope_freqs(&r, theta);
        float x[16], y[16];
        for (int i = 0; i < 16; i++)
            x[i] = (float)(0.1 * i - 0.7);
        for (int64_t p = 0; p < 3000; p += 997) {
            memcpy(y, x, sizeof x);
            kvq_rope_apply(&r, theta, y, 1, p);
            kvq_rope_matrix(&r, p, R);
            for (int j = 0; j < 16; j++) {
                double acc = 0;
                for (int i = 0; i < 16; i++)
                    acc += x[i] * R[i * 16 + j];
                assert_true(fabs(acc - y[j]) < 1e-5);
            }
        }
    }
}

/* Rotation preserves norms; R_a R_b = R_(a+b); relative-position property of scores. */
static void test_rotation_properties(void **state)
{
    kvq_rope r = kvq_rope_default(8);
    r.layout = KVQ_ROPE_HALF;
    double A[64], B[64], C[64];
    kvq_rope_matrix(&r, 5, A);
    kvq_rope_matrix(&r, 7, B);
    kvq_rope_matrix(&r, 12, C);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) {
            double acc = 0;
            for (int k = 0; k < 8; k++)
                acc += A[i * 8 + k] * B[k * 8 + j];
            assert_true(fabs(acc - C[i * 8 + j]) < 1e-12);
        }
}

/* The same head described in both layouts gives the same rotated vector, permuted. */
static void test_layout_permutation(void **state)
{
    kvq_rope ri = kvq_rope_default(8), rh = kvq_rope_default(8);
    rh.layout = KVQ_ROPE_HALF;
    double theta[4];
    kvq_rope_freqs(&ri, theta);
    float xh[8] = {1, -2, 3, 0.5f, -1, 4, 2, -3}, xi[8], back[8];
    kvq_rope_half_to_interleaved(xh, xi, 8);
    kvq_rope_interleaved_to_half(xi, back, 8);
    assert_memory_equal(back, xh, sizeof xh);
    kvq_rope_apply(&rh, theta, xh, 1, 123);
    kvq_rope_apply(&ri, theta, xi, 1, 123);
    kvq_rope_interleaved_to_half(xi, back, 8);
    for (int i = 0; i < 8; i++)
        assert_true(fabsf(back[i] - xh[i]) < 1e-6f);
}

/* llama2.c: freq = 1 / 10000^(2m/d); position 1 rotates pair m by exactly that angle. */
static void test_freqs_and_scaling(void **state)
{
    kvq_rope r = kvq_rope_default(8);
    double t[4];
    kvq_rope_freqs(&r, t);
    assert_true(fabs(t[0] - 1.0) < 1e-15);
    assert_true(fabs(t[1] - 0.1) < 1e-15);
    assert_true(fabs(t[3] - 0.001) < 1e-15);
    r.scaling = KVQ_ROPE_SCALING_LINEAR;
    r.factor = 4;
    kvq_rope_freqs(&r, t);
    assert_true(fabs(t[1] - 0.025) < 1e-15);
    /* llama3 (Llama 3.1 settings): high frequencies unchanged, low divided by factor. */
    kvq_rope l3 = kvq_rope_default(128);
    l3.base = 500000;
    l3.scaling = KVQ_ROPE_SCALING_LLAMA3;
    l3.factor = 8;
    l3.low_freq_factor = 1;
    l3.high_freq_factor = 4;
    l3.original_max_pos = 8192;
    double t3[64], t0[64];
    kvq_rope_freqs(&l3, t3);
    l3.scaling = KVQ_ROPE_SCALING_NONE;
    kvq_rope_freqs(&l3, t0);
    assert_true(t3[0] == t0[0]);
    assert_true(fabs(t3[63] - t0[63] / 8) < 1e-18);
    for (int m = 0; m < 64; m++) {
        double wl = 2 * M_PI / t0[m];
        if (wl < 8192.0 / 4)
            assert_true(t3[m] == t0[m]);
        else if (wl > 8192.0)
            assert_true(fabs(t3[m] - t0[m] / 8) <= 1e-18 + 1e-15 * t0[m]);
        else
            assert_true(t3[m] < t0[m] && t3[m] > t0[m] / 8);
    }
    kvq_err e = {0};
    kvq_rope bad = kvq_rope_default(7);
    assert_int_equal(kvq_rope_check(&bad, &e), KVQ_E_INVALID_ARG);
    bad = kvq_rope_default(8);
    bad.base = 0.5;
    assert_int_equal(kvq_rope_check(&bad, &e), KVQ_E_INVALID_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_apply_equals_matrix),
        cmocka_unit_test(test_rotation_properties),
        cmocka_unit_test(test_layout_permutation),
        cmocka_unit_test(test_freqs_and_scaling),
    };
    return cmocka_run_group_tests_name("rope", tests, NULL, NULL);
}
