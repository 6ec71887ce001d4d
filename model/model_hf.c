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
    if (c->arch == KVQ_ARCH_QWEN2 || c->arch == KVQ_ARCH_QWEN3) {
        c->sliding_from = 28;
        if ((st = json_i32(cfg, "max_window_layers", 0, &c->sliding_from, path, err)))
            return st;
    }
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(cfg, "layer_types");
    if (types && !cJSON_IsNull(types)) {
        int32_t first = -1, i = 0;
        const cJSON *t;
        if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != c->n_layers)
            return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: \"layer_types\" is not a list of "
                               "num_hidden_layers (%d) entries", path, (int)c->n_layers);
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
        {"qwen3", "Qwen3ForCausalLM", KVQ_ARCH_QWEN3},
        {"gemma2", "Gemma2ForCausalLM", KVQ_ARCH_GEMMA2},
        {"gemma3_text", "Gemma3ForCausalLM", KVQ_ARCH_GEMMA3},
        {"phi3", "Phi3ForCausalLM", KVQ_ARCH_PHI3},
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
    return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                       "%s: %s: unsupported architecture '%s' (kvq reads " KVQ_ARCH_LIST
                       "; gemma3 as Gemma3ForCausalLM, model_type gemma3_text)", path,
                       name ? "model_type" : "architectures", name ? name : cls);
}

/* The rope scaling object rs ("rope_scaling", or a "rope_parameters" object of
 * transformers 5, whose rope_theta is read too). */
static kvq_status parse_rope_object(const cJSON *rs, const char *what, kvq_rope *r,
                                    const char *path, kvq_err *err);

static kvq_status parse_rope_scaling(const cJSON *cfg, kvq_rope *r, const char *path,
                                     kvq_err *err)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling");
    if (!rs || cJSON_IsNull(rs))
        return KVQ_OK;
    return parse_rope_object(rs, "rope_scaling", r, path, err);
}

/* transformers 5's "rope_parameters": one object (rope_theta, rope_type, factor ...),
 * or gemma3's {"full_attention": {...}, "sliding_attention": {...}} whose sliding
 * entry must be unscaled (it gives the local base). Read after rope_theta /
 * rope_scaling, which it replaces. */
static kvq_status parse_rope_parameters(const cJSON *cfg, kvq_model_config *c, const char *path,
                                        kvq_err *err)
{
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    if (!rp || cJSON_IsNull(rp))
        return KVQ_OK;
    if (!cJSON_IsObject(rp))
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: \"rope_parameters\" is not an object", path);
    const cJSON *full = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
    const cJSON *slide = cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention");
    if (!full && !slide)
        return parse_rope_object(rp, "rope_parameters", &c->rope, path, err);
    kvq_status st;
    if (full && (st = parse_rope_object(full, "rope_parameters.full_attention", &c->rope, path,
                                        err)))
        return st;
    if (slide) {
        kvq_rope local = kvq_rope_default(c->head_dim);
        local.base = c->rope_local_base > 0 ? c->rope_local_base : local.base;
        if ((st = parse_rope_object(slide, "rope_parameters.sliding_attention", &local, path,
                                    err)))
            return st;
        if (local.scaling != KVQ_ROPE_SCALING_NONE)
            return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: rope_parameters.sliding_attention: "
                               "scaled RoPE on sliding-window layers", path);
        if (c->sliding_window > 0)
            c->rope_local_base = local.base;
    }
    return KVQ_OK;
}

