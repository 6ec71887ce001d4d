/*
 * lloyd_hd.h — per-element logic of the device-resident batched Lloyd iterations
 * (kmeans/cuda/lloyd_batched.cu), written once for the CUDA kernels and the CPU
 * (KVQ_HD = __host__ __device__ under nvcc, nothing in C). The CPU test
 * tests/test_lloyd_hd.c checks these functions against independent computations, and
 * tests/cuda/test_cuda_paths.c checks the kernels against the CPU references below
 * (kvq_lb_seed_head_ref, kvq_lb_repair_head_ref), which are made of the same functions.
 *
 * Every sum that decides something is in a fixed order, so the device and the CPU give
 * the same bits: distances are one fused multiply-add chain (fmaf, j ascending), and
 * double sums run over chunks of KVQ_LB_CHUNK points in point order, then over the
 * chunks in order. Not installed; plain C99/C++.
 */
#ifndef KVQ_KMEANS_CUDA_LLOYD_HD_H
#define KVQ_KMEANS_CUDA_LLOYD_HD_H

#include <math.h>
#include <stdint.h>

#include "common/hd.h"
#include "kmeans/kmeans_kernels.h" /* kvq_km_mix64, kvq_km_uniform_at */

/* Points per chunk of the fixed-order double sums (inertia, the D^2 potential). */
#define KVQ_LB_CHUNK 256
/* Relative size of the split that refills an empty cluster (as kmeans.c's repair). */
#define KVQ_LB_REPAIR_EPS (1.0 / 1024.0)
/* Random streams of the seeding and the repair (kvq_km_uniform_at's `stream`). */
#define KVQ_LB_STREAM_SEED 0x5eedULL
#define KVQ_LB_STREAM_REPAIR 0x4e9aULL

/* ||a - b||^2 as one fused multiply-add chain over j = 0 .. d-1: the same bits on the
 * device and the CPU (fmaf is correctly rounded on both). */
KVQ_HD static inline float kvq_lb_l2sq(const float *a, const float *b, int32_t d)
{
    float acc = 0.0f;
    for (int32_t j = 0; j < d; j++) {
        const float t = a[j] - b[j];
        acc = fmaf(t, t, acc);
    }
    return acc;
}

/* One weighted term of an inertia or potential sum (w NULL: weight 1). */
KVQ_HD static inline double kvq_lb_term(const float *w, int64_t i, float dist)
{
    return (w ? (double)w[i] : 1.0) * (double)dist;
}

/* Sum of terms i0 .. i1-1 of one chunk, in point order. */
KVQ_HD static inline double kvq_lb_chunk_sum(const float *dist, const float *w, int64_t i0,
                                             int64_t i1)
{
    double s = 0.0;
    for (int64_t i = i0; i < i1; i++)
        s += kvq_lb_term(w, i, dist[i]);
    return s;
}

/* Number of chunks of n points. */
KVQ_HD static inline int64_t kvq_lb_nchunks(int64_t n)
{
    return (n + KVQ_LB_CHUNK - 1) / KVQ_LB_CHUNK;
}

/* The fixed-order total: chunk sums csum[0 .. nchunks-1] added in order. */
KVQ_HD static inline double kvq_lb_total(const double *csum, int64_t nchunks)
{
    double s = 0.0;
    for (int64_t c = 0; c < nchunks; c++)
        s += csum[c];
    return s;
}

/* The stopping rule of kmeans.c's Lloyd loop: zero inertia, or a relative change below
 * tol after the first iteration. */
KVQ_HD static inline int kvq_lb_converged(int32_t it, double prev, double inertia, double tol)
{
    const double ch = prev - inertia;
    return inertia == 0.0 || (it > 0 && (ch < 0 ? -ch : ch) < tol * prev);
}

/* ---- seeding: k-means++ (D^2 sampling) on a strided subsample ------------------------ */

