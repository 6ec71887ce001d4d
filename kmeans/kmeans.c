/*
 * kmeans.c — the k-means driver, written once for every backend:
 * check inputs -> subsample -> seed -> Lloyd (assign -> update -> repair empty
 * clusters) -> optional final assignment of all points, with stats per iteration.
 * Only assign and update go through the backend table (kmeans_internal.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kmeans/kmeans_internal.h"
#include "kmeans/kmeans_kernels.h"

/* Relative size of the perturbation that splits a cluster to refill an empty one
 * (faiss uses the same 1/1024). */
#define REPAIR_EPS (1.0 / 1024.0)

kvq_kmeans_params kvq_kmeans_params_default(void)
{
    kvq_kmeans_params p;
    memset(&p, 0, sizeof p);
    p.k = 256;
    p.max_iters = 25;
    p.tol = 1e-4;
    p.seed = 1234;
    p.threads = 1;
    p.init = KVQ_KMEANS_INIT_GREEDY_PP;
    p.greedy_trials = 0;
    p.parallel_rounds = 5;
    p.parallel_oversample = 2.0;
    p.max_points_per_centroid = 256;
    p.min_points_per_centroid = 39;
    p.seed_points_per_centroid = KVQ_KMEANS_SEED_PPC_DEFAULT;
    p.device = KVQ_KMEANS_DEVICE_CPU;
    p.label = NULL;
    return p;
}

void kvq_kmeans_stats_free(kvq_kmeans_stats *s)
{
    if (!s)
        return;
    free(s->inertia);
    free(s->iter_seconds);
    free(s->cluster_size);
    s->inertia = NULL;
    s->iter_seconds = NULL;
    s->cluster_size = NULL;
}

static const struct {
    const char *name;
    kvq_kmeans_init m;
} init_names[] = {
    {"greedy-k-means++", KVQ_KMEANS_INIT_GREEDY_PP}, {"k-means++", KVQ_KMEANS_INIT_PP},
    {"k-means||", KVQ_KMEANS_INIT_PARALLEL},         {"random", KVQ_KMEANS_INIT_RANDOM},
    {"given", KVQ_KMEANS_INIT_GIVEN},                {"greedy", KVQ_KMEANS_INIT_GREEDY_PP},
    {"kmeans++", KVQ_KMEANS_INIT_PP},                {"kmeans||", KVQ_KMEANS_INIT_PARALLEL},
    {"parallel", KVQ_KMEANS_INIT_PARALLEL},
};

const char *kvq_kmeans_init_name(kvq_kmeans_init m)
{
    for (size_t i = 0; i < sizeof init_names / sizeof init_names[0]; i++)
        if (init_names[i].m == m)
            return init_names[i].name;
    return "unknown";
}

kvq_status kvq_kmeans_init_parse(const char *s, kvq_kmeans_init *out, kvq_err *err)
{
    for (size_t i = 0; s && i < sizeof init_names / sizeof init_names[0]; i++)
        if (strcmp(s, init_names[i].name) == 0) {
            *out = init_names[i].m;
            return KVQ_OK;
        }
    return kvq_err_set(err, KVQ_E_INVALID_ARG,
                       "%s: unknown k-means init (greedy-k-means++, k-means++, k-means||, "
                       "random, given)", s ? s : "(null)");
}

/* ---- input checks ------------------------------------------------------------------- */

/* Every row finite, and its squared norm too (the SGEMM path needs ||x||^2). */
static kvq_status check_rows(const float *x, int64_t n, int32_t d, const char *what,
                             const char *label, kvq_err *err)
{
    for (int64_t i = 0; i < n; i++) {
        const float *r = x + (size_t)i * d;
        if (isfinite(kvq_km_norm2(r, d)))
            continue;
        for (int32_t j = 0; j < d; j++)
            if (!isfinite(r[j]))
                return kvq_err_set(err, KVQ_E_NUMERIC, "%s: %s row %lld col %d is %s", label,
                                   what, (long long)i, j, isnan(r[j]) ? "NaN" : "Inf");
        return kvq_err_set(err, KVQ_E_NUMERIC, "%s: %s row %lld: squared norm overflows",
                           label, what, (long long)i);
    }
    return KVQ_OK;
}

