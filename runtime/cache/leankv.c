/*
 * runtime/cache/leankv.c — the LeanKV cache of one KV head (leankv paper, sections 4
 * and 5): the prompt held exactly until it ends, then every token in the pool of its
 * class (HIGH K8V4, LOW K4V2), pruned tokens holding nothing; each pool grows as the
 * head's own sparsity asks and reuses the slots freed by downgrades. Attention reads
 * the rows in place (kvc_rows.h). kvc.h states the policy.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cache/kvc.h"
#include "runtime/kernels/rk.h"
#include "runtime/runtime_internal.h"

/* ==========================================================================
 * Pools
 * ========================================================================== */

static void pool_init(kvq_rt_lk_pool *P, int32_t d, int32_t kb, int32_t vb)
{
    memset(P, 0, sizeof *P);
    P->kb = kb;
    P->vb = vb;
    P->krow = kvq_rk_lkq_row_bytes(d, kb);
    P->row = P->krow + kvq_rk_lkq_row_bytes(d, vb);
}

/* A free slot (the pool doubles when it has none), or -1 when out of memory. */
static int32_t pool_take(kvq_rt_lk_pool *P)
{
    if (P->n_free > 0) {
        P->used++;
        return P->free_[--P->n_free];
    }
    if (P->used == P->cap) {
        const int64_t cap = P->cap ? 2 * P->cap : 64;
        /* huge pages from 4 MiB on, as the f16 cache's arrays (cache.c): the readers
         * stream the rows, and 4 KiB pages cost a TLB miss every 40-70 rows */
        if (!kvq_rt_grow_cache((void **)&P->data, (size_t)P->cap * P->row, (size_t)cap * P->row))
            return -1;
        int32_t *fr = (int32_t *)realloc(P->free_, sizeof(int32_t) * (size_t)cap);
        if (!fr)
            return -1;
        P->free_ = fr;
        P->cap = cap;
    }
    return (int32_t)P->used++;
}

static void pool_give(kvq_rt_lk_pool *P, int32_t slot)
{
    P->free_[P->n_free++] = slot;
    P->used--;
}

static uint8_t *pool_row(const kvq_rt_lk_pool *P, int32_t slot)
{
    return P->data + (size_t)slot * P->row;
}

/* ==========================================================================
 * The head
 * ========================================================================== */

kvq_status kvq_rt_lk_head_init(kvq_rt_lk_head *H, int32_t d, int32_t gs,
                               const kvq_rt_lk_params *p, kvq_err *err)
{
    kvq_status s;
    memset(H, 0, sizeof *H);
    if ((s = kvq_rt_lk_check(p, err)))
        return s;
    if (d < 1 || d > 512 || gs < 1 || gs > KVQ_RT_LK_MAX_GROUP)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "leankv: d %d (1..512), gs %d (1..%d)", (int)d,
                           (int)gs, KVQ_RT_LK_MAX_GROUP);
    H->p = *p;
    H->d = d;
    H->gs = gs;
    pool_init(&H->pool[KVQ_RT_LK_LOW], d, p->k_low, p->v_low);
    pool_init(&H->pool[KVQ_RT_LK_HIGH], d, p->k_high, p->v_high);
    H->isa = kvq_isa_best();
    H->at_n = -1;
    H->row_ = (float *)malloc(sizeof(float) * 2 * (size_t)d);
    if (!H->row_)
        return kvq_err_set(err, KVQ_E_NOMEM, "leankv: out of memory");
    return KVQ_OK;
}

void kvq_rt_lk_head_free(kvq_rt_lk_head *H)
{
    free(H->cls);
    free(H->slot);
    free(H->acc);
    free(H->qcum);
    free(H->sig);
    free(H->exact);
    free(H->p_);
    free(H->row_);
    free(H->col);
    free((void *)H->kr);
    free((void *)H->vr);
    free(H->kb);
    free(H->vb);
    free(H->pruned);
    for (int c = 0; c < 3; c++) {
        free(H->pool[c].data);
        free(H->pool[c].free_);
    }
    memset(H, 0, sizeof *H);
}

static int grow(void **p, size_t bytes)
{
    void *q = realloc(*p, bytes);
    if (!q)
        return 0;
    *p = q;
    return 1;
}

