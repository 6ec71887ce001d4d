/*
 * test_topk_bands.c — kvq_rk_topk_bands (runtime/kernels/topk_bands.c), the selection of
 * --score-pos bands on rows in code order, against the scalar path it replaces: every
 * row's score written from its band's LUT (the band found by a linear scan of the
 * thresholds, row by row), then kvq_rk_topk over the scores. Randomized runs, tails,
 * band thresholds and LUTs (distinct values, a few values shared across codes and
 * bands so that the group at the threshold is taken in part, signed zeros, codes that
 * never occur); the selection must be the same indices, and the scored variant
 * (kvq_rk_topk_bands_scored, the residual stage's first-stage scores) must give each
 * selected row the score of its band from that scan, bit for bit: every row's when
 * k >= the rows, those at a band's first token included; and the grouped variant
 * (kvq_rk_topk_bands_grouped, the per-head residual stage's index into its heads' band
 * LUTs) each row's group b K + code, b from that scan; and kvq_rk_bands_groups (every
 * row's group without a selection, the per-head stage over every candidate) the same
 * groups for every row, without reading the LUTs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/util.h"
#include "runtime/kernels/rk.h"

/* One randomized case: n rows in code order (a stable sort of random codes over
 * tokens [0, n)), nu rows in token order after them (tokens n + gap ...), nb bands with
 * random non-increasing thresholds over the tokens. Returns 0 when the selections of
 * every k agree. */
