/*
 * kmeans_seed.c — initial centroids: k-means++, greedy k-means++, k-means||, random.
 *
 * D^2 sampling draws point i with probability w_i D_i / sum_j w_j D_j, where D_i is
 * the squared distance to the nearest centroid chosen so far. D is updated by the
 * scalar reference distance (exact, no cancellation) in parallel over fixed blocks
 * of SEED_BLOCK points; the potential is the sum of per-block partial sums (double,
 * point order inside a block) taken in block order, so every draw is the same for
 * any thread count. k-means|| draws each point's coin from a counter-based hash of
 * (seed, round, point) for the same reason, and uses the backend's SGEMM assign.
 * BLAS is called from inside OpenMP regions: the caller runs this with OpenBLAS
 * single-threaded (kvq_km_blas_threads_begin).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <omp.h>

#include "kmeans/kmeans_internal.h"
#include "kmeans/kmeans_kernels.h"

#define SEED_BLOCK 4096
#define PROGRESS_EVERY 64

/* Working state of the D^2 samplers. */
typedef struct d2_state {
    const kvq_km_data *data;
    int32_t threads;
    int64_t nblocks;
    float *dmin;      /* [n] squared distance to the nearest chosen centroid */
    double *bsum;     /* [nblocks] sum of w_i dmin_i over each block */
} d2_state;

static inline double weight_at(const kvq_km_data *data, int64_t i)
{
    return data->w ? (double)data->w[i] : 1.0;
}

static double d2_total(const d2_state *s)
{
    double t = 0.0;
    for (int64_t b = 0; b < s->nblocks; b++)
        t += s->bsum[b];
    return t;
}

/* dmin = min(dmin, ||x_i - c||^2) (or = when init), then refresh the block sums. */
static void d2_update(d2_state *s, const float *c, int init)
{
    const kvq_km_data *data = s->data;
    const int32_t d = data->d;
#pragma omp parallel for num_threads(s->threads) schedule(dynamic, 1) if (s->nblocks > 1)
    for (int64_t b = 0; b < s->nblocks; b++) {
        const int64_t i1 = (b + 1) * SEED_BLOCK < data->n ? (b + 1) * SEED_BLOCK : data->n;
        double sum = 0.0;
        for (int64_t i = b * SEED_BLOCK; i < i1; i++) {
            float v = kvq_km_l2sq(data->x + (size_t)i * d, c, d);
            if (init || v < s->dmin[i])
                s->dmin[i] = v;
            sum += weight_at(data, i) * (double)s->dmin[i];
        }
        s->bsum[b] = sum;
    }
}

/* Index of the point where the running sum of w_i dmin_i first exceeds u * total.
 * Sums are re-formed in the order the block sums were, so the walk is consistent.
 * With total == 0 (every point sits on a centroid) a uniform point is returned. */
static int64_t d2_draw(const d2_state *s, double total, double u, kvq_rng *rng)
{
    const kvq_km_data *data = s->data;
    if (!(total > 0.0))
        return (int64_t)kvq_rng_below(rng, (uint64_t)data->n);
    const double target = u * total;
    double cum = 0.0;
    int64_t b = 0;
    for (; b < s->nblocks - 1; b++) {
        if (cum + s->bsum[b] > target)
            break;
        cum += s->bsum[b];
    }
    const int64_t i1 = (b + 1) * SEED_BLOCK < data->n ? (b + 1) * SEED_BLOCK : data->n;
    int64_t last_pos = -1;
    double run = 0.0;
    for (int64_t i = b * SEED_BLOCK; i < i1; i++) {
        double m = weight_at(data, i) * (double)s->dmin[i];
        if (m > 0.0)
            last_pos = i;
        run += m;
        if (m > 0.0 && cum + run > target)
            return i;
    }
    /* rounding put the target past this block's last positive mass */
    if (last_pos >= 0)
        return last_pos;
    for (int64_t i = data->n - 1; i >= 0; i--)
        if (weight_at(data, i) * (double)s->dmin[i] > 0.0)
            return i;
    return (int64_t)kvq_rng_below(rng, (uint64_t)data->n);
}

