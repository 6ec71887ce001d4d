/* fuzz_gguf_rt.c — libFuzzer round trip for the GGUF writer and reader. The input
 * bytes are a recipe: key/values of every type (nested arrays too), an optional
 * general.alignment, and tensors of several ggml types with their bytes. The target
 * writes the file twice (same bytes), reads it back (same values, bit for bit, same
 * tensor bytes, conversions equal to the references), and writes what it read (same
 * bytes again). Any difference aborts. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/gguf.h"
#include "kvq/half.h"
#include "kvq/quant.h"

#define CHECK(x) do { if (!(x)) abort(); } while (0)

typedef struct recipe {
    const uint8_t *p;
    size_t n, pos;
} recipe;

static uint8_t take8(recipe *r) { return r->pos < r->n ? r->p[r->pos++] : 0; }

static uint64_t take(recipe *r, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)take8(r) << (8 * i);
    return v;
}

/* A double holding f32 bits exactly (NaN payloads by bit manipulation, as the reader
 * does), so the writer's conversion back to f32 is exact. */
static double f32_as_f64(uint32_t b)
{
    double d;
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        const uint64_t bits = ((uint64_t)(b >> 31) << 63) | (UINT64_C(0x7ff) << 52) |
                              ((uint64_t)(b & 0x7fffffu) << 29);
        memcpy(&d, &bits, 8);
    } else {
        float f;
        memcpy(&f, &b, 4);
        d = f;
    }
    return d;
}

static void value_free(kvq_gguf_value *v)
{
    if (v->type == KVQ_GGUF_STRING) {
        free((char *)v->v.str.s);
    } else if (v->type == KVQ_GGUF_ARRAY) {
        kvq_gguf_value *items = (kvq_gguf_value *)v->v.arr.items;
        for (uint64_t i = 0; i < v->v.arr.n; i++)
            value_free(&items[i]);
        free(items);
    }
}

static void make_value(recipe *r, kvq_gguf_type type, int depth, kvq_gguf_value *v)
{
    memset(v, 0, sizeof *v);
    v->type = type;
    switch (type) {
    case KVQ_GGUF_UINT8: v->v.u = take(r, 1); break;
    case KVQ_GGUF_UINT16: v->v.u = take(r, 2); break;
    case KVQ_GGUF_UINT32: v->v.u = take(r, 4); break;
    case KVQ_GGUF_UINT64: v->v.u = take(r, 8); break;
    case KVQ_GGUF_INT8: v->v.i = (int8_t)take(r, 1); break;
    case KVQ_GGUF_INT16: v->v.i = (int16_t)take(r, 2); break;
    case KVQ_GGUF_INT32: v->v.i = (int32_t)take(r, 4); break;
    case KVQ_GGUF_INT64: v->v.i = (int64_t)take(r, 8); break;
    case KVQ_GGUF_BOOL: v->v.u = take8(r) & 1; break;
    case KVQ_GGUF_FLOAT32: v->v.f = f32_as_f64((uint32_t)take(r, 4)); break;
    case KVQ_GGUF_FLOAT64: {
        const uint64_t b = take(r, 8);
        memcpy(&v->v.f, &b, 8);
        break;
    }
    case KVQ_GGUF_STRING: {
        const size_t len = take8(r) % 24;
        char *s = malloc(len + 1);
        CHECK(s);
        for (size_t i = 0; i < len; i++)
            s[i] = (char)take8(r); /* any bytes: values need not be UTF-8 */
        s[len] = '\0';
        v->v.str.s = s;
        v->v.str.len = len;
        break;
    }
    default: { /* array */
        const uint8_t t = take8(r) % 13;
        const kvq_gguf_type et = (t == KVQ_GGUF_ARRAY && depth >= 3) ? KVQ_GGUF_UINT8
                                                                       : (kvq_gguf_type)t;
        const uint64_t n = take8(r) % 6;
        kvq_gguf_value *items = n ? calloc((size_t)n, sizeof *items) : NULL;
        CHECK(n == 0 || items);
        for (uint64_t i = 0; i < n; i++)
            make_value(r, et, depth + 1, &items[i]);
        v->v.arr.type = et;
        v->v.arr.n = n;
        v->v.arr.items = items;
        break;
    }
    }
}

enum { MAX_KV = 8, MAX_T = 4 };
static const uint32_t tensor_types[] = {KVQ_GGML_F32,  KVQ_GGML_F16,  KVQ_GGML_BF16,
                                        KVQ_GGML_Q8_0, KVQ_GGML_Q4_0, KVQ_GGML_I8,
                                        KVQ_GGML_Q4_K, KVQ_GGML_Q6_K, 16 /* IQ2_XXS */};

typedef struct planned_tensor {
    char name[16];
    uint32_t type, ndim;
    int64_t ne[4];
    uint8_t *data;
    size_t nbytes;
} planned_tensor;

