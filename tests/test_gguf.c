/* test_gguf.c — the GGUF reader on the real stories260K model (values from
 * shared/models/SOURCES.md, weights against stories260K.bin) and on its committed
 * stand-in tiny_spm (weights against its llama2.c checkpoint), every kind of corrupt
 * file with its exact status, Q8_0 fast path == reference, and writer round trips. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers/testutil.h"
#include "helpers/tiny_spm.h"
#include "kvq/common.h"
#include "kvq/gguf.h"
#include "kvq/half.h"
#include "kvq/quant.h"
#include "kvq/util.h"
#include "formats/half_simd.h"

/* ==========================================================================
 * a byte builder for hand-made files
 * ========================================================================== */

typedef struct bb {
    uint8_t *p;
    size_t n, cap;
} bb;

static void bb_put(bb *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void bb_uint(bb *b, uint64_t v, int width)
{
    uint8_t x[8];
    for (int i = 0; i < width; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    bb_put(b, x, (size_t)width);
}

static void bb_u32(bb *b, uint32_t v) { bb_uint(b, v, 4); }
static void bb_u64(bb *b, uint64_t v) { bb_uint(b, v, 8); }

static void bb_str(bb *b, const char *s)
{
    bb_u64(b, strlen(s));
    bb_put(b, s, strlen(s));
}

static void bb_pad(bb *b, size_t align)
{
    while (b->n % align)
        bb_uint(b, 0, 1);
}

static void patch(uint8_t *p, size_t pos, uint64_t v, int width)
{
    for (int i = 0; i < width; i++)
        p[pos + i] = (uint8_t)(v >> (8 * i));
}

/* The base file: 6 key/values of every kind and 3 tensors, with the positions of the
 * fields the corruption tests patch. */
typedef struct base_file {
    bb b;
    size_t version, n_tensors, n_kv;
    size_t key0_byte, arch_len, align_type, align_value, kv_type[6];
    size_t arr_type, arr_count, flag_value, dupkey_byte, nested_inner_type;
    size_t t_name[3], t_ndim[3], t_ne0[3], t_ne1, t_type[3], t_off[3];
    size_t header_end, data_offset, data_used;
} base_file;

static const uint64_t base_off[3] = {0, 64, 96};

static void base_build(base_file *f)
{
    memset(f, 0, sizeof *f);
    bb *b = &f->b;
    bb_put(b, "GGUF", 4);
    f->version = b->n;
    bb_u32(b, 3);
    f->n_tensors = b->n;
    bb_u64(b, 3);
    f->n_kv = b->n;
    bb_u64(b, 6);

    /* 0: general.architecture = "llama" */
    f->key0_byte = b->n + 8 + 3; /* the 'e' of "general" */
    bb_str(b, "general.architecture");
    f->kv_type[0] = b->n;
    bb_u32(b, KVQ_GGUF_STRING);
    f->arch_len = b->n;
    bb_str(b, "llama");
    /* 1: general.alignment = u32 32 */
    bb_str(b, "general.alignment");
    f->kv_type[1] = f->align_type = b->n;
    bb_u32(b, KVQ_GGUF_UINT32);
    f->align_value = b->n;
    bb_u32(b, 32);
    /* 2: test.aa = arr<i32> {1, -2, 3} */
    bb_str(b, "test.aa");
    f->kv_type[2] = b->n;
    bb_u32(b, KVQ_GGUF_ARRAY);
    f->arr_type = b->n;
    bb_u32(b, KVQ_GGUF_INT32);
    f->arr_count = b->n;
    bb_u64(b, 3);
    bb_u32(b, 1);
    bb_u32(b, (uint32_t)-2);
    bb_u32(b, 3);
    /* 3: test.ab = true */
    f->dupkey_byte = b->n + 8 + 6;
    bb_str(b, "test.ab");
    f->kv_type[3] = b->n;
    bb_u32(b, KVQ_GGUF_BOOL);
    f->flag_value = b->n;
    bb_uint(b, 1, 1);
    /* 4: test.nested = arr<arr<str>> {{"x", "yz"}, {}} */
    bb_str(b, "test.nested");
    f->kv_type[4] = b->n;
    bb_u32(b, KVQ_GGUF_ARRAY);
    bb_u32(b, KVQ_GGUF_ARRAY);
    bb_u64(b, 2);
    f->nested_inner_type = b->n;
    bb_u32(b, KVQ_GGUF_STRING);
    bb_u64(b, 2);
    bb_str(b, "x");
    bb_str(b, "yz");
    bb_u32(b, KVQ_GGUF_STRING);
    bb_u64(b, 0);
    /* 5: test.f = f32 0.5 */
    bb_str(b, "test.f");
    f->kv_type[5] = b->n;
    bb_u32(b, KVQ_GGUF_FLOAT32);
    bb_u32(b, 0x3f000000);

    static const char *names[3] = {"a", "b", "c"};
    static const uint32_t types[3] = {KVQ_GGML_F32, KVQ_GGML_F16, KVQ_GGML_F32};
    static const uint64_t ne0[3] = {8, 16, 4};
    for (int t = 0; t < 3; t++) {
        f->t_name[t] = b->n + 8;
        bb_str(b, names[t]);
        f->t_ndim[t] = b->n;
        bb_u32(b, t == 0 ? 2 : 1);
        f->t_ne0[t] = b->n;
        bb_u64(b, ne0[t]);
        if (t == 0) {
            f->t_ne1 = b->n;
            bb_u64(b, 2);
        }
        f->t_type[t] = b->n;
        bb_u32(b, types[t]);
        f->t_off[t] = b->n;
        bb_u64(b, base_off[t]);
    }
    f->header_end = b->n;
    bb_pad(b, 32);
    f->data_offset = b->n;
    for (int i = 0; i < 16; i++) { /* a: [2, 8] f32 */
        const float v = (float)i * 0.25f;
        bb_put(b, &v, 4);
    }
    for (int i = 0; i < 16; i++) /* b: [16] f16 */
        bb_uint(b, kvq_f32_to_f16_ref((float)(i - 8)), 2);
    for (int i = 0; i < 4; i++) { /* c: [4] f32 */
        const float v = -1.5f * (float)i;
        bb_put(b, &v, 4);
    }
    f->data_used = b->n - f->data_offset;
    bb_pad(b, 32);
}

/* Opens `n` bytes copied to a heap block of exactly that size (so a sanitizer sees any
 * read past the end) and checks the status; on failure also the message. */
static void expect_open(const uint8_t *data, size_t n, kvq_status want, const char *msg_part,
                        const char *what)
{
    uint8_t *copy = malloc(n ? n : 1);
    assert_non_null(copy);
    if (n)
        memcpy(copy, data, n);
    kvq_gguf *g = (kvq_gguf *)(uintptr_t)1;
    kvq_err e = {0};
    const kvq_status st = kvq_gguf_open_memory(copy, n, "t.gguf", &g, &e);
    if (st != want)
        fail_msg("%s: status %d (%s), expected %d (%s)", what, st, e.msg, want,
                 kvq_status_str(want));
    if (st != KVQ_OK) {
        assert_null(g);
        assert_int_equal(e.status, want);
        assert_non_null(strstr(e.msg, "t.gguf"));
        if (msg_part && !strstr(e.msg, msg_part))
            fail_msg("%s: message '%s' lacks '%s'", what, e.msg, msg_part);
    } else {
        assert_non_null(g);
        kvq_gguf_close(g);
    }
    free(copy);
}

static void expect_patched(const base_file *f, size_t pos, uint64_t v, int width,
                           kvq_status want, const char *msg_part, const char *what)
{
    uint8_t *p = malloc(f->b.n);
    assert_non_null(p);
    memcpy(p, f->b.p, f->b.n);
    patch(p, pos, v, width);
    expect_open(p, f->b.n, want, msg_part, what);
    free(p);
}

/* ==========================================================================
 * the base file reads back as built
 * ========================================================================== */

static void test_base_file(void **state)
{
    base_file f;
    base_build(&f);
    kvq_gguf *g = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_gguf_open_memory(f.b.p, f.b.n, NULL, &g, &e), KVQ_OK);
    assert_int_equal(kvq_gguf_version(g), 3);
    assert_int_equal(kvq_gguf_alignment(g), 32);
    assert_int_equal(kvq_gguf_data_offset(g), f.data_offset);
    assert_int_equal(kvq_gguf_kv_count(g), 6);
    assert_int_equal(kvq_gguf_tensor_count(g), 3);
    assert_string_equal(kvq_gguf_kv_at(g, 0)->key, "general.architecture");
    assert_null(kvq_gguf_kv_at(g, 6));
    assert_string_equal(kvq_gguf_get_str(g, "general.architecture"), "llama");
    assert_null(kvq_gguf_get_str(g, "general.alignment"));
    assert_null(kvq_gguf_get(g, "missing"));

    const kvq_gguf_value *a = kvq_gguf_get(g, "test.aa");
    assert_non_null(a);
    assert_int_equal(a->type, KVQ_GGUF_ARRAY);
    assert_int_equal(a->v.arr.type, KVQ_GGUF_INT32);
    assert_int_equal(a->v.arr.n, 3);
    assert_int_equal(a->v.arr.items[1].v.i, -2);
    assert_int_equal(a->v.arr.items[2].type, KVQ_GGUF_INT32);

    uint64_t u = 0;
    double d = 0;
    assert_int_equal(kvq_gguf_get_u64(g, "general.alignment", &u), 0);
    assert_int_equal(u, 32);
    assert_int_equal(kvq_gguf_get_u64(g, "test.f", &u), -1);
    assert_int_equal(kvq_gguf_get_u64(g, "test.ab", &u), -1); /* bool is not an integer */
    assert_int_equal(kvq_gguf_get_f64(g, "test.f", &d), 0);
    assert_true(d == 0.5);
    assert_int_equal(kvq_gguf_get_f64(g, "general.alignment", &d), 0);
    assert_true(d == 32.0);
    assert_int_equal(kvq_gguf_get_f64(g, "general.architecture", &d), -1);
    const kvq_gguf_value *flag = kvq_gguf_get(g, "test.ab");
    assert_int_equal(flag->type, KVQ_GGUF_BOOL);
    assert_int_equal(flag->v.u, 1);

    const kvq_gguf_value *n = kvq_gguf_get(g, "test.nested");
    assert_int_equal(n->v.arr.type, KVQ_GGUF_ARRAY);
    assert_int_equal(n->v.arr.n, 2);
    assert_int_equal(n->v.arr.items[0].v.arr.type, KVQ_GGUF_STRING);
    assert_int_equal(n->v.arr.items[0].v.arr.n, 2);
    assert_string_equal(n->v.arr.items[0].v.arr.items[1].v.str.s, "yz");
    assert_int_equal(n->v.arr.items[0].v.arr.items[1].v.str.len, 2);
    assert_int_equal(n->v.arr.items[1].v.arr.n, 0);

    const kvq_gguf_tensor *t = kvq_gguf_find_tensor(g, "a");
    assert_ptr_equal(t, kvq_gguf_tensor_at(g, 0));
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->ne[0], 8);
    assert_int_equal(t->ne[1], 2);
    assert_int_equal(t->ne[2], 1);
    assert_int_equal(t->nbytes, 64);
    assert_int_equal(kvq_gguf_tensor_rows(t), 2);
    assert_ptr_equal(t->data, f.b.p + f.data_offset);
    float out[16];
    assert_int_equal(kvq_gguf_rows_to_f32(t, 1, 1, out, &e), KVQ_OK);
    for (int i = 0; i < 8; i++)
        assert_true(out[i] == (float)(8 + i) * 0.25f);
    t = kvq_gguf_find_tensor(g, "b");
    assert_int_equal(t->offset, 64);
    assert_int_equal(kvq_gguf_rows_to_f32(t, 0, 1, out, &e), KVQ_OK);
    for (int i = 0; i < 16; i++)
        assert_true(out[i] == (float)(i - 8));
    assert_int_equal(kvq_gguf_rows_to_f32(t, 0, 2, out, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_gguf_rows_to_f32(t, -1, 1, out, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_gguf_rows_to_f32(t, 1, 0, out, &e), KVQ_OK); /* empty range at end */
    assert_null(kvq_gguf_find_tensor(g, "d"));
    kvq_gguf_close(g);
    kvq_gguf_close(NULL);
    free(f.b.p);
}

/* ==========================================================================
 * the real model
 * ========================================================================== */

static const struct {
    const char *name;
    uint32_t ndim;
    int64_t ne0, ne1;
    uint64_t offset;
} model_tensors[48] = {
    {"token_embd.weight", 2, 64, 512, 0},
    {"output_norm.weight", 1, 64, 1, 131072},
    {"output.weight", 2, 64, 512, 131328},
    {"blk.0.attn_q.weight", 2, 64, 64, 262400},
    {"blk.0.attn_k.weight", 2, 64, 32, 278784},
    {"blk.0.attn_v.weight", 2, 64, 32, 286976},
    {"blk.0.attn_output.weight", 2, 64, 64, 295168},
    {"blk.0.attn_norm.weight", 1, 64, 1, 311552},
    {"blk.0.ffn_gate.weight", 2, 64, 172, 311808},
    {"blk.0.ffn_down.weight", 2, 172, 64, 355840},
    {"blk.0.ffn_up.weight", 2, 64, 172, 399872},
    {"blk.0.ffn_norm.weight", 1, 64, 1, 443904},
    {"blk.1.attn_q.weight", 2, 64, 64, 444160},
    {"blk.1.attn_k.weight", 2, 64, 32, 460544},
    {"blk.1.attn_v.weight", 2, 64, 32, 468736},
    {"blk.1.attn_output.weight", 2, 64, 64, 476928},
    {"blk.1.attn_norm.weight", 1, 64, 1, 493312},
    {"blk.1.ffn_gate.weight", 2, 64, 172, 493568},
    {"blk.1.ffn_down.weight", 2, 172, 64, 537600},
    {"blk.1.ffn_up.weight", 2, 64, 172, 581632},
    {"blk.1.ffn_norm.weight", 1, 64, 1, 625664},
    {"blk.2.attn_q.weight", 2, 64, 64, 625920},
    {"blk.2.attn_k.weight", 2, 64, 32, 642304},
    {"blk.2.attn_v.weight", 2, 64, 32, 650496},
    {"blk.2.attn_output.weight", 2, 64, 64, 658688},
    {"blk.2.attn_norm.weight", 1, 64, 1, 675072},
    {"blk.2.ffn_gate.weight", 2, 64, 172, 675328},
    {"blk.2.ffn_down.weight", 2, 172, 64, 719360},
    {"blk.2.ffn_up.weight", 2, 64, 172, 763392},
    {"blk.2.ffn_norm.weight", 1, 64, 1, 807424},
    {"blk.3.attn_q.weight", 2, 64, 64, 807680},
    {"blk.3.attn_k.weight", 2, 64, 32, 824064},
    {"blk.3.attn_v.weight", 2, 64, 32, 832256},
    {"blk.3.attn_output.weight", 2, 64, 64, 840448},
    {"blk.3.attn_norm.weight", 1, 64, 1, 856832},
    {"blk.3.ffn_gate.weight", 2, 64, 172, 857088},
    {"blk.3.ffn_down.weight", 2, 172, 64, 901120},
    {"blk.3.ffn_up.weight", 2, 64, 172, 945152},
    {"blk.3.ffn_norm.weight", 1, 64, 1, 989184},
    {"blk.4.attn_q.weight", 2, 64, 64, 989440},
    {"blk.4.attn_k.weight", 2, 64, 32, 1005824},
    {"blk.4.attn_v.weight", 2, 64, 32, 1014016},
    {"blk.4.attn_output.weight", 2, 64, 64, 1022208},
    {"blk.4.attn_norm.weight", 1, 64, 1, 1038592},
    {"blk.4.ffn_gate.weight", 2, 64, 172, 1038848},
    {"blk.4.ffn_down.weight", 2, 172, 64, 1082880},
    {"blk.4.ffn_up.weight", 2, 64, 172, 1126912},
    {"blk.4.ffn_norm.weight", 1, 64, 1, 1170944},
};

static void assert_u64_key(const kvq_gguf *g, const char *key, uint64_t want)
{
    const kvq_gguf_value *v = kvq_gguf_get(g, key);
    if (!v)
        fail_msg("missing key %s", key);
    assert_int_equal(v->type, KVQ_GGUF_UINT32);
    assert_int_equal(v->v.u, want);
}

/* Without stories260K: SmolLM2's header against the values the `gguf` package reads
 * from the same file (gguf 0.19.0: GGUFReader fields, .data_offset, .alignment,
 * .tensors[i].name / tensor_type / shape / data_offset - data_offset / n_bytes). */
static void smollm2_header(const char *path)
{
    kvq_gguf *g = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_gguf_open(path, &g, &e), KVQ_OK);
    assert_int_equal(kvq_gguf_version(g), 3);
    assert_int_equal(kvq_gguf_tensor_count(g), 272);
    assert_int_equal(kvq_gguf_kv_count(g), 33);
    assert_int_equal(kvq_gguf_data_offset(g), 1785664);
    assert_int_equal(kvq_gguf_alignment(g), 32);
    assert_string_equal(kvq_gguf_get_str(g, "general.architecture"), "llama");
    assert_string_equal(kvq_gguf_get_str(g, "tokenizer.ggml.model"), "gpt2");
    assert_string_equal(kvq_gguf_get_str(g, "tokenizer.ggml.pre"), "smollm");
    assert_u64_key(g, "llama.context_length", 8192);
    assert_u64_key(g, "llama.embedding_length", 576);
    assert_u64_key(g, "llama.feed_forward_length", 1536);
    assert_u64_key(g, "llama.block_count", 30);
    assert_u64_key(g, "llama.attention.head_count", 9);
    assert_u64_key(g, "llama.attention.head_count_kv", 3);
    assert_u64_key(g, "llama.vocab_size", 49152);
    assert_u64_key(g, "tokenizer.ggml.bos_token_id", 1);
    assert_u64_key(g, "tokenizer.ggml.eos_token_id", 2);
    assert_u64_key(g, "tokenizer.ggml.padding_token_id", 2);
    const kvq_gguf_value *tok = kvq_gguf_get(g, "tokenizer.ggml.tokens");
    assert_non_null(tok);
    assert_int_equal(tok->v.arr.n, 49152);
    const kvq_gguf_value *mg = kvq_gguf_get(g, "tokenizer.ggml.merges");
    assert_non_null(mg);
    assert_int_equal(mg->v.arr.n, 48900);
    const kvq_gguf_tensor *t0 = kvq_gguf_tensor_at(g, 0), *t2 = kvq_gguf_tensor_at(g, 2);
    assert_string_equal(t0->name, "token_embd.weight");
    assert_int_equal(t0->type, KVQ_GGML_Q8_0);
    assert_int_equal(t0->ne[0], 576);
    assert_int_equal(t0->ne[1], 49152);
    assert_int_equal(t0->offset, 0);
    assert_int_equal(t0->nbytes, 30081024);
    assert_string_equal(t2->name, "blk.0.ffn_down.weight");
    assert_int_equal(t2->type, KVQ_GGML_Q4_1);
    assert_int_equal(t2->ne[0], 1536);
    assert_int_equal(t2->ne[1], 576);
    assert_int_equal(t2->offset, 30083328);
    kvq_gguf_close(g);
}

static void test_model_header(void **state)
{
    int is_stories;
    const char *path = test_real_model(&is_stories);
    if (!path)
        TEST_SKIP("neither stories260K (KVQ_TEST_MODEL) nor SmolLM2 (KVQ_SMOLLM2) found");
    if (!is_stories) {
        smollm2_header(path);
        return;
    }
    kvq_gguf *g = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_gguf_open(path, &g, &e), KVQ_OK);
    assert_int_equal(kvq_gguf_version(g), 3);
    assert_int_equal(kvq_gguf_tensor_count(g), 48);
    assert_int_equal(kvq_gguf_kv_count(g), 19);
    assert_int_equal(kvq_gguf_data_offset(g), 14176);
    assert_int_equal(kvq_gguf_alignment(g), 32);
    assert_null(kvq_gguf_get(g, "general.alignment"));

    assert_string_equal(kvq_gguf_get_str(g, "general.architecture"), "llama");
    assert_string_equal(kvq_gguf_get_str(g, "general.name"), "llama");
    assert_string_equal(kvq_gguf_get_str(g, "tokenizer.ggml.model"), "llama");
    assert_u64_key(g, "llama.context_length", 2048);
    assert_u64_key(g, "llama.embedding_length", 64);
    assert_u64_key(g, "llama.feed_forward_length", 172);
    assert_u64_key(g, "llama.block_count", 5);
    assert_u64_key(g, "llama.attention.head_count", 8);
    assert_u64_key(g, "llama.attention.head_count_kv", 4);
    assert_u64_key(g, "llama.rope.dimension_count", 8);
    assert_u64_key(g, "tokenizer.ggml.unknown_token_id", 0);
    assert_u64_key(g, "tokenizer.ggml.bos_token_id", 1);
    assert_u64_key(g, "tokenizer.ggml.eos_token_id", 2);
    assert_u64_key(g, "tokenizer.ggml.seperator_token_id", 4294967295u);
    assert_u64_key(g, "tokenizer.ggml.padding_token_id", 4294967295u);
    assert_null(kvq_gguf_get(g, "llama.rope.freq_base"));
    const kvq_gguf_value *eps = kvq_gguf_get(g, "llama.attention.layer_norm_rms_epsilon");
    assert_non_null(eps);
    assert_int_equal(eps->type, KVQ_GGUF_FLOAT32);
    assert_true(eps->v.f == (double)1e-5f);

    const kvq_gguf_value *tok = kvq_gguf_get(g, "tokenizer.ggml.tokens");
    assert_ptr_equal(tok, &kvq_gguf_kv_at(g, 0)->value);
    assert_int_equal(tok->v.arr.type, KVQ_GGUF_STRING);
    assert_int_equal(tok->v.arr.n, 512);
    assert_string_equal(tok->v.arr.items[0].v.str.s, "<unk>");
    assert_string_equal(tok->v.arr.items[1].v.str.s, "<s>");
    assert_string_equal(tok->v.arr.items[2].v.str.s, "</s>");
    assert_string_equal(tok->v.arr.items[3].v.str.s, "<0x00>");
    assert_string_equal(tok->v.arr.items[258].v.str.s, "<0xFF>");
    assert_string_equal(tok->v.arr.items[259].v.str.s, "\xe2\x96\x81t"); /* "▁t" */
    const kvq_gguf_value *sc = kvq_gguf_get(g, "tokenizer.ggml.scores");
    assert_int_equal(sc->v.arr.type, KVQ_GGUF_FLOAT32);
    assert_int_equal(sc->v.arr.n, 512);
    for (int i = 0; i < 512; i++) /* 0 for specials and bytes, then 0, -1, ..., -252 */
        assert_true(sc->v.arr.items[i].v.f == (i < 259 ? 0.0 : -(double)(i - 259)));
    const kvq_gguf_value *tt = kvq_gguf_get(g, "tokenizer.ggml.token_type");
    assert_int_equal(tt->v.arr.type, KVQ_GGUF_INT32);
    assert_int_equal(tt->v.arr.items[0].v.i, 2);
    assert_int_equal(tt->v.arr.items[1].v.i, 3);
    assert_int_equal(tt->v.arr.items[3].v.i, 6);
    assert_int_equal(tt->v.arr.items[511].v.i, 1);

    for (size_t i = 0; i < 48; i++) {
        const kvq_gguf_tensor *t = kvq_gguf_tensor_at(g, i);
        assert_string_equal(t->name, model_tensors[i].name);
        assert_ptr_equal(kvq_gguf_find_tensor(g, t->name), t);
        assert_int_equal(t->ndim, model_tensors[i].ndim);
        assert_int_equal(t->ne[0], model_tensors[i].ne0);
        assert_int_equal(t->ne[1], model_tensors[i].ne1);
        assert_int_equal(t->type, KVQ_GGML_F32);
        assert_int_equal(t->offset, model_tensors[i].offset);
        assert_int_equal(t->nbytes, (size_t)(4 * model_tensors[i].ne0 * model_tensors[i].ne1));
    }
    kvq_gguf_close(g);
}

