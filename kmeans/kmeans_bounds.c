/*
 * kmeans_bounds.c — the CPU Lloyd assignment with Yinyang bounds (Ding et al., ICML
 * 2015), exact: every iteration gives the assignment that computing all m k distances
 * gives (the exhaustive engine, the same code with no distance skipped).
 *
 * Distances. s(i, j) = kvq_km_dist_from_dot(xn_i, cn_j, dot), with xn, cn from
 * kvq_km_norm2_fma and dot one fused multiply-add chain over the dims in ascending
 * order (kvq_km_panel_dots_*, kvq_km_pair_dots_*): the same bits whoever computes it.
 * Its error against the true squared distance D^2 is at most e_i = eta (xn_i + max_j
 * cn_j), eta = 1.25 (2 d + 16) 2^-24 (each of the three chains is within d u of its
 * absolute sum, and the expanded form adds three roundings; u = 2^-24).
 *
 * Bounds. The centroids are split once into T groups (a few Lloyd steps on the first
 * centroids). Every point keeps, per group g, a lower bound lb(i, g) on the true
 * distance to every centroid of g other than its own. After the update each bound
 * drops by the largest move of a centroid of its group (triangle inequality). Every
 * iteration computes s(i, a_i) to the point's own centroid exactly (also the inertia
 * term), and a group is skipped when lb(i, g)^2 > s(i, a_i) + e_i: then every centroid
 * j in it has s(i, j) >= D^2 - e_i > s(i, a_i), so it can neither win nor tie. The
 * groups left are computed whole (a small GEMM: points x the group's centroids), and
 * their bounds become exact again. Every bound is rounded towards safety (SLACK).
 * Each point also keeps the minimum of its bounds and the iteration it was brought up
 * to date at; the moves are summed per iteration (hist), so a point whose minimum,
 * lowered by the largest moves since, still clears the test touches none of its T
 * bounds. The first pass (and every pass of the exhaustive engine) computes every
 * distance, all centroids in group order, 32 a chunk (block_dense).
 *
 * Determinism: points are processed in blocks of BLOCK whatever the thread count, and
 * every output of a point depends on that point only.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "kmeans/kmeans_internal.h"

#define BLOCK 1024                          /* points per block (<= 65536: uint16 lists) */
#define GROUP_SIZE 32                       /* centroids per group, automatic count */
#define LB_BYTES ((size_t)1 << 29)          /* cap of the m x T lower bounds */
#define GROUP_ITERS 5                       /* Lloyd steps making the groups */
#define SLACK (1.0f / 1048576.0f)           /* 2^-20: relative safety of every bound */

typedef void (*panel_fn)(const float *const *, int32_t, int32_t, const float *, int32_t,
                         float *);
typedef void (*gmin_fn)(const float *, const float *, float, int32_t, float *, int32_t *,
                        float *);
typedef void (*pair_fn)(const float *, int64_t, int32_t, const float *, const int32_t *,
                        float *);

typedef struct scratch {
    float *mark;     /* [BLOCK, T] per examined group its smallest s; -1: skipped */
    uint16_t *list;  /* [T, BLOCK] points of the block that examine group g */
    int32_t *cnt;    /* [T] */
    float *out;      /* [8, max padded group size] dots */
    float *sa;       /* [BLOCK] s(i, a_i) */
    float *e;        /* [BLOCK] e_i */
    float *best_s;   /* [BLOCK] */
    float *best_m2;  /* [BLOCK] smallest s in the best's group but the best */
    int32_t *best_j; /* [BLOCK] */
    uint8_t *whole;  /* [BLOCK] 1: the point skipped every group by its global bound */
    float *row;      /* [8, kpad] dots of eight points with every centroid (dense pass) */
    uint64_t *chunks; /* [kpad / 32 / 64 + 1] chunks of 32 to compute exactly (first pass) */
} scratch;

