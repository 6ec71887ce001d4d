/*
 * lloyd_batched.h — k-means of many heads at once on the GPU, device-resident
 * (kmeans/cuda/lloyd_batched.cu; built with `make CUDA=1` only): the shape of `kvq fit`,
 * many small problems, batched as flash-kmeans does. The points [h, n, d], the centroids,
 * the assignments and every per-cluster sum stay on the device; each Lloyd iteration
 * brings back one inertia (and a stop flag) per head. Seeding (k-means++ on a strided
 * subsample) and the empty-cluster repair run on the device too. The per-element logic is
 * kmeans/cuda/lloyd_hd.h, which the CPU tests run.
 *
 * Differences from kvq_kmeans_fit (the CPU fit), by design: no weights; the seeding is
 * k-means++ on seed_points_per_centroid * k evenly spread points (kvq_lb_sub_index), not
 * greedy k-means++ on a random subsample; all n points train (no max_points_per_centroid
 * subsample); the repair's random signs come from a counter (kvq_lb_repair_sign). The
 * stopping rule per head is the CPU's (kvq_lb_converged); a head that stops keeps its
 * centroids while the others go on.
 *
 * Status: compiled and linked; never executed (no session has had a GPU: docs/cuda.md).
 */
#ifndef KVQ_KMEANS_CUDA_LLOYD_BATCHED_H
#define KVQ_KMEANS_CUDA_LLOYD_BATCHED_H

#include <stdint.h>

#include "kvq/common.h"
#include "kvq/kmeans.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvq_lb_stats {
    int32_t iters_run;      /* Lloyd iterations the batch ran (its slowest head) */
    int32_t *n_iters;       /* [h] iterations per head (each = assign + update, as the CPU) */
    double *inertia;        /* [h * max_iters] head b's inertia at iteration t:
                               inertia[b * max_iters + t]; 0 after the head stopped */
    double *inertia_final;  /* [h] over the n points for the returned centroids */
    int64_t *repairs;       /* [h] empty clusters refilled */
    double *iter_seconds;   /* [max_iters] wall time of each batch iteration */
    double seed_seconds, upload_seconds, total_seconds;
} kvq_lb_stats;

void kvq_lb_stats_free(kvq_lb_stats *s);

/* Fits p->k centroids to each of h heads x [h, n, d] (host, row-major): centroids
 * [h, k, d] out (with p->init == KVQ_KMEANS_INIT_GIVEN also in), assign [h, n] out or
 * NULL, stats or NULL (free with kvq_lb_stats_free). Uses p->k, max_iters, tol, seed,
 * init, seed_points_per_centroid (0: every point seeds). Needs 1 <= k <= n,
 * h * n < 2^31, h * k < 2^31. Errors: KVQ_E_INVALID_ARG, KVQ_E_NOMEM, KVQ_E_BACKEND. */
kvq_status kvq_km_cuda_fit_batched(const float *x, int32_t h, int64_t n, int32_t d,
                                   const kvq_kmeans_params *p, float *centroids,
                                   int32_t *assign, kvq_lb_stats *stats, kvq_err *err);

/* The device seeding alone (tests): k-means++ on m points of each head (x [h, n, d],
 * points kvq_lb_sub_index(q, m, n)); idx [h, k] out: the chosen subsample positions q;
 * centroids [h, k, d] out. */
kvq_status kvq_km_cuda_seed_batched(const float *x, int32_t h, int64_t n, int32_t d, int32_t k,
                                    int64_t m, uint64_t seed, float *centroids, int64_t *idx,
                                    kvq_err *err);

/* The device repair alone (tests): k_repair on cent [h, k, d], wsum, cin [h, k] (in and
 * out) at iteration it; repairs [h] out. */
kvq_status kvq_km_cuda_repair_batched(float *cent, int32_t h, int32_t k, int32_t d,
                                      double *wsum, double *cin, uint64_t seed, int32_t it,
                                      int64_t *repairs, kvq_err *err);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_KMEANS_CUDA_LLOYD_BATCHED_H */
