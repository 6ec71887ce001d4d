/*
 * tokenizer.c — vocabulary tables, the merge engine, decode, dispatch, and the GGUF /
 * HF tokenizer.json / llama2.c loaders. Encoding proper lives in tokenizer_sp.c (SPM)
 * and tokenizer_bpe.c (BPE and the pre-tokenizer).
 */
#include "model/tokenizer_internal.h"

#include <cJSON.h>
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

/* "<0xHH>" (upper- or lower-case hex) -> HH, else -1. */
static int parse_byte_token(const char *s, size_t n)
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
 * the merge engine
 * ========================================================================== */

typedef struct heap_ent {
    double prio;
    int32_t l, r;
    uint32_t size; /* l.len + r.len when the entry was made: detects stale entries */
    int32_t id;
} heap_ent;

typedef struct heap {
    heap_ent *v;
    size_t n, cap;
} heap;

/* a comes out before b: higher priority, then the leftmost pair. */
static int heap_before(const heap_ent *a, const heap_ent *b)
{
    return a->prio > b->prio || (a->prio == b->prio && a->l < b->l);
}

static int heap_push(heap *h, heap_ent e)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        heap_ent *v = realloc(h->v, cap * sizeof *v);
        if (!v)
            return -1;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_before(&e, &h->v[p]))
            break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = e;
    return 0;
}

static heap_ent heap_pop(heap *h)
{
    heap_ent top = h->v[0];
    heap_ent last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && heap_before(&h->v[c + 1], &h->v[c]))
            c++;
        if (!heap_before(&h->v[c], &last))
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n > 0)
        h->v[i] = last;
    return top;
}

static int try_pair(heap *h, tok_sym *syms, int32_t l, int32_t r, tok_pair_fn fn,
                    const void *ctx)
{
    if (l < 0 || r < 0)
        return 0;
    heap_ent e;
    if (!fn(ctx, &syms[l], &syms[r], &e.prio, &e.id))
        return 0;
    e.l = l;
    e.r = r;
    e.size = syms[l].len + syms[r].len;
    return heap_push(h, e);
}

int tok_merge(tok_sym *syms, size_t n, tok_pair_fn fn, const void *ctx)
{
    heap h = {0};
    int rc = 0;
    for (size_t i = 0; i + 1 < n && rc == 0; i++)
        rc = try_pair(&h, syms, (int32_t)i, (int32_t)i + 1, fn, ctx);
    while (rc == 0 && h.n > 0) {
        heap_ent e = heap_pop(&h);
        tok_sym *l = &syms[e.l], *r = &syms[e.r];
        if (l->len == 0 || r->len == 0 || l->next != e.r || l->len + r->len != e.size)
            continue; /* stale: one side has changed since the entry was made */
        l->len += r->len;
        l->id = e.id;
        l->next = r->next;
        if (r->next >= 0)
            syms[r->next].prev = e.l;
        r->len = 0;
        rc = try_pair(&h, syms, l->prev, e.l, fn, ctx);
        if (rc == 0)
            rc = try_pair(&h, syms, e.l, l->next, fn, ctx);
    }
    free(h.v);
    return rc;
}

