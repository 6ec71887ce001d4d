/*
 * bench_resid.c — the per-head residual stage's kernel, kvq_rk_resid_scores_max
 * (runtime/kernels_resid*.c; runtime/select/codebook/resid.c under --resid-group max), per
 * instruction set, over every candidate of one KV head at a long context.
 *
 *   bench_resid [--gs 4] [--dim 128] [--rows 131004] [--reps 9]
 *
 * runs      the candidates as the stage over every candidate hands them over: rows
 *           0, 1, 2, ... in code order, each (code, band) group a run of rows (11 bands
 *           of 256 codes, each code's run split in halves toward its nearest band)
 * shuffled  the same rows in a random order with their groups (each candidate's record
 *           and group entries gathered)
 *
 * Records of d / 8 bytes (1 bit per channel) and an f32 scale, random; the heads'
 * sign tables from random queries. Times: the best of reps, process CPU time, in ns a
 * candidate; the last column is shuffled / runs. Every ISA's scores must be the scalar
 * path's, bit for bit (checked; exit 1 otherwise).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_common.h"
#include "kvq.h"
#include "kvq/util.h"
#include "runtime/kernels/rk.h"

static int usage(void)
{
    fprintf(stderr, "usage: bench_resid [--gs G] [--dim D] [--rows N] [--reps R]\n");
    return 2;
}

/* The best of reps of the kernel over n candidates, seconds. */
static double best_of(kvq_isa isa, int64_t reps, const float *tab, int32_t gs, int32_t nb8,
                      const uint8_t *bits, const float *scale, const int32_t *tok,
                      const float *first, size_t fs, const int32_t *grp, int64_t n, float *out)
{
    double best = 1e30;
    for (int64_t r = 0; r < reps; r++) {
        const double t0 = bench_cpu_now();
        kvq_rk_resid_scores_max(isa, tab, gs, nb8, bits, scale, tok, first, fs, grp, n, out);
        const double t = bench_cpu_now() - t0;
        best = t < best ? t : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    int64_t gs = 4, d = 128, n = 131004, reps = 9;
    kvq_err e = {0};
    for (int i = 1; i < argc; i += 2) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return usage();
        if (!strcmp(o, "--gs")) {
            if (kvq_parse_i64(v, 1, 64, &gs, &e))
                return usage();
        } else if (!strcmp(o, "--dim")) {
            if (kvq_parse_i64(v, 8, 512, &d, &e) || d % 8)
                return usage();
        } else if (!strcmp(o, "--rows")) {
            if (kvq_parse_i64(v, 16, 1 << 24, &n, &e))
                return usage();
        } else if (!strcmp(o, "--reps")) {
            if (kvq_parse_i64(v, 1, 10000, &reps, &e))
                return usage();
        } else {
            return usage();
        }
    }
    const int32_t K = 256, nb = 11, nb8 = (int32_t)(d / 8);
    const size_t tl = KVQ_RK_SIGN_TABLE_LEN(d), fs = (size_t)nb * K;
    float *q = malloc(sizeof(float) * (size_t)(gs * d)), *tab = malloc(sizeof(float) * gs * tl);
    float *first = malloc(sizeof(float) * gs * fs), *scale = malloc(sizeof(float) * (size_t)n);
    float *ref = malloc(sizeof(float) * (size_t)n), *out = malloc(sizeof(float) * (size_t)n);
    uint8_t *bits = malloc((size_t)n * nb8);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n), *grp = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *stok = malloc(sizeof(int32_t) * (size_t)n), *sgrp = malloc(sizeof(int32_t) * (size_t)n);
    if (!q || !tab || !first || !scale || !ref || !out || !bits || !tok || !grp || !stok || !sgrp)
        return 1;
    kvq_rng rng;
    kvq_rng_seed(&rng, 1);
    for (int64_t i = 0; i < gs * d; i++)
        q[i] = (float)kvq_rng_normal(&rng);
    for (int32_t h = 0; h < gs; h++)
        kvq_rk_sign_table(q + (size_t)h * d, (int32_t)d, tab + (size_t)h * tl);
    for (size_t i = 0; i < (size_t)gs * fs; i++)
        first[i] = (float)kvq_rng_normal(&rng);
    for (int64_t i = 0; i < n * nb8; i++)
        bits[i] = (uint8_t)kvq_rng_below(&rng, 256);
    for (int64_t j = 0; j < n; j++) {
        scale[j] = 0.1f + (float)kvq_rng_uniform(&rng);
        tok[j] = (int32_t)j;
    }
    /* runs: code c's rows [j, e), its farthest band the first half, then halves */
    for (int64_t c = 0, j = 0; c < K; c++) {
        const int64_t end = j + n / K + (c < n % K);
        for (int32_t b = nb - 1; b >= 0 && j < end; b--) {
            const int64_t len = b == 0 ? end - j : (end - j + 1) / 2;
            for (int64_t t = 0; t < len; t++)
                grp[j++] = b * K + (int32_t)c;
        }
    }
    for (int64_t j = 0; j < n; j++) { /* a shuffle of the candidates */
        stok[j] = tok[j];
        sgrp[j] = grp[j];
    }
    for (int64_t j = n - 1; j > 0; j--) {
        const int64_t x = (int64_t)kvq_rng_below(&rng, (uint64_t)j + 1);
        const int32_t t = stok[j], g = sgrp[j];
        stok[j] = stok[x];
        sgrp[j] = sgrp[x];
        stok[x] = t;
        sgrp[x] = g;
    }
    printf("bench_resid: gs %lld, d %lld (1 bit), %lld candidates, best of %lld, process "
           "CPU time\n\n%7s | %12s %12s | %9s\n",
           (long long)gs, (long long)d, (long long)n, (long long)reps, "isa", "runs ns",
           "shuffled ns", "shuf/runs");
    static const char *names[] = {"scalar", "avx2", "avx512"};
    int bad = 0;
    for (int isa = KVQ_ISA_SCALAR; isa <= KVQ_ISA_AVX512; isa++) {
        if (kvq_isa_clamp((kvq_isa)isa) != (kvq_isa)isa)
            continue;
        double t[2];
        for (int sh = 0; sh < 2; sh++) {
            const int32_t *tk = sh ? stok : tok, *gp = sh ? sgrp : grp;
            t[sh] = best_of((kvq_isa)isa, reps, tab, (int32_t)gs, nb8, bits, scale, tk, first, fs,
                            gp, n, out);
            kvq_rk_resid_scores_max(KVQ_ISA_SCALAR, tab, (int32_t)gs, nb8, bits, scale, tk, first,
                                    fs, gp, n, ref);
            if (memcmp(out, ref, sizeof(float) * (size_t)n)) {
                fprintf(stderr, "bench_resid: %s scores differ from the scalar path's\n",
                        names[isa]);
                bad = 1;
            }
        }
        printf("%7s | %12.2f %12.2f | %8.2fx\n", names[isa], t[0] * 1e9 / (double)n,
               t[1] * 1e9 / (double)n, t[1] / t[0]);
    }
    free(q);
    free(tab);
    free(first);
    free(scale);
    free(ref);
    free(out);
    free(bits);
    free(tok);
    free(grp);
    free(stok);
    free(sgrp);
    return bad;
}
