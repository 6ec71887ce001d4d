/* safetensors.c — safetensors reader (mmap, zero-copy views); the streaming writer is
 * safetensors_write.c.
 *
 * The validation order and the status of each kind of problem are the contract in
 * kvq/safetensors.h; this file follows that list top to bottom. */
#include "kvq/safetensors.h"

#include <assert.h>
#include <inttypes.h>
#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/util.h"
#include "formats/safetensors_internal.h"


/* ==========================================================================
 * dtypes
 * ========================================================================== */

static const struct {
    const char *name;
    size_t size;
} dtype_info[KVQ_DT_COUNT] = {
    [KVQ_DT_BOOL] = {"BOOL", 1},       [KVQ_DT_U8] = {"U8", 1},
    [KVQ_DT_I8] = {"I8", 1},           [KVQ_DT_F8_E4M3] = {"F8_E4M3", 1},
    [KVQ_DT_F8_E5M2] = {"F8_E5M2", 1}, [KVQ_DT_I16] = {"I16", 2},
    [KVQ_DT_U16] = {"U16", 2},         [KVQ_DT_F16] = {"F16", 2},
    [KVQ_DT_BF16] = {"BF16", 2},       [KVQ_DT_I32] = {"I32", 4},
    [KVQ_DT_U32] = {"U32", 4},         [KVQ_DT_F32] = {"F32", 4},
    [KVQ_DT_I64] = {"I64", 8},         [KVQ_DT_U64] = {"U64", 8},
    [KVQ_DT_F64] = {"F64", 8},
};


size_t kvq_dtype_size(kvq_dtype t) { return dtype_ok(t) ? dtype_info[t].size : 0; }

const char *kvq_dtype_name(kvq_dtype t) { return dtype_ok(t) ? dtype_info[t].name : "?"; }

int kvq_dtype_from_name(const char *name, kvq_dtype *t)
{
    if (!name)
        return -1;
    for (int i = 0; i < KVQ_DT_COUNT; i++)
        if (strcmp(name, dtype_info[i].name) == 0) {
            *t = (kvq_dtype)i;
            return 0;
        }
    return -1;
}

/* "[2,3]" into buf, for messages. */
static const char *shape_str(int ndim, const int64_t *shape, char *buf, size_t cap)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
    return buf;
}

/* ==========================================================================
 * reader
 * ========================================================================== */

struct kvq_st {
    kvq_map map;              /* the file mapping; zeroed for open_memory */
    size_t header_size;       /* 8 + N */
    size_t data_size;         /* D */
    kvq_tensor_view *tensors; /* [count], in data-offset order */
    size_t count;
    const kvq_tensor_view **by_name; /* [count], sorted by name, for find */
    const char **meta;        /* [2 * n_meta]: key, value, ... sorted by key */
    size_t n_meta;
    char *strings;            /* one block holding every name, key and value */
};

