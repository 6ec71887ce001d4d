/*
 * codebook.c — the codebook object of kvq/codebook.h: methods, create, fit space,
 * encode (codebook/nearest.h), decode, lookup tables, the attention-score error, and
 * load from / save to the artifact. The k-means fit that builds one is
 * kmeans/codebook_fit.c.
 *
 * A codebook stores, per group g, the fit-space centroids W_g [K, d/G] (C^z groups for
 * the query-aware methods). Everything else (the key-space codebook of qavq, the LUT
 * query q' = q~ L^-T) is derived from W, L and L^-1 in double and rounded once, so a
 * codebook rebuilt from its stored tensors behaves exactly like the fitted one.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codebook/encode_simd.h"
#include "codebook/nearest.h"
#include "kvq/artifact.h"
#include "kvq/codebook.h"
#include "kvq/artifact.h"
#include "kvq/util.h"

struct kvq_codebook {
    kvq_codebook_desc desc;
    int32_t dg;        /* d / G */
    float *W;          /* [G, K, dg] fit-space centroids */
    float *C;          /* [K, d] key-space codebook (G == 1): W itself, or C^z L^-1 */
    float *L, *Linv;   /* [d, d] query-aware methods, else NULL */
    double *Ld;        /* [d, d] L in double, +0 above the diagonal (the AVX2 encode) */
    float *cnorm;      /* [G, K] ||W_g[c]||^2 (kvq_km_norm2) for encode */
    int simd;          /* encode by the AVX2 kernels (codebook/encode_simd.h) */
    double theta[KVQ_ROPE_MAX_DIM / 2]; /* RoPE frequencies   // [d/2] */
};

/* ==========================================================================
 * Methods
 * ========================================================================== */

static const char *const method_names[KVQ_CODEBOOK_N_METHODS] = {
    "vq", "qavq", "pq", "qapq", "vq-postrope",
};

const char *kvq_codebook_method_name(kvq_codebook_method m)
{
    return (unsigned)m < KVQ_CODEBOOK_N_METHODS ? method_names[m] : "unknown";
}

kvq_status kvq_codebook_method_parse(const char *s, kvq_codebook_method *m, kvq_err *err)
{
    if (!s || !m)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "method: NULL argument");
    for (int i = 0; i < KVQ_CODEBOOK_N_METHODS; i++)
        if (!strcmp(s, method_names[i])) {
            *m = (kvq_codebook_method)i;
            return KVQ_OK;
        }
    if (!strcmp(s, KVQ_METHOD_QAVQ_OLD)) {
        *m = KVQ_CODEBOOK_QAVQ;
        return KVQ_OK;
    }
    if (!strcmp(s, KVQ_METHOD_VQ_POSTROPE_OLD)) {
        *m = KVQ_CODEBOOK_VQ_POSTROPE;
        return KVQ_OK;
    }
    return kvq_err_set(err, KVQ_E_INVALID_ARG,
                       "unknown method '%s' (vq, qavq, pq, qapq or vq-postrope)", s);
}

const char *kvq_codebook_method_format_name(kvq_codebook_method m)
{
    switch (m) {
    case KVQ_CODEBOOK_VQ:
    case KVQ_CODEBOOK_PQ:
        return "vq";
    case KVQ_CODEBOOK_QAVQ:
    case KVQ_CODEBOOK_QAPQ:
        return KVQ_METHOD_QAVQ;
    case KVQ_CODEBOOK_VQ_POSTROPE:
        return KVQ_METHOD_VQ_POSTROPE;
    }
    return "unknown";
}

kvq_status kvq_codebook_method_from_format(const char *name, int32_t groups,
                                           kvq_codebook_method *m, kvq_err *err)
{
    if (name && !strcmp(name, KVQ_METHOD_VQ))
        *m = groups > 1 ? KVQ_CODEBOOK_PQ : KVQ_CODEBOOK_VQ;
    else if (name && (!strcmp(name, KVQ_METHOD_QAVQ) || !strcmp(name, KVQ_METHOD_QAVQ_OLD)))
        *m = groups > 1 ? KVQ_CODEBOOK_QAPQ : KVQ_CODEBOOK_QAVQ;
    else if (name && (!strcmp(name, KVQ_METHOD_VQ_POSTROPE) ||
                      !strcmp(name, KVQ_METHOD_VQ_POSTROPE_OLD)))
        *m = KVQ_CODEBOOK_VQ_POSTROPE;
    else
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "method '%s' has no codebooks",
                           name ? name : "(null)");
    return KVQ_OK;
}