/* Float offsets (after the 7-int header) of stories260K.bin's arrays; see SOURCES.md. */
enum {
    BIN_TOK = 0, BIN_RMS_ATT = 32768, BIN_WQ = 33088, BIN_WK = 53568, BIN_WV = 63808,
    BIN_WO = 74048, BIN_RMS_FFN = 94528, BIN_W1 = 94848, BIN_W2 = 149888, BIN_W3 = 204928,
    BIN_RMS_FINAL = 259968
};

/* rows [row0, row0 + n) of the GGUF tensor `name` equal `want` bit for bit */
static void expect_rows(const kvq_gguf *g, const char *name, int64_t row0, int64_t n,
                        int64_t cols, const float *want)
{
    kvq_err e = {0};
    const kvq_gguf_tensor *t = kvq_gguf_find_tensor(g, name);
    if (!t)
        fail_msg("no tensor %s", name);
    float *out = malloc((size_t)(n * cols) * sizeof *out);
    assert_non_null(out);
    assert_int_equal(kvq_gguf_rows_to_f32(t, row0, n, out, &e), KVQ_OK);
    if (memcmp(out, want, (size_t)(n * cols) * sizeof *out) != 0)
        fail_msg("%s rows %lld..%lld differ from the llama2.c checkpoint", name,
                 (long long)row0, (long long)(row0 + n - 1));
    free(out);
}

