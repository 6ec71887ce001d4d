/*
 * gguf.c — GGUF reader (versions 2 and 3) and tensor conversion to f32; the writer is
 * gguf_write.c.
 *
 * The reader parses the whole header up front into storage owned by the handle (one
 * arena for keys, strings and value arrays), validates every tensor's byte range
 * against the data section, and then answers queries without further checks. Every
 * count and length is compared with the bytes remaining before anything is allocated
 * (see read_count), so a hostile file cannot make it allocate more than a small
 * multiple of its own size.
 */
#include "kvq/gguf.h"
#include "kvq/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/half.h"
#include "kvq/util.h"
#include "formats/gguf_internal.h"
#include "formats/quant_simd.h"

/* Minimum encoded sizes, used to bound counts before allocating. */
enum {
    MIN_KV_BYTES = 8 + 1 + 4 + 1,         /* key length, 1-byte key, type, 1-byte value */
    MIN_TENSOR_BYTES = 8 + 1 + 4 + 8 + 4 + 8 /* name length, name, ndim, ne[0], type, offset */
};

/* ==========================================================================
 * ggml tensor types
 * ========================================================================== */

/* The table of ggml types (names, block layouts, what kvq computes) is in quant.c. */
typedef kvq_quant_info ggml_type_info;

static const ggml_type_info *type_info(uint32_t type) { return kvq_quant_info_of(type); }

const char *kvq_ggml_type_name(uint32_t type)
{
    const ggml_type_info *ti = type_info(type);
    return ti ? ti->name : NULL;
}

int kvq_ggml_type_layout(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes)
{
    const ggml_type_info *ti = type_info(type);
    if (!ti)
        return -1;
    if (block_elems)
        *block_elems = ti->block_elems;
    if (block_bytes)
        *block_bytes = ti->block_bytes;
    return 0;
}

const char *kvq_gguf_type_name(kvq_gguf_type t)
{
    static const char *const names[] = {"u8",  "i8",   "u16", "i16", "u32", "i32", "f32",
                                        "bool", "str", "arr", "u64", "i64", "f64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

/* Bytes one value of a scalar type takes in the file; strings and arrays give their
 * minimum (an empty string, an empty array). 0 for an invalid type. */
uint64_t kvq_gguf_type_min_bytes(uint32_t t)
{
    switch (t) {
    case KVQ_GGUF_UINT8: case KVQ_GGUF_INT8: case KVQ_GGUF_BOOL: return 1;
    case KVQ_GGUF_UINT16: case KVQ_GGUF_INT16: return 2;
    case KVQ_GGUF_UINT32: case KVQ_GGUF_INT32: case KVQ_GGUF_FLOAT32: return 4;
    case KVQ_GGUF_UINT64: case KVQ_GGUF_INT64: case KVQ_GGUF_FLOAT64: return 8;
    case KVQ_GGUF_STRING: return 8;
    case KVQ_GGUF_ARRAY: return 12;
    default: return 0;
    }
}

static int is_unsigned_type(kvq_gguf_type t)
{
    return t == KVQ_GGUF_UINT8 || t == KVQ_GGUF_UINT16 || t == KVQ_GGUF_UINT32 ||
           t == KVQ_GGUF_UINT64;
}

static int is_signed_type(kvq_gguf_type t)
{
    return t == KVQ_GGUF_INT8 || t == KVQ_GGUF_INT16 || t == KVQ_GGUF_INT32 ||
           t == KVQ_GGUF_INT64;
}

/* FLOAT32 metadata is held as a double. NaNs are converted through their bits so a
 * signalling NaN's payload survives a read-write round trip unchanged (an FPU
 * conversion would quiet it). */
static double f32_bits_to_f64(uint32_t b)
{
    double d;
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        const uint64_t bits = ((uint64_t)(b >> 31) << 63) | (UINT64_C(0x7ff) << 52) |
                              ((uint64_t)(b & 0x7fffffu) << 29);
        memcpy(&d, &bits, sizeof d);
    } else {
        float f;
        memcpy(&f, &b, sizeof f);
        d = f;
    }
    return d;
}

/* ==========================================================================
 * arena: keys, strings and value arrays, freed all at once by kvq_gguf_close
 * ========================================================================== */

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
} arena_block;

#define ARENA_HEADER ((sizeof(arena_block) + 15) & ~(size_t)15)
#define ARENA_CHUNK ((size_t)64 << 10)

