/*
 * simcache.c — the simulated compressed cache: exact attention over a KV cache that
 * LeanKV or PATS compresses, one thr_head per (layer, KV head), and the kvq_simcache
 * attention backend that puts it into the forward pass.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kvq/util.h"
#include "thresholds/thresholds_internal.h"

/* ==========================================================================
 * Attention
 * ========================================================================== */

void thr_attend(const float *q, int32_t gs, int32_t d, const float *K, const float *V,
                int64_t n, const uint8_t *cls, double *p, float *out)
{
    /* logits and exponentials in float (the hot loop), sums in double */
    const float scale = (float)(1.0 / sqrt((double)d));
    for (int32_t g = 0; g < gs; g++) {
        const float *qg = q + (size_t)g * d;
        double *pg = p + (size_t)g * n;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            if (cls && cls[j] == KVQ_LEANKV_PRUNED)
                continue;
            const float *kj = K + (size_t)j * d;
            float s = 0;
            for (int32_t t = 0; t < d; t++)
                s += qg[t] * kj[t];
            s *= scale;
            pg[j] = s;
            mx = s > mx ? s : mx;
        }
        double sum = 0;
        for (int64_t j = 0; j < n; j++) {
            if (cls && cls[j] == KVQ_LEANKV_PRUNED) {
                pg[j] = 0;
                continue;
            }
            pg[j] = expf((float)pg[j] - mx);
            sum += pg[j];
        }
        if (sum > 0) {
            const double inv = 1.0 / sum;
            for (int64_t j = 0; j < n; j++)
                pg[j] *= inv;
        }
        /* one running sum per output dimension (kept in a register; V is in cache) */
        for (int32_t t = 0; out && t < d; t++) {
            double a = 0;
            if (sum > 0)
                for (int64_t j = 0; j < n; j++)
                    a += pg[j] * V[(size_t)j * d + t];
            out[(size_t)g * d + t] = (float)a;
        }
    }
}

/* ==========================================================================
 * One head
 * ========================================================================== */

void thr_head_init(thr_head *h, kvq_simcache_kind kind, const kvq_leankv_params *lk,
                   const kvq_pats_params *pt, int32_t d, int32_t gs)
{
    memset(h, 0, sizeof *h);
    h->kind = kind;
    h->lk = lk ? *lk : kvq_leankv_params_default();
    h->pt = pt ? *pt : kvq_pats_params_default();
    h->d = d;
    h->gs = gs;
}

void thr_head_free(thr_head *h)
{
    if (!h)
        return;
    free(h->k);
    free(h->v);
    free(h->kc);
    free(h->vc);
    free(h->cls);
    free(h->acc);
    free(h->qcum);
    free(h->sig);
    free(h->p);
    memset(h, 0, sizeof *h);
}

void thr_head_begin(thr_head *h, int64_t seq_len, int64_t prompt_len)
{
    h->n = 0;
    h->seq_len = seq_len > 0 ? seq_len : 0;
    h->prompt_len = prompt_len > 0 ? prompt_len : 0;
    h->classified = 0;
    h->nq = 0;
    h->pats_bytes = 0;
    h->pats_bits = 0;
}

/* Room for `need` rows (doubling). */
static kvq_status reserve(thr_head *h, int64_t need, kvq_err *err)
{
    if (need <= h->cap)
        return KVQ_OK;
    int64_t cap = h->cap ? 2 * h->cap : 64;
    while (cap < need)
        cap *= 2;
    const size_t c = (size_t)cap, d = (size_t)h->d, gs = (size_t)h->gs;
    const int lean = h->kind == KVQ_SIMCACHE_LEANKV;
    if ((lean && (kvq_resize((void **)&h->k, c * d, sizeof(float)) ||
                  kvq_resize((void **)&h->v, c * d, sizeof(float)) ||
                  kvq_resize((void **)&h->cls, c, 1) ||
                  kvq_resize((void **)&h->acc, c * gs, sizeof(double)) ||
                  kvq_resize((void **)&h->qcum, c, sizeof(int64_t)) ||
                  kvq_resize((void **)&h->sig, c, sizeof(double)))) ||
        kvq_resize((void **)&h->kc, c * d, sizeof(float)) ||
        kvq_resize((void **)&h->vc, c * d, sizeof(float)) ||
        kvq_resize((void **)&h->p, c * gs, sizeof(double)))
        return kvq_err_set(err, KVQ_E_NOMEM, "simcache: out of memory for %lld tokens",
                           (long long)cap);
    h->cap = cap;
    return KVQ_OK;
}