/* Every tensor of a llama GGUF equals its slice of the llama2.c "legacy" checkpoint of
 * the same model (7 int32 then the arrays in llama2.c's order; vocab_size < 0: a
 * classifier of its own after freq_cis; > 0: shared with the embedding). */
static void expect_llama2c_slices(const char *gguf_path, const char *bin_path)
{
    uint8_t *raw = NULL;
    size_t n = 0;
    kvq_err e = {0};
    assert_int_equal(kvq_read_file(bin_path, &raw, &n, &e), KVQ_OK);
    int32_t h[7];
    memcpy(h, raw, sizeof h);
    const int64_t D = h[0], F = h[1], L = h[2], KVD = h[4] * (h[0] / h[3]);
    const int64_t V = h[5] < 0 ? -(int64_t)h[5] : h[5], S = h[6], HD = D / h[3];
    const int64_t tok = 0, att = tok + V * D, wq = att + L * D, wk = wq + L * D * D;
    const int64_t wv = wk + L * KVD * D, wo = wv + L * KVD * D, ffn = wo + L * D * D;
    const int64_t w1 = ffn + L * D, w2 = w1 + L * F * D, w3 = w2 + L * D * F;
    const int64_t fin = w3 + L * F * D, cls = fin + D + S * HD;
    assert_int_equal(n, 28 + 4 * (size_t)(cls + (h[5] < 0 ? V * D : 0)));
    float *w = malloc(n - 28);
    assert_non_null(w);
    memcpy(w, raw + 28, n - 28);
    free(raw);
    kvq_gguf *g = NULL;
    assert_int_equal(kvq_gguf_open(gguf_path, &g, &e), KVQ_OK);
    char name[64];
    for (int64_t l = 0; l < L; l++) {
#define ROWS(t, off, rows, cols)                                                           \
    (snprintf(name, sizeof name, "blk.%lld." t ".weight", (long long)l),                \
     expect_rows(g, name, 0, rows, cols, w + (off) + l * (rows) * (cols)))
        ROWS("attn_norm", att, 1, D);
        ROWS("attn_q", wq, D, D);
        ROWS("attn_k", wk, KVD, D);
        ROWS("attn_v", wv, KVD, D);
        ROWS("attn_output", wo, D, D);
        ROWS("ffn_norm", ffn, 1, D);
        ROWS("ffn_gate", w1, F, D);
        ROWS("ffn_down", w2, D, F);
        ROWS("ffn_up", w3, F, D);
#undef ROWS
    }
    expect_rows(g, "token_embd.weight", 0, V, D, w + tok);
    expect_rows(g, "output_norm.weight", 0, 1, D, w + fin);
    if (h[5] < 0 || kvq_gguf_find_tensor(g, "output.weight"))
        expect_rows(g, "output.weight", 0, V, D, w + (h[5] < 0 ? cls : tok));
    kvq_gguf_close(g);
    free(w);
}

