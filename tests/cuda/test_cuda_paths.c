/* test_cuda_paths.c — every CUDA path of kvq against its CPU reference (built and run only
 * with CUDA=1: `make test-cuda`, scripts/test-cuda.sh; `make CUDA=1 test` runs it too).
 *
 *   k-means     distances + argmin (cuBLAS SGEMM + k_argmin), the centroid update
 *               (cub radix sort + k_update), seeding through the CUDA backend (k-means||'s
 *               distance passes), the whole fit with device cuda
 *   moments     the batched Cholesky (cusolverDnDpotrfBatched) against LAPACK's dpotrf
 *   retrieval   the LUT (k_lut), the score gather (k_score) and the top-k kernel itself
 *               (k_topk), through kvq_rt_cuda_select and kvq_rt_cuda_topk
 *
 * Without a usable GPU (no device, no driver, or a device this build has no code for)
 * every case reports "[  SKIP    ] <reason>" (kvq_cuda_available's reason, which says
 * "no CUDA device ...", a reason tests/run-tests.sh accepts) and the program exits 0.
 *
 * The CPU references are kvq's own CPU backends, which the CPU tests check against
 * independent sources (numpy, brute force). The tolerances are named below with the
 * reason for each; the selections (top-k) and everything on separable data are exact.
 * Status: compiled here; never executed on a GPU (docs/cuda.md). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cholesky/cholesky_internal.h"
#include "kmeans/cuda/lloyd_batched.h"
#include "kmeans/cuda/lloyd_hd.h"
#include "kmeans/kmeans_internal.h"
#include "kvq/half.h"
#include "kvq/kmeans.h"
#include "kvq/util.h"
#include "runtime/cuda/retrieval_cuda.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/rk.h"
#include "helpers/testutil.h"

/* Squared distances of the GPU's expanded form ||x||^2 + ||c||^2 - 2 x.c (float SGEMM,
 * possibly another summation order and FMA contraction) against the CPU's: the
 * difference is a few float roundings of the terms, so it is bounded relative to
 * ||x||^2 + ||c||^2. */
#define DIST_RTOL 1e-5
/* Centroid coordinates: both sum w x in double in point order and round once to float;
 * nvcc may fuse the multiply-add (the CPU build does not), which can move the double by
 * an ulp and, rarely, the float by one ulp. */
#define UPDATE_RTOL 3e-7
/* Whole fit on data without a planted structure: the GPU's and the CPU's roundings break
 * near-ties differently, the trajectories part and end in different local minima of
 * about the same inertia. */
#define FIT_INERTIA_RTOL 1e-2
/* The batched device fit (kmeans/cuda/lloyd_batched.cu) against the CPU fit per head:
 * its seeding is k-means++ on a strided subsample where the CPU's is greedy k-means++ on a
 * random one, so on data without structure the two end in different local minima; their
 * inertias after 15 iterations differ by about a percent (the spread of k-means restarts
 * at this n / k). From the same given centroids, the first inertia differs only by the
 * expanded form's float roundings (as DIST_RTOL). The device's seeding and repair are
 * exact: the same bits as the CPU references (fused chains, fixed-order double sums). */
#define LLOYD_FIT_INERTIA_RTOL 2e-2
#define LLOYD_INERTIA0_RTOL 1e-5
/* Cholesky factors: cuSOLVER's and LAPACK's dpotrf sum in different orders in double;
 * matrices with condition number about 1e3. */
#define CHOL_RTOL 1e-11

/* ---- skip unless a usable GPU ------------------------------------------------------------- */

#define NEED_GPU()                                                                         \
    do {                                                                                   \
        const char *why_ = NULL;                                                           \
        if (!kvq_cuda_available(&why_))                                                    \
            TEST_SKIP("%s", why_ ? why_ : "no CUDA device found");                        \
    } while (0)

/* ---- data ----------------------------------------------------------------------------------- */

static float *randn(size_t n, uint64_t seed, float scale)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(scale * kvq_rng_normal(&r));
    return x;
}

/* nc blobs of `per` points each (blob j = rows [j per, (j+1) per)), centres sep N(0, 1)
 * apart, spread sd: separable when sep >> sd. */
static float *planted(int32_t nc, int64_t per, int32_t d, float sep, float sd, uint64_t seed)
{
    float *c = randn((size_t)nc * d, seed, sep);
    float *x = randn((size_t)nc * per * d, seed + 1, sd);
    for (int32_t j = 0; j < nc; j++)
        for (int64_t q = 0; q < per; q++)
            for (int32_t t = 0; t < d; t++)
                x[((size_t)j * per + q) * d + t] += c[(size_t)j * d + t];
    free(c);
    return x;
}

static double l2sq(const float *a, const float *b, int32_t d)
{
    double s = 0;
    for (int32_t t = 0; t < d; t++)
        s += ((double)a[t] - b[t]) * ((double)a[t] - b[t]);
    return s;
}

