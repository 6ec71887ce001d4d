/* tinyllama.c — see tinyllama.h. */
#include "helpers/tinyllama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvq/gguf.h"
#include "kvq/half.h"
#include "kvq/safetensors.h"
#include "kvq/util.h"

tinyllama_spec tinyllama_default(void)
{
    tinyllama_spec s = {
        .arch = "llama",
        .dim = 64, .hidden_dim = 128, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
        .head_dim = 16, .vocab = 96, .context_length = 256,
        .norm_eps = 1e-5, .rope_base = 10000.0,
        .scaling = KVQ_ROPE_SCALING_NONE, .factor = 1.0, .low_freq_factor = 1.0,
        .high_freq_factor = 4.0, .original_max_pos = 8192.0,
        .n_shards = 1, .seed = 1,
    };
    return s;
}

/* ==========================================================================
 * Random weights
 * ========================================================================== */

static int wrote_err(const char *what, const kvq_err *e)
{
    fprintf(stderr, "tinyllama: %s: %s\n", what, e ? e->msg : "failed");
    return -1;
}

/* Rounds x [rows, cols] through the storage type so both forms hold the same values. */
static void round_through(float *x, int64_t rows, int64_t cols, tinyllama_wtype t)
{
    size_t n = (size_t)(rows * cols);
    if (t == TINYLLAMA_F16)
        for (size_t i = 0; i < n; i++)
            x[i] = kvq_f16_to_f32_ref(kvq_f32_to_f16_ref(x[i]));
    else if (t == TINYLLAMA_BF16)
        for (size_t i = 0; i < n; i++)
            x[i] = kvq_bf16_to_f32_ref(kvq_f32_to_bf16_ref(x[i]));
    else if (t == TINYLLAMA_Q8_0) {
        void *blocks = malloc(n / 32 * 34);
        kvq_quant_q8_0_ref(x, blocks, n);
        kvq_dequant_q8_0_ref(blocks, x, n);
        free(blocks);
    }
}

/* [rows, cols] uniform in [-a, a] with a = gain / sqrt(cols), rounded through t. */
static float *rand_matrix(kvq_rng *r, int64_t rows, int64_t cols, double gain, tinyllama_wtype t)
{
    float *m = malloc(sizeof(float) * (size_t)(rows * cols));
    if (!m)
        return NULL;
    double a = gain / sqrt((double)cols);
    for (int64_t i = 0; i < rows * cols; i++)
        m[i] = (float)((2 * kvq_rng_uniform(r) - 1) * a);
    round_through(m, rows, cols, t);
    return m;
}

/* [n] values center + uniform in [-spread, spread]. */
static float *rand_vector(kvq_rng *r, int64_t n, double center, double spread)
{
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v)
        return NULL;
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)(center + (2 * kvq_rng_uniform(r) - 1) * spread);
    return v;
}

tinyllama *tinyllama_new(const tinyllama_spec *s)
{
    tinyllama *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->s = *s;
    kvq_rng r;
    kvq_rng_seed(&r, s->seed);
    const int64_t qd = (int64_t)s->n_heads * s->head_dim, kvd = (int64_t)s->n_kv_heads * s->head_dim;
    const int qwen = !strcmp(s->arch, "qwen2");
    int ok = 1;
    t->embed = rand_matrix(&r, s->vocab, s->dim, sqrt((double)s->dim), s->wtype);
    t->norm = rand_vector(&r, s->dim, 1.0, 0.1);
    if (!s->tied)
        t->output = rand_matrix(&r, s->vocab, s->dim, 2.0, s->wtype);
    ok = t->embed && t->norm && (s->tied || t->output);
    t->layers = calloc((size_t)s->n_layers, sizeof *t->layers);
    ok = ok && t->layers;
    for (int l = 0; ok && l < s->n_layers; l++) {
        tinyllama_layer *L = &t->layers[l];
        L->attn_norm = rand_vector(&r, s->dim, 1.0, 0.1);
        L->wq = rand_matrix(&r, qd, s->dim, 2.0, s->wtype);
        L->wk = rand_matrix(&r, kvd, s->dim, 2.0, s->wtype);
        L->wv = rand_matrix(&r, kvd, s->dim, 1.0, s->wtype);
        L->wo = rand_matrix(&r, s->dim, qd, 1.0, s->wtype);
        L->ffn_norm = rand_vector(&r, s->dim, 1.0, 0.1);
        L->wg = rand_matrix(&r, s->hidden_dim, s->dim, 1.0, s->wtype);
        L->wu = rand_matrix(&r, s->hidden_dim, s->dim, 1.0, s->wtype);
        L->wd = rand_matrix(&r, s->dim, s->hidden_dim, 1.0, s->wtype);
        ok = L->attn_norm && L->wq && L->wk && L->wv && L->wo && L->ffn_norm && L->wg && L->wu &&
             L->wd;
        if (ok && qwen) {
            L->bq = rand_vector(&r, qd, 0.0, 0.2);
            L->bk = rand_vector(&r, kvd, 0.0, 0.2);
            L->bv = rand_vector(&r, kvd, 0.0, 0.2);
            ok = L->bq && L->bk && L->bv;
        }
    }
    if (!ok) {
        tinyllama_free(t);
        return NULL;
    }
    return t;
}

