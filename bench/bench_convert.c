/*
 * bench_convert.c — speed of the f16/bf16 conversions and the Q8_0 dequantizer: the
 * scalar reference against each SIMD path this CPU runs, measured in the same run,
 * with the ratio to the reference. Every fast result is also compared with the
 * reference bit for bit (a mismatch exits with status 1).
 *
 *   bench_convert [--n ELEMENTS] [--seconds S]
 *
 * Defaults: n = 65536 (in cache: the kernels' own speed) and 16M (memory bound),
 * each kernel timed for about S = 0.2 s, best of 3 runs, in Melem/s.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "kvq/util.h"
#include "kvq/gguf.h"
#include "kvq/half.h"
#include "formats/half_simd.h"

typedef void (*to_f32_fn)(const void *in, float *out, size_t n);
typedef void (*from_f32_fn)(const float *in, void *out, size_t n);

/* Adapters so every kernel has one of two shapes. */
#define ADAPT_TO(name, fn) \
    static void name(const void *in, float *out, size_t n) { fn((const uint16_t *)in, out, n); }
#define ADAPT_FROM(name, fn) \
    static void name(const float *in, void *out, size_t n) { fn(in, (uint16_t *)out, n); }
ADAPT_TO(h2f_ref, kvq_f16_to_f32_scalar)
ADAPT_TO(h2f_fast, kvq_f16_to_f32)
ADAPT_TO(b2f_ref, kvq_bf16_to_f32_scalar)
ADAPT_TO(b2f_fast, kvq_bf16_to_f32)
ADAPT_FROM(f2h_ref, kvq_f32_to_f16_scalar)
ADAPT_FROM(f2h_fast, kvq_f32_to_f16)
ADAPT_FROM(f2b_ref, kvq_f32_to_bf16_scalar)
ADAPT_FROM(f2b_fast, kvq_f32_to_bf16)
#if KVQ_HAVE_X86_SIMD
ADAPT_TO(h2f_avx2, kvq_f16_to_f32_avx2)
ADAPT_TO(b2f_avx2, kvq_bf16_to_f32_avx2)
ADAPT_FROM(f2h_avx2, kvq_f32_to_f16_avx2)
ADAPT_FROM(f2b_avx2, kvq_f32_to_bf16_avx2)
ADAPT_TO(h2f_avx512, kvq_f16_to_f32_avx512)
ADAPT_TO(b2f_avx512, kvq_bf16_to_f32_avx512)
ADAPT_FROM(f2h_avx512, kvq_f32_to_f16_avx512)
ADAPT_FROM(f2b_avx512, kvq_f32_to_bf16_avx512)
#endif

typedef struct kernel {
    const char *op, *path;
    int level; /* SIMD level needed */
    to_f32_fn to;
    from_f32_fn from;
} kernel;

static const kernel kernels[] = {
    {"f16->f32", "scalar", 0, h2f_ref, NULL},
    {"f16->f32", "dispatch", 0, h2f_fast, NULL},
#if KVQ_HAVE_X86_SIMD
    {"f16->f32", "avx2", 1, h2f_avx2, NULL},
    {"f16->f32", "avx512", 2, h2f_avx512, NULL},
#endif
    {"f32->f16", "scalar", 0, NULL, f2h_ref},
    {"f32->f16", "dispatch", 0, NULL, f2h_fast},
#if KVQ_HAVE_X86_SIMD
    {"f32->f16", "avx2", 1, NULL, f2h_avx2},
    {"f32->f16", "avx512", 2, NULL, f2h_avx512},
#endif
    {"bf16->f32", "scalar", 0, b2f_ref, NULL},
    {"bf16->f32", "dispatch", 0, b2f_fast, NULL},
#if KVQ_HAVE_X86_SIMD
    {"bf16->f32", "avx2", 1, b2f_avx2, NULL},
    {"bf16->f32", "avx512", 2, b2f_avx512, NULL},
#endif
    {"f32->bf16", "scalar", 0, NULL, f2b_ref},
    {"f32->bf16", "dispatch", 0, NULL, f2b_fast},
#if KVQ_HAVE_X86_SIMD
    {"f32->bf16", "avx2", 1, NULL, f2b_avx2},
    {"f32->bf16", "avx512", 2, NULL, f2b_avx512},
#endif
    {"q8_0->f32", "scalar", 0, kvq_dequant_q8_0_ref, NULL},
    {"q8_0->f32", "dispatch", 0, kvq_dequant_q8_0, NULL},
#if KVQ_HAVE_X86_SIMD
    {"q8_0->f32", "avx2", 1, kvq_dequant_q8_0_avx2, NULL},
    {"q8_0->f32", "avx512", 2, kvq_dequant_q8_0_avx512, NULL},
#endif
};

