/*
 * kmeans_seed.c — initial centroids: k-means++, greedy k-means++, k-means||, random.
 *
 * The D^2 methods run on a seeded subsample of seed_points_per_centroid * k points of
 * the training set (all of it when smaller), so their cost grows with k^2, not n k.
 *
 * D^2 sampling draws point i with probability w_i D_i / sum_j w_j D_j, where D_i is
 * the squared distance to the nearest centroid chosen so far. (Greedy) k-means++ keeps
 * D with the candidate kernel kvq_km_cand_eval_* (below; AVX-512 / AVX2 / scalar, all
 * equal bit for bit): every step evaluates all of its candidates in one pass over the
 * points, in fixed blocks of DRAW_BLOCK points, and the winner's distances from that
 * pass update D. Block sums are kept in double and added in block order, so every draw
 * is the same for any thread count. k-means|| draws each point's coin from a
 * counter-based hash of (seed, round, point) for the same reason, and uses the
 * backend's assign for its distance passes. BLAS is called from inside OpenMP regions:
 * the caller runs this with OpenBLAS single-threaded (kvq_km_blas_threads_begin).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "kmeans/kmeans_internal.h"
#include "kmeans/kmeans_kernels.h"

#define DRAW_BLOCK 256 /* points per block of D sums, draws and kernel calls */
#define PROGRESS_EVERY 64
#define LANES KVQ_KM_CAND_LANES

/* ---- the candidate kernel, scalar reference ------------------------------------------ */

float kvq_km_norm2_fma(const float *a, int32_t d)
{
    float s = 0.0f;
    for (int32_t j = 0; j < d; j++)
        s = fmaf(a[j], a[j], s);
    return s;
}

void kvq_km_cand_eval_ref(const float *xi, const float *xn, const float *w, const float *dmin,
                          int64_t ntiles, int32_t d, int32_t P, const float *ct,
                          const float *cn, float *dist, double *pot)
{
    for (int64_t g = 0; g < ntiles; g++)
        for (int l = 0; l < LANES; l++) {
            const int64_t i = g * P + l % P;
            const float *xg = xi + (size_t)g * d * P + l % P;
            float dot = 0.0f;
            for (int32_t j = 0; j < d; j++)
                dot = fmaf(xg[(size_t)j * P], ct[(size_t)j * LANES + l], dot);
            const float v = kvq_km_dist_from_dot(xn[i], cn[l], dot);
            dist[(size_t)g * LANES + l] = v;
            pot[l] += (double)w[i] * (double)(v < dmin[i] ? v : dmin[i]);
        }
}

typedef void (*cand_eval_fn)(const float *, const float *, const float *, const float *,
                             int64_t, int32_t, int32_t, const float *, const float *, float *,
                             double *);

/* The fastest kernel on this CPU (all give the same bits). */
static cand_eval_fn pick_cand_eval(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (kvq_cpu_has_avx512())
        return kvq_km_cand_eval_avx512;
    if (kvq_cpu_has_avx2())
        return kvq_km_cand_eval_avx2;
#endif
    return kvq_km_cand_eval_ref;
}

/* AVX-512 BF16 (the seeding's and the first pass's filters). Here, not in an *_avx512.c
 * file, because every machine calls it. */
