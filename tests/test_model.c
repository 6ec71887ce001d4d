/* test_model.c — model loading and the forward pass: golden output of the real tiny
 * model, HF and GGUF forms of random models giving the same logits and the same
 * pre-RoPE q/k up to the layout permutation, an independent layer-0 key, weight
 * conversions, chunking, the attention/observer hooks, and exact error statuses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers/testutil.h"
#include "kvq/util.h"
#include "helpers/tinyllama.h"
#include "kvq/model.h"
#include "kvq/perplexity.h"
#include "kvq/tokenizer.h"

/* ---- helpers ------------------------------------------------------------------ */

static kvq_model *open_ok(const char *path)
{
    kvq_err e = {0};
    kvq_model *m = NULL;
    kvq_status st = kvq_model_open(path, NULL, &m, &e);
    if (st != KVQ_OK)
        fail_msg("open %s: %s", path, e.msg);
    return m;
}

static kvq_forward *forward_ok(const kvq_model *m, int chunk)
{
    kvq_forward_params p = kvq_forward_params_default();
    p.chunk = chunk;
    kvq_forward *f = NULL;
    kvq_err e = {0};
    if (kvq_forward_create(m, &p, &f, &e) != KVQ_OK)
        fail_msg("forward: %s", e.msg);
    return f;
}

static void tokens_ok(kvq_forward *f, const int32_t *t, int64_t n, kvq_logits_mode mode,
                      float *logits)
{
    kvq_err e = {0};
    if (kvq_forward_tokens(f, t, n, mode, logits, &e) != KVQ_OK)
        fail_msg("forward_tokens: %s", e.msg);
}

static int32_t argmax(const float *x, int n)
{
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static void assert_close(const float *a, const float *b, size_t n, double tol)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)a[i] - b[i]) <= tol))
            fail_msg("element %zu: %.7g vs %.7g (tol %g)", i, a[i], b[i], tol);
}

/* Observer that records pre-RoPE q and k of every layer by position. */
typedef struct recorder {
    int n_layers, qd, kvd, n_tokens;
    float *q, *k;   /* [n_layers, n_tokens, qd], [n_layers, n_tokens, kvd] */
    int calls;
} recorder;

static void recorder_init(recorder *r, const kvq_model_config *c, int n_tokens)
{
    r->n_layers = c->n_layers;
    r->qd = c->n_heads * c->head_dim;
    r->kvd = c->n_kv_heads * c->head_dim;
    r->n_tokens = n_tokens;
    r->q = calloc((size_t)(r->n_layers * n_tokens * r->qd), sizeof(float));
    r->k = calloc((size_t)(r->n_layers * n_tokens * r->kvd), sizeof(float));
    r->calls = 0;
}

static kvq_status record(void *user, const kvq_attn_call *c, kvq_err *err)
{
    recorder *r = user;
    assert_null(c->out);
    for (int i = 0; i < c->n; i++) {
        int64_t p = c->pos[i];
        assert_true(p < r->n_tokens);
        memcpy(r->q + ((size_t)c->layer * r->n_tokens + p) * r->qd, c->q + (size_t)i * r->qd,
               sizeof(float) * r->qd);
        memcpy(r->k + ((size_t)c->layer * r->n_tokens + p) * r->kvd, c->k + (size_t)i * r->kvd,
               sizeof(float) * r->kvd);
    }
    r->calls++;
    return KVQ_OK;
}

/* Runs tokens through a model in chunks, recording logits [n, vocab] and q/k. */
static float *run_all(const kvq_model *m, const int32_t *toks, int n, int chunk, recorder *rec)
{
    const kvq_model_config *c = kvq_model_config_get(m);
    float *logits = malloc(sizeof(float) * (size_t)n * c->vocab_size);
    kvq_forward *f = forward_ok(m, chunk);
    if (rec) {
        recorder_init(rec, c, n);
        kvq_forward_set_observer(f, record, rec);
    }
    tokens_ok(f, toks, n, KVQ_LOGITS_ALL, logits);
    assert_int_equal(kvq_forward_length(f), n);
    kvq_forward_free(f);
    return logits;
}

/* ---- the real tiny model -------------------------------------------------------- */

static const int32_t golden_ids[48] = {
    403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
    401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385,
    328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267};
static const float golden_logits[8] = {-6.22291f, 8.40434f, -6.22374f, -6.22254f,
                                       -6.22195f, -6.22288f, -6.22188f, -6.22342f};
