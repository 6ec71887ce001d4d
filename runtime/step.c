/*
 * step.c — one decode step of retrieval attention (kvq_rt_step) and the exact prefill
 * of a chunk: the sinks, the selector's choice (kvq_rt_select: runtime/select/), the
 * window, and exact attention over their union; the step's statistics and, with
 * measure, the comparison with exact attention over every visible token.
 */
#include <math.h>
#include <string.h>

#include <cblas.h>

#include "kvq/half.h"
#include "kvq/runtime.h"
#include "kvq/util.h"
#include "runtime/runtime_internal.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/rk.h"

int64_t kvq_rt_window_start(const kvq_retrieval *r, int32_t layer, int64_t n)
{
    const kvq_model_config c = {.sliding_window = r->sliding_window,
                                .sliding_from = r->sliding_from};
    return kvq_model_window_start(&c, layer, n);
}

void kvq_rt_softcap(float *x, int32_t rows, int64_t n, int64_t ld, float c)
{
    if (!(c > 0))
        return;
    for (int32_t g = 0; g < rows; g++)
        for (int64_t j = 0; j < n; j++)
            x[(size_t)g * ld + j] = c * tanhf(x[(size_t)g * ld + j] / c);
}

void kvq_rt_step_key(const rt_step *st, int64_t j, float *y)
{
    const kvq_retrieval *r = st->r;
    if (r->kvc) /* the compressed cache's row (runtime/cache/kvc_retr.c) */
        kvq_rt_kvc_key(st, j, y);
    else if (st->S->ktok)
        memcpy(y, st->S->ktok + (size_t)kvq_rt_row_token(st->H, j) * r->d,
               sizeof(float) * (size_t)r->d);
    else
        kvq_rt_key_rotated(r, st->L, st->H, j, y);
}

/* Exact attention (exact RoPE) of the group's queries over the m tokens [lo, lo + m)
 * whose rotated keys are krot [m, d]: probabilities into p [gs, ld] and outputs into
 * o [gs, d]. qi: [gs, d] rotated queries. */
static void exact_attention(const kvq_retrieval *r, const rt_head *H, const float *krot,
                            const float *qi, int64_t lo, int64_t m, float *p, int64_t ld, float *o)
{
    kvq_rk_logits(r->p.isa, qi, r->gs, r->d, krot, KVQ_DT_F32, r->d, NULL, m, r->scale, p, ld);
    kvq_rt_softcap(p, r->gs, m, ld, r->softcap);
    kvq_rk_softmax(r->p.isa, p, r->gs, m, ld);
    kvq_rk_mix(r->p.isa, p, r->gs, ld, (const char *)H->v + (size_t)lo * r->d * r->es,
               r->p.cache_dtype, r->d, NULL, m, r->d, o);
}

/* The group's queries rotated by R_b (qb) and by their position (qi). */
static void rotate_queries(const kvq_retrieval *r, const float *q, int64_t pos, rt_scratch *S)
{
    const int32_t d = r->d;
    for (int32_t g = 0; g < r->gs; g++) {
        kvq_rk_rotate(q + (size_t)g * d, r->bcos, r->bsin, (int)r->rope.layout, d,
                      S->qb + (size_t)g * d);
        kvq_rt_rotate(r, q + (size_t)g * d, pos, S->qi + (size_t)g * d);
    }
}

/* Head g's exact output norm squared: sum over t, ascending, of ofull[g, t]^2 in double. */
static double exact_norm(const rt_scratch *S, int32_t d, int32_t g)
{
    double f = 0;
    for (int32_t t = 0; t < d; t++) {
        const double y = S->ofull[(size_t)g * d + t];
        f += y * y;
    }
    return f;
}

void kvq_rt_exact_norms(const rt_scratch *S, int32_t gs, int32_t d, double *f2)
{
    for (int32_t g = 0; g < gs; g++)
        f2[g] = exact_norm(S, d, g);
}

