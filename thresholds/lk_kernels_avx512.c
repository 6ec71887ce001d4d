/*
 * lk_kernels_avx512.c — AVX-512 versions of the LeanKV grid kernels
 * (thresholds/lk_kernels.h), equal to the scalar ones bit for bit: separate multiplies
 * and adds (the output's fused as the scalar fmaf), tails by the scalar rule or masked
 * lanes. The gather keeps eight partial sums (defined per j mod 8) in the lanes of one
 * register per head.
 */
#include "thresholds/lk_kernels.h"
#include "thresholds/thresholds_internal.h"

#if THR_LK_X86
#include <immintrin.h>
#include <math.h>

#define TARGET __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma")))

TARGET static void significance_avx512(double *sig, const double *acc, int64_t n, int32_t gs,
                                       const int64_t *qcum, int64_t nq, int64_t len)
{
    const __m512i vnq = _mm512_set1_epi64(nq);
    const __m512d inf = _mm512_set1_pd(INFINITY);
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) {
        const __m512i cnt = _mm512_sub_epi64(vnq, _mm512_loadu_si512(qcum + j));
        const __mmask8 pos = _mm512_cmpgt_epi64_mask(cnt, _mm512_setzero_si512());
        __m512d best = _mm512_set1_pd(-INFINITY);
        for (int32_t g = 0; g < gs; g++) /* max_pd(a, b) = a > b ? a : b, the scalar rule */
            best = _mm512_max_pd(_mm512_loadu_pd(acc + (size_t)g * n + j), best);
        _mm512_storeu_pd(sig + j, _mm512_mask_div_pd(inf, pos, best, _mm512_cvtepi64_pd(cnt)));
    }
    for (; j < len; j++) {
        const int64_t cnt = nq - qcum[j];
        double best = -INFINITY;
        for (int32_t g = 0; g < gs && cnt > 0; g++) {
            const double a = acc[(size_t)g * n + j];
            best = a > best ? a : best;
        }
        sig[j] = cnt > 0 ? best / (double)cnt : INFINITY;
    }
}

/* The gather of heads [g0, g0 + NG), NG <= 4 (a constant at each call), 8 tokens at a
 * time by masked loads: the partial sum of j mod 8 in lane j mod 8 of the head's
 * register. */
#define GATHER_HEAD(H, P)                                                                   \
    if ((H) < NG) {                                                                        \
        const size_t off = (size_t)(g0 + (H)) * es + (size_t)j;                            \
        __m256 x = _mm256_maskz_loadu_ps(m1, e1 + off);                                    \
        x = _mm256_mask_loadu_ps(x, m2, e2 + off);                                         \
        x = _mm256_mask_loadu_ps(x, m3, e3 + off);                                         \
        _mm256_storeu_ps(w + (size_t)(g0 + (H)) * ws + j, x);                              \
        P = _mm512_add_pd(P, _mm512_cvtps_pd(x));                                          \
    }
TARGET static inline __attribute__((always_inline)) void
gather4_avx512(const float *const e[4], size_t es, const uint8_t *ver, int64_t len, int32_t g0,
               const int NG, float *w, size_t ws, double *z)
{
    __m512d p0 = _mm512_setzero_pd(), p1 = p0, p2 = p0, p3 = p0;
    const float *e1 = e[1], *e2 = e[2], *e3 = e[3]; /* loaded once: w may alias them */
    const __m256i v1 = _mm256_set1_epi32(1), v2 = _mm256_set1_epi32(2),
                  v3 = _mm256_set1_epi32(3);
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) {
        const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(ver + j)));
        const __mmask8 m1 = _mm256_cmpeq_epi32_mask(v, v1), m2 = _mm256_cmpeq_epi32_mask(v, v2),
                       m3 = _mm256_cmpeq_epi32_mask(v, v3);
        GATHER_HEAD(0, p0)
        GATHER_HEAD(1, p1)
        GATHER_HEAD(2, p2)
        GATHER_HEAD(3, p3)
    }
    const __m512d p[4] = {p0, p1, p2, p3};
    for (int h = 0; h < NG; h++) {
        double ps[8];
        _mm512_storeu_pd(ps, p[h]);
        thr_lk_gather_tail(e, (size_t)(g0 + h) * es, ver, j, len, w + (size_t)(g0 + h) * ws, ps);
        z[g0 + h] = thr_lk_sum8(ps);
    }
}
#undef GATHER_HEAD

