/*
 * tokenizer_bpe.c — BPE encoding with ranked merges: GPT-2's byte-to-unicode alphabet,
 * byte-level encoding over the pre-tokens of tokenizer_pretok.c (after the normalizer of
 * tokenizer_norm.c, when the tokenizer has one), and the metaspace flavour.
 */
#include "model/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * GPT-2 byte <-> unicode alphabet
 * ========================================================================== */

/* Printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68
 * bytes, in increasing order, get the code points 256, 257, ... */
uint32_t tok_byte_to_cp(uint8_t b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    if (b <= 32)
        return 256u + b;         /* 0..32    -> 256..288 */
    if (b <= 160)
        return 289u + (b - 127); /* 127..160 -> 289..322 */
    return 323u;                 /* 173 (soft hyphen) */
}

int tok_cp_to_byte(uint32_t cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp >= 256 && cp <= 288)
        return (int)(cp - 256);
    if (cp >= 289 && cp <= 322)
        return (int)(cp - 289 + 127);
    if (cp == 323)
        return 173;
    return -1;
}

/* ==========================================================================
 * encoding
 * ========================================================================== */

/* Two tokens merge when the pair is in the merge table; lower rank first. */
static int bpe_pair(const void *ctx, const tok_sym *l, const tok_sym *r, double *prio,
                    int32_t *id)
{
    int32_t rank;
    if (!tok_pair_lookup(ctx, l->id, r->id, &rank, id))
        return 0;
    *prio = -(double)rank;
    return 1;
}

static kvq_status metaspace_encode(const kvq_tokenizer *t, const char *text, size_t len,
                                   int prefix, tok_ids *out, kvq_err *err)
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
    if (tok_merge(syms, count, bpe_pair, t)) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    st = tok_emit(t, syms, count, buf, out, err);
done:
    free(syms);
    free(buf);
    return st;
}

kvq_status tok_bpe_encode(const kvq_tokenizer *t, const char *text, size_t len, int prefix,
                          tok_ids *out, kvq_err *err)
{
    if (!t->byte_level)
        return metaspace_encode(t, text, len, prefix, out, err);
    kvq_status st = KVQ_OK;
    char *pbuf = NULL, *mapped = NULL, *nbuf = NULL;
    tok_sym *syms = NULL;
    size_t *ends = NULL, n_ends = 0, cap = 0;
    if (t->normalizer != KVQ_NORM_NONE) { /* HF: the normalizer runs before the split */
        size_t nn = 0;
        if ((st = tok_normalize(t->normalizer, text, len, &nbuf, &nn, err)))
            return st;
        text = nbuf;
        len = nn;
    }
    const char *s = text;
    size_t n = len;
    if (prefix) { /* ByteLevel add_prefix_space (the caller checked text[0] != ' ') */
        pbuf = malloc(len + 1);
        if (!pbuf) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        pbuf[0] = ' ';
        if (len)
            memcpy(pbuf + 1, text, len);
        s = pbuf;
        n = len + 1;
    }
    if (t->pretok != KVQ_PRETOK_NONE &&
        (st = kvq_pretokenize(t->pretok, t->max_digits, s, n, &ends, &n_ends, err)))
        goto done;
    for (size_t i = 0, p = 0; i < n; p++) {
        size_t e = t->pretok == KVQ_PRETOK_NONE ? n : ends[p];
        size_t m = e - i;
        if (m > cap) {
            size_t c2 = m > 2 * cap ? m : 2 * cap;
            tok_sym *s2 = realloc(syms, c2 * sizeof *s2);
            char *m2 = s2 ? realloc(mapped, 2 * c2) : NULL;
            if (s2)
                syms = s2;
            if (!m2) {
                st = kvq_err_set(err, KVQ_E_NOMEM, "tokenizer: out of memory");
                goto done;
            }
            mapped = m2;
            cap = c2;
        }
        if (t->ignore_merges) { /* the whole pre-token may be a token (Llama-3) */
            size_t w = 0;
            for (size_t k = i; k < e; k++) {
                uint32_t cp = tok_byte_to_cp((uint8_t)s[k]);
                if (cp < 0x80) {
                    mapped[w++] = (char)cp;
                } else {
                    mapped[w++] = (char)(0xC0 | (cp >> 6));
                    mapped[w++] = (char)(0x80 | (cp & 0x3F));
                }
            }
            int32_t id = tok_lookup(t, mapped, w);
            if (id >= 0) {
                if (tok_ids_push(out, id)) {
                    st = kvq_err_set(err, KVQ_E_NOMEM, "tokenizer: out of memory");
                    goto done;
                }
                i = e;
                continue;
            }
        }
        for (size_t k = 0; k < m; k++) {
            syms[k].start = (uint32_t)(i + k);
            syms[k].len = 1;
            syms[k].id = t->byte_sym[(uint8_t)s[i + k]];
            syms[k].prev = (int32_t)k - 1;
            syms[k].next = k + 1 < m ? (int32_t)k + 1 : -1;
        }
        if (tok_merge(syms, m, bpe_pair, t)) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        if ((st = tok_emit(t, syms, m, s, out, err)))
            goto done;
        i = e;
    }
done:
    free(ends);
    free(nbuf);
    free(pbuf);
    free(mapped);
    free(syms);
    return st;
}
