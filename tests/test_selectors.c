/* test_selectors.c — the selector interface (runtime/select/selector.h): the registry
 * has a table for every kvq_selector value, under its own id and name, that the public
 * names, parser and artifact rule come from; the bits each selector holds per key are
 * the storage its definition gives (FIER: one bit per channel plus an f32 min and max
 * per channel for every fier_group tokens; Quest: an f32 min and max per channel for
 * every quest_page tokens; the oracle: the f16 key); and a context of each selector
 * that needs no artifact selects the same tokens after a reset (its per-head data
 * cleared and regrown past the first 256 rows) as a fresh context. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "kvq/model.h"
#include "kvq/runtime.h"
#include "runtime/select/selector.h"

static void test_registry(void **state)
{
    (void)state;
    for (int i = 0; i < KVQ_SELECT_COUNT; i++) {
        const rt_selector *s = kvq_rt_selector((kvq_selector)i);
        assert_non_null(s);
        assert_int_equal(s->id, i);
        assert_non_null(s->select);
        assert_string_equal(s->name, kvq_selector_name((kvq_selector)i));
        kvq_selector back = KVQ_SELECT_COUNT;
        int method = 0;
        assert_int_equal(kvq_selector_parse(s->name, &back, &method, NULL), KVQ_OK);
        assert_int_equal(back, i);
        assert_int_equal(method, -1);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(s->name, kvq_rt_selector((kvq_selector)j)->name);
        /* the codebook and mass selectors read the artifact's codes; no other does */
        assert_int_equal(kvq_selector_needs_artifact((kvq_selector)i),
                         i == KVQ_SELECT_CODEBOOK || i == KVQ_SELECT_MASS);
    }
    assert_null(kvq_rt_selector(KVQ_SELECT_COUNT));
    assert_null(kvq_rt_selector((kvq_selector)-1));
    assert_string_equal(kvq_selector_name(KVQ_SELECT_COUNT), "unknown");
}

static void test_bits_per_key(void **state)
{
    (void)state;
    kvq_retrieval_params p = kvq_retrieval_params_default();
    p.fier_group = 32;
    p.quest_page = 16;
    const int32_t d = 64;
    /* FIER: 64 bits + 2 x 64 floats of 32 bits shared by 32 tokens = 64 + 128 */
    assert_true(kvq_selector_bits_per_key(KVQ_SELECT_FIER, &p, NULL, d) == 192.0);
    /* Quest: 2 x 64 floats of 32 bits shared by 16 tokens = 256 */
    assert_true(kvq_selector_bits_per_key(KVQ_SELECT_QUEST, &p, NULL, d) == 256.0);
    assert_true(kvq_selector_bits_per_key(KVQ_SELECT_ORACLE, &p, NULL, d) == 1024.0);
    assert_true(kvq_selector_bits_per_key(KVQ_SELECT_FULL, &p, NULL, d) == 0.0);
    /* without an artifact the codebook selectors hold nothing */
    assert_true(kvq_selector_bits_per_key(KVQ_SELECT_CODEBOOK, &p, NULL, d) == 0.0);
    assert_true(kvq_selector_bits_per_key(KVQ_SELECT_MASS, &p, NULL, d) == 0.0);
}

/* xorshift floats in [-1, 1) */
static float rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Runs T tokens (a prefill of 64, then decode steps) through r; the last step's
 * selection of (layer 0, KV head 0) into sel, its count returned. */
static int64_t run(kvq_retrieval *r, const kvq_model_config *c, int64_t T, int32_t *sel)
{
    const int32_t d = c->head_dim, qd = c->n_heads * d, kvd = c->n_kv_heads * d;
    float *q = malloc(sizeof(float) * (size_t)(T * qd));
    float *k = malloc(sizeof(float) * (size_t)(T * kvd));
    float *v = malloc(sizeof(float) * (size_t)(T * kvd));
    float *out = malloc(sizeof(float) * (size_t)(T * qd));
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)T);
    uint64_t s = 88172645463325252ull;
    for (int64_t i = 0; i < T * qd; i++)
        q[i] = rnd(&s);
    for (int64_t i = 0; i < T * kvd; i++) {
        k[i] = rnd(&s);
        v[i] = rnd(&s);
    }
    for (int64_t i = 0; i < T; i++)
        pos[i] = i;
    const kvq_attn_backend b = kvq_retrieval_backend(r);
    for (int64_t at = 0; at < T;) {
        const int64_t n = at == 0 ? 64 : 1;
        for (int32_t l = 0; l < c->n_layers; l++) {
            const kvq_attn_call call = {.layer = l, .n = (int32_t)n, .pos = pos + at,
                                        .q = q + at * qd, .k = k + at * kvd, .v = v + at * kvd,
                                        .out = out + at * qd};
            kvq_err e = {0};
            if (b.attend(b.user, &call, &e) != KVQ_OK)
                fail_msg("attend: %s", e.msg);
        }
        at += n;
    }
    int64_t n = 0;
    const int32_t *last = kvq_retrieval_last_selection(r, 0, 0, &n);
    if (n)
        memcpy(sel, last, sizeof *sel * (size_t)n);
    free(q);
    free(k);
    free(v);
    free(out);
    free(pos);
    return n;
}

static void test_reset_regrow(void **state)
{
    (void)state;
    kvq_model_config c;
    memset(&c, 0, sizeof c);
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 16;
    c.rope = kvq_rope_default(16);
    const int64_t T = 300; /* past the cache's first 256 rows: one regrowth */
    const kvq_selector which[] = {KVQ_SELECT_ORACLE, KVQ_SELECT_FIER, KVQ_SELECT_QUEST};
    for (size_t w = 0; w < sizeof which / sizeof *which; w++) {
        kvq_retrieval_params p = kvq_retrieval_params_default();
        p.selector = which[w];
        p.budget = (kvq_budget){.count = 24};
        p.window = 32;
        kvq_retrieval *r = NULL;
        kvq_err e = {0};
        assert_int_equal(kvq_retrieval_create(&c, NULL, &p, &r, &e), KVQ_OK);
        int32_t a[300], b[300];
        const int64_t na = run(r, &c, T, a);
        assert_int_equal(na, 24);
        kvq_retrieval_reset(r);
        assert_int_equal(kvq_retrieval_length(r), 0);
        const int64_t nb = run(r, &c, T, b);
        assert_int_equal(nb, na);
        assert_memory_equal(a, b, sizeof *a * (size_t)na);
        for (int64_t i = 0; i < na; i++) /* candidates only: past the sinks, before the window */
            assert_true(a[i] >= p.sink && a[i] < T - p.window);
        kvq_retrieval_free(r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_bits_per_key),
        cmocka_unit_test(test_reset_regrow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
