/*
 * tokenizer.c — the core: a tokenizer built from a kvq_vocab (string table, token
 * types, pieces, merge table), queries, encode / decode dispatch, pre-tokenized id
 * files and the loader auto-detection. The merge engine is in tokenizer_merge.c,
 * encoding proper in tokenizer_sp.c (SPM) and tokenizer_bpe.c (BPE and the
 * pre-tokenizer); the loaders in tokenizer_gguf.c, tokenizer_hf.c (tokenizer.json)
 * and tokenizer_llama2c.c (tokenizer.bin).
 */
#include "model/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvq/util.h"

/* ==========================================================================
 * small helpers
 * ========================================================================== */

static uint64_t str_hash(const char *s, size_t n)
{
    return kvq_fnv1a64(s, n, KVQ_FNV1A64_INIT);
}

int tok_ids_push(tok_ids *a, int32_t id)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

size_t tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) {
        len = 2; v = c & 0x1F; min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3; v = c & 0x0F; min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4; v = c & 0x07; min = 0x10000;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return len;
}

static size_t utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int tok_parse_byte_token(const char *s, size_t n)
{
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>')
        return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = s[k];
        int d = (c >= '0' && c <= '9') ? c - '0'
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

static const char *tok_str(const kvq_tokenizer *t, int32_t id)
{
    return t->str + t->str_off[id];
}

int32_t tok_lookup(const kvq_tokenizer *t, const char *s, size_t len)
{
    if (!t->table || len == 0)
        return -1;
    size_t h = (size_t)str_hash(s, len) & t->table_mask;
    for (;;) {
        int32_t id = t->table[h];
        if (id < 0)
            return -1;
        if (t->str_len[id] == len && memcmp(tok_str(t, id), s, len) == 0)
            return id;
        h = (h + 1) & t->table_mask;
    }
}

static const tok_pair *pair_find(const kvq_tokenizer *t, int32_t l, int32_t r)
{
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    size_t h = (size_t)(key * 0x9E3779B97F4A7C15ULL >> 17) & t->pair_mask;
    for (;;) {
        const tok_pair *p = &t->pairs[h];
        if (p->key == UINT64_MAX || p->key == key)
            return p;
        h = (h + 1) & t->pair_mask;
    }
}

int tok_pair_lookup(const kvq_tokenizer *t, int32_t l, int32_t r, int32_t *rank, int32_t *id)
{
    if (!t->pairs || l < 0 || r < 0)
        return 0;
    const tok_pair *p = pair_find(t, l, r);
    if (p->key == UINT64_MAX)
        return 0;
    *rank = p->rank;
    *id = p->id;
    return 1;
}

/* ==========================================================================
 * building
 * ========================================================================== */

void kvq_vocab_default(kvq_vocab *v)
{
    memset(v, 0, sizeof *v);
    v->bos = v->eos = v->unk = -1;
    v->add_space_prefix = 1;
    v->byte_level = 1;
    v->pretok = KVQ_PRETOK_GPT2;
}

void kvq_tokenizer_free(kvq_tokenizer *t)
{
    if (!t)
        return;
    free(t->str);
    free(t->str_off);
    free(t->str_len);
    free(t->piece);
    free(t->piece_off);
    free(t->piece_len);
    free(t->scores);
    free(t->types);
    free(t->table);
    free(t->pairs);
    free(t);
}

static size_t pow2_at_least(size_t n)
{
    size_t p = 16;
    while (p < n)
        p *= 2;
    return p;
}

/* The decoded bytes of token id into out (which has room for str_len bytes). */
static size_t decode_piece(const kvq_tokenizer *t, int32_t id, char *out)
{
    const char *s = tok_str(t, id);
    size_t n = t->str_len[id];
    switch ((kvq_token_type)t->types[id]) {
    case KVQ_TOKEN_CONTROL:
    case KVQ_TOKEN_UNKNOWN:
        return 0;
    case KVQ_TOKEN_BYTE:
        out[0] = (char)tok_parse_byte_token(s, n);
        return 1;
    case KVQ_TOKEN_USER_DEFINED:
        memcpy(out, s, n);
        return n;
    default:
        break;
    }
    size_t w = 0;
    if (t->kind == KVQ_TOKENIZER_BPE && t->byte_level) {
        /* map GPT-2 alphabet code points back to bytes; others stay as they are */
        size_t i = 0;
        while (i < n) {
            uint32_t cp;
            size_t k = tok_utf8_next((const unsigned char *)s + i, n - i, &cp);
            int b = k ? tok_cp_to_byte(cp) : -1;
            if (b >= 0) {
                out[w++] = (char)b;
            } else {
                size_t m = k ? k : 1;
                memcpy(out + w, s + i, m);
                w += m;
            }
            i += k ? k : 1;
        }
        return w;
    }
    for (size_t i = 0; i < n;) {
        if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
            out[w++] = ' ';
            i += 3;
        } else {
            out[w++] = s[i++];
        }
    }
    return w;
}