TARGET static void gather_avx512(const float *const e[4], size_t es, const uint8_t *ver,
                                 int64_t len, int32_t gs, float *w, size_t ws, double *z)
{
    int32_t g0 = 0;
    for (; g0 + 4 <= gs; g0 += 4)
        gather4_avx512(e, es, ver, len, g0, 4, w, ws, z);
    switch (gs - g0) {
    case 3: gather4_avx512(e, es, ver, len, g0, 3, w, ws, z); break;
    case 2: gather4_avx512(e, es, ver, len, g0, 2, w, ws, z); break;
    case 1: gather4_avx512(e, es, ver, len, g0, 1, w, ws, z); break;
    default: break;
    }
}

TARGET static void daxpy_avx512(double *acc, double a, const float *w, int64_t len)
{
    const __m512d va = _mm512_set1_pd(a);
    int64_t j = 0;
    for (; j + 8 <= len; j += 8)
        _mm512_storeu_pd(acc + j, _mm512_add_pd(_mm512_loadu_pd(acc + j),
                                                _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(w + j)), va)));
    for (; j < len; j++)
        acc[j] += (double)w[j] * a;
}

/* The mix of heads [g0, g0 + NG), NG <= 3 (a constant at each call), columns [c0, c0 +
 * 64) masked by k0..k3 (lanes past d off): one fused multiply-add per term, rows in
 * order, as the scalar fmaf. Accumulators by name: they stay in registers. */
#define MIX_HEAD(H, A0, A1, A2, A3)                                                         \
    if ((H) < NG) {                                                                        \
        const __m512 b =                                                                   \
            _mm512_set1_ps((float)((double)w[(size_t)(g0 + (H)) * ws + j] * inv[g0 + (H)])); \
        A0 = _mm512_fmadd_ps(b, x0, A0);                                                   \
        A1 = _mm512_fmadd_ps(b, x1, A1);                                                   \
        A2 = _mm512_fmadd_ps(b, x2, A2);                                                   \
        A3 = _mm512_fmadd_ps(b, x3, A3);                                                   \
    }
#define MIX_STORE(H, A0, A1, A2, A3)                                                        \
    if ((H) < NG) {                                                                        \
        float *y = o + (size_t)(g0 + (H)) * d + c0;                                        \
        _mm512_mask_storeu_ps(y, k0, A0);                                                  \
        _mm512_mask_storeu_ps(y + 16, k1, A1);                                             \
        _mm512_mask_storeu_ps(y + 32, k2, A2);                                             \
        _mm512_mask_storeu_ps(y + 48, k3, A3);                                             \
    }
TARGET static inline __attribute__((always_inline)) void
mix3_avx512(float *o, const float *w, size_t ws, const double *inv, const uint8_t *ver,
            const float *const v[4], int64_t len, int32_t d, int32_t g0, const int NG, int32_t c0,
            __mmask16 k0, __mmask16 k1, __mmask16 k2, __mmask16 k3)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0,
           b3 = a0, c0v = a0, c1 = a0, c2 = a0, c3 = a0;
    for (int64_t j = 0; j < len; j++) {
        if (!ver[j])
            continue;
        const float *x = v[ver[j]] + (size_t)j * d + c0;
        const __m512 x0 = _mm512_maskz_loadu_ps(k0, x), x1 = _mm512_maskz_loadu_ps(k1, x + 16),
                     x2 = _mm512_maskz_loadu_ps(k2, x + 32),
                     x3 = _mm512_maskz_loadu_ps(k3, x + 48);
        MIX_HEAD(0, a0, a1, a2, a3)
        MIX_HEAD(1, b0, b1, b2, b3)
        MIX_HEAD(2, c0v, c1, c2, c3)
    }
    MIX_STORE(0, a0, a1, a2, a3)
    MIX_STORE(1, b0, b1, b2, b3)
    MIX_STORE(2, c0v, c1, c2, c3)
}
#undef MIX_HEAD
#undef MIX_STORE