/* First centroid: a point drawn with probability proportional to its weight. */
static int64_t draw_first(const kvq_km_data *data, kvq_rng *rng)
{
    if (!data->w)
        return (int64_t)kvq_rng_below(rng, (uint64_t)data->n);
    double total = 0.0;
    for (int64_t i = 0; i < data->n; i++)
        total += data->w[i];
    const double target = kvq_rng_uniform(rng) * total;
    double run = 0.0;
    int64_t last = 0;
    for (int64_t i = 0; i < data->n; i++) {
        if (data->w[i] > 0.0f)
            last = i;
        run += data->w[i];
        if (data->w[i] > 0.0f && run > target)
            return i;
    }
    return last;
}

static kvq_status d2_init(d2_state *s, const kvq_km_data *data, int32_t threads,
                          const char *label, kvq_err *err)
{
    memset(s, 0, sizeof *s);
    s->data = data;
    s->threads = threads;
    s->nblocks = (data->n + SEED_BLOCK - 1) / SEED_BLOCK;
    size_t nb;
    if (kvq_size_mul((size_t)data->n, sizeof(float), &nb))
        s->dmin = malloc(nb ? nb : 1);
    s->bsum = calloc((size_t)s->nblocks + 1, sizeof(double));
    if (!s->dmin || !s->bsum)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: seeding state for %lld points", label,
                           (long long)data->n);
    return KVQ_OK;
}

static void d2_free(d2_state *s)
{
    free(s->dmin);
    free(s->bsum);
}

static const char *label_of(const kvq_kmeans_params *p)
{
    return p->label ? p->label : "kmeans";
}

static kvq_status seed_progress(const kvq_kmeans_params *p, int64_t done, int64_t total,
                                kvq_err *err)
{
    if (kvq_progress(&p->cb, "kmeans-seed", (uint64_t)done, (uint64_t)total))
        return kvq_err_set(err, KVQ_E_CANCELLED, "%s: seeding cancelled", label_of(p));
    return KVQ_OK;
}

/* ---- k-means++ (exact and greedy) ---------------------------------------------------- */

/* Chooses k centroids by D^2 sampling; trials > 1 is greedy k-means++: draw `trials`
 * candidates per step and keep the one whose addition lowers the potential most.
 * The candidates' potentials come from SGEMM distances (one [block, trials] product
 * per block of points); D itself is kept with the scalar reference distance. */
static kvq_status seed_pp(const kvq_km_data *data, const kvq_kmeans_params *p, int32_t k,
                          int32_t trials, uint64_t seed, float *cent, kvq_err *err)
{
    kvq_status st;
    const int32_t d = data->d;
    const int threads = p->threads;
    const char *label = label_of(p);
    d2_state s;
    kvq_rng rng;
    int64_t *cand = NULL;   /* [trials] candidate point indices */
    float *cx = NULL;       /* [trials, d] candidate rows */
    float *cnrm = NULL;     /* [trials] their squared norms */
    float *xnorm = NULL;    /* [n] squared norms of the points */
    float *dot = NULL;      /* [threads, SEED_BLOCK, trials] x.c blocks */
    double *part = NULL;    /* [nblocks, trials] per-block potentials */
    kvq_rng_seed(&rng, seed);
    st = d2_init(&s, data, threads, label, err);
    if (st != KVQ_OK)
        goto done;
    if (trials > 1) {
        cand = calloc((size_t)trials, sizeof *cand);
        cx = malloc((size_t)trials * d * sizeof *cx);
        cnrm = malloc((size_t)trials * sizeof *cnrm);
        xnorm = malloc((size_t)data->n * sizeof *xnorm);
        dot = malloc((size_t)threads * SEED_BLOCK * trials * sizeof *dot);
        part = calloc((size_t)s.nblocks * (size_t)trials, sizeof *part);
        if (!cand || !cx || !cnrm || !xnorm || !dot || !part) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "%s: greedy seeding buffers", label);
            goto done;
        }
