/*
 * fingerprint.c — the weight fingerprint of a model (kvq_model_fingerprint, kvq/model.h;
 * the definition is docs/format.md "Weight fingerprint").
 *
 * A 128-bit hash of the values the forward pass computes keys and queries with: the
 * token embedding, then per layer the attention norm, Wq, bq, Wk, bk, each as f32 (the
 * stored values dequantized), rows of Wq / Wk / bq / bk in the "half" RoPE pair order
 * (a GGUF llama file's interleaved rows are put back in the order of the HF checkpoint).
 * The stream of 32-bit words (a header, then per tensor its rows, cols and values; -0 as
 * +0, every NaN as 0x7fc00000) is hashed as two sums over words i of
 * mix(mix(i) ^ w_i) and mix(mix(i) ^ w_i ^ C): a sum, so any split over threads gives
 * the same bits. Not cryptographic: it tells checkpoints apart, it does not resist
 * forgery. scripts/fingerprint.py computes the same from a GGUF file with numpy.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

#define FP_SALT 0x5851f42d4c957f2dULL

static inline uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

typedef struct fp_state {
    uint64_t n;      /* words so far */
    uint64_t h1, h2; /* the two sums */
} fp_state;

static inline uint32_t canon_bits(float x)
{
    uint32_t u;
    if (x != x)
        return 0x7fc00000u;
    x += 0.0f; /* -0 -> +0 */
    memcpy(&u, &x, sizeof u);
    return u;
}

static void fp_words(fp_state *s, const uint32_t *w, int64_t n)
{
    uint64_t a = 0, b = 0;
    const uint64_t base = s->n;
#pragma omp parallel for reduction(+ : a, b) schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        const uint64_t x = mix64(base + (uint64_t)i) ^ w[i];
        a += mix64(x);
        b += mix64(x ^ FP_SALT);
    }
    s->h1 += a;
    s->h2 += b;
    s->n += (uint64_t)n;
}

static void fp_floats(fp_state *s, float *x, int64_t n)
{
    uint32_t *w = (uint32_t *)x; /* in place: each value read before it is written */
    for (int64_t i = 0; i < n; i++)
        w[i] = canon_bits(x[i]);
    fp_words(s, w, n);
}

static void fp_u32(fp_state *s, uint32_t v) { fp_words(s, &v, 1); }

/* The canonical index of stored row r of a Q/K projection with heads of d rows: rows
 * stored with RoPE pairs interleaved (2i, 2i+1) come back to the half order (i, i+d/2). */
static int64_t stored_row(int64_t canon, int32_t d, int interleaved)
{
    if (!interleaved)
        return canon;
    const int64_t h = canon / d, c = canon % d, half = d / 2;
    return h * d + (c < half ? 2 * c : 2 * (c - half) + 1);
}

/* A weight matrix: rows, cols, then its rows in canonical order (heads of d rows when
 * d > 0), dequantized through `buf` (at least d * cols floats, or 256 rows). */
static kvq_status fp_matrix(fp_state *s, const kvq_wt *w, int32_t d, int interleaved, float *buf,
                            int64_t buf_rows, float *row, kvq_err *err)
{
    fp_u32(s, (uint32_t)w->rows);
    fp_u32(s, (uint32_t)w->cols);
    if (d <= 0 || !interleaved) {
        for (int64_t r = 0; r < w->rows; r += buf_rows) {
            const int64_t n = w->rows - r < buf_rows ? w->rows - r : buf_rows;
            kvq_status st = kvq_wt_rows_f32(w, r, n, buf, err);
            if (st)
                return st;
            fp_floats(s, buf, n * w->cols);
        }
        return KVQ_OK;
    }
    for (int64_t h = 0; h < w->rows / d; h++) {
        kvq_status st = kvq_wt_rows_f32(w, h * d, d, buf, err);
        if (st)
            return st;
        for (int32_t c = 0; c < d; c++) {
            memcpy(row, buf + (stored_row(c, d, 1)) * w->cols, (size_t)w->cols * sizeof *row);
            fp_floats(s, row, w->cols);
        }
    }
    return KVQ_OK;
}

/* A vector of n f32 values (norms, biases): 1, n, then the values, permuted per head as
 * the rows of its projection when d > 0. */
static void fp_vector(fp_state *s, const float *v, int64_t n, int32_t d, int interleaved,
                      float *tmp)
{
    fp_u32(s, 1);
    fp_u32(s, (uint32_t)n);
    for (int64_t i = 0; i < n; i++)
        tmp[i] = v[d > 0 ? stored_row(i, d, interleaved) : i];
    fp_floats(s, tmp, n);
}

kvq_status kvq_model_compute_fingerprint(const kvq_model *m, char *out, size_t cap, kvq_err *err)
{
    const kvq_model_config *c = &m->cfg;
    const int il = c->rope.layout == KVQ_ROPE_INTERLEAVED;
    const int32_t d = c->head_dim;
    int64_t widest = c->dim;
    if ((int64_t)c->n_heads * d > widest)
        widest = (int64_t)c->n_heads * d;
    const int64_t buf_rows = 256 > d ? 256 : d;
    float *buf = malloc((size_t)buf_rows * (size_t)widest * sizeof *buf);
    float *row = malloc((size_t)widest * sizeof *row);
    kvq_status st = KVQ_OK;
    if (!buf || !row) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory computing the fingerprint",
                         m->path);
        goto done;
    }
    fp_state s = {0};
    const uint32_t head[] = {0x4b565146u /* "KVQF" */, 1u, (uint32_t)c->n_layers,
                             (uint32_t)c->n_heads, (uint32_t)c->n_kv_heads, (uint32_t)d};
    fp_words(&s, head, 6);
    if ((st = fp_matrix(&s, &m->tok_embd, 0, 0, buf, buf_rows, row, err)))
        goto done;
    for (int32_t l = 0; l < c->n_layers; l++) {
        const kvq_layer_weights *L = &m->layers[l];
        fp_vector(&s, L->attn_norm, c->dim, 0, 0, row);
        if ((st = fp_matrix(&s, &L->wq, d, il, buf, buf_rows, row, err)))
            goto done;
        if (L->bq)
            fp_vector(&s, L->bq, (int64_t)c->n_heads * d, d, il, row);
        if ((st = fp_matrix(&s, &L->wk, d, il, buf, buf_rows, row, err)))
            goto done;
        if (L->bk)
            fp_vector(&s, L->bk, (int64_t)c->n_kv_heads * d, d, il, row);
    }
    snprintf(out, cap, "%016" PRIx64 "%016" PRIx64, mix64(s.h1 ^ s.n), mix64(s.h2 ^ ~s.n));
done:
    free(buf);
    free(row);
    return st;
}
