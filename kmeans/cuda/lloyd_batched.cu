/*
 * lloyd_batched.cu — device-resident batched k-means (kmeans/cuda/lloyd_batched.h).
 *
 * One iteration for all h heads, nothing crossing to the host but h inertias and h stop
 * flags:
 *   assign   per block of rows: cublasSgemmStridedBatched (S_b = X_b C_b^T for every head
 *            b), then one warp per (head, row) takes the first minimum of the expanded
 *            distance (k_argmin_b: kvq_km_dist_from_dot, kvq_km_better)
 *   inertia  chunk sums in double in point order (k_chunk_sum), then per head in chunk
 *            order, and the stopping rule (k_head_state: kvq_lb_total, kvq_lb_converged)
 *   update   keys head * k + cluster, one stable cub radix sort of all h * n points, the
 *            segment offsets, then one block per (head, cluster) summing its points in
 *            double in point order (k_update_b), also its inertia share
 *   repair   one block per head refills empty clusters (k_repair: kvq_lb_repair_head_ref's
 *            steps, the heaviest cluster by a block reduction with kvq_lb_heavier)
 * Seeding: k-means++ on a strided subsample of each head, all heads per step
 * (k_seed_dmin, k_chunk_sum, k_seed_pick: kvq_lb_l2sq, kvq_lb_dmin, kvq_lb_pick).
 * No floating-point atomics anywhere: results repeat run to run.
 */
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include <cub/device/device_radix_sort.cuh>

#include <thrust/binary_search.h>
#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/sequence.h>

#include <stdlib.h>
#include <string.h>

#include "kmeans/cuda/lloyd_batched.h"
#include "kmeans/cuda/lloyd_hd.h"
#include "kmeans/cuda/km_cuda_check.h"
#include "kvq/util.h"

/* Upper bound on the distance block S [h, rows, k] (floats). */
#define LB_BLOCK_BYTES ((size_t)1 << 30)
#define LB_THREADS 256

typedef struct lb_dev {
    int32_t h, d, k;
    int64_t n;
    float *x, *xnorm;          /* [h n d], [h n] */
    float *cent, *cnorm;       /* [h k d], [h k] */
    int32_t *assign;           /* [h n] */
    float *dist;               /* [h n] */
    double *csum;              /* [h nchunks(n)] */
    double *prev, *state;      /* [h], [2h]: inertia, stop flag (the host's copy) */
    int32_t *done;             /* [h] */
    unsigned *keys, *keys_sorted; /* [h n] */
    int32_t *iota, *order;     /* [h n] */
    void *sort_tmp;
    size_t sort_tmp_bytes;
    int64_t *seg;              /* [h k + 1] */
    double *wsum, *cin;        /* [h k] */
    int64_t *repairs;          /* [h] */
    float *s;                  /* [h rows k] */
    int64_t rows;
    cublasHandle_t blas;
} lb_dev;

#define LB_TRY(call, what) KM_CU_TRY("kmeans cuda batched", call, what)
#define LB_LAUNCHED(kernel) LB_TRY(cudaGetLastError(), "kernel " #kernel)

static unsigned lb_grid(long long threads)
{
    return (unsigned)((threads + LB_THREADS - 1) / LB_THREADS);
}

/* ---- kernels ------------------------------------------------------------------------- */

__global__ void k_norms_b(const float *x, long long rows, int d, float *out)
{
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < rows)
        out[i] = kvq_km_norm2(x + i * d, d);
}

/* One warp per (head b, row i) of the block of rows i0 .. i0 + nr - 1. */
__global__ void k_argmin_b(const float *s, int h, long long nr, long long n, long long i0, int k,
                           const float *xnorm, const float *cnorm, int32_t *assign, float *dist)
{
    long long r = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x & 31;
    if (r >= (long long)h * nr)
        return;
    const long long b = r / nr, i = b * n + i0 + r % nr;
    const float *sr = s + r * k;
    const float *cn = cnorm + b * k;
    const float xn = xnorm[i];
    float best = INFINITY;
    int32_t bi = INT32_MAX;
    for (int j = lane; j < k; j += 32) {
        float v = kvq_km_dist_from_dot(xn, cn[j], sr[j]);
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
        assign[i] = bi;
        dist[i] = best;
    }
}