kvq_status tok_emit(const kvq_tokenizer *t, const tok_sym *syms, size_t n, const char *buf,
                    tok_ids *out, kvq_err *err)
{
    if (n == 0)
        return KVQ_OK;
    for (int32_t i = 0; i >= 0; i = syms[i].next) {
        const tok_sym *s = &syms[i];
        if (s->id >= 0) {
            if (tok_ids_push(out, s->id))
                return kvq_err_set(err, KVQ_E_NOMEM, "tokenizer: out of memory");
            continue;
        }
        const unsigned char *b = (const unsigned char *)buf + s->start;
        int all_bytes = 1;
        for (uint32_t k = 0; k < s->len; k++)
            all_bytes &= t->byte_tok[b[k]] >= 0;
        if (all_bytes) {
            for (uint32_t k = 0; k < s->len; k++)
                if (tok_ids_push(out, t->byte_tok[b[k]]))
                    return kvq_err_set(err, KVQ_E_NOMEM, "tokenizer: out of memory");
        } else if (t->unk >= 0) {
            if (tok_ids_push(out, t->unk))
                return kvq_err_set(err, KVQ_E_NOMEM, "tokenizer: out of memory");
        } else {
            return kvq_err_set(err, KVQ_E_INVALID_ARG,
                               "tokenizer '%s': cannot encode byte 0x%02X: no byte token and "
                               "no unknown token", t->model, b[0]);
        }
    }
    return KVQ_OK;
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
        out[0] = (char)parse_byte_token(s, n);
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

kvq_status kvq_tokenizer_new(kvq_tokenizer_kind kind, const kvq_vocab *v, const char *label,
                             const kvq_callbacks *cb, kvq_tokenizer **out, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    kvq_tokenizer *t = NULL;
    const char *model = v && v->model ? v->model : (kind == KVQ_TOKENIZER_SPM ? "spm" : "bpe");
    if (!label)
        label = "tokenizer";
    *out = NULL;
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

    t = calloc(1, sizeof *t);
    if (!t)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
    t->kind = kind;
    snprintf(t->model, sizeof t->model, "%s", model);
    t->n = n;
    t->bos = v->bos;
    t->eos = v->eos;
    t->unk = v->unk;
    t->add_bos = v->add_bos != 0;
    t->add_space_prefix = v->add_space_prefix != 0;
    t->byte_level = kind == KVQ_TOKENIZER_BPE && v->byte_level;
    t->ignore_merges = t->byte_level && v->ignore_merges;
    t->pretok = t->byte_level ? v->pretok : KVQ_PRETOK_NONE;
    t->max_digits = v->max_digits;
    for (int b = 0; b < 256; b++)
        t->byte_tok[b] = t->byte_sym[b] = -1;

    /* ---- strings, types, scores ---- */
    t->str_off = malloc(n * sizeof *t->str_off);
    t->str_len = malloc(n * sizeof *t->str_len);
    t->piece_off = malloc(n * sizeof *t->piece_off);
    t->piece_len = malloc(n * sizeof *t->piece_len);
    t->types = malloc(n);
    if (!t->str_off || !t->str_len || !t->piece_off || !t->piece_len || !t->types) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!v->tokens[i]) {
            st = kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: token %u is NULL (tokenizer model "
                             "'%s')", label, i, model);
            goto done;
        }
        size_t len = v->token_lens ? v->token_lens[i] : strlen(v->tokens[i]);
        if (len > UINT32_MAX / 2 || !kvq_size_add(total, len + 1, &total)) {
            st = kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: token %u is too long (tokenizer model "
                             "'%s')", label, i, model);
            goto done;
        }
        t->str_off[i] = total - len - 1;
        t->str_len[i] = (uint32_t)len;
    }
    t->str = malloc(total ? total : 1);
    t->piece = malloc(total ? total : 1);
    if (!t->str || !t->piece) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    for (uint32_t i = 0; i < n; i++) {
        memcpy(t->str + t->str_off[i], v->tokens[i], t->str_len[i]);
        t->str[t->str_off[i] + t->str_len[i]] = '\0';
    }
    const int bytes_possible = !t->byte_level; /* <0xHH> tokens exist in SPM/metaspace */
    for (uint32_t i = 0; i < n; i++) {
        const char *s = tok_str(t, (int32_t)i);
        int type;
        if (v->types) {
            type = v->types[i] == 0 ? KVQ_TOKEN_NORMAL : v->types[i];
            if (type < KVQ_TOKEN_NORMAL || type > KVQ_TOKEN_BYTE) {
                st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: token %u has type %d (tokenizer "
                                 "model '%s')", label, i, v->types[i], model);
                goto done;
            }
        } else if ((int32_t)i == v->unk) {
            type = KVQ_TOKEN_UNKNOWN;
        } else if ((int32_t)i == v->bos || (int32_t)i == v->eos) {
            type = KVQ_TOKEN_CONTROL;
        } else if (bytes_possible && parse_byte_token(s, t->str_len[i]) >= 0) {
            type = KVQ_TOKEN_BYTE;
        } else {
            type = KVQ_TOKEN_NORMAL;
        }
        if (type == KVQ_TOKEN_BYTE) {
            int b = parse_byte_token(s, t->str_len[i]);
            if (b < 0) {
                st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: byte token %u is '%.32s', not <0xHH> "
                                 "(tokenizer model '%s')", label, i, s, model);
                goto done;
            }
            if (t->byte_tok[b] < 0)
                t->byte_tok[b] = (int32_t)i;
        }
        t->types[i] = (uint8_t)type;
    }
    if (v->scores) {
        t->scores = malloc(n * sizeof *t->scores);
        if (!t->scores) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
            goto done;
        }
        memcpy(t->scores, v->scores, n * sizeof *t->scores);
    }
    for (uint32_t i = 0; i < n; i++) {
        t->piece_off[i] = t->str_off[i];
        size_t w = decode_piece(t, (int32_t)i, t->piece + t->piece_off[i]);
        t->piece_len[i] = (uint32_t)w;
        t->piece[t->piece_off[i] + w] = '\0';
    }

    /* ---- string -> id table (first id wins) ---- */
    t->table_mask = pow2_at_least((size_t)n * 2) - 1;
    t->table = malloc((t->table_mask + 1) * sizeof *t->table);
    if (!t->table) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
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

    /* ---- merges ---- */
    if (kind == KVQ_TOKENIZER_BPE && v->n_merges > 0) {
        if (!v->merges && !v->merge_pairs) {
            st = kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: merge count without merges "
                             "(tokenizer model '%s')", label, model);
            goto done;
        }
        if (v->n_merges > INT32_MAX / 4) {
            st = kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: %u merges (tokenizer model '%s')",
                             label, v->n_merges, model);
            goto done;
        }
        t->pair_mask = pow2_at_least((size_t)v->n_merges * 2) - 1;
        t->pairs = malloc((t->pair_mask + 1) * sizeof *t->pairs);
        char *cat = NULL;
        size_t cat_cap = 0;
        if (!t->pairs) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
            goto done;
        }
        for (size_t i = 0; i <= t->pair_mask; i++)
            t->pairs[i].key = UINT64_MAX;
        uint32_t skipped = 0;
        for (uint32_t m = 0; m < v->n_merges; m++) {
            const char *a, *b;
            size_t an, bn;
            if (v->merges) {
                const char *s = v->merges[m];
                const char *sp = s ? strchr(s, ' ') : NULL;
                if (!sp) {
                    free(cat);
                    st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: merge %u is not \"left right\" "
                                     "(tokenizer model '%s')", label, m, model);
                    goto done;
                }
                a = s;
                an = (size_t)(sp - s);
                b = sp + 1;
                bn = strlen(b);
            } else {
                a = v->merge_pairs[2 * (size_t)m];
                b = v->merge_pairs[2 * (size_t)m + 1];
                if (!a || !b) {
                    free(cat);
                    st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: merge %u is incomplete "
                                     "(tokenizer model '%s')", label, m, model);
                    goto done;
                }
                an = strlen(a);
                bn = strlen(b);
            }
            if (an + bn > cat_cap) {
                char *c2 = realloc(cat, an + bn);
                if (!c2) {
                    free(cat);
                    st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
                    goto done;
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
        if (skipped)
            kvq_log(cb, KVQ_LOG_WARN, "%s: %u of %u merges name strings that are not tokens; "
                    "skipped (tokenizer model '%s')", label, skipped, v->n_merges, model);
    }
done:
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
 * GGUF
 * ========================================================================== */

/* An array of `type` items with n entries, or NULL. */
static const kvq_gguf_value *gguf_array(const kvq_gguf *g, const char *key, kvq_gguf_type type)
{
    const kvq_gguf_value *v = kvq_gguf_get(g, key);
    if (!v || v->type != KVQ_GGUF_ARRAY || v->v.arr.type != type)
        return NULL;
    return v;
}

/* Reads an optional token id key: *id stays as given when absent; UINT32_MAX and
 * larger mean "none". 0 ok, -1 out of range, -2 wrong type. */
static int gguf_token_id(const kvq_gguf *g, const char *key, uint32_t n, int32_t *id)
{
    const kvq_gguf_value *v = kvq_gguf_get(g, key);
    if (!v)
        return 0;
    uint64_t u;
    if (kvq_gguf_get_u64(g, key, &u) != 0)
        return -2;
    if (u >= UINT32_MAX) {
        *id = -1;
        return 0;
    }
    if (u >= n)
        return -1;
    *id = (int32_t)u;
    return 0;
}

static int gguf_bool(const kvq_gguf *g, const char *key, int dflt)
{
    const kvq_gguf_value *v = kvq_gguf_get(g, key);
    if (!v)
        return dflt;
    if (v->type == KVQ_GGUF_BOOL)
        return v->v.u != 0;
    uint64_t u;
    return kvq_gguf_get_u64(g, key, &u) == 0 ? u != 0 : dflt;
}

kvq_status kvq_tokenizer_from_gguf(const kvq_gguf *g, const char *label,
                                   const kvq_callbacks *cb, kvq_tokenizer **out, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    const char **tokens = NULL, **merges = NULL;
    uint32_t *lens = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    *out = NULL;
    if (!label)
        label = "gguf";

    const char *model = kvq_gguf_get_str(g, "tokenizer.ggml.model");
    if (!model)
        return kvq_err_set(err, KVQ_E_NOT_FOUND, "%s: no tokenizer (tokenizer.ggml.model is "
                           "missing)", label);
    kvq_tokenizer_kind kind;
    if (strcmp(model, "llama") == 0)
        kind = KVQ_TOKENIZER_SPM;
    else if (strcmp(model, "gpt2") == 0)
        kind = KVQ_TOKENIZER_BPE;
    else
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: tokenizer model '%s' is not supported "
                           "(supported: llama, gpt2)", label, model);

    const kvq_gguf_value *tv = gguf_array(g, "tokenizer.ggml.tokens", KVQ_GGUF_STRING);
    if (!tv || tv->v.arr.n == 0)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: tokenizer.ggml.tokens is missing or not a "
                           "non-empty array of strings (tokenizer model '%s')", label, model);
    if (tv->v.arr.n > KVQ_TOKENIZER_MAX_VOCAB)
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: %llu tokens (tokenizer model '%s')",
                           label, (unsigned long long)tv->v.arr.n, model);
    const uint32_t n = (uint32_t)tv->v.arr.n;

    kvq_vocab v;
    kvq_vocab_default(&v);
    v.model = model;
    v.n_tokens = n;
    tokens = malloc(n * sizeof *tokens);
    lens = malloc(n * sizeof *lens);
    if (!tokens || !lens) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    for (uint32_t i = 0; i < n; i++) {
        const kvq_gguf_value *it = &tv->v.arr.items[i];
        if (it->v.str.len > UINT32_MAX / 2) {
            st = kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: token %u is too long (tokenizer model "
                             "'%s')", label, i, model);
            goto done;
        }
        tokens[i] = it->v.str.s;
        lens[i] = (uint32_t)it->v.str.len;
    }
    v.tokens = tokens;
    v.token_lens = lens;

    const kvq_gguf_value *sv = kvq_gguf_get(g, "tokenizer.ggml.scores");
    if (sv) {
        if (sv->type != KVQ_GGUF_ARRAY || sv->v.arr.type != KVQ_GGUF_FLOAT32 ||
            sv->v.arr.n != n) {
            st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: tokenizer.ggml.scores is not %u f32 values "
                             "(tokenizer model '%s')", label, n, model);
            goto done;
        }
        scores = malloc(n * sizeof *scores);
        if (!scores) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
            goto done;
        }
        for (uint32_t i = 0; i < n; i++)
            scores[i] = (float)sv->v.arr.items[i].v.f;
        v.scores = scores;
    } else if (kind == KVQ_TOKENIZER_SPM) {
        st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: tokenizer.ggml.scores is missing (tokenizer "
                         "model '%s')", label, model);
        goto done;
    }

    const kvq_gguf_value *yv = kvq_gguf_get(g, "tokenizer.ggml.token_type");
    if (yv) {
        if (yv->type != KVQ_GGUF_ARRAY || yv->v.arr.n != n ||
            (yv->v.arr.type != KVQ_GGUF_INT32 && yv->v.arr.type != KVQ_GGUF_UINT32)) {
            st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: tokenizer.ggml.token_type is not %u int32 "
                             "values (tokenizer model '%s')", label, n, model);
            goto done;
        }
        types = malloc(n * sizeof *types);
        if (!types) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
            goto done;
        }
        for (uint32_t i = 0; i < n; i++) {
            const kvq_gguf_value *it = &yv->v.arr.items[i];
            int64_t x = it->type == KVQ_GGUF_INT32 ? it->v.i : (int64_t)it->v.u;
            types[i] = (x < INT32_MIN || x > INT32_MAX) ? INT32_MAX : (int32_t)x; /* _new checks */
        }
        v.types = types;
    }

    static const char *const id_keys[3] = {"tokenizer.ggml.bos_token_id",
                                           "tokenizer.ggml.eos_token_id",
                                           "tokenizer.ggml.unknown_token_id"};
    int32_t ids[3] = {-1, -1, -1};
    if (kind == KVQ_TOKENIZER_SPM) { /* llama.cpp's defaults for SentencePiece vocabularies */
        ids[0] = n > 1 ? 1 : -1;
        ids[1] = n > 2 ? 2 : -1;
        ids[2] = 0;
    }
    for (int k = 0; k < 3; k++) {
        int rc = gguf_token_id(g, id_keys[k], n, &ids[k]);
        if (rc) {
            st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: %s is %s (tokenizer model '%s')", label,
                             id_keys[k], rc == -1 ? "outside the vocabulary" : "not an integer",
                             model);
            goto done;
        }
    }
    v.bos = ids[0];
    v.eos = ids[1];
    v.unk = ids[2];

    if (kind == KVQ_TOKENIZER_SPM) {
        v.add_space_prefix = gguf_bool(g, "tokenizer.ggml.add_space_prefix", 1);
        v.add_bos = gguf_bool(g, "tokenizer.ggml.add_bos_token", 1);
    } else {
        const kvq_gguf_value *mv = gguf_array(g, "tokenizer.ggml.merges", KVQ_GGUF_STRING);
        if (!mv) {
            st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: tokenizer.ggml.merges is missing or not "
                             "an array of strings (tokenizer model '%s')", label, model);
            goto done;
        }
        if (mv->v.arr.n > INT32_MAX / 4) {
            st = kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: %llu merges (tokenizer model '%s')",
                             label, (unsigned long long)mv->v.arr.n, model);
            goto done;
        }
        v.n_merges = (uint32_t)mv->v.arr.n;
        merges = malloc((v.n_merges ? v.n_merges : 1) * sizeof *merges);
        if (!merges) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
            goto done;
        }
        for (uint32_t i = 0; i < v.n_merges; i++)
            merges[i] = mv->v.arr.items[i].v.str.s;
        v.merges = merges;
        v.byte_level = 1;
        v.add_space_prefix = gguf_bool(g, "tokenizer.ggml.add_space_prefix", 0);
        const char *pre = kvq_gguf_get_str(g, "tokenizer.ggml.pre");
        v.pretok = KVQ_PRETOK_GPT2;
        if (pre && (!strcmp(pre, "llama3") || !strcmp(pre, "llama-bpe") ||
                    !strcmp(pre, "llama-v3"))) {
            v.pretok = KVQ_PRETOK_LLAMA3;
            v.max_digits = 3;
            v.ignore_merges = 1;
        } else if (pre && (!strcmp(pre, "qwen2") || !strcmp(pre, "deepseek-r1-qwen"))) {
            v.pretok = KVQ_PRETOK_LLAMA3;
            v.max_digits = 1;
        } else if (pre && strcmp(pre, "gpt-2") && strcmp(pre, "gpt2") &&
                   strcmp(pre, "default")) {
            kvq_log(cb, KVQ_LOG_WARN, "%s: pre-tokenizer '%s' is approximated by the GPT-2 split",
                    label, pre);
        }
        v.add_bos = gguf_bool(g, "tokenizer.ggml.add_bos_token",
                              v.pretok == KVQ_PRETOK_LLAMA3 && v.max_digits == 3);
    }
    st = kvq_tokenizer_new(kind, &v, label, cb, out, err);