static void *arena_alloc(arena_block **head, size_t n)
{
    if (n > SIZE_MAX - 15 - ARENA_HEADER)
        return NULL;
    n = (n + 15) & ~(size_t)15;
    arena_block *blk = *head;
    if (blk && blk->cap - blk->used >= n) {
        void *p = (char *)blk + ARENA_HEADER + blk->used;
        blk->used += n;
        return p;
    }
    const size_t cap = n > ARENA_CHUNK / 4 ? n : ARENA_CHUNK;
    arena_block *nb = malloc(ARENA_HEADER + cap);
    if (!nb)
        return NULL;
    nb->used = n;
    nb->cap = cap;
    if (blk && cap == n) { /* a big dedicated block: keep filling the current one */
        nb->next = blk->next;
        blk->next = nb;
    } else {
        nb->next = blk;
        *head = nb;
    }
    return (char *)nb + ARENA_HEADER;
}

static void arena_free(arena_block *blk)
{
    while (blk) {
        arena_block *next = blk->next;
        free(blk);
        blk = next;
    }
}

/* ==========================================================================
 * name index: open addressing over key / tensor names, for duplicates and lookups
 * ========================================================================== */

typedef struct name_index {
    size_t *slots; /* entry index + 1, 0 = empty */
    size_t mask;
} name_index;

static kvq_status index_init(name_index *ix, size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    ix->slots = calloc(cap, sizeof *ix->slots);
    ix->mask = cap - 1;
    return ix->slots ? KVQ_OK : KVQ_E_NOMEM;
}

/* Finds `name`; names(i) gives entry i's name. Returns the slot holding it, or the
 * empty slot where it would go. */
static size_t index_slot(const name_index *ix, const char *name,
                         const char *(*names)(const void *, size_t), const void *ctx)
{
    size_t h = (size_t)kvq_fnv1a64(name, strlen(name), KVQ_FNV1A64_INIT) & ix->mask;
    while (ix->slots[h] && strcmp(names(ctx, ix->slots[h] - 1), name) != 0)
        h = (h + 1) & ix->mask;
    return h;
}

/* ==========================================================================
 * the handle
 * ========================================================================== */

struct kvq_gguf {
    kvq_map map;            /* when opened from a file */
    const uint8_t *base;    /* [size] the whole file */
    size_t size;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    size_t n_kv;
    kvq_gguf_kv *kv;        /* [n_kv], in the arena */
    size_t n_tensors;
    kvq_gguf_tensor *tensors; /* [n_tensors], in the arena */
    name_index kv_index, tensor_index;
    arena_block *arena;
};

static const char *kv_name(const void *ctx, size_t i)
{
    return ((const kvq_gguf *)ctx)->kv[i].key;
}

static const char *tensor_name(const void *ctx, size_t i)
{
    return ((const kvq_gguf *)ctx)->tensors[i].name;
}

/* ==========================================================================
 * reading the header
 * ========================================================================== */

typedef struct reader {
    const uint8_t *p;
    size_t size, pos;
    const char *label;
    kvq_err *err;
    arena_block **arena;
} reader;

static kvq_status need(reader *r, uint64_t n, const char *what)
{
    if (n > r->size - r->pos)
        return kvq_err_set(r->err, KVQ_E_TRUNCATED_HEADER,
                           "%s: file ends inside the header: %s at offset %zu needs %llu bytes, "
                           "%zu left",
                           r->label, what, r->pos, (unsigned long long)n, r->size - r->pos);
    return KVQ_OK;
}

static uint64_t load_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static kvq_status read_uint(reader *r, int n, uint64_t *out, const char *what)
{
    kvq_status st = need(r, (uint64_t)n, what);
    if (st)
        return st;
    *out = load_le(r->p + r->pos, n);
    r->pos += (size_t)n;
    return KVQ_OK;
}

static kvq_status read_u32(reader *r, uint32_t *out, const char *what)
{
    uint64_t v = 0;
    kvq_status st = read_uint(r, 4, &v, what);
    *out = (uint32_t)v;
    return st;
}

/* The count rule: `count` items of at least `min_bytes` each must fit in the bytes
 * left. An absurd count (more than GGUF_MAX_BYTES, or overflowing) is TOO_LARGE; a
 * plausible one that runs past the end of the file is TRUNCATED_HEADER. */
