/*
 * local.c — exact windowed attention of the local layers (runtime/local.h): per layer a
 * ring of rotated keys and values in f32, token t in slot t % cap, cap >= W + the
 * longest chunk - 1, so that every query of a chunk finds its whole window after the
 * chunk's rows are written. Logits in double per (query head, key), scaled, capped
 * (c tanh(s / c)), softmax in double, values mixed in double.
 */
#include "runtime/local.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/rope.h"
#include "kvq/runtime.h"

#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
#endif

#define MAX_POSITION ((int64_t)1 << 31)

typedef struct lc_layer {
    kvq_layer_attn la;
    double theta[KVQ_ROPE_MAX_DIM / 2];
    float *k, *v;   /* [cap, n_kv, d] rotated keys, values */
    int64_t cap;    /* slots */
    int64_t len;    /* tokens seen */
} lc_layer;

struct rt_local {
    int32_t n_layers, n_heads, n_kv, d, threads;
    int64_t max_tokens;
    lc_layer **layer; /* [n_layers]: NULL for the non-local ones */
    float *q;         /* [q_rows, n_heads, d] rotated queries of a chunk */
    int64_t q_rows;
    double *p;        /* [threads, p_cap] probabilities of one (row, head) */
    int64_t p_cap;
};

int kvq_rt_layer_local(const kvq_model_config *c, int32_t layer)
{
    if (!kvq_model_layer_sliding(c, layer))
        return 0;
    for (int32_t l = 0; l < c->n_layers; l++)
        if (!kvq_model_layer_sliding(c, l))
            return 1;
    return 0;
}

int kvq_retrieval_layer_local(const kvq_model_config *c, int32_t layer)
{
    return kvq_rt_layer_local(c, layer);
}

int32_t kvq_rt_local_count(const kvq_model_config *c)
{
    int32_t n = 0;
    for (int32_t l = 0; l < c->n_layers; l++)
        n += kvq_rt_layer_local(c, l);
    return n;
}

int kvq_retrieval_layers_note(const kvq_model_config *c, char *buf, size_t cap)
{
    if (!cap)
        return 0;
    buf[0] = '\0';
    if (kvq_rt_local_count(c) == 0)
        return 0;
    size_t n = (size_t)snprintf(buf, cap, "layers ");
    const char *sep = "";
    for (int32_t l = 0; l < c->n_layers && n < cap; l++) {
        if (!kvq_rt_layer_local(c, l) || (l > 0 && kvq_rt_layer_local(c, l - 1)))
            continue;
        int32_t e = l;
        while (e + 1 < c->n_layers && kvq_rt_layer_local(c, e + 1))
            e++;
        n += e > l ? (size_t)snprintf(buf + n, cap - n, "%s%d-%d", sep, (int)l, (int)e)
                   : (size_t)snprintf(buf + n, cap - n, "%s%d", sep, (int)l);
        sep = ",";
    }
    if (n < cap)
        snprintf(buf + n, cap - n, " of %d slide over %d tokens: attended exactly, no retrieval",
                 (int)c->n_layers, (int)c->sliding_window);
    return 1;
}

void kvq_rt_local_free(rt_local *lc)
{
    if (!lc)
        return;
    for (int32_t l = 0; lc->layer && l < lc->n_layers; l++)
        if (lc->layer[l]) {
            free(lc->layer[l]->k);
            free(lc->layer[l]->v);
            free(lc->layer[l]);
        }
    free(lc->layer);
    free(lc->q);
    free(lc->p);
    free(lc);
}

