/* test_engine.c — the embedding API (kvq/engine.h) driven by an engine of its own: a
 * plain-C llama forward pass written here over the tinyllama helper's weight arrays
 * (no kvq forward pass, no kvq RoPE), attending the prompt itself and handing kvq the
 * prompt's K/V rows (kvq_engine_seq_append) and each decode step's q/k/v
 * (kvq_engine_seq_decode). Its logits are compared with kvq's own forward pass using
 * the retrieval backend with the same artifact and settings (what `kvq run --artifact`
 * decodes with). The artifact is calibrated on the same checkpoint by
 * kvq_calibrate_run; the weight check refuses other fingerprints. */
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
#include "kvq/util.h"
#include "helpers/tinyllama.h"
#include "kvq.h"
#include "kvq/engine.h"
#include "kvq/eval.h"

enum { PROMPT = 96, DECODE = 48, TOTAL = PROMPT + DECODE };

typedef struct fixture {
    tinyllama *t;
    char dir[1024], art[1024];
    char fp[KVQ_FINGERPRINT_CAP];
    int32_t tokens[TOTAL];
} fixture;

static fixture F;

static int setup(void **state)
{
    tinyllama_spec s = tinyllama_default();
    s.seed = 7;
    F.t = tinyllama_new(&s);
    if (!F.t)
        return -1;
    snprintf(F.dir, sizeof F.dir, "%s", test_path("engine_hf"));
    snprintf(F.art, sizeof F.art, "%s", test_path("engine.kvq"));
    if (tinyllama_calibrated(F.t, F.dir, F.art, test_path("engine_ids.bin"), 11, 2048, 4,
                             F.tokens, TOTAL, F.fp))
        return -1;
    (void)state;
    return 0;
}

static int teardown(void **state)
{
    tinyllama_free(F.t);
    (void)state;
    return 0;
}

static kvq_engine_model engine_model(const char *fp)
{
    const tinyllama_spec *s = &F.t->s;
    kvq_engine_model m = {.n_layers = s->n_layers,
                          .n_heads = s->n_heads,
                          .n_kv_heads = s->n_kv_heads,
                          .head_dim = s->head_dim,
                          .rope_base = s->rope_base,
                          .rope_interleaved = 0, /* HF rows: pairs (i, i + d/2) */
                          .fingerprint = fp};
    return m;
}

/* ---- the engine's own forward pass (HF layout, row vectors, double sums) ---------- */

static void matvec(const float *W, const float *x, int rows, int cols, float *y)
{
    for (int r = 0; r < rows; r++) {
        double acc = 0;
        for (int c = 0; c < cols; c++)
            acc += (double)W[(size_t)r * cols + c] * x[c];
        y[r] = (float)acc;
    }
}

static void rmsnorm(const float *x, const float *w, int n, double eps, float *y)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        y[i] = (float)(x[i] * inv * w[i]);
}

/* RoPE of one head, pairs (i, i + d/2), angle pos * base^(-2i/d). */
static void rope(float *x, int d, int64_t pos, double base)
{
    for (int i = 0; i < d / 2; i++) {
        const double th = (double)pos * pow(base, -2.0 * i / d);
        const double c = cos(th), s = sin(th), a = x[i], b = x[i + d / 2];
        x[i] = (float)(a * c - b * s);
        x[i + d / 2] = (float)(a * s + b * c);
    }
}

static int own_exact; /* own_forward: decode with own_attention too (no kvq) */

typedef struct own_cache { /* the engine's own KV memory for the prompt: post-RoPE keys */
    float *k, *v;          /* [layers][TOTAL][n_kv*d] */
} own_cache;

