/* fuzz_gguf.c — libFuzzer target for the GGUF reader: open the input from memory,
 * walk every key/value (nested arrays too) and convert the first rows of every tensor,
 * checking the fast conversion against the scalar reference. Any inconsistency aborts.
 * Also built as a plain corpus replayer (tests/fuzz/replay_main.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/gguf.h"
#include "kvq/half.h"
#include "kvq/quant.h"

#define CHECK(x) do { if (!(x)) abort(); } while (0)

static uint64_t walk(const kvq_gguf_value *v, int depth)
{
    CHECK(depth <= KVQ_GGUF_MAX_NESTING);
    uint64_t h = (uint64_t)v->type;
    switch (v->type) {
    case KVQ_GGUF_STRING:
        CHECK(v->v.str.s != NULL && v->v.str.s[v->v.str.len] == '\0');
        for (uint64_t i = 0; i < v->v.str.len; i++)
            h = h * 31 + (uint8_t)v->v.str.s[i];
        break;
    case KVQ_GGUF_ARRAY:
        CHECK(v->v.arr.n == 0 || v->v.arr.items != NULL);
        for (uint64_t i = 0; i < v->v.arr.n; i++) {
            CHECK(v->v.arr.items[i].type == v->v.arr.type);
            h += walk(&v->v.arr.items[i], depth + 1);
        }
        break;
    case KVQ_GGUF_BOOL:
        CHECK(v->v.u <= 1);
        h += v->v.u;
        break;
    default:
        h += v->v.u; /* the union's bits, whatever the type */
        break;
    }
    return h;
}

/* Reference conversion of n elements of a supported type, for comparison. */
static void reference_rows(const kvq_gguf_tensor *t, int64_t nrows, float *out)
{
    kvq_err err = {0};
    CHECK(kvq_dequantize_ref(t->type, t->data, out, (size_t)(nrows * t->ne[0]), &err) == KVQ_OK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvq_gguf *g = NULL;
    kvq_err err = {0};
    if (kvq_gguf_open_memory(data, size, "fuzz", &g, &err) != KVQ_OK) {
        CHECK(g == NULL && err.status != KVQ_OK && err.msg[0] != '\0');
        return 0;
    }
    CHECK(kvq_gguf_version(g) == 2 || kvq_gguf_version(g) == 3);
    const uint64_t align = kvq_gguf_alignment(g);
    CHECK(align != 0 && (align & (align - 1)) == 0);
    CHECK(kvq_gguf_data_offset(g) % align == 0);

    volatile uint64_t sink = 0;
    for (size_t i = 0; i < kvq_gguf_kv_count(g); i++) {
        const kvq_gguf_kv *kv = kvq_gguf_kv_at(g, i);
        CHECK(kv && kv->key && kv->key[0]);
        CHECK(kvq_gguf_get(g, kv->key) == &kv->value);
        sink += walk(&kv->value, 0);
        uint64_t u;
        double d;
        sink += (uint64_t)kvq_gguf_get_u64(g, kv->key, &u) + (uint64_t)kvq_gguf_get_f64(g, kv->key, &d);
        const char *s = kvq_gguf_get_str(g, kv->key);
        CHECK((s != NULL) == (kv->value.type == KVQ_GGUF_STRING));
    }
    CHECK(kvq_gguf_kv_at(g, kvq_gguf_kv_count(g)) == NULL);

    for (size_t i = 0; i < kvq_gguf_tensor_count(g); i++) {
        const kvq_gguf_tensor *t = kvq_gguf_tensor_at(g, i);
        CHECK(t && kvq_gguf_find_tensor(g, t->name) == t);
        CHECK(t->ndim >= 1 && t->ndim <= 4);
        CHECK(t->offset % align == 0);
        CHECK(kvq_gguf_data_offset(g) + t->offset + t->nbytes <= size);
        const int64_t rows = kvq_gguf_tensor_rows(t);
        CHECK(rows >= 0);
        const int64_t nrows = rows < 2 ? rows : 2;
        const size_t n = (size_t)(nrows * t->ne[0]); /* fits: the rows lie in the file */
        float *out = malloc((n ? n : 1) * sizeof *out), *ref = malloc((n ? n : 1) * sizeof *ref);
        CHECK(out && ref);
        const kvq_status st = kvq_gguf_rows_to_f32(t, 0, nrows, out, &err);
        const int convertible = kvq_quant_supported(t->type);
        CHECK(st == (convertible ? KVQ_OK : KVQ_E_UNSUPPORTED));
        if (st == KVQ_OK && n) {
            reference_rows(t, nrows, ref);
            CHECK(memcmp(out, ref, n * sizeof *out) == 0);
        }
        CHECK(kvq_gguf_rows_to_f32(t, rows, 1, out, &err) == (convertible ? KVQ_E_INVALID_ARG
                                                                          : KVQ_E_UNSUPPORTED));
        free(out);
        free(ref);
    }
    kvq_gguf_close(g);
    return 0;
}
