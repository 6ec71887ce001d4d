/* test_archs_engine.c — per-layer attention in the retrieval runtime and the embedding
 * engine (issue 33), on the tiny gemma3 and gemma2 models of tests/data/archs
 * (scripts/gen_arch_models.py: transformers' logits of a 16-token prompt and its 48
 * greedy ids, with a sliding window of 8 tokens on the local layers).
 *
 *   - kvq calibrate on each: the artifact has codebooks for the global layers only;
 *   - the engine given the model description written from transformers' own per-layer
 *     values (the expected file's "layers" and "rope_parameters", config.json's softcap)
 *     and fed kvq's forward pass one token at a time, every token a decode step, with a
 *     budget covering every token: transformers' logits within test_archs's tolerance
 *     and its 48 greedy ids (64 tokens: the local layers see 8 of them); the same when
 *     the engine attends the first 10 prompt tokens itself and hands their rows to kvq
 *     (kvq_engine_seq_append);
 *   - kvq's forward pass with the retrieval backend (kvq run --artifact, kvq eval), the
 *     prompt in chunks, selectors codebook, oracle and full at a budget covering every
 *     token: the same;
 *   - at a budget of 2 tokens (sink 1, window 2): the local layers' attention outputs
 *     equal exact windowed attention (kvq's full attention, checked against transformers
 *     by test_archs), the global layer selects 2 candidates;
 *   - bad input: a description whose layer contradicts the artifact's is refused by
 *     name; a description left out takes the artifact's. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "helpers/testutil.h"
#include "kvq.h"
#include "kvq/engine.h"
#include "kvq/util.h"

/* test_archs's bound for float32 forward passes against transformers (measured there at
 * most 4.4e-6): the engine's path sums in another order, within the same bound. */
#define LOGIT_TOL 2e-5
/* local layers: kvq's exact windowed attention (double sums) against the full
 * attention backend (float SGEMM) on the same rows */
#define LOCAL_TOL 1e-5
#define N_GREEDY 48
#define MAX_TOK 64

static cJSON *load_json(const char *path)
{
    uint8_t *data = NULL;
    size_t size = 0;
    kvq_err e = {0};
    assert_int_equal(kvq_read_file(path, &data, &size, &e), KVQ_OK);
    cJSON *j = cJSON_ParseWithLength((const char *)data, size);
    free(data);
    assert_non_null(j);
    return j;
}