static void test_model_weights(void **state)
{
    /* the stand-in, always (scripts/gen_tiny_spm.py wrote both files from one set of
     * weights): its shape, a row range, a range past the end, then every tensor */
    uint8_t *raw = NULL;
    size_t n = 0;
    kvq_err e = {0};
    assert_int_equal(kvq_read_file(TINY_SPM_BIN, &raw, &n, &e), KVQ_OK);
    int32_t th[7];
    memcpy(th, raw, sizeof th);
    free(raw);
    assert_int_equal(th[0], 32);  /* dim */
    assert_int_equal(th[2], 4);   /* n_layers */
    assert_int_equal(th[3], 4);   /* n_heads */
    assert_int_equal(th[4], 2);   /* n_kv_heads */
    assert_int_equal(th[5], -371);/* vocab, a classifier of its own */
    kvq_gguf *tg = NULL;
    assert_int_equal(kvq_gguf_open(TINY_SPM_GGUF, &tg, &e), KVQ_OK);
    const kvq_gguf_tensor *tk = kvq_gguf_find_tensor(tg, "blk.2.attn_k.weight");
    assert_non_null(tk);
    assert_int_equal(tk->ne[0], 32);
    assert_int_equal(tk->ne[1], 16);
    float row[32];
    assert_int_equal(kvq_gguf_rows_to_f32(tk, 15, 1, row, &e), KVQ_OK);
    assert_int_equal(kvq_gguf_rows_to_f32(tk, 15, 2, row, &e), KVQ_E_INVALID_ARG);
    kvq_gguf_close(tg);
    expect_llama2c_slices(TINY_SPM_GGUF, TINY_SPM_BIN);

    /* stories260K, when ../shared has it */
    const char *path = test_model_path(), *bin = test_model_bin_path();
    if (!path || !bin) {
        printf("[          ] stories260K absent: checked on tiny_spm only\n");
        return;
    }
    raw = NULL;
    assert_int_equal(kvq_read_file(bin, &raw, &n, &e), KVQ_OK);
    assert_int_equal(n, 1056540);
    int32_t hdr[7];
    memcpy(hdr, raw, sizeof hdr);
    assert_int_equal(hdr[0], 64);  /* dim */
    assert_int_equal(hdr[2], 5);   /* n_layers */
    assert_int_equal(hdr[4], 4);   /* n_kv_heads */
    float *w = malloc(n - 28); // [264128] the checkpoint body
    assert_non_null(w);
    memcpy(w, raw + 28, n - 28);
    free(raw);

    kvq_gguf *g = NULL;
    assert_int_equal(kvq_gguf_open(path, &g, &e), KVQ_OK);
    static float out[512 * 64];
    /* blk.0.attn_k.weight: [32 rows of 64] == wk[0] */
    const kvq_gguf_tensor *k0 = kvq_gguf_find_tensor(g, "blk.0.attn_k.weight");
    assert_non_null(k0);
    assert_int_equal(kvq_gguf_rows_to_f32(k0, 0, 32, out, &e), KVQ_OK);
    assert_memory_equal(out, w + BIN_WK, 32 * 64 * sizeof(float));
    /* a row range in the middle */
    assert_int_equal(kvq_gguf_rows_to_f32(k0, 5, 4, out, &e), KVQ_OK);
    assert_memory_equal(out, w + BIN_WK + 5 * 64, 4 * 64 * sizeof(float));
    assert_int_equal(kvq_gguf_rows_to_f32(k0, 30, 3, out, &e), KVQ_E_INVALID_ARG);
    /* every layer's K, V and norms, the embedding and the final norm */
    char name[64];
    for (int l = 0; l < 5; l++) {
        snprintf(name, sizeof name, "blk.%d.attn_k.weight", l);
        assert_int_equal(kvq_gguf_rows_to_f32(kvq_gguf_find_tensor(g, name), 0, 32, out, &e),
                         KVQ_OK);
        assert_memory_equal(out, w + BIN_WK + l * 2048, 2048 * sizeof(float));
        snprintf(name, sizeof name, "blk.%d.attn_v.weight", l);
        assert_int_equal(kvq_gguf_rows_to_f32(kvq_gguf_find_tensor(g, name), 0, 32, out, &e),
                         KVQ_OK);
        assert_memory_equal(out, w + BIN_WV + l * 2048, 2048 * sizeof(float));
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        assert_int_equal(kvq_gguf_rows_to_f32(kvq_gguf_find_tensor(g, name), 0, 1, out, &e),
                         KVQ_OK);
        assert_memory_equal(out, w + BIN_RMS_ATT + l * 64, 64 * sizeof(float));
    }
    assert_int_equal(
        kvq_gguf_rows_to_f32(kvq_gguf_find_tensor(g, "token_embd.weight"), 0, 512, out, &e),
        KVQ_OK);
    assert_memory_equal(out, w + BIN_TOK, 512 * 64 * sizeof(float));
    assert_int_equal(
        kvq_gguf_rows_to_f32(kvq_gguf_find_tensor(g, "output_norm.weight"), 0, 1, out, &e),
        KVQ_OK);
    assert_memory_equal(out, w + BIN_RMS_FINAL, 64 * sizeof(float));
    kvq_gguf_close(g);
    free(w);
    expect_llama2c_slices(path, bin);
}

/* ==========================================================================
 * corrupt files, each with its exact status
 * ========================================================================== */

static void test_bad_magic_and_version(void **state)
{
    base_file f;
    base_build(&f);
    expect_patched(&f, 0, 'X', 1, KVQ_E_BAD_MAGIC, "magic", "magic XGUF");
    expect_patched(&f, 3, 'f', 1, KVQ_E_BAD_MAGIC, "magic", "magic GGUf");
    expect_open((const uint8_t *)"GGX", 3, KVQ_E_BAD_MAGIC, NULL, "short bad magic");
    expect_open((const uint8_t *)"\x89PNG\r\n\x1a\n", 8, KVQ_E_BAD_MAGIC, NULL, "png");
    expect_patched(&f, f.version, 1, 4, KVQ_E_VERSION, "only versions 2 and 3", "version 1");
    expect_patched(&f, f.version, 4, 4, KVQ_E_VERSION, "version 4", "version 4");
    expect_patched(&f, f.version, 0, 4, KVQ_E_VERSION, NULL, "version 0");
    expect_patched(&f, f.version, 0x03000000, 4, KVQ_E_UNSUPPORTED, "big-endian", "byte-swapped 3");
    expect_patched(&f, f.version, 0x02000000, 4, KVQ_E_UNSUPPORTED, "big-endian", "byte-swapped 2");
    expect_patched(&f, f.version, 2, 4, KVQ_OK, NULL, "version 2");
    free(f.b.p);
}

static void test_truncated(void **state)
{
    base_file f;
    base_build(&f);
    char what[64];
    /* every cut inside the header */
    for (size_t cut = 0; cut < f.header_end; cut++) {
        snprintf(what, sizeof what, "header cut at %zu", cut);
        expect_open(f.b.p, cut, KVQ_E_TRUNCATED_HEADER, "ends inside", what);
    }
    /* in the padding before the data, and inside any tensor's bytes */
    for (size_t cut = f.header_end; cut < f.data_offset + f.data_used; cut++) {
        snprintf(what, sizeof what, "data cut at %zu", cut);
        expect_open(f.b.p, cut, KVQ_E_TRUNCATED_DATA, NULL, what);
    }
    /* the last tensor's trailing padding is optional */
    for (size_t cut = f.data_offset + f.data_used; cut <= f.b.n; cut++) {
        snprintf(what, sizeof what, "padding cut at %zu", cut);
        expect_open(f.b.p, cut, KVQ_OK, NULL, what);
    }
    /* a tensor that claims more rows than the file holds */
    expect_patched(&f, f.t_ne0[2], 12, 8, KVQ_E_TRUNCATED_DATA, "'c'", "c grows past the end");
    free(f.b.p);
}

