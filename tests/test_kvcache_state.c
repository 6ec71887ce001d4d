/*
 * tests/test_kvcache_state.c — the LeanKV head's state kept between steps
 * (runtime/cache/kvc.h): the kept-row list updated on append, downgrade and prune, and
 * the significance and Algorithm 1's candidates counted in attend's pass, against a
 * recomputation from scratch at every step of long random sequences, bit for bit: the
 * significance of every token by kvc.h's formula over the head's sums, the classes by
 * kvq_rt_lk_generation_step (the scalar Algorithm 1) on those, the list by walking the
 * classes and slots. Steps whose sums are counted outside attend (as
 * kvq_kvcache_count does for retrieval) are mixed in.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cache/kvc.h"

static uint64_t rng_state = 12345;

static double rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* kvc.h's significance of token j after nq queries, from the head's sums. */
static double sig_ref(const kvq_rt_lk_head *H, int64_t j)
{
    const int64_t cnt = H->nq - H->qcum[j] - 1;
    if (cnt <= 0)
        return INFINITY;
    double best = -INFINITY;
    for (int32_t g = 0; g < H->gs; g++)
        best = fmax(best, H->acc[(size_t)j * H->gs + g]);
    return best / (double)cnt;
}

/* The list as walking the classes and slots gives it (when a pool moved since the
 * last read, the list is made again at the next: nothing to check before). */
static void check_list(const kvq_rt_lk_head *H)
{
    int64_t m = 0;
    if (H->list_stale)
        return;
    for (int64_t j = 0; j < H->n; j++) {
        const int c = H->cls[j];
        if (c == KVQ_RT_LK_PRUNED) {
            assert_int_equal(H->slot[j], -1);
            continue;
        }
        const kvq_rt_lk_pool *P = &H->pool[c];
        assert_true(m < H->m);
        assert_int_equal(H->col[m], j);
        assert_ptr_equal(H->kr[m], P->data + (size_t)H->slot[j] * P->row);
        assert_ptr_equal(H->vr[m], P->data + (size_t)H->slot[j] * P->row + P->krow);
        assert_int_equal(H->kb[m], P->kb);
        assert_int_equal(H->vb[m], P->vb);
        m++;
    }
    assert_int_equal(H->m, m);
}

/* n_steps generation steps after a prompt of `prompt` tokens; every `aside`-th step
 * counts its sums outside attend (random probabilities over the kept tokens). */
static void run(double alpha_h, double alpha_l, int32_t window, int32_t gs, int64_t prompt,
                int64_t n_steps, int aside, int64_t *pruned, int64_t *low)
{
    enum { D = 64 };
    kvq_rt_lk_params p = kvq_rt_lk_params_default();
    p.alpha_h = alpha_h, p.alpha_l = alpha_l, p.window = window;
    kvq_rt_lk_head H;
    kvq_err err = {0};
    assert_int_equal(kvq_rt_lk_head_init(&H, D, gs, &p, &err), KVQ_OK);
    float k[D], v[D], q[8 * D], o[8 * D];
    const int64_t N = prompt + n_steps;
    double *sig = malloc(sizeof(double) * (size_t)N);
    uint8_t *cls = malloc((size_t)N);
    int64_t moved = 0;
    for (int64_t n = 1; n <= N; n++) {
        const double spread = 1.0 + 3.0 * (n % 5 == 0); /* some peaked queries */
        for (int32_t t = 0; t < D; t++)
            k[t] = (float)(2 * rnd() + (n % 7 == 0 ? 1.5 : 0)), v[t] = (float)rnd();
        for (int32_t t = 0; t < gs * D; t++)
            q[t] = (float)(spread * rnd());
        assert_int_equal(kvq_rt_lk_append(&H, k, v, &err), KVQ_OK);
        if (H.prompt_done && aside > 0 && n % aside == 0) {
            for (int64_t j = 0; j + 1 < n; j++) /* kvq_kvcache_count's counting */
                if (H.cls[j] != KVQ_RT_LK_PRUNED)
                    for (int32_t g = 0; g < gs; g++)
                        H.acc[(size_t)j * gs + g] += 0.5 * (1 + rnd()) / (double)n;
            H.nq++;
        } else {
            kvq_rt_lk_attend(&H, q, 0.125f, o);
            if (H.prompt_done) { /* read: never stale after it */
                assert_int_equal(H.list_stale, 0);
                check_list(&H);
            }
        }
        if (!H.prompt_done) {
            if (n == prompt)
                assert_int_equal(kvq_rt_lk_end_prompt(&H, &err), KVQ_OK);
            else
                continue;
        } else {
            for (int64_t j = 0; j < n; j++)
                sig[j] = sig_ref(&H, j);
            memcpy(cls, H.cls, (size_t)n);
            kvq_rt_lk_generation_step(sig, n, &p, cls);
            assert_int_equal(kvq_rt_lk_step(&H, &err), KVQ_OK);
            assert_memory_equal(H.sig, sig, sizeof(double) * (size_t)n);
            assert_memory_equal(H.cls, cls, (size_t)n);
        }
        check_list(&H);
        moved += H.list_stale;
    }
    assert_true(moved > 0); /* the pools grew: the list was made again */
    for (int64_t j = 0; j < N; j++) {
        *pruned += H.cls[j] == KVQ_RT_LK_PRUNED;
        *low += H.cls[j] == KVQ_RT_LK_LOW;
    }
    int64_t np = 0;
    for (int64_t i = 0; i < H.npruned; i++)
        np += H.cls[H.pruned[i]] == KVQ_RT_LK_PRUNED;
    assert_int_equal(np, H.npruned);
    assert_int_equal(np, *pruned);
    kvq_rt_lk_head_free(&H);
    free(sig), free(cls);
}

static void test_state_equals_scratch(void **state)
{
    (void)state;
    int64_t pr = 0, lo = 0;
    run(3.0, 0.8, 16, 3, 200, 3000, 0, &pr, &lo); /* downgrades and prunes */
    assert_true(pr > 100 && lo > 100);
    pr = lo = 0;
    run(3.0, 0.8, 16, 4, 100, 1500, 7, &pr, &lo); /* with steps counted outside attend */
    assert_true(pr > 50 && lo > 50);
    pr = lo = 0;
    run(2.0, 0.5, 0, 2, 64, 1000, 0, &pr, &lo); /* window 0: the new token leaves at once */
    assert_true(pr > 0);
    pr = lo = 0;
    run(0.0, 0.0, 8, 3, 30, 500, 3, &pr, &lo); /* alpha 0: every token kept HIGH */
    assert_int_equal(pr + lo, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_equals_scratch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
