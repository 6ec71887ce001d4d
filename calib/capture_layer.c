/* capture_layer.c — the reader of one capture layer file (kvq/capture_dir.h,
 * kvq_capture_layer): open, tensors checked against capture.json, checked int columns,
 * vectors as f32. Used by the moments, fit, profile and merge stages. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/capture_dir.h"
#include "kvq/half.h"
#include "kvq/util.h"

/* The file's XXH64 against the one capture.json records (none recorded: accepted). */
static kvq_status check_sum(const kvq_capture_info *ci, int32_t i, const char *path,
                            kvq_err *err)
{
    if (!ci->checksums)
        return KVQ_OK;
    uint64_t h = 0;
    kvq_status s = kvq_xxh64_file(path, &h, err);
    if (s)
        return s;
    if (h != ci->checksums[i])
        return kvq_err_set(err, KVQ_E_CHECKSUM, "%s: checksum mismatch: its bytes hash to "
                           "xxh64:%016" PRIx64 ", %s records xxh64:%016" PRIx64 " (the file is "
                           "corrupt or was changed)", path, h, KVQ_CAPTURE_JSON,
                           ci->checksums[i]);
    return KVQ_OK;
}

kvq_status kvq_capture_layer_open(const kvq_capture_info *ci, int32_t i, kvq_capture_layer *L,
                                  kvq_err *err)
{
    kvq_status s;
    memset(L, 0, sizeof *L);
    L->ci = ci;
    L->layer = ci->layers[i];
    L->n_q = ci->n_queries > 0 ? ci->n_queries : ci->n_tokens;
    if ((s = kvq_capture_info_file_path(ci, i, &L->path, err)) ||
        (s = kvq_st_open(L->path, &L->st, err)) || (s = check_sum(ci, i, L->path, err)))
        goto fail;
    const char *ml = kvq_st_meta_get(L->st, "layer");
    int64_t mlv = 0;
    if (ml && (kvq_parse_i64(ml, 0, INT32_MAX, &mlv, NULL) || mlv != L->layer)) {
        s = kvq_err_set(err, KVQ_E_CORRUPT, "%s: metadata layer \"%s\" but capture.json "
                        "lists this file as layer %d", L->path, ml, (int)L->layer);
        goto fail;
    }
    return KVQ_OK;
fail:
    kvq_capture_layer_close(L);
    return s;
}

void kvq_capture_layer_close(kvq_capture_layer *L)
{
    kvq_st_close(L->st);
    free(L->path);
    memset(L, 0, sizeof *L);
}

/* The dtype and shape capture.json gives tensor `name`; 0 for a name not in the table. */
static int expected(const kvq_capture_layer *L, const char *name, kvq_dtype *dt, int *ndim,
                    int64_t shape[3])
{
    const kvq_capture_info *ci = L->ci;
    const int64_t nt = ci->n_tokens, nh = ci->model.n_heads, nkv = ci->model.n_kv_heads,
                  d = ci->model.head_dim;
    if (!strcmp(name, "k") || !strcmp(name, "v") || !strcmp(name, "q")) {
        *dt = ci->dtype;
        *ndim = 3;
        shape[0] = name[0] == 'q' ? L->n_q : nt;
        shape[1] = name[0] == 'q' ? nh : nkv;
        shape[2] = d;
    } else if (!strcmp(name, "q_rows") || !strcmp(name, "pos") || !strcmp(name, "seq") ||
               !strcmp(name, "tokens")) {
        *dt = KVQ_DT_I32;
        *ndim = 1;
        shape[0] = !strcmp(name, "q_rows") ? L->n_q : nt;
    } else if (!strcmp(name, "q_moment_sum")) {
        *dt = KVQ_DT_F64;
        *ndim = 3;
        shape[0] = nh;
        shape[1] = shape[2] = d;
    } else if (!strcmp(name, "q_moment_count")) {
        *dt = KVQ_DT_F64;
        *ndim = 1;
        shape[0] = nh;
    } else {
        return 0;
    }
    return 1;
}

/* "a, b, c" */
static void format_shape(const int64_t *shape, int ndim, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < ndim && used < cap; i++) {
        int w = snprintf(buf + used, cap - used, "%s%" PRId64, i ? ", " : "", shape[i]);
        used += w > 0 ? (size_t)w : 0;
    }
}

