/* cmd_inspect.c — `kvq inspect PATH [--json]`: what a file is and what it holds.
 *
 * The kind is detected from the content, never the name: GGUF (magic "GGUF"), a .kvq
 * artifact (zstd skippable magic), safetensors (u64 header length, then '{'), or a
 * capture directory (a directory with capture.json). The text output is for people
 * and is compared byte for byte by tests/cli/inspect.sh; --json prints one document
 * for scripts, with everything the text shows. An artifact from `kvq fit` / `kvq
 * profile` also gets a summary of docs/format.md sections 9 and 10 ("fit" and
 * "thresholds" in the JSON). */
#include <cJSON.h>
#include <errno.h>
#include <math.h>
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
            "For an artifact from `kvq fit`: the fit's settings and its held-out\n"
            "attention-score error per layer against the plain-VQ reference; after\n"
            "`kvq profile`: the chosen thresholds and each knob's memory/quality table.\n"
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

/* ==========================================================================
 * .kvq: what `kvq fit` and `kvq profile` added (docs/format.md, sections 9 and 10),
 * as a summary. All of it is optional in an artifact: a piece that is missing or
 * malformed shows as "-" (null in JSON), never as an error.
 * ========================================================================== */

/* Element i of an F64 or F32 tensor as a double (views may be unaligned), else NaN. */
static double tensor_at(const kvq_tensor_view *t, size_t i)
{
    double v = NAN;
    if (t->dtype == KVQ_DT_F64 && i < t->nbytes / 8) {
        memcpy(&v, (const char *)t->data + i * 8, 8);
    } else if (t->dtype == KVQ_DT_F32 && i < t->nbytes / 4) {
        float f;
        memcpy(&f, (const char *)t->data + i * 4, 4);
        v = f;
    }
    return v;
}

/* A metadata value as a number; NaN when absent or not a whole number. */
static double meta_num(const kvq_st *st, const char *key)
{
    const char *v = kvq_st_meta_get(st, key);
    char *end = NULL;
    double x = v && *v ? strtod(v, &end) : NAN;
    return end && *end == '\0' ? x : NAN;
}

static const char *meta_str(const kvq_st *st, const char *key, const char *dflt)
{
    const char *v = kvq_st_meta_get(st, key);
    return v ? v : dflt;
}

/* Mean of the finite values of x[0..n); NaN when there is none. */
static double mean_finite(const double *x, size_t n)
{
    double s = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i])) {
            s += x[i];
            k++;
        }
    return k ? s / (double)k : NAN;
}

/* A double as the shortest decimal that reads back to it (cJSON's own printing keeps
 * 15 digits when they come within its epsilon), or null when it is not finite. */
static cJSON *json_num_or_null(double x)
{
    char b[32];
    if (!isfinite(x))
        return cJSON_CreateNull();
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(b, sizeof b, "%.*g", digits, x);
        if (strtod(b, NULL) == x)
            break;
    }
    return cJSON_CreateRaw(b);
}

static cJSON *json_str_or_null(const char *s)
{
    return s ? cJSON_CreateString(s) : cJSON_CreateNull();
}

/* ---- kvq fit ---------------------------------------------------------------------- */

enum { FIT_MSE, FIT_REF, FIT_POWER, FIT_NQ };
/* The [n_fit_layers, n_kv_heads] grids, and the per-head scalars used without them. */
static const char *const fit_grid[FIT_NQ] = {"diag.fit.score_mse", "diag.fit.score_mse_ref",
                                             "diag.fit.score_power"};
static const char *const fit_scalar[FIT_NQ] = {"diag.layer.%d.head.%d.score_mse",
                                               "diag.layer.%d.head.%d.ref.score_mse",
                                               "diag.layer.%d.head.%d.score_power"};

typedef struct fit_summary {
    const char *fit_method;   /* fit.method: vq, qavq, pq, qapq, vq-postrope */
    const char *reference;    /* fit.reference, "none" when absent */
    int64_t n_layers, n_kv;   /* model.n_layers, model.n_kv_heads (0 if malformed) */
    int32_t *layers;          /* [n_fit] model layers with codebooks */
    size_t n_fit;             /* 0: no per-layer table */
    double *v[FIT_NQ];        /* [n_fit, n_kv] per (fit layer, KV head); NaN = absent */
} fit_summary;

