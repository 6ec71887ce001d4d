/*
 * fit.c — the `kvq fit` stage (kvq/fit.h, kvq_fit_run): a capture directory and a
 * moments file in, one .kvq artifact out.
 *
 *   check inputs -> hold out sequences -> for each (layer, KV head) job:
 *       checkpoint with a matching key?  load it
 *       else  keys -> fit the method's codebook (and the plain reference) ->
 *             held-out score MSE -> tensors -> checkpoint
 *   -> artifact (every job's tensors + summary) -> remove the checkpoint directory
 *
 * This file is the driver (inputs, jobs, fitting); the checkpoint files are in
 * fit_checkpoint.c, the artifact writer in fit_artifact.c, and what they share in
 * fit_internal.h.
 *
 * A job's result is just its list of named tensors (codebooks, diagnostics), the same
 * whether it was fitted now or read back from its checkpoint file, so a resumed run
 * writes the same artifact bytes as an uninterrupted one.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvq/artifact.h"
#include "kvq/capture_dir.h"
#include "kvq/codebook.h"
#include "kvq/fit.h"
#include "kvq/model.h"
#include "kvq/half.h"
#include "kvq/moments.h"
#include "kvq/util.h"
#include "kmeans/fit_internal.h"

#define FIT_DEFAULT_K 4096
#define FIT_MIN_POINTS 39     /* training keys per centroid below which fits get noisy */

kvq_fit_params kvq_fit_params_default(void)
{
    kvq_fit_params p;
    memset(&p, 0, sizeof p);
    p.method = KVQ_CODEBOOK_QAVQ;
    p.iters = 25;
    p.tol = 1e-4;
    p.seed = 1234;
    p.threads = 1;
    p.init = KVQ_KMEANS_INIT_GREEDY_PP;
    p.device = KVQ_KMEANS_DEVICE_CPU;
    p.holdout = 0.1;
    p.reference = 1;
    p.checkpoint = 1;
    return p;
}

/* ==========================================================================
 * A job's result: named tensors
 * ========================================================================== */

void fit_job_clear(fit_job *j)
{
    for (size_t i = 0; i < j->n_t; i++)
        free(j->t[i].data);
    free(j->t);
    j->t = NULL;
    j->n_t = j->cap = 0;
}

/* Appends a tensor with a copy of `data` (nbytes from dtype and shape). */
kvq_status fit_job_add(fit_job *j, const char *name, kvq_dtype dt, int ndim,
                       const int64_t *shape, const void *data, kvq_err *err)
{
    size_t nbytes = kvq_dtype_size(dt);
    for (int i = 0; i < ndim; i++)
        if (!kvq_size_mul(nbytes, (size_t)shape[i], &nbytes))
            return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: tensor too large", name);
    if (j->n_t == j->cap) {
        size_t cap = j->cap ? 2 * j->cap : 16;
        fit_tensor *t = realloc(j->t, cap * sizeof *t);
        if (!t)
            return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", name);
        j->t = t;
        j->cap = cap;
    }
    fit_tensor *t = &j->t[j->n_t];
    memset(t, 0, sizeof *t);
    if (strlen(name) >= sizeof t->name)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: tensor name too long", name);
    strcpy(t->name, name);
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->nbytes = nbytes;
    t->data = malloc(nbytes ? nbytes : 1);
    if (!t->data)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", name);
    memcpy(t->data, data, nbytes);
    j->n_t++;
    return KVQ_OK;
}

static kvq_status job_add_scalar(fit_job *j, const char *name, double v, kvq_err *err)
{
    return fit_job_add(j, name, KVQ_DT_F64, 0, NULL, &v, err);
}

static const fit_tensor *job_find(const fit_job *j, const char *name)
{
    for (size_t i = 0; i < j->n_t; i++)
        if (!strcmp(j->t[i].name, name))
            return &j->t[i];
    return NULL;
}

/* The value of a scalar F64 diagnostic "diag.layer.L.head.H.<what>", NaN if absent. */
double fit_job_scalar(const fit_job *j, const char *what)
{
    char name[128];
    snprintf(name, sizeof name, KVQ_TENSOR_DIAG_HEAD, (int)j->layer, (int)j->head, what);
    const fit_tensor *t = job_find(j, name);
    double v = NAN;
    if (t && t->dtype == KVQ_DT_F64 && t->ndim == 0)
        memcpy(&v, t->data, sizeof v);
    return v;
}

/* ==========================================================================
 * Run context
 * ========================================================================== */

/* k-means logs one level lower (its INFO lines would drown the per-head ones), and its
 * progress is forwarded as the stage's, so a stop request is heard mid-fit. */
static void km_log(void *user, kvq_log_level level, const char *msg)
{
    const fit_ctx *c = user;
    if (c->cb.log)
        c->cb.log(c->cb.user, level == KVQ_LOG_INFO ? KVQ_LOG_DEBUG : level, msg);
}

