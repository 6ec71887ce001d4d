/*
 * kernels.c — the retrieval kernels of kvq/runtime.h: scalar references, the LUT
 * table, the top-k driver and the run-time dispatch to kernels_avx2.c /
 * kernels_avx512.c.
 *
 * The scalar versions are the specification: plain loops, dot products summed in
 * double, built from the per-element functions of runtime/kernels/kernels.h that the CUDA
 * kernels share. The fast paths are tested against them (tests/test_runtime.c) with
 * the tolerances named in the header; score gather and top-k must agree exactly.
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/half.h"
#include "kvq/runtime.h"
#include "kvq/util.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/rk.h"
#include "runtime/kernels/kernels_simd.h"

/* ==========================================================================
 * Instruction sets
 * ========================================================================== */

/* Computed once: CPU features do not change while we run. Concurrent first calls
 * compute the same value; relaxed atomics keep that race defined. */
kvq_isa kvq_isa_best(void)
{
#if KVQ_RK_HAVE_X86
    static int cached = -1;
    int level = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (level < 0) {
        level = KVQ_ISA_SCALAR;
        if (kvq_cpu_has_avx2()) /* includes FMA and F16C */
            level = kvq_cpu_has_avx512() ? KVQ_ISA_AVX512 : KVQ_ISA_AVX2;
        __atomic_store_n(&cached, level, __ATOMIC_RELAXED);
    }
    return (kvq_isa)level;
#else
    return KVQ_ISA_SCALAR;
#endif
}

kvq_isa kvq_isa_clamp(kvq_isa want)
{
    const kvq_isa best = kvq_isa_best();
    if ((int)want < 0)
        return KVQ_ISA_SCALAR;
    return want > best ? best : want;
}

const char *kvq_isa_name(kvq_isa isa)
{
    switch (isa) {
    case KVQ_ISA_SCALAR:
        return "scalar";
    case KVQ_ISA_AVX2:
        return "avx2";
    case KVQ_ISA_AVX512:
        return "avx512";
    }
    return "unknown";
}

/* Calls name_avx512 / name_avx2 / the scalar expression by the clamped isa. */
#if KVQ_RK_HAVE_X86
#define DISPATCH(isa, name, args, scalar)                                                          \
    do {                                                                                           \
        switch (kvq_isa_clamp(isa)) {                                                              \
        case KVQ_ISA_AVX512:                                                                       \
            name##_avx512 args;                                                                    \
            return;                                                                                \
        case KVQ_ISA_AVX2:                                                                         \
            name##_avx2 args;                                                                      \
            return;                                                                                \
        default:                                                                                   \
            scalar;                                                                                \
            return;                                                                                \
        }                                                                                          \
    } while (0)
#define DISPATCH_RET(isa, name, args, scalar)                                                      \
    do {                                                                                           \
        switch (kvq_isa_clamp(isa)) {                                                              \
        case KVQ_ISA_AVX512:                                                                       \
            return name##_avx512 args;                                                             \
        case KVQ_ISA_AVX2:                                                                         \
            return name##_avx2 args;                                                               \
        default:                                                                                   \
            return scalar;                                                                         \
        }                                                                                          \
    } while (0)
#else
#define DISPATCH(isa, name, args, scalar)                                                          \
    do {                                                                                           \
        (void)(isa);                                                                               \
        scalar;                                                                                    \
        return;                                                                                    \
    } while (0)
#define DISPATCH_RET(isa, name, args, scalar)                                                      \
    do {                                                                                           \
        (void)(isa);                                                                               \
        return scalar;                                                                             \
    } while (0)
#endif

/* ==========================================================================
 * LUT table and LUT build
 * ========================================================================== */

struct kvq_rk_table {
    const kvq_codebook *cb;
    int32_t G, K, dg, d;
    const float *Linv; /* [d, d] for grouped query-aware codebooks (q' = qs L^-T), else NULL */
    uint16_t *CT;      /* [G, dg, K] f16: centroid c of group g, dim t at (g dg + t) K + c */
    double scale;      /* CT holds W / scale (a power of two >= 1); queries are multiplied by it */
};

/* f16's largest finite value, and the largest power-of-two scale a table may take: a
 * centroid above F16_MAX x TABLE_MAX_SCALE is refused rather than turned into Inf. */
#define F16_MAX 65504.0
#define TABLE_MAX_SCALE 0x1p40

/* The power of two that brings every |W| of the codebook into f16's range. */
static kvq_status table_scale(const kvq_codebook *cb, int32_t G, int32_t K, int32_t dg,
                              double *scale, kvq_err *err)
{
    double m = 0;
    for (int32_t g = 0; g < G; g++) {
        const float *W = G == 1 ? kvq_codebook_key_codebook(cb) : kvq_codebook_centroids(cb, g);
        for (size_t i = 0; i < (size_t)K * dg; i++)
            m = fabs((double)W[i]) > m ? fabs((double)W[i]) : m;
    }
    *scale = 1.0;
    while (m / *scale > F16_MAX && *scale <= TABLE_MAX_SCALE)
        *scale *= 2.0;
    if (!(m / *scale <= F16_MAX))
        return kvq_err_set(err, KVQ_E_NUMERIC, "LUT table: a centroid of magnitude %g is beyond "
                           "the f16 table's range (%g) even scaled by 2^40", m,
                           F16_MAX * TABLE_MAX_SCALE);
    return KVQ_OK;
}