/* The argument and vocabulary checks of kvq_tokenizer_new, before anything is built. */
static kvq_status check_vocab(kvq_tokenizer_kind kind, const kvq_vocab *v, const char *label,
                              const char *model, kvq_err *err)
{
    if (!v || (kind != KVQ_TOKENIZER_SPM && kind != KVQ_TOKENIZER_BPE) || !v->tokens)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: bad tokenizer arguments (tokenizer "
                           "model '%s')", label, model);
    if (v->n_tokens == 0)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: empty vocabulary (tokenizer model '%s')",
                           label, model);
    if (v->n_tokens > KVQ_TOKENIZER_MAX_VOCAB)
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: %u tokens is more than %u (tokenizer "
                           "model '%s')", label, v->n_tokens, KVQ_TOKENIZER_MAX_VOCAB, model);
    if (kind == KVQ_TOKENIZER_SPM && !v->scores)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: no token scores (tokenizer model '%s')",
                           label, model);
    const uint32_t n = v->n_tokens;
    const int32_t special[3] = {v->bos, v->eos, v->unk};
    static const char *const special_name[3] = {"BOS", "EOS", "unknown"};
    for (int k = 0; k < 3; k++)
        if (special[k] < -1 || special[k] >= (int64_t)n)
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: %s token id %d is outside the "
                               "vocabulary of %u (tokenizer model '%s')", label,
                               special_name[k], special[k], n, model);
    return KVQ_OK;
}

/* The token strings: offsets and lengths, then one NUL-terminated copy each (the
 * piece arrays are allocated with the same layout, filled by build_pieces). */
static kvq_status build_strings(kvq_tokenizer *t, const kvq_vocab *v, const char *label,
                                const char *model, kvq_err *err)
{
    const uint32_t n = t->n;
    t->str_off = malloc(n * sizeof *t->str_off);
    t->str_len = malloc(n * sizeof *t->str_len);
    t->piece_off = malloc(n * sizeof *t->piece_off);
    t->piece_len = malloc(n * sizeof *t->piece_len);
    t->types = malloc(n);
    if (!t->str_off || !t->str_len || !t->piece_off || !t->piece_len || !t->types)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!v->tokens[i])
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: token %u is NULL (tokenizer model "
                               "'%s')", label, i, model);
        size_t len = v->token_lens ? v->token_lens[i] : strlen(v->tokens[i]);
        if (len > UINT32_MAX / 2 || !kvq_size_add(total, len + 1, &total))
            return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: token %u is too long (tokenizer model "
                               "'%s')", label, i, model);
        t->str_off[i] = total - len - 1;
        t->str_len[i] = (uint32_t)len;
    }
    t->str = malloc(total ? total : 1);
    t->piece = malloc(total ? total : 1);
    if (!t->str || !t->piece)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
    for (uint32_t i = 0; i < n; i++) {
        memcpy(t->str + t->str_off[i], v->tokens[i], t->str_len[i]);
        t->str[t->str_off[i] + t->str_len[i]] = '\0';
    }
    return KVQ_OK;
}

/* The type of every token (given, or guessed from the special ids and <0xHH>) and the
 * byte fallback table. */