static kvq_status check_count(reader *r, uint64_t count, uint64_t min_bytes, const char *what)
{
    if (min_bytes && count > GGUF_MAX_BYTES / min_bytes)
        return kvq_err_set(r->err, KVQ_E_TOO_LARGE, "%s: %s (%llu) before offset %zu is too large",
                           r->label, what, (unsigned long long)count, r->pos);
    if (count * min_bytes > r->size - r->pos)
        return kvq_err_set(r->err, KVQ_E_TRUNCATED_HEADER,
                           "%s: file ends inside the header: %s (%llu) before offset %zu needs "
                           "at least %llu bytes, %zu left",
                           r->label, what, (unsigned long long)count, r->pos,
                           (unsigned long long)(count * min_bytes), r->size - r->pos);
    return KVQ_OK;
}

/* Allocates n items of `size` bytes from the arena (n already bounded by the file). */
static kvq_status arena_items(reader *r, uint64_t n, size_t size, void **out)
{
    size_t bytes;
    *out = NULL;
    if (n > SIZE_MAX || !kvq_size_mul((size_t)n, size, &bytes))
        return kvq_err_set(r->err, KVQ_E_TOO_LARGE, "%s: %llu items do not fit in memory",
                           r->label, (unsigned long long)n);
    if (bytes == 0)
        return KVQ_OK;
    *out = arena_alloc(r->arena, bytes);
    if (!*out)
        return kvq_err_set(r->err, KVQ_E_NOMEM, "%s: out of memory", r->label);
    return KVQ_OK;
}

/* A string: u64 length, then that many bytes, copied NUL-terminated into the arena. */
static kvq_status read_string(reader *r, const char **s, uint64_t *len, const char *what)
{
    uint64_t n = 0;
    char length_of[64];
    snprintf(length_of, sizeof length_of, "the length of %s", what);
    kvq_status st = read_uint(r, 8, &n, length_of);
    if (!st)
        st = check_count(r, n, 1, length_of);
    if (st)
        return st;
    char *copy = arena_alloc(r->arena, (size_t)n + 1);
    if (!copy)
        return kvq_err_set(r->err, KVQ_E_NOMEM, "%s: out of memory", r->label);
    memcpy(copy, r->p + r->pos, (size_t)n);
    copy[n] = '\0';
    r->pos += (size_t)n;
    *s = copy;
    *len = n;
    return KVQ_OK;
}

/* Keys and tensor names: non-empty UTF-8 without NUL bytes. */
static kvq_status read_name(reader *r, const char **s, const char *what)
{
    const size_t at = r->pos;
    uint64_t n = 0;
    kvq_status st = read_string(r, s, &n, what);
    if (st)
        return st;
    if (n == 0)
        return kvq_err_set(r->err, KVQ_E_CORRUPT, "%s: empty %s at offset %zu", r->label, what,
                           at);
    if (memchr(*s, '\0', (size_t)n))
        return kvq_err_set(r->err, KVQ_E_CORRUPT, "%s: %s at offset %zu contains a NUL byte",
                           r->label, what, at);
    if (!kvq_utf8_valid(*s, (size_t)n))
        return kvq_err_set(r->err, KVQ_E_BAD_UTF8, "%s: %s at offset %zu is not valid UTF-8",
                           r->label, what, at);
    return KVQ_OK;
}

