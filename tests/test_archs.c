/* test_archs.c — qwen3, gemma3, gemma2 and phi3 against transformers.
 *
 * tests/data/archs/<arch>/ (HF directory), <arch>.gguf (the same weights converted by
 * llama.cpp's convert_hf_to_gguf.py) and <arch>.json (transformers' values) come from
 * scripts/gen_arch_models.py, never from kvq. For each architecture and each of the two
 * files:
 *   - every layer's attention as kvq describes it (window, score scale) is transformers'
 *   - the logits of all 16 prompt positions within LOGIT_TOL of transformers'
 *   - the pre-RoPE q and k the observer sees (what kvq capture records) within QK_TOL
 *     of the outputs of transformers' own modules (q_norm / k_norm, q_proj / k_proj,
 *     qkv_proj), every layer and position
 *   - greedy decoding (one token at a time after the prompt) gives transformers' 48 ids
 * and the GGUF's logits agree with the HF directory's within GGUF_TOL; the converter's
 * Q8_0 file (<arch>.q8_0.gguf) gives, within LOGIT_TOL, the logits and the greedy ids
 * transformers computes from the weights the gguf package dequantizes from it; and on the
 * GGUF kvq agrees with llama.cpp (<arch>.llamacpp.json, llama-cpp-python 0.3.16) within
 * LLAMACPP_TOL, with its 48 greedy ids (qwen3, gemma3, gemma2). */
#include <cJSON.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvq/model.h"
#include "kvq/tokenizer.h"
#include "kvq/util.h"

/* float32 forward passes over the same weights: measured max |kvq - transformers| is at
 * most 4.4e-6 (logits of magnitude up to ~10, q/k up to ~4; summation order differs);
 * the bounds leave about 5x room. HF directory and GGUF: the same f32 values. */
#define LOGIT_TOL 2e-5
#define QK_TOL 2e-5
#define GGUF_TOL 1e-5
/* llama.cpp (CPU, F32 weights) computes GELU from an f16 table: on the gemma files it is
 * 1.6e-3 / 2.2e-3 from transformers (2.9e-6 on qwen3); kvq is checked against it within
 * this bound, its greedy ids exactly. */
#define LLAMACPP_TOL 5e-3
#define N_GREEDY 48

static const char *const ARCHS[] = {"qwen3", "gemma3", "gemma2", "phi3"};

static cJSON *load_expected(const char *arch)
{
    char path[256];
    snprintf(path, sizeof path, "tests/data/archs/%s.json", arch);
    uint8_t *data = NULL;
    size_t size = 0;
    kvq_err e = {0};
    assert_int_equal(kvq_read_file(path, &data, &size, &e), KVQ_OK);
    cJSON *j = cJSON_ParseWithLength((const char *)data, size);
    free(data);
    assert_non_null(j);
    return j;
}

static int n_items(const cJSON *a) { return cJSON_GetArraySize(a); }

typedef struct qk_rec {
    const cJSON *q, *k;          /* expected [layer][pos][heads * d] */
    double max_q, max_k;
    int calls;
} qk_rec;

static double max_diff_row(const float *got, const cJSON *row, int n)
{
    double m = 0;
    assert_int_equal(n_items(row), n);
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, row)
    {
        double d = fabs((double)got[i++] - v->valuedouble);
        m = d > m ? d : m;
    }
    return m;
}

static kvq_status observe(void *user, const kvq_attn_call *c, kvq_err *err)
{
    (void)err;
    qk_rec *r = user;
    const cJSON *ql = cJSON_GetArrayItem(r->q, c->layer), *kl = cJSON_GetArrayItem(r->k, c->layer);
    const int qw = n_items(cJSON_GetArrayItem(ql, 0)), kw = n_items(cJSON_GetArrayItem(kl, 0));
    for (int i = 0; i < c->n; i++) {
        double dq = max_diff_row(c->q + (size_t)i * qw, cJSON_GetArrayItem(ql, (int)c->pos[i]), qw);
        double dk = max_diff_row(c->k + (size_t)i * kw, cJSON_GetArrayItem(kl, (int)c->pos[i]), kw);
        r->max_q = dq > r->max_q ? dq : r->max_q;
        r->max_k = dk > r->max_k ? dk : r->max_k;
    }
    r->calls++;
    return KVQ_OK;
}

/* Runs the prompt (logits of every position into *logits_out) and checks q/k, the
 * logits and the greedy ids against transformers'. */
