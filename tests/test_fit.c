/* test_fit.c — codebook methods (kvq/codebook.h): fit space, encode against brute force,
 * LUT scores against direct dot products, the score error against explicit pairs,
 * query-aware beating plain VQ on an anisotropic H, and the `kvq fit` stage: artifact
 * content, determinism, checkpoint resume, and the error cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers/testutil.h"
#include "kvq/util.h"
#include "kvq.h"
#include "kvq/capture.h"
#include "kvq/codebook.h"
#include "kvq/moments.h"

#define D 8

/* ======================================================================================
 * Helpers
 * ====================================================================================== */

static float *normal_matrix(int64_t n, int32_t d, double scale, uint64_t seed)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    float *x = malloc((size_t)n * d * sizeof *x);
    for (int64_t i = 0; i < n * d; i++)
        x[i] = (float)(scale * kvq_rng_normal(&r));
    return x;
}

/* A fixed, strongly anisotropic mixing, q = g M with g standard normal: block diagonal
 * over the dimension pairs (2m, 2m+1), which are also the RoPE pairs and the groups of
 * G = 4, each block diag(a_m, b_m) times a rotation, so the query variance differs by
 * orders of magnitude across pairs and by 10x inside each pair.   M: [D, D] */
static void query_mixing(double *M)
{
    static const double a[D / 2] = {12, 5, 2, 1}, b[D / 2] = {1.2, 0.5, 0.2, 0.1};
    static const double phi[D / 2] = {0.3, 1.1, 2.0, 2.7};
    memset(M, 0, sizeof(double) * D * D);
    for (int m = 0; m < D / 2; m++) {
        const double c = cos(phi[m]), s = sin(phi[m]);
        const int i = 2 * m;
        M[i * D + i] = a[m] * c, M[i * D + i + 1] = a[m] * s;
        M[(i + 1) * D + i] = -b[m] * s, M[(i + 1) * D + i + 1] = b[m] * c;
    }
}

/* n anisotropic queries [n, D]. */
static float *aniso_queries(int64_t n, uint64_t seed)
{
    double M[D * D];
    query_mixing(M);
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    float *q = malloc((size_t)n * D * sizeof *q);
    for (int64_t i = 0; i < n; i++) {
        double g[D];
        for (int t = 0; t < D; t++)
            g[t] = kvq_rng_normal(&r);
        for (int t = 0; t < D; t++) {
            double v = 0;
            for (int a = 0; a < D; a++)
                v += g[a] * M[a * D + t];
            q[i * D + t] = (float)v;
        }
    }
    return q;
}

/* L, L^-1 (float) of H = mean q^T q of n queries [n, D]. */
static void factor_queries(const float *q, int64_t n, float *Lf, float *Lif)
{
    double H[D * D] = {0}, L[D * D], Li[D * D];
    for (int64_t i = 0; i < n; i++)
        for (int a = 0; a < D; a++)
            for (int b = 0; b < D; b++)
                H[a * D + b] += (double)q[i * D + a] * q[i * D + b] / (double)n;
    kvq_moments_params mp = kvq_moments_params_default();
    kvq_moments_head_stats st;
    kvq_err e = {0};
    assert_int_equal(kvq_cholesky_regularized(H, D, &mp, "test", L, Li, &st, &e), KVQ_OK);
    for (int i = 0; i < D * D; i++)
        Lf[i] = (float)L[i], Lif[i] = (float)Li[i];
}

static kvq_codebook_desc desc_of(kvq_codebook_method m, int32_t k, int32_t g)
{
    kvq_codebook_desc d = {.method = m, .dim = D, .k = k, .groups = g,
                           .rope = kvq_rope_default(D), .wrope_b = 2048};
    return d;
}

static kvq_kmeans_params km_params(int iters)
{
    kvq_kmeans_params km = kvq_kmeans_params_default();
    km.max_iters = iters;
    km.seed = 7;
    return km;
}

static double l2sq(const float *a, const float *b, int32_t d)
{
    double s = 0;
    for (int32_t t = 0; t < d; t++)
        s += ((double)a[t] - b[t]) * ((double)a[t] - b[t]);
    return s;
}

static double dot(const float *a, const float *b, int32_t d)
{
    double s = 0;
    for (int32_t t = 0; t < d; t++)
        s += (double)a[t] * b[t];
    return s;
}

/* ======================================================================================
 * Methods
 * ====================================================================================== */

