/*
 * resid.c — the residual stage of the codebook selector
 * (kvq_retrieval_params.resid_bits, resid_wide; kvq/runtime.h): each cached key keeps,
 * besides its code, its residual from the centroid quantized to b bits per channel
 * with one f32 scale, packed (ceil(d b / 8) + 4 bytes), by row (row_order.c moves them
 * with the rows: a selection's candidates come in runs of rows). Under ROPE the residual is kept
 * rotated by the token's position, r'_j = R_{p_j} (k_j - c_j) (the rotation is
 * orthogonal per pair, so quantizing r' costs what quantizing r does), else as is. At
 * a step the codebook picks ceil(resid_wide k2) candidates, k2 = ceil(rerank k) (k
 * without the exact rerank); the residual scores keep k2 of them, which the exact
 * rerank (rerank.c) then cuts to k. It tells apart the tokens that share a centroid (a
 * copy token and its neighbours) for a few bytes each instead of a key row.
 *
 * Score of candidate j (the fast rule, b = 1 or 2, d % 8 == 0):
 *   first_j + a_j (q . s_j)        (b = 1; b = 2: a_j (q . h_j) + a_j / 2 (q . l_j), two
 *                                   sign planes, the same table of [q, q / 2])
 * first_j the codebook's own first-stage score of row j (the LUT entry of its code, in
 * its distance band under --score-pos bands; 0 without a key-space centroid), a_j and
 * s_j in {-1, +1}^d the residual's scale and signs, q the group's summed query as the
 * exact step scores keys (q R_i under ROPE, q R_b otherwise): the centroid part as the
 * codebook scored it (selected from the (code, band) groups, the selection writes each
 * row's group score, kvq_rk_topk_bands_scored: no band search here), the residual's
 * part exactly. The sign dot is a byte-table lookup per 8 channels (kvq_rk_sign_table,
 * kvq_rk_resid_scores: one reference, an interleaved path, and an AVX-512 path that
 * forms each byte's entry from two nibble tables in registers; the same bits). For the
 * maximum over the group (group MAX, or resid_group MAX under group SUM) the same per
 * head: head h's own first-stage score (its LUT of the row's band: the row's (code,
 * band) group handed over by the selection, kvq_rt_head_band_luts, else searched,
 * kvq_rt_head_first_scores) + its q_h . r^, the best head's kept, each row's signs and
 * scale read once for all the heads (kvq_rk_resid_scores_max). Otherwise (b >= 4,
 * d % 8 != 0) the reconstruction rule, slower: q . (R_{p_j} c_j + r'^_j) in double, per
 * head for the maximum.
 *
 * Quantizer of a residual r [d] (kvq_rt_resid_quantize): b = 1: r^_c = +-a with
 * a = mean |r_c| (sign of r_c, + for 0); b >= 2: L = 2^b levels of step
 * s = 2 max |r_c| / L, index i_c = clamp(floor(r_c / s) + L/2, 0, L - 1),
 * r^_c = (i_c - L/2 + 1/2) s. Index c is stored in bits [c b, c b + b) of the row
 * (byte c b / 8, from its lowest bit), except at b = 2 with d % 8 == 0: two sign planes
 * (pack). The centroid is the key-space codebook's (G = 1);
 * with none (grouped query-aware codebooks, vq-postrope) the key itself is quantized.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/runtime.h"
#include "runtime/kernels/kernels.h"
#include "runtime/runtime_internal.h"
#include "runtime/select/codebook/codebook.h"

void kvq_rt_resid_quantize(const float *x, int32_t d, int32_t bits, uint8_t *idx, float *scale)
{
    if (bits == 1) {
        double a = 0;
        for (int32_t c = 0; c < d; c++)
            a += fabs((double)x[c]);
        *scale = (float)(a / d);
        for (int32_t c = 0; c < d; c++)
            idx[c] = x[c] >= 0 ? 1 : 0;
        return;
    }
    const int32_t L = 1 << bits;
    float m = 0;
    for (int32_t c = 0; c < d; c++)
        m = fabsf(x[c]) > m ? fabsf(x[c]) : m;
    const float s = 2.0f * m / (float)L;
    *scale = s;
    for (int32_t c = 0; c < d; c++) {
        int32_t i = s > 0 ? (int32_t)floorf(x[c] / s) + L / 2 : L / 2;
        idx[c] = (uint8_t)(i < 0 ? 0 : i > L - 1 ? L - 1 : i);
    }
}

void kvq_rt_resid_dequantize(const uint8_t *idx, float scale, int32_t d, int32_t bits, float *y)
{
    if (bits == 1) {
        for (int32_t c = 0; c < d; c++)
            y[c] = idx[c] ? scale : -scale;
        return;
    }
    const int32_t L = 1 << bits;
    for (int32_t c = 0; c < d; c++)
        y[c] = ((float)(idx[c] - L / 2) + 0.5f) * scale;
}

/* The key-space centroid of code c, or NULL (grouped codebooks have none; vq-postrope's
 * centroids are of rotated keys). */