void kvq_rt_measure_output(const rt_scratch *S, int32_t gs, int32_t d, int64_t lo, int64_t nv,
                           const int32_t *att, int64_t m, const float *o, const double *f2,
                           rt_sums *z)
{
    double mass = 0, rel = 0;
    /* each head's mass summed in att order, and its squared error in t order; up to four
     * heads' sums side by side (their adds do not wait on each other; a group of fewer
     * than four repeats its last head in the spare sums, never read) */
    for (int32_t g0 = 0; g0 < gs; g0 += 4) {
        const int32_t ng = gs - g0 < 4 ? gs - g0 : 4;
        const int32_t i1 = ng > 1 ? 1 : 0, i2 = ng > 2 ? 2 : ng - 1, i3 = ng > 3 ? 3 : ng - 1;
        const float *p0 = S->pfull + (size_t)g0 * nv;
        const float *p1 = p0 + (size_t)i1 * nv, *p2 = p0 + (size_t)i2 * nv;
        const float *p3 = p0 + (size_t)i3 * nv;
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (int64_t a = 0; a < m; a++) {
            const int64_t j = att[a] - lo;
            s0 += p0[j];
            s1 += p1[j];
            s2 += p2[j];
            s3 += p3[j];
        }
        const size_t h0 = (size_t)g0 * d, h1 = (size_t)(g0 + i1) * d;
        const size_t h2 = (size_t)(g0 + i2) * d, h3 = (size_t)(g0 + i3) * d;
        double e0 = 0, e1 = 0, e2 = 0, e3 = 0;
        for (int32_t t = 0; t < d; t++) {
            const double x0 = (double)o[h0 + t] - S->ofull[h0 + t];
            const double x1 = (double)o[h1 + t] - S->ofull[h1 + t];
            const double x2 = (double)o[h2 + t] - S->ofull[h2 + t];
            const double x3 = (double)o[h3 + t] - S->ofull[h3 + t];
            e0 += x0 * x0;
            e1 += x1 * x1;
            e2 += x2 * x2;
            e3 += x3 * x3;
        }
        const double sv[4] = {s0, s1, s2, s3}, ev[4] = {e0, e1, e2, e3};
        for (int32_t i = 0; i < ng; i++) {
            const double f = f2 ? f2[g0 + i] : exact_norm(S, d, g0 + i);
            mass += sv[i];
            rel += f > 0 ? sqrt(ev[i] / f) : 0.0;
        }
    }
    z->measured++;
    z->recall_mass += mass / gs;
    z->out_rel_err += rel / gs;
}

/* Measurement of one step (measure = 1): exact attention over every visible token
 * (kvq_rt_measure_output's figures), and the oracle's selection of the same size
 * against the step's selection sel [nsel]. */
static void measure_step(const rt_step *st, const int32_t *att, int64_t m, int64_t nsel,
                         const int32_t *sel)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const int32_t d = r->d, gs = r->gs;
    const int64_t lo = st->lo, nv = st->nvis - lo; /* the visible tokens [lo, nvis) */
    if (r->kvc) { /* over the rows the compressed cache holds (kvc_retr.c) */
        kvq_rt_kvc_exact(st);
    } else {
        for (int64_t j = lo; j < st->nvis; j++)
            kvq_rt_key_rotated(r, st->L, st->H, j, S->krot + (size_t)(j - lo) * d);
        exact_attention(r, st->H, S->krot, S->qi, lo, nv, S->pfull, nv, S->ofull);
    }
    kvq_rt_measure_output(S, gs, d, lo, nv, att, m, S->o, NULL, &S->sums);
    double recall = 1.0;
    if (nsel < st->nc && nsel > 0) {
        double unused = 0, unused2 = 0;
        const int64_t no = kvq_rt_select(st, KVQ_SELECT_ORACLE, nsel, S->osel, &unused, &unused2);
        /* both lists ascending: count the common indices */
        int64_t a = 0, b = 0, common = 0;
        while (a < nsel && b < no) {
            if (sel[a] == S->osel[b]) {
                common++;
                a++;
                b++;
            } else if (sel[a] < S->osel[b]) {
                a++;
            } else {
                b++;
            }
        }
        recall = (double)common / (double)nsel;
    }
    S->sums.recall_topk += recall;
}

/* One retrieval step: query row `row` of the chunk (position pos, nvis tokens
 * visible) for KV head h; writes the group's outputs [gs, d] to out. */
