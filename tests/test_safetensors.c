/* test_safetensors.c — reader validation (one exact status per kind of corruption),
 * writer round trips of every dtype, exact output bytes, determinism, atomicity. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers/testutil.h"
#include "kvq/safetensors.h"
#include "kvq/util.h"

/* ---- helpers ------------------------------------------------------------------ */

/* A file image: u64 LE strlen(hdr) (or hlen_override when non-zero), hdr, then
 * `data_len` data bytes (0, 1, 2, ...). malloc'd; *len receives the size. */
static uint8_t *image_ex(const char *hdr, size_t hdr_len, uint64_t hlen_field, size_t data_len,
                         size_t *len)
{
    size_t n = 8 + hdr_len + data_len;
    uint8_t *b = malloc(n ? n : 1);
    assert_non_null(b);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(hlen_field >> (8 * i));
    memcpy(b + 8, hdr, hdr_len);
    for (size_t i = 0; i < data_len; i++)
        b[8 + hdr_len + i] = (uint8_t)i;
    *len = n;
    return b;
}

static uint8_t *image(const char *hdr, size_t data_len, size_t *len)
{
    return image_ex(hdr, strlen(hdr), strlen(hdr), data_len, len);
}

/* Opens hdr + data_len bytes from memory and expects `want`; when `msg` is non-NULL
 * the error message must contain it. */
static void expect_open(const char *hdr, size_t data_len, kvq_status want, const char *msg)
{
    size_t len;
    uint8_t *b = image(hdr, data_len, &len);
    kvq_st *st = (kvq_st *)1;
    kvq_err e = {0};
    kvq_status s = kvq_st_open_memory(b, len, "t.st", &st, &e);
    if (s != want || (msg && !strstr(e.msg, msg)))
        print_error("header %s\n  got %d (%s) '%s', want %d '%s'\n", hdr, s, kvq_status_str(s),
                    e.msg, want, msg ? msg : "");
    assert_int_equal(s, want);
    if (want != KVQ_OK) {
        assert_null(st);
        assert_int_equal(e.status, want);
        assert_memory_equal(e.msg, "t.st: ", 6);
    }
    if (msg)
        assert_non_null(strstr(e.msg, msg));
    kvq_st_close(st);
    free(b);
}

static void fill_pattern(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (uint8_t)(seed >> 24);
    }
}

/* ---- dtypes ---------------------------------------------------------------------- */

static void test_dtypes(void **state)
{
    static const char *names[KVQ_DT_COUNT] = {"BOOL", "U8",  "I8",  "F8_E4M3", "F8_E5M2",
                                              "I16",  "U16", "F16", "BF16",    "I32",
                                              "U32",  "F32", "I64", "U64",     "F64"};
    static const size_t sizes[KVQ_DT_COUNT] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};
    for (int i = 0; i < KVQ_DT_COUNT; i++) {
        kvq_dtype t = KVQ_DT_COUNT;
        assert_string_equal(kvq_dtype_name((kvq_dtype)i), names[i]);
        assert_int_equal(kvq_dtype_size((kvq_dtype)i), sizes[i]);
        assert_int_equal(kvq_dtype_from_name(names[i], &t), 0);
        assert_int_equal(t, i);
    }
    kvq_dtype t = KVQ_DT_F32;
    assert_int_equal(kvq_dtype_from_name("F4", &t), -1);
    assert_int_equal(kvq_dtype_from_name("f32", &t), -1);
    assert_int_equal(kvq_dtype_from_name(NULL, &t), -1);
    assert_int_equal(t, KVQ_DT_F32);
    assert_int_equal(kvq_dtype_size(KVQ_DT_COUNT), 0);
    assert_string_equal(kvq_dtype_name(KVQ_DT_COUNT), "?");
}

/* ---- reading valid files ------------------------------------------------------------ */

