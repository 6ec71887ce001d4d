/* attn_full.c — the exact full-attention backend (kvq_full_attn, kvq/model.h): a KV
 * cache of post-RoPE keys and values, each layer attending as kvq_model_layer_attn
 * describes it (its own RoPE base and scaling, score scale, softcap and window). */
#include "model_internal.h"
#include "kvq/util.h"

#include <cblas.h>
#include <omp.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * Full attention backend
 * ========================================================================== */

struct kvq_full_attn {
    kvq_model_config cfg;
    kvq_layer_attn *la;                  /* [n_layers] each layer's attention */
    double *theta;                       /* [n_layers, head_dim / 2] its RoPE frequencies */
    int64_t max_tokens, cap;             /* cache rows allowed / allocated per layer */
    int64_t *len;                        /* [n_layers] tokens cached per layer */
    float **k, **v;                      /* [n_layers] -> [cap, n_kv_heads, head_dim] */
    float *qrot;                         /* [qrot_rows, n_heads, head_dim] */
    int64_t qrot_rows;
    float *scores;                       /* [scores_cap] = [n, T] per head */
    size_t scores_cap;
};

kvq_status kvq_full_attn_create(const kvq_model_config *cfg, int64_t max_tokens,
                                kvq_full_attn **out, kvq_err *err)
{
    *out = NULL;
    if (max_tokens < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "full attention: max_tokens %lld < 1",
                           (long long)max_tokens);
    kvq_status st = kvq_rope_check(&cfg->rope, err);
    if (st != KVQ_OK)
        return st;
    kvq_full_attn *fa = calloc(1, sizeof *fa);
    if (!fa)
        return kvq_err_set(err, KVQ_E_NOMEM, "full attention: out of memory");
    fa->cfg = *cfg;
    fa->max_tokens = max_tokens;
    const size_t nl = (size_t)(cfg->n_layers > 0 ? cfg->n_layers : 1);
    const size_t half = (size_t)cfg->head_dim / 2;
    fa->la = calloc(nl, sizeof *fa->la);
    fa->theta = calloc(nl * (half ? half : 1), sizeof *fa->theta);
    fa->len = calloc(nl, sizeof *fa->len);
    fa->k = calloc(nl, sizeof *fa->k);
    fa->v = calloc(nl, sizeof *fa->v);
    if (!fa->len || !fa->k || !fa->v || !fa->la || !fa->theta) {
        kvq_full_attn_free(fa);
        return kvq_err_set(err, KVQ_E_NOMEM, "full attention: out of memory");
    }
    for (int32_t l = 0; l < cfg->n_layers; l++) {
        kvq_model_layer_attn(cfg, l, &fa->la[l]);
        if ((st = kvq_rope_check(&fa->la[l].rope, err))) {
            kvq_full_attn_free(fa);
            return st;
        }
        kvq_rope_freqs(&fa->la[l].rope, fa->theta + (size_t)l * half);
    }
    *out = fa;
    return KVQ_OK;
}

void kvq_full_attn_free(kvq_full_attn *fa)
{
    if (!fa)
        return;
    for (int32_t l = 0; fa->k && l < fa->cfg.n_layers; l++)
        free(fa->k[l]);
    for (int32_t l = 0; fa->v && l < fa->cfg.n_layers; l++)
        free(fa->v[l]);
    free(fa->k);
    free(fa->v);
    free(fa->la);
    free(fa->theta);
    free(fa->len);
    free(fa->qrot);
    free(fa->scores);
    free(fa);
}

int64_t kvq_full_attn_length(const kvq_full_attn *fa) { return fa->len[0]; }

static void full_reset(void *user)
{
    kvq_full_attn *fa = user;
    memset(fa->len, 0, sizeof *fa->len * (size_t)fa->cfg.n_layers);
}

/* Grows every layer's cache to hold `need` rows (doubling, capped at max_tokens). */
static kvq_status full_reserve(kvq_full_attn *fa, int64_t need, kvq_err *err)
{
    if (need <= fa->cap)
        return KVQ_OK;
    int64_t cap = fa->cap ? fa->cap : 64;
    while (cap < need)
        cap *= 2;
    if (cap > fa->max_tokens)
        cap = fa->max_tokens;
    size_t row = (size_t)fa->cfg.n_kv_heads * fa->cfg.head_dim * sizeof(float), bytes;
    if (!kvq_size_mul(row, (size_t)cap, &bytes))
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "full attention: cache of %lld tokens",
                           (long long)cap);
    for (int32_t l = 0; l < fa->cfg.n_layers; l++) {
        float *k = realloc(fa->k[l], bytes);
        if (k)
            fa->k[l] = k;
        float *v = k ? realloc(fa->v[l], bytes) : NULL;
        if (v)
            fa->v[l] = v;
        if (!k || !v)
            return kvq_err_set(err, KVQ_E_NOMEM, "full attention: out of memory for %lld tokens",
                               (long long)cap);
    }
    fa->cap = cap;
    return KVQ_OK;
}

#define QBLOCK KVQ_FULL_ATTN_QBLOCK

/* Query head h, queries [i0, i0 + QBLOCK) of the chunk: S = Q K^T * scale over the
 * keys they may see (c tanh(S / c) under a softcap c), causal softmax (over the layer's
 * sliding window when it has one), out = S V. One single-threaded sgemm each; S:
 * [QBLOCK, T] scratch of this thread. */
