/* test_moments.c — query moments, regularized Cholesky, diagnostics, the capture
 * directory reader and the moments file (kvq/moments.h, kvq/capture_dir.h). */
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
#include "kvq/capture_dir.h"
#include "kvq/half.h"
#include "kvq/moments.h"
#include "kvq/rope.h"
#include "kvq/safetensors.h"

/* ======================================================================================
 * Small dense helpers (row-major)
 * ====================================================================================== */

/* C = A B for d x d. */
static void matmul(const double *A, const double *B, double *C, int d)
{
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double acc = 0;
            for (int k = 0; k < d; k++)
                acc += A[i * d + k] * B[k * d + j];
            C[i * d + j] = acc;
        }
}

static double fro(const double *A, int d)
{
    double s = 0;
    for (int i = 0; i < d * d; i++)
        s += A[i] * A[i];
    return sqrt(s);
}

/* ||L L^T - H||_F / ||H||_F */
static double llt_rel_err(const double *L, const double *H, int d)
{
    double e = 0;
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double acc = 0;
            for (int k = 0; k < d; k++)
                acc += L[i * d + k] * L[j * d + k];
            e += (acc - H[i * d + j]) * (acc - H[i * d + j]);
        }
    return sqrt(e) / fro(H, d);
}

/* max |L Linv - I| */
static double inv_err(const double *L, const double *Linv, int d)
{
    double *P = malloc((size_t)d * d * sizeof *P), m = 0;
    matmul(L, Linv, P, d);
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++)
            m = fmax(m, fabs(P[i * d + j] - (i == j)));
    free(P);
    return m;
}

/* H = X^T X / n for random X [n, d] with per-dimension scales (anisotropic, SPD). */
static void random_spd(double *H, int d, int n, uint64_t seed)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    double *X = malloc((size_t)n * d * sizeof *X);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < d; k++)
            X[i * d + k] = kvq_rng_normal(&r) * (1.0 + k);
    for (int a = 0; a < d; a++)
        for (int b = 0; b < d; b++) {
            double acc = 0;
            for (int i = 0; i < n; i++)
                acc += X[i * d + a] * X[i * d + b];
            H[a * d + b] = acc / n;
        }
    free(X);
}

/* A random orthogonal Q [d, d] (Gram-Schmidt of a Gaussian matrix). */
static void random_orthogonal(double *Q, int d, uint64_t seed)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    for (int i = 0; i < d * d; i++)
        Q[i] = kvq_rng_normal(&r);
    for (int i = 0; i < d; i++) {
        for (int j = 0; j < i; j++) {
            double dot = 0;
            for (int k = 0; k < d; k++)
                dot += Q[i * d + k] * Q[j * d + k];
            for (int k = 0; k < d; k++)
                Q[i * d + k] -= dot * Q[j * d + k];
        }
        double n = 0;
        for (int k = 0; k < d; k++)
            n += Q[i * d + k] * Q[i * d + k];
        for (int k = 0; k < d; k++)
            Q[i * d + k] /= sqrt(n);
    }
}

/* H = Q^T diag(ev) Q */
static void with_eigenvalues(double *H, const double *ev, int d, uint64_t seed)
{
    double *Q = malloc((size_t)d * d * sizeof *Q);
    random_orthogonal(Q, d, seed);
    for (int a = 0; a < d; a++)
        for (int b = 0; b < d; b++) {
            double acc = 0;
            for (int k = 0; k < d; k++)
                acc += Q[k * d + a] * ev[k] * Q[k * d + b];
            H[a * d + b] = acc;
        }
    kvq_moments_symmetrize(H, d);
    free(Q);
}

/* ======================================================================================
 * Math primitives
 * ====================================================================================== */

static void test_cholesky_spd(void **state)
{
    enum { D = 16 };
    double H[D * D], L[D * D], Linv[D * D];
    kvq_moments_params p = kvq_moments_params_default();
    kvq_moments_head_stats s = {0};
    kvq_err e = {0};
    random_spd(H, D, 200, 1);
    assert_int_equal(kvq_cholesky_regularized(H, D, &p, "h", L, Linv, &s, &e), KVQ_OK);
    assert_true(s.lambda == 0);
    assert_true(s.eps == 0);
    assert_true(llt_rel_err(L, H, D) < 1e-10);
    assert_true(inv_err(L, Linv, D) < 1e-10);
    for (int i = 0; i < D; i++)
        for (int j = i + 1; j < D; j++) {
            assert_true(L[i * D + j] == 0);
            assert_true(Linv[i * D + j] == 0);
        }
    for (int i = 0; i < D; i++)
        assert_true(L[i * D + i] > 0);
    /* cond and the extreme eigenvalues are consistent. */
    assert_true(s.eig_min > 0 && s.eig_max > s.eig_min);
    assert_true(fabs(s.cond - s.eig_max / s.eig_min) <= 1e-12 * s.cond);
}

/* Dead dims: zero rows/columns. Exact lambda = 1e-6 * tr(H)/d on the first step. */
static void test_cholesky_singular(void **state)
{
    enum { D = 12 };
    double H[D * D], Hl[D * D], L[D * D], Linv[D * D];
    kvq_moments_params p = kvq_moments_params_default();
    kvq_moments_head_stats s = {0};
    kvq_err e = {0};
    random_spd(H, D, 100, 2);
    for (int k = 0; k < D; k++) {
        H[3 * D + k] = H[k * D + 3] = 0;
        H[7 * D + k] = H[k * D + 7] = 0;
    }
    double tr = 0;
    for (int i = 0; i < D; i++)
        tr += H[i * D + i];
    assert_int_equal(kvq_cholesky_regularized(H, D, &p, "h", L, Linv, &s, &e), KVQ_OK);
    assert_true(fabs(s.lambda - 1e-6 * tr / D) <= 1e-15 * s.lambda);
    assert_true(s.eps == 1e-6);
    assert_true(fabs(s.eig_min) < 1e-12 * s.eig_max);
    memcpy(Hl, H, sizeof H);
    for (int i = 0; i < D; i++)
        Hl[i * D + i] += s.lambda;
    assert_true(llt_rel_err(L, Hl, D) < 1e-10);
    assert_true(inv_err(L, Linv, D) < 1e-8);

    /* Rank-deficient sums: 5 samples in 12 dims. Eigenvalues ~1e-16 pass dpotrf by
     * luck or not; the eigenvalue test regularizes either way. */
    random_spd(H, D, 5, 3);
    memset(&s, 0, sizeof s);
    assert_int_equal(kvq_cholesky_regularized(H, D, &p, "h", L, Linv, &s, &e), KVQ_OK);
    assert_true(s.lambda > 0);
    assert_true(s.cond < 1e9); /* the factored matrix is well conditioned */

    /* eps0 = 1e-3 starts higher: lambda scales with it. */
    p.eps0 = 1e-3;
    assert_int_equal(kvq_cholesky_regularized(H, D, &p, "h", L, Linv, &s, &e), KVQ_OK);
    assert_true(s.eps == 1e-3);
}