static void test_method_names(void **state)
{
    (void)state;
    kvq_codebook_method m;
    kvq_err e = {0};
    for (int i = 0; i < KVQ_CODEBOOK_N_METHODS; i++) {
        assert_int_equal(kvq_codebook_method_parse(kvq_codebook_method_name(i), &m, &e), KVQ_OK);
        assert_int_equal(m, i);
        /* The artifact spelling and the group count give the method back. */
        int32_t g = kvq_codebook_method_default_groups(i);
        assert_int_equal(kvq_codebook_method_from_format(kvq_codebook_method_format_name(i), g,
                                                         &m, &e), KVQ_OK);
        assert_int_equal(m, i);
    }
    assert_int_equal(kvq_codebook_method_parse("qa-vq", &m, &e), KVQ_OK);
    assert_int_equal(m, KVQ_CODEBOOK_QAVQ);
    assert_int_equal(kvq_codebook_method_parse("opq", &m, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "opq"));
    assert_int_equal(kvq_codebook_method_from_format("none", 1, &m, &e), KVQ_E_UNSUPPORTED);
    assert_int_equal(kvq_codebook_method_default_groups(KVQ_CODEBOOK_QAPQ), 4);
    assert_int_equal(kvq_codebook_method_default_groups(KVQ_CODEBOOK_VQ_POSTROPE), 1);
    assert_string_equal(kvq_codebook_method_format_name(KVQ_CODEBOOK_PQ), "vq");
    /* Writers use one spelling per method; the old artifact spellings are still read. */
    assert_string_equal(kvq_codebook_method_format_name(KVQ_CODEBOOK_QAVQ), "qavq");
    assert_string_equal(kvq_codebook_method_format_name(KVQ_CODEBOOK_QAPQ), "qavq");
    assert_string_equal(kvq_codebook_method_format_name(KVQ_CODEBOOK_VQ_POSTROPE), "vq-postrope");
    assert_int_equal(kvq_codebook_method_parse("post-rope-vq", &m, &e), KVQ_OK);
    assert_int_equal(m, KVQ_CODEBOOK_VQ_POSTROPE);
    assert_int_equal(kvq_codebook_method_from_format("qa-vq", 1, &m, &e), KVQ_OK);
    assert_int_equal(m, KVQ_CODEBOOK_QAVQ);
    assert_int_equal(kvq_codebook_method_from_format("qa-vq", 4, &m, &e), KVQ_OK);
    assert_int_equal(m, KVQ_CODEBOOK_QAPQ);
    assert_int_equal(kvq_codebook_method_from_format("post-rope-vq", 1, &m, &e), KVQ_OK);
    assert_int_equal(m, KVQ_CODEBOOK_VQ_POSTROPE);
}

static void test_desc_errors(void **state)
{
    (void)state;
    kvq_err e = {0};
    kvq_codebook *cb = NULL;
    float W[4 * D] = {0}, L[D * D] = {0};
    kvq_codebook_desc d = desc_of(KVQ_CODEBOOK_PQ, 4, 3);
    assert_int_equal(kvq_codebook_create(&d, W, NULL, NULL, &cb, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "3 groups do not divide head dim 8"));
    d = desc_of(KVQ_CODEBOOK_QAVQ, 4, 1);
    assert_int_equal(kvq_codebook_create(&d, W, NULL, NULL, &cb, &e), KVQ_E_INVALID_ARG);
    W[5] = NAN;
    for (int i = 0; i < D; i++)
        L[i * D + i] = 1;
    assert_int_equal(kvq_codebook_create(&d, W, L, L, &cb, &e), KVQ_E_NUMERIC);
    assert_null(cb);
    /* More centroids than keys. */
    float *k = normal_matrix(10, D, 1, 1);
    kvq_codebook_data data = {.keys = k, .n = 10};
    kvq_kmeans_params km = km_params(2);
    d = desc_of(KVQ_CODEBOOK_VQ, 16, 1);
    assert_int_equal(kvq_codebook_fit(&d, &data, &km, &cb, NULL, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "larger than the 10 training keys"));
    k[3 * D + 2] = NAN;
    d.k = 4;
    assert_int_equal(kvq_codebook_fit(&d, &data, &km, &cb, NULL, &e), KVQ_E_NUMERIC);
    assert_non_null(strstr(e.msg, "row 3"));
    free(k);
}

/* ======================================================================================
 * Spaces, encode, LUT, decode
 * ====================================================================================== */

/* A fitted codebook of each method on n random keys (positions i % 512). */
static kvq_codebook *fit_one(kvq_codebook_method m, int32_t k, int32_t g, const float *keys,
                             const int32_t *pos, int64_t n, const float *L, const float *Li)
{
    kvq_codebook_desc d = desc_of(m, k, g);
    kvq_codebook_data data = {.keys = keys, .pos = pos, .n = n, .L = L, .Linv = Li};
    kvq_kmeans_params km = km_params(8);
    kvq_codebook *cb = NULL;
    kvq_codebook_fit_stats fs;
    kvq_err e = {0};
    assert_int_equal(kvq_codebook_fit(&d, &data, &km, &cb, &fs, &e), KVQ_OK);
    assert_int_equal(fs.groups, g);
    for (int32_t t = 0; t < g; t++) {
        assert_int_equal(fs.group[t].n_iters >= 1, 1);
        /* Lloyd never increases the inertia. */
        for (int32_t i = 1; i < fs.group[t].n_iters; i++)
            assert_true(fs.group[t].inertia[i] <= fs.group[t].inertia[i - 1] * (1 + 1e-6));
    }
    kvq_codebook_fit_stats_free(&fs);
    return cb;
}

