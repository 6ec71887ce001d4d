/*
 * kmeans_cpu.c — CPU backend of k-means: blocked SGEMM distances with a fused
 * argmin (AVX-512 or AVX2 when the CPU has it), an exact direct path for
 * d <= KVQ_KM_DIRECT_MAX_D on AVX2 / AVX-512 (equal to the scalar reference bit for
 * bit), and a centroid update summed in double in point order.
 *
 * Parallel work is split into blocks whose size depends on the number of
 * centroids only; each block's result is written to its own rows and no
 * floating-point sum crosses a block boundary in thread order, so the output is
 * bit-identical for any thread count. OpenBLAS runs single-threaded inside the
 * OpenMP region (see kvq_km_blas_threads_begin).
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <omp.h>

#include "kmeans/kmeans_internal.h"
#include "kmeans/kmeans_kernels.h"

typedef struct cpu_ctx {
    const float *x;  /* [n, d] borrowed */
    const float *w;  /* [n] borrowed, or NULL */
    int64_t n;
    int32_t d;
    int32_t threads;
    float *xnorm;    /* [n] ||x_i||^2 */
    double *sums;    /* [sums_k, d] per-cluster sums (update scratch) */
    int32_t sums_k;
} cpu_ctx;

/* ---- shared helpers ------------------------------------------------------------ */

int64_t kvq_km_block_rows(int32_t kc)
{
    int64_t rows = (int64_t)(KVQ_KMEANS_BLOCK_BYTES / sizeof(float)) / (kc > 0 ? kc : 1);
    if (rows < 8)
        rows = 8;
    if (rows > 4096)
        rows = 4096;
    return rows;
}

int kvq_km_blas_threads_begin(void)
{
    int prev = openblas_get_num_threads();
    openblas_set_num_threads(1);
    return prev;
}

void kvq_km_blas_threads_end(int previous)
{
    if (previous >= 1)
        openblas_set_num_threads(previous);
}

/* ---- create / destroy ------------------------------------------------------------- */

static void cpu_destroy(void *vctx)
{
    cpu_ctx *c = vctx;
    if (!c)
        return;
    free(c->xnorm);
    free(c->sums);
    free(c);
}

static kvq_status cpu_create(const float *x, const float *w, int64_t n, int32_t d,
                             int32_t threads, void **out, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    cpu_ctx *c = calloc(1, sizeof *c);
    size_t nb;
    if (!c || !kvq_size_mul((size_t)n, sizeof(float), &nb)) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "kmeans: cpu context for %lld points",
                         (long long)n);
        goto done;
    }
    c->x = x;
    c->w = w;
    c->n = n;
    c->d = d;
    c->threads = threads > 0 ? threads : 1;
    c->xnorm = malloc(nb ? nb : 1);
    if (!c->xnorm) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "kmeans: norms of %lld points", (long long)n);
        goto done;
    }
#pragma omp parallel for num_threads(c->threads) schedule(static) if (n > 4096)
    for (int64_t i = 0; i < n; i++)
        c->xnorm[i] = kvq_km_norm2(x + i * d, d);
    *out = c;
    c = NULL;
done:
    cpu_destroy(c);
    return st;
}

/* ---- assign: blocked SGEMM + fused argmin ------------------------------------------ */

/* First minimum of one distance row: s [kc] holds x.c_j for one point. Lanes keep
 * their own first minimum; kvq_km_better merges them into the sequential answer. */
