/* test_tokenizer.c — SPM (stories260K golden ids; its committed stand-in tiny_spm against
 * llama.cpp's ids; a llama2.c-style O(n^2) reference encoder; tiny in-memory vocabularies), byte-level and metaspace BPE from tokenizer.json
 * and GGUF, the pre-tokenizer split, llama2.c tokenizer.bin, pre-tokenized ids, and the
 * exact error statuses of malformed vocabularies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "helpers/testutil.h"
#include "helpers/tiny_spm.h"
#include "kvq/util.h"
#include "kvq.h"

#define SP "\xe2\x96\x81" /* U+2581 '▁' */

/* stories260K greedy generation (SOURCES.md): ids and text */
static const int32_t GOLD_IDS[48] = {
    403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
    401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385,
    328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267};
static const char GOLD_TEXT[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park. One day, she saw a big, red ball. She wanted to";

/* ---- helpers ------------------------------------------------------------------ */

static void encode_ok(const kvq_tokenizer *t, const char *s, size_t len, unsigned flags,
                      int32_t **ids, size_t *n)
{
    kvq_err e = {0};
    kvq_status st = kvq_tokenizer_encode(t, s, len, flags, ids, n, &e);
    if (st)
        fail_msg("encode failed: %s", e.msg);
}

static void assert_ids(const kvq_tokenizer *t, const char *s, const int32_t *want, size_t nw)
{
    int32_t *ids;
    size_t n;
    encode_ok(t, s, strlen(s), 0, &ids, &n);
    if (n != nw || memcmp(ids, want, n * sizeof *ids) != 0) {
        for (size_t i = 0; i < n; i++)
            printf("%d ", ids[i]);
        printf("\n");
        fail_msg("'%s': got %zu ids, want %zu", s, n, nw);
    }
    free(ids);
}

/* decode(encode(s)) == s */
static void assert_round_trip(const kvq_tokenizer *t, const char *s, size_t len)
{
    int32_t *ids;
    size_t n, m;
    char *back;
    kvq_err e = {0};
    encode_ok(t, s, len, 0, &ids, &n);
    assert_int_equal(kvq_tokenizer_decode(t, ids, n, 0, &back, &m, &e), KVQ_OK);
    assert_int_equal(m, len);
    assert_memory_equal(back, s, len);
    free(back);
    free(ids);
}

/* stories260K when ../shared has it (NULL, with a note, when not: the stand-in ran) */
static const char *stories_or_note(void)
{
    const char *p = test_model_path();
    if (!p)
        printf("[          ] stories260K absent: checked on tiny_spm only\n");
    return p;
}

static kvq_tokenizer *load_gguf_tok(const char *path)
{
    kvq_err e = {0};
    kvq_gguf *g = NULL;
    kvq_tokenizer *t = NULL;
    assert_int_equal(kvq_gguf_open(path, &g, &e), KVQ_OK);
    if (kvq_tokenizer_from_gguf(g, path, NULL, &t, &e))
        fail_msg("%s", e.msg);
    kvq_gguf_close(g); /* the tokenizer keeps its own copy */
    return t;
}

/* llama2.c's encoder, written the slow obvious way on top of the public lookups: dummy
 * prefix, code points (unknown ones as <0xHH> byte tokens right away), then merge the
 * best-scoring adjacent pair (strictly greater wins, so the leftmost of equals) until no
 * pair's concatenation is a token. */
static size_t ref_spm_encode(const kvq_tokenizer *t, const char *text, int32_t *out)
{
    size_t n = 0, len = strlen(text);
    char *esc = malloc(3 * len + 4), *cat = malloc(8 * len + 16);
    size_t w = 0;
    if (len > 0) {
        memcpy(esc, SP, 3);
        w = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(esc + w, SP, 3);
            w += 3;
        } else {
            esc[w++] = text[i];
        }
    }
    for (size_t i = 0; i < w;) {
        size_t k = 1;
        unsigned char c = (unsigned char)esc[i];
        if (c >= 0xC0) {
            size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            while (k < need && i + k < w && ((unsigned char)esc[i + k] & 0xC0) == 0x80)
                k++;
            if (k != need || !kvq_utf8_valid(esc + i, k))
                k = 1;
        }
        int32_t id = kvq_tokenizer_find(t, esc + i, k);
        if (id >= 0) {
            out[n++] = id;
        } else {
            for (size_t b = 0; b < k; b++) {
                char name[8];
                snprintf(name, sizeof name, "<0x%02X>", (unsigned char)esc[i + b]);
                out[n++] = kvq_tokenizer_find(t, name, 6);
            }
        }
        i += k;
    }
    for (;;) {
        float best = -1e30f;
        int32_t best_id = -1;
        size_t best_i = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            size_t a, b;
            const char *sa = kvq_tokenizer_token_str(t, out[i], &a);
            const char *sb = kvq_tokenizer_token_str(t, out[i + 1], &b);
            memcpy(cat, sa, a);
            memcpy(cat + a, sb, b);
            int32_t id = kvq_tokenizer_find(t, cat, a + b);
            if (id >= 0 && kvq_tokenizer_score(t, id) > best) {
                best = kvq_tokenizer_score(t, id);
                best_id = id;
                best_i = i;
            }
        }
        if (best_id < 0)
            break;
        out[best_i] = best_id;
        memmove(out + best_i + 1, out + best_i + 2, (n - best_i - 2) * sizeof *out);
        n--;
    }
    free(esc);
    free(cat);
    return n;
}

/* ---- SPM on stories260K ---------------------------------------------------------- */

/* The stand-in (tests/data/tiny_spm.gguf): its vocabulary's layout, llama.cpp's ids for
 * every golden text, llama.cpp's greedy text from its ids, BOS/EOS flags. */
static void spm_golden_tiny(void)
{
    tiny_spm_gold *gd = tiny_spm_gold_load();
    kvq_tokenizer *t = load_gguf_tok(TINY_SPM_GGUF);
    kvq_err e = {0};
    assert_int_equal(kvq_tokenizer_kind_of(t), KVQ_TOKENIZER_SPM);
    assert_string_equal(kvq_tokenizer_model(t), "llama");
    assert_int_equal(kvq_tokenizer_n_vocab(t), gd->n_vocab);
    assert_int_equal(kvq_tokenizer_bos(t), 1);
    assert_int_equal(kvq_tokenizer_eos(t), 2);
    assert_int_equal(kvq_tokenizer_unk(t), 0);
    assert_int_equal(kvq_tokenizer_add_bos(t), 1);
    for (size_t i = 0; i < gd->n_texts; i++)
        assert_ids(t, gd->texts[i].text, gd->texts[i].ids, gd->texts[i].n);
    char *text;
    size_t len;
    assert_int_equal(kvq_tokenizer_decode(t, gd->greedy.ids, gd->greedy.n, 0, &text, &len, &e),
                     KVQ_OK);
    assert_string_equal(text, gd->greedy.text);
    free(text);
    const tiny_spm_text *x = &gd->texts[0];
    int32_t *ids;
    size_t n;
    encode_ok(t, x->text, strlen(x->text), KVQ_ENCODE_BOS | KVQ_ENCODE_EOS, &ids, &n);
    assert_int_equal(n, x->n + 2);
    assert_int_equal(ids[0], 1);
    assert_memory_equal(ids + 1, x->ids, x->n * sizeof *ids);
    assert_int_equal(ids[n - 1], 2);
    free(ids);
    assert_string_equal(kvq_tokenizer_token_str(t, 3 + 'A', NULL), "<0x41>");
    assert_int_equal(kvq_tokenizer_token_type(t, 3 + 'A'), KVQ_TOKEN_BYTE);
    assert_int_equal(kvq_tokenizer_token_type(t, 1), KVQ_TOKEN_CONTROL);
    size_t pl;
    const char *pc = kvq_tokenizer_piece(t, 3 + 0x0A, &pl);
    assert_int_equal(pl, 1);
    assert_int_equal(pc[0], '\n');
    assert_int_equal(kvq_tokenizer_find(t, SP "the", strlen(SP "the")), x->ids[11]);
    assert_null(kvq_tokenizer_token_str(t, gd->n_vocab, NULL));
    encode_ok(t, "", 0, 0, &ids, &n);
    assert_int_equal(n, 0);
    free(ids);
    kvq_tokenizer_free(t);
    tiny_spm_gold_free(gd);
}