/* "fit" progress: the heads done of this rank's share, shown as the whole job's
 * (kvq_dist_progress: rank 0 estimates it from its share, the shares being balanced). */
static int fit_progress(const fit_ctx *c)
{
    return kvq_progress(&c->cb, "fit",
                        kvq_dist_progress(c->p->dist, (uint64_t)c->jobs_done,
                                          (uint64_t)c->jobs_prog, (uint64_t)c->jobs_total),
                        (uint64_t)c->jobs_total);
}

static int km_progress(void *user, const char *what, uint64_t done, uint64_t total)
{
    const fit_ctx *c = user;
    return fit_progress(c);
}

/* ==========================================================================
 * Reading one layer of the capture
 * ========================================================================== */

typedef struct layer_data {
    kvq_capture_layer f;
    const kvq_tensor_view *k, *q;
    int32_t *pos, *seq;   /* [n_tokens] */
    int32_t *q_rows;      /* [n_q] */
    int64_t n_q;
} layer_data;

static void layer_close(layer_data *L)
{
    kvq_capture_layer_close(&L->f);
    free(L->pos);
    free(L->seq);
    free(L->q_rows);
    memset(L, 0, sizeof *L);
}

static kvq_status layer_open(const fit_ctx *c, int32_t layer, layer_data *L, kvq_err *err)
{
    kvq_status s;
    memset(L, 0, sizeof *L);
    if ((s = kvq_capture_layer_open(c->ci, kvq_capture_info_find_layer(c->ci, layer), &L->f,
                                    err)) ||
        (s = kvq_capture_layer_tensor(&L->f, "k", &L->k, err)) ||
        (s = kvq_capture_layer_tensor(&L->f, "q", &L->q, err)) ||
        (s = kvq_capture_layer_column(&L->f, "pos", &L->pos, err)) ||
        (s = kvq_capture_layer_column(&L->f, "seq", &L->seq, err)) ||
        (s = kvq_capture_layer_column(&L->f, "q_rows", &L->q_rows, err))) {
        layer_close(L);
        return s;
    }
    L->n_q = L->f.n_q;
    return KVQ_OK;
}

/* ==========================================================================
 * One job
 * ========================================================================== */

/* The data of (layer, head): training and held-out keys with positions, held-out
 * scoring queries (q R_b, and q R_pos for vq-postrope), L and L^-1. */
typedef struct head_data {
    float *k_train;   /* [n_train, d] */
    int32_t *p_train; /* [n_train] */
    float *k_hold;    /* [n_hk, d] */
    int32_t *p_hold;  /* [n_hk] */
    int64_t n_hk;
    float *q_b;       /* [n_hq, d] q R_b */
    float *q_pos;     /* [n_hq, d] q R_pos (vq-postrope only) */
    int64_t n_hq;
} head_data;

static void head_free(head_data *h)
{
    free(h->k_train);
    free(h->p_train);
    free(h->k_hold);
    free(h->p_hold);
    free(h->q_b);
    free(h->q_pos);
    memset(h, 0, sizeof *h);
}