static kvq_status build_types(kvq_tokenizer *t, const kvq_vocab *v, const char *label,
                              const char *model, kvq_err *err)
{
    const int bytes_possible = !t->byte_level; /* <0xHH> tokens exist in SPM/metaspace */
    for (uint32_t i = 0; i < t->n; i++) {
        const char *s = tok_str(t, (int32_t)i);
        int type;
        if (v->types) {
            type = v->types[i] == 0 ? KVQ_TOKEN_NORMAL : v->types[i];
            if (type < KVQ_TOKEN_NORMAL || type > KVQ_TOKEN_BYTE)
                return kvq_err_set(err, KVQ_E_CORRUPT, "%s: token %u has type %d (tokenizer "
                                   "model '%s')", label, i, v->types[i], model);
        } else if ((int32_t)i == v->unk) {
            type = KVQ_TOKEN_UNKNOWN;
        } else if ((int32_t)i == v->bos || (int32_t)i == v->eos) {
            type = KVQ_TOKEN_CONTROL;
        } else if (bytes_possible && tok_parse_byte_token(s, t->str_len[i]) >= 0) {
            type = KVQ_TOKEN_BYTE;
        } else {
            type = KVQ_TOKEN_NORMAL;
        }
        if (type == KVQ_TOKEN_BYTE) {
            int b = tok_parse_byte_token(s, t->str_len[i]);
            if (b < 0)
                return kvq_err_set(err, KVQ_E_CORRUPT, "%s: byte token %u is '%.32s', not "
                                   "<0xHH> (tokenizer model '%s')", label, i, s, model);
            if (t->byte_tok[b] < 0)
                t->byte_tok[b] = (int32_t)i;
        }
        t->types[i] = (uint8_t)type;
    }
    return KVQ_OK;
}

/* The scores (when given) and each token's decoded piece. */
static kvq_status build_pieces(kvq_tokenizer *t, const kvq_vocab *v, const char *label,
                               kvq_err *err)
{
    const uint32_t n = t->n;
    if (v->scores) {
        t->scores = malloc(n * sizeof *t->scores);
        if (!t->scores)
            return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
        memcpy(t->scores, v->scores, n * sizeof *t->scores);
    }
    for (uint32_t i = 0; i < n; i++) {
        t->piece_off[i] = t->str_off[i];
        size_t w = decode_piece(t, (int32_t)i, t->piece + t->piece_off[i]);
        t->piece_len[i] = (uint32_t)w;
        t->piece[t->piece_off[i] + w] = '\0';
    }
    return KVQ_OK;
}

/* The string -> id table (first id wins) and, byte-level, the token of each byte's
 * GPT-2 alphabet character. */
static kvq_status build_table(kvq_tokenizer *t, const char *label, kvq_err *err)
{
    const uint32_t n = t->n;
    t->table_mask = pow2_at_least((size_t)n * 2) - 1;
    t->table = malloc((t->table_mask + 1) * sizeof *t->table);
    if (!t->table)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
    memset(t->table, 0xff, (t->table_mask + 1) * sizeof *t->table);
    for (uint32_t i = 0; i < n; i++) {
        size_t len = t->str_len[i];
        if (len == 0 || tok_lookup(t, tok_str(t, (int32_t)i), len) >= 0)
            continue;
        size_t h = (size_t)str_hash(tok_str(t, (int32_t)i), len) & t->table_mask;
        while (t->table[h] >= 0)
            h = (h + 1) & t->table_mask;
        t->table[h] = (int32_t)i;
    }
    if (t->byte_level) {
        for (int b = 0; b < 256; b++) {
            char u[4];
            size_t k = utf8_put(tok_byte_to_cp((uint8_t)b), u);
            t->byte_sym[b] = tok_lookup(t, u, k);
        }
    }
    return KVQ_OK;
}

/* Merge m's two sides: "left right" (v->merges) or a pair (v->merge_pairs). 0 ok,
 * -1 not "left right", -2 incomplete pair. */
static int merge_sides(const kvq_vocab *v, uint32_t m, const char **a, size_t *an,
                       const char **b, size_t *bn)
{
    if (v->merges) {
        const char *s = v->merges[m];
        const char *sp = s ? strchr(s, ' ') : NULL;
        if (!sp)
            return -1;
        *a = s;
        *an = (size_t)(sp - s);
        *b = sp + 1;
        *bn = strlen(*b);
    } else {
        *a = v->merge_pairs[2 * (size_t)m];
        *b = v->merge_pairs[2 * (size_t)m + 1];
        if (!*a || !*b)
            return -2;
        *an = strlen(*a);
        *bn = strlen(*b);
    }
    return 0;
}

