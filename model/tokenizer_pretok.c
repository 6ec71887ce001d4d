/*
 * tokenizer_pretok.c — the byte-level BPE pre-token splits, written by hand as exact
 * matchers of the regular expressions llama.cpp and HF tokenizers use (see
 * kvq/tokenizer.h for the list), over the Unicode classes of model/unicode_classes.h.
 *
 * A split is a pipeline of stages. Each stage takes the pieces of the previous one and
 * splits every piece on its own, as llama.cpp's unicode_regex_split and HF's Split
 * (behavior Isolated) do: at each position of the piece the stage's matcher says
 * whether the expression matches there (and where the match ends); a match becomes a
 * piece, and the text between matches becomes a piece too. Matchers see only the
 * piece: a lookahead at its end sees the end of the text.
 */
#include "model/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "model/unicode_classes.h"

/* ==========================================================================
 * character classes
 * ========================================================================== */

enum {
    F_LU = 1u << 0, F_LL = 1u << 1, F_LT = 1u << 2, F_LM = 1u << 3, F_LO = 1u << 4,
    F_M = 1u << 5, F_N = 1u << 6, F_P = 1u << 7, F_S = 1u << 8, /* \s */
    F_CRLF = 1u << 9,
    F_L = F_LU | F_LL | F_LT | F_LM | F_LO,
    F_UPPERISH = F_LU | F_LT | F_LM | F_LO | F_M, /* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] */
    F_LOWERISH = F_LL | F_LM | F_LO | F_M,        /* [\p{Ll}\p{Lm}\p{Lo}\p{M}] */
    F_PUNCT = 0                                   /* [^\s\p{L}\p{N}]: tested as !(L|N|S) */
};

static int is_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static unsigned uc_class(uint32_t cp)
{
    size_t lo = 0, hi = sizeof TOK_CLASS_RUNS / sizeof *TOK_CLASS_RUNS;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (cp < TOK_CLASS_RUNS[mid].lo)
            hi = mid;
        else if (cp > TOK_CLASS_RUNS[mid].hi)
            lo = mid + 1;
        else
            return TOK_CLASS_RUNS[mid].cls;
    }
    return TOK_UC_OTHER;
}

static unsigned cp_flags(uint32_t cp)
{
    if (cp > 0x10FFFF)
        return 0; /* a byte that is not well-formed UTF-8: punctuation */
    unsigned f = is_space(cp) ? F_S : 0;
    if (cp == '\r' || cp == '\n')
        f |= F_CRLF;
    static const unsigned map[10] = {0, F_LU, F_LL, F_LT, F_LM, F_LO, F_M, F_N, F_P, 0};
    if (cp < 0x80) { /* fast path, same answers as the table */
        if (cp >= 'A' && cp <= 'Z')
            return f | F_LU;
        if (cp >= 'a' && cp <= 'z')
            return f | F_LL;
        if (cp >= '0' && cp <= '9')
            return f | F_N;
    }
    return f | map[uc_class(cp)];
}

int tok_cp_class(uint32_t cp)
{
    unsigned f = cp_flags(cp);
    return (f & F_S) ? 3 : (f & F_L) ? 1 : (f & F_N) ? 2 : 0;
}

/* The code point at s[i] (i < n): its length (a stray byte counts as one), flags, value. */
static size_t at(const char *s, size_t n, size_t i, unsigned *f, uint32_t *cpo)
{
    uint32_t cp;
    size_t k = tok_utf8_next((const unsigned char *)s + i, n - i, &cp);
    if (k == 0) {
        k = 1;
        cp = UINT32_MAX;
    }
    *f = cp_flags(cp);
    if (cpo)
        *cpo = cp;
    return k;
}

static unsigned flags_at(const char *s, size_t n, size_t i)
{
    unsigned f = 0;
    if (i < n)
        at(s, n, i, &f, NULL);
    return f;
}

#define IS_PUNCT(f) (((f) & (F_L | F_N | F_S)) == 0) /* [^\s\p{L}\p{N}] */

