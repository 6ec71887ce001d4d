/* tok_check.h — the checks the tokenizer fuzz targets (fuzz_tokenizer_json.c,
 * fuzz_llama2c_tok.c) run on every tokenizer that loads. Header-only (static functions)
 * because each fuzz target is built from one .c file.
 *
 * What must hold for any tokenizer the loaders accept:
 *   - the queries agree with each other: every token's string finds an id whose string
 *     is the same (the first id wins), pieces and types exist for ids in range and not
 *     outside it;
 *   - encoding never fails when the vocabulary covers every byte (<0xHH> tokens, or in
 *     byte-level BPE the 256 characters of GPT-2's byte alphabet), has an unknown token,
 *     or drops what has no token (kvq_tokenizer_drops_unknown: byte-level BPE from GGUF,
 *     or HF without unk_token, as llama.cpp and HF do); a tokenizer that may drop text
 *     is exempt from the two checks below that need every byte encoded (some ids for
 *     non-empty text, the round trip);
 *   - every id encode returns is in range, BOS/EOS flags add exactly those ids, and
 *     encoding is deterministic;
 *   - decode(encode(s, f), kvq_tokenizer_adds_prefix(s, f) ? 0 : KEEP_PREFIX) == s, for
 *     f = 0 and f = NO_PREFIX, when every id encode returned is a NORMAL or BYTE token
 *     other than the unknown id (a CONTROL/UNKNOWN/USER_DEFINED token, or the unknown
 *     fallback, stands for different text by design) and s has no '▁' (SPM/metaspace
 *     turn it into a space): the round-trip promise of kvq_tokenizer_decode. Text that
 *     starts with a space is included (byte-level BPE with add_prefix_space adds no
 *     space there, as HF's ByteLevel does, and kvq_tokenizer_adds_prefix says so). Not
 *     checked: SPM/metaspace text with spaces when the vocabulary has no '▁' token (a
 *     space then falls back to the bytes of '▁', which decode to '▁');
 *   - decode rejects an out-of-range id with KVQ_E_INVALID_ARG. */
#ifndef KVQ_FUZZ_TOK_CHECK_H
#define KVQ_FUZZ_TOK_CHECK_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/tokenizer.h"

#define CHECK(c) do { if (!(c)) abort(); } while (0)

/* Ids checked one by one: the first and the last ones (vocabularies can have 2^24). */
#define TOK_CHECK_IDS 512

/* GPT-2's byte-to-unicode alphabet: byte b as a UTF-8 string in out (NUL-terminated). */
static void gpt2_byte_char(int b, char out[3])
{
    unsigned cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = (unsigned)b;
    } else { /* the others take 256, 257, ... in byte order */
        unsigned k = 0;
        for (int c = 0; c < b; c++)
            if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255)))
                k++;
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static int piece_is_byte(const kvq_tokenizer *t, int32_t id, int b)
{
    size_t len = 0;
    const char *p = kvq_tokenizer_piece(t, id, &len);
    return p && len == 1 && (uint8_t)p[0] == b;
}

/* 1 when every byte has a token that decodes to exactly that byte and that encode can
 * reach: a BYTE token (SPM, metaspace) or the byte's GPT-2 character (byte-level). */
static int covers_all_bytes(const kvq_tokenizer *t)
{
    const uint32_t n = kvq_tokenizer_n_vocab(t);
    int byte_level = 1, bytes = 1;
    for (int b = 0; b < 256 && byte_level; b++) {
        char c[3];
        gpt2_byte_char(b, c);
        const int32_t id = kvq_tokenizer_find(t, c, strlen(c));
        byte_level = id >= 0 && piece_is_byte(t, id, b);
    }
    if (byte_level)
        return 1;
    for (int b = 0; b < 256 && bytes; b++) {
        int found = 0;
        for (uint32_t i = 0; i < n && !found; i++)
            found = kvq_tokenizer_token_type(t, (int32_t)i) == KVQ_TOKEN_BYTE &&
                    piece_is_byte(t, (int32_t)i, b);
        bytes = found;
    }
    return bytes;
}

