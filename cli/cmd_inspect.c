/* cmd_inspect.c — `kvq inspect PATH [--json]`: what a file is and what it holds.
 *
 * The kind is detected from the content, never the name: GGUF (magic "GGUF"), a .kvq
 * artifact (zstd skippable magic), safetensors (u64 header length, then '{'), or a
 * capture directory (a directory with capture.json). The text output is for people
 * and is compared byte for byte by tests/cli/inspect.sh; --json prints one document
 * for scripts. */
#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "kvq/capture_dir.h"

/* Arrays with more items than this are shown as "[N x type]". */
#define SHORT_ARRAY 8
/* Strings longer than this are cut in the text output ("... (N bytes)"). */
#define SHORT_STRING 64

static void inspect_usage(FILE *f)
{
    fprintf(f,
            "usage: kvq inspect PATH [--json]\n"
            "\n"
            "Describes a GGUF model, a safetensors file, a .kvq artifact or a capture\n"
            "directory (detected from the content): format and version, model identity\n"
            "and hyperparameters, tokenizer, method settings, metadata, and every tensor\n"
            "with its type and shape. GGUF shapes are in ne order (ne[0] contiguous).\n"
            "\n"
            "options:\n"
            "  --json       one JSON document instead of text\n"
            "  -h, --help   this help\n");
}

/* ==========================================================================
 * text helpers
 * ========================================================================== */

/* Writes s[0..n) with control characters, quotes and backslashes escaped; cuts
 * strings longer than `max` bytes (0 = never) at a UTF-8 boundary. */
static void put_escaped(FILE *f, const char *s, size_t n, size_t max)
{
    size_t end = n;
    if (max && n > max) {
        end = max;
        while (end > 0 && ((unsigned char)s[end] & 0xC0) == 0x80)
            end--;
    }
    for (size_t i = 0; i < end; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c == '\\' || c == '"')
            fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7F)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
    if (end < n)
        fprintf(f, "... (%zu bytes)", n);
}

static void put_quoted(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    put_escaped(f, s, n, SHORT_STRING);
    fputc('"', f);
}

static void put_dims(FILE *f, int n, const int64_t *dims)
{
    fputc('[', f);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%lld", i ? ", " : "", (long long)dims[i]);
    fputc(']', f);
}

/* Width of the widest of n strings. */
static int widest(const char *const *s, size_t n)
{
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] && strlen(s[i]) > w)
            w = strlen(s[i]);
    return (int)w;
}

/* ==========================================================================
 * JSON helpers (a NULL from an allocation failure drops the field; the final print
 * then fails and reports it)
 * ========================================================================== */

/* Integers above 2^53 do not survive a double: they become decimal strings. */
static cJSON *json_u64(uint64_t v)
{
    if (v <= ((uint64_t)1 << 53))
        return cJSON_CreateNumber((double)v);
    char b[24];
    snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    return cJSON_CreateString(b);
}

static cJSON *json_i64(int64_t v)
{
    if (v >= -((int64_t)1 << 53) && v <= ((int64_t)1 << 53))
        return cJSON_CreateNumber((double)v);
    char b[24];
    snprintf(b, sizeof b, "%lld", (long long)v);
    return cJSON_CreateString(b);
}

/* A float32 as the shortest decimal that reads back to it, not the double's 17 digits. */
static cJSON *json_f32(double v)
{
    char b[32];
    snprintf(b, sizeof b, "%.9g", v);
    return cJSON_CreateNumber(strtod(b, NULL));
}

static cJSON *json_dims(int n, const int64_t *dims)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(a, json_i64(dims[i]));
    return a;
}

/* Prints and frees doc. */
static int json_emit(const char *path, cJSON *doc)
{
    char *s = doc ? cJSON_Print(doc) : NULL;
    cJSON_Delete(doc);
    if (!s)
        return cli_failf(1, "%s: out of memory building the JSON output", path);
    puts(s);
    cJSON_free(s);
    return 0;
}