static const float *centroid(const kvq_codebook *cb, int32_t c)
{
    const kvq_codebook_desc *D = kvq_codebook_get_desc(cb);
    const float *C = D->method == KVQ_CODEBOOK_VQ_POSTROPE ? NULL : kvq_codebook_key_codebook(cb);
    return C ? C + (size_t)c * D->dim : NULL;
}

size_t kvq_rt_resid_row_bytes(int32_t d, int32_t bits) { return ((size_t)d * bits + 7) / 8; }

int kvq_rt_resid_permute(const kvq_retrieval *r, rt_head *H, int64_t first, const int32_t *order,
                         int64_t n)
{
    const size_t rb = kvq_rt_resid_row_bytes(r->d, r->p.resid_bits);
    uint8_t *q8 = malloc(rb * (size_t)n);
    float *qs = malloc(sizeof(float) * (size_t)n);
    if (!q8 || !qs) {
        free(q8);
        free(qs);
        return 1;
    }
    rt_cb_head *C = kvq_rt_cb(H);
    for (int64_t i = 0; i < n; i++) {
        memcpy(q8 + (size_t)i * rb, C->rq + (size_t)(first + order[i]) * rb, rb);
        qs[i] = C->rqs[first + order[i]];
    }
    memcpy(C->rq + (size_t)first * rb, q8, rb * (size_t)n);
    memcpy(C->rqs + first, qs, sizeof(float) * (size_t)n);
    free(q8);
    free(qs);
    return 0;
}

/* Whether b = 2 is kept as two sign planes (kvq_rt_resid_planes) for d. */
static int planes(int32_t d, int32_t bits) { return bits == 2 && d % 8 == 0; }

/* idx [d] (each < 2^bits) packed into row [ceil(d bits / 8)] and back: b bits per channel
 * in channel order, except b = 2 with d % 8 == 0, kept as two sign planes (the high bit
 * of channel c at byte c / 8, bit c % 8, the low bit at byte d / 8 + c / 8): the fast rule
 * scores them as 2 d signs (kvq_rt_resid_stage). */
static void pack(const uint8_t *idx, int32_t d, int32_t bits, uint8_t *row)
{
    memset(row, 0, kvq_rt_resid_row_bytes(d, bits));
    if (planes(d, bits)) {
        for (int32_t c = 0; c < d; c++) {
            row[c / 8] |= (uint8_t)((idx[c] >> 1 & 1) << (c % 8));
            row[d / 8 + c / 8] |= (uint8_t)((idx[c] & 1) << (c % 8));
        }
        return;
    }
    for (int32_t c = 0; c < d; c++)
        row[(size_t)c * bits / 8] |= (uint8_t)(idx[c] << ((size_t)c * bits % 8));
}

static void unpack(const uint8_t *row, int32_t d, int32_t bits, uint8_t *idx)
{
    if (planes(d, bits)) {
        for (int32_t c = 0; c < d; c++)
            idx[c] = (uint8_t)((row[c / 8] >> (c % 8) & 1) << 1 | (row[d / 8 + c / 8] >> (c % 8) & 1));
        return;
    }
    const uint8_t m = (uint8_t)((1u << bits) - 1u);
    for (int32_t c = 0; c < d; c++)
        idx[c] = (uint8_t)(row[(size_t)c * bits / 8] >> ((size_t)c * bits % 8) & m);
}