static void test_read_valid(void **state)
{
    /* Tensors listed out of offset order; the reader returns them in offset order. */
    const char *hdr = "{\"b\":{\"dtype\":\"I16\",\"shape\":[3],\"data_offsets\":[8,14]},"
                      "\"__metadata__\":{\"z\":\"last\",\"a\":\"first\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[14,15]}}  \n ";
    size_t len;
    uint8_t *b = image(hdr, 15, &len);
    kvq_st *st = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_st_open_memory(b, len, "m", &st, &e), KVQ_OK);
    assert_int_equal(kvq_st_count(st), 3);
    assert_int_equal(kvq_st_header_size(st), 8 + strlen(hdr));
    assert_int_equal(kvq_st_data_size(st), 15);
    const uint8_t *data = b + 8 + strlen(hdr);

    const kvq_tensor_view *a = kvq_st_tensor(st, 0);
    assert_string_equal(a->name, "a");
    assert_int_equal(a->dtype, KVQ_DT_F32);
    assert_int_equal(a->ndim, 1);
    assert_int_equal(a->shape[0], 2);
    assert_int_equal(a->nbytes, 8);
    assert_int_equal(a->offset, 0);
    assert_ptr_equal(a->data, data);

    const kvq_tensor_view *bt = kvq_st_tensor(st, 1);
    assert_string_equal(bt->name, "b");
    assert_int_equal(bt->dtype, KVQ_DT_I16);
    assert_int_equal(bt->nbytes, 6);
    assert_ptr_equal(bt->data, data + 8);

    const kvq_tensor_view *sc = kvq_st_tensor(st, 2);
    assert_string_equal(sc->name, "s");
    assert_int_equal(sc->ndim, 0);
    assert_int_equal(sc->nbytes, 1);
    assert_int_equal(*(const uint8_t *)sc->data, 14);
    assert_null(kvq_st_tensor(st, 3));

    assert_ptr_equal(kvq_st_find(st, "a"), a);
    assert_ptr_equal(kvq_st_find(st, "b"), bt);
    assert_ptr_equal(kvq_st_find(st, "s"), sc);
    assert_null(kvq_st_find(st, "c"));
    assert_null(kvq_st_find(st, "__metadata__"));

    assert_int_equal(kvq_st_meta_count(st), 2);
    assert_string_equal(kvq_st_meta_key(st, 0), "a");
    assert_string_equal(kvq_st_meta_value(st, 0), "first");
    assert_string_equal(kvq_st_meta_key(st, 1), "z");
    assert_string_equal(kvq_st_meta_get(st, "z"), "last");
    assert_null(kvq_st_meta_get(st, "y"));
    assert_null(kvq_st_meta_key(st, 2));
    kvq_st_close(st);
    kvq_st_close(NULL);
    free(b);
}

static void test_read_edge_cases(void **state)
{
    /* no tensors at all */
    expect_open("{}", 0, KVQ_OK, NULL);
    expect_open("  {  }  ", 0, KVQ_OK, NULL);
    expect_open("{\"__metadata__\":{}}", 0, KVQ_OK, NULL);
    /* zero-size tensors, several at one offset, and at the very end */
    expect_open("{\"z1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                "\"z2\":{\"dtype\":\"F64\",\"shape\":[5,0,3],\"data_offsets\":[0,0]},"
                "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                "\"z3\":{\"dtype\":\"I8\",\"shape\":[0],\"data_offsets\":[4,4]}}",
                4, KVQ_OK, NULL);
    /* a zero dim makes huge other dims harmless */
    expect_open("{\"z\":{\"dtype\":\"F64\",\"shape\":[4503599627370495,0,4503599627370495],"
                "\"data_offsets\":[0,0]}}",
                0, KVQ_OK, NULL);
    /* integral numbers in float notation are accepted */
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":[4.0],\"data_offsets\":[0,4e0]}}", 4, KVQ_OK,
                NULL);
    /* 8 dims is the maximum */
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[0,2]}}", 2,
                KVQ_OK, NULL);

    /* escaped names decode; zero-size tensors keep header order among themselves */
    const char *hdr = "{\"q\\\"\\u00e9\\n\":"
                      "{\"dtype\":\"BOOL\",\"shape\":[0],\"data_offsets\":[0,0]},"
                      "\"e\":{\"dtype\":\"BOOL\",\"shape\":[0],\"data_offsets\":[0,0]}}";
    size_t len;
    uint8_t *b = image(hdr, 0, &len);
    kvq_st *st = NULL;
    assert_int_equal(kvq_st_open_memory(b, len, "m", &st, NULL), KVQ_OK);
    assert_int_equal(kvq_st_count(st), 2);
    assert_string_equal(kvq_st_tensor(st, 0)->name, "q\"\xc3\xa9\n");
    assert_string_equal(kvq_st_tensor(st, 1)->name, "e");
    assert_non_null(kvq_st_find(st, "q\"\xc3\xa9\n"));
    kvq_st_close(st);
    free(b);
}

/* ---- every kind of corruption --------------------------------------------------------- */

