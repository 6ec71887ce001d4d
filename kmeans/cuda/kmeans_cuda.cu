/*
 * kmeans_cuda.cu — CUDA backend of k-means (built only with `make CUDA=1`).
 *
 * assign: cuBLAS SGEMM of a block of points against the centroids, then one warp
 *         per point takes the argmin of ||x||^2 + ||c||^2 - 2 x.c.
 * update: points are stably sorted by cluster (cub radix sort over the bits of k - 1, its
 *         buffers allocated once per context), then one thread
 *         block per cluster sums its points in double, in point order, one thread
 *         per dimension. No floating-point atomics, so results repeat run to run.
 * The per-element logic is kmeans/kmeans_kernels.h, shared with the CPU backend.
 */
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include <cub/device/device_radix_sort.cuh>

#include <thrust/binary_search.h>
#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/sequence.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kmeans/kmeans_internal.h"
#include "kmeans/kmeans_kernels.h"
#include "kmeans/cuda/km_cuda_check.h"

/* Upper bound on the device distance block (rows x kc floats). */
#define CUDA_BLOCK_BYTES ((size_t)256 << 20)

typedef struct cuda_ctx {
    int64_t n;
    int32_t d;
    float *x;         /* [n, d] */
    float *w;         /* [n] or NULL */
    float *xnorm;     /* [n] */
    int32_t *assign;  /* [n] last assignment */
    float *dist;      /* [n] last distances */
    int32_t *keys;    /* [n] the assignment sorted (update) */
    int64_t *iota;    /* [n] 0, 1, ..., n - 1 (update) */
    int64_t *order;   /* [n] points sorted by cluster (update) */
    void *sort_tmp;   /* cub's temporary storage (update) */
    size_t sort_tmp_bytes;
    float *cent;      /* [cap_k, d] */
    float *cnorm;     /* [cap_k] */
    int64_t *seg;     /* [cap_k + 1] cluster offsets in order (update) */
    double *wsum;     /* [cap_k] */
    float *s;         /* [s_cap] distance block */
    size_t s_cap;
    int32_t cap_k;
    cublasHandle_t blas;
} cuda_ctx;

/* ---- error mapping ------------------------------------------------------------------ */

#define CU_TRY(call, what) KM_CU_TRY("kmeans cuda", call, what)

/* After every kernel launch: a launch error (bad configuration, no kernel image for this
 * device) is reported at once, naming the kernel. */
#define CU_LAUNCHED(kernel) CU_TRY(cudaGetLastError(), "kernel " #kernel)

/* ---- kernels ------------------------------------------------------------------------- */

/* out[i] = ||x_i||^2 */
__global__ void k_norms(const float *x, long long n, int d, float *out)
{
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = kvq_km_norm2(x + i * d, d);
}