static kvq_status reserve(kvq_rt_lk_head *H, int64_t need, kvq_err *err)
{
    if (need <= H->cap)
        return KVQ_OK;
    int64_t cap = H->cap ? H->cap : 64;
    while (cap < need)
        cap *= 2;
    if (cap > INT32_MAX) /* the row lists hold tokens as int32 */
        return kvq_err_set(err, KVQ_E_NOMEM, "leankv: %lld tokens (at most %d)",
                           (long long)need, INT32_MAX);
    const size_t c = (size_t)cap;
    if (!grow((void **)&H->cls, c) || !grow((void **)&H->slot, sizeof(int32_t) * c) ||
        !grow((void **)&H->acc, sizeof(double) * c * (size_t)H->gs) ||
        !grow((void **)&H->qcum, sizeof(int32_t) * c) || !grow((void **)&H->sig, sizeof(double) * c) ||
        !grow((void **)&H->p_, sizeof(float) * c * (size_t)H->gs) ||
        !grow((void **)&H->col, sizeof(int32_t) * c) || !grow((void **)&H->kr, sizeof(void *) * c) ||
        !grow((void **)&H->pruned, sizeof(int32_t) * c) ||
        !grow((void **)&H->vr, sizeof(void *) * c) || !grow((void **)&H->kb, c) ||
        !grow((void **)&H->vb, c) ||
        (!H->prompt_done && !grow((void **)&H->exact, sizeof(float) * 2 * c * (size_t)H->d)))
        return kvq_err_set(err, KVQ_E_NOMEM, "leankv: out of memory (%lld tokens)",
                           (long long)cap);
    H->cap = cap;
    return KVQ_OK;
}

/* Stores k, v [d] as token j in class c (a new slot). */
static kvq_status store(kvq_rt_lk_head *H, int64_t j, int c, const float *k, const float *v,
                        kvq_err *err)
{
    H->cls[j] = (uint8_t)c;
    H->slot[j] = -1;
    if (c == KVQ_RT_LK_PRUNED)
        return KVQ_OK;
    kvq_rt_lk_pool *P = &H->pool[c];
    const uint8_t *was = P->data;
    const int32_t sl = pool_take(P);
    if (sl < 0)
        return kvq_err_set(err, KVQ_E_NOMEM, "leankv: out of memory");
    H->list_stale |= P->data != was; /* the pool moved: the list's addresses too */
    kvq_status s = kvq_rt_lkq_quantize(k, H->d, P->kb, pool_row(P, sl), err);
    if (!s)
        s = kvq_rt_lkq_quantize(v, H->d, P->vb, pool_row(P, sl) + P->krow, err);
    if (s) {
        pool_give(P, sl);
        return s;
    }
    H->slot[j] = sl;
    return KVQ_OK;
}

/* ==========================================================================
 * The kept-row list
 * ========================================================================== */

/* Entry i of the list: token j's rows (j kept). */
static void list_set(kvq_rt_lk_head *H, int64_t i, int64_t j)
{
    const kvq_rt_lk_pool *P = &H->pool[H->cls[j]];
    H->col[i] = (int32_t)j;
    H->kr[i] = pool_row(P, H->slot[j]);
    H->vr[i] = H->kr[i] + P->krow;
    H->kb[i] = (int8_t)P->kb;
    H->vb[i] = (int8_t)P->vb;
}

/* The list made again from the classes. */
static void list_make(kvq_rt_lk_head *H)
{
    int64_t m = 0;
    for (int64_t j = 0; j < H->n; j++)
        if (H->cls[j] != KVQ_RT_LK_PRUNED)
            list_set(H, m++, j);
    H->m = m;
    H->list_stale = 0;
}

