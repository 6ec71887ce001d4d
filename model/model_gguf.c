/* model_gguf.c — a llama-family model from a GGUF file (llama.cpp's naming).
 *
 * Metadata keys are "<arch>.<name>"; tensors are "token_embd.weight",
 * "blk.<L>.attn_q.weight", ... with ne[0] the input (contiguous) dimension. The
 * llama.cpp converter permutes the Q and K rows of "llama" models so that RoPE pairs
 * adjacent dimensions (interleaved); "qwen2" keeps the HF order (half). */
#include "model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/quant.h"
#include "kvq/tokenizer.h"

/* ==========================================================================
 * Metadata
 * ========================================================================== */

/* Reads integer key "<arch>.<name>" into *out. required: a missing key is
 * KVQ_E_NOT_FOUND; otherwise *out keeps its default. Values above INT32_MAX are
 * KVQ_E_CORRUPT. */
static kvq_status meta_i32(const kvq_gguf *g, const char *path, const char *arch,
                           const char *name, int required, int32_t *out, kvq_err *err)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, name);
    uint64_t v;
    if (kvq_gguf_get_u64(g, key, &v) != 0) {
        if (kvq_gguf_get(g, key))
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: %s is not a non-negative integer", path,
                               key);
        if (required)
            return kvq_err_set(err, KVQ_E_NOT_FOUND, "%s: missing metadata key %s", path, key);
        return KVQ_OK;
    }
    if (v > INT32_MAX)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: %s = %llu out of range", path, key,
                           (unsigned long long)v);
    *out = (int32_t)v;
    return KVQ_OK;
}

static kvq_status meta_f64(const kvq_gguf *g, const char *path, const char *arch,
                           const char *name, int required, double *out, kvq_err *err)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, name);
    if (kvq_gguf_get_f64(g, key, out) != 0) {
        if (kvq_gguf_get(g, key))
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: %s is not a number", path, key);
        if (required)
            return kvq_err_set(err, KVQ_E_NOT_FOUND, "%s: missing metadata key %s", path, key);
    }
    return KVQ_OK;
}

/* ==========================================================================
 * Tensors
 * ========================================================================== */

/* Binds tensor `name` as a [rows, cols] matrix (rows 0: a 1-D vector of cols).
 * A missing tensor is KVQ_E_NOT_FOUND when required, else leaves w->data NULL. */
static kvq_status bind(kvq_model *m, const char *name, int64_t rows, int64_t cols,
                       int required, kvq_wt *w, kvq_err *err)
{
    memset(w, 0, sizeof *w);
    const kvq_gguf_tensor *t = kvq_gguf_find_tensor(m->gguf, name);
    if (!t)
        return required ? kvq_err_set(err, KVQ_E_NOT_FOUND, "%s: missing tensor %s", m->path, name)
                        : KVQ_OK;
    if (!kvq_quant_supported(t->type)) {
        char tn[32];
        if (kvq_ggml_type_name(t->type))
            snprintf(tn, sizeof tn, "%s", kvq_ggml_type_name(t->type));
        else
            snprintf(tn, sizeof tn, "ggml type %u", t->type);
        return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                           "%s: %s: unsupported weight type %s (kvq computes with F32, F16, "
                           "BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)",
                           m->path, name, tn);
    }
    const wt_type type = (wt_type)t->type;
    int64_t want_rows = rows ? rows : 1;
    int ok = t->ne[0] == cols && t->ne[1] == want_rows && t->ne[2] == 1 && t->ne[3] == 1 &&
             (rows || t->ndim == 1);
    if (!ok) {
        if (rows)
            return kvq_err_set(err, KVQ_E_SHAPE_MISMATCH,
                               "%s: %s: shape ne=[%lld, %lld, %lld, %lld], the config needs "
                               "[%lld, %lld]",
                               m->path, name, (long long)t->ne[0], (long long)t->ne[1],
                               (long long)t->ne[2], (long long)t->ne[3], (long long)cols,
                               (long long)rows);
        return kvq_err_set(err, KVQ_E_SHAPE_MISMATCH,
                           "%s: %s: shape ne=[%lld, %lld, %lld, %lld], the config needs [%lld]",
                           m->path, name, (long long)t->ne[0], (long long)t->ne[1],
                           (long long)t->ne[2], (long long)t->ne[3], (long long)cols);
    }
    w->name = t->name;
    w->rows = want_rows;
    w->cols = cols;
    w->type = type;
    w->data = t->data;
    kvq_err qe = {0};
    if (kvq_quant_check(t->type, cols, &w->row_bytes, &qe) != KVQ_OK ||
        w->row_bytes * (size_t)want_rows != t->nbytes)
        return kvq_err_set(err, KVQ_E_SHAPE_MISMATCH, "%s: %s: %s", m->path, name,
                           qe.msg[0] ? qe.msg : "size does not match its shape");
    w->gguf = t;
    m->mapped_bytes += t->nbytes;
    return KVQ_OK;
}

