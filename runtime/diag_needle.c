/*
 * diag_needle.c — a diagnostic build (not in the shipped library): where the tokens of
 * a range (a passkey's digits) rank at each stage of the codebook selector.
 *
 * Build: make clean && make OPT='-O2 -DKVQ_RT_DIAG_NEEDLE -DKVQ_RT_DIAG_LO=2896
 *        -DKVQ_RT_DIAG_HI=2916' build/kvq   (token range [LO, HI], inclusive)
 * Then `kvq eval ... --threads 1` prints, to stderr, for every codebook step whose
 * query position is past the range, a line per (layer, KV head):
 *   NEEDLE pos L h nc k k1 k2 mass other_topk n n1 n2 n3 range_topk n n1 n2 n3
 * mass: the largest share of its candidates' exact attention any query head of the
 * group puts on the range; n: the exact (group-summed, as the rerank scores) top k
 * outside / inside the range, n1 n2 n3 how many of them the codebook's k1, the residual
 * stage's k2 and the final k keep; then
 *   GAP other n mean(exact - first) mean(stage - first) range n ... ...
 * over those of them that were stage candidates (the residual's true and estimated part
 * of the score). Where mass >= 2%, per range token whose exact rank
 * is < k:
 *   TOK tok exact_rank first_rank stage_rank(-1: not a stage candidate) in1 in2 in3
 *       scale scale_pct first exact
 * first = the codebook's first-stage score (bands: kvq_rt_banded_scores), stage = first +
 * residual part, scale = its residual scale, scale_pct = its percentile among the
 * candidates' scales. Single-threaded use only (static state).
 */
#ifdef KVQ_RT_DIAG_NEEDLE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/runtime.h"
#include "runtime/runtime_internal.h"
#include "runtime/select/codebook/codebook.h"

#ifndef KVQ_RT_DIAG_LO
#define KVQ_RT_DIAG_LO 0
#endif
#ifndef KVQ_RT_DIAG_HI
#define KVQ_RT_DIAG_HI -1
#endif

static struct {
    int on;
    int64_t nc, k, k1, k2;
    float *ex, *fs, mass;
    uint8_t *in; /* per candidate: bit 0 stage-1 set, bit 1 stage-2, bit 2 final */
    float *stg;  /* stage score per candidate (NAN when not a stage candidate) */
} D;

static int64_t rank_of(const float *s, int64_t n, int64_t j)
{
    int64_t r = 0;
    for (int64_t i = 0; i < n; i++)
        r += s[i] > s[j];
    return r;
}

void kvq_rt_diag_needle_pre(const rt_step *st, int64_t k, int64_t k1, int64_t k2)
{
    const kvq_retrieval *r = st->r;
    const int32_t d = r->d, gs = r->gs;
    D.on = 0;
    if (st->pos <= KVQ_RT_DIAG_HI || st->nc <= k || r->p.positions != KVQ_POSITIONS_ROPE)
        return;
    const int64_t nc = st->nc;
    free(D.ex);
    free(D.fs);
    free(D.in);
    free(D.stg);
    D.ex = malloc(sizeof(float) * nc);
    D.fs = malloc(sizeof(float) * nc);
    D.stg = malloc(sizeof(float) * nc);
    D.in = calloc((size_t)nc, 1);
    float *lg = malloc(sizeof(float) * (size_t)nc * gs);
    float kr[KVQ_ROPE_MAX_DIM], qs[KVQ_ROPE_MAX_DIM];
    for (int64_t j = 0; j < nc; j++) {
        kvq_rt_step_key(st, st->s_end + j, kr); /* the compressed cache's when attached */
        double sum = 0;
        for (int32_t g = 0; g < gs; g++) {
            double s = 0;
            for (int32_t t = 0; t < d; t++)
                s += (double)st->S->qi[(size_t)g * d + t] * kr[t];
            lg[(size_t)g * nc + j] = (float)(s / sqrt((double)d));
            sum += s;
        }
        D.ex[j] = (float)sum;
        D.stg[j] = NAN;
    }
    D.mass = 0;
    for (int32_t g = 0; g < gs; g++) {
        float m = -INFINITY;
        for (int64_t j = 0; j < nc; j++)
            m = lg[(size_t)g * nc + j] > m ? lg[(size_t)g * nc + j] : m;
        double z = 0, zn = 0;
        for (int64_t j = 0; j < nc; j++) {
            const double e = exp((double)(lg[(size_t)g * nc + j] - m));
            const int64_t t = kvq_rt_row_token(st->H, st->s_end + j);
            z += e;
            zn += t >= KVQ_RT_DIAG_LO && t <= KVQ_RT_DIAG_HI ? e : 0;
        }
        D.mass = (float)(zn / z) > D.mass ? (float)(zn / z) : D.mass;
    }
    free(lg);
    memcpy(qs, st->q, sizeof(float) * (size_t)d);
    for (int32_t g = 1; g < gs; g++)
        for (int32_t t = 0; t < d; t++)
            qs[t] += st->q[(size_t)g * d + t];
    double dummy = 0;
    kvq_rt_banded_scores(st, qs, D.fs, &dummy);
    D.nc = nc;
    D.k = k;
    D.k1 = k1;
    D.k2 = k2;
    D.on = 1;
}