/* One warp per row of s [rows, kc] (= x.c): first minimum of the expanded distance. */
__global__ void k_argmin(const float *s, long long rows, int kc, const float *xnorm,
                         const float *cnorm, int32_t *assign, float *dist)
{
    long long row = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x & 31;
    if (row >= rows)
        return; /* whole warps leave together: row is uniform across a warp */
    const float *sr = s + row * kc;
    const float xn = xnorm[row];
    float best = INFINITY;
    int32_t bi = INT32_MAX;
    for (int j = lane; j < kc; j += 32) {
        float v = kvq_km_dist_from_dot(xn, cnorm[j], sr[j]);
        if (kvq_km_better(v, j, best, bi)) {
            best = v;
            bi = j;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        float ov = __shfl_down_sync(0xffffffffu, best, off);
        int32_t oi = __shfl_down_sync(0xffffffffu, bi, off);
        if (kvq_km_better(ov, oi, best, bi)) {
            best = ov;
            bi = oi;
        }
    }
    if (lane == 0) {
        assign[row] = bi;
        dist[row] = best;
    }
}

/* One block per cluster c: centroid c from its points order[seg[c] .. seg[c+1]),
 * thread t summing dimension t (and t + blockDim, ...) in double. */
__global__ void k_update(const float *x, const float *w, int d, const int64_t *order,
                         const int64_t *seg, float *cent, double *wsum)
{
    const int c = blockIdx.x;
    const int64_t q0 = seg[c], q1 = seg[c + 1];
    for (int t = threadIdx.x; t < d; t += blockDim.x) {
        double s = 0.0, ws = 0.0;
        for (int64_t q = q0; q < q1; q++) {
            const int64_t i = order[q];
            const float wi = w ? w[i] : 1.0f;
            s = kvq_km_accum(s, x[i * d + t], wi);
            ws += wi;
        }
        if (ws > 0.0)
            cent[(int64_t)c * d + t] = kvq_km_centroid_coord(s, ws);
        if (t == 0)
            wsum[c] = ws;
    }
}

/* ---- context ------------------------------------------------------------------------- */

static void cuda_destroy(void *vctx)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    if (!c)
        return;
    cudaFree(c->x);
    cudaFree(c->w);
    cudaFree(c->xnorm);
    cudaFree(c->assign);
    cudaFree(c->dist);
    cudaFree(c->keys);
    cudaFree(c->iota);
    cudaFree(c->order);
    cudaFree(c->sort_tmp);
    cudaFree(c->cent);
    cudaFree(c->cnorm);
    cudaFree(c->seg);
    cudaFree(c->wsum);
    cudaFree(c->s);
    if (c->blas)
        cublasDestroy(c->blas);
    free(c);
}

static kvq_status cuda_create(const float *x, const float *w, int64_t n, int32_t d,
                              int32_t threads, void **out, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    (void)threads;
    if (!c) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "kmeans cuda: context");
        goto done;
    }
    c->n = n;
    c->d = d;
    CU_TRY(cudaMalloc((void **)&c->x, (size_t)n * d * sizeof(float)), "points");
    CU_TRY(cudaMemcpy(c->x, x, (size_t)n * d * sizeof(float), cudaMemcpyHostToDevice),
           "upload points");
    if (w) {
        CU_TRY(cudaMalloc((void **)&c->w, (size_t)n * sizeof(float)), "weights");
        CU_TRY(cudaMemcpy(c->w, w, (size_t)n * sizeof(float), cudaMemcpyHostToDevice),
               "upload weights");
    }
    CU_TRY(cudaMalloc((void **)&c->xnorm, (size_t)n * sizeof(float)), "norms");
    CU_TRY(cudaMalloc((void **)&c->assign, (size_t)n * sizeof(int32_t)), "assignment");
    CU_TRY(cudaMalloc((void **)&c->dist, (size_t)n * sizeof(float)), "distances");
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        st = kvq_err_set(err, KVQ_E_BACKEND, "kmeans cuda: cublasCreate failed");
        goto done;
    }
    k_norms<<<(unsigned)((n + 255) / 256), 256>>>(c->x, (long long)n, d, c->xnorm);
    CU_LAUNCHED(k_norms);
    *out = c;
    c = NULL;
done:
    cuda_destroy(c);
    return st;
}

/* Room for kc centroids and their per-cluster arrays. */
static kvq_status ensure_k(cuda_ctx *c, int32_t kc, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    if (kc <= c->cap_k)
        return KVQ_OK;
    cudaFree(c->cent);
    cudaFree(c->cnorm);
    cudaFree(c->seg);
    cudaFree(c->wsum);
    c->cent = NULL;
    c->cnorm = NULL;
    c->seg = NULL;
    c->wsum = NULL;
    c->cap_k = 0;
    CU_TRY(cudaMalloc((void **)&c->cent, (size_t)kc * c->d * sizeof(float)), "centroids");
    CU_TRY(cudaMalloc((void **)&c->cnorm, (size_t)kc * sizeof(float)), "centroid norms");
    CU_TRY(cudaMalloc((void **)&c->seg, ((size_t)kc + 1) * sizeof(int64_t)), "segments");
    CU_TRY(cudaMalloc((void **)&c->wsum, (size_t)kc * sizeof(double)), "weights per cluster");
    c->cap_k = kc;
done:
    return st;
}