/* End of the run of code points with (flags & mask) from i, at most limit (0: any). */
static size_t run(const char *s, size_t n, size_t i, unsigned mask, uint32_t limit)
{
    uint32_t count = 0;
    while (i < n && (limit == 0 || count < limit)) {
        unsigned f;
        size_t len = at(s, n, i, &f, NULL);
        if (!(f & mask))
            break;
        i += len;
        count++;
    }
    return i;
}

/* End of the run of [^\s\p{L}\p{N}] from i. */
static size_t punct_run(const char *s, size_t n, size_t i)
{
    while (i < n) {
        unsigned f;
        size_t len = at(s, n, i, &f, NULL);
        if (!IS_PUNCT(f))
            break;
        i += len;
    }
    return i;
}

/* \s+(?!\S) | \s+ at i (a space): the whole run when it reaches the end of the text,
 * else the run minus its last code point, unless that leaves nothing. */
static size_t space_run(const char *s, size_t n, size_t i)
{
    size_t last = i, j = i;
    while (j < n) {
        unsigned f;
        size_t len = at(s, n, j, &f, NULL);
        if (!(f & F_S))
            break;
        last = j;
        j += len;
    }
    if (j == n || last == i)
        return j;
    return last;
}

/* \s*[\r\n]+ at i: just past the last \r or \n of the whitespace run, or 0. */
static size_t space_newlines(const char *s, size_t n, size_t i)
{
    size_t k = i, end = 0;
    while (k < n) {
        unsigned f;
        size_t kl = at(s, n, k, &f, NULL);
        if (!(f & F_S))
            break;
        if (f & F_CRLF)
            end = k + 1;
        k += kl;
    }
    return end;
}