/* One thread per (head, chunk) of m points per head: csum = the chunk's sum. */
__global__ void k_chunk_sum(const float *v, int h, long long m, double *csum)
{
    const long long nch = kvq_lb_nchunks(m);
    long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (g >= (long long)h * nch)
        return;
    const long long b = g / nch, c = g % nch;
    const long long i1 = (c + 1) * KVQ_LB_CHUNK < m ? (c + 1) * KVQ_LB_CHUNK : m;
    csum[g] = kvq_lb_chunk_sum(v + b * m, NULL, c * KVQ_LB_CHUNK, i1);
}

/* One thread per head: its inertia at iteration it and the stopping rule. */
__global__ void k_head_state(const double *csum, int h, long long n, int it, double tol,
                             double *prev, int32_t *done, double *state)
{
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= h)
        return;
    const long long nch = kvq_lb_nchunks(n);
    const double in = kvq_lb_total(csum + b * nch, nch);
    if (!done[b]) {
        if (kvq_lb_converged(it, prev[b], in, tol))
            done[b] = 1;
        prev[b] = in;
    }
    state[b] = in;
    state[h + b] = done[b];
}

__global__ void k_keys(const int32_t *assign, int h, long long n, int k, unsigned *keys)
{
    long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (p < (long long)h * n)
        keys[p] = (unsigned)((p / n) * k + assign[p]);
}

/* One block per (head, cluster) g: centroid from its points order[seg[g] .. seg[g+1]) (global
 * point indices), thread t summing dimension t in double in point order; wsum and the
 * cluster's inertia share cin. Heads that stopped are left alone. */
__global__ void k_update_b(const float *x, const float *dist, int d, int k, const int32_t *order,
                           const int64_t *seg, const int32_t *done, float *cent, double *wsum,
                           double *cin)
{
    const long long g = blockIdx.x;
    if (done[g / k])
        return;
    const int64_t q0 = seg[g], q1 = seg[g + 1];
    for (int t = threadIdx.x; t < d; t += blockDim.x) {
        double s = 0.0;
        for (int64_t q = q0; q < q1; q++)
            s = kvq_km_accum(s, x[(long long)order[q] * d + t], 1.0f);
        if (q1 > q0)
            cent[g * d + t] = kvq_km_centroid_coord(s, (double)(q1 - q0));
    }
    if (threadIdx.x == 0) {
        double c = 0.0;
        for (int64_t q = q0; q < q1; q++)
            c += kvq_lb_term(NULL, 0, dist[order[q]]);
        wsum[g] = (double)(q1 - q0);
        cin[g] = c;
    }
}

/* One block per head: kvq_lb_repair_head_ref, with the heaviest cluster found by a block
 * reduction (kvq_lb_heavier is order-independent: the same j as the serial loop). */