static void test_encode_is_nearest_in_fit_space(void **state)
{
    (void)state;
    const int64_t n = 1500, nt = 300;
    float *keys = normal_matrix(n, D, 1.5, 11), *test = normal_matrix(nt, D, 1.5, 12);
    float *q = aniso_queries(2000, 13), L[D * D], Li[D * D];
    int32_t *pos = malloc((size_t)n * sizeof *pos), *tpos = malloc((size_t)nt * sizeof *tpos);
    for (int64_t i = 0; i < n; i++)
        pos[i] = (int32_t)(i % 512);
    for (int64_t i = 0; i < nt; i++)
        tpos[i] = (int32_t)(i * 7 % 1000);
    factor_queries(q, 2000, L, Li);
    const kvq_codebook_method methods[] = {KVQ_CODEBOOK_VQ, KVQ_CODEBOOK_QAVQ, KVQ_CODEBOOK_PQ,
                                           KVQ_CODEBOOK_QAPQ, KVQ_CODEBOOK_VQ_POSTROPE};
    for (size_t mi = 0; mi < 5; mi++) {
        const kvq_codebook_method m = methods[mi];
        const int32_t G = kvq_codebook_method_default_groups(m), K = 32, dg = D / G;
        kvq_codebook *cb = fit_one(m, K, G, keys, pos, n, L, Li);
        const kvq_codebook_desc *desc = kvq_codebook_get_desc(cb);
        float *x = malloc((size_t)nt * D * sizeof *x);
        int32_t *codes = malloc((size_t)nt * G * sizeof *codes);
        kvq_err e = {0};
        assert_int_equal(kvq_codebook_fit_space(desc, L, test, tpos, nt, 2, x, &e), KVQ_OK);
        /* The fit space by hand: k L, k R_pos, or k. */
        double theta[D / 2];
        kvq_rope_freqs(&desc->rope, theta);
        for (int64_t j = 0; j < nt; j++) {
            float want[D];
            memcpy(want, test + j * D, sizeof want);
            if (m == KVQ_CODEBOOK_QAVQ || m == KVQ_CODEBOOK_QAPQ) {
                for (int b = 0; b < D; b++) {
                    double s = 0;
                    for (int a = 0; a < D; a++)
                        s += (double)test[j * D + a] * L[a * D + b];
                    want[b] = (float)s;
                }
            } else if (m == KVQ_CODEBOOK_VQ_POSTROPE) {
                kvq_rope_apply(&desc->rope, theta, want, 1, tpos[j]);
            }
            for (int t = 0; t < D; t++)
                assert_float_equal(x[j * D + t], want[t], 1e-5 * (1 + fabsf(want[t])));
        }
        assert_int_equal(kvq_codebook_encode(cb, test, tpos, nt, 1, codes, &e), KVQ_OK);
        /* Brute force per group: the chosen centroid is the nearest, up to the SGEMM
         * distance tolerance; nearly always exactly. */
        int64_t exact = 0;
        for (int64_t j = 0; j < nt; j++)
            for (int32_t g = 0; g < G; g++) {
                const float *xg = x + j * D + g * dg, *W = kvq_codebook_centroids(cb, g);
                int32_t best = 0;
                double bd = INFINITY;
                for (int32_t c = 0; c < K; c++) {
                    double dd = l2sq(xg, W + c * dg, dg);
                    if (dd < bd)
                        bd = dd, best = c;
                }
                const int32_t got = codes[j * G + g];
                assert_true(got >= 0 && got < K);
                double gd = l2sq(xg, W + got * dg, dg);
                double scale = dot(xg, xg, dg) + dot(W + got * dg, W + got * dg, dg);
                assert_true(gd <= bd + KVQ_KMEANS_TOL_DIST * scale);
                exact += got == best;
            }
        assert_true(exact >= (int64_t)(0.99 * nt * G));
        /* Thread count does not change the codes. */
        int32_t *codes2 = malloc((size_t)nt * G * sizeof *codes2);
        assert_int_equal(kvq_codebook_encode(cb, test, tpos, nt, 2, codes2, &e), KVQ_OK);
        assert_memory_equal(codes, codes2, (size_t)nt * G * sizeof *codes);
        free(codes2);
        free(x);
        free(codes);
        kvq_codebook_free(cb);
    }
    int32_t c1[1];
    kvq_codebook *cb = fit_one(KVQ_CODEBOOK_VQ_POSTROPE, 8, 1, keys, pos, n, NULL, NULL);
    kvq_err e = {0};
    assert_int_equal(kvq_codebook_encode(cb, keys, NULL, 1, 1, c1, &e), KVQ_E_INVALID_ARG);
    keys[4] = INFINITY;
    assert_int_equal(kvq_codebook_encode(cb, keys, pos, 2, 1, c1, &e), KVQ_E_NUMERIC);
    kvq_codebook_free(cb);
    free(keys);
    free(test);
    free(q);
    free(pos);
    free(tpos);
}