static void test_spm_stories_golden(void **state)
{
    spm_golden_tiny();
    const char *path = stories_or_note();
    if (!path)
        return;
    kvq_tokenizer *t = load_gguf_tok(path);
    kvq_err e = {0};
    assert_int_equal(kvq_tokenizer_kind_of(t), KVQ_TOKENIZER_SPM);
    assert_string_equal(kvq_tokenizer_model(t), "llama");
    assert_int_equal(kvq_tokenizer_n_vocab(t), 512);
    assert_int_equal(kvq_tokenizer_bos(t), 1);
    assert_int_equal(kvq_tokenizer_eos(t), 2);
    assert_int_equal(kvq_tokenizer_unk(t), 0);
    assert_int_equal(kvq_tokenizer_add_bos(t), 1);

    /* decoding the model's own greedy output gives exactly the SOURCES.md text */
    char *text;
    size_t len;
    assert_int_equal(kvq_tokenizer_decode(t, GOLD_IDS, 48, 0, &text, &len, &e), KVQ_OK);
    assert_string_equal(text, GOLD_TEXT);
    assert_int_equal(len, strlen(GOLD_TEXT));
    free(text);
    /* with BOS in front (how llama2.c prints it) the result is the same */
    int32_t with_bos[49] = {1};
    memcpy(with_bos + 1, GOLD_IDS, sizeof GOLD_IDS);
    assert_int_equal(kvq_tokenizer_decode(t, with_bos, 49, 0, &text, &len, &e), KVQ_OK);
    assert_string_equal(text, GOLD_TEXT);
    free(text);
    assert_int_equal(kvq_tokenizer_decode(t, with_bos, 3, KVQ_DECODE_SPECIAL |
                                          KVQ_DECODE_KEEP_PREFIX, &text, &len, &e), KVQ_OK);
    assert_string_equal(text, "<s> Once upon");
    free(text);

    /* encoding the text (dummy prefix, score-ordered merges) gives the same 48 ids: the
     * model generated the canonical tokenization here */
    assert_ids(t, GOLD_TEXT, GOLD_IDS, 48);
    int32_t *ids;
    size_t n;
    encode_ok(t, GOLD_TEXT, strlen(GOLD_TEXT), KVQ_ENCODE_BOS | KVQ_ENCODE_EOS, &ids, &n);
    assert_int_equal(n, 50);
    assert_int_equal(ids[0], 1);
    assert_memory_equal(ids + 1, GOLD_IDS, sizeof GOLD_IDS);
    assert_int_equal(ids[49], 2);
    free(ids);

    /* a few pieces by name */
    assert_string_equal(kvq_tokenizer_token_str(t, 403, NULL), SP "Once");
    assert_string_equal(kvq_tokenizer_token_str(t, 3 + 'A', NULL), "<0x41>");
    assert_int_equal(kvq_tokenizer_token_type(t, 3 + 'A'), KVQ_TOKEN_BYTE);
    assert_int_equal(kvq_tokenizer_token_type(t, 1), KVQ_TOKEN_CONTROL);
    size_t pl;
    const char *pc = kvq_tokenizer_piece(t, 3 + 0x0A, &pl);
    assert_int_equal(pl, 1);
    assert_int_equal(pc[0], '\n');
    assert_string_equal(kvq_tokenizer_piece(t, 403, NULL), " Once");
    assert_int_equal(kvq_tokenizer_find(t, SP "Once", strlen(SP "Once")), 403);
    assert_null(kvq_tokenizer_token_str(t, 512, NULL));

    /* empty text: nothing (no dummy prefix), BOS only when asked */
    encode_ok(t, "", 0, 0, &ids, &n);
    assert_int_equal(n, 0);
    free(ids);
    encode_ok(t, "", 0, KVQ_ENCODE_BOS, &ids, &n);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 1);
    free(ids);
    kvq_tokenizer_free(t);
}

/* The tokenizer against ref_spm_encode on fixed and random texts, and round trips. */
static void spm_reference(const char *path)
{
    kvq_tokenizer *t = load_gguf_tok(path);
    static const char *const texts[] = {
        "Hello world", "The cat sat on the mat.", "  two leading spaces", "tabs\tand\nnewlines\n",
        "Lily and Ben went to the park!", "caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac",
        "emoji \xf0\x9f\x98\x80 ok", "x", " ", "12345 67", "stray \xff byte \x80",
        "ababababab aaaaaaa", GOLD_TEXT,
    };
    int32_t ref[1024];
    for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
        size_t nr = ref_spm_encode(t, texts[k], ref);
        assert_ids(t, texts[k], ref, nr);
        assert_round_trip(t, texts[k], strlen(texts[k]));
    }
    /* random strings over an alphabet with letters, spaces, punctuation and UTF-8 */
    static const char *const alpha[] = {"a", "e", "t", "h", "s", "o", "n", " ", " ", ".", ",",
                                        "!", "\n", "T", "L", "\xc3\xa9", "\xe2\x82\xac", "q"};
    kvq_rng r;
    kvq_rng_seed(&r, 42);
    char buf[256];
    for (int trial = 0; trial < 300; trial++) {
        size_t w = 0, len = 1 + kvq_rng_below(&r, 60);
        for (size_t i = 0; i < len; i++) {
            const char *a = alpha[kvq_rng_below(&r, sizeof alpha / sizeof *alpha)];
            memcpy(buf + w, a, strlen(a));
            w += strlen(a);
        }
        buf[w] = '\0';
        size_t nr = ref_spm_encode(t, buf, ref);
        assert_ids(t, buf, ref, nr);
        assert_round_trip(t, buf, w);
    }
    /* every byte value survives (byte fallback), including NUL inside the text */
    char all[256];
    for (int b = 0; b < 256; b++)
        all[b] = (char)b;
    assert_round_trip(t, all, 256);
    kvq_tokenizer_free(t);
}

static void test_spm_stories_reference(void **state)
{
    spm_reference(TINY_SPM_GGUF);
    const char *path = stories_or_note();
    if (path)
        spm_reference(path);
}

/* The llama2.c tokenizer.bin of a model equals its GGUF vocabulary (pieces, scores,
 * types), so it encodes `text` to the same `ids`; the auto-detecting loader picks each
 * format. */
static void llama2c_vs_gguf(const char *bin, const char *gguf, int32_t n_vocab, const char *text,
                            const int32_t *ids, size_t n_ids)
{
    kvq_tokenizer *g = load_gguf_tok(gguf);
    kvq_err e = {0};
    kvq_tokenizer *l = NULL;
    assert_int_equal(kvq_tokenizer_from_llama2c(bin, &l, &e), KVQ_OK);
    assert_string_equal(kvq_tokenizer_model(l), "llama2c");
    assert_int_equal(kvq_tokenizer_n_vocab(l), n_vocab);
    assert_int_equal(kvq_tokenizer_bos(l), 1);
    assert_int_equal(kvq_tokenizer_eos(l), 2);
    assert_int_equal(kvq_tokenizer_unk(l), 0);
    for (int32_t i = 0; i < n_vocab; i++) {
        size_t a, b;
        const char *sa = kvq_tokenizer_token_str(g, i, &a);
        const char *sb = kvq_tokenizer_token_str(l, i, &b);
        assert_int_equal(a, b);
        assert_memory_equal(sa, sb, a);
        assert_true(kvq_tokenizer_score(g, i) == kvq_tokenizer_score(l, i));
        assert_int_equal(kvq_tokenizer_token_type(g, i), kvq_tokenizer_token_type(l, i));
    }
    /* so it encodes the same */
    assert_ids(l, text, ids, n_ids);
    kvq_tokenizer *x = NULL;
    assert_int_equal(kvq_tokenizer_load(bin, NULL, &x, &e), KVQ_OK);
    assert_string_equal(kvq_tokenizer_model(x), "llama2c");
    kvq_tokenizer_free(x);
    assert_int_equal(kvq_tokenizer_load(gguf, NULL, &x, &e), KVQ_OK);
    assert_string_equal(kvq_tokenizer_model(x), "llama");
    kvq_tokenizer_free(x);
    kvq_tokenizer_free(l);
    kvq_tokenizer_free(g);
}

static void test_llama2c_matches_gguf(void **state)
{
    tiny_spm_gold *gd = tiny_spm_gold_load();
    for (size_t i = 0; i < gd->n_texts; i++)
        llama2c_vs_gguf(TINY_SPM_TOK, TINY_SPM_GGUF, gd->n_vocab, gd->texts[i].text,
                        gd->texts[i].ids, gd->texts[i].n);
    tiny_spm_gold_free(gd);
    const char *path = stories_or_note(), *bin = test_tokenizer_bin_path();
    if (path && bin)
        llama2c_vs_gguf(bin, path, 512, GOLD_TEXT, GOLD_IDS, 48);
    else if (path)
        printf("[          ] tok512.bin not next to %s: checked on tiny_spm only\n", path);
}

/* ---- SPM on tiny in-memory vocabularies -------------------------------------------- */

