/* inspect_gguf.c — `kvq inspect` of a GGUF model: header, hyperparameters (with the
 * derived head_dim and rope base), tokenizer, metadata and tensors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/inspect.h"

/* ==========================================================================
 * GGUF
 * ========================================================================== */

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

/* A value of the description as the text shows it: type is its GGUF type name
 * (item_type for the items of an array). Nested arrays keep no item type in the
 * description: their strings print quoted, their numbers as integers when whole,
 * else with 17 digits. */
static void value_text(FILE *f, const char *type, const cJSON *v, const cJSON *entry)
{
    if (cJSON_IsObject(v)) { /* a long array inside an array */
        fprintf(f, "[%llu x %s]", (unsigned long long)ju64(v, "n"), jstr(v, "item_type", "?"));
    } else if (!strcmp(type, "arr") || cJSON_IsArray(v)) {
        if (!v) {
            fprintf(f, "[%llu x %s]", (unsigned long long)ju64(entry, "n"),
                    jstr(entry, "item_type", "?"));
            return;
        }
        const char *it = entry ? jstr(entry, "item_type", "") : "";
        fputc('[', f);
        for (const cJSON *x = v->child; x; x = x->next) {
            fputs(x != v->child ? ", " : "", f);
            value_text(f, it, x, NULL);
        }
        fputc(']', f);
    } else if (cJSON_IsString(v) && (!strcmp(type, "str") || !type[0])) {
        put_quoted(f, v->valuestring, strlen(v->valuestring));
    } else if (cJSON_IsString(v)) { /* an integer above 2^53 */
        fputs(v->valuestring, f);
    } else if (cJSON_IsBool(v)) {
        fputs(cJSON_IsTrue(v) ? "true" : "false", f);
    } else if (type[0] == 'u' || (type[0] == '\0' && v->valuedouble >= 0 &&
                                  v->valuedouble == floor(v->valuedouble))) {
        fprintf(f, "%llu", (unsigned long long)v->valuedouble);
    } else if (type[0] == 'i' || (type[0] == '\0' && v->valuedouble == floor(v->valuedouble))) {
        fprintf(f, "%lld", (long long)v->valuedouble);
    } else if (!strcmp(type, "f32")) {
        fprintf(f, "%.9g", v->valuedouble);
    } else {
        fprintf(f, "%.17g", v->valuedouble);
    }
}

/* A metadata entry {"type", "value" | "item_type", "n"} of the description. */
static void entry_text(FILE *f, const cJSON *e)
{
    value_text(f, jstr(e, "type", ""), cJSON_GetObjectItemCaseSensitive(e, "value"), e);
}