struct kvq_km_bounds {
    const float *x; /* [m, d] borrowed */
    int64_t m;
    int32_t d, k, T, T_req, threads, exhaustive, first, gpmax;
    float eta, cnmax;
    float *xn;       /* [m] */
    float *lb;       /* [m, T] (NULL when exhaustive) */
    int32_t *gof;    /* [k] group of each centroid */
    int32_t *gstart; /* [T + 1] */
    int32_t *gmem;   /* [k] centroids by group, ascending within a group */
    int64_t *poff;   /* [T + 1] panel offsets */
    float *panel;    /* per group [d, padded size]: the centroids transposed */
    float *fpanel;   /* [kpad / 32, d, 32]: every centroid in group order, 32 a chunk
                        (the dense passes: the first, and every one when exhaustive) */
    int32_t kpad;    /* k rounded up to 32 */
    float *cng;      /* [k] cn by group order */
    float *cn;       /* [k] */
    float *cprev;    /* [k, d] the centroids of the previous call */
    float *gdrift;   /* [T] largest move in each group since the previous call */
    float *glb;      /* [m] min over g of lb(i, g) when the row was last brought up to date */
    int32_t *stamp;  /* [m] the call at which it was */
    double *hist;    /* [calls, T + 1] per call the summed moves of each group so far, and
                        (column T) the summed largest move of any group */
    float *mv;       /* [calls, T + 1] moved(s, call, g) for every s <= call, this call */
    int32_t call, hist_cap;
    int64_t *work;   /* [blocks] distances computed */
    scratch *sc;     /* [threads] */
    panel_fn panel_dots;
    pair_fn pair_dots;
    gmin_fn group_min;
    kvq_km_first ff; /* the first pass's bf16 filter, while it runs (ff.xb set) */
    int no_filter;   /* 1: the first pass without it */
    void (*plan_row)(float *, const float *, int32_t, float, float *, uint16_t *, int32_t,
                     int32_t *, uint16_t);
};

/* The smallest of r [n] (+inf when n is 0): eight running minima, so no chain of
 * dependent compares; a minimum is the same in any order. */
static inline float min_of(const float *r, int32_t n)
{
    float m[8] = {INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY,
                  INFINITY};
    int32_t q = 0;
    for (; q + 8 <= n; q += 8)
        for (int u = 0; u < 8; u++)
            m[u] = r[q + u] < m[u] ? r[q + u] : m[u];
    for (; q < n; q++)
        m[0] = r[q] < m[0] ? r[q] : m[0];
    float lo = m[0];
    for (int u = 1; u < 8; u++)
        lo = m[u] < lo ? m[u] : lo;
    return lo;
}

/* Frees the first pass's filter state (kmeans_first_avx512.c); here because every
 * machine calls it. */
void kvq_km_first_free(kvq_km_first *f)
{
    free(f->xb);
    free(f->bn);
    free(f->yr);
    free(f->cpan);
    free(f->cbn);
    free(f->czr);
    memset(f, 0, sizeof *f);
}

/* ---- scalar references of the kernels ------------------------------------------------ */

void kvq_km_panel_dots_ref(const float *const *xp, int32_t np, int32_t d, const float *panel,
                           int32_t ncols, float *out)
{
    for (int32_t p = 0; p < np; p++)
        for (int32_t c = 0; c < ncols; c++) {
            float s = 0.0f;
            for (int32_t t = 0; t < d; t++)
                s = fmaf(xp[p][t], panel[(size_t)t * ncols + c], s);
            out[(size_t)p * ncols + c] = s;
        }
}

void kvq_km_plan_row_ref(float *lb, const float *mv, int32_t T, float thr, float *mk,
                         uint16_t *list, int32_t ldl, int32_t *cnt, uint16_t p)
{
    for (int32_t g = 0; g < T; g++) {
        const float v0 = (lb[g] - mv[g]) * (1.0f - SLACK);
        const float v = v0 > 0.0f ? v0 : 0.0f;
        lb[g] = v;
        mk[g] = v * v * (1.0f - SLACK) > thr ? -1.0f : INFINITY;
        if (mk[g] >= 0.0f)
            list[(size_t)g * ldl + cnt[g]++] = p;
    }
}

void kvq_km_pair_dots_ref(const float *x, int64_t m, int32_t d, const float *cent,
                          const int32_t *a, float *out)
{
    for (int64_t i = 0; i < m; i++) {
        const float *xr = x + (size_t)i * d, *cr = cent + (size_t)a[i] * d;
        float s = 0.0f;
        for (int32_t t = 0; t < d; t++)
            s = fmaf(xr[t], cr[t], s);
        out[i] = s;
    }
}

void kvq_km_group_min_ref(const float *o, const float *cn, float xn, int32_t gs, float *m1,
                          int32_t *pos, float *m2)
{
    float b1 = INFINITY, b2 = INFINITY;
    int32_t p = INT32_MAX;
    for (int32_t u = 0; u < gs; u++) {
        const float v = kvq_km_dist_from_dot(xn, cn[u], o[u]);
        if (v < b1) {
            b2 = b1;
            b1 = v;
            p = u;
        } else if (v < b2) {
            b2 = v;
        }
    }
    *m1 = b1;
    *pos = p;
    *m2 = b2;
}

int kvq_km_bounds_fast(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    return kvq_cpu_has_avx2();
#else
    return 0;
#endif
}

/* ---- bounds arithmetic, rounded towards safety ---------------------------------------- */

/* A lower bound on D from a computed s (D^2 >= s - e). */
static inline float lb_from_s(float s, float e)
{
    const float v = s - e;
    return v > 0.0f ? sqrtf(v) * (1.0f - SLACK) : 0.0f;
}