static kvq_status head_load(const fit_ctx *c, const layer_data *L, int32_t layer, int32_t head,
                            head_data *h, kvq_err *err)
{
    const kvq_capture_info *ci = c->ci;
    const int32_t d = c->d;
    const int64_t n = ci->n_tokens, n_hold = c->n_hold_rows;
    kvq_status s = KVQ_OK;
    memset(h, 0, sizeof *h);
    int64_t n_hq = 0;
    for (int64_t i = 0; i < L->n_q; i++)
        n_hq += c->heldout[L->q_rows[i]];
    n_hq *= c->r;
    const int post = c->p->method == KVQ_CODEBOOK_VQ_POSTROPE;
    if (!(h->k_train = malloc((size_t)c->n_train * d * sizeof(float))) ||
        !(h->p_train = malloc((size_t)c->n_train * sizeof(int32_t))) ||
        !(h->k_hold = malloc((size_t)(n_hold ? n_hold : 1) * d * sizeof(float))) ||
        !(h->p_hold = malloc((size_t)(n_hold ? n_hold : 1) * sizeof(int32_t))) ||
        !(h->q_b = malloc((size_t)(n_hq ? n_hq : 1) * d * sizeof(float))) ||
        (post && !(h->q_pos = malloc((size_t)(n_hq ? n_hq : 1) * d * sizeof(float))))) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory for the keys of head %d",
                        L->f.path, (int)head);
        goto fail;
    }
    int64_t it = 0, ih = 0;
    for (int64_t i = 0; i < n; i++) {
        float *dst = c->heldout[i] ? h->k_hold + (size_t)ih * d : h->k_train + (size_t)it * d;
        kvq_capture_read_heads(L->k, i, head, 1, dst);
        for (int32_t t = 0; t < d; t++)
            if (!isfinite(dst[t])) {
                s = kvq_err_set(err, KVQ_E_NUMERIC, "%s: layer %d head %d row %lld (sequence "
                                "%d position %d): non-finite key", L->f.path, (int)layer,
                                (int)head, (long long)i, (int)L->seq[i], (int)L->pos[i]);
                goto fail;
            }
        if (c->heldout[i])
            h->p_hold[ih++] = L->pos[i];
        else
            h->p_train[it++] = L->pos[i];
    }
    h->n_hk = ih;
    double theta[KVQ_ROPE_MAX_DIM / 2];
    kvq_rope_freqs(&ci->model.rope, theta);
    int64_t iq = 0;
    for (int64_t i = 0; i < L->n_q; i++) {
        const int32_t row = L->q_rows[i];
        if (!c->heldout[row])
            continue;
        for (int32_t g = head * c->r; g < (head + 1) * c->r; g++, iq++) {
            float *qb = h->q_b + (size_t)iq * d;
            kvq_capture_read_heads(L->q, i, g, 1, qb);
            for (int32_t t = 0; t < d; t++)
                if (!isfinite(qb[t])) {
                    s = kvq_err_set(err, KVQ_E_NUMERIC, "%s: layer %d query head %d row %d: "
                                    "non-finite query", L->f.path, (int)layer, (int)g, (int)row);
                    goto fail;
                }
            if (post) {
                float *qp = h->q_pos + (size_t)iq * d;
                memcpy(qp, qb, (size_t)d * sizeof *qp);
                kvq_rope_apply(&ci->model.rope, theta, qp, 1, L->pos[row]);
            }
            kvq_rope_apply(&ci->model.rope, theta, qb, 1, c->wrope_b);
        }
    }
    h->n_hq = iq;
    return KVQ_OK;
fail:
    head_free(h);
    return s;
}

/* kvq_codebook_tensor_fn adding an F32 [rows, cols] tensor to the job (user). */
static kvq_status job_add_f32(void *user, const char *name, int64_t rows, int64_t cols,
                              const float *data, kvq_err *err)
{
    const int64_t shape[2] = {rows, cols};
    return fit_job_add(user, name, KVQ_DT_F32, 2, shape, data, err);
}

/* Adds a fitted codebook's tensors (kvq_codebook_save, docs/format.md section 7) and its
 * k-means diagnostics to the job. */
static kvq_status add_codebook(fit_job *j, const kvq_codebook *cb,
                               const kvq_codebook_fit_stats *fs, kvq_err *err)
{
    const kvq_codebook_desc *D = kvq_codebook_get_desc(cb);
    const int32_t K = D->k, G = D->groups;
    const int L = j->layer, H = j->head;
    char name[128];
    kvq_status s;
    if ((s = kvq_codebook_save(cb, L, H, job_add_f32, j, err)))
        return s;
    for (int32_t g = 0; g < G; g++) {
        const kvq_kmeans_stats *ks = &fs->group[g];
        if (ks->n_iters < 1)
            continue;
        if (G == 1)
            snprintf(name, sizeof name, KVQ_TENSOR_DIAG_HEAD, L, H, "inertia");
        else
            snprintf(name, sizeof name, KVQ_TENSOR_DIAG_GROUP, L, H, (int)g, "inertia");
        const int64_t ni[1] = {ks->n_iters};
        if ((s = fit_job_add(j, name, KVQ_DT_F64, 1, ni, ks->inertia, err)))
            return s;
    }
    int64_t *sizes = malloc((size_t)G * K * sizeof *sizes);
    if (!sizes)
        return kvq_err_set(err, KVQ_E_NOMEM, "out of memory");
    for (int32_t g = 0; g < G; g++)
        memcpy(sizes + (size_t)g * K, fs->group[g].cluster_size, (size_t)K * sizeof *sizes);
    snprintf(name, sizeof name, KVQ_TENSOR_DIAG_HEAD, L, H, "cluster_size");
    const int64_t gk[2] = {G, K};
    s = fit_job_add(j, name, KVQ_DT_I64, 2, gk, sizes, err);
    free(sizes);
    return s;
}

static int stats_cuda(const kvq_codebook_fit_stats *fs)
{
    for (int32_t g = 0; g < fs->groups; g++)
        if (fs->group[g].backend == KVQ_KMEANS_DEVICE_CUDA)
            return 1;
    return 0;
}

