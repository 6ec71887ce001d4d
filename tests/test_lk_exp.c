/* test_lk_exp.c — the profile's exponential and softmax kernels (thresholds/lk_kernels.h:
 * thr_lk_exp1, expsum, maxf).
 *
 * Accuracy: thr_lk_exp1 within 2 ulp of e^x, the expected value from libm's double exp
 * rounded to float (an independent implementation), over a dense sweep of its domain
 * [THR_EXP_LO, THR_EXP_HI], the score differences the profile feeds it (x <= 0) densest;
 * a deliberately wrong exponential (the low part of ln 2 left out of the reduction)
 * fails the same check. Outside the domain: 0 below, finite at the top, NaN kept.
 * Bit equality: every SIMD level's expsum (outputs and the f64 sum of eight partial
 * sums) and maxf equal the scalar ones for lengths with and without tails, in place
 * and not, so the profile's bytes do not depend on the CPU's ISA or the thread count. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "thresholds/lk_kernels.h"

/* Distance in units in the last place between two finite floats of the same sign. */
static int64_t ulp_dist(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    const int64_t d = (int64_t)ia - ib;
    return d < 0 ? -d : d;
}

/* Cephes' reduction with only the high part of ln 2: errors of up to |n| x 2.1e-4 in r. */
static float exp_wrong(float x)
{
    if (!(x >= THR_EXP_LO))
        return 0.0f;
    const float n = (x * THR_EXP_LOG2E + THR_EXP_MAGIC) - THR_EXP_MAGIC;
    const float r = x - n * THR_EXP_C1;
    float p = THR_EXP_P0;
    p = p * r + THR_EXP_P1;
    p = p * r + THR_EXP_P2;
    p = p * r + THR_EXP_P3;
    p = p * r + THR_EXP_P4;
    p = p * r + THR_EXP_P5;
    return ((p * (r * r) + r) + 1.0f) * ldexpf(1.0f, (int)n);
}

/* The largest ulp distance to (float)exp(x) over the sweep. */
static int64_t max_ulp(float (*f)(float))
{
    int64_t worst = 0;
    for (int i = 0; i <= 2000000; i++) { /* x <= 0 densely, as the profile uses it */
        const float x = THR_EXP_LO * (float)i / 2000000.0f;
        const int64_t u = ulp_dist(f(x), (float)exp((double)x));
        worst = u > worst ? u : worst;
    }
    for (int i = 0; i <= 200000; i++) {
        const float x = THR_EXP_HI * (float)i / 200000.0f;
        const int64_t u = ulp_dist(f(x), (float)exp((double)x));
        worst = u > worst ? u : worst;
    }
    return worst;
}

static float exp_right(float x)
{
    return thr_lk_exp1(x);
}

static void test_exp_within_2ulp(void **state)
{
    (void)state;
    const int64_t u = max_ulp(exp_right);
    print_message("thr_lk_exp1: at most %lld ulp from e^x\n", (long long)u);
    assert_true(u <= 2);
    assert_true(max_ulp(exp_wrong) > 2); /* the check can fail */
    assert_true(thr_lk_exp1(0.0f) == 1.0f);
    assert_true(thr_lk_exp1(-100.0f) == 0.0f);
    assert_true(thr_lk_exp1(-INFINITY) == 0.0f);
    assert_true(isfinite(thr_lk_exp1(1000.0f)) && thr_lk_exp1(1000.0f) > 1e38f);
    assert_true(isnan(thr_lk_exp1(NAN)));
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float unif(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0));
}

static void test_simd_equals_scalar(void **state)
{
    (void)state;
    enum { N = 700 };
    float s[N], o0[N], o1[N], io[N];
    for (int i = 0; i < N; i++) /* scores over a wide range, some below the domain */
        s[i] = 120.0f * unif() - 100.0f;
    s[17] = NAN;
    const thr_lk_kernels *ref = thr_lk_kernels_get(0);
    assert_string_equal(ref->name, "scalar");
    for (int level = 1; level <= 2; level++) {
        const thr_lk_kernels *k = thr_lk_kernels_get(level);
        for (int64_t len = 0; len <= N; len += len < 40 ? 1 : 67) {
            const float m0 = ref->maxf(s, len), m1 = k->maxf(s, len);
            assert_memory_equal(&m0, &m1, sizeof m0);
            const int64_t o = len > 20 ? 20 : 0; /* past the NaN: a finite sum */
            const double z0 = ref->expsum(o0, s + o, m0, len - o);
            const double z1 = k->expsum(o1, s + o, m0, len - o);
            assert_memory_equal(&z0, &z1, sizeof z0);
            assert_memory_equal(o0, o1, sizeof(float) * (size_t)(len - o));
            memcpy(io, s + o, sizeof(float) * (size_t)(len - o)); /* in place */
            const double z2 = k->expsum(io, io, m0, len - o);
            assert_memory_equal(&z0, &z2, sizeof z0);
            assert_memory_equal(o0, io, sizeof(float) * (size_t)(len - o));
            for (int64_t j = 0; j < len - o; j++)
                assert_memory_equal(&o0[j], &(float){thr_lk_exp1(s[o + j] - m0)}, 4);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp_within_2ulp),
        cmocka_unit_test(test_simd_equals_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