static double norm2(const float *a, int32_t d)
{
    double s = 0;
    for (int32_t t = 0; t < d; t++)
        s += (double)a[t] * a[t];
    return s;
}

/* ---- k-means: distances + argmin ---------------------------------------------------------- */

/* One shape: the CUDA backend's assignment and distances against the CPU backend's. On
 * separable data the assignments are equal; otherwise a differing choice must be a
 * near-tie (exact distances within DIST_RTOL). */
static void check_assign(const float *x, const float *w, int64_t n, int32_t d, const float *cent,
                         int32_t kc, int separable)
{
    void *cc = NULL, *gc = NULL;
    kvq_err e = {0};
    int32_t *ac = malloc(sizeof(int32_t) * n), *ag = malloc(sizeof(int32_t) * n);
    float *dc = malloc(sizeof(float) * n), *dg = malloc(sizeof(float) * n);
    assert_int_equal(kvq_km_backend_cpu.create(x, w, n, d, 1, &cc, &e), KVQ_OK);
    assert_int_equal(kvq_km_backend_cuda.create(x, w, n, d, 1, &gc, &e), KVQ_OK);
    assert_int_equal(kvq_km_backend_cpu.assign(cc, cent, kc, ac, dc, &e), KVQ_OK);
    if (kvq_km_backend_cuda.assign(gc, cent, kc, ag, dg, &e) != KVQ_OK)
        fail_msg("cuda assign (n %lld d %d k %d): %s", (long long)n, d, kc, e.msg);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * d;
        assert_true(ag[i] >= 0 && ag[i] < kc);
        const double scale = norm2(xi, d) + norm2(cent + (size_t)ag[i] * d, d) + 1e-30;
        if (fabs((double)dg[i] - dc[i]) > DIST_RTOL * scale)
            fail_msg("point %lld: gpu distance %.9g, cpu %.9g", (long long)i, dg[i], dc[i]);
        if (ag[i] != ac[i]) {
            differ++;
            const double eg = l2sq(xi, cent + (size_t)ag[i] * d, d);
            const double ec = l2sq(xi, cent + (size_t)ac[i] * d, d);
            if (separable || fabs(eg - ec) > DIST_RTOL * scale)
                fail_msg("point %lld: gpu chose %d (%.9g), cpu %d (%.9g)", (long long)i, ag[i],
                         eg, ac[i], ec);
        }
    }
    if (differ)
        printf("  n %lld d %d k %d: %lld near-ties chosen differently\n", (long long)n, d, kc,
               (long long)differ);
    kvq_km_backend_cpu.destroy(cc);
    kvq_km_backend_cuda.destroy(gc);
    free(ac);
    free(ag);
    free(dc);
    free(dg);
}

static void test_kmeans_assign(void **state)
{
    (void)state;
    NEED_GPU();
    /* separable: blobs, centroids = the first point of each blob */
    {
        const int32_t nc = 64, d = 128;
        const int64_t per = 50, n = nc * per;
        float *x = planted(nc, per, d, 10.0f, 0.2f, 11);
        float *cent = malloc(sizeof(float) * nc * d);
        for (int32_t j = 0; j < nc; j++)
            memcpy(cent + (size_t)j * d, x + (size_t)j * per * d, sizeof(float) * d);
        check_assign(x, NULL, n, d, cent, nc, 1);
        free(cent);
        free(x);
    }
    /* random shapes: odd d, k = 1, k > n, and a k large enough that the distance block
     * (256 MiB / k rows) takes several passes over the points */
    static const struct { int64_t n; int32_t d, k; } sh[] = {
        {5000, 128, 256}, {777, 5, 33}, {300, 7, 1}, {64, 16, 100}, {3000, 8, 40000}};
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
        float *x = randn((size_t)sh[s].n * sh[s].d, 20 + s, 1.0f);
        float *c = randn((size_t)sh[s].k * sh[s].d, 40 + s, 1.0f);
        check_assign(x, NULL, sh[s].n, sh[s].d, c, sh[s].k, 0);
        free(x);
        free(c);
    }
}

/* ---- k-means: centroid update ------------------------------------------------------------- */