kvq_status kvq_rk_table_create(const kvq_codebook *cb, kvq_rk_table **out, kvq_err *err)
{
    *out = NULL;
    const kvq_codebook_desc *D = kvq_codebook_get_desc(cb);
    kvq_rk_table *t = calloc(1, sizeof *t);
    size_t bytes;
    if (!t || !kvq_size_mul((size_t)D->k, (size_t)D->dim * sizeof(uint16_t), &bytes) ||
        !(t->CT = malloc(bytes))) {
        free(t);
        return kvq_err_set(err, KVQ_E_NOMEM, "LUT table: out of memory");
    }
    t->cb = cb;
    t->G = D->groups;
    t->K = D->k;
    t->d = D->dim;
    t->dg = D->dim / D->groups;
    /* G == 1: the key-space codebook (C = C^z L^-1 for qavq) scores q~ directly.
     * G > 1, query-aware: z-space groups, scored with q' = q~ L^-T. */
    t->Linv = t->G > 1 ? kvq_codebook_Linv(cb) : NULL;
    kvq_status s = table_scale(cb, t->G, t->K, t->dg, &t->scale, err);
    if (s) {
        kvq_rk_table_free(t);
        return s;
    }
    const float inv = (float)(1.0 / t->scale); /* a power of two: W * inv is exact */
    for (int32_t g = 0; g < t->G; g++) {
        const float *W = t->G == 1 ? kvq_codebook_key_codebook(cb) : kvq_codebook_centroids(cb, g);
        for (int32_t c = 0; c < t->K; c++)
            for (int32_t i = 0; i < t->dg; i++)
                t->CT[((size_t)g * t->dg + i) * t->K + c] =
                    kvq_f32_to_f16_ref(W[(size_t)c * t->dg + i] * inv);
    }
    *out = t;
    return KVQ_OK;
}

void kvq_rk_table_free(kvq_rk_table *t)
{
    if (!t)
        return;
    free(t->CT);
    free(t);
}

uint64_t kvq_rk_table_bytes(const kvq_rk_table *t)
{
    return (uint64_t)t->K * (uint64_t)t->d * sizeof(uint16_t);
}

const kvq_codebook *kvq_rk_table_codebook(const kvq_rk_table *t) { return t->cb; }

const uint16_t *kvq_rk_table_f16(const kvq_rk_table *t, int32_t *G, int32_t *dg, int32_t *K)
{
    *G = t->G;
    *dg = t->dg;
    *K = t->K;
    return t->CT;
}

/* q' = qs L^-T in double for grouped query-aware codebooks (kvq_codebook_lut_query), else
 * qs (qavq's table holds the key-space codebook C); times the table's scale, so that
 * q' . (W / scale) is the score.   [d] */
static void lut_query(const kvq_rk_table *t, const float *qs, double *qp)
{
    if (t->Linv)
        kvq_codebook_lut_query(t->cb, qs, qp);
    else
        for (int32_t a = 0; a < t->d; a++)
            qp[a] = qs[a];
    for (int32_t a = 0; a < t->d; a++)
        qp[a] *= t->scale;
}

void kvq_rk_table_query(const kvq_rk_table *t, const float *qs, float *qp)
{
    double q[KVQ_ROPE_MAX_DIM];
    lut_query(t, qs, q);
    for (int32_t i = 0; i < t->d; i++)
        qp[i] = (float)q[i];
}

static void lut_scalar(const kvq_rk_table *t, const double *qp, float *lut)
{
    for (int32_t g = 0; g < t->G; g++)
        for (int32_t c = 0; c < t->K; c++) {
            double s = 0;
            for (int32_t i = 0; i < t->dg; i++)
                s += qp[g * t->dg + i] * kvq_rk_h2f(t->CT[((size_t)g * t->dg + i) * t->K + c]);
            lut[(size_t)g * t->K + c] = (float)s;
        }
}

void kvq_rk_lut(kvq_isa isa, const kvq_rk_table *t, const float *qs, float *lut)
{
    double qp[KVQ_ROPE_MAX_DIM];
    lut_query(t, qs, qp);
#if KVQ_RK_HAVE_X86
    float qf[KVQ_ROPE_MAX_DIM];
    for (int32_t i = 0; i < t->d; i++)
        qf[i] = (float)qp[i];
#endif
    DISPATCH(isa, kvq_rk_lut, (qf, t->CT, t->G, t->dg, t->K, lut), lut_scalar(t, qp, lut));
}

void kvq_rk_lut_multi(kvq_isa isa, const kvq_rk_table *t, const float *qs, int32_t nq,
                      float *lut)
{
    const size_t GK = (size_t)t->G * t->K;
#if KVQ_RK_HAVE_X86
    const kvq_isa use = kvq_isa_clamp(isa);
    if (use == KVQ_ISA_AVX512 || (use == KVQ_ISA_AVX2 && t->K % 8 == 0)) {
        float qf[8 * KVQ_ROPE_MAX_DIM]; /* eight queries at a time */
        for (int32_t i0 = 0; i0 < nq; i0 += 8) {
            const int32_t m = nq - i0 < 8 ? nq - i0 : 8;
            for (int32_t i = 0; i < m; i++) {
                double qp[KVQ_ROPE_MAX_DIM];
                lut_query(t, qs + (size_t)(i0 + i) * t->d, qp);
                for (int32_t a = 0; a < t->d; a++)
                    qf[(size_t)i * t->d + a] = (float)qp[a];
            }
            if (use == KVQ_ISA_AVX512)
                kvq_rk_lut_multi_avx512(qf, m, t->CT, t->G, t->dg, t->K, lut + (size_t)i0 * GK);
            else
                kvq_rk_lut_multi_avx2(qf, m, t->CT, t->G, t->dg, t->K, lut + (size_t)i0 * GK);
        }
        return;
    }
#endif
    for (int32_t i = 0; i < nq; i++)
        kvq_rk_lut(isa, t, qs + (size_t)i * t->d, lut + (size_t)i * GK);
}