static void test_lut_scores(void **state)
{
    (void)state;
    const int64_t n = 1200, nt = 200;
    float *keys = normal_matrix(n, D, 1.0, 21), *q = aniso_queries(1000, 22);
    float L[D * D], Li[D * D];
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    for (int64_t i = 0; i < n; i++)
        pos[i] = (int32_t)(i % 300);
    factor_queries(q, 1000, L, Li);
    const kvq_codebook_method methods[] = {KVQ_CODEBOOK_VQ, KVQ_CODEBOOK_QAVQ, KVQ_CODEBOOK_PQ,
                                           KVQ_CODEBOOK_QAPQ, KVQ_CODEBOOK_VQ_POSTROPE};
    for (size_t mi = 0; mi < 5; mi++) {
        const kvq_codebook_method m = methods[mi];
        const int32_t G = kvq_codebook_method_default_groups(m), K = 16, dg = D / G;
        kvq_codebook *cb = fit_one(m, K, G, keys, pos, n, L, Li);
        const float *C = kvq_codebook_key_codebook(cb);
        float *lut = malloc((size_t)G * K * sizeof *lut), *scores = malloc(nt * sizeof *scores);
        float *khat = malloc(nt * D * sizeof *khat);
        int32_t *codes = malloc((size_t)nt * G * sizeof *codes);
        kvq_err e = {0};
        assert_int_equal(kvq_codebook_encode(cb, keys, pos, nt, 1, codes, &e), KVQ_OK);
        kvq_codebook_decode(cb, codes, nt, khat);
        if (m == KVQ_CODEBOOK_QAVQ) {
            /* C = C^z L^-1 */
            const float *Cz = kvq_codebook_centroids(cb, 0);
            for (int c = 0; c < K; c++)
                for (int b = 0; b < D; b++) {
                    double s = 0;
                    for (int a = 0; a < D; a++)
                        s += (double)Cz[c * D + a] * Li[a * D + b];
                    assert_float_equal(C[c * D + b], s, 1e-5 * (1 + fabs(s)));
                }
        }
        assert_true((C != NULL) == (G == 1));
        for (int qi = 0; qi < 20; qi++) {
            float qs[D];
            kvq_codebook_query_pe(cb, q + qi * D, 100 + qi, qs);
            kvq_codebook_lut_ref(cb, qs, lut);
            kvq_codebook_score(cb, lut, codes, nt, scores);
            for (int64_t j = 0; j < nt; j++) {
                const int32_t *cj = codes + j * G;
                /* grouped score = sum of the group LUT entries */
                float sum = 0;
                for (int32_t g = 0; g < G; g++)
                    sum += lut[g * K + cj[g]];
                assert_true(scores[j] == sum);
                /* = q~ . C[code] computed directly (G = 1), = q~ . khat in general */
                double direct = G == 1 ? dot(qs, C + cj[0] * D, D) : dot(qs, khat + j * D, D);
                double ref = kvq_codebook_score_ref(cb, qs, cj);
                double tol = 2e-5 * (1 + fabs(direct)) * (m == KVQ_CODEBOOK_QAPQ ? 10 : 1);
                assert_float_equal(scores[j], direct, tol);
                assert_float_equal(ref, direct, tol);
                if (m == KVQ_CODEBOOK_QAPQ) {
                    /* q' . z^ with q' = q~ L^-T, straight from the group centroids */
                    double qp[D], s = 0;
                    for (int a = 0; a < D; a++) {
                        qp[a] = 0;
                        for (int b = 0; b <= a; b++)
                            qp[a] += (double)qs[b] * Li[a * D + b];
                    }
                    for (int32_t g = 0; g < G; g++)
                        for (int t = 0; t < dg; t++)
                            s += qp[g * dg + t] * kvq_codebook_centroids(cb, g)[cj[g] * dg + t];
                    assert_float_equal(scores[j], s, 1e-5 * (1 + fabs(s)));
                }
            }
        }
        free(lut);
        free(scores);
        free(khat);
        free(codes);
        kvq_codebook_free(cb);
    }
    free(keys);
    free(q);
    free(pos);
}

static void test_score_mse_is_pair_mean(void **state)
{
    (void)state;
    const int64_t n = 800, nk = 60, nq = 40;
    float *keys = normal_matrix(n, D, 1.0, 31), *q = aniso_queries(nq, 32);
    float L[D * D], Li[D * D];
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    for (int64_t i = 0; i < n; i++)
        pos[i] = (int32_t)(i % 97);
    factor_queries(q, nq, L, Li);
    for (int m = 0; m < KVQ_CODEBOOK_N_METHODS; m++) {
        const int32_t G = kvq_codebook_method_default_groups(m);
        kvq_codebook *cb = fit_one(m, 16, G, keys, pos, n, L, Li);
        float *qs = malloc(nq * D * sizeof *qs), *khat = malloc(nk * D * sizeof *khat);
        int32_t *codes = malloc((size_t)nk * G * sizeof *codes);
        kvq_err e = {0};
        for (int64_t i = 0; i < nq; i++)
            kvq_codebook_query_pe(cb, q + i * D, 500 + i, qs + i * D);
        const float *kt = keys + 100 * D;
        const int32_t *pt = pos + 100;
        assert_int_equal(kvq_codebook_encode(cb, kt, pt, nk, 1, codes, &e), KVQ_OK);
        kvq_codebook_decode(cb, codes, nk, khat);
        double theta[D / 2];
        kvq_rope_freqs(&kvq_codebook_get_desc(cb)->rope, theta);
        double sm = 0, sp = 0;
        for (int64_t i = 0; i < nq; i++)
            for (int64_t j = 0; j < nk; j++) {
                float k[D];
                memcpy(k, kt + j * D, sizeof k);
                if (m == KVQ_CODEBOOK_VQ_POSTROPE)
                    kvq_rope_apply(&kvq_codebook_get_desc(cb)->rope, theta, k, 1, pt[j]);
                double exact = dot(qs + i * D, k, D), approx = dot(qs + i * D, khat + j * D, D);
                sm += (exact - approx) * (exact - approx);
                sp += exact * exact;
            }
        double mse, power;
        assert_int_equal(kvq_codebook_score_mse(cb, qs, nq, kt, pt, nk, 2, &mse, &power, &e),
                         KVQ_OK);
        assert_float_equal(mse, sm / (nq * nk), 1e-6 * sm / (nq * nk) + 1e-9);
        assert_float_equal(power, sp / (nq * nk), 1e-6 * sp / (nq * nk));
        assert_true(mse > 0 && mse < power);
        assert_int_equal(kvq_codebook_score_mse(cb, qs, 0, kt, pt, nk, 1, &mse, &power, &e),
                         KVQ_E_INVALID_ARG);
        free(qs);
        free(khat);
        free(codes);
        kvq_codebook_free(cb);
    }
    free(keys);
    free(q);
    free(pos);
}

/* In memory: on an anisotropic H, query-aware codebooks have a much lower held-out
 * score error than plain ones with the same K and G. */
