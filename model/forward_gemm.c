/* forward_gemm.c — the products of a prefill chunk, split over kvq's own OpenMP threads.
 *
 * OpenBLAS runs at one thread inside a forward pass (kvq_fwd_blas_enter); parallelism
 * comes from OpenMP threads, each calling a one-thread cblas_sgemm on a tile of the
 * output. The tiles are fixed by the shapes alone (never by the thread count) and
 * every sum over k stays inside one sgemm call, so the result has the same bytes for
 * any number of threads. Why not OpenBLAS's own threads: its pthreads pool waits by
 * spinning, and on a busy machine (a compiler beside it) `kvq run --threads 2`
 * prefilled 2.4x slower than --threads 1 (docs/BENCHMARKS.md "Under load",
 * bench/bench_load.sh --prefill); OpenMP threads wait passively under the CLI's policy
 * (cli/thread_policy.c), and a thread that gets no core leaves its tiles to the others
 * (dynamic schedule). */
#include "model_internal.h"

#include <cblas.h>
#include <omp.h>
#include <stdint.h>

/* Tiles per weight matrix aimed at: enough to balance a few threads over the small
 * matrices (K and V of a GQA model), few enough that re-packing the activations for
 * each tile stays cheap. */
#define TILES_AIM 16

int64_t kvq_fwd_tile_rows(int64_t rows, int64_t cols, size_t tile_floats)
{
    const size_t c = tile_floats / (size_t)cols; /* rows the scratch holds */
    const int64_t cap = c < (size_t)rows ? (int64_t)c : rows;
    int64_t t = (rows + TILES_AIM - 1) / TILES_AIM;
    t = (t + 15) / 16 * 16; /* whole micro-kernel panels */
    if (cap >= 16 && t > cap)
        t = cap / 16 * 16;
    else if (t > cap)
        t = cap;
    return t < 1 ? 1 : t;
}

int kvq_fwd_blas_enter(int32_t threads)
{
    const int omp = threads > 0 ? threads : omp_get_max_threads();
    const int prev = openblas_get_num_threads();
    if (prev != 1)
        openblas_set_num_threads(1); /* OpenBLAS's OpenMP build also resets OpenMP's count */
    if (omp_get_max_threads() != omp)
        omp_set_num_threads(omp); /* this thread's regions */
    return prev;
}

void kvq_fwd_blas_leave(int prev)
{
    const int omp = omp_get_max_threads();
    if (prev != 1)
        openblas_set_num_threads(prev);
    if (omp_get_max_threads() != omp)
        omp_set_num_threads(omp);
}

kvq_status kvq_fwd_gemm_wt(const kvq_wt *w, const float *wf, const float *x, int64_t n,
                           float *y, float beta, float *bufs, size_t tile_floats, kvq_err *err)
{
    const int64_t rows = w->rows, cols = w->cols;
    /* f32 in place: no scratch, the tiles only follow the shape */
    const int64_t tr = kvq_fwd_tile_rows(rows, cols, wf ? SIZE_MAX : tile_floats);
    const int64_t tiles = (rows + tr - 1) / tr;
    int64_t bad = tiles; /* first failed tile */
    kvq_err first = {0};
#pragma omp parallel for schedule(dynamic, 1) if (tiles > 1)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t r0 = t * tr, nr = rows - r0 < tr ? rows - r0 : tr;
        const float *W = wf ? wf + r0 * cols : NULL;
        if (!W) {
            float *buf = bufs + (size_t)omp_get_thread_num() * tile_floats;
            kvq_err e = {0};
            if (kvq_wt_rows_f32(w, r0, nr, buf, &e) != KVQ_OK) {
#pragma omp critical(kvq_fwd_gemm_err)
                if (t < bad) {
                    bad = t;
                    first = e;
                }
                continue;
            }
            W = buf;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)nr, (int)cols, 1.0f, x,
                    (int)cols, W, (int)cols, beta, y + r0, (int)rows);
    }
    if (bad < tiles)
        return kvq_err_set(err, first.status ? first.status : KVQ_E_INVALID_ARG, "%s", first.msg);
    return KVQ_OK;
}
