/*
 * gguf_write.c — the GGUF writer (kvq/gguf.h): metadata and tensors collected in
 * memory, then serialized as GGUF version 3 (header, metadata, tensor table, aligned
 * data) to a buffer or, atomically, to a file. The reader is gguf.c.
 */
#include "kvq/gguf.h"
#include "kvq/quant.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/util.h"
#include "formats/gguf_internal.h"

static uint32_t f64_to_f32_bits(double d)
{
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    if ((bits & ~(UINT64_C(1) << 63)) > (UINT64_C(0x7ff) << 52)) {
        uint32_t man = (uint32_t)(bits >> 29) & 0x7fffffu;
        if (man == 0)
            man = 0x400000u; /* payload only in the dropped bits: keep it a NaN */
        return (uint32_t)(bits >> 63) << 31 | 0x7f800000u | man;
    }
    const float f = (float)d;
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

/* ==========================================================================
 * writer
 * ========================================================================== */

typedef struct writer_kv {
    char *key;
    kvq_gguf_value value; /* deep copy: strings and items malloc'd */
} writer_kv;

typedef struct writer_tensor {
    char *name;
    uint32_t type, ndim;
    int64_t ne[4];
    void *data; /* [nbytes] copy */
    size_t nbytes;
    uint64_t offset;
} writer_tensor;

struct kvq_gguf_writer {
    writer_kv *kv;
    size_t n_kv, cap_kv;
    writer_tensor *t;
    size_t n_t, cap_t;
    uint64_t alignment;
};

kvq_gguf_writer *kvq_gguf_writer_new(void)
{
    kvq_gguf_writer *w = calloc(1, sizeof *w);
    if (w)
        w->alignment = KVQ_GGUF_DEFAULT_ALIGNMENT;
    return w;
}

static void value_free(kvq_gguf_value *v)
{
    if (v->type == KVQ_GGUF_STRING) {
        free((char *)v->v.str.s);
    } else if (v->type == KVQ_GGUF_ARRAY) {
        kvq_gguf_value *items = (kvq_gguf_value *)v->v.arr.items;
        for (uint64_t i = 0; items && i < v->v.arr.n; i++)
            value_free(&items[i]);
        free(items);
    }
    memset(v, 0, sizeof *v);
}

void kvq_gguf_writer_free(kvq_gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        value_free(&w->kv[i].value);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->kv);
    free(w->t);
    free(w);
}

static kvq_status check_name(const char *s, const char *what, kvq_err *err)
{
    if (!s || !*s)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "gguf writer: empty %s", what);
    if (!kvq_utf8_valid(s, strlen(s)))
        return kvq_err_set(err, KVQ_E_BAD_UTF8, "gguf writer: %s is not valid UTF-8", what);
    return KVQ_OK;
}