/* The (left id, right id) -> (rank, merged id) table of a BPE vocabulary; merges that
 * name strings which are not tokens are skipped with a warning. */
static kvq_status build_merges(kvq_tokenizer *t, const kvq_vocab *v, const char *label,
                               const char *model, const kvq_callbacks *cb, kvq_err *err)
{
    if (!v->merges && !v->merge_pairs)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: merge count without merges "
                           "(tokenizer model '%s')", label, model);
    if (v->n_merges > INT32_MAX / 4)
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: %u merges (tokenizer model '%s')",
                           label, v->n_merges, model);
    t->pair_mask = pow2_at_least((size_t)v->n_merges * 2) - 1;
    t->pairs = malloc((t->pair_mask + 1) * sizeof *t->pairs);
    if (!t->pairs)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
    for (size_t i = 0; i <= t->pair_mask; i++)
        t->pairs[i].key = UINT64_MAX;
    kvq_status st = KVQ_OK;
    char *cat = NULL;
    size_t cat_cap = 0;
    uint32_t skipped = 0;
    for (uint32_t m = 0; m < v->n_merges; m++) {
        const char *a, *b;
        size_t an, bn;
        int rc = merge_sides(v, m, &a, &an, &b, &bn);
        if (rc == -1) {
            st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: merge %u is not \"left right\" "
                             "(tokenizer model '%s')", label, m, model);
            break;
        }
        if (rc == -2) {
            st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: merge %u is incomplete "
                             "(tokenizer model '%s')", label, m, model);
            break;
        }
        if (an + bn > cat_cap) {
            char *c2 = realloc(cat, an + bn);
            if (!c2) {
                st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
                break;
            }
            cat = c2;
            cat_cap = an + bn;
        }
        int32_t la = tok_lookup(t, a, an), rb = tok_lookup(t, b, bn);
        if (an + bn > 0) {
            memcpy(cat, a, an);
            memcpy(cat + an, b, bn);
        }
        int32_t id = tok_lookup(t, cat, an + bn);
        if (la < 0 || rb < 0 || id < 0) {
            skipped++;
            continue;
        }
        tok_pair *p = (tok_pair *)pair_find(t, la, rb);
        if (p->key == UINT64_MAX) { /* a repeated pair keeps its first rank */
            p->key = (uint64_t)(uint32_t)la << 32 | (uint32_t)rb;
            p->rank = (int32_t)m;
            p->id = id;
        }
    }
    free(cat);
    if (st == KVQ_OK && skipped)
        kvq_log(cb, KVQ_LOG_WARN, "%s: %u of %u merges name strings that are not tokens; "
                "skipped (tokenizer model '%s')", label, skipped, v->n_merges, model);
    return st;
}

kvq_status kvq_tokenizer_new(kvq_tokenizer_kind kind, const kvq_vocab *v, const char *label,
                             const kvq_callbacks *cb, kvq_tokenizer **out, kvq_err *err)
{
    const char *model = v && v->model ? v->model : (kind == KVQ_TOKENIZER_SPM ? "spm" : "bpe");
    if (!label)
        label = "tokenizer";
    *out = NULL;
    kvq_status st = check_vocab(kind, v, label, model, err);
    if (st)
        return st;

    kvq_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
    t->kind = kind;
    snprintf(t->model, sizeof t->model, "%s", model);
    t->n = v->n_tokens;
    t->bos = v->bos;
    t->eos = v->eos;
    t->unk = v->unk;
    t->add_bos = v->add_bos != 0;
    t->add_eos = v->add_eos != 0;
    if (v->approx)
        snprintf(t->approx, sizeof t->approx, "%s", v->approx);
    t->add_space_prefix = v->add_space_prefix != 0;
    t->byte_level = kind == KVQ_TOKENIZER_BPE && v->byte_level;
    t->ignore_merges = t->byte_level && v->ignore_merges;
    t->drop_unknown = t->byte_level && v->drop_unknown;
    t->normalizer = t->byte_level ? v->normalizer : KVQ_NORM_NONE;
    t->pretok = t->byte_level ? v->pretok : KVQ_PRETOK_NONE;
    t->max_digits = v->max_digits;
    for (int b = 0; b < 256; b++)
        t->byte_tok[b] = t->byte_sym[b] = -1;

    st = build_strings(t, v, label, model, err);
    if (st == KVQ_OK)
        st = build_types(t, v, label, model, err);
    if (st == KVQ_OK)
        st = build_pieces(t, v, label, err);
    if (st == KVQ_OK)
        st = build_table(t, label, err);
    if (st == KVQ_OK && kind == KVQ_TOKENIZER_BPE && v->n_merges > 0)
        st = build_merges(t, v, label, model, cb, err);
    if (st != KVQ_OK) {
        kvq_tokenizer_free(t);
        return st;
    }
    *out = t;
    return KVQ_OK;
}