static void test_kmeans_update(void **state)
{
    (void)state;
    NEED_GPU();
    const int64_t n = 4000;
    const int32_t d = 96, k = 300;
    float *x = randn((size_t)n * d, 3, 2.0f);
    float *w = randn((size_t)n, 4, 1.0f);
    for (int64_t i = 0; i < n; i++)
        w[i] = fabsf(w[i]) + 0.1f;
    float *c0 = randn((size_t)k * d, 5, 2.0f);
    /* cluster k-1 far away: it gets no point, and its row must come back unchanged */
    for (int32_t t = 0; t < d; t++)
        c0[(size_t)(k - 1) * d + t] = 1e4f;
    for (int pass = 0; pass < 2; pass++) { /* pass 1: weights */
        const float *wp = pass ? w : NULL;
        void *cc = NULL, *gc = NULL;
        kvq_err e = {0};
        int32_t *a = malloc(sizeof(int32_t) * n), *ac = malloc(sizeof(int32_t) * n);
        float *cg = malloc(sizeof(float) * k * d), *ccpu = malloc(sizeof(float) * k * d);
        double wg[300], wc[300];
        int64_t ng[300], ncpu[300];
        memcpy(cg, c0, sizeof(float) * k * d);
        memcpy(ccpu, c0, sizeof(float) * k * d);
        assert_int_equal(kvq_km_backend_cuda.create(x, wp, n, d, 1, &gc, &e), KVQ_OK);
        assert_int_equal(kvq_km_backend_cpu.create(x, wp, n, d, 1, &cc, &e), KVQ_OK);
        assert_int_equal(kvq_km_backend_cuda.assign(gc, c0, k, a, NULL, &e), KVQ_OK);
        /* the CPU update runs on the GPU's assignment: the two updates see the same input */
        assert_int_equal(kvq_km_backend_cpu.assign(cc, c0, k, ac, NULL, &e), KVQ_OK);
        assert_int_equal(kvq_km_backend_cuda.update(gc, a, k, cg, wg, ng, &e), KVQ_OK);
        assert_int_equal(kvq_km_backend_cpu.update(cc, a, k, ccpu, wc, ncpu, &e), KVQ_OK);
        assert_int_equal(ng[k - 1], 0);
        for (int32_t j = 0; j < k; j++) {
            assert_int_equal(ng[j], ncpu[j]);
            if (fabs(wg[j] - wc[j]) > 1e-12 * (fabs(wc[j]) + 1))
                fail_msg("cluster %d: weight %.17g, cpu %.17g", j, wg[j], wc[j]);
            for (int32_t t = 0; t < d; t++) {
                const float g = cg[(size_t)j * d + t], c = ccpu[(size_t)j * d + t];
                if (fabsf(g - c) > UPDATE_RTOL * (fabsf(c) + 1e-3f))
                    fail_msg("cluster %d dim %d: gpu %.9g, cpu %.9g", j, t, g, c);
            }
        }
        kvq_km_backend_cpu.destroy(cc);
        kvq_km_backend_cuda.destroy(gc);
        free(a);
        free(ac);
        free(cg);
        free(ccpu);
    }
    free(x);
    free(w);
    free(c0);
}

/* ---- k-means: seeding through the CUDA backend -------------------------------------------- */

/* k-means|| runs its distance passes on the backend it is given: on separable blobs it
 * must pick one seed per blob with either backend, and reach the same potential. */
static void test_kmeans_seed(void **state)
{
    (void)state;
    NEED_GPU();
    const int32_t nc = 32, d = 64;
    const int64_t per = 100, n = nc * per;
    float *x = planted(nc, per, d, 10.0f, 0.1f, 7);
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = nc;
    p.init = KVQ_KMEANS_INIT_PARALLEL;
    kvq_km_data data = {.x = x, .w = NULL, .n = n, .d = d, .force_threads = 1};
    double pot[2];
    for (int b = 0; b < 2; b++) {
        const kvq_km_backend *be = b ? &kvq_km_backend_cuda : &kvq_km_backend_cpu;
        void *ctx = NULL;
        kvq_err e = {0};
        float *c = malloc(sizeof(float) * nc * d);
        assert_int_equal(be->create(x, NULL, n, d, 1, &ctx, &e), KVQ_OK);
        if (kvq_km_seed(&data, &p, be, ctx, c, &e) != KVQ_OK)
            fail_msg("seeding on %s: %s", be->name, e.msg);
        int hit[32] = {0};
        for (int32_t j = 0; j < nc; j++) { /* the blob of each seed: its nearest point's */
            int64_t best = 0;
            double bd = INFINITY;
            for (int64_t i = 0; i < n; i++) {
                const double dd = l2sq(x + (size_t)i * d, c + (size_t)j * d, d);
                if (dd < bd) {
                    bd = dd;
                    best = i;
                }
            }
            hit[best / per]++;
        }
        for (int32_t j = 0; j < nc; j++)
            if (hit[j] != 1)
                fail_msg("%s seeding: blob %d got %d seeds", be->name, j, hit[j]);
        pot[b] = kvq_km_potential_ref(&data, c, nc, 1);
        be->destroy(ctx);
        free(c);
    }
    if (fabs(pot[1] - pot[0]) > FIT_INERTIA_RTOL * pot[0])
        fail_msg("seeding potential: cuda %.9g, cpu %.9g", pot[1], pot[0]);
    free(x);
}

/* ---- k-means: the whole fit ----------------------------------------------------------------- */