kvq_status thr_head_push(thr_head *h, const float *k, const float *v, const float *q,
                         float *out, kvq_err *err)
{
    kvq_status s;
    if ((s = reserve(h, h->n + 1, err)))
        return s;
    const int64_t t = h->n++;
    const size_t off = (size_t)t * h->d, bytes = sizeof(float) * (size_t)h->d;
    if (h->kind == KVQ_SIMCACHE_LEANKV) {
        memcpy(h->k + off, k, bytes);
        memcpy(h->v + off, v, bytes);
        return thr_leankv_push(h, q, out, err);
    }
    memcpy(h->kc + off, k, bytes);
    memcpy(h->vc + off, v, bytes);
    thr_pats_push(h, q, out);
    return KVQ_OK;
}

kvq_status thr_head_copy(thr_head *dst, const thr_head *src, kvq_err *err)
{
    kvq_status s;
    if (dst->kind != src->kind || dst->d != src->d || dst->gs != src->gs)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "simcache: copy between different heads");
    if ((s = reserve(dst, src->n, err)))
        return s;
    const size_t n = (size_t)src->n, d = (size_t)src->d, gs = (size_t)src->gs;
    if (src->kind == KVQ_SIMCACHE_LEANKV && n) {
        memcpy(dst->k, src->k, sizeof(float) * n * d);
        memcpy(dst->v, src->v, sizeof(float) * n * d);
        memcpy(dst->cls, src->cls, n);
        memcpy(dst->acc, src->acc, sizeof(double) * n * gs);
        memcpy(dst->qcum, src->qcum, sizeof(int64_t) * n);
    }
    if (n) {
        memcpy(dst->kc, src->kc, sizeof(float) * n * d);
        memcpy(dst->vc, src->vc, sizeof(float) * n * d);
    }
    dst->lk = src->lk;
    dst->pt = src->pt;
    dst->n = src->n;
    dst->seq_len = src->seq_len;
    dst->prompt_len = src->prompt_len;
    dst->classified = src->classified;
    dst->nq = src->nq;
    dst->pats_bytes = src->pats_bytes;
    dst->pats_bits = src->pats_bits;
    return KVQ_OK;
}

kvq_status thr_head_memory(thr_head *h, kvq_simcache_memory *m, kvq_err *err)
{
    kvq_status s;
    m->bytes_f16 += 4.0 * h->d * (double)h->n;
    if (h->kind == KVQ_SIMCACHE_PATS) {
        m->bytes += h->pats_bytes;
        m->bits += h->pats_bits;
        return KVQ_OK;
    }
    if (!h->classified && (s = thr_leankv_finish_prompt(h, err)))
        return s;
    double bytes = 0;
    for (int64_t j = 0; j < h->n; j++) {
        bytes += (double)kvq_leankv_token_bytes(h->d, (kvq_leankv_class)h->cls[j], &h->lk);
        m->n_high += h->cls[j] == KVQ_LEANKV_HIGH;
        m->n_low += h->cls[j] == KVQ_LEANKV_LOW;
        m->n_pruned += h->cls[j] == KVQ_LEANKV_PRUNED;
    }
    m->bytes += bytes;
    m->bits += 8.0 * bytes;
    return KVQ_OK;
}

/* ==========================================================================
 * The attention backend
 * ========================================================================== */