static cJSON *json_header(const char *path, const char *format, uint64_t file_size)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "path", path);
    cJSON_AddStringToObject(doc, "format", format);
    cJSON_AddItemToObject(doc, "file_size", json_u64(file_size));
    return doc;
}

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

static int inspect_gguf(const char *path, uint64_t file_size, int json)
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

/* ==========================================================================
 * safetensors (also the payload of an artifact and the files of a capture)
 * ========================================================================== */

/* Metadata keys whose name passes `want` (NULL = all), "  key  value" lines. */
static void st_meta_text(const kvq_st *st, const char *title, int (*want)(const char *))
{
    size_t n = kvq_st_meta_count(st), shown = 0;
    const char **keys = calloc(n + 1, sizeof *keys);
    if (!keys)
        return;
    for (size_t i = 0; i < n; i++)
        if (!want || want(kvq_st_meta_key(st, i)))
            keys[shown++] = kvq_st_meta_key(st, i);
    if (shown) {
        int w = widest(keys, shown);
        printf("\n%s (%zu):\n", title, shown);
        for (size_t i = 0; i < shown; i++) {
            const char *v = kvq_st_meta_get(st, keys[i]);
            printf("  %-*s  ", w, keys[i]);
            put_escaped(stdout, v, strlen(v), SHORT_STRING);
            putchar('\n');
        }
    }
    free(keys);
}

static void st_tensors_text(const kvq_st *st)
{
    size_t n = kvq_st_count(st);
    const char **names = calloc(n + 1, sizeof *names);
    if (!names)
        return;
    uint64_t elems = 0;
    for (size_t i = 0; i < n; i++) {
        const kvq_tensor_view *t = kvq_st_tensor(st, i);
        names[i] = t->name;
        uint64_t e = 1;
        for (int k = 0; k < t->ndim; k++)
            e *= (uint64_t)t->shape[k];
        elems += e;
    }
    int w = widest(names, n);
    if (w < 4)
        w = 4;
    printf("\ntensors (%zu, %llu elements, %zu bytes):\n", n, (unsigned long long)elems,
           kvq_st_data_size(st));
    printf("  %-*s  %-7s  %-16s  %s\n", w, "name", "dtype", "shape", "offset");
    for (size_t i = 0; i < n; i++) {
        const kvq_tensor_view *t = kvq_st_tensor(st, i);
        char shape[128];
        FILE *mem = fmemopen(shape, sizeof shape, "w");
        if (mem) {
            put_dims(mem, t->ndim, t->shape);
            fclose(mem);
        } else {
            shape[0] = 0;
        }
        printf("  %-*s  %-7s  %-16s  %llu\n", w, t->name, kvq_dtype_name(t->dtype), shape,
               (unsigned long long)t->offset);
    }
    free(names);
}

static cJSON *st_meta_json(const kvq_st *st, const char *prefix_strip, int (*want)(const char *))
{
    cJSON *o = cJSON_CreateObject();
    size_t strip = prefix_strip ? strlen(prefix_strip) : 0;
    for (size_t i = 0; i < kvq_st_meta_count(st); i++) {
        const char *k = kvq_st_meta_key(st, i);
        if (!want || want(k))
            cJSON_AddStringToObject(o, k + strip, kvq_st_meta_value(st, i));
    }
    return o;
}

