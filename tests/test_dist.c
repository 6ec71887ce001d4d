/* test_dist.c — kvq/dist.h without communication: one process (NULL group) and the
 * balanced contiguous split that capture and profile use to share work among ranks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "kvq.h"

static void test_one_process(void **state)
{
    kvq_err e = {0};
    assert_int_equal(kvq_dist_rank(NULL), 0);
    assert_int_equal(kvq_dist_size(NULL), 1);
    kvq_err_set(&e, KVQ_E_IO, "x: broken");
    /* One process: the status and the message come back unchanged. */
    assert_int_equal(kvq_dist_agree(NULL, KVQ_E_IO, &e), KVQ_E_IO);
    assert_string_equal(e.msg, "x: broken");
    assert_int_equal(kvq_dist_share(NULL, KVQ_OK, &e), KVQ_OK);
    int v = 7;
    assert_int_equal(kvq_dist_bcast(NULL, &v, sizeof v, &e), KVQ_OK);
    assert_int_equal(v, 7);
}

/* Every item goes to exactly one rank, in rank order, and each share's cost is within
 * one item of the total / size. */
static void check_split(int64_t n, const double *cost, int32_t size)
{
    double total = 0, maxc = 0;
    for (int64_t i = 0; i < n; i++) {
        const double c = cost ? cost[i] : 1.0;
        total += c;
        maxc = c > maxc ? c : maxc;
    }
    int64_t next = 0;
    for (int32_t r = 0; r < size; r++) {
        int64_t f, e;
        kvq_dist_split(n, cost, r, size, &f, &e);
        assert_true(f <= e);
        if (f < e) {
            assert_int_equal(f, next);
            next = e;
        }
        double share = 0;
        for (int64_t i = f; i < e; i++)
            share += cost ? cost[i] : 1.0;
        assert_true(fabs(share - total / size) <= maxc + 1e-9);
    }
    assert_int_equal(next, n);
}

static void test_split(void **state)
{
    for (int32_t size = 1; size <= 7; size++)
        for (int64_t n = 0; n <= 40; n += 3)
            check_split(n, NULL, size);
    /* 20 heads of which 13 have checkpoints (cost 0.02), as after a killed run. */
    double c[20];
    for (int i = 0; i < 20; i++)
        c[i] = i < 13 ? 0.02 : 1.0;
    for (int32_t size = 1; size <= 5; size++)
        check_split(20, c, size);
    int64_t f, e;
    kvq_dist_split(20, c, 0, 3, &f, &e); /* 7.26 in all: rank 0 gets 13 resumed + 2 */
    assert_int_equal(f, 0);
    assert_int_equal(e, 15);
    /* Sequences of unequal length: balanced by tokens. */
    const double seq[6] = {512, 512, 512, 512, 512, 40};
    check_split(6, seq, 2);
    kvq_dist_split(6, seq, 1, 2, &f, &e);
    assert_int_equal(f, 3);
    assert_int_equal(e, 6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_process),
        cmocka_unit_test(test_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