static kvq_status bind_vec(kvq_model *m, const char *name, int64_t n, float **out, kvq_err *err)
{
    kvq_wt w;
    kvq_status st = bind(m, name, 0, n, 1, &w, err);
    return st != KVQ_OK ? st : kvq_wt_vector(&w, n, out, m->path, err);
}

/* ==========================================================================
 * Llama-3 scaling from rope_freqs.weight
 * ==========================================================================
 *
 * The converter stores llama3 scaling as a per-pair divisor F_m of theta_m instead of
 * the parameters. With s = clamp(a theta - b, 0, 1) the llama3 rule is
 * 1/F = (1 - s)/factor + s, and low_freq_factor = 1, high_freq_factor = 1 + 1/b,
 * original_max_pos = 2 pi a / b give exactly that s; so the parameters are recovered
 * from F (factor = max F; a, b from the pairs in the blend region, or from the
 * boundary pairs when fewer than two are in it) and the result is checked pair by
 * pair. Anything that is not llama3 scaling is KVQ_E_UNSUPPORTED. */
static int rope_matches(const kvq_rope *r, const double *want)
{
    double got[KVQ_ROPE_MAX_DIM / 2];
    if (kvq_rope_check(r, NULL) != KVQ_OK)
        return 0;
    kvq_rope_freqs(r, got);
    for (int i = 0; i < r->head_dim / 2; i++)
        if (!(fabs(got[i] - want[i]) <= 1e-4 * want[i]))
            return 0;
    return 1;
}

static int rope_try_line(kvq_rope *r, double factor, double a, double b, const double *want)
{
    if (!(a > 0) || !(b > 0) || !isfinite(a) || !isfinite(b))
        return 0;
    r->scaling = KVQ_ROPE_SCALING_LLAMA3;
    r->factor = factor;
    r->low_freq_factor = 1.0;
    r->high_freq_factor = 1.0 + 1.0 / b;
    r->original_max_pos = 2.0 * M_PI * a / b;
    return rope_matches(r, want);
}

