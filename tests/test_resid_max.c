/*
 * test_resid_max.c — kvq_rk_resid_scores_max (runtime/kernels/resid.c,
 * kernels_resid_avx512.c), the residual stage by the best head of a GQA group
 * (--resid-group max): one pass over the candidates' records for all the heads.
 *
 * Against two independent references: (1) what rerank_resid.c computed before it, gs
 * calls of kvq_rk_resid_scores (one per head, its own sign table and first-stage
 * scores) and the running maximum (a later head replaces only when strictly greater),
 * which must give the same bits on every ISA; (2) the maximum over the heads of
 * first + scale (q_h . signs) summed in double from the packed bits (channel c = byte
 * c / 8, bit c % 8), within float rounding. Group sizes 1 to 9 (blocks of four heads and
 * their remainders), records of 1 to 32 bytes (d 8 .. 128 at 1 bit, d 128 as two sign
 * planes), candidates gathered out of order and repeated, tails shorter than a vector,
 * first-stage scores per candidate or through each candidate's group index into the
 * heads' tables; and candidates in runs of consecutive records with their groups in runs,
 * as a selection over rows in code order hands them over (the AVX-512 path's block loads
 * of 16 consecutive records and broadcast of one group's entries). Fails with a head's
 * table or first score taken from another head, the scale of another record, a lost
 * byte, the sum instead of the maximum, a fast path that sums in another order, or a
 * block load that takes the wrong dwords or a run for consecutive rows that are not.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/util.h"
#include "runtime/kernels/rk.h"

static const kvq_isa isas[] = {KVQ_ISA_SCALAR, KVQ_ISA_AVX2, KVQ_ISA_AVX512};

/* One case: gs heads, records of nb8 bytes, n candidates over ntok records; grp: the
 * first-stage scores through group indices into [gs, ng] tables, else [gs, n]. */
