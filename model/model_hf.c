/* model_hf.c — a llama-family model from a Hugging Face directory: config.json plus
 * model.safetensors, or the shards named by model.safetensors.index.json.
 *
 * HF checkpoints keep q_proj/k_proj rows in the order RoPE pairs dimension m with
 * m + d/2 ("half"). Tensors are [out, in] row-major. */
#include "model_internal.h"
#include "kvq/util.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvq/tokenizer.h"

#define HF_MAX_JSON (64u << 20) /* config.json / index.json larger than this is refused */

/* ==========================================================================
 * JSON helpers
 * ========================================================================== */

/* Reads and parses a JSON file. A missing file is KVQ_E_NOT_FOUND. */
static kvq_status read_json(const char *path, cJSON **out, kvq_err *err)
{
    uint8_t *data = NULL;
    size_t size = 0;
    *out = NULL;
    kvq_status st = kvq_read_file(path, &data, &size, err);
    if (st != KVQ_OK)
        return st;
    if (size > HF_MAX_JSON) {
        free(data);
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: %zu bytes", path, size);
    }
    *out = cJSON_ParseWithLength((const char *)data, size);
    free(data);
    if (!*out || !cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: not a JSON object", path);
    }
    return KVQ_OK;
}

/* An integer key: absent or null keeps *out (KVQ_E_BAD_JSON when required);
 * a non-integer or out-of-range value is KVQ_E_BAD_JSON. */
static kvq_status json_i32(const cJSON *o, const char *key, int required, int32_t *out,
                           const char *path, kvq_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v))
        return required ? kvq_err_set(err, KVQ_E_BAD_JSON, "%s: missing key \"%s\"", path, key)
                        : KVQ_OK;
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || d != floor(d) || d < 0 || d > INT32_MAX)
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: \"%s\" is not a non-negative integer", path,
                           key);
    *out = (int32_t)d;
    return KVQ_OK;
}

/* sliding_window, and which layers use it: all for mistral; for qwen2 those from
 * max_window_layers on (transformers' default 28 when the key is absent). A
 * "layer_types" list, when present, must be full attention then sliding attention
 * (any other pattern is refused) and decides. */
static kvq_status parse_sliding_window(const cJSON *cfg, kvq_model_config *c, const char *path,
                                       kvq_err *err);

static kvq_status json_f64(const cJSON *o, const char *key, double *out, const char *path,
                           kvq_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v))
        return KVQ_OK;
    if (!cJSON_IsNumber(v))
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: \"%s\" is not a number", path, key);
    *out = v->valuedouble;
    return KVQ_OK;
}

static kvq_status parse_sliding_window(const cJSON *cfg, kvq_model_config *c, const char *path,
                                       kvq_err *err)
{
    kvq_status st;
    c->sliding_window = 0;
    c->sliding_from = 0;
    if ((st = json_i32(cfg, "sliding_window", 0, &c->sliding_window, path, err)))
        return st;
    if (c->sliding_window == 0)
        return KVQ_OK;
    if (c->arch == KVQ_ARCH_QWEN2) {
        c->sliding_from = 28;
        if ((st = json_i32(cfg, "max_window_layers", 0, &c->sliding_from, path, err)))
            return st;
    }
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(cfg, "layer_types");
    if (types && !cJSON_IsNull(types)) {
        int32_t first = -1, i = 0;
        const cJSON *t;
        if (!cJSON_IsArray(types))
            return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: \"layer_types\" is not a list", path);
        cJSON_ArrayForEach(t, types)
        {
            const int sliding = cJSON_IsString(t) && !strcmp(t->valuestring, "sliding_attention");
            if (!sliding && !(cJSON_IsString(t) && !strcmp(t->valuestring, "full_attention")))
                return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: layer_types[%d] is not "
                                   "full_attention or sliding_attention", path, (int)i);
            if (sliding && first < 0)
                first = i;
            if (!sliding && first >= 0)
                return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                                   "%s: layer_types: full attention after sliding attention "
                                   "(layer %d) is not supported", path, (int)i);
            i++;
        }
        if (first < 0) /* no sliding layer */
            c->sliding_window = 0;
        c->sliding_from = first < 0 ? 0 : first;
    }
    return KVQ_OK;
}

