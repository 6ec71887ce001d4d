/* test_engine_positions.c — the embedding API (kvq/engine.h) applies the artifact's
 * position mode and scoring query (positions.mode / positions.score, kvq calibrate's
 * choice) as `kvq run --artifact` does. An artifact calibrated on a tiny llama is
 * rewritten with a non-default choice (rope and rb, where the defaults are wrope and
 * mean; and a copy with the defaults written out); kvq's forward pass runs with a backend that hands every chunk both to a
 * retrieval context set up as kvq run sets it (kvq_eval_artifact_positions over the
 * defaults) and to an engine sequence, and every decode step's selections and outputs
 * are compared (the same q, k, v in: the same indices out). A control run with the
 * unmodified artifact checks that the two modes do select differently here, so the test
 * would catch an engine that ignored the artifact's mode. Also the engine's selectors
 * and measured statistics (kvq_engine_seq_stats) against such a context's, and kv_cache
 * with a selection: retrieval over the compressed cache (test_kv_retrieval). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "helpers/calibrated.h"
#include "helpers/testutil.h"
#include "helpers/tinyllama.h"
#include "kvq.h"
#include "kvq/engine.h"
#include "kvq/eval.h"
#include "kvq/kvcache.h"
#include "kvq/util.h"

enum { PROMPT = 80, DECODE = 40, TOTAL = PROMPT + DECODE };

static struct {
    tinyllama *t;
    char dir[1024], art[1024], art_rope[1024], art_wrope[1024];
    char fp[KVQ_FINGERPRINT_CAP];
    int32_t tokens[TOTAL];
} F;

/* Copies artifact src to dst with positions.mode / positions.score set. */
static int rewrite_positions(const char *src, const char *dst, const char *mode, const char *score)
{
    kvq_artifact *a = NULL;
    kvq_err e = {0};
    if (kvq_artifact_open(src, &a, &e))
        return -1;
    const kvq_st *st = kvq_artifact_payload(a);
    kvq_st_writer *w = kvq_st_writer_new();
    int rc = !w;
    for (size_t i = 0; !rc && i < kvq_st_count(st); i++) {
        const kvq_tensor_view *t = kvq_st_tensor(st, i);
        rc = kvq_st_writer_declare(w, t->name, t->dtype, t->ndim, t->shape, &e) != KVQ_OK;
    }
    for (size_t i = 0; !rc && i < kvq_st_meta_count(st); i++)
        rc = kvq_st_writer_set_meta(w, kvq_st_meta_key(st, i), kvq_st_meta_value(st, i), &e) != KVQ_OK;
    rc = rc || kvq_st_writer_set_meta(w, KVQ_META_POS_MODE, mode, &e) ||
         kvq_st_writer_set_meta(w, KVQ_META_POS_SCORE, score, &e) ||
         kvq_st_writer_begin_buffer(w, &e);
    for (size_t i = 0; !rc && i < kvq_st_count(st); i++) {
        const kvq_tensor_view *t = kvq_st_tensor(st, i);
        rc = kvq_st_writer_write(w, t->data, t->nbytes, &e) != KVQ_OK;
    }
    size_t n = 0;
    const void *buf = rc || kvq_st_writer_finish(w, &e) ? NULL : kvq_st_writer_buffer(w, &n);
    rc = !buf || kvq_artifact_write(dst, 1, buf, n, 0, &e);
    if (rc)
        fprintf(stderr, "rewrite %s: %s\n", src, e.msg);
    kvq_st_writer_free(w);
    kvq_artifact_close(a);
    return rc ? -1 : 0;
}