#pragma omp parallel for num_threads(threads) schedule(static) if (data->n > SEED_BLOCK)
        for (int64_t i = 0; i < data->n; i++)
            xnorm[i] = kvq_km_norm2(data->x + (size_t)i * d, d);
    }

    int64_t first = draw_first(data, &rng);
    memcpy(cent, data->x + (size_t)first * d, (size_t)d * sizeof(float));
    d2_update(&s, cent, 1);

    for (int32_t t = 1; t < k; t++) {
        const double total = d2_total(&s);
        int64_t pick;
        if (trials <= 1) {
            pick = d2_draw(&s, total, kvq_rng_uniform(&rng), &rng);
        } else {
            for (int32_t c = 0; c < trials; c++) {
                cand[c] = d2_draw(&s, total, kvq_rng_uniform(&rng), &rng);
                memcpy(cx + (size_t)c * d, data->x + (size_t)cand[c] * d,
                       (size_t)d * sizeof(float));
                cnrm[c] = xnorm[cand[c]];
            }
            /* potential after adding each candidate, per block then in block order */
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (s.nblocks > 1)
            for (int64_t b = 0; b < s.nblocks; b++) {
                const int64_t i0 = b * SEED_BLOCK;
                const int64_t nr = data->n - i0 < SEED_BLOCK ? data->n - i0 : SEED_BLOCK;
                float *sb = dot + (size_t)omp_get_thread_num() * SEED_BLOCK * trials;
                double *pb = part + (size_t)b * trials;
                /* sb [nr, trials] = X[i0 : i0 + nr] cx^T */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, trials, d, 1.0f,
                            data->x + (size_t)i0 * d, d, cx, d, 0.0f, sb, trials);
                for (int32_t c = 0; c < trials; c++)
                    pb[c] = 0.0;
                for (int64_t r = 0; r < nr; r++) {
                    const int64_t i = i0 + r;
                    const double wi = weight_at(data, i);
                    for (int32_t c = 0; c < trials; c++) {
                        float v = kvq_km_dist_from_dot(xnorm[i], cnrm[c], sb[r * trials + c]);
                        pb[c] += wi * (double)(v < s.dmin[i] ? v : s.dmin[i]);
                    }
                }
            }
            int32_t best = 0;
            double best_pot = INFINITY;
            for (int32_t c = 0; c < trials; c++) {
                double pot = 0.0;
                for (int64_t b = 0; b < s.nblocks; b++)
                    pot += part[(size_t)b * trials + c];
                if (pot < best_pot) {
                    best_pot = pot;
                    best = c;
                }
            }
            pick = cand[best];
        }
        float *ct = cent + (size_t)t * d;
        memcpy(ct, data->x + (size_t)pick * d, (size_t)d * sizeof(float));
        d2_update(&s, ct, 0);
        if (t % PROGRESS_EVERY == 0 && (st = seed_progress(p, t, k, err)) != KVQ_OK)
            goto done;
    }
done:
    d2_free(&s);
    free(cand);
    free(cx);
    free(cnrm);
    free(xnorm);
    free(dot);
    free(part);
    return st;
}

/* ---- random ------------------------------------------------------------------------ */

/* k distinct points, uniformly (weights ignored), by a partial Fisher-Yates shuffle. */
static kvq_status seed_random(const kvq_km_data *data, int32_t k, uint64_t seed,
                              const char *label, float *cent, kvq_err *err)
{
    size_t nb;
    int64_t *idx = NULL;
    if (kvq_size_mul((size_t)data->n, sizeof *idx, &nb))
        idx = malloc(nb);
    if (!idx)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: random seeding of %lld points", label,
                           (long long)data->n);
    kvq_rng rng;
    kvq_rng_seed(&rng, seed);
    for (int64_t i = 0; i < data->n; i++)
        idx[i] = i;
    for (int32_t t = 0; t < k; t++) {
        int64_t j = t + (int64_t)kvq_rng_below(&rng, (uint64_t)(data->n - t));
        int64_t tmp = idx[t];
        idx[t] = idx[j];
        idx[j] = tmp;
        memcpy(cent + (size_t)t * data->d, data->x + (size_t)idx[t] * data->d,
               (size_t)data->d * sizeof(float));
    }
    free(idx);
    return KVQ_OK;
}

/* ---- k-means|| ------------------------------------------------------------------------ */

/* Bahmani et al. 2012: start from one weighted-uniform point; each round keeps
 * point i with probability min(1, l w_i D_i / psi), l = oversample * k; then every
 * candidate is weighted by the total weight of the points nearest to it, and
 * weighted k-means++ on the candidates picks the k centroids. */
