/*
 * retrieval_cuda.cu — CUDA kernels of the retrieval decode step (built only with
 * `make CUDA=1`; see retrieval_cuda.h for the contract and status).
 *
 *   k_lut       one thread per (head, group, centroid): the LUT entry from the f16 table
 *               (coalesced along the centroids, as the CPU kernel streams it)
 *   k_score     one thread per (head, candidate): kvq_rk_score_one
 *   k_topk      one block per head: three radix passes with a shared-memory histogram
 *               over the keys of kvq_rk_key, then an ordered emission (a block scan of
 *               per-thread counts over contiguous index ranges), so ties go to the lower
 *               index exactly as on the CPU
 *   k_rotate    one thread per (head, window row, pair): kvq_rk_rotate's arithmetic
 *   k_attend    one block per head: logits (a warp per attended row), softmax, and the
 *               weighted sum of values (a thread per (query head, dim))
 * The per-element logic is runtime/kernels/kernels.h, shared with the CPU kernels.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "runtime/cuda/retrieval_cuda.h"
#include "runtime/kernels/kernels.h"

#define TOPK_THREADS 256
#define ATT_THREADS 256
#define MAX_D 256

/* ---- LUT and scores ---------------------------------------------------------------- */

__global__ void k_lut(const uint16_t *table, const float *qs, int n_kv, int d, int K, int G,
                      float *lut)
{
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const int dg = d / G;
    if (i >= (long long)n_kv * G * K)
        return;
    const int c = (int)(i % K), g = (int)((i / K) % G), h = (int)(i / ((long long)K * G));
    const uint16_t *T = table + ((long long)h * G + g) * dg * K;
    const float *q = qs + (long long)h * d + g * dg;
    float s = 0.0f;
    for (int t = 0; t < dg; t++)
        s = fmaf(q[t], kvq_rk_h2f(T[(long long)t * K + c]), s);
    lut[((long long)h * G + g) * K + c] = s;
}

__global__ void k_score(const float *lut, const uint16_t *codes, int n_kv, int K, int G, int64_t ld,
                        int64_t first, int64_t nc, float *scores)
{
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)n_kv * nc)
        return;
    const int h = (int)(i / nc);
    const long long j = i % nc;
    scores[(long long)h * ld + j] = kvq_rk_score_one(lut + (long long)h * G * K, G, K,
                                                     codes + ((long long)h * ld + first + j) * G);
}

/* ---- top-k ---------------------------------------------------------------------------- */

/* Exclusive block scan of one value per thread (Hillis-Steele in shared memory). */
__device__ int64_t block_exclusive_scan(int64_t v, int64_t *sh, int64_t *total)
{
    const int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int off = 1; off < blockDim.x; off <<= 1) {
        const int64_t add = t >= off ? sh[t - off] : 0;
        __syncthreads();
        sh[t] += add;
        __syncthreads();
    }
    const int64_t incl = sh[t];
    *total = sh[blockDim.x - 1];
    __syncthreads();
    return incl - v;
}

/* Block h selects from scores[h*ld .. + nc) the top k_sel (k_sel < nc) into
 * idx[h*ld ..] (ascending, offset by `first`). */
