/*
 * kernels_avx2.c — AVX2 + FMA + F16C paths of the retrieval kernels.
 *
 * Same contracts as the scalar references in kernels.c (see kernels_simd.h): score
 * gather, keys, compaction and emission give the same bits; LUT, logits, softmax and
 * mix agree within the tolerances of kvq/runtime.h. Vector loops cover whole groups of
 * 8 elements; the remainders run the scalar per-element code.
 */
#include "runtime/kernels/kernels_simd.h"

#if KVQ_RK_HAVE_X86
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "runtime/kernels/kernels.h"

#define TARGET __attribute__((target("avx2,fma,f16c")))

/* 8 elements of a row (f16 or f32) starting at t, as f32. */
static inline TARGET __m256 load8(const void *row, int f16, int64_t t)
{
    if (f16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + t)));
    return _mm256_loadu_ps((const float *)row + t);
}

static inline float elem(const void *row, int f16, int64_t t)
{
    return f16 ? kvq_rk_h2f(((const uint16_t *)row)[t]) : ((const float *)row)[t];
}

static inline const void *row_ptr(const void *base, int f16, int64_t ld, int64_t r)
{
    return f16 ? (const void *)((const uint16_t *)base + r * ld)
               : (const void *)((const float *)base + r * ld);
}

/* ---- LUT ------------------------------------------------------------------------------ */

TARGET void kvq_rk_lut_avx2(const float *qp, const uint16_t *CT, int32_t G, int32_t dg, int32_t K,
                            float *lut)
{
    for (int32_t g = 0; g < G; g++) {
        float *L = lut + (size_t)g * K;
        const uint16_t *T = CT + (size_t)g * dg * K;
        const float *q = qp + (size_t)g * dg;
        memset(L, 0, sizeof(float) * (size_t)K);
        for (int32_t t = 0; t < dg; t += 2) {
            const int two = t + 1 < dg;
            const __m256 q0 = _mm256_set1_ps(q[t]), q1 = _mm256_set1_ps(two ? q[t + 1] : 0.0f);
            const uint16_t *r0 = T + (size_t)t * K, *r1 = two ? r0 + K : r0;
            int32_t c = 0;
            for (; c + 8 <= K; c += 8) {
                __m256 a = _mm256_loadu_ps(L + c);
                a = _mm256_fmadd_ps(q0, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r0 + c))),
                                    a);
                a = _mm256_fmadd_ps(q1, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r1 + c))),
                                    a);
                _mm256_storeu_ps(L + c, a);
            }
            for (; c < K; c++)
                L[c] += q[t] * kvq_rk_h2f(r0[c]) + (two ? q[t + 1] * kvq_rk_h2f(r1[c]) : 0.0f);
        }
    }
}

/* kvq_rk_lut_avx2 for nq queries (K % 8 == 0: no scalar tail), eight at a time with
 * their accumulators in registers: per 8 codes, every table row converted once and
 * multiplied into the eight, in the order of the single-query loop. */
TARGET void kvq_rk_lut_multi_avx2(const float *qp, int32_t nq, const uint16_t *CT, int32_t G,
                                  int32_t dg, int32_t K, float *lut)
{
    const int32_t d = G * dg;
    for (int32_t g = 0; g < G; g++) {
        const uint16_t *T = CT + (size_t)g * dg * K;
        for (int32_t i0 = 0; i0 < nq; i0 += 8) {
            const int32_t m = nq - i0 < 8 ? nq - i0 : 8;
            const float *q[8];
            for (int32_t i = 0; i < 8; i++) /* past m: a repeat of the last, not stored */
                q[i] = qp + (size_t)(i0 + (i < m ? i : m - 1)) * d + (size_t)g * dg;
            for (int32_t c = 0; c + 8 <= K; c += 8) {
                __m256 a[8];
                for (int32_t i = 0; i < 8; i++)
                    a[i] = _mm256_setzero_ps();
                for (int32_t t = 0; t < dg; t += 2) {
                    const int two = t + 1 < dg;
                    const uint16_t *r0 = T + (size_t)t * K + c, *r1 = two ? r0 + K : r0;
                    const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)r0));
                    const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)r1));
                    for (int32_t i = 0; i < 8; i++) {
                        a[i] = _mm256_fmadd_ps(_mm256_set1_ps(q[i][t]), w0, a[i]);
                        a[i] = _mm256_fmadd_ps(_mm256_set1_ps(two ? q[i][t + 1] : 0.0f), w1, a[i]);
                    }
                }
                for (int32_t i = 0; i < m; i++)
                    _mm256_storeu_ps(lut + (size_t)(i0 + i) * G * K + (size_t)g * K + c, a[i]);
            }
        }
    }
}