static kvq_status seed_parallel(const kvq_km_data *data, const kvq_kmeans_params *p,
                                int32_t k, uint64_t seed, const kvq_km_backend *be,
                                void *ctx, float *cent, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    const int32_t d = data->d;
    const int64_t n = data->n;
    const char *label = label_of(p);
    const double ell = p->parallel_oversample * (double)k;
    d2_state s;
    kvq_rng rng;
    int64_t *cidx = NULL;   /* [cap] candidate point indices, in order of choice */
    int32_t *owner = NULL;  /* [n] nearest candidate of each point */
    int32_t *a_new = NULL;  /* [n] nearest among this round's candidates */
    float *d_new = NULL;    /* [n] distance to it */
    float *cx = NULL;       /* [m, d] candidate rows */
    float *cw = NULL;       /* [m] candidate weights */
    unsigned char *mark = NULL; /* [n] drawn this round */
    int64_t m = 0, cap = 0;
    kvq_rng_seed(&rng, seed);

    st = d2_init(&s, data, p->threads, label, err);
    if (st != KVQ_OK)
        goto done;
    owner = calloc((size_t)n, sizeof *owner);
    a_new = calloc((size_t)n, sizeof *a_new);
    d_new = calloc((size_t)n, sizeof *d_new);
    mark = calloc((size_t)n, 1);
    cap = 1 + (int64_t)ceil(ell * 1.5) * p->parallel_rounds + 16;
    if (cap > n)
        cap = n;
    cidx = malloc((size_t)cap * sizeof *cidx);
    if (!owner || !a_new || !d_new || !mark || !cidx) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: k-means|| buffers for %lld points", label,
                         (long long)n);
        goto done;
    }

    cidx[m++] = draw_first(data, &rng);
    d2_update(&s, data->x + (size_t)cidx[0] * d, 1);

    for (int32_t r = 0; r < p->parallel_rounds; r++) {
        const double psi = d2_total(&s);
        if (!(psi > 0.0))
            break;
#pragma omp parallel for num_threads(p->threads) schedule(static) if (n > SEED_BLOCK)
        for (int64_t i = 0; i < n; i++) {
            double pi = ell * weight_at(data, i) * (double)s.dmin[i] / psi;
            mark[i] = s.dmin[i] > 0.0f && kvq_km_uniform_at(seed, (uint64_t)r + 1, (uint64_t)i) < pi;
        }
        const int64_t base = m;
        for (int64_t i = 0; i < n; i++) {
            if (!mark[i])
                continue;
            if (m == cap) { /* far above the expected count: grow */
                int64_t ncap = cap * 2 < n ? cap * 2 : n;
                int64_t *t = realloc(cidx, (size_t)ncap * sizeof *t);
                if (!t) {
                    st = kvq_err_set(err, KVQ_E_NOMEM, "%s: k-means|| candidates", label);
                    goto done;
                }
                cidx = t;
                cap = ncap;
            }
            cidx[m++] = i;
        }
        const int64_t nnew = m - base;
        if (nnew == 0)
            continue;
        if (nnew > INT32_MAX) {
            st = kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: k-means|| round too large", label);
            goto done;
        }
        free(cx);
        cx = malloc((size_t)nnew * d * sizeof *cx);
        if (!cx) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "%s: k-means|| candidates", label);
            goto done;
        }
        for (int64_t c = 0; c < nnew; c++)
            memcpy(cx + (size_t)c * d, data->x + (size_t)cidx[base + c] * d,
                   (size_t)d * sizeof(float));
        st = be->assign(ctx, cx, (int32_t)nnew, a_new, d_new, err);
        if (st != KVQ_OK)
            goto done;
        /* fold the new distances in; block sums in block order as in d2_update */
