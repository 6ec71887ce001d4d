/*
 * thresholds/lk_kernels.h — the inner loops of the fast LeanKV grid (profile_fast.c),
 * one setting and one query row at a time: significance, the gather of each token's
 * exponential, the significance sums and the output. Scalar references in
 * lk_kernels.c, AVX2 and AVX-512 versions in lk_kernels_avx2.c / lk_kernels_avx512.c,
 * chosen at run time; every version equals the scalar one bit for bit (the same
 * roundings in the same order: no FMA, the gather's four partial sums kept per lane;
 * tests/test_profile_fast.c). Not a public header.
 */
#ifndef KVQ_THRESHOLDS_LK_KERNELS_H
#define KVQ_THRESHOLDS_LK_KERNELS_H

#include <stddef.h>
#include <stdint.h>

typedef struct thr_lk_kernels {
    const char *name;
    /* sig[j] = max_g acc[g n + j] / (nq - qcum[j]) for j < len, +inf when nq <= qcum[j]
     * (the reference's current_significance) */
    void (*significance)(double *sig, const double *acc, int64_t n, int32_t gs,
                         const int64_t *qcum, int64_t nq, int64_t len);
    /* w[j] = ver[j] ? e[ver[j]][j] : 0 (as double) for j < len (ver in 0..3, e[0]
     * unused); returns their sum, added in four partial sums z[j mod 4], then
     * (z0 + z1) + (z2 + z3) */
    double (*gather)(const float *const e[4], const uint8_t *ver, int64_t len, double *w);
    /* acc[j] += w[j] a for j < len */
    void (*daxpy)(double *acc, double a, const double *w, int64_t len);
    /* o [d] = sum over j < len with ver[j] != 0, in order, of (float)(w[j] inv) times
     * row j of v[ver[j]] [., d], each term rounded as o[c] += a x[c] (v[0] unused) */
    void (*mix)(float *o, const double *w, double inv, const uint8_t *ver,
                const float *const v[4], int64_t len, int32_t d);
} thr_lk_kernels;

/* The kernels of level 0 (scalar), 1 (AVX2) or 2 (AVX-512), lowered to what this CPU
 * and build run; level < 0: the best. */
const thr_lk_kernels *thr_lk_kernels_get(int level);

#if defined(__x86_64__) && defined(__GNUC__)
#define THR_LK_X86 1
extern const thr_lk_kernels thr_lk_avx2, thr_lk_avx512;
double thr_lk_gather_avx2(const float *const e[4], const uint8_t *ver, int64_t len, double *w);
#else
#define THR_LK_X86 0
#endif

/* The mix of columns [c0, d), scalar: o[c] = the sum over rows j with ver[j] of
 * (float)(w[j] inv) v[ver[j]][j * d + c], rows in order. mix_scalar is it with c0 = 0;
 * the SIMD kernels finish their columns with it, so the bits are the scalar ones. */
static inline void thr_lk_mix_cols(float *restrict o, const double *w, double inv,
                                   const uint8_t *ver, const float *const v[4], int64_t len,
                                   int32_t d, int32_t c0)
{
    for (int32_t c = c0; c < d; c++)
        o[c] = 0.0f;
    for (int64_t j = 0; c0 < d && j < len; j++)
        if (ver[j]) {
            const float a = (float)(w[j] * inv), *x = v[ver[j]] + (size_t)j * d;
            for (int32_t c = c0; c < d; c++)
                o[c] += a * x[c];
        }
}

#endif