static int lower(char c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* 's 't 're 've 'm 'll 'd at i (fold: ASCII case-insensitive): the end, or 0. */
static size_t contraction(const char *s, size_t n, size_t i, int fold)
{
    if (i >= n || s[i] != '\'' || i + 1 >= n)
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

/* ==========================================================================
 * matchers: end of the match starting at i (< n), or 0 when there is none
 * ========================================================================== */

typedef size_t (*match_fn)(const char *s, size_t n, size_t i, uint32_t digits);

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t m_gpt2(const char *s, size_t n, size_t i, uint32_t digits)
{
    (void)digits;
    size_t e = contraction(s, n, i, 0);
    if (e)
        return e;
    size_t j = (s[i] == ' ' && i + 1 < n) ? i + 1 : i;
    unsigned f = flags_at(s, n, j);
    if (f & F_S)
        return space_run(s, n, i);
    if (f & F_L)
        return run(s, n, j, F_L, 0);
    if (f & F_N)
        return run(s, n, j, F_N, 0);
    return punct_run(s, n, j);
}

/* ' ?[^\s\p{L}\p{N}]+' followed by [\r\n]* (slash 0) or [\r\n/]* (slash 1), or 0. */
static size_t punct_tail(const char *s, size_t n, size_t i, int slash)
{
    size_t j = (s[i] == ' ' && i + 1 < n) ? i + 1 : i;
    if (!IS_PUNCT(flags_at(s, n, j)) || (j == i && s[i] == ' '))
        return 0;
    size_t e = punct_run(s, n, j);
    while (e < n && (s[e] == '\r' || s[e] == '\n' || (slash && s[e] == '/')))
        e++;
    return e;
}

/* The whitespace alternatives common to the Llama-3 family:
 * \s*[\r\n]+ | \s+(?!\S) | \s+  (i is a space), or 0. */
static size_t space_tail(const char *s, size_t n, size_t i)
{
    if (!(flags_at(s, n, i) & F_S))
        return 0;
    size_t e = space_newlines(s, n, i);
    return e ? e : space_run(s, n, i);
}

/* Llama-3 (digits 3), Qwen2 (digits 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,digits}
 * | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t m_llama3(const char *s, size_t n, size_t i, uint32_t digits)
{
    size_t e = contraction(s, n, i, 1);
    if (e)
        return e;
    unsigned f;
    size_t len = at(s, n, i, &f, NULL);
    if (f & F_L)
        return run(s, n, i, F_L, 0);
    if (!(f & (F_N | F_CRLF)) && (flags_at(s, n, i + len) & F_L))
        return run(s, n, i + len, F_L, 0);
    if (f & F_N)
        return run(s, n, i, F_N, digits);
    if ((e = punct_tail(s, n, i, 0)))
        return e;
    return space_tail(s, n, i);
}

/* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+ at j (the first alternative of
 * tekken / o200k after its optional prefix), or 0: the greedy upper run gives back code
 * points until one of the lower class follows. */
static size_t upper_lower(const char *s, size_t n, size_t j)
{
    size_t k = j, last = SIZE_MAX;
    while (k < n) {
        unsigned f;
        size_t len = at(s, n, k, &f, NULL);
        if (f & F_LOWERISH)
            last = k; /* L+ could start here */
        if (!(f & F_UPPERISH))
            break;
        k += len;
    }
    if (last == SIZE_MAX)
        return 0;
    return run(s, n, last, F_LOWERISH, 0);
}

/* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]* at j, or 0. */
static size_t upper_then_lower(const char *s, size_t n, size_t j)
{
    size_t u = run(s, n, j, F_UPPERISH, 0);
    return u > j ? run(s, n, u, F_LOWERISH, 0) : 0;
}

/* tekken (contr 0, digits 1) and gpt-4o / o200k (contr 1, digits 3):
 * [^\r\n\p{L}\p{N}]?[UP]*[LO]+C?|[^\r\n\p{L}\p{N}]?[UP]+[LO]*C?|\p{N}{1,digits}
 * | ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * with UP = \p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}, LO = \p{Ll}\p{Lm}\p{Lo}\p{M} and C the
 * case-insensitive contractions (o200k only). */
static size_t o200k_common(const char *s, size_t n, size_t i, uint32_t digits, int contr)
{
    unsigned f;
    size_t len = at(s, n, i, &f, NULL);
    const int can_prefix = !(f & (F_L | F_N | F_CRLF)) && i + len < n;
    for (int alt = 0; alt < 2; alt++)
        for (int pre = can_prefix; pre >= 0; pre--) {
            size_t j = pre ? i + len : i;
            size_t e = alt == 0 ? upper_lower(s, n, j) : upper_then_lower(s, n, j);
            if (e) {
                size_t c = contr ? contraction(s, n, e, 1) : 0;
                return c ? c : e;
            }
        }
    if (f & F_N)
        return run(s, n, i, F_N, digits);
    size_t e = punct_tail(s, n, i, 1);
    if (e)
        return e;
    return space_tail(s, n, i);
}

static size_t m_tekken(const char *s, size_t n, size_t i, uint32_t digits)
{
    return o200k_common(s, n, i, digits, 0);
}

static size_t m_o200k(const char *s, size_t n, size_t i, uint32_t digits)
{
    return o200k_common(s, n, i, digits, 1);
}

/* \p{N} (digits 1) or \p{N}+ (digits 0). */
static size_t m_numbers(const char *s, size_t n, size_t i, uint32_t digits)
{
    return (flags_at(s, n, i) & F_N) ? run(s, n, i, F_N, digits) : 0;
}

/* [0-9][0-9][0-9] */
static size_t m_ascii3(const char *s, size_t n, size_t i, uint32_t digits)
{
    (void)digits;
    if (i + 3 > n)
        return 0;
    for (size_t k = i; k < i + 3; k++)
        if (s[k] < '0' || s[k] > '9')
            return 0;
    return i + 3;
}

/* [\p{P}\$\+<=>\^~\|]+ (llama.cpp's default split, first stage) */
static size_t m_punct_sym(const char *s, size_t n, size_t i, uint32_t digits)
{
    (void)digits;
    size_t k = i;
    while (k < n) {
        unsigned f;
        uint32_t cp;
        size_t len = at(s, n, k, &f, &cp);
        if (!(f & F_P) && !(cp < 0x80 && strchr("$+<=>^~|", (int)cp) && cp))
            break;
        k += len;
    }
    return k > i ? k : 0;
}

/* deepseek-llm's explicit classes (deepseek-ai/deepseek-llm-7b-base tokenizer.json,
 * llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM), by code point. */
typedef struct cp_range {
    uint32_t lo, hi;
} cp_range;

static const cp_range DS_LETTERS[] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA},
    {0x1BC, 0x1BF}, {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x376},
    {0x377, 0x377}, {0x37B, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A},
    {0x38C, 0x38C}, {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F},
    {0x531, 0x556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102}, {0x2107, 0x2107},
    {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126},
    {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F},
    {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2183}, {0x2184, 0x2184}, {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF2}, {0x2CF3, 0x2CF3}, {0xA640, 0xA66D},
    {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787}, {0xA78B, 0xA78E}, {0xAB70, 0xABBF},
    {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0x10400, 0x1044F},
    {0x104B0, 0x104D3}, {0x104D8, 0x104FB}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2},
    {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
static const cp_range DS_PUNCT[] = {{0x21, 0x2F},     {0x3A, 0x7E},     {0xFF01, 0xFF0F},
                                    {0xFF1A, 0xFF5E}, {0x2018, 0x201F}, {0x3000, 0x3002}};
static const cp_range DS_CJK[] = {{0x4E00, 0x9FA5}, {0x0800, 0x4E00}, {0xAC00, 0xD7FF}};

static int in_ranges(const cp_range *r, size_t nr, uint32_t cp)
{
    for (size_t k = 0; k < nr; k++)
        if (cp >= r[k].lo && cp <= r[k].hi)
            return 1;
    return 0;
}

static size_t ranges_run(const char *s, size_t n, size_t i, const cp_range *r, size_t nr)
{
    while (i < n) {
        unsigned f;
        uint32_t cp;
        size_t len = at(s, n, i, &f, &cp);
        if (!in_ranges(r, nr, cp))
            break;
        i += len;
    }
    return i;
}

/* \s?[R]+ */
static size_t space_opt_ranges(const char *s, size_t n, size_t i, const cp_range *r, size_t nr)
{
    unsigned f;
    size_t len = at(s, n, i, &f, NULL);
    if (f & F_S) {
        size_t e = ranges_run(s, n, i + len, r, nr);
        if (e > i + len)
            return e;
    }
    size_t e = ranges_run(s, n, i, r, nr);
    return e > i ? e : 0;
}

static size_t m_crlf(const char *s, size_t n, size_t i, uint32_t digits)
{
    (void)n;
    (void)digits;
    return (s[i] == '\r' || s[i] == '\n') ? i + 1 : 0;
}

static size_t m_ds_letters(const char *s, size_t n, size_t i, uint32_t digits)
{
    (void)digits;
    return space_opt_ranges(s, n, i, DS_LETTERS, sizeof DS_LETTERS / sizeof *DS_LETTERS);
}

static size_t m_ds_punct(const char *s, size_t n, size_t i, uint32_t digits)
{
    (void)digits;
    return space_opt_ranges(s, n, i, DS_PUNCT, sizeof DS_PUNCT / sizeof *DS_PUNCT);
}

/* \s+$ ($: the end of the piece; pieces hold no '\n' but a lone one by then) */
static size_t m_trailing_space(const char *s, size_t n, size_t i, uint32_t digits)
{
    (void)digits;
    return (flags_at(s, n, i) & F_S) && run(s, n, i, F_S, 0) == n ? n : 0;
}

static size_t m_ds_cjk(const char *s, size_t n, size_t i, uint32_t digits)
{
    (void)digits;
    size_t e = ranges_run(s, n, i, DS_CJK, sizeof DS_CJK / sizeof *DS_CJK);
    return e > i ? e : 0;
}

/* ==========================================================================
 * pipelines
 * ========================================================================== */

typedef struct stage {
    match_fn fn;
    int digits; /* -1: the split's max_digits */
} stage;

/* The stages of a split; *count of them. */
static const stage *pipeline(kvq_pretok style, size_t *count)
{
    static const stage gpt2[] = {{m_gpt2, 0}};
    static const stage smollm[] = {{m_numbers, 1}, {m_gpt2, 0}};
    static const stage llama3[] = {{m_llama3, -1}};
    static const stage tekken[] = {{m_tekken, -1}};
    static const stage gpt4o[] = {{m_o200k, -1}};
    static const stage deepseek[] = {{m_crlf, 0},   {m_ds_letters, 0},       {m_ds_punct, 0},
                                     {m_trailing_space, 0}, {m_ds_cjk, 0}, {m_numbers, -1}};
    static const stage dflt[] = {{m_punct_sym, 0}, {m_gpt2, 0}, {m_numbers, 0}, {m_ascii3, 0}};
#define P(a) (*count = sizeof a / sizeof *a, a)
    switch (style) {
    case KVQ_PRETOK_GPT2: return P(gpt2);
    case KVQ_PRETOK_LLAMA3: return P(llama3);
    case KVQ_PRETOK_SMOLLM: return P(smollm);
    case KVQ_PRETOK_DEEPSEEK_LLM: return P(deepseek);
    case KVQ_PRETOK_TEKKEN: return P(tekken);
    case KVQ_PRETOK_GPT4O: return P(gpt4o);
    case KVQ_PRETOK_DEFAULT: return P(dflt);
    default: *count = 0; return NULL;
    }
#undef P
}

typedef struct ends_vec {
    size_t *v;
    size_t n, cap;
} ends_vec;

static int ends_push(ends_vec *e, size_t x)
{
    if (e->n == e->cap) {
        size_t c2 = e->cap ? 2 * e->cap : 64;
        size_t *v2 = realloc(e->v, c2 * sizeof *v2);
        if (!v2)
            return -1;
        e->v = v2;
        e->cap = c2;
    }
    e->v[e->n++] = x;
    return 0;
}

/* Splits every piece of in (ends) with fn into out. */
static int split_stage(const char *s, const ends_vec *in, match_fn fn, uint32_t digits,
                       ends_vec *out)
{
    size_t a = 0;
    for (size_t p = 0; p < in->n; p++) {
        const size_t b = in->v[p];
        const char *ps = s + a; /* the matcher sees the piece only */
        const size_t pn = b - a;
        size_t x = 0, gap = 0;
        while (x < pn) {
            size_t e = fn(ps, pn, x, digits);
            if (e > x) {
                if (gap < x && ends_push(out, a + x))
                    return -1;
                if (ends_push(out, a + e))
                    return -1;
                x = gap = e;
            } else {
                unsigned f;
                x += at(ps, pn, x, &f, NULL);
            }
        }
        if (gap < pn && ends_push(out, b))
            return -1;
        a = b;
    }
    return 0;
}

kvq_status kvq_pretokenize(kvq_pretok style, uint32_t max_digits, const char *text, size_t len,
                           size_t **ends, size_t *n, kvq_err *err)
{
    *ends = NULL;
    *n = 0;
    ends_vec cur = {0}, nxt = {0};
    if (len == 0)
        return KVQ_OK;
    if (ends_push(&cur, len))
        goto nomem;
    size_t ns = 0;
    const stage *st = pipeline(style, &ns);
    for (size_t k = 0; k < ns; k++) {
        nxt.n = 0;
        uint32_t d = st[k].digits < 0 ? max_digits : (uint32_t)st[k].digits;
        if (split_stage(text, &cur, st[k].fn, d, &nxt))
            goto nomem;
        ends_vec t = cur;
        cur = nxt;
        nxt = t;
    }
    free(nxt.v);
    *ends = cur.v;
    *n = cur.n;
    return KVQ_OK;
nomem:
    free(cur.v);
    free(nxt.v);
    return kvq_err_set(err, KVQ_E_NOMEM, "pretokenize: out of memory");
}

/* ==========================================================================
 * naming and recognizing splits
 * ========================================================================== */

const char *kvq_pretok_name(kvq_pretok style)
{
    switch (style) {
    case KVQ_PRETOK_NONE: return "none";
    case KVQ_PRETOK_GPT2: return "gpt-2";
    case KVQ_PRETOK_LLAMA3: return "llama3";
    case KVQ_PRETOK_SMOLLM: return "smollm";
    case KVQ_PRETOK_DEEPSEEK_LLM: return "deepseek-llm";
    case KVQ_PRETOK_TEKKEN: return "tekken";
    case KVQ_PRETOK_GPT4O: return "gpt-4o";
    case KVQ_PRETOK_DEFAULT: return "default";
    }
    return "?";
}

/* The HF Split regexes kvq knows, as tokenizer.json spells them. */
static const char RE_LLAMA3_HEAD[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}";
static const char RE_LLAMA3_TAIL[] =
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_TEKKEN[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_O200K[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

int tok_pretok_from_regex(const char *re, kvq_pretok *style, uint32_t *digits)
{
    const size_t hl = sizeof RE_LLAMA3_HEAD - 1;
    if (strncmp(re, RE_LLAMA3_HEAD, hl) == 0) {
        const char *r = re + hl;
        uint32_t d = 1;
        if (strncmp(r, "{1,3}", 5) == 0) {
            d = 3;
            r += 5;
        } else if (*r == '+') {
            d = 0;
            r++;
        }
        if (strcmp(r, RE_LLAMA3_TAIL) == 0) {
            *style = KVQ_PRETOK_LLAMA3;
            *digits = d;
            return 1;
        }
        return 0;
    }
    if (strcmp(re, RE_TEKKEN) == 0) {
        *style = KVQ_PRETOK_TEKKEN;
        *digits = 1;
        return 1;
    }
    if (strcmp(re, RE_O200K) == 0) {
        *style = KVQ_PRETOK_GPT4O;
        *digits = 3;
        return 1;
    }
    if (strcmp(re, RE_GPT2) == 0) {
        *style = KVQ_PRETOK_GPT2;
        *digits = 0;
        return 1;
    }
    return 0;
}

/* Appends cp as UTF-8 to b (room for 4 bytes is the caller's). */
static size_t put_utf8(char *b, uint32_t cp)
{
    if (cp < 0x80) {
        b[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        b[0] = (char)(0xC0 | (cp >> 6));
        b[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        b[0] = (char)(0xE0 | (cp >> 12));
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    b[0] = (char)(0xF0 | (cp >> 18));
    b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    b[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    b[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Does re equal head + [class of r] + tail? */
static int regex_class_eq(const char *re, const char *head, const cp_range *r, size_t nr,
                          const char *tail)
{
    size_t hl = strlen(head);
    if (strncmp(re, head, hl) != 0)
        return 0;
    re += hl;
    if (*re++ != '[')
        return 0;
    for (size_t k = 0; k < nr; k++) {
        char b[16];
        size_t l = put_utf8(b, r[k].lo);
        if (r[k].hi != r[k].lo) {
            b[l++] = '-';
            l += put_utf8(b + l, r[k].hi);
        }
        if (strncmp(re, b, l) != 0)
            return 0;
        re += l;
    }
    return *re == ']' && strcmp(re + 1, tail) == 0;
}

int tok_pretok_deepseek_stage(int k, const char *re)
{
    switch (k) {
    case 0: return strcmp(re, "[\r\n]") == 0;
    case 1: return regex_class_eq(re, "\\s?", DS_LETTERS, sizeof DS_LETTERS / sizeof *DS_LETTERS,
                                  "+");
    case 2: return regex_class_eq(re, "\\s?", DS_PUNCT, sizeof DS_PUNCT / sizeof *DS_PUNCT, "+");
    case 3: return strcmp(re, "\\s+$") == 0;
    case 4: return regex_class_eq(re, "", DS_CJK, sizeof DS_CJK / sizeof *DS_CJK, "+");
    default: return 0;
    }
}