static void test_cholesky_failures(void **state)
{
    enum { D = 4 };
    double L[D * D], Linv[D * D];
    kvq_moments_params p = kvq_moments_params_default();
    kvq_moments_head_stats s = {0};
    kvq_err e = {0};
    /* Indefinite beyond what eps_max = 1 can fix: -9 + 21/4 < 0. */
    double ev[D] = {10, 10, 10, -9}, H[D * D];
    with_eigenvalues(H, ev, D, 4);
    assert_int_equal(kvq_cholesky_regularized(H, D, &p, "layer 1 head 2", L, Linv, &s, &e),
                     KVQ_E_NUMERIC);
    assert_non_null(strstr(e.msg, "layer 1 head 2"));
    /* ... but fixable with eps = 1 when -1 + 31/4 > 0; exactly the 7th step. */
    double ev2[D] = {10, 10, 12, -1};
    with_eigenvalues(H, ev2, D, 5);
    assert_int_equal(kvq_cholesky_regularized(H, D, &p, "h", L, Linv, &s, &e), KVQ_OK);
    assert_true(fabs(s.eps - 1.0) < 1e-12);
    /* tr <= 0 and NaN */
    double Z[D * D] = {0};
    assert_int_equal(kvq_cholesky_regularized(Z, D, &p, "h", L, Linv, &s, &e), KVQ_E_NUMERIC);
    double N[D * D] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, NAN};
    assert_int_equal(kvq_cholesky_regularized(N, D, &p, "h", L, Linv, &s, &e), KVQ_E_NUMERIC);
    /* bad parameters */
    p.eps0 = 0;
    assert_int_equal(kvq_cholesky_regularized(ev, 1, &p, "h", L, Linv, &s, &e),
                     KVQ_E_INVALID_ARG);
}

static void test_diagnostics(void **state)
{
    enum { D = 4 };
    double H[D * D] = {0};
    kvq_moments_head_stats s;
    kvq_err e = {0};
    for (int i = 0; i < D; i++)
        H[i * D + i] = 3;
    assert_int_equal(kvq_moments_diagnose(H, D, 0, &s, &e), KVQ_OK);
    assert_true(s.anisotropy == 0);
    assert_true(fabs(s.eig_min - 3) < 1e-14 && fabs(s.eig_max - 3) < 1e-14);
    assert_true(fabs(s.cond - 1) < 1e-14);

    /* Known spectrum {1,2,3,4} in a random basis: anisotropy 1 - 2.5^2 / 7.5 = 1/6. */
    double ev[D] = {4, 1, 3, 2};
    with_eigenvalues(H, ev, D, 6);
    assert_int_equal(kvq_moments_diagnose(H, D, 0, &s, &e), KVQ_OK);
    assert_true(fabs(s.eig_min - 1) < 1e-12);
    assert_true(fabs(s.eig_max - 4) < 1e-12);
    assert_true(fabs(s.cond - 4) < 1e-12);
    assert_true(fabs(s.anisotropy - 1.0 / 6) < 1e-12);
    /* lambda shifts the condition number only */
    assert_int_equal(kvq_moments_diagnose(H, D, 1, &s, &e), KVQ_OK);
    assert_true(fabs(s.cond - 2.5) < 1e-12);

    /* Rank one: anisotropy 1 - 1/d. */
    double u[D] = {1, -2, 0.5, 3};
    for (int a = 0; a < D; a++)
        for (int b = 0; b < D; b++)
            H[a * D + b] = u[a] * u[b];
    assert_int_equal(kvq_moments_diagnose(H, D, 0, &s, &e), KVQ_OK);
    assert_true(fabs(s.anisotropy - (1 - 1.0 / D)) < 1e-12);
}

/* GQA: KV head h averages query heads h*r .. h*r+r-1, weighted by their counts. */
static void test_gqa_grouping(void **state)
{
    enum { NH = 8, NKV = 2, D = 3, R = NH / NKV };
    double S[NH * D * D], counts[NH], H[NKV * D * D], count[NKV];
    kvq_err e = {0};
    for (int g = 0; g < NH; g++) {
        counts[g] = 10 + g;
        for (int i = 0; i < D * D; i++)
            S[g * D * D + i] = (double)(1 << g) * (i + 1); /* head g is bit g */
    }
    assert_int_equal(kvq_moments_group(S, counts, NH, NKV, D, H, count, &e), KVQ_OK);
    for (int h = 0; h < NKV; h++) {
        double c = 0, bits = 0;
        for (int g = h * R; g < (h + 1) * R; g++)
            c += counts[g], bits += 1 << g;
        assert_true(count[h] == c);
        for (int i = 0; i < D * D; i++)
            assert_true(fabs(H[h * D * D + i] - bits * (i + 1) / c) < 1e-15 * bits * (i + 1));
    }
    assert_true(count[0] == 10 + 11 + 12 + 13);
    /* Bad input: groups that do not divide, NaN sums, bad counts, an empty group. */
    assert_int_equal(kvq_moments_group(S, counts, 6, 4, D, H, count, &e), KVQ_E_INVALID_ARG);
    S[5 * D * D + 4] = NAN;
    assert_int_equal(kvq_moments_group(S, counts, NH, NKV, D, H, count, &e), KVQ_E_NUMERIC);
    assert_non_null(strstr(e.msg, "query head 5"));
    S[5 * D * D + 4] = 1;
    counts[2] = -1;
    assert_int_equal(kvq_moments_group(S, counts, NH, NKV, D, H, count, &e), KVQ_E_NUMERIC);
    counts[2] = 2.5;
    assert_int_equal(kvq_moments_group(S, counts, NH, NKV, D, H, count, &e), KVQ_E_NUMERIC);
    for (int g = 0; g < NH; g++)
        counts[g] = g < R ? 5 : 0;
    assert_int_equal(kvq_moments_group(S, counts, NH, NKV, D, H, count, &e), KVQ_E_NUMERIC);
    assert_non_null(strstr(e.msg, "KV head 1"));
}

/* RoPE at position p written out from its definition (base 10000, no scaling): the pair
 * (a, b) of frequency m, a = 2m, b = 2m + 1 (interleaved) or a = m, b = m + d/2 (half),
 * turns by p * 10000^(-2m/d): x'_a = x_a cos - x_b sin, x'_b = x_a sin + x_b cos. */
static void rope_by_definition(int layout, int d, double p, const double *x, double *y)
{
    for (int m = 0; m < d / 2; m++) {
        const int a = layout == KVQ_ROPE_INTERLEAVED ? 2 * m : m;
        const int b = layout == KVQ_ROPE_INTERLEAVED ? 2 * m + 1 : m + d / 2;
        const double t = p * pow(10000.0, -2.0 * m / d);
        y[a] = x[a] * cos(t) - x[b] * sin(t);
        y[b] = x[a] * sin(t) + x[b] * cos(t);
    }
}