static void check_model(const char *arch, const char *path, const cJSON *exp, float **logits_out)
{
    kvq_err e = {0};
    kvq_model *m = NULL;
    kvq_model_params mp = kvq_model_params_default();
    mp.load_tokenizer = 0;
    if (kvq_model_open(path, &mp, &m, &e) != KVQ_OK)
        fail_msg("%s: %s", path, e.msg);
    const kvq_model_config *c = kvq_model_config_get(m);
    assert_string_equal(kvq_arch_name(c->arch), arch);

    /* per-layer attention: transformers' window and score scale */
    const cJSON *layers = cJSON_GetObjectItem(exp, "layers");
    const int check_qk = layers != NULL; /* the Q8_0 files' values have logits and ids only */
    for (int l = 0; check_qk && l < c->n_layers; l++) {
        const cJSON *L = cJSON_GetArrayItem(layers, l);
        kvq_layer_attn la;
        kvq_model_layer_attn(c, l, &la);
        assert_int_equal(la.window, cJSON_GetObjectItem(L, "window")->valueint);
        assert_true(fabs(la.scale - cJSON_GetObjectItem(L, "scaling")->valuedouble) < 1e-7);
    }

    const cJSON *toks = cJSON_GetObjectItem(exp, "tokens");
    const int n = n_items(toks), V = c->vocab_size;
    int32_t *ids = malloc(sizeof *ids * (size_t)(n + N_GREEDY));
    float *logits = malloc(sizeof *logits * (size_t)n * (size_t)V);
    assert_non_null(ids);
    assert_non_null(logits);
    for (int i = 0; i < n; i++)
        ids[i] = cJSON_GetArrayItem(toks, i)->valueint;

    kvq_forward_params fp = kvq_forward_params_default();
    fp.chunk = 5; /* several chunks: the window and the cache are crossed mid-chunk */
    fp.max_tokens = n + N_GREEDY;
    kvq_forward *f = NULL;
    assert_int_equal(kvq_forward_create(m, &fp, &f, &e), KVQ_OK);
    qk_rec rec = {.q = cJSON_GetObjectItem(exp, "q"), .k = cJSON_GetObjectItem(exp, "k")};
    if (check_qk) {
        assert_int_equal(n_items(layers), c->n_layers);
        kvq_forward_set_observer(f, observe, &rec);
    }
    if (kvq_forward_tokens(f, ids, n, KVQ_LOGITS_ALL, logits, &e) != KVQ_OK)
        fail_msg("%s: %s", path, e.msg);
    kvq_forward_set_observer(f, NULL, NULL);
    assert_int_equal(rec.calls, check_qk ? c->n_layers * ((n + fp.chunk - 1) / fp.chunk) : 0);
    if (!(rec.max_q <= QK_TOL) || !(rec.max_k <= QK_TOL))
        fail_msg("%s: pre-RoPE q/k max |kvq - transformers| %g / %g > %g", path, rec.max_q,
                 rec.max_k, QK_TOL);

    const cJSON *el = cJSON_GetObjectItem(exp, "logits");
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double d = max_diff_row(logits + (size_t)i * V, cJSON_GetArrayItem(el, i), V);
        worst = d > worst ? d : worst;
    }
    if (!(worst <= LOGIT_TOL))
        fail_msg("%s: logits max |kvq - transformers| %g > %g", path, worst, LOGIT_TOL);
    if (check_qk)
        print_message("%s: max |kvq - transformers|: logits %.2g, pre-RoPE q %.2g, k %.2g\n",
                      path, worst, rec.max_q, rec.max_k);
    else
        print_message("%s: max |kvq - transformers|: logits %.2g\n", path, worst);

    /* greedy: the argmax of the last logits, fed back one token at a time */
    const cJSON *greedy = cJSON_GetObjectItem(exp, "greedy");
    assert_int_equal(n_items(greedy), N_GREEDY);
    float *last = malloc(sizeof *last * (size_t)V);
    assert_non_null(last);
    memcpy(last, logits + (size_t)(n - 1) * V, sizeof *last * (size_t)V);
    for (int s = 0; s < N_GREEDY; s++) {
        int32_t t = kvq_sample_token(last, V, 0, 1, NULL, NULL, NULL);
        if (t != cJSON_GetArrayItem(greedy, s)->valueint)
            fail_msg("%s: greedy step %d: kvq %d, transformers %d", path, s, t,
                     cJSON_GetArrayItem(greedy, s)->valueint);
        if (kvq_forward_tokens(f, &t, 1, KVQ_LOGITS_LAST, last, &e) != KVQ_OK)
            fail_msg("%s: %s", path, e.msg);
    }
    free(last);
    free(ids);
    kvq_forward_free(f);
    kvq_model_close(m);
    *logits_out = logits;
}