static kvq_status rope_from_freq_factors(kvq_model *m, kvq_err *err)
{
    kvq_rope *r = &m->cfg.rope;
    const int half = r->head_dim / 2;
    const kvq_gguf_tensor *t = kvq_gguf_find_tensor(m->gguf, "rope_freqs.weight");
    if (!t)
        return KVQ_OK;
    if (t->ne[0] != half || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        return kvq_err_set(err, KVQ_E_SHAPE_MISMATCH,
                           "%s: rope_freqs.weight: %lld values, head_dim %d needs %d", m->path,
                           (long long)t->ne[0], r->head_dim, half);
    float F[KVQ_ROPE_MAX_DIM / 2];
    kvq_status st = kvq_gguf_rows_to_f32(t, 0, 1, F, err);
    if (st != KVQ_OK)
        return st;
    double base_theta[KVQ_ROPE_MAX_DIM / 2], want[KVQ_ROPE_MAX_DIM / 2], s[KVQ_ROPE_MAX_DIM / 2];
    kvq_rope plain = *r;
    plain.scaling = KVQ_ROPE_SCALING_NONE;
    kvq_rope_freqs(&plain, base_theta);
    double factor = 0;
    for (int i = 0; i < half; i++) {
        if (!(F[i] > 0) || !isfinite(F[i]))
            goto unsupported;
        want[i] = base_theta[i] / F[i];
        if (F[i] > factor)
            factor = F[i];
    }
    if (factor < 1 + 1e-6) { /* all ones: no scaling */
        if (rope_matches(&plain, want))
            return KVQ_OK;
        goto unsupported;
    }
    /* s per pair; blend pairs strictly inside (0, 1), boundaries on either side. */
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int nb = 0;
    double x_lo = -1, x_hi = -1, x1 = 0, s1 = 0; /* largest theta at s=0, smallest at s=1 */
    for (int i = 0; i < half; i++) {
        s[i] = (1.0 / F[i] - 1.0 / factor) / (1.0 - 1.0 / factor);
        double x = base_theta[i];
        if (s[i] <= 1e-6) {
            if (x_lo < 0 || x > x_lo)
                x_lo = x;
        } else if (s[i] >= 1 - 1e-6) {
            if (x_hi < 0 || x < x_hi)
                x_hi = x;
        } else {
            sx += x, sy += s[i], sxx += x * x, sxy += x * s[i];
            x1 = x, s1 = s[i];
            nb++;
        }
    }
    if (nb >= 2) {
        double a = (nb * sxy - sx * sy) / (nb * sxx - sx * sx);
        double b = (a * sx - sy) / nb;
        if (rope_try_line(r, factor, a, b, want))
            return KVQ_OK;
    } else if (nb == 1) {
        if (x_lo > 0 && rope_try_line(r, factor, s1 / (x1 - x_lo), s1 / (x1 - x_lo) * x_lo, want))
            return KVQ_OK;
        if (x_hi > 0) {
            double a = (1 - s1) / (x_hi - x1);
            if (rope_try_line(r, factor, a, a * x1 - s1, want))
                return KVQ_OK;
        }
    } else if (x_lo > 0 && x_hi > 0) {
        double a = 1.0 / (x_hi - x_lo);
        if (rope_try_line(r, factor, a, a * x_lo, want))
            return KVQ_OK;
    }
unsupported:
    *r = plain;
    return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                       "%s: rope_freqs.weight: unsupported rope scaling (not llama3)", m->path);
}

/* ==========================================================================
 * Loader
 * ========================================================================== */

/* The architecture (general.architecture), its RoPE layout and the features it always
 * has. Every architecture but llama keeps the HF row order (half). */
static kvq_status read_arch(kvq_model *m, const char **arch_out, kvq_err *err)
{
    kvq_model_config *c = &m->cfg;
    const char *path = m->path;
    const char *arch = *arch_out = kvq_gguf_get_str(m->gguf, "general.architecture");
    if (!arch)
        return kvq_err_set(err, KVQ_E_NOT_FOUND, "%s: missing metadata key general.architecture",
                           path);
    if (!*arch)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: metadata general.architecture is empty",
                           path);
    if (kvq_arch_parse(arch, &c->arch) != 0 || c->arch == KVQ_ARCH_MISTRAL)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                           "%s: general.architecture: unsupported architecture '%s' (kvq reads "
                           "llama, qwen2, qwen3, gemma2, gemma3, phi3)", path, arch);
    c->rope = kvq_rope_default(0);
    c->rope.layout = c->arch == KVQ_ARCH_LLAMA ? KVQ_ROPE_INTERLEAVED : KVQ_ROPE_HALF;
    c->qkv_bias = c->arch == KVQ_ARCH_QWEN2;
    c->qk_norm = c->arch == KVQ_ARCH_QWEN3 || c->arch == KVQ_ARCH_GEMMA3;
    if (c->arch == KVQ_ARCH_GEMMA2 || c->arch == KVQ_ARCH_GEMMA3) {
        c->post_norms = 1;
        c->act = KVQ_ACT_GELU_TANH;
    }
    return KVQ_OK;
}

/* The "<arch>.*" keys kvq reads or knows to change nothing it computes. Any other key
 * of the architecture may change the computation (an attention scale, a yarn
 * parameter, experts): it is refused by name rather than ignored. */