static void test_huge_counts(void **state)
{
    base_file f;
    base_build(&f);
    const uint64_t big[] = {UINT64_C(1) << 60, UINT64_C(1) << 62, UINT64_MAX,
                            UINT64_C(1) << 49};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        expect_patched(&f, f.n_tensors, big[i], 8, KVQ_E_TOO_LARGE, "tensor count", "tensors");
        expect_patched(&f, f.n_kv, big[i], 8, KVQ_E_TOO_LARGE, "metadata count", "kv count");
        expect_patched(&f, f.key0_byte - 3 - 8, big[i], 8, KVQ_E_TOO_LARGE,
                       "length of a metadata key", "key len");
        expect_patched(&f, f.arch_len, big[i], 8, KVQ_E_TOO_LARGE, "length of a string",
                       "string len");
        expect_patched(&f, f.arr_count, big[i], 8, KVQ_E_TOO_LARGE, "array length", "array");
        expect_patched(&f, f.t_name[0] - 8, big[i], 8, KVQ_E_TOO_LARGE, "tensor name",
                       "name len");
    }
    /* i32 array of 2^47 items = 2^49 bytes: over the limit; 2^44 items: plausible */
    expect_patched(&f, f.arr_count, UINT64_C(1) << 47, 8, KVQ_E_TOO_LARGE, NULL, "arr 2^47");
    expect_patched(&f, f.arr_count, UINT64_C(1) << 44, 8, KVQ_E_TRUNCATED_HEADER, NULL,
                   "arr 2^44");
    /* plausible numbers that run past the end of this small file */
    expect_patched(&f, f.n_kv, 1000, 8, KVQ_E_TRUNCATED_HEADER, NULL, "kv count 1000");
    expect_patched(&f, f.n_tensors, 1000, 8, KVQ_E_TRUNCATED_HEADER, NULL, "tensors 1000");
    expect_patched(&f, f.arch_len, 100000, 8, KVQ_E_TRUNCATED_HEADER, NULL, "string 100000");
    /* tensor shapes */
    expect_patched(&f, f.t_ne0[0], UINT64_C(1) << 62, 8, KVQ_E_TOO_LARGE, "shape", "ne 2^62 x 2");
    expect_patched(&f, f.t_ne0[0], UINT64_MAX, 8, KVQ_E_TOO_LARGE, "shape", "ne -1");
    expect_patched(&f, f.t_ne0[1], UINT64_C(1) << 48, 8, KVQ_E_TOO_LARGE, NULL, "f16 2^49 bytes");
    /* zero rows of a huge width: an empty tensor, which opens and converts nothing */
    {
        uint8_t *p = malloc(f.b.n);
        memcpy(p, f.b.p, f.b.n);
        patch(p, f.t_ne0[0], UINT64_C(1) << 62, 8);
        patch(p, f.t_ne1, 0, 8);
        kvq_gguf *g = NULL;
        kvq_err e = {0};
        assert_int_equal(kvq_gguf_open_memory(p, f.b.n, NULL, &g, &e), KVQ_OK);
        const kvq_gguf_tensor *t = kvq_gguf_find_tensor(g, "a");
        assert_int_equal(t->nbytes, 0);
        assert_int_equal(kvq_gguf_tensor_rows(t), 0);
        float out[1];
        assert_int_equal(kvq_gguf_rows_to_f32(t, 0, 0, out, &e), KVQ_OK);
        assert_int_equal(kvq_gguf_rows_to_f32(t, 0, 1, out, &e), KVQ_E_INVALID_ARG);
        kvq_gguf_close(g);
        free(p);
    }
    free(f.b.p);
}

static void test_bad_metadata(void **state)
{
    base_file f;
    base_build(&f);
    /* value types */
    expect_patched(&f, f.kv_type[0], 13, 4, KVQ_E_CORRUPT, "bad value type 13", "type 13");
    expect_patched(&f, f.kv_type[5], 0xffffffffu, 4, KVQ_E_CORRUPT, "bad value type", "type -1");
    expect_patched(&f, f.arr_type, 99, 4, KVQ_E_CORRUPT, "element type 99", "array of 99");
    expect_patched(&f, f.nested_inner_type, 13, 4, KVQ_E_CORRUPT, "element type", "inner 13");
    expect_patched(&f, f.flag_value, 2, 1, KVQ_E_CORRUPT, "bool", "bool 2");
    /* keys */
    expect_patched(&f, f.key0_byte, 0xff, 1, KVQ_E_BAD_UTF8, "UTF-8", "key 0xff");
    expect_patched(&f, f.key0_byte, 0xc0, 1, KVQ_E_BAD_UTF8, "UTF-8", "key lone lead byte");
    expect_patched(&f, f.key0_byte, 0, 1, KVQ_E_CORRUPT, "NUL", "key with NUL");
    expect_patched(&f, f.dupkey_byte, 'a', 1, KVQ_E_CORRUPT, "duplicate key 'test.aa'",
                   "duplicate key");
    /* alignment */
    expect_patched(&f, f.align_value, 0, 4, KVQ_E_CORRUPT, "general.alignment", "align 0");
    expect_patched(&f, f.align_value, 3, 4, KVQ_E_CORRUPT, "general.alignment", "align 3");
    expect_patched(&f, f.align_value, 48, 4, KVQ_E_CORRUPT, "general.alignment", "align 48");
    expect_patched(&f, f.align_type, KVQ_GGUF_FLOAT32, 4, KVQ_E_CORRUPT, "general.alignment",
                   "align as f32");
    expect_patched(&f, f.align_type, KVQ_GGUF_INT32, 4, KVQ_OK, NULL, "align as i32 32");
    /* 64: tensor b (offset 64) is fine, c (offset 96) is misaligned */
    expect_patched(&f, f.align_value, 64, 4, KVQ_E_CORRUPT, "'c' offset 96", "align 64");
    {
        uint8_t *p = malloc(f.b.n);
        memcpy(p, f.b.p, f.b.n);
        patch(p, f.align_value, 16, 4);
        kvq_gguf *g = NULL;
        kvq_err e = {0};
        const uint64_t want = (f.header_end + 15) & ~(uint64_t)15;
        /* the data section moves, so the tensors may now run past the end */
        const kvq_status st = kvq_gguf_open_memory(p, f.b.n, "t.gguf", &g, &e);
        assert_int_equal(st, want + f.data_used <= f.b.n ? KVQ_OK : KVQ_E_TRUNCATED_DATA);
        if (g) {
            assert_int_equal(kvq_gguf_alignment(g), 16);
            assert_int_equal(kvq_gguf_data_offset(g), want);
        }
        kvq_gguf_close(g);
        free(p);
    }
    free(f.b.p);
}

static void test_bad_tensors(void **state)
{
    base_file f;
    base_build(&f);
    /* types */
    expect_patched(&f, f.t_type[1], 99, 4, KVQ_E_UNSUPPORTED, "unknown ggml type 99", "type 99");
    expect_patched(&f, f.t_type[1], 4, 4, KVQ_E_UNSUPPORTED, "type 4", "removed type 4");
    expect_patched(&f, f.t_type[0], KVQ_GGML_Q8_0, 4, KVQ_E_CORRUPT, "block size",
                   "Q8_0 with ne[0] = 8");
    /* dimensions */
    expect_patched(&f, f.t_ndim[1], 0, 4, KVQ_E_CORRUPT, "0 dimensions", "ndim 0");
    expect_patched(&f, f.t_ndim[1], 5, 4, KVQ_E_CORRUPT, "5 dimensions", "ndim 5");
    /* names */
    expect_patched(&f, f.t_name[1], 'a', 1, KVQ_E_CORRUPT, "duplicate tensor 'a'", "dup name");
    expect_patched(&f, f.t_name[1], 0xfe, 1, KVQ_E_BAD_UTF8, "UTF-8", "name 0xfe");
    /* offsets */
    expect_patched(&f, f.t_off[1], 68, 8, KVQ_E_CORRUPT, "not a multiple", "misaligned b");
    expect_patched(&f, f.t_off[2], 97, 8, KVQ_E_CORRUPT, "not a multiple", "misaligned c");
    expect_patched(&f, f.t_off[1], 32, 8, KVQ_E_OVERLAP, "'a' and 'b'", "b inside a");
    expect_patched(&f, f.t_off[2], 64, 8, KVQ_E_OVERLAP, "overlap", "c on b");
    expect_patched(&f, f.t_off[0], 64, 8, KVQ_E_OVERLAP, "overlap", "a on b");
    expect_patched(&f, f.t_off[2], 1 << 20, 8, KVQ_E_OUT_OF_BOUNDS, "outside", "c far away");
    expect_patched(&f, f.t_off[2], 128, 8, KVQ_E_OUT_OF_BOUNDS, "outside", "c just past end");
    expect_patched(&f, f.t_off[2], UINT64_MAX - 31, 8, KVQ_E_OUT_OF_BOUNDS, "outside",
                   "c offset near 2^64");
    expect_patched(&f, f.t_off[0], UINT64_MAX - 31, 8, KVQ_E_OUT_OF_BOUNDS, "out of bounds",
                   "a offset + size wraps");
    /* tensors may come in any order: swap a and c, leaving a gap; still fine */
    {
        uint8_t *p = malloc(f.b.n);
        memcpy(p, f.b.p, f.b.n);
        patch(p, f.t_off[0], 0, 8);
        patch(p, f.t_off[1], 96, 8); /* b now holds bytes 96..127: the padding */
        patch(p, f.t_off[2], 64, 8);
        expect_open(p, f.b.n, KVQ_OK, NULL, "reordered offsets");
        free(p);
    }
    free(f.b.p);
}

