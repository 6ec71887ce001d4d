/* test_kvcache_attn.c — full attention over a compressed cache (kvq/kvcache.h) as an
 * attention backend: against the exact kvq_full_attn where the compression is the
 * identity up to f16 rounding (PATS b = 0; LeanKV while the whole sequence is its
 * prompt), the same bits whether the tokens come in chunks or one per call and for
 * any thread count, memory held against hand counts, and its refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "kvq/util.h"
#include "helpers/testutil.h"

enum { NL = 2, NH = 4, NKV = 2, D = 64, T = 120 };

static kvq_model_config config(void)
{
    return test_synthetic_config(NL, NH, NKV, D);
}

typedef struct seq {
    float q[T * NH * D], k[T * NKV * D], v[T * NKV * D];
    int64_t pos[T];
} seq;

static void make_seq(seq *s, uint64_t seed)
{
    test_random_qkv(seed, s->q, T * NH * D, s->k, s->v, T * NKV * D);
    for (int64_t i = 0; i < T; i++)
        s->pos[i] = i;
}

/* The sequence through b: chunks of `chunk` tokens (the last may be shorter). */
static float *run(const kvq_attn_backend *b, const seq *s, int64_t chunk)
{
    float *out = malloc(sizeof(float) * T * NH * D);
    if (b->reset)
        b->reset(b->user);
    for (int64_t at = 0; at < T; at += chunk) {
        const int64_t n = chunk < T - at ? chunk : T - at;
        for (int32_t l = 0; l < NL; l++) {
            kvq_attn_call c = {.layer = l, .n = (int32_t)n, .pos = s->pos + at,
                               .q = s->q + at * NH * D, .k = s->k + at * NKV * D,
                               .v = s->v + at * NKV * D, .out = out + at * NH * D};
            kvq_err e = {0};
            if (b->attend(b->user, &c, &e))
                fail_msg("attend: %s", e.msg);
        }
    }
    return out;
}

static double max_rel(const float *a, const float *b, size_t n)
{
    double m = 0, sc = 0;
    for (size_t i = 0; i < n; i++) {
        m = fmax(m, fabs((double)a[i] - b[i]));
        sc = fmax(sc, fabs((double)b[i]));
    }
    return m / sc;
}

static float *run_kv(const kvq_model_config *c, const kvq_kvcache_params *p, const seq *s,
                     int64_t chunk, kvq_kvcache_memory *mem)
{
    kvq_kvcache *kc = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_kvcache_create(c, p, &kc, &e), KVQ_OK);
    const kvq_attn_backend b = kvq_kvcache_backend(kc);
    float *out = run(&b, s, chunk);
    if (mem)
        kvq_kvcache_memory_get(kc, mem);
    kvq_kvcache_free(kc);
    return out;
}

static void test_against_full(void **state)
{
    (void)state;
    const kvq_model_config c = config();
    static seq s;
    make_seq(&s, 5);
    kvq_full_attn *fa = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_full_attn_create(&c, T, &fa, &e), KVQ_OK);
    const kvq_attn_backend fb = kvq_full_attn_backend(fa);
    float *ref = run(&fb, &s, 32);
    /* PATS with b = 0: f16 rounding of K and V only */
    kvq_kvcache_params p = kvq_kvcache_params_default();
    p.kind = KVQ_KV_PATS, p.b_min = 0, p.b_max = 0, p.max_tokens = T;
    kvq_kvcache_memory m;
    float *out = run_kv(&c, &p, &s, 32, &m);
    assert_true(max_rel(out, ref, T * NH * D) < 2e-3);
    assert_true(m.tokens == T && m.bytes == (double)T * NL * NKV * 2 * 128); /* 2d bytes/row */
    free(out);
    /* PATS middle-heavy 2..8: the output moves, less than the truncation allows */
    p.b_min = 2, p.b_max = 8;
    out = run_kv(&c, &p, &s, 32, &m);
    const double rel = max_rel(out, ref, T * NH * D);
    assert_true(rel > 1e-4 && rel < 0.1);
    assert_true(m.bytes < m.bytes_f16);
    free(out);
    /* LeanKV whose prompt is the whole sequence: exact */
    p = kvq_kvcache_params_default();
    p.kind = KVQ_KV_LEANKV, p.prompt_tokens = T, p.max_tokens = T;
    out = run_kv(&c, &p, &s, 32, &m);
    assert_true(max_rel(out, ref, T * NH * D) < 1e-5);
    free(out);
    /* LeanKV alpha 0, window 16: every token K8V4 (104 bytes per head and token) */
    p.prompt_tokens = 40, p.alpha_h = 0, p.alpha_l = 0, p.window = 16;
    out = run_kv(&c, &p, &s, 32, &m);
    assert_true(m.bytes == (double)T * NL * NKV * 104 && m.bytes_low == 0 && m.pruned == 0);
    assert_true(max_rel(out, ref, T * NH * D) < 0.05);
    free(out);
    free(ref);
    kvq_full_attn_free(fa);
}