/* <unk> <s> </s>, 256 byte tokens (ids 3..258), then the given pieces */
static kvq_tokenizer *tiny_spm(const char *const *pieces, const float *scores, size_t np,
                               int with_bytes, int32_t unk)
{
    const char *tok[300];
    float sc[300];
    char bytes[256][8];
    size_t n = 0;
    tok[n] = "<unk>"; sc[n++] = 0;
    tok[n] = "<s>"; sc[n++] = 0;
    tok[n] = "</s>"; sc[n++] = 0;
    if (with_bytes)
        for (int b = 0; b < 256; b++) {
            snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
            tok[n] = bytes[b];
            sc[n++] = 0;
        }
    for (size_t i = 0; i < np; i++) {
        tok[n] = pieces[i];
        sc[n++] = scores[i];
    }
    kvq_vocab v;
    kvq_vocab_default(&v);
    v.n_tokens = (uint32_t)n;
    v.tokens = tok;
    v.scores = sc;
    v.bos = 1;
    v.eos = 2;
    v.unk = unk;
    v.model = "tiny";
    kvq_tokenizer *t = NULL;
    kvq_err e = {0};
    if (kvq_tokenizer_new(KVQ_TOKENIZER_SPM, &v, "tiny", NULL, &t, &e))
        fail_msg("%s", e.msg);
    return t;
}

static void test_spm_scores_and_ties(void **state)
{
    /* ids: ▁ 259, a 260, b 261, ab 262, ▁a 263 */
    const char *const p[] = {SP, "a", "b", "ab", SP "a"};
    const float hi_ab[] = {0, 0, 0, -1, -2};   /* "ab" scores higher than "▁a" */
    const float hi_sa[] = {0, 0, 0, -2, -1};   /* "▁a" scores higher */
    const float tie[] = {0, 0, 0, -1, -1};     /* equal: the leftmost pair (▁,a) wins */
    kvq_tokenizer *t = tiny_spm(p, hi_ab, 5, 1, 0);
    assert_ids(t, "ab", (const int32_t[]){259, 262}, 2);
    kvq_tokenizer_free(t);
    t = tiny_spm(p, hi_sa, 5, 1, 0);
    assert_ids(t, "ab", (const int32_t[]){263, 261}, 2);
    kvq_tokenizer_free(t);
    t = tiny_spm(p, tie, 5, 1, 0);
    assert_ids(t, "ab", (const int32_t[]){263, 261}, 2);
    /* "bab": ▁ b a b -> (a,b) is the only pair in the vocab */
    assert_ids(t, "bab", (const int32_t[]){259, 261, 262}, 3);
    /* no dummy prefix on request */
    int32_t *ids;
    size_t n;
    encode_ok(t, "ab", 2, KVQ_ENCODE_NO_PREFIX, &ids, &n);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 262);
    free(ids);
    /* unknown characters fall back to bytes: é = C3 A9, and a stray 0xFF */
    assert_ids(t, "a\xc3\xa9\xff", (const int32_t[]){263, 3 + 0xC3, 3 + 0xA9, 3 + 0xFF}, 4);
    assert_round_trip(t, "a\xc3\xa9\xff b", 6);
    /* decode keeps or drops the dummy prefix's space */
    char *s;
    kvq_err e = {0};
    assert_int_equal(kvq_tokenizer_decode(t, (const int32_t[]){263, 261}, 2,
                                          KVQ_DECODE_KEEP_PREFIX, &s, NULL, &e), KVQ_OK);
    assert_string_equal(s, " ab");
    free(s);
    assert_int_equal(kvq_tokenizer_decode(t, (const int32_t[]){263, 600}, 2, 0, &s, NULL, &e),
                     KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "index 1"));
    kvq_tokenizer_free(t);

    /* without byte tokens an unknown character is <unk> (one per character) */
    t = tiny_spm(p, hi_ab, 5, 0, 0);
    assert_ids(t, "a\xc3\xa9x", (const int32_t[]){3 + 4, 0, 0}, 3);
    kvq_tokenizer_free(t);
    /* ... and without <unk> it is an error naming the tokenizer */
    t = tiny_spm(p, hi_ab, 5, 0, -1);
    assert_int_equal(kvq_tokenizer_encode(t, "a?", 2, 0, &ids, &n, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "tiny"));
    assert_null(ids);
    kvq_tokenizer_free(t);
}

static void test_vocab_errors(void **state)
{
    const char *tok[] = {"<unk>", "<s>", "a", "<0x4"};
    const float sc[] = {0, 0, 0, 0};
    const int32_t types[] = {2, 3, 1, 6};
    const int32_t bad_types[] = {2, 3, 9, 1};
    kvq_vocab v;
    kvq_tokenizer *t = NULL;
    kvq_err e = {0};
    kvq_vocab_default(&v);
    v.n_tokens = 4;
    v.tokens = tok;
    v.scores = sc;
    v.model = "llama";
    v.bos = 4; /* out of range */
    assert_int_equal(kvq_tokenizer_new(KVQ_TOKENIZER_SPM, &v, "x.gguf", NULL, &t, &e),
                     KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "BOS"));
    assert_non_null(strstr(e.msg, "'llama'"));
    v.bos = 1;
    v.types = types; /* a BYTE token that is not <0xHH> */
    assert_int_equal(kvq_tokenizer_new(KVQ_TOKENIZER_SPM, &v, "x.gguf", NULL, &t, &e),
                     KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "<0x4"));
    v.types = bad_types;
    assert_int_equal(kvq_tokenizer_new(KVQ_TOKENIZER_SPM, &v, "x.gguf", NULL, &t, &e),
                     KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "type 9"));
    v.types = NULL;
    v.scores = NULL; /* SPM needs scores */
    assert_int_equal(kvq_tokenizer_new(KVQ_TOKENIZER_SPM, &v, "x.gguf", NULL, &t, &e),
                     KVQ_E_CORRUPT);
    v.scores = sc;
    v.n_tokens = 0;
    assert_int_equal(kvq_tokenizer_new(KVQ_TOKENIZER_SPM, &v, "x.gguf", NULL, &t, &e),
                     KVQ_E_CORRUPT);
    v.n_tokens = KVQ_TOKENIZER_MAX_VOCAB + 1;
    assert_int_equal(kvq_tokenizer_new(KVQ_TOKENIZER_SPM, &v, "x.gguf", NULL, &t, &e),
                     KVQ_E_TOO_LARGE);
    v.n_tokens = 4;
    static const char *const merges[] = {"ab"}; /* no space */
    v.n_merges = 1;
    v.merges = merges;
    assert_int_equal(kvq_tokenizer_new(KVQ_TOKENIZER_BPE, &v, "x.gguf", NULL, &t, &e),
                     KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "merge 0"));
    assert_int_equal(kvq_tokenizer_new(KVQ_TOKENIZER_IDS, &v, "x.gguf", NULL, &t, &e),
                     KVQ_E_INVALID_ARG);
    assert_null(t);
}

static void test_llama2c_errors(void **state)
{
    kvq_tokenizer *t = NULL;
    kvq_err e = {0};
    /* max_len 4, then token "ab" (score 0.5) and token " x" */
    uint8_t good[4 + 10 + 10] = {4, 0, 0, 0};
    float sc = 0.5f;
    memcpy(good + 4, &sc, 4);
    good[8] = 2;
    good[12] = 'a';
    good[13] = 'b';
    sc = -1.0f;
    memcpy(good + 14, &sc, 4);
    good[18] = 2;
    good[22] = ' ';
    good[23] = 'x';
    assert_int_equal(kvq_tokenizer_from_llama2c_memory(good, sizeof good, "t.bin", &t, &e),
                     KVQ_OK);
    assert_int_equal(kvq_tokenizer_n_vocab(t), 2);
    assert_string_equal(kvq_tokenizer_token_str(t, 1, NULL), SP "x"); /* ' ' -> '▁' */
    assert_true(kvq_tokenizer_score(t, 0) == 0.5f);
    kvq_tokenizer_free(t);
    assert_int_equal(kvq_tokenizer_from_llama2c_memory(good, 3, "t.bin", &t, &e),
                     KVQ_E_TRUNCATED_HEADER);
    assert_int_equal(kvq_tokenizer_from_llama2c_memory(good, sizeof good - 1, "t.bin", &t, &e),
                     KVQ_E_TRUNCATED_DATA);
    assert_non_null(strstr(e.msg, "token 1"));
    assert_int_equal(kvq_tokenizer_from_llama2c_memory(good, 4 + 6, "t.bin", &t, &e),
                     KVQ_E_TRUNCATED_DATA);
    assert_int_equal(kvq_tokenizer_from_llama2c_memory(good, 4, "t.bin", &t, &e),
                     KVQ_E_CORRUPT);
    uint8_t bad[sizeof good];
    memcpy(bad, good, sizeof good);
    bad[8] = 0xff; bad[9] = 0xff; bad[10] = 0xff; bad[11] = 0xff; /* length -1 */
    assert_int_equal(kvq_tokenizer_from_llama2c_memory(bad, sizeof bad, "t.bin", &t, &e),
                     KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "llama2c"));
    memcpy(bad, good, sizeof good);
    bad[8] = 200; /* length past the end */
    assert_int_equal(kvq_tokenizer_from_llama2c_memory(bad, sizeof bad, "t.bin", &t, &e),
                     KVQ_E_TRUNCATED_DATA);
    assert_int_equal(kvq_tokenizer_from_llama2c(test_path("none.bin"), &t, &e),
                     KVQ_E_NOT_FOUND);
    assert_null(t);
}