static void fit_summary_free(fit_summary *f)
{
    free(f->layers);
    for (int k = 0; k < FIT_NQ; k++)
        free(f->v[k]);
}

/* Reads the fit's summary from st. 0 with *f filled (free with fit_summary_free) for
 * an artifact written by `kvq fit` (it has fit.method); -1 for any other. The table
 * is left empty (n_fit 0) when the model keys or `layers` do not parse or memory runs
 * out. */
static int fit_summary_load(const kvq_st *st, fit_summary *f)
{
    kvq_err e = {0};
    memset(f, 0, sizeof *f);
    f->fit_method = kvq_st_meta_get(st, "fit.method");
    if (!f->fit_method)
        return -1;
    f->reference = meta_str(st, "fit.reference", "none");
    if (kvq_parse_i64(meta_str(st, KVQ_META_N_LAYERS, ""), 1, 1 << 20, &f->n_layers, &e) ||
        kvq_parse_i64(meta_str(st, KVQ_META_N_KV_HEADS, ""), 1, 1 << 20, &f->n_kv, &e)) {
        f->n_layers = f->n_kv = 0;
        return 0;
    }
    const char *layers = kvq_st_meta_get(st, KVQ_META_LAYERS);
    size_t n_fit = 0;
    if (layers) {
        if (kvq_parse_index_list(layers, f->n_layers, &f->layers, &n_fit, &e))
            return 0;
    } else {
        n_fit = (size_t)f->n_layers;
        if (!(f->layers = malloc(n_fit * sizeof *f->layers)))
            return 0;
        for (size_t i = 0; i < n_fit; i++)
            f->layers[i] = (int32_t)i;
    }
    const size_t n_kv = (size_t)f->n_kv;
    for (int k = 0; k < FIT_NQ; k++)
        if (!(f->v[k] = malloc(n_fit * n_kv * sizeof *f->v[k])))
            return 0;
    for (int k = 0; k < FIT_NQ; k++) {
        const kvq_tensor_view *g = kvq_st_find(st, fit_grid[k]);
        const int grid = g && g->ndim == 2 && g->shape[0] == (int64_t)n_fit &&
                         g->shape[1] == f->n_kv;
        for (size_t i = 0; i < n_fit; i++)
            for (size_t h = 0; h < n_kv; h++) {
                double x = NAN;
                if (grid) {
                    x = tensor_at(g, i * n_kv + h);
                } else {
                    char name[128];
                    snprintf(name, sizeof name, fit_scalar[k], f->layers[i], (int)h);
                    const kvq_tensor_view *t = kvq_st_find(st, name);
                    if (t && t->ndim == 0)
                        x = tensor_at(t, 0);
                }
                f->v[k][i * n_kv + h] = x;
            }
    }
    f->n_fit = n_fit;
    return 0;
}

/* Code bits per token per KV head: groups x ceil(log2 codebook_size); 0 if unknown. */
static int fit_code_bits(const kvq_st *st)
{
    const double k = meta_num(st, KVQ_META_CODEBOOK_SIZE), g = meta_num(st, KVQ_META_GROUPS);
    if (!(k >= 2 && k <= 65536 && g >= 1 && g <= 65536))
        return 0;
    int bits = 0;
    while ((double)(1 << bits) < k)
        bits++;
    return bits * (int)g;
}

/* x in a 12-wide cell with printf format fmt, or "-" when it is not finite. */
static void put_cell(const char *fmt, double x)
{
    if (isfinite(x))
        printf(fmt, x);
    else
        printf(" %12s", "-");
}

