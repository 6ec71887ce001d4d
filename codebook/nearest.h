/*
 * codebook/nearest.h — the nearest-centroid rule, written once: the distances and the
 * tie rule that k-means (kmeans/kmeans_kernels.h, the CPU backend, the CUDA kernels)
 * and kvq_codebook_encode both use (KVQ_HD = __host__ __device__ under nvcc, nothing
 * in C). Plain C99/C++ only (no restrict, no libm), so one text compiles in both.
 */
#ifndef KVQ_CODEBOOK_NEAREST_H
#define KVQ_CODEBOOK_NEAREST_H

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

/* x . c over d floats, summed in the order of kvq_km_norm2 (lanes, then lane 0, 1, ...):
 * the dot product of the codebook's expanded-form distance (kvq_codebook_encode). */
KVQ_HD static inline float kvq_km_dot(const float *a, const float *b, int32_t d)
{
    float acc[KVQ_KM_LANES] = {0};
    int32_t j = 0;
    for (; j + KVQ_KM_LANES <= d; j += KVQ_KM_LANES)
        for (int l = 0; l < KVQ_KM_LANES; l++)
            acc[l] += a[j + l] * b[j + l];
    for (int l = 0; j < d; j++, l++)
        acc[l] += a[j] * b[j];
    float s = 0.0f;
    for (int l = 0; l < KVQ_KM_LANES; l++)
        s += acc[l];
    return s;
}

/* Up to this many dims the nearest centroid is taken by the exact distance kvq_km_l2sq
 * (the CPU k-means backend's direct path on AVX2 CPUs, bit for bit); above it by the
 * expanded form kvq_km_dist_from_dot (k-means computes the dot with SGEMM). */
#define KVQ_KM_DIRECT_MAX_D 16

#endif /* KVQ_CODEBOOK_NEAREST_H */
