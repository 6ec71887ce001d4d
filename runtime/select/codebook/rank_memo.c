/*
 * rank_memo.c — the rerank's top k (rerank.c) for kvq_retrieval_probe's steps of one
 * (row, head). The rerank keeps the k best of its candidates by exact score, and a
 * candidate's score is a function of its row alone (the group's gathered far logits,
 * rt_logit_memo.lgb), the same for every setting. So every visible row is ranked once
 * per (row, head) by (score key descending, row ascending), and each setting's top k is
 * the k candidates of least rank: the set kvq_rk_topk selects (its keys above the k-th
 * largest, then ties by index; the candidates are in ascending rows, so index order is
 * row order), found with a bitmap of the candidates' ranks instead of a radix select
 * per setting (tests/test_rank_memo.c).
 */
#include <stdlib.h>
#include <string.h>

#include "kvq/util.h"
#include "runtime/kernels/kernels.h"
#include "runtime/select/mass.h"

struct rt_rank_memo {
    int64_t n, cap;
    int32_t *rank;   /* [cap] row j's place in the order */
    float *sc;       /* [cap] scores */
    uint64_t *v;     /* [2 cap] */
    int32_t *a;      /* [cap] */
    uint64_t *bits;  /* [cap / 64 + 1] */
};

void kvq_rt_score_order(const float *scores, int64_t n, uint64_t *v, int32_t *a)
{
    if (n <= 0)
        return;
    /* each inverted key with its index in the low half (the passes move both, no
     * lookup); the four digits' counts in one pass (they do not depend on the order) */
    int64_t cnt[4][257] = {{0}};
    uint64_t *in = v, *out = v + n;
    for (int64_t j = 0; j < n; j++) {
        const uint32_t u = ~kvq_rk_key(scores[j]);
        in[j] = (uint64_t)u << 32 | (uint64_t)j;
        cnt[0][(u & 255u) + 1]++;
        cnt[1][((u >> 8) & 255u) + 1]++;
        cnt[2][((u >> 16) & 255u) + 1]++;
        cnt[3][(u >> 24) + 1]++;
    }
    for (int p = 0; p < 4; p++) {
        const int shift = 32 + 8 * p;
        int64_t *c = cnt[p];
        if (c[((in[0] >> shift) & 255u) + 1] == n)
            continue; /* one digit value: the stable pass would keep the order */
        for (int i = 0; i < 256; i++)
            c[i + 1] += c[i];
        for (int64_t j = 0; j < n; j++)
            out[c[(in[j] >> shift) & 255u]++] = in[j];
        uint64_t *t = in;
        in = out;
        out = t;
    }
    for (int64_t i = 0; i < n; i++)
        a[i] = (int32_t)(uint32_t)in[i];
}

rt_rank_memo *kvq_rt_rank_memo_new(void) { return calloc(1, sizeof(rt_rank_memo)); }

void kvq_rt_rank_memo_free(rt_rank_memo *R)
{
    if (!R)
        return;
    free(R->rank);
    free(R->sc);
    free(R->v);
    free(R->a);
    free(R->bits);
    free(R);
}

static int reserve(rt_rank_memo *R, int64_t n)
{
    if (n <= R->cap)
        return 1;
    const size_t c = (size_t)n; /* each array keeps its old block when a later one fails */
    if (kvq_resize((void **)&R->rank, c, sizeof *R->rank) ||
        kvq_resize((void **)&R->sc, c, sizeof *R->sc) ||
        kvq_resize((void **)&R->v, 2 * c, sizeof *R->v) ||
        kvq_resize((void **)&R->a, c, sizeof *R->a) ||
        kvq_resize((void **)&R->bits, c / 64 + 1, sizeof *R->bits))
        return 0;
    R->cap = n;
    return 1;
}

int kvq_rt_rank_memo_build(rt_rank_memo *R, const float *lgb, int64_t nv, int32_t nq, int32_t gs,
                           int max)
{
    R->n = 0;
    if (nv < 1 || !reserve(R, nv))
        return 0;
    /* rerank.c's scores: the summed query's logit (nq > gs), or the heads' logits summed
     * in head order or their maximum */
    float *sc = R->sc;
    memcpy(sc, lgb + (size_t)(nq > gs ? gs : 0) * (size_t)nv, sizeof(float) * (size_t)nv);
    for (int32_t g = 1; nq == gs && g < gs; g++) {
        const float *l = lgb + (size_t)g * (size_t)nv;
        for (int64_t j = 0; j < nv; j++)
            sc[j] = max ? (l[j] > sc[j] ? l[j] : sc[j]) : sc[j] + l[j];
    }
    kvq_rt_score_order(sc, nv, R->v, R->a);
    for (int64_t i = 0; i < nv; i++)
        R->rank[R->a[i]] = (int32_t)i;
    R->n = nv;
    return 1;
}

int64_t kvq_rt_rank_memo_topk(rt_rank_memo *R, int64_t lo, const int32_t *rows, int64_t n,
                              int64_t k, int32_t *sel)
{
    if (k <= 0 || n <= 0)
        return 0;
    if (k >= n) {
        for (int64_t a = 0; a < n; a++)
            sel[a] = (int32_t)a;
        return n;
    }
    const int64_t nw = R->n / 64 + 1;
    uint64_t *bits = R->bits;
    memset(bits, 0, sizeof *bits * (size_t)nw);
    for (int64_t a = 0; a < n; a++) {
        const int32_t q = R->rank[rows[a] - lo];
        bits[q >> 6] |= (uint64_t)1 << (q & 63);
    }
    /* the k-th least rank among the candidates */
    int64_t left = k, T = 0;
    for (int64_t w = 0; w < nw; w++) {
        const int c = __builtin_popcountll(bits[w]);
        if (c >= left) {
            uint64_t u = bits[w];
            for (int64_t i = 1; i < left; i++)
                u &= u - 1;
            T = w * 64 + __builtin_ctzll(u);
            break;
        }
        left -= c;
    }
    int64_t c = 0;
    for (int64_t a = 0; a < n; a++) { /* branch-free: sel[c] with c <= k < n */
        sel[c] = (int32_t)a;
        c += R->rank[rows[a] - lo] <= T;
    }
    return c;
}
