/*
 * score_pos.c — positions in the codebook selector's scoring query (kvq_score_pos of
 * kvq/runtime.h): q R_b (a2ats), or the mean rotation over the candidates' distances,
 * over all of them or per distance band.
 *
 * The exact score of candidate j for a query at position i is q R_delta . k_j with
 * delta = i - p_j (row vectors, pre-RoPE k). Pair m of R_delta is the complex factor
 * e^{i delta t_m}. Averaged over delta in [a, b] (N = b - a + 1 values) that factor is
 *     e^{i c t} sin(N t / 2) / (N sin(t / 2)),   c = (a + b) / 2
 * (a Dirichlet kernel): a rotation by the centre distance, damped where the pair turns
 * fast enough that its angle over the range is unknown. q M . k is then the mean of the
 * exact scores over the distances, which is the best linear stand-in for all of them
 * when a key's content does not depend on where it sits.
 */
#include <math.h>
#include <string.h>

#include "kvq/runtime.h"
#include "runtime/runtime_internal.h"
#include "runtime/select/codebook/codebook.h"
#include "runtime/kernels/kernels.h"

static const char *const score_names[] = {"rb", "mean", "bands"};

const char *kvq_score_pos_name(kvq_score_pos s)
{
    return (unsigned)s <= KVQ_SCORE_BANDS ? score_names[s] : "unknown";
}

int kvq_score_pos_parse(const char *s, kvq_score_pos *out)
{
    for (int i = 0; i <= (int)KVQ_SCORE_BANDS; i++)
        if (s && !strcmp(s, score_names[i])) {
            *out = (kvq_score_pos)i;
            return 0;
        }
    return -1;
}

void kvq_rt_mean_rotation(const kvq_retrieval *r, int64_t a, int64_t b, float *cs, float *sn)
{
    const int32_t half = r->d / 2;
    const double n = (double)(b - a + 1), c = 0.5 * ((double)a + (double)b);
    for (int32_t m = 0; m < half; m++) {
        const double t = r->theta[m], s2 = sin(0.5 * t);
        const double damp = fabs(s2) < 1e-12 ? 1.0 : sin(0.5 * n * t) / (n * s2);
        cs[m] = (float)(damp * cos(c * t));
        sn[m] = (float)(damp * sin(c * t));
    }
}

void kvq_rt_scoring_query(const rt_step *st, const kvq_codebook *cb, const float *q, int64_t a,
                          int64_t b, float *out)
{
    const kvq_retrieval *r = st->r;
    if (r->p.score_pos == KVQ_SCORE_RB ||
        kvq_codebook_get_desc(cb)->method == KVQ_CODEBOOK_VQ_POSTROPE) {
        kvq_codebook_query_pe(cb, q, st->pos, out);
        return;
    }
    rt_scratch *S = st->S;
    rt_codes_scratch *X = kvq_rt_codes_scr(S);
    if (X->mr_b <= 0 || X->mr_a != a || X->mr_b != b) { /* mr_b = 0: nothing held */
        kvq_rt_mean_rotation(r, a, b, X->mr_cs, X->mr_sn);
        X->mr_a = a;
        X->mr_b = b;
    }
    kvq_rk_rotate(q, X->mr_cs, X->mr_sn, (int)r->rope.layout, r->d, out);
}

/* The scoring query of band k, distances [lo, hi], of candidates at distances [a, b]:
 * what kvq_rt_scoring_query gives, with the band's mean rotation kept in the scratch
 * while the candidates' distances stay (a step's layers and heads share them). */
static void band_query(const rt_step *st, const kvq_codebook *cb, const float *q, int64_t a,
                       int64_t b, int32_t k, int64_t lo, int64_t hi, float *out)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    rt_codes_scratch *X = kvq_rt_codes_scr(S);
    if (r->p.score_pos == KVQ_SCORE_RB || k >= KVQ_RT_BAND_ROTATIONS ||
        kvq_codebook_get_desc(cb)->method == KVQ_CODEBOOK_VQ_POSTROPE) {
        kvq_rt_scoring_query(st, cb, q, lo, hi, out);
        return;
    }
    if (X->br_a != a || X->br_b != b) {
        X->br_a = a;
        X->br_b = b;
        X->br_have = 0;
    }
    float *cs = X->br[k], *sn = X->br[k] + r->d / 2;
    if (!(X->br_have >> k & 1u)) {
        kvq_rt_mean_rotation(r, lo, hi, cs, sn);
        X->br_have |= 1u << k;
    }
    kvq_rk_rotate(q, cs, sn, (int)r->rope.layout, r->d, out);
}