/* Validates src (types, ranges, nesting) and deep-copies it into dst. */
static kvq_status value_copy(kvq_gguf_value *dst, const kvq_gguf_value *src, int depth,
                             const char *key, kvq_err *err)
{
    memset(dst, 0, sizeof *dst);
    const uint64_t u = src->v.u;
    const int64_t i = src->v.i;
    int ok = 1;
    switch (src->type) {
    case KVQ_GGUF_UINT8: ok = u <= UINT8_MAX; break;
    case KVQ_GGUF_UINT16: ok = u <= UINT16_MAX; break;
    case KVQ_GGUF_UINT32: ok = u <= UINT32_MAX; break;
    case KVQ_GGUF_BOOL: ok = u <= 1; break;
    case KVQ_GGUF_INT8: ok = i >= INT8_MIN && i <= INT8_MAX; break;
    case KVQ_GGUF_INT16: ok = i >= INT16_MIN && i <= INT16_MAX; break;
    case KVQ_GGUF_INT32: ok = i >= INT32_MIN && i <= INT32_MAX; break;
    case KVQ_GGUF_UINT64: case KVQ_GGUF_INT64: case KVQ_GGUF_FLOAT32: case KVQ_GGUF_FLOAT64:
        break;
    case KVQ_GGUF_STRING:
        if (!src->v.str.s && src->v.str.len)
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "gguf writer: '%s': NULL string", key);
        break;
    case KVQ_GGUF_ARRAY:
        if (depth >= KVQ_GGUF_MAX_NESTING)
            return kvq_err_set(err, KVQ_E_INVALID_ARG,
                               "gguf writer: '%s': arrays nested more than %d deep", key,
                               KVQ_GGUF_MAX_NESTING);
        if (!kvq_gguf_type_min_bytes(src->v.arr.type) || (!src->v.arr.items && src->v.arr.n))
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "gguf writer: '%s': bad array", key);
        break;
    default:
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "gguf writer: '%s': bad value type %d", key,
                           (int)src->type);
    }
    if (!ok)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "gguf writer: '%s': value out of range for %s",
                           key, kvq_gguf_type_name(src->type));
    *dst = *src;
    if (src->type == KVQ_GGUF_STRING) {
        const size_t n = (size_t)src->v.str.len;
        char *s = n < SIZE_MAX ? malloc(n + 1) : NULL;
        if (!s) {
            memset(dst, 0, sizeof *dst);
            return kvq_err_set(err, KVQ_E_NOMEM, "gguf writer: out of memory");
        }
        if (n)
            memcpy(s, src->v.str.s, n);
        s[n] = '\0';
        dst->v.str.s = s;
    } else if (src->type == KVQ_GGUF_ARRAY) {
        const uint64_t n = src->v.arr.n;
        size_t bytes = 0;
        kvq_gguf_value *items = NULL;
        dst->v.arr.items = NULL;
        dst->v.arr.n = 0;
        if (n > SIZE_MAX || !kvq_size_mul((size_t)n, sizeof *items, &bytes))
            return kvq_err_set(err, KVQ_E_TOO_LARGE, "gguf writer: '%s': array too large", key);
        if (n && !(items = calloc((size_t)n, sizeof *items)))
            return kvq_err_set(err, KVQ_E_NOMEM, "gguf writer: out of memory");
        dst->v.arr.items = items;
        for (uint64_t k = 0; k < n; k++) {
            const kvq_gguf_value *it = &src->v.arr.items[k];
            kvq_status st = it->type != src->v.arr.type
                                ? kvq_err_set(err, KVQ_E_INVALID_ARG,
                                              "gguf writer: '%s': array item %llu is %s, not %s",
                                              key, (unsigned long long)k,
                                              kvq_gguf_type_name(it->type),
                                              kvq_gguf_type_name(src->v.arr.type))
                                : value_copy(&items[k], it, depth + 1, key, err);
            if (st) {
                value_free(dst);
                return st;
            }
            dst->v.arr.n = k + 1;
        }
    }
    return KVQ_OK;
}

kvq_status kvq_gguf_writer_set(kvq_gguf_writer *w, const char *key, const kvq_gguf_value *v,
                               kvq_err *err)
{
    kvq_status st = check_name(key, "metadata key", err);
    if (st)
        return st;
    if (!w || !v)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "gguf writer: NULL argument");
    uint64_t align = 0;
    if (!strcmp(key, "general.alignment")) {
        if (v->type != KVQ_GGUF_UINT32 || v->v.u == 0 || v->v.u > UINT32_MAX ||
            (v->v.u & (v->v.u - 1)) != 0)
            return kvq_err_set(err, KVQ_E_INVALID_ARG,
                               "gguf writer: general.alignment must be a u32 power of two");
        align = v->v.u;
    }
    kvq_gguf_value copy;
    if ((st = value_copy(&copy, v, 0, key, err)))
        return st;
    for (size_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key)) { /* replace in place: the order stays */
            value_free(&w->kv[i].value);
            w->kv[i].value = copy;
            if (align)
                w->alignment = align;
            return KVQ_OK;
        }
    char *k = strdup(key);
    if (!k || kvq_grow((void **)&w->kv, &w->cap_kv, w->n_kv + 1, sizeof *w->kv)) {
        free(k);
        value_free(&copy);
        return kvq_err_set(err, KVQ_E_NOMEM, "gguf writer: out of memory");
    }
    w->kv[w->n_kv].key = k;
    w->kv[w->n_kv].value = copy;
    w->n_kv++;
    if (align)
        w->alignment = align;
    return KVQ_OK;
}