/* kvq's logits on the GGUF within LLAMACPP_TOL of llama.cpp's, the same greedy ids. */
static void check_llamacpp(const char *path, const cJSON *lc)
{
    kvq_err e = {0};
    kvq_model_params mp = kvq_model_params_default();
    mp.load_tokenizer = 0;
    kvq_model *m = NULL;
    kvq_forward *f = NULL;
    assert_int_equal(kvq_model_open(path, &mp, &m, &e), KVQ_OK);
    const cJSON *toks = cJSON_GetObjectItem(lc, "tokens"), *gl = cJSON_GetObjectItem(lc, "greedy");
    const int n = n_items(toks), V = kvq_model_config_get(m)->vocab_size;
    kvq_forward_params fp = kvq_forward_params_default();
    fp.max_tokens = n + N_GREEDY;
    assert_int_equal(kvq_forward_create(m, &fp, &f, &e), KVQ_OK);
    int32_t ids[64];
    float *logits = malloc(sizeof *logits * (size_t)n * (size_t)V);
    assert_non_null(logits);
    assert_true(n <= 64);
    for (int i = 0; i < n; i++)
        ids[i] = cJSON_GetArrayItem(toks, i)->valueint;
    assert_int_equal(kvq_forward_tokens(f, ids, n, KVQ_LOGITS_ALL, logits, &e), KVQ_OK);
    double worst = 0;
    const cJSON *ll = cJSON_GetObjectItem(lc, "logits");
    for (int i = 0; i < n; i++)
        worst = fmax(worst, max_diff_row(logits + (size_t)i * V, cJSON_GetArrayItem(ll, i), V));
    if (!(worst <= LLAMACPP_TOL))
        fail_msg("%s: logits max |kvq - llama.cpp| %g > %g", path, worst, LLAMACPP_TOL);
    print_message("%s: max |kvq - llama.cpp|: logits %.2g\n", path, worst);
    float *last = logits + (size_t)(n - 1) * V;
    for (int s = 0; s < N_GREEDY; s++) {
        int32_t t = kvq_sample_token(last, V, 0, 1, NULL, NULL, NULL);
        if (t != cJSON_GetArrayItem(gl, s)->valueint)
            fail_msg("%s: greedy step %d: kvq %d, llama.cpp %d", path, s, t,
                     cJSON_GetArrayItem(gl, s)->valueint);
        assert_int_equal(kvq_forward_tokens(f, &t, 1, KVQ_LOGITS_LAST, last, &e), KVQ_OK);
    }
    free(logits);
    kvq_forward_free(f);
    kvq_model_close(m);
}

static void test_arch(const char *arch)
{
    cJSON *exp = load_expected(arch);
    char hf[256], gg[256];
    snprintf(hf, sizeof hf, "tests/data/archs/%s", arch);
    snprintf(gg, sizeof gg, "tests/data/archs/%s.gguf", arch);
    float *lh = NULL, *lg = NULL;
    check_model(arch, hf, exp, &lh);
    check_model(arch, gg, exp, &lg);
    const size_t cnt = (size_t)n_items(cJSON_GetObjectItem(exp, "tokens")) *
                       (size_t)cJSON_GetObjectItem(exp, "vocab_size")->valueint;
    double worst = 0;
    for (size_t i = 0; i < cnt; i++)
        worst = fmax(worst, fabs((double)lh[i] - lg[i]));
    if (!(worst <= GGUF_TOL))
        fail_msg("%s: logits max |HF dir - GGUF| %g > %g", arch, worst, GGUF_TOL);
    /* the same values: the same weight fingerprint (gemma's norms are 1 + w in both) */
    kvq_model_params mp = kvq_model_params_default();
    mp.load_tokenizer = 0;
    kvq_model *mh = NULL, *mg = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_model_open(hf, &mp, &mh, &e), KVQ_OK);
    assert_int_equal(kvq_model_open(gg, &mp, &mg, &e), KVQ_OK);
    assert_string_equal(kvq_model_fingerprint(mh), kvq_model_fingerprint(mg));
    kvq_model_close(mh);
    kvq_model_close(mg);
    free(lh);
    free(lg);
    cJSON_Delete(exp);

    /* llama.cpp on the same GGUF (its vocabulary loader refuses the phi3 file) */
    if (strcmp(arch, "phi3") != 0) {
        char lp[64];
        snprintf(lp, sizeof lp, "%s.llamacpp", arch);
        cJSON *lc = load_expected(lp);
        check_llamacpp(gg, lc);
        cJSON_Delete(lc);
    }

    /* The Q8_0 conversion: its prefill dequantizes tiles, its decode multiplies the packed
     * blocks; transformers ran on the weights the gguf package dequantizes from it. */
    char q8[256], q8e[256];
    snprintf(q8, sizeof q8, "tests/data/archs/%s.q8_0.gguf", arch);
    snprintf(q8e, sizeof q8e, "%s.q8_0", arch);
    exp = load_expected(q8e);
    check_model(arch, q8, exp, &lg);
    free(lg);
    cJSON_Delete(exp);
}

