/* fuzz_artifact_rt.c — libFuzzer round-trip target for the .kvq artifact writer.
 *
 * The input is a little program: a zstd level, tensors (dtype, shape) and metadata
 * derived from its bytes, then the bytes of the data. The payload is serialized with
 * the safetensors writer and encoded; then:
 *   - encoding again gives the same bytes;
 *   - the artifact opens to exactly the payload, tensors and metadata;
 *   - every cut of it fails with TRUNCATED_HEADER (inside the 32-byte header) or
 *     TRUNCATED_DATA (after), and one appended byte is CORRUPT;
 *   - a higher minor version is accepted, another major version is VERSION;
 *   - a flipped bit anywhere either fails or (a bit zstd does not use) gives back
 *     exactly the same payload. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/artifact.h"

#define CHECK(c) do { if (!(c)) abort(); } while (0)
#define MAX_T 6
#define MAX_M 4

typedef struct input {
    const uint8_t *p;
    size_t n;
} input;

static uint8_t take(input *in)
{
    if (!in->n)
        return 0;
    in->n--;
    return *in->p++;
}

static kvq_status open_bytes(const uint8_t *p, size_t n, kvq_artifact **a)
{
    kvq_err e;
    memset(&e, 0, sizeof e);
    kvq_status s = kvq_artifact_open_memory(p, n, "rt", a, &e);
    CHECK(s == KVQ_OK ? *a != NULL : (*a == NULL && e.status == s));
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *bytes, size_t size)
{
    static const int levels[] = {1, 2, 3, -1, -5, 5};
    input in = {bytes, size};
    int level = levels[take(&in) % 6];
    size_t nt = take(&in) % (MAX_T + 1), nm = take(&in) % (MAX_M + 1);

    kvq_st_writer *w = kvq_st_writer_new();
    CHECK(w);
    size_t total = 0;
    for (size_t i = 0; i < nt; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%zu", i);
        kvq_dtype dt = (kvq_dtype)(take(&in) % KVQ_DT_COUNT);
        int ndim = take(&in) % 4;
        int64_t shape[3];
        size_t nbytes = kvq_dtype_size(dt);
        for (int d = 0; d < ndim; d++) {
            shape[d] = take(&in) % 6;
            nbytes *= (size_t)shape[d];
        }
        CHECK(kvq_st_writer_declare(w, name, dt, ndim, shape, NULL) == KVQ_OK);
        total += nbytes;
    }
    for (size_t i = 0; i < nm; i++) {
        char key[16], value[16];
        snprintf(key, sizeof key, "k%zu", i);
        size_t len = take(&in) % 12;
        for (size_t k = 0; k < len; k++)
            value[k] = (char)(0x20 + take(&in) % 0x5F); /* printable ASCII */
        value[len] = '\0';
        CHECK(kvq_st_writer_set_meta(w, key, value, NULL) == KVQ_OK);
    }
    CHECK(kvq_st_writer_begin_buffer(w, NULL) == KVQ_OK);
    uint8_t *data = malloc(total + 1); // [total] tensor bytes, repeating the input
    CHECK(data);
    for (size_t i = 0; i < total; i++)
        data[i] = in.n ? in.p[i % in.n] : (uint8_t)i;
    if (total)
        CHECK(kvq_st_writer_write(w, data, total, NULL) == KVQ_OK);
    CHECK(kvq_st_writer_finish(w, NULL) == KVQ_OK);
    size_t pn = 0;
    const uint8_t *payload = kvq_st_writer_buffer(w, &pn);

    uint8_t *z = NULL, *z2 = NULL;
    size_t zn = 0, zn2 = 0;
    CHECK(kvq_artifact_encode(payload, pn, level, (void **)&z, &zn, NULL) == KVQ_OK);
    CHECK(kvq_artifact_encode(payload, pn, level, (void **)&z2, &zn2, NULL) == KVQ_OK);
    CHECK(zn == zn2 && !memcmp(z, z2, zn));
    free(z2);

    kvq_artifact *a = NULL;
    CHECK(open_bytes(z, zn, &a) == KVQ_OK);
    CHECK(kvq_artifact_payload_size(a) == pn && !memcmp(kvq_artifact_payload_data(a), payload, pn));
    const kvq_st *st = kvq_artifact_payload(a);
    CHECK(kvq_st_count(st) == nt && kvq_st_meta_count(st) == nm);
    for (size_t i = 0, off = 0; i < nt; i++) {
        const kvq_tensor_view *v = kvq_st_tensor(st, i);
        CHECK(v->nbytes == 0 || !memcmp(v->data, data + off, v->nbytes));
        off += v->nbytes;
    }
    kvq_artifact_close(a);

    uint8_t *c = malloc(zn + 1); // [zn + 1] a mutable copy
    CHECK(c);
    size_t cut = zn ? (size_t)((uint64_t)(size * 2654435761u) % zn) : 0;
    CHECK(open_bytes(z, cut, &a) == (cut < 32 ? KVQ_E_TRUNCATED_HEADER : KVQ_E_TRUNCATED_DATA));
    memcpy(c, z, zn);
    c[zn] = (uint8_t)size;
    CHECK(open_bytes(c, zn + 1, &a) == KVQ_E_CORRUPT);
    c[16] = (uint8_t)(1 + size % 200); /* minor version */
    CHECK(open_bytes(c, zn, &a) == KVQ_OK);
    CHECK(kvq_artifact_minor(a) == c[16]);
    kvq_artifact_close(a);
    c[12] = 2; /* major version */
    CHECK(open_bytes(c, zn, &a) == KVQ_E_VERSION);
    memcpy(c, z, zn);
    size_t pos = (size_t)((uint64_t)(size * 40503u + nt) % zn);
    c[pos] ^= (uint8_t)(1u << (size % 8));
    if (open_bytes(c, zn, &a) == KVQ_OK) {
        CHECK(pos >= 16 && pos < 20 ? 1 : pos >= 32); /* only the minor or frame bits */
        CHECK(kvq_artifact_payload_size(a) == pn &&
              !memcmp(kvq_artifact_payload_data(a), payload, pn));
        kvq_artifact_close(a);
    }
    free(c);
    free(z);
    free(data);
    kvq_st_writer_free(w);
    return 0;
}