__global__ void k_repair(float *cent, int k, int d, double *wsum, double *cin, uint64_t seed,
                         int it, const int32_t *done, int64_t *repairs)
{
    __shared__ double rw[LB_THREADS];
    __shared__ int32_t rj[LB_THREADS];
    const int b = blockIdx.x;
    if (done && done[b])
        return;
    float *cb = cent + (long long)b * k * d;
    double *wb = wsum + (long long)b * k, *ib = cin + (long long)b * k;
    int any = 0;
    for (int c = threadIdx.x; c < k; c += blockDim.x)
        any |= !(wb[c] > 0.0);
    if (!__syncthreads_or(any))
        return;
    int32_t nrep = 0;
    for (int c = 0; c < k; c++) {
        if (wb[c] > 0.0) /* uniform: every thread reads the value after the last barrier */
            continue;
        double bw = -1.0;
        int32_t bj = INT32_MAX;
        for (int q = threadIdx.x; q < k; q += blockDim.x)
            if (kvq_lb_heavier(wb[q], q, bw, bj)) {
                bw = wb[q];
                bj = q;
            }
        rw[threadIdx.x] = bw;
        rj[threadIdx.x] = bj;
        __syncthreads();
        for (int off = blockDim.x / 2; off > 0; off >>= 1) {
            if ((int)threadIdx.x < off &&
                kvq_lb_heavier(rw[threadIdx.x + off], rj[threadIdx.x + off], rw[threadIdx.x],
                               rj[threadIdx.x])) {
                rw[threadIdx.x] = rw[threadIdx.x + off];
                rj[threadIdx.x] = rj[threadIdx.x + off];
            }
            __syncthreads();
        }
        const int32_t j = rj[0];
        const double wj = rw[0];
        __syncthreads();
        if (!(wj > 0.0))
            break; /* uniform */
        const double sigma = kvq_lb_sigma(ib[j], wb[j], d);
        for (int t = threadIdx.x; t < d; t += blockDim.x)
            kvq_lb_split(cb[(long long)j * d + t], sigma, kvq_lb_repair_sign(seed, b, it, c, t),
                         &cb[(long long)c * d + t], &cb[(long long)j * d + t]);
        __syncthreads();
        if (threadIdx.x == 0) {
            wb[c] = wb[j] / 2;
            wb[j] -= wb[c];
            ib[c] = ib[j] / 2;
            ib[j] -= ib[c];
        }
        nrep++;
        __syncthreads();
    }
    if (threadIdx.x == 0)
        repairs[b] += nrep;
}

/* Seeding. xs [h, m, d]: the strided subsample. */
__global__ void k_seed_gather(const float *x, int h, long long n, int d, long long m, float *xs)
{
    long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (g >= (long long)h * m * d)
        return;
    const long long t = g % d, q = (g / d) % m, b = g / d / m;
    xs[g] = x[(b * n + kvq_lb_sub_index(q, m, n)) * d + t];
}

/* One thread per (head, point): the potential after seed s - 1 was added (s >= 1). */
__global__ void k_seed_dmin(const float *xs, int h, long long m, int d, int k, int s,
                            const float *cent, float *dmin)
{
    long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (g >= (long long)h * m)
        return;
    const long long b = g / m;
    const float dq = kvq_lb_l2sq(xs + g * d, cent + (b * k + s - 1) * d, d);
    dmin[g] = kvq_lb_dmin(dmin[g], dq, s);
}

/* One block per head: seed s of head b (kvq_lb_first or kvq_lb_pick), its row copied. */
__global__ void k_seed_pick(const float *xs, const float *dmin, const double *csum, long long m,
                            int d, int k, int s, uint64_t seed, float *cent, int64_t *idx)
{
    __shared__ long long pick;
    const int b = blockIdx.x;
    if (threadIdx.x == 0) {
        const double u = kvq_lb_seed_u(seed, b, s);
        pick = s == 0 ? kvq_lb_first(u, m)
                      : kvq_lb_pick(dmin + (long long)b * m, NULL, m,
                                    csum + (long long)b * kvq_lb_nchunks(m), u);
        idx[(long long)b * k + s] = pick;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < d; t += blockDim.x)
        cent[((long long)b * k + s) * d + t] = xs[((long long)b * m + pick) * d + t];
}

/* ---- host --------------------------------------------------------------------------- */

static void lb_free(lb_dev *g)
{
    cudaFree(g->x);
    cudaFree(g->xnorm);
    cudaFree(g->cent);
    cudaFree(g->cnorm);
    cudaFree(g->assign);
    cudaFree(g->dist);
    cudaFree(g->csum);
    cudaFree(g->prev);
    cudaFree(g->state);
    cudaFree(g->done);
    cudaFree(g->keys);
    cudaFree(g->keys_sorted);
    cudaFree(g->iota);
    cudaFree(g->order);
    cudaFree(g->sort_tmp);
    cudaFree(g->seg);
    cudaFree(g->wsum);
    cudaFree(g->cin);
    cudaFree(g->repairs);
    cudaFree(g->s);
    if (g->blas)
        cublasDestroy(g->blas);
    memset(g, 0, sizeof *g);
}