int32_t kvq_codebook_method_default_groups(kvq_codebook_method m)
{
    return m == KVQ_CODEBOOK_PQ || m == KVQ_CODEBOOK_QAPQ ? 4 : 1;
}

int kvq_codebook_method_is_query_aware(kvq_codebook_method m)
{
    return m == KVQ_CODEBOOK_QAVQ || m == KVQ_CODEBOOK_QAPQ;
}

/* ==========================================================================
 * Building and accessing a codebook
 * ========================================================================== */

kvq_status kvq_codebook_desc_check(const kvq_codebook_desc *desc, kvq_err *err)
{
    if (!desc)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "codebook: NULL description");
    if ((unsigned)desc->method >= KVQ_CODEBOOK_N_METHODS)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "codebook: unknown method %d",
                           (int)desc->method);
    if (desc->dim < 2 || desc->dim > KVQ_ROPE_MAX_DIM || desc->dim % 2)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "codebook: head dim %d is not even in "
                           "[2, %d]", (int)desc->dim, KVQ_ROPE_MAX_DIM);
    if (desc->k < 1 || desc->k > 65536)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "codebook: size %d is outside [1, 65536]",
                           (int)desc->k);
    if (desc->groups < 1 || desc->dim % desc->groups)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "codebook: %d groups do not divide head "
                           "dim %d", (int)desc->groups, (int)desc->dim);
    if (desc->wrope_b < 0 || desc->wrope_b > INT32_MAX)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "codebook: WRoPE b %lld is outside "
                           "[0, 2^31)", (long long)desc->wrope_b);
    if (desc->rope.head_dim != desc->dim)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "codebook: RoPE head dim %d differs from "
                           "head dim %d", (int)desc->rope.head_dim, (int)desc->dim);
    return kvq_rope_check(&desc->rope, err);
}

static int all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* C = Cz Linv in double: C[c][b] = sum_{a >= b} Cz[c][a] Linv[a][b] (Linv lower). */
static void key_codebook_from_z(const float *Cz, const float *Linv, int32_t K, int32_t d,
                                float *C)
{
    for (int32_t c = 0; c < K; c++) {
        const float *z = Cz + (size_t)c * d;
        for (int32_t b = 0; b < d; b++) {
            double s = 0;
            for (int32_t a = b; a < d; a++)
                s += (double)z[a] * Linv[(size_t)a * d + b];
            C[(size_t)c * d + b] = (float)s;
        }
    }
}

kvq_status kvq_codebook_create(const kvq_codebook_desc *desc, const float *centroids,
                               const float *L, const float *Linv, kvq_codebook **out,
                               kvq_err *err)
{
    kvq_codebook *cb = NULL;
    kvq_status s;
    if (!out)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "codebook: NULL output");
    *out = NULL;
    if ((s = kvq_codebook_desc_check(desc, err)))
        return s;
    const int qa = kvq_codebook_method_is_query_aware(desc->method);
    const int32_t d = desc->dim, K = desc->k;
    const size_t nw = (size_t)K * d, dd = (size_t)d * d;
    if (!centroids || (qa && (!L || !Linv)))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "codebook: NULL %s",
                           !centroids ? "centroids" : "L or L^-1 (query-aware method)");
    if (!all_finite(centroids, nw) || (qa && (!all_finite(L, dd) || !all_finite(Linv, dd))))
        return kvq_err_set(err, KVQ_E_NUMERIC, "codebook: non-finite %s",
                           !all_finite(centroids, nw) ? "centroid" : "L or L^-1");

    cb = calloc(1, sizeof *cb);
    if (!cb)
        goto nomem;
    cb->desc = *desc;
    cb->dg = d / desc->groups;
    cb->simd = kvq_cpu_has_avx2(); /* once: cpuid can trap under a hypervisor */
    cb->W = malloc(nw * sizeof *cb->W);
    if (!cb->W)
        goto nomem;
    memcpy(cb->W, centroids, nw * sizeof *cb->W);
    cb->cnorm = malloc((size_t)desc->groups * K * sizeof *cb->cnorm);
    if (!cb->cnorm)
        goto nomem;
    for (size_t c = 0; c < (size_t)desc->groups * K; c++)
        cb->cnorm[c] = kvq_km_norm2(cb->W + c * cb->dg, cb->dg);
    if (qa) {
        cb->L = malloc(dd * sizeof *cb->L);
        cb->Linv = malloc(dd * sizeof *cb->Linv);
        if (!cb->L || !cb->Linv)
            goto nomem;
        memcpy(cb->L, L, dd * sizeof *cb->L);
        memcpy(cb->Linv, Linv, dd * sizeof *cb->Linv);
        if (cb->simd) {
            if (!(cb->Ld = malloc(dd * sizeof *cb->Ld)))
                goto nomem;
            for (size_t a = 0; a < (size_t)d; a++)
                for (size_t b = 0; b < (size_t)d; b++)
                    cb->Ld[a * d + b] = b <= a ? (double)L[a * d + b] : 0.0;
        }
    }
    if (desc->groups == 1) {
        if (qa) {
            cb->C = malloc(nw * sizeof *cb->C);
            if (!cb->C)
                goto nomem;
            key_codebook_from_z(cb->W, cb->Linv, K, d, cb->C);
        } else {
            cb->C = cb->W;
        }
    }
    kvq_rope_freqs(&cb->desc.rope, cb->theta);
    *out = cb;
    return KVQ_OK;