static kvq_status parse_rope_object(const cJSON *rs, const char *what, kvq_rope *r,
                                    const char *path, kvq_err *err)
{
    if (!cJSON_IsObject(rs))
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: \"%s\" is not an object", path, what);
    kvq_status st0 = json_f64(rs, "rope_theta", &r->base, path, err);
    if (st0 != KVQ_OK)
        return st0;
    double prf = 1.0;
    if ((st0 = json_f64(rs, "partial_rotary_factor", &prf, path, err)))
        return st0;
    if (prf != 1.0)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: %s.partial_rotary_factor %g", path, what,
                           prf);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!t)
        t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(t))
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: %s has no \"rope_type\"", path, what);
    const char *type = t->valuestring;
    kvq_status st;
    if (!strcmp(type, "default"))
        return KVQ_OK;
    if (!strcmp(type, "linear"))
        r->scaling = KVQ_ROPE_SCALING_LINEAR;
    else if (!strcmp(type, "llama3"))
        r->scaling = KVQ_ROPE_SCALING_LLAMA3;
    else
        return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                           "%s: %s.rope_type: unsupported rope scaling type '%s' (kvq "
                           "implements default, linear, llama3)", path, what, type);
    if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(rs, "factor")))
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: %s has no \"factor\"", path, what);
    if ((st = json_f64(rs, "factor", &r->factor, path, err)) ||
        (st = json_f64(rs, "low_freq_factor", &r->low_freq_factor, path, err)) ||
        (st = json_f64(rs, "high_freq_factor", &r->high_freq_factor, path, err)) ||
        (st = json_f64(rs, "original_max_position_embeddings", &r->original_max_pos, path, err)))
        return st;
    return KVQ_OK;
}

/* The MLP activation: hidden_act (or gemma's hidden_activation), silu or gelu_tanh
 * ("gelu_pytorch_tanh", "gelu_tanh"); anything else is refused by name. */
static kvq_status parse_act(const cJSON *cfg, kvq_model_config *c, const char *path,
                            kvq_err *err)
{
    const int gemma = c->arch == KVQ_ARCH_GEMMA2 || c->arch == KVQ_ARCH_GEMMA3;
    const char *key = gemma && cJSON_GetObjectItemCaseSensitive(cfg, "hidden_activation")
                          ? "hidden_activation" : "hidden_act";
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(cfg, key);
    c->act = gemma ? KVQ_ACT_GELU_TANH : KVQ_ACT_SILU;
    if (!act || cJSON_IsNull(act))
        return KVQ_OK;
    const char *a = cJSON_IsString(act) ? act->valuestring : "";
    if (!strcmp(a, "silu"))
        c->act = KVQ_ACT_SILU;
    else if (!strcmp(a, "gelu_pytorch_tanh") || !strcmp(a, "gelu_tanh"))
        c->act = KVQ_ACT_GELU_TANH;
    else
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: %s: unsupported activation '%s'", path,
                           key, a);
    return KVQ_OK;
}

/* Which layers slide for gemma: layer_types when present (it must be periodic: layer l
 * is full attention iff (l + 1) % P == 0), else gemma3's sliding_window_pattern
 * (default 6) or gemma2's fixed 2. */
static kvq_status parse_gemma_layers(const cJSON *cfg, kvq_model_config *c, const char *path,
                                     kvq_err *err)
{
    kvq_status st;
    c->sliding_period = c->arch == KVQ_ARCH_GEMMA2 ? 2 : 6;
    if (c->arch == KVQ_ARCH_GEMMA3 &&
        (st = json_i32(cfg, "sliding_window_pattern", 0, &c->sliding_period, path, err)))
        return st;
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(cfg, "layer_types");
    if (!types || cJSON_IsNull(types))
        return KVQ_OK;
    if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != c->n_layers)
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: \"layer_types\" is not a list of %d layers",
                           path, c->n_layers);
    int32_t period = 0, i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, types)
    {
        const char *v = cJSON_IsString(t) ? t->valuestring : "";
        if (!strcmp(v, "full_attention") && period == 0)
            period = i + 1;
        else if (strcmp(v, "sliding_attention") != 0 && strcmp(v, "full_attention") != 0)
            return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: layer_types[%d]: '%s' is not "
                               "full_attention or sliding_attention", path, (int)i, v);
        i++;
    }
    c->sliding_period = period ? period : c->n_layers + 1; /* none full: every layer slides */
    i = 0;
    cJSON_ArrayForEach(t, types)
    {
        const int full = !strcmp(t->valuestring, "full_attention");
        if (full != ((i + 1) % c->sliding_period == 0))
            return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: layer_types[%d]: the layers do not "
                               "repeat one sliding/full pattern (period %d)", path, (int)i,
                               (int)c->sliding_period);
        i++;
    }
    return KVQ_OK;
}

/* Gemma's settings: query_pre_attn_scalar, softcaps, embedding scale, window, local
 * RoPE base, (1 + w) norms and post-norms; tied embeddings unless the file says not. */