static int run_case(uint64_t seed, int64_t n, int64_t nu, int32_t K, int32_t nb, int lutmode)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    const int64_t total = n + nu, gap = (int64_t)kvq_rng_below(&r, 5), utok0 = n + gap;
    const int64_t ntok = utok0 + nu;
    uint16_t *code = malloc(sizeof *code * (size_t)(total + 1)); /* by token (tail after) */
    uint32_t *cnt = calloc((size_t)K, sizeof *cnt), *pos = calloc((size_t)K, sizeof *pos);
    int32_t *tok = malloc(sizeof *tok * (size_t)(n + 1));
    uint16_t *rcode = malloc(sizeof *rcode * (size_t)(total + 1)); /* by row */
    int32_t *rtok = malloc(sizeof *rtok * (size_t)(total + 1));
    float *lut = malloc(sizeof *lut * (size_t)nb * K), *sc = malloc(sizeof *sc * (size_t)(total + 1));
    int64_t *tb = malloc(sizeof *tb * (size_t)nb);
    int32_t *want = malloc(sizeof *want * (size_t)(total + 1));
    int32_t *got = malloc(sizeof *got * (size_t)(total + 1));
    int32_t *got2 = malloc(sizeof *got2 * (size_t)(total + 1));
    float *val = malloc(sizeof *val * (size_t)(total + 1));
    int32_t *grp = malloc(sizeof *grp * (size_t)(total + 1));
    int32_t *wgrp = malloc(sizeof *wgrp * (size_t)(total + 1));
    uint32_t *work = malloc(sizeof *work * (size_t)(2 * total + 2));
    uint32_t *bwork = malloc(sizeof *bwork * ((size_t)3 * nb * K));
    int bad = 0;
    /* codes (mode 3: only even codes occur) */
    for (int64_t t = 0; t < total; t++) {
        uint64_t c = kvq_rng_below(&r, (uint64_t)K);
        if (lutmode == 3)
            c &= ~(uint64_t)1;
        code[t] = (uint16_t)c;
    }
    for (int64_t t = 0; t < n; t++)
        cnt[code[t]]++;
    for (int32_t c = 0, acc = 0; c < K; c++) {
        pos[c] = (uint32_t)acc;
        acc += (int32_t)cnt[c];
    }
    for (int64_t t = 0; t < n; t++) { /* stable: rows of one code in token order */
        const uint32_t row = pos[code[t]]++;
        tok[row] = (int32_t)t;
        rcode[row] = code[t];
        rtok[row] = (int32_t)t;
    }
    for (int64_t i = 0; i < nu; i++) {
        rcode[n + i] = code[n + i];
        rtok[n + i] = (int32_t)(utok0 + i);
    }
    /* thresholds: non-increasing, anywhere in [0, ntok] (some bands empty, some equal) */
    for (int32_t b = 0; b + 1 < nb; b++)
        tb[b] = (int64_t)kvq_rng_below(&r, (uint64_t)ntok + 1);
    for (int32_t b = 0; b + 1 < nb; b++) /* sort descending */
        for (int32_t e = b + 1; e + 1 < nb; e++)
            if (tb[e] > tb[b]) {
                const int64_t x = tb[b];
                tb[b] = tb[e];
                tb[e] = x;
            }
    for (size_t i = 0; i < (size_t)nb * K; i++) {
        const double u = kvq_rng_normal(&r);
        lut[i] = lutmode == 1   ? (float)(kvq_rng_below(&r, 4))
                 : lutmode == 2 ? (i % 3 ? (i % 2 ? 0.0f : -0.0f) : 1.0f)
                                : (float)u;
    }
    if (lutmode == 4) /* bands alike, as rotations of one query are: most codes pruned */
        for (size_t i = (size_t)K; i < (size_t)nb * K; i++)
            lut[i] = lut[i % (size_t)K] + 0.05f * lut[i];
    /* the scores the scalar path writes: band by a linear scan, row by row */
    for (int64_t j = 0; j < total; j++) {
        int32_t b = 0;
        while (b + 1 < nb && rtok[j] < tb[b])
            b++;
        sc[j] = lut[(size_t)b * K + rcode[j]];
        wgrp[j] = b * K + rcode[j];
    }
    const kvq_rk_bands B = {.K = K,
                            .nb = nb,
                            .lut = lut,
                            .n = n,
                            .cnt = cnt,
                            .tok = tok,
                            .tb = tb,
                            .nu = nu,
                            .utok0 = utok0,
                            .ucodes = code + n};
    /* every row's group without a selection (kvq_rk_bands_groups, the residual stage over
     * every candidate), the LUTs not read: b from the linear scan */
    {
        kvq_rk_bands B0 = B;
        B0.lut = NULL;
        memset(grp, 0xff, sizeof *grp * (size_t)(total + 1));
        kvq_rk_bands_groups(&B0, grp, bwork);
        int gbad = grp[total] != -1;
        for (int64_t j = 0; j < total && !gbad; j++)
            gbad = grp[j] != wgrp[j];
        if (gbad) {
            print_error("seed %llu n %lld nu %lld K %d nb %d: kvq_rk_bands_groups differs\n",
                        (unsigned long long)seed, (long long)n, (long long)nu, (int)K, (int)nb);
            bad = 1;
        }
    }
    /* the same groups by pieces (kvq_rk_bands_cursor: the residual stage over every
     * candidate makes them a piece at a time), pieces of 1 to 70 rows and one of 0 */
    {
        kvq_rk_bands B0 = B;
        B0.lut = NULL;
        kvq_rk_bands_cursor cur;
        kvq_rk_bands_cursor_begin(&B0, bwork, &cur);
        memset(grp, 0xff, sizeof *grp * (size_t)(total + 1));
        kvq_rk_bands_cursor_next(&cur, 0, grp);
        for (int64_t j = 0, p = 1; j < total; p = p % 70 + 1) {
            const int64_t m = total - j < p ? total - j : p;
            kvq_rk_bands_cursor_next(&cur, m, grp + j);
            j += m;
        }
        int gbad = grp[total] != -1;
        for (int64_t j = 0; j < total && !gbad; j++)
            gbad = grp[j] != wgrp[j];
        if (gbad) {
            print_error("seed %llu n %lld nu %lld K %d nb %d: kvq_rk_bands_cursor differs\n",
                        (unsigned long long)seed, (long long)n, (long long)nu, (int)K, (int)nb);
            bad = 1;
        }
    }
    const int64_t ks[] = {0, 1, 2, total / 17, total / 2, total - 1, total, total + 3};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0] && !bad; ki++) {
        const int64_t k = ks[ki];
        const int64_t m = kvq_rk_topk(KVQ_ISA_SCALAR, sc, total, k, want, work);
        memset(got, 0xff, sizeof *got * (size_t)(total + 1));
        const int64_t g = kvq_rk_topk_bands(&B, k, got, bwork);
        /* the scored variant: the same rows, and each one's score is its band's LUT entry
         * for its code (the band from the linear scan above): rows at a band's first
         * token included (k >= total emits every row) */
        memset(got2, 0xff, sizeof *got2 * (size_t)(total + 1));
        const int64_t g2 = kvq_rk_topk_bands_scored(&B, k, got2, val, bwork);
        int vbad = g2 != g || memcmp(got2, got, sizeof *got * (size_t)(g > 0 ? g : 0));
        for (int64_t i = 0; i < g2 && !vbad; i++)
            vbad = memcmp(&val[i], &sc[got2[i]], sizeof(float)) != 0;
        if (vbad) {
            print_error("seed %llu n %lld nu %lld K %d nb %d lut mode %d k %lld: "
                        "kvq_rk_topk_bands_scored's rows or scores differ\n",
                        (unsigned long long)seed, (long long)n, (long long)nu, (int)K, (int)nb,
                        lutmode, (long long)k);
            bad = 1;
        }
        /* the grouped variant: the same rows, scores, and each one's group b K + code
         * (b from the linear scan), with val or without */
        for (int wv = 0; wv < 2 && !bad; wv++) {
            memset(got2, 0xff, sizeof *got2 * (size_t)(total + 1));
            memset(grp, 0xff, sizeof *grp * (size_t)(total + 1));
            const int64_t g3 = kvq_rk_topk_bands_grouped(&B, k, got2, wv ? val : NULL, grp, bwork);
            int gbad = g3 != g || memcmp(got2, got, sizeof *got * (size_t)(g > 0 ? g : 0));
            for (int64_t i = 0; i < g3 && !gbad; i++)
                gbad = grp[i] != wgrp[got2[i]] ||
                       (wv && memcmp(&val[i], &sc[got2[i]], sizeof(float)) != 0);
            if (gbad) {
                print_error("seed %llu n %lld nu %lld K %d nb %d lut mode %d k %lld val %d: "
                            "kvq_rk_topk_bands_grouped's rows or groups differ\n",
                            (unsigned long long)seed, (long long)n, (long long)nu, (int)K,
                            (int)nb, lutmode, (long long)k, wv);
                bad = 1;
            }
        }
        if (g != m || memcmp(got, want, sizeof *got * (size_t)m)) {
            int64_t at = 0;
            while (at < m && at < g && got[at] == want[at])
                at++;
            print_error("seed %llu n %lld nu %lld K %d nb %d lut mode %d k %lld: %lld selected "
                        "(want %lld), first difference at %lld\n",
                        (unsigned long long)seed, (long long)n, (long long)nu, (int)K, (int)nb,
                        lutmode, (long long)k, (long long)g, (long long)m, (long long)at);
            bad = 1;
        }
    }
    free(code);
    free(cnt);
    free(pos);
    free(tok);
    free(rcode);
    free(rtok);
    free(lut);
    free(sc);
    free(tb);
    free(want);
    free(got);
    free(got2);
    free(val);
    free(grp);
    free(wgrp);
    free(work);
    free(bwork);
    return bad;
}

static void test_same_as_scores(void **state)
{
    (void)state;
    static const int64_t ns[] = {0, 1, 40, 3000, 70000};
    static const int64_t nus[] = {0, 1, 900};
    static const int32_t Ks[] = {1, 7, 256};
    static const int32_t nbs[] = {1, 2, 11};
    int bad = 0;
    uint64_t seed = 1;
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t u = 0; u < sizeof nus / sizeof nus[0]; u++)
            for (size_t c = 0; c < sizeof Ks / sizeof Ks[0]; c++)
                for (size_t b = 0; b < sizeof nbs / sizeof nbs[0]; b++)
                    for (int mode = 0; mode < 5; mode++)
                        if (ns[a] + nus[u] > 0)
                            bad |= run_case(seed++, ns[a], nus[u], Ks[c], nbs[b], mode);
    if (bad)
        fail_msg("kvq_rk_topk_bands differs from the top-k of the per-row scores");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_as_scores),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