static void test_truncated_and_too_large(void **state)
{
    kvq_st *st = NULL;
    kvq_err e = {0};
    uint8_t small[7] = {2, 0, 0, 0, 0, 0, 0};
    assert_int_equal(kvq_st_open_memory(NULL, 0, "t.st", &st, &e), KVQ_E_TRUNCATED_HEADER);
    assert_string_equal(e.msg, "t.st: 0 bytes, shorter than the 8-byte header length");
    assert_int_equal(kvq_st_open_memory(small, 7, "t.st", &st, &e), KVQ_E_TRUNCATED_HEADER);
    assert_null(st);

    size_t len;
    /* N absurd: above the 100 MiB limit (checked before the file size) */
    uint8_t *b = image_ex("{}", 2, (uint64_t)KVQ_ST_MAX_HEADER + 1, 0, &len);
    assert_int_equal(kvq_st_open_memory(b, len, "t.st", &st, &e), KVQ_E_TOO_LARGE);
    assert_non_null(strstr(e.msg, "104857601"));
    free(b);
    b = image_ex("{}", 2, UINT64_MAX, 0, &len);
    assert_int_equal(kvq_st_open_memory(b, len, "t.st", &st, &e), KVQ_E_TOO_LARGE);
    free(b);
    /* N plausible but the file ends inside the header */
    b = image_ex("{}", 2, 3, 0, &len);
    assert_int_equal(kvq_st_open_memory(b, len, "t.st", &st, &e), KVQ_E_TRUNCATED_HEADER);
    assert_string_equal(e.msg, "t.st: header length 3 but only 2 bytes follow");
    free(b);
    b = image_ex("{}", 2, KVQ_ST_MAX_HEADER, 0, &len);
    assert_int_equal(kvq_st_open_memory(b, len, "t.st", &st, &e), KVQ_E_TRUNCATED_HEADER);
    free(b);
    /* a NUL byte in the header (cJSON would take it for whitespace) */
    b = image_ex("{}\0 ", 4, 4, 0, &len);
    assert_int_equal(kvq_st_open_memory(b, len, "t.st", &st, &e), KVQ_E_BAD_JSON);
    free(b);
    /* N = 0: an empty header is not JSON */
    b = image_ex("", 0, 0, 0, &len);
    assert_int_equal(kvq_st_open_memory(b, len, "t.st", &st, &e), KVQ_E_BAD_JSON);
    free(b);
}

static void test_bad_utf8_and_json(void **state)
{
    expect_open("{\"\xff\":{}}", 0, KVQ_E_BAD_UTF8, "not valid UTF-8");
    expect_open("{\"\xc0\xaf\":{}}", 0, KVQ_E_BAD_UTF8, NULL); /* overlong */
    expect_open("{\"\xed\xa0\x80\":{}}", 0, KVQ_E_BAD_UTF8, NULL); /* surrogate */

    expect_open("{", 0, KVQ_E_BAD_JSON, NULL);
    expect_open("{\"a\":}", 0, KVQ_E_BAD_JSON, NULL);
    expect_open("[]", 0, KVQ_E_BAD_JSON, "not a JSON object");
    expect_open("\"x\"", 0, KVQ_E_BAD_JSON, "not a JSON object");
    expect_open("{} x", 0, KVQ_E_BAD_JSON, NULL);
    expect_open("{}{}", 0, KVQ_E_BAD_JSON, "trailing");
    expect_open("{}\x01", 0, KVQ_E_BAD_JSON, NULL);        /* cJSON would skip it */
    expect_open("\xef\xbb\xbf{}", 0, KVQ_E_BAD_JSON, NULL); /* BOM */
    expect_open("{\"a\tb\":1}", 0, KVQ_E_BAD_JSON, "control character");
    expect_open("{\"a\\x\":1}", 0, KVQ_E_BAD_JSON, "bad escape");
    expect_open("{\"a\\u12G4\":1}", 0, KVQ_E_BAD_JSON, "bad \\u escape");
    expect_open("{\"a\\ud800\":1}", 0, KVQ_E_BAD_JSON, NULL); /* lone surrogate */
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":[01],\"data_offsets\":[0,1]}}", 1,
                KVQ_E_BAD_JSON, "malformed number");
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":[+1],\"data_offsets\":[0,1]}}", 1,
                KVQ_E_BAD_JSON, "unexpected byte");
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":[1.],\"data_offsets\":[0,1]}}", 1,
                KVQ_E_BAD_JSON, "malformed number");
    expect_open("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                KVQ_E_UNSUPPORTED, "\\u0000");

    /* structure */
    expect_open("{\"a\":[]}", 0, KVQ_E_BAD_JSON, "tensor 'a': entry is not an object");
    expect_open("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, KVQ_E_BAD_JSON,
                "missing 'dtype'");
    expect_open("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, KVQ_E_BAD_JSON,
                "missing 'shape'");
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, KVQ_E_BAD_JSON,
                "missing 'data_offsets'");
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1,
                KVQ_E_BAD_JSON, "unknown key 'x'");
    expect_open("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                1, KVQ_E_BAD_JSON, "duplicate key 'dtype'");
    expect_open("{\"a\":{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, KVQ_E_BAD_JSON,
                "dtype is not a string");
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1,
                KVQ_E_BAD_JSON, "shape is not an array");
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1,
                KVQ_E_BAD_JSON, "data_offsets");
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":0}}", 1, KVQ_E_BAD_JSON,
                "data_offsets");
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":[\"1\"],\"data_offsets\":[0,1]}}", 1,
                KVQ_E_BAD_JSON, "not a number");
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1,
                KVQ_E_BAD_JSON, "shape dim -1 is negative");
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1,
                KVQ_E_BAD_JSON, "not an integer");
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1,
                KVQ_E_BAD_JSON, "negative");
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,null]}}", 1,
                KVQ_E_BAD_JSON, NULL);
    /* metadata */
    expect_open("{\"__metadata__\":{\"k\":1}}", 0, KVQ_E_BAD_JSON,
                "__metadata__ 'k' is not a string");
    expect_open("{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", 0, KVQ_E_BAD_JSON, NULL);
    expect_open("{\"__metadata__\":[\"k\"]}", 0, KVQ_E_BAD_JSON, "not an object");
    expect_open("{\"__metadata__\":null}", 0, KVQ_E_BAD_JSON, "not an object");
}