static kvq_status json_bool(const cJSON *o, const char *key, int *out, const char *path,
                            kvq_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v))
        return KVQ_OK;
    if (!cJSON_IsBool(v))
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: \"%s\" is not a boolean", path, key);
    *out = cJSON_IsTrue(v);
    return KVQ_OK;
}

/* A token id: an integer, or a list whose first element is one (eos lists). */
static int32_t json_token_id(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsArray(v))
        v = cJSON_GetArrayItem(v, 0);
    if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < INT32_MAX &&
        v->valuedouble == floor(v->valuedouble))
        return (int32_t)v->valuedouble;
    return -1;
}

/* ==========================================================================
 * config.json
 * ========================================================================== */

static kvq_status parse_arch(const cJSON *cfg, kvq_model_config *c, const char *path,
                             kvq_err *err)
{
    static const struct {
        const char *type, *cls;
        kvq_arch arch;
    } known[] = {
        {"llama", "LlamaForCausalLM", KVQ_ARCH_LLAMA},
        {"mistral", "MistralForCausalLM", KVQ_ARCH_MISTRAL},
        {"qwen2", "Qwen2ForCausalLM", KVQ_ARCH_QWEN2},
    };
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(cfg, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    const char *name = cJSON_IsString(mt) ? mt->valuestring : NULL;
    const char *cls = cJSON_IsString(a0) ? a0->valuestring : NULL;
    if (!name && !cls)
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: missing key \"model_type\"", path);
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (name ? !strcmp(name, known[i].type) : !strcmp(cls, known[i].cls)) {
            c->arch = known[i].arch;
            return KVQ_OK;
        }
    return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: unsupported architecture '%s'", path,
                       name ? name : cls);
}

static kvq_status parse_rope_scaling(const cJSON *cfg, kvq_rope *r, const char *path,
                                     kvq_err *err)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling");
    if (!rs || cJSON_IsNull(rs))
        return KVQ_OK;
    if (!cJSON_IsObject(rs))
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: \"rope_scaling\" is not an object", path);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!t)
        t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(t))
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: rope_scaling has no \"rope_type\"", path);
    const char *type = t->valuestring;
    kvq_status st;
    if (!strcmp(type, "default"))
        return KVQ_OK;
    if (!strcmp(type, "linear"))
        r->scaling = KVQ_ROPE_SCALING_LINEAR;
    else if (!strcmp(type, "llama3"))
        r->scaling = KVQ_ROPE_SCALING_LLAMA3;
    else
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: unsupported rope scaling type '%s'", path,
                           type);
    if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(rs, "factor")))
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: rope_scaling has no \"factor\"", path);
    if ((st = json_f64(rs, "factor", &r->factor, path, err)) ||
        (st = json_f64(rs, "low_freq_factor", &r->low_freq_factor, path, err)) ||
        (st = json_f64(rs, "high_freq_factor", &r->high_freq_factor, path, err)) ||
        (st = json_f64(rs, "original_max_position_embeddings", &r->original_max_pos, path, err)))
        return st;
    return KVQ_OK;
}

