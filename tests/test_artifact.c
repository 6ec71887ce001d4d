/* test_artifact.c — the .kvq artifact: round trip, determinism, the exact header bytes,
 * every kind of damage with its exact status, atomic writes, content validation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zstd.h>

#include "helpers/testutil.h"
#include "kvq/util.h"
#include "kvq.h"

/* ==========================================================================
 * fixtures
 * ========================================================================== */

typedef struct buf {
    uint8_t *p;
    size_t n;
} buf;

static buf buf_copy(const void *p, size_t n)
{
    buf b = {malloc(n ? n : 1), n};
    assert_non_null(b.p);
    memcpy(b.p, p, n);
    return b;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    put_u32(p, (uint32_t)v);
    put_u32(p + 4, (uint32_t)(v >> 32));
}

/* Adds a tensor and its data to lists the caller writes after begin. */
typedef struct tensor_spec {
    const char *name;
    kvq_dtype dtype;
    int ndim;
    int64_t shape[2];
    void *data;
    size_t nbytes;
} tensor_spec;

/* Serializes tensors + metadata (key, value pairs, NULL-terminated) with the
 * safetensors writer in buffer mode. */
static buf make_payload(const tensor_spec *t, int nt, const char *const *meta)
{
    kvq_err e = {0};
    kvq_st_writer *w = kvq_st_writer_new();
    assert_non_null(w);
    for (int i = 0; i < nt; i++)
        assert_int_equal(kvq_st_writer_declare(w, t[i].name, t[i].dtype, t[i].ndim, t[i].shape,
                                               &e), KVQ_OK);
    for (int i = 0; meta && meta[i]; i += 2)
        assert_int_equal(kvq_st_writer_set_meta(w, meta[i], meta[i + 1], &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_begin_buffer(w, &e), KVQ_OK);
    for (int i = 0; i < nt; i++)
        assert_int_equal(kvq_st_writer_write(w, t[i].data, t[i].nbytes, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_finish(w, &e), KVQ_OK);
    size_t n = 0;
    const void *p = kvq_st_writer_buffer(w, &n);
    buf b = buf_copy(p, n);
    kvq_st_writer_free(w);
    return b;
}

/* A small payload: three tensors of different dtypes and three metadata keys. */
static float g_a[2][3] = {{1.5f, -2.0f, 3.25f}, {0.0f, 1e-7f, -1e30f}}; // [2, 3]
static int32_t g_b[4] = {7, -8, 2147483647, -2147483647 - 1};           // [4]
static uint16_t g_c = 0x3c00;                                            // [] (f16 1.0)
static const char *const g_meta[] = {"model.architecture", "llama", "seed", "42",
                                     "note", "\xe2\x96\x81 unicode \"quoted\"", NULL};

static buf small_payload(void)
{
    tensor_spec t[] = {
        {"a", KVQ_DT_F32, 2, {2, 3}, g_a, sizeof g_a},
        {"b", KVQ_DT_I32, 1, {4, 0}, g_b, sizeof g_b},
        {"c", KVQ_DT_F16, 0, {0, 0}, &g_c, sizeof g_c},
    };
    return make_payload(t, 3, g_meta);
}

/* A payload of ~160 KB (two zstd blocks) of partly compressible floats. */
static buf large_payload(void)
{
    enum { N = 40000 };
    float *x = malloc(N * sizeof *x); // [N]
    assert_non_null(x);
    kvq_rng r;
    kvq_rng_seed(&r, 1);
    for (int i = 0; i < N; i++)
        x[i] = (float)(int)(kvq_rng_normal(&r) * 8) / 8.0f;
    tensor_spec t[] = {{"x", KVQ_DT_F32, 1, {N, 0}, x, N * sizeof *x}};
    buf b = make_payload(t, 1, g_meta);
    free(x);
    return b;
}

/* 100,000 zero bytes: compresses to a few dozen bytes, content size field of 4 bytes. */
static buf zeros_payload(void)
{
    uint8_t *z = calloc(100000, 1); // [100000]
    assert_non_null(z);
    tensor_spec t[] = {{"z", KVQ_DT_U8, 1, {100000, 0}, z, 100000}};
    buf b = make_payload(t, 1, NULL);
    free(z);
    return b;
}

static buf encode(buf payload, int level)
{
    kvq_err e = {0};
    void *out = NULL;
    size_t n = 0;
    assert_int_equal(kvq_artifact_encode(payload.p, payload.n, level, &out, &n, &e), KVQ_OK);
    buf b = {out, n};
    return b;
}

/* Opens bytes; returns the status (the artifact is closed again). */
static kvq_status open_status(const void *p, size_t n, kvq_err *e)
{
    kvq_artifact *a = NULL;
    kvq_status s = kvq_artifact_open_memory(p, n, "t.kvq", &a, e);
    if (s == KVQ_OK)
        assert_non_null(a);
    else
        assert_null(a);
    kvq_artifact_close(a);
    return s;
}

/* Offset of the zstd frame's content-size field, and its width in bytes. */
static size_t fcs_field(const uint8_t *z, size_t *width)
{
    uint8_t fhd = z[4];
    int single = (fhd >> 5) & 1;
    static const size_t did[4] = {0, 1, 2, 4}, fcs[4] = {0, 2, 4, 8};
    *width = (fhd >> 6) == 0 ? (size_t)single : fcs[fhd >> 6];
    return 5 + (size_t)!single + did[fhd & 3];
}

/* ==========================================================================
 * round trip and determinism
 * ========================================================================== */

static void test_round_trip(void **state)
{
    buf p = small_payload();
    buf z = encode(p, 0);
    kvq_err e = {0};
    kvq_artifact *a = NULL;
    assert_int_equal(kvq_artifact_open_memory(z.p, z.n, "rt.kvq", &a, &e), KVQ_OK);
    assert_int_equal(kvq_artifact_major(a), 1);
    assert_int_equal(kvq_artifact_minor(a), KVQ_ARTIFACT_MINOR);
    assert_int_equal(kvq_artifact_payload_size(a), p.n);
    assert_memory_equal(kvq_artifact_payload_data(a), p.p, p.n);
    const kvq_st *st = kvq_artifact_payload(a);
    assert_int_equal(kvq_st_count(st), 3);
    const kvq_tensor_view *ta = kvq_st_find(st, "a"), *tb = kvq_st_find(st, "b"),
                          *tc = kvq_st_find(st, "c");
    assert_non_null(ta);
    assert_non_null(tb);
    assert_non_null(tc);
    assert_int_equal(ta->dtype, KVQ_DT_F32);
    assert_int_equal(ta->ndim, 2);
    assert_int_equal(ta->shape[0], 2);
    assert_int_equal(ta->shape[1], 3);
    assert_int_equal(ta->nbytes, sizeof g_a);
    assert_memory_equal(ta->data, g_a, sizeof g_a);
    assert_int_equal(tb->dtype, KVQ_DT_I32);
    assert_memory_equal(tb->data, g_b, sizeof g_b);
    assert_int_equal(tc->dtype, KVQ_DT_F16);
    assert_int_equal(tc->ndim, 0);
    assert_memory_equal(tc->data, &g_c, 2);
    assert_int_equal(kvq_st_meta_count(st), 3);
    for (int i = 0; g_meta[i]; i += 2)
        assert_string_equal(kvq_st_meta_get(st, g_meta[i]), g_meta[i + 1]);
    kvq_artifact_close(a);

    /* A larger, multi-block payload at a fast level decodes to the same bytes. */
    buf big = large_payload();
    buf zb = encode(big, 1);
    assert_int_equal(kvq_artifact_open_memory(zb.p, zb.n, "big.kvq", &a, &e), KVQ_OK);
    const kvq_tensor_view *tx = kvq_st_find(kvq_artifact_payload(a), "x");
    assert_non_null(tx);
    assert_int_equal(kvq_st_header_size(kvq_artifact_payload(a)) + tx->nbytes, big.n);
    assert_memory_equal(tx->data, big.p + big.n - tx->nbytes, tx->nbytes);
    kvq_artifact_close(a);
    free(big.p);
    free(zb.p);
    free(z.p);
    free(p.p);
}

static void test_exact_header_bytes(void **state)
{
    buf p = small_payload();
    buf z = encode(p, 0);
    static const uint8_t want[12] = {0x5B, 0x2A, 0x4D, 0x18, 24, 0, 0, 0, 'K', 'V', 'Q', 'A'};
    assert_memory_equal(z.p, want, 12);
    uint8_t ver[12] = {1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}; /* major 1, minor 1, flags 0 */
    assert_memory_equal(z.p + 12, ver, 12);
    uint8_t size[8];
    put_u64(size, p.n);
    assert_memory_equal(z.p + 24, size, 8);
    static const uint8_t zmagic[4] = {0x28, 0xB5, 0x2F, 0xFD};
    assert_memory_equal(z.p + 32, zmagic, 4);
    assert_true(z.p[36] & 0x04); /* content checksum flag */
    assert_int_equal(ZSTD_getFrameContentSize(z.p + 32, z.n - 32), p.n);
    /* zstd itself skips the header frame and decodes the payload. */
    uint8_t *dec = malloc(p.n);
    assert_int_equal(ZSTD_decompress(dec, p.n, z.p, z.n), p.n);
    assert_memory_equal(dec, p.p, p.n);
    free(dec);
    free(z.p);
    free(p.p);
}

static void test_same_bytes_twice(void **state)
{
    buf p = large_payload();
    buf z1 = encode(p, 0), z2 = encode(p, 0), z3 = encode(p, 3);
    assert_int_equal(z1.n, z2.n);
    assert_memory_equal(z1.p, z2.p, z1.n);
    assert_int_equal(z1.n, z3.n); /* 0 means 3 */
    assert_memory_equal(z1.p, z3.p, z1.n);
    kvq_err e = {0};
    const char *f1 = test_path("same1.kvq"), *f2 = test_path("same2.kvq");
    assert_int_equal(kvq_artifact_write(f1, 0, p.p, p.n, 0, &e), KVQ_OK);
    assert_int_equal(kvq_artifact_write(f2, 0, p.p, p.n, 0, &e), KVQ_OK);
    uint8_t *b1, *b2;
    size_t n1, n2;
    assert_int_equal(kvq_read_file(f1, &b1, &n1, &e), KVQ_OK);
    assert_int_equal(kvq_read_file(f2, &b2, &n2, &e), KVQ_OK);
    assert_int_equal(n1, z1.n);
    assert_int_equal(n2, z1.n);
    assert_memory_equal(b1, z1.p, n1);
    assert_memory_equal(b2, z1.p, n2);
    kvq_artifact *a = NULL;
    assert_int_equal(kvq_artifact_open(f1, &a, &e), KVQ_OK);
    assert_int_equal(kvq_artifact_payload_size(a), p.n);
    kvq_artifact_close(a);
    free(b1);
    free(b2);
    free(z1.p);
    free(z2.p);
    free(z3.p);
    free(p.p);
}

static void test_levels(void **state)
{
    buf p = small_payload();
    kvq_err e = {0};
    void *out = (void *)1;
    size_t n = 1;
    assert_int_equal(kvq_artifact_encode(p.p, p.n, 100, &out, &n, &e), KVQ_E_INVALID_ARG);
    assert_null(out);
    assert_int_equal(n, 0);
    assert_non_null(strstr(e.msg, "100"));
    for (int level = -5; level <= 22; level += 9) {
        if (level == 0)
            continue;
        buf z = encode(p, level);
        assert_int_equal(open_status(z.p, z.n, &e), KVQ_OK);
        free(z.p);
    }
    /* The writer refuses a payload that is not safetensors. */
    assert_int_equal(kvq_artifact_encode("not safetensors at all", 22, 0, &out, &n, &e),
                     KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "safetensors"));
    free(p.p);
}

/* ==========================================================================
 * damage: each kind with its exact status
 * ========================================================================== */

static void test_bad_magic_and_tag(void **state)
{
    buf p = small_payload();
    buf z = encode(p, 0);
    kvq_err e = {0};
    buf c = buf_copy(z.p, z.n);
    c.p[0] ^= 1;
    assert_int_equal(open_status(c.p, c.n, &e), KVQ_E_BAD_MAGIC);
    assert_non_null(strstr(e.msg, "t.kvq: "));
    /* Another skippable frame magic (0x184D2A50) is still the wrong magic. */
    memcpy(c.p, z.p, z.n);
    c.p[0] = 0x50;
    assert_int_equal(open_status(c.p, c.n, &e), KVQ_E_BAD_MAGIC);
    /* A bare zstd frame, a GGUF file, a short wrong prefix. */
    assert_int_equal(open_status(z.p + 32, z.n - 32, &e), KVQ_E_BAD_MAGIC);
    assert_int_equal(open_status("GGUF\3\0\0\0", 8, &e), KVQ_E_BAD_MAGIC);
    assert_int_equal(open_status("\x5B\x2B", 2, &e), KVQ_E_BAD_MAGIC);
    /* The tag. */
    memcpy(c.p, z.p, z.n);
    c.p[11] = 'B';
    assert_int_equal(open_status(c.p, c.n, &e), KVQ_E_BAD_MAGIC);
    assert_non_null(strstr(e.msg, "KVQA"));
    assert_int_equal(open_status(c.p, 10, &e), KVQ_E_TRUNCATED_HEADER); /* "KV" matches */
    c.p[9] = 'X';
    assert_int_equal(open_status(c.p, 10, &e), KVQ_E_BAD_MAGIC);
    free(c.p);
    free(z.p);
    free(p.p);
}

static void test_versions(void **state)
{
    buf p = small_payload();
    buf z = encode(p, 0);
    kvq_err e = {0};
    buf c = buf_copy(z.p, z.n);
    put_u32(c.p + 12, 2);
    assert_int_equal(open_status(c.p, c.n, &e), KVQ_E_VERSION);
    assert_non_null(strstr(e.msg, "2.1"));
    put_u32(c.p + 12, 0);
    assert_int_equal(open_status(c.p, c.n, &e), KVQ_E_VERSION);
    /* The version is checked before the frame size: a future major may change it. */
    put_u32(c.p + 12, 3);
    put_u32(c.p + 4, 4);
    assert_int_equal(open_status(c.p, c.n, &e), KVQ_E_VERSION);
    assert_non_null(strstr(e.msg, "3.1"));

    /* The previous minor (1.0: no model.attention keys) is still read. */
    put_u32(c.p + 4, 24);
    put_u32(c.p + 12, 1);
    put_u32(c.p + 16, 0);
    {
        kvq_artifact *a0 = NULL;
        assert_int_equal(kvq_artifact_open_memory(c.p, c.n, "v10.kvq", &a0, &e), KVQ_OK);
        assert_int_equal(kvq_artifact_minor(a0), 0);
        kvq_artifact_close(a0);
    }

    /* A higher minor is accepted and reported. */
    memcpy(c.p, z.p, z.n);
    put_u32(c.p + 16, 7);
    kvq_artifact *a = NULL;
    assert_int_equal(kvq_artifact_open_memory(c.p, c.n, "m.kvq", &a, &e), KVQ_OK);
    assert_int_equal(kvq_artifact_major(a), 1);
    assert_int_equal(kvq_artifact_minor(a), 7);
    kvq_artifact_close(a);

    /* ... also with a longer header frame (fields a later minor may append). */
    buf w = {malloc(z.n + 8), z.n + 8};
    memcpy(w.p, z.p, 32);
    memset(w.p + 32, 0xAB, 8);
    memcpy(w.p + 40, z.p + 32, z.n - 32);
    put_u32(w.p + 4, 32);
    put_u32(w.p + 16, 1);
    assert_int_equal(kvq_artifact_open_memory(w.p, w.n, "m.kvq", &a, &e), KVQ_OK);
    assert_int_equal(kvq_artifact_minor(a), 1);
    assert_int_equal(kvq_artifact_payload_size(a), p.n);
    kvq_artifact_close(a);
    free(w.p);
    free(c.p);
    free(z.p);
    free(p.p);
}

static void test_header_fields(void **state)
{
    buf p = small_payload();
    buf z = encode(p, 0);
    kvq_err e = {0};
    buf c = buf_copy(z.p, z.n);
    put_u32(c.p + 4, 23); /* frame too small for the fields */
    assert_int_equal(open_status(c.p, c.n, &e), KVQ_E_CORRUPT);
    put_u32(c.p + 4, 0xFFFFFFF0u); /* frame larger than the file */
    assert_int_equal(open_status(c.p, c.n, &e), KVQ_E_TRUNCATED_HEADER);
    memcpy(c.p, z.p, z.n);
    put_u32(c.p + 20, 1); /* flags */
    assert_int_equal(open_status(c.p, c.n, &e), KVQ_E_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "flags"));

    /* Payload size lies. */
    memcpy(c.p, z.p, z.n);
    put_u64(c.p + 24, p.n + 1);
    assert_int_equal(open_status(c.p, c.n, &e), KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "payload size"));
    put_u64(c.p + 24, p.n - 1);
    assert_int_equal(open_status(c.p, c.n, &e), KVQ_E_CORRUPT);
    put_u64(c.p + 24, KVQ_ARTIFACT_MAX_PAYLOAD + 1);
    assert_int_equal(open_status(c.p, c.n, &e), KVQ_E_TOO_LARGE);
    put_u64(c.p + 24, UINT64_MAX);
    assert_int_equal(open_status(c.p, c.n, &e), KVQ_E_TOO_LARGE);
    put_u64(c.p + 24, KVQ_ARTIFACT_MAX_PAYLOAD); /* at the limit: the frame disagrees */
    assert_int_equal(open_status(c.p, c.n, &e), KVQ_E_CORRUPT);

    free(c.p);
    free(z.p);
    free(p.p);

    /* Frame content size and header agree on a size the compressed bytes cannot
     * hold: refused before allocating it. */
    p = zeros_payload();
    z = encode(p, 0);
    assert_true(z.n < 200);
    size_t width, off = fcs_field(z.p + 32, &width);
    assert_int_equal(width, 4);
    assert_int_equal(open_status(z.p, z.n, &e), KVQ_OK);
    for (size_t i = 0; i < width; i++)
        z.p[32 + off + i] = 0xFF;
    put_u64(z.p + 24, 0xFFFFFFFFu);
    assert_int_equal(open_status(z.p, z.n, &e), KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "cannot come from"));
    free(z.p);
    free(p.p);
}