static void fit(const float *x, int64_t n, int32_t d, int32_t k, kvq_kmeans_device dev,
                float *c, int32_t *a, kvq_kmeans_stats *s)
{
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = k;
    p.max_iters = 15;
    p.device = dev;
    kvq_err e = {0};
    memset(s, 0, sizeof *s);
    if (kvq_kmeans_fit(x, n, d, NULL, &p, c, a, s, &e) != KVQ_OK)
        fail_msg("fit on %s: %s", dev == KVQ_KMEANS_DEVICE_CUDA ? "cuda" : "cpu", e.msg);
    assert_int_equal(s->backend, dev);
}

static void test_kmeans_fit(void **state)
{
    (void)state;
    NEED_GPU();
    /* separable: the same assignment */
    {
        const int32_t nc = 40, d = 32;
        const int64_t per = 120, n = nc * per;
        float *x = planted(nc, per, d, 10.0f, 0.2f, 9);
        float *cc = malloc(sizeof(float) * nc * d), *cg = malloc(sizeof(float) * nc * d);
        int32_t *ac = malloc(sizeof(int32_t) * n), *ag = malloc(sizeof(int32_t) * n);
        kvq_kmeans_stats sc, sg;
        fit(x, n, d, nc, KVQ_KMEANS_DEVICE_CPU, cc, ac, &sc);
        fit(x, n, d, nc, KVQ_KMEANS_DEVICE_CUDA, cg, ag, &sg);
        assert_memory_equal(ac, ag, sizeof(int32_t) * n);
        kvq_kmeans_stats_free(&sc);
        kvq_kmeans_stats_free(&sg);
        free(x);
        free(cc);
        free(cg);
        free(ac);
        free(ag);
    }
    /* no structure (one Gaussian, head-shaped d): inertia within FIT_INERTIA_RTOL */
    {
        const int64_t n = 20000;
        const int32_t d = 128, k = 256;
        float *x = randn((size_t)n * d, 13, 1.0f);
        float *c = malloc(sizeof(float) * k * d);
        kvq_kmeans_stats sc, sg;
        fit(x, n, d, k, KVQ_KMEANS_DEVICE_CPU, c, NULL, &sc);
        fit(x, n, d, k, KVQ_KMEANS_DEVICE_CUDA, c, NULL, &sg);
        const double ic = sc.inertia[sc.n_iters - 1], ig = sg.inertia[sg.n_iters - 1];
        printf("  fit n %lld d %d k %d: inertia cpu %.9g, cuda %.9g\n", (long long)n, d, k, ic,
               ig);
        if (fabs(ig - ic) > FIT_INERTIA_RTOL * ic)
            fail_msg("inertia: cuda %.9g, cpu %.9g", ig, ic);
        kvq_kmeans_stats_free(&sc);
        kvq_kmeans_stats_free(&sg);
        free(x);
        free(c);
    }
}

/* ---- k-means: device-resident batched Lloyd ---------------------------------------------- */

/* The device seeding of every head against kvq_lb_seed_head_ref on the same strided
 * subsample: the same seeds, bit for bit. */
static void test_lloyd_batched_seed(void **state)
{
    (void)state;
    NEED_GPU();
    const int32_t h = 3, d = 40, k = 60;
    const int64_t n = 4000, m = 1500;
    float *x = randn((size_t)h * n * d, 31, 1.0f);
    float *cg = malloc(sizeof(float) * h * k * d), *cc = malloc(sizeof(float) * k * d);
    float *xs = malloc(sizeof(float) * m * d), *dmin = malloc(sizeof(float) * m);
    double *cs = malloc(sizeof(double) * kvq_lb_nchunks(m));
    int64_t *ig = malloc(sizeof(int64_t) * h * k), *ic = malloc(sizeof(int64_t) * k);
    kvq_err e = {0};
    if (kvq_km_cuda_seed_batched(x, h, n, d, k, m, 4321, cg, ig, &e) != KVQ_OK)
        fail_msg("cuda seeding: %s", e.msg);
    for (int32_t b = 0; b < h; b++) {
        for (int64_t q = 0; q < m; q++)
            memcpy(xs + q * d, x + ((size_t)b * n + kvq_lb_sub_index(q, m, n)) * d,
                   sizeof(float) * d);
        kvq_lb_seed_head_ref(xs, m, d, k, 4321, b, ic, cc, dmin, cs);
        for (int32_t s = 0; s < k; s++)
            if (ig[(size_t)b * k + s] != ic[s])
                fail_msg("head %d seed %d: cuda point %lld, cpu %lld", b, s,
                         (long long)ig[(size_t)b * k + s], (long long)ic[s]);
        assert_memory_equal(cg + (size_t)b * k * d, cc, sizeof(float) * k * d);
    }
    free(x);
    free(cg);
    free(cc);
    free(xs);
    free(dmin);
    free(cs);
    free(ig);
    free(ic);
}