/* Device buffers of a batch; with x, the points uploaded and their norms taken. */
static kvq_status lb_alloc(lb_dev *g, const float *x, int32_t h, int64_t n, int32_t d, int32_t k,
                           kvq_err *err)
{
    kvq_status st = KVQ_OK;
    const size_t hn = (size_t)h * (size_t)n, hk = (size_t)h * (size_t)k;
    g->h = h;
    g->n = n;
    g->d = d;
    g->k = k;
    LB_TRY(cudaMalloc((void **)&g->cent, hk * d * sizeof(float)), "centroids");
    LB_TRY(cudaMalloc((void **)&g->wsum, hk * sizeof(double)), "cluster weights");
    LB_TRY(cudaMalloc((void **)&g->cin, hk * sizeof(double)), "cluster inertia");
    LB_TRY(cudaMalloc((void **)&g->repairs, (size_t)h * sizeof(int64_t)), "repairs");
    LB_TRY(cudaMemset(g->repairs, 0, (size_t)h * sizeof(int64_t)), "repairs");
    if (!x)
        return KVQ_OK;
    LB_TRY(cudaMalloc((void **)&g->x, hn * d * sizeof(float)), "points");
    LB_TRY(cudaMemcpy(g->x, x, hn * d * sizeof(float), cudaMemcpyHostToDevice), "upload points");
    LB_TRY(cudaMalloc((void **)&g->xnorm, hn * sizeof(float)), "point norms");
    LB_TRY(cudaMalloc((void **)&g->cnorm, hk * sizeof(float)), "centroid norms");
    LB_TRY(cudaMalloc((void **)&g->assign, hn * sizeof(int32_t)), "assignment");
    LB_TRY(cudaMalloc((void **)&g->dist, hn * sizeof(float)), "distances");
    LB_TRY(cudaMalloc((void **)&g->csum, (size_t)h * kvq_lb_nchunks(n) * sizeof(double)),
           "chunk sums");
    LB_TRY(cudaMalloc((void **)&g->prev, (size_t)h * sizeof(double)), "inertia");
    LB_TRY(cudaMalloc((void **)&g->state, 2 * (size_t)h * sizeof(double)), "state");
    LB_TRY(cudaMalloc((void **)&g->done, (size_t)h * sizeof(int32_t)), "stop flags");
    LB_TRY(cudaMemset(g->done, 0, (size_t)h * sizeof(int32_t)), "stop flags");
    LB_TRY(cudaMemset(g->prev, 0, (size_t)h * sizeof(double)), "inertia");
    LB_TRY(cudaMalloc((void **)&g->keys, hn * sizeof(unsigned)), "sort keys");
    LB_TRY(cudaMalloc((void **)&g->keys_sorted, hn * sizeof(unsigned)), "sort keys");
    LB_TRY(cudaMalloc((void **)&g->iota, hn * sizeof(int32_t)), "point indices");
    LB_TRY(cudaMalloc((void **)&g->order, hn * sizeof(int32_t)), "sort order");
    LB_TRY(cudaMalloc((void **)&g->seg, (hk + 1) * sizeof(int64_t)), "segments");
    g->rows = (int64_t)(LB_BLOCK_BYTES / sizeof(float) / hk);
    if (g->rows < 1)
        g->rows = 1;
    if (g->rows > n)
        g->rows = n;
    LB_TRY(cudaMalloc((void **)&g->s, (size_t)h * g->rows * k * sizeof(float)), "distance block");
    if (cublasCreate(&g->blas) != CUBLAS_STATUS_SUCCESS) {
        g->blas = NULL;
        return kvq_err_set(err, KVQ_E_BACKEND, "kmeans cuda batched: cublasCreate failed");
    }
    try {
        thrust::device_ptr<int32_t> io(g->iota);
        thrust::sequence(thrust::device, io, io + hn);
    } catch (...) {
        return kvq_err_set(err, KVQ_E_BACKEND, "kmeans cuda batched: point indices failed");
    }
    k_norms_b<<<lb_grid((long long)hn), LB_THREADS>>>(g->x, (long long)hn, d, g->xnorm);
    LB_LAUNCHED(k_norms_b);
done:
    return st;
}