/* Exact causal attention of token t over 0..t (the engine's prompt attention). */
static void own_attention(const tinyllama_spec *s, const own_cache *C, int l, int t,
                          const float *q, float *out)
{
    const int d = s->head_dim, nkv = s->n_kv_heads, gs = s->n_heads / nkv;
    const size_t row = (size_t)nkv * d, lay = (size_t)TOTAL * row;
    double w[TOTAL];
    for (int h = 0; h < s->n_heads; h++) {
        float qr[64];
        memcpy(qr, q + (size_t)h * d, sizeof(float) * d);
        rope(qr, d, t, s->rope_base);
        const int kh = h / gs;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j <= t; j++) {
            const float *k = C->k + l * lay + j * row + (size_t)kh * d;
            double dot = 0;
            for (int i = 0; i < d; i++)
                dot += (double)qr[i] * k[i];
            w[j] = dot / sqrt((double)d);
            mx = w[j] > mx ? w[j] : mx;
        }
        for (int j = 0; j <= t; j++)
            sum += (w[j] = exp(w[j] - mx));
        for (int i = 0; i < d; i++) {
            double acc = 0;
            for (int j = 0; j <= t; j++)
                acc += w[j] * C->v[l * lay + j * row + (size_t)kh * d + i];
            out[(size_t)h * d + i] = (float)(acc / sum);
        }
    }
}

/* Runs the tokens through the engine's forward pass: the prompt attended by
 * own_attention and appended to seq; later tokens by kvq_engine_seq_decode. Writes
 * logits [TOTAL, vocab]. */
static void own_forward(kvq_engine_seq *seq, float *logits)
{
    const tinyllama *T = F.t;
    const tinyllama_spec *s = &T->s;
    const int D = s->dim, d = s->head_dim, nq = s->n_heads * d, nkv = s->n_kv_heads * d;
    own_cache C = {calloc((size_t)s->n_layers * TOTAL * nkv, sizeof(float)),
                   calloc((size_t)s->n_layers * TOTAL * nkv, sizeof(float))};
    float x[256], h[256], q[256], k[256], v[256], att[256], o[256], g[512], u[512];
    kvq_err e = {0};
    for (int t = 0; t < TOTAL; t++) {
        memcpy(x, T->embed + (size_t)F.tokens[t] * D, sizeof(float) * D);
        for (int l = 0; l < s->n_layers; l++) {
            const tinyllama_layer *L = &T->layers[l];
            rmsnorm(x, L->attn_norm, D, s->norm_eps, h);
            matvec(L->wq, h, nq, D, q);
            matvec(L->wk, h, nkv, D, k);
            matvec(L->wv, h, nkv, D, v);
            const int64_t pos = t;
            if (t < PROMPT) {
                assert_int_equal(kvq_engine_seq_append(seq, l, 1, &pos, k, v, KVQ_ENGINE_F32, &e),
                                 KVQ_OK);
                float *kc = C.k + ((size_t)l * TOTAL + t) * nkv;
                memcpy(kc, k, sizeof(float) * nkv);
                for (int kh = 0; kh < s->n_kv_heads; kh++)
                    rope(kc + (size_t)kh * d, d, t, s->rope_base);
                memcpy(C.v + ((size_t)l * TOTAL + t) * nkv, v, sizeof(float) * nkv);
                own_attention(s, &C, l, t, q, att);
            } else if (own_exact) { /* the engine's own exact attention all along */
                float *kc = C.k + ((size_t)l * TOTAL + t) * nkv;
                memcpy(kc, k, sizeof(float) * nkv);
                for (int kh = 0; kh < s->n_kv_heads; kh++)
                    rope(kc + (size_t)kh * d, d, t, s->rope_base);
                memcpy(C.v + ((size_t)l * TOTAL + t) * nkv, v, sizeof(float) * nkv);
                own_attention(s, &C, l, t, q, att);
            } else {
                assert_int_equal(
                    kvq_engine_seq_decode(seq, l, pos, q, k, v, KVQ_ENGINE_F32, att, &e), KVQ_OK);
            }
            matvec(L->wo, att, D, nq, o);
            for (int i = 0; i < D; i++)
                x[i] += o[i];
            rmsnorm(x, L->ffn_norm, D, s->norm_eps, h);
            matvec(L->wg, h, s->hidden_dim, D, g);
            matvec(L->wu, h, s->hidden_dim, D, u);
            for (int i = 0; i < s->hidden_dim; i++)
                g[i] = (float)(g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
            matvec(L->wd, g, D, s->hidden_dim, o);
            for (int i = 0; i < D; i++)
                x[i] += o[i];
        }
        rmsnorm(x, T->norm, D, s->norm_eps, h);
        matvec(T->output ? T->output : T->embed, h, s->vocab, D, logits + (size_t)t * s->vocab);
    }
    free(C.k);
    free(C.v);
}

/* kvq's forward pass with the retrieval backend: the prompt as one chunk (attended
 * exactly), then one token per step (retrieval). */
static void kvq_reference(const kvq_engine_seq_params *sp, float *logits)
{
    kvq_model *m = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_model_open(F.dir, NULL, &m, &e), KVQ_OK);
    kvq_model_id id;
    kvq_model_identity(m, &id);
    kvq_codebook_set *set = NULL;
    assert_int_equal(kvq_codebook_set_open(F.art, &id, "model", &set, &e), KVQ_OK);
    kvq_retrieval_params rp = kvq_retrieval_params_default();
    kvq_eval_artifact_positions(set, &rp, 0, 0); /* kvq run's rule: the artifact's mode */
    rp.budget.count = sp->budget_tokens;
    rp.budget.fraction = 0;
    rp.sink = sp->sink;
    rp.cache_dtype = sp->cache_f16 ? KVQ_DT_F16 : KVQ_DT_F32;
    kvq_retrieval *r = NULL;
    assert_int_equal(kvq_retrieval_create(kvq_model_config_get(m), set, &rp, &r, &e), KVQ_OK);
    kvq_forward *f = NULL;
    assert_int_equal(kvq_forward_create(m, NULL, &f, &e), KVQ_OK);
    kvq_attn_backend b = kvq_retrieval_backend(r);
    kvq_forward_set_attention(f, &b);
    const int V = F.t->s.vocab;
    assert_int_equal(kvq_forward_tokens(f, F.tokens, PROMPT, KVQ_LOGITS_ALL, logits, &e), KVQ_OK);
    for (int t = PROMPT; t < TOTAL; t++)
        assert_int_equal(kvq_forward_tokens(f, F.tokens + t, 1, KVQ_LOGITS_LAST,
                                            logits + (size_t)t * V, &e),
                         KVQ_OK);
    kvq_retrieval_stats st;
    kvq_retrieval_stats_get(r, &st);
    assert_true(st.steps > 0);                 /* retrieval ran */
    assert_true(st.attended < st.visible - 1); /* and selected fewer than all */
    kvq_forward_free(f);
    kvq_retrieval_free(r);
    kvq_codebook_set_close(set);
    kvq_model_close(m);
}