static kvq_status read_value(reader *r, uint32_t type, kvq_gguf_value *v, int depth)
{
    uint64_t x = 0;
    kvq_status st = KVQ_OK;
    v->type = (kvq_gguf_type)type;
    switch (type) {
    case KVQ_GGUF_UINT8: case KVQ_GGUF_UINT16: case KVQ_GGUF_UINT32: case KVQ_GGUF_UINT64:
        st = read_uint(r, (int)kvq_gguf_type_min_bytes(type), &v->v.u, "a value");
        break;
    case KVQ_GGUF_INT8:
        st = read_uint(r, 1, &x, "a value");
        v->v.i = (int8_t)x;
        break;
    case KVQ_GGUF_INT16:
        st = read_uint(r, 2, &x, "a value");
        v->v.i = (int16_t)x;
        break;
    case KVQ_GGUF_INT32:
        st = read_uint(r, 4, &x, "a value");
        v->v.i = (int32_t)x;
        break;
    case KVQ_GGUF_INT64:
        st = read_uint(r, 8, &x, "a value");
        v->v.i = (int64_t)x;
        break;
    case KVQ_GGUF_BOOL:
        if ((st = read_uint(r, 1, &x, "a value")))
            break;
        if (x > 1)
            st = kvq_err_set(r->err, KVQ_E_CORRUPT, "%s: bool value %u at offset %zu",
                             r->label, (unsigned)x, r->pos - 1);
        v->v.u = x;
        break;
    case KVQ_GGUF_FLOAT32:
        st = read_uint(r, 4, &x, "a value");
        v->v.f = f32_bits_to_f64((uint32_t)x);
        break;
    case KVQ_GGUF_FLOAT64:
        st = read_uint(r, 8, &x, "a value");
        memcpy(&v->v.f, &x, sizeof x);
        break;
    case KVQ_GGUF_STRING:
        st = read_string(r, &v->v.str.s, &v->v.str.len, "a string");
        break;
    case KVQ_GGUF_ARRAY: {
        uint32_t et = 0;
        uint64_t n = 0;
        if (depth >= KVQ_GGUF_MAX_NESTING) {
            st = kvq_err_set(r->err, KVQ_E_TOO_LARGE,
                             "%s: arrays nested more than %d deep at offset %zu", r->label,
                             KVQ_GGUF_MAX_NESTING, r->pos);
            break;
        }
        if ((st = read_u32(r, &et, "an array type")))
            break;
        if (!kvq_gguf_type_min_bytes(et)) {
            st = kvq_err_set(r->err, KVQ_E_CORRUPT, "%s: bad array element type %u at offset %zu",
                             r->label, et, r->pos - 4);
            break;
        }
        if ((st = read_uint(r, 8, &n, "an array length")) ||
            (st = check_count(r, n, kvq_gguf_type_min_bytes(et), "an array length")))
            break;
        kvq_gguf_value *items = NULL;
        if ((st = arena_items(r, n, sizeof *items, (void **)&items)))
            break;
        v->v.arr.type = (kvq_gguf_type)et;
        v->v.arr.n = n;
        v->v.arr.items = items;
        for (uint64_t i = 0; i < n && !st; i++)
            st = read_value(r, et, &items[i], depth + 1);
        break;
    }
    default:
        st = kvq_err_set(r->err, KVQ_E_CORRUPT, "%s: bad value type %u", r->label, type);
        break;
    }
    return st;
}

/* Magic, version and the two counts. */
static kvq_status parse_preamble(kvq_gguf *g, reader *r, uint64_t *n_tensors, uint64_t *n_kv)
{
    const size_t have = r->size < 4 ? r->size : 4;
    if (memcmp(r->p, "GGUF", have) != 0)
        return kvq_err_set(r->err, KVQ_E_BAD_MAGIC, "%s: not a GGUF file (bad magic)", r->label);
    kvq_status st = need(r, 4, "the magic");
    if (st)
        return st;
    r->pos = 4;
    if ((st = read_u32(r, &g->version, "the version")))
        return st;
    if (g->version != 0 && (g->version & 0xffffu) == 0)
        return kvq_err_set(r->err, KVQ_E_UNSUPPORTED,
                           "%s: version field 0x%08x looks byte-swapped: big-endian GGUF "
                           "files are not supported",
                           r->label, g->version);
    if (g->version < 2 || g->version > 3)
        return kvq_err_set(r->err, KVQ_E_VERSION,
                           "%s: GGUF version %u is not supported (only versions 2 and 3 are)",
                           r->label, g->version);
    if ((st = read_uint(r, 8, n_tensors, "the tensor count")) ||
        (st = read_uint(r, 8, n_kv, "the metadata count")) ||
        (st = check_count(r, *n_kv, MIN_KV_BYTES, "the metadata count")) ||
        (st = check_count(r, *n_tensors, MIN_TENSOR_BYTES, "the tensor count")))
        return st;
    return KVQ_OK;
}

static kvq_status parse_kvs(kvq_gguf *g, reader *r, uint64_t n_kv)
{
    kvq_status st = arena_items(r, n_kv, sizeof *g->kv, (void **)&g->kv);
    if (st)
        return st;
    if (index_init(&g->kv_index, (size_t)n_kv))
        return kvq_err_set(r->err, KVQ_E_NOMEM, "%s: out of memory", r->label);
    for (size_t i = 0; i < n_kv; i++) {
        kvq_gguf_kv *kv = &g->kv[i];
        uint32_t type = 0;
        if ((st = read_name(r, &kv->key, "a metadata key")) ||
            (st = read_u32(r, &type, "a value type")))
            return st;
        if (!kvq_gguf_type_min_bytes(type))
            return kvq_err_set(r->err, KVQ_E_CORRUPT, "%s: key '%s' has bad value type %u",
                               r->label, kv->key, type);
        if ((st = read_value(r, type, &kv->value, 0)))
            return st;
        const size_t slot = index_slot(&g->kv_index, kv->key, kv_name, g);
        if (g->kv_index.slots[slot])
            return kvq_err_set(r->err, KVQ_E_CORRUPT, "%s: duplicate key '%s'", r->label, kv->key);
        g->kv_index.slots[slot] = i + 1;
        g->n_kv = i + 1;
    }
    return KVQ_OK;
}