static const char golden_text[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in "
    "the park. One day, she saw a big, red ball. She wanted to";

/* Without stories260K: SmolLM2's configuration against its GGUF metadata (as the gguf
 * package reads it: tests/data/smollm2_q41_golden.json "model"), and greedy decoding one
 * token at a time against one prefill and chunks of 7 of the same ids. Its logits and
 * greedy ids against numpy and llama.cpp are in test_smollm2.c. */
static void smollm2_consistency(const char *path)
{
    kvq_model *m = open_ok(path);
    const kvq_model_config *c = kvq_model_config_get(m);
    assert_int_equal(c->arch, KVQ_ARCH_LLAMA);
    assert_int_equal(c->n_layers, 30);
    assert_int_equal(c->dim, 576);
    assert_int_equal(c->hidden_dim, 1536);
    assert_int_equal(c->n_heads, 9);
    assert_int_equal(c->n_kv_heads, 3);
    assert_int_equal(c->head_dim, 64);
    assert_int_equal(c->vocab_size, 49152);
    assert_int_equal(c->rope.layout, KVQ_ROPE_INTERLEAVED);
    assert_true(c->rope.base == 100000.0);
    assert_int_equal(c->bos_id, 1);
    assert_true(c->tied_embeddings == 1);
    enum { N = 8, V = 49152 };
    kvq_forward *f = forward_ok(m, 256);
    float *logits = malloc(sizeof(float) * V), *step = malloc(sizeof(float) * N * V);
    assert_true(logits && step);
    int32_t seq[N + 1] = {6403}; /* "Once" */
    tokens_ok(f, seq, 1, KVQ_LOGITS_LAST, logits);
    for (int i = 0; i < N; i++) {
        memcpy(step + (size_t)i * V, logits, sizeof(float) * V);
        seq[i + 1] = argmax(logits, V);
        if (i < N - 1)
            tokens_ok(f, &seq[i + 1], 1, KVQ_LOGITS_LAST, logits);
    }
    kvq_forward_free(f);
    float *all = run_all(m, seq, N, 256, NULL), *chunked = run_all(m, seq, N, 7, NULL);
    for (int i = 0; i < N; i++)
        assert_int_equal(argmax(all + (size_t)i * V, V), seq[i + 1]);
    assert_close(all, step, (size_t)N * V, 2e-3);
    assert_close(all, chunked, (size_t)N * V, 1e-4);
    free(all), free(chunked), free(logits), free(step);
    kvq_model_close(m);
}

static void test_stories_golden(void **state)
{
    int is_stories;
    const char *path = test_real_model(&is_stories);
    if (!path)
        TEST_SKIP("neither stories260K (KVQ_TEST_MODEL) nor SmolLM2 (KVQ_SMOLLM2) found");
    if (!is_stories) {
        smollm2_consistency(path);
        return;
    }
    kvq_model *m = open_ok(path);
    const kvq_model_config *c = kvq_model_config_get(m);
    assert_int_equal(c->arch, KVQ_ARCH_LLAMA);
    assert_int_equal(c->source, KVQ_MODEL_GGUF);
    assert_int_equal(c->n_layers, 5);
    assert_int_equal(c->dim, 64);
    assert_int_equal(c->hidden_dim, 172);
    assert_int_equal(c->n_heads, 8);
    assert_int_equal(c->n_kv_heads, 4);
    assert_int_equal(c->head_dim, 8);
    assert_int_equal(c->vocab_size, 512);
    assert_int_equal(c->rope.layout, KVQ_ROPE_INTERLEAVED);
    assert_true(c->rope.base == 10000.0);
    assert_int_equal(c->rope.scaling, KVQ_ROPE_SCALING_NONE);
    assert_int_equal(c->bos_id, 1);
    assert_true(c->tied_embeddings == 0); /* the GGUF carries output.weight */
    assert_int_equal(kvq_model_n_params(m), 260032 + 512 * 64);

    /* greedy from BOS, one token at a time (decode path) */
    kvq_forward *f = forward_ok(m, 256);
    float logits[512];
    int32_t seq[49] = {1};
    tokens_ok(f, seq, 1, KVQ_LOGITS_LAST, logits);
    assert_close(logits, golden_logits, 8, 1e-4);
    for (int i = 0; i < 48; i++) {
        seq[i + 1] = argmax(logits, 512);
        if (i < 47)
            tokens_ok(f, &seq[i + 1], 1, KVQ_LOGITS_LAST, logits);
    }
    assert_memory_equal(seq + 1, golden_ids, sizeof golden_ids);
    kvq_forward_free(f);

    /* the same sequence as one prefill and in chunks of 7 gives the same logits */
    float *all = run_all(m, seq, 48, 256, NULL), *chunked = run_all(m, seq, 48, 7, NULL);
    assert_close(all, golden_logits, 8, 1e-4);
    for (int i = 0; i < 48; i++)
        assert_int_equal(argmax(all + i * 512, 512), seq[i + 1]);
    assert_close(all, chunked, 48 * 512, 1e-4);
    free(all);
    free(chunked);

    /* the tokenizer from the GGUF metadata decodes the reference text */
    const kvq_tokenizer *tok = kvq_model_tokenizer(m);
    assert_non_null(tok);
    char *text = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_tokenizer_decode(tok, seq + 1, 48, 0, &text, NULL, &e), KVQ_OK);
    assert_string_equal(text, golden_text);
    free(text);

    kvq_model_id id;
    kvq_model_identity(m, &id);
    assert_string_equal(id.architecture, "llama");
    assert_string_equal(id.source, "gguf");
    assert_int_equal(id.n_kv_heads, 4);
    kvq_model_close(m);
}

/* ---- HF vs GGUF forms of the same random model ---------------------------------- */

static int32_t *random_tokens(int n, int vocab, uint64_t seed)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    int32_t *t = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)kvq_rng_below(&r, (uint64_t)vocab);
    t[0] = 1;
    return t;
}

/* Writes spec in both forms and checks: same logits, q/k equal up to the layout
 * permutation (GGUF llama) or equal (GGUF qwen2). */