static kvq_status check_arch_keys(const kvq_model *m, const char *arch, kvq_err *err)
{
    static const char *const known[] = {
        "context_length", "embedding_length", "feed_forward_length", "block_count",
        "vocab_size", "attention.head_count", "attention.head_count_kv",
        "attention.layer_norm_rms_epsilon", "attention.key_length", "attention.value_length",
        "attention.sliding_window", "rope.dimension_count", "rope.freq_base",
        "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length",
        "rope.scaling.finetuned", "attn_logit_softcapping", "final_logit_softcapping"};
    const size_t al = strlen(arch);
    for (size_t i = 0; i < kvq_gguf_kv_count(m->gguf); i++) {
        const char *key = kvq_gguf_kv_at(m->gguf, i)->key;
        if (!key || strncmp(key, arch, al) != 0 || key[al] != '.')
            continue;
        size_t j = 0;
        while (j < sizeof known / sizeof known[0] && strcmp(key + al + 1, known[j]) != 0)
            j++;
        if (j == sizeof known / sizeof known[0])
            return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                               "%s: metadata key %s: not implemented by kvq (refused rather "
                               "than ignored)", m->path, key);
    }
    return KVQ_OK;
}

/* The gemma settings llama.cpp takes from the architecture rather than the file
 * (src/llama-model.cpp, load_hparams): the sliding-window period (gemma2: 2, gemma3: 6),
 * gemma3's local RoPE base 10000, and the score scale 1/sqrt(head_dim) except for the
 * 27B models (gemma2: 46 layers, gemma3: 62), 1/sqrt(dim / n_heads). */
static kvq_status read_gemma(kvq_model *m, const char *arch, kvq_err *err)
{
    kvq_model_config *c = &m->cfg;
    kvq_status st;
    const int g2 = c->arch == KVQ_ARCH_GEMMA2;
    c->embed_scale = sqrt((double)c->dim);
    c->sliding_period = g2 ? 2 : 6;
    if (g2)
        c->sliding_window = 4096; /* llama.cpp's default when the key is absent */
    if ((st = meta_i32(m->gguf, m->path, arch, "attention.sliding_window", !g2,
                       &c->sliding_window, err)))
        return st;
    if (g2 && ((st = meta_f64(m->gguf, m->path, arch, "attn_logit_softcapping", 0,
                              &c->attn_softcap, err)) ||
               (st = meta_f64(m->gguf, m->path, arch, "final_logit_softcapping", 0,
                              &c->final_softcap, err))))
        return st;
    if (!g2)
        c->rope_local_base = 10000.0;
    const int big = c->n_layers == (g2 ? 46 : 62);
    c->attn_scale = 1.0 / sqrt(big ? (double)(c->dim / c->n_heads) : (double)c->head_dim);
    return KVQ_OK;
}

/* The hyperparameters "<arch>.*" and the RoPE settings: base, dimensions, scaling from
 * metadata (linear) or the llama3 factors tensor. */