static kvq_status check_weights(const float *w, int64_t n, const char *label, kvq_err *err)
{
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(w[i]))
            return kvq_err_set(err, KVQ_E_NUMERIC, "%s: weight of row %lld is not finite",
                               label, (long long)i);
        if (w[i] < 0.0f)
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: weight of row %lld is negative",
                               label, (long long)i);
        total += w[i];
    }
    if (!(total > 0.0))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: the weights sum to zero", label);
    return KVQ_OK;
}

static kvq_status check_params(const kvq_kmeans_params *p, int64_t n, int32_t d,
                               const char *label, kvq_err *err)
{
    if (n < 1 || d < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: empty data (n=%lld, d=%d)", label,
                           (long long)n, d);
    if (p->k < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: k=%d must be >= 1", label, p->k);
    if (p->k > n)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: k=%d is larger than n=%lld points",
                           label, p->k, (long long)n);
    if (p->max_iters < 0 || !(p->tol >= 0.0) || p->threads < 1 || p->greedy_trials < 0 ||
        p->parallel_rounds < 1 || !(p->parallel_oversample > 0.0) ||
        p->max_points_per_centroid < 0 || p->min_points_per_centroid < 0 ||
        p->seed_points_per_centroid < 0 ||
        (int)p->init < 0 || (int)p->init > KVQ_KMEANS_INIT_GIVEN ||
        (int)p->device < 0 || (int)p->device > KVQ_KMEANS_DEVICE_CUDA)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "%s: bad k-means parameters (max_iters %d, tol %g, threads %d, "
                           "init %d, device %d)", label, p->max_iters, p->tol, p->threads,
                           (int)p->init, (int)p->device);
    size_t nd;
    if (!kvq_size_mul((size_t)n, (size_t)d, &nd) || !kvq_size_mul(nd, sizeof(float), &nd))
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: %lld x %d points", label, (long long)n,
                           d);
    return KVQ_OK;
}

/* ---- backend choice -------------------------------------------------------------------- */

static const kvq_km_backend *pick_backend(const kvq_kmeans_params *p, const char *label)
{
    if (p->device == KVQ_KMEANS_DEVICE_CPU)
        return &kvq_km_backend_cpu;
    const char *why = NULL;
    int have = kvq_cuda_available(&why);
#ifdef KVQ_HAVE_CUDA
    if (have)
        return &kvq_km_backend_cuda;
#else
    (void)have;
#endif
    if (p->device == KVQ_KMEANS_DEVICE_CUDA)
        kvq_log(&p->cb, KVQ_LOG_WARN, "%s: CUDA requested but unavailable (%s); using the CPU",
                label, why ? why : "no device");
    return &kvq_km_backend_cpu;
}

/* ---- subsampling ---------------------------------------------------------------------- */

kvq_status kvq_km_subsample(const float *x, const float *w, int64_t n, int32_t d, int64_t m,
                            uint64_t seed, const char *label, float **xs, float **ws,
                            kvq_err *err)
{
    kvq_status st = KVQ_OK;
    int64_t *idx = malloc((size_t)n * sizeof *idx);
    *xs = malloc((size_t)m * d * sizeof(float));
    *ws = w ? malloc((size_t)m * sizeof(float)) : NULL;
    if (!idx || !*xs || (w && !*ws)) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: subsample of %lld points", label,
                         (long long)m);
        goto done;
    }
    kvq_rng rng;
    kvq_rng_seed(&rng, kvq_km_mix64(seed ^ 0x5b5a3b1eULL));
    for (int64_t i = 0; i < n; i++)
        idx[i] = i;
    for (int64_t t = 0; t < m; t++) {
        int64_t j = t + (int64_t)kvq_rng_below(&rng, (uint64_t)(n - t));
        int64_t tmp = idx[t];
        idx[t] = idx[j];
        idx[j] = tmp;
    }
    qsort(idx, (size_t)m, sizeof *idx, kvq_cmp_i64);
    for (int64_t t = 0; t < m; t++) {
        memcpy(*xs + (size_t)t * d, x + (size_t)idx[t] * d, (size_t)d * sizeof(float));
        if (w)
            (*ws)[t] = w[idx[t]];
    }
done:
    free(idx);
    return st;
}

/* ---- empty-cluster repair ---------------------------------------------------------------- */

/* Every cluster with zero weight takes the place of half of the currently heaviest
 * cluster j: both centroids move REPAIR_EPS * (|c_jt| + sigma_j) apart along a
 * seeded random sign vector, sigma_j being the RMS spread per dim of cluster j
 * (so centroids at the origin still split). Returns the number of repairs. */
