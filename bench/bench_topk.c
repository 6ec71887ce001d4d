/*
 * bench_topk.c — the two ways the runtime selects a step's top K from a single-group
 * codebook, per instruction set, with the data in cache (the selection's own cost).
 *
 *   bench_topk [--codebook 4096] [--budget 0.06] [--reps 200]
 *
 * codes   kvq_rk_topk_codes: the threshold from the K LUT entries weighted by the
 *         per-code counts, one pass over the codes (counts given, as the runtime keeps
 *         them)
 * scores  kvq_rk_score (the score gather) then kvq_rk_topk over the scores
 *
 * Both select the same tokens (checked here for every row). Contexts 4096 .. 131072
 * candidates with random codes; times are the mean over reps, wall clock; the last
 * column is scores time / codes time, the ratio behind kvq_rk_codes_select_pays.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "kvq/util.h"
#include "kvq/runtime.h"
#include "runtime/kernels/rk.h"

static int usage(void)
{
    fprintf(stderr, "usage: bench_topk [--codebook K] [--budget F] [--reps N]\n");
    return 2;
}

int main(int argc, char **argv)
{
    int64_t K = 4096, reps = 200;
    double budget = 0.06;
    kvq_err e = {0};
    for (int i = 1; i < argc; i += 2) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return usage();
        if (!strcmp(o, "--codebook")) {
            if (kvq_parse_i64(v, 2, 65536, &K, &e))
                return usage();
        } else if (!strcmp(o, "--budget")) {
            if (kvq_parse_f64(v, 1e-4, 0.5, &budget, &e))
                return usage();
        } else if (!strcmp(o, "--reps")) {
            if (kvq_parse_i64(v, 1, 100000, &reps, &e))
                return usage();
        } else {
            return usage();
        }
    }
    static const int64_t ns[] = {4096, 16384, 65536, 131072};
    const int64_t nmax = 131072;
    float *lut = malloc(sizeof(float) * (size_t)K), *scores = malloc(sizeof(float) * nmax);
    uint16_t *codes = malloc(sizeof(uint16_t) * nmax);
    uint32_t *counts = malloc(sizeof(uint32_t) * (size_t)K);
    uint32_t *cwork = malloc(sizeof(uint32_t) * 3 * (size_t)K), *work = malloc(sizeof(uint32_t) * 2 * nmax);
    int32_t *a = malloc(sizeof(int32_t) * nmax), *b = malloc(sizeof(int32_t) * nmax);
    if (!lut || !scores || !codes || !counts || !cwork || !work || !a || !b)
        return 1;
    kvq_rng rng;
    kvq_rng_seed(&rng, 1);
    for (int64_t c = 0; c < K; c++)
        lut[c] = (float)kvq_rng_normal(&rng);
    for (int64_t j = 0; j < nmax; j++)
        codes[j] = (uint16_t)kvq_rng_below(&rng, (uint64_t)K);
    printf("bench_topk: codebook %lld, budget %.4g, mean of %lld, data in cache\n\n",
           (long long)K, budget, (long long)reps);
    printf("%8s %7s %7s | %10s %10s | %7s\n", "n", "isa", "k", "codes us", "scores us",
           "scores/codes");
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
        const int64_t n = ns[ni], k = (int64_t)(budget * (double)n);
        kvq_rk_code_counts(NULL, (int32_t)K, codes, n, 0, n, counts);
        for (int isa = KVQ_ISA_SCALAR; isa <= KVQ_ISA_AVX512; isa++) {
            if (kvq_isa_clamp((kvq_isa)isa) != (kvq_isa)isa)
                continue;
            int64_t ma = 0, mb = 0;
            double t0 = kvq_now();
            for (int64_t r = 0; r < reps; r++)
                ma = kvq_rk_topk_codes((kvq_isa)isa, lut, (int32_t)K, counts, codes, n, k, a,
                                       cwork);
            const double tc = (kvq_now() - t0) / (double)reps;
            t0 = kvq_now();
            for (int64_t r = 0; r < reps; r++) {
                kvq_rk_score((kvq_isa)isa, lut, 1, (int32_t)K, codes, n, scores);
                mb = kvq_rk_topk((kvq_isa)isa, scores, n, k, b, work);
            }
            const double ts = (kvq_now() - t0) / (double)reps;
            if (ma != mb || memcmp(a, b, sizeof(int32_t) * (size_t)ma)) {
                fprintf(stderr, "bench_topk: the two selections differ (n %lld, %s)\n",
                        (long long)n, kvq_isa_name((kvq_isa)isa));
                return 1;
            }
            printf("%8lld %7s %7lld | %10.1f %10.1f | %7.2f\n", (long long)n,
                   kvq_isa_name((kvq_isa)isa), (long long)k, 1e6 * tc, 1e6 * ts, ts / tc);
        }
    }
    free(lut);
    free(scores);
    free(codes);
    free(counts);
    free(cwork);
    free(work);
    free(a);
    free(b);
    return 0;
}
