/*
 * test_forward_resume.c — a prompt prefilled once and replayed into other retrieval
 * contexts (what `kvq eval` does for its task prompts, eval/tasks.c): an observer
 * records every layer's pre-RoPE keys and values during an exact prefill under one
 * selector; a fresh context of another selector gets them appended in the forward's
 * chunks (kvq_retrieval_append), the forward resumes after them (kvq_forward_resume),
 * and the rest of the prompt and a greedy decode run through it.
 *
 * The reference is the direct path: the whole prompt prefilled under the decoding
 * selector's own context (prefill_full), then the same decode. Every logit of the
 * prompt's last token and of each decode step must be equal bit for bit, for prompts
 * whose last chunk holds several tokens (replayed whole) and one token (a retrieval
 * step, run per context). Resuming one position late, or appending without resuming,
 * must give other logits (the comparison can fail); the decode must differ from full
 * attention (retrieval is at work). Model: stories260K, else SmolLM2 (skipped with
 * neither).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers/testutil.h"
#include "kvq.h"
#include "kvq/model.h"
#include "kvq/runtime.h"

enum { CHUNK = 16, MAXN = 48, STEPS = 4, MAXL = 64 };

typedef struct rec {
    int32_t n_layers;
    size_t kvd;
    int64_t n[MAXL];
    float *k[MAXL], *v[MAXL];
} rec;

static kvq_status record(void *user, const kvq_attn_call *c, kvq_err *err)
{
    (void)err;
    rec *r = user;
    memcpy(r->k[c->layer] + r->n[c->layer] * r->kvd, c->k, sizeof(float) * c->n * r->kvd);
    memcpy(r->v[c->layer] + r->n[c->layer] * r->kvd, c->v, sizeof(float) * c->n * r->kvd);
    r->n[c->layer] += c->n;
    return KVQ_OK;
}

static kvq_retrieval_params params(kvq_selector s)
{
    kvq_retrieval_params p = kvq_retrieval_params_default();
    p.selector = s;
    p.budget = (kvq_budget){.count = 4};
    p.sink = 2;
    p.window = 4;
    p.positions = KVQ_POSITIONS_ROPE;
    p.max_tokens = 128;
    return p;
}

static int32_t argmax(const float *x, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        b = x[i] > x[b] ? i : b;
    return b;
}

/* Greedy decode of STEPS tokens from logits (the prompt's last), every step's logits
 * into out [STEPS + 1, vocab] (out[0] = the prompt's). */
static void decode(kvq_forward *f, int32_t vocab, float *out)
{
    kvq_err e = {0};
    for (int s = 0; s < STEPS; s++) {
        int32_t t = argmax(out + (size_t)s * vocab, vocab);
        assert_int_equal(kvq_forward_tokens(f, &t, 1, KVQ_LOGITS_LAST, out + (size_t)(s + 1) * vocab,
                                            &e),
                         KVQ_OK);
    }
}

/* The direct path: the whole prompt under sel's own context. */
static void direct(kvq_forward *f, const kvq_model_config *c, kvq_selector sel, const int32_t *ids,
                   int64_t n, float *out)
{
    kvq_err e = {0};
    kvq_retrieval *r = NULL;
    kvq_retrieval_params p = params(sel);
    if (sel == KVQ_SELECT_FULL) {
        kvq_forward_set_attention(f, NULL);
    } else {
        assert_int_equal(kvq_retrieval_create(c, NULL, &p, &r, &e), KVQ_OK);
        const kvq_attn_backend b = kvq_retrieval_backend(r);
        kvq_forward_set_attention(f, &b);
    }
    assert_int_equal(kvq_forward_tokens(f, ids, n, KVQ_LOGITS_LAST, out, &e), KVQ_OK);
    decode(f, c->vocab_size, out);
    kvq_forward_set_attention(f, NULL);
    kvq_retrieval_free(r);
}

/* The replayed path: tokens [0, m) recorded under `by`, appended into a context of
 * `sel`, resumed at m + shift (resume 0: not resumed), the rest run. */
