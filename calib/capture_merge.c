/* capture_merge.c — kvq capture --merge: concatenating captures of one model
 * (kvq/capture.h, docs/capture.md). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/capture.h"
#include "kvq/util.h"

#define SLICE ((size_t)64 << 20) /* bytes handed to the writer at once */
#define INT_CHUNK 16384

typedef struct merge_in {
    const char *dir;
    kvq_capture_info *ci;
    int64_t n_q;              /* stored query rows */
    int64_t row0, seq0;       /* offsets of this input in the result */
    kvq_capture_layer file;   /* the open layer file (one layer at a time) */
} merge_in;

/* The tensors of a layer file in file order (docs/capture.md). */
enum { T_K, T_V, T_Q, T_QROWS, T_POS, T_SEQ, T_TOK, T_MSUM, T_MCNT, T_N };
static const char *const tensor_names[T_N] = {
    "k", "v", "q", "q_rows", "pos", "seq", "tokens", "q_moment_sum", "q_moment_count",
};

static const char *dtype_word(kvq_dtype t)
{
    return t == KVQ_DT_F32 ? "f32" : t == KVQ_DT_F16 ? "f16" : t == KVQ_DT_BF16 ? "bf16" : "?";
}

/* KVQ_E_MISMATCH unless b can be appended to a. */
static kvq_status check_same(const merge_in *a, const merge_in *b, kvq_err *err)
{
    kvq_status st = kvq_model_id_compare(&a->ci->model, a->dir, &b->ci->model, b->dir, err);
    if (st)
        return st;
    if (a->ci->dtype != b->ci->dtype)
        return kvq_err_set(err, KVQ_E_MISMATCH, "%s vs %s: dtype differs (%s vs %s)", a->dir,
                           b->dir, dtype_word(a->ci->dtype), dtype_word(b->ci->dtype));
    if (a->ci->seq_len != b->ci->seq_len)
        return kvq_err_set(err, KVQ_E_MISMATCH,
                           "%s vs %s: seq_len differs (%" PRId64 " vs %" PRId64 ")", a->dir,
                           b->dir, a->ci->seq_len, b->ci->seq_len);
    if (a->ci->has_values != b->ci->has_values)
        return kvq_err_set(err, KVQ_E_MISMATCH, "%s vs %s: has_values differs (%s vs %s)",
                           a->dir, b->dir, a->ci->has_values ? "true" : "false",
                           b->ci->has_values ? "true" : "false");
    if (a->ci->n_files != b->ci->n_files)
        return kvq_err_set(err, KVQ_E_MISMATCH, "%s vs %s: layers differ (%d vs %d layers)",
                           a->dir, b->dir, a->ci->n_files, b->ci->n_files);
    for (int32_t i = 0; i < a->ci->n_files; i++)
        if (kvq_capture_info_find_layer(b->ci, a->ci->layers[i]) < 0)
            return kvq_err_set(err, KVQ_E_MISMATCH, "%s vs %s: layers differ (layer %d only in %s)",
                               a->dir, b->dir, a->ci->layers[i], a->dir);
    return KVQ_OK;
}

static kvq_status put_bytes(kvq_st_writer *w, const kvq_tensor_view *t, kvq_err *err)
{
    const uint8_t *p = t->data;
    for (size_t off = 0; off < t->nbytes; off += SLICE) {
        size_t n = t->nbytes - off < SLICE ? t->nbytes - off : SLICE;
        kvq_status st = kvq_st_writer_write(w, p + off, n, err);
        if (st)
            return st;
    }
    return KVQ_OK;
}

/* Writes the int32 column t of in's layer file with `add` added to each value, read and
 * checked by the capture layer reader in pieces of INT_CHUNK. */
static kvq_status put_ints(kvq_st_writer *w, const kvq_capture_layer *in,
                           const kvq_tensor_view *t, int64_t add, int32_t *buf, kvq_err *err)
{
    int64_t n = t->shape[0];
    for (int64_t i0 = 0; i0 < n; i0 += INT_CHUNK) {
        int64_t m = n - i0 < INT_CHUNK ? n - i0 : INT_CHUNK;
        kvq_status st = kvq_capture_layer_ints(in, t, i0, m, buf, err);
        if (st)
            return st;
        for (int64_t j = 0; j < m; j++)
            buf[j] = (int32_t)(buf[j] + add);
        st = kvq_st_writer_write(w, buf, (size_t)m * 4, err);
        if (st)
            return st;
    }
    return KVQ_OK;
}