/* The device repair (k_repair) against kvq_lb_repair_head_ref: heads with no empty
 * cluster, one, several, ties for the heaviest, and a tail of empties; the same bits. */
static void test_lloyd_batched_repair(void **state)
{
    (void)state;
    NEED_GPU();
    const int32_t h = 4, k = 50, d = 24;
    float *cg = randn((size_t)h * k * d, 41, 2.0f), *cc = malloc(sizeof(float) * h * k * d);
    double *wg = malloc(sizeof(double) * h * k), *ig = malloc(sizeof(double) * h * k);
    double *wc = malloc(sizeof(double) * h * k), *icc = malloc(sizeof(double) * h * k);
    int64_t rg[4], want[4];
    kvq_rng r;
    kvq_rng_seed(&r, 42);
    for (int32_t b = 0; b < h; b++)
        for (int32_t c = 0; c < k; c++) {
            const size_t g = (size_t)b * k + c;
            wg[g] = (double)(1 + kvq_rng_below(&r, 20));
            ig[g] = wg[g] * (0.5 + kvq_rng_uniform(&r));
            const int empty = b == 1 ? c == 7 : b == 2 ? c % 9 == 4 : b == 3 ? c >= 40 : 0;
            if (empty)
                wg[g] = ig[g] = 0.0;
        }
    wg[2 * k + 10] = wg[2 * k + 30] = 25.0; /* a tie for the heaviest: the lower index */
    memcpy(cc, cg, sizeof(float) * h * k * d);
    memcpy(wc, wg, sizeof(double) * h * k);
    memcpy(icc, ig, sizeof(double) * h * k);
    kvq_err e = {0};
    if (kvq_km_cuda_repair_batched(cg, h, k, d, wg, ig, 99, 3, rg, &e) != KVQ_OK)
        fail_msg("cuda repair: %s", e.msg);
    for (int32_t b = 0; b < h; b++)
        want[b] = kvq_lb_repair_head_ref(cc + (size_t)b * k * d, k, d, wc + (size_t)b * k,
                                         icc + (size_t)b * k, 99, b, 3);
    assert_memory_equal(rg, want, sizeof rg);
    assert_true(want[0] == 0 && want[1] == 1 && want[2] > 1 && want[3] == 10);
    assert_memory_equal(cg, cc, sizeof(float) * h * k * d);
    assert_memory_equal(wg, wc, sizeof(double) * h * k);
    assert_memory_equal(ig, icc, sizeof(double) * h * k);
    free(cg);
    free(cc);
    free(wg);
    free(ig);
    free(wc);
    free(icc);
}

/* One batched device fit of h heads [h, n, d]; checks what holds for any fit. */
static void lloyd_fit(const float *x, int32_t h, int64_t n, int32_t d, kvq_kmeans_params *p,
                      float *c, int32_t *a, kvq_lb_stats *s)
{
    kvq_err e = {0};
    if (kvq_km_cuda_fit_batched(x, h, n, d, p, c, a, s, &e) != KVQ_OK)
        fail_msg("batched fit (h %d n %lld d %d k %d): %s", h, (long long)n, d, p->k, e.msg);
    for (int32_t b = 0; b < h; b++) {
        const double *in = s->inertia + (size_t)b * p->max_iters;
        assert_true(s->n_iters[b] >= 1 && s->n_iters[b] <= p->max_iters);
        for (int32_t t = 1; t < s->n_iters[b]; t++) /* Lloyd never rises (float noise aside) */
            assert_true(in[t] <= in[t - 1] * (1 + LLOYD_INERTIA0_RTOL) + 1e-30);
        double ex = 0;
        for (int64_t i = 0; i < n; i++) {
            const int32_t j = a[(size_t)b * n + i];
            assert_true(j >= 0 && j < p->k);
            ex += l2sq(x + ((size_t)b * n + i) * d, c + ((size_t)b * p->k + j) * d, d);
        }
        if (fabs(s->inertia_final[b] - ex) > LLOYD_INERTIA0_RTOL * ex + 1e-30)
            fail_msg("head %d: final inertia %.9g, recomputed %.9g", b, s->inertia_final[b], ex);
    }
}

/* 1 if labels a and b [n] make the same partition (a bijection between their labels). */
static int same_partition(const int32_t *a, const int32_t *b, int64_t n, int32_t k)
{
    int32_t *ab = malloc(sizeof(int32_t) * k), *ba = malloc(sizeof(int32_t) * k);
    int ok = 1;
    for (int32_t j = 0; j < k; j++)
        ab[j] = ba[j] = -1;
    for (int64_t i = 0; i < n && ok; i++) {
        if (ab[a[i]] < 0 && ba[b[i]] < 0) {
            ab[a[i]] = b[i];
            ba[b[i]] = a[i];
        }
        ok = ab[a[i]] == b[i] && ba[b[i]] == a[i];
    }
    free(ab);
    free(ba);
    return ok;
}

