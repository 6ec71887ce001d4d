/*
 * tokenizer_bpe.c — BPE encoding with ranked merges: GPT-2's byte-to-unicode alphabet,
 * the GPT-2 / Llama-3 pre-token split (see kvq/tokenizer.h for the exact expressions
 * and the approximate character classes), and the metaspace flavour.
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
 * character classes (Unicode general categories; see the header)
 * ========================================================================== */

#include "model/unicode_classes.h"

enum { C_OTHER = 0, C_LETTER = 1, C_NUMBER = 2, C_SPACE = 3 }; /* 1, 2 as in the table */

/* White_Space: \s of the expressions. */
static int is_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static int cp_class(uint32_t cp)
{
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')
            return C_LETTER;
        if (cp >= '0' && cp <= '9')
            return C_NUMBER;
        return is_space(cp) ? C_SPACE : C_OTHER;
    }
    if (cp > 0x10FFFF)
        return C_OTHER; /* not well-formed UTF-8 */
    if (is_space(cp))
        return C_SPACE;
    size_t lo = 0, hi = sizeof TOK_CLASS_RUNS / sizeof *TOK_CLASS_RUNS;
    while (lo < hi) { /* the run holding cp, if any: letters and numbers */
        const size_t mid = (lo + hi) / 2;
        if (cp < TOK_CLASS_RUNS[mid].lo)
            hi = mid;
        else if (cp > TOK_CLASS_RUNS[mid].hi)
            lo = mid + 1;
        else
            return TOK_CLASS_RUNS[mid].cls;
    }
    return C_OTHER;
}

int tok_cp_class(uint32_t cp) { return cp_class(cp); }

/* The code point at s[i] (i < n): its length (a stray byte counts as one) and class. */
static size_t cp_at(const char *s, size_t n, size_t i, int *cls, uint32_t *cpo)
{
    uint32_t cp;
    size_t k = tok_utf8_next((const unsigned char *)s + i, n - i, &cp);
    if (k == 0) {
        k = 1;
        cp = UINT32_MAX;
    }
    *cls = cp_class(cp);
    if (cpo)
        *cpo = cp;
    return k;
}

static int class_at(const char *s, size_t n, size_t i)
{
    int c;
    cp_at(s, n, i, &c, NULL);
    return c;
}

/* End of the run of class c starting at i (at most `limit` code points, 0 = no limit). */
static size_t run_end(const char *s, size_t n, size_t i, int c, uint32_t limit)
{
    uint32_t count = 0;
    while (i < n && (limit == 0 || count < limit)) {
        int k;
        size_t len = cp_at(s, n, i, &k, NULL);
        if (k != c)
            break;
        i += len;
        count++;
    }
    return i;
}

/* \s+(?!\S) | \s+ at i (a space): the whole run when it reaches the end of the text,
 * else the run minus its last code point, unless that leaves nothing. */
static size_t space_run(const char *s, size_t n, size_t i)
{
    size_t last = i, j = i;
    while (j < n) {
        int k;
        size_t len = cp_at(s, n, j, &k, NULL);
        if (k != C_SPACE)
            break;
        last = j;
        j += len;
    }
    if (j == n || last == i)
        return j;
    return last;
}