/* ---- score gather ------------------------------------------------------------------------ */

TARGET void kvq_rk_score_avx2(const float *lut, int32_t G, int32_t K, const uint16_t *codes,
                              int64_t n, float *scores)
{
    int64_t j = 0;
    if (G == 1) {
        for (; j + 8 <= n; j += 8) {
            const __m256i ix = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(codes + j)));
            const __m256 s = _mm256_add_ps(_mm256_setzero_ps(), _mm256_i32gather_ps(lut, ix, 4));
            _mm256_storeu_ps(scores + j, s);
        }
    } else {
        int32_t ix[8] __attribute__((aligned(32)));
        for (; j + 8 <= n; j += 8) {
            __m256 s = _mm256_setzero_ps();
            for (int32_t g = 0; g < G; g++) {
                for (int l = 0; l < 8; l++)
                    ix[l] = g * K + codes[(size_t)(j + l) * G + g];
                s = _mm256_add_ps(
                    s, _mm256_i32gather_ps(lut, _mm256_load_si256((const __m256i *)ix), 4));
            }
            _mm256_storeu_ps(scores + j, s);
        }
    }
    for (; j < n; j++)
        scores[j] = kvq_rk_score_one(lut, G, K, codes + (size_t)j * G);
}

/* ---- top-k scans ---------------------------------------------------------------------------- */

TARGET void kvq_rk_keyhist_avx2(const float *scores, int64_t n, uint32_t *keys, uint32_t *hist)
{
    int64_t j = 0;
    const __m256i top = _mm256_set1_epi32((int)0x80000000u);
    for (; j + 8 <= n; j += 8) {
        const __m256i u =
            _mm256_castps_si256(_mm256_add_ps(_mm256_loadu_ps(scores + j), _mm256_setzero_ps()));
        const __m256i k = _mm256_xor_si256(u, _mm256_or_si256(_mm256_srai_epi32(u, 31), top));
        _mm256_storeu_si256((__m256i *)(keys + j), k);
    }
    for (; j < n; j++)
        keys[j] = kvq_rk_key(scores[j]);
    kvq_rk_hist_top(keys, n, hist);
}

TARGET int64_t kvq_rk_compact_avx2(const uint32_t *keys, int64_t n, uint32_t digit, int shift,
                                   uint32_t mask, uint32_t *out)
{
    const __m256i want = _mm256_set1_epi32((int)digit), msk = _mm256_set1_epi32((int)mask);
    const __m128i sh = _mm_cvtsi32_si128(shift);
    int64_t m = 0, j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256i k = _mm256_loadu_si256((const __m256i *)(keys + j));
        const __m256i dg = _mm256_and_si256(_mm256_srl_epi32(k, sh), msk);
        unsigned hit =
            (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(dg, want)));
        uint32_t buf[8];
        _mm256_storeu_si256((__m256i *)buf, k);
        while (hit) {
            out[m++] = buf[__builtin_ctz(hit)];
            hit &= hit - 1;
        }
    }
    for (; j < n; j++)
        if (((keys[j] >> shift) & mask) == digit)
            out[m++] = keys[j];
    return m;
}

/* The emission step of 8 keys k of tokens j .. j+7 against the threshold tv: every key
 * above it, and keys equal to it while *ties lasts, appended to idx[m..]; returns the
 * new count. Unsigned compares through the sign flip: a >u b <=> (a ^ 2^31) >s (b ^ 2^31). */
static inline TARGET int64_t emit8(__m256i k, __m256i tv, int64_t j, int64_t *ties, int32_t *idx,
                                   int64_t m)
{
    const __m256i top = _mm256_set1_epi32((int)0x80000000u);
    const unsigned gt = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_xor_si256(k, top), _mm256_xor_si256(tv, top))));
    const unsigned eq =
        (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(k, tv)));
    unsigned bits = gt | eq;
    while (bits) {
        const int l = __builtin_ctz(bits);
        bits &= bits - 1;
        if ((gt >> l) & 1u) {
            idx[m++] = (int32_t)(j + l);
        } else if (*ties > 0) {
            idx[m++] = (int32_t)(j + l);
            (*ties)--;
        }
    }
    return m;
}