static void test_query_aware_beats_plain(void **state)
{
    (void)state;
    const int64_t n = 3000, nk = 500, nq = 500;
    float *keys = normal_matrix(n, D, 1.0, 41), *hold = normal_matrix(nk, D, 1.0, 42);
    float *qtrain = aniso_queries(4000, 43), *qhold = aniso_queries(nq, 44);
    float L[D * D], Li[D * D];
    factor_queries(qtrain, 4000, L, Li);
    double mse[4], power;
    const kvq_codebook_method m[4] = {KVQ_CODEBOOK_VQ, KVQ_CODEBOOK_QAVQ, KVQ_CODEBOOK_PQ,
                                      KVQ_CODEBOOK_QAPQ};
    for (int i = 0; i < 4; i++) {
        const int32_t G = kvq_codebook_method_default_groups(m[i]);
        kvq_codebook *cb = fit_one(m[i], 32, G, keys, NULL, n, L, Li);
        kvq_err e = {0};
        /* the queries are already post-PE: score them as q~ */
        assert_int_equal(kvq_codebook_score_mse(cb, qhold, nq, hold, NULL, nk, 1, &mse[i],
                                                &power, &e), KVQ_OK);
        kvq_codebook_free(cb);
    }
    print_message("score MSE: vq %.4g qavq %.4g pq %.4g qapq %.4g (power %.4g)\n", mse[0],
                  mse[1], mse[2], mse[3], power);
    assert_true(mse[1] < 0.6 * mse[0]);
    assert_true(mse[3] < 0.6 * mse[2]);
    free(keys);
    free(hold);
    free(qtrain);
    free(qhold);
}

/* ======================================================================================
 * The fit stage on a synthetic capture
 * ====================================================================================== */

#define N_SEQ 16
#define SEQ_LEN 128
#define N_TOK (N_SEQ * SEQ_LEN)

typedef struct cap_opts {
    int32_t n_heads, n_kv_heads, n_layers;
    uint64_t seed;
} cap_opts;

/* Writes a capture of N_TOK rows with isotropic keys and anisotropic queries (the same
 * mixing for every head), dtype f32. Returns its path. */
static const char *make_capture(const char *name, const cap_opts *o)
{
    static char path[4][512];
    static int slot;
    char *dir = path[slot++ & 3];
    snprintf(dir, sizeof path[0], "%s", test_path(name));
    kvq_capture_info info;
    memset(&info, 0, sizeof info);
    kvq_model_id *m = &info.model;
    snprintf(m->path, sizeof m->path, "synthetic");
    snprintf(m->source, sizeof m->source, "gguf");
    snprintf(m->architecture, sizeof m->architecture, "llama");
    m->n_layers = o->n_layers;
    m->dim = o->n_heads * D;
    m->hidden_dim = 64;
    m->n_heads = o->n_heads;
    m->n_kv_heads = o->n_kv_heads;
    m->head_dim = D;
    m->vocab_size = 16;
    m->context_length = 2048;
    m->norm_eps = 1e-5;
    m->rope = kvq_rope_default(D);
    snprintf(info.corpus_spec, sizeof info.corpus_spec, "synthetic");
    snprintf(info.corpus_hash, sizeof info.corpus_hash, "0123456789abcdef");
    info.n_documents = N_SEQ;
    info.dtype = KVQ_DT_F32;
    info.seq_len = SEQ_LEN;
    info.n_tokens = N_TOK;
    int64_t seqs[2 * N_SEQ];
    for (int s = 0; s < N_SEQ; s++)
        seqs[2 * s] = s * SEQ_LEN, seqs[2 * s + 1] = SEQ_LEN;
    info.n_sequences = N_SEQ;
    info.sequences = seqs;
    int32_t layers[8];
    for (int l = 0; l < o->n_layers; l++)
        layers[l] = l;
    info.n_files = o->n_layers;
    info.layers = layers;
    info.n_queries = 0;
    info.has_values = 0;
    int32_t *tokens = calloc(N_TOK, sizeof *tokens);
    kvq_capture_writer_params wp = kvq_capture_writer_params_default();
    wp.threads = 1;
    kvq_capture_writer *w = NULL;
    kvq_err e = {0};
    kvq_status s = kvq_capture_writer_create(dir, &info, tokens, &wp, &w, &e);
    if (s)
        print_error("%s\n", e.msg);
    assert_int_equal(s, KVQ_OK);
    for (int l = 0; l < o->n_layers; l++) {
        float *k = normal_matrix((int64_t)N_TOK * o->n_kv_heads, D, 1.0, o->seed + 100 * l);
        float *q = aniso_queries((int64_t)N_TOK * o->n_heads, o->seed + 100 * l + 1);
        assert_int_equal(kvq_capture_writer_append(w, l, N_TOK, q, k, NULL, &e), KVQ_OK);
        free(k);
        free(q);
    }
    s = kvq_capture_writer_finish(w, &e);
    if (s)
        print_error("%s\n", e.msg);
    assert_int_equal(s, KVQ_OK);
    kvq_capture_writer_free(w);
    free(tokens);
    return dir;
}

static const char *make_moments(const char *cap, const char *name)
{
    static char path[4][512];
    static int slot;
    char *out = path[slot++ & 3];
    snprintf(out, sizeof path[0], "%s", test_path(name));
    kvq_moments_params mp = kvq_moments_params_default();
    kvq_err e = {0};
    kvq_status s = kvq_moments_compute(cap, out, 1, &mp, NULL, &e);
    if (s)
        print_error("%s\n", e.msg);
    assert_int_equal(s, KVQ_OK);
    return out;
}

static const char *g_cap, *g_mom; /* the shared synthetic capture (2 layers x 2 KV heads) */