struct kvq_simcache {
    kvq_simcache_kind kind;
    kvq_rope rope;
    double theta[KVQ_ROPE_MAX_DIM / 2];
    int32_t n_layers, n_kv, nh, gs, d, threads;
    int32_t sliding_window, sliding_from; /* the model's (not simulated: refused) */
    thr_head *heads;   /* [n_layers, n_kv] */
    float *qr, *kr;    /* [rows, nh, d], [rows, n_kv, d]: the chunk after RoPE */
    int64_t rows;
    kvq_status *st;    /* [n_kv] per-head status of the last call */
    kvq_err *errs;     /* [n_kv] */
};

kvq_status kvq_simcache_create(const kvq_model_config *cfg, kvq_simcache_kind kind,
                               const kvq_leankv_params *lk, const kvq_pats_params *pt,
                               int32_t threads, kvq_simcache **out, kvq_err *err)
{
    kvq_status s;
    *out = NULL;
    if (kind != KVQ_SIMCACHE_LEANKV && kind != KVQ_SIMCACHE_PATS)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "simcache: unknown kind %d", (int)kind);
    if (kind == KVQ_SIMCACHE_LEANKV && (!lk || (s = kvq_leankv_check(lk, err))))
        return lk ? s : kvq_err_set(err, KVQ_E_INVALID_ARG, "simcache: LeanKV without params");
    if (kind == KVQ_SIMCACHE_PATS && (!pt || (s = kvq_pats_check(pt, err))))
        return pt ? s : kvq_err_set(err, KVQ_E_INVALID_ARG, "simcache: PATS without params");
    if (cfg->n_layers < 1 || cfg->n_kv_heads < 1 || cfg->n_heads % cfg->n_kv_heads ||
        cfg->head_dim < 2 || cfg->head_dim > KVQ_ROPE_MAX_DIM || cfg->rope.head_dim != cfg->head_dim)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "simcache: bad model configuration");
    kvq_simcache *c = calloc(1, sizeof *c);
    if (!c)
        return kvq_err_set(err, KVQ_E_NOMEM, "simcache: out of memory");
    c->kind = kind;
    c->rope = cfg->rope;
    kvq_rope_freqs(&c->rope, c->theta);
    c->n_layers = cfg->n_layers;
    c->n_kv = cfg->n_kv_heads;
    c->nh = cfg->n_heads;
    c->gs = cfg->n_heads / cfg->n_kv_heads;
    c->d = cfg->head_dim;
    c->threads = threads > 0 ? threads : 1;
    c->sliding_window = cfg->sliding_window;
    c->sliding_from = cfg->sliding_from;
    c->heads = calloc((size_t)c->n_layers * c->n_kv, sizeof *c->heads);
    c->st = calloc((size_t)c->n_kv, sizeof *c->st);
    c->errs = calloc((size_t)c->n_kv, sizeof *c->errs);
    if (!c->heads || !c->st || !c->errs) {
        kvq_simcache_free(c);
        return kvq_err_set(err, KVQ_E_NOMEM, "simcache: out of memory");
    }
    for (int32_t i = 0; i < c->n_layers * c->n_kv; i++)
        thr_head_init(&c->heads[i], kind, lk, pt, c->d, c->gs);
    *out = c;
    return KVQ_OK;
}

void kvq_simcache_free(kvq_simcache *s)
{
    if (!s)
        return;
    for (int32_t i = 0; s->heads && i < s->n_layers * s->n_kv; i++)
        thr_head_free(&s->heads[i]);
    free(s->heads);
    free(s->qr);
    free(s->kr);
    free(s->st);
    free(s->errs);
    free(s);
}

void kvq_simcache_begin(kvq_simcache *s, int64_t seq_len, int64_t prompt_len)
{
    for (int32_t i = 0; i < s->n_layers * s->n_kv; i++)
        thr_head_begin(&s->heads[i], seq_len, prompt_len);
}

static void simcache_reset(void *user)
{
    kvq_simcache_begin(user, 0, 0);
}

