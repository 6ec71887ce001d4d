/* inspect_gguf.c — `kvq inspect` of a GGUF model: header, hyperparameters (with the
 * derived head_dim and rope base), tokenizer, metadata and tensors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/inspect.h"

/* ==========================================================================
 * GGUF
 * ========================================================================== */

static void gguf_value_text(FILE *f, const kvq_gguf_value *v)
{
    switch (v->type) {
    case KVQ_GGUF_UINT8: case KVQ_GGUF_UINT16: case KVQ_GGUF_UINT32: case KVQ_GGUF_UINT64:
        fprintf(f, "%llu", (unsigned long long)v->v.u);
        break;
    case KVQ_GGUF_INT8: case KVQ_GGUF_INT16: case KVQ_GGUF_INT32: case KVQ_GGUF_INT64:
        fprintf(f, "%lld", (long long)v->v.i);
        break;
    case KVQ_GGUF_FLOAT32:
        fprintf(f, "%.9g", v->v.f);
        break;
    case KVQ_GGUF_FLOAT64:
        fprintf(f, "%.17g", v->v.f);
        break;
    case KVQ_GGUF_BOOL:
        fputs(v->v.u ? "true" : "false", f);
        break;
    case KVQ_GGUF_STRING:
        put_quoted(f, v->v.str.s, (size_t)v->v.str.len);
        break;
    case KVQ_GGUF_ARRAY:
        if (v->v.arr.n > SHORT_ARRAY) {
            fprintf(f, "[%llu x %s]", (unsigned long long)v->v.arr.n,
                    kvq_gguf_type_name(v->v.arr.type));
            break;
        }
        fputc('[', f);
        for (uint64_t i = 0; i < v->v.arr.n; i++) {
            fputs(i ? ", " : "", f);
            gguf_value_text(f, &v->v.arr.items[i]);
        }
        fputc(']', f);
        break;
    }
}

/* The plain JSON value (long arrays: {"type": "arr", "item_type", "n"}). */
static cJSON *gguf_value_json(const kvq_gguf_value *v)
{
    switch (v->type) {
    case KVQ_GGUF_UINT8: case KVQ_GGUF_UINT16: case KVQ_GGUF_UINT32: case KVQ_GGUF_UINT64:
        return json_u64(v->v.u);
    case KVQ_GGUF_INT8: case KVQ_GGUF_INT16: case KVQ_GGUF_INT32: case KVQ_GGUF_INT64:
        return json_i64(v->v.i);
    case KVQ_GGUF_FLOAT32:
        return json_f32(v->v.f);
    case KVQ_GGUF_FLOAT64:
        return cJSON_CreateNumber(v->v.f);
    case KVQ_GGUF_BOOL:
        return cJSON_CreateBool(v->v.u != 0);
    case KVQ_GGUF_STRING:
        /* cJSON strings end at NUL; GGUF strings may hold one: the text up to it. */
        return cJSON_CreateString(v->v.str.s);
    case KVQ_GGUF_ARRAY:
        if (v->v.arr.n > SHORT_ARRAY) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "type", "arr");
            cJSON_AddStringToObject(o, "item_type", kvq_gguf_type_name(v->v.arr.type));
            cJSON_AddItemToObject(o, "n", json_u64(v->v.arr.n));
            return o;
        }
        cJSON *a = cJSON_CreateArray();
        for (uint64_t i = 0; i < v->v.arr.n; i++)
            cJSON_AddItemToArray(a, gguf_value_json(&v->v.arr.items[i]));
        return a;
    }
    return cJSON_CreateNull();
}

/* Token text for an id of the tokenizer.ggml.tokens array, or NULL. */
static const kvq_gguf_value *gguf_token(const kvq_gguf *g, uint64_t id)
{
    const kvq_gguf_value *t = kvq_gguf_get(g, "tokenizer.ggml.tokens");
    if (!t || t->type != KVQ_GGUF_ARRAY || t->v.arr.type != KVQ_GGUF_STRING || id >= t->v.arr.n)
        return NULL;
    return &t->v.arr.items[id];
}

static const char *const special_keys[][2] = {
    {"bos", "tokenizer.ggml.bos_token_id"},
    {"eos", "tokenizer.ggml.eos_token_id"},
    {"unknown", "tokenizer.ggml.unknown_token_id"},
    {"padding", "tokenizer.ggml.padding_token_id"},
    {"separator", "tokenizer.ggml.seperator_token_id"}, /* sic: GGUF's spelling */
};
enum { N_SPECIAL = sizeof special_keys / sizeof special_keys[0] };

/* Derived numbers every reader of a llama-family GGUF computes the same way. */
typedef struct gguf_derived {
    const char *arch;
    char prefix[64];        /* "llama." */
    int has_head_dim;
    uint64_t head_dim;      /* embedding_length / head_count */
    int rope_base_default;  /* ARCH.rope.freq_base absent */
    double rope_base;
    uint64_t vocab;         /* tokens in tokenizer.ggml.tokens, 0 if none */
} gguf_derived;