kvq_status kvq_tokenizer_new_ids(uint32_t n_vocab, int32_t bos, int32_t eos,
                                 kvq_tokenizer **out, kvq_err *err)
{
    *out = NULL;
    if (n_vocab == 0 || n_vocab > KVQ_TOKENIZER_MAX_VOCAB)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "pre-tokenized: vocabulary size %u out of "
                           "range [1, %u]", n_vocab, KVQ_TOKENIZER_MAX_VOCAB);
    if (bos < -1 || bos >= (int64_t)n_vocab || eos < -1 || eos >= (int64_t)n_vocab)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "pre-tokenized: BOS %d / EOS %d outside "
                           "the vocabulary of %u", bos, eos, n_vocab);
    kvq_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return kvq_err_set(err, KVQ_E_NOMEM, "pre-tokenized: out of memory");
    t->kind = KVQ_TOKENIZER_IDS;
    snprintf(t->model, sizeof t->model, "ids");
    t->n = n_vocab;
    t->bos = bos;
    t->eos = eos;
    t->unk = -1;
    t->add_bos = bos >= 0;
    for (int b = 0; b < 256; b++)
        t->byte_tok[b] = t->byte_sym[b] = -1;
    *out = t;
    return KVQ_OK;
}

/* ==========================================================================
 * queries
 * ========================================================================== */

kvq_tokenizer_kind kvq_tokenizer_kind_of(const kvq_tokenizer *t) { return t->kind; }
const char *kvq_tokenizer_model(const kvq_tokenizer *t) { return t->model; }
uint32_t kvq_tokenizer_n_vocab(const kvq_tokenizer *t) { return t->n; }
int32_t kvq_tokenizer_bos(const kvq_tokenizer *t) { return t->bos; }
int32_t kvq_tokenizer_eos(const kvq_tokenizer *t) { return t->eos; }
int32_t kvq_tokenizer_unk(const kvq_tokenizer *t) { return t->unk; }
int kvq_tokenizer_add_bos(const kvq_tokenizer *t) { return t->add_bos; }
int kvq_tokenizer_add_eos(const kvq_tokenizer *t) { return t->add_eos; }
kvq_normalizer kvq_tokenizer_normalizer(const kvq_tokenizer *t) { return t->normalizer; }
int kvq_tokenizer_drops_unknown(const kvq_tokenizer *t) { return t->drop_unknown; }
const char *kvq_tokenizer_approx(const kvq_tokenizer *t) { return t->approx[0] ? t->approx : NULL; }

kvq_pretok kvq_tokenizer_pretok(const kvq_tokenizer *t, uint32_t *max_digits)
{
    if (max_digits)
        *max_digits = t->max_digits;
    return t->pretok;
}

static int has_vocab(const kvq_tokenizer *t, int32_t id)
{
    return t->kind != KVQ_TOKENIZER_IDS && id >= 0 && (uint32_t)id < t->n;
}

const char *kvq_tokenizer_token_str(const kvq_tokenizer *t, int32_t id, size_t *len)
{
    if (!has_vocab(t, id))
        return NULL;
    if (len)
        *len = t->str_len[id];
    return tok_str(t, id);
}

kvq_token_type kvq_tokenizer_token_type(const kvq_tokenizer *t, int32_t id)
{
    if (id < 0 || (uint32_t)id >= t->n)
        return (kvq_token_type)0;
    return t->types ? (kvq_token_type)t->types[id] : KVQ_TOKEN_NORMAL;
}

