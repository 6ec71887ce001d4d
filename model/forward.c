/* forward.c — the llama-family forward pass, the exact full-attention backend and
 * token sampling (see kvq/model.h for the contracts).
 *
 * Every projection is x [n, in] times W^T with W [out, in] as stored. Weights that are
 * f32 in the mapping are used in place (cblas_sgemm for several tokens). The others
 * (F16, BF16, the ggml block quantizations) stay packed in the mapping and are never
 * expanded as a whole: a chunk of several tokens (prefill) dequantizes tiles of rows
 * into a bounded per-thread scratch and runs cblas_sgemm on each tile. Prefill's
 * products are split over kvq's OpenMP threads, OpenBLAS at one thread
 * (forward_gemm.c; the bytes do not depend on the thread count). A chunk of one token
 * (decode) runs kvq_quant_matvec on the rows, f32 or packed: OpenMP threads that wait
 * passively, not OpenBLAS's spinning pool. With 8-bit activations (p.act_q8, kvq run)
 * Q4_1 and Q8_0 products quantize their input once: one-token products run the
 * integer dot kernels (q8dot.h), chunks the tiled integer GEMM (q8gemm.h). The
 * embedding lookup dequantizes only the rows of the tokens it embeds. */
#include "model_internal.h"
#include "kvq/util.h"

#include <cblas.h>
#include <omp.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/quant.h"
#include "model/q8dot.h"
#include "model/q8gemm.h"

/* Matrices per layer, in the order of the weight table below. */
enum { W_Q, W_K, W_V, W_O, W_GATE, W_UP, W_DOWN, W_PER_LAYER };

static const kvq_wt *layer_wt(const kvq_layer_weights *L, int j)
{
    const kvq_wt *t[W_PER_LAYER] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                                    &L->w_down};
    return t[j];
}

/* ==========================================================================
 * Small kernels
 * ========================================================================== */

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], per row.   // x, out: [n, dim] */
static void rmsnorm(float *out, const float *x, const float *w, int64_t n, int dim, double eps)
{
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * dim;
        float *o = out + r * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        float s = (float)(1.0 / sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++)
            o[i] = xr[i] * s * w[i];
    }
}

/* gate[i] = act(gate[i]) * up[i]: silu(g) = g / (1 + e^-g), or GELU's tanh form
 * gelu(g) = g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).   // [n * hidden] */