/* How far the bounds of column g moved between calls `from` and `to` (g = T: any
 * group's largest), rounded up: the double sums carry a relative error far below
 * 1e-12 of their size. */
static inline float moved(const kvq_km_bounds *b, int32_t from, int32_t to, int32_t g)
{
    const double *h = b->hist;
    const int32_t T1 = b->T + 1;
    const double v = h[(size_t)to * T1 + g] - h[(size_t)from * T1 + g];
    return nextafterf((float)(v + 1e-12 * h[(size_t)to * T1 + g]), INFINITY);
}

/* ---- create / destroy ------------------------------------------------------------------ */

void kvq_km_bounds_destroy(kvq_km_bounds *b)
{
    if (!b)
        return;
    for (int32_t t = 0; b->sc && t < b->threads; t++) {
        scratch *s = &b->sc[t];
        free(s->mark);
        free(s->list);
        free(s->cnt);
        free(s->out);
        free(s->sa);
        free(s->e);
        free(s->best_s);
        free(s->best_m2);
        free(s->best_j);
        free(s->whole);
        free(s->row);
        free(s->chunks);
    }
    free(b->sc);
    free(b->xn);
    free(b->lb);
    free(b->gof);
    free(b->gstart);
    free(b->gmem);
    free(b->poff);
    free(b->panel);
    free(b->fpanel);
    kvq_km_first_free(&b->ff);
    free(b->cng);
    free(b->cn);
    free(b->cprev);
    free(b->gdrift);
    free(b->glb);
    free(b->stamp);
    free(b->hist);
    free(b->mv);
    free(b->work);
    free(b);
}

kvq_status kvq_km_bounds_create(const float *x, int64_t m, int32_t d, int32_t k,
                                int32_t threads, int exhaustive, int32_t groups,
                                kvq_km_bounds **out, kvq_err *err)
{
    kvq_km_bounds *b = calloc(1, sizeof *b);
    *out = NULL;
    if (!b)
        return kvq_err_set(err, KVQ_E_NOMEM, "kmeans: bounds state");
    b->x = x;
    b->m = m;
    b->d = d;
    b->k = k;
    b->threads = threads > 0 ? threads : 1;
    b->exhaustive = exhaustive & 1;
    b->no_filter = (exhaustive & 2) != 0;
    b->first = 1;
    b->T_req = groups;
    b->eta = 1.25f * (float)(2 * d + 16) / 16777216.0f;
    b->panel_dots = kvq_km_panel_dots_ref;
    b->pair_dots = kvq_km_pair_dots_ref;
    b->group_min = kvq_km_group_min_ref;
    b->plan_row = kvq_km_plan_row_ref;
#if defined(__x86_64__) && defined(__GNUC__)
    if (kvq_cpu_has_avx2()) {
        b->panel_dots = kvq_km_panel_dots_avx2;
        b->pair_dots = kvq_km_pair_dots_avx2;
    }
    if (kvq_cpu_has_avx512()) {
        b->group_min = kvq_km_group_min_avx512;
        b->plan_row = kvq_km_plan_row_avx512;
        b->panel_dots = kvq_km_panel_dots_avx512;
        b->pair_dots = kvq_km_pair_dots_avx512;
    }
#endif
    const int64_t nblocks = (m + BLOCK - 1) / BLOCK;
    b->xn = malloc((size_t)m * sizeof *b->xn);
    b->gof = malloc((size_t)k * sizeof *b->gof);
    b->gmem = malloc((size_t)k * sizeof *b->gmem);
    b->cng = malloc((size_t)k * sizeof *b->cng);
    b->cn = malloc((size_t)k * sizeof *b->cn);
    b->cprev = malloc((size_t)k * d * sizeof *b->cprev);
    b->work = calloc((size_t)nblocks, sizeof *b->work);
    b->sc = calloc((size_t)b->threads, sizeof *b->sc);
    if (!b->xn || !b->gof || !b->gmem || !b->cng || !b->cn || !b->cprev || !b->work ||
        !b->sc) {
        kvq_km_bounds_destroy(b);
        return kvq_err_set(err, KVQ_E_NOMEM, "kmeans: bounds state for %lld points, k=%d",
                           (long long)m, k);
    }
#pragma omp parallel for num_threads(b->threads) schedule(static) if (m > 4096)
    for (int64_t i = 0; i < m; i++)
        b->xn[i] = kvq_km_norm2_fma(x + (size_t)i * d, d);
    *out = b;
    return KVQ_OK;
}

/* ---- groups ------------------------------------------------------------------------------ */

/* Splits the k centroids cent into about T groups by GROUP_ITERS Lloyd steps (exact
 * distances, centers started at evenly spaced centroids); empty groups are dropped.
 * Fills gof (group ids 0..T-1 after dropping) and returns the number of groups, or -1
 * when out of memory. */