static uint64_t read_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int is_hex(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Scans a JSON number at s[i..n) by the strict grammar
 * -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? and returns the index after it,
 * or 0 if it is malformed (including when a number character follows, as in "01"). */
static size_t scan_number(const unsigned char *s, size_t n, size_t i)
{
    if (i < n && s[i] == '-')
        i++;
    if (i >= n || !is_digit(s[i]))
        return 0;
    if (s[i] == '0')
        i++;
    else
        while (i < n && is_digit(s[i]))
            i++;
    if (i < n && s[i] == '.') {
        if (++i >= n || !is_digit(s[i]))
            return 0;
        while (i < n && is_digit(s[i]))
            i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        if (++i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= n || !is_digit(s[i]))
            return 0;
        while (i < n && is_digit(s[i]))
            i++;
    }
    if (i < n && (is_digit(s[i]) || s[i] == '.' || s[i] == '+' || s[i] == '-' || s[i] == 'e' ||
                  s[i] == 'E'))
        return 0;
    return i;
}

/* Lexical pass before cJSON, which is lenient where JSON (and the reference reader)
 * is not: it treats every byte <= 0x20 as whitespace, keeps raw control characters
 * in strings, turns a bad \u escape into U+0000, skips a BOM and reads "+1" or "01"
 * as numbers. Structure (brackets, commas, literals) is left to cJSON. */
static kvq_status header_lex_check(const unsigned char *s, size_t n, const char *label,
                                   kvq_err *err)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c == '"') {
            size_t start = i++;
            for (;;) {
                if (i >= n)
                    return kvq_err_set(err, KVQ_E_BAD_JSON,
                                       "%s: header: string at byte %zu is not terminated", label,
                                       start);
                c = s[i];
                if (c == '"') {
                    i++;
                    break;
                }
                if (c < 0x20)
                    return kvq_err_set(err, KVQ_E_BAD_JSON,
                                       "%s: header: raw control character 0x%02x in a string "
                                       "at byte %zu",
                                       label, c, i);
                if (c != '\\') {
                    i++;
                    continue;
                }
                unsigned char e = i + 1 < n ? s[i + 1] : 0;
                if (e == 'u') {
                    if (n - i < 6 || !is_hex(s[i + 2]) || !is_hex(s[i + 3]) ||
                        !is_hex(s[i + 4]) || !is_hex(s[i + 5]))
                        return kvq_err_set(err, KVQ_E_BAD_JSON,
                                           "%s: header: bad \\u escape at byte %zu", label, i);
                    if (memcmp(s + i + 2, "0000", 4) == 0)
                        return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                                           "%s: header: \\u0000 in a string at byte %zu is not "
                                           "supported",
                                           label, i);
                    i += 6;
                } else if (e && strchr("\"\\/bfnrt", e)) {
                    i += 2;
                } else {
                    return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: header: bad escape at byte %zu",
                                       label, i);
                }
            }
        } else if (c == '-' || is_digit(c)) {
            size_t end = scan_number(s, n, i);
            if (!end)
                return kvq_err_set(err, KVQ_E_BAD_JSON,
                                   "%s: header: malformed number at byte %zu", label, i);
            i = end;
        } else if (is_ws(c) || strchr("{}[]:,", c) || (c >= 'a' && c <= 'z')) {
            i++; /* letters: true/false/null, checked by the parser */
        } else {
            return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: header: unexpected byte 0x%02x at %zu",
                               label, c, i);
        }
    }
    return KVQ_OK;
}

/* A JSON number that must be a non-negative integer below 2^53. */
static kvq_status json_uint(const cJSON *v, const char *label, const char *tname,
                            const char *what, uint64_t *out, kvq_err *err)
{
    if (!cJSON_IsNumber(v))
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: tensor '%.100s': %s is not a number", label,
                           tname, what);
    double d = v->valuedouble;
    if (d < 0)
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: tensor '%.100s': %s %g is negative", label,
                           tname, what, d);
    if (d >= (double)ST_JSON_INT_LIMIT) /* checked before the cast below (also +Inf) */
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: tensor '%.100s': %s %g is not below 2^53",
                           label, tname, what, d);
    if (d != (double)(uint64_t)d)
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: tensor '%.100s': %s %g is not an integer",
                           label, tname, what, d);
    *out = (uint64_t)d;
    return KVQ_OK;
}

/* A tensor being parsed: its view (name still pointing into the JSON tree), its
 * end offset and its position in the header (the last sort key). */
typedef struct st_entry {
    kvq_tensor_view v;
    uint64_t end;
    size_t order;
} st_entry;