/* stage 0: the codebook's k1 rows; 1: after the residual stage; 2: the final set */
void kvq_rt_diag_needle_stage(const rt_step *st, int stage, const int32_t *rows, int64_t n)
{
    if (!D.on)
        return;
    const kvq_retrieval *r = st->r;
    const int32_t d = r->d, gs = r->gs;
    float q[KVQ_ROPE_MAX_DIM];
    memcpy(q, st->S->qi, sizeof(float) * (size_t)d);
    for (int32_t g = 1; g < gs; g++)
        for (int32_t t = 0; t < d; t++)
            q[t] += st->S->qi[(size_t)g * d + t];
    const size_t rb = ((size_t)d * (r->p.resid_bits > 0 ? r->p.resid_bits : 1) + 7) / 8;
    for (int64_t a = 0; a < n; a++) {
        const int64_t j = rows[a] - st->s_end;
        D.in[j] |= (uint8_t)(1u << stage);
        if (stage == 0 && kvq_rt_cb(st->H)->rq && r->p.resid_bits == 1) {
            const uint8_t *b = kvq_rt_cb(st->H)->rq + (size_t)rows[a] * rb;
            double s = 0;
            for (int32_t c = 0; c < d; c++)
                s += (b[c / 8] >> (c % 8) & 1) ? q[c] : -q[c];
            D.stg[j] = D.fs[j] + kvq_rt_cb(st->H)->rqs[rows[a]] * (float)s;
        }
    }
}

static int cmpf(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

void kvq_rt_diag_needle_post(const rt_step *st)
{
    if (!D.on)
        return;
    const int64_t nc = D.nc;
    float *sc = malloc(sizeof(float) * nc);
    /* the exact top k of all candidates and of the range: how many each stage keeps */
    memcpy(sc, D.ex, sizeof(float) * nc);
    qsort(sc, (size_t)nc, sizeof(float), cmpf);
    const float thr = sc[nc - D.k];
    int64_t all[4] = {0}, rng[4] = {0};
    double gap[2][3] = {{0}}; /* per group: sum of (exact - first), of (stage - first), count */
    for (int64_t j = 0; j < nc; j++) {
        if (D.ex[j] < thr)
            continue;
        const int64_t t = kvq_rt_row_token(st->H, st->s_end + j);
        const int in_rng = t >= KVQ_RT_DIAG_LO && t <= KVQ_RT_DIAG_HI;
        int64_t *c = in_rng ? rng : all;
        if (!isnan(D.stg[j])) {
            gap[in_rng][0] += D.ex[j] - D.fs[j];
            gap[in_rng][1] += D.stg[j] - D.fs[j];
            gap[in_rng][2] += 1;
        }
        c[0]++;
        for (int s = 0; s < 3; s++)
            c[s + 1] += D.in[j] >> s & 1;
    }
    fprintf(stderr,
            "NEEDLE pos %lld L %d h %d nc %lld k %lld k1 %lld k2 %lld mass %.3f "
            "other_topk %lld %lld %lld %lld range_topk %lld %lld %lld %lld\n",
            (long long)st->pos, st->layer, st->head, (long long)nc, (long long)D.k,
            (long long)D.k1, (long long)D.k2, D.mass, (long long)all[0], (long long)all[1],
            (long long)all[2], (long long)all[3], (long long)rng[0], (long long)rng[1],
            (long long)rng[2], (long long)rng[3]);
    fprintf(stderr, "GAP other %.0f %.3f %.3f range %.0f %.3f %.3f\n", gap[0][2],
            gap[0][2] ? gap[0][0] / gap[0][2] : 0, gap[0][2] ? gap[0][1] / gap[0][2] : 0, gap[1][2],
            gap[1][2] ? gap[1][0] / gap[1][2] : 0, gap[1][2] ? gap[1][1] / gap[1][2] : 0);
    for (int64_t j = 0; j < nc; j++)
        sc[j] = kvq_rt_cb(st->H)->rqs ? kvq_rt_cb(st->H)->rqs[st->s_end + j] : 0;
    float *sorted = malloc(sizeof(float) * nc);
    memcpy(sorted, sc, sizeof(float) * nc);
    qsort(sorted, (size_t)nc, sizeof(float), cmpf);
    for (int64_t j = 0; D.mass >= 0.02f && j < nc; j++) {
        const int64_t t = kvq_rt_row_token(st->H, st->s_end + j);
        if (t < KVQ_RT_DIAG_LO || t > KVQ_RT_DIAG_HI)
            continue;
        const int64_t er = rank_of(D.ex, nc, j);
        if (er >= D.k)
            continue;
        int64_t sr = -1;
        if (!isnan(D.stg[j])) {
            sr = 0;
            for (int64_t i = 0; i < nc; i++)
                sr += !isnan(D.stg[i]) && D.stg[i] > D.stg[j];
        }
        int64_t pct = 0;
        while (pct < nc && sorted[pct] < sc[j])
            pct++;
        fprintf(stderr,
                "TOK %lld exact_rank %lld first_rank %lld stage_rank %lld in %d%d%d "
                "scale %.3f pct %.2f med %.3f first %.2f exact %.2f\n",
                (long long)t, (long long)er, (long long)rank_of(D.fs, nc, j), (long long)sr,
                D.in[j] & 1, D.in[j] >> 1 & 1, D.in[j] >> 2 & 1, sc[j], (double)pct / nc,
                sorted[nc / 2], D.fs[j], D.ex[j]);
    }
    free(sc);
    free(sorted);
}
#else
typedef int kvq_rt_diag_needle_unused;
#endif