/* Fits one (layer, head): the method, the reference, the held-out errors. */
static kvq_status job_fit(fit_ctx *c, const layer_data *L, fit_job *j, kvq_err *err)
{
    const kvq_fit_params *p = c->p;
    const int32_t d = c->d;
    head_data h;
    kvq_codebook *cb = NULL, *ref = NULL;
    kvq_codebook_fit_stats fs = {0}, rs = {0};
    float *Lm = NULL, *Li = NULL;
    char label[64], name[128];
    kvq_status s;
    if ((s = head_load(c, L, j->layer, j->head, &h, err)))
        return s;
    if (!(Lm = malloc((size_t)d * d * sizeof *Lm)) || !(Li = malloc((size_t)d * d * sizeof *Li))) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "out of memory");
        goto done;
    }
    if ((s = kvq_moments_get_f32(c->m, j->layer, j->head, KVQ_MOMENTS_MAT_L, Lm, err)) ||
        (s = kvq_moments_get_f32(c->m, j->layer, j->head, KVQ_MOMENTS_MAT_LINV, Li, err)))
        goto done;
    kvq_codebook_desc desc = {
        .method = p->method, .dim = d, .k = c->K, .groups = c->G,
        .rope = c->ci->model.rope, .wrope_b = c->wrope_b,
    };
    kvq_codebook_data data = {
        .keys = h.k_train, .pos = h.p_train, .n = c->n_train, .L = Lm, .Linv = Li,
    };
    kvq_kmeans_params km = kvq_kmeans_params_default();
    km.max_iters = p->iters;
    km.tol = p->tol;
    km.seed = kvq_codebook_group_seed(p->seed, (int64_t)j->layer * 65536 + j->head);
    km.threads = p->threads;
    km.init = p->init;
    km.device = c->device;
    km.min_points_per_centroid = 0; /* warned about once, for the whole run */
    km.cb.log = km_log;
    km.cb.progress = km_progress;
    km.cb.user = c;
    snprintf(label, sizeof label, "layer %d head %d", (int)j->layer, (int)j->head);
    km.label = label;
    if ((s = kvq_codebook_fit(&desc, &data, &km, &cb, &fs, err)) || (s = add_codebook(j, cb, &fs, err))) {
        if (s == KVQ_E_NUMERIC && err) { /* the keys are whitened by the moments' factor */
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err->msg);
            kvq_err_set(err, s, "%s: %s (the keys of the capture whitened by this moments "
                        "file's factor: is it damaged?)", c->moments_path, msg);
        }
        goto done;
    }
    j->cuda = stats_cuda(&fs);

    const int have_hold = h.n_hk > 0 && h.n_hq > 0;
    double mse = NAN, power = NAN, mse_ref = NAN, power_ref = NAN;
    if (have_hold &&
        (s = kvq_codebook_score_mse(cb, h.q_pos ? h.q_pos : h.q_b, h.n_hq, h.k_hold, h.p_hold,
                                    h.n_hk, p->threads, &mse, &power, err)))
        goto done;
    if (p->reference && c->ref_fit) {
        kvq_codebook_desc rd = desc;
        rd.method = c->ref_method;
        kvq_codebook_data rdata = data;
        rdata.L = rdata.Linv = NULL;
        snprintf(label, sizeof label, "layer %d head %d ref", (int)j->layer, (int)j->head);
        if ((s = kvq_codebook_fit(&rd, &rdata, &km, &ref, &rs, err)))
            goto done;
        j->cuda |= stats_cuda(&rs);
        if (have_hold &&
            (s = kvq_codebook_score_mse(ref, h.q_b, h.n_hq, h.k_hold, h.p_hold, h.n_hk,
                                        p->threads, &mse_ref, &power_ref, err)))
            goto done;
    } else if (p->reference) {
        mse_ref = mse;
        power_ref = power;
    }
    if (have_hold) {
        snprintf(name, sizeof name, KVQ_TENSOR_DIAG_HEAD, (int)j->layer, (int)j->head, "score_mse");
        if ((s = job_add_scalar(j, name, mse, err)))
            goto done;
        snprintf(name, sizeof name, KVQ_TENSOR_DIAG_HEAD, (int)j->layer, (int)j->head, "score_power");
        if ((s = job_add_scalar(j, name, power, err)))
            goto done;
        if (p->reference) {
            snprintf(name, sizeof name, KVQ_TENSOR_DIAG_HEAD, (int)j->layer, (int)j->head, "ref.score_mse");
            if ((s = job_add_scalar(j, name, mse_ref, err)))
                goto done;
            snprintf(name, sizeof name, KVQ_TENSOR_DIAG_HEAD, (int)j->layer, (int)j->head, "ref.score_power");
            if ((s = job_add_scalar(j, name, power_ref, err)))
                goto done;
        }
    }
    if (have_hold) {
        snprintf(name, sizeof name, KVQ_TENSOR_DIAG_HEAD, (int)j->layer, (int)j->head, "n_heldout_queries");
        s = job_add_scalar(j, name, (double)h.n_hq, err);
    }