static kvq_status parse_config(const cJSON *cfg, kvq_model_config *c, const char *path,
                               kvq_err *err)
{
    kvq_status st;
    if ((st = parse_arch(cfg, c, path, err)))
        return st;
    if ((st = json_i32(cfg, "hidden_size", 1, &c->dim, path, err)) ||
        (st = json_i32(cfg, "intermediate_size", 1, &c->hidden_dim, path, err)) ||
        (st = json_i32(cfg, "num_hidden_layers", 1, &c->n_layers, path, err)) ||
        (st = json_i32(cfg, "num_attention_heads", 1, &c->n_heads, path, err)) ||
        (st = json_i32(cfg, "vocab_size", 1, &c->vocab_size, path, err)))
        return st;
    c->n_kv_heads = c->n_heads;
    c->head_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0;
    c->norm_eps = 1e-6;
    c->rope = kvq_rope_default(0);
    c->rope.layout = KVQ_ROPE_HALF;
    if ((st = json_i32(cfg, "num_key_value_heads", 0, &c->n_kv_heads, path, err)) ||
        (st = json_i32(cfg, "head_dim", 0, &c->head_dim, path, err)) ||
        (st = json_i32(cfg, "max_position_embeddings", 0, &c->context_length, path, err)) ||
        (st = json_f64(cfg, "rms_norm_eps", &c->norm_eps, path, err)) ||
        (st = json_f64(cfg, "rope_theta", &c->rope.base, path, err)) ||
        (st = json_bool(cfg, "tie_word_embeddings", &c->tied_embeddings, path, err)) ||
        (st = parse_rope_scaling(cfg, &c->rope, path, err)))
        return st;
    c->rope.head_dim = c->head_dim;

    /* Features outside the llama family's core are refused rather than ignored. */
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(cfg, "hidden_act");
    if (cJSON_IsString(act) && strcmp(act->valuestring, "silu") != 0)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: unsupported hidden_act '%s'", path,
                           act->valuestring);
    double prf = 1.0;
    if ((st = json_f64(cfg, "partial_rotary_factor", &prf, path, err)))
        return st;
    if (prf != 1.0)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: partial_rotary_factor %g", path, prf);
    int attn_bias = 0, mlp_bias = 0, use_sw = c->arch == KVQ_ARCH_MISTRAL;
    if ((st = json_bool(cfg, "attention_bias", &attn_bias, path, err)) ||
        (st = json_bool(cfg, "mlp_bias", &mlp_bias, path, err)) ||
        (st = json_bool(cfg, "use_sliding_window", &use_sw, path, err)))
        return st;
    if (attn_bias || mlp_bias)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: unsupported %s", path,
                           attn_bias ? "attention_bias" : "mlp_bias");
    c->qkv_bias = c->arch == KVQ_ARCH_QWEN2;
    if (use_sw && (st = parse_sliding_window(cfg, c, path, err)))
        return st;
    c->bos_id = json_token_id(cfg, "bos_token_id");
    c->eos_id = json_token_id(cfg, "eos_token_id");
    return KVQ_OK;
}

/* ==========================================================================
 * Shards and tensors
 * ========================================================================== */

typedef struct hf_ctx {
    kvq_model *m;
    char **shard_paths;      /* [m->n_shards] */
    cJSON *weight_map;       /* index.json "weight_map" (owned by index), or NULL */
    cJSON *index;
} hf_ctx;

/* Opens model.safetensors, or every shard the index names (each once). */
static kvq_status open_shards(hf_ctx *h, kvq_err *err)
{
    kvq_model *m = h->m;
    kvq_status st = KVQ_OK;
    char *single = kvq_path_join(m->path, "model.safetensors");
    char *index = kvq_path_join(m->path, "model.safetensors.index.json");
    if (!single || !index) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", m->path);
        goto done;
    }
    if (access(single, F_OK) == 0) {
        m->shards = calloc(1, sizeof *m->shards);
        h->shard_paths = calloc(1, sizeof *h->shard_paths);
        if (!m->shards || !h->shard_paths) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", m->path);
            goto done;
        }
        if ((st = kvq_st_open(single, &m->shards[0], err)))
            goto done;
        m->n_shards = 1;
        h->shard_paths[0] = single;
        single = NULL;
        goto done;
    }
    if (access(index, F_OK) != 0) {
        st = kvq_err_set(err, KVQ_E_NOT_FOUND,
                         "%s: no model.safetensors or model.safetensors.index.json", m->path);
        goto done;
    }
    if ((st = read_json(index, &h->index, err)))
        goto done;
    h->weight_map = cJSON_GetObjectItemCaseSensitive(h->index, "weight_map");
    if (!cJSON_IsObject(h->weight_map)) {
        st = kvq_err_set(err, KVQ_E_BAD_JSON, "%s: no \"weight_map\" object", index);
        goto done;
    }
    int n = cJSON_GetArraySize(h->weight_map);
    m->shards = calloc((size_t)(n > 0 ? n : 1), sizeof *m->shards);
    h->shard_paths = calloc((size_t)(n > 0 ? n : 1), sizeof *h->shard_paths);
    if (!m->shards || !h->shard_paths) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", m->path);
        goto done;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, h->weight_map)
    {
        if (!cJSON_IsString(e)) {
            st = kvq_err_set(err, KVQ_E_BAD_JSON, "%s: weight_map[\"%s\"] is not a string", index,
                             e->string);
            goto done;
        }
        const char *f = e->valuestring;
        if (!*f || strchr(f, '/') || !strcmp(f, "..") || !strcmp(f, ".")) {
            st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: shard name '%s' is not a plain file name",
                             index, f);
            goto done;
        }
        char *fp = kvq_path_join(m->path, f);
        if (!fp) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", m->path);
            goto done;
        }
        size_t i = 0;
        while (i < m->n_shards && strcmp(h->shard_paths[i], fp) != 0)
            i++;
        if (i < m->n_shards) {
            free(fp);
            continue;
        }
        h->shard_paths[i] = fp;
        m->n_shards++; /* counted first so that cleanup frees fp even if open fails */
        if ((st = kvq_st_open(fp, &m->shards[i], err)))
            goto done;
    }
