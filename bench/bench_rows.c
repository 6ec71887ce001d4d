/*
 * bench_rows.c — the two kernels of a decode step that read scattered cache rows, at
 * any head dimension: kvq_rk_logits over the rerank's candidates and kvq_rk_mix over
 * the kept value rows, against plain loads of the same rows in the same run.
 *
 *   bench_rows [--dim 64] [--queries 4] [--heads 8] [--context 131072]
 *              [--fraction 0.12] [--reps 5] [--isa scalar|avx2|avx512]
 *
 * Per head a K and a V array of `context` f16 rows of `dim` (allocated like the
 * runtime's cache: 2 MiB aligned, transparent huge pages); the candidates are each row
 * taken with probability `fraction` (seeded; 0.12 = the rerank's 2 x 6% at 128K), the
 * kept rows every other candidate. Per repetition, from a cold cache (256 MiB streamed
 * through first): the logits of `queries` query rows over every head's candidates
 * (kvq_rk_logits, rows by index: the rerank's call, runtime/select/codebook/rerank.c), then the
 * weighted sum of the kept value rows (kvq_rk_mix: the attention's), then the same K
 * and V rows read with plain loads and nothing else. Prints the best of reps (process
 * CPU time) and the rows' GB/s. bench_decode measures the whole step at d 128 only;
 * this is the kernels at the real model's shape (SmolLM2: --dim 64 --queries 4, three
 * heads plus the summed query of the rerank; docs/BENCHMARKS.md, "The two-stage step
 * against its floor").
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "kvq/runtime.h"
#include "kvq/util.h"
#include "runtime/kernels/rk.h"

#include "bench/bench_common.h"

static int usage(void)
{
    fprintf(stderr, "usage: bench_rows [--dim D] [--queries Q] [--heads H] [--context N] "
                    "[--fraction F] [--reps R] [--isa scalar|avx2|avx512]\n");
    return 2;
}

/* Sum of the rows' bytes (plain 8-byte loads). */
static uint64_t read_rows(const uint16_t *base, int64_t dim, const int32_t *rows, int64_t m)
{
    uint64_t s = 0;
    for (int64_t i = 0; i < m; i++) {
        const uint64_t *r = (const uint64_t *)(base + (size_t)rows[i] * dim);
        for (int64_t t = 0; t < dim / 4; t++)
            s += r[t];
    }
    return s;
}

