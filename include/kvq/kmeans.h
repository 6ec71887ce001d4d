/*
 * kvq/kmeans.h — k-means (Lloyd) with k-means++ / greedy k-means++ / k-means|| /
 * random seeding, on the CPU (OpenBLAS) or a CUDA device (cuBLAS).
 *
 * This is the core of `kvq fit`: the codebooks of query-aware and grouped VQ are
 * k-means centroids of Z = K L (per group of dims). The loop is written once
 * (kmeans/kmeans.c); only the nearest-centroid search and the centroid update go
 * through a backend (kmeans/kmeans_cpu.c, kmeans/cuda/kmeans_cuda.cu).
 *
 * Data layout: points X [n, d] and centroids C [k, d] are f32, row-major, dense.
 *
 * Determinism: the same X, weights, parameters and seed give bit-identical
 * centroids and assignments on the CPU for ANY thread count (work is split into
 * blocks that depend only on n, k and d, and every reduction runs in block or
 * point order), on a given machine and OpenBLAS build. The CUDA backend does not
 * reproduce the CPU bits (no floating-point atomics are used, so it repeats itself).
 *
 * Distances: the scalar reference is ||x - c||^2 summed in a fixed order
 * (kmeans/kmeans_kernels.h). For d > 16 (or without AVX2) the CPU computes
 * ||x||^2 + ||c||^2 - 2 x.c, within KVQ_KMEANS_TOL_DIST of the reference (relative to
 * ||x||^2 + ||c||^2), so a near-tie may pick a different, equally near centroid: in the
 * Lloyd iterations of kvq_kmeans_fit with every term one fused multiply-add chain (the
 * same bits from any kernel or thread), in kvq_kmeans_assign with SGEMM; for d <= 16
 * with AVX2 or AVX-512 it computes the reference itself, bit for bit.
 *
 * Cost: one Lloyd iteration is at most 2 n k d flops plus O(n k) for the argmin and
 * O(n d) for the update. On the CPU with d > 16 the iterations after the first skip the
 * distances that cannot change an assignment (Yinyang bounds with a rounding margin:
 * the assignment of every iteration is still the one of computing every distance;
 * docs/kmeans.md), typically 98-99% of them on keys; memory n * k / 32 floats more. Seeding: random O(k d). The D^2 methods run on a seeded
 * subsample of s = min(n, seed_points_per_centroid * k) points, one pass over it per
 * chosen centroid: k-means++ k s d / 16 fused multiply-adds (AVX-512 lanes), greedy
 * k-means++ with t candidates k s d t' / 16 (t' = t rounded up to 1, 2, 4, 8, 16;
 * twice that on AVX2), i.e. with the defaults (s = 4k, t = 4) about k^2 d; k-means||
 * 2 s (oversample k) d SGEMM flops per round, then greedy k-means++ on the ~rounds x
 * oversample x k candidates. Seeding steps are small: they run on one thread or on
 * params.threads, whichever the first steps time as faster (same result either way).
 * Memory: the training set copy when subsampling (cap k d floats), the seeding copy
 * (s d floats plus at most 16 s floats of distances), O(n) per-point arrays, and per thread
 * one distance block of at most KVQ_KMEANS_BLOCK_BYTES.
 * The n x k distance matrix is never held whole.
 *
 * Threads: OpenMP with params.threads threads. OpenBLAS is called single-threaded
 * from inside the OpenMP region; the OpenBLAS thread count is set to 1 for the
 * duration of a call and restored on return (a process-global OpenBLAS setting:
 * do not run kvq_kmeans_* concurrently with other OpenBLAS users in one process).
 */
#ifndef KVQ_KMEANS_H
#define KVQ_KMEANS_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/kmeans.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include <stddef.h>
#include <stdint.h>
#include "kvq/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tolerance of the SGEMM distance against the scalar reference, relative to
 * ||x||^2 + ||c||^2 (cancellation in the expanded form is the error source). */
#define KVQ_KMEANS_TOL_DIST 1e-4

/* Default of kvq_kmeans_params.seed_points_per_centroid. */
#define KVQ_KMEANS_SEED_PPC_DEFAULT 4