static int32_t group_centroids(const float *cent, int32_t k, int32_t d, int32_t T,
                               int32_t threads, int32_t *gof)
{
    float *g = malloc((size_t)T * d * sizeof *g);
    double *sum = malloc((size_t)T * d * sizeof *sum);
    int64_t *cnt = malloc((size_t)T * sizeof *cnt);
    int32_t *remap = malloc((size_t)T * sizeof *remap);
    int32_t out = -1;
    if (!g || !sum || !cnt || !remap)
        goto done;
    for (int32_t t = 0; t < T; t++)
        memcpy(g + (size_t)t * d, cent + (size_t)((int64_t)t * k / T) * d,
               (size_t)d * sizeof *g);
    for (int32_t it = 0; it <= GROUP_ITERS; it++) {
#pragma omp parallel for num_threads(threads) schedule(static) if (k >= 256)
        for (int32_t j = 0; j < k; j++) {
            float best = INFINITY;
            int32_t bi = 0;
            for (int32_t t = 0; t < T; t++) {
                const float v = kvq_km_l2sq(cent + (size_t)j * d, g + (size_t)t * d, d);
                if (v < best) {
                    best = v;
                    bi = t;
                }
            }
            gof[j] = bi;
        }
        if (it == GROUP_ITERS)
            break;
        memset(sum, 0, (size_t)T * d * sizeof *sum);
        memset(cnt, 0, (size_t)T * sizeof *cnt);
        for (int32_t j = 0; j < k; j++) {
            cnt[gof[j]]++;
            for (int32_t t = 0; t < d; t++)
                sum[(size_t)gof[j] * d + t] += cent[(size_t)j * d + t];
        }
        for (int32_t t = 0; t < T; t++)
            for (int32_t u = 0; cnt[t] > 0 && u < d; u++)
                g[(size_t)t * d + u] = (float)(sum[(size_t)t * d + u] / (double)cnt[t]);
    }
    memset(cnt, 0, (size_t)T * sizeof *cnt);
    for (int32_t j = 0; j < k; j++)
        cnt[gof[j]]++;
    out = 0;
    for (int32_t t = 0; t < T; t++)
        remap[t] = cnt[t] > 0 ? out++ : -1;
    for (int32_t j = 0; j < k; j++)
        gof[j] = remap[gof[j]];
done:
    free(g);
    free(sum);
    free(cnt);
    free(remap);
    return out;
}

/* The groups, the panel layout, the lower bounds and the per-thread scratch, from the
 * first centroids. */
static kvq_status bounds_setup(kvq_km_bounds *b, const float *cent, kvq_err *err)
{
    const int32_t k = b->k, d = b->d;
    int32_t T = b->T_req > 0 ? b->T_req : k / GROUP_SIZE;
    if (!b->exhaustive && (size_t)T * (size_t)b->m * sizeof(float) > LB_BYTES)
        T = (int32_t)(LB_BYTES / sizeof(float) / (size_t)b->m);
    if (T < 1)
        T = 1;
    if (T > k)
        T = k;
    if (T > 1)
        T = group_centroids(cent, k, d, T, b->threads, b->gof);
    else
        memset(b->gof, 0, (size_t)k * sizeof *b->gof);
    if (T < 1)
        return kvq_err_set(err, KVQ_E_NOMEM, "kmeans: centroid groups for k=%d", k);
    b->T = T;
    b->gstart = calloc((size_t)T + 1, sizeof *b->gstart);
    b->poff = calloc((size_t)T + 1, sizeof *b->poff);
    b->gdrift = calloc((size_t)T, sizeof *b->gdrift);
    if (!b->gstart || !b->poff || !b->gdrift)
        return kvq_err_set(err, KVQ_E_NOMEM, "kmeans: centroid groups for k=%d", k);
    for (int32_t j = 0; j < k; j++)
        b->gstart[b->gof[j] + 1]++;
    b->gpmax = 16;
    for (int32_t g = 0; g < T; g++) {
        const int32_t gp = (b->gstart[g + 1] + 15) / 16 * 16;
        b->gpmax = gp > b->gpmax ? gp : b->gpmax;
        b->poff[g + 1] = b->poff[g] + (int64_t)gp * d;
        b->gstart[g + 1] += b->gstart[g];
    }
    {
        int32_t *fill = calloc((size_t)T, sizeof *fill);
        if (!fill)
            return kvq_err_set(err, KVQ_E_NOMEM, "kmeans: centroid groups for k=%d", k);
        for (int32_t j = 0; j < k; j++)
            b->gmem[b->gstart[b->gof[j]] + fill[b->gof[j]]++] = j;
        free(fill);
    }
    b->kpad = (k + 31) / 32 * 32;
    b->panel = calloc((size_t)b->poff[T], sizeof *b->panel);
    b->fpanel = calloc((size_t)b->kpad * d, sizeof *b->fpanel);
    if (!b->panel || !b->fpanel)
        return kvq_err_set(err, KVQ_E_NOMEM, "kmeans: centroid panels for k=%d", k);
    if (!b->exhaustive && (!(b->lb = malloc((size_t)b->m * T * sizeof *b->lb)) ||
                           !(b->glb = malloc((size_t)b->m * sizeof *b->glb)) ||
                           !(b->stamp = malloc((size_t)b->m * sizeof *b->stamp))))
        return kvq_err_set(err, KVQ_E_NOMEM, "kmeans: %lld x %d lower bounds",
                           (long long)b->m, T);
    for (int32_t t = 0; t < b->threads; t++) {
        scratch *s = &b->sc[t];
        s->mark = malloc((size_t)BLOCK * T * sizeof *s->mark);
        s->list = malloc((size_t)BLOCK * T * sizeof *s->list);
        s->cnt = malloc((size_t)T * sizeof *s->cnt);
        s->out = malloc((size_t)8 * b->gpmax * sizeof *s->out);
        s->sa = malloc(BLOCK * sizeof *s->sa);
        s->e = malloc(BLOCK * sizeof *s->e);
        s->best_s = malloc(BLOCK * sizeof *s->best_s);
        s->best_m2 = malloc(BLOCK * sizeof *s->best_m2);
        s->best_j = malloc(BLOCK * sizeof *s->best_j);
        s->whole = malloc(BLOCK * sizeof *s->whole);
        s->row = malloc((size_t)8 * b->kpad * sizeof *s->row);
        s->chunks = malloc(((size_t)b->kpad / 32 / 64 + 1) * sizeof *s->chunks);
        if (!s->chunks || !s->mark || !s->list || !s->cnt || !s->out || !s->sa || !s->e || !s->best_s ||
            !s->best_m2 || !s->best_j || !s->whole || !s->row)
            return kvq_err_set(err, KVQ_E_NOMEM, "kmeans: bounds scratch for k=%d", k);
    }
    return KVQ_OK;
}