__global__ void k_topk(const float *scores, int64_t ld, int64_t nc, int64_t k_sel, int64_t first,
                       uint32_t *keys, int32_t *idx)
{
    __shared__ unsigned int hist[KVQ_RK_HIST];
    __shared__ int64_t scan[TOPK_THREADS];
    __shared__ uint32_t sh_T, sh_prefix_mask;
    __shared__ int64_t sh_remaining;
    const int h = blockIdx.x, t = threadIdx.x;
    const float *s = scores + (long long)h * ld;
    uint32_t *ky = keys + (long long)h * ld;
    for (int64_t j = t; j < nc; j += blockDim.x)
        ky[j] = kvq_rk_key(s[j]);
    if (t == 0) {
        sh_T = 0;
        sh_prefix_mask = 0;
        sh_remaining = k_sel;
    }
    __syncthreads();
    for (int pass = 0; pass < 3; pass++) {
        const int shift = kvq_rk_digit_shift(pass);
        const uint32_t mask = kvq_rk_digit_mask(pass);
        for (int b = t; b < KVQ_RK_HIST; b += blockDim.x)
            hist[b] = 0;
        __syncthreads();
        const uint32_t T = sh_T, pm = sh_prefix_mask;
        for (int64_t j = t; j < nc; j += blockDim.x)
            if ((ky[j] & pm) == T)
                atomicAdd(&hist[(ky[j] >> shift) & mask], 1u);
        __syncthreads();
        if (t == 0) {
            int64_t rem = sh_remaining;
            uint32_t b = mask;
            while (b > 0 && (int64_t)hist[b] < rem) {
                rem -= hist[b];
                b--;
            }
            sh_remaining = rem;
            sh_T = T | (b << shift);
            sh_prefix_mask = pm | (mask << shift);
        }
        __syncthreads();
    }
    /* ordered emission: thread t owns the contiguous range [a, e) */
    const uint32_t T = sh_T;
    const int64_t per = (nc + blockDim.x - 1) / blockDim.x;
    const int64_t a = t * per < nc ? t * per : nc, e = a + per < nc ? a + per : nc;
    int64_t gt = 0, eq = 0, tot;
    for (int64_t j = a; j < e; j++) {
        gt += ky[j] > T;
        eq += ky[j] == T;
    }
    const int64_t eq_before = block_exclusive_scan(eq, scan, &tot);
    const int64_t ties = sh_remaining;
    const int64_t my_ties = eq_before >= ties ? 0 : (eq < ties - eq_before ? eq : ties - eq_before);
    const int64_t out_before = block_exclusive_scan(gt + my_ties, scan, &tot);
    int32_t *o = idx + (long long)h * ld;
    int64_t w = out_before, taken = 0;
    for (int64_t j = a; j < e; j++)
        if (ky[j] > T || (ky[j] == T && taken++ < my_ties))
            o[w++] = (int32_t)(first + j);
}

/* ---- window rotation and attention ------------------------------------------------------ */

__global__ void k_rotate(const uint16_t *k, int64_t ld, int n_kv, int d, int64_t w_beg, int window,
                         const float *wcos, const float *wsin, int layout, float *krot)
{
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)n_kv * window)
        return;
    const int h = (int)(i / window), a = (int)(i % window);
    float x[MAX_D];
    const uint16_t *row = k + ((long long)h * ld + w_beg + a) * d;
    for (int t = 0; t < d; t++)
        x[t] = kvq_rk_h2f(row[t]);
    kvq_rk_rotate(x, wcos + (long long)a * (d / 2), wsin + (long long)a * (d / 2), layout, d,
                  krot + ((long long)h * window + a) * d);
}

/* Block h: attended rows are the sinks [0, S), idx[h][0 .. n_sel) and the window
 * [w_beg, n); logits [gs, m] in global scratch. */