void kvq_km_row_argmin_ref(const float *s, const float *cn, float xn, int32_t kc,
                           int32_t *out_idx, float *out_dist)
{
    float best[KVQ_KM_LANES];
    int32_t bi[KVQ_KM_LANES];
    for (int l = 0; l < KVQ_KM_LANES; l++) {
        best[l] = INFINITY;
        bi[l] = INT32_MAX;
    }
    int32_t j = 0;
    for (; j + KVQ_KM_LANES <= kc; j += KVQ_KM_LANES)
        for (int l = 0; l < KVQ_KM_LANES; l++) {
            const float v = kvq_km_dist_from_dot(xn, cn[j + l], s[j + l]);
            if (v < best[l]) {
                best[l] = v;
                bi[l] = j + l;
            }
        }
    for (int l = 0; j < kc; j++, l++) {
        float v = kvq_km_dist_from_dot(xn, cn[j], s[j]);
        if (kvq_km_better(v, j, best[l], bi[l])) {
            best[l] = v;
            bi[l] = j;
        }
    }
    float b = best[0];
    int32_t i = bi[0];
    for (int l = 1; l < KVQ_KM_LANES; l++)
        if (kvq_km_better(best[l], bi[l], b, i)) {
            b = best[l];
            i = bi[l];
        }
    *out_idx = i == INT32_MAX ? 0 : i; /* every distance overflowed to +inf */
    *out_dist = b;
}

static kvq_status cpu_assign(void *vctx, const float *cent, int32_t kc, int32_t *assign,
                             float *dist2, kvq_err *err)
{
    cpu_ctx *c = vctx;
    kvq_status st = KVQ_OK;
    const int32_t d = c->d;
    const int64_t rows = kvq_km_block_rows(kc);
    const int64_t nblocks = (c->n + rows - 1) / rows;
    const int threads = c->threads;
    void (*row_argmin)(const float *, const float *, float, int32_t, int32_t *, float *) =
        kvq_km_row_argmin_ref;
#ifdef KVQ_KM_HAVE_AVX2_ARGMIN
    const int avx512 = kvq_cpu_has_avx512();
    if (avx512)
        row_argmin = kvq_km_row_argmin_avx512;
    else if (kvq_cpu_has_avx2())
        row_argmin = kvq_km_row_argmin_avx2;
#endif
    float *cn = NULL;      /* [kc] ||c_j||^2 */
    float *scratch = NULL; /* [threads, rows, kc] x.c blocks */
    float *ct = NULL;      /* [dpad, roundup(kc, lanes)] centroids transposed (direct path;
                              lanes 16 with AVX-512, else 8) */
    size_t scratch_n, cn_b;
#ifdef KVQ_KM_HAVE_AVX2_ARGMIN
    if (d <= KVQ_KM_DIRECT_MAX_D && kvq_cpu_has_avx2()) {
        const int64_t lanes = avx512 ? 16 : 8;
        const int64_t kcp = ((int64_t)kc + lanes - 1) / lanes * lanes;
        void (*direct)(const float *, int64_t, int32_t, const float *, int32_t, int32_t *,
                       float *) = avx512 ? kvq_km_assign_direct_avx512
                                         : kvq_km_assign_direct_avx2;
        ct = calloc((size_t)KVQ_KM_DIRECT_DPAD(d) * (size_t)kcp, sizeof *ct);
        if (!ct) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "kmeans: centroids for k=%d", kc);
            goto done;
        }
        for (int32_t j = 0; j < kc; j++)
            for (int32_t t = 0; t < d; t++)
                ct[(size_t)t * kcp + j] = cent[(size_t)j * d + t];
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (nblocks > 1)
        for (int64_t b = 0; b < nblocks; b++) {
            const int64_t i0 = b * rows;
            const int64_t nr = c->n - i0 < rows ? c->n - i0 : rows;
            direct(c->x + (size_t)i0 * d, nr, d, ct, kc, assign + i0,
                   dist2 ? dist2 + i0 : NULL);
        }
        goto done;
    }
#endif
    if (!kvq_size_mul((size_t)rows, (size_t)kc, &scratch_n) ||
        !kvq_size_mul(scratch_n, (size_t)threads, &scratch_n) ||
        !kvq_size_mul(scratch_n, sizeof(float), &scratch_n) ||
        !kvq_size_mul((size_t)kc, sizeof(float), &cn_b)) {
        st = kvq_err_set(err, KVQ_E_TOO_LARGE, "kmeans: distance block for k=%d", kc);
        goto done;
    }
    cn = malloc(cn_b);
    scratch = malloc(scratch_n);
    if (!cn || !scratch) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "kmeans: distance block for k=%d", kc);
        goto done;
    }
    for (int32_t j = 0; j < kc; j++)
        cn[j] = kvq_km_norm2(cent + (size_t)j * d, d);

