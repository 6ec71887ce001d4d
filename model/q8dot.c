/* q8dot.c — the q8 activation path's quantizer, scalar reference, kernel dispatch and
 * the row-times-tokens driver (see q8dot.h for the specification). */
#include "model/q8dot.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "kvq/gguf.h"
#include "kvq/half.h"

#define ALIGN_UP(x) (((x) + 63) & ~(size_t)63)

size_t kvq_q8_row_bytes(int64_t n)
{
    const size_t nn = (size_t)n;
    return ALIGN_UP(nn) + ALIGN_UP(nn / 16 * sizeof(float)) + ALIGN_UP(nn / 4 * sizeof(int32_t)) +
           ALIGN_UP(nn / 32 * sizeof(int32_t));
}

void kvq_q8_quantize(const float *x, int64_t n, void *buf, kvq_q8row *out)
{
    int8_t *q = buf;
    float *ds = (float *)(void *)((uint8_t *)buf + ALIGN_UP((size_t)n));
    int32_t *c4 = (int32_t *)(void *)((uint8_t *)ds + ALIGN_UP((size_t)n / 16 * sizeof(float)));
    int32_t *c32 = (int32_t *)(void *)((uint8_t *)c4 + ALIGN_UP((size_t)n / 4 * sizeof(int32_t)));
    const float magic = 0x1.8p23f; /* v + magic - magic: v rounded half to even, |v| < 2^22 */
    for (int64_t b = 0; b < n / KVQ_Q8_BLOCK; b++) {
        const float *xb = x + b * KVQ_Q8_BLOCK;
        int8_t *qb = q + b * KVQ_Q8_BLOCK;
        float amax = 0.0f;
        for (int i = 0; i < KVQ_Q8_BLOCK; i++) { /* fmaxf's value (amax is never NaN) */
            const float a = fabsf(xb[i]);
            amax = a > amax ? a : amax;
        }
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < KVQ_Q8_BLOCK; i++) {
            const float v = xb[i] * id;
            const float r = v + magic;
            qb[i] = (int8_t)(int32_t)(r - magic);
            sum += qb[i];
        }
        for (int k = 0; k < KVQ_Q8_BLOCK / 4; k++)
            c4[b * 8 + k] = 128 * (qb[4 * k] + qb[4 * k + 1] + qb[4 * k + 2] + qb[4 * k + 3]);
        c32[b] = 128 * sum;
        ds[2 * b] = d;
        ds[2 * b + 1] = d * (float)sum;
    }
    out->q = q;
    out->ds = ds;
    out->c4 = c4;
    out->c32 = c32;
}

int kvq_q8_supported(uint32_t type, int64_t cols)
{
    return (type == KVQ_GGML_Q4_1 || type == KVQ_GGML_Q8_0) && cols > 0 && cols % 64 == 0;
}

static float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return kvq_f16_to_f32_ref(h);
}

/* The weight block's 32 integers (u for Q4_1, v for Q8_0), its d_w and (Q4_1) m_w. */
static void block_ints(uint32_t type, const uint8_t *p, int32_t w[32], float *dw, float *mw)
{
    *dw = f16_at(p);
    if (type == KVQ_GGML_Q4_1) {
        *mw = f16_at(p + 2);
        for (int j = 0; j < 16; j++) {
            w[j] = p[4 + j] & 0xF;
            w[j + 16] = p[4 + j] >> 4;
        }
    } else {
        *mw = 0.0f;
        for (int j = 0; j < 32; j++)
            w[j] = (int8_t)p[2 + j];
    }
}

float kvq_q8dot_ref(uint32_t type, const uint8_t *row, const kvq_q8row *a, size_t nb)
{
    const size_t bb = type == KVQ_GGML_Q4_1 ? 20 : 34;
    float acc[16] = {0}, macc[2] = {0};
    for (size_t b = 0; b < nb; b++) {
        int32_t w[32];
        float dw, mw;
        block_ints(type, row + b * bb, w, &dw, &mw);
        const int8_t *q = a->q + b * KVQ_Q8_BLOCK;
        const float sc = dw * a->ds[2 * b];
        for (int k = 0; k < 8; k++) {
            int32_t l = 0;
            for (int j = 0; j < 4; j++)
                l += w[4 * k + j] * q[4 * k + j];
            acc[(b % 2) * 8 + k] = fmaf((float)l, sc, acc[(b % 2) * 8 + k]);
        }
        if (type == KVQ_GGML_Q4_1)
            macc[b % 2] += mw * a->ds[2 * b + 1];
    }
    for (int i = 0; i < 8; i++)
        acc[i] += acc[i + 8];
    for (int i = 0; i < 4; i++)
        acc[i] += acc[i + 4];
    for (int i = 0; i < 2; i++)
        acc[i] += acc[i + 2];
    const float r = acc[0] + acc[1];
    return type == KVQ_GGML_Q4_1 ? r + (macc[0] + macc[1]) : r;
}

static float ref_q4_1(const uint8_t *row, const kvq_q8row *a, size_t nb)
{
    return kvq_q8dot_ref(KVQ_GGML_Q4_1, row, a, nb);
}