done:
    kvq_codebook_free(cb);
    kvq_codebook_free(ref);
    kvq_codebook_fit_stats_free(&fs);
    kvq_codebook_fit_stats_free(&rs);
    free(Lm);
    free(Li);
    head_free(&h);
    return s;
}

/* ==========================================================================
 * Setup: checks, layers, held-out split, codebook size
 * ========================================================================== */

static kvq_status check_params(const kvq_fit_params *p, kvq_err *err)
{
    if ((unsigned)p->method >= KVQ_CODEBOOK_N_METHODS)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "fit: unknown method %d", (int)p->method);
    if (p->codebook_size != 0 && (p->codebook_size < 2 || p->codebook_size > 65536))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "fit: codebook size %d is outside [2, 65536]",
                           (int)p->codebook_size);
    if (p->groups < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "fit: groups %d is negative", (int)p->groups);
    if (p->iters < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "fit: iterations %d is negative", (int)p->iters);
    if (!(p->tol >= 0) || !isfinite(p->tol))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "fit: tolerance must be finite and >= 0");
    if (p->threads < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "fit: threads %d must be >= 1", (int)p->threads);
    if (!(p->holdout >= 0 && p->holdout < 1))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "fit: holdout fraction must be in [0, 1)");
    if (p->n_layers && !p->layers)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "fit: NULL layer list");
    return KVQ_OK;
}

/* The layers to fit: the requested ones (each in both inputs), or all of the capture's
 * (each must be in the moments file). */
static kvq_status choose_layers(fit_ctx *c, const char *capture_dir, kvq_err *err)
{
    const kvq_fit_params *p = c->p;
    size_t n = p->layers ? p->n_layers : (size_t)c->ci->n_files;
    c->layers = malloc((n ? n : 1) * sizeof *c->layers);
    if (!c->layers)
        return kvq_err_set(err, KVQ_E_NOMEM, "out of memory");
    c->n_layers = 0;
    /* Sliding-window layers attend their window exactly and need no codebook: without
     * --layers they are left out when the model also has global layers (gemma). When
     * every layer has a window (mistral, phi3), retrieval within the window is all there
     * is: they are fitted, and the log says why. */
    const kvq_model_id *mid = &c->ci->model;
    int32_t n_windowed = 0, window = 0;
    for (int32_t l = 0; l < mid->n_layers; l++) {
        kvq_layer_attn la;
        kvq_model_id_layer_attn(mid, l, &la);
        n_windowed += la.window > 0;
        window = la.window > 0 ? la.window : window;
    }
    const int skip_windowed = !p->layers && n_windowed > 0 && n_windowed < mid->n_layers;
    if (skip_windowed)
        kvq_log(&c->cb, KVQ_LOG_INFO, "fit: %d of the model's %d layers attend a sliding window "
                "of %d tokens exactly: no codebook for them", (int)n_windowed,
                (int)mid->n_layers, (int)window);
    else if (n_windowed == mid->n_layers && n_windowed > 0)
        kvq_log(&c->cb, KVQ_LOG_INFO, "fit: every layer attends a sliding window of %d tokens: "
                "codebooks are fitted for retrieval within it", (int)window);
    for (size_t i = 0; i < n; i++) {
        int32_t l = p->layers ? p->layers[i] : c->ci->layers[i];
        if (skip_windowed && l >= 0 && l < mid->n_layers) {
            kvq_layer_attn la;
            kvq_model_id_layer_attn(mid, l, &la);
            if (la.window > 0)
                continue;
        }
        int in_cap = kvq_capture_info_find_layer(c->ci, l) >= 0;
        int in_mom = kvq_moments_has_layer(c->m, l);
        if (p->layers && (!in_cap || !in_mom))
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "fit: layer %d is not in %s", (int)l,
                               !in_cap ? capture_dir : c->moments_path);
        if (!in_mom)
            return kvq_err_set(err, KVQ_E_MISMATCH, "fit: %s has no layer %d of %s (give "
                               "--layers to fit only the layers it has)", c->moments_path,
                               (int)l, capture_dir);
        int dup = 0;
        for (size_t t = 0; t < c->n_layers; t++)
            dup |= c->layers[t] == l;
        if (!dup)
            c->layers[c->n_layers++] = l;
    }
    if (c->n_layers == 0 && skip_windowed)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "fit: %s holds only sliding-window layers, "
                           "which need no codebook (capture a global layer, or give --layers)",
                           capture_dir);
    if (c->n_layers == 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "fit: %s and %s have no layer in common",
                           capture_dir, c->moments_path);
    qsort(c->layers, c->n_layers, sizeof *c->layers, kvq_cmp_i32);
    return KVQ_OK;
}