static void attend_block(const kvq_full_attn *fa, const kvq_attn_call *c, const float *K,
                         const float *V, int h, int64_t i0, float *S)
{
    const kvq_model_config *cfg = &fa->cfg;
    const int d = cfg->head_dim, nh = cfg->n_heads, nkv = cfg->n_kv_heads, g = h / (nh / nkv);
    const int64_t qd = (int64_t)nh * d, kvd = (int64_t)nkv * d, past = fa->len[c->layer];
    const int64_t nb = c->n - i0 < QBLOCK ? c->n - i0 : QBLOCK;
    const int64_t T = past + i0 + nb; /* keys [0, T) cover every query of the block */
    const kvq_layer_attn *la = &fa->la[c->layer];
    const float scale = (float)la->scale, cap = (float)la->softcap;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)T, d, scale,
                fa->qrot + i0 * qd + h * d, (int)qd, K + g * d, (int)kvd, 0.0f, S, (int)T);
    for (int64_t i = 0; i < nb; i++) {
        float *row = S + i * T;
        const int64_t valid = past + i0 + i + 1; /* causal: keys [lo, past + i0 + i] */
        const int64_t lo = la->window > 0 && valid > la->window ? valid - la->window : 0;
        if (cap > 0)
            for (int64_t j = lo; j < valid; j++)
                row[j] = cap * tanhf(row[j] / cap);
        float mx = row[lo];
        for (int64_t j = lo + 1; j < valid; j++)
            mx = row[j] > mx ? row[j] : mx;
        double sum = 0;
        for (int64_t j = lo; j < valid; j++) {
            row[j] = expf(row[j] - mx);
            sum += row[j];
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t j = lo; j < valid; j++)
            row[j] *= inv;
        for (int64_t j = 0; j < lo; j++)
            row[j] = 0.0f;
        for (int64_t j = valid; j < T; j++)
            row[j] = 0.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nb, d, (int)T, 1.0f, S, (int)T,
                V + g * d, (int)kvd, 0.0f, c->out + i0 * qd + h * d, (int)qd);
}

static kvq_status full_attend(void *user, const kvq_attn_call *c, kvq_err *err)
{
    kvq_full_attn *fa = user;
    const kvq_model_config *cfg = &fa->cfg;
    const int d = cfg->head_dim, nh = cfg->n_heads, nkv = cfg->n_kv_heads;
    const int64_t qd = (int64_t)nh * d, kvd = (int64_t)nkv * d, n = c->n;
    const int64_t past = fa->len[c->layer], T = past + n;
    kvq_status st;
    if (T > fa->max_tokens)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "full attention: sequence of %lld tokens exceeds max_tokens %lld",
                           (long long)T, (long long)fa->max_tokens);
    if ((st = full_reserve(fa, T, err)))
        return st;
    /* Scores: one [QBLOCK, T] slot per OpenMP thread. */
    const int nt = omp_get_max_threads();
    size_t need_scores;
    if (!kvq_size_mul((size_t)nt * QBLOCK, (size_t)T, &need_scores))
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "full attention: score matrix");
    if (need_scores > fa->scores_cap) {
        float *s = realloc(fa->scores, need_scores * sizeof(float));
        if (!s)
            return kvq_err_set(err, KVQ_E_NOMEM, "full attention: out of memory");
        fa->scores = s;
        fa->scores_cap = need_scores;
    }
    if (n > fa->qrot_rows) {
        float *q = realloc(fa->qrot, (size_t)n * (size_t)qd * sizeof(float));
        if (!q)
            return kvq_err_set(err, KVQ_E_NOMEM, "full attention: out of memory");
        fa->qrot = q;
        fa->qrot_rows = n;
    }

    /* RoPE: keys go into the cache rotated; queries into a scratch copy. */
    float *K = fa->k[c->layer], *V = fa->v[c->layer]; // [cap, n_kv_heads, head_dim]
    memcpy(K + past * kvd, c->k, sizeof(float) * (size_t)(n * kvd));
    memcpy(V + past * kvd, c->v, sizeof(float) * (size_t)(n * kvd));
    memcpy(fa->qrot, c->q, sizeof(float) * (size_t)(n * qd));
    const kvq_layer_attn *la = &fa->la[c->layer];
    const double *theta = fa->theta + (size_t)c->layer * (size_t)(d / 2);
    for (int64_t i = 0; la->use_rope && i < n; i++) {
        kvq_rope_apply(&la->rope, theta, K + (past + i) * kvd, nkv, c->pos[i]);
        kvq_rope_apply(&la->rope, theta, fa->qrot + i * qd, nh, c->pos[i]);
    }

    /* Tasks: query head x block of QBLOCK queries, over this thread's OpenMP team. */
    const int64_t blocks = (n + QBLOCK - 1) / QBLOCK;
    const double work = (double)nh * (double)n * (double)T * d; /* multiply-adds of S */
#pragma omp parallel for schedule(dynamic, 1) if (nh * blocks > 1 && work >= 1 << 18)
    for (int64_t t = 0; t < nh * blocks; t++)
        attend_block(fa, c, K, V, (int)(t / blocks), (t % blocks) * QBLOCK,
                     fa->scores + (size_t)omp_get_thread_num() * QBLOCK * (size_t)T);
    fa->len[c->layer] = T;
    return KVQ_OK;
}

kvq_attn_backend kvq_full_attn_backend(kvq_full_attn *fa)
{
    kvq_attn_backend b = {.name = "full", .user = fa, .attend = full_attend, .reset = full_reset,
                          .per_layer = 1};
    return b;
}