/* Upper bound on one thread's distance block (rows x k floats), in bytes. */
#define KVQ_KMEANS_BLOCK_BYTES (4u << 20)

/* How the initial centroids are chosen. All methods are seeded and reproducible. */
typedef enum kvq_kmeans_init {
    KVQ_KMEANS_INIT_GREEDY_PP = 0, /* greedy k-means++: each step draws `greedy_trials`
                                      D^2 candidates and keeps the one that lowers the
                                      potential most (default) */
    KVQ_KMEANS_INIT_PP = 1,        /* exact k-means++ (one D^2 draw per step) */
    KVQ_KMEANS_INIT_PARALLEL = 2,  /* k-means|| (Bahmani et al.): `parallel_rounds`
                                      rounds sampling about oversample * k points each,
                                      then weighted greedy k-means++ on the candidates;
                                      for large n */
    KVQ_KMEANS_INIT_RANDOM = 3,    /* k distinct points chosen uniformly */
    KVQ_KMEANS_INIT_GIVEN = 4      /* use the centroids passed in `centroids` on entry */
} kvq_kmeans_init;

/* Where the hot steps run. AUTO = CUDA when kvq_cuda_available(), else CPU
 * (silently). CUDA without a usable device falls back to the CPU and logs one
 * KVQ_LOG_WARN line per call. */
typedef enum kvq_kmeans_device {
    KVQ_KMEANS_DEVICE_AUTO = 0,
    KVQ_KMEANS_DEVICE_CPU = 1,
    KVQ_KMEANS_DEVICE_CUDA = 2
} kvq_kmeans_device;

typedef struct kvq_kmeans_params {
    int32_t k;                  /* number of centroids, 1 <= k <= n. Default 256 */
    int32_t max_iters;          /* Lloyd iterations, >= 0 (0 = seeding only). Default 25 */
    double tol;                 /* stop when (I[t-1] - I[t]) / I[t-1] < tol, where I is
                                   the inertia; >= 0 (0 = run max_iters). Default 1e-4 */
    uint64_t seed;              /* seeds every random choice. Default 1234 */
    int32_t threads;            /* OpenMP threads, >= 1. Default 1 */
    kvq_kmeans_init init;       /* seeding method. Default KVQ_KMEANS_INIT_GREEDY_PP */
    int32_t greedy_trials;      /* candidates per greedy step; 0 = min(2 + floor(ln k), 4).
                                   Default 0 */
    int32_t parallel_rounds;    /* k-means|| rounds, >= 1. Default 5 */
    double parallel_oversample; /* k-means|| expected draws per round / k, > 0. Default 2 */
    int64_t max_points_per_centroid; /* train on a seeded uniform subsample of
                                   cap * k points when n > cap * k; 0 = never. Default 256 */
    int64_t min_points_per_centroid; /* warn (KVQ_LOG_WARN) when n < this * k; 0 = never.
                                   Default 39 */
    kvq_kmeans_device device;   /* Default KVQ_KMEANS_DEVICE_CPU */
    const char *label;          /* prefix of log lines and error messages, e.g.
                                   "L3H1g0"; NULL = "kmeans". Not copied. */
    kvq_callbacks cb;           /* log: INFO for subsampling and the backend, DEBUG per
                                   iteration; progress("kmeans", iter, max_iters) after
                                   each iteration, non-zero return -> KVQ_E_CANCELLED */
    int64_t seed_points_per_centroid; /* k-means++, greedy k-means++ and k-means|| run
                                   on a seeded uniform subsample of this * k training
                                   points when there are more; 0 = all. Seeding then
                                   costs O(k * this * k * d) whatever n is. Default
                                   KVQ_KMEANS_SEED_PPC_DEFAULT */
} kvq_kmeans_params;

/* The defaults listed above. */
kvq_kmeans_params kvq_kmeans_params_default(void);

/* Statistics of one fit. Arrays are malloc'd by kvq_kmeans_fit and released by
 * kvq_kmeans_stats_free (safe on a zeroed struct and after a failed fit). */