done:
    free(tokens);
    free(lens);
    free(scores);
    free(types);
    free(merges);
    return st;
}

/* ==========================================================================
 * llama2.c tokenizer.bin
 * ========================================================================== */

static uint32_t rd_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

kvq_status kvq_tokenizer_from_llama2c_memory(const void *data, size_t size, const char *label,
                                             kvq_tokenizer **out, kvq_err *err)
{
    const uint8_t *p = data;
    kvq_status st = KVQ_OK;
    char **tokens = NULL;
    uint32_t *lens = NULL;
    float *scores = NULL;
    uint32_t n = 0;
    *out = NULL;
    if (!label)
        label = "tokenizer.bin";
    if (size < 4)
        return kvq_err_set(err, KVQ_E_TRUNCATED_HEADER, "%s: %zu bytes, too short for a "
                           "llama2.c tokenizer (tokenizer model 'llama2c')", label, size);
    int32_t max_len = (int32_t)rd_u32(p);
    if (max_len < 1)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: max_token_length %d (tokenizer model "
                           "'llama2c')", label, max_len);
    /* pass 1: count and check every record against the bytes remaining */
    size_t off = 4;
    while (off < size) {
        if (size - off < 8) {
            return kvq_err_set(err, KVQ_E_TRUNCATED_DATA, "%s: token %u is cut short at byte "
                               "%zu (tokenizer model 'llama2c')", label, n, off);
        }
        int32_t len = (int32_t)rd_u32(p + off + 4);
        if (len < 0)
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: token %u has length %d (tokenizer "
                               "model 'llama2c')", label, n, len);
        if ((size_t)len > size - off - 8)
            return kvq_err_set(err, KVQ_E_TRUNCATED_DATA, "%s: token %u (%d bytes) runs past "
                               "the end of the file (tokenizer model 'llama2c')", label, n, len);
        off += 8 + (size_t)len;
        if (++n > KVQ_TOKENIZER_MAX_VOCAB)
            return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: more than %u tokens (tokenizer model "
                               "'llama2c')", label, KVQ_TOKENIZER_MAX_VOCAB);
    }
    if (n == 0)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: no tokens (tokenizer model 'llama2c')",
                           label);
    tokens = calloc(n, sizeof *tokens);
    lens = malloc(n * sizeof *lens);
    scores = malloc(n * sizeof *scores);
    if (!tokens || !lens || !scores) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    /* pass 2: copy, turning ' ' back into '▁' and "\n<s>\n" into "<s>" */
    off = 4;
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
        if (!d) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
            goto done;
        }
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