static void decode_matches_kvq(int cache_f16)
{
    kvq_engine_model em = engine_model(F.fp);
    kvq_engine *eng = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_engine_open(F.art, &em, 0, &eng, &e), KVQ_OK);
    assert_string_equal(kvq_engine_weights_note(eng), "");
    assert_string_equal(kvq_engine_artifact_fingerprint(eng), F.fp);
    kvq_engine_seq_params sp = kvq_engine_seq_params_default();
    sp.budget_tokens = 8;
    sp.sink = 2;
    sp.cache_f16 = cache_f16;
    kvq_engine_seq *seq = NULL;
    assert_int_equal(kvq_engine_seq_create(eng, &sp, &seq, &e), KVQ_OK);
    const int V = F.t->s.vocab;
    float *mine = calloc((size_t)TOTAL * V, sizeof(float));
    float *ref = calloc((size_t)TOTAL * V, sizeof(float));
    own_forward(seq, mine);
    assert_int_equal(kvq_engine_seq_length(seq, 0), TOTAL);
    const uint64_t per_tok = (uint64_t)F.t->s.n_layers * F.t->s.n_kv_heads *
                             (2u * F.t->s.head_dim * (cache_f16 ? 2u : 4u) + 2u);
    assert_int_equal(kvq_engine_seq_bytes(seq), per_tok * TOTAL);
    kvq_reference(&sp, ref);
    double worst = 0, scale = 0;
    int agree = 0;
    for (int t = PROMPT - 1; t < TOTAL; t++) {
        int am = 0, ar = 0;
        for (int i = 0; i < V; i++) {
            const size_t j = (size_t)t * V + i;
            worst = fmax(worst, fabs((double)mine[j] - ref[j]));
            scale = fmax(scale, fabs((double)ref[j]));
            am = mine[j] > mine[(size_t)t * V + am] ? i : am;
            ar = ref[j] > ref[(size_t)t * V + ar] ? i : ar;
        }
        agree += am == ar;
    }
    printf("  engine vs kvq forward (cache %s): max |logit diff| %.3g of max |logit| %.3g, "
           "argmax agrees at %d of %d positions\n",
           cache_f16 ? "f16" : "f32", worst, scale, agree, DECODE + 1);
    /* f32: the same keys, the same selections. f16: the two forwards' keys round to f16
     * an ulp apart here and there (their q, k differ by ~1e-7), which is ~2e-4 of the
     * logits, and can swap one near-tied token in the default selection (every candidate
     * through the best head's residual score, then the exact rerank): ~1% of the logits
     * where it does. A wrong conversion or layout moves them by far more. */
    assert_true(worst <= (cache_f16 ? 2e-2 : 1e-3) * scale);
    assert_int_equal(agree, DECODE + 1);
    free(mine);
    free(ref);
    kvq_engine_seq_free(seq);
    kvq_engine_close(eng);
}

