/* artifact_api.c — the stable accessors of an open artifact (kvq/artifact.h): metadata,
 * tensors as plain structs, codebooks by (layer, KV head, group), and the description
 * as JSON into the caller's buffer. Built on the payload's safetensors reader. */
#include <stdio.h>
#include <string.h>

#include "kvq/artifact.h"
#include "kvq/util.h"

size_t kvq_artifact_meta_count(const kvq_artifact *a)
{
    return kvq_st_meta_count(kvq_artifact_payload(a));
}

const char *kvq_artifact_meta_key(const kvq_artifact *a, size_t i)
{
    const kvq_st *st = kvq_artifact_payload(a);
    return i < kvq_st_meta_count(st) ? kvq_st_meta_key(st, i) : NULL;
}

const char *kvq_artifact_meta_value(const kvq_artifact *a, size_t i)
{
    const kvq_st *st = kvq_artifact_payload(a);
    return i < kvq_st_meta_count(st) ? kvq_st_meta_value(st, i) : NULL;
}

const char *kvq_artifact_meta_get(const kvq_artifact *a, const char *key)
{
    return kvq_st_meta_get(kvq_artifact_payload(a), key);
}

size_t kvq_artifact_tensor_count(const kvq_artifact *a)
{
    return kvq_st_count(kvq_artifact_payload(a));
}

static void to_plain(const kvq_tensor_view *t, kvq_artifact_tensor *out)
{
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->dtype = kvq_dtype_name(t->dtype);
    out->ndim = t->ndim;
    for (int i = 0; i < t->ndim && i < KVQ_ARTIFACT_MAX_DIMS; i++)
        out->shape[i] = t->shape[i];
    out->nbytes = t->nbytes;
    out->data = t->data;
}

kvq_status kvq_artifact_tensor_at(const kvq_artifact *a, size_t i, kvq_artifact_tensor *out,
                                  kvq_err *err)
{
    const kvq_st *st = kvq_artifact_payload(a);
    if (i >= kvq_st_count(st))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "artifact: tensor %zu of %zu", i,
                           kvq_st_count(st));
    to_plain(kvq_st_tensor(st, i), out);
    return KVQ_OK;
}

kvq_status kvq_artifact_tensor_find(const kvq_artifact *a, const char *name,
                                    kvq_artifact_tensor *out, kvq_err *err)
{
    const kvq_tensor_view *t = kvq_st_find(kvq_artifact_payload(a), name);
    if (!t)
        return kvq_err_set(err, KVQ_E_NOT_FOUND, "artifact: no tensor '%s'", name);
    to_plain(t, out);
    return KVQ_OK;
}

kvq_status kvq_artifact_codebook(const kvq_artifact *a, int32_t layer, int32_t kv_head,
                                 int32_t group, kvq_artifact_tensor *out, kvq_err *err)
{
    char name[96];
    if (group >= 0)
        snprintf(name, sizeof name, KVQ_TENSOR_GROUP_CODEBOOK, (int)layer, (int)kv_head,
                 (int)group);
    else
        snprintf(name, sizeof name, KVQ_TENSOR_CODEBOOK, (int)layer, (int)kv_head);
    return kvq_artifact_tensor_find(a, name, out, err);
}

static void describe(const kvq_artifact *a, kvq_strbuf *b)
{
    const kvq_st *st = kvq_artifact_payload(a);
    kvq_sb_printf(b, "{\"format\": \"kvq\", \"major\": %u, \"minor\": %u, \"payload_bytes\": %zu, "
                  "\"metadata\": {", (unsigned)kvq_artifact_major(a),
                  (unsigned)kvq_artifact_minor(a), kvq_artifact_payload_size(a));
    for (size_t i = 0; i < kvq_st_meta_count(st); i++) {
        kvq_sb_puts(b, i ? ", " : "");
        kvq_sb_json_str(b, kvq_st_meta_key(st, i));
        kvq_sb_puts(b, ": ");
        kvq_sb_json_str(b, kvq_st_meta_value(st, i));
    }
    kvq_sb_puts(b, "}, \"tensors\": [");
    for (size_t i = 0; i < kvq_st_count(st); i++) {
        const kvq_tensor_view *t = kvq_st_tensor(st, i);
        kvq_sb_puts(b, i ? ", {\"name\": " : "{\"name\": ");
        kvq_sb_json_str(b, t->name);
        kvq_sb_printf(b, ", \"dtype\": \"%s\", \"shape\": [", kvq_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            kvq_sb_printf(b, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        kvq_sb_printf(b, "], \"nbytes\": %zu}", t->nbytes);
    }
    kvq_sb_puts(b, "]}");
}

kvq_status kvq_artifact_describe_json(const kvq_artifact *a, char *buf, size_t cap, size_t *len,
                                      kvq_err *err)
{
    kvq_strbuf b = {0};
    describe(a, &b);
    if (b.oom) {
        kvq_sb_free(&b);
        return kvq_err_set(err, KVQ_E_NOMEM, "artifact: out of memory describing it");
    }
    if (len)
        *len = b.len;
    kvq_status s = KVQ_OK;
    if (b.len + 1 <= cap)
        memcpy(buf, b.s ? b.s : "", b.len + 1);
    else if (buf || cap) /* buf NULL with cap 0 only asks the length */
        s = kvq_err_set(err, KVQ_E_TOO_LARGE, "artifact: the description takes %zu bytes, "
                        "the buffer holds %zu", b.len + 1, cap);
    kvq_sb_free(&b);
    return s;
}
