/* inspect_capture.c — `kvq inspect` of a capture directory: capture.json and the
 * tensors of every layer file. */
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "cli/inspect.h"
#include "kvq/capture_dir.h"

/* ==========================================================================
 * capture directory
 * ========================================================================== */

int inspect_capture(const char *path, int json)
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
