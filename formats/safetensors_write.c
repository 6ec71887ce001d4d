/* safetensors_write.c — the streaming safetensors writer (declare, set metadata, write
 * the tensors in order, finish atomically); the reader is safetensors.c. */
#include "kvq/safetensors.h"

#include <inttypes.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/util.h"
#include "formats/safetensors_internal.h"

/* ==========================================================================
 * writer
 * ========================================================================== */

typedef struct st_decl {
    char *name;
    kvq_dtype dtype;
    int ndim;
    int64_t shape[KVQ_MAX_DIMS];
    uint64_t begin, end; /* offsets within the data section */
} st_decl;

typedef struct st_meta {
    char *key, *value;
} st_meta;

enum { W_DECLARING, W_WRITING, W_FINISHED };

struct kvq_st_writer {
    st_decl *decls;            /* [n_decls], declaration order == layout order */
    size_t n_decls, cap_decls;
    size_t *slots;             /* [n_slots] name hash set: decl index + 1, 0 = empty */
    size_t n_slots;
    st_meta *meta;             /* [n_meta], sorted at begin */
    size_t n_meta, cap_meta;
    uint64_t data_size;        /* sum of the declared tensor sizes */

    int state;
    kvq_status failed;         /* sticky I/O failure */
    char *label;               /* path, or "safetensors buffer" */
    int to_file;
    kvq_atomic_file af;        /* file mode */
    uint8_t *out;              /* buffer mode: [out_size] the whole serialized file */
    size_t out_size;
    size_t header_total;       /* 8 + N */
    uint64_t written;          /* data bytes written so far */
    size_t cur;                /* first tensor not completely written */
    int checksum;              /* record KVQ_ST_META_DATA_XXH64 (kvq_st_writer_checksum) */
    kvq_xxh64_state xs;        /* of the data written so far */
    size_t sum_off;            /* byte offset of the 16 hex digits in the header */
};

kvq_st_writer *kvq_st_writer_new(void) { return calloc(1, sizeof(kvq_st_writer)); }

void kvq_st_writer_free(kvq_st_writer *w)
{
    if (!w)
        return;
    kvq_atomic_abort(&w->af); /* removes the temporary unless finish committed it */
    for (size_t i = 0; i < w->n_decls; i++)
        free(w->decls[i].name);
    for (size_t i = 0; i < w->n_meta; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->decls);
    free(w->slots);
    free(w->meta);
    free(w->label);
    free(w->out);
    free(w);
}

static size_t name_hash(const char *s)
{
    return (size_t)kvq_fnv1a64(s, strlen(s), KVQ_FNV1A64_INIT);
}

/* Slot of `name` in the hash set: where it is, or the empty slot where it would go. */
static size_t name_slot(const kvq_st_writer *w, const char *name)
{
    size_t mask = w->n_slots - 1, i = name_hash(name) & mask;
    while (w->slots[i] && strcmp(w->decls[w->slots[i] - 1].name, name) != 0)
        i = (i + 1) & mask;
    return i;
}

/* Keeps the load factor of the name set at most 1/2. Returns 0 on out of memory. */
static int names_reserve(kvq_st_writer *w, size_t n)
{
    if (2 * n <= w->n_slots)
        return 1;
    size_t cap = w->n_slots ? 2 * w->n_slots : 16;
    while (2 * n > cap)
        cap *= 2;
    size_t *old = w->slots, old_n = w->n_slots;
    w->slots = calloc(cap, sizeof *w->slots);
    if (!w->slots) {
        w->slots = old;
        return 0;
    }
    w->n_slots = cap;
    for (size_t i = 0; i < old_n; i++)
        if (old[i])
            w->slots[name_slot(w, w->decls[old[i] - 1].name)] = old[i];
    free(old);
    return 1;
}