static kvq_status read_hparams(kvq_model *m, const char *arch, kvq_err *err)
{
    kvq_status st;
    const kvq_gguf *g = m->gguf;
    kvq_model_config *c = &m->cfg;
    const char *path = m->path;

    /* ---- hyperparameters */
    c->norm_eps = 1e-5;
    c->context_length = 0;
    if ((st = meta_i32(g, path, arch, "embedding_length", 1, &c->dim, err)) ||
        (st = meta_i32(g, path, arch, "feed_forward_length", 1, &c->hidden_dim, err)) ||
        (st = meta_i32(g, path, arch, "block_count", 1, &c->n_layers, err)) ||
        (st = meta_i32(g, path, arch, "attention.head_count", 1, &c->n_heads, err)) ||
        (st = meta_i32(g, path, arch, "context_length", 0, &c->context_length, err)) ||
        (st = meta_i32(g, path, arch, "attention.sliding_window", 0, &c->sliding_window, err)) ||
        (st = meta_f64(g, path, arch, "attention.layer_norm_rms_epsilon", 1, &c->norm_eps, err)))
        return st;
    c->n_kv_heads = c->n_heads;
    c->head_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0;
    if ((st = meta_i32(g, path, arch, "attention.head_count_kv", 0, &c->n_kv_heads, err)) ||
        (st = meta_i32(g, path, arch, "attention.key_length", 0, &c->head_dim, err)))
        return st;
    int32_t vdim = c->head_dim, rope_dim = c->head_dim;
    if ((st = meta_i32(g, path, arch, "attention.value_length", 0, &vdim, err)) ||
        (st = meta_i32(g, path, arch, "rope.dimension_count", 0, &rope_dim, err)))
        return st;
    if (vdim != c->head_dim)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: value head dim %d != key head dim %d",
                           path, vdim, c->head_dim);
    c->rope.head_dim = rope_dim;
    if ((st = meta_f64(g, path, arch, "rope.freq_base", 0, &c->rope.base, err)))
        return st;

    /* ---- rope scaling: metadata (linear), or the llama3 factors tensor */
    char key[160];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    const char *stype = kvq_gguf_get_str(g, key);
    if (stype && strcmp(stype, "none") != 0) {
        if (strcmp(stype, "linear") != 0)
            return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: %s: unsupported rope scaling type "
                               "'%s'", path, key, stype);
        c->rope.scaling = KVQ_ROPE_SCALING_LINEAR;
        if ((st = meta_f64(g, path, arch, "rope.scaling.factor", 1, &c->rope.factor, err)))
            return st;
    }
    if (kvq_gguf_find_tensor(g, "rope_factors_long.weight") ||
        kvq_gguf_find_tensor(g, "rope_factors_short.weight"))
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: rope_factors_long.weight: unsupported "
                           "rope scaling type 'longrope' (Phi-3 long-context)", path);
    if (c->rope.scaling == KVQ_ROPE_SCALING_NONE && rope_dim == c->head_dim && rope_dim > 0 &&
        rope_dim <= KVQ_ROPE_MAX_DIM && rope_dim % 2 == 0 && c->rope.base > 1 &&
        (st = rope_from_freq_factors(m, err)))
        return st;
    const int gemma = c->arch == KVQ_ARCH_GEMMA2 || c->arch == KVQ_ARCH_GEMMA3;
    if (gemma && (st = read_gemma(m, arch, err)))
        return st;
    if (c->arch == KVQ_ARCH_GEMMA3 && c->rope.scaling == KVQ_ROPE_SCALING_LLAMA3)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: rope_freqs.weight: gemma3 with llama3 "
                           "rope scaling", path);
    return check_arch_keys(m, arch, err);
}

/* The vocabulary size from the embedding's rows, BOS / EOS from the tokenizer keys. */
static kvq_status read_vocab(kvq_model *m, kvq_err *err)
{
    const kvq_gguf *g = m->gguf;
    kvq_model_config *c = &m->cfg;
    const char *path = m->path;
    const kvq_gguf_tensor *emb = kvq_gguf_find_tensor(g, "token_embd.weight");
    if (!emb)
        return kvq_err_set(err, KVQ_E_NOT_FOUND, "%s: missing tensor token_embd.weight", path);
    if (emb->ne[1] < 1 || emb->ne[1] > INT32_MAX)
        return kvq_err_set(err, KVQ_E_SHAPE_MISMATCH, "%s: token_embd.weight: %lld rows", path,
                           (long long)emb->ne[1]);
    c->vocab_size = (int32_t)emb->ne[1];
    uint64_t u;
    c->bos_id = kvq_gguf_get_u64(g, "tokenizer.ggml.bos_token_id", &u) == 0 && u < INT32_MAX
                    ? (int32_t)u : -1;
    c->eos_id = kvq_gguf_get_u64(g, "tokenizer.ggml.eos_token_id", &u) == 0 && u < INT32_MAX
                    ? (int32_t)u : -1;
    return KVQ_OK;
}

/* Binds q, k, v of layer l: three tensors, or phi3's fused attn_qkv (rows q, k, v). */
static kvq_status bind_qkv(kvq_model *m, int32_t l, kvq_err *err)
{
    kvq_status st;
    const kvq_model_config *c = &m->cfg;
    const int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    kvq_layer_weights *L = &m->layers[l];
    char n[4][96];
    static const char *const suffix[4] = {"attn_q.weight", "attn_k.weight", "attn_v.weight",
                                          "attn_qkv.weight"};
    for (int i = 0; i < 4; i++)
        snprintf(n[i], sizeof n[i], "blk.%d.%s", l, suffix[i]);
    if (c->arch == KVQ_ARCH_PHI3 && kvq_gguf_find_tensor(m->gguf, n[3])) {
        kvq_wt qkv;
        if ((st = bind(m, n[3], qd + 2 * kvd, c->dim, 1, &qkv, err)))
            return st;
        kvq_wt_slice(&qkv, 0, qd, &L->wq);
        kvq_wt_slice(&qkv, qd, kvd, &L->wk);
        kvq_wt_slice(&qkv, qd + kvd, kvd, &L->wv);
        return KVQ_OK;
    }
    if ((st = bind(m, n[0], qd, c->dim, 1, &L->wq, err)) ||
        (st = bind(m, n[1], kvd, c->dim, 1, &L->wk, err)) ||
        (st = bind(m, n[2], kvd, c->dim, 1, &L->wv, err)))
        return st;
    return KVQ_OK;
}