/* The batched fit against the CPU fit, head by head: planted blobs give the same partition
 * and repeat bit for bit; Gaussian heads end within LLOYD_FIT_INERTIA_RTOL; from the same
 * given centroids the first inertia agrees within LLOYD_INERTIA0_RTOL. */
static void test_lloyd_batched_fit(void **state)
{
    (void)state;
    NEED_GPU();
    for (int shape = 0; shape < 3; shape++) {
        const int32_t h = shape == 0 ? 3 : 2, d = shape == 0 ? 64 : 128;
        const int32_t k = shape == 0 ? 24 : shape == 1 ? 256 : 64;
        const int64_t n = shape == 0 ? 24 * 50 : shape == 1 ? 20000 : 5000;
        float *x = malloc(sizeof(float) * h * n * d);
        for (int32_t b = 0; b < h; b++) {
            float *xb = shape == 0 ? planted(k, n / k, d, 10.0f, 0.2f, 60 + b)
                                   : randn((size_t)n * d, 70 + b, 1.0f);
            memcpy(x + (size_t)b * n * d, xb, sizeof(float) * n * d);
            free(xb);
        }
        kvq_kmeans_params p = kvq_kmeans_params_default();
        p.k = k;
        p.max_iters = 15;
        if (shape == 2) {
            p.init = KVQ_KMEANS_INIT_GIVEN;
            p.max_iters = 5;
            p.tol = 0;
        }
        float *cg = randn((size_t)h * k * d, 80, 1.0f), *cc = malloc(sizeof(float) * k * d);
        int32_t *ag = malloc(sizeof(int32_t) * h * n), *ac = malloc(sizeof(int32_t) * n);
        kvq_lb_stats sg;
        lloyd_fit(x, h, n, d, &p, cg, ag, &sg);
        for (int32_t b = 0; b < h; b++) {
            kvq_kmeans_stats sc;
            kvq_err e = {0};
            kvq_kmeans_params pc = p;
            pc.device = KVQ_KMEANS_DEVICE_CPU;
            if (shape == 2) {
                float *c0 = randn((size_t)h * k * d, 80, 1.0f);
                memcpy(cc, c0 + (size_t)b * k * d, sizeof(float) * k * d);
                free(c0);
            }
            if (kvq_kmeans_fit(x + (size_t)b * n * d, n, d, NULL, &pc, cc, ac, &sc, &e) != KVQ_OK)
                fail_msg("cpu fit: %s", e.msg);
            const double ic = sc.inertia[sc.n_iters - 1];
            const double ig = sg.inertia[(size_t)b * p.max_iters + sg.n_iters[b] - 1];
            printf("  batched fit shape %d head %d: inertia cpu %.9g (%d it), cuda %.9g (%d it)\n",
                   shape, b, ic, sc.n_iters, ig, sg.n_iters[b]);
            if (shape == 0 && !same_partition(ag + (size_t)b * n, ac, n, k))
                fail_msg("head %d: the planted blobs were split differently", b);
            if (shape == 2 && fabs(sg.inertia[(size_t)b * p.max_iters] - sc.inertia[0]) >
                                  LLOYD_INERTIA0_RTOL * sc.inertia[0])
                fail_msg("head %d: first inertia cuda %.9g, cpu %.9g", b,
                         sg.inertia[(size_t)b * p.max_iters], sc.inertia[0]);
            if (fabs(ig - ic) > LLOYD_FIT_INERTIA_RTOL * ic)
                fail_msg("head %d: inertia cuda %.9g, cpu %.9g", b, ig, ic);
            kvq_kmeans_stats_free(&sc);
        }
        if (shape == 0) { /* run to run: the same bits */
            float *c2 = malloc(sizeof(float) * h * k * d);
            kvq_lb_stats s2;
            lloyd_fit(x, h, n, d, &p, c2, ag, &s2);
            assert_memory_equal(c2, cg, sizeof(float) * h * k * d);
            kvq_lb_stats_free(&s2);
            free(c2);
        }
        kvq_lb_stats_free(&sg);
        free(x);
        free(cg);
        free(cc);
        free(ag);
        free(ac);
    }
}

/* ---- moments: the batched Cholesky ------------------------------------------------------------ */