/* Opens every input's file for `layer` and checks its tensors: tv[i][T_*]. */
static kvq_status open_inputs(merge_in *in, size_t n_in, int32_t layer,
                              const kvq_tensor_view *(*tv)[T_N], kvq_err *err)
{
    kvq_status st = KVQ_OK;
    for (size_t i = 0; i < n_in; i++) {
        const kvq_capture_info *ci = in[i].ci;
        if ((st = kvq_capture_layer_open(ci, kvq_capture_info_find_layer(ci, layer),
                                         &in[i].file, err)))
            return st;
        for (int t = 0; t < T_N; t++) {
            if (t == T_V && !ci->has_values)
                continue;
            if ((st = kvq_capture_layer_tensor(&in[i].file, tensor_names[t], &tv[i][t], err)))
                return st;
        }
    }
    return KVQ_OK;
}

/* Declares the merged file's tensors and metadata and opens it at path. */
static kvq_status declare_output(kvq_st_writer *w, const kvq_capture_info *out, int32_t layer,
                                 int64_t n_q, const char *path, kvq_err *err)
{
    kvq_status st;
    const kvq_model_id *m = &out->model;
    const int64_t H = m->n_heads, KH = m->n_kv_heads, d = m->head_dim;
    const int64_t nt = out->n_tokens;
    const int64_t ks[3] = {nt, KH, d}, qs[3] = {n_q, H, d}, ms[3] = {H, d, d};
    char layer_str[16];
    snprintf(layer_str, sizeof layer_str, "%d", layer);
    if ((st = kvq_st_writer_declare(w, "k", out->dtype, 3, ks, err)) ||
        (out->has_values && (st = kvq_st_writer_declare(w, "v", out->dtype, 3, ks, err))) ||
        (st = kvq_st_writer_declare(w, "q", out->dtype, 3, qs, err)) ||
        (st = kvq_st_writer_declare(w, "q_rows", KVQ_DT_I32, 1, &n_q, err)) ||
        (st = kvq_st_writer_declare(w, "pos", KVQ_DT_I32, 1, &nt, err)) ||
        (st = kvq_st_writer_declare(w, "seq", KVQ_DT_I32, 1, &nt, err)) ||
        (st = kvq_st_writer_declare(w, "tokens", KVQ_DT_I32, 1, &nt, err)) ||
        (st = kvq_st_writer_declare(w, "q_moment_sum", KVQ_DT_F64, 3, ms, err)) ||
        (st = kvq_st_writer_declare(w, "q_moment_count", KVQ_DT_F64, 1, &H, err)) ||
        (st = kvq_st_writer_set_meta(w, "format", KVQ_CAPTURE_FORMAT, err)) ||
        (st = kvq_st_writer_set_meta(w, "version", "1", err)) ||
        (st = kvq_st_writer_set_meta(w, "layer", layer_str, err)) ||
        (st = kvq_model_id_set_meta(m, "model.", w, err)) ||
        (st = kvq_st_writer_begin_file(w, path, 0, err)))
        return st;
    return KVQ_OK;
}

/* Writes the rows: tensors in declaration order, inputs in order within each. */
static kvq_status write_rows(kvq_st_writer *w, const merge_in *in, size_t n_in,
                             const kvq_capture_info *out, const kvq_tensor_view *(*tv)[T_N],
                             kvq_err *err)
{
    kvq_status st = KVQ_OK;
    int32_t *buf = malloc(INT_CHUNK * sizeof(int32_t));
    if (!buf)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", in[0].file.path);
    for (size_t i = 0; i < n_in && !st; i++)
        st = put_bytes(w, tv[i][T_K], err);
    for (size_t i = 0; i < n_in && !st && out->has_values; i++)
        st = put_bytes(w, tv[i][T_V], err);
    for (size_t i = 0; i < n_in && !st; i++)
        st = put_bytes(w, tv[i][T_Q], err);
    for (size_t i = 0; i < n_in && !st; i++)
        st = put_ints(w, &in[i].file, tv[i][T_QROWS], in[i].row0, buf, err);
    for (size_t i = 0; i < n_in && !st; i++)
        st = put_ints(w, &in[i].file, tv[i][T_POS], 0, buf, err);
    for (size_t i = 0; i < n_in && !st; i++)
        st = put_ints(w, &in[i].file, tv[i][T_SEQ], in[i].seq0, buf, err);
    for (size_t i = 0; i < n_in && !st; i++)
        st = put_ints(w, &in[i].file, tv[i][T_TOK], 0, buf, err);
    free(buf);
    return st;
}