static void fit_text(const kvq_st *st, const fit_summary *f)
{
    const char *na = "-";
    const int bits = fit_code_bits(st);
    printf("\nfit:\n");
    printf("  method      %s (artifact method %s), reference %s\n", f->fit_method,
           meta_str(st, KVQ_META_METHOD, na), f->reference);
    printf("  codebooks   %s centroids x %s group(s)", meta_str(st, KVQ_META_CODEBOOK_SIZE, na),
           meta_str(st, KVQ_META_GROUPS, na));
    if (bits)
        printf(": %d bits per token per KV head", bits);
    printf("\n  seed        %s\n", meta_str(st, KVQ_META_SEED, na));
    printf("  layers      %s", meta_str(st, KVQ_META_LAYERS, "all"));
    if (f->n_kv)
        printf(" (%zu of %lld), %lld KV heads each", f->n_fit, (long long)f->n_layers,
               (long long)f->n_kv);
    printf("\n  k-means     %s, at most %s iterations, tol %g, sample %s x K\n",
           meta_str(st, "kmeans.init", na), meta_str(st, "kmeans.iters", na),
           meta_num(st, "fit.tol"), meta_str(st, "kmeans.sample", na));
    printf("  keys        %s training, %s held out per head (holdout %g of the sequences)\n",
           meta_str(st, "fit.n_train", na), meta_str(st, "fit.n_heldout_keys", na),
           meta_num(st, "fit.holdout"));
    printf("  positions   %s (w %s, b %s)\n", meta_str(st, "fit.positions", na),
           meta_str(st, KVQ_META_WROPE_W, na), meta_str(st, KVQ_META_WROPE_B, na));
    if (!f->n_fit)
        return;
    const size_t n_kv = (size_t)f->n_kv;
    char ratio[64];
    snprintf(ratio, sizeof ratio, "%s/%s", f->fit_method, f->reference);
    printf("\nheld-out attention-score MSE per layer (mean over %zu KV heads; power = "
           "E[score^2]):\n", n_kv);
    printf("  %5s %12.12s %12.12s %12.12s %12s\n", "layer", f->fit_method, f->reference, ratio,
           "power");
    for (size_t i = 0; i <= f->n_fit; i++) {
        /* rows: each fit layer, then "all" over every (layer, head) */
        const size_t off = i < f->n_fit ? i * n_kv : 0;
        const size_t n = i < f->n_fit ? n_kv : f->n_fit * n_kv;
        const double m = mean_finite(f->v[FIT_MSE] + off, n);
        const double r = mean_finite(f->v[FIT_REF] + off, n);
        if (i < f->n_fit)
            printf("  %5d", f->layers[i]);
        else
            printf("  %5s", "all");
        put_cell(" %12.4g", m);
        put_cell(" %12.4g", r);
        put_cell(" %12.4f", m / r);
        put_cell(" %12.4g", mean_finite(f->v[FIT_POWER] + off, n));
        putchar('\n');
    }
}