static void check_both_forms(const tinyllama_spec *s, const char *tag, double tol)
{
    char hf[64], gg[64];
    snprintf(hf, sizeof hf, "hf-%s", tag);
    snprintf(gg, sizeof gg, "%s.gguf", tag);
    const char *hf_dir = test_path(hf), *gguf = test_path(gg);
    tinyllama *t = tinyllama_new(s);
    assert_non_null(t);
    assert_int_equal(tinyllama_write_hf(t, hf_dir), 0);
    assert_int_equal(tinyllama_write_gguf(t, gguf), 0);
    kvq_model *mh = open_ok(hf_dir), *mg = open_ok(gguf);
    const kvq_model_config *ch = kvq_model_config_get(mh), *cg = kvq_model_config_get(mg);
    assert_int_equal(ch->source, KVQ_MODEL_HF);
    assert_int_equal(ch->rope.layout, KVQ_ROPE_HALF);
    const int qwen = !strcmp(s->arch, "qwen2");
    assert_int_equal(cg->rope.layout, qwen ? KVQ_ROPE_HALF : KVQ_ROPE_INTERLEAVED);
    assert_int_equal(ch->qkv_bias, qwen);
    assert_int_equal(cg->qkv_bias, qwen);
    assert_int_equal(ch->tied_embeddings, s->tied);
    assert_int_equal(cg->tied_embeddings, s->tied);
    assert_int_equal(ch->rope.scaling, s->scaling);
    assert_int_equal(cg->rope.scaling, s->scaling);
    /* the GGUF side recovers llama3 parameters from rope_freqs: same frequencies */
    double th[KVQ_ROPE_MAX_DIM / 2], tg[KVQ_ROPE_MAX_DIM / 2];
    kvq_rope_freqs(&ch->rope, th);
    kvq_rope_freqs(&cg->rope, tg);
    for (int i = 0; i < s->head_dim / 2; i++)
        assert_true(fabs(th[i] - tg[i]) <= 1e-6 * th[i]);

    const int n = 40;
    int32_t *toks = random_tokens(n, s->vocab, 7);
    recorder rh, rg;
    float *lh = run_all(mh, toks, n, 16, &rh), *lg = run_all(mg, toks, n, 16, &rg);
    assert_close(lh, lg, (size_t)n * s->vocab, tol);
    /* logits are not degenerate: they vary across tokens */
    assert_true(fabs(lh[0] - lh[1]) > 1e-3);
    assert_int_equal(rh.calls, s->n_layers * 3); /* 40 tokens in chunks of 16 */

    const int d = s->head_dim;
    float conv[KVQ_ROPE_MAX_DIM];
    for (int l = 0; l < s->n_layers; l++)
        for (int p = 0; p < n; p++) {
            for (int h = 0; h < s->n_heads; h++) {
                const float *qh = rh.q + ((size_t)(l * n + p) * rh.qd + h * d);
                const float *qg = rg.q + ((size_t)(l * n + p) * rg.qd + h * d);
                if (qwen)
                    memcpy(conv, qh, sizeof(float) * d);
                else
                    kvq_rope_half_to_interleaved(qh, conv, d);
                assert_close(conv, qg, (size_t)d, 1e-4);
            }
            for (int h = 0; h < s->n_kv_heads; h++) {
                const float *kh = rh.k + ((size_t)(l * n + p) * rh.kvd + h * d);
                const float *kg = rg.k + ((size_t)(l * n + p) * rg.kvd + h * d);
                if (qwen)
                    memcpy(conv, kh, sizeof(float) * d);
                else
                    kvq_rope_half_to_interleaved(kh, conv, d);
                assert_close(conv, kg, (size_t)d, 1e-4);
            }
        }
    free(rh.q), free(rh.k), free(rg.q), free(rg.k);
    free(lh), free(lg), free(toks);
    kvq_model_close(mh);
    kvq_model_close(mg);
    tinyllama_free(t);
}

static void test_forms_llama(void **state)
{
    tinyllama_spec s = tinyllama_default();
    check_both_forms(&s, "llama", 1e-4);
}

static void test_forms_qwen2(void **state)
{
    tinyllama_spec s = tinyllama_default();
    s.arch = "qwen2";
    s.tied = 1;
    s.rope_base = 1000000.0;
    check_both_forms(&s, "qwen2", 1e-4);
}

static void test_forms_rope_scaling(void **state)
{
    tinyllama_spec s = tinyllama_default();
    /* llama3 with one pair in the blend region (head_dim 16, base 1e4: wavelengths
     * 6, 20, 63, 199, 628, ...; orig 256 / high 4 = 64 and orig / low = 256) */
    s.scaling = KVQ_ROPE_SCALING_LLAMA3;
    s.factor = 8;
    s.low_freq_factor = 1;
    s.high_freq_factor = 4;
    s.original_max_pos = 256;
    check_both_forms(&s, "llama3a", 1e-4);
    /* two pairs in the blend region (least squares fit) */
    s.high_freq_factor = 8;
    s.original_max_pos = 1024;
    s.seed = 2;
    check_both_forms(&s, "llama3b", 1e-4);
    s.scaling = KVQ_ROPE_SCALING_LINEAR;
    s.factor = 4;
    check_both_forms(&s, "linear", 1e-4);
}

static void test_forms_storage_types(void **state)
{
    tinyllama_spec s = tinyllama_default();
    s.wtype = TINYLLAMA_F16;
    s.n_shards = 3; /* sharded HF directory with an index */
    check_both_forms(&s, "f16", 1e-4);
    s.wtype = TINYLLAMA_BF16;
    s.n_shards = 1;
    s.tied = 1;
    check_both_forms(&s, "bf16", 1e-4);
    s.wtype = TINYLLAMA_Q8_0;
    s.tied = 0;
    s.arch = "qwen2";
    check_both_forms(&s, "q8", 1e-4);
    s.arch = "mistral"; /* HF only name; written to GGUF as llama below */
    s.wtype = TINYLLAMA_F32;
    tinyllama *t = tinyllama_new(&s);
    assert_int_equal(tinyllama_write_hf(t, test_path("hf-mistral")), 0);
    kvq_model *m = open_ok(test_path("hf-mistral"));
    assert_int_equal(kvq_model_config_get(m)->arch, KVQ_ARCH_MISTRAL);
    kvq_model_close(m);
    tinyllama_free(t);
}