nomem:
    kvq_codebook_free(cb);
    return kvq_err_set(err, KVQ_E_NOMEM, "codebook: out of memory (K %d, d %d)", (int)K, (int)d);
}

void kvq_codebook_free(kvq_codebook *cb)
{
    if (!cb)
        return;
    if (cb->C != cb->W)
        free(cb->C);
    free(cb->W);
    free(cb->cnorm);
    free(cb->L);
    free(cb->Linv);
    free(cb->Ld);
    free(cb);
}

const kvq_codebook_desc *kvq_codebook_get_desc(const kvq_codebook *cb) { return &cb->desc; }

const float *kvq_codebook_centroids(const kvq_codebook *cb, int32_t g)
{
    assert(g >= 0 && g < cb->desc.groups);
    return cb->W + (size_t)g * cb->desc.k * cb->dg;
}

const float *kvq_codebook_key_codebook(const kvq_codebook *cb) { return cb->C; }
const float *kvq_codebook_L(const kvq_codebook *cb) { return cb->L; }
const float *kvq_codebook_Linv(const kvq_codebook *cb) { return cb->Linv; }

/* ==========================================================================
 * Spaces
 * ========================================================================== */

/* z = k L in double: z[b] = sum_{a >= b} k[a] L[a][b] (L lower).   k, z: [d] */
static void mul_lower(const float *k, const float *L, int32_t d, float *z)
{
    for (int32_t b = 0; b < d; b++) {
        double s = 0;
        for (int32_t a = b; a < d; a++)
            s += (double)k[a] * L[(size_t)a * d + b];
        z[b] = (float)s;
    }
}

/* Fit space of one key (vq-postrope: rotated with `theta`, kvq_rope_freqs of desc's RoPE).
 * key, x: [d] (may not alias). */
static void fit_space_row(const kvq_codebook_desc *desc, const double *theta, const float *L,
                          const float *key, int32_t pos, float *x)
{
    const int32_t d = desc->dim;
    if (kvq_codebook_method_is_query_aware(desc->method)) {
        mul_lower(key, L, d, x);
        return;
    }
    memcpy(x, key, (size_t)d * sizeof *x);
    if (desc->method == KVQ_CODEBOOK_VQ_POSTROPE)
        kvq_rope_apply(&desc->rope, theta, x, 1, pos);
}

kvq_status kvq_codebook_fit_space(const kvq_codebook_desc *desc, const float *L,
                                  const float *keys, const int32_t *pos, int64_t n,
                                  int32_t threads, float *out, kvq_err *err)
{
    kvq_status s;
    if ((s = kvq_codebook_desc_check(desc, err)))
        return s;
    const int32_t d = desc->dim;
    if (n < 0 || (n > 0 && (!keys || !out)) || threads < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "codebook: bad keys, count or threads");
    if (desc->method == KVQ_CODEBOOK_VQ_POSTROPE && n > 0 && !pos)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "codebook: vq-postrope needs key positions");
    if (kvq_codebook_method_is_query_aware(desc->method) && !L)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "codebook: %s needs L",
                           kvq_codebook_method_name(desc->method));
    double theta[KVQ_ROPE_MAX_DIM / 2];
    kvq_rope_freqs(&desc->rope, theta);
    const int64_t par = kvq_codebook_method_is_query_aware(desc->method) ? 1024 : 4096;