TARGET static void mix_avx512(float *o, const float *w, size_t ws, const double *inv,
                              const uint8_t *ver, const float *const v[4], int64_t len,
                              int32_t d, int32_t gs)
{
    for (int32_t c0 = 0; c0 < d; c0 += 64) {
        __mmask16 k[4];
        for (int q = 0; q < 4; q++) {
            const int32_t left = d - c0 - 16 * q;
            k[q] = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        }
        int32_t g0 = 0;
        for (; g0 + 3 <= gs; g0 += 3)
            mix3_avx512(o, w, ws, inv, ver, v, len, d, g0, 3, c0, k[0], k[1], k[2], k[3]);
        if (gs - g0 == 2)
            mix3_avx512(o, w, ws, inv, ver, v, len, d, g0, 2, c0, k[0], k[1], k[2], k[3]);
        else if (gs - g0 == 1)
            mix3_avx512(o, w, ws, inv, ver, v, len, d, g0, 1, c0, k[0], k[1], k[2], k[3]);
    }
}

/* thr_lk_exp1 on 16 lanes, the same operations in the same order. */
TARGET static inline __m512 exp16(__m512 x)
{
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __mmask16 in = _mm512_cmp_ps_mask(x, _mm512_set1_ps(THR_EXP_LO), _CMP_GE_OQ);
    const __m512 xn = x;
    x = _mm512_min_ps(x, _mm512_set1_ps(THR_EXP_HI)); /* x < HI ? x : HI */
    const __m512 magic = _mm512_set1_ps(THR_EXP_MAGIC);
    const __m512 n = _mm512_sub_ps(
        _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(THR_EXP_LOG2E)), magic), magic);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(THR_EXP_C1)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(THR_EXP_C2)));
    __m512 p = _mm512_set1_ps(THR_EXP_P0);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(THR_EXP_P1));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(THR_EXP_P2));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(THR_EXP_P3));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(THR_EXP_P4));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(THR_EXP_P5));
    __m512 y = _mm512_mul_ps(p, _mm512_mul_ps(r, r));
    y = _mm512_add_ps(_mm512_add_ps(y, r), _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    y = _mm512_maskz_mov_ps(in, _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
    return _mm512_mask_mov_ps(y, nan, xn);
}

TARGET static double expsum_avx512(float *out, const float *s, float mx, int64_t len)
{
    const __m512 vm = _mm512_set1_ps(mx);
    __m512d z = _mm512_setzero_pd(); /* lane i: z[j mod 8], the low half before the high */
    int64_t j = 0;
    for (; j + 16 <= len; j += 16) {
        const __m512 y = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm));
        _mm512_storeu_ps(out + j, y);
        z = _mm512_add_pd(z, _mm512_cvtps_pd(_mm512_castps512_ps256(y)));
        z = _mm512_add_pd(z, _mm512_cvtps_pd(_mm256_castpd_ps(
                                 _mm512_extractf64x4_pd(_mm512_castps_pd(y), 1))));
    }
    double zs[8];
    _mm512_storeu_pd(zs, z);
    thr_lk_expsum_tail(out, s, mx, j, len, zs);
    return thr_lk_sum8(zs);
}