static float ref_q8_0(const uint8_t *row, const kvq_q8row *a, size_t nb)
{
    return kvq_q8dot_ref(KVQ_GGML_Q8_0, row, a, nb);
}

int kvq_q8dot_level(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    static int cached = -1;
    int level = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (level < 0) {
        level = 0;
        if (kvq_cpu_has_avx2())
            level = kvq_cpu_has_avx512() && __builtin_cpu_supports("avx512vnni") ? 2 : 1;
        __atomic_store_n(&cached, level, __ATOMIC_RELAXED);
    }
    return level;
#else
    return 0;
#endif
}

kvq_q8dot_fn kvq_q8dot_kernel(uint32_t type, int level)
{
    if (type != KVQ_GGML_Q4_1 && type != KVQ_GGML_Q8_0)
        return NULL;
    const int q41 = type == KVQ_GGML_Q4_1;
    if (level == 0)
        return q41 ? ref_q4_1 : ref_q8_0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (level > kvq_q8dot_level())
        return NULL;
    if (level == 1)
        return q41 ? kvq_q8dot_q4_1_avx2 : kvq_q8dot_q8_0_avx2;
    if (level == 2)
        return q41 ? kvq_q8dot_q4_1_avx512 : kvq_q8dot_q8_0_avx512;
#endif
    return NULL;
}

kvq_q8dot4_fn kvq_q8dot4_kernel(uint32_t type, int level)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (type == KVQ_GGML_Q4_1 && level == 2 && kvq_q8dot_level() >= 2)
        return kvq_q8dot4_q4_1_avx512;
#endif
    (void)type;
    (void)level;
    return NULL;
}

/* Rows from which a product is split over the team (below: one thread, no region). */
#define PARALLEL_MIN_VALUES (1 << 18)

/* Rows [r0, r1) of the product: each row read once for all n tokens, four at a time
 * where the level has a four-token kernel. */
static void rows_range(uint32_t type, const uint8_t *base, size_t row_bytes, int64_t r0,
                       int64_t r1, size_t nb, const kvq_q8row *a, int64_t n, float *y,
                       int64_t ldy, float beta)
{
    const int level = kvq_q8dot_level();
    const kvq_q8dot_fn dot = kvq_q8dot_kernel(type, level);
    const kvq_q8dot4_fn dot4 = kvq_q8dot4_kernel(type, level);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = base + (size_t)r * row_bytes;
        int64_t t = 0;
        float v[4];
        for (; dot4 && t + 4 <= n; t += 4) {
            dot4(row, a + t, nb, v);
            for (int i = 0; i < 4; i++)
                y[(t + i) * ldy + r] = beta != 0.0f ? y[(t + i) * ldy + r] + v[i] : v[i];
        }
        for (; t < n; t++) {
            v[0] = dot(row, &a[t], nb);
            y[t * ldy + r] = beta != 0.0f ? y[t * ldy + r] + v[0] : v[0];
        }
    }
}

void kvq_q8_matmul(uint32_t type, const void *w, size_t row_bytes, int64_t rows,
                   int64_t cols, const kvq_q8row *a, int64_t n, float *y, int64_t ldy,
                   float beta)
{
    const kvq_q8_mat m = {type, w, row_bytes, rows, y, ldy};
    kvq_q8_matmul_multi(&m, 1, cols, a, n, beta);
}

/* Row tiles per matrix (fixed by the shape: the same bytes for any thread count). */
#define TILE_ROWS 16

void kvq_q8_matmul_multi(const kvq_q8_mat *m, int count, int64_t cols, const kvq_q8row *a,
                         int64_t n, float beta)
{
    const size_t nb = (size_t)cols / KVQ_Q8_BLOCK;
    int64_t tiles = 0;
    double work = 0;
    for (int i = 0; i < count; i++) {
        tiles += (m[i].rows + TILE_ROWS - 1) / TILE_ROWS;
        work += (double)m[i].rows * (double)cols * (double)n;
    }
    if (omp_get_max_threads() <= 1 || work < PARALLEL_MIN_VALUES) {
        /* no parallel region at all: a team of one still pays its start */
        for (int i = 0; i < count; i++)
            rows_range(m[i].type, m[i].w, m[i].row_bytes, 0, m[i].rows, nb, a, n, m[i].y,
                       m[i].ldy, beta);
        return;
    }
    /* one region for all the matrices, each thread a contiguous range of tiles (a
     * tile is a few hundred ns at decode: dealing them one by one cost more than it
     * balanced; bench_model at 2 threads) */
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        int i = 0;
        int64_t r0 = t * TILE_ROWS;
        while (r0 >= (m[i].rows + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS) {
            r0 -= (m[i].rows + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS;
            i++;
        }
        const int64_t r1 = r0 + TILE_ROWS < m[i].rows ? r0 + TILE_ROWS : m[i].rows;
        rows_range(m[i].type, m[i].w, m[i].row_bytes, r0, r1, nb, a, n, m[i].y, m[i].ldy, beta);
    }
}