/* One header entry {"dtype", "shape", "data_offsets"} into *e (checks 3 and 4). */
static kvq_status parse_tensor(const cJSON *item, const char *label, st_entry *e, kvq_err *err)
{
    const char *name = item->string;
    if (!cJSON_IsObject(item))
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: tensor '%.100s': entry is not an object",
                           label, name);
    const cJSON *dt = NULL, *shape = NULL, *offs = NULL, *f;
    cJSON_ArrayForEach(f, item)
    {
        const cJSON **slot = !strcmp(f->string, "dtype")          ? &dt
                             : !strcmp(f->string, "shape")        ? &shape
                             : !strcmp(f->string, "data_offsets") ? &offs
                                                                  : NULL;
        if (!slot)
            return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: tensor '%.100s': unknown key '%.60s'",
                               label, name, f->string);
        if (*slot)
            return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: tensor '%.100s': duplicate key '%s'",
                               label, name, f->string);
        *slot = f;
    }
    if (!dt || !shape || !offs)
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: tensor '%.100s': missing '%s'", label, name,
                           !dt ? "dtype" : !shape ? "shape" : "data_offsets");
    if (!cJSON_IsString(dt))
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: tensor '%.100s': dtype is not a string",
                           label, name);
    if (!cJSON_IsArray(shape))
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: tensor '%.100s': shape is not an array",
                           label, name);
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return kvq_err_set(err, KVQ_E_BAD_JSON,
                           "%s: tensor '%.100s': data_offsets is not an array of two numbers",
                           label, name);

    memset(e, 0, sizeof *e);
    e->v.name = name;
    if (kvq_dtype_from_name(dt->valuestring, &e->v.dtype) != 0)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: tensor '%.100s': unknown dtype '%.40s'",
                           label, name, dt->valuestring);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > KVQ_MAX_DIMS)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                           "%s: tensor '%.100s': %d dims (at most %d supported)", label, name,
                           ndim, KVQ_MAX_DIMS);
    e->v.ndim = ndim;
    int d = 0;
    cJSON_ArrayForEach(f, shape)
    {
        uint64_t dim;
        kvq_status s = json_uint(f, label, name, "shape dim", &dim, err);
        if (s)
            return s;
        e->v.shape[d++] = (int64_t)dim;
    }
    uint64_t begin, end;
    kvq_status s = json_uint(cJSON_GetArrayItem(offs, 0), label, name, "data offset", &begin, err);
    if (!s)
        s = json_uint(cJSON_GetArrayItem(offs, 1), label, name, "data offset", &end, err);
    if (s)
        return s;

    char sh[8 * 21 + 4];
    size_t nbytes;
    if (!tensor_nbytes(e->v.dtype, ndim, e->v.shape, &nbytes))
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: tensor '%.100s': %s %s overflows a size",
                           label, name, kvq_dtype_name(e->v.dtype),
                           shape_str(ndim, e->v.shape, sh, sizeof sh));
    if (begin > end)
        return kvq_err_set(err, KVQ_E_CORRUPT,
                           "%s: tensor '%.100s': data_offsets [%llu, %llu] are reversed", label,
                           name, (unsigned long long)begin, (unsigned long long)end);
    if ((uint64_t)nbytes != end - begin)
        return kvq_err_set(err, KVQ_E_SHAPE_MISMATCH,
                           "%s: tensor '%.100s': data_offsets [%llu, %llu] but %s %s needs %zu "
                           "bytes",
                           label, name, (unsigned long long)begin, (unsigned long long)end,
                           kvq_dtype_name(e->v.dtype), shape_str(ndim, e->v.shape, sh, sizeof sh),
                           nbytes);
    e->v.offset = begin;
    e->v.nbytes = nbytes;
    e->end = end;
    return KVQ_OK;
}

