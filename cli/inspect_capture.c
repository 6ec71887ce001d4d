/* inspect_capture.c — `kvq inspect` of a capture directory: capture.json and the
 * tensors of every layer file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/inspect.h"
#include "kvq/capture_dir.h"

/* The description: capture.json's fields and every layer file's tensors. NULL with
 * the error printed (the exit code in *rc) when a layer file does not open. */
static cJSON *capture_describe(const char *path, const kvq_capture_info *ci, int *rc)
{
    const kvq_model_id *m = &ci->model;
    kvq_err e = {0};
    cJSON *doc = cJSON_CreateObject();
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
    if (ci->tokenizer_approx[0])
        cJSON_AddStringToObject(doc, "tokenizer_approx", ci->tokenizer_approx);
    cJSON *layers = cJSON_AddArrayToObject(doc, "layers");
    /* each file opened as the stages open it: its checksum verified when recorded */
    cJSON_AddStringToObject(doc, "checksums", ci->checksums ? "xxh64" : "none");
    for (int32_t i = 0; i < ci->n_files && *rc == 0; i++) {
        kvq_capture_layer L;
        if (kvq_capture_layer_open(ci, i, &L, &e) != KVQ_OK) {
            *rc = cli_fail(&e);
            continue;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "layer", ci->layers[i]);
        cJSON_AddStringToObject(o, "file", ci->files[i]);
        cJSON_AddItemToObject(o, "tensors", st_tensors_json(L.st));
        cJSON_AddItemToArray(layers, o);
        kvq_capture_layer_close(&L);
    }
    if (*rc) {
        cJSON_Delete(doc);
        return NULL;
    }
    return doc;
}

static void capture_text(const cJSON *doc)
{
    const cJSON *mo = cJSON_GetObjectItemCaseSensitive(doc, "model");
    const cJSON *co = cJSON_GetObjectItemCaseSensitive(doc, "corpus");
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(doc, "layers");
    printf("%s: kvq capture directory version %d (%s)\n", jstr(doc, "path", "?"),
           (int)jnum_or(doc, "version", 0), jstr(doc, "tool", ""));
    printf("\nmodel:\n  %s, %d layers, %d heads, %d KV heads, head dim %d\n",
           jstr(mo, "architecture", ""), (int)jnum_or(mo, "n_layers", 0),
           (int)jnum_or(mo, "n_heads", 0), (int)jnum_or(mo, "n_kv_heads", 0),
           (int)jnum_or(mo, "head_dim", 0));
    printf("  rope base %g, layout %s, scaling %s\n", jnum_or(mo, "rope_base", NAN),
           jstr(mo, "rope_layout", ""), jstr(mo, "rope_scaling", ""));
    printf("\ncorpus:\n  %s (seed %llu, hash %s, %lld documents)\n", jstr(co, "spec", ""),
           (unsigned long long)ju64(co, "seed"), jstr(co, "hash", ""),
           (long long)jnum_or(co, "n_documents", 0));
    printf("  %lld tokens in %lld sequences, stored as %s, queries %s%s\n",
           (long long)jnum_or(doc, "n_tokens", 0), (long long)jnum_or(doc, "n_sequences", 0),
           jstr(doc, "dtype", ""), jnum_or(doc, "queries", 0) ? "sampled" : "all",
           cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "has_values")) ? ", with values"
                                                                              : "");
    if (cJSON_GetObjectItemCaseSensitive(doc, "tokenizer_approx"))
        printf("  tokenizer approximated: %s\n", jstr(doc, "tokenizer_approx", ""));
    printf("\nlayers (%d), %s:\n", cJSON_GetArraySize(layers),
           strcmp(jstr(doc, "checksums", ""), "none") ? "xxh64 checksums verified"
                                                      : "no checksums recorded");
    for (const cJSON *o = layers->child; o; o = o->next) {
        printf("  %3d  %s:", (int)jnum_or(o, "layer", 0), jstr(o, "file", ""));
        const cJSON *ts = cJSON_GetObjectItemCaseSensitive(o, "tensors");
        for (const cJSON *t = ts ? ts->child : NULL; t; t = t->next) {
            int64_t dims[8];
            int nd = 0;
            for (const cJSON *x = cJSON_GetObjectItemCaseSensitive(t, "shape")->child;
                 x && nd < 8; x = x->next)
                dims[nd++] = jint(x);
            printf("%s %s %s ", t != ts->child ? "," : "", jstr(t, "name", ""),
                   jstr(t, "dtype", ""));
            put_dims(stdout, nd, dims);
        }
        putchar('\n');
    }
}

int inspect_capture(const char *path, int json)
{
    kvq_err e = {0};
    kvq_capture_info *ci = NULL;
    if (kvq_capture_info_read(path, &ci, &e) != KVQ_OK)
        return cli_fail(&e);
    int rc = 0;
    cJSON *doc = capture_describe(path, ci, &rc);
    if (rc == 0 && json) {
        rc = json_emit(path, doc); /* frees doc */
    } else if (rc == 0 && !doc) {
        rc = cli_failf(1, "%s: out of memory describing the capture", path);
    } else if (rc == 0) {
        capture_text(doc);
        cJSON_Delete(doc);
    }
    kvq_capture_info_free(ci);
    return rc;
}
