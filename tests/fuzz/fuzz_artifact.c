/* fuzz_artifact.c — libFuzzer target for the .kvq artifact reader.
 *
 * Opens the input with kvq_artifact_open_memory. A failure must carry a consistent
 * error (same status, message prefixed with the label, no handle). A success must
 * satisfy the reader's contract: every view's bytes are read, validation runs to a
 * status, and the payload re-encoded at a fast level opens to the same tensors and
 * metadata. Inputs over 16 KiB are skipped: a valid header may promise up to
 * 128 KiB per 3 input bytes, and the fuzzer counts that allocation. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/artifact.h"

#define CHECK(c) do { if (!(c)) abort(); } while (0)

static void check_same(const kvq_st *a, const kvq_st *b)
{
    CHECK(kvq_st_count(a) == kvq_st_count(b) && kvq_st_meta_count(a) == kvq_st_meta_count(b));
    for (size_t i = 0; i < kvq_st_count(a); i++) {
        const kvq_tensor_view *x = kvq_st_tensor(a, i), *y = kvq_st_tensor(b, i);
        CHECK(!strcmp(x->name, y->name) && x->dtype == y->dtype && x->ndim == y->ndim);
        CHECK(!memcmp(x->shape, y->shape, sizeof x->shape) && x->nbytes == y->nbytes);
        CHECK(x->nbytes == 0 || !memcmp(x->data, y->data, x->nbytes));
    }
    for (size_t i = 0; i < kvq_st_meta_count(a); i++) {
        CHECK(!strcmp(kvq_st_meta_key(a, i), kvq_st_meta_key(b, i)));
        CHECK(!strcmp(kvq_st_meta_value(a, i), kvq_st_meta_value(b, i)));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 16384)
        return 0;
    kvq_artifact *a = NULL;
    kvq_err err;
    memset(&err, 0, sizeof err);
    kvq_status s = kvq_artifact_open_memory(data, size, "fuzz", &a, &err);
    if (s != KVQ_OK) {
        CHECK(a == NULL && err.status == s && strncmp(err.msg, "fuzz: ", 6) == 0);
        return 0;
    }
    CHECK(kvq_artifact_major(a) == KVQ_ARTIFACT_MAJOR);
    const kvq_st *st = kvq_artifact_payload(a);
    size_t payload = kvq_artifact_payload_size(a);
    CHECK(kvq_st_header_size(st) + kvq_st_data_size(st) == payload);
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < kvq_st_count(st); i++) {
        const kvq_tensor_view *v = kvq_st_tensor(st, i);
        for (size_t b = 0; b < v->nbytes; b++)
            sink ^= ((const uint8_t *)v->data)[b];
    }
    (void)sink;
    kvq_err ve;
    memset(&ve, 0, sizeof ve);
    kvq_status vs = kvq_artifact_validate(a, &ve);
    CHECK(vs == KVQ_OK || (ve.status == vs && ve.msg[0]));

    /* Re-encoded at a fast level, the payload opens to the same content. */
    void *z = NULL;
    size_t zn = 0;
    CHECK(kvq_artifact_encode(kvq_artifact_payload_data(a), payload, 1, &z, &zn, NULL) ==
          KVQ_OK);
    kvq_artifact *b = NULL;
    CHECK(kvq_artifact_open_memory(z, zn, "copy", &b, NULL) == KVQ_OK);
    CHECK(kvq_artifact_payload_size(b) == payload);
    CHECK(!memcmp(kvq_artifact_payload_data(b), kvq_artifact_payload_data(a), payload));
    check_same(st, kvq_artifact_payload(b));
    kvq_artifact_close(b);
    free(z);
    kvq_artifact_close(a);
    return 0;
}