static void expect_open(const tinyllama_spec *s, int gguf, const char *name, kvq_status want,
                        const char *needle);

/* Opens a mistral or qwen2 HF directory with extra config members. */
static kvq_model *open_hf_with(const char *arch, const char *extra, const char *name)
{
    tinyllama_spec s = tinyllama_default();
    s.arch = arch;
    s.hf_extra = extra;
    tinyllama *t = tinyllama_new(&s);
    assert_int_equal(tinyllama_write_hf(t, test_path(name)), 0);
    tinyllama_free(t);
    return open_ok(test_path(name));
}

/* Sliding windows: which layers get one, from the HF config; the forward pass then
 * matches the unwindowed model on the first W rows and departs from it after. */
static void test_sliding_window(void **state)
{
    kvq_model *m = open_hf_with("mistral", "\"sliding_window\": 8", "hf-swa");
    const kvq_model_config *c = kvq_model_config_get(m);
    assert_int_equal(c->sliding_window, 8);
    assert_int_equal(c->sliding_from, 0);
    assert_int_equal(kvq_model_window_start(c, 0, 8), 0);
    assert_int_equal(kvq_model_window_start(c, 1, 20), 12);
    kvq_model *full = open_hf_with("mistral", "\"sliding_window\": null", "hf-noswa");
    assert_int_equal(kvq_model_config_get(full)->sliding_window, 0);
    const int n = 20, vocab = kvq_model_config_get(full)->vocab_size;
    int32_t *toks = random_tokens(n, vocab, 11);
    float *a = run_all(m, toks, n, 7, NULL), *b = run_all(full, toks, n, 7, NULL);
    assert_close(a, b, (size_t)8 * vocab, 1e-5); /* rows 0..7 see at most 8 tokens */
    double far = 0;
    for (size_t i = (size_t)8 * vocab; i < (size_t)n * vocab; i++)
        far = fmax(far, fabs((double)a[i] - b[i]));
    assert_true(far > 1e-3);
    /* chunking does not matter */
    float *a1 = run_all(m, toks, n, 1, NULL);
    assert_close(a, a1, (size_t)n * vocab, 1e-5);
    free(a);
    free(a1);
    free(b);
    free(toks);
    kvq_model_close(m);
    kvq_model_close(full);

    /* qwen2: only with use_sliding_window, from max_window_layers on (default 28) */
    m = open_hf_with("qwen2", "\"sliding_window\": 8", "hf-q-off");
    assert_int_equal(kvq_model_config_get(m)->sliding_window, 0);
    kvq_model_close(m);
    m = open_hf_with("qwen2", "\"use_sliding_window\": true, \"sliding_window\": 8, "
                              "\"max_window_layers\": 1", "hf-q-from1");
    assert_int_equal(kvq_model_config_get(m)->sliding_window, 8);
    assert_int_equal(kvq_model_config_get(m)->sliding_from, 1);
    assert_int_equal(kvq_model_window_start(kvq_model_config_get(m), 0, 20), 0);
    kvq_model_close(m);
    m = open_hf_with("qwen2", "\"use_sliding_window\": true, \"sliding_window\": 8",
                     "hf-q-default");
    assert_int_equal(kvq_model_config_get(m)->sliding_from, 28);
    kvq_model_close(m);
    /* layer_types decides; a full layer after a sliding one is refused */
    m = open_hf_with("mistral", "\"sliding_window\": 8, \"layer_types\": "
                                "[\"full_attention\", \"sliding_attention\"]", "hf-lt");
    assert_int_equal(kvq_model_config_get(m)->sliding_from, 1);
    kvq_model_close(m);
    tinyllama_spec s = tinyllama_default();
    s.arch = "mistral";
    s.hf_extra = "\"sliding_window\": 8, \"layer_types\": [\"sliding_attention\", "
                 "\"full_attention\"]";
    expect_open(&s, 0, "hf-lt-bad", KVQ_E_UNSUPPORTED, "full attention after sliding attention");
}

/* Prefill tiles through a scratch of a few rows equal one whole-matrix tile; one-token
 * decode (the fused matvec on the packed weights) agrees with prefill. */
static void test_conversion_paths(void **state)
{
    tinyllama_spec s = tinyllama_default();
    s.wtype = TINYLLAMA_F16;
    tinyllama *t = tinyllama_new(&s);
    assert_int_equal(tinyllama_write_gguf(t, test_path("conv.gguf")), 0);
    kvq_model *m = open_ok(test_path("conv.gguf"));
    const int n = 12;
    int32_t *toks = random_tokens(n, s.vocab, 3);
    float *cached = run_all(m, toks, n, 5, NULL);

    kvq_forward_params p = kvq_forward_params_default();
    p.scratch_bytes = 1000; /* blocks of a few rows */
    kvq_forward *f = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_forward_create(m, &p, &f, &e), KVQ_OK);
    float *direct = malloc(sizeof(float) * (size_t)n * s.vocab);
    tokens_ok(f, toks, n, KVQ_LOGITS_ALL, direct);
    assert_close(cached, direct, (size_t)n * s.vocab, 1e-5);
    /* LAST gives the last row of ALL */
    float last[96];
    kvq_forward_reset(f);
    assert_int_equal(kvq_forward_length(f), 0);
    tokens_ok(f, toks, n, KVQ_LOGITS_LAST, last);
    assert_close(last, direct + (n - 1) * s.vocab, (size_t)s.vocab, 1e-5);
    kvq_forward_free(f);

    kvq_model_memory mem, mem0;
    kvq_model_memory_estimate(m, NULL, 100, &mem);
    kvq_model_memory_estimate(m, &p, 100, &mem0);
    const uint64_t weights2d = 2 * (uint64_t)s.vocab * s.dim +
                               (uint64_t)s.n_layers * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64);
    assert_int_equal(mem.converted_bytes, 0); /* weights stay packed in the mapping */
    assert_int_equal(mem0.converted_bytes, 0);
    assert_true(mem0.scratch_bytes < mem.scratch_bytes); /* the tile scratch is bounded */
    assert_int_equal(mem.kv_cache_bytes, 2ull * s.n_layers * 100 * 32 * 4);
    assert_true(mem.mapped_bytes >= 2 * weights2d);
    assert_int_equal(mem.total_bytes, mem.mapped_bytes + mem.converted_bytes +
                                          mem.scratch_bytes + mem.kv_cache_bytes);
    free(cached), free(direct), free(toks);
    kvq_model_close(m);
    tinyllama_free(t);
}