/* Per call: the panels and norms of the new centroids and, after the first call, each
 * group's largest centroid move since the previous call. */
static void bounds_centroids(kvq_km_bounds *b, const float *cent)
{
    const int32_t k = b->k, d = b->d, T = b->T;
    float cnmax = 0.0f;
    for (int32_t g = 0; g < T; g++) {
        const int32_t g0 = b->gstart[g], gs = b->gstart[g + 1] - g0;
        const int32_t gp = (gs + 15) / 16 * 16;
        float *pan = b->panel + b->poff[g];
        float drift = 0.0f;
        for (int32_t c = 0; c < gs; c++) {
            const int32_t j = b->gmem[g0 + c];
            const float *cj = cent + (size_t)j * d;
            for (int32_t t = 0; t < d; t++)
                pan[(size_t)t * gp + c] = cj[t];
            if (b->first || b->exhaustive) {
                float *fp = b->fpanel + (size_t)((g0 + c) / 32) * d * 32 + (g0 + c) % 32;
                for (int32_t t = 0; t < d; t++)
                    fp[(size_t)t * 32] = cj[t];
            }
            b->cn[j] = b->cng[g0 + c] = kvq_km_norm2_fma(cj, d);
            cnmax = b->cn[j] > cnmax ? b->cn[j] : cnmax;
            if (!b->first && !b->exhaustive) {
                const float *cp = b->cprev + (size_t)j * d;
                double s = 0.0;
                for (int32_t t = 0; t < d; t++) {
                    const double u = (double)cj[t] - (double)cp[t];
                    s += u * u;
                }
                /* rounded up: the double sum is within 1e-13 of the true move */
                const float v = nextafterf((float)(sqrt(s) * (1.0 + 1e-9)), INFINITY);
                drift = v > drift ? v : drift;
            }
        }
        b->gdrift[g] = drift;
    }
    b->cnmax = cnmax;
    if (!b->first && !b->exhaustive) { /* summed moves: row `call` of the history */
        const int32_t T1 = T + 1;
        double *h = b->hist + (size_t)b->call * T1, *h0 = h - T1;
        float most = 0.0f;
        for (int32_t g = 0; g < T; g++) {
            h[g] = h0[g] + (double)b->gdrift[g];
            most = b->gdrift[g] > most ? b->gdrift[g] : most;
        }
        h[T] = h0[T] + (double)most;
    }
    memcpy(b->cprev, cent, (size_t)k * d * sizeof *cent);
}

/* ---- one block of points ------------------------------------------------------------------ */