/* Marks the rows of a seeded sample of round(holdout * n_sequences) sequences (at least
 * one when holdout > 0, at most all but one). */
static kvq_status split_holdout(fit_ctx *c, kvq_err *err)
{
    const kvq_capture_info *ci = c->ci;
    const int64_t ns = ci->n_sequences;
    int64_t nh = (int64_t)llround(c->p->holdout * (double)ns);
    if (c->p->holdout > 0 && nh == 0)
        nh = 1;
    if (nh > ns - 1)
        nh = ns - 1;
    if (nh < 0)
        nh = 0;
    int64_t *idx = malloc((size_t)(ns ? ns : 1) * sizeof *idx);
    c->heldout = calloc((size_t)ci->n_tokens, 1);
    if (!idx || !c->heldout) {
        free(idx);
        return kvq_err_set(err, KVQ_E_NOMEM, "out of memory");
    }
    for (int64_t i = 0; i < ns; i++)
        idx[i] = i;
    kvq_rng rng;
    kvq_rng_seed(&rng, kvq_codebook_group_seed(c->p->seed, -2));
    for (int64_t i = 0; i < nh; i++) {
        int64_t t = i + (int64_t)kvq_rng_below(&rng, (uint64_t)(ns - i));
        int64_t tmp = idx[i];
        idx[i] = idx[t];
        idx[t] = tmp;
        const int64_t first = ci->sequences[2 * idx[i]], len = ci->sequences[2 * idx[i] + 1];
        for (int64_t r = first; r < first + len && r < ci->n_tokens; r++)
            c->heldout[r] = 1;
    }
    free(idx);
    c->n_hold_rows = 0;
    for (int64_t r = 0; r < ci->n_tokens; r++)
        c->n_hold_rows += c->heldout[r];
    c->n_train = ci->n_tokens - c->n_hold_rows;
    if (c->p->holdout > 0 && nh == 0)
        kvq_log(&c->cb, KVQ_LOG_WARN, "%s has one sequence: nothing to hold out, so no held-out "
                "score error", ci->dir);
    return KVQ_OK;
}

static kvq_status choose_k(fit_ctx *c, kvq_err *err)
{
    const int64_t n = c->n_train;
    if (c->p->codebook_size) {
        c->K = c->p->codebook_size;
        if (c->K > n)
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "fit: codebook size %d is larger than the "
                               "%lld training keys of %s", (int)c->K, (long long)n, c->ci->dir);
        if (n < (int64_t)FIT_MIN_POINTS * c->K)
            kvq_log(&c->cb, KVQ_LOG_WARN, "codebook size %d has only %.1f training keys per "
                    "centroid (%d or more recommended): the codebooks will be noisy", (int)c->K,
                    (double)n / c->K, FIT_MIN_POINTS);
        return KVQ_OK;
    }
    int32_t K = FIT_DEFAULT_K;
    while (K > 2 && (int64_t)FIT_MIN_POINTS * K > n)
        K /= 2;
    if (K > n)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "fit: %s has only %lld training keys, too "
                           "few for a codebook", c->ci->dir, (long long)n);
    if ((int64_t)FIT_MIN_POINTS * K > n)
        kvq_log(&c->cb, KVQ_LOG_WARN, "only %lld training keys: codebook size %d has fewer than "
                "%d per centroid", (long long)n, (int)K, FIT_MIN_POINTS);
    else if (K < FIT_DEFAULT_K)
        kvq_log(&c->cb, KVQ_LOG_INFO, "codebook size %d (the default %d needs %lld training "
                "keys, there are %lld)", (int)K, FIT_DEFAULT_K,
                (long long)FIT_MIN_POINTS * FIT_DEFAULT_K, (long long)n);
    c->K = K;
    return KVQ_OK;
}

/* ==========================================================================
 * The stage
 * ========================================================================== */

/* Opens the capture and the moments file and derives the run's shapes and device. */
static kvq_status fit_open(fit_ctx *c, const char *capture_dir, const char *moments_path,
                           kvq_err *err)
{
    const kvq_fit_params *p = c->p;
    kvq_status s;
    if ((s = kvq_capture_info_read(capture_dir, &c->ci, err)) ||
        (s = kvq_moments_open(moments_path, &c->m, err)) ||
        (s = kvq_moments_check_capture(c->m, c->ci, err)))
        return s;
    const kvq_model_id *id = &c->ci->model;
    c->d = id->head_dim;
    c->n_heads = id->n_heads;
    c->n_kv = id->n_kv_heads;
    c->r = c->n_heads / c->n_kv;
    c->G = p->groups ? p->groups : kvq_codebook_method_default_groups(p->method);
    c->wrope_b = kvq_moments_wrope_b(c->m);
    c->wrope_w = kvq_moments_wrope_w(c->m);
    if (c->d % c->G != 0 || c->G > c->d)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "fit: %d groups do not divide head dim %d",
                           (int)c->G, (int)c->d);
    c->ref_method = c->G > 1 ? KVQ_CODEBOOK_PQ : KVQ_CODEBOOK_VQ;
    c->ref_fit = p->method != KVQ_CODEBOOK_VQ && p->method != KVQ_CODEBOOK_PQ;
    c->device = p->device;
    if (c->device != KVQ_KMEANS_DEVICE_CPU) {
        const char *why = NULL;
        int have = kvq_cuda_available(&why);
        if (!have && c->device == KVQ_KMEANS_DEVICE_CUDA)
            kvq_log(&c->cb, KVQ_LOG_WARN, "CUDA requested but unavailable (%s); fitting on the "
                    "CPU", why ? why : "unknown reason");
        c->device = have ? KVQ_KMEANS_DEVICE_CUDA : KVQ_KMEANS_DEVICE_CPU;
    }
    return KVQ_OK;
}