/* Token j's entry (j listed): bisection over the ascending tokens. */
static int64_t list_find(const kvq_rt_lk_head *H, int64_t j)
{
    int64_t lo = 0, hi = H->m;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (H->col[mid] < j)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Token j was moved to another class (a new row) or pruned: its entry follows. */
static void list_update(kvq_rt_lk_head *H, int64_t j)
{
    const int pruned = H->cls[j] == KVQ_RT_LK_PRUNED;
    if (pruned)
        H->pruned[H->npruned++] = (int32_t)j;
    if (H->list_stale) /* made again before the next read */
        return;
    const int64_t i = list_find(H, j);
    if (!pruned) {
        list_set(H, i, j);
        return;
    }
    const size_t t = (size_t)(H->m - i - 1);
    memmove(H->col + i, H->col + i + 1, sizeof *H->col * t);
    memmove((void *)(H->kr + i), H->kr + i + 1, sizeof *H->kr * t);
    memmove((void *)(H->vr + i), H->vr + i + 1, sizeof *H->vr * t);
    memmove(H->kb + i, H->kb + i + 1, t);
    memmove(H->vb + i, H->vb + i + 1, t);
    H->m--;
}

/* ==========================================================================
 * Tokens, attention, the policy
 * ========================================================================== */

kvq_status kvq_rt_lk_append(kvq_rt_lk_head *H, const float *k, const float *v, kvq_err *err)
{
    kvq_status s;
    const int64_t j = H->n;
    if ((s = reserve(H, j + 1, err)))
        return s;
    if (H->nq > INT32_MAX) /* the queries counted are held as int32 */
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "leankv: %lld queries counted (at most %d)",
                           (long long)H->nq, INT32_MAX);
    for (int32_t g = 0; g < H->gs; g++)
        H->acc[(size_t)j * H->gs + g] = 0;
    H->qcum[j] = (int32_t)H->nq;
    if (!H->prompt_done) {
        memcpy(H->exact + (size_t)j * 2 * H->d, k, sizeof(float) * (size_t)H->d);
        memcpy(H->exact + ((size_t)j * 2 + 1) * H->d, v, sizeof(float) * (size_t)H->d);
        H->cls[j] = KVQ_RT_LK_HIGH;
        H->slot[j] = -1;
    } else if ((s = store(H, j, KVQ_RT_LK_HIGH, k, v, err))) {
        return s;
    } else if (!H->list_stale) {
        list_set(H, H->m++, j);
    }
    H->n++;
    return KVQ_OK;
}

/* Token j's significance after nq queries (kvc.h): its sums' largest over the query
 * heads by the queries counted after it, +inf when none. */
static inline double sig_of(const kvq_rt_lk_head *H, int64_t j, int64_t nq)
{
    const int64_t cnt = nq - H->qcum[j] - 1; /* the queries after token j's own */
    if (cnt <= 0)
        return INFINITY;
    const double *a = H->acc + (size_t)j * H->gs;
    double best = -INFINITY;
    for (int32_t g = 0; g < H->gs; g++)
        best = a[g] > best ? a[g] : best;
    return best / (double)cnt;
}

#define SUMS_BLK 64 /* tokens of count_sums' blocks */

typedef double lk_v8d __attribute__((vector_size(64)));
typedef int64_t lk_v8l __attribute__((vector_size(64)));

/* out[k] = num[k] / den[k] where den[k] > 0, else +inf (sig_of's division) for k <
 * SUMS_BLK: IEEE divisions eight at a time (vectors of the clone's width), so every
 * clone gives the scalar bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void divide_block(const double *num, const double *den, double *out)
{
    const lk_v8d inf = {INFINITY, INFINITY, INFINITY, INFINITY,
                        INFINITY, INFINITY, INFINITY, INFINITY};
    for (int k = 0; k < SUMS_BLK; k += 8) {
        lk_v8d a, b;
        memcpy(&a, num + k, sizeof a);
        memcpy(&b, den + k, sizeof b);
        const lk_v8l pos = b > 0;
        const lk_v8l r = ((lk_v8l)(a / b) & pos) | ((lk_v8l)inf & ~pos);
        memcpy(out + k, &r, sizeof r);
    }
}

/* Block [i0, i0 + nb) of count_sums' pass: the sums of the tokens before the last
 * (n - 1) counted, each token's largest sum into best and its later queries into den. */
static inline __attribute__((always_inline)) void sums_block(kvq_rt_lk_head *H, int64_t i0,
                                                             int64_t nb, int64_t ld, int64_t nq,
                                                             int32_t gs, double *best,
                                                             double *den)
{
    const float *p = H->p_ + i0;
    const int64_t last = H->n - 1;
    for (int64_t k = 0; k < nb; k++) {
        const int64_t j = H->col[i0 + k];
        double *a = H->acc + (size_t)j * (size_t)gs, bt = -INFINITY;
        if (j < last)
            for (int32_t g = 0; g < gs; g++)
                a[g] += p[(size_t)g * (size_t)ld + (size_t)k];
        for (int32_t g = 0; g < gs; g++)
            bt = a[g] > bt ? a[g] : bt;
        best[k] = bt;
        den[k] = (double)(nq - H->qcum[j] - 1);
    }
}