static gguf_derived gguf_derive(const kvq_gguf *g)
{
    gguf_derived d = {0};
    d.arch = kvq_gguf_get_str(g, "general.architecture");
    snprintf(d.prefix, sizeof d.prefix, "%s.", d.arch ? d.arch : "?");
    char key[128];
    uint64_t emb, heads;
    snprintf(key, sizeof key, "%sembedding_length", d.prefix);
    int ok = kvq_gguf_get_u64(g, key, &emb) == 0;
    snprintf(key, sizeof key, "%sattention.head_count", d.prefix);
    ok = ok && kvq_gguf_get_u64(g, key, &heads) == 0 && heads > 0;
    d.has_head_dim = ok;
    d.head_dim = ok ? emb / heads : 0;
    snprintf(key, sizeof key, "%srope.freq_base", d.prefix);
    d.rope_base_default = kvq_gguf_get_f64(g, key, &d.rope_base) != 0;
    if (d.rope_base_default)
        d.rope_base = 10000.0;
    const kvq_gguf_value *t = kvq_gguf_get(g, "tokenizer.ggml.tokens");
    d.vocab = t && t->type == KVQ_GGUF_ARRAY ? t->v.arr.n : 0;
    return d;
}

static void gguf_text(const char *path, const kvq_gguf *g, uint64_t file_size)
{
    const size_t nkv = kvq_gguf_kv_count(g), nt = kvq_gguf_tensor_count(g);
    gguf_derived d = gguf_derive(g);
    printf("%s: GGUF version %u, %llu bytes\n", path, kvq_gguf_version(g),
           (unsigned long long)file_size);
    printf("  %zu metadata keys, %zu tensors, alignment %llu, data at offset %llu\n", nkv, nt,
           (unsigned long long)kvq_gguf_alignment(g), (unsigned long long)kvq_gguf_data_offset(g));

    const char **keys = calloc(nkv + 4, sizeof *keys);
    if (!keys)
        return;
    for (size_t i = 0; i < nkv; i++)
        keys[i] = kvq_gguf_kv_at(g, i)->key;
    int w = widest(keys, nkv);
    char rope_key[96];
    snprintf(rope_key, sizeof rope_key, "%srope.freq_base", d.prefix);
    if ((int)strlen(rope_key) > w)
        w = (int)strlen(rope_key);

    printf("\nhyperparameters (%s):\n", d.arch ? d.arch : "no general.architecture");
    for (size_t i = 0; i < nkv; i++) {
        const kvq_gguf_kv *kv = kvq_gguf_kv_at(g, i);
        if (strncmp(kv->key, d.prefix, strlen(d.prefix)) != 0)
            continue;
        printf("  %-*s  ", w, kv->key);
        gguf_value_text(stdout, &kv->value);
        putchar('\n');
    }
    if (d.has_head_dim)
        printf("  %-*s  %llu (embedding_length / head_count)\n", w, "head_dim",
               (unsigned long long)d.head_dim);
    if (d.rope_base_default)
        printf("  %-*s  %g (absent: the default)\n", w, rope_key, d.rope_base);

    const char *tok_model = kvq_gguf_get_str(g, "tokenizer.ggml.model");
    if (tok_model || d.vocab) {
        printf("\ntokenizer:\n");
        printf("  %-10s  %s\n", "model", tok_model ? tok_model : "(absent)");
        printf("  %-10s  %llu\n", "vocab size", (unsigned long long)d.vocab);
        for (int i = 0; i < N_SPECIAL; i++) {
            uint64_t id;
            if (kvq_gguf_get_u64(g, special_keys[i][1], &id) != 0)
                continue;
            printf("  %-10s  %llu", special_keys[i][0], (unsigned long long)id);
            const kvq_gguf_value *t = gguf_token(g, id);
            if (t) {
                putchar(' ');
                put_quoted(stdout, t->v.str.s, (size_t)t->v.str.len);
            } else {
                fputs(id == UINT32_MAX || id == UINT64_MAX ? " (unset)" : " (not a token id)",
                      stdout);
            }
            putchar('\n');
        }
    }

    printf("\nmetadata (%zu):\n", nkv);
    for (size_t i = 0; i < nkv; i++) {
        const kvq_gguf_kv *kv = kvq_gguf_kv_at(g, i);
        printf("  %-*s  %-4s  ", w, kv->key, kvq_gguf_type_name(kv->value.type));
        gguf_value_text(stdout, &kv->value);
        putchar('\n');
    }
    free(keys);

    const char **names = calloc(nt + 1, sizeof *names);
    if (!names)
        return;
    uint64_t elems = 0, bytes = 0;
    for (size_t i = 0; i < nt; i++) {
        const kvq_gguf_tensor *t = kvq_gguf_tensor_at(g, i);
        names[i] = t->name;
        uint64_t e = 1;
        for (uint32_t k = 0; k < t->ndim; k++)
            e *= (uint64_t)t->ne[k];
        elems += e;
        bytes += t->nbytes;
    }
    int wn = widest(names, nt);
    if (wn < 4)
        wn = 4;
    printf("\ntensors (%zu, %llu elements, %llu bytes):\n", nt, (unsigned long long)elems,
           (unsigned long long)bytes);
    printf("  %-*s  %-6s  %-16s  %s\n", wn, "name", "type", "ne", "offset");
    for (size_t i = 0; i < nt; i++) {
        const kvq_gguf_tensor *t = kvq_gguf_tensor_at(g, i);
        char shape[96];
        int k = snprintf(shape, sizeof shape, "[");
        for (uint32_t j = 0; j < t->ndim && k < (int)sizeof shape; j++)
            k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%lld", j ? ", " : "",
                          (long long)t->ne[j]);
        if (k < (int)sizeof shape)
            snprintf(shape + k, sizeof shape - (size_t)k, "]");
        const char *type = kvq_ggml_type_name(t->type);
        printf("  %-*s  %-6s  %-16s  %llu\n", wn, t->name, type ? type : "?", shape,
               (unsigned long long)t->offset);
    }
    free(names);
}