static int64_t repair_empty(float *cent, int32_t k, int32_t d, double *wsum, double *cin,
                            kvq_rng *rng)
{
    int64_t repairs = 0;
    for (int32_t c = 0; c < k; c++) {
        if (wsum[c] > 0.0)
            continue;
        int32_t j = 0;
        for (int32_t q = 1; q < k; q++)
            if (wsum[q] > wsum[j])
                j = q;
        if (!(wsum[j] > 0.0))
            break; /* cannot happen: the total weight is positive */
        const double sigma = sqrt(cin[j] / wsum[j] / d);
        float *cc = cent + (size_t)c * d, *cj = cent + (size_t)j * d;
        for (int32_t t = 0; t < d; t++) {
            const double delta = REPAIR_EPS * (fabs((double)cj[t]) + sigma);
            const double sign = (kvq_rng_u64(rng) >> 63) ? 1.0 : -1.0;
            const double base = cj[t];
            cc[t] = (float)(base + sign * delta);
            cj[t] = (float)(base - sign * delta);
        }
        wsum[c] = wsum[j] / 2;
        wsum[j] -= wsum[c];
        cin[c] = cin[j] / 2;
        cin[j] -= cin[c];
        repairs++;
    }
    return repairs;
}

/* ---- fit --------------------------------------------------------------------------------- */

/* Checks the inputs of kvq_kmeans_fit. */
static kvq_status fit_check(const float *x, int64_t n, int32_t d, const float *weights,
                            const float *centroids, const kvq_kmeans_params *p,
                            const char *label, kvq_err *err)
{
    kvq_status st;
    if (!x || !centroids)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: NULL data or centroids", label);
    if ((st = check_params(p, n, d, label, err)) != KVQ_OK)
        return st;
    if ((st = check_rows(x, n, d, "data", label, err)) != KVQ_OK)
        return st;
    if (weights && (st = check_weights(weights, n, label, err)) != KVQ_OK)
        return st;
    if (p->init == KVQ_KMEANS_INIT_GIVEN &&
        (st = check_rows(centroids, p->k, d, "initial centroid", label, err)) != KVQ_OK)
        return st;
    return KVQ_OK;
}

/* The training set: all n points, or a seeded subsample of p->max_points_per_centroid * k
 * of them (*xs, *ws: [m, d], [m], owned by the caller) when there are more. */
static kvq_status training_set(const float *x, const float *weights, int64_t n, int32_t d,
                               const kvq_kmeans_params *p, const char *label, const float **xt,
                               const float **wt, int64_t *m_out, float **xs, float **ws,
                               kvq_err *err)
{
    kvq_status st;
    const int32_t k = p->k;
    int64_t m = n;
    if (p->max_points_per_centroid > 0 && n / p->max_points_per_centroid >= k &&
        n > p->max_points_per_centroid * k) {
        m = p->max_points_per_centroid * k;
        kvq_log(&p->cb, KVQ_LOG_INFO, "%s: training on a seeded subsample of %lld of %lld points "
                "(%lld per centroid)", label, (long long)m, (long long)n,
                (long long)p->max_points_per_centroid);
        if ((st = kvq_km_subsample(x, weights, n, d, m, p->seed, label, xs, ws, err)) !=
            KVQ_OK)
            return st;
        *xt = *xs;
        *wt = *ws;
        *m_out = m;
        if (weights && (st = check_weights(*wt, m, label, err)) != KVQ_OK) {
            kvq_err_set(err, st, "%s: the subsample has zero total weight; raise "
                        "max_points_per_centroid", label);
            return st;
        }
    }
    return KVQ_OK;
}

/* Working buffers of the Lloyd iterations (m training points, k clusters). */
typedef struct lloyd_bufs {
    int32_t *a;                       /* [m] assignment of the training points */
    float *dist;                      /* [m] their squared distances */
    double *wsum, *cin;               /* [k] weight and inertia per cluster */
    int64_t *count;                   /* [k] points per cluster */
} lloyd_bufs;

static kvq_status lloyd_loop(const kvq_km_backend *be, void *ctx, kvq_km_bounds *bd,
                             const float *wt, int64_t m, int32_t d, const kvq_kmeans_params *p,
                             const kvq_km_fit_opts *o, const char *label, float *centroids,
                             const lloyd_bufs *b, kvq_kmeans_stats *s, kvq_err *err);

