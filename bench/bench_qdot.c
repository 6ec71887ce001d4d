/*
 * bench_qdot.c — the decode matrix-vector product of a quantized weight (Q4_1, Q8_0:
 * SmolLM2's types; Q4_K, Q6_K: a Q4_K_M llama's), per SIMD level this CPU runs: each
 * 256-value tile dequantized into a buffer and then dotted with x (the level's
 * dequantizer and dot kernel: what a level without a fused kernel does), against the
 * fused dequantize-and-dot tile of that level (formats/quant_avx2.c, quant_avx512.c),
 * measured in the same run, with the ratio.
 * Both give the same bits (checked here: a mismatch exits with status 1; and by
 * tests/test_quant.c). One thread: the kernels' own speed.
 *
 *   bench_qdot [--rows R] [--cols C] [--kcols C] [--seconds S]
 *
 * Defaults: C = 576 (SmolLM2's hidden size) for Q4_1 and Q8_0 and 4096 (a 7B llama's)
 * for the K types (whole 256-value blocks), R = 1536 (the weights in L2) and R = 49152
 * (from memory), each path timed for about S = 0.2 s, best of 3, in ns a row and GB/s
 * of blocks read.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "kvq/util.h"
#include "kvq/gguf.h"
#include "kvq/quant.h"
#include "formats/half_simd.h"
#include "formats/quant_simd.h"

enum { TILE = 256 }; /* formats/quant.c's tile */

typedef struct job {
    uint32_t type;
    const uint8_t *w;
    size_t rows, cols, row_bytes, tile_bytes;
    const float *x;
    float *y;
    kvq_dequant_fn deq;
    kvq_dot_fn dot;
    kvq_qdot_fn qdot; /* NULL: dequantize + dot */
} job;

static void run(const job *j)
{
    float buf[TILE];
    for (size_t r = 0; r < j->rows; r++) {
        const uint8_t *row = j->w + r * j->row_bytes;
        float s = 0.0f;
        for (size_t i = 0; i < j->cols; i += TILE, row += j->tile_bytes) {
            const size_t k = j->cols - i < TILE ? j->cols - i : TILE;
            if (j->qdot) {
                s += j->qdot(row, j->x + i, k);
            } else {
                j->deq(row, buf, k);
                s += j->dot(buf, j->x + i, k);
            }
        }
        j->y[r] = s;
    }
}

/* Best-of-3 seconds per product; each run repeats it for about seconds / 3. */
static double time_job(const job *j, double seconds)
{
    double best = 1e30;
    for (int t = 0; t < 3; t++) {
        size_t reps = 0;
        const double t0 = kvq_now();
        double now = t0;
        do {
            run(j);
            reps++;
            now = kvq_now();
        } while (now - t0 < seconds / 3);
        const double per = (now - t0) / (double)reps;
        best = per < best ? per : best;
    }
    return best;
}

/* Random blocks with finite f16 scales (d in [2^-7, 2^-6), m in (-2^-6, -2^-7]; the K
 * types' d and dmin, Q6_K's d at its end). */
static uint8_t *random_blocks(uint32_t type, size_t blocks, kvq_rng *rng)
{
    const kvq_quant_info *qi = kvq_quant_info_of(type);
    uint8_t *w = malloc(blocks * qi->block_bytes);
    if (!w)
        return NULL;
    for (size_t b = 0; b < blocks; b++) {
        uint8_t *p = w + b * qi->block_bytes;
        for (size_t i = 0; i < qi->block_bytes; i++)
            p[i] = (uint8_t)kvq_rng_u64(rng);
        const uint16_t d = (uint16_t)(0x2000 | (kvq_rng_u64(rng) & 0x3ff)),
                       m = (uint16_t)(0xa000 | (kvq_rng_u64(rng) & 0x3ff));
        if (type == KVQ_GGML_Q6_K) {
            memcpy(p + 208, &d, 2);
            continue;
        }
        memcpy(p, &d, 2);
        if (type == KVQ_GGML_Q4_1 || type == KVQ_GGML_Q4_K)
            memcpy(p + 2, type == KVQ_GGML_Q4_K ? &d : &m, 2);
    }
    return w;
}