#pragma omp parallel for num_threads(p->threads) schedule(dynamic, 1) if (s.nblocks > 1)
        for (int64_t b = 0; b < s.nblocks; b++) {
            const int64_t i1 = (b + 1) * SEED_BLOCK < n ? (b + 1) * SEED_BLOCK : n;
            double sum = 0.0;
            for (int64_t i = b * SEED_BLOCK; i < i1; i++) {
                if (d_new[i] < s.dmin[i]) {
                    s.dmin[i] = d_new[i];
                    owner[i] = (int32_t)(base + a_new[i]);
                }
                if (mark[i]) /* a candidate is its own nearest */
                    s.dmin[i] = 0.0f;
                sum += weight_at(data, i) * (double)s.dmin[i];
            }
            s.bsum[b] = sum;
        }
        if ((st = seed_progress(p, r + 1, p->parallel_rounds, err)) != KVQ_OK)
            goto done;
    }

    if (m <= k) {
        /* too few distinct candidates (tiny or degenerate data): plain k-means++ */
        kvq_log(&p->cb, KVQ_LOG_DEBUG,
                "%s: k-means|| found %lld candidates for k=%d; using k-means++", label,
                (long long)m, k);
        st = seed_pp(data, p, k, 1, kvq_km_mix64(seed ^ 0x5eedULL), cent, err);
        goto done;
    }
    if (m > INT32_MAX) {
        st = kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: k-means|| candidates", label);
        goto done;
    }
    free(cx);
    cx = malloc((size_t)m * d * sizeof *cx);
    cw = calloc((size_t)m, sizeof *cw);
    double *cwd = calloc((size_t)m, sizeof *cwd);
    if (!cx || !cw || !cwd) {
        free(cwd);
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: k-means|| candidates", label);
        goto done;
    }
    for (int64_t c = 0; c < m; c++)
        memcpy(cx + (size_t)c * d, data->x + (size_t)cidx[c] * d, (size_t)d * sizeof(float));
    /* owner[] is only updated on a strict improvement: candidates keep their own
     * index because they had distance 0 when chosen. Points never improved by a
     * round belong to candidate 0 (calloc). */
    for (int64_t c = 0; c < m; c++)
        owner[cidx[c]] = (int32_t)c;
    for (int64_t i = 0; i < n; i++)
        cwd[owner[i]] += weight_at(data, i);
    for (int64_t c = 0; c < m; c++)
        cw[c] = (float)cwd[c];
    free(cwd);
    kvq_log(&p->cb, KVQ_LOG_DEBUG, "%s: k-means|| reduced %lld points to %lld candidates",
            label, (long long)n, (long long)m);
    {
        kvq_km_data cand = {.x = cx, .w = cw, .n = m, .d = d};
        st = seed_pp(&cand, p, k, 1, kvq_km_mix64(seed ^ 0xca11ULL), cent, err);
    }
done:
    d2_free(&s);
    free(cidx);
    free(owner);
    free(a_new);
    free(d_new);
    free(mark);
    free(cx);
    free(cw);
    return st;
}

/* ---- entry points ---------------------------------------------------------------------- */

kvq_status kvq_km_seed(const kvq_km_data *data, const kvq_kmeans_params *p,
                       const kvq_km_backend *be, void *ctx, float *cent, kvq_err *err)
{
    const int32_t k = p->k;
    const uint64_t seed = kvq_km_mix64(p->seed ^ 0x6b6d65616e73ULL); /* "kmeans" */
    switch (p->init) {
    case KVQ_KMEANS_INIT_PP:
        return seed_pp(data, p, k, 1, seed, cent, err);
    case KVQ_KMEANS_INIT_GREEDY_PP: {
        int32_t trials = p->greedy_trials > 0 ? p->greedy_trials
                                              : 2 + (int32_t)floor(log((double)k));
        return seed_pp(data, p, k, trials, seed, cent, err);
    }
    case KVQ_KMEANS_INIT_PARALLEL:
        return seed_parallel(data, p, k, seed, be, ctx, cent, err);
    case KVQ_KMEANS_INIT_RANDOM:
        return seed_random(data, k, seed, label_of(p), cent, err);
    case KVQ_KMEANS_INIT_GIVEN:
        break;
    }
    return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: no seeding for init method %d",
                       label_of(p), (int)p->init);
}

double kvq_km_potential_ref(const kvq_km_data *data, const float *cent, int32_t k,
                            int32_t threads)
{
    const int64_t nblocks = (data->n + SEED_BLOCK - 1) / SEED_BLOCK;
    double *bs = calloc((size_t)nblocks + 1, sizeof *bs);
    if (!bs)
        return NAN;
    const int32_t d = data->d;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(dynamic, 1) if (nblocks > 1)
    for (int64_t b = 0; b < nblocks; b++) {
        const int64_t i1 = (b + 1) * SEED_BLOCK < data->n ? (b + 1) * SEED_BLOCK : data->n;
        double sum = 0.0;
        for (int64_t i = b * SEED_BLOCK; i < i1; i++) {
            float best = INFINITY;
            for (int32_t j = 0; j < k; j++) {
                float v = kvq_km_l2sq(data->x + (size_t)i * d, cent + (size_t)j * d, d);
                if (v < best)
                    best = v;
            }
            sum += weight_at(data, i) * (double)best;
        }
        bs[b] = sum;
    }
    double t = 0.0;
    for (int64_t b = 0; b < nblocks; b++)
        t += bs[b];
    free(bs);
    return t;
}
