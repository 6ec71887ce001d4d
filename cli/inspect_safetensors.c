/* inspect_safetensors.c — `kvq inspect` of a safetensors file, and the metadata and
 * tensor listings shared with the artifact's payload and the capture's layer files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/inspect.h"

/* ==========================================================================
 * safetensors (also the payload of an artifact and the files of a capture)
 * ========================================================================== */

void meta_text(const cJSON *md, const char *title, int (*want)(const char *))
{
    const int n = cJSON_GetArraySize(md);
    size_t shown = 0;
    const cJSON **kv = calloc((size_t)n + 1, sizeof *kv);
    const char **keys = calloc((size_t)n + 1, sizeof *keys);
    if (kv && keys)
        for (const cJSON *x = md ? md->child : NULL; x; x = x->next)
            if (!want || want(x->string)) {
                kv[shown] = x;
                keys[shown++] = x->string;
            }
    if (shown) {
        int w = widest(keys, shown);
        printf("\n%s (%zu):\n", title, shown);
        for (size_t i = 0; i < shown; i++) {
            const char *v = cJSON_IsString(kv[i]) ? kv[i]->valuestring : "";
            printf("  %-*s  ", w, keys[i]);
            put_escaped(stdout, v, strlen(v), SHORT_STRING);
            putchar('\n');
        }
    }
    free(kv);
    free(keys);
}

/* Dimensions of a json_dims array, at most 8 (a safetensors tensor has fewer). */
static int dims_of(const cJSON *a, int64_t dims[8])
{
    int n = 0;
    for (const cJSON *x = a ? a->child : NULL; x && n < 8; x = x->next)
        dims[n++] = jint(x);
    return n;
}

void tensors_text(const cJSON *ts, uint64_t data_size)
{
    const int n = cJSON_GetArraySize(ts);
    const char **names = calloc((size_t)n + 1, sizeof *names);
    if (!names)
        return;
    uint64_t elems = 0;
    int i = 0;
    for (const cJSON *t = ts->child; t; t = t->next, i++) {
        int64_t dims[8];
        const int nd = dims_of(cJSON_GetObjectItemCaseSensitive(t, "shape"), dims);
        names[i] = jstr(t, "name", "");
        uint64_t e = 1;
        for (int k = 0; k < nd; k++)
            e *= (uint64_t)dims[k];
        elems += e;
    }
    int w = widest(names, (size_t)n);
    if (w < 4)
        w = 4;
    printf("\ntensors (%d, %llu elements, %llu bytes):\n", n, (unsigned long long)elems,
           (unsigned long long)data_size);
    printf("  %-*s  %-7s  %-16s  %s\n", w, "name", "dtype", "shape", "offset");
    for (const cJSON *t = ts->child; t; t = t->next) {
        int64_t dims[8];
        const int nd = dims_of(cJSON_GetObjectItemCaseSensitive(t, "shape"), dims);
        char shape[128];
        FILE *mem = fmemopen(shape, sizeof shape, "w");
        if (mem) {
            put_dims(mem, nd, dims);
            fclose(mem);
        } else {
            shape[0] = 0;
        }
        printf("  %-*s  %-7s  %-16s  %llu\n", w, jstr(t, "name", ""), jstr(t, "dtype", "?"),
               shape, (unsigned long long)ju64(t, "offset"));
    }
    free(names);
}

cJSON *st_meta_json(const kvq_st *st, const char *prefix_strip, int (*want)(const char *))
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

cJSON *st_tensors_json(const kvq_st *st)
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

static cJSON *st_describe(const char *path, const kvq_st *st, uint64_t file_size)
{
    cJSON *doc = json_header(path, "safetensors", file_size);
    cJSON_AddItemToObject(doc, "header_size", json_u64(kvq_st_header_size(st)));
    cJSON_AddItemToObject(doc, "data_size", json_u64(kvq_st_data_size(st)));
    cJSON_AddItemToObject(doc, "metadata", st_meta_json(st, NULL, NULL));
    cJSON_AddItemToObject(doc, "tensors", st_tensors_json(st));
    return doc;
}

static void st_text(const cJSON *doc)
{
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(doc, "metadata");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(doc, "tensors");
    printf("%s: safetensors, %llu bytes\n", jstr(doc, "path", "?"),
           (unsigned long long)ju64(doc, "file_size"));
    printf("  header %llu bytes, data %llu bytes, %d tensors, %d metadata keys\n",
           (unsigned long long)ju64(doc, "header_size"), (unsigned long long)ju64(doc, "data_size"),
           cJSON_GetArraySize(ts), cJSON_GetArraySize(md));
    meta_text(md, "metadata", NULL);
    tensors_text(ts, ju64(doc, "data_size"));
}

int inspect_safetensors(const char *path, uint64_t file_size, int json)
{
    kvq_err e = {0};
    kvq_st *st = NULL;
    if (kvq_st_open(path, &st, &e) != KVQ_OK)
        return cli_fail(&e);
    int rc = 0;
    cJSON *doc = st_describe(path, st, file_size);
    if (json) {
        rc = json_emit(path, doc); /* frees doc */
    } else if (!doc) {
        rc = cli_failf(1, "%s: out of memory describing the file", path);
    } else {
        st_text(doc);
        cJSON_Delete(doc);
    }
    kvq_st_close(st);
    return rc;
}