static void test_decode_matches_kvq_f32(void **state)
{
    (void)state;
    decode_matches_kvq(0);
}

static void test_decode_matches_kvq_f16(void **state)
{
    (void)state;
    decode_matches_kvq(1);
}

static void test_weights_refused(void **state)
{
    (void)state;
    kvq_err e = {0};
    kvq_engine *eng = NULL;
    const char *other = "0123456789abcdef0123456789abcdef";
    kvq_engine_model em = engine_model(other);
    assert_int_equal(kvq_engine_open(F.art, &em, 0, &eng, &e), KVQ_E_MISMATCH);
    assert_null(eng);
    assert_non_null(strstr(e.msg, F.fp));
    assert_non_null(strstr(e.msg, other));
    em = engine_model(NULL); /* no fingerprint: refused too */
    assert_int_equal(kvq_engine_open(F.art, &em, 0, &eng, &e), KVQ_E_MISMATCH);
    assert_non_null(strstr(e.msg, F.fp));
    em = engine_model(other);
    assert_int_equal(kvq_engine_open(F.art, &em, KVQ_ENGINE_ACCEPT_MODEL_MISMATCH, &eng, &e),
                     KVQ_OK);
    assert_non_null(strstr(kvq_engine_weights_note(eng), other));
    kvq_engine_close(eng);
    em = engine_model(F.fp);
    em.head_dim = 8; /* another shape: refused whatever the flag */
    assert_int_equal(kvq_engine_open(F.art, &em, KVQ_ENGINE_ACCEPT_MODEL_MISMATCH, &eng, &e),
                     KVQ_E_MISMATCH);
    assert_non_null(strstr(e.msg, "model.head_dim differs (16 vs 8)"));
    em = engine_model(F.fp);
    em.rope_interleaved = 1;
    assert_int_equal(kvq_engine_open(F.art, &em, 0, &eng, &e), KVQ_E_MISMATCH);
    assert_non_null(strstr(e.msg, "rope.layout"));
    em.n_kv_heads = 3;
    assert_int_equal(kvq_engine_open(F.art, &em, 0, &eng, &e), KVQ_E_INVALID_ARG);
}

/* The same values as GGUF (interleaved rows, another dtype) and HF give one
 * fingerprint; different values another. */