/* The q-th of m seeding points among n (m <= n): evenly spread, strictly increasing. */
KVQ_HD static inline int64_t kvq_lb_sub_index(int64_t q, int64_t m, int64_t n)
{
    return (int64_t)(((unsigned long long)q * (unsigned long long)n) / (unsigned long long)m);
}

/* The uniform number of head h's step s (step 0 picks the first seed). */
KVQ_HD static inline double kvq_lb_seed_u(uint64_t seed, int64_t h, int64_t s)
{
    return kvq_km_uniform_at(seed ^ KVQ_LB_STREAM_SEED, (uint64_t)h, (uint64_t)s);
}

/* The first seed: point floor(u * m). */
KVQ_HD static inline int64_t kvq_lb_first(double u, int64_t m)
{
    const int64_t i = (int64_t)(u * (double)m);
    return i < m ? i : m - 1;
}

/* A point's potential after seed s (s >= 1) was added: its distance dq to that seed, or
 * the smaller of dq and the potential `old` before it. */
KVQ_HD static inline float kvq_lb_dmin(float old, float dq, int32_t s)
{
    return (s == 1 || dq < old) ? dq : old;
}

/* D^2 sampling over m points with potentials dmin [m] (weights w or NULL) and their
 * chunk sums csum [nchunks]: the first point i whose running sum, taken chunk by chunk,
 * passes u * total. A total of 0 (every point on a seed) picks floor(u * m). */
KVQ_HD static inline int64_t kvq_lb_pick(const float *dmin, const float *w, int64_t m,
                                         const double *csum, double u)
{
    const int64_t nch = kvq_lb_nchunks(m);
    const double total = kvq_lb_total(csum, nch);
    if (!(total > 0.0))
        return kvq_lb_first(u, m);
    const double target = u * total;
    double run = 0.0;
    int64_t c = 0;
    while (c < nch - 1 && run + csum[c] <= target)
        run += csum[c++];
    int64_t last = -1;
    const int64_t i1 = (c + 1) * KVQ_LB_CHUNK < m ? (c + 1) * KVQ_LB_CHUNK : m;
    for (int64_t i = c * KVQ_LB_CHUNK; i < i1; i++) {
        const double t = kvq_lb_term(w, i, dmin[i]);
        if (t > 0.0)
            last = i;
        run += t;
        if (run > target && t > 0.0)
            return i;
    }
    if (last >= 0)
        return last; /* target at the chunk's rounding edge */
    for (int64_t i = m - 1; i >= 0; i--) /* cannot happen: csum[c] > 0 has a positive term */
        if (kvq_lb_term(w, i, dmin[i]) > 0.0)
            return i;
    return 0;
}

/* The seeding of one head, the CPU reference of the device's (k_seed_* kernels): k seeds
 * from the m points xs [m, d] (the strided subsample); idx [k] and cent [k, d] out;
 * dmin [m] and csum [kvq_lb_nchunks(m)] scratch. */
static inline void kvq_lb_seed_head_ref(const float *xs, int64_t m, int32_t d, int32_t k,
                                        uint64_t seed, int64_t h, int64_t *idx, float *cent,
                                        float *dmin, double *csum)
{
    const int64_t nch = kvq_lb_nchunks(m);
    for (int32_t s = 0; s < k; s++) {
        int64_t i;
        if (s == 0) {
            i = kvq_lb_first(kvq_lb_seed_u(seed, h, 0), m);
        } else {
            const float *c = cent + (int64_t)(s - 1) * d;
            for (int64_t q = 0; q < m; q++)
                dmin[q] = kvq_lb_dmin(dmin[q], kvq_lb_l2sq(xs + q * d, c, d), s);
            for (int64_t ch = 0; ch < nch; ch++) {
                const int64_t i1 = (ch + 1) * KVQ_LB_CHUNK < m ? (ch + 1) * KVQ_LB_CHUNK : m;
                csum[ch] = kvq_lb_chunk_sum(dmin, 0, ch * KVQ_LB_CHUNK, i1);
            }
            i = kvq_lb_pick(dmin, 0, m, csum, kvq_lb_seed_u(seed, h, s));
        }
        idx[s] = i;
        for (int32_t t = 0; t < d; t++)
            cent[(int64_t)s * d + t] = xs[i * d + t];
    }
}