kvq_status kvq_st_writer_declare(kvq_st_writer *w, const char *name, kvq_dtype dtype, int ndim,
                                 const int64_t *shape, kvq_err *err)
{
    if (!w || !name || (ndim > 0 && !shape))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "safetensors writer: NULL argument");
    if (w->state != W_DECLARING)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "safetensors writer: tensor '%.100s' declared after begin", name);
    if (!kvq_utf8_valid(name, strlen(name)))
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "safetensors writer: tensor name is not valid UTF-8");
    if (strcmp(name, "__metadata__") == 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "safetensors writer: '__metadata__' is reserved");
    if (!dtype_ok(dtype))
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "safetensors writer: tensor '%.100s': bad dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > KVQ_MAX_DIMS)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "safetensors writer: tensor '%.100s': ndim %d not in [0, %d]", name,
                           ndim, KVQ_MAX_DIMS);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return kvq_err_set(err, KVQ_E_INVALID_ARG,
                               "safetensors writer: tensor '%.100s': negative dim %lld", name,
                               (long long)shape[i]);
        if ((uint64_t)shape[i] >= ST_JSON_INT_LIMIT)
            return kvq_err_set(err, KVQ_E_TOO_LARGE,
                               "safetensors writer: tensor '%.100s': dim %lld is not below 2^53",
                               name, (long long)shape[i]);
    }
    size_t nbytes;
    uint64_t end;
    if (!tensor_nbytes(dtype, ndim, shape, &nbytes) ||
        __builtin_add_overflow(w->data_size, (uint64_t)nbytes, &end) || end >= ST_JSON_INT_LIMIT)
        return kvq_err_set(err, KVQ_E_TOO_LARGE,
                           "safetensors writer: tensor '%.100s': data section would exceed 2^53 "
                           "bytes",
                           name);
    if (!names_reserve(w, w->n_decls + 1))
        return kvq_err_set(err, KVQ_E_NOMEM, "safetensors writer: out of memory");
    size_t slot = name_slot(w, name);
    if (w->slots[slot])
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "safetensors writer: tensor '%.100s' declared twice", name);
    if (kvq_grow((void **)&w->decls, &w->cap_decls, w->n_decls + 1, sizeof *w->decls))
        return kvq_err_set(err, KVQ_E_NOMEM, "safetensors writer: out of memory");
    st_decl *d = &w->decls[w->n_decls];
    memset(d, 0, sizeof *d);
    if (!(d->name = strdup(name)))
        return kvq_err_set(err, KVQ_E_NOMEM, "safetensors writer: out of memory");
    d->dtype = dtype;
    d->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        d->shape[i] = shape[i];
    d->begin = w->data_size;
    d->end = end;
    w->data_size = end;
    w->slots[slot] = ++w->n_decls;
    return KVQ_OK;
}

#define SUM_PLACEHOLDER "xxh64:0000000000000000"

kvq_status kvq_st_writer_checksum(kvq_st_writer *w, kvq_err *err)
{
    kvq_status s = kvq_st_writer_set_meta(w, KVQ_ST_META_DATA_XXH64, SUM_PLACEHOLDER, err);
    if (!s)
        w->checksum = 1;
    return s;
}

/* The offset of the checksum's hex digits in the serialized header hdr[0..n). */
static size_t sum_offset(const char *hdr, size_t n)
{
    static const char key[] = "\"" KVQ_ST_META_DATA_XXH64 "\":\"" SUM_PLACEHOLDER "\"";
    const size_t nk = sizeof key - 1;
    for (size_t i = 0; i + nk <= n; i++)
        if (!memcmp(hdr + i, key, nk))
            return i + nk - 1 - 16;
    return 0;
}

kvq_status kvq_st_writer_set_meta(kvq_st_writer *w, const char *key, const char *value,
                                  kvq_err *err)
{
    if (!w || !key || !value)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "safetensors writer: NULL argument");
    if (w->state != W_DECLARING)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "safetensors writer: metadata '%.100s' set after begin", key);
    if (!kvq_utf8_valid(key, strlen(key)) || !kvq_utf8_valid(value, strlen(value)))
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "safetensors writer: metadata is not valid UTF-8");
    if (kvq_grow((void **)&w->meta, &w->cap_meta, w->n_meta + 1, sizeof *w->meta))
        return kvq_err_set(err, KVQ_E_NOMEM, "safetensors writer: out of memory");
    char *v = strdup(value);
    if (!v)
        return kvq_err_set(err, KVQ_E_NOMEM, "safetensors writer: out of memory");
    for (size_t i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta[i].key, key) == 0) { /* set again: the last value wins */
            free(w->meta[i].value);
            w->meta[i].value = v;
            return KVQ_OK;
        }
    char *k = strdup(key);
    if (!k) {
        free(v);
        return kvq_err_set(err, KVQ_E_NOMEM, "safetensors writer: out of memory");
    }
    w->meta[w->n_meta].key = k;
    w->meta[w->n_meta].value = v;
    w->n_meta++;
    return KVQ_OK;
}