static void gated_act(float *gate, const float *up, size_t count, kvq_act act)
{
    if (act == KVQ_ACT_GELU_TANH) {
        const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
        for (size_t i = 0; i < count; i++) {
            float g = gate[i];
            gate[i] = 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * up[i];
        }
        return;
    }
    for (size_t i = 0; i < count; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* x[i] += y[i].   // [count] */
static void add_into(float *x, const float *y, size_t count)
{
    for (size_t i = 0; i < count; i++)
        x[i] += y[i];
}

/* y[r] += b, per row.   // y: [n, width] */
static void add_bias(float *y, const float *b, int64_t n, int64_t width)
{
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < width; i++)
            y[r * width + i] += b[i];
}

/* Index of the first row holding NaN or Inf, or -1.   // a: [n, width] */
static int64_t first_nonfinite_row(const float *a, int64_t n, int64_t width)
{
    for (int64_t r = 0; r < n; r++) {
        /* Summing is cheaper than testing each element; Inf - Inf and NaN propagate. */
        float acc = 0;
        for (int64_t i = 0; i < width; i++)
            acc += a[r * width + i] * 0.0f;
        if (isnan(acc))
            return r;
    }
    return -1;
}

/* ==========================================================================
 * Forward context
 * ========================================================================== */

struct kvq_forward {
    const kvq_model *m;
    kvq_forward_params p;
    int32_t n_layers;              /* layers run */
    int64_t n_past;                /* tokens in the current sequence */
    kvq_full_attn *full;
    kvq_attn_backend attn;
    kvq_observe_fn obs;
    void *obs_user;
    int uniform;                   /* kvq_model_attn_uniform: any backend may attend it */
    char why_not_uniform[160];

    /* activations for one chunk of up to p.chunk tokens */
    float *x;                      /* [chunk, dim] residual stream */
    float *xn;                     /* [chunk, dim] normalized */
    float *q;                      /* [chunk, n_heads, head_dim] */
    float *k, *v;                  /* [chunk, n_kv_heads, head_dim] */
    float *att;                    /* [chunk, n_heads, head_dim] attention output */
    float *gate, *up;              /* [chunk, hidden_dim] */
    int64_t *pos;                  /* [chunk] */

    /* weights as f32 in place, or NULL (packed: tiles through wbuf, or matvec) */
    const float **wf;              /* [n_layers * W_PER_LAYER + 2]: layers, embd, output */
    float *tbuf;                   /* [tbuf_threads, tile_floats] dequantized row tiles */
    size_t tile_floats;            /* per thread (0: every weight f32 in place) */
    int tbuf_threads;
    float *ybuf;                   /* [ybuf_floats] one-token product before accumulating */
    size_t ybuf_floats;

    /* the q8 activation path (p.act_q8): a chunk's rows quantized once per input */
    void *q8buf;                   /* [chunk * q8_row_bytes], 64-byte aligned */
    kvq_q8row *q8rows;             /* [chunk] */
    size_t q8_row_bytes;           /* kvq_q8_row_bytes of the widest input */
};

kvq_forward_params kvq_forward_params_default(void)
{
    kvq_forward_params p = {
        .threads = 0,
        .chunk = 256,
        .max_tokens = 0,
        .n_layers = 0,
        .scratch_bytes = (uint64_t)64 << 20,
    };
    return p;
}

/* A thread's tile scratch is at most this (1 MiB: tiles stay in L2). */
#define TILE_FLOATS_MAX ((uint64_t)1 << 18)

/* Sizes a context needs, shared by create and the memory estimate. */
typedef struct fwd_plan {
    uint64_t act_floats;           /* activations */
    uint64_t tile_floats;          /* a thread's row tiles (0: every weight f32 in place) */
    uint64_t ybuf_floats;          /* one-token product of a packed weight */
} fwd_plan;

static const kvq_wt *table_wt(const kvq_model *m, size_t i)
{
    size_t nl = (size_t)m->cfg.n_layers * W_PER_LAYER;
    if (i < nl)
        return layer_wt(&m->layers[i / W_PER_LAYER], (int)(i % W_PER_LAYER));
    return i == nl ? &m->tok_embd : &m->output;
}

static size_t table_size(const kvq_model *m)
{
    return (size_t)m->cfg.n_layers * W_PER_LAYER + 2;
}

static void plan(const kvq_model *m, const kvq_forward_params *p, fwd_plan *pl)
{
    const kvq_model_config *c = &m->cfg;
    const uint64_t qd = (uint64_t)c->n_heads * c->head_dim, kvd = (uint64_t)c->n_kv_heads * c->head_dim;
    const uint64_t chunk = (uint64_t)(p->chunk > 0 ? p->chunk : 1);
    memset(pl, 0, sizeof *pl);
    pl->act_floats = chunk * (2 * (uint64_t)c->dim + 2 * qd + 2 * kvd + 2 * (uint64_t)c->hidden_dim);
    uint64_t largest = 0, widest = 0, tallest = 0;
    for (size_t i = 0; i < table_size(m); i++) {
        const kvq_wt *w = table_wt(m, i);
        tallest = (uint64_t)w->rows > tallest ? (uint64_t)w->rows : tallest;
        if (kvq_wt_direct(w))
            continue; /* f32 in place */
        uint64_t f = (uint64_t)w->rows * (uint64_t)w->cols;
        largest = f > largest ? f : largest;
        widest = (uint64_t)w->cols > widest ? (uint64_t)w->cols : widest;
    }
    if (largest) {
        uint64_t budget = p->scratch_bytes / sizeof(float);
        budget = budget < TILE_FLOATS_MAX ? budget : TILE_FLOATS_MAX;
        pl->tile_floats = largest < budget ? largest : budget;
        if (pl->tile_floats < widest)
            pl->tile_floats = widest; /* at least one row */
    }
    pl->ybuf_floats = tallest; /* one token's product (matvec), packed or f32 */
}

void kvq_model_memory_estimate(const kvq_model *m, const kvq_forward_params *p, int64_t n_ctx,
                               kvq_model_memory *out)
{
    kvq_forward_params def = kvq_forward_params_default();
    if (!p)
        p = &def;
    const kvq_model_config *c = &m->cfg;
    fwd_plan pl;
    plan(m, p, &pl);
    if (n_ctx <= 0)
        n_ctx = p->max_tokens > 0 ? p->max_tokens : (c->context_length > 0 ? c->context_length : 4096);
    const uint64_t chunk = (uint64_t)(p->chunk > 0 ? p->chunk : 1);
    const uint64_t kvd = (uint64_t)c->n_kv_heads * c->head_dim;
    memset(out, 0, sizeof *out);
    out->mapped_bytes = m->mapped_bytes;
    out->converted_bytes = 0; /* weights are never copied whole */
    const uint64_t threads = (uint64_t)(p->threads > 0 ? p->threads : omp_get_max_threads());
    out->scratch_bytes = (pl.act_floats + threads * pl.tile_floats + pl.ybuf_floats +
                          threads * (chunk < KVQ_FULL_ATTN_QBLOCK ? chunk : KVQ_FULL_ATTN_QBLOCK) *
                              (uint64_t)n_ctx +
                          chunk * (uint64_t)c->n_heads * c->head_dim) * sizeof(float);
    out->kv_cache_bytes = 2 * (uint64_t)c->n_layers * (uint64_t)n_ctx * kvd * sizeof(float);
    out->total_bytes = out->mapped_bytes + out->converted_bytes + out->scratch_bytes +
                       out->kv_cache_bytes;
}

static float *alloc_floats(uint64_t n)
{
    if (n == 0 || n > SIZE_MAX / sizeof(float))
        return NULL;
    return malloc((size_t)n * sizeof(float));
}

/* The q8 path's scratch: a chunk of rows as wide as the widest input of a product. */
static kvq_status q8_scratch(kvq_forward *f, kvq_err *err)
{
    const kvq_model_config *c = &f->m->cfg;
    int64_t widest = c->dim > c->hidden_dim ? c->dim : c->hidden_dim;
    const int64_t qd = (int64_t)c->n_heads * c->head_dim;
    widest = qd > widest ? qd : widest;
    widest = (widest + 63) / 64 * 64;
    f->q8_row_bytes = kvq_q8_row_bytes(widest);
    f->q8buf = aligned_alloc(64, (size_t)f->p.chunk * f->q8_row_bytes);
    f->q8rows = calloc((size_t)f->p.chunk, sizeof *f->q8rows);
    if (!f->q8buf || !f->q8rows)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory for the 8-bit activations",
                           f->m->path);
    return KVQ_OK;
}