static void test_bad_tensor_info(void **state)
{
    expect_open("{\"x\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1,
                KVQ_E_UNSUPPORTED, "tensor 'x': unknown dtype 'F4'");
    expect_open("{\"x\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
                KVQ_E_UNSUPPORTED, "'C64'");
    expect_open("{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
                1, KVQ_E_UNSUPPORTED, "9 dims");
    /* sizes */
    expect_open("{\"x\":{\"dtype\":\"U8\",\"shape\":[9007199254740992],\"data_offsets\":[0,1]}}",
                1, KVQ_E_TOO_LARGE, "not below 2^53");
    expect_open("{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1e300]}}", 1,
                KVQ_E_TOO_LARGE, NULL);
    expect_open("{\"x\":{\"dtype\":\"F64\",\"shape\":[4503599627370495,4503599627370495],"
                "\"data_offsets\":[0,8]}}",
                8, KVQ_E_TOO_LARGE, "overflows");
    expect_open("{\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[16,0]}}", 16,
                KVQ_E_CORRUPT, "reversed");
    /* the message from the brief, exactly */
    size_t len;
    uint8_t *b = image("{\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 12,
                       &len);
    kvq_st *st = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_st_open_memory(b, len, "model.safetensors", &st, &e),
                     KVQ_E_SHAPE_MISMATCH);
    assert_string_equal(e.msg, "model.safetensors: tensor 'x': data_offsets [0, 12] but F32 "
                               "[2,2] needs 16 bytes");
    free(b);
    expect_open("{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,4]}}", 4,
                KVQ_E_SHAPE_MISMATCH, "F64 [] needs 8 bytes");
}

static void test_bad_layout(void **state)
{
    const char *ab_fmt = "{\"a\":{\"dtype\":\"U8\",\"shape\":[%d],\"data_offsets\":[%d,%d]},"
                         "\"b\":{\"dtype\":\"U8\",\"shape\":[%d],\"data_offsets\":[%d,%d]}}";
    char h[512];
    /* duplicates */
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                2, KVQ_E_CORRUPT, "duplicate tensor name 'a'");
    expect_open("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, KVQ_E_CORRUPT,
                "duplicate __metadata__ key 'k'");
    expect_open("{\"__metadata__\":{},\"__metadata__\":{}}", 0, KVQ_E_CORRUPT,
                "duplicate __metadata__");
    /* overlap */
    snprintf(h, sizeof h, ab_fmt, 8, 0, 8, 8, 4, 12);
    expect_open(h, 12, KVQ_E_OVERLAP, "tensor 'b': data_offsets [4, 12] overlap");
    snprintf(h, sizeof h, ab_fmt, 8, 0, 8, 8, 0, 8); /* same range twice */
    expect_open(h, 8, KVQ_E_OVERLAP, NULL);
    expect_open("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
                "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]}}",
                8, KVQ_E_OVERLAP, "tensor 'z'");
    /* hole inside the data section */
    snprintf(h, sizeof h, ab_fmt, 4, 0, 4, 4, 8, 12);
    expect_open(h, 12, KVQ_E_CORRUPT, "leave a hole at 4");
    snprintf(h, sizeof h, ab_fmt, 4, 4, 8, 4, 8, 12); /* nothing at 0 */
    expect_open(h, 12, KVQ_E_CORRUPT, "hole at 0");
    /* hole before a tensor that ends outside the data section */
    snprintf(h, sizeof h, ab_fmt, 4, 0, 4, 4, 100, 104);
    expect_open(h, 4, KVQ_E_OUT_OF_BOUNDS, "end past the data section");
    snprintf(h, sizeof h, ab_fmt, 4, 0, 4, 4, 6, 10); /* starts inside, ends outside */
    expect_open(h, 8, KVQ_E_OUT_OF_BOUNDS, NULL);
    /* tiled but the file is short: truncated data */
    snprintf(h, sizeof h, ab_fmt, 4, 0, 4, 4, 4, 8);
    expect_open(h, 7, KVQ_E_TRUNCATED_DATA, "tensors need 8 data bytes but the file holds 7");
    expect_open(h, 0, KVQ_E_TRUNCATED_DATA, NULL);
    expect_open("{\"a\":{\"dtype\":\"F32\",\"shape\":[1073741824],"
                "\"data_offsets\":[0,4294967296]}}",
                16, KVQ_E_TRUNCATED_DATA, NULL);
    /* tiled but bytes left over */
    snprintf(h, sizeof h, ab_fmt, 4, 0, 4, 4, 4, 8);
    expect_open(h, 9, KVQ_E_CORRUPT, "1 unreferenced bytes");
    expect_open("{}", 1, KVQ_E_CORRUPT, "unreferenced");
}