static void test_nesting_split_and_empty(void **state)
{
    /* arrays nested KVQ_GGUF_MAX_NESTING deep open; one more is TOO_LARGE */
    for (int depth = KVQ_GGUF_MAX_NESTING; depth <= KVQ_GGUF_MAX_NESTING + 1; depth++) {
        bb b = {0};
        bb_put(&b, "GGUF", 4);
        bb_u32(&b, 3);
        bb_u64(&b, 0);
        bb_u64(&b, 1);
        bb_str(&b, "deep");
        bb_u32(&b, KVQ_GGUF_ARRAY);
        for (int i = 0; i < depth; i++) {
            bb_u32(&b, i == depth - 1 ? KVQ_GGUF_UINT8 : KVQ_GGUF_ARRAY);
            bb_u64(&b, 1);
        }
        bb_uint(&b, 7, 1);
        expect_open(b.p, b.n, depth <= KVQ_GGUF_MAX_NESTING ? KVQ_OK : KVQ_E_TOO_LARGE,
                    depth <= KVQ_GGUF_MAX_NESTING ? NULL : "nested", "nesting");
        free(b.p);
    }
    /* a file with nothing in it */
    {
        bb b = {0};
        bb_put(&b, "GGUF", 4);
        bb_u32(&b, 3);
        bb_u64(&b, 0);
        bb_u64(&b, 0);
        kvq_gguf *g = NULL;
        kvq_err e = {0};
        assert_int_equal(kvq_gguf_open_memory(b.p, b.n, NULL, &g, &e), KVQ_OK);
        assert_int_equal(kvq_gguf_kv_count(g), 0);
        assert_int_equal(kvq_gguf_tensor_count(g), 0);
        assert_null(kvq_gguf_get(g, "x"));
        assert_null(kvq_gguf_find_tensor(g, "x"));
        kvq_gguf_close(g);
        free(b.p);
    }
    /* split files */
    for (uint64_t parts = 1; parts <= 3; parts++) {
        kvq_gguf_writer *w = kvq_gguf_writer_new();
        kvq_err e = {0};
        const kvq_gguf_value v = {.type = KVQ_GGUF_UINT16, .v.u = parts};
        assert_int_equal(kvq_gguf_writer_set(w, "split.count", &v, &e), KVQ_OK);
        void *buf = NULL;
        size_t n = 0;
        assert_int_equal(kvq_gguf_writer_to_buffer(w, &buf, &n, &e), KVQ_OK);
        expect_open(buf, n, parts > 1 ? KVQ_E_UNSUPPORTED : KVQ_OK,
                    parts > 1 ? "split GGUF" : NULL, "split");
        free(buf);
        kvq_gguf_writer_free(w);
    }
    /* open on a missing path */
    kvq_gguf *g = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_gguf_open(test_path("missing.gguf"), &g, &e), KVQ_E_NOT_FOUND);
    assert_null(g);
}

/* ==========================================================================
 * Q8_0
 * ========================================================================== */

static void test_q8_0(void **state)
{
    enum { NB = 300, N = NB * 32 };
    float *x = malloc(N * sizeof *x), *ref = malloc(N * sizeof *ref),
          *out = malloc(N * sizeof *out);
    uint8_t *q = malloc(NB * 34 + 1);
    assert_true(x && ref && out && q);
    kvq_rng rng;
    kvq_rng_seed(&rng, 5);
    for (int i = 0; i < N; i++)
        x[i] = (float)kvq_rng_normal(&rng) * (float)(1 + i / 32);
    for (int i = 0; i < 32; i++) /* block 0: all zeros; block 1: exact multiples */
        x[i] = 0.0f, x[32 + i] = (float)(i - 16) * 0.5f;
    x[32] = -63.5f; /* max |x| = 63.5, d = 0.5 */
    kvq_quant_q8_0_ref(x, q, N);
    assert_int_equal(q[0] | q[1] << 8, 0);
    assert_int_equal(q[34] | q[35] << 8, kvq_f32_to_f16_ref(0.5f));
    assert_int_equal((int8_t)q[36], -127);
    kvq_dequant_q8_0_ref(q, ref, N);
    for (int i = 0; i < 64; i++)
        assert_true(ref[i] == x[i]); /* exactly representable blocks come back exactly */
    for (int b = 0; b < NB; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[b * 32 + i]));
        const float d = kvq_f16_to_f32_ref(kvq_f32_to_f16_ref(amax / 127.0f));
        for (int i = 0; i < 32; i++) /* half a step, plus the f16 rounding of d */
            assert_true(fabsf(ref[b * 32 + i] - x[b * 32 + i]) <= 0.5f * d + 127.0f * d / 1024.0f);
    }
    /* fast paths == reference, bit for bit, on valid and on random bytes (every kind
     * of f16 scale: subnormal, Inf, NaN), at an odd address */
    for (int round = 0; round < 2; round++) {
        uint8_t *src = q + round;
        if (round == 1)
            for (int i = 0; i < NB * 34; i++)
                src[i] = (uint8_t)kvq_rng_u64(&rng);
        kvq_dequant_q8_0_ref(src, ref, N);
        void (*paths[3])(const void *, float *, size_t) = {kvq_dequant_q8_0, NULL, NULL};
#if KVQ_HAVE_X86_SIMD
        if (kvq_half_simd_level() >= KVQ_SIMD_AVX2)
            paths[1] = kvq_dequant_q8_0_avx2;
        if (kvq_half_simd_level() >= KVQ_SIMD_AVX512)
            paths[2] = kvq_dequant_q8_0_avx512;
#endif
        for (int p = 0; p < 3; p++) {
            if (!paths[p])
                continue;
            for (size_t n = 0; n <= N; n += (n < 96 ? 32 : 32 * 37)) {
                memset(out, 0xee, N * sizeof *out);
                paths[p](src, out, n);
                assert_memory_equal(out, ref, n * sizeof *out);
                if (n < N)
                    assert_int_equal(((uint32_t *)out)[n], 0xeeeeeeeeu);
            }
            paths[p](src, out, N);
            assert_memory_equal(out, ref, N * sizeof *out);
        }
    }
    /* non-finite input: a NaN block */
    x[5] = NAN;
    kvq_quant_q8_0_ref(x, q, 32);
    kvq_dequant_q8_0_ref(q, ref, 32);
    for (int i = 0; i < 32; i++)
        assert_true(isnan(ref[i]));
    free(x);
    free(ref);
    free(out);
    free(q);
}

/* ==========================================================================
 * writer round trips
 * ========================================================================== */

/* Copies everything a reader holds into a new writer. */
static kvq_gguf_writer *writer_from(const kvq_gguf *g)
{
    kvq_gguf_writer *w = kvq_gguf_writer_new();
    kvq_err e = {0};
    assert_non_null(w);
    for (size_t i = 0; i < kvq_gguf_kv_count(g); i++) {
        const kvq_gguf_kv *kv = kvq_gguf_kv_at(g, i);
        assert_int_equal(kvq_gguf_writer_set(w, kv->key, &kv->value, &e), KVQ_OK);
    }
    for (size_t i = 0; i < kvq_gguf_tensor_count(g); i++) {
        const kvq_gguf_tensor *t = kvq_gguf_tensor_at(g, i);
        assert_int_equal(kvq_gguf_writer_add_tensor(w, t->name, t->type, t->ndim, t->ne, t->data,
                                                    t->nbytes, &e),
                         KVQ_OK);
    }
    return w;
}

/* The writer reproduces the hand-built base file byte for byte. */
static void test_writer_matches_builder(void **state)
{
    base_file f;
    base_build(&f);
    kvq_gguf *g = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_gguf_open_memory(f.b.p, f.b.n, NULL, &g, &e), KVQ_OK);
    kvq_gguf_writer *w = writer_from(g);
    void *buf = NULL;
    size_t n = 0;
    assert_int_equal(kvq_gguf_writer_to_buffer(w, &buf, &n, &e), KVQ_OK);
    assert_int_equal(n, f.b.n);
    assert_memory_equal(buf, f.b.p, n);
    free(buf);
    kvq_gguf_writer_free(w);
    kvq_gguf_close(g);
    free(f.b.p);
}

