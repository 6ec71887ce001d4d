/*
 * profile_fast.c — the LeanKV and PATS grids on one (sequence, KV head) of a capture,
 * computed from shared intermediates (the reference, one simulated cache per setting,
 * is run_job in profile.c; the contract is kvq/thresholds.h "Quality").
 *
 *   exact pass   the prompt's query rows attend exactly, in blocks of rows with SGEMM
 *                (QK^T, then the causal softmax); their column sums are the prompt
 *                significance every LeanKV setting starts from. The measured
 *                continuation rows get their exact outputs the same way (PV by SGEMM).
 *   LeanKV       a token is, in any setting's cache at any step, one of four versions:
 *                K8V4 of the exact row (HIGH), K4V2 of the exact row (LOW at the end of
 *                the prompt), K4V2 of the K8V4 row (moved to LOW later), or pruned.
 *                The logits of every continuation query against the three stored
 *                versions, and their exponentials under one shared maximum, are
 *                computed once per block of rows (SGEMM); each setting then runs
 *                Algorithm 1 on its own classes and significance sums, and per query row
 *                only gathers the exponential of each token's current version,
 *                normalises, and adds the probabilities to its sums: no logit, no
 *                exponential and (except on measured rows) no PV per setting; a measured
 *                row's output sum is kept from the previous setting and updated by the
 *                tokens whose version changed (lk_mix).
 *   PATS         truncation changes every row, and PATS has no state that depends on
 *                the attention, so only the measured rows attend: per setting, K and V
 *                gathered from the truncated copies at each bit level, SGEMM for QK^T
 *                and PV.
 * The probabilities are f32 exponentials summed in f64 as in the reference; logits
 * come from SGEMM instead of a sequential dot product, so figures agree with the
 * reference to rounding (tests/test_thresholds.c compares them).
 */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kvq/half.h"
#include "thresholds/lk_kernels.h"
#include "thresholds/thresholds_internal.h"

int64_t thr_sample_rows(const int64_t *cand, int64_t n_cand, int64_t sample, int64_t *out)
{
    if (sample <= 0 || sample >= n_cand) {
        memcpy(out, cand, sizeof(int64_t) * (size_t)(n_cand > 0 ? n_cand : 0));
        return n_cand > 0 ? n_cand : 0;
    }
    for (int64_t i = 0; i < sample; i++) /* the middle of each of `sample` equal parts */
        out[i] = cand[(2 * i + 1) * n_cand / (2 * sample)];
    return sample;
}

int64_t thr_thin_count(int64_t nm, int64_t nc)
{
    const int64_t q = nm / 4 > 1 ? nm / 4 : 1;
    return nm >= nc || q >= nm ? nm : q;
}

int64_t thr_sample_complement(const int64_t *cand, int64_t n_cand, int64_t sample, int64_t *out)
{
    if (sample <= 0 || sample >= n_cand)
        return 0;
    int64_t m = 0;
    for (int64_t k = 0, i = 0; k < n_cand; k++) { /* thr_sample_rows' picks, ascending */
        if (i < sample && k == (2 * i + 1) * n_cand / (2 * sample)) {
            i++;
            continue;
        }
        out[m++] = cand[k];
    }
    return m;
}

/* ==========================================================================
 * Exact attention of a list of rows (blocks, SGEMM)
 * ========================================================================== */

/* Rows per SGEMM block so that a block's scores over T tokens stay near 4 MiB; at most
 * 16 for exact_rows (a block's scores reach its last row: fewer rows, less of the
 * causal triangle computed in vain). */
static int64_t block_rows(int64_t T, int32_t gs)
{
    int64_t b = (int64_t)(1 << 20) / ((int64_t)gs * (T > 0 ? T : 1));
    return b < 4 ? 4 : b > 128 ? 128 : b;
}

static int64_t exact_block_rows(int64_t T, int32_t gs)
{
    const int64_t b = block_rows(T, gs);
    return b < 16 ? b : 16;
}

/* Rows per LeanKV block: the exponentials of a block against the three versions, which
 * every setting reads in turn, stay near 512 KiB (in a core's L2). */
static int64_t lk_block_rows(int64_t T, int32_t gs)
{
    int64_t b = (int64_t)(1 << 19) / (12 * (int64_t)gs * (T > 0 ? T : 1));
    return b < 4 ? 4 : b > 128 ? 128 : b;
}

/* Packs the queries of rows [nr] into Qp [nr, gs, d]. */
static void pack_queries(const thr_rows *R, const int64_t *rows, int64_t nr, float *Qp)
{
    const size_t gd = (size_t)R->gs * R->d;
    for (int64_t i = 0; i < nr; i++)
        memcpy(Qp + (size_t)i * gd, R->q + (size_t)rows[i] * gd, sizeof(float) * gd);
}

/* S [nr * gs, ld] = Qp K[0:T]^T / sqrt(d) in the first T columns. */
static void scores_ld(const thr_rows *R, const float *Qp, int64_t nr, const float *K, int64_t T,
                      float *S, int64_t ld)
{
    const float scale = (float)(1.0 / sqrt((double)R->d));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(nr * R->gs), (int)T, R->d, scale,
                Qp, R->d, K, R->d, 0.0f, S, (int)ld);
}