/* ---- BPE --------------------------------------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t n, cap;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->s = realloc(b->s, b->cap);
        assert_non_null(b->s);
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* UTF-8 of GPT-2's alphabet character for byte b */
static void byte_char(int b, char *out)
{
    unsigned cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        cp = (unsigned)b;
    else if (b <= 32)
        cp = 256u + (unsigned)b;
    else if (b <= 160)
        cp = 289u + (unsigned)(b - 127);
    else
        cp = 323;
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* Byte-level vocabulary: ids 0..255 are the byte characters (id == byte), then
 * he 256, ll 257, llo 258, Ġh 259, é 260, hel 261, Ġhe 262, and the special
 * <|endoftext|> 263 as an added token. */
#define ID_HE 256
#define ID_LL 257
#define ID_LLO 258
#define ID_GH 259
#define ID_EACUTE 260
#define ID_HEL 261
#define ID_GHE 262
#define ID_EOT 263

static const char *const EXTRA[] = {"he", "ll", "llo", "\xc4\xa0h", "\xc3\x83\xc2\xa9", "hel",
                                    "\xc4\xa0he"};

static char *bytelevel_json(const char *merges_json, const char *pre, int ignore_merges)
{
    sbuf b = {0};
    sb_str(&b, "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":263,\"content\":\"<|endoftext|>\","
               "\"special\":true}],\"normalizer\":null,\"pre_tokenizer\":");
    sb_str(&b, pre);
    sb_str(&b, ",\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",");
    sb_str(&b, ignore_merges ? "\"ignore_merges\":true," : "");
    sb_str(&b, "\"vocab\":{");
    char num[32];
    for (int i = 0; i < 256 + 7; i++) {
        char c[4];
        const char *s = c;
        if (i < 256)
            byte_char(i, c);
        else
            s = EXTRA[i - 256];
        sb_str(&b, i ? ",\"" : "\"");
        if (!strcmp(s, "\"") || !strcmp(s, "\\"))
            sb_str(&b, "\\");
        sb_str(&b, s);
        snprintf(num, sizeof num, "\":%d", i);
        sb_str(&b, num);
    }
    sb_str(&b, "},\"merges\":");
    sb_str(&b, merges_json);
    sb_str(&b, "}}");
    return b.s;
}

static const char PRE_GPT2[] =
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,"
    "\"use_regex\":true}";
static const char PRE_LLAMA3[] =
    "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
    "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
    "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":"
    "false,\"trim_offsets\":true,\"use_regex\":false}]}";
/* rank order: h e, l l, ll o, Ġ h, Ã ©, Ġh e */
static const char MERGES_STR[] =
    "[\"h e\",\"l l\",\"ll o\",\"\xc4\xa0 h\",\"\xc3\x83 \xc2\xa9\",\"\xc4\xa0h e\"]";
static const char MERGES_PAIRS[] =
    "[[\"h\",\"e\"],[\"l\",\"l\"],[\"ll\",\"o\"],[\"\xc4\xa0\",\"h\"],[\"\xc3\x83\",\"\xc2\xa9\"],"
    "[\"\xc4\xa0h\",\"e\"]]";
/* Ġ h first: " hello" becomes Ġh, then Ġhe */
static const char MERGES_SPACE_FIRST[] =
    "[\"\xc4\xa0 h\",\"\xc4\xa0h e\",\"h e\",\"l l\",\"ll o\",\"\xc3\x83 \xc2\xa9\"]";

static kvq_tokenizer *hf_tok(const char *json, const char *config)
{
    kvq_tokenizer *t = NULL;
    kvq_err e = {0};
    if (kvq_tokenizer_from_hf_json_memory(json, strlen(json), config, "tok.json", NULL, &t, &e))
        fail_msg("%s", e.msg);
    return t;
}

static void check_bytelevel_encodings(const kvq_tokenizer *t)
{
    assert_ids(t, "hello", (const int32_t[]){ID_HE, ID_LLO}, 2);
    /* " hello": h e merges (rank 0) before Ġ h (rank 3), so Ġ stays alone */
    assert_ids(t, "hello hello", (const int32_t[]){ID_HE, ID_LLO, 32 /* Ġ */, ID_HE, ID_LLO},
               5);
    /* multibyte: é = C3 A9 merges into one token; "café!" splits before '!' */
    assert_ids(t, "caf\xc3\xa9!", (const int32_t[]){'c', 'a', 'f', ID_EACUTE, '!'}, 5);
    /* a 4-byte emoji has no merges: its bytes */
    assert_ids(t, "\xf0\x9f\x98\x80", (const int32_t[]){0xF0, 0x9F, 0x98, 0x80}, 4);
    /* special tokens inside text are plain text */
    assert_ids(t, "<|", (const int32_t[]){'<', '|'}, 2);
    static const char *const rt[] = {
        "hello hello", "caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80",
        "  lead and trail  ", "line\r\nbreaks\n\n\ttabs", "don't STOP'S 12345678",
        "\x01\x7f\xff\xfe bytes",
    };
    for (size_t k = 0; k < sizeof rt / sizeof *rt; k++)
        assert_round_trip(t, rt[k], strlen(rt[k]));
}

static void test_bpe_hf_bytelevel(void **state)
{
    char *json = bytelevel_json(MERGES_STR, PRE_GPT2, 0);
    const char *config = "{\"bos_token\":{\"content\":\"<|endoftext|>\",\"special\":true},"
                         "\"eos_token\":\"<|endoftext|>\",\"add_bos_token\":false}";
    kvq_tokenizer *t = hf_tok(json, config);
    uint32_t digits = 9;
    assert_int_equal(kvq_tokenizer_kind_of(t), KVQ_TOKENIZER_BPE);
    assert_int_equal(kvq_tokenizer_pretok(t, &digits), KVQ_PRETOK_GPT2);
    assert_int_equal(kvq_tokenizer_n_vocab(t), 264);
    assert_int_equal(kvq_tokenizer_bos(t), ID_EOT);
    assert_int_equal(kvq_tokenizer_eos(t), ID_EOT);
    assert_int_equal(kvq_tokenizer_add_bos(t), 0);
    assert_int_equal(kvq_tokenizer_token_type(t, ID_EOT), KVQ_TOKEN_CONTROL);
    check_bytelevel_encodings(t);
    /* pieces map back to raw bytes; the special token decodes to nothing */
    assert_string_equal(kvq_tokenizer_piece(t, 32, NULL), " ");
    assert_string_equal(kvq_tokenizer_piece(t, ID_GHE, NULL), " he");
    assert_string_equal(kvq_tokenizer_piece(t, ID_EACUTE, NULL), "\xc3\xa9");
    size_t pl;
    kvq_tokenizer_piece(t, ID_EOT, &pl);
    assert_int_equal(pl, 0);
    char *s;
    kvq_err e = {0};
    assert_int_equal(kvq_tokenizer_decode(t, (const int32_t[]){ID_EOT, ID_HE}, 2,
                                          KVQ_DECODE_SPECIAL, &s, NULL, &e), KVQ_OK);
    assert_string_equal(s, "<|endoftext|>he");
    free(s);
    kvq_tokenizer_free(t);

    /* merges given as [a, b] pairs: identical tokenizer */
    free(json);
    json = bytelevel_json(MERGES_PAIRS, PRE_GPT2, 0);
    t = hf_tok(json, NULL);
    check_bytelevel_encodings(t);
    assert_int_equal(kvq_tokenizer_bos(t), ID_EOT); /* found by name without a config */
    kvq_tokenizer_free(t);

    /* rank order decides: with Ġ h first, " hello" is Ġhe llo */
    free(json);
    json = bytelevel_json(MERGES_SPACE_FIRST, PRE_GPT2, 0);
    t = hf_tok(json, NULL);
    assert_ids(t, " hello", (const int32_t[]){ID_GHE, ID_LLO}, 2);
    kvq_tokenizer_free(t);
    free(json);
}

static void test_bpe_hf_llama3(void **state)
{
    char *json = bytelevel_json(MERGES_STR, PRE_LLAMA3, 1);
    kvq_tokenizer *t = hf_tok(json, NULL);
    uint32_t digits = 0;
    assert_int_equal(kvq_tokenizer_pretok(t, &digits), KVQ_PRETOK_LLAMA3);
    assert_int_equal(digits, 3);
    /* ignore_merges: "hel" is a token, kept whole although no merge makes it */
    assert_ids(t, "hel", (const int32_t[]){ID_HEL}, 1);
    /* numbers split in threes */
    assert_ids(t, "12345", (const int32_t[]){'1', '2', '3', '4', '5'}, 5);
    check_bytelevel_encodings(t);
    kvq_tokenizer_free(t);
    free(json);
    /* without ignore_merges: he + l */
    json = bytelevel_json(MERGES_STR, PRE_LLAMA3, 0);
    t = hf_tok(json, NULL);
    assert_ids(t, "hel", (const int32_t[]){ID_HE, 'l'}, 2);
    kvq_tokenizer_free(t);
    free(json);
}

static void test_bpe_hf_file_and_config(void **state)
{
    char *json = bytelevel_json(MERGES_STR, PRE_GPT2, 0);
    const char *dir = test_path("hf");
    char p[4096];
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    assert_int_equal(test_write_file(p, json, strlen(json)), 0);
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    const char *c = "{\"bos_token\":\"h\",\"eos_token\":{\"content\":\"e\"},\"add_bos_token\":true}";
    assert_int_equal(test_write_file(cfg, c, strlen(c)), 0);
    kvq_tokenizer *t = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_tokenizer_load(dir, NULL, &t, &e), KVQ_OK); /* directory */
    assert_int_equal(kvq_tokenizer_bos(t), 'h');
    assert_int_equal(kvq_tokenizer_eos(t), 'e');
    assert_int_equal(kvq_tokenizer_add_bos(t), 1);
    kvq_tokenizer_free(t);
    /* a broken config is an error, not silently ignored */
    assert_int_equal(test_write_file(cfg, "{", 1), 0);
    assert_int_equal(kvq_tokenizer_from_hf_json(p, NULL, &t, &e), KVQ_E_BAD_JSON);
    assert_int_equal(kvq_tokenizer_from_hf_json(test_path("nope.json"), NULL, &t, &e),
                     KVQ_E_NOT_FOUND);
    assert_null(t);
    free(json);
}

static void test_bpe_hf_errors(void **state)
{
    kvq_tokenizer *t = NULL;
    kvq_err e = {0};
    struct {
        const char *json;
        kvq_status want;
        const char *msg;
    } cases[] = {
        {"not json", KVQ_E_BAD_JSON, "tok.json"},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", KVQ_E_UNSUPPORTED, "Unigram"},
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", KVQ_E_UNSUPPORTED, "WordPiece"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]},"
         "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}", KVQ_E_CORRUPT, "'a'"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0.5},\"merges\":[]},"
         "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}", KVQ_E_CORRUPT, "BPE"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"ab\"]},"
         "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}", KVQ_E_CORRUPT, "merge 0"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[[\"a\"]]},"
         "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}", KVQ_E_CORRUPT, "merge 0"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":[],\"merges\":[]}}", KVQ_E_CORRUPT, "vocab"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", KVQ_E_UNSUPPORTED,
         "ByteLevel"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],"
         "\"continuing_subword_prefix\":\"##\"}}", KVQ_E_UNSUPPORTED, "prefix"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},"
         "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}", KVQ_E_CORRUPT, "empty"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"added_tokens\":"
         "[{\"content\":\"x\"}],\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}", KVQ_E_CORRUPT,
         "added_tokens"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999},\"merges\":[]},"
         "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}", KVQ_E_CORRUPT, "'a'"},
        /* sparse: the largest id must stay below 2 x entries + 1024 (3 entries: 1030) */
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1030},\"merges\":[]},"
         "\"added_tokens\":[{\"id\":1,\"content\":\"<s>\"}],"
         "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}", KVQ_E_CORRUPT,
         "sparse vocabulary: largest id 1030 for 3 entries"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":13000000},\"merges\":[]},"
         "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}", KVQ_E_CORRUPT, "sparse vocabulary"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        kvq_status st = kvq_tokenizer_from_hf_json_memory(cases[k].json, strlen(cases[k].json),
                                                          NULL, "tok.json", NULL, &t, &e);
        if (st != cases[k].want || !strstr(e.msg, cases[k].msg))
            fail_msg("case %zu: got %d '%s', want %d with '%s'", k, st, e.msg, cases[k].want,
                     cases[k].msg);
        assert_null(t);
    }
    /* one id below the sparse limit loads, holes and all */
    static const char dense_enough[] =
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1029},\"merges\":[]},"
        "\"added_tokens\":[{\"id\":1,\"content\":\"<s>\"}],"
        "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}";
    t = hf_tok(dense_enough, NULL);
    assert_int_equal(kvq_tokenizer_n_vocab(t), 1030);
    assert_int_equal(kvq_tokenizer_token_type(t, 500), KVQ_TOKEN_UNUSED);
    kvq_tokenizer_free(t);
}