static void test_truncated_everywhere(void **state)
{
    buf p = small_payload();
    buf z = encode(p, 0);
    kvq_err e = {0};
    for (size_t n = 0; n < z.n; n++) {
        kvq_status s = open_status(z.p, n, &e);
        if (s != (n < 32 ? KVQ_E_TRUNCATED_HEADER : KVQ_E_TRUNCATED_DATA))
            fail_msg("prefix of %zu bytes: %s (%s)", n, kvq_status_str(s), e.msg);
    }
    assert_int_equal(open_status(z.p, z.n, &e), KVQ_OK);
    /* The same on a multi-block frame, at a few points. */
    buf big = large_payload();
    buf zb = encode(big, 3);
    size_t cuts[] = {32, 33, 36, 40, 1000, zb.n / 2, zb.n - 5, zb.n - 4, zb.n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++)
        assert_int_equal(open_status(zb.p, cuts[i], &e), KVQ_E_TRUNCATED_DATA);
    assert_non_null(strstr(e.msg, "ends inside the compressed payload"));
    free(zb.p);
    free(big.p);
    free(z.p);
    free(p.p);
}

static void test_checksum_and_corruption(void **state)
{
    buf p = large_payload();
    buf z = encode(p, 3);
    kvq_err e = {0};
    buf c = buf_copy(z.p, z.n);
    for (int k = 1; k <= 4; k++) { /* every byte of the stored checksum */
        memcpy(c.p, z.p, z.n);
        c.p[z.n - k] ^= 0x10;
        assert_int_equal(open_status(c.p, c.n, &e), KVQ_E_CHECKSUM);
        assert_non_null(strstr(e.msg, "checksum"));
    }
    /* Flipped bits in the compressed blocks: never accepted with other content. */
    size_t width, start = 32 + fcs_field(z.p + 32, &width) + width;
    int checksum = 0, corrupt = 0;
    for (size_t i = start; i < z.n - 4; i += 97) {
        memcpy(c.p, z.p, z.n);
        c.p[i] ^= (uint8_t)(1u << (i % 8));
        kvq_artifact *a = NULL;
        kvq_status s = kvq_artifact_open_memory(c.p, c.n, "t.kvq", &a, &e);
        if (s == KVQ_OK) { /* possible only if the flip did not change the content */
            const kvq_st *st = kvq_artifact_payload(a);
            const kvq_tensor_view *t = kvq_st_tensor(st, 0);
            assert_memory_equal(t->data, p.p + p.n - t->nbytes, t->nbytes);
            kvq_artifact_close(a);
            continue;
        }
        checksum += s == KVQ_E_CHECKSUM;
        corrupt += s == KVQ_E_CORRUPT;
        if (s != KVQ_E_CHECKSUM && s != KVQ_E_CORRUPT && s != KVQ_E_TRUNCATED_DATA)
            fail_msg("flip at %zu: %s (%s)", i, kvq_status_str(s), e.msg);
    }
    assert_true(checksum + corrupt > (int)((z.n - 4 - start) / 97 / 2));
    free(c.p);
    free(z.p);
    free(p.p);
}