#pragma omp parallel for num_threads(threads) schedule(static) if (n > par)
    for (int64_t j = 0; j < n; j++)
        fit_space_row(desc, theta, L, keys + (size_t)j * d, pos ? pos[j] : 0,
                      out + (size_t)j * d);
    return KVQ_OK;
}

void kvq_codebook_query_pe(const kvq_codebook *cb, const float *q, int64_t pos, float *out)
{
    const int32_t d = cb->desc.dim;
    if (out != q)
        memmove(out, q, (size_t)d * sizeof *out);
    int64_t p = cb->desc.method == KVQ_CODEBOOK_VQ_POSTROPE ? pos : cb->desc.wrope_b;
    kvq_rope_apply(&cb->desc.rope, cb->theta, out, 1, p);
}

/* ==========================================================================
 * Encode, decode, LUT, score
 * ========================================================================== */

int64_t kvq_codebook_first_bad_row(const float *x, int64_t n, int32_t d)
{
    for (int64_t j = 0; j < n; j++)
        if (!all_finite(x + (size_t)j * d, (size_t)d))
            return j;
    return -1;
}

void kvq_codebook_take_group(const float *x, int64_t n, int32_t d, int32_t g, int32_t dg, float *sub)
{
    for (int64_t j = 0; j < n; j++)
        memcpy(sub + (size_t)j * dg, x + (size_t)j * d + (size_t)g * dg, (size_t)dg * sizeof *sub);
}

/* Nearest of the K centroids W [K, dg] (norms cn [K]) to x [dg]: the rule of
 * codebook/nearest.h, first minimum (kvq_km_better), 0 when every distance overflows. */
static int32_t nearest(const float *x, const float *W, const float *cn, int32_t K, int32_t dg)
{
    float best = INFINITY;
    int32_t bi = INT32_MAX;
    const float xn = dg <= KVQ_KM_DIRECT_MAX_D ? 0.0f : kvq_km_norm2(x, dg);
    for (int32_t c = 0; c < K; c++) {
        const float *w = W + (size_t)c * dg;
        const float v = dg <= KVQ_KM_DIRECT_MAX_D
                            ? kvq_km_l2sq(x, w, dg)
                            : kvq_km_dist_from_dot(xn, cn[c], kvq_km_dot(x, w, dg));
        if (kvq_km_better(v, c, best, bi)) {
            best = v;
            bi = c;
        }
    }
    return bi == INT32_MAX ? 0 : bi;
}

kvq_status kvq_codebook_encode(const kvq_codebook *cb, const float *keys, const int32_t *pos,
                               int64_t n, int32_t threads, int32_t *codes, kvq_err *err)
{
    const kvq_codebook_desc *D = &cb->desc;
    const int32_t d = D->dim, G = D->groups, K = D->k, dg = cb->dg;
    if (n < 0 || (n > 0 && (!keys || !codes)) || threads < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "encode: bad keys, count or threads");
    if (D->method == KVQ_CODEBOOK_VQ_POSTROPE && n > 0 && !pos)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "codebook: vq-postrope needs key positions");
    if (n == 0)
        return KVQ_OK;
    int64_t bad = kvq_codebook_first_bad_row(keys, n, d);
    if (bad >= 0)
        return kvq_err_set(err, KVQ_E_NUMERIC, "encode: key row %lld is not finite",
                           (long long)bad);
    /* AVX2 kernels where they apply: the same bits (codebook/encode_simd.h) */
    const int simd = cb->simd && dg > KVQ_KM_DIRECT_MAX_D && dg % 8 == 0;
    const int simd_L = simd && cb->Ld;
    if (simd) { /* tiles of keys: each block of centroids read from L1 by the tile */
        const int64_t nt = (n + KVQ_CB_TILE - 1) / KVQ_CB_TILE;
#pragma omp parallel for num_threads(threads) schedule(static) if (n > 64)
        for (int64_t t = 0; t < nt; t++) {
            float x[KVQ_CB_TILE][KVQ_ROPE_MAX_DIM], xn[KVQ_CB_TILE];
            const int64_t j0 = t * KVQ_CB_TILE;
            const int32_t tn = (int32_t)(n - j0 < KVQ_CB_TILE ? n - j0 : KVQ_CB_TILE);
            for (int32_t i = 0; i < tn; i++) {
                const int64_t j = j0 + i;
                if (simd_L)
                    kvq_cb_mul_lower_d_avx2(keys + (size_t)j * d, cb->Ld, d, x[i]);
                else
                    fit_space_row(D, cb->theta, cb->L, keys + (size_t)j * d, pos ? pos[j] : 0, x[i]);
            }
            for (int32_t g = 0; g < G; g++) {
                for (int32_t i = 0; i < tn; i++)
                    xn[i] = kvq_km_norm2(x[i] + (size_t)g * dg, dg);
                kvq_cb_nearest_tile_avx2(x[0] + (size_t)g * dg, KVQ_ROPE_MAX_DIM, xn, tn,
                                         kvq_codebook_centroids(cb, g), cb->cnorm + (size_t)g * K,
                                         K, dg, codes + (size_t)j0 * G + g, G);
            }
        }
        return KVQ_OK;
    }
