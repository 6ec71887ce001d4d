/*
 * kmeans_internal.h — the backend interface of the k-means driver, and the
 * seeding entry points. Not installed; shared by the kmeans sources, the CUDA backend
 * and tests/test_kmeans.c.
 */
#ifndef KVQ_KMEANS_INTERNAL_H
#define KVQ_KMEANS_INTERNAL_H

#include "kvq/common.h"
#include "kvq/kmeans.h"
#include "kvq/util.h"
#include "codebook/nearest.h" /* KVQ_KM_DIRECT_MAX_D */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- backend interface ---------------------------------------------------------
 * A backend holds one resident point set (the training set, or the points to
 * encode) and runs the two hot steps on it. The Lloyd driver (kmeans.c) and the
 * seeding (kmeans_seed.c) call only these. Every function returns KVQ_OK or sets err. */
typedef struct kvq_km_backend {
    const char *name; /* "cpu", "cuda" */
    kvq_kmeans_device device;

    /* Makes a context over x [n, d] and weights [n] (NULL = all 1). The CPU backend
     * keeps pointers (the caller keeps x and w alive until destroy); a device
     * backend copies them. */
    kvq_status (*create)(const float *x, const float *w, int64_t n, int32_t d,
                         int32_t threads, void **ctx, kvq_err *err);
    void (*destroy)(void *ctx); /* NULL is fine */

    /* Nearest of kc centroids [kc, d] (host memory) for every resident point:
     * assign [n] (ties to the lower index) and dist2 [n] or NULL (squared distance,
     * >= 0: the SGEMM expanded form, or exact on the CPU's small-d path). Host memory. */
    kvq_status (*assign)(void *ctx, const float *centroids, int32_t kc, int32_t *assign,
                         float *dist2, kvq_err *err);

    /* Centroid update from the assignment of the last assign() call (passed again
     * in `assign` [n], host): for every cluster c < k with positive weight,
     * centroids[c] = sum_i w_i x_i / sum_i w_i (summed in double, in point order);
     * clusters with zero weight keep their row untouched. wsum [k] and count [k]
     * receive the total weight and number of points per cluster. Host memory. */
    kvq_status (*update)(void *ctx, const int32_t *assign, int32_t k, float *centroids,
                         double *wsum, int64_t *count, kvq_err *err);
} kvq_km_backend;

extern const kvq_km_backend kvq_km_backend_cpu;
#ifdef KVQ_HAVE_CUDA
extern const kvq_km_backend kvq_km_backend_cuda;
#endif

/* Rows per distance block for kc centroids: depends on kc only (never on the
 * thread count), so block results and reductions are thread-count independent. */
int64_t kvq_km_block_rows(int32_t kc);

/* First minimum over j < kc of kvq_km_dist_from_dot(xn, cn[j], s[j]) (ties to the
 * lower index): the fused argmin of one row of the distance block. s [kc], cn [kc].
 * The AVX2 version (x86-64 only; call it only when kvq_cpu_has_avx2()) gives the
 * same index and distance bit for bit. */
void kvq_km_row_argmin_ref(const float *s, const float *cn, float xn, int32_t kc,
                           int32_t *out_idx, float *out_dist);
#if defined(__x86_64__) && defined(__GNUC__)
#define KVQ_KM_HAVE_AVX2_ARGMIN 1
void kvq_km_row_argmin_avx2(const float *s, const float *cn, float xn, int32_t kc,
                            int32_t *out_idx, float *out_dist);
/* Small-d path (d <= KVQ_KM_DIRECT_MAX_D, AVX2 only): nearest of kc centroids for
 * rows x [nr, d] by exact distances, equal bit for bit to kvq_km_l2sq + first minimum.
 * ct: the centroids transposed and zero-padded, [KVQ_KM_DIRECT_DPAD(d), roundup(kc, 8)].
 * assign [nr], dist2 [nr] or NULL. */
#define KVQ_KM_DIRECT_DPAD(d) ((d) <= 8 ? 8 : 16)
void kvq_km_assign_direct_avx2(const float *x, int64_t nr, int32_t d, const float *ct,
                               int32_t kc, int32_t *assign, float *dist2);