/* ==========================================================================
 * Score gather
 * ========================================================================== */

static void score_scalar(const float *lut, int32_t G, int32_t K, const uint16_t *codes, int64_t n,
                         float *scores)
{
    for (int64_t j = 0; j < n; j++)
        scores[j] = kvq_rk_score_one(lut, G, K, codes + (size_t)j * G);
}

void kvq_rk_score(kvq_isa isa, const float *lut, int32_t G, int32_t K, const uint16_t *codes,
                  int64_t n, float *scores)
{
    DISPATCH(isa, kvq_rk_score, (lut, G, K, codes, n, scores),
             score_scalar(lut, G, K, codes, n, scores));
}

/* ==========================================================================
 * Residual stage: 1-bit sign dots through a byte table
 * ========================================================================== */

void kvq_rk_sign_table(const float *q, int32_t d, float *tab)
{
    float nib[KVQ_ROPE_MAX_DIM / 4][16];
    for (int32_t p4 = 0; p4 < d / 4; p4++)
        for (int v = 0; v < 16; v++) {
            float s = 0.0f;
            for (int c = 0; c < 4; c++)
                s += (v >> c & 1) ? q[4 * p4 + c] : -q[4 * p4 + c];
            nib[p4][v] = s;
        }
    for (int32_t p = 0; p < d / 8; p++)
        for (int v = 0; v < 256; v++)
            tab[(size_t)p * 256 + v] = nib[2 * p][v & 15] + nib[2 * p + 1][v >> 4];
    memcpy(tab + (size_t)d / 8 * 256, nib, sizeof(float) * 16 * (size_t)(d / 4));
}

static void resid_scores_scalar(const float *tab, int32_t nb8, const uint8_t *bits,
                                const float *scale, const int32_t *tok, const float *first,
                                int64_t n, float *out)
{
    for (int64_t a = 0; a < n; a++) {
        const uint8_t *b = bits + (size_t)tok[a] * nb8;
        float s = 0.0f;
        for (int32_t p = 0; p < nb8; p++)
            s += tab[(size_t)p * 256 + b[p]];
        const float w = scale[tok[a]] * s;
        out[a] = first[a] + w;
    }
}

/* The fast path: four candidates' lookups interleaved (four independent sums in flight;
 * each candidate's sum in the reference's order, so the same bits), their rows
 * prefetched 32 candidates ahead. Measured faster than AVX2 / AVX-512 gathers of the
 * table entries on the AMD EPYC of docs/BENCHMARKS.md (4.7 against 9.5-10 ns per
 * candidate at d 128, rows in L2), which is why no ISA has its own path. */
static void resid_scores_x4(const float *tab, int32_t nb8, const uint8_t *bits,
                            const float *scale, const int32_t *tok, const float *first,
                            int64_t n, float *out)
{
    int64_t a = 0;
    for (; a + 4 <= n; a += 4) {
        for (int64_t l = a + 32; l < a + 36 && l < n; l++) {
            __builtin_prefetch(bits + (size_t)tok[l] * nb8);
            __builtin_prefetch(scale + tok[l]);
        }
        const uint8_t *b0 = bits + (size_t)tok[a] * nb8, *b1 = bits + (size_t)tok[a + 1] * nb8,
                      *b2 = bits + (size_t)tok[a + 2] * nb8, *b3 = bits + (size_t)tok[a + 3] * nb8;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int32_t p = 0; p < nb8; p++) {
            const float *t = tab + (size_t)p * 256;
            s0 += t[b0[p]];
            s1 += t[b1[p]];
            s2 += t[b2[p]];
            s3 += t[b3[p]];
        }
        const float w0 = scale[tok[a]] * s0, w1 = scale[tok[a + 1]] * s1,
                    w2 = scale[tok[a + 2]] * s2, w3 = scale[tok[a + 3]] * s3;
        out[a] = first[a] + w0;
        out[a + 1] = first[a + 1] + w1;
        out[a + 2] = first[a + 2] + w2;
        out[a + 3] = first[a + 3] + w3;
    }
    resid_scores_scalar(tab, nb8, bits, scale, tok + a, first + a, n - a, out + a);
}

void kvq_rk_resid_scores(kvq_isa isa, const float *tab, int32_t nb8, const uint8_t *bits,
                         const float *scale, const int32_t *tok, const float *first, int64_t n,
                         float *out)
{
    int64_t a = 0;
#if KVQ_RK_HAVE_X86
    if (kvq_isa_clamp(isa) == KVQ_ISA_AVX512)
        a = kvq_rk_resid_scores_avx512(tab, nb8, bits, scale, tok, first, n, out);
#endif
    if (kvq_isa_clamp(isa) == KVQ_ISA_SCALAR)
        resid_scores_scalar(tab, nb8, bits, scale, tok + a, first + a, n - a, out + a);
    else
        resid_scores_x4(tab, nb8, bits, scale, tok + a, first + a, n - a, out + a);
}