static void test_cholesky_batched(void **state)
{
    (void)state;
    NEED_GPU();
    const int nb = 9, d = 64;
    const size_t dd = (size_t)d * d;
    double *A = malloc(sizeof(double) * dd * nb), *Lg = malloc(sizeof(double) * dd * nb);
    double *Lc = malloc(sizeof(double) * dd);
    int info[9];
    for (int b = 0; b < nb; b++) { /* A = B B^T / d + 1e-3 I: SPD, cond about 1e3-1e4 */
        float *B = randn(dd, 100 + b, 1.0f);
        double *Ab = A + b * dd;
        for (int i = 0; i < d; i++)
            for (int j = 0; j < d; j++) {
                double s = 0;
                for (int t = 0; t < d; t++)
                    s += (double)B[i * d + t] * B[j * d + t];
                Ab[i * d + j] = s / d + (i == j ? 1e-3 : 0);
            }
        free(B);
    }
    /* head 4 is not positive definite (one negative diagonal entry) */
    A[4 * dd + 10 * d + 10] = -1.0;
    kvq_err e = {0};
    if (kvq_moments_cuda_potrf_batched(A, nb, d, Lg, info, &e) != KVQ_OK)
        fail_msg("batched potrf: %s", e.msg);
    for (int b = 0; b < nb; b++) {
        const int rc = kvq_chol_potrf(A + b * dd, d, 0.0, Lc);
        if (b == 4) {
            assert_true(rc > 0);
            assert_true(info[b] > 0);
            continue;
        }
        assert_int_equal(rc, 0);
        assert_int_equal(info[b], 0);
        double mx = 0;
        for (size_t i = 0; i < dd; i++)
            mx = fmax(mx, fabs(Lc[i]));
        for (int i = 0; i < d; i++)
            for (int j = 0; j < d; j++) {
                const double g = Lg[b * dd + (size_t)i * d + j], c = Lc[(size_t)i * d + j];
                if (j > i)
                    assert_true(g == 0.0);
                else if (fabs(g - c) > CHOL_RTOL * mx)
                    fail_msg("head %d L[%d][%d]: gpu %.17g, cpu %.17g", b, i, j, g, c);
            }
    }
    free(A);
    free(Lg);
    free(Lc);
}

/* ---- retrieval: LUT, score gather, top-k ------------------------------------------------------- */

/* References computed here: the LUT entry in double from the same f16 table (within
 * KVQ_RK_TOL_DOT of its magnitude), the scores by kvq_rk_score_one on the GPU's own LUT
 * (exact: the same float sum in the same order), the selection by the CPU's scalar
 * kvq_rk_topk on the GPU's own scores (exact: the same rule). */
static void check_select(kvq_rt_cuda *c, int32_t G, int32_t dg, int32_t K, int64_t cap,
                         int64_t first, int64_t nc, int64_t k, uint64_t seed)
{
    const int32_t d = G * dg;
    kvq_err e = {0};
    float *tf = randn((size_t)G * dg * K, seed, 1.0f);
    uint16_t *table = malloc(sizeof(uint16_t) * G * dg * K);
    kvq_f32_to_f16(tf, table, (size_t)G * dg * K);
    float *q = randn((size_t)d, seed + 1, 1.0f);
    uint16_t *codes = malloc(sizeof(uint16_t) * cap * G);
    kvq_rng r;
    kvq_rng_seed(&r, seed + 2);
    for (int64_t i = 0; i < cap * G; i++) /* few distinct codes at G = 1: many tied scores */
        codes[i] = (uint16_t)kvq_rng_below(&r, (uint64_t)K);
    assert_int_equal(kvq_rt_cuda_set_table(c, 0, 0, table, G, dg, K, &e), KVQ_OK);
    /* codes in two pieces: the mirror grows and keeps the first rows */
    assert_int_equal(kvq_rt_cuda_put_codes(c, 0, 0, codes, 0, cap / 2, cap / 2, &e), KVQ_OK);
    assert_int_equal(kvq_rt_cuda_put_codes(c, 0, 0, codes, cap / 2, cap - cap / 2, cap, &e),
                     KVQ_OK);
    int32_t *sel = malloc(sizeof(int32_t) * k), *want = malloc(sizeof(int32_t) * nc);
    float *lut = malloc(sizeof(float) * G * K), *sc = malloc(sizeof(float) * nc);
    uint32_t *work = malloc(sizeof(uint32_t) * 2 * nc);
    if (kvq_rt_cuda_select(c, 0, 0, 0, q, first, nc, k, sel, &e) != KVQ_OK)
        fail_msg("select: %s", e.msg);
    assert_int_equal(kvq_rt_cuda_peek(c, 0, lut, (int64_t)G * K, sc, nc, &e), KVQ_OK);
    for (int32_t g = 0; g < G; g++)
        for (int32_t cI = 0; cI < K; cI++) {
            double s = 0, mag = 0;
            for (int32_t t = 0; t < dg; t++) {
                const double wv = kvq_f16_to_f32_ref(table[((size_t)g * dg + t) * K + cI]);
                s += (double)q[g * dg + t] * wv;
                mag += fabs((double)q[g * dg + t] * wv);
            }
            if (fabs(lut[(size_t)g * K + cI] - s) > KVQ_RK_TOL_DOT * mag + 1e-30)
                fail_msg("LUT g %d c %d: gpu %.9g, ref %.9g", g, cI, lut[(size_t)g * K + cI], s);
        }
    for (int64_t j = 0; j < nc; j++) {
        const float ref = kvq_rk_score_one(lut, G, K, codes + (size_t)(first + j) * G);
        if (memcmp(&ref, &sc[j], sizeof ref))
            fail_msg("score %lld: gpu %.9g, ref %.9g", (long long)j, sc[j], ref);
    }
    assert_int_equal(kvq_rk_topk(KVQ_ISA_SCALAR, sc, nc, k, want, work), k);
    for (int64_t j = 0; j < k; j++)
        if (sel[j] != (int32_t)(first + want[j]))
            fail_msg("selection %lld of %lld: gpu %d, cpu %lld", (long long)j, (long long)k,
                     sel[j], (long long)(first + want[j]));
    free(tf);
    free(table);
    free(q);
    free(codes);
    free(sel);
    free(want);
    free(lut);
    free(sc);
    free(work);
}