TARGET int64_t kvq_rk_emit_avx2(const uint32_t *keys, int64_t n, uint32_t T, int64_t ties,
                                int32_t *idx)
{
    const __m256i tv = _mm256_set1_epi32((int)T);
    int64_t m = 0, j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256i k = _mm256_loadu_si256((const __m256i *)(keys + j));
        m = emit8(k, tv, j, &ties, idx, m);
    }
    for (; j < n; j++)
        if (keys[j] > T || (keys[j] == T && ties-- > 0))
            idx[m++] = (int32_t)j;
    return m;
}

static inline TARGET __m256i keys8(__m256 x)
{
    const __m256i u = _mm256_castps_si256(_mm256_add_ps(x, _mm256_setzero_ps()));
    return _mm256_xor_si256(
        u, _mm256_or_si256(_mm256_srai_epi32(u, 31), _mm256_set1_epi32((int)0x80000000u)));
}

TARGET int64_t kvq_rk_bracket_avx2(const float *scores, int64_t n, uint32_t lo, uint32_t hi,
                                   uint32_t *out, int64_t *above)
{
    /* unsigned compares through the sign flip */
    const __m256i top = _mm256_set1_epi32((int)0x80000000u);
    const __m256i los = _mm256_xor_si256(_mm256_set1_epi32((int)lo), top);
    const __m256i his = _mm256_xor_si256(_mm256_set1_epi32((int)hi), top);
    int64_t m = 0, a = 0, j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256i k = keys8(_mm256_loadu_ps(scores + j)), ks = _mm256_xor_si256(k, top);
        const unsigned gt =
            (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(ks, his)));
        const unsigned below =
            (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(los, ks)));
        unsigned in = ~(gt | below) & 0xffu;
        a += __builtin_popcount(gt);
        if (in) {
            uint32_t buf[8];
            _mm256_storeu_si256((__m256i *)buf, k);
            while (in) {
                out[m++] = buf[__builtin_ctz(in)];
                in &= in - 1;
            }
        }
    }
    for (; j < n; j++) {
        const uint32_t key = kvq_rk_key(scores[j]);
        a += key > hi;
        if (key >= lo && key <= hi)
            out[m++] = key;
    }
    *above = a;
    return m;
}

TARGET int64_t kvq_rk_emit_scores_avx2(const float *scores, int64_t n, uint32_t T, int64_t ties,
                                       int32_t *idx)
{
    const __m256i tv = _mm256_set1_epi32((int)T);
    int64_t m = 0, j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256i k = keys8(_mm256_loadu_ps(scores + j));
        m = emit8(k, tv, j, &ties, idx, m);
    }
    for (; j < n; j++) {
        const uint32_t key = kvq_rk_key(scores[j]);
        if (key > T || (key == T && ties-- > 0))
            idx[m++] = (int32_t)j;
    }
    return m;
}

/* ---- logits ---------------------------------------------------------------------------------- */