/* decode(ids, kvq_tokenizer_adds_prefix(s) ? 0 : KEEP_PREFIX) == s: the round trip
 * kvq_tokenizer_decode promises, with the prefix tracked. */
static void assert_tracked_round_trip(const kvq_tokenizer *t, const char *s, unsigned flags,
                                      int want_added)
{
    int32_t *ids;
    size_t n, m;
    char *back;
    kvq_err e = {0};
    const size_t len = strlen(s);
    const int added = kvq_tokenizer_adds_prefix(t, s, len, flags);
    assert_int_equal(added, want_added);
    encode_ok(t, s, len, flags, &ids, &n);
    assert_int_equal(kvq_tokenizer_decode(t, ids, n, added ? 0 : KVQ_DECODE_KEEP_PREFIX, &back,
                                          &m, &e), KVQ_OK);
    if (m != len || memcmp(back, s, len) != 0)
        fail_msg("'%s' (flags %u) decodes to '%s'", s, flags, back);
    free(back);
    free(ids);
}

/* Byte-level BPE with add_prefix_space: HF adds the space only before text that does
 * not start with one, so "hello" and " hello" give the same ids; the caller learns
 * which happened from kvq_tokenizer_adds_prefix and decodes accordingly. */
static void test_bpe_prefix_space(void **state)
{
    static const char pre[] = "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,"
                              "\"trim_offsets\":true,\"use_regex\":true}";
    char *json = bytelevel_json(MERGES_SPACE_FIRST, pre, 0);
    kvq_tokenizer *t = hf_tok(json, NULL);
    assert_ids(t, "hello", (const int32_t[]){ID_GHE, ID_LLO}, 2);
    assert_ids(t, " hello", (const int32_t[]){ID_GHE, ID_LLO}, 2);
    assert_ids(t, "  two", (const int32_t[]){32, 32, 't', 'w', 'o'}, 5);
    assert_int_equal(kvq_tokenizer_adds_prefix(t, "", 0, 0), 0);
    assert_tracked_round_trip(t, "hello", 0, 1);
    assert_tracked_round_trip(t, " hello", 0, 0);
    assert_tracked_round_trip(t, "  two", 0, 0);
    assert_tracked_round_trip(t, "  two", KVQ_ENCODE_NO_PREFIX, 0);
    assert_tracked_round_trip(t, "two", KVQ_ENCODE_NO_PREFIX, 0);
    assert_tracked_round_trip(t, "\ttab first", 0, 1);
    /* what decode does with each flag: the ids cannot tell "two" from " two" */
    int32_t *ids;
    size_t n;
    char *s;
    kvq_err e = {0};
    encode_ok(t, "  two", 5, 0, &ids, &n);
    assert_int_equal(kvq_tokenizer_decode(t, ids, n, 0, &s, NULL, &e), KVQ_OK);
    assert_string_equal(s, " two");
    free(s);
    assert_int_equal(kvq_tokenizer_decode(t, ids, n, KVQ_DECODE_KEEP_PREFIX, &s, NULL, &e),
                     KVQ_OK);
    assert_string_equal(s, "  two");
    free(s);
    free(ids);
    kvq_tokenizer_free(t);
    free(json);

    /* without add_prefix_space nothing is added or dropped */
    json = bytelevel_json(MERGES_SPACE_FIRST, PRE_GPT2, 0);
    t = hf_tok(json, NULL);
    assert_int_equal(kvq_tokenizer_adds_prefix(t, "hello", 5, 0), 0);
    assert_round_trip(t, "  two", 5);
    assert_round_trip(t, "hello", 5);
    kvq_tokenizer_free(t);
    free(json);

    /* SPM's dummy prefix is added even before a space, so the plain round trip holds */
    const char *const p[] = {SP, "a", "b", "ab", SP "a"};
    const float sc[] = {0, 0, 0, -1, -2};
    t = tiny_spm(p, sc, 5, 1, 0);
    assert_tracked_round_trip(t, "  ab", 0, 1);
    assert_tracked_round_trip(t, "  ab", KVQ_ENCODE_NO_PREFIX, 0);
    assert_round_trip(t, "  ab", 4);
    assert_ids(t, " ab", (const int32_t[]){259, 259, 262}, 3);
    kvq_tokenizer_free(t);
}