/* R_b^T (mean q^T q) R_b == mean (q' )^T q' with q' = RoPE(q, b) from its definition (not
 * from kvq_rope_matrix), per layout; and the rotation moves H: it fails if R_b were the
 * identity or rotated the wrong pairs. */
static void test_rotation(void **state)
{
    enum { D = 8, N = 50 };
    for (int layout = 0; layout < 2; layout++) {
        kvq_rope rope = kvq_rope_default(D);
        rope.layout = (kvq_rope_layout)layout;
        double R[D * D], work[D * D], H[D * D] = {0}, Hd[D * D] = {0}, H0[D * D], q[D], qr[D];
        kvq_rope_matrix(&rope, 2048, R);
        kvq_rng rng;
        kvq_rng_seed(&rng, 7);
        for (int n = 0; n < N; n++) {
            for (int k = 0; k < D; k++)
                q[k] = kvq_rng_normal(&rng) * (k + 1);
            rope_by_definition(layout, D, 2048.0, q, qr);
            for (int a = 0; a < D; a++)
                for (int b = 0; b < D; b++) {
                    H[a * D + b] += q[a] * q[b] / N;
                    Hd[a * D + b] += qr[a] * qr[b] / N;
                }
        }
        memcpy(H0, H, sizeof H0);
        kvq_moments_rotate(H, R, D, work);
        for (int i = 0; i < D * D; i++)
            assert_true(fabs(H[i] - Hd[i]) < 1e-12 * fro(Hd, D));
        /* The rotation moved H by a good part of its size (the identity would not). */
        double diff[D * D];
        for (int i = 0; i < D * D; i++)
            diff[i] = H[i] - H0[i];
        assert_true(fro(diff, D) > 0.1 * fro(H0, D));
    }
}

/* ======================================================================================
 * Tiny capture directories
 * ====================================================================================== */

typedef struct cap_opts {
    int n_heads, n_kv_heads, head_dim;
    int sum_heads;        /* heads in the stored tensors (== n_heads unless testing) */
    int n_tokens;         /* rows; seq_len 16 */
    kvq_dtype dtype;      /* q storage */
    double rope_base;
    const char *layout;   /* "interleaved" | "half" */
    int nan_sum;          /* a NaN in layer 2's q_moment_sum */
    int dead_dim;         /* -1, or a dimension that is zero in every query */
    int drop_count;       /* leave q_moment_count out */
    int version;
} cap_opts;

static cap_opts cap_default(void)
{
    cap_opts o = {.n_heads = 4, .n_kv_heads = 2, .head_dim = 8, .sum_heads = 4, .n_tokens = 48,
                  .dtype = KVQ_DT_F32, .rope_base = 10000.0, .layout = "interleaved",
                  .nan_sum = 0, .dead_dim = -1, .drop_count = 0, .version = 1};
    return o;
}

/* Queries of one layer as the capture stores them, decoded back to float (so f16
 * rounding is part of the reference).   q: [n_tokens, n_heads, d] */
static void gen_q(const cap_opts *o, int layer, float *q)
{
    kvq_rng r;
    kvq_rng_seed(&r, 100 + (uint64_t)layer);
    size_t n = (size_t)o->n_tokens * o->sum_heads * o->head_dim;
    for (size_t i = 0; i < n; i++) {
        int k = (int)(i % o->head_dim), g = (int)(i / o->head_dim % o->sum_heads);
        q[i] = k == o->dead_dim ? 0.0f
                                : (float)(kvq_rng_normal(&r) * (0.5 + k) * (1.0 + 0.3 * g));
    }
    if (o->dtype == KVQ_DT_F16) {
        uint16_t *h = malloc(n * sizeof *h);
        kvq_f32_to_f16(q, h, n);
        kvq_f16_to_f32(h, q, n);
        free(h);
    }
}

