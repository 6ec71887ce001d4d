/*
 * tokenizer_bpe.c — BPE encoding with ranked merges: GPT-2's byte-to-unicode alphabet,
 * the GPT-2 / Llama-3 pre-token split (see kvq/tokenizer.h for the exact expressions
 * and the approximate character classes), and the metaspace flavour.
 */
#include "calib/tokenizer_int.h"

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
 * character classes (approximate Unicode; see the header)
 * ========================================================================== */

enum { C_OTHER = 0, C_LETTER, C_NUMBER, C_SPACE };

typedef struct cp_range {
    uint32_t lo, hi;
} cp_range;

/* \p{N}: Nd, Nl and No for ASCII/Latin-1 and the common blocks. Sorted. */
static const cp_range NUMBERS[] = {
    {0x0030, 0x0039}, {0x00B2, 0x00B3}, {0x00B9, 0x00B9}, {0x00BC, 0x00BE},
    {0x0660, 0x0669}, {0x06F0, 0x06F9}, {0x07C0, 0x07C9}, {0x0966, 0x096F},
    {0x09E6, 0x09EF}, {0x09F4, 0x09F9}, {0x0A66, 0x0A6F}, {0x0AE6, 0x0AEF},
    {0x0B66, 0x0B6F}, {0x0B72, 0x0B77}, {0x0BE6, 0x0BF2}, {0x0C66, 0x0C6F},
    {0x0C78, 0x0C7E}, {0x0CE6, 0x0CEF}, {0x0D58, 0x0D5E}, {0x0D66, 0x0D78},
    {0x0DE6, 0x0DEF}, {0x0E50, 0x0E59}, {0x0ED0, 0x0ED9}, {0x0F20, 0x0F33},
    {0x1040, 0x1049}, {0x1090, 0x1099}, {0x1369, 0x137C}, {0x16EE, 0x16F0},
    {0x17E0, 0x17E9}, {0x17F0, 0x17F9}, {0x1810, 0x1819}, {0x1946, 0x194F},
    {0x19D0, 0x19DA}, {0x1A80, 0x1A89}, {0x1A90, 0x1A99}, {0x1B50, 0x1B59},
    {0x1BB0, 0x1BB9}, {0x1C40, 0x1C49}, {0x1C50, 0x1C59}, {0x2070, 0x2070},
    {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2150, 0x2182}, {0x2185, 0x2189},
    {0x2460, 0x249B}, {0x24EA, 0x24FF}, {0x2776, 0x2793}, {0x2CFD, 0x2CFD},
    {0x3007, 0x3007}, {0x3021, 0x3029}, {0x3038, 0x303A}, {0x3192, 0x3195},
    {0x3220, 0x3229}, {0x3248, 0x324F}, {0x3251, 0x325F}, {0x3280, 0x3289},
    {0x32B1, 0x32BF}, {0xA620, 0xA629}, {0xA6E6, 0xA6EF}, {0xA830, 0xA835},
    {0xA8D0, 0xA8D9}, {0xA900, 0xA909}, {0xA9D0, 0xA9D9}, {0xA9F0, 0xA9F9},
    {0xAA50, 0xAA59}, {0xABF0, 0xABF9}, {0xFF10, 0xFF19}, {0x10107, 0x10133},
    {0x1D7CE, 0x1D7FF}, {0x1F100, 0x1F10C}, {0x1FBF0, 0x1FBF9},
};

/* Code points >= 0x80 that are neither letters, numbers nor spaces: punctuation,
 * symbols, marks, controls, private use. Sorted; checked after NUMBERS and spaces. */
