/* model.c — opening a model (GGUF file or HF directory), configuration checks and the
 * weight-view helpers shared by the two loaders and the forward pass. */
#include "model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvq/quant.h"
#include "kvq/tokenizer.h"

/* ==========================================================================
 * Names
 * ========================================================================== */

const char *kvq_arch_name(kvq_arch a)
{
    switch (a) {
    case KVQ_ARCH_LLAMA: return "llama";
    case KVQ_ARCH_MISTRAL: return "mistral";
    case KVQ_ARCH_QWEN2: return "qwen2";
    case KVQ_ARCH_QWEN3: return "qwen3";
    case KVQ_ARCH_GEMMA2: return "gemma2";
    case KVQ_ARCH_GEMMA3: return "gemma3";
    case KVQ_ARCH_PHI3: return "phi3";
    }
    return "?";
}

int kvq_arch_parse(const char *s, kvq_arch *out)
{
    for (int a = 0; a < KVQ_ARCH_COUNT; a++)
        if (s && !strcmp(s, kvq_arch_name((kvq_arch)a))) {
            *out = (kvq_arch)a;
            return 0;
        }
    return -1;
}

const char *kvq_model_source_name(kvq_model_source s)
{
    return s == KVQ_MODEL_HF ? "hf" : "gguf";
}

kvq_model_params kvq_model_params_default(void)
{
    kvq_model_params p = {.load_tokenizer = 1};
    return p;
}

/* ==========================================================================
 * Weight views
 * ========================================================================== */

size_t kvq_wt_bytes(const kvq_wt *w) { return w->row_bytes * (size_t)w->rows; }

void kvq_wt_slice(const kvq_wt *src, int64_t r0, int64_t rows, kvq_wt *out)
{
    *out = *src;
    out->rows = rows;
    out->data = (const uint8_t *)src->data + (size_t)r0 * src->row_bytes;
}

void kvq_vec_add_scalar(float *v, int64_t n, float offset)
{
    for (int64_t i = 0; i < n; i++)
        v[i] += offset;
}

const float *kvq_wt_direct(const kvq_wt *w)
{
    if (w->type != WT_F32 || ((uintptr_t)w->data % sizeof(float)) != 0)
        return NULL;
    return w->data;
}

kvq_status kvq_wt_rows_f32(const kvq_wt *w, int64_t r0, int64_t n, float *out, kvq_err *err)
{
    if (r0 < 0 || n < 0 || r0 > w->rows - n)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: rows [%lld, %lld) outside [0, %lld)",
                           w->name, (long long)r0, (long long)(r0 + n), (long long)w->rows);
    kvq_err e = {0};
    kvq_status st = kvq_dequantize_rows((uint32_t)w->type, w->data, w->rows, w->cols, r0, r0 + n,
                                        out, &e);
    if (st != KVQ_OK)
        return kvq_err_set(err, st, "%s: %s", w->name, e.msg);
    return KVQ_OK;
}

kvq_status kvq_wt_vector(const kvq_wt *w, int64_t n, float **out, const char *path,
                         kvq_err *err)
{
    *out = NULL;
    float *v = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!v)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: %s: out of memory", path, w->name);
    kvq_status st = kvq_wt_rows_f32(w, 0, w->rows, v, err);
    if (st != KVQ_OK) {
        free(v);
        return st;
    }
    *out = v;
    return KVQ_OK;
}

/* ==========================================================================
 * Configuration
 * ========================================================================== */

/* Bounds that keep every size product far from overflow and reject absurd headers. */
#define MAX_LAYERS 4096
#define MAX_WIDTH (1 << 20)
#define MAX_HEADS 4096
#define MAX_VOCAB (1 << 24)

/* The fields beyond the llama family: finite, non-negative, and a window that says
 * which layers it covers. */