/* Binds the MLP of layer l: gate, up, down, or phi3's ffn_up holding gate then up. */
static kvq_status bind_mlp(kvq_model *m, int32_t l, kvq_err *err)
{
    kvq_status st;
    const kvq_model_config *c = &m->cfg;
    kvq_layer_weights *L = &m->layers[l];
    char n[3][96];
    static const char *const suffix[3] = {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"};
    for (int i = 0; i < 3; i++)
        snprintf(n[i], sizeof n[i], "blk.%d.%s", l, suffix[i]);
    if ((st = bind(m, n[2], c->dim, c->hidden_dim, 1, &L->w_down, err)))
        return st;
    if (c->arch == KVQ_ARCH_PHI3) {
        kvq_wt gu;
        if ((st = bind(m, n[1], 2 * (int64_t)c->hidden_dim, c->dim, 1, &gu, err)))
            return st;
        kvq_wt_slice(&gu, 0, c->hidden_dim, &L->w_gate);
        kvq_wt_slice(&gu, c->hidden_dim, c->hidden_dim, &L->w_up);
        return KVQ_OK;
    }
    if ((st = bind(m, n[0], c->hidden_dim, c->dim, 1, &L->w_gate, err)) ||
        (st = bind(m, n[1], c->hidden_dim, c->dim, 1, &L->w_up, err)))
        return st;
    return KVQ_OK;
}

/* Binds the weights of layer l ("blk.<l>.*"). */
static kvq_status bind_layer(kvq_model *m, int32_t l, kvq_err *err)
{
    kvq_status st;
    const kvq_model_config *c = &m->cfg;
    const int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    kvq_layer_weights *L = &m->layers[l];
    char n[11][96];
    static const char *const suffix[11] = {
        "attn_output.weight", "attn_norm.weight", "ffn_norm.weight", "attn_q.bias",
        "attn_k.bias", "attn_v.bias", "attn_output.bias", "attn_q_norm.weight",
        "attn_k_norm.weight", "post_attention_norm.weight", "post_ffw_norm.weight"};
    for (int i = 0; i < 11; i++)
        snprintf(n[i], sizeof n[i], "blk.%d.%s", l, suffix[i]);
    if ((st = bind_qkv(m, l, err)) || (st = bind(m, n[0], c->dim, qd, 1, &L->wo, err)) ||
        (st = bind_mlp(m, l, err)) || (st = bind_vec(m, n[1], c->dim, &L->attn_norm, err)) ||
        (st = bind_vec(m, n[2], c->dim, &L->ffn_norm, err)))
        return st;
    if (c->qkv_bias && ((st = bind_vec(m, n[3], qd, &L->bq, err)) ||
                        (st = bind_vec(m, n[4], kvd, &L->bk, err)) ||
                        (st = bind_vec(m, n[5], kvd, &L->bv, err))))
        return st;
    if (c->qk_norm && ((st = bind_vec(m, n[7], c->head_dim, &L->q_norm, err)) ||
                       (st = bind_vec(m, n[8], c->head_dim, &L->k_norm, err))))
        return st;
    if (c->post_norms && ((st = bind_vec(m, n[9], c->dim, &L->post_attn_norm, err)) ||
                          (st = bind_vec(m, n[10], c->dim, &L->post_ffn_norm, err))))
        return st;
    /* Tensors the architecture does not use would be silently ignored: refused. */
    const int unused[4] = {6, c->qk_norm ? -1 : 7, c->post_norms ? -1 : 9, c->qkv_bias ? -1 : 3};
    for (int i = 0; i < 4; i++)
        if (unused[i] >= 0 && kvq_gguf_find_tensor(m->gguf, n[unused[i]]))
            return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: %s: tensor not used by a %s model "
                               "(refused rather than ignored)", m->path, n[unused[i]],
                               kvq_arch_name(c->arch));
    return KVQ_OK;
}