/* Llama-2 style tokenizer.json: BPE with '▁' normalizer and byte fallback. */
static void test_bpe_hf_metaspace(void **state)
{
    sbuf b = {0};
    sb_str(&b, "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},"
               "{\"id\":1,\"content\":\"<s>\",\"special\":true},{\"id\":2,\"content\":"
               "\"</s>\",\"special\":true}],\"normalizer\":{\"type\":\"Sequence\","
               "\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"" SP "\"},{\"type\":"
               "\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"" SP "\"}]},"
               "\"pre_tokenizer\":null,\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,"
               "\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2");
    char item[64];
    for (int i = 0; i < 256; i++) {
        snprintf(item, sizeof item, ",\"<0x%02X>\":%d", i, 3 + i);
        sb_str(&b, item);
    }
    sb_str(&b, ",\"" SP "\":259,\"a\":260,\"b\":261,\"" SP "a\":262,\"ab\":263},"
               "\"merges\":[\"" SP " a\",\"a b\"]}}");
    kvq_tokenizer *t = hf_tok(b.s, "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\"}");
    assert_int_equal(kvq_tokenizer_bos(t), 1);
    assert_int_equal(kvq_tokenizer_eos(t), 2);
    assert_int_equal(kvq_tokenizer_unk(t), 0);
    /* ▁ a b ▁ a b: (▁,a) has rank 0, leftmost first; no rank for (▁a, b) */
    assert_ids(t, "ab ab", (const int32_t[]){262, 261, 262, 261}, 4);
    /* ç is not in the vocabulary: byte fallback */
    assert_ids(t, "b\xc3\xa7", (const int32_t[]){259, 261, 3 + 0xC3, 3 + 0xA7}, 4);
    assert_round_trip(t, "ab ab\xc3\xa7 z", 9);
    kvq_tokenizer_free(t);
    free(b.s);
}

/* ---- GGUF vocabularies -------------------------------------------------------------- */

typedef struct gguf_vocab {
    kvq_gguf_value tokens[300], merges[8], scores[300], types[300];
} gguf_vocab;

static void set_str(kvq_gguf_writer *w, const char *key, const char *s)
{
    kvq_gguf_value v = {.type = KVQ_GGUF_STRING};
    v.v.str.s = s;
    v.v.str.len = strlen(s);
    kvq_err e = {0};
    assert_int_equal(kvq_gguf_writer_set(w, key, &v, &e), KVQ_OK);
}

static void set_arr(kvq_gguf_writer *w, const char *key, kvq_gguf_type t, kvq_gguf_value *items,
                    uint64_t n)
{
    kvq_gguf_value v = {.type = KVQ_GGUF_ARRAY};
    v.v.arr.type = t;
    v.v.arr.n = n;
    v.v.arr.items = items;
    kvq_err e = {0};
    assert_int_equal(kvq_gguf_writer_set(w, key, &v, &e), KVQ_OK);
}

static void set_u32(kvq_gguf_writer *w, const char *key, uint64_t x)
{
    kvq_gguf_value v = {.type = KVQ_GGUF_UINT32};
    v.v.u = x;
    kvq_err e = {0};
    assert_int_equal(kvq_gguf_writer_set(w, key, &v, &e), KVQ_OK);
}

/* Opens the writer's file image as a GGUF and loads its tokenizer. */
static kvq_status gguf_tok(kvq_gguf_writer *w, kvq_tokenizer **t, kvq_err *e)
{
    void *data;
    size_t size;
    kvq_gguf *g = NULL;
    assert_int_equal(kvq_gguf_writer_to_buffer(w, &data, &size, e), KVQ_OK);
    assert_int_equal(kvq_gguf_open_memory(data, size, "t.gguf", &g, e), KVQ_OK);
    kvq_status st = kvq_tokenizer_from_gguf(g, "t.gguf", NULL, t, e);
    kvq_gguf_close(g);
    free(data);
    return st;
}

/* A "gpt2" GGUF with the same vocabulary and merges as the tokenizer.json tests. */
static kvq_gguf_writer *gpt2_writer(gguf_vocab *gv, char (*chars)[4])
{
    kvq_gguf_writer *w = kvq_gguf_writer_new();
    assert_non_null(w);
    set_str(w, "tokenizer.ggml.model", "gpt2");
    for (int i = 0; i < 264; i++) {
        const char *s = i < 256 ? chars[i] : i < 263 ? EXTRA[i - 256] : "<|endoftext|>";
        if (i < 256)
            byte_char(i, chars[i]);
        gv->tokens[i].type = KVQ_GGUF_STRING;
        gv->tokens[i].v.str.s = s;
        gv->tokens[i].v.str.len = strlen(s);
        gv->types[i].type = KVQ_GGUF_INT32;
        gv->types[i].v.i = i == 263 ? 3 : 1;
    }
    static const char *const m[] = {"h e", "l l", "ll o", "\xc4\xa0 h", "\xc3\x83 \xc2\xa9",
                                    "\xc4\xa0h e"};
    for (int i = 0; i < 6; i++) {
        gv->merges[i].type = KVQ_GGUF_STRING;
        gv->merges[i].v.str.s = m[i];
        gv->merges[i].v.str.len = strlen(m[i]);
    }
    set_arr(w, "tokenizer.ggml.tokens", KVQ_GGUF_STRING, gv->tokens, 264);
    set_arr(w, "tokenizer.ggml.token_type", KVQ_GGUF_INT32, gv->types, 264);
    set_arr(w, "tokenizer.ggml.merges", KVQ_GGUF_STRING, gv->merges, 6);
    set_u32(w, "tokenizer.ggml.bos_token_id", 263);
    set_u32(w, "tokenizer.ggml.eos_token_id", 263);
    return w;
}

static void test_bpe_gguf(void **state)
{
    gguf_vocab gv;
    char chars[256][4];
    kvq_gguf_writer *w = gpt2_writer(&gv, chars);
    kvq_tokenizer *t = NULL;
    kvq_err e = {0};
    assert_int_equal(gguf_tok(w, &t, &e), KVQ_OK);
    assert_string_equal(kvq_tokenizer_model(t), "gpt2");
    assert_int_equal(kvq_tokenizer_pretok(t, NULL), KVQ_PRETOK_GPT2);
    assert_int_equal(kvq_tokenizer_bos(t), ID_EOT);
    check_bytelevel_encodings(t);
    kvq_tokenizer_free(t);
    /* tokenizer.ggml.pre = llama-bpe: the Llama-3 split with ignore_merges */
    set_str(w, "tokenizer.ggml.pre", "llama-bpe");
    assert_int_equal(gguf_tok(w, &t, &e), KVQ_OK);
    uint32_t digits = 0;
    assert_int_equal(kvq_tokenizer_pretok(t, &digits), KVQ_PRETOK_LLAMA3);
    assert_int_equal(digits, 3);
    assert_ids(t, "hel", (const int32_t[]){ID_HEL}, 1);
    kvq_tokenizer_free(t);

    /* malformed vocabularies */
    set_u32(w, "tokenizer.ggml.bos_token_id", 264);
    assert_int_equal(gguf_tok(w, &t, &e), KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "bos_token_id"));
    assert_non_null(strstr(e.msg, "gpt2"));
    set_u32(w, "tokenizer.ggml.bos_token_id", 0xFFFFFFFFu); /* "unset" */
    assert_int_equal(gguf_tok(w, &t, &e), KVQ_OK);
    assert_int_equal(kvq_tokenizer_bos(t), -1);
    kvq_tokenizer_free(t);
    set_arr(w, "tokenizer.ggml.token_type", KVQ_GGUF_INT32, gv.types, 263);
    assert_int_equal(gguf_tok(w, &t, &e), KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "token_type"));
    set_arr(w, "tokenizer.ggml.token_type", KVQ_GGUF_INT32, gv.types, 264);
    set_arr(w, "tokenizer.ggml.merges", KVQ_GGUF_INT32, gv.types, 6);
    assert_int_equal(gguf_tok(w, &t, &e), KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "merges"));
    set_arr(w, "tokenizer.ggml.tokens", KVQ_GGUF_INT32, gv.types, 264);
    assert_int_equal(gguf_tok(w, &t, &e), KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "tokenizer.ggml.tokens"));
    set_str(w, "tokenizer.ggml.model", "bert");
    assert_int_equal(gguf_tok(w, &t, &e), KVQ_E_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "'bert'"));
    kvq_gguf_writer_free(w);

    /* a "llama" vocabulary without scores, and one with no tokenizer at all */
    w = kvq_gguf_writer_new();
    set_u32(w, "general.alignment", 32);
    assert_int_equal(gguf_tok(w, &t, &e), KVQ_E_NOT_FOUND);
    set_str(w, "tokenizer.ggml.model", "llama");
    set_arr(w, "tokenizer.ggml.tokens", KVQ_GGUF_STRING, gv.tokens, 264);
    assert_int_equal(gguf_tok(w, &t, &e), KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "scores"));
    assert_non_null(strstr(e.msg, "'llama'"));
    for (int i = 0; i < 264; i++) {
        gv.scores[i].type = KVQ_GGUF_FLOAT32;
        gv.scores[i].v.f = -i;
    }
    set_arr(w, "tokenizer.ggml.scores", KVQ_GGUF_FLOAT32, gv.scores, 200);
    assert_int_equal(gguf_tok(w, &t, &e), KVQ_E_CORRUPT);
    set_arr(w, "tokenizer.ggml.scores", KVQ_GGUF_FLOAT32, gv.scores, 264);
    assert_int_equal(gguf_tok(w, &t, &e), KVQ_OK);
    assert_int_equal(kvq_tokenizer_kind_of(t), KVQ_TOKENIZER_SPM);
    kvq_tokenizer_free(t);
    kvq_gguf_writer_free(w);
}