static double jnum(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

/* The artifact of arch: kvq_calibrate_run on the HF directory (a quick run, no
 * profile). */
static void calibrate(const char *arch, char *art, size_t cap)
{
    char dir[256];
    snprintf(dir, sizeof dir, "tests/data/archs/%s", arch);
    char name[64];
    snprintf(name, sizeof name, "archs_engine_%s.kvq", arch);
    snprintf(art, cap, "%s", test_path(name));
    /* token ids (the HF directories' SentencePiece tokenizer.model is not read) */
    kvq_rng rng;
    kvq_rng_seed(&rng, 33);
    static int32_t ids[1024];
    for (size_t i = 0; i < 1024; i++)
        ids[i] = 4 + (int32_t)kvq_rng_below(&rng, 508);
    char idp[1024], spec[1100];
    snprintf(name, sizeof name, "archs_engine_%s.ids", arch);
    snprintf(idp, sizeof idp, "%s", test_path(name));
    assert_int_equal(test_write_file(idp, ids, sizeof ids), 0);
    snprintf(spec, sizeof spec, "ids:%s", idp);
    kvq_calibrate_params p = kvq_calibrate_params_default();
    p.corpus = spec;
    p.capture.seq_len = 64;
    p.capture.max_tokens = 1024;
    p.heldout_tokens = 0;
    p.profile = 0;
    p.fit.codebook_size = 8;
    p.fit.iters = 4;
    kvq_calibrate_summary sum;
    kvq_err e = {0};
    if (kvq_calibrate_run(dir, art, &p, &sum, &e))
        fail_msg("calibrate %s: %s", arch, e.msg);
}

/* The engine's description of the model from transformers' values. */
typedef struct desc {
    kvq_engine_model m;
    kvq_engine_layer layers[8];
    char fp[KVQ_FINGERPRINT_CAP];
} desc;

static void describe(const char *arch, const kvq_model *model, const cJSON *exp, desc *D)
{
    char path[256];
    snprintf(path, sizeof path, "tests/data/archs/%s/config.json", arch);
    cJSON *cfg = load_json(path);
    const cJSON *rp = cJSON_GetObjectItem(exp, "rope_parameters");
    const cJSON *full = cJSON_GetObjectItem(rp, "full_attention");
    const cJSON *slide = cJSON_GetObjectItem(rp, "sliding_attention");
    if (!full) /* gemma2: one RoPE for every layer */
        full = slide = rp;
    memset(D, 0, sizeof *D);
    snprintf(D->fp, sizeof D->fp, "%s", kvq_model_fingerprint(model));
    const cJSON *layers = cJSON_GetObjectItem(exp, "layers");
    const int n = cJSON_GetArraySize(layers);
    assert_true(n <= 8);
    D->m.n_layers = n;
    D->m.n_heads = (int32_t)jnum(cfg, "num_attention_heads");
    D->m.n_kv_heads = (int32_t)jnum(cfg, "num_key_value_heads");
    D->m.head_dim = (int32_t)jnum(exp, "head_dim");
    D->m.rope_base = jnum(full, "rope_theta");
    D->m.rope_interleaved = 0; /* HF rows */
    const cJSON *rt = cJSON_GetObjectItem(full, "rope_type");
    D->m.rope_scaling = cJSON_IsString(rt) ? rt->valuestring : "none";
    if (!strcmp(D->m.rope_scaling, "default"))
        D->m.rope_scaling = "none";
    D->m.rope_factor = jnum(full, "factor");
    D->m.fingerprint = D->fp;
    for (int l = 0; l < n; l++) {
        const cJSON *L = cJSON_GetArrayItem(layers, l);
        kvq_engine_layer *x = &D->layers[l];
        const int sliding = !strcmp(cJSON_GetObjectItem(L, "type")->valuestring,
                                    "sliding_attention");
        x->window = (int32_t)jnum(L, "window");
        x->attn_scale = jnum(L, "scaling");
        x->attn_softcap = jnum(cfg, "attn_logit_softcapping");
        x->rope_base = jnum(sliding ? slide : full, "rope_theta");
        x->rope_scaling = sliding && slide != full ? "none" : NULL;
    }
    D->m.layers = D->layers;
    cJSON_Delete(cfg);
}

/* The attention backend of kvq's forward pass that hands every row to the engine as a
 * decode step; with ref set, also to kvq's full attention, and the local layers'
 * outputs compared. */
typedef struct eng_backend {
    kvq_engine *e;
    kvq_engine_seq *s;
    kvq_full_attn *ref;
    const kvq_model_config *c;
    float *rout;
    int compare;        /* ref: compare the local layers' outputs with it */
    int prefill;        /* ref: attends chunks of several rows (the engine's own prefill),
                           their rows handed to kvq by kvq_engine_seq_append */
    double worst_local; /* max |engine - full| over the local layers' outputs */
    int64_t selected;   /* candidates the global layers' last steps selected */
} eng_backend;

static kvq_status eng_attend(void *user, const kvq_attn_call *c, kvq_err *err)
{
    eng_backend *b = user;
    const size_t qd = (size_t)b->c->n_heads * b->c->head_dim,
                 kvd = (size_t)b->c->n_kv_heads * b->c->head_dim;
    if (b->prefill && c->n > 1) { /* the engine attends the prompt itself */
        kvq_attn_backend rb = kvq_full_attn_backend(b->ref);
        kvq_status s = rb.attend(rb.user, c, err);
        return s ? s : kvq_engine_seq_append(b->s, c->layer, c->n, c->pos, c->k, c->v,
                                             KVQ_ENGINE_F32, err);
    }
    for (int32_t i = 0; i < c->n; i++) {
        kvq_status s = kvq_engine_seq_decode(b->s, c->layer, c->pos[i], c->q + i * qd,
                                             c->k + i * kvd, c->v + i * kvd, KVQ_ENGINE_F32,
                                             c->out + i * qd, err);
        if (s)
            return s;
        const int local = kvq_engine_layer_window(b->e, c->layer) > 0;
        int64_t cnt = 0;
        kvq_engine_seq_last_selection(b->s, c->layer, 0, &cnt);
        if (local)
            assert_int_equal(cnt, 0);
        else
            b->selected += cnt;
    }
    if (!b->compare)
        return KVQ_OK;
    kvq_attn_backend rb = kvq_full_attn_backend(b->ref);
    const kvq_attn_call rc = {.layer = c->layer, .n = c->n, .pos = c->pos, .q = c->q,
                              .k = c->k, .v = c->v, .out = b->rout};
    kvq_status s = rb.attend(rb.user, &rc, err);
    if (s || kvq_engine_layer_window(b->e, c->layer) == 0)
        return s;
    for (size_t j = 0; j < (size_t)c->n * qd; j++)
        b->worst_local = fmax(b->worst_local, fabs((double)c->out[j] - b->rout[j]));
    return KVQ_OK;
}

/* The prompt one token at a time (mode 0, 1) or its first PREFILL tokens attended by
 * the engine itself (kvq's full attention) and handed to kvq with kvq_engine_seq_append,
 * the rest one at a time (mode 2), then 48 greedy steps, through the engine. Mode 1: a
 * budget of 2 tokens, the local layers compared with exact windowed attention. */
#define PREFILL 10 /* more than the window: the local ring holds a chunk beyond it */
static void run_engine(const char *arch, const char *art, const cJSON *exp, int mode)
{
    const int small_budget = mode == 1;
    char dir[256];
    snprintf(dir, sizeof dir, "tests/data/archs/%s", arch);
    kvq_model_params mp = kvq_model_params_default();
    mp.load_tokenizer = 0;
    kvq_model *m = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_model_open(dir, &mp, &m, &e), KVQ_OK);
    const kvq_model_config *c = kvq_model_config_get(m);
    desc D;
    describe(arch, m, exp, &D);
    eng_backend b = {.c = c};
    if (kvq_engine_open(art, &D.m, 0, &b.e, &e))
        fail_msg("%s: engine open: %s", arch, e.msg);
    for (int32_t l = 0; l < c->n_layers; l++)
        assert_int_equal(kvq_engine_layer_window(b.e, l), D.layers[l].window);
    kvq_engine_seq_params sp = kvq_engine_seq_params_default();
    sp.cache_f16 = 0;
    sp.max_tokens = MAX_TOK;
    if (small_budget) {
        sp.budget_tokens = 2;
        sp.sink = 1;
        sp.window = 2;
        b.compare = 1;
        b.rout = malloc(sizeof(float) * (size_t)c->n_heads * c->head_dim);
        assert_non_null(b.rout);
    } else {
        sp.budget_fraction = 1.0;
    }
    b.prefill = mode == 2;
    if (b.compare || b.prefill)
        assert_int_equal(kvq_full_attn_create(c, MAX_TOK, &b.ref, &e), KVQ_OK);
    assert_int_equal(kvq_engine_seq_create(b.e, &sp, &b.s, &e), KVQ_OK);
    kvq_forward_params fp = kvq_forward_params_default();
    fp.max_tokens = MAX_TOK;
    kvq_forward *f = NULL;
    assert_int_equal(kvq_forward_create(m, &fp, &f, &e), KVQ_OK);
    const kvq_attn_backend be = {.name = "engine", .user = &b, .attend = eng_attend,
                                 .per_layer = 1};
    kvq_forward_set_attention(f, &be);

    const cJSON *toks = cJSON_GetObjectItem(exp, "tokens"), *ll = cJSON_GetObjectItem(exp, "logits");
    const cJSON *greedy = cJSON_GetObjectItem(exp, "greedy");
    const int n = cJSON_GetArraySize(toks), V = c->vocab_size;
    float *logits = malloc(sizeof *logits * (size_t)V * PREFILL);
    assert_non_null(logits);
    double worst = 0;
    int first = 0;
    if (mode == 2) {
        int32_t ids[PREFILL];
        for (int i = 0; i < PREFILL; i++)
            ids[i] = cJSON_GetArrayItem(toks, i)->valueint;
        assert_int_equal(kvq_forward_tokens(f, ids, PREFILL, KVQ_LOGITS_ALL, logits, &e), KVQ_OK);
        assert_int_equal(kvq_engine_seq_length(b.s, 0), PREFILL);
        for (int i = 0; i < PREFILL; i++)
            for (int v = 0; v < V; v++)
                worst = fmax(worst, fabs((double)logits[(size_t)i * V + v] -
                                         cJSON_GetArrayItem(cJSON_GetArrayItem(ll, i), v)->valuedouble));
        first = PREFILL;
    }
    for (int i = first; i < n; i++) {
        int32_t t = cJSON_GetArrayItem(toks, i)->valueint;
        if (kvq_forward_tokens(f, &t, 1, KVQ_LOGITS_LAST, logits, &e))
            fail_msg("%s: token %d: %s", arch, i, e.msg);
        const cJSON *row = cJSON_GetArrayItem(ll, i);
        for (int v = 0; v < V; v++)
            worst = fmax(worst, fabs((double)logits[v] - cJSON_GetArrayItem(row, v)->valuedouble));
    }
    int mismatch = -1;
    for (int s = 0; s < N_GREEDY; s++) {
        int32_t t = kvq_sample_token(logits, V, 0, 1, NULL, NULL, NULL);
        if (mismatch < 0 && t != cJSON_GetArrayItem(greedy, s)->valueint)
            mismatch = s;
        if (s + 1 < N_GREEDY)
            assert_int_equal(kvq_forward_tokens(f, &t, 1, KVQ_LOGITS_LAST, logits, &e), KVQ_OK);
    }
    if (!small_budget) {
        print_message("%s: engine%s, budget all: max |kvq - transformers| logits %.2g\n", arch,
                      mode == 2 ? " after kvq_engine_seq_append of the prompt's rows" : "",
                      worst);
        if (!(worst <= LOGIT_TOL))
            fail_msg("%s: engine logits max |kvq - transformers| %g > %g", arch, worst, LOGIT_TOL);
        if (mismatch >= 0)
            fail_msg("%s: engine greedy id %d differs from transformers'", arch, mismatch);
    } else {
        print_message("%s: engine, budget 2: local layers max |engine - exact window| %.2g, "
                      "%lld candidates selected on the global layers\n", arch, b.worst_local,
                      (long long)b.selected);
        if (!(b.worst_local <= LOCAL_TOL))
            fail_msg("%s: a local layer's output differs from exact windowed attention by %g",
                     arch, b.worst_local);
        assert_true(b.selected > 0);
    }
    free(logits);
    free(b.rout);
    kvq_full_attn_free(b.ref);
    kvq_forward_free(f);
    kvq_engine_seq_free(b.s);
    kvq_engine_close(b.e);
    kvq_model_close(m);
}