/* Binds the embedding, output and every layer's weights (the config is checked). */
static kvq_status bind_tensors(kvq_model *m, kvq_err *err)
{
    kvq_status st;
    kvq_model_config *c = &m->cfg;
    if ((st = bind(m, "token_embd.weight", c->vocab_size, c->dim, 1, &m->tok_embd, err)) ||
        (st = bind_vec(m, "output_norm.weight", c->dim, &m->out_norm, err)) ||
        (st = bind(m, "output.weight", c->vocab_size, c->dim, 0, &m->output, err)))
        return st;
    if (!m->output.data) {
        c->tied_embeddings = 1;
        m->output = m->tok_embd;
    }
    /* llama models may carry q/k/v biases too (attention_bias); qwen2 always does. */
    if (c->arch == KVQ_ARCH_LLAMA && kvq_gguf_find_tensor(m->gguf, "blk.0.attn_q.bias"))
        c->qkv_bias = 1;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", m->path);
    for (int32_t l = 0; l < c->n_layers; l++)
        if ((st = bind_layer(m, l, err)))
            return st;
    return KVQ_OK;
}

/* The tokenizer in the metadata (optional); it fills in a missing BOS / EOS. */
static kvq_status load_tokenizer(kvq_model *m, const kvq_model_params *p, kvq_err *err)
{
    kvq_status st;
    kvq_model_config *c = &m->cfg;
    const char *path = m->path;
    kvq_tokenizer_params tp = kvq_tokenizer_params_default();
    tp.cb = p->cb;
    tp.accept_approx = p->accept_approx_tokenizer;
    if ((st = kvq_tokenizer_from_gguf_p(m->gguf, path, &tp, &m->tok, err)))
        return st;
    if (c->bos_id < 0)
        c->bos_id = kvq_tokenizer_bos(m->tok);
    if (c->eos_id < 0)
        c->eos_id = kvq_tokenizer_eos(m->tok);
    if (kvq_tokenizer_n_vocab(m->tok) > (uint32_t)c->vocab_size)
        kvq_log(&p->cb, KVQ_LOG_WARN, "%s: tokenizer has %u tokens, the model %d", path,
                kvq_tokenizer_n_vocab(m->tok), c->vocab_size);
    return KVQ_OK;
}

/* block_count against the layers the tensors name ("blk.N."): a file whose count says
 * fewer (or more) layers than it holds would run some of them silently. */
static kvq_status check_block_count(const kvq_model *m, kvq_err *err)
{
    long top = -1;
    for (size_t i = 0; i < kvq_gguf_tensor_count(m->gguf); i++) {
        const char *name = kvq_gguf_tensor_at(m->gguf, i)->name;
        char *end;
        if (strncmp(name, "blk.", 4))
            continue;
        const long b = strtol(name + 4, &end, 10);
        if (end != name + 4 && *end == '.' && b > top)
            top = b;
    }
    if (top + 1 != m->cfg.n_layers)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: block_count is %d but its tensors are of "
                           "%ld layers (blk.0 .. blk.%ld)", m->path, m->cfg.n_layers, top + 1,
                           top);
    return KVQ_OK;
}

kvq_status kvq_model_load_gguf(kvq_model *m, const kvq_model_params *p, kvq_err *err)
{
    kvq_status st = kvq_gguf_open(m->path, &m->gguf, err);
    if (st != KVQ_OK)
        return st;
    const char *arch = NULL;
    if ((st = read_arch(m, &arch, err)) || (st = read_hparams(m, arch, err)) ||
        (st = read_vocab(m, err)) || (st = kvq_model_check_config(&m->cfg, m->path, err)) ||
        (st = check_block_count(m, err)) || (st = bind_tensors(m, err)))
        return st;
    if (m->cfg.context_length == 0)
        kvq_log(&p->cb, KVQ_LOG_WARN, "%s: context_length is 0 (not recorded): positions "
                "are not checked against the length the model was trained for", m->path);
    if (p->load_tokenizer && kvq_gguf_get(m->gguf, "tokenizer.ggml.model"))
        return load_tokenizer(m, p, err);
    return KVQ_OK;
}