int main(int argc, char **argv)
{
    int64_t dim = 64, nq = 4, heads = 8, context = 131072, reps = 5;
    double fraction = 0.12;
    kvq_isa isa = kvq_isa_clamp(KVQ_ISA_AVX512);
    kvq_err e = {0};
    for (int i = 1; i < argc; i += 2) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return usage();
        if (!strcmp(o, "--dim")) {
            if (kvq_parse_i64(v, 4, 512, &dim, &e) || dim % 4)
                return usage();
        } else if (!strcmp(o, "--queries")) {
            if (kvq_parse_i64(v, 1, 64, &nq, &e))
                return usage();
        } else if (!strcmp(o, "--heads")) {
            if (kvq_parse_i64(v, 1, 64, &heads, &e))
                return usage();
        } else if (!strcmp(o, "--context")) {
            if (kvq_parse_i64(v, 4096, (int64_t)1 << 22, &context, &e))
                return usage();
        } else if (!strcmp(o, "--fraction")) {
            if (kvq_parse_f64(v, 1e-4, 1, &fraction, &e))
                return usage();
        } else if (!strcmp(o, "--reps")) {
            if (kvq_parse_i64(v, 1, 1000, &reps, &e))
                return usage();
        } else if (!strcmp(o, "--isa")) {
            if (!strcmp(v, "scalar"))
                isa = KVQ_ISA_SCALAR;
            else if (!strcmp(v, "avx2"))
                isa = kvq_isa_clamp(KVQ_ISA_AVX2);
            else if (!strcmp(v, "avx512"))
                isa = kvq_isa_clamp(KVQ_ISA_AVX512);
            else
                return usage();
        } else {
            return usage();
        }
    }
    const size_t bytes = (size_t)context * (size_t)dim * sizeof(uint16_t);
    uint16_t **K = calloc((size_t)heads, sizeof *K), **V = calloc((size_t)heads, sizeof *V);
    int32_t *cand = malloc(sizeof *cand * (size_t)context), *kept = malloc(sizeof *kept * (size_t)context);
    float *q = malloc(sizeof(float) * (size_t)(nq * dim)), *tmp = malloc(sizeof(float) * (size_t)dim);
    uint64_t *flush = malloc(BENCH_FLUSH_BYTES);
    if (!K || !V || !cand || !kept || !q || !tmp || !flush)
        return 1;
    memset(flush, 0, BENCH_FLUSH_BYTES);
    kvq_rng rng;
    kvq_rng_seed(&rng, 11);
    for (int64_t h = 0; h < heads; h++) {
        K[h] = bench_cache_alloc(bytes);
        V[h] = bench_cache_alloc(bytes);
        if (!K[h] || !V[h]) {
            fprintf(stderr, "bench_rows: out of memory (%lld x 2 arrays of %zu bytes)\n",
                    (long long)heads, bytes);
            return 1;
        }
        for (int64_t j = 0; j < context; j++) {
            for (int64_t t = 0; t < dim; t++)
                tmp[t] = (float)kvq_rng_normal(&rng);
            kvq_f32_to_f16(tmp, K[h] + (size_t)j * dim, (size_t)dim);
            kvq_f32_to_f16(tmp, V[h] + (size_t)j * dim, (size_t)dim);
        }
    }
    for (int64_t i = 0; i < nq * dim; i++)
        q[i] = (float)kvq_rng_normal(&rng);
    int64_t n = 0, m = 0;
    const uint64_t p = (uint64_t)(fraction * 1e6);
    for (int64_t j = 0; j < context; j++)
        if (kvq_rng_below(&rng, 1000000) < p) {
            if (n % 2 == 0)
                kept[m++] = (int32_t)j;
            cand[n++] = (int32_t)j;
        }
    float *lg = malloc(sizeof(float) * (size_t)(nq * (n + 1))),
          *pw = malloc(sizeof(float) * (size_t)(nq * (m + 1))),
          *out = malloc(sizeof(float) * (size_t)(nq * dim));
    if (!lg || !pw || !out)
        return 1;
    for (int64_t i = 0; i < nq * m; i++)
        pw[i] = (float)kvq_rng_uniform(&rng) / (float)m;
    double best[3] = {1e30, 1e30, 1e30};
    for (int64_t r = 0; r < reps; r++) {
        double t[3];
        bench_flush_caches(flush);
        double t0 = bench_cpu_now();
        for (int64_t h = 0; h < heads; h++)
            kvq_rk_logits(isa, q, (int32_t)nq, (int32_t)dim, K[h], KVQ_DT_F16, dim, cand, n,
                          0.125f, lg, n);
        t[0] = bench_cpu_now() - t0;
        bench_flush_caches(flush);
        t0 = bench_cpu_now();
        for (int64_t h = 0; h < heads; h++)
            kvq_rk_mix(isa, pw, (int32_t)nq, m, V[h], KVQ_DT_F16, dim, kept, m, (int32_t)dim, out);
        t[1] = bench_cpu_now() - t0;
        bench_flush_caches(flush);
        t0 = bench_cpu_now();
        uint64_t s = 0;
        for (int64_t h = 0; h < heads; h++)
            s += read_rows(K[h], dim, cand, n) + read_rows(V[h], dim, kept, m);
        t[2] = bench_cpu_now() - t0;
        bench_sink += s + (uint64_t)(lg[0] != 0.0f) + (uint64_t)(out[0] != 0.0f);
        for (int i = 0; i < 3; i++)
            best[i] = t[i] < best[i] ? t[i] : best[i];
    }
    const double kb = (double)heads * (double)n * (double)dim * 2.0,
                 vb = (double)heads * (double)m * (double)dim * 2.0;
    printf("bench_rows: %lld heads, d %lld, %lld query rows, isa %s, %lld candidates and %lld "
           "kept rows of %lld per head, best of %lld, process CPU time\n",
           (long long)heads, (long long)dim, (long long)nq, kvq_isa_name(isa), (long long)n,
           (long long)m, (long long)context, (long long)reps);
    printf("logits (K rows)     %8.3f ms  %6.2f GB/s\n", 1e3 * best[0], kb / best[0] / 1e9);
    printf("mix (V rows)        %8.3f ms  %6.2f GB/s\n", 1e3 * best[1], vb / best[1] / 1e9);
    printf("plain loads of both %8.3f ms  %6.2f GB/s\n", 1e3 * best[2], (kb + vb) / best[2] / 1e9);
    for (int64_t h = 0; h < heads; h++) {
        free(K[h]);
        free(V[h]);
    }
    free(K);
    free(V);
    free(cand);
    free(kept);
    free(q);
    free(tmp);
    free(flush);
    free(lg);
    free(pw);
    free(out);
    return 0;
}