static void test_open_file(void **state)
{
    kvq_st *st = NULL;
    kvq_err e = {0};
    const char *missing = test_path("missing.safetensors");
    assert_int_equal(kvq_st_open(missing, &st, &e), KVQ_E_NOT_FOUND);
    assert_memory_equal(e.msg, missing, strlen(missing));

    const char *p = test_path("short.safetensors");
    size_t len;
    uint8_t *b = image("{\"a\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &len);
    assert_int_equal(test_write_file(p, b, len - 1), 0);
    assert_int_equal(kvq_st_open(p, &st, &e), KVQ_E_TRUNCATED_DATA);
    assert_memory_equal(e.msg, p, strlen(p));
    assert_int_equal(test_write_file(p, b, len), 0);
    assert_int_equal(kvq_st_open(p, &st, &e), KVQ_OK);
    const kvq_tensor_view *v = kvq_st_find(st, "a");
    assert_non_null(v);
    assert_memory_equal(v->data, b + len - 8, 8);
    kvq_st_close(st);
    assert_int_equal(test_write_file(p, "", 0), 0);
    assert_int_equal(kvq_st_open(p, &st, &e), KVQ_E_TRUNCATED_HEADER);
    free(b);
}

/* ---- writer ------------------------------------------------------------------------------ */

typedef struct decl {
    const char *name;
    kvq_dtype dtype;
    int ndim;
    int64_t shape[KVQ_MAX_DIMS];
} decl;

static size_t decl_bytes(const decl *d)
{
    size_t n = kvq_dtype_size(d->dtype);
    for (int i = 0; i < d->ndim; i++)
        n *= (size_t)d->shape[i];
    return n;
}

/* Every dtype, plus scalars and zero-size tensors between them. */
static const decl all_decls[] = {
    {"bool", KVQ_DT_BOOL, 2, {3, 5}},      {"u8", KVQ_DT_U8, 1, {7}},
    {"i8", KVQ_DT_I8, 3, {1, 2, 3}},       {"e4m3", KVQ_DT_F8_E4M3, 1, {9}},
    {"e5m2", KVQ_DT_F8_E5M2, 1, {4}},      {"empty", KVQ_DT_F32, 1, {0}},
    {"i16", KVQ_DT_I16, 2, {2, 3}},        {"u16", KVQ_DT_U16, 1, {5}},
    {"f16", KVQ_DT_F16, 2, {3, 3}},        {"bf16", KVQ_DT_BF16, 1, {11}},
    {"scalar_f32", KVQ_DT_F32, 0, {0}},    {"i32", KVQ_DT_I32, 1, {3}},
    {"u32", KVQ_DT_U32, 2, {2, 2}},        {"f32", KVQ_DT_F32, 4, {1, 2, 1, 3}},
    {"empty2", KVQ_DT_I64, 3, {2, 0, 7}},  {"i64", KVQ_DT_I64, 1, {3}},
    {"u64", KVQ_DT_U64, 1, {2}},           {"f64", KVQ_DT_F64, 8, {1, 1, 2, 1, 1, 1, 1, 2}},
    {"scalar_u8", KVQ_DT_U8, 0, {0}},
};
#define N_ALL (sizeof all_decls / sizeof all_decls[0])

/* Declares all_decls and the metadata, begins (file when path, else buffer), writes
 * `data` in chunks of `chunk` bytes (crossing tensor boundaries), finishes. */
static kvq_st_writer *write_all(const uint8_t *data, size_t total, size_t chunk, const char *path)
{
    kvq_err e = {0};
    kvq_st_writer *w = kvq_st_writer_new();
    assert_non_null(w);
    for (size_t i = 0; i < N_ALL; i++)
        assert_int_equal(kvq_st_writer_declare(w, all_decls[i].name, all_decls[i].dtype,
                                               all_decls[i].ndim, all_decls[i].shape, &e),
                         KVQ_OK);
    assert_int_equal(kvq_st_writer_set_meta(w, "zeta", "last", &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_set_meta(w, "alpha", "tmp", &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_set_meta(w, "alpha", "q\"b\\n\nt\tc\x01 \xc3\xa9", &e),
                     KVQ_OK);
    assert_int_equal(kvq_st_writer_set_meta(w, "", "empty key", &e), KVQ_OK);
    if (path)
        assert_int_equal(kvq_st_writer_begin_file(w, path, 1, &e), KVQ_OK);
    else
        assert_int_equal(kvq_st_writer_begin_buffer(w, &e), KVQ_OK);
    for (size_t off = 0; off < total; off += chunk) {
        size_t n = total - off < chunk ? total - off : chunk;
        assert_int_equal(kvq_st_writer_write(w, data + off, n, &e), KVQ_OK);
    }
    assert_int_equal(kvq_st_writer_finish(w, &e), KVQ_OK);
    return w;
}

static void check_all(const kvq_st *st, const uint8_t *data)
{
    assert_int_equal(kvq_st_count(st), N_ALL);
    size_t off = 0;
    for (size_t i = 0; i < N_ALL; i++) {
        const decl *d = &all_decls[i];
        const kvq_tensor_view *v = kvq_st_tensor(st, i); /* declaration order == offset order */
        assert_string_equal(v->name, d->name);
        assert_ptr_equal(kvq_st_find(st, d->name), v);
        assert_int_equal(v->dtype, d->dtype);
        assert_int_equal(v->ndim, d->ndim);
        for (int k = 0; k < d->ndim; k++)
            assert_int_equal(v->shape[k], d->shape[k]);
        assert_int_equal(v->offset, off);
        assert_int_equal(v->nbytes, decl_bytes(d));
        if (v->nbytes)
            assert_memory_equal(v->data, data + off, v->nbytes);
        off += v->nbytes;
    }
    assert_int_equal(kvq_st_data_size(st), off);
    assert_int_equal(kvq_st_header_size(st) % 8, 0);
    assert_int_equal(kvq_st_meta_count(st), 3);
    assert_string_equal(kvq_st_meta_key(st, 0), "");
    assert_string_equal(kvq_st_meta_key(st, 1), "alpha");
    assert_string_equal(kvq_st_meta_key(st, 2), "zeta");
    assert_string_equal(kvq_st_meta_get(st, "alpha"), "q\"b\\n\nt\tc\x01 \xc3\xa9");
    assert_string_equal(kvq_st_meta_get(st, "zeta"), "last");
    assert_string_equal(kvq_st_meta_get(st, ""), "empty key");
}

static void test_writer_roundtrip_all_dtypes(void **state)
{
    size_t total = 0;
    for (size_t i = 0; i < N_ALL; i++)
        total += decl_bytes(&all_decls[i]);
    uint8_t *data = malloc(total);
    assert_non_null(data);
    fill_pattern(data, total, 7);

    static const size_t chunks[] = {1, 3, 7, 64, 100000};
    const void *first = NULL;
    size_t first_size = 0;
    kvq_st_writer *w0 = NULL;
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        kvq_st_writer *w = write_all(data, total, chunks[c], NULL);
        size_t size = 0;
        const void *buf = kvq_st_writer_buffer(w, &size);
        assert_non_null(buf);
        kvq_st *st = NULL;
        kvq_err e = {0};
        assert_int_equal(kvq_st_open_memory(buf, size, "buf", &st, &e), KVQ_OK);
        check_all(st, data);
        assert_int_equal(kvq_st_header_size(st) + kvq_st_data_size(st), size);
        kvq_st_close(st);
        if (!w0) { /* every chunking gives the same bytes */
            w0 = w;
            first = buf;
            first_size = size;
            continue;
        }
        assert_int_equal(size, first_size);
        assert_memory_equal(buf, first, size);
        kvq_st_writer_free(w);
    }

    /* file mode: same bytes as the buffer, readable through the mapping */
    const char *p = test_path("all.safetensors");
    kvq_st_writer *wf = write_all(data, total, 5, p);
    size_t fsize = 1;
    assert_null(kvq_st_writer_buffer(wf, &fsize)); /* file mode has no buffer */
    assert_int_equal(fsize, 0);
    kvq_st_writer_free(wf); /* after finish: the file stays */
    uint8_t *fbytes = NULL;
    assert_int_equal(kvq_read_file(p, &fbytes, &fsize, NULL), KVQ_OK);
    assert_int_equal(fsize, first_size);
    assert_memory_equal(fbytes, first, fsize);
    kvq_st *st = NULL;
    assert_int_equal(kvq_st_open(p, &st, NULL), KVQ_OK);
    check_all(st, data);
    kvq_st_close(st);
    /* written twice to the same path: same bytes */
    wf = write_all(data, total, 4096, p);
    kvq_st_writer_free(wf);
    uint8_t *again = NULL;
    size_t again_size = 0;
    assert_int_equal(kvq_read_file(p, &again, &again_size, NULL), KVQ_OK);
    assert_int_equal(again_size, fsize);
    assert_memory_equal(again, fbytes, fsize);
    free(again);
    free(fbytes);
    kvq_st_writer_free(w0);
    free(data);
}

static void test_writer_exact_bytes(void **state)
{
    kvq_err e = {0};
    kvq_st_writer *w = kvq_st_writer_new();
    const int64_t shape[2] = {1, 2};
    const float v[2] = {1.0f, -2.0f};
    assert_int_equal(kvq_st_writer_declare(w, "w", KVQ_DT_F32, 2, shape, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_declare(w, "s", KVQ_DT_U8, 0, NULL, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_set_meta(w, "b", "2", &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_set_meta(w, "a", "1", &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_begin_buffer(w, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_write(w, v, sizeof v, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_write(w, "\x2a", 1, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_finish(w, &e), KVQ_OK);
    size_t size = 0;
    const uint8_t *b = kvq_st_writer_buffer(w, &size);
    const char *json = "{\"__metadata__\":{\"a\":\"1\",\"b\":\"2\"},"
                       "\"w\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[0,8]},"
                       "\"s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[8,9]}}";
    size_t jl = strlen(json), padded = (jl + 7) / 8 * 8;
    assert_int_equal(size, 8 + padded + 9);
    assert_int_equal(b[0], padded);
    for (int i = 1; i < 8; i++)
        assert_int_equal(b[i], 0);
    assert_memory_equal(b + 8, json, jl);
    for (size_t i = jl; i < padded; i++)
        assert_int_equal(b[8 + i], ' ');
    assert_memory_equal(b + 8 + padded, v, 8);
    assert_int_equal(b[8 + padded + 8], 0x2a);
    kvq_st_writer_free(w);

    /* nothing declared: "{}" padded to 8 */
    w = kvq_st_writer_new();
    assert_int_equal(kvq_st_writer_begin_buffer(w, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_finish(w, &e), KVQ_OK);
    b = kvq_st_writer_buffer(w, &size);
    assert_int_equal(size, 16);
    assert_memory_equal(b, "\x08\0\0\0\0\0\0\0{}      ", 16);
    kvq_st *st = NULL;
    assert_int_equal(kvq_st_open_memory(b, size, "empty", &st, &e), KVQ_OK);
    assert_int_equal(kvq_st_count(st), 0);
    assert_int_equal(kvq_st_meta_count(st), 0);
    kvq_st_close(st);
    kvq_st_writer_free(w);
}

static void test_writer_errors(void **state)
{
    kvq_err e = {0};
    const int64_t s4[1] = {4}, neg[1] = {-1}, huge[1] = {INT64_C(1) << 53};
    const int64_t big[2] = {INT64_C(1) << 40, INT64_C(1) << 20};
    uint8_t bytes[16] = {0};
    kvq_st_writer *w = kvq_st_writer_new();
    assert_int_equal(kvq_st_writer_write(w, bytes, 1, &e), KVQ_E_INVALID_ARG);   /* before begin */
    assert_int_equal(kvq_st_writer_finish(w, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_st_writer_declare(w, "a", KVQ_DT_U8, 1, s4, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_declare(w, "a", KVQ_DT_U8, 1, s4, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "'a' declared twice"));
    assert_int_equal(kvq_st_writer_declare(w, "__metadata__", KVQ_DT_U8, 1, s4, &e),
                     KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_st_writer_declare(w, "\xff", KVQ_DT_U8, 1, s4, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_st_writer_declare(w, "n", KVQ_DT_U8, 1, neg, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_st_writer_declare(w, "n", KVQ_DT_U8, 9, s4, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_st_writer_declare(w, "n", KVQ_DT_U8, -1, s4, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_st_writer_declare(w, "n", KVQ_DT_COUNT, 1, s4, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_st_writer_declare(w, "n", KVQ_DT_U8, 1, huge, &e), KVQ_E_TOO_LARGE);
    assert_int_equal(kvq_st_writer_declare(w, "n", KVQ_DT_F32, 2, big, &e), KVQ_E_TOO_LARGE);
    assert_int_equal(kvq_st_writer_set_meta(w, "k", "\xc0\xaf", &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_st_writer_declare(w, "b", KVQ_DT_U16, 1, s4, &e), KVQ_OK); /* 8 bytes */
    assert_int_equal(kvq_st_writer_begin_buffer(w, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_begin_buffer(w, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_st_writer_declare(w, "c", KVQ_DT_U8, 1, s4, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_st_writer_set_meta(w, "k", "v", &e), KVQ_E_INVALID_ARG);
    /* too many bytes in one write: refused, nothing written */
    assert_int_equal(kvq_st_writer_write(w, bytes, 13, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "write of 13 bytes but only 12"));
    assert_int_equal(kvq_st_writer_write(w, bytes, 6, &e), KVQ_OK);
    /* too few at finish: names the incomplete tensor */
    assert_int_equal(kvq_st_writer_finish(w, &e), KVQ_E_INVALID_ARG);
    assert_string_equal(e.msg, "safetensors buffer: finish with tensor 'b' incomplete: 2 of 8 "
                               "bytes written");
    assert_int_equal(kvq_st_writer_write(w, bytes, 7, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_st_writer_write(w, bytes, 6, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_write(w, bytes, 1, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_st_writer_write(w, NULL, 0, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_finish(w, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_finish(w, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_st_writer_write(w, bytes, 0, &e), KVQ_E_INVALID_ARG);
    size_t size;
    assert_non_null(kvq_st_writer_buffer(w, &size));
    kvq_st_writer_free(w);
    kvq_st_writer_free(NULL);

    /* existing output without overwrite */
    const char *p = test_path("exists.safetensors");
    assert_int_equal(test_write_file(p, "x", 1), 0);
    w = kvq_st_writer_new();
    assert_int_equal(kvq_st_writer_begin_file(w, p, 0, &e), KVQ_E_EXISTS);
    kvq_st_writer_free(w);
}

/* Number of directory entries whose name starts with prefix. */
static int count_prefixed(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d)))
        n += strncmp(ent->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static void test_writer_atomic(void **state)
{
    kvq_err e = {0};
    const int64_t s[1] = {1024};
    uint8_t bytes[1024] = {0};
    const char *p = test_path("atomic.safetensors");
    unlink(p);
    kvq_st_writer *w = kvq_st_writer_new();
    assert_int_equal(kvq_st_writer_declare(w, "a", KVQ_DT_F32, 1, s, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_begin_file(w, p, 0, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_write(w, bytes, sizeof bytes, &e), KVQ_OK);
    assert_int_equal(count_prefixed(test_tmpdir(), "atomic.safetensors"), 1); /* the temp */
    assert_int_equal(access(p, F_OK), -1);
    kvq_st_writer_free(w); /* without finish */
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(count_prefixed(test_tmpdir(), "atomic.safetensors"), 0);

    /* a failed finish (too few bytes) leaves no final file either */
    w = kvq_st_writer_new();
    assert_int_equal(kvq_st_writer_declare(w, "a", KVQ_DT_F32, 1, s, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_begin_file(w, p, 0, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_finish(w, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "atomic.safetensors: finish with tensor 'a' incomplete"));
    kvq_st_writer_free(w);
    assert_int_equal(count_prefixed(test_tmpdir(), "atomic.safetensors"), 0);

    /* overwrite = 1 replaces an existing file only at finish */
    assert_int_equal(test_write_file(p, "old", 3), 0);
    w = kvq_st_writer_new();
    assert_int_equal(kvq_st_writer_declare(w, "a", KVQ_DT_U8, 1, s, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_begin_file(w, p, 1, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_write(w, bytes, sizeof bytes, &e), KVQ_OK);
    uint8_t *old = NULL;
    size_t n = 0;
    assert_int_equal(kvq_read_file(p, &old, &n, NULL), KVQ_OK);
    assert_int_equal(n, 3);
    free(old);
    assert_int_equal(kvq_st_writer_finish(w, &e), KVQ_OK);
    kvq_st_writer_free(w);
    kvq_st *st = NULL;
    assert_int_equal(kvq_st_open(p, &st, &e), KVQ_OK);
    assert_int_equal(kvq_st_find(st, "a")->nbytes, 1024);
    kvq_st_close(st);
    assert_int_equal(count_prefixed(test_tmpdir(), "atomic.safetensors"), 1);
}

/* Flipping every byte of a valid header never crashes, and every failure is one of
 * the documented statuses. */
static void test_header_mutations(void **state)
{
    const char *hdr = "{\"__metadata__\":{\"k\":\"v\"},"
                      "\"a\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                      "\"b\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[12,13]}}";
    size_t len;
    uint8_t *b = image(hdr, 13, &len);
    static const uint8_t repl[] = {0, ' ', '"', '{', '}', '[', ']', ',', ':', '0', '9', '-',
                                   'e', '\\', 0x80, 0xff};
    int ok = 0, bad = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t keep = b[i];
        for (size_t r = 0; r < sizeof repl; r++) {
            b[i] = repl[r];
            kvq_st *st = NULL;
            kvq_err e = {0};
            kvq_status s = kvq_st_open_memory(b, len, "mut", &st, &e);
            if (s == KVQ_OK) {
                ok++;
                for (size_t t = 0; t < kvq_st_count(st); t++)
                    assert_ptr_equal(kvq_st_find(st, kvq_st_tensor(st, t)->name),
                                     kvq_st_tensor(st, t));
            } else {
                bad++;
                assert_true((s >= KVQ_E_TRUNCATED_HEADER && s <= KVQ_E_BAD_UTF8) ||
                            s == KVQ_E_CORRUPT || s == KVQ_E_UNSUPPORTED);
                assert_int_equal(e.status, s);
            }
            kvq_st_close(st);
        }
        b[i] = keep;
    }
    assert_true(ok > 0 && bad > 0);
    free(b);
}

static int teardown(void **state)
{
    test_tmpdir_cleanup();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_read_valid),
        cmocka_unit_test(test_read_edge_cases),
        cmocka_unit_test(test_truncated_and_too_large),
        cmocka_unit_test(test_bad_utf8_and_json),
        cmocka_unit_test(test_bad_tensor_info),
        cmocka_unit_test(test_bad_layout),
        cmocka_unit_test(test_open_file),
        cmocka_unit_test(test_writer_roundtrip_all_dtypes),
        cmocka_unit_test(test_writer_exact_bytes),
        cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_writer_atomic),
        cmocka_unit_test(test_header_mutations),
    };
    return cmocka_run_group_tests_name("safetensors", tests, NULL, teardown);
}