/* general.alignment and split.count, once all the metadata is in. */
static kvq_status check_metadata(kvq_gguf *g, reader *r)
{
    const kvq_gguf_value *a = kvq_gguf_get(g, "general.alignment");
    g->alignment = KVQ_GGUF_DEFAULT_ALIGNMENT;
    if (a) {
        uint64_t v = 0;
        if (kvq_gguf_get_u64(g, "general.alignment", &v) != 0 || v == 0 || v > UINT32_MAX ||
            (v & (v - 1)) != 0)
            return kvq_err_set(r->err, KVQ_E_CORRUPT,
                               "%s: general.alignment must be a non-zero power of two "
                               "(an unsigned 32-bit integer)",
                               r->label);
        g->alignment = v;
    }
    uint64_t parts = 0;
    if (kvq_gguf_get_u64(g, "split.count", &parts) == 0 && parts > 1)
        return kvq_err_set(r->err, KVQ_E_UNSUPPORTED,
                           "%s: split GGUF (%llu parts) is not supported; merge the parts "
                           "first (llama-gguf-split --merge)",
                           r->label, (unsigned long long)parts);
    return KVQ_OK;
}

static kvq_status parse_tensor_infos(kvq_gguf *g, reader *r, uint64_t n_tensors)
{
    kvq_status st = check_count(r, n_tensors, MIN_TENSOR_BYTES, "the tensor count");
    if (!st)
        st = arena_items(r, n_tensors, sizeof *g->tensors, (void **)&g->tensors);
    if (st)
        return st;
    if (index_init(&g->tensor_index, (size_t)n_tensors))
        return kvq_err_set(r->err, KVQ_E_NOMEM, "%s: out of memory", r->label);
    for (size_t i = 0; i < n_tensors; i++) {
        kvq_gguf_tensor *t = &g->tensors[i];
        uint64_t ne[4] = {1, 1, 1, 1}, type = 0;
        if ((st = read_name(r, &t->name, "a tensor name")) ||
            (st = read_u32(r, &t->ndim, "a tensor's dimension count")))
            return st;
        if (t->ndim < 1 || t->ndim > 4)
            return kvq_err_set(r->err, KVQ_E_CORRUPT, "%s: tensor '%s' has %u dimensions (1..4)",
                               r->label, t->name, t->ndim);
        for (uint32_t d = 0; d < t->ndim; d++)
            if ((st = read_uint(r, 8, &ne[d], "a tensor's shape")))
                return st;
        if ((st = read_uint(r, 4, &type, "a tensor's type")) ||
            (st = read_uint(r, 8, &t->offset, "a tensor's offset")))
            return st;
        t->type = (uint32_t)type;

        const ggml_type_info *ti = type_info(t->type);
        if (!ti)
            return kvq_err_set(r->err, KVQ_E_UNSUPPORTED, "%s: tensor '%s' has unknown ggml type %u",
                               r->label, t->name, t->type);
        /* span: the product of the nonzero dims, held to INT64_MAX like the element count
         * (never more than it), so that no product of some of the dims overflows either: an
         * empty tensor (a zero dim) with huge others still has a row count
         * (kvq_gguf_tensor_rows) */
        uint64_t count = 1, span = 1;
        for (int d = 0; d < 4; d++) {
            if (ne[d] > (uint64_t)INT64_MAX || (ne[d] != 0 && span > (uint64_t)INT64_MAX / ne[d]))
                return kvq_err_set(r->err, KVQ_E_TOO_LARGE, "%s: tensor '%s' shape is too large",
                                   r->label, t->name);
            span *= ne[d] ? ne[d] : 1;
            count *= ne[d];
            t->ne[d] = (int64_t)ne[d];
        }
        if (ne[0] % ti->block_elems != 0)
            return kvq_err_set(r->err, KVQ_E_CORRUPT,
                               "%s: tensor '%s': ne[0] = %llu is not a multiple of the %s block "
                               "size %u",
                               r->label, t->name, (unsigned long long)ne[0], ti->name, ti->block_elems);
        const uint64_t blocks = count / ti->block_elems;
        if (blocks > GGUF_MAX_BYTES / ti->block_bytes)
            return kvq_err_set(r->err, KVQ_E_TOO_LARGE, "%s: tensor '%s' is too large", r->label,
                               t->name);
        t->nbytes = (size_t)(blocks * ti->block_bytes);
        if (t->offset % g->alignment != 0)
            return kvq_err_set(r->err, KVQ_E_CORRUPT,
                               "%s: tensor '%s' offset %llu is not a multiple of the alignment %llu",
                               r->label, t->name, (unsigned long long)t->offset,
                               (unsigned long long)g->alignment);
        const size_t slot = index_slot(&g->tensor_index, t->name, tensor_name, g);
        if (g->tensor_index.slots[slot])
            return kvq_err_set(r->err, KVQ_E_CORRUPT, "%s: duplicate tensor '%s'", r->label,
                               t->name);
        g->tensor_index.slots[slot] = i + 1;
        g->n_tensors = i + 1;
    }
    return KVQ_OK;
}