/* The (layer, KV head) jobs i with mine[i] (NULL: every job) in order (job i is layer
 * c->layers[i / n_kv], head i % n_kv): from its checkpoint or fitted, one layer file
 * open at a time. */
kvq_status fit_run_jobs(fit_ctx *c, const uint8_t *mine, kvq_fit_summary *sum, kvq_err *err)
{
    layer_data L;
    kvq_status s = KVQ_OK;
    int32_t open_layer = -1;
    memset(&L, 0, sizeof L);
    c->jobs_prog = 0;
    for (int32_t i = 0; i < c->jobs_total; i++)
        c->jobs_prog += !mine || mine[i];
    for (int32_t i = 0; i < c->jobs_total; i++) {
        if (mine && !mine[i])
            continue;
        const int32_t layer = c->layers[i / c->n_kv], head = i % c->n_kv;
        {
            fit_job *j = &c->jobs[i];
            char key[1024];
            j->layer = layer;
            j->head = head;
            if ((s = fit_job_key(c, layer, head, key, sizeof key, err)))
                goto done;
            if (!fit_ckpt_load(c, j, key)) {
                if (L.f.st && open_layer != layer)
                    layer_close(&L);
                if (!L.f.st && (s = layer_open(c, layer, &L, err)))
                    goto done;
                open_layer = layer;
                if ((s = job_fit(c, &L, j, err)) ||
                    (c->ckpt_dir && (s = fit_ckpt_save(c, j, key, err))))
                    goto done;
            } else {
                sum->n_resumed++;
            }
            double m = fit_job_scalar(j, "score_mse"), r = fit_job_scalar(j, "ref.score_mse");
            if (isfinite(m) && isfinite(r))
                kvq_log(&c->cb, KVQ_LOG_INFO, "layer %d head %d: held-out score MSE %.4g, "
                        "reference %s %.4g (ratio %.3f)%s", (int)layer, (int)head, m,
                        kvq_codebook_method_name(c->ref_method), r, r > 0 ? m / r : NAN,
                        j->resumed ? " (checkpoint)" : "");
            else
                kvq_log(&c->cb, KVQ_LOG_INFO, "layer %d head %d: done%s", (int)layer, (int)head,
                        j->resumed ? " (checkpoint)" : "");
            c->jobs_done++;
            if (fit_progress(c)) {
                s = kvq_err_set(err, KVQ_E_CANCELLED, "fit: cancelled after %d of %d heads "
                                "(finished heads are kept in %s)", (int)c->jobs_done,
                                (int)c->jobs_prog, c->ckpt_dir ? c->ckpt_dir : "no checkpoint");
                goto done;
            }
        }
    }
done:
    layer_close(&L);
    return s;
}

static void fit_clean_job(const fit_ctx *c, const char *out_path)
{
    const size_t n = strlen(out_path) + 6;
    char *ck = malloc(n);
    if (ck)
        snprintf(ck, n, "%s.ckpt", out_path);
    const int k = kvq_output_clean_job(out_path, c->p->checkpoint ? ck : NULL);
    if (k)
        kvq_log(&c->cb, KVQ_LOG_INFO, "fit: removed %d temporaries of an earlier run of %s", k,
                out_path);
    free(ck);
}