/* The four horizontal sums of a, b, c, d as one vector [sa, sb, sc, sd]. */
static inline TARGET __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d)
{
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

#define PREFETCH_ROWS 8
/* and rows this far ahead into L2 only: scattered rows (the rerank's candidates, the
 * kept value rows) keep more misses in flight (kernels_avx512.c, LOGITS_FAR) */
#define FAR_ROWS 64

static inline TARGET __attribute__((always_inline)) void prefetch_l2(const void *row, int64_t bytes)
{
    for (int64_t b = 0; b < bytes; b += 64)
        _mm_prefetch((const char *)row + b, _MM_HINT_T1);
}

static inline TARGET __attribute__((always_inline)) void prefetch_row(const void *row, int64_t bytes)
{
    for (int64_t b = 0; b < bytes; b += 64)
        _mm_prefetch((const char *)row + b, _MM_HINT_T0);
}

TARGET void kvq_rk_logits_avx2(const float *q, int32_t nq, int32_t d, const void *K, int f16,
                               int64_t ld_k, const int32_t *idx, int64_t m, float scale,
                               float *logits, int64_t ld_l)
{
    const int64_t row_bytes = (int64_t)d * (f16 ? 2 : 4);
    const int32_t dv = d & ~7;
    for (int32_t hb = 0; hb < nq; hb += 4) {
        const int nh = nq - hb < 4 ? nq - hb : 4;
        const float *qh[4];
        for (int h = 0; h < 4; h++)
            qh[h] = q + (size_t)(hb + (h < nh ? h : 0)) * d;
        for (int64_t j = 0; j < m; j++) {
            const void *row = row_ptr(K, f16, ld_k, idx ? idx[j] : j);
            if (idx && j + PREFETCH_ROWS < m) {
                const char *pf = (const char *)row_ptr(K, f16, ld_k, idx[j + PREFETCH_ROWS]);
                for (int64_t b = 0; b < row_bytes; b += 64)
                    _mm_prefetch(pf + b, _MM_HINT_T0);
            }
            if (idx && hb == 0 && j + FAR_ROWS < m)
                prefetch_l2(row_ptr(K, f16, ld_k, idx[j + FAR_ROWS]), row_bytes);
            if (!idx && j + PREFETCH_ROWS < m) /* consecutive rows: the row a block ahead */
                prefetch_row(row_ptr(K, f16, ld_k, j + PREFETCH_ROWS), row_bytes);
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int32_t t = 0; t < dv; t += 8) {
                const __m256 k = load8(row, f16, t);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh[0] + t), k, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh[1] + t), k, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(qh[2] + t), k, a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(qh[3] + t), k, a3);
            }
            float s[4];
            _mm_storeu_ps(s, hsum4(a0, a1, a2, a3));
            for (int h = 0; h < nh; h++) {
                for (int32_t t = dv; t < d; t++)
                    s[h] += qh[h][t] * elem(row, f16, t);
                logits[(size_t)(hb + h) * ld_l + j] = s[h] * scale;
            }
        }
    }
}

/* ---- softmax --------------------------------------------------------------------------------- */

/* exp(x) for x <= 0 (below -87 gives exp(-87)); as exp16 in kernels_avx512.c, with
 * 2^n built in the exponent field. */
static inline TARGET __m256 exp8(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723212e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline TARGET float hsum8(__m256 v)
{
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

TARGET void kvq_rk_softmax_avx2(float *x, int32_t rows, int64_t m, int64_t ld)
{
    const int64_t mv = m & ~(int64_t)7;
    for (int32_t r = 0; r < rows; r++) {
        float *v = x + (size_t)r * ld;
        float mx = v[0];
        if (mv) {
            __m256 vm = _mm256_loadu_ps(v);
            for (int64_t j = 8; j < mv; j += 8)
                vm = _mm256_max_ps(vm, _mm256_loadu_ps(v + j));
            float b[8];
            _mm256_storeu_ps(b, vm);
            for (int l = 0; l < 8; l++)
                mx = b[l] > mx ? b[l] : mx;
        }
        for (int64_t j = mv; j < m; j++)
            mx = v[j] > mx ? v[j] : mx;
        const __m256 mxv = _mm256_set1_ps(mx);
        __m256 sum = _mm256_setzero_ps();
        for (int64_t j = 0; j < mv; j += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(v + j), mxv));
            _mm256_storeu_ps(v + j, e);
            sum = _mm256_add_ps(sum, e);
        }
        float s = hsum8(sum);
        for (int64_t j = mv; j < m; j++) {
            v[j] = expf(v[j] - mx);
            s += v[j];
        }
        const float inv = 1.0f / s;
        const __m256 iv = _mm256_set1_ps(inv);
        for (int64_t j = 0; j < mv; j += 8)
            _mm256_storeu_ps(v + j, _mm256_mul_ps(_mm256_loadu_ps(v + j), iv));
        for (int64_t j = mv; j < m; j++)
            v[j] *= inv;
    }
}

/* ---- mix -------------------------------------------------------------------------------------- */

/* Blocks of 16 rows (kept in L1 across passes), 4 heads and 16 dims: 8 accumulators. */
#define MIX_ROWS 16