/* ---- pre-tokenizer ------------------------------------------------------------------- */

static void assert_split(kvq_pretok style, uint32_t digits, const char *text,
                         const char *const *want, size_t nw)
{
    size_t *ends, n;
    kvq_err e = {0};
    assert_int_equal(kvq_pretokenize(style, digits, text, strlen(text), &ends, &n, &e), KVQ_OK);
    size_t start = 0;
    for (size_t i = 0; i < n && i < nw; i++) {
        if (ends[i] - start != strlen(want[i]) || memcmp(text + start, want[i], ends[i] - start))
            fail_msg("'%s' piece %zu: got '%.*s', want '%s'", text, i, (int)(ends[i] - start),
                     text + start, want[i]);
        start = ends[i];
    }
    assert_int_equal(n, nw);
    free(ends);
}

static void test_pretokenize(void **state)
{
    const char *t1 = "Hello world's  end!!\n\n 123456";
    const char *const g1[] = {"Hello", " world", "'s", " ", " end", "!!", "\n\n", " 123456"};
    assert_split(KVQ_PRETOK_GPT2, 0, t1, g1, 8);
    const char *const l1[] = {"Hello", " world", "'s", " ", " end", "!!\n\n", " ", "123", "456"};
    assert_split(KVQ_PRETOK_LLAMA3, 3, t1, l1, 9);
    const char *const q1[] = {"Hello", " world", "'s", " ", " end", "!!\n\n", " ", "1", "2", "3",
                              "4", "5", "6"};
    assert_split(KVQ_PRETOK_LLAMA3, 1, t1, q1, 13);

    /* contractions: case-sensitive in GPT-2, case-insensitive in Llama-3 */
    const char *const g2[] = {"DON", "'", "T", " don", "'t", " we", "'ll"};
    assert_split(KVQ_PRETOK_GPT2, 0, "DON'T don't we'll", g2, 7);
    const char *const l2[] = {"DON", "'T", " don", "'t", " we", "'ll"};
    assert_split(KVQ_PRETOK_LLAMA3, 3, "DON'T don't we'll", l2, 6);

    /* Llama-3: one non-letter may lead a word; a newline may not */
    const char *const l3[] = {"(hello", ")\n", "world", "  \n", "x", "   "};
    assert_split(KVQ_PRETOK_LLAMA3, 3, "(hello)\nworld  \nx   ", l3, 6);
    /* GPT-2 on the same: punctuation runs, whitespace before a word keeps one space back */
    const char *const g3b[] = {"(", "hello", ")", "\n", "world", "  ", "\n", "x", "   "};
    assert_split(KVQ_PRETOK_GPT2, 0, "(hello)\nworld  \nx   ", g3b, 9);

    /* Unicode classes: letters of other scripts, CJK punctuation, emoji, combining mark */
    const char *const u1[] = {"na\xc3\xafve", " caf\xc3\xa9", " \xe6\x97\xa5\xe6\x9c\xac",
                              "\xe3\x80\x82", " \xf0\x9f\x98\x80!", " \xd0\x9f\xd1\x80\xd0\xb8",
                              " e", "\xcc\x81", "\xc2\xa0", "\xd9\xa3"};
    assert_split(KVQ_PRETOK_GPT2, 0,
                 "na\xc3\xafve caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe3\x80\x82 "
                 "\xf0\x9f\x98\x80! \xd0\x9f\xd1\x80\xd0\xb8 e\xcc\x81\xc2\xa0\xd9\xa3",
                 u1, 10);
    /* Indic vowel signs and viramas are marks, not letters: each ends the word (what
     * Python's regex module gives for the GPT-2 expression); Roman numerals and
     * Devanagari digits are numbers; Cherokee and U+A66E are letters */
    const char *const u2[] = {"\xe0\xa4\xb9", "\xe0\xa4\xbf", "\xe0\xa4\xa8", "\xe0\xa5\x8d",
                              "\xe0\xa4\xa6", "\xe0\xa5\x80", " \xe2\x85\xab\xe2\x85\xa2",
                              " \xe0\xa5\xaa\xe0\xa5\xa8", " \xe1\x8f\xa3\xe1\x8e\xb3\xe1\x8e\xa9",
                              " \xea\x99\xae"};
    assert_split(KVQ_PRETOK_GPT2, 0,
                 "\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80 "
                 "\xe2\x85\xab\xe2\x85\xa2 \xe0\xa5\xaa\xe0\xa5\xa8 \xe1\x8f\xa3\xe1\x8e\xb3\xe1\x8e\xa9 "
                 "\xea\x99\xae",
                 u2, 10);
    /* stray bytes count as punctuation */
    const char *const b1[] = {"a", "\xff\x80", " b"};
    assert_split(KVQ_PRETOK_GPT2, 0, "a\xff\x80 b", b1, 3);
    /* NONE: the whole text */
    const char *const n1[] = {"a b  c"};
    assert_split(KVQ_PRETOK_NONE, 0, "a b  c", n1, 1);
}

/* ---- pre-tokenized ids ------------------------------------------------------------- */

static void test_ids(void **state)
{
    kvq_tokenizer *t = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_tokenizer_new_ids(100, 1, 2, &t, &e), KVQ_OK);
    assert_int_equal(kvq_tokenizer_kind_of(t), KVQ_TOKENIZER_IDS);
    assert_int_equal(kvq_tokenizer_n_vocab(t), 100);
    assert_int_equal(kvq_tokenizer_bos(t), 1);
    int32_t *ids = NULL;
    size_t n;
    assert_int_equal(kvq_tokenizer_encode(t, "x", 1, 0, &ids, &n, &e), KVQ_E_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "'ids'"));
    char *s;
    assert_int_equal(kvq_tokenizer_decode(t, (const int32_t[]){5, 99}, 2, 0, &s, NULL, &e),
                     KVQ_OK);
    assert_string_equal(s, "<5><99>");
    free(s);
    assert_null(kvq_tokenizer_token_str(t, 5, NULL));
    kvq_tokenizer_free(t);
    assert_int_equal(kvq_tokenizer_new_ids(0, -1, -1, &t, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_tokenizer_new_ids(10, 10, -1, &t, &e), KVQ_E_INVALID_ARG);

    const uint8_t file[] = {1, 0, 0, 0, 0x2c, 0x01, 0, 0, 7, 0, 0, 0}; /* 1, 300, 7 */
    const char *p = test_path("x.ids");
    assert_int_equal(test_write_file(p, file, sizeof file), 0);
    assert_int_equal(kvq_ids_read(p, 0, &ids, &n, &e), KVQ_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 300);
    free(ids);
    assert_int_equal(kvq_ids_read(p, 300, &ids, &n, &e), KVQ_E_MISMATCH);
    assert_non_null(strstr(e.msg, "index 1"));
    assert_int_equal(test_write_file(p, file, 11), 0);
    assert_int_equal(kvq_ids_read(p, 0, &ids, &n, &e), KVQ_E_CORRUPT);
    const uint8_t neg[] = {0xff, 0xff, 0xff, 0xff};
    assert_int_equal(test_write_file(p, neg, 4), 0);
    assert_int_equal(kvq_ids_read(p, 0, &ids, &n, &e), KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "negative"));
    assert_int_equal(kvq_ids_read(test_path("missing.ids"), 0, &ids, &n, &e), KVQ_E_NOT_FOUND);
}