static cJSON *gguf_json(const char *path, const kvq_gguf *g, uint64_t file_size)
{
    gguf_derived d = gguf_derive(g);
    cJSON *doc = json_header(path, "gguf", file_size);
    cJSON_AddNumberToObject(doc, "version", kvq_gguf_version(g));
    cJSON_AddItemToObject(doc, "alignment", json_u64(kvq_gguf_alignment(g)));
    cJSON_AddItemToObject(doc, "data_offset", json_u64(kvq_gguf_data_offset(g)));
    cJSON_AddItemToObject(doc, "architecture",
                          d.arch ? cJSON_CreateString(d.arch) : cJSON_CreateNull());

    cJSON *hp = cJSON_AddObjectToObject(doc, "hyperparameters");
    cJSON *meta = cJSON_CreateObject();
    for (size_t i = 0; i < kvq_gguf_kv_count(g); i++) {
        const kvq_gguf_kv *kv = kvq_gguf_kv_at(g, i);
        if (!strncmp(kv->key, d.prefix, strlen(d.prefix)))
            cJSON_AddItemToObject(hp, kv->key, gguf_value_json(&kv->value));
        /* {"type": "u32", "value": 5}; arrays add "item_type" and "n", and keep
         * "value" only when short. */
        const kvq_gguf_value *v = &kv->value;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "type", kvq_gguf_type_name(v->type));
        if (v->type == KVQ_GGUF_ARRAY) {
            cJSON_AddStringToObject(m, "item_type", kvq_gguf_type_name(v->v.arr.type));
            cJSON_AddItemToObject(m, "n", json_u64(v->v.arr.n));
        }
        if (v->type != KVQ_GGUF_ARRAY || v->v.arr.n <= SHORT_ARRAY)
            cJSON_AddItemToObject(m, "value", gguf_value_json(v));
        cJSON_AddItemToObject(meta, kv->key, m);
    }
    if (d.has_head_dim)
        cJSON_AddItemToObject(doc, "head_dim", json_u64(d.head_dim));
    cJSON_AddNumberToObject(doc, "rope_base", d.rope_base);
    cJSON_AddBoolToObject(doc, "rope_base_default", d.rope_base_default);

    cJSON *tok = cJSON_AddObjectToObject(doc, "tokenizer");
    const char *tok_model = kvq_gguf_get_str(g, "tokenizer.ggml.model");
    cJSON_AddItemToObject(tok, "model",
                          tok_model ? cJSON_CreateString(tok_model) : cJSON_CreateNull());
    cJSON_AddItemToObject(tok, "vocab_size", json_u64(d.vocab));
    for (int i = 0; i < N_SPECIAL; i++) {
        uint64_t id;
        if (kvq_gguf_get_u64(g, special_keys[i][1], &id) == 0)
            cJSON_AddItemToObject(tok, special_keys[i][0], json_u64(id));
    }
    cJSON_AddItemToObject(doc, "metadata", meta);

    cJSON *ts = cJSON_AddArrayToObject(doc, "tensors");
    for (size_t i = 0; i < kvq_gguf_tensor_count(g); i++) {
        const kvq_gguf_tensor *t = kvq_gguf_tensor_at(g, i);
        const char *type = kvq_ggml_type_name(t->type);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", t->name);
        cJSON_AddStringToObject(o, "type", type ? type : "?");
        cJSON_AddItemToObject(o, "ne", json_dims((int)t->ndim, t->ne));
        cJSON_AddItemToObject(o, "offset", json_u64(t->offset));
        cJSON_AddItemToObject(o, "nbytes", json_u64(t->nbytes));
        cJSON_AddItemToArray(ts, o);
    }
    return doc;
}

int inspect_gguf(const char *path, uint64_t file_size, int json)
{
    kvq_err e = {0};
    kvq_gguf *g = NULL;
    if (kvq_gguf_open(path, &g, &e) != KVQ_OK)
        return cli_fail(&e);
    int rc = 0;
    if (json)
        rc = json_emit(path, gguf_json(path, g, file_size));
    else
        gguf_text(path, g, file_size);
    kvq_gguf_close(g);
    return rc;
}