static int setup(void **state)
{
    (void)state;
    tinyllama_spec s = tinyllama_default();
    s.seed = 5;
    if (!(F.t = tinyllama_new(&s)))
        return -1;
    snprintf(F.dir, sizeof F.dir, "%s", test_path("engpos_hf"));
    snprintf(F.art, sizeof F.art, "%s", test_path("engpos.kvq"));
    snprintf(F.art_rope, sizeof F.art_rope, "%s", test_path("engpos_rope.kvq"));
    snprintf(F.art_wrope, sizeof F.art_wrope, "%s", test_path("engpos_wrope.kvq"));
    if (tinyllama_calibrated(F.t, F.dir, F.art, test_path("engpos_ids.bin"), 3, 1024, 3,
                             F.tokens, TOTAL, F.fp))
        return -1;
    /* whatever calibrate chose, one artifact of each choice */
    return rewrite_positions(F.art, F.art_rope, "rope", "rb") ||
                   rewrite_positions(F.art, F.art_wrope, "wrope", "mean")
               ? -1
               : 0;
}

static int teardown(void **state)
{
    (void)state;
    tinyllama_free(F.t);
    test_tmpdir_cleanup();
    return 0;
}

/* The backend: every chunk to the retrieval context (kvq run's) and to the engine. */
typedef struct tee {
    kvq_attn_backend inner;
    kvq_retrieval *r;
    kvq_engine_seq *seq;
    int32_t n_kv, n_heads, d;
    int64_t compared, differ;  /* (step, layer, KV head) selections compared / unequal */
    double out_err;            /* max |engine out - kvq out| */
} tee;

static kvq_status tee_attend(void *user, const kvq_attn_call *c, kvq_err *err)
{
    tee *T = user;
    kvq_status s = T->inner.attend(T->inner.user, c, err);
    if (s)
        return s;
    if (c->n > 1)
        return kvq_engine_seq_append(T->seq, c->layer, c->n, c->pos, c->k, c->v, KVQ_ENGINE_F32,
                                     err);
    float out[1024];
    assert_true((size_t)T->n_heads * T->d <= 1024);
    if ((s = kvq_engine_seq_decode(T->seq, c->layer, c->pos[0], c->q, c->k, c->v, KVQ_ENGINE_F32,
                                   out, err)))
        return s;
    for (int32_t i = 0; i < T->n_heads * T->d; i++)
        T->out_err = fmax(T->out_err, fabs((double)out[i] - c->out[i]));
    for (int32_t h = 0; h < T->n_kv; h++) {
        int64_t na = 0, nb = 0;
        const int32_t *a = kvq_retrieval_last_selection(T->r, c->layer, h, &na);
        const int32_t *b = kvq_engine_seq_last_selection(T->seq, c->layer, h, &nb);
        T->compared++;
        T->differ += na != nb || (na && memcmp(a, b, sizeof *a * (size_t)na));
    }
    return KVQ_OK;
}

typedef struct run_result {
    int64_t compared, differ;
    double out_err;
    kvq_retrieval_stats kvq;  /* the retrieval context's statistics */
    kvq_engine_stats eng;     /* the engine sequence's */
} run_result;

/* kvq's forward over F.tokens through the attention backend b: the prompt in one chunk,
 * then the rest a token at a time (decode). */
static void forward_fixture(kvq_model *m, const kvq_attn_backend *b)
{
    kvq_err e = {0};
    kvq_forward *f = NULL;
    assert_int_equal(kvq_forward_create(m, NULL, &f, &e), KVQ_OK);
    kvq_forward_set_attention(f, b);
    float *logits = malloc(sizeof(float) * (size_t)F.t->s.vocab * PROMPT);
    assert_non_null(logits);
    assert_int_equal(kvq_forward_tokens(f, F.tokens, PROMPT, KVQ_LOGITS_LAST, logits, &e), KVQ_OK);
    for (int t = PROMPT; t < TOTAL; t++)
        assert_int_equal(kvq_forward_tokens(f, F.tokens + t, 1, KVQ_LOGITS_LAST, logits, &e),
                         KVQ_OK);
    free(logits);
    kvq_forward_free(f);
}

/* kvq's forward over F.tokens with the tee: the retrieval context from `run_art` set up
 * as kvq run does, the engine from `eng_art`, with selector sel (KVQ_ENGINE_SELECT_*). */