kvq_status kvq_forward_create(const kvq_model *m, const kvq_forward_params *p,
                              kvq_forward **out, kvq_err *err)
{
    kvq_forward_params def = kvq_forward_params_default();
    const kvq_model_config *c = &m->cfg;
    kvq_status st = KVQ_OK;
    *out = NULL;
    if (!p)
        p = &def;
    if (p->chunk < 1 || p->threads < 0 || p->max_tokens < 0 || p->n_layers < 0 ||
        p->n_layers > c->n_layers)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "forward: bad parameters (chunk %d, threads %d, max_tokens %lld, "
                           "n_layers %d)",
                           p->chunk, p->threads, (long long)p->max_tokens, p->n_layers);
    kvq_forward *f = calloc(1, sizeof *f);
    if (!f)
        return kvq_err_set(err, KVQ_E_NOMEM, "forward: out of memory");
    f->m = m;
    f->p = *p;
    f->uniform = kvq_model_attn_uniform(c, f->why_not_uniform, sizeof f->why_not_uniform);
    f->n_layers = p->n_layers ? p->n_layers : c->n_layers;
    int64_t max_tokens = p->max_tokens ? p->max_tokens
                                       : (c->context_length > 0 ? c->context_length : 4096);
    if ((st = kvq_full_attn_create(c, max_tokens, &f->full, err)))
        goto done;
    f->attn = kvq_full_attn_backend(f->full);

    const int64_t ch = p->chunk, qd = (int64_t)c->n_heads * c->head_dim,
                  kvd = (int64_t)c->n_kv_heads * c->head_dim;
    f->x = alloc_floats((uint64_t)ch * c->dim);
    f->xn = alloc_floats((uint64_t)ch * c->dim);
    f->q = alloc_floats((uint64_t)ch * qd);
    f->att = alloc_floats((uint64_t)ch * qd);
    f->k = alloc_floats((uint64_t)ch * kvd);
    f->v = alloc_floats((uint64_t)ch * kvd);
    f->gate = alloc_floats((uint64_t)ch * c->hidden_dim);
    f->up = alloc_floats((uint64_t)ch * c->hidden_dim);
    f->pos = malloc(sizeof *f->pos * (size_t)ch);
    f->wf = calloc(table_size(m), sizeof *f->wf);
    if (!f->x || !f->xn || !f->q || !f->att || !f->k || !f->v || !f->gate || !f->up || !f->pos ||
        !f->wf) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory for chunks of %d tokens", m->path,
                         p->chunk);
        goto done;
    }

    /* Weights: in place when f32; otherwise packed, read through the scratches. */
    fwd_plan pl;
    plan(m, p, &pl);
    for (size_t i = 0; i < table_size(m); i++)
        f->wf[i] = kvq_wt_direct(table_wt(m, i));
    if (pl.ybuf_floats && !(f->ybuf = alloc_floats(pl.ybuf_floats))) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory for the weight scratch", m->path);
        goto done;
    }
    f->tile_floats = (size_t)pl.tile_floats; /* tbuf: at the first prefill */
    f->ybuf_floats = (size_t)pl.ybuf_floats;
    if (p->act_q8 && (st = q8_scratch(f, err)))
        goto done;