/* Checks, opens the inputs, chooses layers, held-out rows and K, allocates the jobs. */
static kvq_status fit_setup(fit_ctx *c, const char *capture_dir, const char *moments_path,
                            const char *out_path, kvq_err *err)
{
    const kvq_fit_params *p = c->p;
    kvq_status s;
    if (!capture_dir || !moments_path || !out_path)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "fit: capture, moments and output are required");
    if ((s = check_params(p, err)))
        return s;
    /* rank 0 alone writes the output, so it alone checks it (and cleans its stale
     * temporaries); several ranks: every temporary of the output and of its checkpoints
     * (a killed rank's pid says nothing on another machine) */
    if (kvq_dist_rank(p->dist) == 0 && kvq_dist_size(p->dist) > 1)
        fit_clean_job(c, out_path);
    if (kvq_dist_rank(p->dist) == 0)
        fit_ckpt_clean_finished(out_path, &c->cb);
    if (kvq_dist_rank(p->dist) == 0 &&
        (s = kvq_output_check(out_path, p->overwrite, kvq_artifact_is_artifact,
                              "a .kvq artifact", err)))
        return s;
    if ((s = fit_open(c, capture_dir, moments_path, err)))
        return s;
    if ((s = choose_layers(c, capture_dir, err)) || (s = split_holdout(c, err)) ||
        (s = choose_k(c, err)))
        return s;

    c->jobs_total = (int32_t)(c->n_layers * (size_t)c->n_kv);
    c->jobs = calloc((size_t)c->jobs_total, sizeof *c->jobs);
    if (!c->jobs)
        return kvq_err_set(err, KVQ_E_NOMEM, "out of memory");
    if (p->checkpoint) {
        size_t n = strlen(out_path) + 6;
        c->ckpt_dir = malloc(n);
        if (!c->ckpt_dir)
            return kvq_err_set(err, KVQ_E_NOMEM, "out of memory");
        snprintf(c->ckpt_dir, n, "%s.ckpt", out_path);
    }
    kvq_log(&c->cb, KVQ_LOG_INFO, "fit: %s, K %d, G %d, %zu layers x %d KV heads, %lld training "
            "keys and %lld held-out keys per head", kvq_codebook_method_name(p->method),
            (int)c->K, (int)c->G, c->n_layers, (int)c->n_kv, (long long)c->n_train,
            (long long)c->n_hold_rows);
    if (kvq_progress(&c->cb, "fit", 0, (uint64_t)c->jobs_total))
        return kvq_err_set(err, KVQ_E_CANCELLED, "fit: cancelled");
    return KVQ_OK;
}

kvq_status kvq_fit_run(const char *capture_dir, const char *moments_path, const char *out_path,
                       const kvq_fit_params *params, kvq_fit_summary *summary, kvq_err *err)
{
    kvq_fit_params defaults = kvq_fit_params_default();
    const kvq_fit_params *p = params ? params : &defaults;
    fit_ctx c;
    kvq_fit_summary sum;
    kvq_status s;
    memset(&c, 0, sizeof c);
    memset(&sum, 0, sizeof sum);
    sum.score_mse = sum.score_mse_ref = sum.score_power = NAN;
    c.p = p;
    c.cb = p->cb;
    c.moments_path = moments_path;
    /* With several ranks every step below ends in agreement on its status, so that an
     * error on one rank stops all of them (kvq/dist.h); rank 0 alone writes. */
    s = kvq_dist_agree(p->dist, fit_setup(&c, capture_dir, moments_path, out_path, err), err);
    if (s)
        goto done;
    if (kvq_dist_size(p->dist) > 1)
        s = fit_dist_jobs(&c, &sum, err);
    else
        s = fit_run_jobs(&c, NULL, &sum, err);
    if (s)
        goto done;
    if (kvq_dist_rank(p->dist) == 0) {
        if (sum.n_resumed)
            kvq_log(&c.cb, KVQ_LOG_INFO, "resumed %d of %d heads from %s", (int)sum.n_resumed,
                    (int)c.jobs_total, c.ckpt_dir);
        if (!(s = fit_write_artifact(&c, out_path, &sum, err)) && c.ckpt_dir)
            kvq_rmtree(c.ckpt_dir);
    }
    if ((s = kvq_dist_share(p->dist, s, err)))
        goto done;
    sum.codebook_size = c.K;
    sum.groups = c.G;
    sum.n_train = c.n_train;
    sum.n_heldout_keys = c.n_hold_rows;
    for (int32_t i = 0; i < c.jobs_total; i++) {
        double q = fit_job_scalar(&c.jobs[i], "n_heldout_queries");
        if (isfinite(q) && (int64_t)q > sum.n_heldout_queries)
            sum.n_heldout_queries = (int64_t)q;
    }
    sum.n_jobs = c.jobs_total;
    if (summary)
        *summary = sum;
done:
    if (s && c.ckpt_dir && kvq_dist_rank(p->dist) == 0)
        rmdir(c.ckpt_dir); /* a failed run that saved nothing (a full disk) leaves no folder */
    for (int32_t i = 0; c.jobs && i < c.jobs_total; i++)
        fit_job_clear(&c.jobs[i]);
    free(c.jobs);
    free(c.layers);
    free(c.heldout);
    free(c.ckpt_dir);
    kvq_moments_close(c.m);
    kvq_capture_info_free(c.ci);
    return s;
}