#pragma omp parallel for num_threads(threads) schedule(static) if (n > 64)
    for (int64_t j = 0; j < n; j++) {
        float x[KVQ_ROPE_MAX_DIM];
        fit_space_row(D, cb->theta, cb->L, keys + (size_t)j * d, pos ? pos[j] : 0, x);
        for (int32_t g = 0; g < G; g++)
            codes[(size_t)j * G + g] = nearest(x + (size_t)g * dg, kvq_codebook_centroids(cb, g),
                                               cb->cnorm + (size_t)g * K, K, dg);
    }
    return KVQ_OK;
}

/* Fit-space reconstruction of one code [G]: the concatenated group centroids. */
static void decode_fit_space(const kvq_codebook *cb, const int32_t *code, float *x)
{
    const int32_t G = cb->desc.groups, K = cb->desc.k, dg = cb->dg;
    for (int32_t g = 0; g < G; g++) {
        assert(code[g] >= 0 && code[g] < K);
        memcpy(x + (size_t)g * dg, kvq_codebook_centroids(cb, g) + (size_t)code[g] * dg,
               (size_t)dg * sizeof *x);
    }
}

void kvq_codebook_decode(const kvq_codebook *cb, const int32_t *codes, int64_t n, float *khat)
{
    const int32_t d = cb->desc.dim, G = cb->desc.groups;
    float z[KVQ_ROPE_MAX_DIM];
    for (int64_t j = 0; j < n; j++) {
        float *out = khat + (size_t)j * d;
        if (!cb->L) {
            decode_fit_space(cb, codes + (size_t)j * G, out);
        } else if (G == 1) {
            assert(codes[j] >= 0 && codes[j] < cb->desc.k);
            memcpy(out, cb->C + (size_t)codes[j] * d, (size_t)d * sizeof *out);
        } else {
            decode_fit_space(cb, codes + (size_t)j * G, z);
            key_codebook_from_z(z, cb->Linv, 1, d, out);
        }
    }
}

void kvq_codebook_lut_query(const kvq_codebook *cb, const float *qs, double *qp)
{
    const int32_t d = cb->desc.dim;
    for (int32_t a = 0; a < d; a++) {
        if (!cb->Linv) {
            qp[a] = qs[a];
            continue;
        }
        double s = 0;
        for (int32_t b = 0; b <= a; b++)
            s += (double)qs[b] * cb->Linv[(size_t)a * d + b];
        qp[a] = s;
    }
}

void kvq_codebook_lut_ref(const kvq_codebook *cb, const float *qs, float *lut)
{
    const int32_t K = cb->desc.k, G = cb->desc.groups, dg = cb->dg;
    double qp[KVQ_ROPE_MAX_DIM];
    kvq_codebook_lut_query(cb, qs, qp);
    for (int32_t g = 0; g < G; g++) {
        const float *W = kvq_codebook_centroids(cb, g);
        const double *q = qp + (size_t)g * dg;
        for (int32_t c = 0; c < K; c++) {
            const float *w = W + (size_t)c * dg;
            double s = 0;
            for (int32_t t = 0; t < dg; t++)
                s += q[t] * w[t];
            lut[(size_t)g * K + c] = (float)s;
        }
    }
}