int main(int argc, char **argv)
{
    size_t shapes[2] = {1536, 49152}, cols32 = 576, cols256 = 4096;
    int n_shapes = 2;
    double seconds = 0.2;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--rows") && a + 1 < argc) {
            shapes[0] = (size_t)strtoull(argv[++a], NULL, 10);
            n_shapes = 1;
        } else if (!strcmp(argv[a], "--cols") && a + 1 < argc) {
            cols32 = (size_t)strtoull(argv[++a], NULL, 10) / 32 * 32;
        } else if (!strcmp(argv[a], "--kcols") && a + 1 < argc) {
            cols256 = (size_t)strtoull(argv[++a], NULL, 10) / 256 * 256;
        } else if (!strcmp(argv[a], "--seconds") && a + 1 < argc) {
            seconds = strtod(argv[++a], NULL);
        } else {
            fprintf(stderr, "usage: bench_qdot [--rows R] [--cols C] [--kcols C] [--seconds S]\n");
            return 2;
        }
    }
    if (cols32 == 0 || cols256 == 0 || shapes[0] == 0 || !(seconds > 0)) {
        fprintf(stderr, "bench_qdot: --rows, --cols (a multiple of 32) and --kcols (of 256) "
                        "must be positive\n");
        return 2;
    }
    const int top = kvq_half_simd_level();
    printf("bench_qdot: SIMD level %d (%s), one thread, best of 3 x %.2fs per path\n", top,
           top == 2 ? "AVX-512" : top == 1 ? "AVX2+F16C" : "scalar only", seconds);
    printf("%-5s %6s %5s %-7s | %10s %8s | %10s %8s | %s\n", "type", "rows", "cols", "level",
           "deq+dot ns", "GB/s", "fused ns", "GB/s", "deq+dot / fused");
    kvq_rng rng;
    kvq_rng_seed(&rng, 7);
    const size_t xn = cols32 > cols256 ? cols32 : cols256;
    float *x = malloc(sizeof(float) * xn);
    for (size_t i = 0; i < xn; i++)
        x[i] = (float)kvq_rng_normal(&rng);
    const uint32_t types[4] = {KVQ_GGML_Q4_1, KVQ_GGML_Q8_0, KVQ_GGML_Q4_K, KVQ_GGML_Q6_K};
    int bad = 0;
    for (int s = 0; s < n_shapes; s++)
        for (int t = 0; t < 4; t++) {
            const kvq_quant_info *qi = kvq_quant_info_of(types[t]);
            const size_t cols = qi->block_elems == 256 ? cols256 : cols32;
            const size_t rows = shapes[s], row_bytes = cols / qi->block_elems * qi->block_bytes;
            uint8_t *w = random_blocks(types[t], rows * (cols / qi->block_elems), &rng);
            float *y0 = malloc(sizeof(float) * rows), *y1 = malloc(sizeof(float) * rows);
            if (!w || !y0 || !y1) {
                fprintf(stderr, "bench_qdot: out of memory\n");
                return 1;
            }
            for (int level = KVQ_SIMD_AVX2; level <= top; level++) {
                const kvq_qdot_fn qdot = kvq_quant_qdot_kernel(types[t], level);
                kvq_dequant_fn deq = kvq_quant_kernel(types[t], level);
                if (!qdot)
                    continue;
                const size_t tile_bytes = TILE / qi->block_elems * qi->block_bytes;
                job j = {types[t], w, rows, cols, row_bytes, tile_bytes, x, y0,
                         deq ? deq : kvq_quant_fast_kernel(types[t]), kvq_quant_dot_kernel(level),
                         NULL};
                const double t_deq = time_job(&j, seconds);
                j.qdot = qdot;
                j.y = y1;
                const double t_fused = time_job(&j, seconds);
                if (memcmp(y0, y1, sizeof(float) * rows)) {
                    fprintf(stderr, "bench_qdot: %s level %d: fused != dequantize + dot\n",
                            qi->name, level);
                    bad = 1;
                }
                const double bytes = (double)rows * (double)row_bytes;
                printf("%-5s %6zu %5zu %-7s | %10.1f %8.2f | %10.1f %8.2f | %.2fx\n", qi->name,
                       rows, cols, level == 2 ? "avx512" : "avx2", 1e9 * t_deq / (double)rows,
                       bytes / t_deq / 1e9, 1e9 * t_fused / (double)rows, bytes / t_fused / 1e9,
                       t_deq / t_fused);
            }
            free(w);
            free(y0);
            free(y1);
        }
    free(x);
    return bad;
}