static kvq_status parse_gemma(const cJSON *cfg, kvq_model_config *c, const char *path,
                              kvq_err *err)
{
    kvq_status st;
    double qpas = c->head_dim;
    int bidir = 0;
    c->tied_embeddings = 1;
    c->sliding_window = 4096; /* transformers' default for both */
    c->post_norms = 1;
    c->embed_scale = sqrt((double)c->dim);
    if (c->arch == KVQ_ARCH_GEMMA3)
        c->rope_local_base = 10000.0;
    if ((st = json_f64(cfg, "query_pre_attn_scalar", &qpas, path, err)) ||
        (st = json_f64(cfg, "attn_logit_softcapping", &c->attn_softcap, path, err)) ||
        (st = json_f64(cfg, "final_logit_softcapping", &c->final_softcap, path, err)) ||
        (st = json_f64(cfg, "rope_local_base_freq", &c->rope_local_base, path, err)) ||
        (st = json_bool(cfg, "tie_word_embeddings", &c->tied_embeddings, path, err)) ||
        (st = json_bool(cfg, "use_bidirectional_attention", &bidir, path, err)) ||
        (st = json_i32(cfg, "sliding_window", 0, &c->sliding_window, path, err)) ||
        (st = parse_gemma_layers(cfg, c, path, err)))
        return st;
    if (bidir)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: use_bidirectional_attention: not a "
                           "causal model", path);
    if (!(qpas > 0) || !isfinite(qpas))
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: query_pre_attn_scalar %g must be > 0", path,
                           qpas);
    c->attn_scale = 1.0 / sqrt(qpas);
    if (c->sliding_window == 0)
        c->rope_local_base = 0, c->sliding_period = 0;
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
    if ((st = parse_act(cfg, c, path, err)))
        return st;
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
    c->qk_norm = c->arch == KVQ_ARCH_QWEN3 || c->arch == KVQ_ARCH_GEMMA3;
    if (c->arch == KVQ_ARCH_PHI3)
        use_sw = 1; /* transformers' Phi3 applies sliding_window when it is set */
    if (c->arch == KVQ_ARCH_GEMMA2 || c->arch == KVQ_ARCH_GEMMA3) {
        if ((st = parse_gemma(cfg, c, path, err)))
            return st;
    } else if (use_sw && (st = parse_sliding_window(cfg, c, path, err))) {
        return st;
    }
    if ((st = parse_rope_parameters(cfg, c, path, err)))
        return st;
    c->rope.head_dim = c->head_dim;
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

/* q, k, v of layer l: three tensors, or phi3's fused qkv_proj (rows q, k, v). */
static kvq_status bind_qkv(hf_ctx *h, int32_t l, kvq_layer_weights *L, kvq_err *err)
{
    const kvq_model_config *c = &h->m->cfg;
    const int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    kvq_status st;
    char n[3][128];
    if (c->arch == KVQ_ARCH_PHI3) {
        kvq_wt qkv;
        snprintf(n[0], sizeof n[0], "model.layers.%d.self_attn.qkv_proj.weight", l);
        if ((st = bind(h, n[0], qd + 2 * kvd, c->dim, 1, &qkv, err)))
            return st;
        kvq_wt_slice(&qkv, 0, qd, &L->wq);
        kvq_wt_slice(&qkv, qd, kvd, &L->wk);
        kvq_wt_slice(&qkv, qd + kvd, kvd, &L->wv);
        return KVQ_OK;
    }
    for (int i = 0; i < 3; i++)
        snprintf(n[i], sizeof n[i], "model.layers.%d.self_attn.%c_proj.weight", l, "qkv"[i]);
    if ((st = bind(h, n[0], qd, c->dim, 1, &L->wq, err)) ||
        (st = bind(h, n[1], kvd, c->dim, 1, &L->wk, err)) ||
        (st = bind(h, n[2], kvd, c->dim, 1, &L->wv, err)))
        return st;
    return KVQ_OK;
}