static kvq_status check_config_extra(const kvq_model_config *c, const char *path, kvq_err *err)
{
    const struct {
        const char *name;
        double v;
    } f[] = {{"attention scale", c->attn_scale},      {"attention softcap", c->attn_softcap},
             {"final logit softcap", c->final_softcap}, {"embedding scale", c->embed_scale},
             {"local RoPE base", c->rope_local_base}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!(f[i].v >= 0) || !isfinite(f[i].v) || f[i].v > 1e30)
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: %s %g out of range", path, f[i].name,
                               f[i].v);
    if (c->rope_local_base != 0 && !(c->rope_local_base > 1))
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: local RoPE base %g must be > 1", path,
                           c->rope_local_base);
    if (c->sliding_window < 0 || c->sliding_from < 0 || c->sliding_period < 0)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: sliding window %d (from layer %d, period %d)",
                           path, c->sliding_window, c->sliding_from, c->sliding_period);
    if (c->rope_local_base > 0 && c->sliding_window == 0)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: a local RoPE base (%g) but no sliding window",
                           path, c->rope_local_base);
    return KVQ_OK;
}

kvq_status kvq_model_check_config(const kvq_model_config *c, const char *path, kvq_err *err)
{
    const struct {
        const char *name;
        int64_t v, max;
    } f[] = {
        {"n_layers", c->n_layers, MAX_LAYERS},     {"dim", c->dim, MAX_WIDTH},
        {"hidden_dim", c->hidden_dim, MAX_WIDTH},  {"n_heads", c->n_heads, MAX_HEADS},
        {"n_kv_heads", c->n_kv_heads, MAX_HEADS},  {"head_dim", c->head_dim, KVQ_ROPE_MAX_DIM},
        {"vocab_size", c->vocab_size, MAX_VOCAB},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v < 1 || f[i].v > f[i].max)
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: %s %lld out of range [1, %lld]", path,
                               f[i].name, (long long)f[i].v, (long long)f[i].max);
    if (c->n_heads % c->n_kv_heads)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: n_heads %d is not a multiple of n_kv_heads %d",
                           path, c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: head_dim %d is odd", path, c->head_dim);
    if ((int64_t)c->n_heads * c->head_dim > MAX_WIDTH)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: n_heads * head_dim too large", path);
    if (!(c->norm_eps > 0) || !isfinite(c->norm_eps))
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: norm eps %g must be > 0", path, c->norm_eps);
    if (c->context_length < 0)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: context length %d", path, c->context_length);
    if (c->rope.head_dim != c->head_dim)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                           "%s: partial rotary embedding (rope dim %d, head dim %d)", path,
                           c->rope.head_dim, c->head_dim);
    kvq_err e = {0};
    kvq_status st = kvq_rope_check(&c->rope, &e);
    if (st != KVQ_OK)
        return kvq_err_set(err, st == KVQ_E_INVALID_ARG ? KVQ_E_CORRUPT : st, "%s: %s", path,
                           e.msg);
    return check_config_extra(c, path, err);
}

/* ==========================================================================
 * Open / close
 * ========================================================================== */

kvq_status kvq_model_open(const char *path, const kvq_model_params *p, kvq_model **out,
                          kvq_err *err)
{
    kvq_status st = KVQ_OK;
    kvq_model_params def = kvq_model_params_default();
    kvq_model *m = NULL;
    *out = NULL;
    if (!p)
        p = &def;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return kvq_err_set(err, KVQ_E_NOT_FOUND, "%s: no such file or directory", path);
    m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    m->cfg.bos_id = m->cfg.eos_id = -1;
    if (S_ISDIR(sb.st_mode)) {
        m->cfg.source = KVQ_MODEL_HF;
        st = kvq_model_load_hf(m, p, err);
    } else {
        m->cfg.source = KVQ_MODEL_GGUF;
        st = kvq_model_load_gguf(m, p, err);
    }
    if (st == KVQ_OK)
        st = kvq_model_compute_fingerprint(m, m->fingerprint, sizeof m->fingerprint, err);
    if (st == KVQ_OK) {
        const char *gname = m->gguf ? kvq_gguf_get_str(m->gguf, "general.name") : NULL;
        if (gname && gname[0])
            snprintf(m->name, sizeof m->name, "%s", gname);
        else
            kvq_path_basename(path, m->name, sizeof m->name);
    }
done:
    if (st != KVQ_OK) {
        kvq_model_close(m);
        return st;
    }
    *out = m;
    return KVQ_OK;
}