static void scores(const thr_rows *R, const float *Qp, int64_t nr, const float *K, int64_t T,
                   float *S)
{
    scores_ld(R, Qp, nr, K, T, S, T);
}

/* Causal softmax of one score row over [0, len) in place (zeros after len): the f32
 * exponentials (the kernels' thr_lk_exp1), their f64 sum, scaled by its inverse. */
static void softmax_row(const thr_lk_kernels *K, float *s, int64_t len, int64_t T)
{
    const double sum = K->expsum(s, s, K->maxf(s, len), len);
    const float inv = (float)(1.0 / sum);
    if (len > 0) /* s[j] *= inv, one IEEE multiply each, vectorized */
        cblas_sscal((int)len, inv, s, 1);
    if (T > len)
        memset(s + len, 0, sizeof(float) * (size_t)(T - len));
}

/* Exact attention of rows [nr] (ascending): adds each row's probabilities of the tokens
 * before it into accP [gs, n] (when not NULL) and writes its outputs to out [nr, gs, d]
 * (when not NULL). Scratch: Qp [blk, gs, d], S [blk * gs, n]. K: the softmax kernels. */
static void exact_rows(const thr_lk_kernels *K, const thr_rows *R, const int64_t *rows,
                       int64_t nr, double *accP, float *out, float *Qp, float *S)
{
    const int32_t gs = R->gs, d = R->d;
    for (int64_t b0 = 0; b0 < nr;) {
        int64_t nb = exact_block_rows(R->n, gs);
        nb = nb > nr - b0 ? nr - b0 : nb;
        const int64_t Tb = rows[b0 + nb - 1] + 1;
        pack_queries(R, rows + b0, nb, Qp);
        scores(R, Qp, nb, R->k, Tb, S);
        for (int64_t i = 0; i < nb; i++)
            for (int32_t g = 0; g < gs; g++) {
                float *s = S + ((size_t)i * gs + g) * Tb;
                const int64_t t = rows[b0 + i];
                softmax_row(K, s, t + 1, Tb);
                double *a = accP ? accP + (size_t)g * R->n : NULL;
                for (int64_t j = 0; a && j < t; j++)
                    a[j] += s[j];
            }
        if (out)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(nb * gs), d, (int)Tb,
                        1.0f, S, (int)Tb, R->v, d, 0.0f, out + (size_t)b0 * gs * d, d);
        b0 += nb;
    }
}

/* Relative error of the outputs o against ex, [gs, d] each, into a (thresholds/thresholds_internal.h). */
void thr_add_rel_err(const float *o, const float *ex, int32_t gs, int32_t d, thr_acc *a)
{
    for (int32_t g = 0; g < gs; g++) {
        const float *x = o + (size_t)g * d, *y = ex + (size_t)g * d;
        double e2 = 0, f2 = 0;
        for (int32_t c = 0; c < d; c++) {
            e2 += ((double)x[c] - y[c]) * ((double)x[c] - y[c]);
            f2 += (double)y[c] * y[c];
        }
        if (f2 > 0) {
            const double r = sqrt(e2 / f2);
            a->err_sum += r;
            a->err_sq += r * r;
            a->err_n += 1;
        }
    }
}

/* ==========================================================================
 * The job's shared data
 * ========================================================================== */

enum { V_PRUNED, V_HIGH, V_LOWA, V_LOWB, N_VER };

typedef struct fjob {
    const thr_rows *R;
    int64_t *qcum;       /* [n] query rows at or before j */
    int64_t *crow, nc;   /* continuation query rows */
    int64_t *mrow, nm;   /* measured rows (a subset of crow) */
    int64_t *mat;        /* [n] index of row t in mrow, or -1 */
    int64_t *trow, nt;   /* the thin PATS settings' rows (thr_thin_count of mrow) */
    double *accP;        /* [gs, n] prompt significance sums */
    int64_t nqP;         /* prompt query rows */
    float *ex;           /* [nm, gs, d] exact outputs of the measured rows */
    float *Qp, *S;       /* scratch of exact_rows */
    const thr_lk_kernels *K; /* the LeanKV loops (lk_kernels.h) */
} fjob;

static void fjob_free(fjob *J)
{
    free(J->qcum);
    free(J->crow);
    free(J->mrow);
    free(J->mat);
    free(J->trow);
    free(J->accP);
    free(J->ex);
    free(J->Qp);
    free(J->S);
}