kvq_status kvq_gguf_writer_add_tensor(kvq_gguf_writer *w, const char *name, uint32_t type,
                                      uint32_t ndim, const int64_t *ne, const void *data,
                                      size_t nbytes, kvq_err *err)
{
    kvq_status st = check_name(name, "tensor name", err);
    if (st)
        return st;
    if (!w || !ne || (!data && nbytes))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "gguf writer: NULL argument");
    const kvq_quant_info *ti = kvq_quant_info_of(type);
    if (!ti)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "gguf writer: '%s': unknown ggml type %u",
                           name, type);
    if (ndim < 1 || ndim > 4)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "gguf writer: '%s': %u dimensions (1..4)",
                           name, ndim);
    writer_tensor t = {.type = type, .ndim = ndim, .ne = {1, 1, 1, 1}, .nbytes = nbytes};
    uint64_t count = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        if (ne[d] < 0 || (ne[d] && count > (uint64_t)INT64_MAX / (uint64_t)ne[d]))
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "gguf writer: '%s': bad shape", name);
        count *= (uint64_t)ne[d];
        t.ne[d] = ne[d];
    }
    if (t.ne[0] % ti->block_elems != 0)
        return kvq_err_set(err, KVQ_E_SHAPE_MISMATCH,
                           "gguf writer: '%s': ne[0] = %lld is not a multiple of the %s block "
                           "size %u",
                           name, (long long)t.ne[0], ti->name, ti->block_elems);
    if (count / ti->block_elems > GGUF_MAX_BYTES / ti->block_bytes ||
        (count / ti->block_elems) * ti->block_bytes != nbytes)
        return kvq_err_set(err, KVQ_E_SHAPE_MISMATCH,
                           "gguf writer: '%s': %zu bytes do not match its shape and type %s",
                           name, nbytes, ti->name);
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "gguf writer: duplicate tensor '%s'",
                               name);
    t.name = strdup(name);
    t.data = malloc(nbytes ? nbytes : 1);
    if (!t.name || !t.data || kvq_grow((void **)&w->t, &w->cap_t, w->n_t + 1, sizeof *w->t)) {
        free(t.name);
        free(t.data);
        return kvq_err_set(err, KVQ_E_NOMEM, "gguf writer: out of memory");
    }
    if (nbytes)
        memcpy(t.data, data, nbytes);
    w->t[w->n_t++] = t;
    return KVQ_OK;
}

/* Output sink: counts bytes (buf and fp NULL), fills a buffer, or writes a FILE. */
typedef struct sink {
    uint8_t *buf;
    FILE *fp;
    uint64_t len;
    int failed;
} sink;

static void put(sink *s, const void *p, size_t n)
{
    if (s->buf)
        memcpy(s->buf + s->len, p, n);
    else if (s->fp && !s->failed && fwrite(p, 1, n, s->fp) != n)
        s->failed = 1;
    s->len += n;
}