typedef struct placed {
    uint64_t offset, nbytes;
    size_t index;
} placed;

static int cmp_placed(const void *a, const void *b)
{
    const placed *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return x->index < y->index ? -1 : 1;
}

/* Places the tensors in the data section. In offset order: an overlap with an earlier
 * tensor is OVERLAP; a tensor that runs past the end of the file is TRUNCATED_DATA if
 * it starts where the previous one ended (rounded up to the alignment) or inside the
 * file (the file was cut short), and OUT_OF_BOUNDS if it starts past the end of the
 * file after a gap (its offset points nowhere). */
static kvq_status place_tensors(kvq_gguf *g, reader *r)
{
    kvq_status st = KVQ_OK;
    const uint64_t header_end = r->pos;
    g->data_offset = (header_end + g->alignment - 1) & ~(g->alignment - 1);
    if (g->n_tensors == 0)
        return KVQ_OK;
    if (g->data_offset > r->size)
        return kvq_err_set(r->err, KVQ_E_TRUNCATED_DATA,
                           "%s: file ends at %zu, before the data section at %llu", r->label,
                           r->size, (unsigned long long)g->data_offset);
    const uint64_t data_size = r->size - g->data_offset;

    for (size_t i = 0; i < g->n_tensors; i++) {
        const kvq_gguf_tensor *t = &g->tensors[i];
        if (t->offset > UINT64_MAX - t->nbytes)
            return kvq_err_set(r->err, KVQ_E_OUT_OF_BOUNDS,
                               "%s: tensor '%s' offset %llu is out of bounds", r->label, t->name,
                               (unsigned long long)t->offset);
    }
    placed *order = malloc(g->n_tensors * sizeof *order); // [n_tensors]
    if (!order)
        return kvq_err_set(r->err, KVQ_E_NOMEM, "%s: out of memory", r->label);
    for (size_t i = 0; i < g->n_tensors; i++)
        order[i] = (placed){g->tensors[i].offset, g->tensors[i].nbytes, i};
    qsort(order, g->n_tensors, sizeof *order, cmp_placed);

    uint64_t prev_end = 0;
    const kvq_gguf_tensor *prev = NULL;
    for (size_t k = 0; k < g->n_tensors && !st; k++) {
        kvq_gguf_tensor *t = &g->tensors[order[k].index];
        const uint64_t end = t->offset + t->nbytes;
        if (t->nbytes == 0 && prev && t->offset < prev_end) {
            /* an empty tensor inside another one's bytes overlaps nothing */
        } else if (prev && t->offset < prev_end) {
            st = kvq_err_set(r->err, KVQ_E_OVERLAP,
                             "%s: tensors '%s' and '%s' overlap (bytes %llu..%llu of the data)",
                             r->label, prev->name, t->name, (unsigned long long)t->offset,
                             (unsigned long long)(prev_end < end ? prev_end : end));
            break;
        }
        if (end > data_size) {
            const uint64_t expect = (prev_end + g->alignment - 1) & ~(g->alignment - 1);
            if (t->offset > expect && t->offset >= data_size)
                st = kvq_err_set(r->err, KVQ_E_OUT_OF_BOUNDS,
                                 "%s: tensor '%s' data [%llu, %llu) lies outside the %llu-byte "
                                 "data section",
                                 r->label, t->name, (unsigned long long)t->offset,
                                 (unsigned long long)end, (unsigned long long)data_size);
            else
                st = kvq_err_set(r->err, KVQ_E_TRUNCATED_DATA,
                                 "%s: file ends inside tensor '%s' (data needs %llu bytes, the "
                                 "file has %llu)",
                                 r->label, t->name,
                                 (unsigned long long)(g->data_offset + end),
                                 (unsigned long long)r->size);
            break;
        }
        t->data = g->base + g->data_offset + t->offset;
        if (end > prev_end) {
            prev_end = end;
            prev = t;
        }
    }
    free(order);
    return st;
}