/* kvq's forward pass with the retrieval backend (what kvq run --artifact and kvq eval
 * use): the prompt in chunks of 5 (exact prefill, crossing the window mid-chunk), then
 * 48 greedy decode steps, sink 1, window 2 and a budget covering every token, exact
 * RoPE, f32 cache: transformers' logits and greedy ids. */
static void run_retrieval(const char *arch, const char *art, const cJSON *exp, kvq_selector sel)
{
    char dir[256];
    snprintf(dir, sizeof dir, "tests/data/archs/%s", arch);
    kvq_model_params mp = kvq_model_params_default();
    mp.load_tokenizer = 0;
    kvq_model *m = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_model_open(dir, &mp, &m, &e), KVQ_OK);
    const kvq_model_config *c = kvq_model_config_get(m);
    kvq_model_id id;
    kvq_model_identity(m, &id);
    kvq_codebook_set *set = NULL;
    assert_int_equal(kvq_codebook_set_open(art, &id, "model", &set, &e), KVQ_OK);
    kvq_retrieval_params rp = kvq_retrieval_params_default();
    rp.selector = sel;
    rp.budget = (kvq_budget){.fraction = 1.0};
    rp.sink = 1;
    rp.window = 2;
    rp.positions = KVQ_POSITIONS_ROPE;
    rp.cache_dtype = KVQ_DT_F32;
    rp.max_tokens = MAX_TOK;
    kvq_retrieval *r = NULL;
    assert_int_equal(kvq_retrieval_create(c, set, &rp, &r, &e), KVQ_OK);
    kvq_forward_params fp = kvq_forward_params_default();
    fp.max_tokens = MAX_TOK;
    fp.chunk = 5;
    kvq_forward *f = NULL;
    assert_int_equal(kvq_forward_create(m, &fp, &f, &e), KVQ_OK);
    const kvq_attn_backend be = kvq_retrieval_backend(r);
    kvq_forward_set_attention(f, &be);
    const cJSON *toks = cJSON_GetObjectItem(exp, "tokens"), *ll = cJSON_GetObjectItem(exp, "logits");
    const cJSON *greedy = cJSON_GetObjectItem(exp, "greedy");
    const int n = cJSON_GetArraySize(toks), V = c->vocab_size;
    int32_t ids[MAX_TOK];
    float *logits = malloc(sizeof *logits * (size_t)n * (size_t)V);
    assert_non_null(logits);
    for (int i = 0; i < n; i++)
        ids[i] = cJSON_GetArrayItem(toks, i)->valueint;
    if (kvq_forward_tokens(f, ids, n, KVQ_LOGITS_ALL, logits, &e))
        fail_msg("%s: retrieval forward: %s", arch, e.msg);
    double worst = 0;
    for (int i = 0; i < n; i++)
        for (int v = 0; v < V; v++)
            worst = fmax(worst, fabs((double)logits[(size_t)i * V + v] -
                                     cJSON_GetArrayItem(cJSON_GetArrayItem(ll, i), v)->valuedouble));
    float *last = logits + (size_t)(n - 1) * V;
    for (int s = 0; s < N_GREEDY; s++) {
        int32_t t = kvq_sample_token(last, V, 0, 1, NULL, NULL, NULL);
        if (t != cJSON_GetArrayItem(greedy, s)->valueint)
            fail_msg("%s: retrieval greedy step %d: kvq %d, transformers %d", arch, s, t,
                     cJSON_GetArrayItem(greedy, s)->valueint);
        if (s + 1 < N_GREEDY)
            assert_int_equal(kvq_forward_tokens(f, &t, 1, KVQ_LOGITS_LAST, last, &e), KVQ_OK);
    }
    kvq_retrieval_stats st;
    kvq_retrieval_stats_get(r, &st);
    print_message("%s: retrieval backend, %s, budget all: max |kvq - transformers| logits %.2g, "
                  "%llu retrieval steps\n", arch, kvq_selector_name(sel), worst,
                  (unsigned long long)st.steps);
    if (!(worst <= LOGIT_TOL))
        fail_msg("%s: retrieval logits max |kvq - transformers| %g > %g", arch, worst, LOGIT_TOL);
    assert_true(st.steps > 0 && st.attended == st.visible);
    free(logits);
    kvq_forward_free(f);
    kvq_retrieval_free(r);
    kvq_codebook_set_close(set);
    kvq_model_close(m);
}