/* prompt: the prompt rows' significance sums (LeanKV only needs them) */
static kvq_status fjob_init(fjob *J, const thr_rows *R, int64_t sample, int prompt, kvq_err *err)
{
    const int64_t n = R->n, gs = R->gs, d = R->d, blk = exact_block_rows(n, R->gs);
    memset(J, 0, sizeof *J);
    J->R = R;
    J->K = thr_lk_kernels_get(-1);
    J->qcum = malloc(sizeof(int64_t) * (size_t)n);
    J->crow = malloc(sizeof(int64_t) * (size_t)n);
    J->mrow = malloc(sizeof(int64_t) * (size_t)n);
    J->mat = malloc(sizeof(int64_t) * (size_t)n);
    J->trow = malloc(sizeof(int64_t) * (size_t)n);
    J->accP = calloc((size_t)(gs * n), sizeof(double));
    J->ex = malloc(sizeof(float) * (size_t)(n * gs * d));
    J->Qp = malloc(sizeof(float) * (size_t)(blk * gs * d));
    J->S = malloc(sizeof(float) * (size_t)(blk * gs * n));
    if (!J->qcum || !J->crow || !J->mrow || !J->mat || !J->trow || !J->accP || !J->ex || !J->Qp ||
        !J->S)
        return kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    int64_t nq = 0, *prow = J->mrow; /* the prompt rows borrow mrow first */
    for (int64_t t = 0; t < n; t++) {
        nq += R->has_q[t] != 0;
        J->qcum[t] = nq;
        J->mat[t] = -1;
        if (R->has_q[t] && t < R->P)
            prow[J->nqP++] = t;
        else if (R->has_q[t])
            J->crow[J->nc++] = t;
    }
    if (prompt)
        exact_rows(J->K, R, prow, J->nqP, J->accP, NULL, J->Qp, J->S);
    J->nm = sample >= 0 ? thr_sample_rows(J->crow, J->nc, sample, J->mrow)
                        : thr_sample_complement(J->crow, J->nc, -sample, J->mrow);
    for (int64_t i = 0; i < J->nm; i++)
        J->mat[J->mrow[i]] = i;
    J->nt = sample > 0 ? thr_sample_rows(J->mrow, J->nm, thr_thin_count(J->nm, J->nc), J->trow)
                       : thr_sample_rows(J->mrow, J->nm, 0, J->trow);
    exact_rows(J->K, R, J->mrow, J->nm, NULL, J->ex, J->Qp, J->S);
    return KVQ_OK;
}

/* ==========================================================================
 * LeanKV
 * ========================================================================== */

/* The three stored versions of every row: K [N_VER][n, d] and V likewise (index 0,
 * pruned, unused). */
typedef struct lk_versions {
    float *k[N_VER], *v[N_VER];
} lk_versions;

static void versions_free(lk_versions *X)
{
    for (int i = 1; i < N_VER; i++) {
        free(X->k[i]);
        free(X->v[i]);
    }
}

static kvq_status versions_make(const thr_rows *R, const kvq_leankv_params *lk, lk_versions *X,
                                kvq_err *err)
{
    const size_t nd = (size_t)R->n * R->d;
    const int32_t d = R->d;
    kvq_status s = KVQ_OK;
    memset(X, 0, sizeof *X);
    for (int i = 1; i < N_VER; i++)
        if (!(X->k[i] = malloc(sizeof(float) * nd)) || !(X->v[i] = malloc(sizeof(float) * nd)))
            return kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    for (int64_t t = 0; t < R->n && !s; t++) {
        const size_t o = (size_t)t * d;
        if (!(s = kvq_asymq_roundtrip(R->k + o, d, lk->k_high, X->k[V_HIGH] + o, err)) &&
            !(s = kvq_asymq_roundtrip(R->v + o, d, lk->v_high, X->v[V_HIGH] + o, err)) &&
            !(s = kvq_asymq_roundtrip(R->k + o, d, lk->k_low, X->k[V_LOWA] + o, err)) &&
            !(s = kvq_asymq_roundtrip(R->v + o, d, lk->v_low, X->v[V_LOWA] + o, err)) &&
            !(s = kvq_asymq_roundtrip(X->k[V_HIGH] + o, d, lk->k_low, X->k[V_LOWB] + o, err)))
            s = kvq_asymq_roundtrip(X->v[V_HIGH] + o, d, lk->v_low, X->v[V_LOWB] + o, err);
    }
    return s;
}

/* One setting's cache: classes, the version of each LOW row, significance sums. */
typedef struct lk_state {
    kvq_leankv_params lk;
    uint8_t *cls;   /* [n] */
    uint8_t *ver;   /* [n] V_* */
    double *acc;    /* [gs, n] attention received from later queries */
    double *sig;    /* [n] scratch shared by the settings (lk_block) */
    int64_t nq;     /* queries counted */
} lk_state;

static void state_free(lk_state *st)
{
    free(st->cls);
    free(st->ver);
    free(st->acc);
}

/* sig[j] for j < len from the sums, as the reference's current_significance. */
static void significance(const lk_state *st, const fjob *J, int64_t len)
{
    J->K->significance(st->sig, st->acc, J->R->n, J->R->gs, J->qcum, st->nq, len);
}

/* sig[j] alone: the significance kernels' rule (lk_kernels.c significance_scalar, which
 * the SIMD ones equal), the same bits. */
static double sig_at(const lk_state *st, const fjob *J, int64_t j)
{
    const int64_t cnt = st->nq - J->qcum[j];
    if (cnt <= 0)
        return INFINITY;
    double best = -INFINITY;
    for (int32_t g = 0; g < J->R->gs; g++) {
        const double a = st->acc[(size_t)g * J->R->n + j];
        best = a > best ? a : best;
    }
    return best / (double)cnt;
}