void tinyllama_free(tinyllama *t)
{
    if (!t)
        return;
    for (int l = 0; t->layers && l < t->s.n_layers; l++) {
        tinyllama_layer *L = &t->layers[l];
        float *p[] = {L->wq, L->wk, L->wv, L->wo, L->wg, L->wu, L->wd, L->attn_norm,
                      L->ffn_norm, L->bq, L->bk, L->bv};
        for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
            free(p[i]);
    }
    free(t->layers);
    free(t->embed);
    free(t->output);
    free(t->norm);
    free(t);
}

/* ==========================================================================
 * Tensor list (shared by both writers)
 * ========================================================================== */

typedef struct tl_tensor {
    char hf[128], gguf[64];
    const float *data;
    int64_t rows, cols;   /* rows 0: 1-D of cols */
    int permute;          /* GGUF llama: Q/K rows to interleaved order, heads of head_dim */
    int is_weight;        /* 2-D weight stored as wtype */
} tl_tensor;

static int add(tl_tensor *v, int n, const char *hf, const char *gguf, const float *data,
               int64_t rows, int64_t cols, int permute)
{
    tl_tensor *t = &v[n];
    snprintf(t->hf, sizeof t->hf, "%s", hf);
    snprintf(t->gguf, sizeof t->gguf, "%s", gguf);
    t->data = data;
    t->rows = rows;
    t->cols = cols;
    t->permute = permute;
    t->is_weight = rows > 0;
    return n + 1;
}