kvq_status kvq_rt_local_create(const kvq_model_config *c, int64_t max_tokens, int32_t threads,
                               rt_local **out, kvq_err *err)
{
    *out = NULL;
    if (kvq_rt_local_count(c) == 0)
        return KVQ_OK;
    rt_local *lc = calloc(1, sizeof *lc);
    if (!lc || !(lc->layer = calloc((size_t)c->n_layers, sizeof *lc->layer))) {
        free(lc);
        return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory");
    }
    lc->n_layers = c->n_layers;
    lc->n_heads = c->n_heads;
    lc->n_kv = c->n_kv_heads;
    lc->d = c->head_dim;
    lc->threads = threads > 0 ? threads : 1;
    lc->max_tokens = max_tokens;
    for (int32_t l = 0; l < c->n_layers; l++) {
        if (!kvq_rt_layer_local(c, l))
            continue;
        lc_layer *L = calloc(1, sizeof *L);
        if (!L) {
            kvq_rt_local_free(lc);
            return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory");
        }
        lc->layer[l] = L;
        kvq_model_layer_attn(c, l, &L->la);
        kvq_status s = kvq_rope_check(&L->la.rope, err);
        if (s) {
            kvq_rt_local_free(lc);
            return s;
        }
        kvq_rope_freqs(&L->la.rope, L->theta);
    }
    *out = lc;
    return KVQ_OK;
}

void kvq_rt_local_reset(rt_local *lc)
{
    for (int32_t l = 0; lc && l < lc->n_layers; l++)
        if (lc->layer[l])
            lc->layer[l]->len = 0;
}

int kvq_rt_local_has(const rt_local *lc, int32_t layer)
{
    return lc && layer >= 0 && layer < lc->n_layers && lc->layer[layer];
}

int64_t kvq_rt_local_length(const rt_local *lc, int32_t layer)
{
    return kvq_rt_local_has(lc, layer) ? lc->layer[layer]->len : 0;
}

uint64_t kvq_rt_local_bytes(const rt_local *lc)
{
    uint64_t b = 0;
    for (int32_t l = 0; lc && l < lc->n_layers; l++)
        if (lc->layer[l])
            b += (uint64_t)lc->layer[l]->cap * (uint64_t)lc->n_kv * (uint64_t)lc->d * 8u;
    return b;
}

/* Slots for a chunk of n rows: at least W + n - 1, the tokens kept moved to their
 * slots in the grown ring. */
static kvq_status ring_reserve(const rt_local *lc, lc_layer *L, int64_t n, kvq_err *err)
{
    const int64_t need = L->la.window + n - 1;
    if (need <= L->cap)
        return KVQ_OK;
    const int64_t cap = need > 2 * L->cap ? need : 2 * L->cap;
    const size_t row = (size_t)lc->n_kv * (size_t)lc->d;
    float *k = malloc((size_t)cap * row * sizeof *k), *v = malloc((size_t)cap * row * sizeof *v);
    if (!k || !v) {
        free(k);
        free(v);
        return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory for a window of %lld rows",
                           (long long)cap);
    }
    const int64_t keep = L->len < L->cap ? L->len : L->cap;
    for (int64_t t = L->len - keep; t < L->len; t++) {
        memcpy(k + (size_t)(t % cap) * row, L->k + (size_t)(t % L->cap) * row, row * sizeof *k);
        memcpy(v + (size_t)(t % cap) * row, L->v + (size_t)(t % L->cap) * row, row * sizeof *v);
    }
    free(L->k);
    free(L->v);
    L->k = k;
    L->v = v;
    L->cap = cap;
    return KVQ_OK;
}