int kvq_km_seed_bf16_ok(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return kvq_cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

/* ---- D^2 state --------------------------------------------------------------------- */

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

static inline int64_t block_end(const kvq_km_data *data, int64_t b)
{
    return (b + 1) * DRAW_BLOCK < data->n ? (b + 1) * DRAW_BLOCK : data->n;
}

static double d2_total(const d2_state *s)
{
    double t = 0.0;
    for (int64_t b = 0; b < s->nblocks; b++)
        t += s->bsum[b];
    return t;
}

/* dmin = ||x_i - c||^2 by the scalar reference, then the block sums (k-means||). */
static void d2_init_dist(d2_state *s, const float *c)
{
    const kvq_km_data *data = s->data;
    const int32_t d = data->d;
#pragma omp parallel for num_threads(s->threads) schedule(dynamic, 1) if (s->nblocks > 1)
    for (int64_t b = 0; b < s->nblocks; b++) {
        double sum = 0.0;
        for (int64_t i = b * DRAW_BLOCK; i < block_end(data, b); i++) {
            s->dmin[i] = kvq_km_l2sq(data->x + (size_t)i * d, c, d);
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
    int64_t last_pos = -1;
    double run = 0.0;
    for (int64_t i = b * DRAW_BLOCK; i < block_end(data, b); i++) {
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
    s->nblocks = (data->n + DRAW_BLOCK - 1) / DRAW_BLOCK;
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

/* Buffers of one (greedy) k-means++ run over n points, in tiles of P points
 * (kvq_km_cand_eval_ref); npad = n rounded up to P, padding points are zero. */
typedef struct pp_work {
    int32_t P;       /* points per tile: 16 / (candidates per chunk, rounded up to 2^i) */
    int32_t threads; /* threads of the per-step loops */
    int64_t npad;
    int64_t *cand;   /* [trials] candidate point indices */
    float *ct;       /* [d, LANES] candidates of one chunk, by lane */
    float *cn;       /* [LANES] their squared norms, by lane */
    float *xi;       /* [npad / P, d, P] the points, interleaved */
    float *xnorm;    /* [npad] squared norms of the points (kvq_km_norm2_fma) */
    float *wt;       /* [npad] weights (1 when the data has none; 0 for padding) */
    float *dmin;     /* [npad] D; the padding stays 0 */
    float *dist;     /* [npad / P, LANES] distances to the chunk's candidates */
    float *dbest;    /* [n] distances to the best candidate so far (trials > LANES) */
    double *part;    /* [nblocks, LANES] per-block potentials of the chunk */
    cand_eval_fn eval;
    /* the bf16 filter (kvq_km_cand_eval_bf16_avx512), when f.xb is set */
    kvq_km_cand_bf16 f;
    uint16_t *xb;    /* [npad / P, dp / 2, P, 2] bf16 of x - mu */
    float *bn, *yr;  /* [npad] */
    uint16_t *cb;    /* [dp / 2, LANES, 2] */
    float bnc[LANES], zr[LANES];
    int64_t exact_tiles, all_tiles; /* tiles computed in f32, tiles evaluated */
} pp_work;

/* The filter's lanes for candidates cand [nt]: their bf16 rows, bn and yr. */
static void bf16_chunk(pp_work *w, const int64_t *cand, int32_t nt)
{
    const int32_t P = w->P, dh = w->f.dp / 2;
    memset(w->cb, 0, (size_t)dh * LANES * 2 * sizeof *w->cb);
    uint32_t live = 0;
    for (int l = 0; l < LANES; l++) {
        w->bnc[l] = 0.0f;
        w->zr[l] = 0.0f;
        if (l / P >= nt)
            continue;
        const int64_t c = cand[l / P], g = c / P, q = c % P;
        const uint16_t *src = w->xb + ((size_t)g * dh * P + (size_t)q) * 2;
        for (int32_t j = 0; j < dh; j++) {
            w->cb[((size_t)j * LANES + l) * 2] = src[(size_t)j * P * 2];
            w->cb[((size_t)j * LANES + l) * 2 + 1] = src[(size_t)j * P * 2 + 1];
        }
        w->bnc[l] = w->bn[c];
        w->zr[l] = w->yr[c];
        live |= 1u << l;
    }
    w->f.live = live;
}

/* Distances of every point to candidates cand [nt] (nt <= LANES / w->P) into w->dist,
 * and per-block potentials with them into w->part. */
static void eval_chunk(const d2_state *s, pp_work *w, const int64_t *cand, int32_t nt)
{
    const kvq_km_data *data = s->data;
    const int32_t d = data->d, P = w->P;
    memset(w->ct, 0, (size_t)d * LANES * sizeof *w->ct);
    memset(w->cn, 0, LANES * sizeof *w->cn);
    for (int l = 0; l < LANES && l / P < nt; l++) {
        const int64_t c = cand[l / P];
        for (int32_t j = 0; j < d; j++)
            w->ct[(size_t)j * LANES + l] = data->x[(size_t)c * d + j];
        w->cn[l] = w->xnorm[c];
    }
    if (w->xb)
        bf16_chunk(w, cand, nt);
    int64_t exact = 0;
#pragma omp parallel for num_threads(w->threads) schedule(dynamic, 1) if (w->threads > 1) reduction(+ : exact)
    for (int64_t b = 0; b < s->nblocks; b++) {
        const int64_t g0 = b * DRAW_BLOCK / P;
        const int64_t g1 = (block_end(data, b) + P - 1) / P;
        double *pb = w->part + (size_t)b * LANES;
        for (int l = 0; l < LANES; l++)
            pb[l] = 0.0;
#if defined(__x86_64__) && defined(__GNUC__)
        if (w->xb) {
            kvq_km_cand_bf16 f = w->f;
            f.xb = w->xb + (size_t)g0 * w->f.dp * P;
            f.bn = w->bn + g0 * P;
            f.yr = w->yr + g0 * P;
            exact += kvq_km_cand_eval_bf16_avx512(
                w->xi + (size_t)g0 * d * P, w->xnorm + g0 * P, w->wt + g0 * P,
                w->dmin + g0 * P, g1 - g0, d, P, w->ct, w->cn, &f,
                w->dist + (size_t)g0 * LANES, pb);
            continue;
        }
#endif
        w->eval(w->xi + (size_t)g0 * d * P, w->xnorm + g0 * P, w->wt + g0 * P,
                w->dmin + g0 * P, g1 - g0, d, P, w->ct, w->cn, w->dist + (size_t)g0 * LANES,
                pb);
    }
    w->exact_tiles += exact;
    w->all_tiles += w->npad / P;
}

/* Potential after adding candidate t of the last chunk: its lanes of every block. */
static double chunk_pot(const d2_state *s, const pp_work *w, int32_t t)
{
    double pot = 0.0;
    for (int64_t b = 0; b < s->nblocks; b++)
        for (int32_t p = 0; p < w->P; p++)
            pot += w->part[(size_t)b * LANES + t * w->P + p];
    return pot;
}

/* Distance of point i to candidate t of the last chunk. */
static inline float chunk_dist(const pp_work *w, int64_t i, int32_t t)
{
    return w->dist[(size_t)(i / w->P) * LANES + t * w->P + i % w->P];
}

/* D = min(D, distance to the chosen point: candidate t of the last chunk, or dbest
 * when t < 0), 0 at the chosen point itself, and the block sums. */
static void d2_apply(d2_state *s, pp_work *w, int32_t t, int64_t pick)
{
    const kvq_km_data *data = s->data;
    const int32_t P = w->P;
#pragma omp parallel for num_threads(w->threads) schedule(dynamic, 1) if (w->threads > 1)
    for (int64_t b = 0; b < s->nblocks; b++) {
        const int64_t i0 = b * DRAW_BLOCK, i1 = block_end(data, b);
        float *dm = w->dmin;
        if (t >= 0) /* DRAW_BLOCK is a multiple of P: tiles start at i0 */
            for (int64_t i = i0; i < i1; i += P) {
                const float *src = w->dist + (size_t)(i / P) * LANES + (size_t)t * P;
                const int32_t np = i1 - i < P ? (int32_t)(i1 - i) : P;
                for (int32_t q = 0; q < np; q++)
                    dm[i + q] = src[q] < dm[i + q] ? src[q] : dm[i + q];
            }
        else
            for (int64_t i = i0; i < i1; i++)
                dm[i] = w->dbest[i] < dm[i] ? w->dbest[i] : dm[i];
        if (pick >= i0 && pick < i1)
            dm[pick] = 0.0f;
        double sum = 0.0;
        for (int64_t i = i0; i < i1; i++)
            sum += (double)w->wt[i] * (double)dm[i];
        s->bsum[b] = sum;
    }
}

/* Threads of the per-step loops. Every block's result and every sum is the same for any
 * thread count, so the count is chosen for speed alone. A step is small (two parallel
 * loops over a few megabytes at most), and when the machine is busy, waking a second
 * thread twice per step can cost milliseconds, far more than the step itself. So
 * steps with fewer than SEED_MIN_WORK multiply-adds run on one thread, and otherwise
 * the steps are timed: the first SEED_PROBE run on p->threads, the next SEED_PROBE on one
 * thread, later ones use the faster (by a running mean of step times), trying the other
 * for one step every SEED_REPROBE steps. force_threads turns this off (tests). */
#define SEED_MIN_WORK ((int64_t)1 << 16)
#define SEED_PROBE 2
#define SEED_REPROBE 1024

typedef struct step_timer {
    int32_t fixed;  /* > 0: always this many threads; 0: choose by timing */
    int32_t many;   /* p->threads */
    double mean[2]; /* running mean step time with `many` threads [0] and one [1]; < 0 unset */
    int mode;       /* the step being timed ran with `many` (0) or one (1) thread */
    double t0;
} step_timer;

/* Threads for step t (t >= 1), and the start of its timing. */
static int32_t timer_begin(step_timer *tm, int32_t t)
{
    if (tm->fixed > 0)
        return tm->fixed;
    const int best = tm->mean[0] < 0 ? 0 : tm->mean[1] < 0 ? 1 : tm->mean[0] > tm->mean[1];
    if (t <= 2 * SEED_PROBE) /* several steps in a row: a woken team stays awake */
        tm->mode = t > SEED_PROBE;
    else if (t % SEED_REPROBE == 0)
        tm->mode = !best;
    else
        tm->mode = best;
    tm->t0 = kvq_now();
    return tm->mode ? 1 : tm->many;
}

static void timer_end(step_timer *tm)
{
    if (tm->fixed > 0)
        return;
    const double dt = kvq_now() - tm->t0;
    double *m = &tm->mean[tm->mode];
    *m = *m < 0 ? dt : 0.75 * *m + 0.25 * dt;
}

/* The buffers of w for n points of d dims (w->P and w->npad set) and `trials`
 * candidates per step; s gives the block count. */
static kvq_status pp_work_alloc(pp_work *w, const d2_state *s, int64_t n, int32_t d,
                                int32_t trials, const char *label, kvq_err *err)
{
    size_t nd, nl;
    if (!kvq_size_mul((size_t)w->npad, (size_t)d * sizeof(float), &nd) ||
        !kvq_size_mul((size_t)(w->npad / w->P), LANES * sizeof(float), &nl))
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: seeding buffers", label);
    w->cand = calloc((size_t)trials, sizeof *w->cand);
    w->ct = malloc((size_t)d * LANES * sizeof *w->ct);
    w->cn = malloc(LANES * sizeof *w->cn);
    w->xi = malloc(nd);
    w->xnorm = calloc((size_t)w->npad, sizeof *w->xnorm);
    w->wt = calloc((size_t)w->npad, sizeof *w->wt);
    w->dmin = calloc((size_t)w->npad, sizeof *w->dmin);
    w->dist = malloc(nl);
    w->dbest = trials > LANES ? malloc((size_t)n * sizeof *w->dbest) : NULL;
    w->part = calloc((size_t)s->nblocks * LANES, sizeof *w->part);
    if (!w->cand || !w->ct || !w->cn || !w->xi || !w->xnorm || !w->wt || !w->dmin || !w->dist ||
        (trials > LANES && !w->dbest) || !w->part)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: seeding buffers for %lld points", label,
                           (long long)n);
    return KVQ_OK;
}

static void pp_work_free(pp_work *w)
{
    free(w->cand);
    free(w->ct);
    free(w->cn);
    free(w->xi);
    free(w->xnorm);
    free(w->wt);
    free(w->dmin);
    free(w->dist);
    free(w->dbest);
    free(w->part);
    free(w->xb);
    free(w->bn);
    free(w->yr);
    free(w->cb);
}

/* The points into w: interleaved in tiles of P, their norms, weights, and D = inf. */
static void pp_interleave(pp_work *w, const kvq_km_data *data, int32_t threads)
{
    const int32_t d = data->d;
    const int64_t n = data->n;
    /* interleave: xi[(g * d + j) * P + q] = x[g * P + q][j] */
#pragma omp parallel for num_threads(threads) schedule(static) if (n > DRAW_BLOCK)
    for (int64_t g = 0; g < w->npad / w->P; g++)
        for (int32_t q = 0; q < w->P; q++) {
            const int64_t i = g * w->P + q;
            float *dst = w->xi + (size_t)g * d * w->P + q;
            for (int32_t j = 0; j < d; j++)
                dst[(size_t)j * w->P] = i < n ? data->x[(size_t)i * d + j] : 0.0f;
            if (i < n) {
                w->xnorm[i] = kvq_km_norm2_fma(data->x + (size_t)i * d, d);
                w->wt[i] = data->w ? data->w[i] : 1.0f;
                w->dmin[i] = INFINITY;
            }
        }
}

/* The bf16 copy of the points for the filter (kvq_km_cand_eval_bf16_avx512), centred on
 * their mean (summed in double in point order). The filter only decides which distances
 * are computed in f32, never a value, so mu need not be exact. 0 when out of memory: the
 * seeding then runs without the filter. */
static int bf16_setup(pp_work *w, const kvq_km_data *data, int32_t threads)
{
    const int32_t d = data->d, P = w->P, dp = (d + 1) / 2 * 2;
    const int64_t n = data->n;
    size_t nb;
    double *sum = calloc((size_t)d, sizeof *sum);
    float *mu = malloc((size_t)d * sizeof *mu);
    if (kvq_size_mul((size_t)w->npad, (size_t)dp * sizeof *w->xb, &nb))
        w->xb = calloc(nb ? nb : 1, 1);
    w->bn = calloc((size_t)w->npad, sizeof *w->bn);
    w->yr = calloc((size_t)w->npad, sizeof *w->yr);
    w->cb = malloc((size_t)dp * LANES * sizeof *w->cb);
    if (!sum || !mu || !w->xb || !w->bn || !w->yr || !w->cb) {
        free(sum);
        free(mu);
        free(w->xb);
        w->xb = NULL;
        return 0;
    }
    for (int64_t i = 0; i < n; i++)
        for (int32_t j = 0; j < d; j++)
            sum[j] += data->x[(size_t)i * d + j];
    for (int32_t j = 0; j < d; j++)
        mu[j] = (float)(sum[j] / (double)n);
#pragma omp parallel for num_threads(threads) schedule(static) if (n > DRAW_BLOCK)
    for (int64_t i = 0; i < n; i++)
        kvq_km_seed_bf16_row(data->x + (size_t)i * d, mu, d,
                             w->xb + ((size_t)(i / P) * (dp / 2) * P + (size_t)(i % P)) * 2,
                             2 * P, &w->bn[i], &w->yr[i]);
    free(sum);
    free(mu);
    w->f.dp = dp;
    w->f.cb = w->cb;
    w->f.bnc = w->bnc;
    w->f.zr = w->zr;
    w->f.eta = 1.25f * (float)(2 * d + 16) / 16777216.0f;
    w->f.kappa = (float)(dp + 16) / 4194304.0f;
    return 1;
}

/* One step after the first: draws `trials` candidates, evaluates them in chunks of
 * per_chunk, applies the one that lowers the potential most and returns its point. */
static int64_t pp_step(d2_state *s, pp_work *w, int32_t trials, int32_t per_chunk, kvq_rng *rng)
{
    const int64_t n = s->data->n;
    const double total = d2_total(s);
    for (int32_t c = 0; c < trials; c++)
        w->cand[c] = d2_draw(s, total, kvq_rng_uniform(rng), rng);
    int32_t best = 0, best_t = 0;
    double best_pot = INFINITY;
    for (int32_t c0 = 0; c0 < trials; c0 += per_chunk) {
        const int32_t nt = trials - c0 < per_chunk ? trials - c0 : per_chunk;
        eval_chunk(s, w, w->cand + c0, nt);
        int32_t chunk_best = -1;
        for (int32_t c = 0; c < nt; c++) {
            const double pot = chunk_pot(s, w, c);
            if (pot < best_pot) {
                best_pot = pot;
                best = c0 + c;
                chunk_best = best_t = c;
            }
        }
        if (w->dbest && chunk_best >= 0)
            for (int64_t i = 0; i < n; i++)
                w->dbest[i] = chunk_dist(w, i, chunk_best);
    }
    const int64_t pick = w->cand[best];
    d2_apply(s, w, w->dbest ? -1 : best_t, pick);
    return pick;
}

/* Chooses k centroids by D^2 sampling; trials > 1 is greedy k-means++: draw `trials`
 * candidates per step and keep the one whose addition lowers the potential most
 * (ties to the earlier draw). The candidates of a step are evaluated in chunks of at
 * most 16 in one pass over the points each; the winner's distances from that pass
 * become the new D. */
static kvq_status seed_pp(const kvq_km_data *data, const kvq_kmeans_params *p, int32_t k,
                          int32_t trials, uint64_t seed, float *cent, kvq_err *err)
{
    kvq_status st;
    const int32_t d = data->d;
    const int64_t n = data->n;
    const char *label = label_of(p);
    d2_state s;
    kvq_rng rng;
    pp_work w;
    memset(&w, 0, sizeof w);
    kvq_rng_seed(&rng, seed);
    if (trials < 1)
        trials = 1;
    int32_t per_chunk = 1; /* candidates per chunk: a power of two <= LANES */
    while (per_chunk < trials && per_chunk < LANES)
        per_chunk *= 2;
    w.P = LANES / per_chunk;
    w.npad = (n + w.P - 1) / w.P * w.P;
    w.eval = pick_cand_eval();
    step_timer tm = {.fixed = p->threads, .many = p->threads, .mean = {-1.0, -1.0}};
    {
        const int64_t work = w.npad / w.P * d * ((trials + LANES - 1) / LANES);
        if (!data->force_threads && p->threads > 1)
            tm.fixed = work >= SEED_MIN_WORK && n > DRAW_BLOCK ? 0 : 1;
    }
    st = d2_init(&s, data, p->threads, label, err);
    if (st != KVQ_OK)
        goto done;
    if ((st = pp_work_alloc(&w, &s, n, d, trials, label, err)) != KVQ_OK)
        goto done;
    pp_interleave(&w, data, p->threads);
    if (!data->no_seed_filter && kvq_km_seed_bf16_ok())
        bf16_setup(&w, data, p->threads);
    free(s.dmin); /* the draws read D from w.dmin */
    s.dmin = w.dmin;

    for (int32_t t = 0; t < k; t++) {
        int64_t pick;
        w.threads = t == 0 ? (tm.fixed ? tm.fixed : 1) : timer_begin(&tm, t);
        if (t == 0) {
            w.cand[0] = pick = draw_first(data, &rng);
            eval_chunk(&s, &w, w.cand, 1);
            d2_apply(&s, &w, 0, pick);
        } else {
            pick = pp_step(&s, &w, trials, per_chunk, &rng);
        }
        if (t > 0)
            timer_end(&tm);
        memcpy(cent + (size_t)t * d, data->x + (size_t)pick * d, (size_t)d * sizeof(float));
        if (t % PROGRESS_EVERY == 0 && t > 0 && (st = seed_progress(p, t, k, err)) != KVQ_OK)
            goto done;
    }
    if (!tm.fixed)
        kvq_log(&p->cb, KVQ_LOG_DEBUG, "%s: seeding step %.3g ms on %d threads, %.3g ms on 1",
                label, 1e3 * tm.mean[0], p->threads, 1e3 * tm.mean[1]);
    if (w.xb)
        kvq_log(&p->cb, KVQ_LOG_DEBUG, "%s: seeding's bf16 filter: %.4g of the tiles in f32",
                label, (double)w.exact_tiles / (double)(w.all_tiles ? w.all_tiles : 1));
done:
    if (s.dmin == w.dmin)
        s.dmin = NULL;
    d2_free(&s);
    pp_work_free(&w);
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

/* Candidates per greedy step: p->greedy_trials, or min(2 + floor(ln k), 4). Four
 * candidates cost what three do (one tile of 4 points x 4 candidates), and at the same
 * cost a larger seeding sample with 4 candidates beats 2 + ln k candidates on a smaller
 * one (docs/BENCHMARKS.md). */
static int32_t greedy_trials(const kvq_kmeans_params *p, int32_t k)
{
    if (p->greedy_trials > 0)
        return p->greedy_trials;
    const int32_t t = 2 + (int32_t)floor(log((double)k));
    return t < 4 ? t : 4;
}

/* ---- k-means|| ------------------------------------------------------------------------ */

/* Appends the points marked this round (mark [n]) to the candidates cidx [*m], growing
 * it (*cap entries) when needed. */
static kvq_status par_collect(const unsigned char *mark, int64_t n, int64_t **cidx,
                              int64_t *cap, int64_t *m, const char *label, kvq_err *err)
{
    for (int64_t i = 0; i < n; i++) {
        if (!mark[i])
            continue;
        if (*m == *cap) { /* far above the expected count: grow */
            int64_t ncap = *cap * 2 < n ? *cap * 2 : n;
            int64_t *t = realloc(*cidx, (size_t)ncap * sizeof *t);
            if (!t)
                return kvq_err_set(err, KVQ_E_NOMEM, "%s: k-means|| candidates", label);
            *cidx = t;
            *cap = ncap;
        }
        (*cidx)[(*m)++] = i;
    }
    return KVQ_OK;
}

/* Folds the distances d_new to this round's candidates (a_new: the nearest of them,
 * numbered from base) into D and owner; block sums in block order as in d2_apply. */
static void par_fold(d2_state *s, const kvq_km_data *data, const float *d_new,
                     const int32_t *a_new, const unsigned char *mark, int64_t base,
                     int32_t threads, int32_t *owner)
{
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (s->nblocks > 1)
    for (int64_t b = 0; b < s->nblocks; b++) {
        double sum = 0.0;
        for (int64_t i = b * DRAW_BLOCK; i < block_end(data, b); i++) {
            if (d_new[i] < s->dmin[i]) {
                s->dmin[i] = d_new[i];
                owner[i] = (int32_t)(base + a_new[i]);
            }
            if (mark[i]) /* a candidate is its own nearest */
                s->dmin[i] = 0.0f;
            sum += weight_at(data, i) * (double)s->dmin[i];
        }
        s->bsum[b] = sum;
    }
}

/* The last step of k-means||: each of the m candidates cidx is weighted by the total
 * weight of the points it owns (owner [n]), and weighted greedy k-means++ on the
 * candidates picks the k centroids. */
static kvq_status par_reduce(const kvq_km_data *data, const kvq_kmeans_params *p, int32_t k,
                             uint64_t seed, const int64_t *cidx, int32_t *owner, int64_t m,
                             float *cent, kvq_err *err)
{
    kvq_status st;
    const int32_t d = data->d;
    const int64_t n = data->n;
    const char *label = label_of(p);
    if (m > INT32_MAX)
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: k-means|| candidates", label);
    float *cx = malloc((size_t)m * d * sizeof *cx);
    float *cw = calloc((size_t)m, sizeof *cw);
    double *cwd = calloc((size_t)m, sizeof *cwd);
    if (!cx || !cw || !cwd) {
        free(cwd);
        free(cx);
        free(cw);
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: k-means|| candidates", label);
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
        kvq_km_data cand = {.x = cx, .w = cw, .n = m, .d = d,
                            .force_threads = data->force_threads,
                            .no_seed_filter = data->no_seed_filter};
        st = seed_pp(&cand, p, k, greedy_trials(p, k), kvq_km_mix64(seed ^ 0xca11ULL), cent,
                     err);
    }
    free(cx);
    free(cw);
    return st;
}

/* Bahmani et al. 2012: start from one weighted-uniform point; each round keeps
 * point i with probability min(1, l w_i D_i / psi), l = oversample * k; then every
 * candidate is weighted by the total weight of the points nearest to it, and
 * weighted greedy k-means++ on the candidates (greedy_trials per step) picks the k
 * centroids. */
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
    float *cx = NULL;       /* [nnew, d] this round's candidate rows */
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
    d2_init_dist(&s, data->x + (size_t)cidx[0] * d);

    for (int32_t r = 0; r < p->parallel_rounds; r++) {
        const double psi = d2_total(&s);
        if (!(psi > 0.0))
            break;
#pragma omp parallel for num_threads(p->threads) schedule(static) if (n > DRAW_BLOCK)
        for (int64_t i = 0; i < n; i++) {
            double pi = ell * weight_at(data, i) * (double)s.dmin[i] / psi;
            mark[i] = s.dmin[i] > 0.0f && kvq_km_uniform_at(seed, (uint64_t)r + 1, (uint64_t)i) < pi;
        }
        const int64_t base = m;
        if ((st = par_collect(mark, n, &cidx, &cap, &m, label, err)) != KVQ_OK)
            goto done;
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
        par_fold(&s, data, d_new, a_new, mark, base, p->threads, owner);
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
    free(cx);
    cx = NULL;
    st = par_reduce(data, p, k, seed, cidx, owner, m, cent, err);
done:
    d2_free(&s);
    free(cidx);
    free(owner);
    free(a_new);
    free(d_new);
    free(mark);
    free(cx);
    return st;
}

/* ---- entry points ---------------------------------------------------------------------- */

kvq_status kvq_km_seed(const kvq_km_data *data, const kvq_kmeans_params *p,
                       const kvq_km_backend *be, void *ctx, float *cent, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    const int32_t k = p->k;
    const uint64_t seed = kvq_km_mix64(p->seed ^ 0x6b6d65616e73ULL); /* "kmeans" */
    const char *label = label_of(p);
    float *xs = NULL, *ws = NULL; /* [m, d], [m]: the seeding subsample, when taken */
    void *sctx = NULL;            /* backend context over it (k-means||) */
    kvq_km_data sub = *data;
    const kvq_km_data *use = data;
    const int64_t ppc = p->seed_points_per_centroid;
    if (p->init == KVQ_KMEANS_INIT_RANDOM)
        return seed_random(data, k, seed, label, cent, err);
    if (p->init == KVQ_KMEANS_INIT_GIVEN || (int)p->init < 0 ||
        (int)p->init > KVQ_KMEANS_INIT_GIVEN)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: no seeding for init method %d",
                           label, (int)p->init);
    /* ppc * k < n exactly when ppc <= (n - 1) / k, without overflow */
    if (ppc > 0 && ppc <= (data->n - 1) / k) {
        sub.n = ppc * k;
        kvq_log(&p->cb, KVQ_LOG_DEBUG, "%s: seeding on a subsample of %lld of %lld points",
                label, (long long)sub.n, (long long)data->n);
        st = kvq_km_subsample(data->x, data->w, data->n, data->d, sub.n,
                              kvq_km_mix64(seed ^ 0x5a3b1e5eedULL), label, &xs, &ws, err);
        if (st != KVQ_OK)
            goto done;
        sub.x = xs;
        sub.w = ws;
        use = &sub;
        if (p->init == KVQ_KMEANS_INIT_PARALLEL) {
            if ((st = be->create(xs, ws, sub.n, sub.d, p->threads, &sctx, err)) != KVQ_OK)
                goto done;
            ctx = sctx;
        }
    }
    switch (p->init) {
    case KVQ_KMEANS_INIT_PP:
        st = seed_pp(use, p, k, 1, seed, cent, err);
        break;
    case KVQ_KMEANS_INIT_GREEDY_PP:
        st = seed_pp(use, p, k, greedy_trials(p, k), seed, cent, err);
        break;
    default: /* KVQ_KMEANS_INIT_PARALLEL */
        st = seed_parallel(use, p, k, seed, be, ctx, cent, err);
        break;
    }
done:
    if (sctx)
        be->destroy(sctx);
    free(xs);
    free(ws);
    return st;
}

double kvq_km_potential_ref(const kvq_km_data *data, const float *cent, int32_t k,
                            int32_t threads)
{
    const int64_t nblocks = (data->n + DRAW_BLOCK - 1) / DRAW_BLOCK;
    double *bs = calloc((size_t)nblocks + 1, sizeof *bs);
    if (!bs)
        return NAN;
    const int32_t d = data->d;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(dynamic, 1) if (nblocks > 1)
    for (int64_t b = 0; b < nblocks; b++) {
        double sum = 0.0;
        for (int64_t i = b * DRAW_BLOCK; i < block_end(data, b); i++) {
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