static cJSON *fit_json(const kvq_st *st, const fit_summary *f)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "method", f->fit_method);
    cJSON_AddItemToObject(o, "artifact_method", json_str_or_null(kvq_st_meta_get(st,
                                                                                KVQ_META_METHOD)));
    cJSON_AddStringToObject(o, "reference", f->reference);
    cJSON_AddItemToObject(o, "codebook_size", json_num_or_null(meta_num(st,
                                                                         KVQ_META_CODEBOOK_SIZE)));
    cJSON_AddItemToObject(o, "groups", json_num_or_null(meta_num(st, KVQ_META_GROUPS)));
    const int bits = fit_code_bits(st);
    cJSON_AddItemToObject(o, "bits_per_token", bits ? cJSON_CreateNumber(bits)
                                                    : cJSON_CreateNull());
    /* a u64: as a number when a double holds it exactly, else the decimal string */
    const char *seed = kvq_st_meta_get(st, KVQ_META_SEED);
    int64_t s64;
    kvq_err e = {0};
    cJSON_AddItemToObject(o, "seed", !seed ? cJSON_CreateNull()
                                     : kvq_parse_i64(seed, 0, (int64_t)1 << 53, &s64, &e) == KVQ_OK
                                         ? json_i64(s64) : cJSON_CreateString(seed));
    cJSON *kl = cJSON_AddArrayToObject(o, "layers");
    for (size_t i = 0; i < f->n_fit; i++)
        cJSON_AddItemToArray(kl, cJSON_CreateNumber(f->layers[i]));
    cJSON_AddItemToObject(o, "n_kv_heads", f->n_kv ? json_i64(f->n_kv) : cJSON_CreateNull());
    cJSON *km = cJSON_AddObjectToObject(o, "kmeans");
    cJSON_AddItemToObject(km, "init", json_str_or_null(kvq_st_meta_get(st, "kmeans.init")));
    cJSON_AddItemToObject(km, "iters", json_num_or_null(meta_num(st, "kmeans.iters")));
    cJSON_AddItemToObject(km, "sample", json_num_or_null(meta_num(st, "kmeans.sample")));
    cJSON_AddItemToObject(km, "tol", json_num_or_null(meta_num(st, "fit.tol")));
    cJSON_AddItemToObject(o, "holdout", json_num_or_null(meta_num(st, "fit.holdout")));
    cJSON_AddItemToObject(o, "positions", json_str_or_null(kvq_st_meta_get(st,
                                                                           "fit.positions")));
    cJSON_AddItemToObject(o, "n_train", json_num_or_null(meta_num(st, "fit.n_train")));
    cJSON_AddItemToObject(o, "n_heldout_keys", json_num_or_null(meta_num(st,
                                                                          "fit.n_heldout_keys")));
    static const char *const names[FIT_NQ] = {"score_mse", "score_mse_ref", "score_power"};
    const size_t n_kv = (size_t)f->n_kv, all = f->n_fit * n_kv;
    /* over every (layer, head); NaN (null) without a table: mean_finite of nothing */
    for (int k = 0; k < FIT_NQ; k++)
        cJSON_AddItemToObject(o, names[k], json_num_or_null(mean_finite(f->v[k], all)));
    cJSON_AddItemToObject(o, "ratio", json_num_or_null(mean_finite(f->v[FIT_MSE], all) /
                                                       mean_finite(f->v[FIT_REF], all)));
    cJSON *pl = cJSON_AddArrayToObject(o, "per_layer");
    for (size_t i = 0; i < f->n_fit; i++) {
        cJSON *r = cJSON_CreateObject(), *heads = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "layer", f->layers[i]);
        for (int k = 0; k < FIT_NQ; k++) {
            const double *x = f->v[k] + i * n_kv;
            cJSON_AddItemToObject(r, names[k], json_num_or_null(mean_finite(x, n_kv)));
            cJSON *a = cJSON_AddArrayToObject(heads, names[k]);
            for (size_t h = 0; h < n_kv; h++)
                cJSON_AddItemToArray(a, json_num_or_null(x[h]));
        }
        cJSON_AddItemToObject(r, "ratio",
                              json_num_or_null(mean_finite(f->v[FIT_MSE] + i * n_kv, n_kv) /
                                               mean_finite(f->v[FIT_REF] + i * n_kv, n_kv)));
        cJSON_AddItemToObject(r, "heads", heads);
        cJSON_AddItemToArray(pl, r);
    }
    return o;
}

/* ---- kvq profile ------------------------------------------------------------------ */

enum { KNOB_LEANKV, KNOB_PATS, KNOB_BUDGET, KNOB_MASS, N_KNOBS };
static const char *const knob_name[N_KNOBS] = {"leankv", "pats", "budget", "mass"};
static const char *const knob_note[N_KNOBS] = {
    "memory: of the f16 cache; high/low/pruned: token shares",
    "memory: packed, of the cache; bits: unpacked, of 16",
    "attended: of the visible tokens; mass: attention mass kept",
    "attended: of the visible tokens; mass: attention mass kept",
};
#define KNOB_MAX_COLS 16

/* One profile table: profile.NAME [n_rows, n_cols] under profile.NAME.columns. */
typedef struct knob_table {
    const char *skipped;                /* profile.NAME.skipped, or NULL */
    const kvq_tensor_view *rows;        /* [n_rows, n_cols] F64, or NULL (absent, malformed) */
    int64_t n_rows;
    int n_cols;
    char col_buf[256];
    const char *cols[KNOB_MAX_COLS];    /* into col_buf */
    int64_t chosen;                     /* the row equal to diag.profile.NAME.*, or -1 */
    int met;                            /* thresholds.NAME.met: 1, 0, or -1 if absent */
} knob_table;