TARGET void kvq_rk_mix_avx2(const float *p, int32_t nq, int64_t ld_p, const void *V, int f16,
                            int64_t ld_v, const int32_t *idx, int64_t m, int32_t d, float *out)
{
    const int32_t dv = d & ~7;
    const int64_t row_bytes = (int64_t)d * (f16 ? 2 : 4);
    memset(out, 0, sizeof(float) * (size_t)nq * d);
    for (int64_t j0 = 0; j0 < m; j0 += MIX_ROWS) {
        const int64_t jn = m - j0 < MIX_ROWS ? m - j0 : MIX_ROWS;
        for (int32_t hb = 0; hb < nq; hb += 4) {
            const int nh = nq - hb < 4 ? nq - hb : 4;
            const float *ph[4];
            for (int h = 0; h < 4; h++)
                ph[h] = p + (size_t)(hb + (h < nh ? h : 0)) * ld_p;
            for (int32_t t0 = 0; t0 < dv; t0 += 16) {
                const int two = t0 + 8 < dv;
                __m256 acc[4][2];
#pragma GCC unroll 4
                for (int h = 0; h < 4; h++)
                    acc[h][0] = acc[h][1] = _mm256_setzero_ps();
                for (int64_t j = j0; j < j0 + jn; j++) {
                    if (idx && hb == 0 && t0 == 0 && j + FAR_ROWS < m)
                        prefetch_l2(row_ptr(V, f16, ld_v, idx[j + FAR_ROWS]), row_bytes);
                    if (!idx && hb == 0 && t0 == 0 && j + MIX_ROWS < m)
                        prefetch_row(row_ptr(V, f16, ld_v, j + MIX_ROWS), row_bytes);
                    const void *row = row_ptr(V, f16, ld_v, idx ? idx[j] : j);
                    const __m256 v0 = load8(row, f16, t0);
                    const __m256 v1 = two ? load8(row, f16, t0 + 8) : v0;
#pragma GCC unroll 4
                    for (int h = 0; h < 4; h++) {
                        const __m256 w = _mm256_set1_ps(ph[h][j]);
                        acc[h][0] = _mm256_fmadd_ps(w, v0, acc[h][0]);
                        acc[h][1] = _mm256_fmadd_ps(w, v1, acc[h][1]);
                    }
                }
                for (int h = 0; h < nh; h++) {
                    float *o = out + (size_t)(hb + h) * d + t0;
                    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), acc[h][0]));
                    if (two)
                        _mm256_storeu_ps(o + 8, _mm256_add_ps(_mm256_loadu_ps(o + 8), acc[h][1]));
                }
            }
            for (int h = 0; h < nh; h++)
                for (int64_t j = j0; j < j0 + jn; j++) {
                    const void *row = row_ptr(V, f16, ld_v, idx ? idx[j] : j);
                    for (int32_t t = dv; t < d; t++)
                        out[(size_t)(hb + h) * d + t] += ph[h][j] * elem(row, f16, t);
                }
        }
    }
}

/* ---- fused attention ----------------------------------------------------------------------- */

/* Blocks of 8 rows, as kvq_rk_attend_avx512 with 16. */
#define ATT_ROWS 8