static void check_id(const kvq_tokenizer *t, int32_t id)
{
    size_t len = 0, plen = 0;
    const char *s = kvq_tokenizer_token_str(t, id, &len);
    CHECK(s != NULL && s[len] == '\0');
    const int type = kvq_tokenizer_token_type(t, id);
    CHECK(type >= KVQ_TOKEN_NORMAL && type <= KVQ_TOKEN_BYTE);
    const char *p = kvq_tokenizer_piece(t, id, &plen);
    CHECK(p != NULL);
    if (type == KVQ_TOKEN_CONTROL || type == KVQ_TOKEN_UNKNOWN)
        CHECK(plen == 0);
    if (type == KVQ_TOKEN_BYTE)
        CHECK(plen == 1);
    if (len > 0) {
        const int32_t f = kvq_tokenizer_find(t, s, len);
        size_t flen = 0;
        CHECK(f >= 0 && f <= id);
        const char *fs = kvq_tokenizer_token_str(t, f, &flen);
        CHECK(flen == len && memcmp(fs, s, len) == 0);
    }
}

static int has_metaspace(const char *s, size_t n)
{
    for (size_t i = 0; i + 2 < n; i++)
        if (!memcmp(s + i, "\xe2\x96\x81", 3))
            return 1;
    return 0;
}

static void check_encode(const kvq_tokenizer *t, const char *text, size_t len, int must_encode,
                         int may_drop)
{
    const uint32_t n = kvq_tokenizer_n_vocab(t);
    static const unsigned enc_flags[2] = {0, KVQ_ENCODE_NO_PREFIX};
    for (int f = 0; f < 2; f++) {
        const int added = kvq_tokenizer_adds_prefix(t, text, len, enc_flags[f]);
        const unsigned dec_flags = added ? 0 : KVQ_DECODE_KEEP_PREFIX;
        CHECK(f == 0 || !added);
        int32_t *ids = NULL, *ids2 = NULL;
        size_t m = 0, m2 = 0;
        kvq_err err = {0};
        const kvq_status st = kvq_tokenizer_encode(t, text, len, enc_flags[f], &ids, &m, &err);
        if (st != KVQ_OK) {
            CHECK(!must_encode && st == KVQ_E_INVALID_ARG && err.status == st && err.msg[0]);
            free(ids);
            continue;
        }
        CHECK(len == 0 || m > 0 || may_drop);
        CHECK(m == 0 || ids != NULL);
        int plain = !has_metaspace(text, len);
        for (size_t i = 0; i < m; i++) {
            CHECK(ids[i] >= 0 && (uint32_t)ids[i] < n);
            const int type = kvq_tokenizer_token_type(t, ids[i]);
            /* the unknown id may be typed NORMAL (tokenizer.json without it in
               added_tokens): it then decodes to its own string, as in HF */
            plain &= (type == KVQ_TOKEN_NORMAL || type == KVQ_TOKEN_BYTE) &&
                     ids[i] != kvq_tokenizer_unk(t);
        }
        /* deterministic */
        CHECK(kvq_tokenizer_encode(t, text, len, enc_flags[f], &ids2, &m2, &err) == KVQ_OK);
        CHECK(m2 == m && (m == 0 || memcmp(ids, ids2, m * sizeof *ids) == 0));
        free(ids2);
        ids2 = NULL;

        char *out = NULL;
        size_t olen = 0;
        CHECK(kvq_tokenizer_decode(t, ids, m, dec_flags, &out, &olen, &err) == KVQ_OK);
        CHECK(out != NULL && out[olen] == '\0');
        /* A vocabulary without a '▁' token encodes a space (after the SPM/metaspace
           escape) as the bytes of '▁', which decode to '▁', as in llama.cpp and HF. */
        if (plain && has_metaspace(out, olen) && kvq_tokenizer_find(t, "\xe2\x96\x81", 3) < 0)
            plain = 0;
        if (plain && !may_drop)
            CHECK(olen == len && memcmp(out, text, len) == 0);
        free(out);

        /* BOS / EOS exactly where asked, the rest unchanged */
        const int32_t bos = kvq_tokenizer_bos(t), eos = kvq_tokenizer_eos(t);
        const kvq_status be = kvq_tokenizer_encode(t, text, len,
                                                   enc_flags[f] | KVQ_ENCODE_BOS | KVQ_ENCODE_EOS,
                                                   &ids2, &m2, &err);
        if (bos < 0 || eos < 0) {
            CHECK(be == KVQ_E_INVALID_ARG && ids2 == NULL);
        } else {
            CHECK(be == KVQ_OK && m2 == m + 2 && ids2[0] == bos && ids2[m + 1] == eos);
            CHECK(m == 0 || memcmp(ids2 + 1, ids, m * sizeof *ids) == 0);
        }
        free(ids2);
        free(ids);
    }
}