#endif
/* Up to KVQ_KM_DIRECT_MAX_D dims (codebook/nearest.h) the CPU backend skips SGEMM and
 * uses the direct path when the CPU has AVX2 (an SGEMM with K this small is bound by
 * writing the n x k block). */

/* AVX-512 versions (kmeans_avx512.c; call them only when kvq_cpu_has_avx512()), equal
 * bit for bit to the scalar references like the AVX2 ones. The direct path takes
 * sixteen centroids per register: ct is [KVQ_KM_DIRECT_DPAD(d), roundup(kc, 16)]. */
#if defined(__x86_64__) && defined(__GNUC__)
#define KVQ_KM_HAVE_AVX512 1
void kvq_km_row_argmin_avx512(const float *s, const float *cn, float xn, int32_t kc,
                              int32_t *out_idx, float *out_dist);
void kvq_km_assign_direct_avx512(const float *x, int64_t nr, int32_t d, const float *ct,
                                 int32_t kc, int32_t *assign, float *dist2);
#endif

/* ---- seeding kernel: distances to a few candidates -----------------------------------
 * The inner step of greedy k-means++ / k-means++ (kmeans_seed.c): the distance of every
 * point to nt <= 16 candidates, in one pass. Its unit is a tile of 16 lanes holding P
 * points x 16 / P candidates (P = 1, 2, 4, 8 or 16): lane l is point p = l % P and
 * candidate t = l / P, so a step with 1, 2, 4, 8 or 16 candidates costs 1/16, 1/8, 1/4,
 * 1/2 or 1 fused multiply-add per point and dim (AVX-512; twice that on AVX2).
 *
 *   xi    [ntiles, d, P]  the points interleaved: xi[(g * d + j) * P + p] = x[g * P + p][j]
 *   xn, w, dmin [ntiles * P]  per point: squared norm (kvq_km_norm2_fma), weight, current
 *                         squared distance to the nearest centroid (padding points: 0)
 *   ct    [d, 16]         candidate coordinates per lane: ct[j * 16 + l] = c_{l / P}[j]
 *   cn    [16]            candidate squared norms per lane (kvq_km_norm2_fma)
 *   dist  [ntiles, 16]    out: dist[g * 16 + l] = kvq_km_dist_from_dot(xn_i, cn[l], dot),
 *                         i = g * P + l % P, dot = fmaf(x_i[d-1], ct[d-1][l], ...
 *                         fmaf(x_i[0], ct[0][l], 0.0f))  (one fused chain, j ascending)
 *   pot   [16]            added to, per lane, in tile order g = 0, 1, ...:
 *                         pot[l] += (double)w_i * (double)min(dist[g * 16 + l], dmin_i)
 *
 * Every lane is one fused multiply-add chain and one double sum, so the AVX2 and AVX-512
 * versions equal the reference bit for bit. */
#define KVQ_KM_CAND_LANES 16
void kvq_km_cand_eval_ref(const float *xi, const float *xn, const float *w, const float *dmin,
                          int64_t ntiles, int32_t d, int32_t P, const float *ct,
                          const float *cn, float *dist, double *pot);
#if defined(__x86_64__) && defined(__GNUC__)
void kvq_km_cand_eval_avx2(const float *xi, const float *xn, const float *w, const float *dmin,
                           int64_t ntiles, int32_t d, int32_t P, const float *ct,
                           const float *cn, float *dist, double *pot);
void kvq_km_cand_eval_avx512(const float *xi, const float *xn, const float *w,
                             const float *dmin, int64_t ntiles, int32_t d, int32_t P,
                             const float *ct, const float *cn, float *dist, double *pot);
#endif
/* The same pass with a bf16 filter (kmeans_seed_avx512.c; AVX-512 BF16, call only when
 * kvq_km_seed_bf16_ok()): every lane whose s(i, c) > dmin_i it can prove from a bf16 copy
 * of the points (centred on a fixed mu) gets dist = +inf and adds w_i dmin_i to pot; the
 * tiles with a lane it cannot prove are computed as kvq_km_cand_eval_ref. So pot is the
 * reference's bit for bit, and min(dist, dmin_i) is too on every lane of `live`. Returns
 * the number of tiles computed exactly. */