static int setup_capture(void **state)
{
    (void)state;
    cap_opts o = {.n_heads = 4, .n_kv_heads = 2, .n_layers = 2, .seed = 1000};
    g_cap = make_capture("cap", &o);
    g_mom = make_moments(g_cap, "mom.safetensors");
    return 0;
}

static kvq_fit_params quick_params(kvq_codebook_method m)
{
    kvq_fit_params p = kvq_fit_params_default();
    p.method = m;
    p.codebook_size = 16;
    p.iters = 8;
    p.seed = 5;
    return p;
}

static uint8_t *slurp(const char *path, size_t *n)
{
    uint8_t *b = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_read_file(path, &b, n, &e), KVQ_OK);
    return b;
}

static int exists(const char *p) { return access(p, F_OK) == 0; }

static void test_fit_stage_artifact(void **state)
{
    (void)state;
    const kvq_codebook_method methods[] = {KVQ_CODEBOOK_QAVQ, KVQ_CODEBOOK_QAPQ,
                                           KVQ_CODEBOOK_VQ_POSTROPE, KVQ_CODEBOOK_PQ};
    for (size_t mi = 0; mi < 4; mi++) {
        const kvq_codebook_method m = methods[mi];
        char out[600];
        snprintf(out, sizeof out, "%s.kvq", test_path(kvq_codebook_method_name(m)));
        kvq_fit_params p = quick_params(m);
        kvq_fit_summary sum;
        kvq_err e = {0};
        kvq_status s = kvq_fit_run(g_cap, g_mom, out, &p, &sum, &e);
        if (s)
            print_error("%s\n", e.msg);
        assert_int_equal(s, KVQ_OK);
        const int32_t G = kvq_codebook_method_default_groups(m);
        assert_int_equal(sum.codebook_size, 16);
        assert_int_equal(sum.groups, G);
        assert_int_equal(sum.n_jobs, 4);
        assert_int_equal(sum.n_resumed, 0);
        assert_int_equal(sum.n_heldout_keys, 2 * SEQ_LEN); /* round(0.1 * 16) sequences */
        assert_int_equal(sum.n_train, N_TOK - 2 * SEQ_LEN);
        assert_int_equal(sum.n_heldout_queries, 2 * SEQ_LEN * 2); /* GQA group of 2 */
        char ck[700];
        snprintf(ck, sizeof ck, "%s.ckpt", out);
        assert_false(exists(ck)); /* removed once the artifact is written */
        print_message("%s: score MSE %.4g, reference %.4g, power %.4g\n",
                      kvq_codebook_method_name(m), sum.score_mse, sum.score_mse_ref,
                      sum.score_power);
        if (m == KVQ_CODEBOOK_QAVQ || m == KVQ_CODEBOOK_QAPQ)
            assert_true(sum.score_mse < 0.6 * sum.score_mse_ref);
        if (m == KVQ_CODEBOOK_PQ)
            assert_true(sum.score_mse == sum.score_mse_ref);

        kvq_artifact *a = NULL;
        assert_int_equal(kvq_artifact_open(out, &a, &e), KVQ_OK);
        s = kvq_artifact_validate(a, &e);
        if (s)
            print_error("%s\n", e.msg);
        assert_int_equal(s, KVQ_OK);
        const kvq_st *st = kvq_artifact_payload(a);
        assert_string_equal(kvq_st_meta_get(st, "method"), kvq_codebook_method_format_name(m));
        assert_string_equal(kvq_st_meta_get(st, "fit.method"), kvq_codebook_method_name(m));
        assert_string_equal(kvq_st_meta_get(st, "codebook_size"), "16");
        assert_string_equal(kvq_st_meta_get(st, "layers"), "0-1");
        assert_string_equal(kvq_st_meta_get(st, "wrope.b"), "2048");
        assert_string_equal(kvq_st_meta_get(st, "wrope.w"), "64");
        assert_string_equal(kvq_st_meta_get(st, "seed"), "5");
        assert_string_equal(kvq_st_meta_get(st, "model.rope.layout"), "interleaved");
        assert_string_equal(kvq_st_meta_get(st, "provenance.corpus_hash"), "0123456789abcdef");
        assert_string_equal(kvq_st_meta_get(st, "provenance.backend"), "cpu");
        assert_string_equal(kvq_st_meta_get(st, "fit.reference"), G > 1 ? "pq" : "vq");
        assert_non_null(kvq_st_meta_get(st, "provenance.tool_version"));
        /* diagnostics */
        const kvq_tensor_view *v = kvq_st_find(st, "diag.fit.score_mse");
        assert_non_null(v);
        assert_int_equal(v->ndim, 2);
        assert_int_equal(v->shape[0], 2);
        assert_int_equal(v->shape[1], 2);
        v = kvq_st_find(st, "diag.layer.1.head.0.cluster_size");
        assert_non_null(v);
        assert_int_equal(v->dtype, KVQ_DT_I64);
        assert_int_equal(v->shape[0], G);
        int64_t total = 0;
        for (int64_t i = 0; i < G * 16; i++) {
            int64_t c;
            memcpy(&c, (const char *)v->data + i * 8, 8);
            total += c;
        }
        assert_int_equal(total, (int64_t)G * sum.n_train);
        v = kvq_st_find(st, G == 1 ? "diag.layer.0.head.1.inertia"
                                   : "diag.layer.0.head.1.group.3.inertia");
        assert_non_null(v);
        assert_int_equal(v->dtype, KVQ_DT_F64);
        assert_true(v->shape[0] >= 1 && v->shape[0] <= 8);
        /* The codebook reloads and matches its tensors. */
        kvq_codebook *cb = NULL;
        assert_int_equal(kvq_codebook_load(st, 1, 1, &cb, &e), KVQ_OK);
        assert_int_equal(kvq_codebook_get_desc(cb)->method, m);
        assert_int_equal(kvq_codebook_get_desc(cb)->groups, G);
        if (m == KVQ_CODEBOOK_QAVQ) {
            v = kvq_st_find(st, "layer.1.head.1.codebook");
            assert_non_null(v);
            assert_memory_equal(v->data, kvq_codebook_key_codebook(cb), v->nbytes);
            assert_non_null(kvq_st_find(st, "layer.1.head.1.L"));
        }
        kvq_codebook_free(cb);
        assert_int_equal(kvq_codebook_load(st, 1, 2, &cb, &e), KVQ_E_INVALID_ARG);
        kvq_artifact_close(a);
    }
}