static void test_trailing_bytes(void **state)
{
    buf p = small_payload();
    buf z = encode(p, 0);
    kvq_err e = {0};
    buf c = {malloc(2 * z.n), 0};
    memcpy(c.p, z.p, z.n);
    c.p[z.n] = 0;
    assert_int_equal(open_status(c.p, z.n + 1, &e), KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "1 unexpected byte(s)"));
    /* A second, valid zstd frame (zstd -d would decode both) is garbage too. */
    memcpy(c.p + z.n, z.p + 32, z.n - 32);
    assert_int_equal(open_status(c.p, 2 * z.n - 32, &e), KVQ_E_CORRUPT);
    /* A frame without a content checksum, or without a content size. */
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    for (int variant = 0; variant < 2; variant++) {
        ZSTD_CCtx_reset(cc, ZSTD_reset_session_and_parameters);
        ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, variant == 1);
        ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, variant == 0);
        memcpy(c.p, z.p, 32);
        size_t r = ZSTD_compress2(cc, c.p + 32, z.n, p.p, p.n);
        assert_false(ZSTD_isError(r));
        assert_int_equal(open_status(c.p, 32 + r, &e), KVQ_E_CORRUPT);
        assert_non_null(strstr(e.msg, variant == 0 ? "no content checksum" : "does not record"));
    }
    ZSTD_freeCCtx(cc);
    /* Something that is not a zstd frame after the header. */
    memcpy(c.p, z.p, z.n);
    c.p[32] ^= 0xFF;
    assert_int_equal(open_status(c.p, z.n, &e), KVQ_E_CORRUPT);
    free(c.p);
    free(z.p);
    free(p.p);
}