/* ---- assign ---------------------------------------------------------------------------- */

static kvq_status cuda_assign(void *vctx, const float *cent, int32_t kc, int32_t *assign,
                              float *dist2, kvq_err *err)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    kvq_status st = KVQ_OK;
    const int32_t d = c->d;
    int64_t rows = (int64_t)(CUDA_BLOCK_BYTES / sizeof(float) / (size_t)kc);
    if (rows < 1)
        rows = 1;
    if (rows > c->n)
        rows = c->n;
    const size_t need = (size_t)rows * (size_t)kc;
    const float one = 1.0f, zero = 0.0f;
    if ((st = ensure_k(c, kc, err)) != KVQ_OK)
        goto done;
    if (need > c->s_cap) {
        cudaFree(c->s);
        c->s = NULL;
        c->s_cap = 0;
        CU_TRY(cudaMalloc((void **)&c->s, need * sizeof(float)), "distance block");
        c->s_cap = need;
    }
    CU_TRY(cudaMemcpy(c->cent, cent, (size_t)kc * d * sizeof(float), cudaMemcpyHostToDevice),
           "upload centroids");
    k_norms<<<(unsigned)((kc + 255) / 256), 256>>>(c->cent, kc, d, c->cnorm);
    CU_LAUNCHED(k_norms);
    for (int64_t i0 = 0; i0 < c->n; i0 += rows) {
        const int64_t nr = c->n - i0 < rows ? c->n - i0 : rows;
        /* column-major: s^T [kc, nr] = C [kc, d] . X_b^T [d, nr]; row-major s [nr, kc] */
        if (cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, kc, (int)nr, d, &one, c->cent, d,
                        c->x + (size_t)i0 * d, d, &zero, c->s, kc) != CUBLAS_STATUS_SUCCESS) {
            st = kvq_err_set(err, KVQ_E_BACKEND, "kmeans cuda: cublasSgemm failed");
            goto done;
        }
        const long long threads = nr * 32;
        k_argmin<<<(unsigned)((threads + 255) / 256), 256>>>(
            c->s, nr, kc, c->xnorm + i0, c->cnorm, c->assign + i0, c->dist + i0);
        CU_LAUNCHED(k_argmin);
    }
    if (assign)
        CU_TRY(cudaMemcpy(assign, c->assign, (size_t)c->n * sizeof(int32_t),
                          cudaMemcpyDeviceToHost), "download assignment");
    if (dist2)
        CU_TRY(cudaMemcpy(dist2, c->dist, (size_t)c->n * sizeof(float), cudaMemcpyDeviceToHost),
               "download distances");
done:
    return st;
}

/* ---- update ------------------------------------------------------------------------------ */