typedef struct kvq_km_cand_bf16 {
    const uint16_t *xb;  /* [ntiles, dp / 2, P, 2] bf16 of fl(x - mu) (kvq_km_seed_bf16_row) */
    const float *bn;     /* [ntiles * P] ||xb_i||^2 */
    const float *yr;     /* [ntiles * P] 2^-8 ||x_i - mu||, rounded up */
    const uint16_t *cb;  /* [dp / 2, 16, 2] the candidates' rows of xb, by lane */
    const float *bnc;    /* [16] their bn, by lane */
    const float *zr;     /* [16] their yr, by lane */
    int32_t dp;          /* d rounded up to even */
    uint32_t live;       /* the lanes in use (the others are proved by fiat) */
    float eta;           /* the expanded form's rounding bound (kmeans_bounds.c) */
    float kappa;         /* the bf16 expanded form's: (dp + 16) 2^-22 */
} kvq_km_cand_bf16;
int kvq_km_seed_bf16_ok(void);
/* x [d] -> out[(j / 2) * stride + j % 2] = bf16(fl(x_j - mu_j)) (0 pads an odd d), *bn its
 * squared norm, *yr = 2^-8 ||x - mu|| rounded up. */
void kvq_km_seed_bf16_row(const float *x, const float *mu, int32_t d, uint16_t *out,
                          int64_t stride, float *bn, float *yr);
#if defined(__x86_64__) && defined(__GNUC__)
int64_t kvq_km_cand_eval_bf16_avx512(const float *xi, const float *xn, const float *w,
                                     const float *dmin, int64_t ntiles, int32_t d, int32_t P,
                                     const float *ct, const float *cn, const kvq_km_cand_bf16 *f,
                                     float *dist, double *pot);
#endif
/* ||a||^2 as the fused chain above (dot of a with itself), so a point's distance to a
 * candidate equal to it comes out exactly 0. */
float kvq_km_norm2_fma(const float *a, int32_t d);

/* OpenBLAS single-threaded (BLAS is called from OpenMP threads). */
int kvq_km_blas_threads_begin(void);      /* returns the previous count */
void kvq_km_blas_threads_end(int previous);

/* ---- Lloyd with bounds (kmeans_bounds.c) ------------------------------------------
 * The CPU Lloyd iterations for d > KVQ_KM_DIRECT_MAX_D. Distances are the expanded form
 * kvq_km_dist_from_dot(xn, cn, dot) with xn, cn from kvq_km_norm2_fma and dot one fused
 * multiply-add chain over the dims in ascending order (the seeding's arithmetic), so a
 * distance has the same bits whichever kernel, block or thread computes it. Yinyang
 * bounds (one lower bound per group of centroids and point, an exact distance to the
 * point's own centroid every iteration) skip the distances that provably cannot change
 * an assignment, with a margin covering the rounding of the expanded form: the
 * assignment of every iteration is the one of computing every distance. */

/* dots of np <= 8 points xp[p] (each [d]) against a panel [d, ncols] (ncols a multiple
 * of 16): out[p * ncols + c] = fmaf(xp[p][d-1], panel[(d-1) * ncols + c], ... fmaf(
 * xp[p][0], panel[c], 0.0f)). */
void kvq_km_panel_dots_ref(const float *const *xp, int32_t np, int32_t d, const float *panel,
                           int32_t ncols, float *out);
/* out[i] = the same chain for x_i (x [m, d]) and centroid row a[i] of cent [*, d]. */
void kvq_km_pair_dots_ref(const float *x, int64_t m, int32_t d, const float *cent,
                          const int32_t *a, float *out);
/* The smallest of the gs distances s_u = kvq_km_dist_from_dot(xn, cn[u], o[u]): *m1, its
 * first position *pos (INT32_MAX when every s_u is +inf) and *m2, the smallest s_u
 * over u != *pos (+inf when gs is 1). */
void kvq_km_group_min_ref(const float *o, const float *cn, float xn, int32_t gs, float *m1,
                          int32_t *pos, float *m2);
