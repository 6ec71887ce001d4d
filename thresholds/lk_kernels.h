/*
 * thresholds/lk_kernels.h — the inner loops of the fast LeanKV grid (profile_fast.c),
 * one setting and one query row at a time (every query head of the row in one call):
 * significance, the gather of each token's exponential, the significance sums and the
 * output. Scalar references in lk_kernels.c, AVX2 and AVX-512 versions in
 * lk_kernels_avx2.c / lk_kernels_avx512.c, chosen at run time; every version equals
 * the scalar one bit for bit (the same roundings in the same order: the output's
 * products fused as fmaf, the gather's eight partial sums kept per lane;
 * tests/test_profile_fast.c). Not a public header.
 */
#ifndef KVQ_THRESHOLDS_LK_KERNELS_H
#define KVQ_THRESHOLDS_LK_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

typedef struct thr_lk_kernels {
    const char *name;
    /* sig[j] = max_g acc[g n + j] / (nq - qcum[j]) for j < len, +inf when nq <= qcum[j]
     * (the reference's current_significance) */
    void (*significance)(double *sig, const double *acc, int64_t n, int32_t gs,
                         const int64_t *qcum, int64_t nq, int64_t len);
    /* for each query head g < gs: w[g ws + j] = ver[j] ? e[ver[j]][g es + j] : 0 for
     * j < len (ver in 0..3, e[0] unused), and z[g] = their sum as doubles, added in
     * eight partial sums p[j mod 8], then thr_lk_sum8(p) */
    void (*gather)(const float *const e[4], size_t es, const uint8_t *ver, int64_t len,
                   int32_t gs, float *w, size_t ws, double *z);
    /* acc[j] += (double)w[j] a for j < len */
    void (*daxpy)(double *acc, double a, const float *w, int64_t len);
    /* for each query head g < gs: o[g d + c] = the sum over j < len with ver[j] != 0 of
     * (float)((double)w[g ws + j] inv[g]) times row j of v[ver[j]] [., d], j in order, each term
     * fused: s = fmaf(a, x, s) from s = 0 (v[0] unused) */
    void (*mix)(float *o, const float *w, size_t ws, const double *inv, const uint8_t *ver,
                const float *const v[4], int64_t len, int32_t d, int32_t gs);
    /* out[j] = thr_lk_exp1(s[j] - mx) for j < len (out may be s); returns their sum as
     * double in eight partial sums z[j mod 8], then ((z0 + z1) + (z2 + z3)) + ((z4 + z5)
     * + (z6 + z7)) */
    double (*expsum)(float *out, const float *s, float mx, int64_t len);
    /* the largest of s[0 .. len) (NaN ignored; -inf when len is 0) */
    float (*maxf)(const float *s, int64_t len);
    /* the first j < len with cls[j] == sec and the least sig[j], -1 if none (the scalar
     * rule: thr_leankv_argmin_scalar, thresholds_internal.h) */
    int64_t (*argmin)(const double *sig, const uint8_t *cls, uint8_t sec, int64_t len);
    /* argmin(sig, cls, sec, len) of sig = significance(acc, n, gs, qcum, nq, len),
     * the same index, without sig: key [len] is scratch. The AVX-512 version divides
     * only near the least (thr_lk_sigmin_slack); the others are the definition. */
    int64_t (*sigmin)(const double *acc, int64_t n, int32_t gs, const int64_t *qcum,
                      int64_t nq, const uint8_t *cls, uint8_t sec, int64_t len, double *key);
} thr_lk_kernels;

/* sigmin's filter: a key x approximates the significance s = RN(a / m) of a token as
 * RN(a r) with r within a relative 2^-14 of 1 / m (vrcp14pd), so x / s lies within
 * 1 +- 2^-13; the least significance's key is then at most the least key times
 * (1 + 2^-13) / (1 - 2^-13) < 1 + 2^-11.9, and any token whose significance equals the
 * least likewise. So every token that can be the choice (or tie with it) has a key at
 * most THR_LK_SIGMIN_SLACK times the least key (the product rounded up by one more
 * factor); only those are divided exactly. Keys below THR_LK_SIGMIN_TINY (where
 * subnormal rounding breaks the relative bound; the significances are probabilities
 * over at most 2^31 rows, far above it) and NaN go to the definition. */
#define THR_LK_SIGMIN_SLACK (1.0 + 0x1p-11)
#define THR_LK_SIGMIN_TINY 0x1p-900