/* The prompt rule at the end of the prompt (the reference's thr_leankv_finish_prompt). */
static kvq_status state_start(lk_state *st, const fjob *J, const kvq_leankv_params *lk,
                              double *sig, kvq_err *err)
{
    const thr_rows *R = J->R;
    const size_t n = (size_t)R->n;
    memset(st, 0, sizeof *st);
    st->lk = *lk;
    st->cls = malloc(n);
    st->ver = malloc(n);
    st->acc = malloc(sizeof(double) * n * (size_t)R->gs);
    st->sig = sig;
    if (!st->cls || !st->ver || !st->acc)
        return kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    memcpy(st->acc, J->accP, sizeof(double) * n * (size_t)R->gs);
    st->nq = J->nqP;
    significance(st, J, R->P);
    kvq_leankv_classify_prompt(st->sig, R->P, &st->lk, st->cls);
    for (int64_t j = 0; j < R->P; j++)
        st->ver[j] = st->cls[j] == KVQ_LEANKV_HIGH  ? V_HIGH
                     : st->cls[j] == KVQ_LEANKV_LOW ? V_LOWA
                                                    : V_PRUNED;
    return KVQ_OK;
}

/* Algorithm 1 for token t (the reference's thr_leankv_push before the attention). */
static void state_step(lk_state *st, const fjob *J, int64_t t)
{
    st->cls[t] = KVQ_LEANKV_HIGH;
    st->ver[t] = V_HIGH;
    /* thr_leankv_step: the significance of c, of the least of its class (sigmin: no
     * significance of every token) and of that token */
    const int64_t c = t - st->lk.window;
    const uint8_t old_c = c >= 0 ? st->cls[c] : 0;
    int64_t v = -1;
    if (c >= 0) {
        const kvq_leankv_class sec = kvq_leankv_rule(sig_at(st, J, c), t + 1, &st->lk);
        st->cls[c] = (uint8_t)sec;
        if (sec != KVQ_LEANKV_PRUNED) {
            v = J->K->sigmin(st->acc, J->R->n, J->R->gs, J->qcum, st->nq, st->cls, (uint8_t)sec,
                             c + 1, st->sig);
            const kvq_leankv_class now = kvq_leankv_rule(sig_at(st, J, v), t + 1, &st->lk);
            if (now < sec)
                st->cls[v] = (uint8_t)now; /* HIGH -> LOW or PRUNED; LOW -> PRUNED */
        }
    }
    /* what moved down is re-quantized from the K8V4 row the cache held */
    if (c >= 0 && st->cls[c] != old_c)
        st->ver[c] = st->cls[c] == KVQ_LEANKV_LOW ? V_LOWB : V_PRUNED;
    if (v >= 0 && v != c && st->cls[v] != st->cls[c])
        st->ver[v] = st->cls[v] == KVQ_LEANKV_LOW ? V_LOWB : V_PRUNED;
}

/* One block of continuation query rows: scores S [N_VER-1][nb * gs, T] against the
 * stored versions and E = exp(S - M), M the largest score of the row and head over
 * every version. K4V2 of the exact row is only ever a prompt token's version (the
 * prompt rule gives it; later moves give K4V2 of the K8V4 row), so its columns stop at
 * the prompt's end P. */
typedef struct lk_block {
    int64_t i0, nb, T;   /* rows J->crow[i0 .. i0 + nb), tokens [0, T) */
    float *S, *E;        /* [3, blk * gs, n] */
    float *Qp;           /* [blk, gs, d] */
    double *sig;         /* [n] scratch: significance */
    float *w;            /* [gs, n] scratch: a row's f32 exponentials, per head */
    double *z;           /* [2 gs] scratch: their sums, then the inverses */
    struct lk_chain *ch; /* the measured rows' output sums (lk_mix) */
} lk_block;

/* The output of a measured row by differences between settings (lk_mix): for each row
 * of the block, the versions and the unnormalized output sum of the last setting that
 * measured it. */
typedef struct lk_chain {
    uint8_t *ver;  /* [blk, n] */
    float *u;      /* [blk, gs, d] */
    uint8_t *ok;   /* [blk] holds a setting's sums */
    int64_t *at;   /* [n] scratch: the changed tokens */
    float *vc;     /* [2 n, d] scratch: their new value rows, then their old ones */
    float *wo;     /* [gs, 2 n] scratch: their new exponentials, then minus the old */
    uint8_t *ones; /* [2 n] versions of the compact rows: 1 */
    float *du;     /* [gs, d] scratch */
    double *one;   /* [gs] ones */
} lk_chain;

static void chain_free(lk_chain *C)
{
    if (!C)
        return;
    free(C->ver);
    free(C->u);
    free(C->ok);
    free(C->at);
    free(C->vc);
    free(C->ones);
    free(C->wo);
    free(C->du);
    free(C->one);
    free(C);
}