/* The generation phase's one pass over the kept tokens after the probabilities p_
 * [gs, ld]: each token's sums (the query's own token, the last, excluded), its
 * significance as the policy step sees it (the query counted: sig_of's value), and per
 * section the least significant token before c = n - 1 - window (ties: the earliest),
 * which with token c itself is Algorithm 1's choice (kvq_rt_lk_step). */
static void count_sums(kvq_rt_lk_head *H, int64_t m, int64_t ld)
{
    const int32_t gs = H->gs;
    const int64_t n = H->n, nq = H->nq + 1, c = n - 1 - H->p.window;
    int64_t least[3] = {-1, -1, -1};
    double ls[3] = {0, 0, 0};
    double best[SUMS_BLK], den[SUMS_BLK], sg[SUMS_BLK];
    for (int64_t i0 = 0; i0 < m; i0 += SUMS_BLK) {
        const int64_t nb = m - i0 < SUMS_BLK ? m - i0 : SUMS_BLK;
        switch (gs) { /* the group sizes of common models, unrolled */
        case 1: sums_block(H, i0, nb, ld, nq, 1, best, den); break;
        case 2: sums_block(H, i0, nb, ld, nq, 2, best, den); break;
        case 3: sums_block(H, i0, nb, ld, nq, 3, best, den); break;
        case 4: sums_block(H, i0, nb, ld, nq, 4, best, den); break;
        case 8: sums_block(H, i0, nb, ld, nq, 8, best, den); break;
        default: sums_block(H, i0, nb, ld, nq, gs, best, den); break;
        }
        for (int64_t k = nb; k < SUMS_BLK; k++)
            best[k] = 0, den[k] = 1;
        divide_block(best, den, sg);
        for (int64_t k = 0; k < nb; k++) {
            const int64_t j = H->col[i0 + k];
            H->sig[j] = sg[k];
            if (j < c) {
                const int cl = H->cls[j];
                if (least[cl] < 0 || sg[k] < ls[cl])
                    least[cl] = j, ls[cl] = sg[k];
            }
        }
    }
    for (int k = 0; k < 3; k++)
        H->least[k] = least[k], H->least_sig[k] = ls[k];
    H->at_n = n;
    H->at_nq = nq;
}

void kvq_rt_lk_attend(kvq_rt_lk_head *H, const float *q, float scale, float *o)
{
    const int32_t d = H->d, gs = H->gs;
    const int64_t n = H->n, ld = H->cap;
    int64_t m = n;
    if (!H->prompt_done) {
        kvq_rk_logits(H->isa, q, gs, d, H->exact, KVQ_DT_F32, 2 * (int64_t)d, NULL, n, scale,
                      H->p_, ld);
    } else {
        float qs[KVQ_RT_LK_MAX_GROUP];
        if (H->list_stale)
            list_make(H);
        m = H->m;
        for (int32_t g = 0; g < gs; g++)
            qs[g] = kvq_rk_qsum(q + (size_t)g * d, d);
        kvq_rk_lkq_logits(H->isa, q, gs, d, qs, H->kr, H->kb, m, d, scale, H->p_, ld);
    }
    memset(o, 0, sizeof(float) * (size_t)gs * d);
    if (m > 0)
        kvq_rk_softmax(H->isa, H->p_, gs, m, ld);
    if (H->prompt_done) {
        count_sums(H, m, ld);
    } else {
        for (int64_t j = 0; j + 1 < n; j++) { /* the query's own token: not a later query */
            double *a = H->acc + (size_t)j * gs;
            for (int32_t g = 0; g < gs; g++)
                a[g] += H->p_[(size_t)g * (size_t)ld + (size_t)j];
        }
    }
    if (!H->prompt_done)
        kvq_rk_mix(H->isa, H->p_, gs, ld, H->exact + d, KVQ_DT_F32, 2 * (int64_t)d, NULL, n, d, o);
    else
        kvq_rk_lkq_mix(H->isa, H->p_, gs, ld, H->vr, H->vb, m, d, o, d);
    H->nq++;
}

/* The current significance of every token into H->sig. */
static void significance(kvq_rt_lk_head *H)
{
    for (int64_t j = 0; j < H->n; j++)
        H->sig[j] = sig_of(H, j, H->nq);
}

