/* q8gemm.c — the q8 activation path's prefill GEMM: the specification, the tile packer,
 * the scalar kernel, dispatch and the row-tiles driver (see q8gemm.h). */
#include "model/q8gemm.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/gguf.h"
#include "kvq/half.h"

#define ALIGN_UP(x) (((x) + 63) & ~(size_t)63)
#define R KVQ_Q8G_ROWS

static float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return kvq_f16_to_f32_ref(h);
}

float kvq_q8gemm_ref(uint32_t type, const uint8_t *row, const kvq_q8row *a, size_t nb)
{
    const int q41 = type == KVQ_GGML_Q4_1;
    const size_t bb = q41 ? 20 : 34;
    float acc = 0.0f, macc = 0.0f;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *p = row + b * bb;
        const int8_t *q = a->q + b * KVQ_Q8_BLOCK;
        int32_t l = 0;
        for (int j = 0; j < 32; j++) {
            const int32_t w = q41 ? (j < 16 ? p[4 + j] & 0xF : p[4 + j - 16] >> 4)
                                  : (int32_t)(int8_t)p[2 + j];
            l += w * q[j];
        }
        const float sc = f16_at(p) * a->ds[2 * b];
        acc = fmaf((float)l, sc, acc);
        if (q41)
            macc = fmaf(f16_at(p + 2), a->ds[2 * b + 1], macc);
    }
    return q41 ? acc + macc : acc;
}

size_t kvq_q8gemm_tile_bytes(size_t nb)
{
    return nb * (8 * 64 + 2 * R * sizeof(float));
}

void kvq_q8gemm_pack(uint32_t type, const uint8_t *rows, size_t row_bytes, int nr, size_t nb,
                     void *tile)
{
    const int q41 = type == KVQ_GGML_Q4_1;
    const size_t bb = q41 ? 20 : 34;
    uint8_t *w = tile;
    float *dm = (float *)(void *)(w + nb * 512);
    memset(tile, 0, kvq_q8gemm_tile_bytes(nb));
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = rows + (size_t)r * row_bytes;
        for (size_t b = 0; b < nb; b++) {
            const uint8_t *p = row + b * bb;
            uint8_t v[32];
            if (q41) {
                for (int j = 0; j < 16; j++) {
                    v[j] = p[4 + j] & 0xF;
                    v[j + 16] = p[4 + j] >> 4;
                }
            } else {
                for (int j = 0; j < 32; j++)
                    v[j] = p[2 + j] ^ 0x80;
            }
            uint8_t *wb = w + b * 512 + (size_t)r * 4;
            for (int g = 0; g < 8; g++)
                memcpy(wb + g * 64, v + 4 * g, 4);
            dm[b * 2 * R + r] = f16_at(p);
            dm[b * 2 * R + R + r] = q41 ? f16_at(p + 2) : 0.0f;
        }
    }
}

/* Level 0: the tile read in the specification's order. */
static void gemm_scalar(uint32_t type, const void *tile, size_t nb, const kvq_q8row *a,
                        int64_t n, float *y, int64_t ldy, int nr, float beta)
{
    const int q41 = type == KVQ_GGML_Q4_1;
    const uint8_t *w = tile;
    const float *dm = (const float *)(const void *)(w + nb * 512);
    for (int64_t t = 0; t < n; t++) {
        for (int r = 0; r < nr; r++) {
            float acc = 0.0f, macc = 0.0f;
            for (size_t b = 0; b < nb; b++) {
                const int8_t *q = a[t].q + b * KVQ_Q8_BLOCK;
                int32_t l = 0;
                for (int j = 0; j < 32; j++)
                    l += (int32_t)w[b * 512 + (j / 4) * 64 + r * 4 + j % 4] * q[j];
                if (!q41)
                    l -= a[t].c32[b];
                acc = fmaf((float)l, dm[b * 2 * R + r] * a[t].ds[2 * b], acc);
                if (q41)
                    macc = fmaf(dm[b * 2 * R + R + r], a[t].ds[2 * b + 1], macc);
            }
            const float v = q41 ? acc + macc : acc;
            y[t * ldy + r] = beta != 0.0f ? y[t * ldy + r] + v : v;
        }
    }
}

kvq_q8gemm_fn kvq_q8gemm_kernel(int level)
{
    if (level == 0)
        return gemm_scalar;
#if defined(__x86_64__) && defined(__GNUC__)
    if (level > kvq_q8dot_level())
        return NULL;
    if (level == 1)
        return kvq_q8gemm_avx2;
    if (level == 2)
        return kvq_q8gemm_avx512;
#endif
    return NULL;
}

/* Below this much work (rows x cols x tokens) a product runs on the calling thread. */
#define PARALLEL_MIN_VALUES (1 << 18)

/* Tile t of the matrices' concatenated 16-row tiles: packed into scratch, multiplied. */
static void one_tile(const kvq_q8_mat *m, int64_t t, size_t nb, const kvq_q8row *a, int64_t n,
                     float beta, kvq_q8gemm_fn k, void *scratch)
{
    int i = 0;
    int64_t r0 = t * R;
    while (r0 >= (m[i].rows + R - 1) / R * R) {
        r0 -= (m[i].rows + R - 1) / R * R;
        i++;
    }
    const int nr = (int)(m[i].rows - r0 < R ? m[i].rows - r0 : R);
    kvq_q8gemm_pack(m[i].type, (const uint8_t *)m[i].w + (size_t)r0 * m[i].row_bytes,
                    m[i].row_bytes, nr, nb, scratch);
    k(m[i].type, scratch, nb, a, n, m[i].y + r0, m[i].ldy, nr, beta);
}

int kvq_q8gemm_multi(const kvq_q8_mat *m, int count, int64_t cols, const kvq_q8row *a,
                     int64_t n, float beta)
{
    const size_t nb = (size_t)cols / KVQ_Q8_BLOCK, tb = ALIGN_UP(kvq_q8gemm_tile_bytes(nb));
    const kvq_q8gemm_fn k = kvq_q8gemm_kernel(kvq_q8dot_level());
    int64_t tiles = 0;
    double work = 0;
    for (int i = 0; i < count; i++) {
        tiles += (m[i].rows + R - 1) / R;
        work += (double)m[i].rows * (double)cols * (double)n;
    }
    int failed = 0;
    if (omp_get_max_threads() <= 1 || work < PARALLEL_MIN_VALUES) {
        void *s = aligned_alloc(64, tb);
        if (!s)
            return -1;
        for (int64_t t = 0; t < tiles; t++)
            one_tile(m, t, nb, a, n, beta, k, s);
        free(s);
        return 0;
    }
#pragma omp parallel reduction(| : failed)
    {
        void *s = aligned_alloc(64, tb);
        failed = s == NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tiles; t++)
            if (s)
                one_tile(m, t, nb, a, n, beta, k, s);
        free(s);
    }
    return failed ? -1 : 0;
}