/* Nearest centroid of every point of every head (assign, dist on the device). */
static kvq_status lb_assign(lb_dev *g, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    const float one = 1.0f, zero = 0.0f;
    const long long hk = (long long)g->h * g->k;
    k_norms_b<<<lb_grid(hk), LB_THREADS>>>(g->cent, hk, g->d, g->cnorm);
    LB_LAUNCHED(k_norms_b);
    for (int64_t i0 = 0; i0 < g->n; i0 += g->rows) {
        const int64_t nr = g->n - i0 < g->rows ? g->n - i0 : g->rows;
        /* column-major per head: S_b^T [k, nr] = C_b [k, d] . X_b[i0 ..]^T; row-major
         * S [h, nr, k] */
        if (cublasSgemmStridedBatched(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, g->k, (int)nr, g->d,
                                      &one, g->cent, g->d, (long long)g->k * g->d,
                                      g->x + (size_t)i0 * g->d, g->d, (long long)g->n * g->d,
                                      &zero, g->s, g->k, (long long)nr * g->k,
                                      g->h) != CUBLAS_STATUS_SUCCESS)
            return kvq_err_set(err, KVQ_E_BACKEND,
                               "kmeans cuda batched: cublasSgemmStridedBatched failed");
        k_argmin_b<<<lb_grid((long long)g->h * nr * 32), LB_THREADS>>>(
            g->s, g->h, nr, g->n, i0, g->k, g->xnorm, g->cnorm, g->assign, g->dist);
        LB_LAUNCHED(k_argmin_b);
    }
done:
    return st;
}

/* Inertia of every head at iteration it and the stopping rule; state [2h] to the host:
 * the only copy of a Lloyd iteration. */
static kvq_status lb_inertia(lb_dev *g, int32_t it, double tol, double *state, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    k_chunk_sum<<<lb_grid((long long)g->h * kvq_lb_nchunks(g->n)), LB_THREADS>>>(g->dist, g->h,
                                                                                g->n, g->csum);
    LB_LAUNCHED(k_chunk_sum);
    k_head_state<<<lb_grid(g->h), LB_THREADS>>>(g->csum, g->h, g->n, it, tol, g->prev, g->done,
                                               g->state);
    LB_LAUNCHED(k_head_state);
    LB_TRY(cudaMemcpy(state, g->state, 2 * (size_t)g->h * sizeof(double),
                      cudaMemcpyDeviceToHost), "download inertia");
done:
    return st;
}

/* Centroids of the heads still running from the assignment, then their repair. */
static kvq_status lb_update(lb_dev *g, uint64_t seed, int32_t it, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    const long long hn = (long long)g->h * g->n;
    const unsigned hk = (unsigned)g->h * (unsigned)g->k;
    int bits = 1;
    while (bits < 32 && (1ull << bits) < hk)
        bits++;
    size_t need = 0;
    k_keys<<<lb_grid(hn), LB_THREADS>>>(g->assign, g->h, g->n, g->k, g->keys);
    LB_LAUNCHED(k_keys);
    LB_TRY(cub::DeviceRadixSort::SortPairs(nullptr, need, g->keys, g->keys_sorted, g->iota,
                                           g->order, (int)hn, 0, bits), "sort size");
    if (need > g->sort_tmp_bytes) {
        cudaFree(g->sort_tmp);
        g->sort_tmp = NULL;
        g->sort_tmp_bytes = 0;
        LB_TRY(cudaMalloc(&g->sort_tmp, need), "sort storage");
        g->sort_tmp_bytes = need;
    }
    need = g->sort_tmp_bytes;
    LB_TRY(cub::DeviceRadixSort::SortPairs(g->sort_tmp, need, g->keys, g->keys_sorted, g->iota,
                                           g->order, (int)hn, 0, bits), "sort points");
    try {
        thrust::device_ptr<unsigned> ks(g->keys_sorted);
        thrust::device_ptr<int64_t> seg(g->seg);
        thrust::lower_bound(thrust::device, ks, ks + hn, thrust::counting_iterator<unsigned>(0),
                            thrust::counting_iterator<unsigned>(hk + 1), seg);
    } catch (...) {
        return kvq_err_set(err, KVQ_E_BACKEND, "kmeans cuda batched: cluster offsets failed");
    }
    {
        const int threads = g->d < 256 ? ((g->d + 31) / 32) * 32 : 256;
        k_update_b<<<hk, threads>>>(g->x, g->dist, g->d, g->k, g->order, g->seg, g->done,
                                    g->cent, g->wsum, g->cin);
        LB_LAUNCHED(k_update_b);
    }
    k_repair<<<g->h, LB_THREADS>>>(g->cent, g->k, g->d, g->wsum, g->cin, seed, it, g->done,
                                   g->repairs);
    LB_LAUNCHED(k_repair);
done:
    return st;
}