/* ==========================================================================
 * Top-k selection
 * ========================================================================== */

static void keyhist_scalar(const float *scores, int64_t n, uint32_t *keys, uint32_t *hist)
{
    for (int64_t j = 0; j < n; j++) {
        keys[j] = kvq_rk_key(scores[j]);
        hist[keys[j] >> 21]++;
    }
}

static int64_t compact_scalar(const uint32_t *keys, int64_t n, uint32_t digit, int shift,
                              uint32_t mask, uint32_t *out)
{
    int64_t m = 0;
    for (int64_t j = 0; j < n; j++)
        if (((keys[j] >> shift) & mask) == digit)
            out[m++] = keys[j];
    return m;
}

static int64_t emit_scalar(const uint32_t *keys, int64_t n, uint32_t T, int64_t ties, int32_t *idx)
{
    int64_t m = 0;
    for (int64_t j = 0; j < n; j++)
        if (keys[j] > T || (keys[j] == T && ties-- > 0))
            idx[m++] = (int32_t)j;
    return m;
}

static void keyhist(kvq_isa isa, const float *scores, int64_t n, uint32_t *keys, uint32_t *hist)
{
    DISPATCH(isa, kvq_rk_keyhist, (scores, n, keys, hist), keyhist_scalar(scores, n, keys, hist));
}

static int64_t compact(kvq_isa isa, const uint32_t *keys, int64_t n, uint32_t digit, int shift,
                       uint32_t mask, uint32_t *out)
{
    DISPATCH_RET(isa, kvq_rk_compact, (keys, n, digit, shift, mask, out),
                 compact_scalar(keys, n, digit, shift, mask, out));
}

static int64_t emit(kvq_isa isa, const uint32_t *keys, int64_t n, uint32_t T, int64_t ties,
                    int32_t *idx)
{
    DISPATCH_RET(isa, kvq_rk_emit, (keys, n, T, ties, idx), emit_scalar(keys, n, T, ties, idx));
}

/* hist[(src[i] >> shift) & mask] += 1 for i < m; hist: [mask + 1], zeroed here. From
 * 4096 keys on, counts into four interleaved copies: a narrow range of keys crowds into
 * a few bins, and one counter incremented back to back waits for its own store. */
static void digit_hist(const uint32_t *src, int64_t m, int shift, uint32_t mask, uint32_t *hist)
{
    const size_t bins = (size_t)mask + 1;
    memset(hist, 0, sizeof *hist * bins);
    int64_t i = 0;
    if (m >= 4096) {
        uint32_t h4[3][KVQ_RK_HIST];
        memset(h4, 0, sizeof h4);
        for (; i + 4 <= m; i += 4) {
            hist[(src[i] >> shift) & mask]++;
            h4[0][(src[i + 1] >> shift) & mask]++;
            h4[1][(src[i + 2] >> shift) & mask]++;
            h4[2][(src[i + 3] >> shift) & mask]++;
        }
        for (size_t b = 0; b < bins; b++)
            hist[b] += h4[0][b] + h4[1][b] + h4[2][b];
    }
    for (; i < m; i++)
        hist[(src[i] >> shift) & mask]++;
}

/* The k-th largest of keys[0..m) (1 <= k <= m), digit by digit, most significant first,
 * over the low `bits` bits of the keys (every key < 2^bits; 32 for any keys): digits of
 * 11 bits from the top, the last one narrower (32 bits: 11, 11, 10). After each digit,
 * `remaining` counts how many of the selection are still to be found among the keys
 * sharing the digits so far; those keys are compacted (into sub [m]) so the next digit
 * only looks at them. Returns the key T and in *ties how many keys equal to T belong to
 * the top k. hist0, when not NULL, is the histogram of the first digit of 32-bit keys
 * (keys >> 21), already counted. */
static uint32_t kth_key(kvq_isa isa, const uint32_t *keys, int64_t m, int64_t k, int bits,
                        uint32_t *sub, const uint32_t *hist0, int64_t *ties)
{
    uint32_t hist[KVQ_RK_HIST];
    const uint32_t *src = keys;
    int64_t remaining = k;
    uint32_t T = 0;
    assert(bits >= 0 && bits <= 32 && (!hist0 || bits == 32));
    for (int pass = 0, left = bits; left > 0; pass++) {
        const int w = left < KVQ_RK_DIGIT_BITS0 ? left : KVQ_RK_DIGIT_BITS0;
        const int shift = left - w;
        const uint32_t mask = (1u << w) - 1u;
        if (pass == 0 && hist0)
            memcpy(hist, hist0, sizeof hist);
        else
            digit_hist(src, m, shift, mask, hist);
        uint32_t b = mask;
        while (hist[b] < remaining) { /* the selection's digit: bins above are taken whole */
            remaining -= hist[b];
            assert(b > 0);
            b--;
        }
        T |= b << shift;
        left = shift;
        if (left > 0) {
            m = compact(pass == 0 ? isa : KVQ_ISA_SCALAR, src, m, b, shift, mask, sub);
            src = sub;
        }
    }
    *ties = remaining;
    return T;
}