static void run_case(kvq_rng *rng, int32_t gs, int32_t nb8, int64_t n, int use_grp, int runs)
{
    const int32_t d = 8 * nb8, ntok = 301 + (int32_t)n, ng = 97;
    const size_t tl = KVQ_RK_SIGN_TABLE_LEN(d);
    const size_t fs = use_grp ? (size_t)ng : (size_t)n;
    float *q = malloc(sizeof(float) * (size_t)gs * d), *tab = malloc(sizeof(float) * gs * tl);
    uint8_t *bits = malloc((size_t)ntok * nb8);
    float *scale = malloc(sizeof(float) * ntok), *first = malloc(sizeof(float) * gs * fs);
    float *fa = malloc(sizeof(float) * (size_t)n), *o = malloc(sizeof(float) * (size_t)n);
    float *want = malloc(sizeof(float) * (size_t)n), *got = malloc(sizeof(float) * (size_t)n);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n), *grp = malloc(sizeof(int32_t) * (size_t)n);
    assert_true(q && tab && bits && scale && first && fa && o && want && got && tok && grp);
    for (int32_t i = 0; i < gs * d; i++)
        q[i] = (float)kvq_rng_normal(rng);
    if (gs > 2) /* two heads alike: ties between heads resolved to the first */
        memcpy(q + 2 * d, q, sizeof(float) * (size_t)d);
    for (int64_t i = 0; i < (int64_t)ntok * nb8; i++)
        bits[i] = (uint8_t)kvq_rng_below(rng, 256);
    for (int t = 0; t < ntok; t++)
        scale[t] = (float)(0.1 + kvq_rng_uniform(rng));
    for (size_t i = 0; i < (size_t)gs * fs; i++)
        first[i] = (float)(3.0 * kvq_rng_normal(rng));
    if (gs > 2)
        memcpy(first + 2 * fs, first, sizeof(float) * fs);
    for (int64_t a = 0; a < n; a++) {
        tok[a] = (int32_t)kvq_rng_below(rng, ntok);
        grp[a] = (int32_t)kvq_rng_below(rng, (uint64_t)ng);
    }
    /* runs: the candidates as a selection of rows in code order gives them, consecutive
     * rows (a jump now and then) whose groups hold for runs of 1 to 40 rows */
    /* runs 2: every candidate, as the stage over every candidate hands them over (one
     * stretch of consecutive rows: the kernel's blocks of 4 x 16 records) */
    for (int64_t a = 0, t = (int64_t)kvq_rng_below(rng, 50), left = 0; runs && a < n; a++) {
        t += runs == 2 || kvq_rng_below(rng, 48) ? 1 : 1 + (int64_t)kvq_rng_below(rng, 5);
        tok[a] = (int32_t)(t % ntok);
        if (left-- <= 0) {
            left = (int64_t)kvq_rng_below(rng, 40);
            grp[a] = (int32_t)kvq_rng_below(rng, (uint64_t)ng);
        } else
            grp[a] = grp[a - 1];
    }
    for (int32_t h = 0; h < gs; h++)
        kvq_rk_sign_table(q + (size_t)h * d, d, tab + (size_t)h * tl);
    /* (1) gs passes of kvq_rk_resid_scores (scalar) and the running maximum */
    for (int32_t h = 0; h < gs; h++) {
        for (int64_t a = 0; a < n; a++)
            fa[a] = first[(size_t)h * fs + (size_t)(use_grp ? grp[a] : a)];
        kvq_rk_resid_scores(KVQ_ISA_SCALAR, tab + (size_t)h * tl, nb8, bits, scale, tok, fa, n, o);
        for (int64_t a = 0; a < n; a++)
            want[a] = h == 0 || o[a] > want[a] ? o[a] : want[a];
    }
    for (int ii = 0; ii < 3; ii++) {
        memset(got, 0xff, sizeof(float) * (size_t)n);
        kvq_rk_resid_scores_max(isas[ii], tab, gs, nb8, bits, scale, tok, first, fs,
                                use_grp ? grp : NULL, n, got);
        if (memcmp(got, want, sizeof(float) * (size_t)n)) {
            int64_t at = 0;
            while (memcmp(&got[at], &want[at], sizeof(float)) == 0)
                at++;
            fail_msg("isa %d gs %d nb8 %d n %lld grp %d runs %d: candidate %lld %.9g, want %.9g",
                     (int)isas[ii], (int)gs, (int)nb8, (long long)n, use_grp, runs, (long long)at,
                     (double)got[at], (double)want[at]);
        }
    }
    /* (2) in double from the bits */
    for (int64_t a = 0; a < n; a++) {
        double best = 0, tol = 0;
        for (int32_t h = 0; h < gs; h++) {
            const float *qh = q + (size_t)h * d;
            double dot = 0, mag = 0;
            for (int32_t c = 0; c < d; c++) {
                const int set = bits[(size_t)tok[a] * nb8 + c / 8] >> (c % 8) & 1;
                dot += set ? qh[c] : -(double)qh[c];
                mag += fabs((double)qh[c]);
            }
            const double f = first[(size_t)h * fs + (size_t)(use_grp ? grp[a] : a)];
            const double v = f + (double)scale[tok[a]] * dot;
            best = h == 0 || v > best ? v : best;
            const double th = 1e-6 * (fabs(f) + scale[tok[a]] * mag);
            tol = th > tol ? th : tol;
        }
        assert_true(fabs(got[a] - best) <= tol);
    }
    free(q);
    free(tab);
    free(bits);
    free(scale);
    free(first);
    free(fa);
    free(o);
    free(want);
    free(got);
    free(tok);
    free(grp);
}

static void test_resid_max_kernel(void **state)
{
    (void)state;
    kvq_rng rng;
    kvq_rng_seed(&rng, 2026);
    static const int32_t gss[] = {1, 2, 3, 4, 5, 8, 9};
    static const int32_t nb8s[] = {1, 3, 8, 16, 32}; /* d 8, 24, 64, 128; 2 x 128 planes */
    static const int64_t ns[] = {1, 15, 16, 237, 1000};
    for (size_t gi = 0; gi < sizeof gss / sizeof gss[0]; gi++)
        for (size_t bi = 0; bi < sizeof nb8s / sizeof nb8s[0]; bi++)
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                for (int ug = 0; ug < 2; ug++)
                    for (int runs = 0; runs < 3; runs++)
                        run_case(&rng, gss[gi], nb8s[bi], ns[ni], ug, runs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resid_max_kernel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