static lk_chain *chain_make(int64_t blk, int64_t n, int32_t gs, int32_t d)
{
    lk_chain *C = calloc(1, sizeof *C);
    if (!C)
        return NULL;
    C->ver = malloc((size_t)(blk * n));
    C->u = malloc(sizeof(float) * (size_t)(blk * gs * d));
    C->ok = calloc((size_t)blk, 1);
    C->at = malloc(sizeof(int64_t) * (size_t)n);
    C->vc = malloc(sizeof(float) * (size_t)(2 * n * d));
    C->ones = malloc((size_t)(2 * n));
    C->wo = malloc(sizeof(float) * (size_t)(2 * gs * n));
    C->du = malloc(sizeof(float) * (size_t)(gs * d));
    C->one = malloc(sizeof(double) * (size_t)gs);
    if (!C->ver || !C->u || !C->ok || !C->at || !C->vc || !C->ones || !C->wo || !C->du || !C->one) {
        chain_free(C);
        return NULL;
    }
    for (int32_t g = 0; g < gs; g++)
        C->one[g] = 1.0;
    memset(C->ones, 1, (size_t)(2 * n));
    return C;
}

static void block_scores(const fjob *J, const lk_versions *X, lk_block *B)
{
    const thr_rows *R = J->R;
    const size_t plane = (size_t)B->nb * R->gs * B->T;
    const int64_t TA = B->T < R->P ? B->T : R->P;
    pack_queries(R, J->crow + B->i0, B->nb, B->Qp);
    for (int ver = V_HIGH; ver < N_VER; ver++)
        scores_ld(R, B->Qp, B->nb, X->k[ver], ver == V_LOWA ? TA : B->T,
                  B->S + (size_t)(ver - 1) * plane, B->T);
    for (int64_t i = 0; i < B->nb; i++) {
        const int64_t len = J->crow[B->i0 + i] + 1;
        for (int32_t g = 0; g < R->gs; g++) {
            const size_t off = ((size_t)i * R->gs + g) * B->T;
            float mx = -INFINITY;
            for (int ver = 0; ver < N_VER - 1; ver++) {
                const int64_t l = ver == V_LOWA - 1 && len > R->P ? R->P : len;
                const float m = J->K->maxf(B->S + ver * plane + off, l);
                mx = m > mx ? m : mx;
            }
            for (int ver = 0; ver < N_VER - 1; ver++) {
                const int64_t l = ver == V_LOWA - 1 && len > R->P ? R->P : len;
                (void)J->K->expsum(B->E + ver * plane + off, B->S + ver * plane + off, mx, l);
            }
        }
    }
}

/* y += x and y = x a, elementwise (four lanes at a time where SSE2 is there: the same
 * bits). */
static void add_to(float *restrict y, const float *restrict x, size_t m)
{
    size_t c = 0;
#if defined(__SSE2__)
    for (; c + 4 <= m; c += 4)
        _mm_storeu_ps(y + c, _mm_add_ps(_mm_loadu_ps(y + c), _mm_loadu_ps(x + c)));
#endif
    for (; c < m; c++)
        y[c] += x[c];
}

static void scale_to(float *restrict y, const float *restrict x, float a, size_t m)
{
    size_t c = 0;
#if defined(__SSE2__)
    for (; c + 4 <= m; c += 4)
        _mm_storeu_ps(y + c, _mm_mul_ps(_mm_loadu_ps(x + c), _mm_set1_ps(a)));
#endif
    for (; c < m; c++)
        y[c] = x[c] * a;
}

/* The output of measured row t (block row i) into o [gs, d]: U = the sum over the kept
 * tokens of exponential x value row (the mix kernel with unit weights, tokens in order),
 * o = U x (float)inv per head. U is kept per block row: the next setting that measures
 * the row, when fewer than half its kept tokens changed version, adds the changed
 * tokens' new terms and the old ones' negatives (the same kernel over only those
 * tokens) instead of summing every token again (neighbouring settings differ in about 3%
 * of the tokens here). own: a head's exponentials were taken under its own maximum
 * (state_attend), not the block's: that row is summed directly and not kept. The same
 * bits for any thread count and ISA (the mix kernels equal the scalar one). */