done:
    if (st != KVQ_OK) {
        kvq_forward_free(f);
        return st;
    }
    *out = f;
    return KVQ_OK;
}

void kvq_forward_free(kvq_forward *f)
{
    if (!f)
        return;
    free(f->wf);
    free(f->tbuf);
    free(f->ybuf);
    free(f->x);
    free(f->xn);
    free(f->q);
    free(f->att);
    free(f->k);
    free(f->v);
    free(f->gate);
    free(f->up);
    free(f->pos);
    free(f->q8buf);
    free(f->q8rows);
    kvq_full_attn_free(f->full);
    free(f);
}

void kvq_forward_set_attention(kvq_forward *f, const kvq_attn_backend *backend)
{
    f->attn = backend ? *backend : kvq_full_attn_backend(f->full);
    kvq_forward_reset(f);
}

void kvq_forward_set_observer(kvq_forward *f, kvq_observe_fn fn, void *user)
{
    f->obs = fn;
    f->obs_user = fn ? user : NULL;
}

void kvq_forward_reset(kvq_forward *f)
{
    f->n_past = 0;
    if (f->attn.reset)
        f->attn.reset(f->attn.user);
    if (f->attn.user != f->full)
        kvq_full_attn_backend(f->full).reset(f->full);
}

int64_t kvq_forward_length(const kvq_forward *f) { return f->n_past; }

kvq_status kvq_forward_resume(kvq_forward *f, int64_t n, kvq_err *err)
{
    if (!f || n < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "forward: bad resume");
    if (f->attn.user == f->full)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "forward: resume needs an attention backend other than the built-in "
                           "full attention (which holds no appended tokens)");
    f->n_past = n;
    return KVQ_OK;
}

/* ==========================================================================
 * Forward pass
 * ========================================================================== */

/* y [n, w.rows] = x [n, w.cols] W^T (+ beta y). One token goes through
 * kvq_quant_matvec; several through kvq_fwd_gemm_wt, tiles of rows over the OpenMP
 * threads (a weight that is not f32 in place dequantized tile by tile into the
 * thread's scratch). beta is 0 or 1. */