#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (nblocks > 1)
    for (int64_t b = 0; b < nblocks; b++) {
        float *s = scratch + (size_t)omp_get_thread_num() * (size_t)rows * (size_t)kc;
        const int64_t i0 = b * rows;
        const int64_t nr = c->n - i0 < rows ? c->n - i0 : rows;
        /* s [nr, kc] = X[i0 : i0 + nr] C^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, kc, d, 1.0f,
                    c->x + (size_t)i0 * d, d, cent, d, 0.0f, s, kc);
        for (int64_t r = 0; r < nr; r++) {
            int32_t idx;
            float dd;
            row_argmin(s + (size_t)r * kc, cn, c->xnorm[i0 + r], kc, &idx, &dd);
            assign[i0 + r] = idx;
            if (dist2)
                dist2[i0 + r] = dd;
        }
    }
done:
    free(cn);
    free(scratch);
    free(ct);
    return st;
}

/* ---- update: per-cluster sums in double, in point order -------------------------- */

/* Each thread owns a contiguous range of clusters and scans the points in order, adding
 * those of its clusters into their rows of c->sums: every cluster's sum runs over its
 * points in point order whatever the thread count (the same bits as gathering them
 * cluster by cluster), and the points are read in memory order rather than gathered. */
static kvq_status cpu_update(void *vctx, const int32_t *assign, int32_t k, float *cent,
                             double *wsum, int64_t *count, kvq_err *err)
{
    cpu_ctx *c = vctx;
    const int32_t d = c->d;
    size_t sb;
    if (!c->sums || c->sums_k < k) {
        free(c->sums);
        c->sums = NULL;
        if (!kvq_size_mul((size_t)k * (size_t)d, sizeof(double), &sb) ||
            !(c->sums = malloc(sb)))
            return kvq_err_set(err, KVQ_E_NOMEM, "kmeans: update for k=%d", k);
        c->sums_k = k;
    }
    for (int64_t i = 0; i < c->n; i++)
        assert(assign[i] >= 0 && assign[i] < k);
#pragma omp parallel num_threads(c->threads) if (k > 16 && c->n > 4096)
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int32_t j0 = (int32_t)((int64_t)k * t / nt), j1 = (int32_t)((int64_t)k * (t + 1) / nt);
        memset(c->sums + (size_t)j0 * d, 0, (size_t)(j1 - j0) * d * sizeof *c->sums);
        for (int32_t j = j0; j < j1; j++) {
            wsum[j] = 0.0;
            count[j] = 0;
        }
        for (int64_t i = 0; i < c->n; i++) {
            const int32_t j = assign[i];
            if (j < j0 || j >= j1)
                continue;
            const float wi = c->w ? c->w[i] : 1.0f;
            const float *xi = c->x + (size_t)i * d;
            double *s = c->sums + (size_t)j * d;
            for (int32_t u = 0; u < d; u++)
                s[u] = kvq_km_accum(s[u], xi[u], wi);
            wsum[j] += wi;
            count[j]++;
        }
        for (int32_t j = j0; j < j1; j++)
            if (wsum[j] > 0.0)
                for (int32_t u = 0; u < d; u++)
                    cent[(size_t)j * d + u] =
                        kvq_km_centroid_coord(c->sums[(size_t)j * d + u], wsum[j]);
    }
    return KVQ_OK;
}

const kvq_km_backend kvq_km_backend_cpu = {
    .name = "cpu",
    .device = KVQ_KMEANS_DEVICE_CPU,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .assign = cpu_assign,
    .update = cpu_update,
};
