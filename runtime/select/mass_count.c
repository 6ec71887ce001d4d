/*
 * mass.c — the count k* of hcattention's cumulative-mass rule (the mass selector,
 * select.c): the smallest k such that the k largest logits (ties to the lower index, as
 * kvq_rk_topk takes them) hold at least tau of softmax(logits). O(n): a radix search
 * like kvq_rk_topk with each bin weighted by its softmax mass (in double).
 *
 * Written once for two callers: a decode step (kvq_rt_mass_count, one tau), and the
 * steps of kvq_retrieval_probe that measure one (row, head) under several taus: those
 * share the candidates' scores, and so the exponentials, their sum and the first
 * digit's histogram (rt_mass_memo: made by the first such step, read by the others),
 * and only the walk from tau on is run per tau. Either way the same sums in the same
 * order, so the same k* (tests/test_mass.c). The same steps share one order of the
 * candidates by score, from which each budget's top k is a prefix (nested selections).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/common.h"
#include "kvq/util.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/rk.h"
#include "runtime/select/mass.h"

/* A digit's histogram: hw[b] the weights of the keys whose digit is b, summed in index
 * order, hc[b] their count, and a bitmap of the nonempty bins (walked from the top). */
#define HIST_WORDS (KVQ_RK_HIST / 64)
typedef struct digit_hist {
    double hw[KVQ_RK_HIST];
    int64_t hc[KVQ_RK_HIST];
    uint64_t used[HIST_WORDS];
} digit_hist;

static void hist_clear(digit_hist *h)
{
    memset(h->hw, 0, sizeof h->hw);
    memset(h->hc, 0, sizeof h->hc);
    memset(h->used, 0, sizeof h->used);
}

/* Counts keys [m] with weights w [m] into h (clear on entry). */
static void hist_count(digit_hist *h, const uint32_t *keys, const double *w, int64_t m, int pass)
{
    const int shift = kvq_rk_digit_shift(pass);
    const uint32_t mask = kvq_rk_digit_mask(pass);
    for (int64_t i = 0; i < m; i++) {
        const uint32_t b = (keys[i] >> shift) & mask;
        h->hc[b]++;
        h->hw[b] += w[i];
        h->used[b >> 6] |= (uint64_t)1 << (b & 63);
    }
}

/* Back to clear: only the bins it used. */
static void hist_reset(digit_hist *h)
{
    for (int i = 0; i < HIST_WORDS; i++)
        for (uint64_t u = h->used[i]; u; u &= u - 1) {
            const int b = i * 64 + __builtin_ctzll(u);
            h->hw[b] = 0;
            h->hc[b] = 0;
        }
    memset(h->used, 0, sizeof h->used);
}

/* The walk of one digit from the top: the bins above the one that completes `need`
 * taken whole (need and taken updated). Empty bins change nothing (need - 0 = need),
 * so only the nonempty ones are visited; the walk stops at bin 0 as the full one does.
 * Returns the digit. */
static uint32_t hist_walk(const digit_hist *h, double *need, int64_t *taken)
{
    for (int i = HIST_WORDS - 1; i >= 0; i--)
        for (uint64_t u = h->used[i]; u; u &= ~((uint64_t)1 << (63 - __builtin_clzll(u)))) {
            const uint32_t b = (uint32_t)(i * 64 + 63 - __builtin_clzll(u));
            if (b == 0 || h->hw[b] >= *need)
                return b;
            *need -= h->hw[b];
            *taken += h->hc[b];
        }
    return 0;
}

/* The keys of the chosen digit b (with their weights) kept for the next digit: sub, w
 * [m] may be the inputs themselves (in place: out index <= in index). Returns the count. */
static int64_t keep_digit(const uint32_t *keys, const double *e, int64_t m, int pass, uint32_t b,
                          uint32_t *sub, double *w)
{
    const int shift = kvq_rk_digit_shift(pass);
    const uint32_t mask = kvq_rk_digit_mask(pass);
    int64_t mm = 0;
    for (int64_t i = 0; i < m; i++)
        if (((keys[i] >> shift) & mask) == b) {
            w[mm] = e[i];
            sub[mm++] = keys[i];
        }
    return mm;
}