static run_result run(const char *run_art, const char *eng_art, int32_t sel, int measure)
{
    static const kvq_selector sels[] = {KVQ_SELECT_CODEBOOK, KVQ_SELECT_FULL, KVQ_SELECT_ORACLE,
                                        KVQ_SELECT_FIER,     KVQ_SELECT_QUEST, KVQ_SELECT_MASS};
    kvq_err e = {0};
    kvq_model *m = NULL;
    assert_int_equal(kvq_model_open(F.dir, NULL, &m, &e), KVQ_OK);
    kvq_model_id id;
    kvq_model_identity(m, &id);
    kvq_codebook_set *set = NULL;
    assert_int_equal(kvq_codebook_set_open(run_art, &id, "model", &set, &e), KVQ_OK);
    kvq_retrieval_params rp = kvq_retrieval_params_default();
    kvq_eval_artifact_positions(set, &rp, 0, 0); /* cli_retrieval_open's rule */
    rp.selector = sels[sel];
    rp.budget.count = 6;
    rp.budget.fraction = 0;
    rp.sink = 2;
    rp.window = 12;
    rp.cache_dtype = KVQ_DT_F32;
    rp.measure = measure;
    tee T = {.n_kv = F.t->s.n_kv_heads, .n_heads = F.t->s.n_heads, .d = F.t->s.head_dim};
    assert_int_equal(kvq_retrieval_create(kvq_model_config_get(m), set, &rp, &T.r, &e), KVQ_OK);
    const tinyllama_spec *s = &F.t->s;
    kvq_engine_model em = {.n_layers = s->n_layers, .n_heads = s->n_heads,
                           .n_kv_heads = s->n_kv_heads, .head_dim = s->head_dim,
                           .rope_base = s->rope_base, .rope_interleaved = 0, .fingerprint = F.fp};
    kvq_engine *eng = NULL;
    assert_int_equal(kvq_engine_open(eng_art, &em, 0, &eng, &e), KVQ_OK);
    kvq_engine_seq_params sp = kvq_engine_seq_params_default();
    sp.budget_tokens = 6;
    sp.sink = 2;
    sp.window = 12;
    sp.cache_f16 = 0;
    sp.selector = sel;
    sp.measure = measure;
    assert_int_equal(kvq_engine_seq_create(eng, &sp, &T.seq, &e), KVQ_OK);
    T.inner = kvq_retrieval_backend(T.r);
    kvq_attn_backend b = {.name = "tee", .user = &T, .attend = tee_attend};
    forward_fixture(m, &b);
    run_result res = {.compared = T.compared, .differ = T.differ, .out_err = T.out_err};
    kvq_retrieval_stats_get(T.r, &res.kvq);
    kvq_engine_seq_stats(T.seq, &res.eng);
    kvq_engine_seq_free(T.seq);
    kvq_engine_close(eng);
    kvq_retrieval_free(T.r);
    kvq_codebook_set_close(set);
    kvq_model_close(m);
    return res;
}

static void test_artifact_positions(void **state)
{
    (void)state;
    const int64_t want = (int64_t)DECODE * F.t->s.n_layers * F.t->s.n_kv_heads;
    run_result a = run(F.art_rope, F.art_rope, KVQ_ENGINE_SELECT_CODEBOOK, 0);
    printf("  rope/rb artifact: %lld of %lld selections differ, max |out diff| %.3g\n",
           (long long)a.differ, (long long)a.compared, a.out_err);
    assert_int_equal(a.compared, want);
    assert_int_equal(a.differ, 0);
    assert_true(a.out_err <= 1e-6);
    /* the control: kvq run with the default mode against the engine with the rope
     * artifact selects otherwise (else this test could not tell the modes apart) */
    run_result c = run(F.art_wrope, F.art_rope, KVQ_ENGINE_SELECT_CODEBOOK, 0);
    printf("  control (wrope/mean kvq run vs rope/rb engine): %lld of %lld differ, max |out "
           "diff| %.3g\n", (long long)c.differ, (long long)c.compared, c.out_err);
    assert_true(c.differ > 0 && c.out_err > 1e-3);
    run_result w = run(F.art_wrope, F.art_wrope, KVQ_ENGINE_SELECT_CODEBOOK, 0);
    assert_int_equal(w.differ, 0);
    assert_true(w.out_err <= 1e-6);
}