/* Spread term (experiment knob, off; z = 1 was worse at 8K, docs/QUALITY.md): z times the spread of the exact score over the band's
 * distances, added to the band's LUT. Per pair m the exact contribution turns with the
 * distance; its variance over the band is about (1 - damp_m^2) |q_m|^2 |c_m|^2 / 2 (damp_m
 * the mean rotation's length), so sigma^2(c) = sum_m (1 - damp_m^2) |q_m|^2 |c_m|^2 / 2. */
#ifndef KVQ_RT_BAND_Z
#define KVQ_RT_BAND_Z 0.0
#endif
static void band_spread(const rt_step *st, const kvq_codebook *cb, const float *q, int64_t lo,
                        int64_t hi, float *lut)
{
    const kvq_retrieval *r = st->r;
    const kvq_codebook_desc *D = kvq_codebook_get_desc(cb);
    if (KVQ_RT_BAND_Z == 0.0 || D->groups != 1 || r->p.score_pos != KVQ_SCORE_BANDS ||
        D->method == KVQ_CODEBOOK_VQ_POSTROPE)
        return;
    const int32_t d = r->d, half = d / 2, K = D->k;
    float cs[KVQ_ROPE_MAX_DIM / 2], sn[KVQ_ROPE_MAX_DIM / 2];
    double v[KVQ_ROPE_MAX_DIM / 2];
    int32_t i0[KVQ_ROPE_MAX_DIM / 2], i1[KVQ_ROPE_MAX_DIM / 2];
    kvq_rt_mean_rotation(r, lo, hi, cs, sn);
    for (int32_t m = 0; m < half; m++) {
        i0[m] = r->rope.layout == KVQ_ROPE_HALF ? m : 2 * m;
        i1[m] = r->rope.layout == KVQ_ROPE_HALF ? m + half : 2 * m + 1;
        const double dm2 = (double)cs[m] * cs[m] + (double)sn[m] * sn[m];
        const double q2 = (double)q[i0[m]] * q[i0[m]] + (double)q[i1[m]] * q[i1[m]];
        v[m] = 0.5 * (1.0 - (dm2 > 1.0 ? 1.0 : dm2)) * q2;
    }
    const float *W = kvq_codebook_key_codebook(cb);
    for (int32_t c = 0; c < K; c++) {
        const float *w = W + (size_t)c * d;
        double s2 = 0;
        for (int32_t m = 0; m < half; m++)
            s2 += v[m] * ((double)w[i0[m]] * w[i0[m]] + (double)w[i1[m]] * w[i1[m]]);
        lut[c] += (float)(KVQ_RT_BAND_Z * sqrt(s2));
    }
}

void kvq_rt_candidate_distances(const rt_step *st, int64_t *a, int64_t *b)
{
    /* candidates are the tokens [s_end, w_beg) (in code order the rows hold the same set) */
    *a = st->pos - st->L->pos[st->w_beg - 1];
    *b = st->pos - st->L->pos[st->s_end];
    if (*a > *b) { /* positions out of order: span both */
        const int64_t t = *a;
        *a = *b;
        *b = t;
    }
}

/* Steps per doubling of the bands' first distances, and a cap on a band's width (0: none):
 * experiment knobs (docs/QUALITY.md "8K context": 2 steps per doubling did not help at
 * 8K). bench/bench_decode.c mirrors the default layout (doubling bands). */
#ifndef KVQ_RT_BAND_STEPS
#define KVQ_RT_BAND_STEPS 1
#endif
#ifndef KVQ_RT_BAND_CAP
#define KVQ_RT_BAND_CAP 0
#endif

/* The bands of candidate distances [a, b]: band k is [lo[k], lo[k + 1] - 1], lo[0] = a,
 * lo[k] = a 2^(k / S) rounded (S steps per doubling), at least one more than lo[k - 1];
 * the last band ends at b (lo[nb] = b + 1). Returns nb (<= 63). */