static void knob_load(const kvq_st *st, int k, knob_table *t)
{
    char key[128];
    memset(t, 0, sizeof *t);
    t->chosen = -1;
    snprintf(key, sizeof key, "profile.%s.skipped", knob_name[k]);
    t->skipped = kvq_st_meta_get(st, key);
    snprintf(key, sizeof key, "thresholds.%s.met", knob_name[k]);
    const double met = meta_num(st, key);
    t->met = met == 1 ? 1 : met == 0 ? 0 : -1;
    snprintf(key, sizeof key, "profile.%s.columns", knob_name[k]);
    snprintf(t->col_buf, sizeof t->col_buf, "%s", meta_str(st, key, ""));
    char *save = NULL;
    for (char *c = strtok_r(t->col_buf, ",", &save); c && t->n_cols < KNOB_MAX_COLS;
         c = strtok_r(NULL, ",", &save))
        t->cols[t->n_cols++] = c;
    snprintf(key, sizeof key, "profile.%s", knob_name[k]);
    const kvq_tensor_view *v = kvq_st_find(st, key);
    if (!v || v->dtype != KVQ_DT_F64 || v->ndim != 2 || t->n_cols == 0 ||
        v->shape[1] != t->n_cols)
        return;
    t->rows = v;
    t->n_rows = v->shape[0];
    /* profile writes the chosen row's finite values as diag.profile.NAME.COLUMN (%.17g,
     * exact): the first row that agrees on every column is the chosen one */
    for (int64_t r = 0; r < t->n_rows && t->chosen < 0; r++) {
        int same = 1;
        for (int c = 0; c < t->n_cols && same; c++) {
            snprintf(key, sizeof key, "diag.profile.%s.%s", knob_name[k], t->cols[c]);
            const double m = meta_num(st, key), x = tensor_at(v, (size_t)r * t->n_cols + c);
            same = isnan(x) ? isnan(m) : m == x;
        }
        if (same)
            t->chosen = r;
    }
}

/* An artifact written by `kvq profile` has thresholds.metric. */
static int has_profile(const kvq_st *st)
{
    return kvq_st_meta_get(st, "thresholds.metric") != NULL;
}

static const char *met_text(int met)
{
    return met == 1 ? "within tolerance" : met == 0 ? "NOT within tolerance (the best found)"
                                                    : "tolerance not recorded";
}

/* The chosen setting of knob k in words, from the keys profile writes. */
static void knob_setting_text(const kvq_st *st, int k)
{
    const char *na = "-";
    switch (k) {
    case KNOB_LEANKV:
        printf("alpha_h %g, alpha_l %g (window %s, %s)", meta_num(st, "leankv.alpha_h"),
               meta_num(st, "leankv.alpha_l"), meta_str(st, "leankv.window", na),
               meta_str(st, "leankv.bits", na));
        break;
    case KNOB_PATS:
        printf("schedule %s, b_min %s, b_max %s (%s cache)", meta_str(st, "pats.schedule", na),
               meta_str(st, "pats.b_min", na), meta_str(st, "pats.b_max", na),
               meta_str(st, "pats.dtype", na));
        break;
    case KNOB_BUDGET:
        printf("fraction %g (%s selector, sink %s, positions %s)",
               meta_num(st, "budget.fraction"), meta_str(st, "budget.selector", na),
               meta_str(st, "budget.sink", na), meta_str(st, "budget.positions", na));
        break;
    default:
        printf("tau %g", meta_num(st, "mass.tau"));
        break;
    }
}

static void profile_text(const kvq_st *st)
{
    knob_table t[N_KNOBS];
    for (int k = 0; k < N_KNOBS; k++)
        knob_load(st, k, &t[k]);
    printf("\nthresholds (metric %s, tolerance %g, prompt fraction %g):\n",
           meta_str(st, "thresholds.metric", "-"), meta_num(st, "thresholds.tolerance"),
           meta_num(st, "thresholds.prompt_fraction"));
    const double ppl = meta_num(st, "diag.profile.ppl_full");
    if (isfinite(ppl))
        printf("  %-7s %.4f (perplexity with full attention)\n", "ppl", ppl);
    for (int k = 0; k < N_KNOBS; k++) {
        if (t[k].skipped) {
            printf("  %-7s skipped: %s\n", knob_name[k], t[k].skipped);
        } else if (t[k].rows && t[k].chosen >= 0) {
            printf("  %-7s ", knob_name[k]);
            knob_setting_text(st, k);
            printf(": %s\n", met_text(t[k].met));
        } else if (t[k].rows) {
            printf("  %-7s no setting chosen\n", knob_name[k]);
        }
    }
    for (int k = 0; k < N_KNOBS; k++) {
        const knob_table *x = &t[k];
        if (!x->rows)
            continue;
        printf("\n%s profile (* = chosen; %s):\n  ", knob_name[k], knob_note[k]);
        for (int c = 0; c < x->n_cols; c++)
            printf(" %12.12s", x->cols[c]);
        putchar('\n');
        for (int64_t r = 0; r < x->n_rows; r++) {
            printf("%s ", r == x->chosen ? "*" : " ");
            for (int c = 0; c < x->n_cols; c++) {
                const double v = tensor_at(x->rows, (size_t)r * x->n_cols + c);
                if (isnan(v))
                    printf(" %12s", "-");
                else if (!strcmp(x->cols[c], "schedule"))
                    printf(" %12s", kvq_pats_schedule_name((kvq_pats_schedule)(int)v));
                else
                    printf(" %12.5g", v);
            }
            putchar('\n');
        }
    }
}