static void test_payload_errors_pass_through(void **state)
{
    /* A well-formed container around a payload that is not safetensors: the
     * safetensors reader's status comes back. Built by hand (encode refuses). */
    static const char junk[] = "\x05\0\0\0\0\0\0\0{\"a\":"; /* header length 5, JSON cut */
    size_t cap = ZSTD_compressBound(sizeof junk) + 32;
    uint8_t *c = malloc(cap);
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
    size_t r = ZSTD_compress2(cc, c + 32, cap - 32, junk, sizeof junk - 1);
    assert_false(ZSTD_isError(r));
    ZSTD_freeCCtx(cc);
    put_u32(c, KVQ_ARTIFACT_SKIPPABLE_MAGIC);
    put_u32(c + 4, 24);
    memcpy(c + 8, "KVQA", 4);
    put_u32(c + 12, 1);
    put_u32(c + 16, 0);
    put_u32(c + 20, 0);
    put_u64(c + 24, sizeof junk - 1);
    kvq_err e = {0};
    assert_int_equal(open_status(c, 32 + r, &e), KVQ_E_BAD_JSON);
    assert_non_null(strstr(e.msg, "t.kvq"));
    free(c);
}

/* ==========================================================================
 * files
 * ========================================================================== */

/* Entries in the test directory whose name contains `part`. */
static int count_entries(const char *part)
{
    DIR *d = opendir(test_tmpdir());
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strstr(de->d_name, part) != NULL;
    closedir(d);
    return n;
}

