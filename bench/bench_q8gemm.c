/*
 * bench_q8gemm.c — a prefill chunk's product of a quantized weight with T tokens, per
 * path, in the same run: the f32 path (the weight dequantized, then one-thread OpenBLAS
 * SGEMM, as model/forward_gemm.c does per tile) against the q8 path's tiled integer GEMM
 * (model/q8gemm.h: activations quantized to 8 bits, 16-row tiles packed, integer dot
 * products) at each level this CPU runs (2 AVX-512 VNNI, 1 AVX2, 0 scalar); one thread,
 * rounds alternated, best of --rounds. The q8 time includes quantizing the tokens and
 * packing the tiles; the f32 time includes dequantizing.
 *
 *   bench_q8gemm [--tokens T] [--rounds N] [--level L]   (--level: only the f32 path and L)
 *
 * Shapes: SmolLM2's 1536 x 576 (gate / up) and 576 x 1536 (down) in Q4_1, 576 x 576 in
 * Q8_0; T 128 by default; ns per token and row, GMAC/s and the ratio to the f32 path.
 */
#include <cblas.h>
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
#include "model/q8gemm.h"

typedef struct job {
    uint32_t type;
    const uint8_t *w;
    size_t row_bytes;
    int64_t rows, cols, n;
    const float *x;
    float *y, *wf;
    void *qbuf;
    kvq_q8row *a;
    int level; /* -1: the f32 path */
} job;

static void run(const job *j)
{
    if (j->level < 0) {
        kvq_dequantize(j->type, j->w, j->wf, j->rows * j->cols, NULL);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->n, (int)j->rows,
                    (int)j->cols, 1.0f, j->x, (int)j->cols, j->wf, (int)j->cols, 0.0f, j->y,
                    (int)j->rows);
        return;
    }
    const size_t rb = kvq_q8_row_bytes(j->cols), nb = (size_t)j->cols / 32;
    for (int64_t t = 0; t < j->n; t++)
        kvq_q8_quantize(j->x + t * j->cols, j->cols, (uint8_t *)j->qbuf + t * rb, &j->a[t]);
    void *tile = (uint8_t *)j->qbuf + j->n * rb;
    const kvq_q8gemm_fn k = kvq_q8gemm_kernel(j->level);
    for (int64_t r0 = 0; r0 < j->rows; r0 += KVQ_Q8G_ROWS) {
        const int nr = j->rows - r0 < KVQ_Q8G_ROWS ? (int)(j->rows - r0) : KVQ_Q8G_ROWS;
        kvq_q8gemm_pack(j->type, j->w + (size_t)r0 * j->row_bytes, j->row_bytes, nr, nb, tile);
        k(j->type, tile, nb, j->a, j->n, j->y + r0, j->rows, nr, 0.0f);
    }
}

/* Seconds of one call: repeats for about 0.2 s. */
static double time_one(const job *j)
{
    int reps = 0;
    const double t0 = bench_now();
    double t = t0;
    while (t - t0 < 0.2) {
        run(j);
        reps++;
        t = bench_now();
    }
    return (t - t0) / reps;
}

static int only = -2; /* --level: -2 all */

static void bench(uint32_t type, int64_t rows, int64_t cols, int64_t n, int rounds)
{
    size_t rb;
    kvq_quant_check(type, cols, &rb, NULL);
    uint8_t *w = malloc(rb * (size_t)rows);
    float *x = malloc(sizeof(float) * (size_t)(cols * n)),
          *y = malloc(sizeof(float) * (size_t)(rows * n)),
          *wf = malloc(sizeof(float) * (size_t)(rows * cols));
    kvq_rng r;
    kvq_rng_seed(&r, 3);
    bench_random_quant(type, w, rb * (size_t)rows, &r);
    for (int64_t i = 0; i < cols * n; i++)
        x[i] = (float)(kvq_rng_uniform(&r) - 0.5);
    void *qbuf = aligned_alloc(64, (size_t)n * kvq_q8_row_bytes(cols) +
                                       kvq_q8gemm_tile_bytes((size_t)cols / 32));
    kvq_q8row *a = malloc(sizeof *a * (size_t)n);
    double best[4] = {1e30, 1e30, 1e30, 1e30}; /* f32, q8 levels 0..2 */
    for (int round = 0; round < rounds; round++)
        for (int l = -1; l <= kvq_q8dot_level(); l++) {
            if (l >= 0 && only > -2 && l != only)
                continue;
            job j = {type, w, rb, rows, cols, n, x, y, wf, qbuf, a, l};
            const double s = time_one(&j);
            best[l + 1] = s < best[l + 1] ? s : best[l + 1];
        }
    const double macs = (double)rows * (double)cols * (double)n;
    printf("%s %lld x %lld, %lld tokens   f32 path %.2f ns %.1f GMAC/s",
           type == KVQ_GGML_Q4_1 ? "Q4_1" : "Q8_0", (long long)rows, (long long)cols,
           (long long)n, best[0] / (double)(rows * n) * 1e9, macs / best[0] * 1e-9);
    for (int l = kvq_q8dot_level(); l >= 0; l--)
        if (only == -2 || l == only)
            printf("   q8 level %d %.2f ns %.1f GMAC/s (%.2fx)", l,
               best[l + 1] / (double)(rows * n) * 1e9, macs / best[l + 1] * 1e-9,
               best[0] / best[l + 1]);
    printf("\n");
    free(w);
    free(x);
    free(y);
    free(wf);
    free(qbuf);
    free(a);
}

int main(int argc, char **argv)
{
    int64_t n = 128;
    int rounds = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tokens")) n = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--level")) only = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_q8gemm [--tokens T] [--rounds N] [--level L]\n");
            return 2;
        }
    }
    if (n < 1 || rounds < 1) {
        fprintf(stderr, "bench_q8gemm: --tokens and --rounds must be >= 1\n");
        return 2;
    }
    omp_set_num_threads(1);
    openblas_set_num_threads(1);
    double l[1] = {-1};
    getloadavg(l, 1);
    printf("one thread, best of %d rounds alternated, load average %.1f; ns per token and "
           "row; q8 levels: 2 AVX-512 VNNI, 1 AVX2, 0 scalar (this CPU: up to %d)\n",
           rounds, l[0], kvq_q8dot_level());
    bench(KVQ_GGML_Q4_1, 1536, 576, n, rounds);
    bench(KVQ_GGML_Q4_1, 576, 1536, n, rounds);
    bench(KVQ_GGML_Q8_0, 576, 576, n, rounds);
    return 0;
}