/* Layer-0 k, written out plainly: k = (rmsnorm(embed[tok]) * attn_norm) Wk^T. */
static void test_layer0_k_independent(void **state)
{
    tinyllama_spec s = tinyllama_default();
    s.arch = "qwen2"; /* with a bias, to cover it too */
    tinyllama *t = tinyllama_new(&s);
    assert_int_equal(tinyllama_write_hf(t, test_path("hf-k0")), 0);
    kvq_model *m = open_ok(test_path("hf-k0"));
    const int n = 9;
    int32_t *toks = random_tokens(n, s.vocab, 11);
    recorder r;
    float *logits = run_all(m, toks, n, 4, &r);
    const int kvd = s.n_kv_heads * s.head_dim;
    for (int p = 0; p < n; p++) {
        const float *x = t->embed + (size_t)toks[p] * s.dim;
        double ss = 0;
        for (int i = 0; i < s.dim; i++)
            ss += (double)x[i] * x[i];
        double inv = 1.0 / sqrt(ss / s.dim + s.norm_eps);
        for (int o = 0; o < kvd; o++) {
            double acc = t->layers[0].bk[o];
            for (int i = 0; i < s.dim; i++)
                acc += x[i] * inv * t->layers[0].attn_norm[i] * t->layers[0].wk[o * s.dim + i];
            float got = r.k[(size_t)p * kvd + o];
            if (fabs(acc - got) > 1e-4)
                fail_msg("position %d k[%d]: %.7g vs %.7g", p, o, got, acc);
        }
    }
    free(r.q), free(r.k), free(logits), free(toks);
    kvq_model_close(m);
    tinyllama_free(t);
}

/* ---- hooks ------------------------------------------------------------------------- */

typedef struct wrap_backend {
    kvq_attn_backend inner;
    int calls, resets;
    int64_t tokens;
} wrap_backend;

static kvq_status wrap_attend(void *user, const kvq_attn_call *c, kvq_err *err)
{
    wrap_backend *w = user;
    w->calls++;
    if (c->layer == 0)
        w->tokens += c->n;
    return w->inner.attend(w->inner.user, c, err);
}

static void wrap_reset(void *user)
{
    wrap_backend *w = user;
    w->resets++;
    w->inner.reset(w->inner.user);
}

static kvq_status fail_at_layer1(void *user, const kvq_attn_call *c, kvq_err *err)
{
    (void)user;
    if (c->layer == 1)
        return kvq_err_set(err, KVQ_E_CANCELLED, "observer: stop");
    return KVQ_OK;
}

static void test_backend_and_observer(void **state)
{
    tinyllama_spec s = tinyllama_default();
    tinyllama *t = tinyllama_new(&s);
    assert_int_equal(tinyllama_write_gguf(t, test_path("hooks.gguf")), 0);
    kvq_model *m = open_ok(test_path("hooks.gguf"));
    const kvq_model_config *c = kvq_model_config_get(m);
    const int n = 10;
    int32_t *toks = random_tokens(n, s.vocab, 5);
    float *ref = run_all(m, toks, n, 4, NULL);

    /* a backend wrapping a separate full attention gives the same logits */
    kvq_full_attn *fa = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_full_attn_create(c, 64, &fa, &e), KVQ_OK);
    wrap_backend w = {.inner = kvq_full_attn_backend(fa)};
    kvq_attn_backend b = {.name = "wrap", .user = &w, .attend = wrap_attend, .reset = wrap_reset};
    kvq_forward *f = forward_ok(m, 4);
    kvq_forward_set_attention(f, &b);
    assert_int_equal(w.resets, 1);
    float *out = malloc(sizeof(float) * (size_t)n * s.vocab);
    tokens_ok(f, toks, n, KVQ_LOGITS_ALL, out);
    assert_close(ref, out, (size_t)n * s.vocab, 1e-6);
    assert_int_equal(w.calls, 3 * s.n_layers);
    assert_int_equal(w.tokens, n);
    assert_int_equal(kvq_full_attn_length(fa), n);

    /* the built-in cache is bounded: 64 tokens, then INVALID_ARG */
    kvq_forward_reset(f);
    assert_int_equal(kvq_full_attn_length(fa), 0);
    int32_t many[70] = {0};
    assert_int_equal(kvq_forward_tokens(f, many, 70, KVQ_LOGITS_NONE, NULL, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "max_tokens 64"));

    /* an observer error stops the pass with its status */
    kvq_forward_set_attention(f, NULL);
    kvq_forward_set_observer(f, fail_at_layer1, NULL);
    assert_int_equal(kvq_forward_tokens(f, toks, n, KVQ_LOGITS_ALL, out, &e), KVQ_E_CANCELLED);
    kvq_forward_set_observer(f, NULL, NULL);
    kvq_forward_reset(f);
    tokens_ok(f, toks, n, KVQ_LOGITS_ALL, out);
    assert_close(ref, out, (size_t)n * s.vocab, 1e-6);

    /* out-of-vocabulary token */
    kvq_forward_reset(f);
    int32_t bad[2] = {1, s.vocab};
    assert_int_equal(kvq_forward_tokens(f, bad, 2, KVQ_LOGITS_LAST, out, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "token 1 is 96"));
    kvq_forward_free(f);

    /* partial runs (capture of early layers) have no logits */
    kvq_forward_params p = kvq_forward_params_default();
    p.n_layers = 1;
    assert_int_equal(kvq_forward_create(m, &p, &f, &e), KVQ_OK);
    recorder r;
    recorder_init(&r, c, n);
    kvq_forward_set_observer(f, record, &r);
    tokens_ok(f, toks, n, KVQ_LOGITS_NONE, NULL);
    assert_int_equal(r.calls, 1);
    assert_int_equal(kvq_forward_tokens(f, toks, 1, KVQ_LOGITS_LAST, out, &e), KVQ_E_INVALID_ARG);
    kvq_forward_free(f);
    p.n_layers = s.n_layers + 1;
    assert_int_equal(kvq_forward_create(m, &p, &f, &e), KVQ_E_INVALID_ARG);
    p = kvq_forward_params_default();
    p.chunk = 0;
    assert_int_equal(kvq_forward_create(m, &p, &f, &e), KVQ_E_INVALID_ARG);

    free(r.q), free(r.k), free(out), free(ref), free(toks);
    kvq_full_attn_free(fa);
    kvq_model_close(m);
    tinyllama_free(t);
}