/* Query head h of row t (rotated query q [d]) over the tokens [lo, t]: out [d]. */
static void attend_row(const rt_local *lc, const lc_layer *L, const float *q, int32_t h, int64_t t,
                       double *p, float *out)
{
    const int32_t d = lc->d, g = h / (lc->n_heads / lc->n_kv);
    const size_t row = (size_t)lc->n_kv * (size_t)d;
    const int64_t lo = t + 1 > L->la.window ? t + 1 - L->la.window : 0;
    const double cap = L->la.softcap;
    double mx = -INFINITY;
    for (int64_t j = lo; j <= t; j++) {
        const float *k = L->k + (size_t)(j % L->cap) * row + (size_t)g * d;
        double s = 0;
        for (int32_t i = 0; i < d; i++)
            s += (double)q[i] * k[i];
        s *= L->la.scale;
        if (cap > 0)
            s = cap * tanh(s / cap);
        p[j - lo] = s;
        mx = s > mx ? s : mx;
    }
    double sum = 0;
    for (int64_t j = lo; j <= t; j++)
        sum += p[j - lo] = exp(p[j - lo] - mx);
    double o[KVQ_ROPE_MAX_DIM] = {0};
    for (int64_t j = lo; j <= t; j++) {
        const float *v = L->v + (size_t)(j % L->cap) * row + (size_t)g * d;
        const double w = p[j - lo] / sum;
        for (int32_t i = 0; i < d; i++)
            o[i] += w * v[i];
    }
    for (int32_t i = 0; i < d; i++)
        out[i] = (float)o[i];
}

static kvq_status scratch(rt_local *lc, int64_t n, int64_t W, kvq_err *err)
{
    const size_t qd = (size_t)lc->n_heads * (size_t)lc->d;
    if (n > lc->q_rows) {
        float *q = realloc(lc->q, (size_t)n * qd * sizeof *q);
        if (!q)
            return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory");
        lc->q = q;
        lc->q_rows = n;
    }
    if (W > lc->p_cap) {
        double *p = realloc(lc->p, (size_t)lc->threads * (size_t)W * sizeof *p);
        if (!p)
            return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory");
        lc->p = p;
        lc->p_cap = W;
    }
    return KVQ_OK;
}

kvq_status kvq_rt_local_attend(rt_local *lc, const kvq_attn_call *c, kvq_err *err)
{
    lc_layer *L = lc->layer[c->layer];
    const int64_t n = c->n, past = L->len;
    const int32_t d = lc->d, nh = lc->n_heads;
    const size_t row = (size_t)lc->n_kv * (size_t)d, qd = (size_t)nh * (size_t)d;
    if (past + n > lc->max_tokens)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "retrieval: sequence of %lld tokens exceeds max_tokens %lld",
                           (long long)(past + n), (long long)lc->max_tokens);
    for (int64_t i = 0; i < n; i++)
        if (c->pos[i] < 0 || c->pos[i] >= MAX_POSITION)
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval: position %lld out of range",
                               (long long)c->pos[i]);
    kvq_status s = ring_reserve(lc, L, n, err);
    if (!s && c->q && c->out)
        s = scratch(lc, n, L->la.window, err);
    if (s)
        return s;
    for (int64_t i = 0; i < n; i++) {
        float *k = L->k + (size_t)((past + i) % L->cap) * row;
        memcpy(k, c->k + (size_t)i * row, row * sizeof *k);
        memcpy(L->v + (size_t)((past + i) % L->cap) * row, c->v + (size_t)i * row,
               row * sizeof *k);
        if (L->la.use_rope)
            kvq_rope_apply(&L->la.rope, L->theta, k, lc->n_kv, c->pos[i]);
    }
    L->len = past + n;
    if (!c->q || !c->out)
        return KVQ_OK;
    memcpy(lc->q, c->q, (size_t)n * qd * sizeof *lc->q);
    for (int64_t i = 0; L->la.use_rope && i < n; i++)
        kvq_rope_apply(&L->la.rope, L->theta, lc->q + (size_t)i * qd, nh, c->pos[i]);
    const int64_t items = n * nh;
#pragma omp parallel for num_threads(lc->threads) schedule(static) if (items > 1)
    for (int64_t it = 0; it < items; it++) {
        const int64_t i = it / nh;
        const int32_t h = (int32_t)(it % nh);
        const int tid = omp_get_thread_num();
        attend_row(lc, L, lc->q + (size_t)i * qd + (size_t)h * d, h, past + i,
                   lc->p + (size_t)tid * (size_t)lc->p_cap, c->out + (size_t)i * qd + (size_t)h * d);
    }
    return KVQ_OK;
}