static cJSON *st_tensors_json(const kvq_st *st)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < kvq_st_count(st); i++) {
        const kvq_tensor_view *t = kvq_st_tensor(st, i);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", t->name);
        cJSON_AddStringToObject(o, "dtype", kvq_dtype_name(t->dtype));
        cJSON_AddItemToObject(o, "shape", json_dims(t->ndim, t->shape));
        cJSON_AddItemToObject(o, "offset", json_u64(t->offset));
        cJSON_AddItemToObject(o, "nbytes", json_u64(t->nbytes));
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

static int inspect_safetensors(const char *path, uint64_t file_size, int json)
{
    kvq_err e = {0};
    kvq_st *st = NULL;
    if (kvq_st_open(path, &st, &e) != KVQ_OK)
        return cli_fail(&e);
    int rc = 0;
    if (json) {
        cJSON *doc = json_header(path, "safetensors", file_size);
        cJSON_AddItemToObject(doc, "header_size", json_u64(kvq_st_header_size(st)));
        cJSON_AddItemToObject(doc, "data_size", json_u64(kvq_st_data_size(st)));
        cJSON_AddItemToObject(doc, "metadata", st_meta_json(st, NULL, NULL));
        cJSON_AddItemToObject(doc, "tensors", st_tensors_json(st));
        rc = json_emit(path, doc);
    } else {
        printf("%s: safetensors, %llu bytes\n", path, (unsigned long long)file_size);
        printf("  header %zu bytes, data %zu bytes, %zu tensors, %zu metadata keys\n",
               kvq_st_header_size(st), kvq_st_data_size(st), kvq_st_count(st),
               kvq_st_meta_count(st));
        st_meta_text(st, "metadata", NULL);
        st_tensors_text(st);
    }
    kvq_st_close(st);
    return rc;
}

/* ==========================================================================
 * .kvq artifact
 * ========================================================================== */

static int is_model_key(const char *k) { return !strncmp(k, "model.", 6); }
static int is_provenance_key(const char *k) { return !strncmp(k, "provenance.", 11); }

static int is_method_key(const char *k)
{
    static const char *const keys[] = {KVQ_META_METHOD, KVQ_META_CODEBOOK_SIZE, KVQ_META_GROUPS,
                                       KVQ_META_WROPE_W, KVQ_META_WROPE_B, KVQ_META_SEED,
                                       KVQ_META_LAYERS};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strcmp(k, keys[i]))
            return 1;
    return !strncmp(k, "kmeans.", 7) || !strncmp(k, "leankv.", 7) || !strncmp(k, "pats.", 5);
}

static int is_other_key(const char *k)
{
    return !is_model_key(k) && !is_provenance_key(k) && !is_method_key(k);
}

static int inspect_kvq(const char *path, uint64_t file_size, int json)
{
    kvq_err e = {0}, ve = {0};
    kvq_artifact *a = NULL;
    if (kvq_artifact_open(path, &a, &e) != KVQ_OK)
        return cli_fail(&e);
    const kvq_st *st = kvq_artifact_payload(a);
    kvq_status valid = kvq_artifact_validate(a, &ve);
    size_t payload = kvq_artifact_payload_size(a);
    int rc = 0;
    if (json) {
        cJSON *doc = json_header(path, "kvq", file_size);
        char ver[32];
        snprintf(ver, sizeof ver, "%u.%u", kvq_artifact_major(a), kvq_artifact_minor(a));
        cJSON_AddStringToObject(doc, "version", ver);
        cJSON_AddNumberToObject(doc, "major", kvq_artifact_major(a));
        cJSON_AddNumberToObject(doc, "minor", kvq_artifact_minor(a));
        cJSON_AddItemToObject(doc, "payload_size", json_u64(payload));
        cJSON_AddBoolToObject(doc, "valid", valid == KVQ_OK);
        if (valid != KVQ_OK)
            cJSON_AddStringToObject(doc, "problem", ve.msg);
        cJSON_AddItemToObject(doc, "model", st_meta_json(st, "model.", is_model_key));
        cJSON_AddItemToObject(doc, "method", st_meta_json(st, NULL, is_method_key));
        cJSON_AddItemToObject(doc, "provenance",
                              st_meta_json(st, "provenance.", is_provenance_key));
        cJSON_AddItemToObject(doc, "metadata", st_meta_json(st, NULL, NULL));
        cJSON_AddItemToObject(doc, "tensors", st_tensors_json(st));
        rc = json_emit(path, doc);
    } else {
        printf("%s: kvq artifact version %u.%u, %llu bytes\n", path, kvq_artifact_major(a),
               kvq_artifact_minor(a), (unsigned long long)file_size);
        printf("  payload %zu bytes (safetensors, compressed %.2fx), %zu tensors, "
               "%zu metadata keys\n", payload,
               file_size ? (double)payload / (double)file_size : 0.0, kvq_st_count(st),
               kvq_st_meta_count(st));
        if (valid == KVQ_OK)
            printf("  conforms to format %d.%d\n", KVQ_ARTIFACT_MAJOR, KVQ_ARTIFACT_MINOR);
        else
            printf("  does not conform to format %d.%d: %s\n", KVQ_ARTIFACT_MAJOR,
                   KVQ_ARTIFACT_MINOR, ve.msg);
        st_meta_text(st, "model", is_model_key);
        st_meta_text(st, "method", is_method_key);
        st_meta_text(st, "provenance", is_provenance_key);
        st_meta_text(st, "other metadata", is_other_key);
        st_tensors_text(st);
    }
    kvq_artifact_close(a);
    return rc;
}