float kvq_tokenizer_score(const kvq_tokenizer *t, int32_t id)
{
    return has_vocab(t, id) && t->scores ? t->scores[id] : 0.0f;
}

int32_t kvq_tokenizer_find(const kvq_tokenizer *t, const char *s, size_t len)
{
    return t->kind == KVQ_TOKENIZER_IDS ? -1 : tok_lookup(t, s, len);
}

const char *kvq_tokenizer_piece(const kvq_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || (uint32_t)id >= t->n)
        return NULL;
    if (t->kind == KVQ_TOKENIZER_IDS) {
        if (len)
            *len = 0;
        return "";
    }
    if (len)
        *len = t->piece_len[id];
    return t->piece + t->piece_off[id];
}

/* ==========================================================================
 * encode / decode
 * ========================================================================== */

int kvq_tokenizer_adds_prefix(const kvq_tokenizer *t, const char *text, size_t len,
                              unsigned flags)
{
    if (t->kind == KVQ_TOKENIZER_IDS || !t->add_space_prefix || len == 0 ||
        (flags & KVQ_ENCODE_NO_PREFIX))
        return 0;
    /* HF's ByteLevel add_prefix_space leaves text that starts with a space alone;
     * SentencePiece's dummy prefix (SPM, metaspace) is always added. */
    return !(t->byte_level && text[0] == ' ');
}

kvq_status kvq_tokenizer_encode(const kvq_tokenizer *t, const char *text, size_t len,
                                unsigned flags, int32_t **ids, size_t *n, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    tok_ids out = {0};
    *ids = NULL;
    *n = 0;
    if (t->kind == KVQ_TOKENIZER_IDS)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "pre-tokenized input has no vocabulary: "
                           "cannot encode text (tokenizer model 'ids')");
    if (len >= (1u << 31))
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "tokenizer '%s': %zu bytes of text in one "
                           "call (limit 2^31)", t->model, len);
    if ((flags & KVQ_ENCODE_MODEL_BOS) && t->add_bos && t->bos >= 0)
        flags |= KVQ_ENCODE_BOS;
    if (((flags & KVQ_ENCODE_BOS) && t->bos < 0) || ((flags & KVQ_ENCODE_EOS) && t->eos < 0))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "tokenizer '%s' has no %s token", t->model,
                           (flags & KVQ_ENCODE_BOS) && t->bos < 0 ? "BOS" : "EOS");
    if ((flags & KVQ_ENCODE_BOS) && tok_ids_push(&out, t->bos)) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    if (len > 0) {
        const int prefix = kvq_tokenizer_adds_prefix(t, text, len, flags);
        st = t->kind == KVQ_TOKENIZER_SPM ? tok_spm_encode(t, text, len, prefix, &out, err)
                                          : tok_bpe_encode(t, text, len, prefix, &out, err);
        if (st)
            goto done;
    }
    if ((flags & KVQ_ENCODE_EOS) && tok_ids_push(&out, t->eos)) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "tokenizer: out of memory");
        goto done;
    }
done:
    if (st) {
        free(out.v);
        return st;
    }
    *ids = out.v;
    *n = out.n;
    return KVQ_OK;
}

kvq_status kvq_tokenizer_decode(const kvq_tokenizer *t, const int32_t *ids, size_t n,
                                unsigned flags, char **text, size_t *len, kvq_err *err)
{
    *text = NULL;
    if (len)
        *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->n)
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "decode: id %d at index %zu is outside "
                               "the vocabulary of %u", ids[i], i, t->n);
        total += t->kind == KVQ_TOKENIZER_IDS ? 16 : t->str_len[ids[i]] + 1;
    }
    char *out = malloc(total + 1);
    if (!out)
        return kvq_err_set(err, KVQ_E_NOMEM, "decode: out of memory");
    const int strip = t->add_space_prefix && !(flags & KVQ_DECODE_KEEP_PREFIX);
    int at_start = 1;
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (t->kind == KVQ_TOKENIZER_IDS) {
            w += (size_t)snprintf(out + w, 16, "<%d>", id);
            continue;
        }
        int special = t->types[id] == KVQ_TOKEN_CONTROL || t->types[id] == KVQ_TOKEN_UNKNOWN;
        if (special) {
            if (flags & KVQ_DECODE_SPECIAL) {
                memcpy(out + w, tok_str(t, id), t->str_len[id]);
                w += t->str_len[id];
            }
            continue;
        }
        const char *p = t->piece + t->piece_off[id];
        size_t pn = t->piece_len[id];
        if (at_start && strip && pn > 0 && p[0] == ' ') {
            p++;
            pn--;
        }
        if (t->piece_len[id] > 0)
            at_start = 0;
        memcpy(out + w, p, pn);
        w += pn;
    }
    out[w] = '\0';
    *text = out;
    if (len)
        *len = w;
    return KVQ_OK;
}