/* Number of significant bits of x (0 for 0). */
static int bit_width(uint32_t x) { return x ? 32 - __builtin_clz(x) : 0; }

/* Keys of a strided sample: 1024 of n, deterministic. */
#define TOPK_SAMPLE 1024
#define TOPK_SAMPLE_MIN_N 16384

/* Scalar versions of the bracket pass and the emission from scores (kernels_simd.h). */
static int64_t bracket_scalar(const float *scores, int64_t n, uint32_t lo, uint32_t hi,
                              uint32_t *out, int64_t *above)
{
    int64_t m = 0, a = 0;
    for (int64_t j = 0; j < n; j++) {
        const uint32_t key = kvq_rk_key(scores[j]);
        a += key > hi;
        if (key >= lo && key <= hi)
            out[m++] = key;
    }
    *above = a;
    return m;
}

static int64_t emit_scores_scalar(const float *scores, int64_t n, uint32_t T, int64_t ties,
                                  int32_t *idx)
{
    int64_t m = 0;
    for (int64_t j = 0; j < n; j++) {
        const uint32_t key = kvq_rk_key(scores[j]);
        if (key > T || (key == T && ties-- > 0))
            idx[m++] = (int32_t)j;
    }
    return m;
}

static int64_t bracket(kvq_isa isa, const float *scores, int64_t n, uint32_t lo, uint32_t hi,
                       uint32_t *out, int64_t *above)
{
    DISPATCH_RET(isa, kvq_rk_bracket, (scores, n, lo, hi, out, above),
                 bracket_scalar(scores, n, lo, hi, out, above));
}

static int64_t emit_scores(kvq_isa isa, const float *scores, int64_t n, uint32_t T, int64_t ties,
                           int32_t *idx)
{
    DISPATCH_RET(isa, kvq_rk_emit_scores, (scores, n, T, ties, idx),
                 emit_scores_scalar(scores, n, T, ties, idx));
}

/* Up to this many scores, kvq_rk_topk finds the threshold with 8-bit digits: four
 * passes over 256 bins, where the 11-bit digits clear and walk 2048 bins per pass (most
 * of the cost for the few hundred candidates of a decode step or a rerank). The
 * threshold and the tie rule are the same, so the selection is. */
#define TOPK_SMALL_N 4096

/* kth_key over 32-bit keys with 8-bit digits (same result). sub: [m]. */
static uint32_t kth_key_small(const uint32_t *keys, int64_t m, int64_t k, uint32_t *sub,
                              int64_t *ties)
{
    uint32_t hist[256];
    const uint32_t *src = keys;
    int64_t remaining = k;
    uint32_t T = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        memset(hist, 0, sizeof hist);
        for (int64_t i = 0; i < m; i++)
            hist[(src[i] >> shift) & 255u]++;
        uint32_t b = 255;
        while (hist[b] < remaining) {
            remaining -= hist[b];
            assert(b > 0);
            b--;
        }
        T |= b << shift;
        if (shift > 0) { /* in place once src is sub: mm <= i */
            int64_t mm = 0;
            for (int64_t i = 0; i < m; i++)
                if (((src[i] >> shift) & 255u) == b)
                    sub[mm++] = src[i];
            m = mm;
            src = sub;
        }
    }
    *ties = remaining;
    return T;
}

/* Top-k. Large inputs first bracket the threshold with a sample: the keys of 1024
 * evenly spaced scores give a range [lo, hi] that holds the k-th largest key with high
 * probability; one vector pass counts the keys above hi and keeps those in the range,
 * the radix select finds the exact threshold among the kept ones, and a last pass
 * emits the indices. When the bracket misses (the count above hi exceeds k, or the
 * range holds too few keys), the full radix select over all keys runs instead. Either
 * way the threshold and the tie rule are exact, so the selection never depends on the
 * path. Cost: two passes over n (bracketed), or three (radix). */
int64_t kvq_rk_topk(kvq_isa isa, const float *scores, int64_t n, int64_t k, int32_t *idx,
                    uint32_t *work)
{
    if (n <= 0 || k <= 0)
        return 0;
    if (k >= n) {
        for (int64_t j = 0; j < n; j++)
            idx[j] = (int32_t)j;
        return n;
    }
    uint32_t *keys = work, *sub = work + n;
    int64_t ties;
    uint32_t T;
    if (n <= TOPK_SMALL_N) {
        for (int64_t j = 0; j < n; j++)
            keys[j] = kvq_rk_key(scores[j]);
        T = kth_key_small(keys, n, k, sub, &ties);
        return emit(isa, keys, n, T, ties, idx);
    }
    if (n >= TOPK_SAMPLE_MIN_N) {
        uint32_t sample[TOPK_SAMPLE], ssub[TOPK_SAMPLE];
        for (int64_t i = 0; i < TOPK_SAMPLE; i++)
            sample[i] = kvq_rk_key(scores[(i * n) / TOPK_SAMPLE]);
        /* the k-th largest sits near rank r of the sample; widen by ~4 standard deviations */
        const int64_t r = (k * TOPK_SAMPLE) / n;
        const int64_t margin = 16 + 4 * (int64_t)sqrt((double)r + 1.0);
        const int64_t rh = r - margin, rl = r + margin;
        int64_t unused;
        const uint32_t hi =
            rh < 1 ? UINT32_MAX
                   : kth_key(KVQ_ISA_SCALAR, sample, TOPK_SAMPLE, rh, 32, ssub, NULL, &unused);
        const uint32_t lo = rl >= TOPK_SAMPLE ? 0
                                              : kth_key(KVQ_ISA_SCALAR, sample, TOPK_SAMPLE, rl,
                                                        32, ssub, NULL, &unused);
        int64_t above;
        const int64_t m = bracket(isa, scores, n, lo, hi, keys, &above);
        const int64_t need = k - above;
        if (need >= 1 && need <= m) {
            /* every kept key is in [lo, hi]: select over key - lo, whose digits are
             * spread over the bracket's width rather than crowded into a few bins */
            for (int64_t i = 0; i < m; i++)
                keys[i] -= lo;
            T = lo + kth_key(isa, keys, m, need, bit_width(hi - lo), sub, NULL, &ties);
            return emit_scores(isa, scores, n, T, ties, idx);
        }
    }
    uint32_t hist[KVQ_RK_HIST];
    memset(hist, 0, sizeof hist);
    keyhist(isa, scores, n, keys, hist);
    T = kth_key(isa, keys, n, k, 32, sub, hist, &ties);
    return emit(isa, keys, n, T, ties, idx);
}