static void lk_mix(const lk_state *st, const fjob *J, const lk_versions *X, const lk_block *B,
                   int64_t i, int64_t t, int own, const double *inv, float *o)
{
    const thr_rows *R = J->R;
    const int32_t gs = R->gs, d = R->d;
    const size_t n = (size_t)R->n, gd = (size_t)gs * d;
    const int64_t len = t + 1;
    const float *v[N_VER] = {NULL, X->v[1], X->v[2], X->v[3]};
    lk_chain *C = B->ch;
    uint8_t *pv = C->ver + (size_t)i * n;
    float *U = C->u + (size_t)i * gd;
    if (own) {
        J->K->mix(o, B->w, n, inv, st->ver, v, len, d, gs);
        C->ok[i] = 0;
        return;
    }
    const uint8_t *cv = st->ver;
    int64_t nd = 0, nk = 0;
    if (C->ok[i]) { /* the changed tokens into C->at, 8 versions (bytes 0..3) a word */
        int64_t j = 0;
        for (; j + 8 <= len; j += 8) {
            uint64_t a, b;
            memcpy(&a, pv + j, 8);
            memcpy(&b, cv + j, 8);
            /* one bit per nonzero byte, summed into the top byte by a multiply */
            nk += (int64_t)((((b | b >> 1) & 0x0101010101010101ull) * 0x0101010101010101ull) >> 56);
            for (int k = 0; a != b && k < 8; k++)
                if (pv[j + k] != cv[j + k])
                    C->at[nd++] = j + k;
        }
        for (; j < len; j++) {
            nk += cv[j] != 0;
            if (pv[j] != cv[j])
                C->at[nd++] = j;
        }
    }
    if (C->ok[i] && 2 * nd < nk) {
        /* the changed tokens' terms as rows of one compact list: the new version's
         * exponential and value row, then minus the old one's (pruned: weight 0) */
        const size_t plane = (size_t)B->nb * gs * B->T, off = (size_t)i * gs * B->T;
        const size_t m2 = (size_t)(2 * nd);
        for (int64_t k = 0; k < nd; k++) {
            const int64_t j = C->at[k];
            const uint8_t vn = cv[j], vo = pv[j];
            memcpy(C->vc + (size_t)k * d, v[vn ? vn : 1] + (size_t)j * d, sizeof(float) * d);
            memcpy(C->vc + (size_t)(nd + k) * d, v[vo ? vo : 1] + (size_t)j * d,
                   sizeof(float) * d);
            for (int32_t g = 0; g < gs; g++) {
                const size_t eg = off + (size_t)g * B->T + (size_t)j;
                C->wo[(size_t)g * m2 + k] = vn ? B->w[(size_t)g * n + j] : 0.0f;
                C->wo[(size_t)g * m2 + nd + k] = vo ? -B->E[(size_t)(vo - 1) * plane + eg] : 0.0f;
            }
        }
        const float *vc[N_VER] = {NULL, C->vc, C->vc, C->vc};
        J->K->mix(C->du, C->wo, m2, C->one, C->ones, vc, (int64_t)m2, d, gs);
        add_to(U, C->du, gd);
    } else {
        J->K->mix(U, B->w, n, C->one, st->ver, v, len, d, gs);
    }
    memcpy(pv, st->ver, (size_t)len);
    C->ok[i] = 1;
    for (int32_t g = 0; g < gs; g++)
        scale_to(o + (size_t)g * d, U + (size_t)g * d, (float)inv[g], (size_t)d);
}

/* The attention of row t (block row i) over the setting's cache: adds the probabilities
 * to the sums and, on a measured row, the output's error to a. */
static void state_attend(lk_state *st, const fjob *J, const lk_versions *X, const lk_block *B,
                         int64_t i, int64_t t, float *o, thr_acc *a)
{
    const thr_rows *R = J->R;
    const int32_t gs = R->gs, d = R->d;
    const size_t plane = (size_t)B->nb * gs * B->T, off = (size_t)i * gs * B->T;
    const int64_t m = J->mat[t];
    const float *e[N_VER] = {NULL, B->E + off, B->E + plane + off, B->E + 2 * plane + off};
    double *Z = B->z, *inv = B->z + gs;
    int own = 0;
    J->K->gather(e, (size_t)B->T, st->ver, t + 1, gs, B->w, (size_t)R->n, Z);
    for (int32_t g = 0; g < gs; g++) {
        float *w = B->w + (size_t)g * R->n;
        if (!(Z[g] > 1e-30)) { /* every kept token far below the shared maximum: own maximum */
            own = 1;
            const size_t og = off + (size_t)g * B->T;
            const float *s[N_VER] = {NULL, B->S + og, B->S + plane + og, B->S + 2 * plane + og};
            float mx = -INFINITY;
            for (int64_t j = 0; j <= t; j++)
                if (st->ver[j])
                    mx = s[st->ver[j]][j] > mx ? s[st->ver[j]][j] : mx;
            Z[g] = 0;
            for (int64_t j = 0; j <= t; j++) {
                w[j] = st->ver[j] ? thr_lk_exp1(s[st->ver[j]][j] - mx) : 0.0f;
                Z[g] += w[j];
            }
        }
        inv[g] = Z[g] > 0 ? 1.0 / Z[g] : 0.0;
        J->K->daxpy(st->acc + (size_t)g * R->n, inv[g], w, t);
    }
    st->nq++;
    if (m < 0)
        return;
    lk_mix(st, J, X, B, i, t, own, inv, o);
    thr_add_rel_err(o, J->ex + (size_t)m * gs * d, gs, d, a);
}

/* The cache memory at the end of the sequence (the reference's thr_head_memory). */
static void state_memory(const lk_state *st, const thr_rows *R, thr_acc *a)
{
    double bytes = 0;
    a->mem.bytes_f16 += 4.0 * R->d * (double)R->n;
    for (int64_t j = 0; j < R->n; j++) {
        bytes += (double)kvq_leankv_token_bytes(R->d, (kvq_leankv_class)st->cls[j], &st->lk);
        a->mem.n_high += st->cls[j] == KVQ_LEANKV_HIGH;
        a->mem.n_low += st->cls[j] == KVQ_LEANKV_LOW;
        a->mem.n_pruned += st->cls[j] == KVQ_LEANKV_PRUNED;
    }
    a->mem.bytes += bytes;
    a->mem.bits += 8.0 * bytes;
}