static int cmp_entry_layout(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    if (x->v.offset != y->v.offset)
        return x->v.offset < y->v.offset ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

static int cmp_view_name(const void *a, const void *b)
{
    const kvq_tensor_view *x = *(const kvq_tensor_view *const *)a;
    const kvq_tensor_view *y = *(const kvq_tensor_view *const *)b;
    return strcmp(x->name, y->name);
}

/* meta is an array of (key, value) pairs of const char *. */
static int cmp_meta_key(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Copies s to *p (NUL included), advances *p, returns the copy. */
static const char *arena_put(char **p, const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = *p;
    memcpy(d, s, n);
    *p += n;
    return d;
}

/* Checks 1-3: the header length, then the header as UTF-8 text and as one JSON object.
 * Sets st->header_size and st->data_size; *root (cJSON_Delete) is the parsed header. */
static kvq_status st_parse_header(kvq_st *st, const uint8_t *p, size_t size, const char *label,
                                  cJSON **root, kvq_err *err)
{
    *root = NULL;
    if (size < 8)
        return kvq_err_set(err, KVQ_E_TRUNCATED_HEADER,
                           "%s: %zu bytes, shorter than the 8-byte header length", label, size);
    uint64_t n = read_le64(p);
    if (n > KVQ_ST_MAX_HEADER)
        return kvq_err_set(err, KVQ_E_TOO_LARGE,
                           "%s: header length %llu exceeds the %u-byte limit", label,
                           (unsigned long long)n, (unsigned)KVQ_ST_MAX_HEADER);
    if (n > size - 8)
        return kvq_err_set(err, KVQ_E_TRUNCATED_HEADER,
                           "%s: header length %llu but only %zu bytes follow", label,
                           (unsigned long long)n, size - 8);
    const unsigned char *hdr = p + 8;
    st->header_size = 8 + (size_t)n;
    st->data_size = size - st->header_size;

    /* 2-3: text, then JSON */
    if (!kvq_utf8_valid((const char *)hdr, (size_t)n))
        return kvq_err_set(err, KVQ_E_BAD_UTF8, "%s: header is not valid UTF-8", label);
    kvq_status s = header_lex_check(hdr, (size_t)n, label, err);
    if (s)
        return s;
    const char *parse_end = NULL;
    *root = n ? cJSON_ParseWithLengthOpts((const char *)hdr, (size_t)n, &parse_end, 0) : NULL;
    if (!*root)
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: header is not valid JSON (near byte %zu)",
                           label,
                           parse_end ? (size_t)(parse_end - (const char *)hdr) : (size_t)0);
    for (const unsigned char *q = (const unsigned char *)parse_end; q < hdr + n; q++)
        if (!is_ws(*q))
            return kvq_err_set(err, KVQ_E_BAD_JSON,
                               "%s: header: trailing bytes after the JSON at %zu", label,
                               (size_t)(q - hdr));
    if (!cJSON_IsObject(*root))
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: header is not a JSON object", label);
    return KVQ_OK;
}

/* Finds the one __metadata__ entry of root (*meta NULL when there is none) and checks
 * that it maps keys to strings. *n_tensors: the other entries; *n_meta: its keys. */
static kvq_status st_find_metadata(const cJSON *root, const char *label, const cJSON **meta,
                                   size_t *n_tensors, size_t *n_meta, kvq_err *err)
{
    size_t n_items = 0;
    const cJSON *item;
    *meta = NULL;
    *n_meta = 0;
    cJSON_ArrayForEach(item, root)
    {
        n_items++;
        if (strcmp(item->string, "__metadata__") != 0)
            continue;
        if (*meta)
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: duplicate __metadata__", label);
        *meta = item;
    }
    *n_tensors = n_items - (*meta != NULL);
    if (!*meta)
        return KVQ_OK;
    if (!cJSON_IsObject(*meta))
        return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: __metadata__ is not an object", label);
    cJSON_ArrayForEach(item, *meta)
    {
        if (!cJSON_IsString(item))
            return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: __metadata__ '%.100s' is not a string",
                               label, item->string);
        (*n_meta)++;
    }
    return KVQ_OK;
}

/* Check 4: the tensor entries of root, in header order, into ents[0..n_tensors), and
 * the metadata pairs into st->meta (both still pointing into the JSON tree). *strings:
 * the bytes their names, keys and values take with their NULs. */
static kvq_status st_parse_entries(kvq_st *st, const cJSON *root, const cJSON *meta,
                                   const char *label, st_entry *ents, size_t n_tensors,
                                   size_t *strings, kvq_err *err)
{
    size_t k = 0;
    const cJSON *item;
    *strings = 0;
    cJSON_ArrayForEach(item, root)
    {
        if (item == meta)
            continue;
        kvq_status s = parse_tensor(item, label, &ents[k], err);
        if (s)
            return s;
        ents[k].order = k;
        *strings += strlen(item->string) + 1;
        k++;
    }
    assert(k == n_tensors);
    (void)n_tensors; /* NDEBUG */
    if (meta) {
        k = 0;
        cJSON_ArrayForEach(item, meta)
        {
            st->meta[2 * k] = item->string;
            st->meta[2 * k + 1] = item->valuestring;
            *strings += strlen(item->string) + strlen(item->valuestring) + 2;
            k++;
        }
    }
    return KVQ_OK;
}

/* Check 5: no tensor name and no metadata key twice. Leaves st->by_name pointing at
 * ents' views sorted by name, and st->meta sorted by key. */
static kvq_status st_check_duplicates(kvq_st *st, st_entry *ents, size_t n_tensors,
                                      size_t n_meta, const char *label, kvq_err *err)
{
    for (size_t i = 0; i < n_tensors; i++)
        st->by_name[i] = &ents[i].v;
    qsort(st->by_name, n_tensors, sizeof *st->by_name, cmp_view_name);
    for (size_t i = 1; i < n_tensors; i++)
        if (strcmp(st->by_name[i - 1]->name, st->by_name[i]->name) == 0)
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: duplicate tensor name '%.100s'", label,
                               st->by_name[i]->name);
    qsort(st->meta, n_meta, 2 * sizeof *st->meta, cmp_meta_key);
    for (size_t i = 1; i < n_meta; i++)
        if (strcmp(st->meta[2 * i - 2], st->meta[2 * i]) == 0)
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: duplicate __metadata__ key '%.100s'",
                               label, st->meta[2 * i]);
    return KVQ_OK;
}