static void test_fingerprint_forms(void **state)
{
    (void)state;
    static const tinyllama_wtype types[] = {TINYLLAMA_F32, TINYLLAMA_F16, TINYLLAMA_BF16,
                                            TINYLLAMA_Q8_0};
    char seen[4][KVQ_FINGERPRINT_CAP];
    for (int i = 0; i < 4; i++) {
        tinyllama_spec s = tinyllama_default();
        s.wtype = types[i];
        s.dim = 64;
        tinyllama *t = tinyllama_new(&s);
        assert_non_null(t);
        char dir[1100], gguf[1100];
        snprintf(dir, sizeof dir, "%s%d", test_path("fp_hf"), i);
        snprintf(gguf, sizeof gguf, "%s%d.gguf", test_path("fp"), i);
        assert_int_equal(tinyllama_write_hf(t, dir), 0);
        assert_int_equal(tinyllama_write_gguf(t, gguf), 0);
        kvq_model *a = NULL, *b = NULL;
        kvq_err e = {0};
        assert_int_equal(kvq_model_open(dir, NULL, &a, &e), KVQ_OK);
        assert_int_equal(kvq_model_open(gguf, NULL, &b, &e), KVQ_OK);
        assert_string_equal(kvq_model_fingerprint(a), kvq_model_fingerprint(b));
        assert_int_equal(strlen(kvq_model_fingerprint(a)), 32);
        snprintf(seen[i], sizeof seen[i], "%s", kvq_model_fingerprint(a));
        kvq_model_id id;
        kvq_model_identity(b, &id);
        assert_null(strchr(id.path, '/'));
        assert_string_equal(id.fingerprint, seen[i]);
        kvq_model_close(a);
        kvq_model_close(b);
        tinyllama_free(t);
    }
    /* rounding the same draws through F16, BF16 or Q8_0 changes the values */
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            assert_string_not_equal(seen[i], seen[j]);
}

/* The logits of own_forward through a sequence of sp, its length and bytes. */
static float *forward_with(kvq_engine *eng, const kvq_engine_seq_params *sp, uint64_t *bytes)
{
    kvq_engine_seq *seq = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_engine_seq_create(eng, sp, &seq, &e), KVQ_OK);
    float *lg = calloc((size_t)TOTAL * F.t->s.vocab, sizeof(float));
    own_forward(seq, lg);
    assert_int_equal(kvq_engine_seq_length(seq, 1), own_exact ? PROMPT : TOTAL);
    *bytes = kvq_engine_seq_bytes(seq);
    kvq_engine_seq_free(seq);
    return lg;
}

/* Worst |logit difference| over the decoded positions, relative to the largest logit;
 * argmax agreements in *agree. */
static double logit_diff(const float *a, const float *b, int *agree)
{
    const int V = F.t->s.vocab;
    double worst = 0, scale = 0;
    *agree = 0;
    for (int t = PROMPT - 1; t < TOTAL; t++) {
        int ia = 0, ib = 0;
        for (int i = 0; i < V; i++) {
            const size_t j = (size_t)t * V + i;
            worst = fmax(worst, fabs((double)a[j] - b[j]));
            scale = fmax(scale, fabs((double)b[j]));
            ia = a[j] > a[(size_t)t * V + ia] ? i : ia;
            ib = b[j] > b[(size_t)t * V + ib] ? i : ib;
        }
        *agree += ia == ib;
    }
    return worst / scale;
}

/* kv_cache: full attention over a PATS or LeanKV cache against the engine's own exact
 * attention (double sums over f32 rows); the bytes held by the formats
 * (docs/kvcache.md); settings missing from the artifact refused. */