static kvq_status matmul(kvq_forward *f, size_t wid, const float *x, int64_t n, float *y,
                         float beta, kvq_err *err)
{
    const kvq_wt *w = table_wt(f->m, wid);
    kvq_status st;
    if (n > 1)
        return kvq_fwd_gemm_wt(w, f->wf[wid], x, n, y, beta, f->tbuf, f->tile_floats, err);
    /* One token, f32 in place or packed: kvq's own OpenMP matvec, not cblas_sgemv,
     * whose pthreads spin at every call whatever OMP_WAIT_POLICY says (under load 2
     * threads decoded 4x slower than 1: bench/bench_load.sh --f32). */
    float *dst = beta != 0.0f ? f->ybuf : y;
    kvq_err e = {0};
    const void *data = f->wf[wid] ? (const void *)f->wf[wid] : w->data;
    if ((st = kvq_quant_matvec((uint32_t)w->type, data, w->rows, w->cols, x, dst, &e)))
        return kvq_err_set(err, st, "%s: %s", w->name, e.msg);
    if (beta != 0.0f)
        for (int64_t i = 0; i < w->rows; i++)
            y[i] += dst[i];
    return KVQ_OK;
}

/* Products of fewer tokens than this take the q8 path's one-row kernels (decode, the
 * last token's logits, model/q8dot.h); longer chunks its tiled GEMM (model/q8gemm.h,
 * decision 019). */
#define KVQ_Q8_GEMM_TOKENS 4

/* y[i] [n, rows_i] = x [n, cols] W_i^T (+ beta y[i]) for the weights wid[0..count) that
 * read the same input: on the q8 path (p.act_q8, every weight a type and width it
 * takes) x is quantized once for all of them; otherwise each goes through matmul. */
static kvq_status proj(kvq_forward *f, const size_t *wid, float *const *y, int count,
                       const float *x, int64_t n, float beta, kvq_err *err)
{ /* count <= 3 */
    int q8 = f->q8buf != NULL;
    for (int i = 0; i < count && q8; i++) {
        const kvq_wt *w = table_wt(f->m, wid[i]);
        q8 = kvq_q8_supported((uint32_t)w->type, w->cols) &&
             w->cols == table_wt(f->m, wid[0])->cols;
    }
    if (!q8) {
        for (int i = 0; i < count; i++) {
            kvq_status st = matmul(f, wid[i], x, n, y[i], beta, err);
            if (st != KVQ_OK)
                return st;
        }
        return KVQ_OK;
    }
    const int64_t cols = table_wt(f->m, wid[0])->cols;
    for (int64_t t = 0; t < n; t++)
        kvq_q8_quantize(x + t * cols, cols, (uint8_t *)f->q8buf + (size_t)t * f->q8_row_bytes,
                        &f->q8rows[t]);
    kvq_q8_mat mats[3];
    for (int i = 0; i < count; i++) {
        const kvq_wt *w = table_wt(f->m, wid[i]);
        mats[i] = (kvq_q8_mat){(uint32_t)w->type, w->data, w->row_bytes, w->rows, y[i], w->rows};
    }
    if (n < KVQ_Q8_GEMM_TOKENS)
        kvq_q8_matmul_multi(mats, count, cols, f->q8rows, n, beta);
    else if (kvq_q8gemm_multi(mats, count, cols, f->q8rows, n, beta) != 0)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory for a weight tile",
                           table_wt(f->m, wid[0])->name);
    return KVQ_OK;
}

static kvq_status proj1(kvq_forward *f, size_t wid, const float *x, int64_t n, float *y,
                        float beta, kvq_err *err)
{
    return proj(f, &wid, &y, 1, x, n, beta, err);
}

static kvq_status check_finite(const kvq_forward *f, const float *a, int64_t n, int64_t width,
                               int32_t layer, const char *what, kvq_err *err)
{
    int64_t r = first_nonfinite_row(a, n, width);
    if (r < 0)
        return KVQ_OK;
    if (layer < 0)
        return kvq_err_set(err, KVQ_E_NUMERIC, "%s: position %lld: non-finite %s", f->m->path,
                           (long long)f->pos[r], what);
    return kvq_err_set(err, KVQ_E_NUMERIC, "%s: layer %d position %lld: non-finite %s",
                       f->m->path, layer, (long long)f->pos[r], what);
}