/* Lloyd iterations on the m training points xt (weights wt or NULL) from the seeded
 * centroids [k, d]: assign -> update -> repair empty clusters, until the relative
 * inertia change is below p->tol or p->max_iters. Fills the per-iteration stats. */
static kvq_status lloyd(const kvq_km_backend *be, void *ctx, const float *xt, const float *wt,
                        int64_t m, int32_t d, const kvq_kmeans_params *p,
                        const kvq_km_fit_opts *o, const char *label, float *centroids,
                        const lloyd_bufs *b, kvq_kmeans_stats *s, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    kvq_km_bounds *bd = NULL;
    const kvq_km_engine engine = o ? o->engine : KVQ_KM_ENGINE_BOUNDS;
    if (be == &kvq_km_backend_cpu && d > KVQ_KM_DIRECT_MAX_D &&
        engine != KVQ_KM_ENGINE_BACKEND && p->max_iters > 0 &&
        (o || kvq_km_bounds_fast()) &&
        (st = kvq_km_bounds_create(xt, m, d, p->k, p->threads,
                                   (engine == KVQ_KM_ENGINE_EXHAUSTIVE) |
                                       (o && o->no_first_filter ? 2 : 0),
                                   o ? o->groups : 0, &bd,
                                   err)) != KVQ_OK)
        return st;
    st = lloyd_loop(be, ctx, bd, wt, m, d, p, o, label, centroids, b, s, err);
    kvq_km_bounds_destroy(bd);
    return st;
}

/* The iterations of lloyd(): the assignment by the bounds state bd when there is one,
 * else by the backend. */
static kvq_status lloyd_loop(const kvq_km_backend *be, void *ctx, kvq_km_bounds *bd,
                             const float *wt, int64_t m, int32_t d, const kvq_kmeans_params *p,
                             const kvq_km_fit_opts *o, const char *label, float *centroids,
                             const lloyd_bufs *b, kvq_kmeans_stats *s, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    const int32_t k = p->k;
    int32_t *a = b->a;
    float *dist = b->dist;
    double *wsum = b->wsum, *cin = b->cin;
    int64_t *count = b->count;
    kvq_rng rng;
    kvq_rng_seed(&rng, kvq_km_mix64(p->seed ^ 0x7e9a12ULL));
    double prev = 0.0;
    for (int32_t it = 0; it < p->max_iters; it++) {
        const double t0 = kvq_now();
        double skipped = 0.0;
        if ((st = bd ? kvq_km_bounds_assign(bd, centroids, a, dist, &skipped, err)
                     : be->assign(ctx, centroids, k, a, dist, err)) != KVQ_OK)
            return st;
        if (o && o->skipped)
            o->skipped[it] = skipped;
        if (o && o->trace)
            o->trace(o->user, it, a, dist, m);
        double inertia = 0.0;
        memset(cin, 0, (size_t)k * sizeof *cin);
        memset(s->cluster_size, 0, (size_t)k * sizeof *s->cluster_size);
        for (int64_t i = 0; i < m; i++) {
            const double v = (wt ? (double)wt[i] : 1.0) * (double)dist[i];
            inertia += v;
            cin[a[i]] += v;
            s->cluster_size[a[i]]++;
        }
        s->inertia[it] = inertia;
        s->n_iters = it + 1;
        const int stop = inertia == 0.0 || (it > 0 && fabs(prev - inertia) < p->tol * prev);
        if (!stop) {
            if ((st = be->update(ctx, a, k, centroids, wsum, count, err)) != KVQ_OK)
                return st;
            int64_t r = repair_empty(centroids, k, d, wsum, cin, &rng);
            if (r > 0)
                kvq_log(&p->cb, KVQ_LOG_DEBUG, "%s: iteration %d: re-seeded %lld empty clusters",
                        label, it, (long long)r);
            s->n_empty_repairs += r;
        }
        s->iter_seconds[it] = kvq_now() - t0;
        kvq_log(&p->cb, KVQ_LOG_DEBUG, "%s: iteration %d inertia %.9g (%.3f s)", label, it,
                inertia, s->iter_seconds[it]);
        if (kvq_progress(&p->cb, "kmeans", (uint64_t)it + 1, (uint64_t)p->max_iters))
            return kvq_err_set(err, KVQ_E_CANCELLED, "%s: cancelled at iteration %d", label, it);
        if (stop) {
            s->converged = 1;
            break;
        }
        prev = inertia;
    }
    return KVQ_OK;
}