/* Every selector of the engine: the same selections and statistics as a retrieval
 * context with that selector, measure on (kvq eval's rows). */
static void test_selectors_measured(void **state)
{
    (void)state;
    const char *names[] = {"codebook", "full", "oracle", "fier", "quest", "mass"};
    for (int32_t sel = 0; sel <= KVQ_ENGINE_SELECT_MASS; sel++) {
        run_result r = run(F.art, F.art, sel, 1);
        printf("  %-8s: %lld of %lld selections differ; steps %llu, recall %.4f, mass %.4f, "
               "out err %.4f, kv read %.4f\n",
               names[sel], (long long)r.differ, (long long)r.compared,
               (unsigned long long)r.eng.steps, r.eng.recall_topk / (double)r.eng.measured,
               r.eng.recall_mass / (double)r.eng.measured,
               r.eng.out_rel_err / (double)r.eng.measured, r.eng.bytes_read / r.eng.bytes_full);
        assert_int_equal(r.differ, 0);
        assert_true(r.eng.steps > 0);
        assert_int_equal(r.eng.steps, r.kvq.steps);
        assert_int_equal(r.eng.measured, r.kvq.measured);
        assert_int_equal(r.eng.measured, r.eng.steps);
        assert_true(r.eng.attended == r.kvq.attended && r.eng.visible == r.kvq.visible);
        assert_true(r.eng.bytes_read == r.kvq.bytes_read && r.eng.bytes_full == r.kvq.bytes_full);
        assert_true(fabs(r.eng.recall_topk - r.kvq.recall_topk) <= 1e-9 * r.eng.steps);
        assert_true(fabs(r.eng.recall_mass - r.kvq.recall_mass) <= 1e-6 * r.eng.steps);
        assert_true(fabs(r.eng.out_rel_err - r.kvq.out_rel_err) <= 1e-5 * r.eng.steps);
        if (sel == KVQ_ENGINE_SELECT_ORACLE || sel == KVQ_ENGINE_SELECT_FULL)
            assert_true(r.eng.recall_topk == (double)r.eng.measured); /* the oracle itself */
    }
}

static void test_bad_params(void **state)
{
    (void)state;
    const tinyllama_spec *s = &F.t->s;
    kvq_engine_model em = {.n_layers = s->n_layers, .n_heads = s->n_heads,
                           .n_kv_heads = s->n_kv_heads, .head_dim = s->head_dim,
                           .rope_base = s->rope_base, .fingerprint = F.fp};
    kvq_engine *eng = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_engine_open(F.art, &em, 0, &eng, &e), KVQ_OK);
    kvq_engine_seq_params sp = kvq_engine_seq_params_default();
    kvq_engine_seq *seq = NULL;
    sp.selector = 6;
    assert_int_equal(kvq_engine_seq_create(eng, &sp, &seq, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "selector 6"));
    sp.selector = 0;
    sp.tau = 1.5;
    assert_int_equal(kvq_engine_seq_create(eng, &sp, &seq, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "tau 1.5"));
    assert_null(seq);
    kvq_engine_close(eng);
}

/* ---- kv_cache with a selection: retrieval over the compressed cache --------------- */

/* The backend: the prompt chunk's outputs from a plain context, its rows appended to the
 * reference (a retrieval context with a LeanKV cache attached, as kvq eval's kv rows set
 * it up) and to three engine sequences; each decode step attended by the reference (its
 * outputs drive the forward) and by the sequences. */
typedef struct kvtee {
    kvq_attn_backend plain;
    kvq_retrieval *rk;
    kvq_kvcache *kc;
    kvq_engine_seq *lk, *pats, *f16;
    int32_t n_kv, n;          /* KV heads, n_heads * head_dim */
    int64_t steps, differ;    /* decode calls; (layer, KV head) selections unequal */
    double err_lk, err_pats;  /* max |lk - reference|, max |pats 0:0 - f16| */
} kvtee;