__global__ void k_attend(const kvq_rt_cuda_step s, int64_t n_sel, int64_t w_beg)
{
    const int h = blockIdx.x, gs = s.gs, d = s.d;
    const int64_t sinks = s.sink < w_beg ? s.sink : w_beg;
    const int64_t m_far = sinks + n_sel, m = m_far + (s.n - w_beg);
    const float scale = rsqrtf((float)d);
    const int32_t *sel = s.idx + (long long)h * s.ld;
    float *lg = s.logits + (long long)h * gs * s.ld;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    /* logits: one warp per (query head, row) */
    for (int64_t w = warp; w < (int64_t)gs * m; w += n_warps) {
        const int g = (int)(w / m);
        const int64_t a = w % m;
        const float *q;
        const uint16_t *kh = NULL;
        const float *kf = NULL;
        if (a < m_far) {
            const int64_t row = a < sinks ? a : sel[a - sinks];
            kh = s.k + ((long long)h * s.ld + row) * d;
            q = s.qb + ((long long)h * gs + g) * d;
        } else {
            kf = s.krot + ((long long)h * s.window + (a - m_far)) * d;
            q = s.qi + ((long long)h * gs + g) * d;
        }
        float acc = 0.0f;
        for (int t = lane; t < d; t += 32)
            acc = fmaf(q[t], kh ? kvq_rk_h2f(kh[t]) : kf[t], acc);
        for (int off = 16; off > 0; off >>= 1)
            acc += __shfl_down_sync(0xffffffffu, acc, off);
        if (lane == 0)
            lg[(long long)g * s.ld + a] = acc * scale;
    }
    __syncthreads();
    /* softmax: one warp per query head */
    for (int g = warp; g < gs; g += n_warps) {
        float *x = lg + (long long)g * s.ld, mx = -INFINITY, sum = 0.0f;
        for (int64_t a = lane; a < m; a += 32)
            mx = fmaxf(mx, x[a]);
        for (int off = 16; off > 0; off >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        for (int64_t a = lane; a < m; a += 32) {
            x[a] = expf(x[a] - mx);
            sum += x[a];
        }
        for (int off = 16; off > 0; off >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, off);
        const float inv = 1.0f / sum;
        for (int64_t a = lane; a < m; a += 32)
            x[a] *= inv;
    }
    __syncthreads();
    /* weighted sum of values: one thread per (query head, dim) */
    for (int i = threadIdx.x; i < gs * d; i += blockDim.x) {
        const int g = i / d, t = i % d;
        const float *p = lg + (long long)g * s.ld;
        float acc = 0.0f;
        for (int64_t a = 0; a < m; a++) {
            const int64_t row = a < sinks ? a : a < m_far ? sel[a - sinks] : w_beg + (a - m_far);
            acc = fmaf(p[a], kvq_rk_h2f(s.v[((long long)h * s.ld + row) * d + t]), acc);
        }
        s.out[((long long)h * gs + g) * d + t] = acc;
    }
}

/* ---- host -------------------------------------------------------------------------------- */

static kvq_status cu_check(cudaError_t e, const char *what, kvq_err *err)
{
    if (e == cudaSuccess)
        return KVQ_OK;
    return kvq_err_set(err, KVQ_E_BACKEND, "retrieval cuda: %s: %s", what, cudaGetErrorString(e));
}

static unsigned blocks_for(long long n, int threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

/* After every kernel launch: a launch error (bad configuration, no kernel image for this
 * device) is returned at once, naming the kernel. */
#define LAUNCHED(kernel)                                                                   \
    do {                                                                                   \
        kvq_status st_ = cu_check(cudaGetLastError(), "kernel " #kernel, err);             \
        if (st_ != KVQ_OK)                                                                 \
            return st_;                                                                    \
    } while (0)

extern "C" kvq_status kvq_rt_cuda_decode(const kvq_rt_cuda_step *s, kvq_err *err)
{
    if (s->d > MAX_D || s->d % 2 || s->G < 1 || s->d % s->G || s->n < 1 || s->gs < 1 ||
        s->n_kv < 1 || s->window < 0 || s->sink < 0 || s->ld < s->n)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval cuda: bad step sizes");
    const int64_t s_end = s->sink < s->n ? s->sink : s->n;
    const int64_t w_beg = s->n - s->window > s_end ? s->n - s->window : s_end;
    const int64_t nc = w_beg - s_end;
    int64_t n_sel = nc;
    kvq_status st;
    if (nc > 0) {
        k_lut<<<blocks_for((long long)s->n_kv * s->G * s->K, 256), 256>>>(s->table, s->qs, s->n_kv,
                                                                          s->d, s->K, s->G, s->lut);
        LAUNCHED(k_lut);
        k_score<<<blocks_for((long long)s->n_kv * nc, 256), 256>>>(
            s->lut, s->codes, s->n_kv, s->K, s->G, s->ld, s_end, nc, s->scores);
        LAUNCHED(k_score);
        if (s->k_sel < nc) {
            k_topk<<<s->n_kv, TOPK_THREADS>>>(s->scores, s->ld, nc, s->k_sel, s_end, s->keys,
                                              s->idx);
            LAUNCHED(k_topk);
            n_sel = s->k_sel;
        } else {
            /* every candidate: the index list is the candidate range */
            for (int h = 0; h < s->n_kv; h++) {
                int32_t *host = (int32_t *)malloc(sizeof(int32_t) * (size_t)nc);
                if (!host)
                    return kvq_err_set(err, KVQ_E_NOMEM, "retrieval cuda: out of memory");
                for (int64_t j = 0; j < nc; j++)
                    host[j] = (int32_t)(s_end + j);
                st = cu_check(cudaMemcpy(s->idx + (long long)h * s->ld, host, sizeof(int32_t) * nc,
                                         cudaMemcpyHostToDevice),
                              "index upload", err);
                free(host);
                if (st)
                    return st;
            }
        }
    } else {
        n_sel = 0;
    }
    const int window = (int)(s->n - w_beg);
    if (window > 0)
        k_rotate<<<blocks_for((long long)s->n_kv * window, 128), 128>>>(
            s->k, s->ld, s->n_kv, s->d, w_beg, window, s->wcos, s->wsin, s->layout, s->krot);
    if (window > 0)
        LAUNCHED(k_rotate);
    kvq_rt_cuda_step copy = *s;
    copy.window = window;
    k_attend<<<s->n_kv, ATT_THREADS>>>(copy, n_sel, w_beg);
    LAUNCHED(k_attend);
    return cu_check(cudaDeviceSynchronize(), "synchronize", err);
}

/* ---- selection of one (layer, KV head) step ------------------------------------------------ */

typedef struct cu_head {
    uint16_t *table; /* [G, dg, K] f16, device */
    uint16_t *codes; /* [cap, G], device */
    int64_t cap;     /* rows of codes */
    int32_t G, dg, K;
} cu_head;

typedef struct cu_slot {
    float *qp, *lut, *scores; /* [d], [G K], [n] */
    uint32_t *keys;           /* [n] */
    int32_t *idx;             /* [n] */
    int64_t n;                /* rows of scores / keys / idx (grows geometrically) */
    int64_t lut_n, d;         /* floats of lut, of qp */
    int64_t last_nc;          /* candidates of the last selection (kvq_rt_cuda_peek) */
    cudaStream_t stream;      /* this slot's stream (blocking: it waits for the legacy
                                 default stream, where put_codes copies) */
} cu_slot;

struct kvq_rt_cuda {
    int32_t n_layers, n_kv, n_slots;
    cu_head *head; /* [n_layers, n_kv] */
    cu_slot *slot; /* [n_slots] */
};

extern "C" kvq_status kvq_rt_cuda_create(int32_t n_layers, int32_t n_kv, int32_t n_slots,
                                         kvq_rt_cuda **out, kvq_err *err)
{
    *out = NULL;
    if (n_layers < 1 || n_kv < 1 || n_slots < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval cuda: bad context sizes");
    kvq_rt_cuda *c = (kvq_rt_cuda *)calloc(1, sizeof *c);
    if (c) {
        c->head = (cu_head *)calloc((size_t)n_layers * (size_t)n_kv, sizeof *c->head);
        c->slot = (cu_slot *)calloc((size_t)n_slots, sizeof *c->slot);
    }
    if (!c || !c->head || !c->slot) {
        kvq_rt_cuda_free(c);
        return kvq_err_set(err, KVQ_E_NOMEM, "retrieval cuda: out of memory");
    }
    c->n_layers = n_layers;
    c->n_kv = n_kv;
    c->n_slots = n_slots;
    *out = c;
    return KVQ_OK;
}

static void slot_release(cu_slot *s)
{
    if (s->stream)
        cudaStreamDestroy(s->stream);
    cudaFree(s->qp);
    cudaFree(s->lut);
    cudaFree(s->scores);
    cudaFree(s->keys);
    cudaFree(s->idx);
    memset(s, 0, sizeof *s);
}

extern "C" void kvq_rt_cuda_free(kvq_rt_cuda *c)
{
    if (!c)
        return;
    for (int64_t i = 0; c->head && i < (int64_t)c->n_layers * c->n_kv; i++) {
        cudaFree(c->head[i].table);
        cudaFree(c->head[i].codes);
    }
    for (int32_t t = 0; c->slot && t < c->n_slots; t++)
        slot_release(&c->slot[t]);
    free(c->head);
    free(c->slot);
    free(c);
}

static cu_head *head_of(kvq_rt_cuda *c, int32_t layer, int32_t head)
{
    if (layer < 0 || layer >= c->n_layers || head < 0 || head >= c->n_kv)
        return NULL;
    return &c->head[(size_t)layer * c->n_kv + head];
}

extern "C" kvq_status kvq_rt_cuda_set_table(kvq_rt_cuda *c, int32_t layer, int32_t head,
                                            const uint16_t *ct, int32_t G, int32_t dg, int32_t K,
                                            kvq_err *err)
{
    cu_head *H = head_of(c, layer, head);
    if (!H || G < 1 || dg < 1 || K < 1 || K > 65536 || H->table)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval cuda: bad table of layer %d head %d",
                           (int)layer, (int)head);
    const size_t bytes = (size_t)G * (size_t)dg * (size_t)K * sizeof(uint16_t);
    kvq_status st;
    if ((st = cu_check(cudaMalloc((void **)&H->table, bytes), "table allocation", err)) ||
        (st = cu_check(cudaMemcpy(H->table, ct, bytes, cudaMemcpyHostToDevice), "table upload",
                       err)))
        return st;
    H->G = G;
    H->dg = dg;
    H->K = K;
    return KVQ_OK;
}

extern "C" kvq_status kvq_rt_cuda_put_codes(kvq_rt_cuda *c, int32_t layer, int32_t head,
                                            const uint16_t *codes, int64_t first, int64_t n,
                                            int64_t cap, kvq_err *err)
{
    cu_head *H = head_of(c, layer, head);
    if (!H || !H->table || first < 0 || n < 0 || first + n > cap)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval cuda: bad code rows of layer %d "
                           "head %d", (int)layer, (int)head);
    const size_t row = (size_t)H->G * sizeof(uint16_t);
    kvq_status st;
    if (cap > H->cap) {
        uint16_t *grown = NULL;
        if ((st = cu_check(cudaMalloc((void **)&grown, (size_t)cap * row), "codes allocation",
                           err)))
            return st;
        if (H->cap &&
            (st = cu_check(cudaMemcpy(grown, H->codes, (size_t)H->cap * row,
                                      cudaMemcpyDeviceToDevice),
                           "codes copy", err))) {
            cudaFree(grown);
            return st;
        }
        cudaFree(H->codes);
        H->codes = grown;
        H->cap = cap;
    }
    if (n == 0)
        return KVQ_OK;
    return cu_check(cudaMemcpy(H->codes + (size_t)first * H->G, codes + (size_t)first * H->G,
                               (size_t)n * row, cudaMemcpyHostToDevice),
                    "codes upload", err);
}

/* Frees *p and allocates max(want, 2 * *have) elements of size es when want > *have
 * (geometric growth: a decode step that adds one candidate reallocates only at the
 * powers of two). */
static kvq_status grow(void **p, int64_t *have, int64_t want, size_t es, kvq_err *err)
{
    if (want <= *have)
        return KVQ_OK;
    const int64_t n = want > 2 * *have ? want : 2 * *have;
    cudaFree(*p);
    *p = NULL;
    *have = 0;
    kvq_status st = cu_check(cudaMalloc(p, es * (size_t)n), "scratch allocation", err);
    if (st == KVQ_OK)
        *have = n;
    return st;
}

/* Grows slot scratch to n candidates, a LUT of lut_n floats and a query of d floats;
 * makes the slot's stream on first use. */
static kvq_status slot_reserve(cu_slot *s, int64_t n, int64_t lut_n, int64_t d, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    if (!s->stream && (st = cu_check(cudaStreamCreate(&s->stream), "stream creation", err)))
        return st;
    if (n > s->n) {
        int64_t h1 = s->n, h2 = s->n, h3 = s->n;
        if ((st = grow((void **)&s->scores, &h1, n, sizeof(float), err)) ||
            (st = grow((void **)&s->keys, &h2, n, sizeof(uint32_t), err)) ||
            (st = grow((void **)&s->idx, &h3, n, sizeof(int32_t), err))) {
            s->n = 0; /* the three arrays no longer share one size: re-grow all next time */
            cudaFree(s->scores);
            cudaFree(s->keys);
            cudaFree(s->idx);
            s->scores = NULL;
            s->keys = NULL;
            s->idx = NULL;
            return st;
        }
        s->n = h1;
    }
    if ((st = grow((void **)&s->lut, &s->lut_n, lut_n, sizeof(float), err)) ||
        (st = grow((void **)&s->qp, &s->d, d, sizeof(float), err)))
        return st;
    return st;
}

extern "C" kvq_status kvq_rt_cuda_select(kvq_rt_cuda *c, int32_t slot, int32_t layer, int32_t head,
                                         const float *qp, int64_t first, int64_t nc, int64_t k,
                                         int32_t *sel, kvq_err *err)
{
    cu_head *H = head_of(c, layer, head);
    if (!H || !H->table || slot < 0 || slot >= c->n_slots || first < 0 || nc < 2 || k < 1 ||
        k >= nc || first + nc > H->cap || first + nc > INT32_MAX)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "retrieval cuda: bad selection of layer %d head %d", (int)layer,
                           (int)head);
    cu_slot *S = &c->slot[slot];
    const int32_t d = H->G * H->dg;
    kvq_status st;
    if ((st = slot_reserve(S, nc, (int64_t)H->G * H->K, d, err)) ||
        (st = cu_check(cudaMemcpyAsync(S->qp, qp, sizeof(float) * d, cudaMemcpyHostToDevice,
                                       S->stream),
                       "query upload", err)))
        return st;
    S->last_nc = 0;
    /* one KV head per launch: h = 0 everywhere, so the row stride ld is unused */
    k_lut<<<blocks_for((long long)H->G * H->K, 256), 256, 0, S->stream>>>(H->table, S->qp, 1, d,
                                                                           H->K, H->G, S->lut);
    LAUNCHED(k_lut);
    k_score<<<blocks_for(nc, 256), 256, 0, S->stream>>>(S->lut, H->codes, 1, H->K, H->G, nc,
                                                        first, nc, S->scores);
    LAUNCHED(k_score);
    k_topk<<<1, TOPK_THREADS, 0, S->stream>>>(S->scores, nc, nc, k, first, S->keys, S->idx);
    LAUNCHED(k_topk);
    if ((st = cu_check(cudaMemcpyAsync(sel, S->idx, sizeof(int32_t) * k, cudaMemcpyDeviceToHost,
                                       S->stream),
                       "selection download", err)) ||
        (st = cu_check(cudaStreamSynchronize(S->stream), "selection", err)))
        return st;
    S->last_nc = nc;
    return KVQ_OK;
}

extern "C" kvq_status kvq_rt_cuda_peek(kvq_rt_cuda *c, int32_t slot, float *lut, int64_t lut_n,
                                       float *scores, int64_t nc, kvq_err *err)
{
    if (slot < 0 || slot >= c->n_slots || lut_n < 0 || lut_n > c->slot[slot].lut_n || nc < 0 ||
        nc > c->slot[slot].last_nc)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval cuda: bad peek of slot %d",
                           (int)slot);
    cu_slot *S = &c->slot[slot];
    kvq_status st;
    if (lut_n && (st = cu_check(cudaMemcpy(lut, S->lut, sizeof(float) * lut_n,
                                           cudaMemcpyDeviceToHost), "LUT download", err)))
        return st;
    if (nc && (st = cu_check(cudaMemcpy(scores, S->scores, sizeof(float) * nc,
                                        cudaMemcpyDeviceToHost), "scores download", err)))
        return st;
    return KVQ_OK;
}