typedef struct kvq_kmeans_stats {
    int32_t n_iters;        /* Lloyd iterations run (each = assign + update) */
    int32_t converged;      /* 1 if stopped by tol (or zero inertia), 0 if max_iters */
    int64_t n_train;        /* points trained on (after subsampling) */
    double *inertia;        /* [n_iters] sum_i w_i ||x_i - c_a(i)||^2 over the training
                               points at the assignment of iteration t, i.e. for the
                               centroids entering it; inertia[0] is the seeding's potential */
    double *iter_seconds;   /* [n_iters] wall time of each iteration */
    int64_t *cluster_size;  /* [k] training points per cluster at the last assignment
                               (before the last update); with max_iters 0, all zero */
    double seed_seconds;    /* wall time of seeding (0 for KVQ_KMEANS_INIT_GIVEN) */
    double total_seconds;   /* wall time of the whole call */
    int64_t n_empty_repairs;/* empty clusters re-seeded by splitting a large one */
    double inertia_final;   /* inertia of ALL n points for the returned centroids when
                               assignments were requested; otherwise -1 */
    kvq_kmeans_device backend; /* the backend that ran: CPU or CUDA, never AUTO */
} kvq_kmeans_stats;

void kvq_kmeans_stats_free(kvq_kmeans_stats *s);

/*
 * Fits k centroids to X [n, d] (row-major f32) with optional sample weights.
 *
 *   x          [n, d] points; every value must be finite
 *   n, d       n >= 1, d >= 1
 *   weights    [n] non-negative finite weights with a positive sum, or NULL (all 1).
 *              A point of weight w acts as w copies of it.
 *   p          parameters (NULL = kvq_kmeans_params_default())
 *   centroids  [k, d] output; with KVQ_KMEANS_INIT_GIVEN also the input (the initial
 *              centroids, which must be finite)
 *   assign     [n] output or NULL: nearest returned centroid of every point (all n, even
 *              when training ran on a subsample); costs one more assignment pass
 *   stats      output or NULL; free with kvq_kmeans_stats_free
 *
 * Errors: KVQ_E_INVALID_ARG (NULL pointers, d < 1, n < 1, k < 1, k > n, bad parameter,
 * negative weight, zero total weight), KVQ_E_NUMERIC (a non-finite value; the message
 * names the row), KVQ_E_NOMEM, KVQ_E_BACKEND (BLAS/CUDA failure), KVQ_E_CANCELLED.
 * On error `centroids` and `assign` are unspecified.
 */
kvq_status kvq_kmeans_fit(const float *x, int64_t n, int32_t d, const float *weights,
                          const kvq_kmeans_params *p, float *centroids, int32_t *assign,
                          kvq_kmeans_stats *stats, kvq_err *err);

/*
 * Nearest centroid (ties to the lower index) of each point, by the same distances as
 * the Lloyd iterations: the encoding step.
 *
 *   x          [n, d] points (finite)
 *   centroids  [p->k, d]
 *   assign     [n] output: index in [0, k)
 *   dist2      [n] output or NULL: squared distance to that centroid (>= 0)
 *
 * Uses p->k, p->threads, p->device, p->label and p->cb only (p NULL = defaults).
 * Errors: KVQ_E_INVALID_ARG, KVQ_E_NUMERIC (non-finite point or centroid), KVQ_E_NOMEM,
 * KVQ_E_BACKEND. Cost: 2 n k d flops.
 */
kvq_status kvq_kmeans_assign(const float *x, int64_t n, int32_t d, const float *centroids,
                             const kvq_kmeans_params *p, int32_t *assign, float *dist2,
                             kvq_err *err);

/* Name of an init method ("greedy-k-means++", "k-means++", "k-means||", "random",
 * "given"), or "unknown". */
const char *kvq_kmeans_init_name(kvq_kmeans_init m);
/* Parses the names above (also "greedy", "kmeans++", "kmeans||", "parallel").
 * KVQ_E_INVALID_ARG names the text. */
kvq_status kvq_kmeans_init_parse(const char *s, kvq_kmeans_init *out, kvq_err *err);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_KMEANS_H */
