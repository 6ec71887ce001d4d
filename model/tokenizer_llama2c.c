/*
 * tokenizer_llama2c.c — a tokenizer from llama2.c's tokenizer.bin / tok512.bin: an
 * int32 max_token_length, then per token an f32 score, an int32 length and the bytes.
 */
#include "model/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "kvq/util.h"

static uint32_t rd_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Pass 1: checks the header and every record against the bytes remaining; *n = the
 * number of tokens. */
static kvq_status llama2c_count(const uint8_t *p, size_t size, const char *label, uint32_t *n,
                                kvq_err *err)
{
    *n = 0;
    if (size < 4)
        return kvq_err_set(err, KVQ_E_TRUNCATED_HEADER, "%s: %zu bytes, too short for a "
                           "llama2.c tokenizer (tokenizer model 'llama2c')", label, size);
    int32_t max_len = (int32_t)rd_u32(p);
    if (max_len < 1)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: max_token_length %d (tokenizer model "
                           "'llama2c')", label, max_len);
    size_t off = 4;
    while (off < size) {
        if (size - off < 8) {
            return kvq_err_set(err, KVQ_E_TRUNCATED_DATA, "%s: token %u is cut short at byte "
                               "%zu (tokenizer model 'llama2c')", label, *n, off);
        }
        int32_t len = (int32_t)rd_u32(p + off + 4);
        if (len < 0)
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: token %u has length %d (tokenizer "
                               "model 'llama2c')", label, *n, len);
        if ((size_t)len > size - off - 8)
            return kvq_err_set(err, KVQ_E_TRUNCATED_DATA, "%s: token %u (%d bytes) runs past "
                               "the end of the file (tokenizer model 'llama2c')", label, *n, len);
        off += 8 + (size_t)len;
        if (++*n > KVQ_TOKENIZER_MAX_VOCAB)
            return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: more than %u tokens (tokenizer model "
                               "'llama2c')", label, KVQ_TOKENIZER_MAX_VOCAB);
    }
    if (*n == 0)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: no tokens (tokenizer model 'llama2c')",
                           label);
    return KVQ_OK;
}

/* Pass 2 (records already checked): copies token i's string into tokens[i] (malloc'd),
 * turning ' ' back into '▁' and "\n<s>\n" into "<s>", with its length and score. */
static kvq_status llama2c_copy(const uint8_t *p, uint32_t n, char **tokens, uint32_t *lens,
                               float *scores, const char *label, kvq_err *err)
{
    size_t off = 4;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t sb = rd_u32(p + off);
        float sc;
        memcpy(&sc, &sb, 4);
        size_t len = rd_u32(p + off + 4);
        const char *s = (const char *)p + off + 8;
        off += 8 + len;
        if (len >= 2 && s[0] == '\n' && s[len - 1] == '\n' &&
            ((len == 5 && !memcmp(s + 1, "<s>", 3)) || (len == 6 && !memcmp(s + 1, "</s>", 4)))) {
            s++;
            len -= 2;
        }
        char *d = malloc(3 * len + 1);
        if (!d)
            return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
        size_t w = 0;
        for (size_t k = 0; k < len; k++) {
            if (s[k] == ' ') {
                memcpy(d + w, "\xe2\x96\x81", 3);
                w += 3;
            } else {
                d[w++] = s[k];
            }
        }
        d[w] = '\0';
        tokens[i] = d;
        lens[i] = (uint32_t)w;
        scores[i] = sc;
    }
    return KVQ_OK;
}

kvq_status kvq_tokenizer_from_llama2c_memory(const void *data, size_t size, const char *label,
                                             kvq_tokenizer **out, kvq_err *err)
{
    const uint8_t *p = data;
    char **tokens = NULL;
    uint32_t *lens = NULL;
    float *scores = NULL;
    uint32_t n = 0;
    *out = NULL;
    if (!label)
        label = "tokenizer.bin";
    kvq_status st = llama2c_count(p, size, label, &n, err);
    if (st)
        return st;
    tokens = calloc(n, sizeof *tokens);
    lens = malloc(n * sizeof *lens);
    scores = malloc(n * sizeof *scores);
    if (!tokens || !lens || !scores) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    st = llama2c_copy(p, n, tokens, lens, scores, label, err);
    if (st)
        goto done;
    kvq_vocab v;
    kvq_vocab_default(&v);
    v.model = "llama2c";
    v.n_tokens = n;
    v.tokens = (const char *const *)tokens;
    v.token_lens = lens;
    v.scores = scores;
    v.unk = 0;
    v.bos = n > 1 ? 1 : -1;
    v.eos = n > 2 ? 2 : -1;
    v.add_bos = 1;
    v.add_space_prefix = 1;
    st = kvq_tokenizer_new(KVQ_TOKENIZER_SPM, &v, label, NULL, out, err);
done:
    if (tokens)
        for (uint32_t i = 0; i < n; i++)
            free(tokens[i]);
    free(tokens);
    free(lens);
    free(scores);
    return st;
}

kvq_status kvq_tokenizer_from_llama2c(const char *path, kvq_tokenizer **out, kvq_err *err)
{
    kvq_map m;
    *out = NULL;
    kvq_status st = kvq_map_file(path, &m, err);
    if (st)
        return st;
    st = kvq_tokenizer_from_llama2c_memory(m.data, m.size, path, out, err);
    kvq_unmap(&m);
    return st;
}