static void test_kv_caches(void **state)
{
    (void)state;
    kvq_engine_model em = engine_model(F.fp);
    kvq_engine *eng = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_engine_open(F.art, &em, 0, &eng, &e), KVQ_OK);
    const tinyllama_spec *s = &F.t->s;
    const uint64_t cells = (uint64_t)TOTAL * s->n_layers * s->n_kv_heads;
    kvq_engine_seq_params sp = kvq_engine_seq_params_default();
    uint64_t b_exact, b_pats, b_lk;
    own_exact = 1;
    float *ref = forward_with(eng, &sp, &b_exact);
    own_exact = 0;
    sp.max_tokens = TOTAL;
    sp.selector = KVQ_ENGINE_SELECT_FULL; /* full attention over the compressed cache */
    sp.kv_cache = KVQ_ENGINE_KV_PATS;
    sp.kv_pats_schedule = 2;
    sp.kv_pats_b_min = sp.kv_pats_b_max = 0; /* f16 rows, nothing truncated */
    float *pats = forward_with(eng, &sp, &b_pats);
    sp.kv_cache = KVQ_ENGINE_KV_LEANKV;
    sp.kv_alpha_h = sp.kv_alpha_l = 0; /* every token K8V4 */
    float *lk = forward_with(eng, &sp, &b_lk);
    uint64_t b_lp;
    sp.kv_cache = KVQ_ENGINE_KV_LEANKV_PATS; /* K8V4 of the f16 rows (PATS 0:0) */
    float *lp = forward_with(eng, &sp, &b_lp);
    sp.kv_cache = KVQ_ENGINE_KV_LEANKV;
    int agree_p, agree_l, agree_lp;
    const double dlp = logit_diff(lp, ref, &agree_lp);
    assert_true(dlp <= 0.05 && agree_lp >= DECODE - 4 && b_lp == b_lk);
    const double dp = logit_diff(pats, ref, &agree_p), dl = logit_diff(lk, ref, &agree_l);
    printf("  engine kv_cache vs exact: pats 0:0 %.3g (argmax %d of %d), leankv 0/0 %.3g (%d)\n",
           dp, agree_p, DECODE + 1, dl, agree_l);
    assert_true(dp <= 2e-3 && agree_p == DECODE + 1); /* f16 rounding of K and V */
    assert_true(dl <= 0.05 && dl > 4 * dp && agree_l >= DECODE - 4); /* 4-bit values */
    assert_int_equal(b_pats, cells * 2 * 64); /* a 16-element row is one 64-byte block */
    assert_int_equal(b_lk, cells * ((4u + s->head_dim) + (4u + s->head_dim / 2)));
    /* the test artifact has no profile: a setting left to it is refused, named */
    kvq_engine_seq *seq = NULL;
    sp.kv_alpha_l = -1;
    assert_int_equal(kvq_engine_seq_create(eng, &sp, &seq, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "leankv.alpha_l"));
    assert_null(seq);
    sp.kv_cache = KVQ_ENGINE_KV_PATS;
    sp.kv_pats_b_max = -1;
    assert_int_equal(kvq_engine_seq_create(eng, &sp, &seq, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "pats.b_max"));
    sp.kv_pats_b_max = 11;
    assert_int_equal(kvq_engine_seq_create(eng, &sp, &seq, &e), KVQ_E_INVALID_ARG);
    sp.kv_cache = KVQ_ENGINE_KV_LEANKV_PATS; /* both kinds' settings */
    sp.kv_alpha_l = 0;
    sp.kv_pats_b_max = -1;
    assert_int_equal(kvq_engine_seq_create(eng, &sp, &seq, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "pats.b_max"));
    /* a selection over the compressed cache needs positions rope (this artifact: wrope) */
    sp.kv_pats_b_max = 0;
    sp.selector = KVQ_ENGINE_SELECT_CODEBOOK;
    assert_int_equal(kvq_engine_seq_create(eng, &sp, &seq, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "positions rope"));
    assert_null(seq);
    free(ref), free(pats), free(lk), free(lp);
    kvq_engine_close(eng);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fingerprint_forms),
        cmocka_unit_test(test_weights_refused),
        cmocka_unit_test(test_decode_matches_kvq_f32),
        cmocka_unit_test(test_decode_matches_kvq_f16),
        cmocka_unit_test(test_kv_caches),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    test_tmpdir_cleanup();
    return rc;
}