/* Final assignment of every one of the n points x to the centroids [k, d], and the
 * inertia over all of them. ctx holds the training points xt; when they are a subsample,
 * a context over all points is created in *ctx_all (the caller destroys it). */
static kvq_status final_assign(const kvq_km_backend *be, void *ctx, void **ctx_all,
                               const float *x, const float *weights, int64_t n, int32_t d,
                               const float *xt, const kvq_kmeans_params *p, const char *label,
                               const float *centroids, int32_t *assign, kvq_kmeans_stats *s,
                               kvq_err *err)
{
    kvq_status st;
    const int32_t k = p->k;
    void *c_all = ctx;
    float *dall = NULL;
    if (xt != x) {
        if ((st = be->create(x, weights, n, d, p->threads, ctx_all, err)) != KVQ_OK)
            return st;
        c_all = *ctx_all;
    }
    dall = malloc((size_t)n * sizeof *dall);
    if (!dall)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: final distances", label);
    st = be->assign(c_all, centroids, k, assign, dall, err);
    if (st == KVQ_OK) {
        double tot = 0.0;
        for (int64_t i = 0; i < n; i++)
            tot += (weights ? (double)weights[i] : 1.0) * (double)dall[i];
        s->inertia_final = tot;
    }
    free(dall);
    return st;
}

kvq_status kvq_kmeans_fit(const float *x, int64_t n, int32_t d, const float *weights,
                          const kvq_kmeans_params *pin, float *centroids, int32_t *assign,
                          kvq_kmeans_stats *stats, kvq_err *err)
{
    return kvq_km_fit_ex(x, n, d, weights, pin, NULL, centroids, assign, stats, err);
}

kvq_status kvq_km_fit_ex(const float *x, int64_t n, int32_t d, const float *weights,
                         const kvq_kmeans_params *pin, const kvq_km_fit_opts *o,
                         float *centroids, int32_t *assign, kvq_kmeans_stats *stats,
                         kvq_err *err)
{
    kvq_status st = KVQ_OK;
    const double t_start = kvq_now();
    const kvq_kmeans_params p = pin ? *pin : kvq_kmeans_params_default();
    const char *label = p.label ? p.label : "kmeans";
    const kvq_km_backend *be = NULL;
    void *ctx = NULL, *ctx_all = NULL;
    float *xs = NULL, *ws = NULL;     /* [m, d], [m]: the subsample, when taken */
    int32_t *a = NULL;                /* [m] assignment of the training points */
    float *dist = NULL;               /* [m] their squared distances */
    double *wsum = NULL, *cin = NULL; /* [k] weight and inertia per cluster */
    int64_t *count = NULL;            /* [k] points per cluster */
    int blas_prev = -1;
    kvq_kmeans_stats s;
    memset(&s, 0, sizeof s);
    s.inertia_final = -1.0;

    if ((st = fit_check(x, n, d, weights, centroids, &p, label, err)) != KVQ_OK)
        goto done;
    const int32_t k = p.k;
    if (p.min_points_per_centroid > 0 && n / p.min_points_per_centroid < k)
        kvq_log(&p.cb, KVQ_LOG_WARN,
                "%s: %lld points for k=%d is fewer than %lld per centroid; centroids will "
                "be noisy", label, (long long)n, k, (long long)p.min_points_per_centroid);

    /* training set: all points, or a seeded subsample of cap * k */
    const float *xt = x, *wt = weights;
    int64_t m = n;
    if ((st = training_set(x, weights, n, d, &p, label, &xt, &wt, &m, &xs, &ws, err)) != KVQ_OK)
        goto done;
    s.n_train = m;

    size_t kd;
    if (!kvq_size_mul((size_t)k, (size_t)d, &kd)) {
        st = kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: k x d", label);
        goto done;
    }
    a = malloc((size_t)m * sizeof *a);
    dist = malloc((size_t)m * sizeof *dist);
    wsum = calloc((size_t)k, sizeof *wsum);
    cin = calloc((size_t)k, sizeof *cin);
    count = calloc((size_t)k, sizeof *count);
    s.cluster_size = calloc((size_t)k, sizeof *s.cluster_size);
    s.inertia = calloc((size_t)p.max_iters + 1, sizeof *s.inertia);
    s.iter_seconds = calloc((size_t)p.max_iters + 1, sizeof *s.iter_seconds);
    if (!a || !dist || !wsum || !cin || !count || !s.cluster_size || !s.inertia ||
        !s.iter_seconds) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: k-means buffers (n=%lld, k=%d)", label,
                         (long long)m, k);
        goto done;
    }

    be = pick_backend(&p, label);
    s.backend = be->device;
    blas_prev = kvq_km_blas_threads_begin();
    if ((st = be->create(xt, wt, m, d, p.threads, &ctx, err)) != KVQ_OK)
        goto done;
    kvq_log(&p.cb, KVQ_LOG_DEBUG, "%s: k-means n=%lld d=%d k=%d init=%s backend=%s threads=%d",
            label, (long long)m, d, k, kvq_kmeans_init_name(p.init), be->name, p.threads);

    /* seeding */
    if (p.init != KVQ_KMEANS_INIT_GIVEN) {
        const double t0 = kvq_now();
        kvq_km_data data = {.x = xt, .w = wt, .n = m, .d = d,
                            .no_seed_filter = o && o->no_first_filter};
        if ((st = kvq_km_seed(&data, &p, be, ctx, centroids, err)) != KVQ_OK)
            goto done;
        s.seed_seconds = kvq_now() - t0;
    }

    /* Lloyd */
    const lloyd_bufs bufs = {a, dist, wsum, cin, count};
    if ((st = lloyd(be, ctx, xt, wt, m, d, &p, o, label, centroids, &bufs, &s, err)) !=
        KVQ_OK)
        goto done;

    /* final assignment of every point */
    if (assign && (st = final_assign(be, ctx, &ctx_all, x, weights, n, d, xt, &p, label,
                                     centroids, assign, &s, err)) != KVQ_OK)
        goto done;
    s.total_seconds = kvq_now() - t_start;
    kvq_log(&p.cb, KVQ_LOG_INFO, "%s: k-means k=%d: %d iterations, inertia %.6g, %lld repairs, "
            "%.2f s", label, k, s.n_iters, s.n_iters ? s.inertia[s.n_iters - 1] : 0.0,
            (long long)s.n_empty_repairs, s.total_seconds);