/* Every tensor in HF order. Returns the count; v must hold 4 + 12 * n_layers. */
static int list_tensors(const tinyllama *t, tl_tensor *v)
{
    const tinyllama_spec *s = &t->s;
    const int64_t qd = (int64_t)s->n_heads * s->head_dim, kvd = (int64_t)s->n_kv_heads * s->head_dim;
    const int perm = !strcmp(s->arch, "llama") || !strcmp(s->arch, "mistral");
    int n = 0;
    n = add(v, n, "model.embed_tokens.weight", "token_embd.weight", t->embed, s->vocab, s->dim, 0);
    for (int l = 0; l < s->n_layers; l++) {
        const tinyllama_layer *L = &t->layers[l];
        char h[12][128], g[12][64];
        static const char *const hs[12] = {
            "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
            "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_proj.bias",
            "self_attn.k_proj.bias", "self_attn.v_proj.bias", "post_attention_layernorm.weight",
            "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
        static const char *const gs[12] = {
            "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
            "attn_output.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias",
            "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"};
        for (int i = 0; i < 12; i++) {
            snprintf(h[i], sizeof h[i], "model.layers.%d.%s", l, hs[i]);
            snprintf(g[i], sizeof g[i], "blk.%d.%s", l, gs[i]);
        }
        n = add(v, n, h[0], g[0], L->attn_norm, 0, s->dim, 0);
        n = add(v, n, h[1], g[1], L->wq, qd, s->dim, perm);
        n = add(v, n, h[2], g[2], L->wk, kvd, s->dim, perm);
        n = add(v, n, h[3], g[3], L->wv, kvd, s->dim, 0);
        n = add(v, n, h[4], g[4], L->wo, s->dim, qd, 0);
        if (L->bq) {
            n = add(v, n, h[5], g[5], L->bq, 0, qd, 0);
            n = add(v, n, h[6], g[6], L->bk, 0, kvd, 0);
            n = add(v, n, h[7], g[7], L->bv, 0, kvd, 0);
        }
        n = add(v, n, h[8], g[8], L->ffn_norm, 0, s->dim, 0);
        n = add(v, n, h[9], g[9], L->wg, s->hidden_dim, s->dim, 0);
        n = add(v, n, h[10], g[10], L->wu, s->hidden_dim, s->dim, 0);
        n = add(v, n, h[11], g[11], L->wd, s->dim, s->hidden_dim, 0);
    }
    n = add(v, n, "model.norm.weight", "output_norm.weight", t->norm, 0, s->dim, 0);
    if (t->output)
        n = add(v, n, "lm_head.weight", "output.weight", t->output, s->vocab, s->dim, 0);
    return n;
}

/* The values of one tensor as written, rows permuted for GGUF llama Q/K: a malloc'd
 * [rows, cols] copy. */
static float *tensor_rows(const tl_tensor *t, int head_dim, int permute)
{
    int64_t rows = t->rows ? t->rows : 1, cols = t->cols;
    float *out = malloc(sizeof(float) * (size_t)(rows * cols));
    if (!out)
        return NULL;
    if (permute) {
        /* HF row (head h, i * d/2 + m) -> GGUF row (head h, 2m + i): the rows of each
         * head go from the half order to the interleaved one. */
        const int half = head_dim / 2;
        for (int64_t h = 0; h < rows / head_dim; h++)
            for (int i = 0; i < 2; i++)
                for (int m = 0; m < half; m++)
                    memcpy(out + (h * head_dim + 2 * m + i) * cols,
                           t->data + (h * head_dim + i * half + m) * cols,
                           sizeof(float) * (size_t)cols);
    } else {
        memcpy(out, t->data, sizeof(float) * (size_t)(rows * cols));
    }
    return out;
}

static int is(const char *edit, const char *name) { return edit && !strcmp(edit, name); }

/* ==========================================================================
 * HF directory
 * ========================================================================== */

static int write_config(const tinyllama *t, const char *dir)
{
    const tinyllama_spec *s = &t->s;
    const char *arch = s->edit_arch ? s->edit_arch : s->arch;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return wrote_err(path, NULL);
    const char *cls = !strcmp(arch, "qwen2") ? "Qwen2ForCausalLM"
                      : !strcmp(arch, "mistral") ? "MistralForCausalLM"
                      : !strcmp(arch, "llama") ? "LlamaForCausalLM" : "UnknownForCausalLM";
    static const char *const dt[] = {"float32", "float16", "bfloat16", "float32"};
    fprintf(f, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n", cls, arch);
    fprintf(f, "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n", s->dim, s->hidden_dim);
    fprintf(f, "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n", s->n_layers,
            s->n_heads);
    fprintf(f, "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n", s->n_kv_heads, s->head_dim);
    fprintf(f, "  \"vocab_size\": %d,\n  \"max_position_embeddings\": %d,\n", s->vocab,
            s->context_length);
    fprintf(f, "  \"rms_norm_eps\": %.17g,\n  \"rope_theta\": %.17g,\n", s->norm_eps, s->rope_base);
    fprintf(f, "  \"hidden_act\": \"silu\",\n  \"tie_word_embeddings\": %s,\n",
            s->tied ? "true" : "false");
    fprintf(f, "  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"torch_dtype\": \"%s\",\n",
            dt[s->wtype]);
    if (s->edit_rope_type)
        fprintf(f, "  \"rope_scaling\": {\"rope_type\": \"%s\", \"factor\": 2.0},\n",
                s->edit_rope_type);
    else if (s->scaling == KVQ_ROPE_SCALING_LINEAR)
        fprintf(f, "  \"rope_scaling\": {\"type\": \"linear\", \"factor\": %.17g},\n", s->factor);
    else if (s->scaling == KVQ_ROPE_SCALING_LLAMA3)
        fprintf(f,
                "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %.17g, "
                "\"low_freq_factor\": %.17g, \"high_freq_factor\": %.17g, "
                "\"original_max_position_embeddings\": %.17g},\n",
                s->factor, s->low_freq_factor, s->high_freq_factor, s->original_max_pos);
    else
        fprintf(f, "  \"rope_scaling\": null,\n");
    if (s->hf_extra)
        fprintf(f, "  %s,\n", s->hf_extra);
    fprintf(f, "  \"transformers_version\": \"4.44.0\"\n}\n");
    return fclose(f) == 0 ? 0 : wrote_err(path, NULL);
}

/* One safetensors file with tensors v[i] for i % n_shards == shard. */
static int write_shard(const tinyllama *t, const tl_tensor *v, int n, int shard,
                       const char *path)
{
    const tinyllama_spec *s = &t->s;
    kvq_err e = {0};
    int rc = -1;
    kvq_st_writer *w = kvq_st_writer_new();
    if (!w)
        return wrote_err(path, NULL);
    static const kvq_dtype dts[] = {KVQ_DT_F32, KVQ_DT_F16, KVQ_DT_BF16, KVQ_DT_F32};
    for (int i = 0; i < n; i++) {
        if (i % s->n_shards != shard || is(s->edit_drop, v[i].hf))
            continue;
        const int sh = is(s->edit_short, v[i].hf);
        int64_t shape[2] = {v[i].rows ? v[i].rows - sh : v[i].cols - sh, v[i].cols};
        kvq_dtype dt = is(s->edit_bad_type, v[i].hf) ? KVQ_DT_I8
                       : v[i].is_weight ? dts[s->wtype] : KVQ_DT_F32;
        if (kvq_st_writer_declare(w, v[i].hf, dt, v[i].rows ? 2 : 1, shape, &e))
            goto done;
    }
    if (kvq_st_writer_set_meta(w, "format", "pt", &e) || kvq_st_writer_begin_file(w, path, 1, &e))
        goto done;
    for (int i = 0; i < n; i++) {
        if (i % s->n_shards != shard || is(s->edit_drop, v[i].hf))
            continue;
        float *x = tensor_rows(&v[i], s->head_dim, 0);
        if (!x)
            goto done;
        /* edit_short: one row (or, for a vector, one value) fewer */
        const int sh = is(s->edit_short, v[i].hf);
        size_t cnt = (size_t)(v[i].rows ? (v[i].rows - sh) * v[i].cols : v[i].cols - sh);
        kvq_status st;
        if (is(s->edit_bad_type, v[i].hf)) {
            int8_t *b = calloc(cnt, 1);
            st = b ? kvq_st_writer_write(w, b, cnt, &e) : KVQ_E_NOMEM;
            free(b);
        } else if (v[i].is_weight && (s->wtype == TINYLLAMA_F16 || s->wtype == TINYLLAMA_BF16)) {
            uint16_t *h = malloc(cnt * 2);
            if (h && s->wtype == TINYLLAMA_F16)
                kvq_f32_to_f16(x, h, cnt);
            else if (h)
                kvq_f32_to_bf16(x, h, cnt);
            st = h ? kvq_st_writer_write(w, h, cnt * 2, &e) : KVQ_E_NOMEM;
            free(h);
        } else {
            st = kvq_st_writer_write(w, x, cnt * 4, &e);
        }
        free(x);
        if (st)
            goto done;
    }
    if (kvq_st_writer_finish(w, &e))
        goto done;
    rc = 0;
done:
    kvq_st_writer_free(w);
    return rc ? wrote_err(path, &e) : 0;
}

int tinyllama_write_hf(const tinyllama *t, const char *dir)
{
    const tinyllama_spec *s = &t->s;
    int rc = -1;
    tl_tensor *v = calloc((size_t)(4 + 12 * s->n_layers), sizeof *v);
    if (!v)
        return -1;
    int n = list_tensors(t, v);
    mkdir(dir, 0755);
    if (write_config(t, dir))
        goto done;
    char path[4096];
    if (s->n_shards <= 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = write_shard(t, v, n, 0, path);
        goto done;
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        goto done;
    fprintf(f, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    for (int i = 0, first = 1; i < n; i++) {
        if (is(s->edit_drop, v[i].hf))
            continue;
        fprintf(f, "%s\n  \"%s\": \"model-%05d-of-%05d.safetensors\"", first ? "" : ",", v[i].hf,
                i % s->n_shards + 1, s->n_shards);
        first = 0;
    }
    fprintf(f, "\n}}\n");
    if (fclose(f) != 0)
        goto done;
    for (int k = 0; k < s->n_shards; k++) {
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, k + 1, s->n_shards);
        if (write_shard(t, v, n, k, path))
            goto done;
    }
    rc = 0;
done:
    free(v);
    return rc;
}

/* ==========================================================================
 * GGUF file
 * ========================================================================== */

static int set_str(kvq_gguf_writer *w, const char *key, const char *s, kvq_err *e)
{
    kvq_gguf_value v = {.type = KVQ_GGUF_STRING};
    v.v.str.s = s;
    v.v.str.len = strlen(s);
    return kvq_gguf_writer_set(w, key, &v, e) != KVQ_OK;
}

static int set_u32(kvq_gguf_writer *w, const char *arch, const char *name, uint64_t x,
                   kvq_err *e)
{
    char key[128];
    snprintf(key, sizeof key, "%s%s%s", arch ? arch : "", arch ? "." : "", name);
    kvq_gguf_value v = {.type = KVQ_GGUF_UINT32};
    v.v.u = x;
    return kvq_gguf_writer_set(w, key, &v, e) != KVQ_OK;
}

static int set_f32(kvq_gguf_writer *w, const char *arch, const char *name, double x, kvq_err *e)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, name);
    kvq_gguf_value v = {.type = KVQ_GGUF_FLOAT32};
    v.v.f = (float)x;
    return kvq_gguf_writer_set(w, key, &v, e) != KVQ_OK;
}

/* Adds one tensor in the GGUF storage type. */
static int add_gguf_tensor(kvq_gguf_writer *w, const tinyllama *t, const tl_tensor *tt,
                           int permute, kvq_err *e)
{
    const tinyllama_spec *s = &t->s;
    float *x = tensor_rows(tt, s->head_dim, permute);
    if (!x)
        return -1;
    /* edit_short: one row (or, for a vector, one value) fewer */
    const int sh = is(s->edit_short, tt->gguf);
    int64_t ne[2] = {tt->rows ? tt->cols : tt->cols - sh, tt->rows - sh};
    size_t cnt = (size_t)(tt->rows ? ne[0] * ne[1] : ne[0]);
    uint32_t ndim = tt->rows ? 2 : 1;
    int rc = -1;
    void *buf = NULL;
    if (is(s->edit_bad_type, tt->gguf)) {
        size_t nb = cnt / 256 * 66; /* IQ2_XXS (ggml type 16): 256 values in 66 bytes */
        buf = calloc(nb ? nb : 1, 1);
        rc = buf && !kvq_gguf_writer_add_tensor(w, tt->gguf, 16, ndim, ne, buf, nb, e)
                 ? 0 : -1;
    } else if (!tt->is_weight || s->wtype == TINYLLAMA_F32) {
        rc = kvq_gguf_writer_add_tensor(w, tt->gguf, KVQ_GGML_F32, ndim, ne, x, cnt * 4, e) ? -1 : 0;
    } else if (s->wtype == TINYLLAMA_Q8_0) {
        size_t nb = cnt / 32 * 34;
        buf = malloc(nb);
        if (buf)
            kvq_quant_q8_0_ref(x, buf, cnt);
        rc = buf && !kvq_gguf_writer_add_tensor(w, tt->gguf, KVQ_GGML_Q8_0, ndim, ne, buf, nb, e)
                 ? 0 : -1;
    } else {
        uint16_t *h = malloc(cnt * 2);
        buf = h;
        if (h && s->wtype == TINYLLAMA_F16)
            kvq_f32_to_f16(x, h, cnt);
        else if (h)
            kvq_f32_to_bf16(x, h, cnt);
        rc = h && !kvq_gguf_writer_add_tensor(w, tt->gguf,
                                              s->wtype == TINYLLAMA_F16 ? KVQ_GGML_F16
                                                                        : KVQ_GGML_BF16,
                                              ndim, ne, h, cnt * 2, e)
                 ? 0 : -1;
    }
    free(buf);
    free(x);
    return rc;
}

/* Copies tokenizer.* metadata from another GGUF file. */
static int copy_tokenizer(kvq_gguf_writer *w, const char *from, kvq_err *e)
{
    kvq_gguf *g = NULL;
    if (kvq_gguf_open(from, &g, e))
        return -1;
    int rc = 0;
    for (size_t i = 0; i < kvq_gguf_kv_count(g) && !rc; i++) {
        const kvq_gguf_kv *kv = kvq_gguf_kv_at(g, i);
        if (!strncmp(kv->key, "tokenizer.", 10))
            rc = kvq_gguf_writer_set(w, kv->key, &kv->value, e) != KVQ_OK;
    }
    kvq_gguf_close(g);
    return rc;
}

int tinyllama_write_gguf(const tinyllama *t, const char *path)
{
    const tinyllama_spec *s = &t->s;
    const char *arch = s->edit_arch ? s->edit_arch : s->arch;
    const int permute = !strcmp(s->arch, "llama") || !strcmp(s->arch, "mistral");
    kvq_err e = {0};
    int rc = -1;
    float *freqs = NULL;
    kvq_gguf_writer *w = kvq_gguf_writer_new();
    tl_tensor *v = calloc((size_t)(4 + 12 * s->n_layers), sizeof *v);
    if (!w || !v)
        goto done;
    if (set_str(w, "general.architecture", arch, &e) || set_str(w, "general.name", "tinyllama", &e) ||
        set_u32(w, arch, "context_length", (uint64_t)s->context_length, &e) ||
        set_u32(w, arch, "embedding_length", (uint64_t)s->dim, &e) ||
        set_u32(w, arch, "feed_forward_length", (uint64_t)s->hidden_dim, &e) ||
        set_u32(w, arch, "block_count", (uint64_t)s->n_layers, &e) ||
        set_u32(w, arch, "attention.head_count", (uint64_t)s->n_heads, &e) ||
        set_u32(w, arch, "attention.head_count_kv", (uint64_t)s->n_kv_heads, &e) ||
        set_u32(w, arch, "attention.key_length", (uint64_t)s->head_dim, &e) ||
        set_u32(w, arch, "attention.value_length", (uint64_t)s->head_dim, &e) ||
        set_u32(w, arch, "rope.dimension_count", (uint64_t)s->head_dim, &e) ||
        set_f32(w, arch, "rope.freq_base", s->rope_base, &e) ||
        set_f32(w, arch, "attention.layer_norm_rms_epsilon", s->norm_eps, &e) ||
        set_u32(w, NULL, "tokenizer.ggml.bos_token_id", 1, &e) ||
        set_u32(w, NULL, "tokenizer.ggml.eos_token_id", 2, &e))
        goto done;
    if (s->tokenizer_from && copy_tokenizer(w, s->tokenizer_from, &e))
        goto done;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (s->edit_rope_type) {
        if (set_str(w, key, s->edit_rope_type, &e) || set_f32(w, arch, "rope.scaling.factor", 2, &e))
            goto done;
    } else if (s->scaling == KVQ_ROPE_SCALING_LINEAR) {
        if (set_str(w, key, "linear", &e) || set_f32(w, arch, "rope.scaling.factor", s->factor, &e))
            goto done;
    }
    int n = list_tensors(t, v);
    for (int i = 0; i < n; i++) {
        if (is(s->edit_drop, v[i].gguf))
            continue;
        if (add_gguf_tensor(w, t, &v[i], permute && v[i].permute, &e))
            goto done;
    }
    if (s->scaling == KVQ_ROPE_SCALING_LLAMA3) {
        /* As llama.cpp's converter: the per-pair divisors of theta, not the parameters. */
        kvq_rope r = kvq_rope_default(s->head_dim), plain;
        r.base = s->rope_base;
        r.scaling = KVQ_ROPE_SCALING_LLAMA3;
        r.factor = s->factor;
        r.low_freq_factor = s->low_freq_factor;
        r.high_freq_factor = s->high_freq_factor;
        r.original_max_pos = s->original_max_pos;
        plain = r;
        plain.scaling = KVQ_ROPE_SCALING_NONE;
        double th[KVQ_ROPE_MAX_DIM / 2], th0[KVQ_ROPE_MAX_DIM / 2];
        kvq_rope_freqs(&r, th);
        kvq_rope_freqs(&plain, th0);
        freqs = malloc(sizeof(float) * (size_t)(s->head_dim / 2));
        if (!freqs)
            goto done;
        for (int m = 0; m < s->head_dim / 2; m++)
            freqs[m] = (float)(th0[m] / th[m]);
        int64_t ne[1] = {s->head_dim / 2};
        if (kvq_gguf_writer_add_tensor(w, "rope_freqs.weight", KVQ_GGML_F32, 1, ne, freqs,
                                       sizeof(float) * (size_t)(s->head_dim / 2), &e))
            goto done;
    }
    if (kvq_gguf_writer_write(w, path, 1, &e))
        goto done;
    rc = 0;
done:
    free(freqs);
    free(v);
    kvq_gguf_writer_free(w);
    return rc ? wrote_err(path, &e) : 0;
}