/* ---- header serialization ---------------------------------------------------- */

static int cmp_meta(const void *a, const void *b)
{
    return strcmp(((const st_meta *)a)->key, ((const st_meta *)b)->key);
}

/* The 8-byte length and the JSON header, padded with spaces to a multiple of 8.
 * *out is malloc'd. */
static kvq_status build_header(kvq_st_writer *w, const char *label, char **out, size_t *size,
                               kvq_err *err)
{
    kvq_strbuf b = {0};
    if (w->n_meta)
        qsort(w->meta, w->n_meta, sizeof *w->meta, cmp_meta);
    kvq_sb_put(&b, "\0\0\0\0\0\0\0\0", 8);
    kvq_sb_puts(&b, "{");
    if (w->n_meta) {
        kvq_sb_puts(&b, "\"__metadata__\":{");
        for (size_t i = 0; i < w->n_meta; i++) {
            if (i)
                kvq_sb_puts(&b, ",");
            kvq_sb_json_str(&b, w->meta[i].key);
            kvq_sb_puts(&b, ":");
            kvq_sb_json_str(&b, w->meta[i].value);
        }
        kvq_sb_puts(&b, "}");
    }
    for (size_t i = 0; i < w->n_decls; i++) {
        const st_decl *d = &w->decls[i];
        if (i || w->n_meta)
            kvq_sb_puts(&b, ",");
        kvq_sb_json_str(&b, d->name);
        kvq_sb_puts(&b, ":{\"dtype\":\"");
        kvq_sb_puts(&b, kvq_dtype_name(d->dtype));
        kvq_sb_puts(&b, "\",\"shape\":[");
        for (int k = 0; k < d->ndim; k++) {
            if (k)
                kvq_sb_puts(&b, ",");
            kvq_sb_printf(&b, "%" PRIu64, (uint64_t)d->shape[k]);
        }
        kvq_sb_puts(&b, "],\"data_offsets\":[");
        kvq_sb_printf(&b, "%" PRIu64, d->begin);
        kvq_sb_puts(&b, ",");
        kvq_sb_printf(&b, "%" PRIu64, d->end);
        kvq_sb_puts(&b, "]}");
    }
    kvq_sb_puts(&b, "}");
    while (!b.oom && (b.len - 8) % 8)
        kvq_sb_puts(&b, " ");
    if (b.oom) {
        kvq_sb_free(&b);
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
    }
    uint64_t n = b.len - 8;
    if (n > KVQ_ST_MAX_HEADER) {
        kvq_sb_free(&b);
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: header of %llu bytes exceeds the %u limit",
                           label, (unsigned long long)n, (unsigned)KVQ_ST_MAX_HEADER);
    }
    for (int i = 0; i < 8; i++)
        b.s[i] = (char)(n >> (8 * i));
    *out = b.s;
    *size = b.len;
    return KVQ_OK;
}

/* Skips the tensors already complete (zero-size ones included). */
static void advance_cur(kvq_st_writer *w)
{
    while (w->cur < w->n_decls && w->decls[w->cur].end <= w->written)
        w->cur++;
}

static kvq_status writer_begin(kvq_st_writer *w, const char *path, int overwrite, kvq_err *err)
{
    kvq_status s = KVQ_OK;
    char *hdr = NULL;
    size_t hsize = 0;
    if (!w)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "safetensors writer: NULL writer");
    const char *label = path ? path : "safetensors buffer";
    if (w->state != W_DECLARING)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: writer already begun", label);
    if (!(w->label = strdup(label))) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    if ((s = build_header(w, label, &hdr, &hsize, err)))
        goto done;
    w->header_total = hsize;
    if (w->checksum) {
        kvq_xxh64_init(&w->xs, 0);
        if (!(w->sum_off = sum_offset((const char *)hdr, hsize))) {
            s = kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: checksum placeholder not found", label);
            goto done;
        }
    }
    if (path) {
        if ((s = kvq_atomic_open(path, overwrite, &w->af, err)))
            goto done;
        w->to_file = 1;
        if (fwrite(hdr, 1, hsize, w->af.fp) != hsize) {
            const int e = errno;
            kvq_atomic_abort(&w->af);
            s = kvq_err_set(err, KVQ_E_IO, "%s: write failed (the header, %zu bytes): %s", path,
                            hsize, strerror(e));
            goto done;
        }
    } else {
        size_t total;
        if (!kvq_size_add(hsize, (size_t)w->data_size, &total)) {
            s = kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: too large for memory", label);
            goto done;
        }
        if (!(w->out = malloc(total))) {
            s = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory (%zu bytes)", label, total);
            goto done;
        }
        memcpy(w->out, hdr, hsize);
        w->out_size = total;
    }
    w->state = W_WRITING;
    advance_cur(w);