/* The configuration as transformers 5 writes it (rope_parameters, layer_types) gives
 * kvq the same model as the released checkpoints' form (rope_theta, rope_scaling,
 * rope_local_base_freq, sliding_window_pattern). */
/* A temporary HF directory: config.json = `config` (size bytes), model.safetensors a
 * link to tests/data/archs/<arch>'s. Written into dir[] (a mkdtemp template). */
static void hf_copy(const char *arch, const void *config, size_t size, char *dir)
{
    char dst[512], src[512], stp[512];
    assert_non_null(mkdtemp(dir));
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    FILE *fo = fopen(dst, "wb");
    assert_non_null(fo);
    assert_int_equal(fwrite(config, 1, size, fo), size);
    fclose(fo);
    char *cwd = getcwd(NULL, 0);
    snprintf(src, sizeof src, "%s/tests/data/archs/%s/model.safetensors", cwd, arch);
    free(cwd);
    snprintf(stp, sizeof stp, "%s/model.safetensors", dir);
    assert_int_equal(symlink(src, stp), 0);
}

static void hf_copy_remove(const char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    rmdir(dir);
}

/* The configuration as transformers 5 writes it (rope_parameters, layer_types) gives
 * kvq the same model as the released checkpoints' form (rope_theta, rope_scaling,
 * rope_local_base_freq, sliding_window_pattern). */
static void test_config_v5(void **state)
{
    (void)state;
    for (size_t a = 0; a < sizeof ARCHS / sizeof ARCHS[0]; a++) {
        char dir[] = "/tmp/kvq_archs_v5_XXXXXX", src[256], v4[256];
        snprintf(src, sizeof src, "tests/data/archs/%s.config_v5.json", ARCHS[a]);
        uint8_t *data = NULL;
        size_t size = 0;
        kvq_err e = {0};
        assert_int_equal(kvq_read_file(src, &data, &size, &e), KVQ_OK);
        hf_copy(ARCHS[a], data, size, dir);
        free(data);
        snprintf(v4, sizeof v4, "tests/data/archs/%s", ARCHS[a]);
        kvq_model_params mp = kvq_model_params_default();
        mp.load_tokenizer = 0;
        kvq_model *m4 = NULL, *m5 = NULL;
        assert_int_equal(kvq_model_open(v4, &mp, &m4, &e), KVQ_OK);
        if (kvq_model_open(dir, &mp, &m5, &e) != KVQ_OK)
            fail_msg("%s: %s", ARCHS[a], e.msg);
        const kvq_model_config *c4 = kvq_model_config_get(m4), *c5 = kvq_model_config_get(m5);
        for (int l = 0; l < c4->n_layers; l++) {
            kvq_layer_attn a4, a5;
            kvq_model_layer_attn(c4, l, &a4);
            kvq_model_layer_attn(c5, l, &a5);
            assert_true(memcmp(&a4, &a5, sizeof a4) == 0);
        }
        assert_true(memcmp(c4, c5, sizeof *c4) == 0);
        assert_string_equal(kvq_model_fingerprint(m4), kvq_model_fingerprint(m5));
        kvq_model_close(m4);
        kvq_model_close(m5);
        hf_copy_remove(dir);
    }
}