void kvq_codebook_score(const kvq_codebook *cb, const float *lut, const int32_t *codes,
                        int64_t n, float *scores)
{
    const int32_t K = cb->desc.k, G = cb->desc.groups;
    for (int64_t j = 0; j < n; j++) {
        const int32_t *c = codes + (size_t)j * G;
        float s = 0;
        for (int32_t g = 0; g < G; g++) {
            assert(c[g] >= 0 && c[g] < K);
            s += lut[(size_t)g * K + c[g]];
        }
        scores[j] = s;
    }
}

double kvq_codebook_score_ref(const kvq_codebook *cb, const float *qs, const int32_t *code)
{
    const int32_t d = cb->desc.dim;
    float khat[KVQ_ROPE_MAX_DIM];
    kvq_codebook_decode(cb, code, 1, khat);
    double s = 0;
    for (int32_t t = 0; t < d; t++)
        s += (double)qs[t] * khat[t];
    return s;
}

/* x Q x^T for symmetric Q [d, d] (double), x [d] in double. */
static double quad_form(const double *x, const double *Q, int32_t d)
{
    double s = 0;
    for (int32_t a = 0; a < d; a++) {
        double r = 0;
        for (int32_t b = 0; b < d; b++)
            r += Q[(size_t)a * d + b] * x[b];
        s += x[a] * r;
    }
    return s;
}

kvq_status kvq_codebook_score_mse(const kvq_codebook *cb, const float *qs, int64_t n_q,
                                  const float *keys, const int32_t *pos, int64_t n_k,
                                  int32_t threads, double *mse, double *power, kvq_err *err)
{
    const kvq_codebook_desc *D = &cb->desc;
    const int32_t d = D->dim, G = D->groups;
    double *Q = NULL, *em = NULL, *ep = NULL;
    float *sk = NULL, *kh = NULL;
    int32_t *codes = NULL;
    kvq_status s = KVQ_OK;
    size_t bytes;
    if (n_q < 1 || n_k < 1 || !qs || !keys || !mse || !power || threads < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "score error: needs queries and keys");
    if (!kvq_size_mul((size_t)n_k, (size_t)d * sizeof(float), &bytes) ||
        !(Q = calloc((size_t)d * d, sizeof *Q)) || !(em = malloc((size_t)n_k * sizeof *em)) ||
        !(ep = malloc((size_t)n_k * sizeof *ep)) || !(sk = malloc(bytes)) ||
        !(kh = malloc(bytes)) || !(codes = malloc((size_t)n_k * G * sizeof *codes))) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "score error: out of memory for %lld keys",
                        (long long)n_k);
        goto done;
    }
    /* Q = mean_i qs_i^T qs_i, lower triangle summed in query order, then mirrored. */
    for (int64_t i = 0; i < n_q; i++) {
        const float *q = qs + (size_t)i * d;
        for (int32_t a = 0; a < d; a++)
            for (int32_t b = 0; b <= a; b++)
                Q[(size_t)a * d + b] += (double)q[a] * q[b];
    }
    for (int32_t a = 0; a < d; a++)
        for (int32_t b = 0; b <= a; b++) {
            Q[(size_t)a * d + b] /= (double)n_q;
            Q[(size_t)b * d + a] = Q[(size_t)a * d + b];
        }
    if ((s = kvq_codebook_encode(cb, keys, pos, n_k, threads, codes, err)))
        goto done;
    kvq_codebook_decode(cb, codes, n_k, kh);
    /* The exact scoring-space key: rotated for vq-postrope, else the key itself. */
    if (D->method == KVQ_CODEBOOK_VQ_POSTROPE)
        s = kvq_codebook_fit_space(D, NULL, keys, pos, n_k, threads, sk, err);
    else
        memcpy(sk, keys, bytes);
    if (s)
        goto done;
#pragma omp parallel for num_threads(threads) schedule(static) if (n_k > 1024)
    for (int64_t j = 0; j < n_k; j++) {
        double e[KVQ_ROPE_MAX_DIM], x[KVQ_ROPE_MAX_DIM];
        for (int32_t t = 0; t < d; t++) {
            x[t] = sk[(size_t)j * d + t];
            e[t] = x[t] - kh[(size_t)j * d + t];
        }
        em[j] = quad_form(e, Q, d);
        ep[j] = quad_form(x, Q, d);
    }
    double sm = 0, sp = 0;
    for (int64_t j = 0; j < n_k; j++)
        sm += em[j], sp += ep[j];
    *mse = sm / (double)n_k;
    *power = sp / (double)n_k;