static kvq_status kvtee_attend(void *user, const kvq_attn_call *c, kvq_err *err)
{
    kvtee *T = user;
    kvq_engine_seq *seqs[3] = {T->lk, T->pats, T->f16};
    kvq_status s;
    if (c->n > 1) {
        if ((s = T->plain.attend(T->plain.user, c, err)) ||
            (s = kvq_retrieval_append(T->rk, c->layer, c->n, c->pos, c->k, c->v, err)) ||
            (s = kvq_kvcache_append(T->kc, c->layer, c->n, c->pos, c->k, c->v, err)))
            return s;
        for (int i = 0; i < 3; i++)
            if ((s = kvq_engine_seq_append(seqs[i], c->layer, c->n, c->pos, c->k, c->v,
                                           KVQ_ENGINE_F32, err)))
                return s;
        return KVQ_OK;
    }
    const kvq_attn_backend b = kvq_retrieval_backend(T->rk);
    if ((s = b.attend(b.user, c, err)))
        return s;
    float out[3][1024];
    assert_true(T->n <= 1024);
    for (int i = 0; i < 3; i++)
        if ((s = kvq_engine_seq_decode(seqs[i], c->layer, c->pos[0], c->q, c->k, c->v,
                                       KVQ_ENGINE_F32, out[i], err)))
            return s;
    for (int32_t i = 0; i < T->n; i++) {
        T->err_lk = fmax(T->err_lk, fabs((double)out[0][i] - c->out[i]));
        T->err_pats = fmax(T->err_pats, fabs((double)out[1][i] - out[2][i]));
    }
    for (int32_t h = 0; h < T->n_kv; h++) {
        int64_t na = 0, nb = 0;
        const int32_t *a = kvq_retrieval_last_selection(T->rk, c->layer, h, &na);
        const int32_t *sb = kvq_engine_seq_last_selection(T->lk, c->layer, h, &nb);
        T->differ += na != nb || (na && memcmp(a, sb, sizeof *a * (size_t)na));
    }
    T->steps++;
    return KVQ_OK;
}

/* The engine's sequences with kv_cache and the codebook selector (rope artifact): LeanKV
 * bit for bit the reference context with the cache attached, its bytes the cache's and
 * the context's data (kvq_retrieval_held_get);
 * PATS 0:0 (no truncation) the f16 retrieval sequence's outputs. */