static void test_retrieval_select(void **state)
{
    (void)state;
    NEED_GPU();
    static const struct { int32_t G, dg, K; int64_t cap, first, nc, k; } sh[] = {
        {1, 64, 256, 1000, 4, 900, 100},          /* G 1: many ties */
        {4, 32, 1024, 20000, 128, 19000, 2048},   /* head dim 128 */
        {2, 64, 4096, 131072, 4, 131000, 4096},   /* 128K candidates, K 4096 */
        {8, 16, 16, 5000, 0, 5000, 4999},         /* k = nc - 1 */
        {1, 8, 65536, 3000, 1, 2999, 1},          /* the largest K, k 1 */
    };
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
        kvq_rt_cuda *c = NULL;
        kvq_err e = {0};
        assert_int_equal(kvq_rt_cuda_create(1, 1, 1, &c, &e), KVQ_OK);
        check_select(c, sh[s].G, sh[s].dg, sh[s].K, sh[s].cap, sh[s].first, sh[s].nc, sh[s].k,
                     500 + s);
        kvq_rt_cuda_free(c);
    }
}

/* The top-k kernel on scores given directly: ties, signed zeros, sorted input, sizes
 * around the block's 256 threads; against the CPU's scalar kvq_rk_topk. */
static void test_retrieval_topk(void **state)
{
    (void)state;
    NEED_GPU();
    static const int64_t ns[] = {2, 5, 255, 256, 257, 1000, 16384, 200003};
    kvq_rt_cuda *c = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_rt_cuda_create(1, 1, 1, &c, &e), KVQ_OK);
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
        const int64_t n = ns[ni];
        int32_t *got = malloc(sizeof(int32_t) * n), *want = malloc(sizeof(int32_t) * n);
        uint32_t *work = malloc(sizeof(uint32_t) * 2 * n);
        for (int mode = 0; mode < 4; mode++) {
            float *s = randn((size_t)n, 60 + ni * 4 + mode, 10.0f);
            for (int64_t j = 0; j < n; j++) {
                if (mode == 1)
                    s[j] = roundf(s[j]); /* many ties */
                if (mode == 2)
                    s[j] = j % 2 ? 0.0f : -0.0f; /* all equal, signed zeros */
                if (mode == 3)
                    s[j] = (float)j; /* increasing */
            }
            const int64_t ks[] = {1, n / 3 > 0 ? n / 3 : 1, n - 1};
            for (int ki = 0; ki < 3; ki++) {
                const int64_t k = ks[ki];
                if (k < 1 || k >= n)
                    continue;
                if (kvq_rt_cuda_topk(c, 0, s, n, k, 7, got, &e) != KVQ_OK)
                    fail_msg("top-k n %lld k %lld: %s", (long long)n, (long long)k, e.msg);
                assert_int_equal(kvq_rk_topk(KVQ_ISA_SCALAR, s, n, k, want, work), k);
                for (int64_t j = 0; j < k; j++)
                    if (got[j] != want[j] + 7)
                        fail_msg("n %lld k %lld mode %d: index %lld is %d, cpu %d", (long long)n,
                                 (long long)k, mode, (long long)j, got[j], want[j] + 7);
            }
            free(s);
        }
        free(got);
        free(want);
        free(work);
    }
    kvq_rt_cuda_free(c);
}

int main(void)
{
    const char *why = NULL;
    printf("test_cuda_paths: %s\n",
           kvq_cuda_available(&why) ? "a CUDA device is present: every case runs" : why);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kmeans_assign),    cmocka_unit_test(test_kmeans_update),
        cmocka_unit_test(test_kmeans_seed),      cmocka_unit_test(test_kmeans_fit),
        cmocka_unit_test(test_cholesky_batched), cmocka_unit_test(test_retrieval_select),
        cmocka_unit_test(test_retrieval_topk),   cmocka_unit_test(test_lloyd_batched_seed),
        cmocka_unit_test(test_lloyd_batched_repair), cmocka_unit_test(test_lloyd_batched_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