/* ---- empty-cluster repair ------------------------------------------------------------- */

/* 1 if cluster a (weight wa) is heavier than b (wb): more weight, ties to the lower index;
 * order-independent, so any reduction tree gives the sequential first maximum. */
KVQ_HD static inline int kvq_lb_heavier(double wa, int32_t a, double wb, int32_t b)
{
    return wa > wb || (wa == wb && a < b);
}

/* The sign (+1 or -1) of coordinate t of the split of empty cluster c of head h at
 * iteration it. */
KVQ_HD static inline double kvq_lb_repair_sign(uint64_t seed, int64_t h, int32_t it, int32_t c,
                                               int32_t t)
{
    const uint64_t stream = ((uint64_t)h << 40) ^ ((uint64_t)(uint32_t)it << 20) ^
                            (uint64_t)(uint32_t)c ^ KVQ_LB_STREAM_REPAIR;
    return (kvq_km_mix64(seed ^ kvq_km_mix64(stream ^ kvq_km_mix64((uint64_t)t))) >> 63) ? 1.0
                                                                                      : -1.0;
}

/* Splits coordinate `base` of the heavy cluster: the empty one gets base + sign * delta,
 * the heavy one base - sign * delta, delta = REPAIR_EPS * (|base| + sigma). */
KVQ_HD static inline void kvq_lb_split(float base, double sigma, double sign, float *to_empty,
                                       float *to_heavy)
{
    const double b = (double)base;
    const double delta = KVQ_LB_REPAIR_EPS * ((b < 0 ? -b : b) + sigma);
    *to_empty = (float)(b + sign * delta);
    *to_heavy = (float)(b - sign * delta);
}

/* sigma of cluster j: the RMS spread per dimension, from its inertia and weight. */
KVQ_HD static inline double kvq_lb_sigma(double cin, double wsum, int32_t d)
{
    return sqrt(cin / wsum / (double)d);
}

/* The repair of one head, the CPU reference of k_repair: every cluster c with zero
 * weight, in order, takes half of the heaviest cluster j (kvq_lb_heavier) and both move
 * apart by kvq_lb_split along kvq_lb_repair_sign. cent [k, d], wsum [k], cin [k]
 * (updated). Returns the number of repairs. */
KVQ_HD static inline int32_t kvq_lb_repair_head_ref(float *cent, int32_t k, int32_t d,
                                                    double *wsum, double *cin, uint64_t seed,
                                                    int64_t h, int32_t it)
{
    int32_t repairs = 0;
    for (int32_t c = 0; c < k; c++) {
        if (wsum[c] > 0.0)
            continue;
        int32_t j = 0;
        for (int32_t q = 1; q < k; q++)
            if (kvq_lb_heavier(wsum[q], q, wsum[j], j))
                j = q;
        if (!(wsum[j] > 0.0))
            break;
        const double sigma = kvq_lb_sigma(cin[j], wsum[j], d);
        for (int32_t t = 0; t < d; t++)
            kvq_lb_split(cent[(int64_t)j * d + t], sigma, kvq_lb_repair_sign(seed, h, it, c, t),
                         &cent[(int64_t)c * d + t], &cent[(int64_t)j * d + t]);
        wsum[c] = wsum[j] / 2;
        wsum[j] -= wsum[c];
        cin[c] = cin[j] / 2;
        cin[j] -= cin[c];
        repairs++;
    }
    return repairs;
}

#endif /* KVQ_KMEANS_CUDA_LLOYD_HD_H */