/* The tokenizer section; the special tokens' text is looked up in the file. */
static void gguf_tokenizer_text(const cJSON *doc, const kvq_gguf *g)
{
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(doc, "tokenizer");
    const char *tok_model = jstr(tok, "model", NULL);
    const uint64_t vocab = ju64(tok, "vocab_size");
    if (!tok_model && !vocab)
        return;
    printf("\ntokenizer:\n");
    printf("  %-10s  %s\n", "model", tok_model ? tok_model : "(absent)");
    printf("  %-10s  %llu\n", "vocab size", (unsigned long long)vocab);
    for (int i = 0; i < N_SPECIAL; i++) {
        if (!cJSON_GetObjectItemCaseSensitive(tok, special_keys[i][0]))
            continue;
        const uint64_t id = ju64(tok, special_keys[i][0]);
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

static void gguf_tensors_text(const cJSON *ts)
{
    const int nt = cJSON_GetArraySize(ts);
    const char **names = calloc((size_t)nt + 1, sizeof *names);
    if (!names)
        return;
    uint64_t elems = 0, bytes = 0;
    int i = 0;
    for (const cJSON *t = ts->child; t; t = t->next, i++) {
        names[i] = jstr(t, "name", "");
        uint64_t e = 1;
        for (const cJSON *d = cJSON_GetObjectItemCaseSensitive(t, "ne")->child; d; d = d->next)
            e *= (uint64_t)jint(d);
        elems += e;
        bytes += ju64(t, "nbytes");
    }
    int wn = widest(names, (size_t)nt);
    if (wn < 4)
        wn = 4;
    printf("\ntensors (%d, %llu elements, %llu bytes):\n", nt, (unsigned long long)elems,
           (unsigned long long)bytes);
    printf("  %-*s  %-6s  %-16s  %s\n", wn, "name", "type", "ne", "offset");
    for (const cJSON *t = ts->child; t; t = t->next) {
        char shape[96];
        int k = snprintf(shape, sizeof shape, "[");
        const cJSON *d0 = cJSON_GetObjectItemCaseSensitive(t, "ne")->child;
        for (const cJSON *d = d0; d && k < (int)sizeof shape; d = d->next)
            k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%lld", d != d0 ? ", " : "",
                          (long long)jint(d));
        if (k < (int)sizeof shape)
            snprintf(shape + k, sizeof shape - (size_t)k, "]");
        printf("  %-*s  %-6s  %-16s  %llu\n", wn, jstr(t, "name", ""), jstr(t, "type", "?"),
               shape, (unsigned long long)ju64(t, "offset"));
    }
    free(names);
}

/* The text, rendered from the description (gguf_json). */
static void gguf_text(const cJSON *doc, const kvq_gguf *g)
{
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(doc, "metadata");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(doc, "tensors");
    const int nkv = cJSON_GetArraySize(meta);
    const char *arch = jstr(doc, "architecture", NULL);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s.", arch ? arch : "?");
    printf("%s: GGUF version %d, %llu bytes\n", jstr(doc, "path", "?"),
           (int)jnum_or(doc, "version", 0), (unsigned long long)ju64(doc, "file_size"));
    printf("  %d metadata keys, %d tensors, alignment %llu, data at offset %llu\n", nkv,
           cJSON_GetArraySize(ts), (unsigned long long)ju64(doc, "alignment"),
           (unsigned long long)ju64(doc, "data_offset"));
    const char *fp = jstr(doc, "fingerprint", NULL);
    if (fp)
        printf("  weights: %s, fingerprint %s\n", jstr(doc, "model_name", "?"), fp);
    else
        printf("  weights: no fingerprint (%s)\n", jstr(doc, "fingerprint_error", "?"));

    const char **keys = calloc((size_t)nkv + 4, sizeof *keys);
    if (!keys)
        return;
    int n = 0;
    for (const cJSON *kv = meta->child; kv; kv = kv->next)
        keys[n++] = kv->string;
    int w = widest(keys, (size_t)nkv);
    char rope_key[96];
    snprintf(rope_key, sizeof rope_key, "%srope.freq_base", prefix);
    if ((int)strlen(rope_key) > w)
        w = (int)strlen(rope_key);

    printf("\nhyperparameters (%s):\n", arch ? arch : "no general.architecture");
    for (const cJSON *kv = meta->child; kv; kv = kv->next) {
        if (strncmp(kv->string, prefix, strlen(prefix)) != 0)
            continue;
        printf("  %-*s  ", w, kv->string);
        entry_text(stdout, kv);
        putchar('\n');
    }
    if (cJSON_GetObjectItemCaseSensitive(doc, "head_dim"))
        printf("  %-*s  %llu (embedding_length / head_count)\n", w, "head_dim",
               (unsigned long long)ju64(doc, "head_dim"));
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "rope_base_default")))
        printf("  %-*s  %g (absent: the default)\n", w, rope_key, jnum_or(doc, "rope_base", NAN));

    gguf_tokenizer_text(doc, g);

    printf("\nmetadata (%d):\n", nkv);
    for (const cJSON *kv = meta->child; kv; kv = kv->next) {
        printf("  %-*s  %-4s  ", w, kv->string, jstr(kv, "type", "?"));
        entry_text(stdout, kv);
        putchar('\n');
    }
    free(keys);
    gguf_tensors_text(ts);
}

/* The weight fingerprint of the model in `path` (kvq_model_fingerprint) and its name,
 * added to doc; when kvq cannot load it as a model, "fingerprint" is null and
 * "fingerprint_error" says why. */
static void add_fingerprint(cJSON *doc, const char *path)
{
    kvq_model_params mp = kvq_model_params_default();
    mp.load_tokenizer = 0;
    kvq_model *m = NULL;
    kvq_err e = {0};
    if (kvq_model_open(path, &mp, &m, &e) != KVQ_OK) {
        cJSON_AddNullToObject(doc, "fingerprint");
        cJSON_AddStringToObject(doc, "fingerprint_error", e.msg);
        return;
    }
    cJSON_AddStringToObject(doc, "fingerprint", kvq_model_fingerprint(m));
    cJSON_AddStringToObject(doc, "model_name", kvq_model_name(m));
    kvq_model_close(m);
}

int inspect_gguf(const char *path, uint64_t file_size, int json)
{
    kvq_err e = {0};
    kvq_gguf *g = NULL;
    if (kvq_gguf_open(path, &g, &e) != KVQ_OK)
        return cli_fail(&e);
    int rc = 0;
    cJSON *doc = gguf_json(path, g, file_size);
    if (doc)
        add_fingerprint(doc, path);
    if (json) {
        rc = json_emit(path, doc); /* frees doc */
    } else if (!doc) {
        rc = cli_failf(1, "%s: out of memory describing the model", path);
    } else {
        gguf_text(doc, g);
        cJSON_Delete(doc);
    }
    kvq_gguf_close(g);
    return rc;
}
