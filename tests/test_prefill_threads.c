/* test_prefill_threads.c — prefill's products run on kvq's OpenMP threads with OpenBLAS
 * at one thread (model/forward_gemm.c): the bytes of the logits and of what an
 * observer sees do not depend on the thread count, they agree with the one-token path
 * (kvq_quant_matvec, no SGEMM and no tiles: an independent route through the same
 * model), and OpenBLAS is at one thread while a pass runs and back to the caller's
 * count after it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "helpers/testutil.h"
#include "helpers/tinyllama.h"
#include "kvq/model.h"
#include "kvq/util.h"

/* What the observer saw: q and k of every layer and token, and the thread counts. */
typedef struct seen {
    float *qk;            /* [n_layers, n, qd + kvd] */
    int n, qd, kvd;
    int blas_min, blas_max, omp;
} seen;

static kvq_status observe(void *user, const kvq_attn_call *c, kvq_err *err)
{
    seen *s = user;
    const int blas = openblas_get_num_threads();
    s->blas_min = blas < s->blas_min ? blas : s->blas_min;
    s->blas_max = blas > s->blas_max ? blas : s->blas_max;
    s->omp = omp_get_max_threads();
    for (int i = 0; i < c->n; i++) {
        float *row = s->qk + ((size_t)c->layer * s->n + (size_t)c->pos[i]) * (s->qd + s->kvd);
        memcpy(row, c->q + (size_t)i * s->qd, sizeof(float) * (size_t)s->qd);
        memcpy(row + s->qd, c->k + (size_t)i * s->kvd, sizeof(float) * (size_t)s->kvd);
    }
    return KVQ_OK;
}

typedef struct run_out {
    float *logits; /* [n, vocab] */
    seen obs;
} run_out;

/* One pass over toks in chunks of `chunk` with `threads` threads and a tile scratch of
 * `scratch` bytes (0: the default). */
static run_out run(const kvq_model *m, const int32_t *toks, int n, int chunk, int threads,
                   uint64_t scratch)
{
    const kvq_model_config *c = kvq_model_config_get(m);
    kvq_forward_params p = kvq_forward_params_default();
    p.chunk = chunk;
    p.threads = threads;
    if (scratch)
        p.scratch_bytes = scratch;
    kvq_forward *f = NULL;
    kvq_err e = {0};
    if (kvq_forward_create(m, &p, &f, &e) != KVQ_OK)
        fail_msg("forward: %s", e.msg);
    run_out r = {0};
    r.obs.n = n;
    r.obs.qd = c->n_heads * c->head_dim;
    r.obs.kvd = c->n_kv_heads * c->head_dim;
    r.obs.blas_min = 1 << 20;
    r.obs.qk = calloc((size_t)c->n_layers * n * (r.obs.qd + r.obs.kvd), sizeof(float));
    r.logits = malloc(sizeof(float) * (size_t)n * c->vocab_size);
    assert_non_null(r.obs.qk);
    assert_non_null(r.logits);
    kvq_forward_set_observer(f, observe, &r.obs);
    if (kvq_forward_tokens(f, toks, n, KVQ_LOGITS_ALL, r.logits, &e) != KVQ_OK)
        fail_msg("forward_tokens: %s", e.msg);
    kvq_forward_free(f);
    return r;
}

static void run_free(run_out *r)
{
    free(r->logits);
    free(r->obs.qk);
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* A model with row counts that are not multiples of the tiles (hidden 352, vocab 200),
 * head_dim 32, GQA; written as GGUF in the given storage (F32: used in place; Q8_0:
 * dequantized tile by tile). */
static kvq_model *open_model(tinyllama_wtype wt, const char *name)
{
    tinyllama_spec s = tinyllama_default();
    s.dim = 128;
    s.hidden_dim = 352;
    s.n_heads = 4;
    s.n_kv_heads = 2;
    s.head_dim = 32;
    s.vocab = 200;
    s.context_length = 512;
    s.wtype = wt;
    tinyllama *t = tinyllama_new(&s);
    assert_non_null(t);
    assert_int_equal(tinyllama_write_gguf(t, test_path(name)), 0);
    tinyllama_free(t);
    kvq_model *m = NULL;
    kvq_err e = {0};
    if (kvq_model_open(test_path(name), NULL, &m, &e) != KVQ_OK)
        fail_msg("open: %s", e.msg);
    return m;
}

static int32_t *tokens(int n, int vocab)
{
    kvq_rng r;
    kvq_rng_seed(&r, 5);
    int32_t *t = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)kvq_rng_below(&r, (uint64_t)vocab);
    return t;
}

static void check_model(tinyllama_wtype wt, const char *name, uint64_t scratch)
{
    kvq_model *m = open_model(wt, name);
    const kvq_model_config *c = kvq_model_config_get(m);
    /* 170 tokens in chunks of 100: the second chunk attends over a cached past, and
     * both cover several blocks of queries */
    const int n = 170, chunk = 100;
    const size_t nl = (size_t)n * c->vocab_size,
                 nq = (size_t)c->n_layers * n * (c->n_heads + c->n_kv_heads) * c->head_dim;
    int32_t *toks = tokens(n, c->vocab_size);
    run_out one = run(m, toks, n, chunk, 1, scratch);
    for (int threads = 2; threads <= 3; threads++) {
        run_out more = run(m, toks, n, chunk, threads, scratch);
        assert_memory_equal(one.logits, more.logits, nl * sizeof(float));
        assert_memory_equal(one.obs.qk, more.obs.qk, nq * sizeof(float));
        run_free(&more);
    }
    /* the one-token path: no SGEMM, no tiles */
    run_out dec = run(m, toks, n, 1, 2, scratch);
    assert_true(max_abs_diff(one.logits, dec.logits, nl) < 1e-4);
    assert_true(max_abs_diff(one.obs.qk, dec.obs.qk, nq) < 1e-4);
    /* and the logits are not trivially equal: positions differ from each other */
    assert_true(max_abs_diff(one.logits, one.logits + c->vocab_size, c->vocab_size) > 1e-3);
    run_free(&dec);
    run_free(&one);
    free(toks);
    kvq_model_close(m);
}

static void test_prefill_same_bytes_f32(void **state)
{
    check_model(TINYLLAMA_F32, "pt-f32.gguf", 0);
}

static void test_prefill_same_bytes_q8_0(void **state)
{
    check_model(TINYLLAMA_Q8_0, "pt-q8.gguf", 0);
    check_model(TINYLLAMA_Q8_0, "pt-q8-small.gguf", 2048); /* tiles of 4 rows (1 of 352) */
}

/* OpenBLAS runs at one thread during a pass (kvq's OpenMP threads at --threads do the
 * splitting), and the caller's OpenBLAS count is back after it. */
static void test_blas_one_thread_in_pass(void **state)
{
    kvq_model *m = open_model(TINYLLAMA_F32, "pt-blas.gguf");
    const int n = 80;
    int32_t *toks = tokens(n, kvq_model_config_get(m)->vocab_size);
    openblas_set_num_threads(2);
    const int before = openblas_get_num_threads();
    run_out r = run(m, toks, n, 40, 3, 0);
    assert_int_equal(r.obs.blas_min, 1);
    assert_int_equal(r.obs.blas_max, 1);
    assert_int_equal(r.obs.omp, 3);
    assert_int_equal(openblas_get_num_threads(), before);
    run_free(&r);
    free(toks);
    kvq_model_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_same_bytes_f32),
        cmocka_unit_test(test_prefill_same_bytes_q8_0),
        cmocka_unit_test(test_blas_one_thread_in_pass),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
