/* fuzz_safetensors_rt.c — libFuzzer round-trip target for the safetensors writer.
 *
 * The input is a little program: tensors (name, dtype, shape) and metadata entries
 * derived from its bytes, then the bytes of the data. Each declaration must succeed
 * exactly when its arguments are valid; the file is written to a buffer twice with
 * different chunkings (same bytes required), then read back and compared with the
 * model of what was declared. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/safetensors.h"
#include "kvq/util.h"

#define CHECK(c) do { if (!(c)) abort(); } while (0)
#define MAX_T 8
#define MAX_M 6

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

/* A NUL-terminated string of up to 7 bytes from the input (may be invalid UTF-8). */
static void take_str(input *in, char *out)
{
    size_t len = take(in) % 8;
    for (size_t i = 0; i < len; i++)
        out[i] = (char)take(in);
    out[len] = '\0';
}

typedef struct model_tensor {
    char name[8];
    kvq_dtype dtype;
    int ndim;
    int64_t shape[KVQ_MAX_DIMS];
    size_t nbytes;
} model_tensor;

typedef struct model {
    model_tensor t[MAX_T];
    size_t nt;
    char key[MAX_M][8], value[MAX_M][8];
    size_t nm;
} model;

/* Declares everything in m on a fresh writer, begins a buffer and writes `data`
 * in chunks of `chunk` bytes. */
static kvq_st_writer *emit(const model *m, const uint8_t *data, size_t total, size_t chunk)
{
    kvq_st_writer *w = kvq_st_writer_new();
    CHECK(w);
    for (size_t i = 0; i < m->nt; i++)
        CHECK(kvq_st_writer_declare(w, m->t[i].name, m->t[i].dtype, m->t[i].ndim, m->t[i].shape,
                                    NULL) == KVQ_OK);
    for (size_t i = 0; i < m->nm; i++)
        CHECK(kvq_st_writer_set_meta(w, m->key[i], m->value[i], NULL) == KVQ_OK);
    CHECK(kvq_st_writer_begin_buffer(w, NULL) == KVQ_OK);
    for (size_t off = 0; off < total; off += chunk)
        CHECK(kvq_st_writer_write(w, data + off, total - off < chunk ? total - off : chunk,
                                  NULL) == KVQ_OK);
    if (total) /* one byte too many is refused */
        CHECK(kvq_st_writer_write(w, data, 1, NULL) == KVQ_E_INVALID_ARG);
    CHECK(kvq_st_writer_finish(w, NULL) == KVQ_OK);
    return w;
}

int LLVMFuzzerTestOneInput(const uint8_t *bytes, size_t size)
{
    input in = {bytes, size};
    model m;
    memset(&m, 0, sizeof m);

    /* Declarations: every attempt goes to a probe writer, which must accept exactly
     * the valid ones (valid UTF-8, new, not "__metadata__"). */
    kvq_st_writer *probe = kvq_st_writer_new();
    CHECK(probe);
    size_t attempts = take(&in) % (MAX_T + 1), total = 0;
    for (size_t a = 0; a < attempts; a++) {
        model_tensor *t = &m.t[m.nt];
        memset(t, 0, sizeof *t);
        take_str(&in, t->name);
        uint8_t b = take(&in);
        t->dtype = (kvq_dtype)(b % KVQ_DT_COUNT);
        t->ndim = (b >> 4) % 5;
        if (b == 0xff)
            t->ndim = KVQ_MAX_DIMS;
        t->nbytes = kvq_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) {
            t->shape[d] = take(&in) % (t->ndim > 4 ? 3 : 5);
            t->nbytes *= (size_t)t->shape[d];
        }
        int valid = kvq_utf8_valid(t->name, strlen(t->name)) &&
                    strcmp(t->name, "__metadata__") != 0;
        for (size_t i = 0; i < m.nt && valid; i++)
            valid = strcmp(m.t[i].name, t->name) != 0;
        kvq_status s = kvq_st_writer_declare(probe, t->name, t->dtype, t->ndim, t->shape, NULL);
        CHECK(s == (valid ? KVQ_OK : KVQ_E_INVALID_ARG));
        if (valid) {
            total += t->nbytes;
            m.nt++;
        }
    }
    kvq_st_writer_free(probe);

    /* Metadata: the last value set for a key wins. */
    size_t metas = take(&in) % (MAX_M + 1);
    for (size_t a = 0; a < metas; a++) {
        char k[8], v[8];
        take_str(&in, k);
        take_str(&in, v);
        if (!kvq_utf8_valid(k, strlen(k)) || !kvq_utf8_valid(v, strlen(v)))
            continue;
        size_t i = 0;
        while (i < m.nm && strcmp(m.key[i], k) != 0)
            i++;
        if (i == m.nm)
            memcpy(m.key[m.nm++], k, sizeof k);
        memcpy(m.value[i], v, sizeof v);
    }
    size_t chunk1 = 1 + take(&in) % 17, chunk2 = 1 + take(&in) % 257;

    /* Data: the rest of the input, repeated as needed. */
    uint8_t *data = malloc(total ? total : 1);
    CHECK(data);
    for (size_t i = 0; i < total; i++)
        data[i] = in.n ? in.p[i % in.n] : (uint8_t)i;

    kvq_st_writer *w1 = emit(&m, data, total, chunk1);
    kvq_st_writer *w2 = emit(&m, data, total, chunk2);
    size_t s1 = 0, s2 = 0;
    const uint8_t *b1 = kvq_st_writer_buffer(w1, &s1), *b2 = kvq_st_writer_buffer(w2, &s2);
    CHECK(b1 && b2 && s1 == s2 && memcmp(b1, b2, s1) == 0);

    kvq_st *st = NULL;
    CHECK(kvq_st_open_memory(b1, s1, "rt", &st, NULL) == KVQ_OK);
    CHECK(kvq_st_header_size(st) % 8 == 0 && kvq_st_data_size(st) == total);
    CHECK(kvq_st_count(st) == m.nt);
    size_t off = 0;
    for (size_t i = 0; i < m.nt; i++) {
        const model_tensor *t = &m.t[i];
        const kvq_tensor_view *v = kvq_st_tensor(st, i);
        CHECK(strcmp(v->name, t->name) == 0 && kvq_st_find(st, t->name) == v);
        CHECK(v->dtype == t->dtype && v->ndim == t->ndim);
        CHECK(memcmp(v->shape, t->shape, sizeof t->shape) == 0);
        CHECK(v->offset == off && v->nbytes == t->nbytes);
        CHECK(t->nbytes == 0 || memcmp(v->data, data + off, t->nbytes) == 0);
        off += t->nbytes;
    }
    CHECK(kvq_st_meta_count(st) == m.nm);
    for (size_t i = 0; i < m.nm; i++) {
        const char *v = kvq_st_meta_get(st, m.key[i]);
        CHECK(v && strcmp(v, m.value[i]) == 0);
        CHECK(i == 0 || strcmp(kvq_st_meta_key(st, i - 1), kvq_st_meta_key(st, i)) < 0);
    }
    kvq_st_close(st);
    kvq_st_writer_free(w1);
    kvq_st_writer_free(w2);
    free(data);
    return 0;
}