/* k-means++ on m points of each head: the centroids on the device, idx [h, k] (device). */
static kvq_status lb_seed(lb_dev *g, int64_t m, uint64_t seed, int64_t *idx, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    float *xs = NULL, *dmin = NULL;
    double *csum = NULL;
    const long long hm = (long long)g->h * m;
    LB_TRY(cudaMalloc((void **)&xs, (size_t)hm * g->d * sizeof(float)), "seeding points");
    LB_TRY(cudaMalloc((void **)&dmin, (size_t)hm * sizeof(float)), "seeding potentials");
    LB_TRY(cudaMemset(dmin, 0, (size_t)hm * sizeof(float)), "seeding potentials");
    LB_TRY(cudaMalloc((void **)&csum, (size_t)g->h * kvq_lb_nchunks(m) * sizeof(double)),
           "seeding sums");
    k_seed_gather<<<lb_grid(hm * g->d), LB_THREADS>>>(g->x, g->h, g->n, g->d, m, xs);
    LB_LAUNCHED(k_seed_gather);
    for (int32_t s = 0; s < g->k; s++) {
        if (s > 0) {
            k_seed_dmin<<<lb_grid(hm), LB_THREADS>>>(xs, g->h, m, g->d, g->k, s, g->cent, dmin);
            LB_LAUNCHED(k_seed_dmin);
            k_chunk_sum<<<lb_grid((long long)g->h * kvq_lb_nchunks(m)), LB_THREADS>>>(
                dmin, g->h, m, csum);
            LB_LAUNCHED(k_chunk_sum);
        }
        k_seed_pick<<<g->h, 128>>>(xs, dmin, csum, m, g->d, g->k, s, seed, g->cent, idx);
        LB_LAUNCHED(k_seed_pick);
    }
    LB_TRY(cudaDeviceSynchronize(), "seeding");
done:
    cudaFree(xs);
    cudaFree(dmin);
    cudaFree(csum);
    return st;
}

static kvq_status lb_check(int32_t h, int64_t n, int32_t d, int32_t k, kvq_err *err)
{
    if (h < 1 || n < 1 || d < 1 || k < 1 || k > n)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "kmeans cuda batched: h %d, n %lld, d %d, k %d (need k <= n)", h,
                           (long long)n, d, k);
    if ((int64_t)h * n >= INT32_MAX || (int64_t)h * k >= INT32_MAX)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "kmeans cuda batched: h x n and h x k must be below 2^31");
    return KVQ_OK;
}

void kvq_lb_stats_free(kvq_lb_stats *s)
{
    if (!s)
        return;
    free(s->n_iters);
    free(s->inertia);
    free(s->inertia_final);
    free(s->repairs);
    free(s->iter_seconds);
    memset(s, 0, sizeof *s);
}

static kvq_status lb_stats_alloc(kvq_lb_stats *s, int32_t h, int32_t iters, kvq_err *err)
{
    memset(s, 0, sizeof *s);
    s->n_iters = (int32_t *)calloc((size_t)h, sizeof *s->n_iters);
    s->inertia = (double *)calloc((size_t)h * (iters > 0 ? iters : 1), sizeof *s->inertia);
    s->inertia_final = (double *)calloc((size_t)h, sizeof *s->inertia_final);
    s->repairs = (int64_t *)calloc((size_t)h, sizeof *s->repairs);
    s->iter_seconds = (double *)calloc((size_t)(iters > 0 ? iters : 1), sizeof *s->iter_seconds);
    if (!s->n_iters || !s->inertia || !s->inertia_final || !s->repairs || !s->iter_seconds)
        return kvq_err_set(err, KVQ_E_NOMEM, "kmeans cuda batched: stats");
    return KVQ_OK;
}