static void test_files_and_atomic_write(void **state)
{
    buf p = small_payload();
    kvq_err e = {0};
    kvq_artifact *a = NULL;
    const char *f = test_path("atomic.kvq");
    assert_int_equal(kvq_artifact_open(test_path("missing.kvq"), &a, &e), KVQ_E_NOT_FOUND);
    assert_int_equal(test_write_file(test_path("empty.kvq"), "", 0), 0);
    assert_int_equal(kvq_artifact_open(test_path("empty.kvq"), &a, &e), KVQ_E_TRUNCATED_HEADER);
    assert_int_equal(open_status(NULL, 0, &e), KVQ_E_TRUNCATED_HEADER);
    assert_int_equal(kvq_artifact_open(test_tmpdir(), &a, &e), KVQ_E_IO);
    assert_int_equal(kvq_artifact_write(f, 0, p.p, p.n, 0, &e), KVQ_OK);
    uint8_t *orig;
    size_t orig_n;
    assert_int_equal(kvq_read_file(f, &orig, &orig_n, &e), KVQ_OK);

    /* overwrite = 0 keeps the existing file. */
    buf big = large_payload();
    assert_int_equal(kvq_artifact_write(f, 0, big.p, big.n, 1, &e), KVQ_E_EXISTS);
    /* A bad payload fails before any file is created. */
    assert_int_equal(kvq_artifact_write(test_path("bad.kvq"), 1, "xx", 2, 0, &e),
                     KVQ_E_INVALID_ARG);
    assert_int_not_equal(access(test_path("bad.kvq"), F_OK), 0);
    /* A write that fails half way (file size limit) leaves the old file and no
     * temporary behind. */
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = 4096;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    kvq_status s = kvq_artifact_write(f, 1, big.p, big.n, 1, &e);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    assert_int_equal(s, KVQ_E_IO);
    assert_int_equal(count_entries(".tmp."), 0);
    uint8_t *now;
    size_t now_n;
    assert_int_equal(kvq_read_file(f, &now, &now_n, &e), KVQ_OK);
    assert_int_equal(now_n, orig_n);
    assert_memory_equal(now, orig, orig_n);
    /* ... and with overwrite the new content replaces it. */
    assert_int_equal(kvq_artifact_write(f, 1, big.p, big.n, 1, &e), KVQ_OK);
    assert_int_equal(kvq_artifact_open(f, &a, &e), KVQ_OK);
    assert_int_equal(kvq_artifact_payload_size(a), big.n);
    kvq_artifact_close(a);
    assert_int_equal(count_entries(".tmp."), 0);
    free(now);
    free(orig);
    free(big.p);
    free(p.p);
}