static kvq_status cuda_update(void *vctx, const int32_t *assign, int32_t k, float *cent,
                              double *wsum, int64_t *count, kvq_err *err)
{
    cuda_ctx *c = (cuda_ctx *)vctx;
    kvq_status st = KVQ_OK;
    int64_t *seg_h = NULL;
    (void)assign; /* the device keeps the assignment of the last assign() call */
    if ((st = ensure_k(c, k, err)) != KVQ_OK)
        goto done;
    if (c->n > INT32_MAX) {
        st = kvq_err_set(err, KVQ_E_TOO_LARGE, "kmeans cuda: %lld points (at most 2^31 - 1)",
                         (long long)c->n);
        goto done;
    }
    if (!c->keys) {
        CU_TRY(cudaMalloc((void **)&c->keys, (size_t)c->n * sizeof(int32_t)), "sort keys");
        CU_TRY(cudaMalloc((void **)&c->iota, (size_t)c->n * sizeof(int64_t)), "sort order");
        CU_TRY(cudaMalloc((void **)&c->order, (size_t)c->n * sizeof(int64_t)), "sort order");
        try {
            thrust::device_ptr<int64_t> iota(c->iota);
            thrust::sequence(thrust::device, iota, iota + c->n);
        } catch (...) {
            st = kvq_err_set(err, KVQ_E_BACKEND, "kmeans cuda: point indices failed");
            goto done;
        }
    }
    /* rows of empty clusters must come back unchanged: start from the host values */
    CU_TRY(cudaMemcpy(c->cent, cent, (size_t)k * c->d * sizeof(float), cudaMemcpyHostToDevice),
           "upload centroids");
    {
        /* stable radix sort of (assignment, point index) over the bits of k - 1: points of
         * one cluster stay in point order */
        int bits = 1;
        while (bits < 31 && (1 << bits) < k)
            bits++;
        size_t need = 0;
        CU_TRY(cub::DeviceRadixSort::SortPairs(nullptr, need, (const unsigned *)c->assign,
                                               (unsigned *)c->keys, c->iota,
                                               c->order, (int)c->n, 0, bits),
               "sort size");
        if (need > c->sort_tmp_bytes) {
            cudaFree(c->sort_tmp);
            c->sort_tmp = NULL;
            c->sort_tmp_bytes = 0;
            CU_TRY(cudaMalloc(&c->sort_tmp, need), "sort storage");
            c->sort_tmp_bytes = need;
        }
        size_t have = c->sort_tmp_bytes;
        CU_TRY(cub::DeviceRadixSort::SortPairs(c->sort_tmp, have, (const unsigned *)c->assign,
                                               (unsigned *)c->keys, c->iota,
                                               c->order, (int)c->n, 0, bits),
               "sort points by cluster");
    }
    /* thrust reports failures by exception; none may cross into C */
    try {
        thrust::device_ptr<int32_t> keys(c->keys);
        thrust::device_ptr<int64_t> seg(c->seg);
        thrust::lower_bound(thrust::device, keys, keys + c->n,
                            thrust::counting_iterator<int32_t>(0),
                            thrust::counting_iterator<int32_t>(k + 1), seg);
    } catch (...) {
        st = kvq_err_set(err, KVQ_E_BACKEND, "kmeans cuda: cluster offsets failed");
    }
    if (st != KVQ_OK)
        goto done;
    {
        const int threads = c->d < 256 ? ((c->d + 31) / 32) * 32 : 256;
        k_update<<<(unsigned)k, threads>>>(c->x, c->w, c->d, c->order, c->seg, c->cent,
                                          c->wsum);
        CU_LAUNCHED(k_update);
    }
    seg_h = (int64_t *)malloc(((size_t)k + 1) * sizeof *seg_h);
    if (!seg_h) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "kmeans cuda: segments");
        goto done;
    }
    CU_TRY(cudaMemcpy(seg_h, c->seg, ((size_t)k + 1) * sizeof(int64_t), cudaMemcpyDeviceToHost),
           "download segments");
    CU_TRY(cudaMemcpy(cent, c->cent, (size_t)k * c->d * sizeof(float), cudaMemcpyDeviceToHost),
           "download centroids");
    CU_TRY(cudaMemcpy(wsum, c->wsum, (size_t)k * sizeof(double), cudaMemcpyDeviceToHost),
           "download weights");
    for (int32_t j = 0; j < k; j++)
        count[j] = seg_h[j + 1] - seg_h[j];
done:
    free(seg_h);
    return st;
}

extern "C" const kvq_km_backend kvq_km_backend_cuda = {
    "cuda", KVQ_KMEANS_DEVICE_CUDA, cuda_create, cuda_destroy, cuda_assign, cuda_update,
};