/* Which groups each point of the block [i0, i0 + nb) must examine: s(i, a_i), the bounds
 * moved by the drifts, and the lists of points per group. */
static void block_plan(kvq_km_bounds *b, scratch *sc, const float *cent, int64_t i0,
                       int32_t nb, const int32_t *a)
{
    const int32_t T = b->T, d = b->d;
    const int bounds = !b->exhaustive && !b->first;
    memset(sc->cnt, 0, (size_t)T * sizeof *sc->cnt);
    if (bounds)
        b->pair_dots(b->x + (size_t)i0 * d, nb, d, cent, a + i0, sc->sa);
    for (int32_t p = 0; p < nb; p++) {
        const int64_t i = i0 + p;
        const float xn = b->xn[i];
        float *mk = sc->mark + (size_t)p * T;
        sc->e[p] = b->eta * (xn + b->cnmax);
        sc->best_m2[p] = INFINITY;
        sc->whole[p] = 0;
        if (!bounds) { /* block_dense computes every distance */
            sc->best_s[p] = INFINITY;
            sc->best_j[p] = INT32_MAX;
            continue;
        }
        const float sa = kvq_km_dist_from_dot(xn, b->cn[a[i]], sc->sa[p]);
        sc->sa[p] = sa;
        sc->best_s[p] = sa;
        sc->best_j[p] = a[i];
        /* skip g when lb^2 > sa + e (see the top of the file), rounded towards safety */
        const float thr = (sa + sc->e[p]) * (1.0f + SLACK);
        const float *mv = b->mv + (size_t)b->stamp[i] * (T + 1);
        const float g0 = (b->glb[i] - mv[T]) * (1.0f - SLACK);
        sc->whole[p] = g0 > 0.0f && g0 * g0 * (1.0f - SLACK) > thr;
        if (sc->whole[p])
            continue; /* no group can hold a centroid as near: the row stays as it is */
        /* the row brought up to this call, and the groups to examine */
        b->plan_row(b->lb + (size_t)i * T, mv, T, thr, mk, sc->list, BLOCK, sc->cnt,
                    (uint16_t)p);
        b->stamp[i] = b->call;
    }
}

/* The record of one examined group of point p: its smallest distance in mark, and the
 * point's best when the group holds it. */
static inline void take_group(scratch *sc, int32_t T, int32_t p, int32_t g, float m1, int32_t j1,
                              float m2)
{
    sc->mark[(size_t)p * T + g] = m1;
    if (j1 == sc->best_j[p] || kvq_km_better(m1, j1, sc->best_s[p], sc->best_j[p])) {
        sc->best_s[p] = m1;
        sc->best_j[p] = j1;
        sc->best_m2[p] = m2;
    }
}

/* The examined groups: their distances (points x the group's centroids, eight points a
 * kernel call), each point's best and per group its smallest distance. Returns the
 * number of distances computed. */
static int64_t block_groups(kvq_km_bounds *b, scratch *sc, int64_t i0)
{
    const int32_t T = b->T, d = b->d;
    int64_t work = 0;
    for (int32_t g = 0; g < T; g++) {
        const int32_t c = sc->cnt[g];
        if (!c)
            continue;
        const int32_t g0 = b->gstart[g], gs = b->gstart[g + 1] - g0;
        const int32_t gp = (gs + 15) / 16 * 16;
        const int32_t *mem = b->gmem + g0;
        const float *cng = b->cng + g0;
        const uint16_t *lst = sc->list + (size_t)g * BLOCK;
        work += (int64_t)c * gs;
        for (int32_t q0 = 0; q0 < c; q0 += 8) {
            const int32_t np = c - q0 < 8 ? c - q0 : 8;
            const float *xp[8];
            for (int32_t q = 0; q < np; q++)
                xp[q] = b->x + (size_t)(i0 + lst[q0 + q]) * d;
            b->panel_dots(xp, np, d, b->panel + b->poff[g], gp, sc->out);
            for (int32_t q = 0; q < np; q++) {
                const int32_t p = lst[q0 + q];
                const float xn = b->xn[i0 + p];
                const float *o = sc->out + (size_t)q * gp;
                float m1, m2;
                int32_t u1;
                b->group_min(o, cng, xn, gs, &m1, &u1, &m2);
                /* members ascend within a group: the first position is the lower index */
                const int32_t j1 = u1 == INT32_MAX ? INT32_MAX : mem[u1];
                take_group(sc, T, p, g, m1, j1, m2);
            }
        }
    }
    return work;
}

/* Pointers to the next min(left, 8) rows from i: xp; returns their count. */
static inline int32_t eight_rows(const kvq_km_bounds *b, int64_t i, int32_t left,
                                 const float **xp)
{
    const int32_t np = left < 8 ? left : 8;
    for (int32_t q = 0; q < np; q++)
        xp[q] = b->x + (size_t)(i + q) * b->d;
    return np;
}