/* ==========================================================================
 * HF tokenizer.json
 * ========================================================================== */

static const char *json_str(const cJSON *obj, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

/* A special-token entry of tokenizer_config.json: "text" or {"content": "text"}. */
static const char *json_token_text(const cJSON *obj, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (cJSON_IsString(it))
        return it->valuestring;
    if (cJSON_IsObject(it))
        return json_str(it, "content");
    return NULL;
}

/* Does the JSON tree of a normalizer/pre-tokenizer/decoder mention a component of
 * type `type`? Looks through "Sequence" lists (any nesting). */
static const cJSON *json_find_type(const cJSON *node, const char *type)
{
    if (!node || cJSON_IsNull(node))
        return NULL;
    if (cJSON_IsObject(node)) {
        const char *t = json_str(node, "type");
        if (t && strcmp(t, type) == 0)
            return node;
        static const char *const lists[] = {"pretokenizers", "normalizers", "decoders",
                                            "processors"};
        for (size_t k = 0; k < sizeof lists / sizeof *lists; k++) {
            const cJSON *l = cJSON_GetObjectItemCaseSensitive(node, lists[k]);
            const cJSON *e;
            cJSON_ArrayForEach(e, l) {
                const cJSON *f = json_find_type(e, type);
                if (f)
                    return f;
            }
        }
    }
    return NULL;
}

/* tokenizer.json ids must stay below 2 x (vocab + added_tokens entries) + this. */
#define HF_SPARSE_SLACK 1024

static int is_int_id(const cJSON *it, uint32_t limit)
{
    if (!cJSON_IsNumber(it))
        return 0;
    double d = it->valuedouble;
    return d >= 0 && d < (double)limit && d == (double)(int64_t)d;
}

/* Chooses the pre-token split from a Split pre-tokenizer's regex (or GPT-2 when the
 * ByteLevel pre-tokenizer does the splitting itself). */
static void hf_pretok(const cJSON *pre, kvq_vocab *v, const char *label,
                      const kvq_callbacks *cb)
{
    v->pretok = KVQ_PRETOK_GPT2;
    v->max_digits = 0;
    const cJSON *split = json_find_type(pre, "Split");
    const char *re = NULL;
    if (split) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(split, "pattern");
        re = json_str(pat, "Regex");
    }
    if (!re)
        return;
    if (strstr(re, "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+")) {
        v->pretok = KVQ_PRETOK_LLAMA3;
        v->max_digits = strstr(re, "\\p{N}{1,3}") ? 3 : strstr(re, "\\p{N}+") ? 0 : 1;
        return;
    }
    if (!strstr(re, " ?\\p{L}+| ?\\p{N}+"))
        kvq_log(cb, KVQ_LOG_WARN, "%s: pre-tokenizer regex '%.80s' is approximated by the "
                "GPT-2 split", label, re);
}

