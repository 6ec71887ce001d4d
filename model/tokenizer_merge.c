/*
 * tokenizer_merge.c — the merge engine shared by the SPM (tokenizer_sp.c) and BPE
 * (tokenizer_bpe.c) encoders: a priority queue of adjacent symbol pairs (see
 * tokenizer_internal.h), and the emission of the merged symbols' ids with byte fallback.
 */
#include "model/tokenizer_internal.h"

#include <stdlib.h>

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
        } else if (t->drop_unknown) {
            continue; /* llama.cpp / HF: a symbol that is no token gives nothing */
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