static const cp_range NON_LETTERS[] = {
    {0x0080, 0x00A9}, {0x00AB, 0x00B4}, {0x00B6, 0x00B9}, {0x00BB, 0x00BF},
    {0x00D7, 0x00D7}, {0x00F7, 0x00F7}, {0x02C2, 0x02C5}, {0x02D2, 0x02DF},
    {0x02E5, 0x02EB}, {0x02ED, 0x02ED}, {0x02EF, 0x036F}, {0x0375, 0x0375},
    {0x037E, 0x037E}, {0x0384, 0x0385}, {0x0387, 0x0387}, {0x03F6, 0x03F6},
    {0x0482, 0x0489}, {0x055A, 0x055F}, {0x0589, 0x058A}, {0x058D, 0x058F},
    {0x0591, 0x05C7}, {0x05F3, 0x05F4}, {0x0600, 0x061F}, {0x064B, 0x065F},
    {0x066A, 0x066D}, {0x0670, 0x0670}, {0x06D4, 0x06D4}, {0x06D6, 0x06ED},
    {0x0964, 0x0965}, {0x0970, 0x0970}, {0x0E3F, 0x0E3F}, {0x0E4F, 0x0E4F},
    {0x0E5A, 0x0E5B}, {0x10FB, 0x10FB}, {0x166D, 0x166E}, {0x169B, 0x169C},
    {0x16EB, 0x16ED}, {0x1735, 0x1736}, {0x17D4, 0x17D6}, {0x17D8, 0x17DB},
    {0x1800, 0x180A}, {0x1AB0, 0x1AFF}, {0x1DC0, 0x1DFF}, {0x1FBD, 0x1FBD},
    {0x1FBF, 0x1FC1}, {0x1FCD, 0x1FCF}, {0x1FDD, 0x1FDF}, {0x1FED, 0x1FEF},
    {0x1FFD, 0x1FFE}, {0x2000, 0x206F}, {0x207A, 0x207E}, {0x208A, 0x208E},
    {0x20A0, 0x2101}, {0x2103, 0x2106}, {0x2108, 0x2109}, {0x2114, 0x2114},
    {0x2116, 0x2118}, {0x211E, 0x2123}, {0x2125, 0x2125}, {0x2127, 0x2127},
    {0x2129, 0x2129}, {0x212E, 0x212E}, {0x213A, 0x213B}, {0x2140, 0x2144},
    {0x214A, 0x214D}, {0x214F, 0x214F}, {0x218A, 0x218B}, {0x2190, 0x245F},
    {0x249C, 0x24E9}, {0x2500, 0x2775}, {0x2794, 0x2BFF}, {0x2CE5, 0x2CEA},
    {0x2CEF, 0x2CF1}, {0x2CF9, 0x2CFC}, {0x2CFE, 0x2CFF}, {0x2E00, 0x2FFF},
    {0x3001, 0x3004}, {0x3008, 0x3020}, {0x302A, 0x3030}, {0x3036, 0x3037},
    {0x303D, 0x303F}, {0x3099, 0x309C}, {0x30A0, 0x30A0}, {0x30FB, 0x30FB},
    {0x3190, 0x3191}, {0x3196, 0x319F}, {0x31C0, 0x31E3}, {0x3200, 0x321E},
    {0x322A, 0x3247}, {0x3250, 0x3250}, {0x3260, 0x327F}, {0x328A, 0x32B0},
    {0x32C0, 0x33FF}, {0x4DC0, 0x4DFF}, {0xA490, 0xA4C6}, {0xA4FE, 0xA4FF},
    {0xA60D, 0xA60F}, {0xA670, 0xA67E}, {0xA6F0, 0xA6F7}, {0xA700, 0xA716},
    {0xA720, 0xA721}, {0xA789, 0xA78A}, {0xA828, 0xA82B}, {0xA836, 0xA839},
    {0xA874, 0xA877}, {0xA8CE, 0xA8CF}, {0xA8F8, 0xA8FA}, {0xA8FC, 0xA8FC},
    {0xA92E, 0xA92F}, {0xA95F, 0xA95F}, {0xA9C1, 0xA9CD}, {0xA9DE, 0xA9DF},
    {0xAA5C, 0xAA5F}, {0xAADE, 0xAADF}, {0xAAF0, 0xAAF1}, {0xABEB, 0xABEB},
    {0xD800, 0xF8FF}, {0xFB29, 0xFB29}, {0xFD3E, 0xFD3F}, {0xFDFC, 0xFDFD},
    {0xFE00, 0xFE6F}, {0xFEFF, 0xFEFF}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF20},
    {0xFF3B, 0xFF40}, {0xFF5B, 0xFF65}, {0xFFE0, 0xFFEE}, {0xFFF0, 0xFFFF},
    {0x10100, 0x10106}, {0x1D000, 0x1D24F}, {0x1D300, 0x1D35F}, {0x1F000, 0x1F0FF},
    {0x1F10D, 0x1FAFF}, {0x1FB00, 0x1FBEF}, {0xE0000, 0xE0FFF}, {0xF0000, 0x10FFFF},
};

static int in_ranges(const cp_range *r, size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid].lo)
            hi = mid;
        else if (cp > r[mid].hi)
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}

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
    if (in_ranges(NUMBERS, sizeof NUMBERS / sizeof *NUMBERS, cp))
        return C_NUMBER;
    if (in_ranges(NON_LETTERS, sizeof NON_LETTERS / sizeof *NON_LETTERS, cp))
        return C_OTHER;
    return C_LETTER;
}

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