void kvq_rt_resid_append(const kvq_retrieval *r, const kvq_codebook *cb, rt_head *H,
                         const float *keys, const int32_t *codes, const int64_t *pos,
                         int64_t first, int64_t n)
{
    const int32_t d = r->d, bits = r->p.resid_bits;
    const size_t rb = kvq_rt_resid_row_bytes(d, bits);
    float x[KVQ_ROPE_MAX_DIM];
    uint8_t idx[KVQ_ROPE_MAX_DIM];
    for (int64_t i = 0; i < n; i++) {
        const float *k = keys + (size_t)i * d;
        const float *c = centroid(cb, codes[i * kvq_codebook_get_desc(cb)->groups]);
        for (int32_t t = 0; t < d; t++)
            x[t] = c ? k[t] - c[t] : k[t];
        if (r->p.positions == KVQ_POSITIONS_ROPE) /* r' = R_p (k - c) */
            kvq_rt_rotate(r, x, pos[i], x);
        kvq_rt_resid_quantize(x, d, bits, idx, kvq_rt_cb(H)->rqs + first + i);
        pack(idx, d, bits, kvq_rt_cb(H)->rq + (size_t)(first + i) * rb);
    }
}

/* The reconstruction of row j (its code and residual by row) as the exact
 * step sees the key: R_p c + r'^ under ROPE, c + r^ otherwise.   y: [d] */
static void reconstruct(const rt_step *st, int64_t j, float *y)
{
    const kvq_retrieval *r = st->r;
    const rt_head *H = st->H;
    const kvq_codebook *cb = st->L->cb[st->head];
    const int32_t d = r->d, bits = r->p.resid_bits;
    const int64_t t = kvq_rt_row_token(H, j);
    uint8_t idx[KVQ_ROPE_MAX_DIM];
    float c2[KVQ_ROPE_MAX_DIM];
    const rt_cb_head *C = kvq_rt_cb(H);
    unpack(C->rq + (size_t)j * kvq_rt_resid_row_bytes(d, bits), d, bits, idx);
    kvq_rt_resid_dequantize(idx, C->rqs[j], d, bits, y);
    const float *c = centroid(cb, C->c.codes[(size_t)j * kvq_codebook_get_desc(cb)->groups]);
    if (!c)
        return;
    if (r->p.positions == KVQ_POSITIONS_ROPE) {
        kvq_rt_rotate(r, c, st->L->pos[t], c2);
        c = c2;
    }
    for (int32_t a = 0; a < d; a++)
        y[a] += c[a];
}

/* The codebook's first-stage score of each of rows[0..n) (what it was selected with),
 * into first [n] (0 without a key-space centroid): the per-(code, band) group scores
 * that kvq_rt_banded_select left in S->tmp, else the per-row scores of the score fill
 * (--score-pos bands), else the one LUT of the step (recomputed where the backend may
 * not have left it in the scratch's lut: a device, or the probe's memo). */
static void first_scores(const rt_step *st, const int32_t *rows, int64_t n, float *first)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    rt_codes_scratch *X = kvq_rt_codes_scr(S);
    rt_cb_scratch *Y = kvq_rt_cb_scr(S);
    const kvq_codebook *cb = st->L->cb[st->head];
    const kvq_codebook_desc *D = kvq_codebook_get_desc(cb);
    const int32_t G = D->groups, K = D->k, d = r->d;
    const uint16_t *codes = kvq_rt_codes(st->H)->codes;
    if (!centroid(cb, 0)) {
        memset(first, 0, sizeof(float) * (size_t)n);
        return;
    }
    if (Y->bsel_nb > 0) { /* kvq_rt_banded_select left them in S->tmp, in selection order
                           (rows are its selection, kvq_rt_select) */
        if (first != S->tmp)
            memcpy(first, S->tmp, sizeof(float) * (size_t)n);
        return;
    }
    if (r->p.score_pos == KVQ_SCORE_BANDS) {
        for (int64_t a = 0; a < n; a++)
            first[a] = S->scores[rows[a] - st->s_end];
        return;
    }
    if (S->mass_memo || kvq_rt_codes_ctx(r)->be->device != KVQ_RETRIEVAL_DEVICE_CPU) {
        float qs[KVQ_ROPE_MAX_DIM]; /* the group's scoring queries (codebook.c, S->qx) summed */
        memcpy(qs, S->qx, sizeof(float) * (size_t)d);
        for (int32_t g = 1; g < r->gs; g++)
            for (int32_t t = 0; t < d; t++)
                qs[t] += S->qx[(size_t)g * d + t];
        kvq_rk_lut(r->p.isa, st->L->tab[st->head], qs, X->lut);
    }
    for (int64_t a = 0; a < n; a++)
        first[a] = kvq_rk_score_one(X->lut, G, K, codes + (size_t)rows[a] * G);
}