/* The bf16 filter of the first dense pass (kmeans_first_avx512.c). */
typedef struct kvq_km_first {
    uint16_t *xb;    /* [m, dp] bf16 of fl(x - mu), by row */
    float *bn, *yr;  /* [m] ||xb_i||^2, 2^-8 ||x_i - mu|| rounded up */
    uint16_t *cpan;  /* [kpad / 32, dp / 2, 32, 2] the centroids in group order */
    float *cbn, *czr; /* [kpad] their bn and yr */
    float czmax;      /* the largest czr */
    int32_t dp;
    float kappa;
} kvq_km_first;
/* 1, or 0 when out of memory (then f is empty). */
int kvq_km_first_prep(kvq_km_first *f, const float *x, int64_t m, int32_t d, const float *cent,
                      const int32_t *gmem, int32_t k, int32_t kpad, int32_t threads);
void kvq_km_first_free(kvq_km_first *f);
#if defined(__x86_64__) && defined(__GNUC__)
void kvq_km_first_dots_avx512(const kvq_km_first *f, int64_t i0, int32_t np, int32_t kpad,
                              float *row);
void kvq_km_first_filter_avx512(const kvq_km_first *f, int64_t i, int32_t k, float e,
                                float *r, uint64_t *chunks);
#endif
/* One point's row of group bounds brought up to this call (block_plan): for g < T,
 * lb[g] = max((lb[g] - mv[g]) (1 - 2^-20), 0); the group is skipped (mk[g] = -1) when
 * lb[g]^2 (1 - 2^-20) > thr, else examined (mk[g] = +inf, and p is appended to
 * list[g * ldl + cnt[g]++]). The AVX-512 version gives the same bits. */
void kvq_km_plan_row_ref(float *lb, const float *mv, int32_t T, float thr, float *mk,
                         uint16_t *list, int32_t ldl, int32_t *cnt, uint16_t p);
#if defined(__x86_64__) && defined(__GNUC__)
void kvq_km_plan_row_avx512(float *lb, const float *mv, int32_t T, float thr, float *mk,
                            uint16_t *list, int32_t ldl, int32_t *cnt, uint16_t p);
#endif
#if defined(__x86_64__) && defined(__GNUC__)
void kvq_km_group_min_avx512(const float *o, const float *cn, float xn, int32_t gs,
                             float *m1, int32_t *pos, float *m2);
void kvq_km_panel_dots_avx512(const float *const *xp, int32_t np, int32_t d,
                              const float *panel, int32_t ncols, float *out);
void kvq_km_pair_dots_avx512(const float *x, int64_t m, int32_t d, const float *cent,
                             const int32_t *a, float *out);
void kvq_km_panel_dots_avx2(const float *const *xp, int32_t np, int32_t d,
                            const float *panel, int32_t ncols, float *out);
void kvq_km_pair_dots_avx2(const float *x, int64_t m, int32_t d, const float *cent,
                           const int32_t *a, float *out);
#endif
/* 1 when this CPU has the kernels above (AVX2 + FMA at least): the Lloyd iterations use
 * the bounds only then (a scalar fused multiply-add is a library call elsewhere), and
 * the backend's assign (SGEMM) otherwise. */
int kvq_km_bounds_fast(void);

/* How the CPU Lloyd iterations run (kvq_km_fit_ex). */
typedef enum kvq_km_engine {
    KVQ_KM_ENGINE_BOUNDS = 0,     /* skip distances by bounds (kvq_kmeans_fit's default) */
    KVQ_KM_ENGINE_EXHAUSTIVE = 1, /* the same arithmetic, every distance: the plain loop */
    KVQ_KM_ENGINE_BACKEND = 2     /* the backend's assign (SGEMM + argmin on the CPU) */
} kvq_km_engine;