/* x += in W^T, or with a post-norm (gemma) x += rmsnorm(in W^T) * post (through xn,
 * free by then). */
static kvq_status out_proj(kvq_forward *f, size_t wid, const float *in, int64_t n,
                           const float *post, kvq_err *err)
{
    const kvq_model_config *c = &f->m->cfg;
    if (!post)
        return proj1(f, wid, in, n, f->x, 1.0f, err);
    kvq_status st = proj1(f, wid, in, n, f->xn, 0.0f, err);
    if (st != KVQ_OK)
        return st;
    rmsnorm(f->xn, f->xn, post, n, c->dim, c->norm_eps);
    add_into(f->x, f->xn, (size_t)n * (size_t)c->dim);
    return KVQ_OK;
}

/* One layer over the chunk in f->x [n, dim]. */
static kvq_status run_layer(kvq_forward *f, int32_t l, int64_t n, kvq_err *err)
{
    const kvq_model *m = f->m;
    const kvq_model_config *c = &m->cfg;
    const kvq_layer_weights *L = &m->layers[l];
    const int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    const size_t w0 = (size_t)l * W_PER_LAYER;
    kvq_status st;

    /* ---- attention */
    rmsnorm(f->xn, f->x, L->attn_norm, n, c->dim, c->norm_eps);
    const size_t qkv[3] = {w0 + W_Q, w0 + W_K, w0 + W_V};
    float *const qkv_out[3] = {f->q, f->k, f->v};
    if ((st = proj(f, qkv, qkv_out, 3, f->xn, n, 0.0f, err)))
        return st;
    if (c->qkv_bias) {
        add_bias(f->q, L->bq, n, qd);
        add_bias(f->k, L->bk, n, kvd);
        add_bias(f->v, L->bv, n, kvd);
    }
    if (c->qk_norm) { /* per head, before RoPE (the observer sees the normalized q, k) */
        rmsnorm(f->q, f->q, L->q_norm, n * c->n_heads, c->head_dim, c->norm_eps);
        rmsnorm(f->k, f->k, L->k_norm, n * c->n_kv_heads, c->head_dim, c->norm_eps);
    }
    if ((st = check_finite(f, f->q, n, qd, l, "q", err)) ||
        (st = check_finite(f, f->k, n, kvd, l, "k", err)) ||
        (st = check_finite(f, f->v, n, kvd, l, "v", err)))
        return st;
    kvq_attn_call call = {.layer = l, .n = (int32_t)n, .pos = f->pos, .q = f->q, .k = f->k,
                          .v = f->v, .out = NULL};
    if (f->obs && (st = f->obs(f->obs_user, &call, err)))
        return st;
    call.out = f->att;
    if ((st = f->attn.attend(f->attn.user, &call, err)))
        return st;
    if ((st = out_proj(f, w0 + W_O, f->att, n, L->post_attn_norm, err)) ||
        (st = check_finite(f, f->x, n, c->dim, l, "attention residual", err)))
        return st;

    /* ---- gated MLP (SwiGLU, or GELU for gemma) */
    rmsnorm(f->xn, f->x, L->ffn_norm, n, c->dim, c->norm_eps);
    const size_t gu[2] = {w0 + W_GATE, w0 + W_UP};
    float *const gu_out[2] = {f->gate, f->up};
    if ((st = proj(f, gu, gu_out, 2, f->xn, n, 0.0f, err)))
        return st;
    gated_act(f->gate, f->up, (size_t)(n * c->hidden_dim), c->act);
    if ((st = out_proj(f, w0 + W_DOWN, f->gate, n, L->post_ffn_norm, err)) ||
        (st = check_finite(f, f->x, n, c->dim, l, "MLP residual", err)))
        return st;
    return KVQ_OK;
}