/* The tau-independent part: keys, exponentials (exp(lg - max) in double), their sum in
 * index order, the first digit's histogram (h cleared on entry). */
static void mass_prepare(const float *lg, int64_t n, uint32_t *keys, double *e, double *Z,
                         digit_hist *h)
{
    float mx = lg[0];
    for (int64_t j = 1; j < n; j++)
        mx = lg[j] > mx ? lg[j] : mx;
    double z = 0;
    for (int64_t j = 0; j < n; j++) {
        keys[j] = kvq_rk_key(lg[j]);
        e[j] = exp((double)lg[j] - mx);
        z += e[j];
    }
    *Z = z;
    hist_count(h, keys, e, n, 0);
}

/* k* for tau from the prepared state; sub [n], w [n] scratch (or keys and e themselves,
 * then overwritten), h2 a clear histogram for the later digits, left clear (or h0
 * itself, then cleared after its walk). */
static int64_t mass_finish(const uint32_t *keys, const double *e, int64_t n, double Z,
                           digit_hist *h0, double tau, uint32_t *sub, double *w, digit_hist *h2)
{
    double need = tau * Z; /* mass still to collect below the digits fixed so far */
    int64_t taken = 0;     /* candidates above the digits fixed so far */
    uint32_t b = hist_walk(h0, &need, &taken);
    if (h2 == h0)
        hist_reset(h0);
    int64_t m = keep_digit(keys, e, n, 0, b, sub, w);
    for (int pass = 1; pass < 3; pass++) {
        hist_count(h2, sub, w, m, pass);
        b = hist_walk(h2, &need, &taken);
        hist_reset(h2);
        m = keep_digit(sub, w, m, pass, b, sub, w);
    }
    /* m keys equal the threshold remain, each of weight w[0]: as many as the mass needs */
    if (m == 0)
        return taken > 0 ? taken : 1;
    int64_t ties = need <= 0 ? 1 : (int64_t)ceil(need / w[0]);
    ties = ties < 1 ? 1 : ties > m ? m : ties;
    return taken + ties;
}

int64_t kvq_rt_mass_count(const float *lg, int64_t n, double tau, uint32_t *keys, double *w)
{
    digit_hist h; /* one histogram for the three digits */
    hist_clear(&h);
    double Z;
    /* e in w: the first keep_digit compacts keys and weights in place */
    mass_prepare(lg, n, keys, w, &Z, &h);
    return mass_finish(keys, w, n, Z, &h, tau, keys, w, &h);
}

/* ---- the memo of kvq_retrieval_probe ------------------------------------------------ */

struct rt_mass_memo {
    int valid;      /* scores (and n, cb_bytes) are the current (row, head)'s */
    int prepared;   /* keys, e, Z, h0 too */
    int ordered;    /* order too */
    int64_t n, cap; /* candidates; arrays hold cap */
    float *scores;  /* [cap] the candidates' scores (select.c's, before scaling) */
    double cb_bytes; /* codebook bytes their scoring counted */
    uint32_t *keys, *sub; /* [cap] */
    double *e, *w;        /* [cap] */
    double Z;
    digit_hist h0, h2; /* first digit; the later digits' (kept clear) */
    digit_hist h1;     /* the second digit's of first-digit bin h1_bin (or clear) */
    int64_t h1_bin;    /* -1: none */
    int32_t *order;       /* [cap] candidates by score, descending, ties by index */
    int32_t *rank;        /* [cap] candidate j's place in order */
    int32_t *last;        /* [cap] last[i]: the largest candidate of order[0 .. i] */
    uint64_t *ov;         /* [2 cap] make_order's scratch */
    uint32_t *bk;         /* [cap] keys grouped by first digit, index order in a bin */
    double *be;           /* [cap] their exponentials */
    int64_t boff[KVQ_RK_HIST]; /* where a nonempty bin starts in bk, be */
    int avx512;           /* kvq_rt_rank_select_avx512 */
};

