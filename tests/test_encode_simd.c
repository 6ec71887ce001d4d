/* test_encode_simd.c — kvq_codebook_encode's AVX2 kernels (codebook/encode_avx2.c)
 * equal the scalar rule bit for bit: k L in double (summed from the diagonal down, what
 * lies above the diagonal never read into a sum: filled with garbage here), and the
 * nearest centroid by the expanded-form distance with the first minimum (duplicated
 * centroids, centroid counts that are not a multiple of 8, overflowing keys). Skipped
 * on a CPU without AVX2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codebook/encode_simd.h"
#include "helpers/testutil.h"
#include "codebook/nearest.h"
#include "kvq/common.h"
#include "kvq/util.h"

static void fill(float *x, size_t n, uint64_t seed, double scale)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(scale * kvq_rng_normal(&r));
}

/* The scalar rule (codebook.c's mul_lower and nearest, written from their definition). */
static void ref_mul_lower(const float *k, const float *L, int32_t d, float *z)
{
    for (int32_t b = 0; b < d; b++) {
        double s = 0;
        for (int32_t a = b; a < d; a++)
            s += (double)k[a] * L[(size_t)a * d + b];
        z[b] = (float)s;
    }
}

static int32_t ref_nearest(const float *x, const float *W, const float *cn, int32_t K, int32_t dg)
{
    float best = INFINITY;
    int32_t bi = INT32_MAX;
    const float xn = kvq_km_norm2(x, dg);
    for (int32_t c = 0; c < K; c++) {
        const float v = kvq_km_dist_from_dot(xn, cn[c], kvq_km_dot(x, W + (size_t)c * dg, dg));
        if (kvq_km_better(v, c, best, bi)) {
            best = v;
            bi = c;
        }
    }
    return bi == INT32_MAX ? 0 : bi;
}

static void test_mul_lower(void **state)
{
    (void)state;
    if (!kvq_cpu_has_avx2())
        TEST_SKIP("no AVX2 on this CPU");
    static const int32_t ds[] = {8, 24, 64, 66, 128};
    for (size_t di = 0; di < sizeof ds / sizeof *ds; di++) {
        const int32_t d = ds[di];
        float *L = malloc(sizeof *L * d * d), *k = malloc(sizeof *k * d);
        float *z = malloc(sizeof *z * d), *w = malloc(sizeof *w * d);
        double *Ld = malloc(sizeof *Ld * d * d);
        fill(L, (size_t)d * d, 11 + di, 1.0); /* above the diagonal: garbage */
        for (int rep = 0; rep < 50; rep++) {
            fill(k, (size_t)d, 100 * di + rep, rep % 2 ? 1e3 : 1.0);
            if (rep == 7)
                memset(k, 0, sizeof *k * d); /* zero sums: +0 */
            if (rep == 9) /* cancellation: only the order of the sum gives its value */
                for (int32_t b = 0; b + 2 < d; b++) {
                    L[(size_t)(b + 1) * d + b] = 1e20f;
                    L[(size_t)(b + 2) * d + b] = -1e20f;
                    k[b + 1] = k[b + 2] = 1.0f;
                }
            ref_mul_lower(k, L, d, w);
            /* from L in double, +0 above the diagonal (codebook.c's cb->Ld) */
            for (int32_t a = 0; a < d; a++)
                for (int32_t b = 0; b < d; b++)
                    Ld[(size_t)a * d + b] = b <= a ? (double)L[(size_t)a * d + b] : 0.0;
            kvq_cb_mul_lower_d_avx2(k, Ld, d, z);
            assert_memory_equal(z, w, sizeof *z * d);
        }
        free(Ld);
        free(L);
        free(k);
        free(z);
        free(w);
    }
}

static void test_nearest(void **state)
{
    (void)state;
    if (!kvq_cpu_has_avx2())
        TEST_SKIP("no AVX2 on this CPU");
    static const int32_t Ks[] = {1, 7, 8, 13, 64, 256, 259};
    static const int32_t dgs[] = {24, 64, 128};
    int64_t nonzero = 0;
    for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
        for (size_t di = 0; di < sizeof dgs / sizeof *dgs; di++) {
            const int32_t K = Ks[ki], dg = dgs[di];
            float *W = malloc(sizeof *W * K * dg), *cn = malloc(sizeof *cn * K);
            float *xs = malloc(sizeof *xs * 40 * dg), *xn = malloc(sizeof *xn * 40);
            int32_t want_all[40], got_all[40];
            fill(W, (size_t)K * dg, 7 + ki * 5 + di, 1.0);
            for (int32_t c = 1; c < K; c += 3) /* duplicates: ties to the lower index */
                memcpy(W + (size_t)c * dg, W + (size_t)(c - 1) * dg, sizeof *W * dg);
            for (int32_t c = 2; c < K; c += 3) { /* near duplicates: rounding decides */
                memcpy(W + (size_t)c * dg, W + (size_t)(c - 1) * dg, sizeof *W * dg);
                for (int32_t t = c % dg; t < dg; t += 5)
                    W[(size_t)c * dg + t] = nextafterf(W[(size_t)c * dg + t], 10.0f);
            }
            for (int32_t c = 0; c < K; c++)
                cn[c] = kvq_km_norm2(W + (size_t)c * dg, dg);
            for (int rep = 0; rep < 40; rep++) {
                float *x = xs + (size_t)rep * dg;
                if (rep % 4 == 0) /* a centroid itself, or near one */
                    memcpy(x, W + (size_t)(rep * 7 % K) * dg, sizeof *x * dg);
                else if (rep % 4 == 2) { /* between a near-duplicate pair */
                    const int32_t c = K > 2 ? 1 + 3 * (rep % (K / 3 > 0 ? K / 3 : 1)) : 0;
                    for (int32_t t = 0; t < dg; t++)
                        x[t] = W[(size_t)c * dg + t] * (1.0f + 1e-7f * (float)(t % 3));
                } else
                    fill(x, (size_t)dg, 1000 + (uint64_t)rep, rep == 5 ? 1e25 : 1.0);
                const int32_t want = ref_nearest(x, W, cn, K, dg);
                const int32_t got = kvq_cb_nearest_avx2(x, kvq_km_norm2(x, dg), W, cn, K, dg);
                if (got != want)
                    fail_msg("K %d dg %d rep %d: %d, reference %d", K, dg, rep, got, want);
                nonzero += want != 0;
                want_all[rep] = want;
                xn[rep] = kvq_km_norm2(x, dg);
            }
            /* the tiled kernel: the 40 keys in tiles of every size up to KVQ_CB_TILE, each
             * key's result that of the scalar rule */
            for (int32_t tn = 1; tn <= KVQ_CB_TILE; tn++) {
                for (int32_t i = 0; i < 40; i++)
                    got_all[i] = -1;
                for (int32_t i0 = 0; i0 < 40; i0 += tn) {
                    const int32_t n = 40 - i0 < tn ? 40 - i0 : tn;
                    kvq_cb_nearest_tile_avx2(xs + (size_t)i0 * dg, dg, xn + i0, n, W, cn, K, dg,
                                             got_all + i0, 1);
                }
                for (int32_t i = 0; i < 40; i++)
                    if (got_all[i] != want_all[i])
                        fail_msg("tile %d: K %d dg %d key %d: %d, reference %d", tn, K, dg, i,
                                 got_all[i], want_all[i]);
            }
            free(W);
            free(cn);
            free(xs);
            free(xn);
        }
    assert_true(nonzero > 100); /* the cases pick many centroids, not only the first */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mul_lower),
        cmocka_unit_test(test_nearest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