extern "C" kvq_status kvq_rt_cuda_topk(kvq_rt_cuda *c, int32_t slot, const float *scores,
                                       int64_t nc, int64_t k, int64_t first, int32_t *sel,
                                       kvq_err *err)
{
    if (slot < 0 || slot >= c->n_slots || first < 0 || nc < 2 || k < 1 || k >= nc ||
        first + nc > INT32_MAX)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval cuda: bad top-k sizes");
    cu_slot *S = &c->slot[slot];
    kvq_status st;
    if ((st = slot_reserve(S, nc, 1, 1, err)) ||
        (st = cu_check(cudaMemcpyAsync(S->scores, scores, sizeof(float) * nc,
                                       cudaMemcpyHostToDevice, S->stream),
                       "scores upload", err)))
        return st;
    S->last_nc = 0;
    k_topk<<<1, TOPK_THREADS, 0, S->stream>>>(S->scores, nc, nc, k, first, S->keys, S->idx);
    LAUNCHED(k_topk);
    if ((st = cu_check(cudaMemcpyAsync(sel, S->idx, sizeof(int32_t) * k, cudaMemcpyDeviceToHost,
                                       S->stream),
                       "selection download", err)))
        return st;
    return cu_check(cudaStreamSynchronize(S->stream), "top-k", err);
}