/* ==========================================================================
 * pre-tokenized files
 * ========================================================================== */

kvq_status kvq_ids_read(const char *path, uint32_t n_vocab, int32_t **ids, size_t *n,
                        kvq_err *err)
{
    *ids = NULL;
    *n = 0;
    kvq_map m;
    kvq_status st = kvq_map_file(path, &m, err);
    if (st)
        return st;
    if (m.size % 4 != 0) {
        st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: %zu bytes is not a whole number of int32 "
                         "token ids", path, m.size);
        goto done;
    }
    size_t count = m.size / 4;
    int32_t *v = malloc(count ? count * sizeof *v : 1);
    if (!v) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (size_t i = 0; i < count; i++) {
        const uint8_t *p = m.data + 4 * i;
        int32_t id = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                               (uint32_t)p[3] << 24);
        if (id < 0) {
            free(v);
            st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: token id %d at index %zu is negative",
                             path, id, i);
            goto done;
        }
        if (n_vocab > 0 && (uint32_t)id >= n_vocab) {
            free(v);
            st = kvq_err_set(err, KVQ_E_MISMATCH, "%s: token id %d at index %zu is outside "
                             "the vocabulary of %u", path, id, i, n_vocab);
            goto done;
        }
        v[i] = id;
    }
    *ids = v;
    *n = count;
done:
    kvq_unmap(&m);
    return st;
}

/* ==========================================================================
 * auto-detection
 * ========================================================================== */

kvq_tokenizer_params kvq_tokenizer_params_default(void)
{
    kvq_tokenizer_params p;
    memset(&p, 0, sizeof p);
    return p;
}

kvq_status kvq_tokenizer_load(const char *path, const kvq_callbacks *cb, kvq_tokenizer **out,
                              kvq_err *err)
{
    kvq_tokenizer_params p = kvq_tokenizer_params_default();
    if (cb)
        p.cb = *cb;
    return kvq_tokenizer_load_p(path, &p, out, err);
}

kvq_status kvq_tokenizer_load_p(const char *path, const kvq_tokenizer_params *prm,
                                kvq_tokenizer **out, kvq_err *err)
{
    struct stat sb;
    *out = NULL;
    if (stat(path, &sb) != 0)
        return kvq_err_set(err, KVQ_E_NOT_FOUND, "%s: no such file or directory", path);
    if (S_ISDIR(sb.st_mode)) {
        size_t n = strlen(path);
        char *p = malloc(n + sizeof "/tokenizer.json");
        if (!p)
            return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
        memcpy(p, path, n);
        memcpy(p + n, "/tokenizer.json", sizeof "/tokenizer.json");
        kvq_status st = kvq_tokenizer_from_hf_json_p(p, prm, out, err);
        free(p);
        return st;
    }
    size_t n = strlen(path);
    if (n >= 5 && strcmp(path + n - 5, ".json") == 0)
        return kvq_tokenizer_from_hf_json_p(path, prm, out, err);
    kvq_map m;
    kvq_status st = kvq_map_file(path, &m, err);
    if (st)
        return st;
    int is_gguf = m.size >= 4 && memcmp(m.data, "GGUF", 4) == 0;
    if (!is_gguf) {
        st = kvq_tokenizer_from_llama2c_memory(m.data, m.size, path, out, err);
        kvq_unmap(&m);
        return st;
    }
    kvq_gguf *g = NULL;
    st = kvq_gguf_open_memory(m.data, m.size, path, &g, err);
    if (st == KVQ_OK)
        st = kvq_tokenizer_from_gguf_p(g, path, prm, out, err);
    if (g)
        kvq_gguf_close(g);
    kvq_unmap(&m);
    return st;
}