done:
    if (s) {
        free(w->label);
        w->label = NULL;
    }
    free(hdr);
    return s;
}

kvq_status kvq_st_writer_begin_file(kvq_st_writer *w, const char *path, int overwrite,
                                    kvq_err *err)
{
    if (!path)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "safetensors writer: NULL path");
    return writer_begin(w, path, overwrite, err);
}

kvq_status kvq_st_writer_begin_buffer(kvq_st_writer *w, kvq_err *err)
{
    return writer_begin(w, NULL, 0, err);
}

kvq_status kvq_st_writer_write(kvq_st_writer *w, const void *data, size_t nbytes, kvq_err *err)
{
    if (!w || (!data && nbytes))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "safetensors writer: NULL argument");
    if (w->state != W_WRITING)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "safetensors writer: write %s",
                           w->state == W_DECLARING ? "before begin" : "after finish");
    if (w->failed)
        return kvq_err_set(err, w->failed, "%s: an earlier write failed", w->label);
    uint64_t left = w->data_size - w->written;
    if ((uint64_t)nbytes > left)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "%s: write of %zu bytes but only %llu of the declared %llu data bytes "
                           "remain",
                           w->label, nbytes, (unsigned long long)left,
                           (unsigned long long)w->data_size);
    if (nbytes == 0)
        return KVQ_OK;
    if (w->checksum)
        kvq_xxh64_update(&w->xs, data, nbytes);
    if (w->to_file) {
        if (fwrite(data, 1, nbytes, w->af.fp) != nbytes) {
            w->failed = KVQ_E_IO;
            return kvq_err_set(err, KVQ_E_IO, "%s: write failed (%zu bytes at data byte %llu of "
                               "%llu): %s", w->label, nbytes, (unsigned long long)w->written,
                               (unsigned long long)w->data_size, strerror(errno));
        }
    } else {
        memcpy(w->out + w->header_total + (size_t)w->written, data, nbytes);
    }
    w->written += nbytes;
    advance_cur(w);
    return KVQ_OK;
}

kvq_status kvq_st_writer_finish(kvq_st_writer *w, kvq_err *err)
{
    if (!w)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "safetensors writer: NULL writer");
    if (w->state != W_WRITING)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "safetensors writer: finish %s",
                           w->state == W_DECLARING ? "before begin" : "called twice");
    if (w->failed)
        return kvq_err_set(err, w->failed, "%s: an earlier write failed", w->label);
    if (w->written < w->data_size) {
        const st_decl *d = &w->decls[w->cur];
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "%s: finish with tensor '%.100s' incomplete: %llu of %llu bytes "
                           "written",
                           w->label, d->name, (unsigned long long)(w->written - d->begin),
                           (unsigned long long)(d->end - d->begin));
    }
    if (w->checksum) { /* the digest into the header's placeholder */
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, kvq_xxh64_digest(&w->xs));
        if (!w->to_file) {
            memcpy(w->out + w->sum_off, hex, 16);
        } else if (fflush(w->af.fp) != 0 || fseeko(w->af.fp, (off_t)w->sum_off, SEEK_SET) != 0 ||
                   fwrite(hex, 1, 16, w->af.fp) != 16) {
            w->failed = KVQ_E_IO;
            return kvq_err_set(err, KVQ_E_IO, "%s: write failed (the checksum, 16 bytes at "
                               "byte %zu): %s", w->label, w->sum_off, strerror(errno));
        }
    }
    if (w->to_file) {
        kvq_status s = kvq_atomic_commit(&w->af, err);
        if (s) {
            w->failed = s;
            return s;
        }
    }
    w->state = W_FINISHED;
    return KVQ_OK;
}

const void *kvq_st_writer_buffer(const kvq_st_writer *w, size_t *size)
{
    if (!w || w->state != W_FINISHED || w->to_file) {
        if (size)
            *size = 0;
        return NULL;
    }
    if (size)
        *size = w->out_size;
    return w->out;
}