/* ==========================================================================
 * Top-k from codes (single-group codebooks)
 * ========================================================================== */

void kvq_rk_code_order(const uint16_t *codes, int64_t n, int32_t K, uint32_t *count,
                       int32_t *order)
{
    memset(count, 0, sizeof *count * (size_t)K);
    for (int64_t j = 0; j < n; j++)
        count[codes[j]]++;
    uint32_t start = 0; /* count -> the first slot of each code */
    for (int32_t c = 0; c < K; c++) {
        const uint32_t cnt = count[c];
        count[c] = start;
        start += cnt;
    }
    for (int64_t j = 0; j < n; j++)
        order[count[codes[j]]++] = (int32_t)j;
}

void kvq_rk_code_counts(const uint32_t *hist, int32_t K, const uint16_t *codes, int64_t len,
                        int64_t a, int64_t b, uint32_t *counts)
{
    assert(0 <= a && a <= b && b <= len);
    if (hist && a + (len - b) <= (b - a) / 4) {
        memcpy(counts, hist, sizeof *counts * (size_t)K);
        for (int64_t j = 0; j < a; j++)
            counts[codes[j]]--;
        for (int64_t j = b; j < len; j++)
            counts[codes[j]]--;
        return;
    }
    memset(counts, 0, sizeof *counts * (size_t)K);
    for (int64_t j = a; j < b; j++)
        counts[codes[j]]++;
}

/* The key T of the k-th largest of a multiset in which keys[i] occurs w[i] times
 * (1 <= k <= sum of w), digit by digit as kth_key does: per digit a histogram of the
 * weights, the bins above the k-th taken whole, the entries of its bin compacted in
 * place for the next digit. *ties: how many of the occurrences of T are in the top k.
 * keys and w are overwritten. */
static uint32_t kth_key_weighted(uint32_t *keys, uint32_t *w, int64_t m, int64_t k, int64_t *ties)
{
    uint64_t hist[KVQ_RK_HIST]; /* weights summed in 64 bits: no count can overflow */
    int64_t remaining = k;
    uint32_t T = 0;
    for (int pass = 0; pass < 3; pass++) {
        const int shift = kvq_rk_digit_shift(pass);
        const uint32_t mask = kvq_rk_digit_mask(pass);
        memset(hist, 0, sizeof *hist * ((size_t)mask + 1));
        uint32_t top = 0; /* the largest digit present: the bins above it are empty */
        for (int64_t i = 0; i < m; i++) {
            const uint32_t dg = (keys[i] >> shift) & mask;
            hist[dg] += w[i];
            top = dg > top ? dg : top;
        }
        uint32_t b = top;
        while (b > 0 && hist[b] < (uint64_t)remaining) {
            remaining -= (int64_t)hist[b];
            b--;
        }
        assert(hist[b] >= (uint64_t)remaining); /* else the counts do not add up to k */
        T |= b << shift;
        int64_t mm = 0;
        for (int64_t i = 0; i < m; i++) { /* in place (mm <= i), without a branch */
            const uint32_t key = keys[i], wi = w[i];
            keys[mm] = key;
            w[mm] = wi;
            mm += ((key >> shift) & mask) == b;
        }
        m = mm;
    }
    *ties = remaining;
    return T;
}

uint32_t kvq_rk_kth_key_weighted(uint32_t *keys, uint32_t *w, int64_t m, int64_t k,
                                 int64_t *ties)
{
    return kth_key_weighted(keys, w, m, k, ties);
}

/* Without a branch on the common case: a few percent of the tokens are taken, at
 * random, which a predicted branch would miss each time; keys equal to T (the boundary
 * code's tokens) are rare. idx has room for one entry past the count (room > m). */