done:
    free(Q);
    free(em);
    free(ep);
    free(sk);
    free(kh);
    free(codes);
    return s;
}

/* ==========================================================================
 * Loading from an artifact payload
 * ========================================================================== */

static kvq_status meta_i64(const kvq_st *st, const char *key, int64_t lo, int64_t hi,
                           int64_t *v, kvq_err *err)
{
    const char *s = kvq_st_meta_get(st, key);
    kvq_err e = {0};
    if (!s)
        return kvq_err_set(err, KVQ_E_NOT_FOUND, "artifact: metadata key %s is missing", key);
    if (kvq_parse_i64(s, lo, hi, v, &e))
        return kvq_err_set(err, KVQ_E_CORRUPT, "artifact: metadata %s: %s", key, e.msg);
    return KVQ_OK;
}

/* Finds a F32 tensor of shape [r, c] by name. */
static kvq_status find_f32(const kvq_st *st, const char *name, int64_t r, int64_t c,
                           const kvq_tensor_view **v, kvq_err *err)
{
    *v = kvq_st_find(st, name);
    if (!*v)
        return kvq_err_set(err, KVQ_E_NOT_FOUND, "artifact: tensor %s is missing", name);
    if ((*v)->dtype != KVQ_DT_F32 || (*v)->ndim != 2 || (*v)->shape[0] != r ||
        (*v)->shape[1] != c)
        return kvq_err_set(err, KVQ_E_SHAPE_MISMATCH, "artifact: tensor %s is not F32 "
                           "[%lld, %lld]", name, (long long)r, (long long)c);
    return KVQ_OK;
}

/* The tensor name of group g's fit-space centroids: Cz (query-aware) or codebook, with
 * the group in the name when G > 1. */
static void group_tensor_name(int qa, int32_t G, int32_t layer, int32_t head, int32_t g,
                              char *name, size_t cap)
{
    if (G == 1)
        snprintf(name, cap, qa ? KVQ_TENSOR_CZ : KVQ_TENSOR_CODEBOOK, (int)layer, (int)head);
    else
        snprintf(name, cap, qa ? KVQ_TENSOR_GROUP_CZ : KVQ_TENSOR_GROUP_CODEBOOK, (int)layer,
                 (int)head, (int)g);
}

kvq_status kvq_codebook_save(const kvq_codebook *cb, int32_t layer, int32_t head,
                             kvq_codebook_tensor_fn add, void *user, kvq_err *err)
{
    const kvq_codebook_desc *D = &cb->desc;
    const int32_t d = D->dim, K = D->k, G = D->groups;
    const int qa = kvq_codebook_method_is_query_aware(D->method);
    char name[128];
    kvq_status s;
    if (qa) {
        snprintf(name, sizeof name, KVQ_TENSOR_L, (int)layer, (int)head);
        if ((s = add(user, name, d, d, cb->L, err)))
            return s;
        snprintf(name, sizeof name, KVQ_TENSOR_LINV, (int)layer, (int)head);
        if ((s = add(user, name, d, d, cb->Linv, err)))
            return s;
    }
    for (int32_t g = 0; g < G; g++) {
        group_tensor_name(qa, G, layer, head, g, name, sizeof name);
        if ((s = add(user, name, K, cb->dg, kvq_codebook_centroids(cb, g), err)))
            return s;
    }
    if (qa && G == 1) {
        snprintf(name, sizeof name, KVQ_TENSOR_CODEBOOK, (int)layer, (int)head);
        if ((s = add(user, name, K, d, cb->C, err)))
            return s;
    }
    return KVQ_OK;
}