/* Every LeanKV setting of G over the continuation, block by block of query rows. */
/* The earlier LeanKV setting of G whose classes equal setting c's for every
 * significance, or -1. kvq_leankv_rule: with alpha_l >= alpha_h no token is low (below
 * alpha_h it is pruned), so the classes depend on (alpha_h, min(alpha_l, alpha_h))
 * only; alpha_h = 0 makes every token high whatever alpha_l. The other parameters are
 * the same for every setting of the grid, and the runs are exact, so a duplicate's
 * figures are those of the earlier setting. */
static int64_t lk_duplicate(const thr_grid *G, int64_t c)
{
    const kvq_leankv_params *a = &G->lk[c];
    const double la = a->alpha_l < a->alpha_h ? a->alpha_l : a->alpha_h;
    for (int64_t e = 0; e < c; e++) {
        const kvq_leankv_params *b = &G->lk[e];
        const double lb = b->alpha_l < b->alpha_h ? b->alpha_l : b->alpha_h;
        if (b->alpha_h == a->alpha_h && lb == la && b->window == a->window &&
            b->k_high == a->k_high && b->v_high == a->v_high && b->k_low == a->k_low &&
            b->v_low == a->v_low)
            return e;
    }
    return -1;
}

static kvq_status leankv_settings(const fjob *J, const thr_grid *G, thr_acc *acc, kvq_err *err)
{
    const thr_rows *R = J->R;
    const int32_t gs = R->gs, d = R->d;
    const int64_t blk = lk_block_rows(R->n, gs);
    lk_versions X;
    lk_block B = {0};
    lk_state *st = calloc((size_t)G->n_lk, sizeof *st);
    float *o = malloc(sizeof(float) * (size_t)gs * d);
    kvq_status s = st && o ? KVQ_OK : kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    if (!s)
        s = versions_make(R, &G->lk[0], &X, err);
    B.S = malloc(sizeof(float) * (size_t)(3 * blk * gs * R->n));
    B.E = malloc(sizeof(float) * (size_t)(3 * blk * gs * R->n));
    B.Qp = malloc(sizeof(float) * (size_t)(blk * gs * d));
    B.sig = malloc(sizeof(double) * (size_t)R->n);
    B.w = malloc(sizeof(float) * (size_t)(gs * R->n));
    B.z = malloc(sizeof(double) * (size_t)(2 * gs));
    B.ch = chain_make(blk, R->n, gs, d);
    if (!s && (!B.S || !B.E || !B.Qp || !B.sig || !B.w || !B.z || !B.ch))
        s = kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    /* settings with the same classes everywhere run once: dup[c] = the earlier one */
    int64_t *dup = malloc(sizeof *dup * (size_t)G->n_lk);
    if (!s && !dup)
        s = kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    for (int64_t c = 0; c < G->n_lk && !s; c++)
        dup[c] = lk_duplicate(G, c);
    for (int64_t c = 0; c < G->n_lk && !s; c++)
        if (dup[c] < 0)
            s = state_start(&st[c], J, &G->lk[c], B.sig, err);
    /* rows P .. n-1 in stretches that end at the last row of a block of query rows */
    int64_t t = R->P;
    for (int64_t i0 = 0; !s && (i0 < J->nc || t < R->n); i0 += B.nb) {
        B.i0 = i0;
        B.nb = J->nc - i0 < blk ? J->nc - i0 : blk;
        const int64_t t_end = B.nb > 0 ? J->crow[i0 + B.nb - 1] + 1 : R->n;
        B.T = t_end;
        if (B.ch) /* the block's rows: no setting has measured them */
            memset(B.ch->ok, 0, (size_t)blk);
        if (B.nb > 0)
            block_scores(J, &X, &B);
        for (int64_t c = 0; c < G->n_lk; c++)
            for (int64_t u = t, i = 0; dup[c] < 0 && u < t_end; u++) {
                state_step(&st[c], J, u);
                if (R->has_q[u])
                    state_attend(&st[c], J, &X, &B, i++, u, o, &acc[c]);
            }
        t = t_end;
        if (B.nb == 0)
            break;
    }
    for (int64_t c = 0; c < G->n_lk && !s; c++)
        if (dup[c] < 0)
            state_memory(&st[c], R, &acc[c]);
    for (int64_t c = 0; c < G->n_lk && !s; c++)
        if (dup[c] >= 0)
            acc[c] = acc[dup[c]];
    free(dup);
    for (int64_t c = 0; st && c < G->n_lk; c++)
        state_free(&st[c]);
    free(st);
    free(o);
    free(B.S);
    free(B.E);
    free(B.Qp);
    free(B.sig);
    free(B.w);
    free(B.z);
    chain_free(B.ch);
    versions_free(&X);
    return s;
}

/* ==========================================================================
 * PATS
 * ========================================================================== */