done:
    free(single);
    free(index);
    return st;
}

/* Finds tensor `name`: through the index when there is one, else in the single file. */
static const kvq_tensor_view *find(hf_ctx *h, const char *name, const char **file)
{
    kvq_model *m = h->m;
    size_t i = 0;
    if (h->weight_map) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(h->weight_map, name);
        if (!cJSON_IsString(e))
            return NULL;
        size_t dl = strlen(m->path);
        for (i = 0; i < m->n_shards; i++)
            if (!strcmp(h->shard_paths[i] + dl + 1, e->valuestring))
                break;
        if (i == m->n_shards)
            return NULL;
    }
    *file = h->shard_paths[i];
    return m->n_shards ? kvq_st_find(m->shards[i], name) : NULL;
}

/* Binds `name` as [rows, cols] (rows 0: a 1-D vector of cols). */
static kvq_status bind(hf_ctx *h, const char *name, int64_t rows, int64_t cols, int required,
                       kvq_wt *w, kvq_err *err)
{
    kvq_model *m = h->m;
    const char *file = m->path;
    memset(w, 0, sizeof *w);
    const kvq_tensor_view *t = find(h, name, &file);
    if (!t)
        return required ? kvq_err_set(err, KVQ_E_NOT_FOUND, "%s: missing tensor %s", m->path, name)
                        : KVQ_OK;
    wt_type type;
    switch (t->dtype) {
    case KVQ_DT_F32: type = WT_F32; break;
    case KVQ_DT_F16: type = WT_F16; break;
    case KVQ_DT_BF16: type = WT_BF16; break;
    default:
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: %s: unsupported weight type %s", file,
                           name, kvq_dtype_name(t->dtype));
    }
    int ok = rows ? (t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols)
                  : (t->ndim == 1 && t->shape[0] == cols);
    if (!ok) {
        char got[96] = "[", want[64];
        size_t k = 1;
        for (int i = 0; i < t->ndim && k < sizeof got; i++)
            k += (size_t)snprintf(got + k, sizeof got - k, "%s%lld", i ? ", " : "",
                                  (long long)t->shape[i]);
        if (k < sizeof got)
            snprintf(got + k, sizeof got - k, "]");
        if (rows)
            snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows, (long long)cols);
        else
            snprintf(want, sizeof want, "[%lld]", (long long)cols);
        return kvq_err_set(err, KVQ_E_SHAPE_MISMATCH, "%s: %s: shape %s, the config needs %s",
                           file, name, got, want);
    }
    w->name = t->name;
    w->rows = rows ? rows : 1;
    w->cols = cols;
    w->type = type;
    w->data = t->data;
    w->row_bytes = kvq_dtype_size(t->dtype) * (size_t)cols;
    m->mapped_bytes += t->nbytes;
    return KVQ_OK;
}

static kvq_status bind_vec(hf_ctx *h, const char *name, int64_t n, float **out, kvq_err *err)
{
    kvq_wt w;
    kvq_status st = bind(h, name, 0, n, 1, &w, err);
    return st != KVQ_OK ? st : kvq_wt_vector(&w, n, out, h->m->path, err);
}