/* x [n, dim] = embedding rows of tokens. */
static kvq_status embed(kvq_forward *f, const int32_t *tokens, int64_t n, kvq_err *err)
{
    const kvq_model *m = f->m;
    const int dim = m->cfg.dim;
    const float *E = f->wf[table_size(m) - 2];
    for (int64_t i = 0; i < n; i++) {
        if (E) {
            memcpy(f->x + i * dim, E + (size_t)tokens[i] * dim, sizeof(float) * (size_t)dim);
            continue;
        }
        kvq_status st = kvq_wt_rows_f32(&m->tok_embd, tokens[i], 1, f->x + i * dim, err);
        if (st != KVQ_OK)
            return st;
    }
    if (m->cfg.embed_scale > 0) { /* gemma: sqrt(dim), rounded to f32 as HF and llama.cpp do */
        const float s = (float)m->cfg.embed_scale;
        for (int64_t i = 0; i < n * dim; i++)
            f->x[i] *= s;
    }
    return KVQ_OK;
}

static kvq_status forward_chunks(kvq_forward *f, const int32_t *tokens, int64_t n,
                                 kvq_logits_mode mode, float *logits, kvq_err *err);

kvq_status kvq_forward_tokens(kvq_forward *f, const int32_t *tokens, int64_t n,
                              kvq_logits_mode mode, float *logits, kvq_err *err)
{
    const int blas_prev = kvq_fwd_blas_enter(f->p.threads);
    kvq_status st = forward_chunks(f, tokens, n, mode, logits, err);
    kvq_fwd_blas_leave(blas_prev);
    return st;
}

/* Gives each of this thread's OpenMP threads a tile scratch (prefill only). */
static kvq_status tile_scratch(kvq_forward *f, kvq_err *err)
{
    const int nt = omp_get_max_threads();
    if (!f->tile_floats || nt <= f->tbuf_threads)
        return KVQ_OK;
    float *b = alloc_floats((uint64_t)nt * f->tile_floats);
    if (!b)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory for the weight scratch of %d "
                           "threads", f->m->path, nt);
    free(f->tbuf);
    f->tbuf = b;
    f->tbuf_threads = nt;
    return KVQ_OK;
}

static kvq_status forward_chunks(kvq_forward *f, const int32_t *tokens, int64_t n,
                                 kvq_logits_mode mode, float *logits, kvq_err *err)
{
    const kvq_model *m = f->m;
    const kvq_model_config *c = &m->cfg;
    const size_t out_id = table_size(m) - 1;
    kvq_status st = KVQ_OK;
    if (n < 0 || (n > 0 && !tokens) || (mode != KVQ_LOGITS_NONE && !logits) ||
        (unsigned)mode > KVQ_LOGITS_ALL)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "forward: bad arguments");
    if (mode != KVQ_LOGITS_NONE && f->n_layers < c->n_layers)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "forward: logits need all %d layers (context runs %d)", c->n_layers,
                           f->n_layers);
    if (n > 0 && !f->attn.per_layer && !f->uniform)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                           "%s: %s: the attention backend '%s' attends every layer alike, and "
                           "this model's layers differ (%s)", m->path, kvq_arch_name(c->arch),
                           f->attn.name ? f->attn.name : "?", f->why_not_uniform);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return kvq_err_set(err, KVQ_E_INVALID_ARG,
                               "forward: token %lld is %d, outside the vocabulary [0, %d)",
                               (long long)i, tokens[i], c->vocab_size);
    if (n > 1 && (st = tile_scratch(f, err)))
        return st;

    for (int64_t s = 0; s < n; s += f->p.chunk) {
        const int64_t cn = n - s < f->p.chunk ? n - s : f->p.chunk;
        for (int64_t i = 0; i < cn; i++)
            f->pos[i] = f->n_past + i;
        if ((st = embed(f, tokens + s, cn, err)))
            return st;
        for (int32_t l = 0; l < f->n_layers; l++)
            if ((st = run_layer(f, l, cn, err)))
                return st;
        f->n_past += cn;

        /* ---- output layer: every row (ALL) or only the last token's (LAST). */
        if (mode == KVQ_LOGITS_ALL || (mode == KVQ_LOGITS_LAST && s + cn == n)) {
            const int64_t r0 = mode == KVQ_LOGITS_ALL ? 0 : cn - 1, nr = cn - r0;
            float *dst = mode == KVQ_LOGITS_ALL ? logits + (size_t)s * (size_t)c->vocab_size
                                                : logits;
            rmsnorm(f->xn, f->x + r0 * c->dim, m->out_norm, nr, c->dim, c->norm_eps);
            if ((st = proj1(f, out_id, f->xn, nr, dst, 0.0f, err)))
                return st;
            if (c->final_softcap > 0) {
                const float cap = (float)c->final_softcap;
                for (int64_t i = 0; i < nr * c->vocab_size; i++)
                    dst[i] = cap * tanhf(dst[i] / cap);
            }
            int64_t bad = first_nonfinite_row(dst, nr, c->vocab_size);
            if (bad >= 0)
                return kvq_err_set(err, KVQ_E_NUMERIC, "%s: position %lld: non-finite logits",
                                   m->path, (long long)f->pos[r0 + bad]);
        }
        if (n > f->p.chunk && kvq_progress(&f->p.cb, "prefill", (uint64_t)(s + cn), (uint64_t)n))
            return kvq_err_set(err, KVQ_E_CANCELLED, "forward: cancelled");
    }
    return KVQ_OK;
}