/* Candidates whose groups the stage over every candidate makes at a time (4 KiB of
 * groups: they stay in L1 between the cursor and the kernel). */
#define RESID_PIECE 1024

/* The fast rule per head, for the maximum over the group: sc[a] = the maximum over
 * heads h (first score wins ties) of first_h + a (q_h . s), first_h the head's own
 * first-stage score, q [gs, d] the heads' queries as the exact step scores keys; one
 * kernel reads each candidate's residual once for all the heads (kvq_rk_resid_scores_max).
 * first_h: the entry of the row's (code, band) group, which kvq_rt_banded_select left in
 * S->sel, in the head's band LUTs (kvq_rt_head_band_luts), else the head's score of the
 * row found from its band (kvq_rt_head_first_scores). Returns 0 where it does not apply
 * (the caller reconstructs). */
static int fast_max_scores(const rt_step *st, const float *q, const int32_t *rows, int64_t n,
                           float *sc)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    rt_cb_scratch *Y = kvq_rt_cb_scr(S);
    const int32_t d = r->d, gs = r->gs, bits = r->p.resid_bits, dq = bits * d;
    if (!centroid(st->L->cb[st->head], 0))
        return 0;
    /* the heads' band LUTs [gs, nb K] after q in the scratch's rr ([gs + 1, d + cap]:
     * (gs + 1) cap floats free, where S->scores' cap would not hold gs nb K at short contexts) */
    float *luts = Y->rr + (size_t)(gs + 1) * d;
    const int64_t lcap = (int64_t)(gs + 1) * S->cap;
    const float *first = luts;   /* [gs, nb K] */
    const int32_t *grp = S->sel; /* [n] the rows' groups */
    size_t fs = (size_t)kvq_rt_head_band_luts(st, luts, lcap);
    /* every candidate (resid_share 1: the first cut selected nothing, rows ascending): the
     * groups from the runs, a piece at a time (kvq_rt_banded_cursor), rather than a band
     * search per row */
    kvq_rk_bands B;
    kvq_rk_bands_cursor cur;
    int64_t tb[64];
    int pieces = 0;
    if (fs == 0 && Y->bsel_nb <= 0 && n == st->nc && rows[0] == st->s_end &&
        rows[n - 1] == st->s_end + n - 1 && kvq_rt_banded_cursor(st, &B, tb, &cur) > 0) {
        fs = (size_t)kvq_rt_head_band_luts(st, luts, lcap);
        pieces = fs > 0;
        if (fs == 0)
            Y->bsel_nb = 0; /* (the LUTs do not fit: scored as without the groups) */
    }
    if (fs == 0) {
        float *f = luts; /* [gs, n] */
        if (!kvq_rt_head_first_scores(st, rows, n, f))
            return 0;
        first = f;
        fs = (size_t)n;
        grp = NULL;
    }
    const size_t tl = KVQ_RK_SIGN_TABLE_LEN(dq);
    float qh[KVQ_ROPE_MAX_DIM];
    for (int32_t h = 0; h < gs; h++) {
        memcpy(qh, q + (size_t)h * d, sizeof(float) * (size_t)d);
        for (int32_t t = d; t < dq; t++)
            qh[t] = 0.5f * qh[t - d];
        kvq_rk_sign_table(qh, dq, Y->stab + (size_t)h * tl);
    }
    const rt_cb_head *C = kvq_rt_cb(st->H);
    if (pieces) { /* each piece's groups made in L1 and scored at once: the same bits */
        int32_t g[RESID_PIECE];
        for (int64_t a = 0; a < n; a += RESID_PIECE) {
            const int64_t m = n - a < RESID_PIECE ? n - a : RESID_PIECE;
            kvq_rk_bands_cursor_next(&cur, m, g);
            kvq_rk_resid_scores_max(r->p.isa, Y->stab, gs, dq / 8, C->rq, C->rqs, rows + a, first,
                                    fs, g, m, sc + a);
        }
        return 1;
    }
    kvq_rk_resid_scores_max(r->p.isa, Y->stab, gs, dq / 8, C->rq, C->rqs, rows, first, fs, grp, n,
                            sc);
    return 1;
}