/* ==========================================================================
 * capture directory
 * ========================================================================== */

static int inspect_capture(const char *path, int json)
{
    kvq_err e = {0};
    kvq_capture_info *ci = NULL;
    if (kvq_capture_info_read(path, &ci, &e) != KVQ_OK)
        return cli_fail(&e);
    const kvq_model_id *m = &ci->model;
    int rc = 0;
    cJSON *doc = NULL, *layers = NULL;
    if (json) {
        doc = cJSON_CreateObject();
        cJSON_AddStringToObject(doc, "path", path);
        cJSON_AddStringToObject(doc, "format", "capture");
        cJSON_AddNumberToObject(doc, "version", ci->version);
        cJSON_AddStringToObject(doc, "tool", ci->tool);
        cJSON *mo = cJSON_AddObjectToObject(doc, "model");
        cJSON_AddStringToObject(mo, "architecture", m->architecture);
        cJSON_AddNumberToObject(mo, "n_layers", m->n_layers);
        cJSON_AddNumberToObject(mo, "n_heads", m->n_heads);
        cJSON_AddNumberToObject(mo, "n_kv_heads", m->n_kv_heads);
        cJSON_AddNumberToObject(mo, "head_dim", m->head_dim);
        cJSON_AddNumberToObject(mo, "rope_base", m->rope.base);
        cJSON_AddStringToObject(mo, "rope_layout", kvq_rope_layout_name(m->rope.layout));
        cJSON_AddStringToObject(mo, "rope_scaling", kvq_rope_scaling_name(m->rope.scaling));
        cJSON *co = cJSON_AddObjectToObject(doc, "corpus");
        cJSON_AddStringToObject(co, "spec", ci->corpus_spec);
        cJSON_AddItemToObject(co, "seed", json_u64(ci->corpus_seed));
        cJSON_AddStringToObject(co, "hash", ci->corpus_hash);
        cJSON_AddItemToObject(co, "n_documents", json_i64(ci->n_documents));
        cJSON_AddStringToObject(doc, "dtype", kvq_dtype_name(ci->dtype));
        cJSON_AddItemToObject(doc, "n_tokens", json_i64(ci->n_tokens));
        cJSON_AddItemToObject(doc, "n_sequences", json_i64(ci->n_sequences));
        cJSON_AddItemToObject(doc, "queries", json_i64(ci->n_queries));
        cJSON_AddBoolToObject(doc, "has_values", ci->has_values);
        layers = cJSON_AddArrayToObject(doc, "layers");
    } else {
        printf("%s: kvq capture directory version %d (%s)\n", path, ci->version, ci->tool);
        printf("\nmodel:\n  %s, %d layers, %d heads, %d KV heads, head dim %d\n",
               m->architecture, m->n_layers, m->n_heads, m->n_kv_heads, m->head_dim);
        printf("  rope base %g, layout %s, scaling %s\n", m->rope.base,
               kvq_rope_layout_name(m->rope.layout), kvq_rope_scaling_name(m->rope.scaling));
        printf("\ncorpus:\n  %s (seed %llu, hash %s, %lld documents)\n", ci->corpus_spec,
               (unsigned long long)ci->corpus_seed, ci->corpus_hash, (long long)ci->n_documents);
        printf("  %lld tokens in %lld sequences, stored as %s, queries %s%s\n",
               (long long)ci->n_tokens, (long long)ci->n_sequences, kvq_dtype_name(ci->dtype),
               ci->n_queries ? "sampled" : "all", ci->has_values ? ", with values" : "");
        printf("\nlayers (%d):\n", ci->n_files);
    }
    for (int32_t i = 0; i < ci->n_files && rc == 0; i++) {
        char *file = NULL;
        kvq_st *st = NULL;
        if (kvq_capture_info_file_path(ci, i, &file, &e) != KVQ_OK ||
            kvq_st_open(file, &st, &e) != KVQ_OK) {
            rc = cli_fail(&e);
        } else if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "layer", ci->layers[i]);
            cJSON_AddStringToObject(o, "file", ci->files[i]);
            cJSON_AddItemToObject(o, "tensors", st_tensors_json(st));
            cJSON_AddItemToArray(layers, o);
        } else {
            printf("  %3d  %s:", ci->layers[i], ci->files[i]);
            for (size_t k = 0; k < kvq_st_count(st); k++) {
                const kvq_tensor_view *t = kvq_st_tensor(st, k);
                printf("%s %s %s ", k ? "," : "", t->name, kvq_dtype_name(t->dtype));
                put_dims(stdout, t->ndim, t->shape);
            }
            putchar('\n');
        }
        kvq_st_close(st);
        free(file);
    }
    if (json && rc == 0)
        rc = json_emit(path, doc); /* frees doc */
    else
        cJSON_Delete(doc);          /* NULL is fine */
    kvq_capture_info_free(ci);
    return rc;
}