static void test_chunks_and_threads(void **state)
{
    (void)state;
    const kvq_model_config c = config();
    static seq s;
    make_seq(&s, 9);
    kvq_kvcache_params p = kvq_kvcache_params_default();
    p.kind = KVQ_KV_LEANKV, p.prompt_tokens = 50, p.max_tokens = T;
    p.alpha_h = 1.0, p.alpha_l = 0.3, p.window = 8;
    kvq_kvcache_memory m1, m2;
    p.threads = 1;
    float *one = run_kv(&c, &p, &s, 1, &m1);
    p.threads = 2;
    float *chunked = run_kv(&c, &p, &s, 50, &m2);
    assert_memory_equal(one, chunked, sizeof(float) * T * NH * D);
    assert_true(m1.bytes == m2.bytes && m1.bytes_low > 0 && m1.pruned > 0);
    assert_true(m1.bytes == m1.bytes_high + m1.bytes_low);
    free(one);
    free(chunked);
    p.kind = KVQ_KV_PATS;
    p.threads = 1;
    one = run_kv(&c, &p, &s, 1, NULL);
    p.threads = 2;
    chunked = run_kv(&c, &p, &s, 37, NULL);
    assert_memory_equal(one, chunked, sizeof(float) * T * NH * D);
    free(one);
    free(chunked);
}

static void test_refusals(void **state)
{
    (void)state;
    kvq_model_config c = config();
    kvq_kvcache *kc = NULL;
    kvq_err e = {0};
    kvq_kvcache_params p = kvq_kvcache_params_default();
    p.kind = KVQ_KV_F16; /* the exact cache is not made here */
    assert_int_equal(kvq_kvcache_create(&c, &p, &kc, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "not a compressed cache kind"));
    p = kvq_kvcache_params_default();
    p.kind = KVQ_KV_LEANKV_PATS, p.b_max = 11; /* both kinds' settings are checked */
    assert_int_equal(kvq_kvcache_create(&c, &p, &kc, &e), KVQ_E_INVALID_ARG);
    p = kvq_kvcache_params_default();
    p.kind = KVQ_KV_LEANKV_PATS, p.alpha_l = 2, p.alpha_h = 1;
    assert_int_equal(kvq_kvcache_create(&c, &p, &kc, &e), KVQ_E_INVALID_ARG);
    p = kvq_kvcache_params_default();
    p.alpha_l = -0.5;
    assert_int_equal(kvq_kvcache_create(&c, &p, &kc, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "alpha_l"));
    p = kvq_kvcache_params_default();
    p.kind = KVQ_KV_PATS, p.b_max = 12;
    assert_int_equal(kvq_kvcache_create(&c, &p, &kc, &e), KVQ_E_INVALID_ARG);
    p = kvq_kvcache_params_default();
    c.sliding_window = 64;
    assert_int_equal(kvq_kvcache_create(&c, &p, &kc, &e), KVQ_E_UNSUPPORTED);
    assert_null(kc);
    kvq_kv_kind k;
    assert_int_equal(kvq_kv_kind_parse("leankv+pats", &k), 0);
    assert_int_equal(k, KVQ_KV_LEANKV_PATS);
    assert_int_equal(kvq_kv_kind_parse("int8", &k), -1);
    /* PATS: more tokens than max_tokens */
    c.sliding_window = 0;
    p.kind = KVQ_KV_PATS, p.max_tokens = 4;
    assert_int_equal(kvq_kvcache_create(&c, &p, &kc, &e), KVQ_OK);
    static seq s;
    make_seq(&s, 1);
    float out[5 * NH * D];
    kvq_attn_call call = {.layer = 0, .n = 5, .pos = s.pos, .q = s.q, .k = s.k, .v = s.v,
                          .out = out};
    const kvq_attn_backend b = kvq_kvcache_backend(kc);
    assert_int_equal(b.attend(b.user, &call, &e), KVQ_E_INVALID_ARG);
    kvq_kvcache_free(kc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_full),
        cmocka_unit_test(test_chunks_and_threads),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