static cJSON *profile_json(const kvq_st *st)
{
    static const char *const setting[N_KNOBS][5] = {
        {"leankv.alpha_h", "leankv.alpha_l", "leankv.window", "leankv.bits", NULL},
        {"pats.schedule", "pats.b_min", "pats.b_max", "pats.dtype", NULL},
        {"budget.fraction", "budget.selector", "budget.sink", "budget.positions", NULL},
        {"mass.tau", NULL},
    };
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "metric", json_str_or_null(kvq_st_meta_get(st, "thresholds.metric")));
    cJSON_AddItemToObject(o, "tolerance", json_num_or_null(meta_num(st, "thresholds.tolerance")));
    cJSON_AddItemToObject(o, "prompt_fraction",
                          json_num_or_null(meta_num(st, "thresholds.prompt_fraction")));
    cJSON_AddItemToObject(o, "ppl_full", json_num_or_null(meta_num(st, "diag.profile.ppl_full")));
    for (int k = 0; k < N_KNOBS; k++) {
        knob_table t;
        knob_load(st, k, &t);
        if (!t.skipped && !t.rows)
            continue;
        cJSON *ko = cJSON_AddObjectToObject(o, knob_name[k]);
        if (t.skipped) {
            cJSON_AddStringToObject(ko, "skipped", t.skipped);
            continue;
        }
        /* the chosen setting: numbers as numbers, names as strings */
        for (int s = 0; setting[k][s]; s++) {
            const char *v = kvq_st_meta_get(st, setting[k][s]);
            const double x = meta_num(st, setting[k][s]);
            const char *field = strchr(setting[k][s], '.') + 1;
            cJSON_AddItemToObject(ko, field, !v ? cJSON_CreateNull()
                                             : isfinite(x) ? cJSON_CreateNumber(x)
                                                           : cJSON_CreateString(v));
        }
        cJSON_AddItemToObject(ko, "met", t.met < 0 ? cJSON_CreateNull() : cJSON_CreateBool(t.met));
        cJSON_AddItemToObject(ko, "chosen", t.chosen < 0 ? cJSON_CreateNull()
                                                         : json_i64(t.chosen));
        cJSON *cols = cJSON_AddArrayToObject(ko, "columns");
        for (int c = 0; c < t.n_cols; c++)
            cJSON_AddItemToArray(cols, cJSON_CreateString(t.cols[c]));
        cJSON *rows = cJSON_AddArrayToObject(ko, "rows");
        for (int64_t r = 0; r < t.n_rows; r++) {
            cJSON *row = cJSON_CreateArray();
            for (int c = 0; c < t.n_cols; c++) {
                const double x = tensor_at(t.rows, (size_t)r * t.n_cols + c);
                cJSON_AddItemToArray(row, json_num_or_null(x));
            }
            cJSON_AddItemToArray(rows, row);
        }
    }
    return o;
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
    fit_summary fit;
    const int is_fit = fit_summary_load(st, &fit) == 0;
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
        if (is_fit)
            cJSON_AddItemToObject(doc, "fit", fit_json(st, &fit));
        if (has_profile(st))
            cJSON_AddItemToObject(doc, "thresholds", profile_json(st));
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
        if (is_fit)
            fit_text(st, &fit);
        if (has_profile(st))
            profile_text(st);
        st_meta_text(st, "model", is_model_key);
        st_meta_text(st, "method", is_method_key);
        st_meta_text(st, "provenance", is_provenance_key);
        st_meta_text(st, "other metadata", is_other_key);
        st_tensors_text(st);
    }
    if (is_fit)
        fit_summary_free(&fit);
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