static void test_kv_retrieval(void **state)
{
    (void)state;
    const tinyllama_spec *s = &F.t->s;
    kvq_err e = {0};
    kvq_model *m = NULL;
    assert_int_equal(kvq_model_open(F.dir, NULL, &m, &e), KVQ_OK);
    kvq_model_id id;
    kvq_model_identity(m, &id);
    kvq_codebook_set *set = NULL;
    assert_int_equal(kvq_codebook_set_open(F.art_rope, &id, "model", &set, &e), KVQ_OK);
    kvq_retrieval_params rp = kvq_retrieval_params_default();
    kvq_eval_artifact_positions(set, &rp, 0, 0);
    assert_int_equal(rp.positions, KVQ_POSITIONS_ROPE);
    rp.selector = KVQ_SELECT_CODEBOOK;
    rp.budget.count = 6;
    rp.budget.fraction = 0;
    rp.sink = 2;
    rp.window = 12;
    rp.max_tokens = TOTAL;
    kvq_kvcache_params kp = kvq_kvcache_params_default();
    kp.kind = KVQ_KV_LEANKV;
    kp.alpha_h = 0.5;
    kp.alpha_l = 0.2;
    kp.window = 16;
    kp.prompt_tokens = 0;
    kp.max_tokens = TOTAL;
    kp.threads = 1;
    const kvq_model_config *cfg = kvq_model_config_get(m);
    kvtee T = {.n_kv = s->n_kv_heads, .n = s->n_heads * s->head_dim};
    kvq_retrieval *plain = NULL;
    assert_int_equal(kvq_retrieval_create(cfg, set, &rp, &plain, &e), KVQ_OK);
    assert_int_equal(kvq_retrieval_create(cfg, set, &rp, &T.rk, &e), KVQ_OK);
    assert_int_equal(kvq_kvcache_create(cfg, &kp, &T.kc, &e), KVQ_OK);
    assert_int_equal(kvq_retrieval_set_kvcache(T.rk, T.kc, &e), KVQ_OK);
    T.plain = kvq_retrieval_backend(plain);
    kvq_engine_model em = {.n_layers = s->n_layers, .n_heads = s->n_heads,
                           .n_kv_heads = s->n_kv_heads, .head_dim = s->head_dim,
                           .rope_base = s->rope_base, .fingerprint = F.fp};
    kvq_engine *eng = NULL;
    assert_int_equal(kvq_engine_open(F.art_rope, &em, 0, &eng, &e), KVQ_OK);
    kvq_engine_seq_params sp = kvq_engine_seq_params_default();
    sp.budget_tokens = 6;
    sp.sink = 2;
    sp.window = 12;
    sp.max_tokens = TOTAL;
    assert_int_equal(kvq_engine_seq_create(eng, &sp, &T.f16, &e), KVQ_OK); /* f16 rows */
    sp.kv_cache = KVQ_ENGINE_KV_PATS;
    sp.kv_pats_schedule = 2;
    sp.kv_pats_b_min = sp.kv_pats_b_max = 0;
    assert_int_equal(kvq_engine_seq_create(eng, &sp, &T.pats, &e), KVQ_OK);
    sp.kv_cache = KVQ_ENGINE_KV_LEANKV;
    sp.kv_alpha_h = kp.alpha_h;
    sp.kv_alpha_l = kp.alpha_l;
    sp.kv_window = kp.window;
    assert_int_equal(kvq_engine_seq_create(eng, &sp, &T.lk, &e), KVQ_OK);
    kvq_attn_backend b = {.name = "kvtee", .user = &T, .attend = kvtee_attend};
    forward_fixture(m, &b);
    kvq_kvcache_memory mem;
    kvq_kvcache_memory_get(T.kc, &mem);
    kvq_engine_stats st;
    kvq_engine_seq_stats(T.lk, &st);
    printf("  kv retrieval: leankv vs reference %.3g (%lld selections differ), pats 0:0 vs f16 "
           "%.3g; leankv %llu bytes (%.0f pruned), f16 sequence %llu\n", T.err_lk,
           (long long)T.differ, T.err_pats, (unsigned long long)kvq_engine_seq_bytes(T.lk),
           mem.pruned, (unsigned long long)kvq_engine_seq_bytes(T.f16));
    assert_int_equal(T.steps, (int64_t)DECODE * s->n_layers);
    assert_true(T.err_lk == 0 && T.differ == 0);
    assert_true(T.err_pats == 0); /* f16 rows either way, the same kernels' sums */
    assert_true(st.steps > 0 && st.attended < st.visible); /* a selection was made */
    /* the cache's bytes and the context's data per token (no rows: it holds none), as
     * the reference context with the same cache attached holds them */
    kvq_retrieval_held held;
    kvq_retrieval_held_get(T.rk, &held);
    assert_true(held.rows == 0 && held.selector > 0);
    assert_true(kvq_engine_seq_bytes(T.lk) ==
                (uint64_t)(kvq_kvcache_bytes(T.kc) +
                           held.total * (double)kvq_retrieval_length(T.rk) + 0.5));
    assert_true(kvq_engine_seq_bytes(T.lk) < kvq_engine_seq_bytes(T.f16));
    kvq_engine_seq_free(T.lk);
    kvq_engine_seq_free(T.pats);
    kvq_engine_seq_free(T.f16);
    kvq_engine_close(eng);
    kvq_retrieval_free(T.rk);
    kvq_kvcache_free(T.kc);
    kvq_retrieval_free(plain);
    kvq_codebook_set_close(set);
    kvq_model_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_artifact_positions),
        cmocka_unit_test(test_selectors_measured),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_kv_retrieval),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