static kvq_status bind_layers(hf_ctx *h, kvq_err *err)
{
    kvq_model *m = h->m;
    const kvq_model_config *c = &m->cfg;
    const int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    kvq_status st;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", m->path);
    for (int32_t l = 0; l < c->n_layers; l++) {
        kvq_layer_weights *L = &m->layers[l];
        static const char *const suffix[12] = {
            "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
            "self_attn.o_proj.weight", "mlp.gate_proj.weight",    "mlp.up_proj.weight",
            "mlp.down_proj.weight",    "input_layernorm.weight",  "post_attention_layernorm.weight",
            "self_attn.q_proj.bias",   "self_attn.k_proj.bias",   "self_attn.v_proj.bias"};
        char n[12][128];
        for (int i = 0; i < 12; i++)
            snprintf(n[i], sizeof n[i], "model.layers.%d.%s", l, suffix[i]);
        if ((st = bind(h, n[0], qd, c->dim, 1, &L->wq, err)) ||
            (st = bind(h, n[1], kvd, c->dim, 1, &L->wk, err)) ||
            (st = bind(h, n[2], kvd, c->dim, 1, &L->wv, err)) ||
            (st = bind(h, n[3], c->dim, qd, 1, &L->wo, err)) ||
            (st = bind(h, n[4], c->hidden_dim, c->dim, 1, &L->w_gate, err)) ||
            (st = bind(h, n[5], c->hidden_dim, c->dim, 1, &L->w_up, err)) ||
            (st = bind(h, n[6], c->dim, c->hidden_dim, 1, &L->w_down, err)) ||
            (st = bind_vec(h, n[7], c->dim, &L->attn_norm, err)) ||
            (st = bind_vec(h, n[8], c->dim, &L->ffn_norm, err)))
            return st;
        if (c->qkv_bias && ((st = bind_vec(h, n[9], qd, &L->bq, err)) ||
                            (st = bind_vec(h, n[10], kvd, &L->bk, err)) ||
                            (st = bind_vec(h, n[11], kvd, &L->bv, err))))
            return st;
    }
    return KVQ_OK;
}

/* ==========================================================================
 * Loader
 * ========================================================================== */

kvq_status kvq_model_load_hf(kvq_model *m, const kvq_model_params *p, kvq_err *err)
{
    hf_ctx h = {.m = m};
    cJSON *cfg = NULL;
    kvq_model_config *c = &m->cfg;
    char *cfg_path = kvq_path_join(m->path, "config.json");
    char *tok_path = kvq_path_join(m->path, "tokenizer.json");
    kvq_status st = KVQ_OK;
    if (!cfg_path || !tok_path) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", m->path);
        goto done;
    }
    if ((st = read_json(cfg_path, &cfg, err)) || (st = parse_config(cfg, c, cfg_path, err)) ||
        (st = kvq_model_check_config(c, cfg_path, err)) || (st = open_shards(&h, err)))
        goto done;

    if ((st = bind(&h, "model.embed_tokens.weight", c->vocab_size, c->dim, 1, &m->tok_embd, err)) ||
        (st = bind_vec(&h, "model.norm.weight", c->dim, &m->out_norm, err)) ||
        (st = bind(&h, "lm_head.weight", c->vocab_size, c->dim, !c->tied_embeddings, &m->output,
                   err)))
        goto done;
    if (c->tied_embeddings || !m->output.data) {
        c->tied_embeddings = 1;
        m->output = m->tok_embd;
    }
    if ((st = bind_layers(&h, err)))
        goto done;

    if (p->load_tokenizer && access(tok_path, F_OK) == 0) {
        kvq_tokenizer_params tp = kvq_tokenizer_params_default();
        tp.cb = p->cb;
        tp.accept_approx = p->accept_approx_tokenizer;
        if ((st = kvq_tokenizer_from_hf_json_p(tok_path, &tp, &m->tok, err)))
            goto done;
        if (c->bos_id < 0)
            c->bos_id = kvq_tokenizer_bos(m->tok);
        if (c->eos_id < 0)
            c->eos_id = kvq_tokenizer_eos(m->tok);
        if (kvq_tokenizer_n_vocab(m->tok) > (uint32_t)c->vocab_size)
            kvq_log(&p->cb, KVQ_LOG_WARN, "%s: tokenizer has %u tokens, the model %d", m->path,
                    kvq_tokenizer_n_vocab(m->tok), c->vocab_size);
    }
done:
    if (h.shard_paths)
        for (size_t i = 0; i < m->n_shards; i++)
            free(h.shard_paths[i]);
    free(h.shard_paths);
    cJSON_Delete(h.index);
    cJSON_Delete(cfg);
    free(cfg_path);
    free(tok_path);
    return st;
}