kvq_status kvq_tokenizer_from_hf_json_memory(const char *json, size_t len, const char *config,
                                             const char *label, const kvq_callbacks *cb,
                                             kvq_tokenizer **out, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    cJSON *root = NULL, *cfg = NULL;
    const char **tokens = NULL, **merges = NULL;
    int32_t *types = NULL;
    *out = NULL;
    if (!label)
        label = "tokenizer.json";

    root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        st = kvq_err_set(err, KVQ_E_BAD_JSON, "%s: not a JSON object", label);
        goto done;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) {
        st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: no \"model\" object", label);
        goto done;
    }
    const char *mtype = json_str(model, "type");
    if (mtype && strcmp(mtype, "BPE") != 0) {
        st = kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: tokenizer model type '%s' is not "
                         "supported (supported: BPE)", label, mtype);
        goto done;
    }
    const char *cwp = json_str(model, "continuing_subword_prefix");
    const char *ews = json_str(model, "end_of_word_suffix");
    if ((cwp && *cwp) || (ews && *ews)) {
        st = kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: BPE with a subword prefix/suffix is not "
                         "supported (tokenizer model 'BPE')", label);
        goto done;
    }
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *mlist = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab) || (mlist && !cJSON_IsArray(mlist)) ||
        (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))) {
        st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: model.vocab must be an object, model.merges "
                         "and added_tokens arrays (tokenizer model 'BPE')", label);
        goto done;
    }
    /* vocabulary size: the largest id + 1 over vocab and added_tokens */
    uint32_t n = 0;
    uint64_t entries = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        entries++;
        if (!is_int_id(e, KVQ_TOKENIZER_MAX_VOCAB)) {
            st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: vocab entry '%.40s' does not have an id in "
                             "[0, %u) (tokenizer model 'BPE')", label, e->string,
                             KVQ_TOKENIZER_MAX_VOCAB);
            goto done;
        }
        if ((uint32_t)e->valuedouble + 1 > n)
            n = (uint32_t)e->valuedouble + 1;
    }
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        entries++;
        if (!cJSON_IsObject(e) || !is_int_id(id, KVQ_TOKENIZER_MAX_VOCAB) ||
            !json_str(e, "content")) {
            st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: an added_tokens entry lacks an id or "
                             "content (tokenizer model 'BPE')", label);
            goto done;
        }
        if ((uint32_t)id->valuedouble + 1 > n)
            n = (uint32_t)id->valuedouble + 1;
    }
    if (n == 0) {
        st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: empty vocabulary (tokenizer model 'BPE')",
                         label);
        goto done;
    }
    /* Ids index dense arrays: a few entries with a huge id would cost memory and time
     * in proportion to the id, not to the file. Real vocabularies have few holes. */
    if ((uint64_t)n - 1 >= 2 * entries + HF_SPARSE_SLACK) {
        st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: sparse vocabulary: largest id %u for %llu "
                         "entries (it must be below 2 x entries + %d; tokenizer model 'BPE')",
                         label, n - 1, (unsigned long long)entries, HF_SPARSE_SLACK);
        goto done;
    }
    tokens = calloc(n, sizeof *tokens);
    types = calloc(n, sizeof *types);
    if (!tokens || !types) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    cJSON_ArrayForEach(e, vocab) {
        uint32_t id = (uint32_t)e->valuedouble;
        if (!tokens[id]) {
            tokens[id] = e->string;
            types[id] = KVQ_TOKEN_NORMAL;
        }
    }
    cJSON_ArrayForEach(e, added) {
        uint32_t id = (uint32_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        tokens[id] = json_str(e, "content");
        types[id] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"))
                        ? KVQ_TOKEN_CONTROL : KVQ_TOKEN_USER_DEFINED;
    }
    for (uint32_t i = 0; i < n; i++)
        if (!tokens[i]) { /* a hole in the id space */
            tokens[i] = "";
            types[i] = KVQ_TOKEN_UNUSED;
        }

    kvq_vocab v;
    kvq_vocab_default(&v);
    v.model = "hf-bpe";
    v.n_tokens = n;
    v.tokens = tokens;
    v.types = types;

    /* merges: "a b" strings or [a, b] pairs */
    uint32_t nm = (uint32_t)cJSON_GetArraySize(mlist);
    if (nm > 0) {
        merges = malloc(2 * (size_t)nm * sizeof *merges);
        if (!merges) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
            goto done;
        }
        uint32_t m = 0;
        int as_strings = -1;
        cJSON_ArrayForEach(e, mlist) {
            if (cJSON_IsString(e) && as_strings != 0) {
                as_strings = 1;
                merges[m] = e->valuestring;
                if (!strchr(e->valuestring, ' ')) {
                    st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: merge %u '%.40s' is not \"left "
                                     "right\" (tokenizer model 'BPE')", label, m, e->valuestring);
                    goto done;
                }
            } else if (cJSON_IsArray(e) && as_strings != 1 && cJSON_GetArraySize(e) == 2 &&
                       cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                       cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
                as_strings = 0;
                merges[2 * (size_t)m] = cJSON_GetArrayItem(e, 0)->valuestring;
                merges[2 * (size_t)m + 1] = cJSON_GetArrayItem(e, 1)->valuestring;
            } else {
                st = kvq_err_set(err, KVQ_E_CORRUPT, "%s: merge %u is neither \"left right\" nor "
                                 "[left, right] (tokenizer model 'BPE')", label, m);
                goto done;
            }
            m++;
        }
        v.n_merges = nm;
        if (as_strings == 1)
            v.merges = merges;
        else
            v.merge_pairs = merges;
    }

    /* flavour: byte-level or metaspace */
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const cJSON *bl = json_find_type(pre, "ByteLevel");
    if (!bl)
        bl = json_find_type(dec, "ByteLevel");
    const cJSON *meta = json_find_type(pre, "Metaspace");
    int metaspace_norm = json_find_type(norm, "Replace") || json_find_type(norm, "Prepend");
    if (bl) {
        v.byte_level = 1;
        const cJSON *aps = cJSON_GetObjectItemCaseSensitive(bl, "add_prefix_space");
        v.add_space_prefix = cJSON_IsTrue(aps) && json_find_type(pre, "ByteLevel") != NULL;
        const cJSON *use_regex = cJSON_GetObjectItemCaseSensitive(bl, "use_regex");
        if (json_find_type(pre, "Split") || !cJSON_IsFalse(use_regex))
            hf_pretok(pre, &v, label, cb);
        else
            v.pretok = KVQ_PRETOK_NONE;
        v.ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    } else if (meta || metaspace_norm) {
        v.byte_level = 0;
        v.add_space_prefix = json_find_type(norm, "Prepend") != NULL;
        if (meta) {
            const char *scheme = json_str(meta, "prepend_scheme");
            const cJSON *aps = cJSON_GetObjectItemCaseSensitive(meta, "add_prefix_space");
            v.add_space_prefix = scheme ? strcmp(scheme, "never") != 0 : !cJSON_IsFalse(aps);
        }
    } else {
        st = kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: BPE without ByteLevel or Metaspace ('▁') "
                         "handling is not supported (tokenizer model 'BPE')", label);
        goto done;
    }
    if (!v.byte_level) /* byte fallback tokens are ordinary vocab entries in tokenizer.json */
        for (uint32_t i = 0; i < n; i++)
            if (types[i] == KVQ_TOKEN_NORMAL && parse_byte_token(tokens[i], strlen(tokens[i])) >= 0)
                types[i] = KVQ_TOKEN_BYTE;
    if (!v.byte_level && json_find_type(norm, "NFC"))
        kvq_log(cb, KVQ_LOG_WARN, "%s: the NFC normalizer is not applied", label);
    if (v.byte_level && (json_find_type(norm, "NFC") || json_find_type(norm, "NFKC")))
        kvq_log(cb, KVQ_LOG_WARN, "%s: the Unicode normalizer is not applied", label);

    /* special tokens */
    const char *unk = json_str(model, "unk_token");
    if (unk) {
        for (uint32_t i = 0; i < n && v.unk < 0; i++)
            if (strcmp(tokens[i], unk) == 0)
                v.unk = (int32_t)i;
    }
    const char *bos = NULL, *eos = NULL;
    int add_bos = -1;
    if (config) {
        cfg = cJSON_Parse(config);
        if (!cJSON_IsObject(cfg)) {
            st = kvq_err_set(err, KVQ_E_BAD_JSON, "%s: tokenizer_config.json is not a JSON "
                             "object", label);
            goto done;
        }
        bos = json_token_text(cfg, "bos_token");
        eos = json_token_text(cfg, "eos_token");
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
        if (cJSON_IsBool(ab))
            add_bos = cJSON_IsTrue(ab);
    }
    if (!bos) { /* the template's first special token */
        const cJSON *tp = json_find_type(cJSON_GetObjectItemCaseSensitive(root, "post_processor"),
                                         "TemplateProcessing");
        const cJSON *single = tp ? cJSON_GetObjectItemCaseSensitive(tp, "single") : NULL;
        const cJSON *first = cJSON_GetArrayItem(single, 0);
        const cJSON *sp = first ? cJSON_GetObjectItemCaseSensitive(first, "SpecialToken") : NULL;
        if (sp) {
            bos = json_str(sp, "id");
            if (bos && add_bos < 0)
                add_bos = 1;
        }
    }
    static const char *const bos_names[] = {"<|begin_of_text|>", "<s>", "<|endoftext|>"};
    static const char *const eos_names[] = {"<|end_of_text|>", "</s>", "<|endoftext|>"};
    for (size_t k = 0; !bos && k < 3; k++)
        for (uint32_t i = 0; i < n && !bos; i++)
            if (strcmp(tokens[i], bos_names[k]) == 0)
                bos = bos_names[k];
    for (size_t k = 0; !eos && k < 3; k++)
        for (uint32_t i = 0; i < n && !eos; i++)
            if (strcmp(tokens[i], eos_names[k]) == 0)
                eos = eos_names[k];
    for (uint32_t i = 0; i < n; i++) {
        if (bos && v.bos < 0 && strcmp(tokens[i], bos) == 0)
            v.bos = (int32_t)i;
        if (eos && v.eos < 0 && strcmp(tokens[i], eos) == 0)
            v.eos = (int32_t)i;
    }
    v.add_bos = add_bos >= 0 ? add_bos : v.bos >= 0 && strcmp(tokens[v.bos], "<|endoftext|>");
    st = kvq_tokenizer_new(KVQ_TOKENIZER_BPE, &v, label, cb, out, err);