/* Checks 6-7: sorted by offset, the tensors tile the data section of data_size bytes
 * exactly: no overlap, no hole, nothing past its end and nothing left after the last. */
static kvq_status st_check_layout(st_entry *ents, size_t n_tensors, size_t data_size,
                                  const char *label, kvq_err *err)
{
    qsort(ents, n_tensors, sizeof *ents, cmp_entry_layout);
    uint64_t expected = 0;
    for (size_t i = 0; i < n_tensors; i++) {
        const st_entry *e = &ents[i];
        if (e->v.offset < expected)
            return kvq_err_set(err, KVQ_E_OVERLAP,
                               "%s: tensor '%.100s': data_offsets [%llu, %llu] overlap the "
                               "previous tensor ending at %llu",
                               label, e->v.name, (unsigned long long)e->v.offset,
                               (unsigned long long)e->end, (unsigned long long)expected);
        if (e->v.offset > expected) {
            int outside = e->end > (uint64_t)data_size;
            return kvq_err_set(err, outside ? KVQ_E_OUT_OF_BOUNDS : KVQ_E_CORRUPT,
                               "%s: tensor '%.100s': data_offsets [%llu, %llu] leave a hole at "
                               "%llu%s",
                               label, e->v.name, (unsigned long long)e->v.offset,
                               (unsigned long long)e->end, (unsigned long long)expected,
                               outside ? " and end past the data section" : "");
        }
        expected = e->end;
    }
    if (expected > (uint64_t)data_size)
        return kvq_err_set(err, KVQ_E_TRUNCATED_DATA,
                           "%s: tensors need %llu data bytes but the file holds %zu", label,
                           (unsigned long long)expected, data_size);
    if (expected < (uint64_t)data_size)
        return kvq_err_set(err, KVQ_E_CORRUPT,
                           "%s: %llu unreferenced bytes after the last tensor (data section %zu)",
                           label, (unsigned long long)(data_size - expected), data_size);
    return KVQ_OK;
}

/* A valid header: copies the names, keys and values (`strings` bytes) out of the JSON
 * tree into st->strings and points the views at the data that starts at `data`. */
static kvq_status st_publish(kvq_st *st, const st_entry *ents, size_t n_tensors, size_t n_meta,
                             size_t strings, const uint8_t *data, const char *label,
                             kvq_err *err)
{
    st->strings = malloc(strings ? strings : 1);
    if (!st->strings)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
    char *w = st->strings;
    for (size_t i = 0; i < n_tensors; i++) {
        st->tensors[i] = ents[i].v;
        st->tensors[i].name = arena_put(&w, ents[i].v.name);
        st->tensors[i].data = data + ents[i].v.offset;
        st->by_name[i] = &st->tensors[i];
    }
    qsort(st->by_name, n_tensors, sizeof *st->by_name, cmp_view_name);
    for (size_t i = 0; i < 2 * n_meta; i++)
        st->meta[i] = arena_put(&w, st->meta[i]);
    st->count = n_tensors;
    st->n_meta = n_meta;
    return KVQ_OK;
}

/* Parses and validates the bytes p[0..size) into st (checks 1-7, one step each). */
/* The data section against KVQ_ST_META_DATA_XXH64 when the metadata records it. */
static kvq_status st_check_sum(const kvq_st *st, const uint8_t *data, const char *label,
                               kvq_err *err)
{
    const char *v = kvq_st_meta_get(st, KVQ_ST_META_DATA_XXH64);
    if (!v)
        return KVQ_OK;
    uint64_t want = 0;
    int k = 0;
    if (strncmp(v, "xxh64:", 6) || strspn(v + 6, "0123456789abcdef") != 16 || v[22] ||
        sscanf(v + 6, "%16" SCNx64 "%n", &want, &k) != 1 || k != 16)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: metadata %s is not \"xxh64:\" and 16 hex "
                           "digits", label, KVQ_ST_META_DATA_XXH64);
    const uint64_t h = kvq_xxh64(data, (size_t)st->data_size, 0);
    if (h != want)
        return kvq_err_set(err, KVQ_E_CHECKSUM, "%s: checksum mismatch: its data hash to "
                           "xxh64:%016" PRIx64 ", its metadata %s records xxh64:%016" PRIx64
                           " (the file is corrupt or was changed)", label, h,
                           KVQ_ST_META_DATA_XXH64, want);
    return KVQ_OK;
}