static void write_layer_file(const char *path, const cap_opts *o, int layer)
{
    const int n = o->n_tokens, nh = o->sum_heads, d = o->head_dim;
    const size_t nq = (size_t)n * nh * d;
    float *q = malloc(nq * sizeof *q);
    double *S = calloc((size_t)nh * d * d, sizeof *S), *C = malloc((size_t)nh * sizeof *C);
    int32_t *rows = malloc((size_t)n * sizeof *rows), *pos = malloc((size_t)n * sizeof *pos);
    gen_q(o, layer, q);
    for (int i = 0; i < n; i++) {
        rows[i] = i;
        pos[i] = i % 16;
        for (int g = 0; g < nh; g++)
            for (int a = 0; a < d; a++)
                for (int b = 0; b < d; b++)
                    S[(size_t)g * d * d + a * d + b] +=
                        (double)q[((size_t)i * nh + g) * d + a] * q[((size_t)i * nh + g) * d + b];
    }
    for (int g = 0; g < nh; g++)
        C[g] = n;
    if (o->nan_sum && layer == 2)
        S[5] = NAN;

    kvq_st_writer *w = kvq_st_writer_new();
    kvq_err e = {0};
    int64_t sq[3] = {n, nh, d}, sr[1] = {n}, ss[3] = {nh, d, d}, sc[1] = {nh};
    char lay[8];
    snprintf(lay, sizeof lay, "%d", layer);
    assert_int_equal(kvq_st_writer_declare(w, "q", o->dtype, 3, sq, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_declare(w, "q_rows", KVQ_DT_I32, 1, sr, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_declare(w, "pos", KVQ_DT_I32, 1, sr, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_declare(w, "q_moment_sum", KVQ_DT_F64, 3, ss, &e), KVQ_OK);
    if (!o->drop_count)
        assert_int_equal(kvq_st_writer_declare(w, "q_moment_count", KVQ_DT_F64, 1, sc, &e),
                         KVQ_OK);
    assert_int_equal(kvq_st_writer_set_meta(w, "layer", lay, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_begin_file(w, path, 1, &e), KVQ_OK);
    if (o->dtype == KVQ_DT_F16) {
        uint16_t *h = malloc(nq * sizeof *h);
        kvq_f32_to_f16(q, h, nq);
        assert_int_equal(kvq_st_writer_write(w, h, nq * 2, &e), KVQ_OK);
        free(h);
    } else {
        assert_int_equal(kvq_st_writer_write(w, q, nq * 4, &e), KVQ_OK);
    }
    assert_int_equal(kvq_st_writer_write(w, rows, (size_t)n * 4, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_write(w, pos, (size_t)n * 4, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_write(w, S, (size_t)nh * d * d * 8, &e), KVQ_OK);
    if (!o->drop_count)
        assert_int_equal(kvq_st_writer_write(w, C, (size_t)nh * 8, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_finish(w, &e), KVQ_OK);
    kvq_st_writer_free(w);
    free(q);
    free(S);
    free(C);
    free(rows);
    free(pos);
}

static void write_json(const char *dir, const char *text)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/capture.json", dir);
    assert_int_equal(test_write_file(p, text, strlen(text)), 0);
}

/* A capture of model layers 0 and 2 (of 3) in test_path(name); returns the path. */
static const char *make_capture(const char *name, const cap_opts *o)
{
    static char dir[8][4096];
    static int k;
    char *d = dir[k++ & 7];
    snprintf(d, sizeof dir[0], "%s", test_path(name));
    mkdir(d, 0755);
    char json[4096];
    snprintf(json, sizeof json,
             "{\"format\": \"kvq-capture\", \"version\": %d, \"tool\": \"kvq test\",\n"
             " \"model\": {\"path\": \"none\", \"source\": \"gguf\", \"architecture\": \"llama\",\n"
             "   \"n_layers\": 3, \"dim\": %d, \"hidden_dim\": 64, \"n_heads\": %d,\n"
             "   \"n_kv_heads\": %d, \"head_dim\": %d, \"vocab_size\": 512,\n"
             "   \"context_length\": 2048, \"norm_eps\": 1e-5,\n"
             "   \"rope\": {\"base\": %.17g, \"layout\": \"%s\", \"scaling\": \"none\",\n"
             "     \"factor\": 1.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,\n"
             "     \"original_max_pos\": 8192.0}},\n"
             " \"corpus\": {\"spec\": \"test\", \"seed\": 0, \"hash\": \"00000000deadbeef\",\n"
             "   \"n_documents\": 3},\n"
             " \"dtype\": \"%s\", \"seq_len\": 16, \"n_tokens\": %d, \"n_sequences\": 3,\n"
             " \"sequences\": [[0, 16], [16, 16], [32, 16]],\n"
             " \"layers\": [0, 2],\n"
             " \"files\": [\"layer_000.safetensors\", \"layer_002.safetensors\"],\n"
             " \"queries\": \"all\", \"has_values\": false}\n",
             o->version, o->n_heads * o->head_dim, o->n_heads, o->n_kv_heads, o->head_dim,
             o->rope_base, o->layout, o->dtype == KVQ_DT_F16 ? "f16" : "f32", o->n_tokens);
    write_json(d, json);
    char p[4200];
    snprintf(p, sizeof p, "%s/layer_000.safetensors", d);
    write_layer_file(p, o, 0);
    snprintf(p, sizeof p, "%s/layer_002.safetensors", d);
    write_layer_file(p, o, 2);
    return d;
}

/* The expected H of (layer, KV head) straight from the queries: WRoPE uses R_b for
 * every row, RoPE uses R_pos of each row.   H: [d, d] */
static void direct_H(const cap_opts *o, int layer, int h, int rope_mode, double *H)
{
    const int d = o->head_dim, nh = o->n_heads, r = nh / o->n_kv_heads, n = o->n_tokens;
    float *q = malloc((size_t)n * nh * d * sizeof *q);
    double *R = malloc((size_t)d * d * sizeof *R), *x = malloc((size_t)d * sizeof *x);
    kvq_rope rope = kvq_rope_default(d);
    rope.base = o->rope_base;
    assert_int_equal(kvq_rope_layout_parse(o->layout, &rope.layout), 0);
    gen_q(o, layer, q);
    memset(H, 0, (size_t)d * d * sizeof *H);
    if (!rope_mode)
        kvq_rope_matrix(&rope, 2048, R);
    for (int i = 0; i < n; i++) {
        if (rope_mode)
            kvq_rope_matrix(&rope, i % 16, R);
        for (int g = h * r; g < (h + 1) * r; g++) {
            const float *qi = q + ((size_t)i * nh + g) * d;
            for (int j = 0; j < d; j++) {
                x[j] = 0;
                for (int k = 0; k < d; k++)
                    x[j] += qi[k] * R[k * d + j];
            }
            for (int a = 0; a < d; a++)
                for (int b = 0; b < d; b++)
                    H[a * d + b] += x[a] * x[b] / ((double)n * r);
        }
    }
    free(q);
    free(R);
    free(x);
}

typedef struct log_rec {
    int n_warn, n_info;
    char last_warn[512], all_info[4096];
    int cancel_at; /* progress call at which to cancel (0 = never) */
    int n_progress;
} log_rec;

static void rec_log(void *user, kvq_log_level level, const char *msg)
{
    log_rec *r = user;
    if (level == KVQ_LOG_WARN) {
        r->n_warn++;
        snprintf(r->last_warn, sizeof r->last_warn, "%s", msg);
    } else if (level == KVQ_LOG_INFO) {
        r->n_info++;
        size_t l = strlen(r->all_info);
        snprintf(r->all_info + l, sizeof r->all_info - l, "%s\n", msg);
    }
}

static int rec_progress(void *user, const char *what, uint64_t done, uint64_t total)
{
    log_rec *r = user;
    r->n_progress++;
    assert_string_equal(what, "moments");
    assert_true(total == 2 && done >= 1 && done <= 2);
    return r->cancel_at && r->n_progress >= r->cancel_at;
}

static int exists(const char *p) { return access(p, F_OK) == 0; }

/* ======================================================================================
 * The stage end to end
 * ====================================================================================== */

static void check_file_against_direct(const char *out, const cap_opts *o, int rope_mode,
                                      double tol)
{
    const int d = o->head_dim;
    kvq_moments *m = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_moments_open(out, &m, &e), KVQ_OK);
    assert_int_equal(kvq_moments_n_layers(m), 2);
    assert_int_equal(kvq_moments_layer(m, 0), 0);
    assert_int_equal(kvq_moments_layer(m, 1), 2);
    assert_true(kvq_moments_has_layer(m, 2));
    assert_false(kvq_moments_has_layer(m, 1));
    assert_int_equal(kvq_moments_positions(m),
                     rope_mode ? KVQ_POSITIONS_ROPE : KVQ_POSITIONS_WROPE);
    assert_int_equal(kvq_moments_wrope_b(m), 2048);
    assert_int_equal(kvq_moments_wrope_w(m), 64);
    assert_string_equal(kvq_moments_meta(m, "format"), "kvq-moments");
    assert_string_equal(kvq_moments_meta(m, "corpus.hash"), "00000000deadbeef");
    char nh[16];
    snprintf(nh, sizeof nh, "%d", o->n_heads);
    assert_string_equal(kvq_moments_meta(m, "model.n_heads"), nh);
    assert_string_equal(kvq_moments_meta(m, "model.rope.layout"), o->layout);
    assert_int_equal(kvq_moments_model(m)->n_kv_heads, o->n_kv_heads);

    double *H = malloc((size_t)d * d * sizeof *H), *Hd = malloc((size_t)d * d * sizeof *Hd);
    double *L = malloc((size_t)d * d * sizeof *L), *Li = malloc((size_t)d * d * sizeof *Li);
    float *Lf = malloc((size_t)d * d * sizeof *Lf);
    for (int li = 0; li < 2; li++) {
        int layer = li * 2;
        for (int h = 0; h < o->n_kv_heads; h++) {
            direct_H(o, layer, h, rope_mode, Hd);
            assert_int_equal(kvq_moments_get_f64(m, layer, h, KVQ_MOMENTS_MAT_H, H, &e), KVQ_OK);
            for (int i = 0; i < d * d; i++)
                assert_true(fabs(H[i] - Hd[i]) <= tol * fro(Hd, d));
            assert_int_equal(kvq_moments_get_f64(m, layer, h, KVQ_MOMENTS_MAT_L, L, &e), KVQ_OK);
            assert_int_equal(kvq_moments_get_f64(m, layer, h, KVQ_MOMENTS_MAT_LINV, Li, &e),
                             KVQ_OK);
            kvq_moments_head_stats s;
            assert_int_equal(kvq_moments_get_stats(m, layer, h, &s, &e), KVQ_OK);
            assert_true(s.lambda == 0);
            assert_true(s.count == (double)o->n_tokens * (o->n_heads / o->n_kv_heads));
            assert_true(s.eig_min > 0 && s.cond >= 1 && s.anisotropy > 0 && s.anisotropy < 1);
            assert_true(llt_rel_err(L, H, d) < 1e-10);
            assert_true(inv_err(L, Li, d) < 1e-10);
            assert_int_equal(kvq_moments_get_f32(m, layer, h, KVQ_MOMENTS_MAT_L, Lf, &e), KVQ_OK);
            for (int i = 0; i < d * d; i++)
                assert_true(Lf[i] == (float)L[i]);
        }
    }
    /* Bad lookups */
    assert_int_equal(kvq_moments_get_f64(m, 1, 0, KVQ_MOMENTS_MAT_L, L, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_moments_get_f64(m, 0, o->n_kv_heads, KVQ_MOMENTS_MAT_L, L, &e),
                     KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_moments_get_f32(m, 0, 0, KVQ_MOMENTS_MAT_H, Lf, &e), KVQ_E_INVALID_ARG);
    free(H);
    free(Hd);
    free(L);
    free(Li);
    free(Lf);
    kvq_moments_close(m);
}

static void test_stage_wrope(void **state)
{
    cap_opts o = cap_default();
    const char *dir = make_capture("cap_wrope", &o);
    char out[4200], out2[4200];
    snprintf(out, sizeof out, "%s.moments", dir);
    snprintf(out2, sizeof out2, "%s.moments2", dir);
    kvq_moments_params p = kvq_moments_params_default();
    log_rec rec = {0};
    kvq_callbacks cb = {rec_log, rec_progress, &rec};
    kvq_err e = {0};
    assert_int_equal(kvq_moments_compute(dir, out, 0, &p, &cb, &e), KVQ_OK);
    assert_int_equal(rec.n_progress, 2);
    assert_int_equal(rec.n_warn, 0);
    check_file_against_direct(out, &o, 0, 1e-12);

    /* Same inputs, same bytes. */
    assert_int_equal(kvq_moments_compute(dir, out2, 0, &p, NULL, &e), KVQ_OK);
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    assert_int_equal(kvq_read_file(out, &a, &na, &e), KVQ_OK);
    assert_int_equal(kvq_read_file(out2, &b, &nb, &e), KVQ_OK);
    assert_true(na == nb && memcmp(a, b, na) == 0);
    free(b);

    /* device cuda without a usable GPU: one warning, the same bytes from the CPU. */
    if (!kvq_cuda_available(NULL)) {
        memset(&rec, 0, sizeof rec);
        p.device = KVQ_MOMENTS_CUDA;
        assert_int_equal(kvq_moments_compute(dir, out2, 1, &p, &cb, &e), KVQ_OK);
        assert_int_equal(rec.n_warn, 1);
        assert_non_null(strstr(rec.last_warn, "cuda"));
        assert_int_equal(kvq_read_file(out2, &b, &nb, &e), KVQ_OK);
        assert_true(na == nb && memcmp(a, b, na) == 0);
        free(b);
        p.device = KVQ_MOMENTS_CPU;
    } else {
        /* with a usable GPU (a CUDA build on a GPU machine) the factorization runs on it
         * (cuSOLVER, batched over a layer's heads): no warning, and the file passes the
         * same checks against the direct computation as the CPU's (L L^T = H, L^-1) */
        memset(&rec, 0, sizeof rec);
        p.device = KVQ_MOMENTS_CUDA;
        assert_int_equal(kvq_moments_compute(dir, out2, 1, &p, &cb, &e), KVQ_OK);
        assert_int_equal(rec.n_warn, 0);
        check_file_against_direct(out2, &o, 0, 1e-12);
        p.device = KVQ_MOMENTS_CPU;
    }
    free(a);

    /* Existing output without overwrite; a cancelled run leaves nothing. */
    assert_int_equal(kvq_moments_compute(dir, out, 0, &p, NULL, &e), KVQ_E_EXISTS);
    char out3[4200];
    snprintf(out3, sizeof out3, "%s.cancelled", dir);
    memset(&rec, 0, sizeof rec);
    rec.cancel_at = 1;
    assert_int_equal(kvq_moments_compute(dir, out3, 0, &p, &cb, &e), KVQ_E_CANCELLED);
    assert_false(exists(out3));

    /* The moments file and its capture agree on the model. */
    kvq_capture_info *ci = NULL;
    kvq_moments *m = NULL;
    assert_int_equal(kvq_capture_info_read(dir, &ci, &e), KVQ_OK);
    assert_int_equal(kvq_moments_open(out, &m, &e), KVQ_OK);
    assert_int_equal(kvq_moments_check_capture(m, ci, &e), KVQ_OK);
    kvq_capture_info_free(ci);

    /* ... and a capture of another model does not (rope base differs). */
    cap_opts o2 = cap_default();
    o2.rope_base = 500000.0;
    const char *dir2 = make_capture("cap_other", &o2);
    assert_int_equal(kvq_capture_info_read(dir2, &ci, &e), KVQ_OK);
    assert_int_equal(kvq_moments_check_capture(m, ci, &e), KVQ_E_MISMATCH);
    assert_non_null(strstr(e.msg, "model.rope.base"));
    assert_non_null(strstr(e.msg, out));
    assert_non_null(strstr(e.msg, "cap_other/capture.json"));
    kvq_capture_info_free(ci);
    kvq_moments_close(m);

    /* A file that is not a moments file. */
    char lf[4200];
    snprintf(lf, sizeof lf, "%s/layer_000.safetensors", dir);
    assert_int_equal(kvq_moments_open(lf, &m, &e), KVQ_E_BAD_MAGIC);
    assert_null(m);
}

/* Post-RoPE ablation from f16 queries, half layout, GQA r = 4. */
static void test_stage_rope(void **state)
{
    cap_opts o = cap_default();
    o.n_heads = o.sum_heads = 8;
    o.dtype = KVQ_DT_F16;
    o.layout = "half";
    const char *dir = make_capture("cap_rope", &o);
    char out[4200];
    snprintf(out, sizeof out, "%s.moments", dir);
    kvq_moments_params p = kvq_moments_params_default();
    p.positions = KVQ_POSITIONS_ROPE;
    kvq_err e = {0};
    assert_int_equal(kvq_moments_compute(dir, out, 0, &p, NULL, &e), KVQ_OK);
    check_file_against_direct(out, &o, 1, 1e-12);
    /* WRoPE of the same capture differs (positions matter). */
    char out2[4200];
    snprintf(out2, sizeof out2, "%s.wrope", dir);
    p.positions = KVQ_POSITIONS_WROPE;
    assert_int_equal(kvq_moments_compute(dir, out2, 0, &p, NULL, &e), KVQ_OK);
    check_file_against_direct(out2, &o, 0, 1e-12);
}

/* A dead dimension: every head is regularized, and the log says so. */
static void test_stage_dead_dim(void **state)
{
    cap_opts o = cap_default();
    o.dead_dim = 5;
    const char *dir = make_capture("cap_dead", &o);
    char out[4200];
    snprintf(out, sizeof out, "%s.moments", dir);
    kvq_moments_params p = kvq_moments_params_default();
    log_rec rec = {0};
    kvq_callbacks cb = {rec_log, NULL, &rec};
    kvq_err e = {0};
    assert_int_equal(kvq_moments_compute(dir, out, 0, &p, &cb, &e), KVQ_OK);
    assert_int_equal(rec.n_info, 4); /* 2 layers x 2 KV heads */
    assert_non_null(strstr(rec.all_info, "layer 2 head 1"));
    assert_non_null(strstr(rec.all_info, "lambda"));
    kvq_moments *m = NULL;
    assert_int_equal(kvq_moments_open(out, &m, &e), KVQ_OK);
    double H[64], L[64], Li[64];
    kvq_moments_head_stats s;
    assert_int_equal(kvq_moments_get_stats(m, 2, 1, &s, &e), KVQ_OK);
    assert_int_equal(kvq_moments_get_f64(m, 2, 1, KVQ_MOMENTS_MAT_H, H, &e), KVQ_OK);
    assert_int_equal(kvq_moments_get_f64(m, 2, 1, KVQ_MOMENTS_MAT_L, L, &e), KVQ_OK);
    assert_int_equal(kvq_moments_get_f64(m, 2, 1, KVQ_MOMENTS_MAT_LINV, Li, &e), KVQ_OK);
    double tr = 0;
    for (int i = 0; i < 8; i++)
        tr += H[i * 8 + i];
    assert_true(fabs(s.lambda - 1e-6 * tr / 8) <= 1e-12 * s.lambda);
    assert_true(fabs(s.eps - 1e-6) < 1e-15);
    for (int i = 0; i < 8; i++)
        H[i * 8 + i] += s.lambda;
    assert_true(llt_rel_err(L, H, 8) < 1e-10);
    assert_true(inv_err(L, Li, 8) < 1e-8);
    kvq_moments_close(m);
}

/* ======================================================================================
 * Bad input: exact statuses
 * ====================================================================================== */

static kvq_status compute_status(const char *dir, kvq_err *e)
{
    char out[4200];
    snprintf(out, sizeof out, "%s.out", dir);
    kvq_moments_params p = kvq_moments_params_default();
    kvq_status s = kvq_moments_compute(dir, out, 1, &p, NULL, e);
    if (s != KVQ_OK)
        assert_false(exists(out));
    return s;
}

static void test_bad_captures(void **state)
{
    kvq_err e = {0};
    cap_opts o = cap_default();
    const char *dir = make_capture("bad", &o);
    char path[4200];

    /* No capture.json (and no directory). */
    snprintf(path, sizeof path, "%s/capture.json", dir);
    assert_int_equal(compute_status(test_path("nowhere"), &e), KVQ_E_NOT_FOUND);
    assert_non_null(strstr(e.msg, "nowhere/capture.json"));
    unlink(path);
    assert_int_equal(compute_status(dir, &e), KVQ_E_NOT_FOUND);

    struct { const char *json; kvq_status want; const char *needle; } cases[] = {
        {"{\"format\": \"kvq-capture\", \"version\": 1,", KVQ_E_BAD_JSON, "not valid JSON"},
        {"[1, 2]", KVQ_E_BAD_JSON, "object"},
        {"{\"format\": \"kvq-capture\", \"version\": 1} x", KVQ_E_BAD_JSON, "after"},
        {"{\"format\": \"something\", \"version\": 1}", KVQ_E_BAD_MAGIC, "format"},
        {"{\"format\": \"kvq-capture\", \"version\": 3}", KVQ_E_VERSION, "version 3"},
        {"{\"format\": \"kvq-capture\", \"version\": 1}", KVQ_E_BAD_JSON, "missing key model"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_json(dir, cases[i].json);
        assert_int_equal(compute_status(dir, &e), cases[i].want);
        assert_non_null(strstr(e.msg, "capture.json"));
        assert_non_null(strstr(e.msg, cases[i].needle));
    }

    /* Field-level problems: rewrite one field of a valid capture.json. */
    make_capture("bad", &o);
    uint8_t *good = NULL;
    size_t n = 0;
    assert_int_equal(kvq_read_file(path, &good, &n, &e), KVQ_OK);
    struct { const char *from, *to; kvq_status want; const char *needle; } edits[] = {
        {"\"n_kv_heads\": 2", "\"n_kv_heads\": 3", KVQ_E_CORRUPT, "n_kv_heads"},
        {"\"n_kv_heads\": 2", "\"n_kv_heads\": \"2\"", KVQ_E_BAD_JSON, "model.n_kv_heads"},
        {"\"head_dim\": 8", "\"head_dim\": 8.5", KVQ_E_BAD_JSON, "model.head_dim"},
        {"\"dtype\": \"f32\"", "\"dtype\": \"q4\"", KVQ_E_UNSUPPORTED, "q4"},
        {"\"layout\": \"interleaved\"", "\"layout\": \"zigzag\"", KVQ_E_UNSUPPORTED, "zigzag"},
        {"\"layers\": [0, 2]", "\"layers\": [0, 3]", KVQ_E_CORRUPT, "layers[1]"},
        {"\"layers\": [0, 2]", "\"layers\": [0, 0]", KVQ_E_CORRUPT, "twice"},
        {"\"layers\": [0, 2]", "\"layers\": [0]", KVQ_E_CORRUPT, "1 layers but 2 files"},
        {"\"layer_002.safetensors\"]", "\"../layer_002.safetensors\"]", KVQ_E_CORRUPT, "plain"},
        {"\"layer_002.safetensors\"]", "\"layer_009.safetensors\"]", KVQ_E_NOT_FOUND,
         "layer_009"},
        {"[32, 16]", "[40, 16]", KVQ_E_CORRUPT, "sequences[2]"},
        {"\"n_heads\": 4", "\"n_heads\": 8", KVQ_E_SHAPE_MISMATCH, "q_moment_sum"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        const char *at = strstr((const char *)good, edits[i].from);
        assert_non_null(at);
        char buf[4096];
        snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - (const char *)good), (const char *)good,
                 edits[i].to, at + strlen(edits[i].from));
        write_json(dir, buf);
        kvq_status s = compute_status(dir, &e);
        if (s != edits[i].want || !strstr(e.msg, edits[i].needle))
            print_error("edit %zu: got %d (%s)\n", i, (int)s, e.msg);
        assert_int_equal(s, edits[i].want);
        assert_non_null(strstr(e.msg, edits[i].needle));
    }
    free(good);

    /* Layer files: tensors with more heads than capture.json says, a NaN in the sums,
     * a missing tensor. */
    o.sum_heads = 8;
    make_capture("bad_shape", &o);
    assert_int_equal(compute_status(test_path("bad_shape"), &e), KVQ_E_SHAPE_MISMATCH);
    assert_non_null(strstr(e.msg, "layer_000.safetensors"));
    o = cap_default();
    o.nan_sum = 1;
    make_capture("bad_nan", &o);
    assert_int_equal(compute_status(test_path("bad_nan"), &e), KVQ_E_NUMERIC);
    assert_non_null(strstr(e.msg, "layer_002.safetensors"));
    o = cap_default();
    o.drop_count = 1;
    make_capture("bad_count", &o);
    assert_int_equal(compute_status(test_path("bad_count"), &e), KVQ_E_NOT_FOUND);
    assert_non_null(strstr(e.msg, "q_moment_count"));

    /* Bad parameters are refused before anything is read. */
    kvq_moments_params p = kvq_moments_params_default();
    p.wrope_b = -1;
    assert_int_equal(kvq_moments_compute(dir, test_path("x"), 1, &p, NULL, &e),
                     KVQ_E_INVALID_ARG);
}

/* capture.json fields land where they should. */
static void test_capture_info(void **state)
{
    cap_opts o = cap_default();
    const char *dir = make_capture("info", &o);
    kvq_capture_info *ci = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_capture_info_read(dir, &ci, &e), KVQ_OK);
    assert_string_equal(ci->model.architecture, "llama");
    assert_int_equal(ci->model.n_heads, 4);
    assert_int_equal(ci->model.n_kv_heads, 2);
    assert_int_equal(ci->model.head_dim, 8);
    assert_int_equal(ci->model.rope.head_dim, 8);
    assert_true(ci->model.rope.base == 10000.0);
    assert_int_equal(ci->model.rope.layout, KVQ_ROPE_INTERLEAVED);
    assert_true(ci->model.norm_eps == 1e-5);
    assert_int_equal(ci->dtype, KVQ_DT_F32);
    assert_int_equal(ci->n_tokens, 48);
    assert_int_equal(ci->n_sequences, 3);
    assert_int_equal(ci->sequences[4], 32);
    assert_int_equal(ci->n_files, 2);
    assert_int_equal(ci->layers[1], 2);
    assert_string_equal(ci->files[1], "layer_002.safetensors");
    assert_int_equal(kvq_capture_info_find_layer(ci, 2), 1);
    assert_int_equal(kvq_capture_info_find_layer(ci, 1), -1);
    assert_int_equal(ci->n_queries, 0);
    assert_false(ci->has_values);
    assert_string_equal(ci->corpus_hash, "00000000deadbeef");
    char *p = NULL;
    assert_int_equal(kvq_capture_info_file_path(ci, 0, &p, &e), KVQ_OK);
    assert_non_null(strstr(p, "info/layer_000.safetensors"));
    free(p);

    /* Identity through metadata and back. */
    kvq_st_writer *w = kvq_st_writer_new();
    assert_int_equal(kvq_model_id_set_meta(&ci->model, "model.", w, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_begin_buffer(w, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_finish(w, &e), KVQ_OK);
    size_t size = 0;
    const void *buf = kvq_st_writer_buffer(w, &size);
    kvq_st *st = NULL;
    assert_int_equal(kvq_st_open_memory(buf, size, "mem", &st, &e), KVQ_OK);
    kvq_model_id id;
    assert_int_equal(kvq_model_id_from_meta(st, "model.", "mem", &id, &e), KVQ_OK);
    assert_int_equal(kvq_model_id_compare(&id, "a", &ci->model, "b", &e), KVQ_OK);
    assert_string_equal(id.path, "none");
    assert_int_equal(kvq_model_id_from_meta(st, "other.", "mem", &id, &e), KVQ_E_NOT_FOUND);
    /* A GGUF's float32 eps is the config's decimal one; a different eps is not. */
    id.norm_eps = (double)(float)1e-6;
    ci->model.norm_eps = 1e-6;
    assert_int_equal(kvq_model_id_compare(&id, "a", &ci->model, "b", &e), KVQ_OK);
    id.norm_eps = 1e-5;
    assert_int_equal(kvq_model_id_compare(&id, "a", &ci->model, "b", &e), KVQ_E_MISMATCH);
    assert_non_null(strstr(e.msg, "model.norm_eps differs"));
    id.norm_eps = ci->model.norm_eps;
    id.n_heads = 16;
    assert_int_equal(kvq_model_id_compare(&id, "a", &ci->model, "b", &e), KVQ_E_MISMATCH);
    assert_string_equal(e.msg, "a vs b: model.n_heads differs (16 vs 4)");
    kvq_st_close(st);
    kvq_st_writer_free(w);
    kvq_capture_info_free(ci);
}

/* capture.json text for a model of n_layers layers listing `layers` (model layer
 * indices, file i named "f<i>"), in a malloc'd buffer; *size gets its length. */
static char *capture_json_text(int n_layers, const int *layers, int n, size_t *size)
{
    const size_t cap = 1024 + (size_t)n * 32;
    char *s = malloc(cap);
    assert_non_null(s);
    size_t w = (size_t)snprintf(s, cap,
        "{\"format\": \"kvq-capture\", \"version\": 1, \"tool\": \"kvq test\",\n"
        " \"model\": {\"source\": \"hf\", \"architecture\": \"qwen2\", \"n_layers\": %d,\n"
        "   \"dim\": 64, \"hidden_dim\": 128, \"n_heads\": 8, \"n_kv_heads\": 2,\n"
        "   \"head_dim\": 16, \"vocab_size\": 1000, \"context_length\": 4096,\n"
        "   \"norm_eps\": 1e-6, \"rope\": {\"base\": 1000000, \"layout\": \"half\",\n"
        "   \"scaling\": \"none\"}},\n"
        " \"corpus\": {\"spec\": \"uuid:4\", \"seed\": 9, \"hash\": \"0123456789abcdef\",\n"
        "   \"n_documents\": 4},\n"
        " \"dtype\": \"bf16\", \"seq_len\": 32, \"n_tokens\": 64,\n"
        " \"sequences\": [[0, 32], [32, 32]], \"queries\": 16, \"seed\": 3,\n"
        " \"has_values\": true,\n \"layers\": [", n_layers);
    for (int i = 0; i < n; i++)
        w += (size_t)snprintf(s + w, cap - w, "%s%d", i ? ", " : "", layers[i]);
    w += (size_t)snprintf(s + w, cap - w, "],\n \"files\": [");
    for (int i = 0; i < n; i++)
        w += (size_t)snprintf(s + w, cap - w, "%s\"f%d\"", i ? ", " : "", i);
    w += (size_t)snprintf(s + w, cap - w, "]}\n");
    assert_true(w < cap);
    *size = w;
    return s;
}

static kvq_status read_mem(const char *text, size_t size, kvq_capture_info **ci, kvq_err *e)
{
    *ci = (kvq_capture_info *)text; /* must be overwritten, also on failure */
    kvq_status st = kvq_capture_info_read_memory("mem", text, size, ci, e);
    if (st != KVQ_OK)
        assert_null(*ci);
    return st;
}

/* kvq_capture_info_read_memory: a valid document (not NUL-terminated), every layer of
 * the largest model accepted, and the exact status of corrupt ones. */
static void test_capture_info_memory(void **state)
{
    kvq_err e = {0};
    kvq_capture_info *ci = NULL;
    size_t size = 0;
    const int three[] = {3, 0, 1};
    char *text = capture_json_text(4, three, 3, &size);
    /* The size bounds the document: the bytes after it are not read. */
    char *padded = malloc(size + 8);
    memcpy(padded, text, size);
    memcpy(padded + size, "garbage!", 8);
    assert_int_equal(read_mem(padded, size, &ci, &e), KVQ_OK);
    assert_string_equal(ci->dir, "mem");
    assert_string_equal(ci->model.architecture, "qwen2");
    assert_int_equal(ci->model.n_layers, 4);
    assert_int_equal(ci->model.rope.layout, KVQ_ROPE_HALF);
    assert_true(ci->model.rope.base == 1e6);
    assert_int_equal(ci->dtype, KVQ_DT_BF16);
    assert_int_equal(ci->n_queries, 16);
    assert_true(ci->has_values);
    assert_int_equal(ci->corpus_seed, 9);
    assert_int_equal(ci->n_sequences, 2);
    assert_int_equal(ci->sequences[2], 32);
    assert_int_equal(ci->n_files, 3);
    assert_int_equal(ci->layers[0], 3);
    assert_string_equal(ci->files[2], "f2");
    assert_int_equal(kvq_capture_info_find_layer(ci, 1), 2);
    assert_int_equal(kvq_capture_info_find_layer(ci, 2), -1);
    char *p = NULL;
    assert_int_equal(kvq_capture_info_file_path(ci, 0, &p, &e), KVQ_OK);
    assert_string_equal(p, "mem/f0");
    free(p);
    kvq_capture_info_free(ci);
    assert_int_equal(read_mem(padded, size + 8, &ci, &e), KVQ_E_BAD_JSON);
    assert_string_equal(e.msg, "mem/capture.json: text after the JSON object");
    free(padded);
    free(text);

    /* The largest model, every layer listed in reverse: one linear pass. */
    enum { N = KVQ_CAPTURE_MAX_LAYERS };
    int *all = malloc(N * sizeof *all);
    for (int i = 0; i < N; i++)
        all[i] = N - 1 - i;
    text = capture_json_text(N, all, N, &size);
    assert_int_equal(read_mem(text, size, &ci, &e), KVQ_OK);
    assert_int_equal(ci->n_files, N);
    assert_int_equal(ci->layers[N - 1], 0);
    assert_int_equal(kvq_capture_info_find_layer(ci, N - 1), 0);
    kvq_capture_info_free(ci);
    free(text);
    all[N - 1] = N / 2; /* a repeat at the very end */
    text = capture_json_text(N, all, N, &size);
    assert_int_equal(read_mem(text, size, &ci, &e), KVQ_E_CORRUPT);
    assert_string_equal(e.msg, "mem/capture.json: layer 32768 is listed twice");
    free(text);
    free(all);

    /* Corrupt documents: exact status and message. */
    const int dup[] = {1, 2, 1}, out[] = {0, 4}, one[] = {0};
    struct { int n_layers; const int *layers; int n; kvq_status want; const char *msg; } cases[] = {
        {4, dup, 3, KVQ_E_CORRUPT, "mem/capture.json: layer 1 is listed twice"},
        {4, out, 2, KVQ_E_CORRUPT, "mem/capture.json: layers[1] is not a layer index below 4"},
        {KVQ_CAPTURE_MAX_LAYERS + 1, one, 1, KVQ_E_TOO_LARGE,
         "mem/capture.json: model.n_layers 65537 is more than 65536"},
        {0, one, 1, KVQ_E_CORRUPT, "mem/capture.json: model.n_layers = 0 is outside [1, "},
        {2, three, 3, KVQ_E_CORRUPT, "mem/capture.json: 3 layers listed, model has 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        text = capture_json_text(cases[i].n_layers, cases[i].layers, cases[i].n, &size);
        kvq_status st = read_mem(text, size, &ci, &e);
        if (st != cases[i].want || strncmp(e.msg, cases[i].msg, strlen(cases[i].msg)))
            fail_msg("case %zu: got %d '%s'", i, (int)st, e.msg);
        free(text);
    }
    assert_int_equal(read_mem(NULL, 0, &ci, &e), KVQ_E_BAD_JSON);
    assert_int_equal(read_mem("{\"format\": \"kvq-capture\", \"version\": 3}", 39, &ci, &e),
                     KVQ_E_VERSION);
}

static int teardown(void **state)
{
    test_tmpdir_cleanup();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cholesky_spd),
        cmocka_unit_test(test_cholesky_singular),
        cmocka_unit_test(test_cholesky_failures),
        cmocka_unit_test(test_diagnostics),
        cmocka_unit_test(test_gqa_grouping),
        cmocka_unit_test(test_rotation),
        cmocka_unit_test(test_capture_info),
        cmocka_unit_test(test_capture_info_memory),
        cmocka_unit_test(test_stage_wrope),
        cmocka_unit_test(test_stage_rope),
        cmocka_unit_test(test_stage_dead_dim),
        cmocka_unit_test(test_bad_captures),
    };
    return cmocka_run_group_tests_name("moments", tests, NULL, teardown);
}