/* The Lloyd loop: every head until it stops or max_iters; then the final assignment. */
static kvq_status lb_lloyd(lb_dev *g, const kvq_kmeans_params *p, double *state,
                           kvq_lb_stats *s, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    const int32_t h = g->h;
    int32_t *active = (int32_t *)malloc((size_t)h * sizeof *active);
    if (!active)
        return kvq_err_set(err, KVQ_E_NOMEM, "kmeans cuda batched: flags");
    for (int32_t b = 0; b < h; b++)
        active[b] = 1;
    for (int32_t it = 0; it < p->max_iters; it++) {
        const double t0 = kvq_now();
        if ((st = lb_assign(g, err)) != KVQ_OK || (st = lb_inertia(g, it, p->tol, state, err)))
            goto done;
        int32_t running = 0;
        for (int32_t b = 0; b < h; b++) {
            if (active[b]) {
                s->inertia[(size_t)b * p->max_iters + it] = state[b];
                s->n_iters[b] = it + 1;
            }
            active[b] = state[h + b] == 0.0;
            running += active[b];
        }
        s->iters_run = it + 1;
        if (running > 0 && (st = lb_update(g, p->seed, it, err)) != KVQ_OK)
            goto done;
        LB_TRY(cudaDeviceSynchronize(), "iteration");
        s->iter_seconds[it] = kvq_now() - t0;
        if (running == 0)
            break;
    }
    /* the returned centroids' assignment and inertia (the loop's last one was before its
     * update) */
    if ((st = lb_assign(g, err)) != KVQ_OK ||
        (st = lb_inertia(g, p->max_iters, p->tol, state, err)) != KVQ_OK)
        goto done;
    for (int32_t b = 0; b < h; b++)
        s->inertia_final[b] = state[b];
done:
    free(active);
    return st;
}

extern "C" kvq_status kvq_km_cuda_fit_batched(const float *x, int32_t h, int64_t n, int32_t d,
                                              const kvq_kmeans_params *p, float *centroids,
                                              int32_t *assign, kvq_lb_stats *stats,
                                              kvq_err *err)
{
    kvq_status st;
    lb_dev g;
    kvq_lb_stats s;
    double *state = NULL;
    int64_t *idx = NULL;
    const double t_start = kvq_now();
    memset(&g, 0, sizeof g);
    memset(&s, 0, sizeof s);
    if (!x || !centroids || !p || p->max_iters < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "kmeans cuda batched: bad arguments");
    if ((st = lb_check(h, n, d, p->k, err)) != KVQ_OK)
        return st;
    const int32_t k = p->k;
    if ((st = lb_stats_alloc(&s, h, p->max_iters, err)) != KVQ_OK)
        goto done;
    state = (double *)malloc(2 * (size_t)h * sizeof *state);
    if (!state) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "kmeans cuda batched: state");
        goto done;
    }
    if ((st = lb_alloc(&g, x, h, n, d, k, err)) != KVQ_OK)
        goto done;
    LB_TRY(cudaDeviceSynchronize(), "upload");
    s.upload_seconds = kvq_now() - t_start;
    if (p->init == KVQ_KMEANS_INIT_GIVEN) {
        LB_TRY(cudaMemcpy(g.cent, centroids, (size_t)h * k * d * sizeof(float),
                          cudaMemcpyHostToDevice), "upload centroids");
    } else {
        const double t0 = kvq_now();
        int64_t m = p->seed_points_per_centroid > 0 ? (int64_t)p->seed_points_per_centroid * k : n;
        if (m > n)
            m = n;
        LB_TRY(cudaMalloc((void **)&idx, (size_t)h * k * sizeof(int64_t)), "seed indices");
        if ((st = lb_seed(&g, m, p->seed, idx, err)) != KVQ_OK)
            goto done;
        s.seed_seconds = kvq_now() - t0;
    }
    if ((st = lb_lloyd(&g, p, state, &s, err)) != KVQ_OK)
        goto done;
    LB_TRY(cudaMemcpy(centroids, g.cent, (size_t)h * k * d * sizeof(float),
                      cudaMemcpyDeviceToHost), "download centroids");
    if (assign)
        LB_TRY(cudaMemcpy(assign, g.assign, (size_t)h * n * sizeof(int32_t),
                          cudaMemcpyDeviceToHost), "download assignment");
    LB_TRY(cudaMemcpy(s.repairs, g.repairs, (size_t)h * sizeof(int64_t), cudaMemcpyDeviceToHost),
           "download repairs");
    s.total_seconds = kvq_now() - t_start;