static kvq_status st_load(kvq_st *st, const uint8_t *p, size_t size, const char *label,
                          kvq_err *err)
{
    cJSON *root = NULL;
    st_entry *ents = NULL;
    const cJSON *meta = NULL;
    size_t n_tensors = 0, n_meta = 0, strings = 0;
    kvq_status s = st_parse_header(st, p, size, label, &root, err);
    if (!s)
        s = st_find_metadata(root, label, &meta, &n_tensors, &n_meta, err);
    if (s)
        goto done;

    /* Counts are bounded by the header length. */
    ents = calloc(n_tensors ? n_tensors : 1, sizeof *ents);
    st->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *st->tensors);
    st->by_name = calloc(n_tensors ? n_tensors : 1, sizeof *st->by_name);
    st->meta = calloc(n_meta ? 2 * n_meta : 1, sizeof *st->meta);
    if (!ents || !st->tensors || !st->by_name || !st->meta) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    if ((s = st_parse_entries(st, root, meta, label, ents, n_tensors, &strings, err)) ||
        (s = st_check_duplicates(st, ents, n_tensors, n_meta, label, err)) ||
        (s = st_check_layout(ents, n_tensors, st->data_size, label, err)))
        goto done;
    if (!(s = st_publish(st, ents, n_tensors, n_meta, strings, p + st->header_size, label, err)))
        s = st_check_sum(st, p + st->header_size, label, err);
done:
    cJSON_Delete(root);
    free(ents);
    return s;
}

static void st_free(kvq_st *st)
{
    if (!st)
        return;
    free(st->tensors);
    free(st->by_name);
    free(st->meta);
    free(st->strings);
    kvq_unmap(&st->map);
    free(st);
}

kvq_status kvq_st_open_memory(const void *data, size_t size, const char *label, kvq_st **out,
                              kvq_err *err)
{
    *out = NULL;
    if (!label)
        label = "safetensors";
    if (!data && size)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: NULL data", label);
    kvq_st *st = calloc(1, sizeof *st);
    if (!st)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
    kvq_status s = st_load(st, data, size, label, err);
    if (s) {
        st_free(st);
        return s;
    }
    *out = st;
    return KVQ_OK;
}

kvq_status kvq_st_open(const char *path, kvq_st **out, kvq_err *err)
{
    *out = NULL;
    kvq_st *st = calloc(1, sizeof *st);
    if (!st)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
    kvq_status s = kvq_map_file(path, &st->map, err);
    if (!s)
        s = st_load(st, st->map.data, st->map.size, path, err);
    if (s) {
        st_free(st);
        return s;
    }
    *out = st;
    return KVQ_OK;
}

void kvq_st_close(kvq_st *st) { st_free(st); }

size_t kvq_st_count(const kvq_st *st) { return st->count; }

const kvq_tensor_view *kvq_st_tensor(const kvq_st *st, size_t i)
{
    return i < st->count ? &st->tensors[i] : NULL;
}

const kvq_tensor_view *kvq_st_find(const kvq_st *st, const char *name)
{
    size_t lo = 0, hi = st->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->by_name[mid]->name, name);
        if (c == 0)
            return st->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

size_t kvq_st_meta_count(const kvq_st *st) { return st->n_meta; }

const char *kvq_st_meta_key(const kvq_st *st, size_t i)
{
    return i < st->n_meta ? st->meta[2 * i] : NULL;
}

const char *kvq_st_meta_value(const kvq_st *st, size_t i)
{
    return i < st->n_meta ? st->meta[2 * i + 1] : NULL;
}

const char *kvq_st_meta_get(const kvq_st *st, const char *key)
{
    size_t lo = 0, hi = st->n_meta;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->meta[2 * mid], key);
        if (c == 0)
            return st->meta[2 * mid + 1];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

size_t kvq_st_header_size(const kvq_st *st) { return st->header_size; }

size_t kvq_st_data_size(const kvq_st *st) { return st->data_size; }