void kvq_rt_step(const kvq_retrieval *r, int32_t layer, int32_t h, const float *q, int64_t pos,
                 int64_t nvis, int record, rt_scratch *S, float *out, int64_t ld_out)
{
    const rt_layer *L = &r->layer[layer];
    rt_head *H = &L->head[h];
    const int32_t d = r->d, gs = r->gs;
    rt_step st = {.r = r,
                  .L = L,
                  .H = H,
                  .layer = layer,
                  .head = h,
                  .q = q,
                  .pos = pos,
                  .nvis = nvis,
                  .S = S};
    st.lo = kvq_rt_window_start(r, layer, nvis);
    st.s_end = st.lo + (r->p.sink < nvis - st.lo ? r->p.sink : nvis - st.lo);
    st.w_beg = nvis - r->window > st.s_end ? nvis - r->window : st.s_end;
    st.nc = st.w_beg - st.s_end;
    rotate_queries(r, q, pos, S);

    /* ---- selection: sinks, the chosen candidates, the window (ascending) */
    double sel_bytes = 0, cb_bytes = 0;
    int32_t *att = S->att;
    int64_t m = 0;
    for (int64_t j = st.lo; j < st.s_end; j++)
        att[m++] = (int32_t)j;
    const int64_t k = kvq_budget_tokens(&r->p.budget, nvis - st.lo);
    const int64_t nsel = kvq_rt_select(&st, r->p.selector, k, att + m, &sel_bytes, &cb_bytes);
    m += nsel;
    if (record) { /* the chunk's last row: one writer per head */
        if (nsel > H->sel_cap) {
            int64_t cap = H->sel_cap ? 2 * H->sel_cap : 64;
            while (cap < nsel)
                cap *= 2;
            /* a failed grow only loses the record kept for tests */
            if (kvq_rt_grow((void **)&H->sel, (size_t)cap * sizeof *H->sel) &&
                kvq_rt_grow((void **)&H->sel_tok, (size_t)cap * sizeof *H->sel_tok))
                H->sel_cap = cap;
        }
        H->n_sel = nsel <= H->sel_cap ? nsel : 0;
        if (H->n_sel)
            memcpy(H->sel, att + (st.s_end - st.lo), sizeof *H->sel * (size_t)H->n_sel);
    }
    /* Non-local under WROPE: the selection and the sinks that lie outside the last
     * `window` tokens. Sinks inside them (early in a sequence, when the window reaches
     * back to the sinks; then nothing is selected) are local: exact RoPE, as WRoPE
     * defines for i - j < w. att stays [far sinks][selection][near sinks][window]. */
    int64_t far_sinks = 0;
    for (int64_t j = st.lo; j < st.s_end && j < nvis - r->window; j++)
        far_sinks++;
    const int64_t m_far = far_sinks + nsel;
    for (int64_t j = st.w_beg; j < nvis; j++)
        att[m++] = (int32_t)j;

    /* ---- exact attention over the union: logits, softmax, weighted sum of values
     * (two passes: on the development machine this beat kvq_rk_attend_rows, the fused
     * one-pass kernel, by a few percent; bench_decode --attn compares them) */
    const int32_t *sel = att + (st.s_end - st.lo); /* the selection, after the sinks */
    if (r->kvc) { /* over a compressed cache: its pruned tokens dropped, its rows read */
        if (r->p.measure) { /* the selection as made, for the recall */
            memcpy(S->msel, sel, sizeof *sel * (size_t)nsel);
            sel = S->msel;
        }
        m = kvq_rt_kvc_filter(&st, att, m);
        kvq_rt_kvc_attend(&st, att, m);
    } else {
        kvq_rt_attend_union(&st, att, m, m_far);
    }
    for (int32_t g = 0; g < gs; g++)
        memcpy(out + (size_t)g * ld_out, S->o + (size_t)g * d, sizeof(float) * (size_t)d);

    /* ---- statistics */
    if (st.nc > 0) {
        S->sums.steps++;
        S->sums.visible += (double)(nvis - st.lo);
        S->sums.attended += (double)m;
        S->sums.bytes_read += sel_bytes + (double)m * 2.0 * d * r->es;
        S->sums.bytes_full += (double)(nvis - st.lo) * 2.0 * d * r->es;
        S->sums.bytes_codebook += cb_bytes;
        if (r->p.measure)
            measure_step(&st, att, m, nsel, sel);
    }
}

/* Exact attention of a prefill chunk for KV head h, as matrix products (the full
 * attention backend's method): per query head S = (Q R) (K R)^T / sqrt(d) [n, T] with
 * cblas_sgemm, a causal softmax per row, O = S V. */
void kvq_rt_prefill_head(const kvq_retrieval *r, const rt_layer *L, int32_t h,
                         const kvq_attn_call *c, int64_t past, rt_scratch *S)
{
    if (r->kvc) { /* no rows of its own: the compressed cache's (kvc_retr.c) */
        kvq_rt_kvc_prefill(r, h, c, past, S);
        return;
    }
    const rt_head *H = &L->head[h];
    const int32_t d = r->d;
    const int64_t T = past + c->n;
    const float *K = S->krot; /* rotated keys [T, d]: under ROPE the cache's (f16 converted) */
    if (r->keys_rotated && r->es == 4)
        K = H->k;
    else if (r->keys_rotated)
        kvq_f16_to_f32((const uint16_t *)H->k, S->krot, (size_t)T * d);
    else
        for (int64_t j = 0; j < T; j++)
            kvq_rt_key_rotated(r, L, H, j, S->krot + (size_t)j * d);
    const float *V = H->v;
    if (r->es == 2) {
        kvq_f16_to_f32((const uint16_t *)H->v, S->vbuf, (size_t)T * d);
        V = S->vbuf;
    }
    kvq_rt_prefill_rows(r, c, h, K, V, past, S);
}