static int lower(char c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* 's 't 're 've 'm 'll 'd at i: the end, or 0. */
static size_t contraction(const char *s, size_t n, size_t i, int fold)
{
    if (s[i] != '\'' || i + 1 >= n)
        return 0;
    char a = fold ? (char)lower(s[i + 1]) : s[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return i + 2;
    if (i + 2 >= n)
        return 0;
    char b = fold ? (char)lower(s[i + 2]) : s[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return i + 3;
    return 0;
}

static size_t gpt2_next(const char *s, size_t n, size_t i)
{
    size_t e = contraction(s, n, i, 0);
    if (e)
        return e;
    /* ' ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+': the class after an optional space */
    size_t j = (s[i] == ' ' && i + 1 < n) ? i + 1 : i;
    int c = class_at(s, n, j);
    if (c != C_SPACE)
        return run_end(s, n, j, c, 0);
    return space_run(s, n, i);
}

static size_t llama3_next(const char *s, size_t n, size_t i, uint32_t max_digits)
{
    size_t e = contraction(s, n, i, 1);
    if (e)
        return e;
    int c;
    uint32_t cp;
    size_t len = cp_at(s, n, i, &c, &cp);
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (c == C_LETTER)
        return run_end(s, n, i, C_LETTER, 0);
    if (c != C_NUMBER && cp != '\r' && cp != '\n' && i + len < n &&
        class_at(s, n, i + len) == C_LETTER)
        return run_end(s, n, i + len, C_LETTER, 0);
    /* \p{N}{1,max_digits} */
    if (c == C_NUMBER)
        return run_end(s, n, i, C_NUMBER, max_digits);
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    size_t j = (s[i] == ' ' && i + 1 < n) ? i + 1 : i;
    if (class_at(s, n, j) == C_OTHER) {
        e = run_end(s, n, j, C_OTHER, 0);
        while (e < n && (s[e] == '\r' || s[e] == '\n'))
            e++;
        return e;
    }
    /* \s*[\r\n]+ : up to the last newline of the whitespace run */
    size_t k = i, nl = 0;
    int have_nl = 0;
    while (k < n) {
        int kc;
        uint32_t kcp;
        size_t kl = cp_at(s, n, k, &kc, &kcp);
        if (kc != C_SPACE)
            break;
        if (kcp == '\r' || kcp == '\n') {
            nl = k;
            have_nl = 1;
        }
        k += kl;
    }
    if (have_nl)
        return nl + 1;
    return space_run(s, n, i);
}

size_t tok_pretok_next(kvq_pretok style, uint32_t max_digits, const char *text, size_t len,
                       size_t i)
{
    switch (style) {
    case KVQ_PRETOK_GPT2:
        return gpt2_next(text, len, i);
    case KVQ_PRETOK_LLAMA3:
        return llama3_next(text, len, i, max_digits);
    default:
        return len;
    }
}

kvq_status kvq_pretokenize(kvq_pretok style, uint32_t max_digits, const char *text, size_t len,
                           size_t **ends, size_t *n, kvq_err *err)
{
    *ends = NULL;
    *n = 0;
    size_t cap = 16, count = 0;
    size_t *v = malloc(cap * sizeof *v);
    if (!v)
        return kvq_err_set(err, KVQ_E_NOMEM, "pretokenize: out of memory");
    for (size_t i = 0; i < len;) {
        size_t e = tok_pretok_next(style, max_digits, text, len, i);
        if (count == cap) {
            size_t *v2 = realloc(v, 2 * cap * sizeof *v);
            if (!v2) {
                free(v);
                return kvq_err_set(err, KVQ_E_NOMEM, "pretokenize: out of memory");
            }
            v = v2;
            cap *= 2;
        }
        v[count++] = e;
        i = e;
    }
    *ends = v;
    *n = count;
    return KVQ_OK;
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
    char *pbuf = NULL, *mapped = NULL;
    tok_sym *syms = NULL;
    size_t cap = 0;
    const char *s = text;
    size_t n = len;
    if (prefix) { /* ByteLevel add_prefix_space (the caller checked text[0] != ' ') */
        pbuf = malloc(len + 1);
        if (!pbuf)
            return kvq_err_set(err, KVQ_E_NOMEM, "tokenizer: out of memory");
        pbuf[0] = ' ';
        memcpy(pbuf + 1, text, len);
        s = pbuf;
        n = len + 1;
    }
    for (size_t i = 0; i < n;) {
        size_t e = t->pretok == KVQ_PRETOK_NONE ? n : tok_pretok_next(t->pretok, t->max_digits,
                                                                       s, n, i);
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
    free(pbuf);
    free(mapped);
    free(syms);
    return st;
}