rt_mass_memo *kvq_rt_mass_memo_new(void)
{
    rt_mass_memo *m = calloc(1, sizeof *m); /* calloc: h2 starts clear */
    if (m) {
        m->avx512 = kvq_cpu_has_avx512();
        m->h1_bin = -1;
    }
    return m;
}

void kvq_rt_mass_memo_free(rt_mass_memo *m)
{
    if (!m)
        return;
    free(m->scores);
    free(m->keys);
    free(m->sub);
    free(m->e);
    free(m->w);
    free(m->order);
    free(m->rank);
    free(m->last);
    free(m->bk);
    free(m->be);
    free(m->ov);
    free(m);
}

void kvq_rt_mass_memo_next(rt_mass_memo *m)
{
    if (m)
        m->valid = m->prepared = m->ordered = 0;
}

int kvq_rt_mass_memo_scores(rt_mass_memo *m, int64_t n, float *scores, double *cb_bytes)
{
    if (!m || !m->valid || m->n != n)
        return 0;
    memcpy(scores, m->scores, sizeof *scores * (size_t)n);
    *cb_bytes += m->cb_bytes;
    return 1;
}

/* Grows the memo's arrays to n. 0 when out of memory (the memo then stays unused). */
static int memo_reserve(rt_mass_memo *m, int64_t n)
{
    if (n <= m->cap)
        return 1;
    const size_t c = (size_t)n; /* each array keeps its old block when a later one fails */
    if (kvq_resize((void **)&m->scores, c, sizeof *m->scores) ||
        kvq_resize((void **)&m->keys, c, sizeof *m->keys) ||
        kvq_resize((void **)&m->sub, c, sizeof *m->sub) ||
        kvq_resize((void **)&m->e, c, sizeof *m->e) || kvq_resize((void **)&m->w, c, sizeof *m->w) ||
        kvq_resize((void **)&m->order, c, sizeof *m->order) ||
        kvq_resize((void **)&m->rank, c, sizeof *m->rank) ||
        kvq_resize((void **)&m->last, c, sizeof *m->last) ||
        kvq_resize((void **)&m->bk, c, sizeof *m->bk) || kvq_resize((void **)&m->be, c, sizeof *m->be) ||
        kvq_resize((void **)&m->ov, 2 * c, sizeof *m->ov))
        return 0;
    m->cap = n;
    return 1;
}

/* The memo holds scores [n] (with their codebook bytes) from here on; 0 when it
 * cannot (out of memory). */
static int memo_put(rt_mass_memo *m, const float *scores, int64_t n, double cb_bytes)
{
    if (m->valid && m->n == n)
        return 1;
    if (!memo_reserve(m, n))
        return 0;
    memcpy(m->scores, scores, sizeof *scores * (size_t)n);
    m->cb_bytes = cb_bytes;
    m->n = n;
    m->valid = 1;
    m->prepared = m->ordered = 0;
    return 1;
}

/* The keys and exponentials grouped by their first digit (a stable counting sort: in
 * index order within a bin), so a tau's first keep_digit is its bin's slice. */
static void group_bins(rt_mass_memo *m)
{
    const digit_hist *h = &m->h0;
    int64_t off = 0;
    for (int i = 0; i < HIST_WORDS; i++)
        for (uint64_t u = h->used[i]; u; u &= u - 1) {
            const int b = i * 64 + __builtin_ctzll(u);
            m->boff[b] = off;
            off += h->hc[b];
        }
    const int shift = kvq_rk_digit_shift(0);
    const uint32_t mask = kvq_rk_digit_mask(0);
    for (int64_t i = 0; i < m->n; i++) {
        const uint32_t b = (m->keys[i] >> shift) & mask;
        m->bk[m->boff[b]] = m->keys[i];
        m->be[m->boff[b]++] = m->e[i];
    }
    for (int i = 0; i < HIST_WORDS; i++) /* back to the starts */
        for (uint64_t u = h->used[i]; u; u &= u - 1) {
            const int b = i * 64 + __builtin_ctzll(u);
            m->boff[b] -= h->hc[b];
        }
}