TARGET static float maxf_avx512(const float *s, int64_t len)
{
    __m512 m = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 16 <= len; j += 16) /* max_ps(a, b) = a > b ? a : b: a NaN a is ignored */
        m = _mm512_max_ps(_mm512_loadu_ps(s + j), m);
    float l[16], mx = -INFINITY;
    _mm512_storeu_ps(l, m);
    for (int i = 0; i < 16; i++)
        mx = l[i] > mx ? l[i] : mx;
    for (; j < len; j++)
        mx = s[j] > mx ? s[j] : mx;
    return mx;
}

/* Algorithm 1's choice, 8 tokens at a time: the least sig among the tokens of class sec,
 * then the first token with it (the scalar rule's earliest tie); a NaN among them goes
 * to the scalar rule. */
TARGET static int64_t argmin_avx512(const double *sig, const uint8_t *cls, uint8_t sec,
                                    int64_t len)
{
    const __m512i vs = _mm512_set1_epi64(sec);
    __m512d mn = _mm512_set1_pd(INFINITY);
    __mmask8 any = 0;
    const int64_t l8 = len & ~(int64_t)7;
    for (int64_t j = 0; j < l8; j += 8) {
        const __m512i c = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)(cls + j)));
        const __mmask8 m = _mm512_cmpeq_epi64_mask(c, vs);
        const __m512d x = _mm512_loadu_pd(sig + j);
        if (_mm512_mask_cmp_pd_mask(m, x, x, _CMP_UNORD_Q))
            return thr_leankv_argmin_scalar(sig, cls, sec, len);
        mn = _mm512_mask_min_pd(mn, m, x, mn);
        any |= m;
    }
    double m8[8], best = INFINITY;
    _mm512_storeu_pd(m8, mn);
    for (int i = 0; i < 8; i++)
        best = m8[i] < best ? m8[i] : best;
    for (int64_t j = l8; j < len; j++)
        if (cls[j] == sec) {
            if (sig[j] != sig[j])
                return thr_leankv_argmin_scalar(sig, cls, sec, len);
            best = sig[j] < best ? sig[j] : best;
            any = 1;
        }
    if (!any)
        return -1;
    const __m512d vb = _mm512_set1_pd(best);
    for (int64_t j = 0; j < l8; j += 8) {
        const __m512i c = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)(cls + j)));
        const __mmask8 m = _mm512_mask_cmp_pd_mask(_mm512_cmpeq_epi64_mask(c, vs),
                                                   _mm512_loadu_pd(sig + j), vb, _CMP_EQ_OQ);
        if (m)
            return j + __builtin_ctz(m);
    }
    for (int64_t j = l8; j < len; j++)
        if (cls[j] == sec && sig[j] == best)
            return j;
    return -1; /* not reached */
}

/* The exact significance of token j (significance's scalar rule). */
static inline double sig_at(const double *acc, int64_t n, int32_t gs, const int64_t *qcum,
                            int64_t nq, int64_t j)
{
    const int64_t cnt = nq - qcum[j];
    double best = -INFINITY;
    for (int32_t g = 0; g < gs && cnt > 0; g++) {
        const double a = acc[(size_t)g * n + j];
        best = a > best ? a : best;
    }
    return cnt > 0 ? best / (double)cnt : INFINITY;
}

/* Algorithm 1's choice without dividing every token (lk_kernels.h, THR_LK_SIGMIN_SLACK):
 * keys max_g acc x vrcp14(count) (+inf where the count is not positive; the tail's
 * exact), their least over the class, then the exact significance of the tokens whose
 * key is within the slack of it, the least of those and the first of equals. */