static void test_writer_round_trip(void **state)
{
    kvq_err e = {0};
    kvq_gguf_writer *w = kvq_gguf_writer_new();
    assert_non_null(w);

    /* every scalar type, at its extremes */
    const kvq_gguf_value scalars[] = {
        {.type = KVQ_GGUF_UINT8, .v.u = 255},      {.type = KVQ_GGUF_INT8, .v.i = -128},
        {.type = KVQ_GGUF_UINT16, .v.u = 65535},   {.type = KVQ_GGUF_INT16, .v.i = -32768},
        {.type = KVQ_GGUF_UINT32, .v.u = UINT32_MAX}, {.type = KVQ_GGUF_INT32, .v.i = INT32_MIN},
        {.type = KVQ_GGUF_FLOAT32, .v.f = -0.125}, {.type = KVQ_GGUF_BOOL, .v.u = 1},
        {.type = KVQ_GGUF_UINT64, .v.u = UINT64_MAX}, {.type = KVQ_GGUF_INT64, .v.i = INT64_MIN},
        {.type = KVQ_GGUF_FLOAT64, .v.f = 1e300},
    };
    char key[32];
    for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++) {
        snprintf(key, sizeof key, "s.%s", kvq_gguf_type_name(scalars[i].type));
        assert_int_equal(kvq_gguf_writer_set(w, key, &scalars[i], &e), KVQ_OK);
    }
    /* a signalling-NaN f32 keeps its payload */
    double snan;
    const uint64_t snan_bits = UINT64_C(0x7ff0000020000000); /* f32 0x7f800001 */
    memcpy(&snan, &snan_bits, 8);
    const kvq_gguf_value nanv = {.type = KVQ_GGUF_FLOAT32, .v.f = snan};
    assert_int_equal(kvq_gguf_writer_set(w, "s.snan", &nanv, &e), KVQ_OK);
    /* strings with a NUL inside and bytes that are not UTF-8 */
    const kvq_gguf_value str = {.type = KVQ_GGUF_STRING, .v.str = {"a\0b\xff", 4}};
    assert_int_equal(kvq_gguf_writer_set(w, "s.str", &str, &e), KVQ_OK);
    /* nested arrays: arr<arr<str>>, arr<arr<arr<u8>>>, empty arrays */
    kvq_gguf_value strs[3] = {{.type = KVQ_GGUF_STRING, .v.str = {"x", 1}},
                              {.type = KVQ_GGUF_STRING, .v.str = {"", 0}},
                              {.type = KVQ_GGUF_STRING, .v.str = {"\xe2\x96\x81yz", 5}}};
    kvq_gguf_value inner[2] = {
        {.type = KVQ_GGUF_ARRAY, .v.arr = {KVQ_GGUF_STRING, 3, strs}},
        {.type = KVQ_GGUF_ARRAY, .v.arr = {KVQ_GGUF_STRING, 0, NULL}}};
    const kvq_gguf_value nested = {.type = KVQ_GGUF_ARRAY, .v.arr = {KVQ_GGUF_ARRAY, 2, inner}};
    assert_int_equal(kvq_gguf_writer_set(w, "a.nested", &nested, &e), KVQ_OK);
    kvq_gguf_value bytes[2] = {{.type = KVQ_GGUF_UINT8, .v.u = 1}, {.type = KVQ_GGUF_UINT8, .v.u = 2}};
    kvq_gguf_value lvl2 = {.type = KVQ_GGUF_ARRAY, .v.arr = {KVQ_GGUF_UINT8, 2, bytes}};
    kvq_gguf_value lvl1 = {.type = KVQ_GGUF_ARRAY, .v.arr = {KVQ_GGUF_ARRAY, 1, &lvl2}};
    const kvq_gguf_value lvl0 = {.type = KVQ_GGUF_ARRAY, .v.arr = {KVQ_GGUF_ARRAY, 1, &lvl1}};
    assert_int_equal(kvq_gguf_writer_set(w, "a.deep", &lvl0, &e), KVQ_OK);
    const kvq_gguf_value empty = {.type = KVQ_GGUF_ARRAY, .v.arr = {KVQ_GGUF_FLOAT64, 0, NULL}};
    assert_int_equal(kvq_gguf_writer_set(w, "a.empty", &empty, &e), KVQ_OK);
    /* replacing a key keeps its place */
    const kvq_gguf_value u8b = {.type = KVQ_GGUF_UINT8, .v.u = 7};
    assert_int_equal(kvq_gguf_writer_set(w, "s.u8", &u8b, &e), KVQ_OK);

    /* tensors: F32, F16, BF16, Q8_0 (quantized here), Q4_K (arbitrary bytes), I8 */
    enum { R = 3, C = 64 };
    static float src[R * C];
    static uint16_t h16[R * C], b16[R * C];
    static uint8_t q8[R * C / 32 * 34], q4k[2 * 144];
    kvq_rng rng;
    kvq_rng_seed(&rng, 9);
    for (int i = 0; i < R * C; i++)
        src[i] = (float)kvq_rng_normal(&rng);
    kvq_f32_to_f16(src, h16, R * C);
    kvq_f32_to_bf16(src, b16, R * C);
    kvq_quant_q8_0_ref(src, q8, R * C);
    for (size_t i = 0; i < sizeof q4k; i++)
        q4k[i] = (uint8_t)i;
    const int64_t ne[2] = {C, R}, ne_k[2] = {256, 2}, ne_i8[1] = {5};
    assert_int_equal(kvq_gguf_writer_add_tensor(w, "f32", KVQ_GGML_F32, 2, ne, src, sizeof src, &e),
                     KVQ_OK);
    assert_int_equal(kvq_gguf_writer_add_tensor(w, "f16", KVQ_GGML_F16, 2, ne, h16, sizeof h16, &e),
                     KVQ_OK);
    assert_int_equal(kvq_gguf_writer_add_tensor(w, "bf16", KVQ_GGML_BF16, 2, ne, b16, sizeof b16, &e),
                     KVQ_OK);
    assert_int_equal(kvq_gguf_writer_add_tensor(w, "q8", KVQ_GGML_Q8_0, 2, ne, q8, sizeof q8, &e),
                     KVQ_OK);
    assert_int_equal(kvq_gguf_writer_add_tensor(w, "q4k", KVQ_GGML_Q4_K, 2, ne_k, q4k, sizeof q4k, &e),
                     KVQ_OK);
    assert_int_equal(kvq_gguf_writer_add_tensor(w, "i8", KVQ_GGML_I8, 1, ne_i8, "abcde", 5, &e),
                     KVQ_OK);

    /* deterministic: two serializations and the atomic file are the same bytes */
    void *b1 = NULL, *b2 = NULL;
    size_t n1 = 0, n2 = 0;
    assert_int_equal(kvq_gguf_writer_to_buffer(w, &b1, &n1, &e), KVQ_OK);
    assert_int_equal(kvq_gguf_writer_to_buffer(w, &b2, &n2, &e), KVQ_OK);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    const char *path = test_path("rt.gguf");
    assert_int_equal(kvq_gguf_writer_write(w, path, 0, &e), KVQ_OK);
    assert_int_equal(kvq_gguf_writer_write(w, path, 0, &e), KVQ_E_EXISTS);
    assert_int_equal(kvq_gguf_writer_write(w, path, 1, &e), KVQ_OK);
    uint8_t *fb = NULL;
    size_t fn = 0;
    assert_int_equal(kvq_read_file(path, &fb, &fn, &e), KVQ_OK);
    assert_int_equal(fn, n1);
    assert_memory_equal(fb, b1, n1);
    free(fb);

    /* read back */
    kvq_gguf *g = NULL;
    assert_int_equal(kvq_gguf_open(path, &g, &e), KVQ_OK);
    assert_int_equal(kvq_gguf_version(g), 3);
    assert_int_equal(kvq_gguf_kv_count(g), sizeof scalars / sizeof scalars[0] + 5);
    assert_string_equal(kvq_gguf_kv_at(g, 0)->key, "s.u8");
    assert_int_equal(kvq_gguf_kv_at(g, 0)->value.v.u, 7);
    for (size_t i = 1; i < sizeof scalars / sizeof scalars[0]; i++) {
        snprintf(key, sizeof key, "s.%s", kvq_gguf_type_name(scalars[i].type));
        const kvq_gguf_value *v = kvq_gguf_get(g, key);
        assert_non_null(v);
        assert_true(kvq_gguf_value_equal(v, &scalars[i]));
    }
    assert_true(kvq_gguf_value_equal(kvq_gguf_get(g, "s.snan"), &nanv));
    assert_true(kvq_gguf_value_equal(kvq_gguf_get(g, "s.str"), &str));
    assert_true(kvq_gguf_value_equal(kvq_gguf_get(g, "a.nested"), &nested));
    assert_true(kvq_gguf_value_equal(kvq_gguf_get(g, "a.deep"), &lvl0));
    assert_true(kvq_gguf_value_equal(kvq_gguf_get(g, "a.empty"), &empty));
    assert_false(kvq_gguf_value_equal(kvq_gguf_get(g, "a.nested"), &lvl0));

    float out[R * C], want[R * C];
    const kvq_gguf_tensor *t = kvq_gguf_find_tensor(g, "f32");
    assert_int_equal(t->offset % 32, 0);
    assert_int_equal(kvq_gguf_rows_to_f32(t, 0, R, out, &e), KVQ_OK);
    assert_memory_equal(out, src, sizeof src);
    assert_int_equal(kvq_gguf_rows_to_f32(kvq_gguf_find_tensor(g, "f16"), 1, 2, out, &e), KVQ_OK);
    kvq_f16_to_f32_scalar(h16 + C, want, 2 * C);
    assert_memory_equal(out, want, 2 * C * sizeof(float));
    assert_int_equal(kvq_gguf_rows_to_f32(kvq_gguf_find_tensor(g, "bf16"), 0, R, out, &e), KVQ_OK);
    kvq_bf16_to_f32_scalar(b16, want, R * C);
    assert_memory_equal(out, want, sizeof want);
    t = kvq_gguf_find_tensor(g, "q8");
    assert_int_equal(t->nbytes, sizeof q8);
    assert_int_equal(kvq_gguf_rows_to_f32(t, 2, 1, out, &e), KVQ_OK);
    kvq_dequant_q8_0_ref(q8 + 2 * 68, want, C);
    assert_memory_equal(out, want, C * sizeof(float));
    t = kvq_gguf_find_tensor(g, "q4k");
    assert_int_equal(t->nbytes, 288);
    assert_memory_equal(t->data, q4k, 288);
    /* Q4_K converts through kvq/quant.h (tests/test_quant.c checks the values) */
    float k_out[256], k_want[256];
    assert_int_equal(kvq_gguf_rows_to_f32(t, 1, 1, k_out, &e), KVQ_OK);
    assert_int_equal(kvq_dequantize_ref(KVQ_GGML_Q4_K, q4k + 144, k_want, 256, &e), KVQ_OK);
    assert_memory_equal(k_out, k_want, sizeof k_want);
    assert_int_equal(kvq_gguf_rows_to_f32(kvq_gguf_find_tensor(g, "i8"), 0, 1, out, &e),
                     KVQ_E_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "I8"));

    /* read -> write again gives the same bytes */
    kvq_gguf_writer *w2 = writer_from(g);
    void *b3 = NULL;
    size_t n3 = 0;
    assert_int_equal(kvq_gguf_writer_to_buffer(w2, &b3, &n3, &e), KVQ_OK);
    assert_int_equal(n3, n1);
    assert_memory_equal(b3, b1, n1);
    free(b3);
    kvq_gguf_writer_free(w2);
    kvq_gguf_close(g);
    free(b1);
    free(b2);
    kvq_gguf_writer_free(w);
}