/* Every distance of the block (the first pass, and every pass when exhaustive): eight
 * points at a time against all centroids in group order, then each group's minimum.
 * Returns the number of distances computed. */
static int64_t block_dense(kvq_km_bounds *b, scratch *sc, int64_t i0, int32_t nb)
{
    const int32_t T = b->T, d = b->d, kp = b->kpad;
    float tmp[8 * 32];
    for (int32_t p0 = 0; p0 < nb; p0 += 8) {
        const float *xp[8];
        const int32_t np = eight_rows(b, i0 + p0, nb - p0, xp);
        for (int32_t c = 0; c < kp; c += 32) {
            b->panel_dots(xp, np, d, b->fpanel + (size_t)c * d, 32, tmp);
            for (int32_t q = 0; q < np; q++)
                memcpy(sc->row + (size_t)q * kp + c, tmp + q * 32, 32 * sizeof *tmp);
        }
        for (int32_t q = 0; q < np; q++) {
            const float xn = b->xn[i0 + p0 + q];
            const float *o = sc->row + (size_t)q * kp;
            for (int32_t g = 0; g < T; g++) {
                const int32_t g0 = b->gstart[g], gs = b->gstart[g + 1] - g0;
                float m1, m2;
                int32_t u1;
                b->group_min(o + g0, b->cng + g0, xn, gs, &m1, &u1, &m2);
                take_group(sc, T, p0 + q, g, m1, u1 == INT32_MAX ? INT32_MAX : b->gmem[g0 + u1],
                           m2);
            }
        }
    }
    return (int64_t)nb * b->k;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* Point p's smallest bound over positions [q0, q1) of r, leaving out position skip. */
static float range_min(const float *r, int32_t q0, int32_t q1, int32_t skip)
{
    if (skip < 0)
        return min_of(r + q0, q1 - q0);
    float lo = INFINITY;
    for (int32_t q = q0; q < q1; q++)
        lo = q != skip && r[q] < lo ? r[q] : lo;
    return lo;
}

/* The first pass with the bf16 filter (kmeans_first_avx512.c): per eight points the bf16
 * intervals to every centroid, then the union of their chunks that may hold a nearest
 * centroid computed exactly with the plain pass's kernel; the best from those, per group
 * the smallest lower bound (in mark, the best left out of its own group). */
static int64_t block_first(kvq_km_bounds *b, scratch *sc, int64_t i0, int32_t nb)
{
    const int32_t T = b->T, d = b->d, kp = b->kpad, k = b->k, nw = kp / 32 / 64 + 1;
    float tmp[8 * 32];
    for (int32_t p0 = 0; p0 < nb; p0 += 8) {
        const float *xp[8];
        const int32_t np = eight_rows(b, i0 + p0, nb - p0, xp);
        kvq_km_first_dots_avx512(&b->ff, i0 + p0, np, kp, sc->row);
        memset(sc->chunks, 0, (size_t)nw * sizeof *sc->chunks);
        for (int32_t q = 0; q < np; q++)
            kvq_km_first_filter_avx512(&b->ff, i0 + p0 + q, k, sc->e[p0 + q],
                                       sc->row + (size_t)q * kp, sc->chunks);
        for (int32_t w = 0; w < nw; w++)
            for (uint64_t bits = sc->chunks[w]; bits; bits &= bits - 1) {
                const int32_t c = (w * 64 + __builtin_ctzll(bits)) * 32;
                b->panel_dots(xp, np, d, b->fpanel + (size_t)c * d, 32, tmp);
                for (int32_t q = 0; q < np; q++) {
                    const int32_t p = p0 + q;
                    const float xn = b->xn[i0 + p], e = sc->e[p];
                    float *r = sc->row + (size_t)q * kp;
                    for (int32_t u = 0; u < 32 && c + u < k; u++) {
                        const float v = kvq_km_dist_from_dot(xn, b->cng[c + u], tmp[q * 32 + u]);
                        const int32_t j = b->gmem[c + u];
                        if (kvq_km_better(v, j, sc->best_s[p], sc->best_j[p])) {
                            sc->best_s[p] = v;
                            sc->best_j[p] = j;
                        }
                        const float l = lb_from_s(v, e);
                        r[c + u] = l > r[c + u] ? l : r[c + u];
                    }
                }
            }
        for (int32_t q = 0; q < np; q++) {
            const int32_t p = p0 + q, bj = sc->best_j[p];
            const int32_t gb = bj == INT32_MAX ? -1 : b->gof[bj];
            const float *r = sc->row + (size_t)q * kp;
            for (int32_t g = 0; g < T; g++) {
                const int32_t g0 = b->gstart[g], g1 = b->gstart[g + 1];
                int32_t skip = -1;
                if (g == gb)
                    for (int32_t u = g0; u < g1; u++)
                        skip = b->gmem[u] == bj ? u : skip;
                sc->mark[(size_t)p * T + g] = range_min(r, g0, g1, skip);
            }
        }
    }
    return (int64_t)nb * b->k;
}
#endif

/* The block's outputs and new bounds: exact again for every examined group; the old
 * centroid joins the bound of its group when the point left it unexamined. */
static void block_finish(kvq_km_bounds *b, scratch *sc, int64_t i0, int32_t nb, int32_t *a,
                         float *dist)
{
    const int32_t T = b->T;
    const int bounds = !b->exhaustive && !b->first;
    for (int32_t p = 0; p < nb; p++) {
        const int64_t i = i0 + p;
        int32_t bj = sc->best_j[p];
        if (bj == INT32_MAX) /* every distance overflowed to +inf */
            bj = 0;
        if (b->lb && !sc->whole[p]) {
            const float e = sc->e[p];
            const float *mk = sc->mark + (size_t)p * T;
            float *lb = b->lb + (size_t)i * T;
            const int32_t gb = b->gof[bj];
            for (int32_t g = 0; g < T; g++)
                if (mk[g] >= 0.0f)
                    lb[g] = b->ff.xb ? mk[g] /* block_first: already a lower bound */
                                     : lb_from_s(g == gb ? sc->best_m2[p] : mk[g], e);
            if (bounds && bj != a[i]) {
                const int32_t ga = b->gof[a[i]];
                const float v = lb_from_s(sc->sa[p], e);
                if (mk[ga] < 0.0f && v < lb[ga])
                    lb[ga] = v;
            }
            b->glb[i] = min_of(lb, T);
            b->stamp[i] = b->call;
        }
        a[i] = bj;
        dist[i] = sc->best_s[p];
    }
}

kvq_status kvq_km_bounds_assign(kvq_km_bounds *b, const float *cent, int32_t *assign,
                                float *dist, double *skipped, kvq_err *err)
{
    kvq_status st;
    if (b->first && (st = bounds_setup(b, cent, err)) != KVQ_OK)
        return st;
    if (!b->exhaustive) {
        b->call = b->first ? 0 : b->call + 1;
        if (b->call >= b->hist_cap) {
            const int32_t cap = b->hist_cap ? 2 * b->hist_cap : 32;
            double *h = realloc(b->hist, (size_t)cap * (b->T + 1) * sizeof *h);
            if (h)
                b->hist = h;
            float *mv = realloc(b->mv, (size_t)cap * (b->T + 1) * sizeof *mv);
            if (mv)
                b->mv = mv;
            if (!h || !mv)
                return kvq_err_set(err, KVQ_E_NOMEM, "kmeans: bounds history");
            b->hist_cap = cap;
        }
        if (b->first)
            memset(b->hist, 0, (size_t)(b->T + 1) * sizeof *b->hist);
    }
    bounds_centroids(b, cent);
    for (int32_t c = 0; !b->exhaustive && c <= b->call; c++)
        for (int32_t g = 0; g <= b->T; g++)
            b->mv[(size_t)c * (b->T + 1) + g] = moved(b, c, b->call, g);
    const int64_t nblocks = (b->m + BLOCK - 1) / BLOCK;
    if (b->first && !b->exhaustive && !b->no_filter && kvq_km_seed_bf16_ok())
        kvq_km_first_prep(&b->ff, b->x, b->m, b->d, cent, b->gmem, b->k, b->kpad, b->threads);
#pragma omp parallel num_threads(b->threads) if (nblocks > 1)
    {
        scratch *sc = &b->sc[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 1)
        for (int64_t blk = 0; blk < nblocks; blk++) {
            const int64_t i0 = blk * BLOCK;
            const int32_t nb = (int32_t)(b->m - i0 < BLOCK ? b->m - i0 : BLOCK);
            block_plan(b, sc, cent, i0, nb, assign);
#if defined(__x86_64__) && defined(__GNUC__)
            if (b->ff.xb)
                b->work[blk] = block_first(b, sc, i0, nb);
            else
#endif
                b->work[blk] = b->exhaustive || b->first ? block_dense(b, sc, i0, nb)
                                                         : block_groups(b, sc, i0);
            if (!b->exhaustive && !b->first)
                b->work[blk] += nb; /* s(i, a_i) */
            block_finish(b, sc, i0, nb, assign, dist);
        }
    }
    int64_t work = 0;
    for (int64_t blk = 0; blk < nblocks; blk++)
        work += b->work[blk];
    if (skipped)
        *skipped = 1.0 - (double)work / ((double)b->m * (double)b->k);
    b->first = 0;
    kvq_km_first_free(&b->ff);
    return KVQ_OK;
}