static int64_t emit_codes_scalar(const uint32_t *ktab, const uint16_t *codes, int64_t n,
                                 uint32_t T, int64_t ties, int64_t room, int32_t *idx)
{
    int64_t m = 0, j = 0;
    for (; j < n && m + 1 < room; j++) {
        const uint32_t key = ktab[codes[j]];
        int take = key > T;
        if (key == T) /* rare: predicted */
            take = ties-- > 0;
        idx[m] = (int32_t)j;
        m += take;
    }
    for (; j < n; j++) { /* the last entry: store only what is taken */
        const uint32_t key = ktab[codes[j]];
        if (key > T || (key == T && ties-- > 0))
            idx[m++] = (int32_t)j;
    }
    return m;
}

/* AVX-512 has its own path (a register-held bitmap of the codes); AVX2 runs the scalar
 * loop (an 8-lane gather version was not faster and was removed; bench_topk). */
static int64_t emit_codes(kvq_isa isa, const uint32_t *ktab, int32_t K, const uint16_t *codes,
                          int64_t n, uint32_t T, int64_t ties, int64_t room, int32_t *idx)
{
#if KVQ_RK_HAVE_X86
    if (kvq_isa_clamp(isa) == KVQ_ISA_AVX512)
        return kvq_rk_emit_codes_avx512(ktab, K, codes, n, T, ties, room, idx);
#endif
    (void)isa;
    (void)K;
    return emit_codes_scalar(ktab, codes, n, T, ties, room, idx);
}

/* The threshold from the K LUT entries weighted by their counts, then one pass over the
 * codes with the keys looked up per code: the same threshold, tie count and emission
 * rule as kvq_rk_topk over the scores lut[codes[j]], hence the same selection. */
int64_t kvq_rk_topk_codes(kvq_isa isa, const float *lut, int32_t K, const uint32_t *counts,
                          const uint16_t *codes, int64_t n, int64_t k, int32_t *idx,
                          uint32_t *work)
{
    if (n <= 0 || k <= 0)
        return 0;
    if (k >= n) {
        for (int64_t j = 0; j < n; j++)
            idx[j] = (int32_t)j;
        return n;
    }
    uint32_t *ktab = work, *keys = work + K, *w = work + 2 * (size_t)K;
    int64_t m = 0;
    for (int32_t c = 0; c < K; c++) { /* the codes that occur, compacted without a branch */
        ktab[c] = kvq_rk_key(lut[c]);
        keys[m] = ktab[c];
        w[m] = counts[c];
        m += counts[c] != 0;
    }
    int64_t ties;
    const uint32_t T = kth_key_weighted(keys, w, m, k, &ties);
    return emit_codes(isa, ktab, K, codes, n, T, ties, k, idx); /* emits exactly k */
}

/* ==========================================================================
 * Sparse attention
 * ========================================================================== */

/* Row r of a cache of f16 or f32 rows into f32.   out: [d] */
static void load_row(const void *K, int f16, int64_t ld, int64_t r, int32_t d, float *out)
{
    if (f16) {
        const uint16_t *h = (const uint16_t *)K + (size_t)r * ld;
        for (int32_t t = 0; t < d; t++)
            out[t] = kvq_rk_h2f(h[t]);
    } else {
        memcpy(out, (const float *)K + (size_t)r * ld, (size_t)d * sizeof *out);
    }
}

static void logits_scalar(const float *q, int32_t nq, int32_t d, const void *K, int f16,
                          int64_t ld_k, const int32_t *idx, int64_t m, float scale, float *logits,
                          int64_t ld_l)
{
    float row[KVQ_ROPE_MAX_DIM];
    assert(d <= KVQ_ROPE_MAX_DIM);
    for (int64_t j = 0; j < m; j++) {
        load_row(K, f16, ld_k, idx ? idx[j] : j, d, row);
        for (int32_t h = 0; h < nq; h++) {
            double s = 0;
            for (int32_t t = 0; t < d; t++)
                s += (double)q[(size_t)h * d + t] * row[t];
            logits[(size_t)h * ld_l + j] = (float)(s * scale);
        }
    }
}

void kvq_rk_logits(kvq_isa isa, const float *q, int32_t nq, int32_t d, const void *K, kvq_dtype dt,
                   int64_t ld_k, const int32_t *idx, int64_t m, float scale, float *logits,
                   int64_t ld_l)
{
    const int f16 = dt == KVQ_DT_F16;
    assert(dt == KVQ_DT_F16 || dt == KVQ_DT_F32);
    DISPATCH(isa, kvq_rk_logits, (q, nq, d, K, f16, ld_k, idx, m, scale, logits, ld_l),
             logits_scalar(q, nq, d, K, f16, ld_k, idx, m, scale, logits, ld_l));
}

static void softmax_scalar(float *x, int32_t rows, int64_t m, int64_t ld)
{
    for (int32_t r = 0; r < rows; r++) {
        float *v = x + (size_t)r * ld, mx = v[0];
        for (int64_t j = 1; j < m; j++)
            mx = v[j] > mx ? v[j] : mx;
        double sum = 0;
        for (int64_t j = 0; j < m; j++) {
            v[j] = expf(v[j] - mx);
            sum += v[j];
        }
        for (int64_t j = 0; j < m; j++)
            v[j] = (float)(v[j] / sum);
    }
}

void kvq_rk_softmax(kvq_isa isa, float *x, int32_t rows, int64_t m, int64_t ld)
{
    DISPATCH(isa, kvq_rk_softmax, (x, rows, m, ld), softmax_scalar(x, rows, m, ld));
}

