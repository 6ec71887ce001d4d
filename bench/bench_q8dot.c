/*
 * bench_q8dot.c — the decode product of a quantized weight with one token, per path, in
 * the same run: the f32 path (kvq_quant_matvec: the fused dequantize-and-dot tile)
 * against the q8 activation path (model/q8dot.h: the activations quantized to 8 bits,
 * then integer dot products) at each level this CPU runs (2 AVX-512 VNNI, 1 AVX2,
 * 0 scalar), rounds alternated, best of --rounds, one thread: the kernels' own speed.
 * The q8 time includes quantizing x.
 *
 *   bench_q8dot [--rows R] [--cols C] [--rounds N]
 *
 * Defaults: C = 576 (SmolLM2's width), R = 1536 (in L2) and R = 49152 (the tied
 * output matrix, from memory), 5 rounds of about 0.1 s each; ns a row and GB/s read.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_common.h"
#include "kvq/gguf.h"
#include "kvq/half.h"
#include "kvq/quant.h"
#include "kvq/util.h"
#include "model/q8dot.h"

typedef struct job {
    uint32_t type;
    const uint8_t *w;
    size_t row_bytes;
    int64_t rows, cols;
    const float *x;
    float *y;
    void *qbuf;
    int level; /* -1: the f32 path */
} job;

static void run(const job *j)
{
    if (j->level < 0) {
        kvq_quant_matvec(j->type, j->w, j->rows, j->cols, j->x, j->y, NULL);
        return;
    }
    kvq_q8row a;
    kvq_q8_quantize(j->x, j->cols, j->qbuf, &a);
    const kvq_q8dot_fn dot = kvq_q8dot_kernel(j->type, j->level);
    for (int64_t r = 0; r < j->rows; r++)
        j->y[r] = dot(j->w + (size_t)r * j->row_bytes, &a, (size_t)j->cols / 32);
}

/* Seconds of one call: repeats for about 0.1 s. */
static double time_one(const job *j)
{
    int reps = 0;
    const double t0 = bench_now();
    double t = t0;
    while (t - t0 < 0.1) {
        run(j);
        reps++;
        t = bench_now();
    }
    return (t - t0) / reps;
}

static void bench(uint32_t type, int64_t rows, int64_t cols, int rounds)
{
    size_t rb;
    kvq_quant_check(type, cols, &rb, NULL);
    uint8_t *w = malloc(rb * (size_t)rows);
    float *x = malloc(sizeof(float) * (size_t)cols), *y = malloc(sizeof(float) * (size_t)rows);
    kvq_rng r;
    kvq_rng_seed(&r, 3);
    bench_random_quant(type, w, rb * (size_t)rows, &r);
    for (int64_t i = 0; i < cols; i++)
        x[i] = (float)(kvq_rng_uniform(&r) - 0.5);
    void *qbuf = aligned_alloc(64, kvq_q8_row_bytes(cols));
    double best[4] = {1e30, 1e30, 1e30, 1e30}; /* f32, q8 levels 0..2 */
    for (int round = 0; round < rounds; round++)
        for (int l = -1; l <= kvq_q8dot_level(); l++) {
            job j = {type, w, rb, rows, cols, x, y, qbuf, l};
            const double s = time_one(&j);
            best[l + 1] = s < best[l + 1] ? s : best[l + 1];
        }
    const char *name = type == KVQ_GGML_Q4_1 ? "Q4_1" : "Q8_0";
    printf("%s %lld x %lld (%.1f MiB)   f32 path %.1f ns/row %.1f GB/s", name, (long long)rows,
           (long long)cols, rb * (double)rows / 1048576.0, best[0] / rows * 1e9,
           rb * (double)rows / best[0] * 1e-9);
    for (int l = kvq_q8dot_level(); l >= 0; l--)
        printf("   q8 level %d %.1f ns/row (%.2fx)", l, best[l + 1] / rows * 1e9,
               best[0] / best[l + 1]);
    printf("\n");
    free(w);
    free(x);
    free(y);
    free(qbuf);
}

int main(int argc, char **argv)
{
    int64_t rows = 0, cols = 576;
    int rounds = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rows")) rows = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--cols")) cols = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_q8dot [--rows R] [--cols C] [--rounds N]\n");
            return 2;
        }
    }
    if (cols % 64 || cols <= 0 || rows < 0 || rounds < 1) {
        fprintf(stderr, "bench_q8dot: --cols must be a positive multiple of 64\n");
        return 2;
    }
    omp_set_num_threads(1);
    printf("one thread, best of %d rounds alternated; q8 levels: 2 AVX-512 VNNI, 1 AVX2, "
           "0 scalar (this CPU: up to %d)\n", rounds, kvq_q8dot_level());
    const int64_t sizes[2] = {rows ? rows : 1536, 49152};
    for (int s = 0; s < (rows ? 1 : 2); s++)
        for (int t = 0; t < 2; t++)
            bench(t ? KVQ_GGML_Q8_0 : KVQ_GGML_Q4_1, sizes[s], cols, rounds);
    return 0;
}