kvq_status kvq_codebook_load(const kvq_st *payload, int32_t layer, int32_t head,
                             kvq_codebook **out, kvq_err *err)
{
    kvq_codebook_desc desc;
    const kvq_tensor_view *v = NULL;
    float *W = NULL, *L = NULL, *Linv = NULL;
    int64_t K, G, d, b, x;
    kvq_status s;
    char name[128];
    if (!payload || !out)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "artifact: NULL argument");
    *out = NULL;
    memset(&desc, 0, sizeof desc);
    if ((s = meta_i64(payload, KVQ_META_HEAD_DIM, 2, KVQ_ROPE_MAX_DIM, &d, err)) ||
        (s = meta_i64(payload, KVQ_META_CODEBOOK_SIZE, 1, 65536, &K, err)) ||
        (s = meta_i64(payload, KVQ_META_GROUPS, 1, d, &G, err)) ||
        (s = meta_i64(payload, KVQ_META_WROPE_B, 0, INT32_MAX, &b, err)) ||
        (s = meta_i64(payload, KVQ_META_N_KV_HEADS, 1, 1 << 20, &x, err)))
        return s;
    if (head < 0 || head >= x)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "artifact: KV head %d is out of range "
                           "(%lld heads)", (int)head, (long long)x);
    if ((s = kvq_codebook_method_from_format(kvq_st_meta_get(payload, KVQ_META_METHOD), (int32_t)G,
                                             &desc.method, err)))
        return s;
    /* RoPE from the model identity keys. */
    desc.rope = kvq_rope_default((int32_t)d);
    const char *lay = kvq_st_meta_get(payload, KVQ_META_ROPE_LAYOUT);
    const char *sca = kvq_st_meta_get(payload, KVQ_META_ROPE_SCALING);
    const char *base = kvq_st_meta_get(payload, KVQ_META_ROPE_BASE);
    kvq_err e = {0};
    if (!lay || !sca || !base)
        return kvq_err_set(err, KVQ_E_NOT_FOUND, "artifact: model.rope.* keys are missing");
    if (kvq_rope_layout_parse(lay, &desc.rope.layout) ||
        kvq_rope_scaling_parse(sca, &desc.rope.scaling))
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "artifact: rope layout '%s' or scaling "
                           "'%s' is unknown", lay, sca);
    if (kvq_parse_f64(base, 1.0, 1e300, &desc.rope.base, &e))
        return kvq_err_set(err, KVQ_E_CORRUPT, "artifact: model.rope.base: %s", e.msg);
    static const char *const rope_keys[] = {KVQ_META_ROPE_FACTOR, KVQ_META_ROPE_LOW_FREQ,
                                            KVQ_META_ROPE_HIGH_FREQ, KVQ_META_ROPE_ORIG_MAX};
    double *rope_vals[] = {&desc.rope.factor, &desc.rope.low_freq_factor,
                           &desc.rope.high_freq_factor, &desc.rope.original_max_pos};
    for (int i = 0; i < 4; i++) {
        const char *sv = kvq_st_meta_get(payload, rope_keys[i]);
        if (sv && kvq_parse_f64(sv, 1e-300, 1e300, rope_vals[i], &e))
            return kvq_err_set(err, KVQ_E_CORRUPT, "artifact: %s: %s", rope_keys[i], e.msg);
    }
    desc.dim = (int32_t)d;
    desc.k = (int32_t)K;
    desc.groups = (int32_t)G;
    desc.wrope_b = b;
    const int qa = kvq_codebook_method_is_query_aware(desc.method);
    const int64_t dg = d / G;
    if (!(W = malloc((size_t)K * d * sizeof *W)) ||
        (qa && (!(L = malloc((size_t)d * d * sizeof *L)) ||
                !(Linv = malloc((size_t)d * d * sizeof *Linv))))) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "artifact: out of memory");
        goto done;
    }
    for (int64_t g = 0; g < G; g++) {
        group_tensor_name(qa, (int32_t)G, layer, head, (int32_t)g, name, sizeof name);
        if ((s = find_f32(payload, name, K, dg, &v, err)))
            goto done;
        memcpy(W + (size_t)g * K * dg, v->data, v->nbytes);
    }
    if (qa) {
        snprintf(name, sizeof name, KVQ_TENSOR_L, (int)layer, (int)head);
        if ((s = find_f32(payload, name, d, d, &v, err)))
            goto done;
        memcpy(L, v->data, v->nbytes);
        snprintf(name, sizeof name, KVQ_TENSOR_LINV, (int)layer, (int)head);
        if ((s = find_f32(payload, name, d, d, &v, err)))
            goto done;
        memcpy(Linv, v->data, v->nbytes);
    }
    s = kvq_codebook_create(&desc, W, L, Linv, out, err);
done:
    free(W);
    free(L);
    free(Linv);
    return s;
}