static void mix_scalar(const float *p, int32_t nq, int64_t ld_p, const void *V, int f16,
                       int64_t ld_v, const int32_t *idx, int64_t m, int32_t d, float *out)
{
    float row[KVQ_ROPE_MAX_DIM];
    double acc[KVQ_ROPE_MAX_DIM];
    assert(d <= KVQ_ROPE_MAX_DIM);
    for (int32_t h = 0; h < nq; h++) {
        memset(acc, 0, sizeof acc);
        for (int64_t j = 0; j < m; j++) {
            const double w = p[(size_t)h * ld_p + j];
            load_row(V, f16, ld_v, idx ? idx[j] : j, d, row);
            for (int32_t t = 0; t < d; t++)
                acc[t] += w * row[t];
        }
        for (int32_t t = 0; t < d; t++)
            out[(size_t)h * d + t] = (float)acc[t];
    }
}

void kvq_rk_mix(kvq_isa isa, const float *p, int32_t nq, int64_t ld_p, const void *V, kvq_dtype dt,
                int64_t ld_v, const int32_t *idx, int64_t m, int32_t d, float *out)
{
    const int f16 = dt == KVQ_DT_F16;
    assert(dt == KVQ_DT_F16 || dt == KVQ_DT_F32);
    DISPATCH(isa, kvq_rk_mix, (p, nq, ld_p, V, f16, ld_v, idx, m, d, out),
             mix_scalar(p, nq, ld_p, V, f16, ld_v, idx, m, d, out));
}

/* ---- fused attention (online softmax) ------------------------------------------------ */

size_t kvq_rk_attend_floats(int32_t nq, int32_t d) { return (size_t)nq * ((size_t)d + 2); }

void kvq_rk_attend_init(float *state, int32_t nq, int32_t d)
{
    for (int32_t h = 0; h < nq; h++) {
        state[h] = -INFINITY;
        state[nq + h] = 0.0f;
    }
    memset(state + 2 * nq, 0, sizeof(float) * (size_t)nq * d);
}

void kvq_rk_attend_finish(const float *state, int32_t nq, int32_t d, float *out)
{
    for (int32_t h = 0; h < nq; h++) {
        const float l = state[nq + h];
        const float inv = l > 0 ? 1.0f / l : 0.0f;
        for (int32_t t = 0; t < d; t++)
            out[(size_t)h * d + t] = state[2 * nq + (size_t)h * d + t] * inv;
    }
}

/* Row by row: the logit in double, then the usual online update (rescale the sum and
 * the output when the max grows). */
static void attend_scalar(float *state, const float *q, int32_t nq, int32_t d, const void *K,
                          int kf16, int64_t ld_k, const int32_t *kidx, const void *V, int vf16,
                          int64_t ld_v, const int32_t *vidx, int64_t m, float scale)
{
    float krow[KVQ_ROPE_MAX_DIM], vrow[KVQ_ROPE_MAX_DIM];
    assert(d <= KVQ_ROPE_MAX_DIM);
    float *mx = state, *l = state + nq, *acc = state + 2 * nq;
    for (int64_t j = 0; j < m; j++) {
        load_row(K, kf16, ld_k, kidx ? kidx[j] : j, d, krow);
        load_row(V, vf16, ld_v, vidx ? vidx[j] : j, d, vrow);
        for (int32_t h = 0; h < nq; h++) {
            double dot = 0;
            for (int32_t t = 0; t < d; t++)
                dot += (double)q[(size_t)h * d + t] * krow[t];
            const float s = (float)(dot * scale);
            float *o = acc + (size_t)h * d;
            if (s > mx[h]) {
                const float f = expf(mx[h] - s); /* 0 for the first row (-inf) */
                l[h] *= f;
                for (int32_t t = 0; t < d; t++)
                    o[t] *= f;
                mx[h] = s;
            }
            const float p = expf(s - mx[h]);
            l[h] += p;
            for (int32_t t = 0; t < d; t++)
                o[t] += p * vrow[t];
        }
    }
}

void kvq_rk_attend_rows(kvq_isa isa, float *state, const float *q, int32_t nq, int32_t d,
                        const void *K, kvq_dtype kdt, int64_t ld_k, const int32_t *kidx,
                        const void *V, kvq_dtype vdt, int64_t ld_v, const int32_t *vidx, int64_t m,
                        float scale)
{
    const int kf16 = kdt == KVQ_DT_F16, vf16 = vdt == KVQ_DT_F16;
    assert((kdt == KVQ_DT_F16 || kdt == KVQ_DT_F32) && (vdt == KVQ_DT_F16 || vdt == KVQ_DT_F32));
    if (m <= 0)
        return;
    DISPATCH(isa, kvq_rk_attend,
             (state, q, nq, d, K, kf16, ld_k, kidx, V, vf16, ld_v, vidx, m, scale),
             attend_scalar(state, q, nq, d, K, kf16, ld_k, kidx, V, vf16, ld_v, vidx, m, scale));
}

/* The candidates ranked below k, in order (rk.h; scalar: the AVX-512 path's reference). */
int64_t kvq_rt_rank_select(const int32_t *rank, int64_t n, int32_t k, int32_t *sel)
{
    int64_t c = 0;
    for (int64_t j = 0; j < n; j++) { /* branch-free: c < k until the last one ranked below k */
        sel[c] = (int32_t)j;
        c += rank[j] < k;
    }
    return c;
}