/* ==========================================================================
 * Sampling
 * ========================================================================== */

/* Sorts idx[0..n) by p[idx] descending, lower id first on ties (shell sort: no
 * comparator context needed, O(n^1.3) on the few candidates top-p keeps). */
static void sort_by_prob(int32_t *idx, int32_t n, const float *p)
{
    static const int32_t gaps[] = {1750, 701, 301, 132, 57, 23, 10, 4, 1};
    for (size_t gi = 0; gi < sizeof gaps / sizeof gaps[0]; gi++) {
        const int32_t gap = gaps[gi];
        for (int32_t i = gap; i < n; i++) {
            int32_t t = idx[i], j = i;
            while (j >= gap && (p[idx[j - gap]] < p[t] ||
                                (p[idx[j - gap]] == p[t] && idx[j - gap] > t))) {
                idx[j] = idx[j - gap];
                j -= gap;
            }
            idx[j] = t;
        }
    }
}

int32_t kvq_sample_token(const float *logits, int32_t n, double temp, double top_p,
                         kvq_rng *rng, float *work_p, int32_t *work_idx)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    if (temp <= 0 || n <= 1)
        return best;
    /* probabilities of softmax(logits / temp) */
    const double mx = logits[best];
    double sum = 0;
    for (int32_t i = 0; i < n; i++) {
        work_p[i] = (float)exp((logits[i] - mx) / temp);
        sum += work_p[i];
    }
    for (int32_t i = 0; i < n; i++)
        work_p[i] = (float)(work_p[i] / sum);
    int32_t nc = 0;
    if (top_p >= 1) {
        for (int32_t i = 0; i < n; i++)
            work_idx[nc++] = i;
    } else {
        /* Tokens below (1 - top_p) / (n - 1) can never be in the nucleus: drop them
         * before sorting. */
        const float cutoff = (float)((1.0 - top_p) / (n - 1));
        for (int32_t i = 0; i < n; i++)
            if (work_p[i] >= cutoff)
                work_idx[nc++] = i;
        sort_by_prob(work_idx, nc, work_p);
        double cum = 0;
        int32_t keep = nc;
        for (int32_t i = 0; i < nc; i++) {
            cum += work_p[work_idx[i]];
            if (cum >= top_p) {
                keep = i + 1;
                break;
            }
        }
        nc = keep;
    }
    double mass = 0;
    for (int32_t i = 0; i < nc; i++)
        mass += work_p[work_idx[i]];
    double r = kvq_rng_uniform(rng) * mass, cum = 0;
    for (int32_t i = 0; i < nc; i++) {
        cum += work_p[work_idx[i]];
        if (r < cum)
            return work_idx[i];
    }
    return work_idx[nc - 1];
}