/* NaN in the weights is caught in the forward pass, naming layer and position. */
static void test_numeric_abort(void **state)
{
    tinyllama_spec s = tinyllama_default();
    tinyllama *t = tinyllama_new(&s);
    t->embed[5 * s.dim + 3] = NAN;            /* token 5 */
    t->layers[1].wv[7] = INFINITY;            /* layer 1, every position */
    assert_int_equal(tinyllama_write_hf(t, test_path("hf-nan")), 0);
    kvq_model *m = open_ok(test_path("hf-nan"));
    kvq_forward *f = forward_ok(m, 8);
    kvq_err e = {0};
    int32_t toks[4] = {1, 2, 5, 7};
    assert_int_equal(kvq_forward_tokens(f, toks, 4, KVQ_LOGITS_NONE, NULL, &e), KVQ_E_NUMERIC);
    assert_non_null(strstr(e.msg, "layer 0 position 2: non-finite q"));
    kvq_forward_reset(f);
    assert_int_equal(kvq_forward_tokens(f, toks, 2, KVQ_LOGITS_NONE, NULL, &e), KVQ_E_NUMERIC);
    assert_non_null(strstr(e.msg, "layer 1 position 0: non-finite v"));
    kvq_forward_free(f);
    kvq_model_close(m);
    tinyllama_free(t);
}

/* ---- bad input -------------------------------------------------------------------- */

/* Writes spec in one form and expects open to fail with `want`, the message holding
 * `needle`. */
static void expect_open(const tinyllama_spec *s, int gguf, const char *name, kvq_status want,
                        const char *needle)
{
    tinyllama *t = tinyllama_new(s);
    assert_non_null(t);
    const char *path = test_path(name);
    assert_int_equal(gguf ? tinyllama_write_gguf(t, path) : tinyllama_write_hf(t, path), 0);
    kvq_model *m = NULL;
    kvq_err e = {0};
    kvq_status st = kvq_model_open(path, NULL, &m, &e);
    if (st != want || !strstr(e.msg, needle))
        fail_msg("%s: got %d '%s', want %d with '%s'", name, st, e.msg, want, needle);
    assert_null(m);
    tinyllama_free(t);
}