void kvq_model_close(kvq_model *m)
{
    if (!m)
        return;
    if (m->layers) {
        for (int32_t l = 0; l < m->cfg.n_layers; l++) {
            kvq_layer_weights *L = &m->layers[l];
            free(L->attn_norm);
            free(L->ffn_norm);
            free(L->bq);
            free(L->bk);
            free(L->bv);
            free(L->q_norm);
            free(L->k_norm);
            free(L->post_attn_norm);
            free(L->post_ffn_norm);
        }
        free(m->layers);
    }
    free(m->out_norm);
    kvq_tokenizer_free(m->tok);
    kvq_gguf_close(m->gguf);
    for (size_t i = 0; i < m->n_shards; i++)
        kvq_st_close(m->shards[i]);
    free(m->shards);
    free(m->path);
    free(m);
}

const kvq_model_config *kvq_model_config_get(const kvq_model *m) { return &m->cfg; }
const char *kvq_model_path(const kvq_model *m) { return m->path; }
const char *kvq_model_fingerprint(const kvq_model *m) { return m->fingerprint; }
const char *kvq_model_name(const kvq_model *m) { return m->name; }
const kvq_tokenizer *kvq_model_tokenizer(const kvq_model *m) { return m->tok; }

void kvq_model_id_from_config(const kvq_model_config *c, const char *path, kvq_model_id *id)
{
    memset(id, 0, sizeof *id);
    kvq_path_basename(path ? path : "", id->path, sizeof id->path);
    snprintf(id->source, sizeof id->source, "%s", kvq_model_source_name(c->source));
    snprintf(id->architecture, sizeof id->architecture, "%s", kvq_arch_name(c->arch));
    id->n_layers = c->n_layers;
    id->dim = c->dim;
    id->hidden_dim = c->hidden_dim;
    id->n_heads = c->n_heads;
    id->n_kv_heads = c->n_kv_heads;
    id->head_dim = c->head_dim;
    id->vocab_size = c->vocab_size;
    id->context_length = c->context_length;
    id->norm_eps = c->norm_eps;
    id->rope = c->rope;
    id->attn.sliding_window = c->sliding_window;
    id->attn.sliding_from = c->sliding_window > 0 ? c->sliding_from : 0;
    id->attn.sliding_period = c->sliding_window > 0 ? c->sliding_period : 0;
    id->attn.rope_local_base = c->rope_local_base;
    id->attn.scale = c->attn_scale;
    id->attn.softcap = c->attn_softcap;
}

kvq_model_config kvq_model_config_from_id(const kvq_model_id *id)
{
    kvq_model_config c;
    memset(&c, 0, sizeof c);
    if (kvq_arch_parse(id->architecture, &c.arch) != 0)
        c.arch = KVQ_ARCH_LLAMA;
    c.source = !strcmp(id->source, "hf") ? KVQ_MODEL_HF : KVQ_MODEL_GGUF;
    c.n_layers = id->n_layers;
    c.dim = id->dim;
    c.hidden_dim = id->hidden_dim;
    c.n_heads = id->n_heads;
    c.n_kv_heads = id->n_kv_heads;
    c.head_dim = id->head_dim;
    c.vocab_size = id->vocab_size;
    c.context_length = id->context_length;
    c.norm_eps = id->norm_eps;
    c.rope = id->rope;
    c.bos_id = c.eos_id = -1;
    c.sliding_window = id->attn.sliding_window;
    c.sliding_from = id->attn.sliding_from;
    c.sliding_period = id->attn.sliding_period;
    c.rope_local_base = id->attn.rope_local_base;
    c.attn_scale = id->attn.scale;
    c.attn_softcap = id->attn.softcap;
    return c;
}

void kvq_model_identity(const kvq_model *m, kvq_model_id *id)
{
    kvq_model_id_from_config(&m->cfg, m->path, id);
    snprintf(id->name, sizeof id->name, "%s", m->name);
    snprintf(id->fingerprint, sizeof id->fingerprint, "%s", m->fingerprint);
}

uint64_t kvq_model_n_params(const kvq_model *m)
{
    const kvq_model_config *c = &m->cfg;
    uint64_t qd = (uint64_t)c->n_heads * c->head_dim, kvd = (uint64_t)c->n_kv_heads * c->head_dim;
    uint64_t per_layer = 2 * (uint64_t)c->dim                       /* norms */
                         + qd * c->dim * 2 + kvd * c->dim * 2       /* wq, wo, wk, wv */
                         + 3 * (uint64_t)c->hidden_dim * c->dim;    /* gate, up, down */
    if (c->qkv_bias)
        per_layer += qd + 2 * kvd;
    if (c->qk_norm)
        per_layer += 2 * (uint64_t)c->head_dim;
    if (c->post_norms)
        per_layer += 2 * (uint64_t)c->dim;
    uint64_t n = per_layer * c->n_layers + (uint64_t)c->vocab_size * c->dim + c->dim;
    if (!c->tied_embeddings)
        n += (uint64_t)c->vocab_size * c->dim;
    return n;
}