kvq_status kvq_capture_layer_tensor(const kvq_capture_layer *L, const char *name,
                                    const kvq_tensor_view **out, kvq_err *err)
{
    kvq_dtype dt;
    int ndim = 0;
    int64_t shape[3];
    if (!expected(L, name, &dt, &ndim, shape))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: %s is not a capture tensor", L->path,
                           name);
    const kvq_tensor_view *v = kvq_st_find(L->st, name);
    if (!v)
        return kvq_err_set(err, KVQ_E_NOT_FOUND, "%s: tensor %s is missing", L->path, name);
    int ok = v->dtype == dt && v->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = v->shape[i] == shape[i];
    if (!ok) {
        char want[128], got[128];
        format_shape(shape, ndim, want, sizeof want);
        format_shape(v->shape, v->ndim, got, sizeof got);
        return kvq_err_set(err, KVQ_E_SHAPE_MISMATCH, "%s: tensor %s is %s [%s], capture.json "
                           "says %s [%s]", L->path, name, kvq_dtype_name(v->dtype), got,
                           kvq_dtype_name(dt), want);
    }
    *out = v;
    return KVQ_OK;
}

static int32_t int_at(const kvq_tensor_view *t, int64_t i)
{
    int32_t x;
    memcpy(&x, (const uint8_t *)t->data + (size_t)i * 4, 4); /* the view may be unaligned */
    return x;
}

kvq_status kvq_capture_layer_ints(const kvq_capture_layer *L, const kvq_tensor_view *t,
                                  int64_t first, int64_t n, int32_t *out, kvq_err *err)
{
    const kvq_capture_info *ci = L->ci;
    const int rows = !strcmp(t->name, "q_rows");
    const int64_t limit = !strcmp(t->name, "seq")      ? ci->n_sequences
                          : !strcmp(t->name, "tokens") ? ci->model.vocab_size
                                                       : ci->n_tokens;
    memcpy(out, (const uint8_t *)t->data + (size_t)first * 4, (size_t)n * 4);
    int64_t prev = rows && first > 0 ? int_at(t, first - 1) : -1;
    for (int64_t j = 0; j < n; j++) {
        if (out[j] < 0 || out[j] >= limit)
            return kvq_err_set(err, KVQ_E_CORRUPT,
                               "%s: %s[%" PRId64 "] = %d is outside [0, %" PRId64 ")", L->path,
                               t->name, first + j, out[j], limit);
        if (rows && out[j] <= prev)
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: q_rows[%" PRId64 "] = %d is not "
                               "ascending", L->path, first + j, out[j]);
        prev = out[j];
    }
    return KVQ_OK;
}

kvq_status kvq_capture_layer_column(const kvq_capture_layer *L, const char *name,
                                    int32_t **out, kvq_err *err)
{
    const kvq_tensor_view *t;
    kvq_status s;
    *out = NULL;
    if ((s = kvq_capture_layer_tensor(L, name, &t, err)))
        return s;
    if (t->ndim != 1 || t->dtype != KVQ_DT_I32)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: %s is not an int column", L->path,
                           name);
    int32_t *v = malloc(t->nbytes ? t->nbytes : 1);
    if (!v)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory reading %s", L->path, name);
    if ((s = kvq_capture_layer_ints(L, t, 0, t->shape[0], v, err))) {
        free(v);
        return s;
    }
    *out = v;
    return KVQ_OK;
}

void kvq_capture_read_f32(const kvq_tensor_view *t, size_t first, size_t n, float *out)
{
    const uint8_t *p = (const uint8_t *)t->data + first * kvq_dtype_size(t->dtype);
    if (t->dtype == KVQ_DT_F32) {
        memcpy(out, p, n * sizeof *out);
        return;
    }
    enum { PIECE = 1024 };
    uint16_t h[PIECE]; /* aligned copy: the view may be unaligned */
    for (size_t i = 0; i < n; i += PIECE) {
        const size_t m = n - i < PIECE ? n - i : PIECE;
        memcpy(h, p + i * sizeof *h, m * sizeof *h);
        if (t->dtype == KVQ_DT_F16)
            kvq_f16_to_f32(h, out + i, m);
        else
            kvq_bf16_to_f32(h, out + i, m);
    }
}

void kvq_capture_read_heads(const kvq_tensor_view *t, int64_t row, int32_t h0, int32_t nh,
                            float *out)
{
    const int64_t d = t->shape[2];
    kvq_capture_read_f32(t, ((size_t)row * (size_t)t->shape[1] + (size_t)h0) * (size_t)d,
                         (size_t)nh * (size_t)d, out);
}