typedef struct kvq_km_fit_opts {
    kvq_km_engine engine;
    int32_t groups;   /* centroid groups of the bounds; 0 = automatic */
    /* called after the assignment of every iteration (assign [m], dist [m]) */
    void (*trace)(void *user, int32_t it, const int32_t *assign, const float *dist,
                  int64_t m);
    void *user;
    double *skipped;  /* [max_iters] or NULL: per iteration, the fraction of the m k
                         point-centroid distances not computed */
    int32_t no_first_filter; /* 1: the seeding and the first pass without their bf16
                                filters (the same result, slower) */
} kvq_km_fit_opts;

/* kvq_kmeans_fit with options (o NULL = the defaults: bounds). The engines apply on
 * the CPU backend with d > KVQ_KM_DIRECT_MAX_D; elsewhere the backend's assign runs. */
kvq_status kvq_km_fit_ex(const float *x, int64_t n, int32_t d, const float *weights,
                         const kvq_kmeans_params *p, const kvq_km_fit_opts *o,
                         float *centroids, int32_t *assign, kvq_kmeans_stats *stats,
                         kvq_err *err);

/* State of the bounded (or exhaustive) assignment across the iterations of one fit. */
typedef struct kvq_km_bounds kvq_km_bounds;
/* exhaustive: bit 0, every distance every iteration; bit 1, the first pass without its
 * bf16 filter (kmeans_first_avx512.c; the result is the same).
 * Over the training points x [m, d] (kept by the caller), for k centroids; the groups
 * are made from the first centroids passed to kvq_km_bounds_assign. */
kvq_status kvq_km_bounds_create(const float *x, int64_t m, int32_t d, int32_t k,
                                int32_t threads, int exhaustive, int32_t groups,
                                kvq_km_bounds **out, kvq_err *err);
void kvq_km_bounds_destroy(kvq_km_bounds *b);
/* Nearest of the k centroids cent [k, d] for every point (ties to the lower index):
 * assign [m] (on entry the previous iteration's assignment, after the first call),
 * dist [m]. *skipped: the fraction of the m k distances not computed. */
kvq_status kvq_km_bounds_assign(kvq_km_bounds *b, const float *cent, int32_t *assign,
                                float *dist, double *skipped, kvq_err *err);

/* ---- seeding (kmeans_seed.c) ------------------------------------------------------- */

/* Copies a seeded uniform sample of m of the n rows (kept in row order) into
 * *xs [m, d] (malloc'd) and, when w is not NULL, *ws [m] (else *ws = NULL). The
 * caller frees both, also on error. Errors: KVQ_E_NOMEM. (kmeans.c) */
kvq_status kvq_km_subsample(const float *x, const float *w, int64_t n, int32_t d, int64_t m,
                            uint64_t seed, const char *label, float **xs, float **ws,
                            kvq_err *err);

/* The training set as the seeding sees it. */
typedef struct kvq_km_data {
    const float *x; /* [n, d] */
    const float *w; /* [n] or NULL (all 1) */
    int64_t n;
    int32_t d;
    int32_t force_threads; /* 1: the seeding's per-step loops always use p->threads
                              threads; 0: they pick 1 or p->threads by timing the first
                              steps (the result is the same either way). Tests set 1. */
    int32_t no_seed_filter; /* 1: the seeding's candidate passes compute every distance in
                               f32 (no bf16 filter; the result is the same). Tests set it. */
} kvq_km_data;

/* Chooses p->k initial centroids [k, d] from the data with method p->init (not
 * GIVEN). The D^2 methods run on a seeded subsample of p->seed_points_per_centroid * k
 * points when the data has more. k-means|| uses `be`/`ctx` (the backend holding the
 * same data) for its distance passes, or a context of `be` over the subsample.
 * Deterministic for a given seed, independent of p->threads.
 * Errors: KVQ_E_NOMEM, KVQ_E_BACKEND, KVQ_E_CANCELLED. */
kvq_status kvq_km_seed(const kvq_km_data *data, const kvq_kmeans_params *p,
                       const kvq_km_backend *be, void *ctx, float *centroids, kvq_err *err);

/* Potential sum_i w_i min_c ||x_i - c||^2 by the scalar reference (tests, logs). */
double kvq_km_potential_ref(const kvq_km_data *data, const float *centroids, int32_t k,
                            int32_t threads);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_KMEANS_INTERNAL_H */