/* ==========================================================================
 * detection and entry point
 * ========================================================================== */

typedef enum { KIND_UNKNOWN, KIND_GGUF, KIND_KVQ, KIND_SAFETENSORS } file_kind;

static file_kind detect(const uint8_t *b, size_t n)
{
    if (n >= 4 && !memcmp(b, "GGUF", 4))
        return KIND_GGUF;
    if (n >= 4 && b[0] == 0x5B && b[1] == 0x2A && b[2] == 0x4D && b[3] == 0x18)
        return KIND_KVQ;
    if (n >= 9 && b[8] == '{')
        return KIND_SAFETENSORS;
    return KIND_UNKNOWN;
}

int cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            inspect_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            inspect_usage(stderr);
            return cli_failf(2, "inspect: unknown option '%s'", argv[i]);
        } else if (path) {
            return cli_failf(2, "inspect: one PATH only ('%s' and '%s')", path, argv[i]);
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        inspect_usage(stderr);
        return 2;
    }

    struct stat sb;
    if (stat(path, &sb) != 0)
        return cli_failf(1, "%s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        char probe[4096];
        snprintf(probe, sizeof probe, "%s/%s", path, KVQ_CAPTURE_JSON);
        if (access(probe, F_OK) != 0)
            return cli_failf(1, "%s: a directory without %s (not a capture directory)", path,
                             KVQ_CAPTURE_JSON);
        return inspect_capture(path, json);
    }
    uint8_t head[16] = {0};
    size_t n = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return cli_failf(1, "%s: %s", path, strerror(errno));
    n = fread(head, 1, sizeof head, f);
    fclose(f);
    switch (detect(head, n)) {
    case KIND_GGUF:
        return inspect_gguf(path, (uint64_t)sb.st_size, json);
    case KIND_KVQ:
        return inspect_kvq(path, (uint64_t)sb.st_size, json);
    case KIND_SAFETENSORS:
        return inspect_safetensors(path, (uint64_t)sb.st_size, json);
    case KIND_UNKNOWN:
        break;
    }
    if (n == 0)
        return cli_failf(1, "%s: empty file", path);
    return cli_failf(1, "%s: not a kvq file (unrecognized format: not GGUF, safetensors, a "
                     ".kvq artifact or a capture directory)", path);
}