done:
    cudaFree(idx);
    lb_free(&g);
    free(state);
    if (stats && st == KVQ_OK)
        *stats = s;
    else
        kvq_lb_stats_free(&s);
    return st;
}

extern "C" kvq_status kvq_km_cuda_seed_batched(const float *x, int32_t h, int64_t n, int32_t d,
                                               int32_t k, int64_t m, uint64_t seed,
                                               float *centroids, int64_t *idx, kvq_err *err)
{
    kvq_status st;
    lb_dev g;
    int64_t *idx_d = NULL;
    memset(&g, 0, sizeof g);
    if ((st = lb_check(h, n, d, k, err)) != KVQ_OK)
        return st;
    if (m < k || m > n)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "kmeans cuda batched: seeding on %lld points",
                           (long long)m);
    if ((st = lb_alloc(&g, x, h, n, d, k, err)) != KVQ_OK)
        goto done;
    LB_TRY(cudaMalloc((void **)&idx_d, (size_t)h * k * sizeof(int64_t)), "seed indices");
    if ((st = lb_seed(&g, m, seed, idx_d, err)) != KVQ_OK)
        goto done;
    LB_TRY(cudaMemcpy(centroids, g.cent, (size_t)h * k * d * sizeof(float),
                      cudaMemcpyDeviceToHost), "download seeds");
    LB_TRY(cudaMemcpy(idx, idx_d, (size_t)h * k * sizeof(int64_t), cudaMemcpyDeviceToHost),
           "download seed indices");
done:
    cudaFree(idx_d);
    lb_free(&g);
    return st;
}

extern "C" kvq_status kvq_km_cuda_repair_batched(float *cent, int32_t h, int32_t k, int32_t d,
                                                 double *wsum, double *cin, uint64_t seed,
                                                 int32_t it, int64_t *repairs, kvq_err *err)
{
    kvq_status st;
    lb_dev g;
    const size_t hk = (size_t)h * k;
    memset(&g, 0, sizeof g);
    if ((st = lb_check(h, k, d, k, err)) != KVQ_OK)
        return st;
    if ((st = lb_alloc(&g, NULL, h, k, d, k, err)) != KVQ_OK)
        goto done;
    LB_TRY(cudaMemcpy(g.cent, cent, hk * d * sizeof(float), cudaMemcpyHostToDevice), "upload");
    LB_TRY(cudaMemcpy(g.wsum, wsum, hk * sizeof(double), cudaMemcpyHostToDevice), "upload");
    LB_TRY(cudaMemcpy(g.cin, cin, hk * sizeof(double), cudaMemcpyHostToDevice), "upload");
    k_repair<<<h, LB_THREADS>>>(g.cent, k, d, g.wsum, g.cin, seed, it, NULL, g.repairs);
    LB_LAUNCHED(k_repair);
    LB_TRY(cudaMemcpy(cent, g.cent, hk * d * sizeof(float), cudaMemcpyDeviceToHost), "download");
    LB_TRY(cudaMemcpy(wsum, g.wsum, hk * sizeof(double), cudaMemcpyDeviceToHost), "download");
    LB_TRY(cudaMemcpy(cin, g.cin, hk * sizeof(double), cudaMemcpyDeviceToHost), "download");
    LB_TRY(cudaMemcpy(repairs, g.repairs, (size_t)h * sizeof(int64_t), cudaMemcpyDeviceToHost),
           "download");
done:
    lb_free(&g);
    return st;
}