static kvq_status simcache_attend(void *user, const kvq_attn_call *c, kvq_err *err)
{
    kvq_simcache *s = user;
    const int32_t d = s->d, nh = s->nh, nkv = s->n_kv, gs = s->gs;
    if (c->layer < 0 || c->layer >= s->n_layers || c->n < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "simcache: bad attention call");
    for (int32_t i = 0; i < c->n; i++)
        if (c->pos[i] < 0 || c->pos[i] > INT32_MAX)
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "simcache: position %lld out of range",
                               (long long)c->pos[i]);
    const int64_t cached = s->heads[(size_t)c->layer * nkv].n;
    if (s->sliding_window > 0 && c->layer >= s->sliding_from &&
        cached + c->n > s->sliding_window)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                           "simcache: layer %d attends over a sliding window of %d tokens; "
                           "simulating LeanKV / PATS past it (%lld tokens) is not supported: "
                           "use sequences of at most %d tokens",
                           (int)c->layer, (int)s->sliding_window, (long long)(cached + c->n),
                           (int)s->sliding_window);
    if (c->n > s->rows) {
        float *qr = realloc(s->qr, sizeof(float) * (size_t)c->n * nh * d);
        if (qr)
            s->qr = qr;
        float *kr = realloc(s->kr, sizeof(float) * (size_t)c->n * nkv * d);
        if (kr)
            s->kr = kr;
        if (!qr || !kr)
            return kvq_err_set(err, KVQ_E_NOMEM, "simcache: out of memory");
        s->rows = c->n;
    }
    memcpy(s->qr, c->q, sizeof(float) * (size_t)c->n * nh * d);
    memcpy(s->kr, c->k, sizeof(float) * (size_t)c->n * nkv * d);
    for (int32_t i = 0; i < c->n; i++) {
        kvq_rope_apply(&s->rope, s->theta, s->qr + (size_t)i * nh * d, nh, c->pos[i]);
        kvq_rope_apply(&s->rope, s->theta, s->kr + (size_t)i * nkv * d, nkv, c->pos[i]);
    }
#pragma omp parallel for num_threads(s->threads) schedule(static, 1)
    for (int32_t h = 0; h < nkv; h++) {
        thr_head *H = &s->heads[(size_t)c->layer * nkv + h];
        kvq_status st = KVQ_OK;
        for (int32_t i = 0; i < c->n && !st; i++) {
            const size_t kv = ((size_t)i * nkv + h) * d, qo = ((size_t)i * nh + (size_t)h * gs) * d;
            st = thr_head_push(H, s->kr + kv, c->v + kv, s->qr + qo, c->out ? c->out + qo : NULL,
                               &s->errs[h]);
        }
        s->st[h] = st;
    }
    for (int32_t h = 0; h < nkv; h++)
        if (s->st[h]) {
            if (err)
                *err = s->errs[h];
            return s->st[h];
        }
    return KVQ_OK;
}

kvq_attn_backend kvq_simcache_backend(kvq_simcache *s)
{
    kvq_attn_backend b = {.name = s->kind == KVQ_SIMCACHE_LEANKV ? "leankv" : "pats",
                          .user = s, .attend = simcache_attend, .reset = simcache_reset};
    return b;
}

void kvq_simcache_memory_get(const kvq_simcache *s, kvq_simcache_memory *m)
{
    memset(m, 0, sizeof *m);
    for (int32_t i = 0; i < s->n_layers * s->n_kv; i++) {
        /* a LeanKV head still in its prompt is counted as classified now; the copy keeps
         * the cache itself untouched */
        thr_head *H = &s->heads[i];
        if (H->kind == KVQ_SIMCACHE_LEANKV && !H->classified) {
            thr_head tmp;
            thr_head_init(&tmp, H->kind, &H->lk, &H->pt, H->d, H->gs);
            if (!thr_head_copy(&tmp, H, NULL))
                (void)thr_head_memory(&tmp, m, NULL);
            thr_head_free(&tmp);
        } else {
            (void)thr_head_memory(H, m, NULL);
        }
    }
}