int64_t kvq_rt_resid_count(const kvq_retrieval *r, int64_t k, int64_t nc)
{
    if (r->p.resid_bits <= 0 || !(r->p.resid_wide > 1.0) || k >= nc)
        return k;
    /* at most resid_share of the candidates at 1 bit, never fewer than k: the stage's
     * bytes stay under resid_share (d / 8 + 4) per key at large budgets; at 2 bits the
     * share that reads as many bytes, resid_share (d / 8 + 4) / (d 2 / 8 + 4) (0.3 of
     * the candidates at d 64 and share 0.5); b >= 4 (the slow rule, an experiment) keep
     * 1 bit's share */
    double want = ceil(r->p.resid_wide * (double)k);
    const double row1 = (double)r->d / 8.0 + 4.0,
                 rowb = r->p.resid_bits == 2 ? (double)r->d * 2 / 8.0 + 4.0 : row1;
    const double cap = ceil(r->p.resid_share * row1 / rowb * (double)nc);
    want = want > cap ? (cap > (double)k ? cap : (double)k) : want;
    return want >= (double)nc ? nc : (int64_t)want;
}

int64_t kvq_rt_resid_stage(const rt_step *st, int32_t *rows, int64_t n, int64_t keep,
                           double *sel_bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    rt_cb_scratch *Y = kvq_rt_cb_scr(S);
    const int32_t d = r->d, gs = r->gs, bits = r->p.resid_bits;
    if (n <= 0)
        return 0;
    *sel_bytes += (double)n * ((double)d * bits / 8.0 + 4.0);
    if (keep >= n)
        return n;
    /* the group's queries as the exact step scores keys: q R_i (ROPE) or q R_b, summed
     * in head order, or each head's for the maximum */
    const int max = r->p.group == KVQ_GROUP_MAX || r->p.resid_group == KVQ_GROUP_MAX;
    const int32_t nq = max ? gs : 1;
    const float *qsrc = r->p.positions == KVQ_POSITIONS_ROPE ? S->qi : S->qb;
    float *q = Y->rr; /* [gs, d] */
    memcpy(q, qsrc, sizeof(float) * (size_t)(max ? gs : 1) * d);
    for (int32_t g = 1; !max && g < gs; g++)
        for (int32_t t = 0; t < d; t++)
            q[t] += qsrc[(size_t)g * d + t];
    float *sc = S->tmp; /* [n] */
    const int fast = (bits == 1 || (planes(d, bits) && 2 * d <= KVQ_ROPE_MAX_DIM)) && d % 8 == 0;
#ifdef KVQ_RT_RESID_SLOW /* diagnostic build: the reconstruction rule at every b (docs/QUALITY.md
                           "Why the passkey prompt is missed") */
    if (0) {
#else
    if (fast && !max) { /* the fast rule */
#endif
        /* b = 2: the level (i - 3/2) a of i = 2 h + l is a (2 h - 1) + a/2 (2 l - 1), two
         * sign planes (pack), scored as 2 d signs against the query [q, q / 2] */
        const int32_t dq = bits * d;
        float own[KVQ_RK_SIGN_TABLE_LEN(KVQ_ROPE_MAX_DIM)], *tab = own;
        rt_sign_memo *sm = S->lg_memo ? S->lg_memo->sign : NULL;
        first_scores(st, rows, n, sc);
        for (int32_t t = d; t < dq; t++)
            q[t] = 0.5f * q[t - d];
        if (sm && sm->have && !memcmp(sm->q, q, sizeof(float) * (size_t)d))
            tab = sm->tab; /* the same bits of q: the same table */
        else if (sm) {
            kvq_rk_sign_table(q, dq, sm->tab);
            memcpy(sm->q, q, sizeof(float) * (size_t)d);
            sm->have = 1;
            tab = sm->tab;
        } else
            kvq_rk_sign_table(q, dq, tab);
        kvq_rk_resid_scores(r->p.isa, tab, dq / 8, kvq_rt_cb(st->H)->rq, kvq_rt_cb(st->H)->rqs,
                            rows, sc, n, sc);
    } else if (!(fast && max && fast_max_scores(st, q, rows, n, sc))) {
        float y[KVQ_ROPE_MAX_DIM];
        for (int64_t a = 0; a < n; a++) {
            reconstruct(st, rows[a], y);
            sc[a] = kvq_rt_group_best_dot(q, nq, d, y);
        }
    }
    const int64_t m = kvq_rk_topk(r->p.isa, sc, n, keep, S->sel, S->work);
    for (int64_t i = 0; i < m; i++) /* S->sel ascending: compacts in place */
        rows[i] = rows[S->sel[i]];
    return m;
}