static void test_bad_input(void **state)
{
    tinyllama_spec s = tinyllama_default();
    s.edit_arch = "gpt2";
    expect_open(&s, 1, "arch.gguf", KVQ_E_UNSUPPORTED, "unsupported architecture 'gpt2'");
    expect_open(&s, 0, "hf-arch", KVQ_E_UNSUPPORTED, "unsupported architecture 'gpt2'");

    s = tinyllama_default();
    s.hidden_dim = 256; /* IQ2_XXS needs rows of 256 */
    s.edit_bad_type = "blk.0.ffn_down.weight";
    expect_open(&s, 1, "iq2xxs.gguf", KVQ_E_UNSUPPORTED,
                "blk.0.ffn_down.weight: unsupported weight type IQ2_XXS");
    s.edit_bad_type = "model.layers.0.mlp.down_proj.weight";
    expect_open(&s, 0, "hf-i8", KVQ_E_UNSUPPORTED, "down_proj.weight: unsupported weight type I8");

    s = tinyllama_default();
    s.edit_rope_type = "yarn";
    expect_open(&s, 1, "yarn.gguf", KVQ_E_UNSUPPORTED, "rope scaling type 'yarn'");
    s.edit_rope_type = "dynamic";
    expect_open(&s, 0, "hf-dynamic", KVQ_E_UNSUPPORTED, "rope scaling type 'dynamic'");

    s = tinyllama_default();
    s.edit_drop = "blk.1.attn_k.weight";
    expect_open(&s, 1, "drop.gguf", KVQ_E_NOT_FOUND, "missing tensor blk.1.attn_k.weight");
    s.edit_drop = "model.layers.1.self_attn.k_proj.weight";
    expect_open(&s, 0, "hf-drop", KVQ_E_NOT_FOUND, "missing tensor model.layers.1.self_attn.k_proj.weight");
    s.n_shards = 2;
    expect_open(&s, 0, "hf-drop2", KVQ_E_NOT_FOUND, "missing tensor model.layers.1.self_attn.k_proj.weight");

    s = tinyllama_default();
    s.edit_short = "blk.0.attn_v.weight";
    expect_open(&s, 1, "short.gguf", KVQ_E_SHAPE_MISMATCH, "blk.0.attn_v.weight: shape");
    s.edit_short = "output_norm.weight";
    expect_open(&s, 1, "short2.gguf", KVQ_E_SHAPE_MISMATCH, "output_norm.weight: shape");
    s.edit_short = "model.layers.0.self_attn.o_proj.weight";
    expect_open(&s, 0, "hf-short", KVQ_E_SHAPE_MISMATCH, "o_proj.weight: shape [63, 64], the config needs [64, 64]");

    /* paths and directories */
    kvq_model *m = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_model_open(test_path("nonexistent"), NULL, &m, &e), KVQ_E_NOT_FOUND);
    assert_int_equal(kvq_model_open(test_tmpdir(), NULL, &m, &e), KVQ_E_NOT_FOUND);
    assert_non_null(strstr(e.msg, "config.json"));
    const char *cfg = "{\"model_type\": \"llama\", \"hidden_size\": 64}";
    assert_int_equal(test_write_file(test_path("config.json"), cfg, strlen(cfg)), 0);
    assert_int_equal(kvq_model_open(test_tmpdir(), NULL, &m, &e), KVQ_E_BAD_JSON);
    assert_non_null(strstr(e.msg, "\"intermediate_size\""));
    assert_int_equal(test_write_file(test_path("garbage.gguf"), "GGUX", 4), 0);
    assert_int_equal(kvq_model_open(test_path("garbage.gguf"), NULL, &m, &e), KVQ_E_BAD_MAGIC);
    assert_null(m);
}

/* The model exposes its tokenizer: tokenizer.json in an HF directory, tokenizer.ggml.*
 * in a GGUF; absent means NULL, a broken one fails the open. */
static void test_tokenizer_attached(void **state)
{
    tinyllama_spec s = tinyllama_default();
    tinyllama *t = tinyllama_new(&s);
    const char *dir = test_path("hf-tok");
    assert_int_equal(tinyllama_write_hf(t, dir), 0);
    kvq_model *m = open_ok(dir);
    assert_null(kvq_model_tokenizer(m));
    kvq_model_close(m);

    const char *json = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},"
                       "\"merges\":[\"a b\"]},\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}";
    char p[4096];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    assert_int_equal(test_write_file(p, json, strlen(json)), 0);
    m = open_ok(dir);
    assert_non_null(kvq_model_tokenizer(m));
    assert_int_equal(kvq_tokenizer_n_vocab(kvq_model_tokenizer(m)), 3);
    kvq_model_close(m);
    kvq_model_params mp = kvq_model_params_default();
    mp.load_tokenizer = 0;
    kvq_err e = {0};
    assert_int_equal(kvq_model_open(dir, &mp, &m, &e), KVQ_OK);
    assert_null(kvq_model_tokenizer(m));
    kvq_model_close(m);
    assert_int_equal(test_write_file(p, "{", 1), 0);
    assert_int_equal(kvq_model_open(dir, NULL, &m, &e), KVQ_E_BAD_JSON);
    assert_null(m);
    tinyllama_free(t);

    /* the tokenizer of stories260K (SPM, 512), else SmolLM2's (BPE, 49152; both have
     * bos_token_id 1 in their GGUF metadata) */
    int is_stories;
    const char *real = test_real_model(&is_stories);
    if (!real)
        TEST_SKIP("neither stories260K (KVQ_TEST_MODEL) nor SmolLM2 (KVQ_SMOLLM2) found");
    s.vocab = is_stories ? 512 : 49152;
    s.tokenizer_from = real;
    t = tinyllama_new(&s);
    assert_int_equal(tinyllama_write_gguf(t, test_path("tok.gguf")), 0);
    m = open_ok(test_path("tok.gguf"));
    assert_non_null(kvq_model_tokenizer(m));
    assert_int_equal(kvq_tokenizer_n_vocab(kvq_model_tokenizer(m)), s.vocab);
    assert_int_equal(kvq_model_config_get(m)->bos_id, 1);
    kvq_model_close(m);
    tinyllama_free(t);
}

/* ---- sampling ------------------------------------------------------------------ */

static void test_sampling(void **state)
{
    const float logits[6] = {0.5f, 3.0f, 3.0f, -1.0f, 2.0f, 0.0f};
    float wp[6];
    int32_t wi[6];
    kvq_rng r;
    kvq_rng_seed(&r, 42);
    assert_int_equal(kvq_sample_token(logits, 6, 0.0, 1.0, &r, NULL, NULL), 1); /* lowest id */
    /* a tiny nucleus keeps only the most likely token (lower id first on ties) */
    for (int i = 0; i < 20; i++)
        assert_int_equal(kvq_sample_token(logits, 6, 1.0, 0.01, &r, wp, wi), 1);
    /* top_p 0.9 keeps {1, 2, 4}; frequencies follow the renormalized softmax */
    int count[6] = {0};
    kvq_rng_seed(&r, 7);
    for (int i = 0; i < 20000; i++)
        count[kvq_sample_token(logits, 6, 1.0, 0.9, &r, wp, wi)]++;
    assert_int_equal(count[0] + count[3] + count[5], 0);
    double e3 = exp(3.0), e2 = exp(2.0), z = 2 * e3 + e2;
    assert_true(fabs(count[4] / 20000.0 - e2 / z) < 0.015);
    assert_true(fabs(count[1] / 20000.0 - e3 / z) < 0.015);
    /* same seed, same draws */
    kvq_rng a, b;
    kvq_rng_seed(&a, 9);
    kvq_rng_seed(&b, 9);
    for (int i = 0; i < 50; i++)
        assert_int_equal(kvq_sample_token(logits, 6, 0.8, 1.0, &a, wp, wi),
                         kvq_sample_token(logits, 6, 0.8, 1.0, &b, wp, wi));
}