static kvq_status parse(kvq_gguf *g, const char *label, kvq_err *err)
{
    reader r = {.p = g->base, .size = g->size, .label = label, .err = err, .arena = &g->arena};
    uint64_t n_tensors = 0, n_kv = 0;
    kvq_status st = parse_preamble(g, &r, &n_tensors, &n_kv);
    if (!st)
        st = parse_kvs(g, &r, n_kv);
    if (!st)
        st = check_metadata(g, &r);
    if (!st)
        st = parse_tensor_infos(g, &r, n_tensors);
    if (!st)
        st = place_tensors(g, &r);
    return st;
}

/* ==========================================================================
 * open / close / queries
 * ========================================================================== */

kvq_status kvq_gguf_open_memory(const void *data, size_t size, const char *label, kvq_gguf **out,
                                kvq_err *err)
{
    *out = NULL;
    if (!label)
        label = "<memory>";
    if (!data && size)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: NULL data", label);
    kvq_gguf *g = calloc(1, sizeof *g);
    if (!g)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
    static const uint8_t empty[1];
    g->base = data ? data : empty;
    g->size = size;
    kvq_status st = parse(g, label, err);
    if (st) {
        kvq_gguf_close(g);
        return st;
    }
    *out = g;
    return KVQ_OK;
}

kvq_status kvq_gguf_open(const char *path, kvq_gguf **out, kvq_err *err)
{
    *out = NULL;
    kvq_map m;
    kvq_status st = kvq_map_file(path, &m, err);
    if (st)
        return st;
    st = kvq_gguf_open_memory(m.data, m.size, path, out, err);
    if (st) {
        kvq_unmap(&m);
        return st;
    }
    (*out)->map = m;
    return KVQ_OK;
}

void kvq_gguf_close(kvq_gguf *g)
{
    if (!g)
        return;
    kvq_unmap(&g->map);
    free(g->kv_index.slots);
    free(g->tensor_index.slots);
    arena_free(g->arena);
    free(g);
}

uint32_t kvq_gguf_version(const kvq_gguf *g) { return g->version; }
uint64_t kvq_gguf_alignment(const kvq_gguf *g) { return g->alignment; }
uint64_t kvq_gguf_data_offset(const kvq_gguf *g) { return g->data_offset; }
size_t kvq_gguf_kv_count(const kvq_gguf *g) { return g->n_kv; }
size_t kvq_gguf_tensor_count(const kvq_gguf *g) { return g->n_tensors; }

const kvq_gguf_kv *kvq_gguf_kv_at(const kvq_gguf *g, size_t i)
{
    return i < g->n_kv ? &g->kv[i] : NULL;
}