/* Best-of-3 rate in Melem/s; each run repeats the kernel for about `seconds`. */
static double time_kernel(const kernel *k, const void *src16, const void *srcq,
                          const float *srcf, float *dstf, void *dst16, size_t n,
                          double seconds)
{
    const void *in = !strcmp(k->op, "q8_0->f32") ? srcq : src16;
    double best = 0;
    for (int run = 0; run < 3; run++) {
        size_t reps = 0;
        const double t0 = kvq_now();
        double t = t0;
        do {
            if (k->to)
                k->to(in, dstf, n);
            else
                k->from(srcf, dst16, n);
            reps++;
            t = kvq_now();
        } while (t - t0 < seconds / 3);
        const double rate = (double)reps * (double)n / (t - t0) / 1e6;
        if (rate > best)
            best = rate;
    }
    return best;
}

int main(int argc, char **argv)
{
    size_t sizes[2] = {65536, 16u << 20};
    int n_sizes = 2;
    double seconds = 0.2;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--n") && a + 1 < argc) {
            sizes[0] = (size_t)strtoull(argv[++a], NULL, 10) / 32 * 32;
            n_sizes = 1;
        } else if (!strcmp(argv[a], "--seconds") && a + 1 < argc) {
            seconds = strtod(argv[++a], NULL);
        } else {
            fprintf(stderr, "usage: bench_convert [--n ELEMENTS] [--seconds S]\n");
            return 2;
        }
    }
    const int level = kvq_half_simd_level();
    printf("bench_convert: SIMD level %d (%s), best of 3 x %.2fs per kernel\n", level,
           level == 2 ? "AVX-512" : level == 1 ? "AVX2+F16C" : "scalar only", seconds);
    int bad = 0;
    for (int s = 0; s < n_sizes; s++) {
        const size_t n = sizes[s];
        float *srcf = malloc(n * sizeof *srcf), *dstf = malloc(n * sizeof *dstf),
              *reff = malloc(n * sizeof *reff);
        uint16_t *src16 = malloc(n * 2), *dst16 = malloc(n * 2), *ref16 = malloc(n * 2);
        uint8_t *srcq = malloc(n / 32 * 34 + 1);
        if (!srcf || !dstf || !reff || !src16 || !dst16 || !ref16 || !srcq) {
            fprintf(stderr, "bench_convert: out of memory\n");
            return 1;
        }
        kvq_rng r;
        kvq_rng_seed(&r, 1);
        for (size_t i = 0; i < n; i++) {
            srcf[i] = (float)kvq_rng_normal(&r);
            src16[i] = (uint16_t)kvq_rng_u64(&r);
        }
        kvq_quant_q8_0_ref(srcf, srcq, n);
        printf("\nn = %zu elements\n%-10s %-9s %10s %8s\n", n, "op", "path", "Melem/s",
               "vs ref");
        double ref_rate = 0;
        for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) {
            const kernel *k = &kernels[i];
            if (k->level > level)
                continue;
            const double rate = time_kernel(k, src16, srcq, srcf, dstf, dst16, n, seconds);
            if (!strcmp(k->path, "scalar")) {
                ref_rate = rate;
                if (k->to)
                    k->to(!strcmp(k->op, "q8_0->f32") ? (const void *)srcq : src16, reff, n);
                else
                    k->from(srcf, ref16, n);
            } else {
                const int same = k->to ? !memcmp(dstf, reff, n * sizeof *dstf)
                                       : !memcmp(dst16, ref16, n * 2);
                if (!same) {
                    printf("MISMATCH: %s %s differs from the scalar reference\n", k->op, k->path);
                    bad = 1;
                }
            }
            printf("%-10s %-9s %10.0f %7.2fx\n", k->op, k->path, rate, rate / ref_rate);
        }
        free(srcf);
        free(dstf);
        free(reff);
        free(src16);
        free(dst16);
        free(ref16);
        free(srcq);
    }
    return bad;
}
