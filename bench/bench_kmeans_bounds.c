/*
 * bench_kmeans_bounds.c — a whole k-means fit (seeding + Lloyd) with the exact bounds,
 * against the plain loop (every distance, the same arithmetic) and the SGEMM floor.
 *
 *   bench_kmeans_bounds [--n N] [--d D] [--k K] [--iters I] [--threads T] [--seed S]
 *                       [--init NAME] [--space keys|qa] [--reps R] [--plain 0|1]
 *                       [--groups G] [--dump DIR] [--seeding 0|1] [--filters 0|1]
 *
 * Defaults: the 7B head shape, n 81920, d 128, k 4096, 25 iterations, 2 threads, the
 * library's seeding (greedy k-means++), 1 repetition (best of R).
 * Data (seeded): key-like vectors, a shared offset plus k / 4 anisotropic blobs whose
 * per-dim scales fall as 1 / (1 + j / 8) (--space keys), or the same keys whitened as
 * `kvq fit`'s query-aware methods see them, Z = K L with L the Cholesky factor of a
 * synthetic query second moment whose spectrum falls as 1 / (1 + j / 4) (--space qa).
 *
 * Prints: the seeding time; the bounded fit's total time, per iteration its time and the
 * fraction of the n k distances skipped; the SGEMM floor (one n x k x d OpenBLAS SGEMM
 * with the same threads, best of 3) times the iterations, and the ratio of the fit to
 * it. With --plain 1 also the plain loop's fit, checked iteration by iteration: the
 * same assignment and the same inertia bits (exit 1 if not); the plain loop runs without
 * the bf16 filters, so this also checks them.
 * --filters 0 turns off the bf16 filters of the seeding and of the first pass
 * (kvq_km_fit_opts.no_first_filter; the same result, for timing them).
 * --seeding 1 times the seeding alone (kvq_km_seed, as the fit calls it), with the bf16
 * filter of its candidate passes and without (kvq_km_data.no_seed_filter), alternated, R
 * repetitions each: wall and process CPU seconds (best of R), their ratio, the fraction of
 * tiles the filter left to f32, and whether the two gave the same centroids (exit 1 if
 * not).
 * --dump DIR writes DIR/x.npy [n, d] and DIR/init.npy [k, d] (the seeding's
 * centroids) for bench/kmeans_bounds_peer.py, which runs faiss from the same start and
 * prints the ratio.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "kmeans/kmeans_internal.h"
#include "kvq.h"
#include "kvq/util.h"
#include "bench/bench_kmeans_common.h"

typedef struct args {
    int64_t n, d, k, iters, threads, seed, reps, plain, groups, seeding, filters;
    const char *init, *space, *dump;
} args;

/* Key-like data: offset + blob center + anisotropic noise; whitened by L when qa. */
static float *make_data(const args *a)
{
    const int64_t n = a->n;
    const int32_t d = (int32_t)a->d, blobs = (int32_t)(a->k / 4 > 0 ? a->k / 4 : 1);
    kvq_rng r;
    kvq_rng_seed(&r, (uint64_t)a->seed);
    float *x = malloc((size_t)n * d * sizeof *x);
    float *c = malloc((size_t)blobs * d * sizeof *c);
    float *off = malloc((size_t)d * sizeof *off);
    double *L = calloc((size_t)d * d, sizeof *L);
    if (!x || !c || !off || !L) {
        free(x);
        x = NULL;
        goto done;
    }
    for (int32_t t = 0; t < d; t++)
        off[t] = (float)(3.0 * kvq_rng_normal(&r));
    for (int64_t j = 0; j < (int64_t)blobs * d; j++)
        c[j] = (float)(kvq_rng_normal(&r) / (1.0 + (double)(j % d) / 8.0));
    for (int64_t i = 0; i < n; i++) {
        const float *cj = c + (size_t)kvq_rng_below(&r, (uint64_t)blobs) * d;
        for (int32_t t = 0; t < d; t++)
            x[(size_t)i * d + t] =
                off[t] + cj[t] + (float)(0.3 * kvq_rng_normal(&r) / (1.0 + t / 8.0));
    }
    if (strcmp(a->space, "qa") == 0) {
        /* L: lower-triangular, a decaying diagonal and small random entries below it */
        for (int32_t u = 0; u < d; u++) {
            L[(size_t)u * d + u] = 1.0 / sqrt(1.0 + u / 4.0);
            for (int32_t v = 0; v < u; v++)
                L[(size_t)u * d + v] = 0.1 * kvq_rng_normal(&r) / sqrt(1.0 + u / 4.0);
        }
        double *row = malloc((size_t)d * sizeof *row);
        if (!row) {
            free(x);
            x = NULL;
            goto done;
        }
        for (int64_t i = 0; i < n; i++) { /* z = x L */
            float *xi = x + (size_t)i * d;
            for (int32_t v = 0; v < d; v++) {
                double s = 0;
                for (int32_t u = v; u < d; u++)
                    s += (double)xi[u] * L[(size_t)u * d + v];
                row[v] = s;
            }
            for (int32_t v = 0; v < d; v++)
                xi[v] = (float)row[v];
        }
        free(row);
    }
done:
    free(c);
    free(off);
    free(L);
    return x;
}