TARGET static inline __attribute__((always_inline)) int64_t
sigmin_gs(const double *acc, int64_t n, const int32_t gs, const int64_t *qcum, int64_t nq,
          const uint8_t *cls, uint8_t sec, int64_t len, double *key)
{
    const __m512i vnq = _mm512_set1_epi64(nq), vs = _mm512_set1_epi64(sec);
    const __m512d inf = _mm512_set1_pd(INFINITY);
    __m512d mn = inf;
    __mmask8 any = 0, nan = 0;
    const int64_t l8 = len & ~(int64_t)7;
    for (int64_t j = 0; j < l8; j += 8) {
        const __m512i c = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)(cls + j)));
        const __mmask8 m = _mm512_cmpeq_epi64_mask(c, vs);
        const __m512i cnt = _mm512_sub_epi64(vnq, _mm512_loadu_si512(qcum + j));
        const __mmask8 pos = _mm512_cmpgt_epi64_mask(cnt, _mm512_setzero_si512());
        __m512d best = _mm512_set1_pd(-INFINITY);
        for (int32_t g = 0; g < gs; g++)
            best = _mm512_max_pd(_mm512_loadu_pd(acc + (size_t)g * n + j), best);
        const __m512d x =
            _mm512_mask_mul_pd(inf, pos, best, _mm512_rcp14_pd(_mm512_cvtepi64_pd(cnt)));
        _mm512_storeu_pd(key + j, x);
        nan = _kor_mask8(nan, _mm512_mask_cmp_pd_mask(m, x, x, _CMP_UNORD_Q));
        mn = _mm512_mask_min_pd(mn, m, x, mn);
        any = _kor_mask8(any, m);
    }
    double m8[8], least = INFINITY;
    _mm512_storeu_pd(m8, mn);
    for (int i = 0; i < 8; i++)
        least = m8[i] < least ? m8[i] : least;
    for (int64_t j = l8; j < len; j++)
        if (cls[j] == sec) {
            key[j] = sig_at(acc, n, gs, qcum, nq, j);
            nan |= key[j] != key[j];
            least = key[j] < least ? key[j] : least;
            any = 1;
        }
    if (!any)
        return -1;
    if (nan || least < THR_LK_SIGMIN_TINY) { /* the definition (0 and below too) */
        significance_avx512(key, acc, n, gs, qcum, nq, len);
        return argmin_avx512(key, cls, sec, len);
    }
    const double lim = least * THR_LK_SIGMIN_SLACK;
    const __m512d vl = _mm512_set1_pd(lim);
    int64_t v = -1;
    double sv = 0;
    for (int64_t j = 0; j < l8; j += 8) {
        const __m512i c = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)(cls + j)));
        __mmask8 k = _mm512_mask_cmp_pd_mask(_mm512_cmpeq_epi64_mask(c, vs),
                                             _mm512_loadu_pd(key + j), vl, _CMP_LE_OQ);
        for (; k; k &= (__mmask8)(k - 1)) { /* ascending j: the first of equals stays */
            const int64_t i = j + __builtin_ctz(k);
            const double s = sig_at(acc, n, gs, qcum, nq, i);
            if (v < 0 || s < sv) {
                v = i;
                sv = s;
            }
        }
    }
    for (int64_t j = l8; j < len; j++)
        if (cls[j] == sec && key[j] <= lim && (v < 0 || key[j] < sv)) {
            v = j;
            sv = key[j];
        }
    return v;
}

TARGET static int64_t sigmin_avx512(const double *acc, int64_t n, int32_t gs,
                                    const int64_t *qcum, int64_t nq, const uint8_t *cls,
                                    uint8_t sec, int64_t len, double *key)
{
    switch (gs) { /* the heads' loop unrolled for the common group sizes */
    case 1: return sigmin_gs(acc, n, 1, qcum, nq, cls, sec, len, key);
    case 2: return sigmin_gs(acc, n, 2, qcum, nq, cls, sec, len, key);
    case 3: return sigmin_gs(acc, n, 3, qcum, nq, cls, sec, len, key);
    case 4: return sigmin_gs(acc, n, 4, qcum, nq, cls, sec, len, key);
    default: return sigmin_gs(acc, n, gs, qcum, nq, cls, sec, len, key);
    }
}

const thr_lk_kernels thr_lk_avx512 = {"avx512", significance_avx512, gather_avx512,
                                      daxpy_avx512, mix_avx512, expsum_avx512, maxf_avx512,
                                      argmin_avx512, sigmin_avx512};
#endif