/* ==========================================================================
 * content validation (docs/format.md "Metadata", "Tensors")
 * ========================================================================== */

enum { V_LAYERS = 2, V_KV = 2, V_D = 4, V_K = 4 };

/* A conforming version-1 payload for `method` with G groups, minus the metadata key
 * `drop` (or NULL), with tensor `bad` (or NULL) declared with a wrong shape. */
static buf conforming(const char *method, int G, const char *drop, const char *bad)
{
    static float zeros[V_K * V_D]; // large enough for [K, d] and [d, d]
    const char *meta[] = {
        "model.architecture", "llama", "model.n_layers", "2", "model.n_heads", "4",
        "model.n_kv_heads", "2", "model.head_dim", "4", "model.rope.base", "10000",
        "model.rope.layout", "interleaved", "model.rope.scaling", "none", "method", method,
        "codebook_size", "4", "groups", G == 1 ? "1" : "2", "wrope.w", "64", "wrope.b", "2048",
        "seed", "18446744073709551615", "provenance.tool_version", "kvq test", NULL};
    const char *kept[64];
    int nk = 0;
    for (int i = 0; meta[i]; i += 2)
        if (!drop || strcmp(meta[i], drop)) {
            kept[nk++] = meta[i];
            kept[nk++] = meta[i + 1];
        }
    kept[nk] = NULL;
    static char names[64][64];
    tensor_spec t[64];
    int nt = 0;
    int qa = !strcmp(method, "qavq") || !strcmp(method, "qa-vq");
    for (int l = 0; l < V_LAYERS; l++)
        for (int h = 0; h < V_KV; h++) {
            const char *kinds[4];
            int nkind = 0;
            if (qa) {
                kinds[nkind++] = "L";
                kinds[nkind++] = "Linv";
            }
            if (G == 1) {
                if (qa)
                    kinds[nkind++] = "Cz";
                kinds[nkind++] = "codebook";
            }
            for (int k = 0; k < nkind; k++) {
                int sq = !strcmp(kinds[k], "L") || !strcmp(kinds[k], "Linv");
                snprintf(names[nt], sizeof names[nt], "layer.%d.head.%d.%s", l, h, kinds[k]);
                t[nt] = (tensor_spec){names[nt], KVQ_DT_F32, 2, {sq ? V_D : V_K, V_D}, zeros, 0};
                nt++;
            }
            for (int g = 0; G > 1 && g < G; g++) {
                snprintf(names[nt], sizeof names[nt], "layer.%d.head.%d.group.%d.%s", l, h, g,
                         qa ? "Cz" : "codebook");
                t[nt] = (tensor_spec){names[nt], KVQ_DT_F32, 2, {V_K, V_D / G}, zeros, 0};
                nt++;
            }
        }
    for (int i = 0; i < nt; i++) {
        if (bad && !strcmp(t[i].name, bad))
            t[i].shape[1] = 1;
        t[i].nbytes = (size_t)(t[i].shape[0] * t[i].shape[1]) * sizeof(float);
    }
    return make_payload(t, nt, kept);
}