/* kvq_pats_truncate of row t of h [n, d] (x as f16 or bf16, converted once per job) at
 * `bits` into the same row of out: masked here, converted back by the array converters
 * (exact: any ISA gives the same bits) once a setting's rows are all masked. */
static void truncate_row(const uint16_t *h, int32_t d, int bf, int32_t bits, uint16_t *out)
{
    const uint16_t mask = (uint16_t)~((1u << bits) - 1u), expo = bf ? 0x7f80u : 0x7c00u;
    int32_t i = 0;
#if defined(__SSE2__)
    const __m128i vm = _mm_set1_epi16((short)mask), ve = _mm_set1_epi16((short)expo);
    for (; i + 8 <= d; i += 8) { /* Inf and NaN (all exponent bits set) keep every bit */
        const __m128i x = _mm_loadu_si128((const __m128i *)(h + i));
        const __m128i special = _mm_cmpeq_epi16(_mm_and_si128(x, ve), ve);
        _mm_storeu_si128((__m128i *)(out + i), _mm_and_si128(x, _mm_or_si128(vm, special)));
    }
#endif
    for (; i < d; i++) /* Inf and NaN stay as they are */
        out[i] = (h[i] & expo) != expo ? (uint16_t)(h[i] & mask) : h[i];
}

static void half_to_f32(const uint16_t *h, float *out, size_t n, int bf)
{
    if (bf)
        kvq_bf16_to_f32(h, out, n);
    else
        kvq_f16_to_f32(h, out, n);
}

static kvq_status pats_settings(const fjob *J, const thr_grid *G, thr_acc *acc, kvq_err *err)
{
    const thr_rows *R = J->R;
    const int32_t gs = R->gs, d = R->d;
    const int64_t n = R->n;
    const size_t nd = (size_t)n * d;
    float *K = malloc(sizeof(float) * nd), *V = malloc(sizeof(float) * nd);
    float *o = malloc(sizeof(float) * (size_t)(J->nm > 0 ? J->nm : 1) * gs * d);
    uint16_t *hk = malloc(sizeof(uint16_t) * nd), *hv = malloc(sizeof(uint16_t) * nd);
    uint16_t *tk = malloc(sizeof(uint16_t) * nd), *tv = malloc(sizeof(uint16_t) * nd);
    const int bf = G->pt[0].dtype == KVQ_DT_BF16;
    kvq_status s = KVQ_OK;
    if (!K || !V || !o || !hk || !hv || !tk || !tv) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
        goto done;
    }
    if (bf) {
        kvq_f32_to_bf16(R->k, hk, nd);
        kvq_f32_to_bf16(R->v, hv, nd);
    } else {
        kvq_f32_to_f16(R->k, hk, nd);
        kvq_f32_to_f16(R->v, hv, nd);
    }
    for (int64_t c = 0; c < G->n_pt; c++) {
        const kvq_pats_params *pt = &G->pt[c];
        thr_acc *a = &acc[G->n_lk + c];
        for (int64_t t = 0; t < n; t++) { /* each row at its own level */
            const int32_t b = kvq_pats_bits(pt, t + 1, n);
            const size_t lo = (size_t)t * d;
            truncate_row(hk + lo, d, bf, b, tk + lo);
            truncate_row(hv + lo, d, bf, b, tv + lo);
            a->mem.bytes += 2.0 * (double)kvq_pats_row_bytes(d, b);
            a->mem.bits += 2.0 * d * (16 - b);
        }
        a->mem.bytes_f16 += 4.0 * d * (double)n;
        if (J->nm == 0)
            continue;
        half_to_f32(tk, K, nd, bf);
        half_to_f32(tv, V, nd, bf);
        const thr_rows Rt = {.n = n, .P = R->P, .d = d, .gs = gs, .k = K, .v = V, .q = R->q,
                             .has_q = R->has_q};
        /* a setting that saves no memory (never chosen): the thin rows of the sample */
        const int thin = G->pt_thin && G->pt_thin[c];
        const int64_t *rows = thin ? J->trow : J->mrow, nr = thin ? J->nt : J->nm;
        exact_rows(J->K, &Rt, rows, nr, NULL, o, J->Qp, J->S);
        for (int64_t i = 0; i < nr; i++)
            thr_add_rel_err(o + (size_t)i * gs * d, J->ex + (size_t)J->mat[rows[i]] * gs * d, gs,
                            d, a);
    }
done:
    free(K);
    free(V);
    free(o);
    free(hk);
    free(hv);
    free(tk);
    free(tv);
    return s;
}

kvq_status thr_fast_job(const thr_rows *R, const thr_grid *G, int64_t sample, thr_acc *acc,
                        int64_t *n_err, kvq_err *err)
{
    fjob J;
    kvq_status s = fjob_init(&J, R, sample, G->n_lk > 0, err);
    if (!s && G->n_lk)
        s = leankv_settings(&J, G, acc, err);
    if (!s && G->n_pt)
        s = pats_settings(&J, G, acc, err);
    if (!s)
        *n_err = J.nm;
    fjob_free(&J);
    return s;
}