static void serialize(kvq_gguf_writer *w, void **buf, size_t *n)
{
    kvq_err err = {0};
    CHECK(kvq_gguf_writer_to_buffer(w, buf, n, &err) == KVQ_OK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    recipe r = {data, size, 0};
    kvq_err err = {0};
    kvq_gguf_writer *w = kvq_gguf_writer_new();
    CHECK(w);

    /* metadata */
    char keys[MAX_KV + 1][32];
    kvq_gguf_value vals[MAX_KV + 1];
    size_t n_kv = take8(&r) % (MAX_KV + 1);
    for (size_t i = 0; i < n_kv; i++) {
        snprintf(keys[i], sizeof keys[i], "k%u.\xc3\xa9%02x", (unsigned)i % 100u, take8(&r)); /* "é" */
        make_value(&r, (kvq_gguf_type)(take8(&r) % 13), 0, &vals[i]);
        CHECK(kvq_gguf_writer_set(w, keys[i], &vals[i], &err) == KVQ_OK);
    }
    const uint8_t align_code = take8(&r);
    if (align_code & 1) {
        snprintf(keys[n_kv], sizeof keys[n_kv], "general.alignment");
        vals[n_kv] = (kvq_gguf_value){.type = KVQ_GGUF_UINT32, .v.u = 1u << (align_code >> 1) % 9};
        CHECK(kvq_gguf_writer_set(w, keys[n_kv], &vals[n_kv], &err) == KVQ_OK);
        n_kv++;
    }

    /* tensors */
    planned_tensor ts[MAX_T];
    const size_t n_t = take8(&r) % (MAX_T + 1);
    for (size_t i = 0; i < n_t; i++) {
        planned_tensor *t = &ts[i];
        snprintf(t->name, sizeof t->name, "t%u", (unsigned)i % 100u);
        t->type = tensor_types[take8(&r) % (sizeof tensor_types / sizeof tensor_types[0])];
        uint32_t block = 0, bytes = 0;
        CHECK(kvq_ggml_type_layout(t->type, &block, &bytes) == 0);
        t->ndim = 1 + take8(&r) % 4;
        size_t count = 1;
        for (int d = 0; d < 4; d++) {
            t->ne[d] = d >= (int)t->ndim ? 1 : d == 0 ? (int64_t)block * (take8(&r) % 4)
                                                      : (int64_t)(take8(&r) % 3);
            count *= (size_t)t->ne[d];
        }
        t->nbytes = count / block * bytes;
        t->data = malloc(t->nbytes ? t->nbytes : 1);
        CHECK(t->data);
        for (size_t k = 0; k < t->nbytes; k++)
            t->data[k] = take8(&r);
        CHECK(kvq_gguf_writer_add_tensor(w, t->name, t->type, t->ndim, t->ne, t->data, t->nbytes,
                                         &err) == KVQ_OK);
    }

    /* write twice: same bytes */
    void *b1 = NULL, *b2 = NULL;
    size_t n1 = 0, n2 = 0;
    serialize(w, &b1, &n1);
    serialize(w, &b2, &n2);
    CHECK(n1 == n2 && memcmp(b1, b2, n1) == 0);

    /* read back: the same values and bytes */
    kvq_gguf *g = NULL;
    if (kvq_gguf_open_memory(b1, n1, "rt", &g, &err) != KVQ_OK)
        abort();
    CHECK(kvq_gguf_version(g) == 3);
    CHECK(kvq_gguf_kv_count(g) == n_kv);
    for (size_t i = 0; i < n_kv; i++) {
        const kvq_gguf_kv *kv = kvq_gguf_kv_at(g, i);
        CHECK(strcmp(kv->key, keys[i]) == 0);
        CHECK(kvq_gguf_value_equal(&kv->value, &vals[i]));
    }
    CHECK(kvq_gguf_tensor_count(g) == n_t);
    for (size_t i = 0; i < n_t; i++) {
        const kvq_gguf_tensor *t = kvq_gguf_tensor_at(g, i);
        CHECK(strcmp(t->name, ts[i].name) == 0 && t->type == ts[i].type &&
              t->ndim == ts[i].ndim && t->nbytes == ts[i].nbytes);
        CHECK(memcmp(t->ne, ts[i].ne, sizeof t->ne) == 0);
        CHECK(t->nbytes == 0 || memcmp(t->data, ts[i].data, t->nbytes) == 0);
        const int64_t rows = kvq_gguf_tensor_rows(t);
        const size_t n = (size_t)(rows * t->ne[0]);
        float *out = malloc((n ? n : 1) * sizeof *out), *ref = malloc((n ? n : 1) * sizeof *ref);
        CHECK(out && ref);
        const kvq_status st = kvq_gguf_rows_to_f32(t, 0, rows, out, &err);
        if (!kvq_quant_supported(t->type)) {
            CHECK(st == KVQ_E_UNSUPPORTED);
        } else {
            CHECK(st == KVQ_OK);
            CHECK(kvq_dequantize_ref(t->type, ts[i].data, ref, n, &err) == KVQ_OK);
            CHECK(n == 0 || memcmp(out, ref, n * sizeof *out) == 0);
        }
        free(out);
        free(ref);
    }

    /* write what was read: the same bytes again */
    kvq_gguf_writer *w2 = kvq_gguf_writer_new();
    CHECK(w2);
    for (size_t i = 0; i < kvq_gguf_kv_count(g); i++) {
        const kvq_gguf_kv *kv = kvq_gguf_kv_at(g, i);
        CHECK(kvq_gguf_writer_set(w2, kv->key, &kv->value, &err) == KVQ_OK);
    }
    for (size_t i = 0; i < kvq_gguf_tensor_count(g); i++) {
        const kvq_gguf_tensor *t = kvq_gguf_tensor_at(g, i);
        CHECK(kvq_gguf_writer_add_tensor(w2, t->name, t->type, t->ndim, t->ne, t->data, t->nbytes,
                                         &err) == KVQ_OK);
    }
    void *b3 = NULL;
    size_t n3 = 0;
    serialize(w2, &b3, &n3);
    CHECK(n3 == n1 && memcmp(b3, b1, n1) == 0);

    free(b3);
    kvq_gguf_writer_free(w2);
    kvq_gguf_close(g);
    free(b1);
    free(b2);
    for (size_t i = 0; i < n_kv; i++)
        value_free(&vals[i]);
    for (size_t i = 0; i < n_t; i++)
        free(ts[i].data);
    kvq_gguf_writer_free(w);
    return 0;
}