/* gemma3's config.json with one key changed: what each layer's attention becomes. */
static kvq_model *gemma3_with(const char *key, const char *value, char *dir)
{
    uint8_t *data = NULL;
    size_t size = 0;
    kvq_err e = {0};
    assert_int_equal(kvq_read_file("tests/data/archs/gemma3/config.json", &data, &size, &e),
                     KVQ_OK);
    cJSON *j = cJSON_ParseWithLength((const char *)data, size);
    free(data);
    assert_non_null(j);
    cJSON_DeleteItemFromObject(j, key);
    if (value)
        cJSON_AddItemToObject(j, key, cJSON_Parse(value));
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    hf_copy("gemma3", text, strlen(text), dir);
    free(text);
    kvq_model_params mp = kvq_model_params_default();
    mp.load_tokenizer = 0;
    kvq_model *m = NULL;
    if (kvq_model_open(dir, &mp, &m, &e) != KVQ_OK)
        fail_msg("%s=%s: %s", key, value ? value : "(absent)", e.msg);
    return m;
}

static void test_gemma3_config_keys(void **state)
{
    (void)state;
    kvq_layer_attn la;
    char d1[] = "/tmp/kvq_archs_g3_XXXXXX", d2[] = "/tmp/kvq_archs_g3_XXXXXX",
         d3[] = "/tmp/kvq_archs_g3_XXXXXX";
    /* query_pre_attn_scalar, not head_dim, sets the score scale */
    kvq_model *m = gemma3_with("query_pre_attn_scalar", "64", d1);
    kvq_model_layer_attn(kvq_model_config_get(m), 0, &la);
    assert_true(la.scale == 1.0 / 8);
    kvq_model_close(m);
    hf_copy_remove(d1);
    /* the window pattern decides which layers are global (and take base 1e6, scaled) */
    m = gemma3_with("sliding_window_pattern", "3", d2);
    for (int l = 0; l < 6; l++) {
        kvq_model_layer_attn(kvq_model_config_get(m), l, &la);
        const int global = l == 2 || l == 5;
        assert_int_equal(la.window, global ? 0 : 8);
        assert_true(la.rope.base == (global ? 1e6 : 1e4));
        assert_int_equal(la.rope.scaling, global ? KVQ_ROPE_SCALING_LINEAR : KVQ_ROPE_SCALING_NONE);
    }
    kvq_model_close(m);
    hf_copy_remove(d2);
    /* rope_local_base_freq is read */
    m = gemma3_with("rope_local_base_freq", "20000", d3);
    kvq_model_layer_attn(kvq_model_config_get(m), 0, &la);
    assert_true(la.rope.base == 20000);
    kvq_model_close(m);
    hf_copy_remove(d3);
}

/* The corpus documents through the tokenizer of `path` (GGUF metadata or the HF
 * directory's tokenizer.json) against <arch>.tok.tsv (sentencepiece / HF tokenizers):
 * same count and FNV-1a 64 of the ids for every document. Returns the mismatches. */
static int tok_mismatches(const char *arch, const char *path)
{
    kvq_err e = {0};
    kvq_model *m = NULL;
    if (kvq_model_open(path, NULL, &m, &e) != KVQ_OK)
        fail_msg("%s: %s", path, e.msg);
    const kvq_tokenizer *t = kvq_model_tokenizer(m);
    assert_non_null(t);
    char gp[256];
    snprintf(gp, sizeof gp, "tests/data/archs/%s.tok.tsv", arch);
    FILE *gf = fopen(gp, "r"), *cf = fopen("tests/data/tok_corpus.jsonl", "r");
    assert_non_null(gf);
    assert_non_null(cf);
    char *line = NULL;
    size_t cap = 0;
    int bad = 0, docs = 0;
    while (getline(&line, &cap, cf) > 0) {
        cJSON *doc = cJSON_Parse(line);
        assert_non_null(doc);
        const cJSON *text = cJSON_GetObjectItem(doc, "text");
        char id[256];
        size_t count;
        unsigned long long fnv;
        assert_int_equal(fscanf(gf, "%255[^\t]\t%zu\t%llx\n", id, &count, &fnv), 3);
        assert_string_equal(id, cJSON_GetObjectItem(doc, "id")->valuestring);
        int32_t *ids = NULL;
        size_t n = 0;
        if (kvq_tokenizer_encode(t, text->valuestring, strlen(text->valuestring), 0, &ids, &n,
                                 &e) != KVQ_OK)
            fail_msg("%s: %s: %s", path, id, e.msg);
        uint8_t *le = malloc(4 * n + 1);
        assert_non_null(le);
        for (size_t i = 0; i < n; i++)
            for (int b = 0; b < 4; b++)
                le[4 * i + (size_t)b] = (uint8_t)((uint32_t)ids[i] >> (8 * b));
        const uint64_t h = kvq_fnv1a64(le, 4 * n, KVQ_FNV1A64_INIT);
        if (n != count || h != fnv) {
            if (bad < 3)
                print_message("%s: %s: %zu ids (reference %zu)\n", path, id, n, count);
            bad++;
        }
        free(le);
        free(ids);
        cJSON_Delete(doc);
        docs++;
    }
    free(line);
    fclose(gf);
    fclose(cf);
    assert_int_equal(docs, 304);
    kvq_model_close(m);
    return bad;
}