kvq_status kvq_rt_lk_end_prompt(kvq_rt_lk_head *H, kvq_err *err)
{
    kvq_status s = KVQ_OK;
    if (H->prompt_done)
        return KVQ_OK;
    significance(H);
    kvq_rt_lk_classify_prompt(H->sig, H->n, &H->p, H->cls);
    H->prompt_done = 1;
    for (int64_t j = 0; j < H->n && !s; j++) {
        const float *k = H->exact + (size_t)j * 2 * H->d;
        s = store(H, j, H->cls[j], k, k + H->d, err);
    }
    free(H->exact);
    H->exact = NULL;
    if (s)
        return s;
    list_make(H);
    H->npruned = 0;
    for (int64_t j = 0; j < H->n; j++)
        if (H->cls[j] == KVQ_RT_LK_PRUNED)
            H->pruned[H->npruned++] = (int32_t)j;
    return KVQ_OK;
}

/* Moves token j down to class c (< its class): from its rows, dequantized. */
static kvq_status downgrade(kvq_rt_lk_head *H, int64_t j, int c, kvq_err *err)
{
    kvq_rt_lk_pool *P = &H->pool[H->cls[j]];
    const int32_t sl = H->slot[j], d = H->d;
    kvq_rk_lkq_dequant(pool_row(P, sl), d, P->kb, H->row_);
    kvq_rk_lkq_dequant(pool_row(P, sl) + P->krow, d, P->vb, H->row_ + d);
    pool_give(P, sl);
    kvq_status s = store(H, j, c, H->row_, H->row_ + d, err);
    if (!s)
        list_update(H, j);
    return s;
}

/* The step from scratch: every token's significance, kvq_rt_lk_generation_step on the
 * classes, then the rows follow the tokens whose class it changed (the one leaving the
 * window and the victim). */
static kvq_status step_scan(kvq_rt_lk_head *H, kvq_err *err)
{
    const int64_t n = H->n;
    kvq_status s = KVQ_OK;
    significance(H);
    uint8_t *old = (uint8_t *)H->p_; /* [cap] bytes of the probabilities' scratch */
    memcpy(old, H->cls, (size_t)n);
    kvq_rt_lk_generation_step(H->sig, n, &H->p, H->cls);
    for (int64_t j = 0; j < n && !s; j++)
        if (H->cls[j] != old[j]) {
            const int c = H->cls[j];
            H->cls[j] = old[j];
            s = downgrade(H, j, c, err);
        }
    return s;
}

kvq_status kvq_rt_lk_step(kvq_rt_lk_head *H, kvq_err *err)
{
    const int64_t n = H->n;
    if (!H->prompt_done)
        return KVQ_OK;
    if (n < 1 || H->at_n != n || H->at_nq != H->nq) /* not counted by attend */
        return step_scan(H, err);
    /* kvq_rt_lk_generation_step over what attend counted: the kept tokens' significance
     * is in H->sig, the pruned tokens' follows (the unchanged sums by one more query),
     * and the least significant token of a section among 0..c is the one before c
     * (H->least) unless token c's own is less (c comes later: ties keep the earlier) */
    H->at_n = -1;
    for (int64_t i = 0; i < H->npruned; i++)
        H->sig[H->pruned[i]] = sig_of(H, H->pruned[i], H->nq);
    H->cls[n - 1] = KVQ_RT_LK_HIGH;
    if (n <= H->p.window)
        return KVQ_OK;
    const int64_t c = n - 1 - H->p.window;
    const int sec = kvq_rt_lk_rule(H->sig[c], n, &H->p);
    int cc = sec, nv = sec;
    int64_t v = -1;
    if (sec != KVQ_RT_LK_PRUNED) {
        double sv = H->least_sig[sec];
        v = H->least[sec];
        if (v < 0 || H->sig[c] < sv)
            v = c, sv = H->sig[c];
        const int now = kvq_rt_lk_rule(sv, n, &H->p);
        if (now < sec)
            nv = now;
        if (v == c)
            cc = nv, v = -1;
    }
    kvq_status s = KVQ_OK;
    if (v >= 0 && nv != sec) /* v < c: the tokens in order, as step_scan */
        s = downgrade(H, v, nv, err);
    if (!s && cc != H->cls[c])
        s = downgrade(H, c, cc, err);
    return s;
}

void kvq_rt_lk_bytes(const kvq_rt_lk_head *H, double *low, double *high, double *exact)
{
    *low = (double)H->pool[KVQ_RT_LK_LOW].used * (double)H->pool[KVQ_RT_LK_LOW].row;
    *high = (double)H->pool[KVQ_RT_LK_HIGH].used * (double)H->pool[KVQ_RT_LK_HIGH].row;
    *exact = H->prompt_done ? 0 : (double)H->n * 8.0 * H->d;
}