void kvq_rt_prefill_rows(const kvq_retrieval *r, const kvq_attn_call *c, int32_t h,
                         const float *K, const float *V, int64_t pe, rt_scratch *S)
{
    const int32_t d = r->d, gs = r->gs, nh = r->n_heads;
    const int64_t n = c->n, T = pe + n, past = pe;
    const float scale = r->scale; /* the model's (1/sqrt(d) unless it says) */
    for (int32_t g = 0; g < gs; g++) {
        for (int64_t i = 0; i < n; i++)
            kvq_rt_rotate(r, c->q + ((size_t)i * nh + (size_t)h * gs + g) * d, c->pos[i],
                          S->qpre + (size_t)i * d);
        float *P = S->pre; /* [n, T] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)T, d, scale, S->qpre, d,
                    K, d, 0.0f, P, (int)T);
        for (int64_t i = 0; i < n; i++) { /* causal, over the sliding window if any */
            const int64_t nvis = past + i + 1, lo = kvq_rt_window_start(r, c->layer, nvis);
            float *row = P + (size_t)i * T;
            kvq_rt_softcap(row + lo, 1, nvis - lo, T, r->softcap);
            kvq_rk_softmax(r->p.isa, row + lo, 1, nvis - lo, T);
            memset(row, 0, sizeof(float) * (size_t)lo);
            memset(row + nvis, 0, sizeof(float) * (size_t)(T - nvis));
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, d, (int)T, 1.0f, P, (int)T,
                    V, d, 0.0f, c->out + (size_t)(h * gs + g) * d, nh * d);
    }
}

/* Logits of att[a0..a1) into columns [a0, a1) of S->logits [gs, m]: rotated keys and
 * q R_i (rot), or the stored keys and q R_b. */
static void logits_span(const rt_step *st, const int32_t *att, int64_t a0, int64_t a1, int64_t m,
                        int rot, float scale)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const int32_t d = r->d;
    if (a1 <= a0)
        return;
    const rt_logit_memo *M = S->lg_memo;
    if (M) { /* the probe's: the kernels' values of these rows, gathered */
        for (int32_t g = 0; g < r->gs; g++)
            for (int64_t a = a0; a < a1; a++)
                S->logits[(size_t)g * m + a] =
                    rot ? M->lgi[(size_t)g * M->nv + att[a] - M->lo]
                        : M->lgb[(size_t)g * M->nv + att[a] - M->lo] * scale;
        return;
    }
    if (rot && r->keys_rotated && !S->ktok) { /* the stored rows are k_j R_{p_j} */
        kvq_rk_logits(r->p.isa, S->qi, r->gs, d, st->H->k, r->p.cache_dtype, d, att + a0, a1 - a0,
                      scale, S->logits + a0, m);
    } else if (rot) {
        for (int64_t a = a0; a < a1; a++)
            kvq_rt_step_key(st, att[a], S->krot + (size_t)(a - a0) * d);
        kvq_rk_logits(r->p.isa, S->qi, r->gs, d, S->krot, KVQ_DT_F32, d, NULL, a1 - a0, scale,
                      S->logits + a0, m);
    } else {
        kvq_rk_logits(r->p.isa, S->qb, r->gs, d, st->H->k, r->p.cache_dtype, d, att + a0, a1 - a0,
                      scale, S->logits + a0, m);
    }
}

void kvq_rt_attend_union(const rt_step *st, const int32_t *att, int64_t m, int64_t m_far)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const float scale = r->scale;
    const int rope = r->p.positions == KVQ_POSITIONS_ROPE;
    /* columns [c0, c1) hold the rerank's logits (within the far rows under WROPE) */
    const int64_t c0 = S->rr_kept ? st->s_end - st->lo : 0, c1 = c0 + S->rr_kept;
    const int64_t far_end = rope ? m : m_far;
    logits_span(st, att, 0, S->rr_kept ? c0 : far_end, m, rope, scale);
    if (S->rr_kept)
        logits_span(st, att, c1, far_end, m, rope, scale);
    if (!rope) /* WROPE: the window and near sinks with exact RoPE */
        logits_span(st, att, m_far, m, m, 1, scale);
    S->rr_kept = 0;
    kvq_rt_softcap(S->logits, r->gs, m, m, r->softcap);
    kvq_rk_softmax(r->p.isa, S->logits, r->gs, m, m);
    kvq_rk_mix(r->p.isa, S->logits, r->gs, m, st->H->v, r->p.cache_dtype, r->d, att, m, r->d,
               S->o);
}