static int teardown(void **state)
{
    test_tmpdir_cleanup();
    return 0;
}

/* Layer 0's chunk sizes, in order (observer). */
typedef struct chunk_log {
    int n, size[32];
} chunk_log;

static kvq_status log_chunk(void *user, const kvq_attn_call *c, kvq_err *err)
{
    chunk_log *l = user;
    if (c->layer == 0 && l->n < 32)
        l->size[l->n++] = c->n;
    return KVQ_OK;
}

/* kvq_perplexity_seq_last: the prompt in calls of more than one token (cut in two when
 * the forward's chunk would leave one token), then one call per scored token; the loss
 * that of kvq_perplexity_seq over the same predictions (full attention). */
static void test_perplexity_last(void **state)
{
    tinyllama_spec s = tinyllama_default();
    tinyllama *t = tinyllama_new(&s);
    assert_int_equal(tinyllama_write_gguf(t, test_path("last.gguf")), 0);
    kvq_model *m = open_ok(test_path("last.gguf"));
    const int n = 12;
    int32_t *toks = random_tokens(n, s.vocab, 9);
    kvq_forward *f = forward_ok(m, 4);
    float *logits = malloc(sizeof(float) * 4 * (size_t)s.vocab);
    kvq_err e = {0};
    const struct {
        int last, n_sizes, sizes[16];
    } cases[] = {
        {2, 5, {4, 3, 2, 1, 1}},             /* prompt 9 = 4 + 4 + 1: cut into 7 and 2 */
        {3, 5, {4, 4, 1, 1, 1}},             /* prompt 8 */
        {20, 11, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}}, /* longer than the sequence: all */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        chunk_log l = {0};
        kvq_forward_set_observer(f, log_chunk, &l);
        kvq_nll_sum got = {0}, want = {0};
        assert_int_equal(kvq_perplexity_seq_last(f, toks, n, cases[k].last, 4, s.vocab, logits,
                                                 &got, &e),
                         KVQ_OK);
        kvq_forward_set_observer(f, NULL, NULL);
        const int from = n - cases[k].last - 1 > 0 ? n - cases[k].last - 1 : 0;
        assert_int_equal(kvq_perplexity_seq(f, toks, n, from, 4, s.vocab, logits, &want, &e),
                         KVQ_OK);
        assert_int_equal(got.n_pred, n - 1 - from);
        assert_int_equal(got.n_pred, want.n_pred);
        assert_true(fabs(got.nll - want.nll) < 1e-5 * (1 + fabs(want.nll)));
        assert_int_equal(l.n, cases[k].n_sizes);
        for (int i = 0; i < l.n; i++)
            if (l.size[i] != cases[k].sizes[i])
                fail_msg("case %zu: call %d of %d tokens, want %d", k, i, l.size[i],
                         cases[k].sizes[i]);
    }
    kvq_nll_sum sum = {0};
    assert_int_equal(kvq_perplexity_seq_last(f, toks, n, 2, 2, s.vocab, logits, &sum, &e),
                     KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_perplexity_seq_last(f, toks, n, 0, 4, s.vocab, logits, &sum, &e),
                     KVQ_E_INVALID_ARG);
    free(logits);
    free(toks);
    kvq_forward_free(f);
    kvq_model_close(m);
    tinyllama_free(t);
}

/* kvq_token_nll: uniform logits give log(vocab); a shift of all logits changes nothing;
 * a large logit does not overflow. */
static void test_token_nll(void **state)
{
    float u[5] = {0, 0, 0, 0, 0}, v[3] = {1000.0f, 0.0f, -1000.0f}, w[3] = {2.0f, 1.0f, 0.0f};
    assert_true(fabs(kvq_token_nll(u, 5, 3) - log(5.0)) < 1e-12);
    assert_true(fabs(kvq_token_nll(v, 3, 0)) < 1e-12);
    assert_true(fabs(kvq_token_nll(v, 3, 1) - 1000.0) < 1e-9);
    double ref = -(1.0 - log(exp(2.0) + exp(1.0) + 1.0));
    assert_true(fabs(kvq_token_nll(w, 3, 1) - ref) < 1e-12);
    float w2[3] = {102.0f, 101.0f, 100.0f};
    assert_true(fabs(kvq_token_nll(w2, 3, 1) - ref) < 1e-6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_nll),
        cmocka_unit_test(test_perplexity_last),
        cmocka_unit_test(test_stories_golden),
        cmocka_unit_test(test_forms_llama),
        cmocka_unit_test(test_forms_qwen2),
        cmocka_unit_test(test_forms_rope_scaling),
        cmocka_unit_test(test_forms_storage_types),
        cmocka_unit_test(test_sliding_window),
        cmocka_unit_test(test_conversion_paths),
        cmocka_unit_test(test_layer0_k_independent),
        cmocka_unit_test(test_backend_and_observer),
        cmocka_unit_test(test_numeric_abort),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_tokenizer_attached),
        cmocka_unit_test(test_sampling),
    };
    return cmocka_run_group_tests_name("model", tests, NULL, teardown);
}