const kvq_gguf_tensor *kvq_gguf_tensor_at(const kvq_gguf *g, size_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const kvq_gguf_value *kvq_gguf_get(const kvq_gguf *g, const char *key)
{
    if (!g || !key || !g->kv_index.slots)
        return NULL;
    const size_t slot = index_slot(&g->kv_index, key, kv_name, g);
    const size_t i = g->kv_index.slots[slot];
    return i ? &g->kv[i - 1].value : NULL;
}

const kvq_gguf_tensor *kvq_gguf_find_tensor(const kvq_gguf *g, const char *name)
{
    if (!g || !name || !g->tensor_index.slots)
        return NULL;
    const size_t slot = index_slot(&g->tensor_index, name, tensor_name, g);
    const size_t i = g->tensor_index.slots[slot];
    return i ? &g->tensors[i - 1] : NULL;
}

int kvq_gguf_get_u64(const kvq_gguf *g, const char *key, uint64_t *out)
{
    const kvq_gguf_value *v = kvq_gguf_get(g, key);
    if (!v)
        return -1;
    if (is_unsigned_type(v->type)) {
        *out = v->v.u;
        return 0;
    }
    if (is_signed_type(v->type) && v->v.i >= 0) {
        *out = (uint64_t)v->v.i;
        return 0;
    }
    return -1;
}

int kvq_gguf_get_f64(const kvq_gguf *g, const char *key, double *out)
{
    const kvq_gguf_value *v = kvq_gguf_get(g, key);
    if (!v)
        return -1;
    if (is_unsigned_type(v->type))
        *out = (double)v->v.u;
    else if (is_signed_type(v->type))
        *out = (double)v->v.i;
    else if (v->type == KVQ_GGUF_FLOAT32 || v->type == KVQ_GGUF_FLOAT64)
        *out = v->v.f;
    else
        return -1;
    return 0;
}

int kvq_gguf_value_equal(const kvq_gguf_value *a, const kvq_gguf_value *b)
{
    if (a->type != b->type)
        return 0;
    switch (a->type) {
    case KVQ_GGUF_STRING:
        return a->v.str.len == b->v.str.len && !memcmp(a->v.str.s, b->v.str.s, a->v.str.len);
    case KVQ_GGUF_ARRAY:
        if (a->v.arr.type != b->v.arr.type || a->v.arr.n != b->v.arr.n)
            return 0;
        for (uint64_t i = 0; i < a->v.arr.n; i++)
            if (!kvq_gguf_value_equal(&a->v.arr.items[i], &b->v.arr.items[i]))
                return 0;
        return 1;
    case KVQ_GGUF_FLOAT32: case KVQ_GGUF_FLOAT64:
        return !memcmp(&a->v.f, &b->v.f, sizeof a->v.f);
    case KVQ_GGUF_INT8: case KVQ_GGUF_INT16: case KVQ_GGUF_INT32: case KVQ_GGUF_INT64:
        return a->v.i == b->v.i;
    default:
        return a->v.u == b->v.u;
    }
}

const char *kvq_gguf_get_str(const kvq_gguf *g, const char *key)
{
    const kvq_gguf_value *v = kvq_gguf_get(g, key);
    return v && v->type == KVQ_GGUF_STRING ? v->v.str.s : NULL;
}

/* ==========================================================================
 * conversion to f32
 * ========================================================================== */

int64_t kvq_gguf_tensor_rows(const kvq_gguf_tensor *t)
{
    int64_t rows = 1;
    for (int d = 1; d < 4; d++) {
        if (t->ne[d] < 0 || (t->ne[d] != 0 && rows > INT64_MAX / t->ne[d]))
            return -1;
        rows *= t->ne[d];
    }
    return rows;
}

kvq_status kvq_gguf_rows_to_f32(const kvq_gguf_tensor *t, int64_t row0, int64_t nrows,
                                float *out, kvq_err *err)
{
    if (!t)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "rows_to_f32: NULL tensor");
    const char *name = t->name ? t->name : "?";
    const ggml_type_info *ti = type_info(t->type);
    if (!kvq_quant_supported(t->type)) {
        if (ti)
            return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                               "tensor '%s': ggml type %s is not supported (kvq computes with "
                               "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, "
                               "Q5_K and Q6_K)",
                               name, ti->name);
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "tensor '%s': unknown ggml type %u", name,
                           t->type);
    }
    const int64_t rows = kvq_gguf_tensor_rows(t);
    if (rows < 0 || t->ne[0] < 0 || t->ne[0] % ti->block_elems != 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "tensor '%s': bad shape", name);
    if (row0 < 0 || nrows < 0 || row0 > rows || nrows > rows - row0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "tensor '%s': rows [%lld, %lld + %lld) are outside its %lld rows",
                           name, (long long)row0, (long long)row0, (long long)nrows,
                           (long long)rows);
    if (nrows == 0) /* nothing to do; a 0-row tensor may have any ne[0] */
        return KVQ_OK;
    size_t row_bytes, skip, total, n;
    if (!kvq_size_mul((size_t)t->ne[0] / ti->block_elems, ti->block_bytes, &row_bytes) ||
        !kvq_size_mul((size_t)row0, row_bytes, &skip) ||
        !kvq_size_mul((size_t)nrows, row_bytes, &total) ||
        !kvq_size_mul((size_t)nrows, (size_t)t->ne[0], &n) || skip > t->nbytes ||
        total > t->nbytes - skip)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "tensor '%s': rows exceed its %zu bytes",
                           name, t->nbytes);
    if (n == 0)
        return KVQ_OK;
    if (!t->data || !out)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "tensor '%s': NULL data or output", name);
    const uint8_t *src = (const uint8_t *)t->data + skip; // [nrows, ne[0]] in t->type
    kvq_quant_fast_kernel(t->type)(src, out, n);
    return KVQ_OK;
}