/* gate and up of layer l: two tensors, or phi3's gate_up_proj (rows gate, then up). */
static kvq_status bind_gate_up(hf_ctx *h, int32_t l, kvq_layer_weights *L, kvq_err *err)
{
    const kvq_model_config *c = &h->m->cfg;
    kvq_status st;
    char n[2][128];
    if (c->arch == KVQ_ARCH_PHI3) {
        kvq_wt gu;
        snprintf(n[0], sizeof n[0], "model.layers.%d.mlp.gate_up_proj.weight", l);
        if ((st = bind(h, n[0], 2 * (int64_t)c->hidden_dim, c->dim, 1, &gu, err)))
            return st;
        kvq_wt_slice(&gu, 0, c->hidden_dim, &L->w_gate);
        kvq_wt_slice(&gu, c->hidden_dim, c->hidden_dim, &L->w_up);
        return KVQ_OK;
    }
    snprintf(n[0], sizeof n[0], "model.layers.%d.mlp.gate_proj.weight", l);
    snprintf(n[1], sizeof n[1], "model.layers.%d.mlp.up_proj.weight", l);
    if ((st = bind(h, n[0], c->hidden_dim, c->dim, 1, &L->w_gate, err)) ||
        (st = bind(h, n[1], c->hidden_dim, c->dim, 1, &L->w_up, err)))
        return st;
    return KVQ_OK;
}

/* The norms of layer l. Gemma: input_layernorm, post_attention_layernorm (after the
 * attention), pre_feedforward_layernorm, post_feedforward_layernorm, q_norm / k_norm,
 * each (1 + w), kept as 1 + w; the others: input_layernorm, post_attention_layernorm
 * (before the MLP), and qwen3's q_norm / k_norm. */
static kvq_status bind_norms(hf_ctx *h, int32_t l, kvq_layer_weights *L, kvq_err *err)
{
    const kvq_model_config *c = &h->m->cfg;
    const int gemma = c->post_norms;
    kvq_status st;
    char n[6][128];
    static const char *const suffix[6] = {
        "input_layernorm.weight", "post_attention_layernorm.weight",
        "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight",
        "self_attn.q_norm.weight", "self_attn.k_norm.weight"};
    for (int i = 0; i < 6; i++)
        snprintf(n[i], sizeof n[i], "model.layers.%d.%s", l, suffix[i]);
    if ((st = bind_vec(h, n[0], c->dim, &L->attn_norm, err)) ||
        (st = bind_vec(h, n[gemma ? 2 : 1], c->dim, &L->ffn_norm, err)))
        return st;
    if (gemma && ((st = bind_vec(h, n[1], c->dim, &L->post_attn_norm, err)) ||
                  (st = bind_vec(h, n[3], c->dim, &L->post_ffn_norm, err))))
        return st;
    if (c->qk_norm && ((st = bind_vec(h, n[4], c->head_dim, &L->q_norm, err)) ||
                       (st = bind_vec(h, n[5], c->head_dim, &L->k_norm, err))))
        return st;
    if (gemma) {
        float *v[6] = {L->attn_norm, L->ffn_norm, L->post_attn_norm, L->post_ffn_norm, L->q_norm,
                       L->k_norm};
        for (int i = 0; i < 6; i++)
            if (v[i])
                kvq_vec_add_scalar(v[i], i < 4 ? c->dim : c->head_dim, 1.0f);
    }
    return KVQ_OK;
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
        static const char *const suffix[5] = {
            "self_attn.o_proj.weight", "mlp.down_proj.weight", "self_attn.q_proj.bias",
            "self_attn.k_proj.bias", "self_attn.v_proj.bias"};
        char n[5][128];
        for (int i = 0; i < 5; i++)
            snprintf(n[i], sizeof n[i], "model.layers.%d.%s", l, suffix[i]);
        if ((st = bind_qkv(h, l, L, err)) || (st = bind(h, n[0], c->dim, qd, 1, &L->wo, err)) ||
            (st = bind_gate_up(h, l, L, err)) ||
            (st = bind(h, n[1], c->dim, c->hidden_dim, 1, &L->w_down, err)) ||
            (st = bind_norms(h, l, L, err)))
            return st;
        if (c->qkv_bias && ((st = bind_vec(h, n[2], qd, &L->bq, err)) ||
                            (st = bind_vec(h, n[3], kvd, &L->bk, err)) ||
                            (st = bind_vec(h, n[4], kvd, &L->bv, err))))
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
    if (c->post_norms) /* gemma's final norm is (1 + w) too */
        kvq_vec_add_scalar(m->out_norm, c->dim, 1.0f);
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