TARGET void kvq_rk_attend_avx2(float *state, const float *q, int32_t nq, int32_t d, const void *K,
                               int kf16, int64_t ld_k, const int32_t *kidx, const void *V, int vf16,
                               int64_t ld_v, const int32_t *vidx, int64_t m, float scale)
{
    float *mx = state, *l = state + nq, *acc = state + 2 * nq;
    const int32_t dv = d & ~7;
    const int64_t kbytes = (int64_t)d * (kf16 ? 2 : 4), vbytes = (int64_t)d * (vf16 ? 2 : 4);
    float pw[4][ATT_ROWS] __attribute__((aligned(32)));
    for (int64_t j0 = 0; j0 < m; j0 += ATT_ROWS) {
        const int jn = m - j0 < ATT_ROWS ? (int)(m - j0) : ATT_ROWS;
        const void *kr[ATT_ROWS], *vr[ATT_ROWS];
        for (int r = 0; r < ATT_ROWS; r++) {
            const int64_t jj = j0 + (r < jn ? r : 0);
            kr[r] = row_ptr(K, kf16, ld_k, kidx ? kidx[jj] : jj);
            vr[r] = row_ptr(V, vf16, ld_v, vidx ? vidx[jj] : jj);
        }
        for (int64_t p = j0 + ATT_ROWS; p < j0 + 2 * ATT_ROWS && p < m; p++) {
            if (kidx)
                prefetch_row(row_ptr(K, kf16, ld_k, kidx[p]), kbytes);
            if (vidx)
                prefetch_row(row_ptr(V, vf16, ld_v, vidx[p]), vbytes);
        }
        for (int32_t hb = 0; hb < nq; hb += 4) {
            const int nh = nq - hb < 4 ? nq - hb : 4;
            const float *qh[4];
            for (int h = 0; h < 4; h++)
                qh[h] = q + (size_t)(hb + (h < nh ? h : 0)) * d;
            float s[ATT_ROWS][4];
            for (int r = 0; r < ATT_ROWS; r++) {
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int32_t t = 0; t < dv; t += 8) {
                    const __m256 k = load8(kr[r], kf16, t);
                    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh[0] + t), k, a0);
                    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh[1] + t), k, a1);
                    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(qh[2] + t), k, a2);
                    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(qh[3] + t), k, a3);
                }
                _mm_storeu_ps(s[r], hsum4(a0, a1, a2, a3));
                for (int h = 0; h < 4; h++)
                    for (int32_t t = dv; t < d; t++)
                        s[r][h] += qh[h][t] * elem(kr[r], kf16, t);
            }
            for (int h = 0; h < 4; h++) {
                if (h >= nh) {
                    _mm256_store_ps(pw[h], _mm256_setzero_ps());
                    continue;
                }
                float lg[ATT_ROWS] __attribute__((aligned(32)));
                float bm = -INFINITY;
                for (int r = 0; r < ATT_ROWS; r++) {
                    lg[r] = r < jn ? s[r][h] * scale : -INFINITY;
                    bm = lg[r] > bm ? lg[r] : bm;
                }
                const float old = mx[hb + h], M = bm > old ? bm : old;
                __m256 p = exp8(_mm256_sub_ps(_mm256_load_ps(lg), _mm256_set1_ps(M)));
                /* rows past the end: exp8 clamps -inf to exp(-87); zero them */
                const __m256 live =
                    _mm256_cmp_ps(_mm256_load_ps(lg), _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
                p = _mm256_and_ps(p, live);
                _mm256_store_ps(pw[h], p);
                if (M > old) {
                    const float f = old == -INFINITY ? 0.0f : expf(old - M);
                    l[hb + h] *= f;
                    float *o = acc + (size_t)(hb + h) * d;
                    for (int32_t t = 0; t < d; t++)
                        o[t] *= f;
                    mx[hb + h] = M;
                }
                l[hb + h] += hsum8(p);
            }
            float *o[4];
            for (int h = 0; h < 4; h++)
                o[h] = acc + (size_t)(hb + (h < nh ? h : 0)) * d;
            for (int32_t t = 0; t < dv; t += 8) {
                __m256 a0 = _mm256_loadu_ps(o[0] + t), a1 = _mm256_loadu_ps(o[1] + t);
                __m256 a2 = _mm256_loadu_ps(o[2] + t), a3 = _mm256_loadu_ps(o[3] + t);
                for (int r = 0; r < jn; r++) {
                    const __m256 v = load8(vr[r], vf16, t);
                    a0 = _mm256_fmadd_ps(_mm256_set1_ps(pw[0][r]), v, a0);
                    a1 = _mm256_fmadd_ps(_mm256_set1_ps(pw[1][r]), v, a1);
                    a2 = _mm256_fmadd_ps(_mm256_set1_ps(pw[2][r]), v, a2);
                    a3 = _mm256_fmadd_ps(_mm256_set1_ps(pw[3][r]), v, a3);
                }
                const __m256 a[4] = {a0, a1, a2, a3};
                for (int h = 0; h < nh; h++)
                    _mm256_storeu_ps(o[h] + t, a[h]);
            }
            for (int h = 0; h < nh; h++)
                for (int32_t t = dv; t < d; t++)
                    for (int r = 0; r < jn; r++)
                        o[h][t] += pw[h][r] * elem(vr[r], vf16, t);
        }
    }
}
#endif /* KVQ_RK_HAVE_X86 */