/* gemma's vocabulary type (SentencePiece BPE with byte fallback, no dummy prefix) and
 * llama's (with it) from the GGUFs, against sentencepiece; qwen3's byte-level BPE
 * (pre-tokenizer qwen2) from tokenizer.json and the GGUF, against HF tokenizers. */
static void test_tokenizers(void **state)
{
    (void)state;
    const char *const files[][2] = {{"gemma3", "tests/data/archs/gemma3.gguf"},
                                    {"gemma2", "tests/data/archs/gemma2.gguf"},
                                    {"phi3", "tests/data/archs/phi3.gguf"},
                                    {"qwen3", "tests/data/archs/qwen3.gguf"},
                                    {"qwen3", "tests/data/archs/qwen3"}};
    int bad = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        int b = tok_mismatches(files[i][0], files[i][1]);
        if (b)
            print_message("%s: %d of 304 documents differ\n", files[i][1], b);
        bad += b;
    }
    assert_int_equal(bad, 0);
}

static kvq_status zero_attend(void *user, const kvq_attn_call *c, kvq_err *err)
{
    (void)err;
    const kvq_model_config *cfg = user;
    memset(c->out, 0, sizeof(float) * (size_t)c->n * (size_t)cfg->n_heads * cfg->head_dim);
    return KVQ_OK;
}

/* A backend that does not say it attends per layer (per_layer 0; the retrieval runtime
 * and the full attention do) is refused for gemma3 and gemma2, accepted for qwen3 and phi3. */
static void test_backend_per_layer(void **state)
{
    (void)state;
    const char *const files[] = {"tests/data/archs/gemma3.gguf", "tests/data/archs/gemma2.gguf",
                                 "tests/data/archs/qwen3.gguf", "tests/data/archs/phi3.gguf"};
    for (int i = 0; i < 4; i++) {
        kvq_err e = {0};
        kvq_model_params mp = kvq_model_params_default();
        mp.load_tokenizer = 0;
        kvq_model *m = NULL;
        kvq_forward *f = NULL;
        assert_int_equal(kvq_model_open(files[i], &mp, &m, &e), KVQ_OK);
        assert_int_equal(kvq_forward_create(m, NULL, &f, &e), KVQ_OK);
        kvq_attn_backend b = {.name = "zero", .user = (void *)kvq_model_config_get(m),
                              .attend = zero_attend};
        kvq_forward_set_attention(f, &b);
        const int32_t toks[3] = {5, 6, 7};
        kvq_status st = kvq_forward_tokens(f, toks, 3, KVQ_LOGITS_NONE, NULL, &e);
        if (i < 2) {
            assert_int_equal(st, KVQ_E_UNSUPPORTED);
            assert_non_null(strstr(e.msg, "attends every layer alike"));
        } else {
            assert_int_equal(st, KVQ_OK);
        }
        kvq_forward_free(f);
        kvq_model_close(m);
    }
}

static void test_qwen3(void **state) { (void)state; test_arch(ARCHS[0]); }
static void test_gemma3(void **state) { (void)state; test_arch(ARCHS[1]); }
static void test_gemma2(void **state) { (void)state; test_arch(ARCHS[2]); }
static void test_phi3(void **state) { (void)state; test_arch(ARCHS[3]); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_gemma3),
        cmocka_unit_test(test_gemma2),
        cmocka_unit_test(test_phi3),
        cmocka_unit_test(test_config_v5),
        cmocka_unit_test(test_tokenizers),
        cmocka_unit_test(test_gemma3_config_keys),
        cmocka_unit_test(test_backend_per_layer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