static void put_uint(sink *s, uint64_t v, int n)
{
    uint8_t b[8];
    for (int i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    put(s, b, (size_t)n);
}

static void put_zeros(sink *s, uint64_t n)
{
    static const uint8_t zeros[256];
    while (n) {
        const size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        put(s, zeros, k);
        n -= k;
    }
}

static void put_string(sink *s, const char *p, uint64_t n)
{
    put_uint(s, n, 8);
    if (n)
        put(s, p, (size_t)n);
}

static void put_value(sink *s, const kvq_gguf_value *v)
{
    switch (v->type) {
    case KVQ_GGUF_FLOAT32: put_uint(s, f64_to_f32_bits(v->v.f), 4); break;
    case KVQ_GGUF_FLOAT64: {
        uint64_t b;
        memcpy(&b, &v->v.f, sizeof b);
        put_uint(s, b, 8);
        break;
    }
    case KVQ_GGUF_STRING: put_string(s, v->v.str.s, v->v.str.len); break;
    case KVQ_GGUF_ARRAY:
        put_uint(s, (uint32_t)v->v.arr.type, 4);
        put_uint(s, v->v.arr.n, 8);
        for (uint64_t i = 0; i < v->v.arr.n; i++)
            put_value(s, &v->v.arr.items[i]);
        break;
    default: /* integers and bool; signed values are written two's complement */
        put_uint(s, v->v.u, (int)kvq_gguf_type_min_bytes(v->type));
        break;
    }
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

/* The whole file, version 3: header, tensor infos, padding, data (each tensor padded
 * to the alignment, the last one too). Offsets follow insertion order. */
static void serialize(kvq_gguf_writer *w, sink *s)
{
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        w->t[i].offset = off;
        off = align_up(off + w->t[i].nbytes, w->alignment);
    }
    put(s, "GGUF", 4);
    put_uint(s, 3, 4);
    put_uint(s, w->n_t, 8);
    put_uint(s, w->n_kv, 8);
    for (size_t i = 0; i < w->n_kv; i++) {
        put_string(s, w->kv[i].key, strlen(w->kv[i].key));
        put_uint(s, (uint32_t)w->kv[i].value.type, 4);
        put_value(s, &w->kv[i].value);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        const writer_tensor *t = &w->t[i];
        put_string(s, t->name, strlen(t->name));
        put_uint(s, t->ndim, 4);
        for (uint32_t d = 0; d < t->ndim; d++)
            put_uint(s, (uint64_t)t->ne[d], 8);
        put_uint(s, t->type, 4);
        put_uint(s, t->offset, 8);
    }
    if (w->n_t)
        put_zeros(s, align_up(s->len, w->alignment) - s->len);
    for (size_t i = 0; i < w->n_t; i++) {
        const writer_tensor *t = &w->t[i];
        put(s, t->data, t->nbytes);
        put_zeros(s, align_up(t->nbytes, w->alignment) - t->nbytes);
    }
}

kvq_status kvq_gguf_writer_to_buffer(kvq_gguf_writer *w, void **data, size_t *size, kvq_err *err)
{
    *data = NULL;
    *size = 0;
    if (!w)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "gguf writer: NULL writer");
    sink count = {0};
    serialize(w, &count);
    if (count.len > SIZE_MAX)
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "gguf writer: output too large");
    sink s = {.buf = malloc(count.len ? (size_t)count.len : 1)};
    if (!s.buf)
        return kvq_err_set(err, KVQ_E_NOMEM, "gguf writer: out of memory");
    serialize(w, &s);
    *data = s.buf;
    *size = (size_t)s.len;
    return KVQ_OK;
}

kvq_status kvq_gguf_writer_write(kvq_gguf_writer *w, const char *path, int overwrite,
                                 kvq_err *err)
{
    if (!w || !path)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "gguf writer: NULL argument");
    kvq_atomic_file af;
    kvq_status st = kvq_atomic_open(path, overwrite, &af, err);
    if (st)
        return st;
    sink s = {.fp = af.fp};
    serialize(w, &s);
    if (s.failed) {
        const int e = errno;
        kvq_atomic_abort(&af);
        return kvq_err_set(err, KVQ_E_IO, "%s: write failed: %s", path, strerror(e));
    }
    return kvq_atomic_commit(&af, err);
}