/* The kernels of level 0 (scalar), 1 (AVX2) or 2 (AVX-512), lowered to what this CPU
 * and build run; level < 0: the best. */
const thr_lk_kernels *thr_lk_kernels_get(int level);

#if defined(__x86_64__) && defined(__GNUC__)
#define THR_LK_X86 1
extern const thr_lk_kernels thr_lk_avx2, thr_lk_avx512;
#else
#define THR_LK_X86 0
#endif

/* The mix of head g's columns [c0, d), scalar (lk_kernels.h mix): the SIMD kernels may
 * finish with it, so the bits are the scalar ones. */
static inline void thr_lk_mix_cols(float *restrict o, const float *w, double inv,
                                   const uint8_t *ver, const float *const v[4], int64_t len,
                                   int32_t d, int32_t c0)
{
    for (int32_t c = c0; c < d; c++) {
        float s = 0.0f;
        for (int64_t j = 0; j < len; j++)
            if (ver[j])
                s = fmaf((float)((double)w[j] * inv), v[ver[j]][(size_t)j * d + c], s);
        o[c] = s;
    }
}

/* The gather of one head from token j (a multiple of 8) on, scalar, into p[8]. */
static inline void thr_lk_gather_tail(const float *const e[4], size_t off, const uint8_t *ver,
                                      int64_t j, int64_t len, float *w, double p[8])
{
    for (; j < len; j++) {
        w[j] = ver[j] ? e[ver[j]][off + j] : 0.0f;
        p[j & 7] += (double)w[j];
    }
}

/* The profile's exponential (Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-5
 * polynomial for e^r, times 2^n), written as separate float multiplies and adds so that
 * every SIMD lane rounds as this scalar code: the same bits on any ISA and thread count.
 * Within 2 ulp of a correctly rounded e^x for THR_EXP_LO <= x <= THR_EXP_HI
 * (tests/test_profile_fast.c checks it against expf); 0 below THR_EXP_LO (where expf is
 * subnormal), e^THR_EXP_HI above THR_EXP_HI, NaN for NaN. */
#define THR_EXP_LO (-87.33654f)
#define THR_EXP_HI 88.3762626647949f
#define THR_EXP_LOG2E 1.44269504088896341f
#define THR_EXP_MAGIC 12582912.0f /* 1.5 x 2^23: adding it rounds to an integer */
#define THR_EXP_C1 0.693359375f
#define THR_EXP_C2 (-2.12194440e-4f)
#define THR_EXP_P0 1.9875691500E-4f
#define THR_EXP_P1 1.3981999507E-3f
#define THR_EXP_P2 8.3334519073E-3f
#define THR_EXP_P3 4.1665795894E-2f
#define THR_EXP_P4 1.6666665459E-1f
#define THR_EXP_P5 5.0000001201E-1f

static inline float thr_lk_exp1(float x)
{
    if (x != x)
        return x;
    if (!(x >= THR_EXP_LO))
        return 0.0f;
    x = x > THR_EXP_HI ? THR_EXP_HI : x;
    const float n = (x * THR_EXP_LOG2E + THR_EXP_MAGIC) - THR_EXP_MAGIC;
    float r = x - n * THR_EXP_C1;
    r = r - n * THR_EXP_C2;
    float p = THR_EXP_P0;
    p = p * r + THR_EXP_P1;
    p = p * r + THR_EXP_P2;
    p = p * r + THR_EXP_P3;
    p = p * r + THR_EXP_P4;
    p = p * r + THR_EXP_P5;
    float y = p * (r * r);
    y = y + r;
    y = y + 1.0f;
    union { uint32_t u; float f; } sc;
    sc.u = (uint32_t)((int32_t)n + 127) << 23;
    return y * sc.f;
}

/* expsum's tail from j (j a multiple of 8): adds into z[8], scalar. */
static inline void thr_lk_expsum_tail(float *out, const float *s, float mx, int64_t j,
                                      int64_t len, double z[8])
{
    for (; j < len; j++) {
        out[j] = thr_lk_exp1(s[j] - mx);
        z[j & 7] += out[j];
    }
}

static inline double thr_lk_sum8(const double z[8])
{
    return ((z[0] + z[1]) + (z[2] + z[3])) + ((z[4] + z[5]) + (z[6] + z[7]));
}

#endif