done:
    if (be) {
        be->destroy(ctx);
        be->destroy(ctx_all);
    }
    if (blas_prev >= 0)
        kvq_km_blas_threads_end(blas_prev);
    free(xs);
    free(ws);
    free(a);
    free(dist);
    free(wsum);
    free(cin);
    free(count);
    if (stats && st == KVQ_OK)
        *stats = s;
    else
        kvq_kmeans_stats_free(&s);
    return st;
}

/* ---- assign ------------------------------------------------------------------------------ */

kvq_status kvq_kmeans_assign(const float *x, int64_t n, int32_t d, const float *centroids,
                             const kvq_kmeans_params *pin, int32_t *assign, float *dist2,
                             kvq_err *err)
{
    kvq_status st = KVQ_OK;
    const kvq_kmeans_params p = pin ? *pin : kvq_kmeans_params_default();
    const char *label = p.label ? p.label : "kmeans";
    const kvq_km_backend *be = NULL;
    void *ctx = NULL;
    int blas_prev = -1;
    if (!x || !centroids || !assign || n < 1 || d < 1 || p.k < 1 || p.threads < 1) {
        st = kvq_err_set(err, KVQ_E_INVALID_ARG,
                         "%s: assign needs data, centroids, output, n, d, k, threads >= 1",
                         label);
        goto done;
    }
    size_t nb;
    if (!kvq_size_mul((size_t)n, (size_t)d, &nb) || !kvq_size_mul(nb, sizeof(float), &nb)) {
        st = kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: %lld x %d points", label, (long long)n, d);
        goto done;
    }
    if ((st = check_rows(centroids, p.k, d, "centroid", label, err)) != KVQ_OK ||
        (st = check_rows(x, n, d, "data", label, err)) != KVQ_OK)
        goto done;
    be = pick_backend(&p, label);
    blas_prev = kvq_km_blas_threads_begin();
    if ((st = be->create(x, NULL, n, d, p.threads, &ctx, err)) != KVQ_OK)
        goto done;
    st = be->assign(ctx, centroids, p.k, assign, dist2, err);
done:
    if (be)
        be->destroy(ctx);
    if (blas_prev >= 0)
        kvq_km_blas_threads_end(blas_prev);
    return st;
}