done:
    free(tokens);
    free(types);
    free(merges);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    return st;
}

kvq_status kvq_tokenizer_from_hf_json(const char *path, const kvq_callbacks *cb,
                                      kvq_tokenizer **out, kvq_err *err)
{
    uint8_t *json = NULL, *config = NULL;
    size_t n = 0, cn = 0;
    char *cfg_path = NULL;
    *out = NULL;
    kvq_status st = kvq_read_file(path, &json, &n, err);
    if (st)
        return st;
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0;
    cfg_path = malloc(dir + sizeof "tokenizer_config.json");
    if (!cfg_path) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    memcpy(cfg_path, path, dir);
    memcpy(cfg_path + dir, "tokenizer_config.json", sizeof "tokenizer_config.json");
    kvq_err cerr = {0};
    kvq_status cst = kvq_read_file(cfg_path, &config, &cn, &cerr);
    if (cst != KVQ_OK && cst != KVQ_E_NOT_FOUND) {
        st = kvq_err_set(err, cst, "%s", cerr.msg);
        goto done;
    }
    st = kvq_tokenizer_from_hf_json_memory((const char *)json, n, (const char *)config, path, cb,
                                           out, err);
done:
    free(json);
    free(config);
    free(cfg_path);
    return st;
}

/* ==========================================================================
 * auto-detection
 * ========================================================================== */

kvq_status kvq_tokenizer_load(const char *path, const kvq_callbacks *cb, kvq_tokenizer **out,
                              kvq_err *err)
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
        kvq_status st = kvq_tokenizer_from_hf_json(p, cb, out, err);
        free(p);
        return st;
    }
    size_t n = strlen(path);
    if (n >= 5 && strcmp(path + n - 5, ".json") == 0)
        return kvq_tokenizer_from_hf_json(path, cb, out, err);
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
        st = kvq_tokenizer_from_gguf(g, path, cb, out, err);
    if (g)
        kvq_gguf_close(g);
    kvq_unmap(&m);
    return st;
}