/* Per iteration: a hash of the assignment and the inertia, recorded by the trace hook. */
typedef struct trace_rec {
    uint64_t hash[1024];
    int32_t iters;
} trace_rec;

static void trace_hook(void *user, int32_t it, const int32_t *a, const float *dist, int64_t m)
{
    trace_rec *t = user;
    uint64_t h = 1469598103934665603ULL;
    for (int64_t i = 0; i < m; i++)
        h = (h ^ (uint64_t)(uint32_t)a[i]) * 1099511628211ULL;
    (void)dist;
    if (it < 1024)
        t->hash[it] = h;
    t->iters = it + 1;
}

/* One whole fit with engine e; fills stats, skipped and the trace. */
static int fit_once(const float *x, const args *a, const kvq_kmeans_params *p, kvq_km_engine e,
                    float *cent, kvq_kmeans_stats *s, double *skipped, trace_rec *tr)
{
    kvq_err err = {0};
    kvq_km_fit_opts o = {.engine = e, .groups = (int32_t)a->groups, .trace = trace_hook,
                         .user = tr, .skipped = skipped, .no_first_filter = !a->filters};
    if (kvq_km_fit_ex(x, a->n, (int32_t)a->d, NULL, p, &o, cent, NULL, s, &err) != KVQ_OK) {
        fprintf(stderr, "bench_kmeans_bounds: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int parse(int argc, char **argv, args *a)
{
    kvq_err e = {0};
    for (int i = 1; i + 1 < argc || i < argc; i += 2) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        kvq_status st = KVQ_OK;
        if (!v) {
            fprintf(stderr, "bench_kmeans_bounds: %s needs a value\n", o);
            return -1;
        }
        if (!strcmp(o, "--init"))
            a->init = v;
        else if (!strcmp(o, "--space") && (!strcmp(v, "keys") || !strcmp(v, "qa")))
            a->space = v;
        else if (!strcmp(o, "--dump"))
            a->dump = v;
        else if (!strcmp(o, "--n"))
            st = kvq_parse_i64(v, 1, INT64_C(1) << 32, &a->n, &e);
        else if (!strcmp(o, "--d"))
            st = kvq_parse_i64(v, 17, 4096, &a->d, &e);
        else if (!strcmp(o, "--k"))
            st = kvq_parse_i64(v, 1, INT32_MAX, &a->k, &e);
        else if (!strcmp(o, "--iters"))
            st = kvq_parse_i64(v, 1, 1000, &a->iters, &e);
        else if (!strcmp(o, "--threads"))
            st = kvq_parse_i64(v, 1, 1024, &a->threads, &e);
        else if (!strcmp(o, "--seed"))
            st = kvq_parse_i64(v, 0, INT64_MAX, &a->seed, &e);
        else if (!strcmp(o, "--reps"))
            st = kvq_parse_i64(v, 1, 100, &a->reps, &e);
        else if (!strcmp(o, "--plain"))
            st = kvq_parse_i64(v, 0, 1, &a->plain, &e);
        else if (!strcmp(o, "--filters"))
            st = kvq_parse_i64(v, 0, 1, &a->filters, &e);
        else if (!strcmp(o, "--seeding"))
            st = kvq_parse_i64(v, 0, 1, &a->seeding, &e);
        else if (!strcmp(o, "--groups"))
            st = kvq_parse_i64(v, 0, INT32_MAX, &a->groups, &e);
        else {
            fprintf(stderr, "bench_kmeans_bounds: unknown option %s\n", o);
            return -1;
        }
        if (st != KVQ_OK) {
            fprintf(stderr, "bench_kmeans_bounds: %s: %s\n", o, e.msg);
            return -1;
        }
    }
    return 0;
}

/* The plain loop's fit, compared with the bounded one iteration by iteration. */
static int check_plain(const float *x, const args *a, const kvq_kmeans_params *p,
                       const trace_rec *tb, const kvq_kmeans_stats *sb, const float *cb)
{
    const int32_t k = (int32_t)a->k, d = (int32_t)a->d;
    float *cent = malloc((size_t)k * d * sizeof *cent);
    trace_rec *tr = calloc(1, sizeof *tr);
    kvq_kmeans_stats s;
    memset(&s, 0, sizeof s);
    int rc = 1;
    args ap = *a;
    ap.filters = 0; /* the plain loop as it was: no bf16 filter anywhere */
    if (!cent || !tr || fit_once(x, &ap, p, KVQ_KM_ENGINE_EXHAUSTIVE, cent, &s, NULL, tr))
        goto done;
    int same = tr->iters == tb->iters && s.n_iters == sb->n_iters;
    for (int32_t t = 0; same && t < tr->iters && t < 1024; t++)
        same = tr->hash[t] == tb->hash[t] && s.inertia[t] == sb->inertia[t];
    same = same && memcmp(cent, cb, (size_t)k * d * sizeof *cent) == 0;
    printf("  plain loop (every distance, same arithmetic): %.3f s total, seeding %.3f s; "
           "%s\n", s.total_seconds, s.seed_seconds,
           same ? "the same assignment and inertia bits at every iteration, the same "
                  "centroids" : "DIFFERENT from the bounded fit");
    printf("  bounded / plain: %.3f\n", sb->total_seconds / s.total_seconds);
    rc = same ? 0 : 1;
done:
    kvq_kmeans_stats_free(&s);
    free(cent);
    free(tr);
    return rc;
}

/* The seeding's debug line "...: X of the tiles in f32" -> *user. */
static void seed_log(void *user, kvq_log_level level, const char *msg)
{
    const char *at = strstr(msg, "bf16 filter: ");
    (void)level;
    if (at)
        *(double *)user = atof(at + strlen("bf16 filter: "));
}

/* --seeding 1: the seeding with and without the filter, alternated. */
static int run_seeding(const float *x, const args *a, const kvq_kmeans_params *p0)
{
    const int32_t k = (int32_t)a->k, d = (int32_t)a->d;
    float *cent[2] = {malloc((size_t)k * d * sizeof(float)), malloc((size_t)k * d * sizeof(float))};
    double wall[2] = {1e30, 1e30}, cpu[2] = {1e30, 1e30}, frac = -1;
    kvq_kmeans_params p = *p0;
    p.cb.log = seed_log;
    p.cb.user = &frac;
    int rc = 1;
    if (!cent[0] || !cent[1])
        goto done;
    for (int64_t rep = 0; rep < a->reps; rep++)
        for (int v = 0; v < 2; v++) {
            kvq_km_data data = {.x = x, .n = a->n, .d = d, .no_seed_filter = v};
            kvq_err e = {0};
            const double t0 = kvq_now(), c0 = bench_cpu_now();
            if (kvq_km_seed(&data, &p, &kvq_km_backend_cpu, NULL, cent[v], &e) != KVQ_OK) {
                fprintf(stderr, "bench_kmeans_bounds: %s\n", e.msg);
                goto done;
            }
            const double tw = kvq_now() - t0, tc = bench_cpu_now() - c0;
            wall[v] = tw < wall[v] ? tw : wall[v];
            cpu[v] = tc < cpu[v] ? tc : cpu[v];
            printf("  rep %lld %s: %.3f s [cpu %.3f s]\n", (long long)rep,
                   v ? "plain " : "filter", tw, tc);
        }
    const int same = memcmp(cent[0], cent[1], (size_t)k * d * sizeof(float)) == 0;
    printf("  seeding, best of %lld: bf16 filter %.3f s [cpu %.3f s], plain %.3f s [cpu %.3f "
           "s]; filter / plain %.3f (wall) %.3f (cpu); tiles in f32 %.4f; %s\n",
           (long long)a->reps, wall[0], cpu[0], wall[1], cpu[1], wall[0] / wall[1],
           cpu[0] / cpu[1], frac, same ? "the same centroids" : "DIFFERENT centroids");
    rc = same ? 0 : 1;
done:
    free(cent[0]);
    free(cent[1]);
    return rc;
}

static int run(const args *a)
{
    const int32_t k = (int32_t)a->k, d = (int32_t)a->d;
    float *x = make_data(a);
    float *cent = malloc((size_t)k * d * sizeof *cent);
    double *skipped = calloc((size_t)a->iters, sizeof *skipped);
    trace_rec *tr = calloc(1, sizeof *tr);
    kvq_kmeans_stats s, best;
    double cpu_best = 0;
    memset(&s, 0, sizeof s);
    memset(&best, 0, sizeof best);
    kvq_err e = {0};
    int rc = 1;
    if (!x || !cent || !skipped || !tr) {
        fprintf(stderr, "bench_kmeans_bounds: out of memory\n");
        goto done;
    }
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = k;
    p.threads = (int32_t)a->threads;
    p.seed = (uint64_t)a->seed;
    p.tol = 0; /* every iteration */
    p.max_iters = (int32_t)a->iters;
    p.max_points_per_centroid = 0;
    p.min_points_per_centroid = 0;
    if (a->init && kvq_kmeans_init_parse(a->init, &p.init, &e) != KVQ_OK) {
        fprintf(stderr, "bench_kmeans_bounds: %s\n", e.msg);
        goto done;
    }
    printf("n=%lld d=%d k=%d iters=%lld threads=%lld space=%s init=%s (machine shared: "
           "best of %lld)\n", (long long)a->n, d, k, (long long)a->iters,
           (long long)a->threads, a->space, kvq_kmeans_init_name(p.init), (long long)a->reps);
    if (a->seeding && p.init == KVQ_KMEANS_INIT_PARALLEL) {
        fprintf(stderr, "bench_kmeans_bounds: --seeding 1 times the k-means++ seedings, "
                        "not k-means||\n");
        goto done;
    }
    if (a->seeding) {
        rc = run_seeding(x, a, &p);
        goto done;
    }
    for (int64_t rep = 0; rep < a->reps; rep++) {
        const double c0 = bench_cpu_now();
        if (fit_once(x, a, &p, KVQ_KM_ENGINE_BOUNDS, cent, &s, skipped, tr))
            goto done;
        const double cpu = bench_cpu_now() - c0;
        if (rep == 0 || s.total_seconds < best.total_seconds) {
            cpu_best = cpu;
            kvq_kmeans_stats_free(&best);
            best = s;
        } else {
            kvq_kmeans_stats_free(&s);
        }
        memset(&s, 0, sizeof s);
        printf("  rep %lld: bounded fit %.3f s\n", (long long)rep, best.total_seconds);
    }
    double lloyd = 0;
    for (int32_t t = 0; t < best.n_iters; t++) {
        printf("  iter %2d: %.4f s  skipped %.4f  inertia %.9e\n", t, best.iter_seconds[t],
               skipped[t], best.inertia[t]);
        lloyd += best.iter_seconds[t];
    }
    const double gemm = bench_sgemm_seconds(x, cent, a->n, d, k, (int)a->threads, 8192, 3);
    const double floor = gemm * (double)best.n_iters;
    printf("  bounded fit: %.3f s total [cpu %.3f s] = seeding %.3f s + %d iterations %.3f s\n",
           best.total_seconds, cpu_best, best.seed_seconds, best.n_iters, lloyd);
    printf("  SGEMM floor: %.4f s per n x k x d SGEMM (OpenBLAS, %lld threads) x %d = %.3f s\n",
           gemm, (long long)a->threads, best.n_iters, floor);
    printf("  fit / SGEMM floor: %.3f (Lloyd alone: %.3f)\n", best.total_seconds / floor,
           lloyd / floor);
    printf("  final inertia %.9e  empty clusters repaired: %lld\n",
           best.inertia[best.n_iters - 1], (long long)best.n_empty_repairs);
    if (a->dump) {
        char path[4096];
        p.max_iters = 0; /* the seeding's centroids */
        kvq_kmeans_stats_free(&s);
        if (kvq_kmeans_fit(x, a->n, d, NULL, &p, cent, NULL, &s, &e) != KVQ_OK) {
            fprintf(stderr, "bench_kmeans_bounds: %s\n", e.msg);
            goto done;
        }
        p.max_iters = (int32_t)a->iters;
        snprintf(path, sizeof path, "%s/x.npy", a->dump);
        int bad = bench_write_npy(path, x, a->n, d);
        snprintf(path, sizeof path, "%s/init.npy", a->dump);
        bad |= bench_write_npy(path, cent, k, d);
        if (bad) {
            fprintf(stderr, "bench_kmeans_bounds: cannot write %s\n", path);
            goto done;
        }
        printf("  wrote %s/x.npy, %s/init.npy\n", a->dump, a->dump);
    }
    rc = 0;
    if (a->plain) {
        float *cb = malloc((size_t)k * d * sizeof *cb);
        if (!cb || fit_once(x, a, &p, KVQ_KM_ENGINE_BOUNDS, cb, &s, NULL, tr))
            rc = 1;
        else
            rc = check_plain(x, a, &p, tr, &s, cb);
        free(cb);
    }
done:
    kvq_kmeans_stats_free(&s);
    kvq_kmeans_stats_free(&best);
    free(x);
    free(cent);
    free(skipped);
    free(tr);
    return rc;
}

int main(int argc, char **argv)
{
    args a = {.n = 81920, .d = 128, .k = 4096, .iters = 25, .threads = 2, .seed = 1,
              .reps = 1, .plain = 0, .groups = 0, .filters = 1, .init = NULL, .space = "keys",
              .dump = NULL};
    if (parse(argc, argv, &a) != 0)
        return 2;
    return run(&a);
}