/* Moments: raw sums and counts add, left to right. */
static kvq_status write_moments(kvq_st_writer *w, size_t n_in, const kvq_model_id *m,
                                const kvq_tensor_view *(*tv)[T_N], const char *path,
                                kvq_err *err)
{
    kvq_status st = KVQ_OK;
    const int64_t H = m->n_heads, d = m->head_dim;
    const size_t nmom = (size_t)(H * d * d);
    double *msum = calloc(nmom + (size_t)H, sizeof(double)), *mcnt = msum + nmom;
    double *tmp = malloc((nmom + (size_t)H) * sizeof(double));
    if (!msum || !tmp) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (size_t i = 0; i < n_in; i++) {
        memcpy(tmp, tv[i][T_MSUM]->data, nmom * sizeof(double));
        memcpy(tmp + nmom, tv[i][T_MCNT]->data, (size_t)H * sizeof(double));
        if (i == 0)
            memcpy(msum, tmp, (nmom + (size_t)H) * sizeof(double));
        else
            for (size_t j = 0; j < nmom + (size_t)H; j++)
                msum[j] += tmp[j];
    }
    if ((st = kvq_st_writer_write(w, msum, nmom * sizeof(double), err)) ||
        (st = kvq_st_writer_write(w, mcnt, (size_t)H * sizeof(double), err)))
        goto done;
done:
    free(msum);
    free(tmp);
    return st;
}

/* Merges layer `layer` of every input into path. */
static kvq_status merge_layer(merge_in *in, size_t n_in, const kvq_capture_info *out,
                              int32_t layer, int64_t n_q, const char *path, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    kvq_st_writer *w = kvq_st_writer_new();
    const kvq_tensor_view *(*tv)[T_N] = calloc(n_in, sizeof *tv);
    if (!w || !tv) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    if ((st = open_inputs(in, n_in, layer, tv, err)) ||
        (st = declare_output(w, out, layer, n_q, path, err)) ||
        (st = write_rows(w, in, n_in, out, tv, err)) ||
        (st = write_moments(w, n_in, &out->model, tv, path, err)))
        goto done;
    st = kvq_st_writer_finish(w, err);
done:
    for (size_t i = 0; i < n_in; i++)
        kvq_capture_layer_close(&in[i].file);
    kvq_st_writer_free(w);
    free(tv);
    return st;
}

/* Reads and compares the inputs' descriptions; sets each one's offsets in the result
 * and the totals in *out (n_tokens, n_sequences, n_documents, corpus_hash, n_queries:
 * the stored query rows, 0 for "all"). *nq: the stored query rows in all. */
static kvq_status read_inputs(merge_in *in, const char *const *inputs, size_t n_in,
                              const char *dir, kvq_capture_info *out, int64_t *nq_out,
                              kvq_err *err)
{
    kvq_status st = KVQ_OK;
    int64_t nt = 0, ns = 0, nq = 0, ndocs = 0;
    int all_rows = 1;
    uint64_t hash = KVQ_FNV1A64_INIT;
    for (size_t i = 0; i < n_in; i++) {
        in[i].dir = inputs[i];
        if ((st = kvq_capture_info_read(inputs[i], &in[i].ci, err)))
            return st;
        const kvq_capture_info *ci = in[i].ci;
        if (i > 0 && (st = check_same(&in[0], &in[i], err)))
            return st;
        if (ci->n_sequences < 1)
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s/%s: no sequences listed", inputs[i],
                               KVQ_CAPTURE_JSON);
        in[i].n_q = ci->n_queries > 0 ? ci->n_queries : ci->n_tokens;
        all_rows &= ci->n_queries == 0;
        in[i].row0 = nt;
        in[i].seq0 = ns;
        nt += ci->n_tokens;
        ns += ci->n_sequences;
        nq += in[i].n_q;
        ndocs += ci->n_documents;
        if (nt > INT32_MAX)
            return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: more than 2^31 - 1 rows in all",
                               dir);
        hash = kvq_fnv1a64(ci->corpus_hash, strlen(ci->corpus_hash) + 1, hash);
        if (!out->tokenizer_approx[0])
            snprintf(out->tokenizer_approx, sizeof out->tokenizer_approx, "%s",
                     ci->tokenizer_approx);
    }
    out->n_documents = ndocs;
    snprintf(out->corpus_hash, sizeof out->corpus_hash, "%016" PRIx64, hash);
    out->n_tokens = nt;
    out->n_sequences = ns;
    out->n_queries = all_rows ? 0 : nq;
    *nq_out = nq;
    return KVQ_OK;
}