/* mass_finish from the memo's bins: the same sums in the same order (the first digit's
 * kept keys are its bin's slice, in index order, as keep_digit leaves them). */
static int64_t mass_finish_bins(rt_mass_memo *M, double tau)
{
    double need = tau * M->Z;
    int64_t taken = 0;
    uint32_t b = hist_walk(&M->h0, &need, &taken);
    int64_t m = M->h0.hc[b];
    const uint32_t *ks = m ? M->bk + M->boff[b] : M->sub;
    const double *es = m ? M->be + M->boff[b] : M->w;
    /* the second digit's histogram of bin b: the same for the taus whose first digit is
     * b (the same keys in the same order), so counted once per (row, head) and bin */
    if (M->h1_bin != (int64_t)b) {
        hist_reset(&M->h1);
        hist_count(&M->h1, ks, es, m, 1);
        M->h1_bin = b;
    }
    b = hist_walk(&M->h1, &need, &taken);
    m = keep_digit(ks, es, m, 1, b, M->sub, M->w);
    hist_count(&M->h2, M->sub, M->w, m, 2);
    b = hist_walk(&M->h2, &need, &taken);
    hist_reset(&M->h2);
    m = keep_digit(M->sub, M->w, m, 2, b, M->sub, M->w);
    if (m == 0)
        return taken > 0 ? taken : 1;
    int64_t ties = need <= 0 ? 1 : (int64_t)ceil(need / M->w[0]);
    ties = ties < 1 ? 1 : ties > m ? m : ties;
    return taken + ties;
}

int64_t kvq_rt_mass_count_memo(rt_mass_memo *m, const float *scores, double cb_bytes,
                               const float *lg, int64_t n, double tau, uint32_t *keys, double *w)
{
    if (!m || !memo_put(m, scores, n, cb_bytes))
        return kvq_rt_mass_count(lg, n, tau, keys, w);
    if (!m->prepared) {
        hist_clear(&m->h0);
        mass_prepare(lg, n, m->keys, m->e, &m->Z, &m->h0);
        group_bins(m);
        m->h1_bin = -1; /* a new (row, head): h1 is another's */
        m->prepared = 1;
    }
    return mass_finish_bins(m, tau);
}

/* The candidates by score, descending, equal keys (kvq_rk_key) by index: a stable LSD
 * radix sort of the inverted keys, four 8-bit digits. */
static void make_order(rt_mass_memo *m)
{
    const int64_t n = m->n;
    int32_t *a = m->order;
    kvq_rt_score_order(m->scores, n, m->ov, a);
    int32_t mx = 0;
    for (int64_t i = 0; i < n; i++) {
        m->rank[a[i]] = (int32_t)i;
        mx = a[i] > mx ? a[i] : mx;
        m->last[i] = mx;
    }
    m->ordered = 1;
}

int kvq_rt_mass_memo_put(rt_mass_memo *m, const float *scores, int64_t n, double cb_bytes)
{
    return m && memo_put(m, scores, n, cb_bytes);
}

int64_t kvq_rt_mass_memo_topk(rt_mass_memo *m, int64_t n, int64_t k, int32_t *sel)
{
    if (!m || !m->valid || m->n != n)
        return -1;
    if (!m->ordered)
        make_order(m); /* (its scratch is mass_finish's: the prepared state stays) */
    if (k > n)
        k = n;
    if (k <= 0)
        return 0;
    /* the first k of the order, ascending: the candidates ranked below k, scanned up to
     * the largest of them */
    const int64_t end = (int64_t)m->last[k - 1] + 1;
    if (m->avx512)
        return kvq_rt_rank_select_avx512(m->rank, end, (int32_t)k, sel);
    return kvq_rt_rank_select(m->rank, end, (int32_t)k, sel);
}