/* Alignment 1 puts an f16 tensor at an odd address: conversion still works. */
static void test_writer_alignment(void **state)
{
    kvq_err e = {0};
    for (uint32_t align = 1; align <= 256; align *= 4) {
        kvq_gguf_writer *w = kvq_gguf_writer_new();
        const kvq_gguf_value a = {.type = KVQ_GGUF_UINT32, .v.u = align};
        assert_int_equal(kvq_gguf_writer_set(w, "general.alignment", &a, &e), KVQ_OK);
        const int64_t n3[1] = {3}, n40[1] = {40};
        uint16_t h[40];
        for (int i = 0; i < 40; i++)
            h[i] = kvq_f32_to_f16_ref((float)i - 20.0f);
        assert_int_equal(kvq_gguf_writer_add_tensor(w, "odd", KVQ_GGML_I8, 1, n3, "xyz", 3, &e),
                         KVQ_OK);
        assert_int_equal(kvq_gguf_writer_add_tensor(w, "h", KVQ_GGML_F16, 1, n40, h, 80, &e),
                         KVQ_OK);
        void *buf = NULL;
        size_t n = 0;
        assert_int_equal(kvq_gguf_writer_to_buffer(w, &buf, &n, &e), KVQ_OK);
        /* at both parities of the buffer address, so one of them puts "h" at an odd
         * address (the reader accepts any buffer address) */
        uint8_t *shifted = malloc(n + 1);
        assert_non_null(shifted);
        int odd_seen = 0;
        for (int shift = 0; shift < 2; shift++) {
            memcpy(shifted + shift, buf, n);
            kvq_gguf *g = NULL;
            assert_int_equal(kvq_gguf_open_memory(shifted + shift, n, NULL, &g, &e), KVQ_OK);
            assert_int_equal(kvq_gguf_alignment(g), align);
            assert_int_equal(kvq_gguf_data_offset(g) % align, 0);
            const kvq_gguf_tensor *t = kvq_gguf_find_tensor(g, "h");
            assert_int_equal(t->offset, align == 1 ? 3 : align);
            odd_seen |= (int)((uintptr_t)t->data & 1);
            float out[40];
            assert_int_equal(kvq_gguf_rows_to_f32(t, 0, 1, out, &e), KVQ_OK);
            for (int i = 0; i < 40; i++)
                assert_true(out[i] == (float)i - 20.0f);
            kvq_gguf_close(g);
        }
        assert_true(odd_seen);
        free(shifted);
        free(buf);
        kvq_gguf_writer_free(w);
    }
}

static void test_writer_errors(void **state)
{
    kvq_err e = {0};
    kvq_gguf_writer *w = kvq_gguf_writer_new();
    const kvq_gguf_value ok = {.type = KVQ_GGUF_UINT8, .v.u = 1};
    const kvq_gguf_value big = {.type = KVQ_GGUF_UINT8, .v.u = 256};
    const kvq_gguf_value neg = {.type = KVQ_GGUF_INT16, .v.i = -40000};
    const kvq_gguf_value badb = {.type = KVQ_GGUF_BOOL, .v.u = 2};
    const kvq_gguf_value badt = {.type = (kvq_gguf_type)13};
    assert_int_equal(kvq_gguf_writer_set(w, "", &ok, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_gguf_writer_set(w, "k\xff", &ok, &e), KVQ_E_BAD_UTF8);
    assert_int_equal(kvq_gguf_writer_set(w, "k", &big, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_gguf_writer_set(w, "k", &neg, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_gguf_writer_set(w, "k", &badb, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_gguf_writer_set(w, "k", &badt, &e), KVQ_E_INVALID_ARG);
    kvq_gguf_value mixed[2] = {{.type = KVQ_GGUF_UINT8, .v.u = 1}, {.type = KVQ_GGUF_INT8, .v.i = 1}};
    const kvq_gguf_value arr = {.type = KVQ_GGUF_ARRAY, .v.arr = {KVQ_GGUF_UINT8, 2, mixed}};
    assert_int_equal(kvq_gguf_writer_set(w, "k", &arr, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "item 1"));
    const kvq_gguf_value a3 = {.type = KVQ_GGUF_UINT32, .v.u = 3};
    assert_int_equal(kvq_gguf_writer_set(w, "general.alignment", &a3, &e), KVQ_E_INVALID_ARG);
    const kvq_gguf_value a64 = {.type = KVQ_GGUF_UINT64, .v.u = 64};
    assert_int_equal(kvq_gguf_writer_set(w, "general.alignment", &a64, &e), KVQ_E_INVALID_ARG);

    const float x[32] = {0};
    const int64_t ne[2] = {8, 4}, neg_ne[1] = {-1}, q[1] = {16};
    assert_int_equal(kvq_gguf_writer_add_tensor(w, "t", KVQ_GGML_F32, 2, ne, x, 128, &e), KVQ_OK);
    assert_int_equal(kvq_gguf_writer_add_tensor(w, "t", KVQ_GGML_F32, 2, ne, x, 128, &e),
                     KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_gguf_writer_add_tensor(w, "u", KVQ_GGML_F32, 2, ne, x, 124, &e),
                     KVQ_E_SHAPE_MISMATCH);
    assert_int_equal(kvq_gguf_writer_add_tensor(w, "u", 99, 2, ne, x, 128, &e), KVQ_E_UNSUPPORTED);
    assert_int_equal(kvq_gguf_writer_add_tensor(w, "u", KVQ_GGML_F32, 5, ne, x, 128, &e),
                     KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_gguf_writer_add_tensor(w, "u", KVQ_GGML_F32, 1, neg_ne, x, 0, &e),
                     KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_gguf_writer_add_tensor(w, "u", KVQ_GGML_Q8_0, 1, q, x, 17, &e),
                     KVQ_E_SHAPE_MISMATCH);
    assert_int_equal(kvq_gguf_writer_add_tensor(w, "", KVQ_GGML_F32, 2, ne, x, 128, &e),
                     KVQ_E_INVALID_ARG);
    /* failed calls left nothing behind */
    void *buf = NULL;
    size_t n = 0;
    assert_int_equal(kvq_gguf_writer_to_buffer(w, &buf, &n, &e), KVQ_OK);
    kvq_gguf *g = NULL;
    assert_int_equal(kvq_gguf_open_memory(buf, n, NULL, &g, &e), KVQ_OK);
    assert_int_equal(kvq_gguf_kv_count(g), 0);
    assert_int_equal(kvq_gguf_tensor_count(g), 1);
    kvq_gguf_close(g);
    free(buf);
    kvq_gguf_writer_free(w);
    kvq_gguf_writer_free(NULL);
}

static void test_type_names(void **state)
{
    assert_string_equal(kvq_ggml_type_name(KVQ_GGML_Q8_0), "Q8_0");
    assert_string_equal(kvq_ggml_type_name(KVQ_GGML_BF16), "BF16");
    assert_string_equal(kvq_ggml_type_name(KVQ_GGML_Q6_K), "Q6_K");
    assert_null(kvq_ggml_type_name(4));
    assert_null(kvq_ggml_type_name(40));
    assert_null(kvq_ggml_type_name(UINT32_MAX));
    uint32_t be = 0, bb_ = 0;
    static const struct { uint32_t type, elems, bytes; } layouts[] = {
        {KVQ_GGML_F32, 1, 4},     {KVQ_GGML_F16, 1, 2},     {KVQ_GGML_Q4_0, 32, 18},
        {KVQ_GGML_Q4_1, 32, 20},  {KVQ_GGML_Q5_0, 32, 22},  {KVQ_GGML_Q5_1, 32, 24},
        {KVQ_GGML_Q8_0, 32, 34},  {KVQ_GGML_Q8_1, 32, 36},  {KVQ_GGML_Q2_K, 256, 84},
        {KVQ_GGML_Q3_K, 256, 110}, {KVQ_GGML_Q4_K, 256, 144}, {KVQ_GGML_Q5_K, 256, 176},
        {KVQ_GGML_Q6_K, 256, 210}, {KVQ_GGML_Q8_K, 256, 292}, {KVQ_GGML_BF16, 1, 2},
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        assert_int_equal(kvq_ggml_type_layout(layouts[i].type, &be, &bb_), 0);
        assert_int_equal(be, layouts[i].elems);
        assert_int_equal(bb_, layouts[i].bytes);
    }
    assert_int_equal(kvq_ggml_type_layout(99, &be, &bb_), -1);
    assert_string_equal(kvq_gguf_type_name(KVQ_GGUF_STRING), "str");
    assert_string_equal(kvq_gguf_type_name(KVQ_GGUF_ARRAY), "arr");
    assert_string_equal(kvq_gguf_type_name(KVQ_GGUF_UINT32), "u32");
    assert_string_equal(kvq_gguf_type_name((kvq_gguf_type)77), "unknown");
}

static int teardown(void **state)
{
    test_tmpdir_cleanup();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type_names),
        cmocka_unit_test(test_base_file),
        cmocka_unit_test(test_model_header),
        cmocka_unit_test(test_model_weights),
        cmocka_unit_test(test_bad_magic_and_version),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_huge_counts),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_bad_tensors),
        cmocka_unit_test(test_nesting_split_and_empty),
        cmocka_unit_test(test_q8_0),
        cmocka_unit_test(test_writer_matches_builder),
        cmocka_unit_test(test_writer_round_trip),
        cmocka_unit_test(test_writer_alignment),
        cmocka_unit_test(test_writer_errors),
    };
    return cmocka_run_group_tests_name("gguf", tests, NULL, teardown);
}