/* The artifact: codebooks on the global layers only, the local ones recorded. */
static void check_artifact(const char *art, const kvq_model *m)
{
    const kvq_model_config *c = kvq_model_config_get(m);
    kvq_model_id id;
    kvq_model_identity(m, &id);
    kvq_codebook_set *set = NULL;
    kvq_err e = {0};
    if (kvq_codebook_set_open(art, &id, "model", &set, &e))
        fail_msg("%s", e.msg);
    for (int32_t l = 0; l < c->n_layers; l++) {
        kvq_layer_attn la;
        kvq_model_layer_attn(c, l, &la);
        assert_int_equal(kvq_codebook_set_at(set, l, 0) != NULL, la.window == 0);
        assert_int_equal(kvq_retrieval_layer_local(c, l), la.window > 0);
    }
    kvq_codebook_set_close(set);
}

/* Bad input: each field of one layer contradicting the artifact, named; the old
 * callers' description (no attention fields) takes the artifact's. */
static void check_bad_description(const char *arch, const char *art, const cJSON *exp)
{
    char dir[256];
    snprintf(dir, sizeof dir, "tests/data/archs/%s", arch);
    kvq_model_params mp = kvq_model_params_default();
    mp.load_tokenizer = 0;
    kvq_model *m = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_model_open(dir, &mp, &m, &e), KVQ_OK);
    desc D;
    for (int k = 0; k < 4; k++) {
        describe(arch, m, exp, &D);
        const char *want = NULL;
        switch (k) {
        case 0: D.layers[0].window = 0; want = "layer 0's attention differs: window 8 vs 0"; break;
        case 1: D.layers[1].attn_scale = 0.3; want = "layer 1's attention differs: scale 0.25 vs 0.3"; break;
        case 2: D.layers[0].rope_base = 5e5; want = "layer 0's attention differs: rope.base"; break;
        default: D.layers[1].attn_softcap = 7; want = "layer 1's attention differs: softcap"; break;
        }
        kvq_engine *eng = NULL;
        kvq_status s = kvq_engine_open(art, &D.m, 0, &eng, &e);
        assert_int_equal(s, KVQ_E_MISMATCH);
        assert_null(eng);
        if (!strstr(e.msg, want) || !strstr(e.msg, art))
            fail_msg("%s: message \"%s\" lacks \"%s\"", arch, e.msg, want);
    }
    describe(arch, m, exp, &D);
    D.m.layers = NULL; /* an old caller: no per-layer fields */
    kvq_engine *eng = NULL;
    assert_int_equal(kvq_engine_open(art, &D.m, 0, &eng, &e), KVQ_OK);
    assert_int_equal(kvq_engine_layer_window(eng, 0), 8);
    assert_int_equal(kvq_engine_layer_window(eng, 1), !strcmp(arch, "gemma3") ? 8 : 0);
    kvq_engine_close(eng);
    D.m.sliding_window = 8; /* every layer: contradicts the global layers */
    assert_int_equal(kvq_engine_open(art, &D.m, 0, &eng, &e), KVQ_E_MISMATCH);
    assert_non_null(strstr(e.msg, "'s attention differs: "));
    kvq_model_close(m);
}