static int cancel_at(void *user, const char *what, uint64_t done, uint64_t total)
{
    (void)total;
    const int *at = user;
    return !strcmp(what, "fit") && done >= (uint64_t)*at;
}

static void test_fit_resume_and_determinism(void **state)
{
    (void)state;
    char a[600], b[600], c[600], ck[700];
    snprintf(a, sizeof a, "%s", test_path("det_a.kvq"));
    snprintf(b, sizeof b, "%s", test_path("det_b.kvq"));
    snprintf(c, sizeof c, "%s", test_path("det_c.kvq"));
    snprintf(ck, sizeof ck, "%s.ckpt", b);
    kvq_fit_params p = quick_params(KVQ_CODEBOOK_QAPQ);
    kvq_fit_summary sum;
    kvq_err e = {0};
    assert_int_equal(kvq_fit_run(g_cap, g_mom, a, &p, &sum, &e), KVQ_OK);

    /* Threads do not change the bytes. */
    p.threads = 2;
    assert_int_equal(kvq_fit_run(g_cap, g_mom, c, &p, &sum, &e), KVQ_OK);
    size_t na, nb, nc;
    uint8_t *ba = slurp(a, &na), *bc = slurp(c, &nc);
    assert_int_equal(na, nc);
    assert_memory_equal(ba, bc, na);
    free(bc);

    /* Stopped after 2 of 4 heads: no artifact, 2 checkpoints. */
    int at = 2;
    p.threads = 1;
    p.cb.progress = cancel_at;
    p.cb.user = &at;
    assert_int_equal(kvq_fit_run(g_cap, g_mom, b, &p, &sum, &e), KVQ_E_CANCELLED);
    assert_false(exists(b));
    char f[800];
    snprintf(f, sizeof f, "%s/layer.0.head.1.safetensors", ck);
    assert_true(exists(f));
    snprintf(f, sizeof f, "%s/layer.1.head.0.safetensors", ck);
    assert_false(exists(f));

    /* Resumed: the same bytes as the uninterrupted run, the checkpoint removed. */
    p.cb.progress = NULL;
    assert_int_equal(kvq_fit_run(g_cap, g_mom, b, &p, &sum, &e), KVQ_OK);
    assert_int_equal(sum.n_resumed, 2);
    assert_false(exists(ck));
    uint8_t *bb = slurp(b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(ba, bb, na);
    free(bb);

    /* A checkpoint made with other settings is not reused. */
    p.cb.progress = cancel_at;
    p.overwrite = 1;
    assert_int_equal(kvq_fit_run(g_cap, g_mom, b, &p, &sum, &e), KVQ_E_CANCELLED);
    p.cb.progress = NULL;
    p.seed = 6;
    assert_int_equal(kvq_fit_run(g_cap, g_mom, b, &p, &sum, &e), KVQ_OK);
    assert_int_equal(sum.n_resumed, 0);
    bb = slurp(b, &nb);
    assert_true(nb != na || memcmp(ba, bb, na) != 0);
    free(bb);
    free(ba);

    /* The output is not overwritten without overwrite. */
    p.overwrite = 0;
    assert_int_equal(kvq_fit_run(g_cap, g_mom, b, &p, &sum, &e), KVQ_E_EXISTS);
    assert_non_null(strstr(e.msg, b));
}

static void test_fit_layers_and_reference(void **state)
{
    (void)state;
    char out[600];
    snprintf(out, sizeof out, "%s", test_path("layer1.kvq"));
    kvq_fit_params p = quick_params(KVQ_CODEBOOK_QAVQ);
    int32_t layers[1] = {1};
    p.layers = layers;
    p.n_layers = 1;
    p.reference = 0;
    p.holdout = 0;
    p.checkpoint = 0;
    kvq_fit_summary sum;
    kvq_err e = {0};
    assert_int_equal(kvq_fit_run(g_cap, g_mom, out, &p, &sum, &e), KVQ_OK);
    assert_int_equal(sum.n_jobs, 2);
    assert_int_equal(sum.n_train, N_TOK);
    assert_true(isnan(sum.score_mse) && isnan(sum.score_mse_ref));
    kvq_artifact *a = NULL;
    assert_int_equal(kvq_artifact_open(out, &a, &e), KVQ_OK);
    assert_int_equal(kvq_artifact_validate(a, &e), KVQ_OK);
    const kvq_st *st = kvq_artifact_payload(a);
    assert_string_equal(kvq_st_meta_get(st, "layers"), "1");
    assert_string_equal(kvq_st_meta_get(st, "fit.reference"), "none");
    assert_null(kvq_st_find(st, "layer.0.head.0.Cz"));
    assert_non_null(kvq_st_find(st, "layer.1.head.0.Cz"));
    assert_null(kvq_st_find(st, "diag.fit.score_mse"));
    kvq_artifact_close(a);

    /* The default codebook size: the largest power of two with 39 keys per centroid. */
    snprintf(out, sizeof out, "%s", test_path("defaultk.kvq"));
    p.codebook_size = 0;
    p.iters = 1;
    assert_int_equal(kvq_fit_run(g_cap, g_mom, out, &p, &sum, &e), KVQ_OK);
    assert_int_equal(sum.codebook_size, 32); /* 2048 / 39 = 52 -> 32 */
}

/* ======================================================================================
 * Errors
 * ====================================================================================== */

static void test_fit_errors(void **state)
{
    (void)state;
    char out[600];
    snprintf(out, sizeof out, "%s", test_path("err.kvq"));
    kvq_fit_params p = quick_params(KVQ_CODEBOOK_QAVQ);
    kvq_fit_summary sum;
    kvq_err e = {0};

    /* Capture and moments of different models (other head counts). */
    cap_opts o = {.n_heads = 4, .n_kv_heads = 1, .n_layers = 2, .seed = 7};
    const char *cap2 = make_capture("cap_other", &o);
    const char *mom2 = make_moments(cap2, "mom_other.safetensors");
    assert_int_equal(kvq_fit_run(g_cap, mom2, out, &p, &sum, &e), KVQ_E_MISMATCH);
    assert_non_null(strstr(e.msg, mom2));
    assert_non_null(strstr(e.msg, "capture.json"));
    assert_non_null(strstr(e.msg, "n_kv_heads"));

    /* Codebook larger than the training keys. */
    p.codebook_size = 4096;
    assert_int_equal(kvq_fit_run(g_cap, g_mom, out, &p, &sum, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "larger than the 1792 training keys"));
    p.codebook_size = 16;

    /* Groups that do not divide d. */
    p.groups = 3;
    assert_int_equal(kvq_fit_run(g_cap, g_mom, out, &p, &sum, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "3 groups do not divide head dim 8"));
    p.groups = 0;

    /* A layer that is not captured; bad parameters. */
    int32_t bad_layer[1] = {5};
    p.layers = bad_layer;
    p.n_layers = 1;
    assert_int_equal(kvq_fit_run(g_cap, g_mom, out, &p, &sum, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "layer 5"));
    p.layers = NULL;
    p.n_layers = 0;
    p.holdout = 1.0;
    assert_int_equal(kvq_fit_run(g_cap, g_mom, out, &p, &sum, &e), KVQ_E_INVALID_ARG);
    p.holdout = 0.1;
    assert_int_equal(kvq_fit_run(g_cap, "/nonexistent/m", out, &p, &sum, &e), KVQ_E_NOT_FOUND);
    assert_false(exists(out));

    /* NaN in a key: layer 0, KV head 1, row 300 (sequence 2, position 44). */
    o.n_kv_heads = 2;
    o.seed = 1000;
    const char *cap3 = make_capture("cap_nan", &o);
    const char *mom3 = make_moments(cap3, "mom_nan.safetensors");
    char lf[700];
    snprintf(lf, sizeof lf, "%s/layer_000.safetensors", cap3);
    kvq_st *st = NULL;
    assert_int_equal(kvq_st_open(lf, &st, &e), KVQ_OK);
    const kvq_tensor_view *k = kvq_st_find(st, "k");
    assert_non_null(k);
    long off = (long)(kvq_st_header_size(st) + k->offset + ((300 * 2 + 1) * D + 3) * 4);
    kvq_st_close(st);
    FILE *fp = fopen(lf, "r+b");
    assert_non_null(fp);
    const float nan = NAN;
    assert_int_equal(fseek(fp, off, SEEK_SET), 0);
    assert_int_equal(fwrite(&nan, 4, 1, fp), 1);
    fclose(fp);
    /* the file no longer has the bytes capture.json records: refused, naming it */
    assert_int_equal(kvq_fit_run(cap3, mom3, out, &p, &sum, &e), KVQ_E_CHECKSUM);
    assert_non_null(strstr(e.msg, "layer_000.safetensors: checksum mismatch"));
    assert_false(exists(out));
    /* a NaN that was there when the capture was written (checksums recomputed) */
    kvq_capture_info *ci = NULL;
    char cj[700];
    snprintf(cj, sizeof cj, "%s/capture.json", cap3);
    assert_int_equal(kvq_capture_info_read(cap3, &ci, &e), KVQ_OK);
    assert_int_equal(kvq_capture_info_write(ci, NULL, cj, 1, &e), KVQ_OK);
    kvq_capture_info_free(ci);
    assert_int_equal(kvq_fit_run(cap3, mom3, out, &p, &sum, &e), KVQ_E_NUMERIC);
    assert_non_null(strstr(e.msg, "layer 0 head 1 row 300 (sequence 2 position 44)"));
    assert_false(exists(out));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_method_names),
        cmocka_unit_test(test_desc_errors),
        cmocka_unit_test(test_encode_is_nearest_in_fit_space),
        cmocka_unit_test(test_lut_scores),
        cmocka_unit_test(test_score_mse_is_pair_mean),
        cmocka_unit_test(test_query_aware_beats_plain),
        cmocka_unit_test(test_fit_stage_artifact),
        cmocka_unit_test(test_fit_resume_and_determinism),
        cmocka_unit_test(test_fit_layers_and_reference),
        cmocka_unit_test(test_fit_errors),
    };
    int rc = cmocka_run_group_tests(tests, setup_capture, NULL);
    test_tmpdir_cleanup();
    return rc;
}