static int32_t band_edges(int64_t a, int64_t b, int64_t *lo)
{
    int32_t k = 0;
    lo[0] = a;
    while (k < 62) {
        /* doubling bands (the default) by a shift: no pow on the decode path */
        int64_t nx = KVQ_RT_BAND_STEPS == 1 && k + 1 < 31 /* a < 2^31: no overflow */
                         ? a << (k + 1)
                         : llround((double)a * pow(2.0, (double)(k + 1) / KVQ_RT_BAND_STEPS));
        if (KVQ_RT_BAND_CAP > 0 && nx > lo[k] + KVQ_RT_BAND_CAP)
            nx = lo[k] + KVQ_RT_BAND_CAP;
        if (nx <= lo[k])
            nx = lo[k] + 1;
        if (nx > b)
            break;
        lo[++k] = nx;
    }
    lo[k + 1] = b + 1;
    return k + 1;
}

/* Band of distance delta (lo[0] <= delta < lo[nb]; nearer ones in band 0). */
static int32_t band_of(int64_t delta, const int64_t *lo, int32_t nb)
{
    int32_t k = 0;
    while (k + 1 < nb && delta >= lo[k + 1])
        k++;
    return k;
}

/* First row in [lo, hi) whose position is >= p (positions increasing over the rows). */
static int64_t first_at(const int64_t *pos, int64_t lo, int64_t hi, int64_t p)
{
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (pos[mid] < p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* BANDS on rows in code order (row_order.c): the sorted rows [s_end, se) hold runs of
 * one code, each run in token order, so each run splits into one sub-run per band. The
 * runs from the per-code counts of [s_end, se); then per band (nearest first) its LUT,
 * each run walked backwards from where the nearer band stopped while its rows' positions
 * are in the band (>= pos - hi), filled with the LUT's entry for the code (the farthest
 * band takes the rest of each run), and the unsorted rows [se, w_beg) (token j in row
 * j) scored as a range, as in token order. Every candidate row is read once. */
static void banded_sorted(const rt_step *st, const float *q, int64_t a, int64_t b,
                          const int64_t *E, int32_t nb, float *scores, double *cb_bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    rt_codes_scratch *X = kvq_rt_codes_scr(S);
    const kvq_codebook *cb = st->L->cb[st->head];
    const kvq_rk_table *tab = st->L->tab[st->head];
    const int32_t K = kvq_codebook_get_desc(cb)->k;
    const int64_t *P = st->L->pos, s0 = st->s_end;
    const int32_t *tok = st->H->tok;
    const int64_t se = st->H->sorted_end < st->w_beg ? st->H->sorted_end : st->w_beg;
    uint32_t *run = X->cwork, *cur = X->cwork + K, *cnt = X->cwork + 2 * K; /* of 4 K */
    const rt_codes_head *C = kvq_rt_codes(st->H);
    kvq_rk_code_counts(C->hist, K, C->codes, st->L->len, s0, se, cnt);
    uint32_t acc = 0;
    for (int32_t c = 0; c < K; c++) {
        run[c] = acc;
        cur[c] = acc += cnt[c];
    }
    float qs[KVQ_ROPE_MAX_DIM];
    for (int32_t k = 0; k < nb; k++) {
        const int64_t lo = E[k], hi = E[k + 1] - 1;
        const int64_t first = st->pos - hi;
        band_query(st, cb, q, a, b, k, lo, hi, qs);
        kvq_rk_lut(r->p.isa, tab, qs, X->lut);
        band_spread(st, cb, q, lo, hi, X->lut);
        *cb_bytes += (double)kvq_rk_table_bytes(tab);
        for (int32_t c = 0; c < K; c++) {
            const int64_t rs = run[c];
            const float v = X->lut[c];
            int64_t j = cur[c];
            if (k + 1 == nb)
                for (; j > rs; j--)
                    scores[j - 1] = v;
            else
                for (; j > rs && P[tok[s0 + j - 1]] >= first; j--)
                    scores[j - 1] = v;
            cur[c] = (uint32_t)j;
        }
        const int64_t r0 = k + 1 == nb ? se : first_at(P, se, st->w_beg, first);
        const int64_t r1 = k == 0 ? st->w_beg : first_at(P, se, st->w_beg, st->pos - lo + 1);
        if (r1 > r0)
            kvq_rk_score(r->p.isa, X->lut, 1, K, C->codes + r0, r1 - r0, scores + (r0 - s0));
    }
}

#ifdef KVQ_RT_DIAG_EXACT_ROTATION
/* Diagnostic build only (docs/QUALITY.md "8K context"): each candidate scored with its
 * own exact rotation on its centroid, q R_delta . c(code) -- the bands' scoring without
 * the averaging over distances (no fast path; cost ~ d per row). */
static void cheat_scores(const rt_step *st, const float *q, float *scores)
{
    const kvq_retrieval *r = st->r;
    const kvq_codebook *cb = st->L->cb[st->head];
    const int32_t d = r->d, half = d / 2, G = kvq_codebook_get_desc(cb)->groups;
    const float *W = kvq_codebook_key_codebook(cb);
    float cs[KVQ_ROPE_MAX_DIM / 2], sn[KVQ_ROPE_MAX_DIM / 2], qs[KVQ_ROPE_MAX_DIM];
    for (int64_t j = 0; j < st->nc; j++) {
        const int64_t row = st->s_end + j;
        const int64_t delta = st->pos - st->L->pos[kvq_rt_row_token(st->H, row)];
        for (int32_t m = 0; m < half; m++) {
            cs[m] = (float)cos((double)delta * r->theta[m]);
            sn[m] = (float)sin((double)delta * r->theta[m]);
        }
        kvq_rk_rotate(q, cs, sn, (int)r->rope.layout, d, qs);
        const float *w = W + (size_t)kvq_rt_codes(st->H)->codes[(size_t)row * G] * d;
        float acc = 0;
        for (int32_t t = 0; t < d; t++)
            acc += qs[t] * w[t];
        scores[j] = acc;
    }
}
#endif

void kvq_rt_banded_scores(const rt_step *st, const float *qsum_pre, float *scores,
                          double *cb_bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    rt_codes_scratch *X = kvq_rt_codes_scr(S);
    const kvq_codebook *cb = st->L->cb[st->head];
    const kvq_rk_table *tab = st->L->tab[st->head];
    const kvq_codebook_desc *D = kvq_codebook_get_desc(cb);
    const int32_t G = D->groups, K = D->k;
    const int64_t *P = st->L->pos;
#ifdef KVQ_RT_DIAG_EXACT_ROTATION
    cheat_scores(st, qsum_pre, scores);
    return;
#endif
    int64_t a, b;
    kvq_rt_candidate_distances(st, &a, &b);
    if (a < 1)
        a = 1;
    int64_t E[64];
    const int32_t nb = band_edges(a, b, E);
    /* rows in token order with increasing positions (the usual case): each band is a
     * range of rows, scored by the SIMD gather with its own LUT */
    const int fast = !st->H->tok && !st->L->pos_unordered;
    /* rows in code order (single group, positions increasing) */
    if (st->H->tok && !st->L->pos_unordered && G == 1 && st->H->sorted_end > st->s_end) {
        banded_sorted(st, qsum_pre, a, b, E, nb, scores, cb_bytes);
        return;
    }
    float qs[KVQ_ROPE_MAX_DIM];
    for (int32_t k = 0; k < nb; k++) {
        const int64_t lo = E[k], hi = E[k + 1] - 1;
        int64_t r0 = 0, r1 = 0;
        if (fast) { /* rows whose distance is in [lo, hi]: positions in [pos - hi, pos - lo] */
            r0 = k + 1 == nb ? st->s_end : first_at(P, st->s_end, st->w_beg, st->pos - hi);
            r1 = k == 0 ? st->w_beg : first_at(P, st->s_end, st->w_beg, st->pos - lo + 1);
            if (r1 <= r0)
                continue;
        }
        band_query(st, cb, qsum_pre, a, b, k, lo, hi, qs);
        kvq_rk_lut(r->p.isa, tab, qs, X->lut);
        band_spread(st, cb, qsum_pre, lo, hi, X->lut);
        *cb_bytes += (double)kvq_rk_table_bytes(tab);
        if (fast) {
            kvq_rk_score(r->p.isa, X->lut, G, K, kvq_rt_codes(st->H)->codes + (size_t)r0 * G,
                         r1 - r0, scores + (r0 - st->s_end));
            continue;
        }
        for (int64_t j = 0; j < st->nc; j++) {
            const int64_t row = st->s_end + j;
            const int64_t delta = st->pos - P[kvq_rt_row_token(st->H, row)];
            if (band_of(delta < a ? a : delta, E, nb) != k)
                continue;
            const uint16_t *c = kvq_rt_codes(st->H)->codes + (size_t)row * G;
            float s = 0;
            for (int32_t g = 0; g < G; g++)
                s += X->lut[(size_t)g * K + c[g]];
            scores[j] = s;
        }
    }
}

/* BANDS selection on rows in code order without a score per row (kvq_rk_topk_bands):
 * the same LUTs as banded_sorted, kept side by side [nb, K] in S->scores, each band's
 * first token from the positions (positions increasing over the tokens), then the
 * weighted threshold over the (code, band) groups and the rows emitted group by group.
 * The same selection as kvq_rt_banded_scores + kvq_rk_topk. Used when the groups are
 * few enough to pay (kvq_rk_bands_select_pays) and fit the scratch. */
/* Whether the (code, band) groups apply to this step (kvq_rt_banded_select,
 * kvq_rt_banded_cursor): bands scoring under the group sum, a single-group codebook in
 * key space, the rows by token with some of them in code order past the sinks. */
static int bands_apply(const rt_step *st, const kvq_codebook_desc *D)
{
#ifdef KVQ_RT_DIAG_EXACT_ROTATION
    return 0;
#endif
    const kvq_retrieval *r = st->r;
    const rt_head *H = st->H;
    return !(r->p.score_pos != KVQ_SCORE_BANDS || r->p.group != KVQ_GROUP_SUM ||
             D->groups != 1 || D->method == KVQ_CODEBOOK_VQ_POSTROPE || !H->tok ||
             st->L->pos_unordered || st->s_end != r->p.sink || H->sorted_end <= st->s_end);
}

/* The groups' description of the step's candidates (kvq_rk_bands): the rows in code
 * order [s_end, se) with their per-code counts (into the scratch's cwork), the unsorted rest up
 * to
 * the window; lut the bands' LUTs [nb, K] or NULL, tb the bands' first tokens. */
static kvq_rk_bands bands_of(const rt_step *st, int32_t K, int32_t nb, const float *lut,
                             const int64_t *tb)
{
    const rt_head *H = st->H;
    rt_scratch *S = st->S;
    rt_codes_scratch *X = kvq_rt_codes_scr(S);
    const int64_t s0 = st->s_end, se = H->sorted_end < st->w_beg ? H->sorted_end : st->w_beg;
    const rt_codes_head *C = kvq_rt_codes(H);
    kvq_rk_code_counts(C->hist, K, C->codes, st->L->len, s0, se, X->cwork);
    return (kvq_rk_bands){.K = K,
                          .nb = nb,
                          .lut = lut,
                          .n = se - s0,
                          .cnt = X->cwork,
                          .tok = H->tok + s0,
                          .tb = tb,
                          .nu = st->w_beg - se,
                          .utok0 = se,
                          .ucodes = C->codes + se};
}

int64_t kvq_rt_banded_select(const rt_step *st, int64_t k, int32_t *sel, double *cb_bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    rt_cb_scratch *Y = kvq_rt_cb_scr(S);
    const rt_head *H = st->H;
    const kvq_codebook *cb = st->L->cb[st->head];
    const kvq_codebook_desc *D = kvq_codebook_get_desc(cb);
    const int32_t K = D->k, d = r->d;
    if (!bands_apply(st, D))
        return -1;
    int64_t a, b;
    kvq_rt_candidate_distances(st, &a, &b);
    if (a < 1)
        a = 1;
    int64_t E[64];
    const int32_t nb = band_edges(a, b, E);
    const int64_t nk = (int64_t)nb * K;
    if (!kvq_rk_bands_select_pays(st->nc, nb, K) || nk > S->cap || 3 * nk > 2 * S->cap)
        return -1;
    const int64_t s0 = st->s_end;
    float q[KVQ_ROPE_MAX_DIM], qs[8 * KVQ_ROPE_MAX_DIM];
    memcpy(q, st->q, sizeof(float) * (size_t)d); /* the group's sum */
    for (int32_t g = 1; g < r->gs; g++)
        for (int32_t t = 0; t < d; t++)
            q[t] += st->q[(size_t)g * d + t];
    int64_t tb[64];
    for (int32_t k0 = 0; k0 < nb; k0 += 8) { /* eight bands' LUTs per read of the table */
        const int32_t m = nb - k0 < 8 ? nb - k0 : 8;
        for (int32_t k2 = k0; k2 < k0 + m; k2++) {
            const int64_t lo = E[k2], hi = E[k2 + 1] - 1;
            band_query(st, cb, q, a, b, k2, lo, hi, qs + (size_t)(k2 - k0) * d);
            if (k2 + 1 < nb) /* the band's first token: position >= pos - hi */
                tb[k2] = first_at(st->L->pos, 0, st->L->len, st->pos - hi);
        }
        kvq_rk_lut_multi(r->p.isa, st->L->tab[st->head], qs, m, S->scores + (size_t)k0 * K);
        for (int32_t k2 = k0; k2 < k0 + m; k2++)
            band_spread(st, cb, q, E[k2], E[k2 + 1] - 1, S->scores + (size_t)k2 * K);
        *cb_bytes += (double)m * (double)kvq_rk_table_bytes(st->L->tab[st->head]);
    }
    const kvq_rk_bands B = bands_of(st, K, nb, S->scores, tb);
    /* with the residual stage on, each candidate's group score goes to S->tmp: the stage
     * adds its part to it (resid.c) without finding the row's band again; under
     * its per-head rule (resid_group MAX) each candidate's group b K + code goes to
     * S->sel instead, its entry in every head's band LUTs (kvq_rt_head_band_luts) */
    const int hmax = r->p.resid_group == KVQ_GROUP_MAX;
    const int resid = kvq_rt_cb(H)->rq != NULL;
    const int64_t n = kvq_rk_topk_bands_grouped(&B, k, sel, resid && !hmax ? S->tmp : NULL,
                                                resid && hmax ? S->sel : NULL, S->work);
    Y->bsel_nb = nb; /* the LUTs stay in S->scores */
    for (int64_t j = 0; j < n; j++)
        sel[j] += (int32_t)s0;
    return n;
}

/* The residual stage over every candidate (resid_share 1: the first cut took them all,
 * kvq_rt_select without a selection): the (code, band) group b K + code of each candidate
 * row s_end + j, the bands kvq_rt_banded_select would use, from the runs' band searches
 * (kvq_rk_bands_cursor: a piece of rows at a time) instead of a band search per row and
 * head; then bsel_nb = nb, so the heads' band LUTs apply (kvq_rt_head_band_luts). Returns
 * nb, or 0 where kvq_rt_banded_select would not run (the caller scores otherwise). */
int32_t kvq_rt_banded_cursor(const rt_step *st, kvq_rk_bands *B, int64_t *tb,
                             kvq_rk_bands_cursor *cur)
{
    rt_scratch *S = st->S;
    rt_cb_scratch *Y = kvq_rt_cb_scr(S);
    const kvq_codebook_desc *D = kvq_codebook_get_desc(st->L->cb[st->head]);
    const int32_t K = D->k;
    if (!bands_apply(st, D))
        return 0;
    int64_t a, b;
    kvq_rt_candidate_distances(st, &a, &b);
    if (a < 1)
        a = 1;
    int64_t E[64];
    const int32_t nb = band_edges(a, b, E);
    const int64_t nk = (int64_t)nb * K;
    if (nk > S->cap) /* the cursor's [2 nb K] in S->work [2 cap] */
        return 0;
    for (int32_t k2 = 0; k2 + 1 < nb; k2++) /* the band's first token: position >= pos - hi */
        tb[k2] = first_at(st->L->pos, 0, st->L->len, st->pos - (E[k2 + 1] - 1));
    *B = bands_of(st, K, nb, NULL, tb);
    kvq_rk_bands_cursor_begin(B, S->work, cur);
    Y->bsel_nb = nb;
    return nb;
}

/* Under kvq_rt_banded_select's bands (bsel_nb > 0), each query head's own LUT of each
 * band, luts [gs, nb K]: head h's band k at h nb K + k K, the entry of group b K + code
 * (kvq_rk_topk_bands_grouped) the head's first-stage score of its rows. The tables of
 * kvq_rt_head_first_scores (band_query, kvq_rk_lut_multi: kvq_rk_lut's bits), built for
 * every row at once rather than searched per row. Returns nb K, or 0 when they do not
 * fit in cap floats or the bands are not the selection's (the caller scores
 * otherwise). */
int64_t kvq_rt_head_band_luts(const rt_step *st, float *luts, int64_t cap)
{
    const kvq_retrieval *r = st->r;
    const rt_scratch *S = st->S;
    rt_cb_scratch *Y = kvq_rt_cb_scr(S);
    const kvq_codebook *cb = st->L->cb[st->head];
    const kvq_codebook_desc *D = kvq_codebook_get_desc(cb);
    const int32_t d = r->d, K = D->k;
    if (Y->bsel_nb <= 0 || D->groups != 1)
        return 0;
    int64_t a, b, E[64];
    kvq_rt_candidate_distances(st, &a, &b);
    if (a < 1)
        a = 1;
    const int32_t nb = band_edges(a, b, E);
    const int64_t nk = (int64_t)nb * K;
    if (nb != Y->bsel_nb || (int64_t)r->gs * nk > cap)
        return 0;
    /* the (head, band) pairs i = h nb + k in order, eight LUTs per read of the table */
    const int32_t ni = r->gs * nb;
    float qs[8 * KVQ_ROPE_MAX_DIM];
    for (int32_t i0 = 0; i0 < ni; i0 += 8) {
        const int32_t m = ni - i0 < 8 ? ni - i0 : 8;
        for (int32_t i = i0; i < i0 + m; i++) {
            const int32_t k = i % nb;
            band_query(st, cb, st->q + (size_t)(i / nb) * d, a, b, k, E[k], E[k + 1] - 1,
                       qs + (size_t)(i - i0) * d);
        }
        kvq_rk_lut_multi(r->p.isa, st->L->tab[st->head], qs, m, luts + (size_t)i0 * K);
        for (int32_t i = i0; i < i0 + m; i++) {
            const int32_t k = i % nb;
            band_spread(st, cb, st->q + (size_t)(i / nb) * d, E[k], E[k + 1] - 1,
                        luts + (size_t)i * K);
        }
    }
    return nk;
}

/* Per head of the group, the first-stage score of each of rows[0..n) under that head's
 * query alone, out [gs, n]: under BANDS its code's entry in the LUT of its distance band
 * (the bands of kvq_rt_banded_scores, each head's pre-RoPE query rotated by the band's
 * mean rotation), else in the one LUT of the head's scoring query. The LUTs go to
 * S->scores ([nb, G K], free between the selection and the rerank); returns 0 when they
 * do not fit (the caller scores otherwise), 1 when done. */
int kvq_rt_head_first_scores(const rt_step *st, const int32_t *rows, int64_t n, float *out)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const kvq_codebook *cb = st->L->cb[st->head];
    const kvq_rk_table *tab = st->L->tab[st->head];
    const kvq_codebook_desc *D = kvq_codebook_get_desc(cb);
    const int32_t d = r->d, G = D->groups, K = D->k;
    const int64_t GK = (int64_t)G * K;
    int64_t a, b;
    kvq_rt_candidate_distances(st, &a, &b);
    if (a < 1)
        a = 1;
    int64_t E[64];
    const int bands = r->p.score_pos == KVQ_SCORE_BANDS && D->method != KVQ_CODEBOOK_VQ_POSTROPE;
    const int32_t nb = bands ? band_edges(a, b, E) : 1;
    if ((int64_t)nb * GK > S->cap)
        return 0;
    float qs[KVQ_ROPE_MAX_DIM];
    for (int32_t h = 0; h < r->gs; h++) {
        const float *q = st->q + (size_t)h * d;
        for (int32_t k = 0; k < nb; k++) {
            if (bands) {
                band_query(st, cb, q, a, b, k, E[k], E[k + 1] - 1, qs);
                kvq_rk_lut(r->p.isa, tab, qs, S->scores + (size_t)k * GK);
                band_spread(st, cb, q, E[k], E[k + 1] - 1, S->scores + (size_t)k * GK);
            } else {
                kvq_rt_scoring_query(st, cb, q, a, b, qs);
                kvq_rk_lut(r->p.isa, tab, qs, S->scores);
            }
        }
        float *o = out + (size_t)h * n;
        for (int64_t i = 0; i < n; i++) {
            int32_t k = 0;
            if (bands) {
                const int64_t delta = st->pos - st->L->pos[kvq_rt_row_token(st->H, rows[i])];
                k = band_of(delta < a ? a : delta, E, nb);
            }
            o[i] = kvq_rk_score_one(S->scores + (size_t)k * GK, G, K,
                                    kvq_rt_codes(st->H)->codes + (size_t)rows[i] * G);
        }
    }
    return 1;
}