static void test_arch(const char *arch)
{
    char path[256], art[1024];
    snprintf(path, sizeof path, "tests/data/archs/%s.json", arch);
    cJSON *exp = load_json(path);
    calibrate(arch, art, sizeof art);
    kvq_model *m = NULL;
    kvq_err e = {0};
    kvq_model_params mp = kvq_model_params_default();
    mp.load_tokenizer = 0;
    snprintf(path, sizeof path, "tests/data/archs/%s", arch);
    assert_int_equal(kvq_model_open(path, &mp, &m, &e), KVQ_OK);
    check_artifact(art, m);
    kvq_model_close(m);
    run_engine(arch, art, exp, 0);
    run_engine(arch, art, exp, 1);
    run_engine(arch, art, exp, 2);
    run_retrieval(arch, art, exp, KVQ_SELECT_CODEBOOK);
    run_retrieval(arch, art, exp, KVQ_SELECT_ORACLE);
    run_retrieval(arch, art, exp, KVQ_SELECT_FULL);
    check_bad_description(arch, art, exp);
    cJSON_Delete(exp);
}

static void test_gemma3(void **state) { (void)state; test_arch("gemma3"); }
static void test_gemma2(void **state) { (void)state; test_arch("gemma2"); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemma3),
        cmocka_unit_test(test_gemma2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