/* The rest of the merged description: model, provenance, storage, layers, sequences. */
static kvq_status describe_merged(const merge_in *in, size_t n_in, const char *dir,
                                  kvq_capture_info *out, kvq_err *err)
{
    const kvq_capture_info *c0 = in[0].ci;
    out->model = c0->model;
    out->corpus_seed = c0->corpus_seed;
    size_t cap = sizeof out->corpus_spec, len = 0;
    for (size_t i = 0; i < n_in; i++) {
        int k = snprintf(out->corpus_spec + len, cap - len, "%s%s", i ? " + " : "",
                         in[i].ci->corpus_spec);
        if (k < 0 || (size_t)k >= cap - len) {
            memcpy(out->corpus_spec + cap - 4, "...", 4); /* keep it readable: truncate */
            break;
        }
        len += (size_t)k;
    }
    out->dtype = c0->dtype;
    out->seq_len = c0->seq_len;
    out->has_values = c0->has_values;
    out->n_files = c0->n_files;
    out->layers = c0->layers;
    out->sequences = malloc((size_t)out->n_sequences * 2 * sizeof(int64_t));
    out->files = calloc((size_t)c0->n_files, sizeof(char *));
    if (!out->sequences || !out->files)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
    for (size_t i = 0; i < n_in; i++)
        for (int64_t s = 0; s < in[i].ci->n_sequences; s++) {
            out->sequences[2 * (in[i].seq0 + s)] = in[i].ci->sequences[2 * s] + in[i].row0;
            out->sequences[2 * (in[i].seq0 + s) + 1] = in[i].ci->sequences[2 * s + 1];
        }
    return KVQ_OK;
}

/* Merges every layer into files of the directory tmp. */
static kvq_status merge_layers(merge_in *in, size_t n_in, const char *tmp, const char *dir,
                               kvq_capture_info *out, int64_t nq, const kvq_callbacks *cb,
                               kvq_err *err)
{
    kvq_status st = KVQ_OK;
    for (int32_t f = 0; f < out->n_files; f++) {
        char name[64];
        snprintf(name, sizeof name, "layer_%03d.safetensors", out->layers[f]);
        char *path = kvq_path_join(tmp, name);
        if (!path || !(out->files[f] = strdup(name))) {
            free(path);
            return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
        }
        st = merge_layer(in, n_in, out, out->layers[f], nq, path, err);
        free(path);
        if (st)
            return st;
        if (kvq_progress(cb, "capture: merge", (uint64_t)f + 1, (uint64_t)out->n_files))
            return kvq_err_set(err, KVQ_E_CANCELLED, "%s: cancelled", dir);
    }
    return KVQ_OK;
}

kvq_status kvq_capture_merge(const char *const *inputs, size_t n_in, const char *dir,
                             int overwrite, const kvq_callbacks *cb, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    merge_in *in = NULL;
    char *tmp = NULL, *json = NULL;
    kvq_capture_info out;
    memset(&out, 0, sizeof out);
    if (!inputs || n_in < 1 || !dir)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "capture merge: no inputs or no output");
    if (!(in = calloc(n_in, sizeof *in)))
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);

    /* Read and compare the descriptions, then describe the result. */
    int64_t nq = 0;
    if ((st = read_inputs(in, inputs, n_in, dir, &out, &nq, err)) ||
        (st = describe_merged(in, n_in, dir, &out, err)))
        goto done;

    if ((overwrite && (st = kvq_capture_dir_check_own(dir, err))) ||
        (st = kvq_tmpdir_create(dir, overwrite, kvq_capture_dir_is_capture,
                                "a kvq capture directory", &tmp, err)))
        goto done;
    kvq_log(cb, KVQ_LOG_INFO,
            "capture merge: %zu captures, %" PRId64 " tokens in %" PRId64 " sequences, %d layers",
            n_in, out.n_tokens, out.n_sequences, out.n_files);
    if ((st = merge_layers(in, n_in, tmp, dir, &out, nq, cb, err)))
        goto done;
    if (!(json = kvq_path_join(tmp, KVQ_CAPTURE_JSON))) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    if ((st = kvq_capture_info_write(&out, NULL, json, 0, err)) ||
        (st = kvq_tmpdir_commit(tmp, dir, overwrite, kvq_capture_dir_is_capture,
                                   "a kvq capture directory", err)))
        goto done;
    free(tmp);
    tmp = NULL;
done:
    if (tmp)
        kvq_rmtree(tmp);
    free(tmp);
    free(json);
    for (int32_t f = 0; out.files && f < out.n_files; f++)
        free(out.files[f]);
    free(out.files);
    free(out.sequences);
    for (size_t i = 0; i < n_in; i++)
        kvq_capture_info_free(in[i].ci);
    free(in);
    return st;
}
