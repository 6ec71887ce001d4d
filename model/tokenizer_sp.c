/*
 * tokenizer_sp.c — SentencePiece-style encoding (GGUF "llama", llama2.c).
 *
 * The text is escaped ('▁' for ' ', one leading '▁' as the dummy prefix), split into
 * code points, and merged by score with the shared engine in tokenizer_merge.c: the pair
 * whose concatenation is a token with the highest score merges first, ties going to
 * the leftmost pair. That is what llama2.c does with its O(n^2) scan and llama.cpp
 * with its priority queue; the result is the same.
 */
#include "model/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

static const char SPACE_MARK[3] = {'\xe2', '\x96', '\x81'}; /* U+2581 '▁' */

kvq_status tok_metaspace_buffer(const char *text, size_t len, int prefix, char **buf,
                                size_t *n, kvq_err *err)
{
    size_t spaces = 0;
    for (size_t i = 0; i < len; i++)
        spaces += text[i] == ' ';
    /* len < 2^31 (checked by the caller), so this cannot overflow a size_t */
    size_t total = len + 2 * spaces + (prefix ? 3 : 0);
    if (total > UINT32_MAX)
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "tokenizer: text too long after escaping");
    char *b = malloc(total ? total : 1);
    if (!b)
        return kvq_err_set(err, KVQ_E_NOMEM, "tokenizer: out of memory");
    size_t w = 0;
    if (prefix) {
        memcpy(b, SPACE_MARK, 3);
        w = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(b + w, SPACE_MARK, 3);
            w += 3;
        } else {
            b[w++] = text[i];
        }
    }
    *buf = b;
    *n = w;
    return KVQ_OK;
}

kvq_status tok_split_code_points(const kvq_tokenizer *t, const char *buf, size_t n,
                                 tok_sym **syms, size_t *count, kvq_err *err)
{
    tok_sym *s = malloc((n ? n : 1) * sizeof *s);
    if (!s)
        return kvq_err_set(err, KVQ_E_NOMEM, "tokenizer: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t len = tok_utf8_next((const unsigned char *)buf + i, n - i, &cp);
        if (len == 0)
            len = 1; /* a stray byte is a symbol of its own (byte fallback later) */
        s[k].start = (uint32_t)i;
        s[k].len = (uint32_t)len;
        s[k].id = tok_lookup(t, buf + i, len);
        s[k].prev = (int32_t)k - 1;
        s[k].next = (int32_t)k + 1;
        k++;
        i += len;
    }
    if (k > 0)
        s[k - 1].next = -1;
    *syms = s;
    *count = k;
    return KVQ_OK;
}

typedef struct spm_ctx {
    const kvq_tokenizer *t;
    const char *buf;
} spm_ctx;

/* l and r merge when their concatenated text is a token; priority = its score. */
static int spm_pair(const void *vctx, const tok_sym *l, const tok_sym *r, double *prio,
                    int32_t *id)
{
    const spm_ctx *c = vctx;
    int32_t m = tok_lookup(c->t, c->buf + l->start, (size_t)l->len + r->len);
    if (m < 0)
        return 0;
    *prio = c->t->scores ? c->t->scores[m] : 0.0;
    *id = m;
    return 1;
}

kvq_status tok_spm_encode(const kvq_tokenizer *t, const char *text, size_t len, int prefix,
                          tok_ids *out, kvq_err *err)
{
    char *buf = NULL;
    tok_sym *syms = NULL;
    size_t n = 0, count = 0;
    kvq_status st = tok_metaspace_buffer(text, len, prefix, &buf, &n, err);
    if (st)
        return st;
    st = tok_split_code_points(t, buf, n, &syms, &count, err);
    if (st)
        goto done;
    spm_ctx ctx = {t, buf};
    if (tok_merge(syms, count, spm_pair, &ctx)) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    st = tok_emit(t, syms, count, buf, out, err);
done:
    free(syms);
    free(buf);
    return st;
}