static void replayed(kvq_forward *f, const kvq_model_config *c, kvq_selector by,
                     kvq_selector sel, const int32_t *ids, int64_t n, int64_t m, int64_t shift,
                     int resume, rec *rc, float *out)
{
    kvq_err e = {0};
    kvq_retrieval *r = NULL;
    kvq_retrieval_params p = params(by);
    assert_int_equal(kvq_retrieval_create(c, NULL, &p, &r, &e), KVQ_OK);
    kvq_attn_backend b = kvq_retrieval_backend(r);
    kvq_forward_set_attention(f, &b);
    memset(rc->n, 0, sizeof rc->n);
    kvq_forward_set_observer(f, record, rc);
    float *prefix = malloc(sizeof(float) * (size_t)c->vocab_size);
    assert_int_equal(kvq_forward_tokens(f, ids, m, KVQ_LOGITS_LAST, prefix, &e), KVQ_OK);
    kvq_forward_set_observer(f, NULL, NULL);
    kvq_forward_set_attention(f, NULL);
    kvq_retrieval_free(r);
    for (int l = 0; l < c->n_layers; l++)
        assert_int_equal(rc->n[l], m);

    p = params(sel);
    assert_int_equal(kvq_retrieval_create(c, NULL, &p, &r, &e), KVQ_OK);
    b = kvq_retrieval_backend(r);
    kvq_forward_set_attention(f, &b);
    int64_t pos[MAXN];
    for (int64_t j = 0; j < m; j++)
        pos[j] = j;
    for (int l = 0; l < c->n_layers; l++)
        for (int64_t j = 0; j < m; j += CHUNK) {
            const int32_t cn = (int32_t)(m - j < CHUNK ? m - j : CHUNK);
            assert_int_equal(kvq_retrieval_append(r, l, cn, pos + j, rc->k[l] + j * rc->kvd,
                                                  rc->v[l] + j * rc->kvd, &e),
                             KVQ_OK);
        }
    if (resume)
        assert_int_equal(kvq_forward_resume(f, m + shift, &e), KVQ_OK);
    if (m < n)
        assert_int_equal(kvq_forward_tokens(f, ids + m, n - m, KVQ_LOGITS_LAST, out, &e), KVQ_OK);
    else
        memcpy(out, prefix, sizeof(float) * (size_t)c->vocab_size);
    decode(f, c->vocab_size, out);
    kvq_forward_set_attention(f, NULL);
    kvq_retrieval_free(r);
    free(prefix);
}

static void test_prefill_replay(void **state)
{
    (void)state;
    int stories;
    const char *mp = test_real_model(&stories);
    if (!mp)
        TEST_SKIP("neither stories260K (KVQ_TEST_MODEL) nor SmolLM2 (KVQ_SMOLLM2) found");
    kvq_err e = {0};
    kvq_model *m = NULL;
    kvq_model_params mpar = kvq_model_params_default();
    assert_int_equal(kvq_model_open(mp, &mpar, &m, &e), KVQ_OK);
    const kvq_model_config *c = kvq_model_config_get(m);
    assert_true(c->n_layers <= MAXL);
    kvq_forward_params fp = kvq_forward_params_default();
    fp.max_tokens = 128;
    fp.chunk = CHUNK;
    kvq_forward *f = NULL;
    assert_int_equal(kvq_forward_create(m, &fp, &f, &e), KVQ_OK);
    /* resuming needs a backend that holds the tokens */
    assert_int_equal(kvq_forward_resume(f, 3, &e), KVQ_E_INVALID_ARG);

    /* the prompt: BOS and the model's greedy text */
    const int32_t V = c->vocab_size;
    const size_t sz = sizeof(float) * (size_t)V * (STEPS + 1);
    float *ref = malloc(sz), *got = malloc(sz), *full = malloc(sz), *lg = malloc(sizeof(float) * V);
    int32_t ids[MAXN] = {1};
    kvq_forward_reset(f);
    for (int i = 1; i < MAXN; i++) {
        assert_int_equal(kvq_forward_tokens(f, ids + i - 1, 1, KVQ_LOGITS_LAST, lg, &e), KVQ_OK);
        ids[i] = argmax(lg, V);
    }
    rec rc = {.n_layers = c->n_layers, .kvd = (size_t)c->n_kv_heads * c->head_dim};
    for (int l = 0; l < c->n_layers; l++) {
        rc.k[l] = malloc(sizeof(float) * MAXN * rc.kvd);
        rc.v[l] = malloc(sizeof(float) * MAXN * rc.kvd);
    }
    const kvq_selector sel[3] = {KVQ_SELECT_ORACLE, KVQ_SELECT_FIER, KVQ_SELECT_QUEST};
    /* 40: chunks 16 16 8, replayed whole; 33: 16 16 1, the last token per context */
    const int64_t lens[2] = {40, 33}, pre[2] = {40, 32};
    int retrieval_differs = 0;
    for (int li = 0; li < 2; li++) {
        direct(f, c, KVQ_SELECT_FULL, ids, lens[li], full);
        for (int s = 0; s < 3; s++) {
            const kvq_selector by = sel[(s + 1) % 3];
            direct(f, c, sel[s], ids, lens[li], ref);
            replayed(f, c, by, sel[s], ids, lens[li], pre[li], 0, 1, &rc, got);
            for (int st = 0; st <= STEPS; st++)
                if (memcmp(ref + (size_t)st * V, got + (size_t)st * V, sizeof(float) * V))
                    fail_msg("prompt %lld, selector %d recorded under %d: step %d differs",
                             (long long)lens[li], (int)sel[s], (int)by, st);
            retrieval_differs += memcmp(ref, full, sz) != 0;
            /* resumed one position late, or not resumed: other logits */
            replayed(f, c, by, sel[s], ids, lens[li], pre[li], 1, 1, &rc, got);
            assert_true(memcmp(ref, got, sz) != 0);
            replayed(f, c, by, sel[s], ids, lens[li], pre[li], 0, 0, &rc, got);
            assert_true(memcmp(ref, got, sz) != 0);
        }
    }
    assert_true(retrieval_differs > 0);
    for (int l = 0; l < c->n_layers; l++) {
        free(rc.k[l]);
        free(rc.v[l]);
    }
    free(ref);
    free(got);
    free(full);
    free(lg);
    kvq_forward_free(f);
    kvq_model_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