/* Runs every check on t; tail[0..tail_len) is extra text from the fuzz input. */
static void tok_check(const kvq_tokenizer *t, const char *tail, size_t tail_len)
{
    static const char *const texts[] = {
        "Once upon a time, there was a little girl named Lily.",
        "  two  spaces\tand\nnew lines\r\n",
        "h\xc3\xa9llo w\xc3\xb6rld \xe2\x80\x94 na\xc3\xafve 123 45678 \xe2\x98\x83 "
        "\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82",
        "it's I'LL we've 'd <s> </s> <unk>",
    };
    static const char raw[] = {'\0', '\x01', 'a', '\x7f', '\xff', '\xc3', '(', '\xe2', '\x82'};
    const uint32_t n = kvq_tokenizer_n_vocab(t);
    CHECK(n >= 1 && n <= KVQ_TOKENIZER_MAX_VOCAB);
    const int32_t bos = kvq_tokenizer_bos(t), eos = kvq_tokenizer_eos(t), unk = kvq_tokenizer_unk(t);
    CHECK(bos >= -1 && bos < (int32_t)n && eos >= -1 && eos < (int32_t)n);
    CHECK(unk >= -1 && unk < (int32_t)n);
    CHECK(kvq_tokenizer_model(t) != NULL);

    for (uint32_t i = 0; i < n && i < TOK_CHECK_IDS; i++)
        check_id(t, (int32_t)i);
    for (uint32_t i = n > TOK_CHECK_IDS ? n - 16 : n; i < n; i++)
        check_id(t, (int32_t)i);
    CHECK(kvq_tokenizer_token_str(t, (int32_t)n, NULL) == NULL);
    CHECK(kvq_tokenizer_token_str(t, -1, NULL) == NULL);
    CHECK(kvq_tokenizer_piece(t, (int32_t)n, NULL) == NULL);
    CHECK(kvq_tokenizer_token_type(t, (int32_t)n) == 0);

    const int covers = n <= 65536 && covers_all_bytes(t);
    const int may_drop = kvq_tokenizer_drops_unknown(t) && !covers;
    const int must = covers || unk >= 0 || kvq_tokenizer_drops_unknown(t);
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++)
        check_encode(t, texts[k], strlen(texts[k]), must, may_drop);
    check_encode(t, raw, sizeof raw, must, may_drop);
    check_encode(t, "", 0, must, may_drop);
    check_encode(t, tail, tail_len, must, may_drop);

    /* decode of the first ids, specials rendered; an id out of range is refused */
    int32_t ids[64];
    size_t m = 0;
    for (; m < 64 && m < n; m++)
        ids[m] = (int32_t)m;
    char *out = NULL;
    size_t olen = 0;
    kvq_err err = {0};
    CHECK(kvq_tokenizer_decode(t, ids, m, KVQ_DECODE_SPECIAL, &out, &olen, &err) == KVQ_OK);
    CHECK(out != NULL && out[olen] == '\0');
    free(out);
    out = NULL;
    ids[0] = (int32_t)n;
    CHECK(kvq_tokenizer_decode(t, ids, 1, 0, &out, &olen, &err) == KVQ_E_INVALID_ARG);
    free(out);
}

#endif
