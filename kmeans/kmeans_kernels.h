/*
 * kmeans_kernels.h — per-element logic of k-means, shared by the CPU backend and
 * the CUDA kernels (KVQ_HD = __host__ __device__ under nvcc, nothing in C).
 *
 * These functions are the specification: the CPU tests call them directly and
 * through the CPU backend, and the CUDA kernels call the same functions.
 * Plain C99/C++ only (no restrict, no libm), so one text compiles in both.
 */
#ifndef KVQ_KMEANS_KERNELS_H
#define KVQ_KMEANS_KERNELS_H

#include <stdint.h>

#include "common/hd.h"

/* Lanes of the fixed-order sums below: partial sums over j = l mod KVQ_KM_LANES,
 * then added lane 0, 1, ... in order. Fixed, so every caller gets the same bits,
 * and wide enough for the compiler to vectorize without reassociating. */
#define KVQ_KM_LANES 8

/* ---- distances ---------------------------------------------------------------- */

/* ||a - b||^2 over d floats: the scalar reference distance. */
KVQ_HD static inline float kvq_km_l2sq(const float *a, const float *b, int32_t d)
{
    float acc[KVQ_KM_LANES] = {0};
    int32_t j = 0;
    for (; j + KVQ_KM_LANES <= d; j += KVQ_KM_LANES)
        for (int l = 0; l < KVQ_KM_LANES; l++) {
            float t = a[j + l] - b[j + l];
            acc[l] += t * t;
        }
    for (int l = 0; j < d; j++, l++) {
        float t = a[j] - b[j];
        acc[l] += t * t;
    }
    float s = 0.0f;
    for (int l = 0; l < KVQ_KM_LANES; l++)
        s += acc[l];
    return s;
}

/* ||a||^2 over d floats, same summation order as kvq_km_l2sq. */
KVQ_HD static inline float kvq_km_norm2(const float *a, int32_t d)
{
    float acc[KVQ_KM_LANES] = {0};
    int32_t j = 0;
    for (; j + KVQ_KM_LANES <= d; j += KVQ_KM_LANES)
        for (int l = 0; l < KVQ_KM_LANES; l++)
            acc[l] += a[j + l] * a[j + l];
    for (int l = 0; j < d; j++, l++)
        acc[l] += a[j] * a[j];
    float s = 0.0f;
    for (int l = 0; l < KVQ_KM_LANES; l++)
        s += acc[l];
    return s;
}

/* Squared distance from the expanded form ||x||^2 + ||c||^2 - 2 x.c, clamped at 0
 * (cancellation can make it slightly negative). `dot` comes from SGEMM. */
KVQ_HD static inline float kvq_km_dist_from_dot(float xnorm, float cnorm, float dot)
{
    float v = (xnorm + cnorm) - 2.0f * dot;
    return v > 0.0f ? v : 0.0f;
}

/* ---- argmin ------------------------------------------------------------------- */

/* 1 if candidate (dist, idx) beats the current best (best, best_idx): smaller
 * distance, ties to the lower index. Order-independent, so any reduction tree
 * (lanes, warps) yields the sequential first minimum. */
KVQ_HD static inline int kvq_km_better(float dist, int32_t idx, float best, int32_t best_idx)
{
    return dist < best || (dist == best && idx < best_idx);
}

/* ---- centroid update ---------------------------------------------------------- */

/* One weighted term of a centroid sum, accumulated in double. */
KVQ_HD static inline double kvq_km_accum(double sum, float x, float w)
{
    return sum + (double)w * (double)x;
}

/* Centroid coordinate from its weighted sum and total weight (wsum > 0). */
KVQ_HD static inline float kvq_km_centroid_coord(double sum, double wsum)
{
    return (float)(sum / wsum);
}

/* ---- random numbers by counter ------------------------------------------------ */

/* SplitMix64 finalizer: a bijective 64-bit mix. */
KVQ_HD static inline uint64_t kvq_km_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A uniform double in [0, 1) that depends only on (seed, stream, i): lets every
 * point draw its own random number in parallel, independent of thread count. */
KVQ_HD static inline double kvq_km_uniform_at(uint64_t seed, uint64_t stream, uint64_t i)
{
    uint64_t h = kvq_km_mix64(seed ^ kvq_km_mix64(stream ^ kvq_km_mix64(i)));
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

#endif /* KVQ_KMEANS_KERNELS_H */