/* ==========================================================================
 * Per-layer attention
 * ========================================================================== */

void kvq_model_id_layer_attn(const kvq_model_id *id, int32_t layer, kvq_layer_attn *out)
{
    kvq_model_config c = kvq_model_config_from_id(id);
    kvq_model_layer_attn(&c, layer, out);
}

void kvq_model_layer_attn(const kvq_model_config *c, int32_t layer, kvq_layer_attn *out)
{
    memset(out, 0, sizeof *out);
    out->rope = c->rope;
    out->use_rope = 1;
    out->scale = c->attn_scale > 0 ? c->attn_scale : 1.0 / sqrt((double)c->head_dim);
    out->softcap = c->attn_softcap;
    if (kvq_model_layer_sliding(c, layer)) {
        out->window = c->sliding_window;
        if (c->rope_local_base > 0) { /* gemma3: local layers take the plain local base */
            out->rope.base = c->rope_local_base;
            out->rope.scaling = KVQ_ROPE_SCALING_NONE;
            out->rope.factor = 1.0;
        }
    }
}

const char *kvq_layer_attn_diff(const kvq_layer_attn *a, const kvq_layer_attn *b, double *va,
                                double *vb)
{
    /* scale and softcap within a relative 1e-6: a caller's float of 1/sqrt(144) is one */
#define NEAR(x, y) (fabs((x) - (y)) <= 1e-6 * fabs(y))
#define DIFF(name, x, y, same)                                                                     \
    if (!(same)) {                                                                                 \
        *va = (double)(x);                                                                         \
        *vb = (double)(y);                                                                         \
        return name;                                                                               \
    }
    DIFF("window", a->window, b->window, a->window == b->window)
    DIFF("use_rope", a->use_rope, b->use_rope, a->use_rope == b->use_rope)
    if (a->use_rope) {
        DIFF("rope.base", a->rope.base, b->rope.base, a->rope.base == b->rope.base)
        DIFF("rope.scaling", a->rope.scaling, b->rope.scaling, a->rope.scaling == b->rope.scaling)
        DIFF("rope.factor", a->rope.factor, b->rope.factor,
             a->rope.scaling == KVQ_ROPE_SCALING_NONE || a->rope.factor == b->rope.factor)
    }
    DIFF("scale", a->scale, b->scale, NEAR(a->scale, b->scale))
    DIFF("softcap", a->softcap, b->softcap, NEAR(a->softcap, b->softcap))
#undef DIFF
#undef NEAR
    return NULL;
}

int kvq_model_attn_uniform(const kvq_model_config *c, char *why, size_t cap)
{
    kvq_layer_attn a0, a;
    kvq_model_layer_attn(c, 0, &a0);
    if (why && cap)
        why[0] = '\0';
    const double plain = 1.0 / sqrt((double)c->head_dim);
    if (a0.softcap > 0) {
        if (why)
            snprintf(why, cap, "attention logit softcap %g", a0.softcap);
        return 0;
    }
    if (a0.scale != plain) {
        if (why)
            snprintf(why, cap, "attention scale %.9g, not 1/sqrt(head_dim) = %.9g", a0.scale,
                     plain);
        return 0;
    }
    int seen_window = a0.window > 0;
    for (int32_t l = 1; l < c->n_layers; l++) {
        kvq_model_layer_attn(c, l, &a);
        const char *what = a.rope.base != a0.rope.base || a.rope.scaling != a0.rope.scaling
                               ? "RoPE"
                           : a.use_rope != a0.use_rope ? "no-RoPE layer"
                           : (seen_window && a.window == 0) ? "global layer after a window"
                                                            : NULL;
        if (what) {
            if (why)
                snprintf(why, cap, "layer %d: %s differs from layer 0's (RoPE base %g vs %g, "
                         "window %d vs %d)", (int)l, what, a.rope.base, a0.rope.base,
                         (int)a.window, (int)a0.window);
            return 0;
        }
        seen_window |= a.window > 0;
    }
    return 1;
}
