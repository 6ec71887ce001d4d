/* fuzz_safetensors.c — libFuzzer target for the safetensors reader.
 *
 * Opens the input with kvq_st_open_memory. A failure must carry a consistent error
 * (same status, message prefixed with the label, no handle). A success must satisfy
 * the reader's contract, every view's bytes are read, and the file is re-serialized
 * with the writer: the copy must open to the same tensors and metadata. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/safetensors.h"
#include "kvq/util.h"

#define CHECK(c) do { if (!(c)) abort(); } while (0)

static void check_copy(const kvq_st *st)
{
    kvq_st_writer *w = kvq_st_writer_new();
    CHECK(w);
    size_t n = kvq_st_count(st), nm = kvq_st_meta_count(st);
    for (size_t i = 0; i < n; i++) {
        const kvq_tensor_view *v = kvq_st_tensor(st, i);
        CHECK(kvq_st_writer_declare(w, v->name, v->dtype, v->ndim, v->shape, NULL) == KVQ_OK);
    }
    for (size_t i = 0; i < nm; i++)
        CHECK(kvq_st_writer_set_meta(w, kvq_st_meta_key(st, i), kvq_st_meta_value(st, i), NULL) ==
              KVQ_OK);
    CHECK(kvq_st_writer_begin_buffer(w, NULL) == KVQ_OK);
    for (size_t i = 0; i < n; i++) {
        const kvq_tensor_view *v = kvq_st_tensor(st, i);
        CHECK(kvq_st_writer_write(w, v->data, v->nbytes, NULL) == KVQ_OK);
    }
    CHECK(kvq_st_writer_finish(w, NULL) == KVQ_OK);
    size_t size = 0;
    const void *buf = kvq_st_writer_buffer(w, &size);
    kvq_st *c = NULL;
    CHECK(kvq_st_open_memory(buf, size, "copy", &c, NULL) == KVQ_OK);
    CHECK(kvq_st_count(c) == n && kvq_st_meta_count(c) == nm);
    CHECK(kvq_st_header_size(c) % 8 == 0);
    CHECK(kvq_st_data_size(c) == kvq_st_data_size(st));
    for (size_t i = 0; i < n; i++) {
        const kvq_tensor_view *a = kvq_st_tensor(st, i), *b = kvq_st_tensor(c, i);
        CHECK(strcmp(a->name, b->name) == 0 && a->dtype == b->dtype && a->ndim == b->ndim);
        CHECK(memcmp(a->shape, b->shape, sizeof a->shape) == 0);
        CHECK(a->offset == b->offset && a->nbytes == b->nbytes);
        CHECK(a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0);
    }
    for (size_t i = 0; i < nm; i++) {
        CHECK(strcmp(kvq_st_meta_key(st, i), kvq_st_meta_key(c, i)) == 0);
        CHECK(strcmp(kvq_st_meta_value(st, i), kvq_st_meta_value(c, i)) == 0);
    }
    kvq_st_close(c);
    kvq_st_writer_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvq_st *st = NULL;
    kvq_err err;
    memset(&err, 0, sizeof err);
    kvq_status s = kvq_st_open_memory(data, size, "fuzz", &st, &err);
    if (s != KVQ_OK) {
        CHECK(st == NULL && err.status == s && strncmp(err.msg, "fuzz: ", 6) == 0);
        return 0;
    }
    size_t hs = kvq_st_header_size(st), ds = kvq_st_data_size(st);
    CHECK(hs >= 8 && hs + ds == size);
    const uint8_t *base = data + hs;
    uint64_t expected = 0;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < kvq_st_count(st); i++) {
        const kvq_tensor_view *v = kvq_st_tensor(st, i);
        CHECK(v && v->name && (unsigned)v->dtype < KVQ_DT_COUNT);
        CHECK(v->ndim >= 0 && v->ndim <= KVQ_MAX_DIMS);
        size_t elems = 1;
        for (int d = 0; d < v->ndim; d++) {
            CHECK(v->shape[d] >= 0);
            elems *= (size_t)v->shape[d]; /* cannot overflow when nbytes validated */
        }
        CHECK(elems == 0 ? v->nbytes == 0 : v->nbytes == elems * kvq_dtype_size(v->dtype));
        CHECK(v->offset == expected && (const uint8_t *)v->data == base + v->offset);
        expected += v->nbytes;
        for (size_t b = 0; b < v->nbytes; b++)
            sink ^= ((const uint8_t *)v->data)[b];
        CHECK(kvq_st_find(st, v->name) == v);
    }
    CHECK(expected == ds);
    CHECK(kvq_st_tensor(st, kvq_st_count(st)) == NULL);
    for (size_t i = 0; i < kvq_st_meta_count(st); i++) {
        const char *k = kvq_st_meta_key(st, i), *v = kvq_st_meta_value(st, i);
        CHECK(k && v && kvq_st_meta_get(st, k) == v);
        CHECK(i == 0 || strcmp(kvq_st_meta_key(st, i - 1), k) < 0);
        sink ^= (uint8_t)strlen(v);
    }
    (void)sink;
    /* accepted with a recorded checksum: it is the data's (a mismatch is KVQ_E_CHECKSUM) */
    const char *sum = kvq_st_meta_get(st, KVQ_ST_META_DATA_XXH64);
    if (sum) {
        char want[32];
        snprintf(want, sizeof want, "xxh64:%016llx", (unsigned long long)kvq_xxh64(base, ds, 0));
        CHECK(!strcmp(sum, want));
    }
    check_copy(st);
    kvq_st_close(st);
    return 0;
}