static int teardown(void **state)
{
    test_tmpdir_cleanup();
    return 0;
}

/* The other splits, against pieces computed with Python's `regex` module from the
 * families' tokenizer.json expressions (tests/data/hf_pre/) and llama.cpp's lists. */
static void test_pretokenize_families(void **state)
{
    (void)state;
    const char *const sm[] = {"abc", " ", "1", "2", "3", " x", "1", "y"};
    assert_split(KVQ_PRETOK_SMOLLM, 0, "abc 123 x1y", sm, 8);
    const char *tk = "HelloWorld \xc3\x89" "COLE na\xc3\xafve caf\xc3\xa9's 12345 a/b//\n\n x";
    const char *const tkw[] = {"Hello", "World", " \303\211COLE", " na\xc3\xafve",
                               " caf\xc3\xa9", "'s", " ", "1", "2", "3", "4", "5", " a", "/b",
                               "//\n\n", " x"};
    assert_split(KVQ_PRETOK_TEKKEN, 1, tk, tkw, 16);
    const char *const o2[] = {"Hello", "World", " DON'T", " we'll", " ", "123", "45", " path",
                              "/to", "/\r\n", " ", " end"};
    assert_split(KVQ_PRETOK_GPT4O, 3, "HelloWorld DON'T we'll 12345 path/to/\r\n  end", o2, 12);
    const char *const ds[] = {"Hello", ",", " world", "!", " ", "\xe4\xbd\xa0\xe5\xa5\xbd", " ",
                              "1", "2", " ab", "  ", "\n", "x", "   "};
    assert_split(KVQ_PRETOK_DEEPSEEK_LLM, 1,
                 "Hello, world! \xe4\xbd\xa0\xe5\xa5\xbd 12 ab  \nx   ", ds, 14);
    const char *const df[] = {"a", "+", "b", "=", "c", " ", "123", "456", "78", " hi", "!!"};
    assert_split(KVQ_PRETOK_DEFAULT, 0, "a+b=c 12345678 hi!!", df, 11);
    assert_string_equal(kvq_pretok_name(KVQ_PRETOK_SMOLLM), "smollm");
}

/* NFC in a byte-level tokenizer.json: a decomposed e + U+0301 encodes as the
 * precomposed token; without the normalizer it does not. */
static void test_bpe_hf_nfc(void **state)
{
    (void)state;
    char *json = bytelevel_json(MERGES_STR, PRE_GPT2, 0);
    char *at = strstr(json, "\"normalizer\":null");
    assert_non_null(at);
    static const char nfc[] = "\"normalizer\":{\"type\":\"NFC\"}";
    char *j2 = malloc(strlen(json) + sizeof nfc);
    assert_non_null(j2);
    sprintf(j2, "%.*s%s%s", (int)(at - json), json, nfc, at + strlen("\"normalizer\":null"));
    kvq_tokenizer *t = hf_tok(j2, NULL);
    assert_int_equal(kvq_tokenizer_normalizer(t), KVQ_NORM_NFC);
    assert_ids(t, "caf\x65\xcc\x81", (const int32_t[]){'c', 'a', 'f', ID_EACUTE}, 4);
    kvq_tokenizer_free(t);
    t = hf_tok(json, NULL);
    assert_int_equal(kvq_tokenizer_normalizer(t), KVQ_NORM_NONE);
    assert_ids(t, "\x65\xcc\x81", (const int32_t[]){'e', 0xCC, 0x81}, 3);
    kvq_tokenizer_free(t);
    free(j2);
    free(json);
}

/* An unknown pre-tokenizer is refused with its name unless the approximation is
 * accepted, which kvq_tokenizer_approx then reports; GGUF names map to their splits. */
static void test_unknown_pretok(void **state)
{
    (void)state;
    static const char pre[] = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":"
                              "\"Punctuation\"},{\"type\":\"ByteLevel\",\"use_regex\":true}]}";
    char *json = bytelevel_json(MERGES_STR, pre, 0);
    kvq_tokenizer *t = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_tokenizer_from_hf_json_memory(json, strlen(json), NULL, "tok.json", NULL,
                                                       &t, &e), KVQ_E_UNSUPPORTED);
    assert_null(t);
    assert_non_null(strstr(e.msg, "Punctuation"));
    kvq_tokenizer_params p = kvq_tokenizer_params_default();
    p.accept_approx = 1;
    assert_int_equal(kvq_tokenizer_from_hf_json_memory_p(json, strlen(json), NULL, "tok.json", &p,
                                                         &t, &e), KVQ_OK);
    assert_non_null(kvq_tokenizer_approx(t));
    assert_non_null(strstr(kvq_tokenizer_approx(t), "Punctuation"));
    assert_int_equal(kvq_tokenizer_pretok(t, NULL), KVQ_PRETOK_GPT2);
    kvq_tokenizer_free(t);
    free(json);

    gguf_vocab gv;
    char chars[256][4];
    kvq_gguf_writer *w = gpt2_writer(&gv, chars);
    static const struct {
        const char *name;
        kvq_pretok style;
        uint32_t digits;
    } names[] = {{"smollm", KVQ_PRETOK_SMOLLM, 0}, {"qwen2", KVQ_PRETOK_LLAMA3, 1},
                 {"deepseek-r1-qwen", KVQ_PRETOK_LLAMA3, 1}, {"tekken", KVQ_PRETOK_TEKKEN, 1},
                 {"gpt-4o", KVQ_PRETOK_GPT4O, 3}, {"deepseek-llm", KVQ_PRETOK_DEEPSEEK_LLM, 0},
                 {"default", KVQ_PRETOK_DEFAULT, 0}, {"gpt-2", KVQ_PRETOK_GPT2, 0}};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        set_str(w, "tokenizer.ggml.pre", names[k].name);
        assert_int_equal(gguf_tok(w, &t, &e), KVQ_OK);
        uint32_t d = 99;
        assert_int_equal(kvq_tokenizer_pretok(t, &d), names[k].style);
        assert_int_equal(d, names[k].digits);
        assert_null(kvq_tokenizer_approx(t));
        /* llama.cpp's default without add_bos_token: BOS for tekken (and llama3) only */
        assert_int_equal(kvq_tokenizer_add_bos(t), names[k].style == KVQ_PRETOK_TEKKEN);
        kvq_tokenizer_free(t);
    }
    set_str(w, "tokenizer.ggml.pre", "no-such-pre");
    assert_int_equal(gguf_tok(w, &t, &e), KVQ_E_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "'no-such-pre'"));
    void *data;
    size_t size;
    kvq_gguf *g = NULL;
    assert_int_equal(kvq_gguf_writer_to_buffer(w, &data, &size, &e), KVQ_OK);
    assert_int_equal(kvq_gguf_open_memory(data, size, "t.gguf", &g, &e), KVQ_OK);
    assert_int_equal(kvq_tokenizer_from_gguf_p(g, "t.gguf", &p, &t, &e), KVQ_OK);
    assert_non_null(strstr(kvq_tokenizer_approx(t), "no-such-pre"));
    kvq_tokenizer_free(t);
    kvq_gguf_close(g);
    free(data);
    kvq_gguf_writer_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spm_stories_golden),
        cmocka_unit_test(test_spm_stories_reference),
        cmocka_unit_test(test_llama2c_matches_gguf),
        cmocka_unit_test(test_spm_scores_and_ties),
        cmocka_unit_test(test_vocab_errors),
        cmocka_unit_test(test_llama2c_errors),
        cmocka_unit_test(test_bpe_hf_bytelevel),
        cmocka_unit_test(test_bpe_hf_llama3),
        cmocka_unit_test(test_bpe_hf_file_and_config),
        cmocka_unit_test(test_bpe_hf_errors),
        cmocka_unit_test(test_bpe_prefix_space),
        cmocka_unit_test(test_bpe_hf_metaspace),
        cmocka_unit_test(test_bpe_gguf),
        cmocka_unit_test(test_pretokenize),
        cmocka_unit_test(test_pretokenize_families),
        cmocka_unit_test(test_bpe_hf_nfc),
        cmocka_unit_test(test_unknown_pretok),
        cmocka_unit_test(test_ids),
    };
    return cmocka_run_group_tests_name("tokenizer", tests, NULL, teardown);
}