static kvq_status validate_status(buf payload, kvq_err *e)
{
    buf z = encode(payload, 1);
    kvq_artifact *a = NULL;
    assert_int_equal(kvq_artifact_open_memory(z.p, z.n, "v.kvq", &a, e), KVQ_OK);
    kvq_status s = kvq_artifact_validate(a, e);
    kvq_artifact_close(a);
    free(z.p);
    free(payload.p);
    return s;
}

static void test_validate(void **state)
{
    kvq_err e = {0};
    assert_int_equal(validate_status(conforming("qavq", 1, NULL, NULL), &e), KVQ_OK);
    assert_int_equal(validate_status(conforming("qavq", 2, NULL, NULL), &e), KVQ_OK);
    assert_int_equal(validate_status(conforming("vq", 1, NULL, NULL), &e), KVQ_OK);
    assert_int_equal(validate_status(conforming("vq", 2, NULL, NULL), &e), KVQ_OK);
    assert_int_equal(validate_status(conforming("vq-postrope", 1, NULL, NULL), &e), KVQ_OK);
    /* The old spellings of artifacts written before the names were unified. */
    assert_int_equal(validate_status(conforming("qa-vq", 1, NULL, NULL), &e), KVQ_OK);
    assert_int_equal(validate_status(conforming("qa-vq", 2, NULL, NULL), &e), KVQ_OK);
    assert_int_equal(validate_status(conforming("post-rope-vq", 1, NULL, NULL), &e), KVQ_OK);
    assert_int_equal(validate_status(conforming("qa-vq", 1, NULL, "layer.1.head.0.Linv"), &e),
                     KVQ_E_SHAPE_MISMATCH);

    assert_int_equal(validate_status(conforming("qavq", 1, "model.n_kv_heads", NULL), &e),
                     KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "\"model.n_kv_heads\""));
    assert_int_equal(validate_status(conforming("vq", 1, "provenance.tool_version", NULL), &e),
                     KVQ_E_CORRUPT);
    assert_int_equal(validate_status(conforming("vq", 1, "seed", NULL), &e), KVQ_E_CORRUPT);
    assert_int_equal(validate_status(conforming("magic-vq", 1, NULL, NULL), &e),
                     KVQ_E_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "magic-vq"));
    assert_int_equal(validate_status(conforming("qavq", 1, NULL, "layer.1.head.0.Linv"), &e),
                     KVQ_E_SHAPE_MISMATCH);
    assert_non_null(strstr(e.msg, "layer.1.head.0.Linv"));
    assert_int_equal(validate_status(conforming("vq", 2, NULL, "layer.1.head.1.group.1.codebook"),
                                     &e), KVQ_E_SHAPE_MISMATCH);
    /* No method key at all. */
    buf p = conforming("vq", 1, "method", NULL);
    {
        kvq_artifact *a = NULL;
        buf z = encode(p, 1);
        assert_int_equal(kvq_artifact_open_memory(z.p, z.n, "v.kvq", &a, &e), KVQ_OK);
        assert_int_equal(kvq_artifact_validate(a, &e), KVQ_E_CORRUPT);
        assert_non_null(strstr(e.msg, "\"method\""));
        kvq_artifact_close(a);
        free(z.p);
    }
    free(p.p);
    /* A method "none" artifact needs only the identity. */
    static const char *const none_meta[] = {
        "model.architecture", "qwen2", "model.n_layers", "3", "model.n_heads", "6",
        "model.n_kv_heads", "3", "model.head_dim", "8", "model.rope.base", "1e6",
        "model.rope.layout", "half", "model.rope.scaling", "linear", "model.rope.factor", "2",
        "method", "none", "provenance.tool_version", "kvq 0.1.0", NULL};
    float alpha[3][3] = {{0}}; // [n_layers, n_kv_heads]
    float alpha_bad[2] = {0};  // [2]: neither [] nor [3, 3]
    tensor_spec th[] = {{"thresholds.leankv.alpha_h", KVQ_DT_F32, 2, {3, 3}, alpha, sizeof alpha},
                        {"thresholds.leankv.alpha_l", KVQ_DT_F32, 0, {0, 0}, alpha, 4}};
    assert_int_equal(validate_status(make_payload(th, 2, none_meta), &e), KVQ_OK);
    assert_int_equal(validate_status(make_payload(th, 1, none_meta), &e), KVQ_E_CORRUPT);
    tensor_spec thb[] = {{"thresholds.leankv.alpha_h", KVQ_DT_F32, 1, {2, 0}, alpha_bad, 8},
                         {"thresholds.leankv.alpha_l", KVQ_DT_F32, 0, {0, 0}, alpha, 4}};
    assert_int_equal(validate_status(make_payload(thb, 2, none_meta), &e), KVQ_E_SHAPE_MISMATCH);
    /* linear scaling without its factor */
    const char *no_factor[32];
    int k = 0;
    for (int i = 0; none_meta[i]; i += 2)
        if (strcmp(none_meta[i], "model.rope.factor")) {
            no_factor[k++] = none_meta[i];
            no_factor[k++] = none_meta[i + 1];
        }
    no_factor[k] = NULL;
    assert_int_equal(validate_status(make_payload(NULL, 0, no_factor), &e), KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "model.rope.factor"));
}

static int teardown(void **state)
{
    test_tmpdir_cleanup();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_exact_header_bytes),
        cmocka_unit_test(test_same_bytes_twice),
        cmocka_unit_test(test_levels),
        cmocka_unit_test(test_bad_magic_and_tag),
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_header_fields),
        cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_checksum_and_corruption),
        cmocka_unit_test(test_trailing_bytes),
        cmocka_unit_test(test_payload_errors_pass_through),
        cmocka_unit_test(test_files_and_atomic_write),
        cmocka_unit_test(test_validate),
    };
    return cmocka_run_group_tests_name("artifact", tests, NULL, teardown);
}
