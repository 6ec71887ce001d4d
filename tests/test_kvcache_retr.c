/* test_kvcache_retr.c — retrieval over a compressed KV cache (kvq/kvcache.h
 * kvq_retrieval_set_kvcache): every decode step's output against a scalar reference
 * that takes the step's attended tokens (the sinks, the selection the context reports,
 * the window; LeanKV's pruned tokens dropped), dequantizes their compressed rows and
 * attends over them in double; and the same reference over the exact rows differs
 * (the steps read the compressed rows, not the context's own). PATS, LeanKV (with LOW
 * and pruned tokens) and leankv+pats; f16 results unchanged by a detached cache. The
 * context holds no rows of its own (none allocated; its held bytes by the formats'
 * sizes); the oracle selects the top k of a double-precision reference's scores over
 * the dequantized keys; a prompt prefilled in several calls attends the earlier calls'
 * tokens as the compressed cache holds them and the call's own exactly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "kvq/util.h"
#include "helpers/testutil.h"
#include "runtime/cache/kvc.h"
#include "runtime/runtime_internal.h"

enum { NL = 2, NH = 4, NKV = 2, GS = NH / NKV, D = 64, T = 160, P = 64, SINK = 4, WIN = 16,
       BUDGET = 12 };

typedef struct seq {
    float q[T * NH * D], k[T * NKV * D], v[T * NKV * D];
    int64_t pos[T];
} seq;

static void make_seq(seq *s, uint64_t seed)
{
    test_random_qkv(seed, s->q, T * NH * D, s->k, s->v, T * NKV * D);
    for (int64_t i = 0; i < T; i++)
        s->pos[i] = i;
}

/* The parameters every context here shares: `selector` with BUDGET tokens, positions
 * rope (the compressed cache holds rotated keys), T tokens at most. */
static kvq_retrieval_params retr_params(kvq_selector selector)
{
    kvq_retrieval_params rp = kvq_retrieval_params_default();
    rp.selector = selector;
    rp.budget = (kvq_budget){.count = BUDGET, .fraction = 0};
    rp.positions = KVQ_POSITIONS_ROPE;
    rp.max_tokens = T;
    return rp;
}

/* A context of rp and a compressed cache of kp (fails the test if either is refused). */
static void make_pair(const kvq_model_config *c, const kvq_retrieval_params *rp,
                      const kvq_kvcache_params *kp, kvq_retrieval **r, kvq_kvcache **kc)
{
    kvq_err e = {0};
    *r = NULL;
    *kc = NULL;
    if (kvq_retrieval_create(c, NULL, rp, r, &e) || kvq_kvcache_create(c, kp, kc, &e))
        fail_msg("kv cache: %s", e.msg);
}

static kvq_retrieval *make_retrieval(const kvq_model_config *c)
{
    kvq_retrieval_params rp = retr_params(KVQ_SELECT_ORACLE);
    rp.sink = SINK;
    rp.window = WIN;
    rp.threads = 1;
    kvq_retrieval *r = NULL;
    kvq_err e = {0};
    if (kvq_retrieval_create(c, NULL, &rp, &r, &e))
        fail_msg("retrieval: %s", e.msg);
    return r;
}

/* The rows [T, NKV, 2D] of layer l as the cache holds them now (kept[] 0: pruned). */
static void snapshot(const kvq_kvcache *kc, int32_t l, int64_t n, float *rows, int *kept)
{
    for (int64_t j = 0; j < n; j++)
        for (int32_t h = 0; h < NKV; h++) {
            float *x = rows + ((size_t)j * NKV + h) * 2 * D;
            kept[j * NKV + h] = kvq_kvcache_row(kc, l, h, j, x, x + D);
        }
}

/* The compressed cache's settings of the tests: LeanKV alpha 1 / 0.3 (LOW and pruned
 * tokens both), PATS middle-heavy b 2..9, over T tokens. */
static kvq_kvcache_params kv_params(kvq_kv_kind kind, int32_t window)
{
    kvq_kvcache_params kp = kvq_kvcache_params_default();
    kp.kind = kind;
    kp.alpha_h = 1;
    kp.alpha_l = 0.3;
    kp.window = window;
    kp.schedule = 2;
    kp.b_min = 2;
    kp.b_max = 9;
    kp.max_tokens = T;
    return kp;
}

/* The exact rows [T, NKV, 2D] of s: keys rotated by their positions (in double), values. */
static void exact_rows(const kvq_model_config *c, const seq *s, float *ex)
{
    double theta[KVQ_ROPE_MAX_DIM / 2];
    kvq_rope_freqs(&c->rope, theta);
    for (int64_t j = 0; j < T; j++)
        for (int32_t h = 0; h < NKV; h++) {
            float *x = ex + ((size_t)j * NKV + h) * 2 * D;
            memcpy(x, s->k + ((size_t)j * NKV + h) * D, sizeof(float) * D);
            kvq_rope_apply(&c->rope, theta, x, 1, s->pos[j]);
            memcpy(x + D, s->v + ((size_t)j * NKV + h) * D, sizeof(float) * D);
        }
}

/* The group's queries q [GS, D] rotated by pos and summed, in double, into qs [D]. */
static void group_query(const kvq_model_config *c, const float *q, int64_t pos, double *qs)
{
    double theta[KVQ_ROPE_MAX_DIM / 2];
    kvq_rope_freqs(&c->rope, theta);
    memset(qs, 0, sizeof(double) * D);
    for (int32_t g = 0; g < GS; g++) {
        float qr[D];
        memcpy(qr, q + (size_t)g * D, sizeof qr);
        kvq_rope_apply(&c->rope, theta, qr, 1, pos);
        for (int32_t t = 0; t < D; t++)
            qs[t] += qr[t];
    }
}

/* A selection sel [ns] of candidates [SINK, end) against reference scores sc (by token;
 * -inf: not a candidate): the chosen ones must be k, a top k up to eps. Returns the
 * number of candidates off (0 when right). */
static int64_t topk_off(const double *sc, int64_t end, const int32_t *sel, int64_t ns, int64_t k,
                        double eps)
{
    double kth = INFINITY; /* the k-th largest */
    for (int64_t r = 0; r < k; r++) {
        double best = -INFINITY;
        for (int64_t j = SINK; j < end; j++)
            if (sc[j] < kth && sc[j] > best)
                best = sc[j];
        kth = best;
    }
    int64_t bad = 0, in = 0;
    for (int64_t j = SINK; j < end; j++) {
        if (sc[j] == -INFINITY)
            continue;
        int chosen = 0;
        for (int64_t a = 0; a < ns; a++)
            chosen |= sel[a] == j;
        in += chosen;
        bad += chosen ? sc[j] < kth - eps : sc[j] > kth + eps;
    }
    return bad + (in != k);
}

/* r attached to kc, both reset, and kc laid out for a prompt of `prompt` tokens of T;
 * the buffers of a run: outputs [T, NH, D], the cache's rows and the exact rows
 * [T, NKV, 2D] (exact_rows), the kept flags [T, NKV]. Returns r's backend. */
static kvq_attn_backend attach_run(const kvq_model_config *c, const seq *s, kvq_retrieval *r,
                                   kvq_kvcache *kc, int64_t prompt, float **out, float **rows,
                                   float **ex, int **kept)
{
    kvq_err e = {0};
    if (kvq_retrieval_set_kvcache(r, kc, &e))
        fail_msg("kv cache: %s", e.msg);
    const kvq_attn_backend b = kvq_retrieval_backend(r);
    b.reset(b.user);
    assert_int_equal(kvq_kvcache_begin(kc, prompt, T, &e), KVQ_OK);
    *out = malloc(sizeof(float) * T * NH * D);
    *rows = malloc(sizeof(float) * T * NKV * 2 * D);
    *ex = malloc(sizeof(float) * T * NKV * 2 * D);
    *kept = malloc(sizeof(int) * T * NKV);
    exact_rows(c, s, *ex); /* keys rotated */
    return b;
}

/* Scalar reference of one step: the group's queries (rotated by pos) over the tokens
 * att[0..m) of rows, in double. Returns max |out - ref| over max |ref|. */
static double step_ref(const kvq_model_config *c, const float *q, int64_t pos,
                       const int32_t *att, int64_t m, const float *rows, int32_t h,
                       const float *out)
{
    double theta[KVQ_ROPE_MAX_DIM / 2], err = 0, scale = 0;
    kvq_rope_freqs(&c->rope, theta);
    for (int32_t g = 0; g < GS; g++) {
        float qr[D];
        memcpy(qr, q + (size_t)g * D, sizeof qr);
        kvq_rope_apply(&c->rope, theta, qr, 1, pos);
        double lg[T], mx = -INFINITY, sum = 0, o[D] = {0};
        for (int64_t a = 0; a < m; a++) {
            const float *k = rows + ((size_t)att[a] * NKV + h) * 2 * D;
            double s = 0;
            for (int32_t t = 0; t < D; t++)
                s += (double)qr[t] * k[t];
            lg[a] = s / sqrt((double)D);
            mx = fmax(mx, lg[a]);
        }
        for (int64_t a = 0; a < m; a++)
            sum += lg[a] = exp(lg[a] - mx);
        for (int64_t a = 0; a < m; a++) {
            const float *v = rows + ((size_t)att[a] * NKV + h) * 2 * D + D;
            for (int32_t t = 0; t < D; t++)
                o[t] += lg[a] / sum * v[t];
        }
        for (int32_t t = 0; t < D; t++) {
            err = fmax(err, fabs(o[t] - out[(size_t)g * D + t]));
            scale = fmax(scale, fabs(o[t]));
        }
    }
    return err / scale;
}

typedef struct worst {
    double ok, exact; /* largest error against the compressed rows, least against exact */
    int64_t steps, pruned_dropped;
    int64_t oracle_steps, oracle_bad; /* oracle selections checked, and off the reference */
} worst;

/* The oracle's selection sel [ns] of step (h, query q at pos, nvis tokens) against a
 * double-precision reference: each held candidate [SINK, nvis - WIN) scored (sum of the
 * group's rotated queries) . (the dequantized key rows holds); the selected held ones
 * must be a top k (k = min(BUDGET, held)) up to 1e-5 of the largest score. Returns the
 * number of candidates off that (0 when right). */
static int64_t oracle_check(const kvq_model_config *c, const float *q, int64_t pos, int64_t nvis,
                            const int32_t *sel, int64_t ns, const float *rows, const int *kept,
                            int32_t h)
{
    double qs[D], sc[T], top = 0;
    group_query(c, q, pos, qs);
    int64_t held = 0;
    for (int64_t j = SINK; j < nvis - WIN; j++) {
        sc[j] = -INFINITY;
        if (!kept[j * NKV + h])
            continue;
        const float *k = rows + ((size_t)j * NKV + h) * 2 * D;
        double x = 0;
        for (int32_t t = 0; t < D; t++)
            x += qs[t] * k[t];
        sc[j] = x;
        top = fmax(top, fabs(x));
        held++;
    }
    return topk_off(sc, nvis - WIN, sel, ns, held < BUDGET ? held : BUDGET, 1e-5 * top);
}

/* The decode steps of the sequence (after the prompt's exact prefill): each step's
 * attended tokens checked against the reference. */
static void check_kind(kvq_kv_kind kind, worst *w)
{
    const kvq_model_config c = test_synthetic_config(NL, NH, NKV, D);
    seq *s = malloc(sizeof *s);
    make_seq(s, 7 + (uint64_t)kind);
    kvq_retrieval *r = make_retrieval(&c);
    const kvq_kvcache_params kp = kv_params(kind, WIN);
    kvq_kvcache *kc = NULL;
    kvq_err e = {0};
    if (kvq_kvcache_create(&c, &kp, &kc, &e))
        fail_msg("kv cache: %s", e.msg);
    float *out, *rows, *exact;
    int *kept;
    const kvq_attn_backend b = attach_run(&c, s, r, kc, P, &out, &rows, &exact, &kept);
    for (int64_t at = 0; at < T; at = at ? at + 1 : P) {
        const int64_t n = at ? 1 : P;
        for (int32_t l = 0; l < NL; l++) {
            if (at)
                snapshot(kc, l, at, rows, kept); /* before the step's policy moves rows */
            kvq_attn_call call = {.layer = l, .n = (int32_t)n, .pos = s->pos + at,
                                  .q = s->q + at * NH * D, .k = s->k + at * NKV * D,
                                  .v = s->v + at * NKV * D, .out = out + at * NH * D};
            if (b.attend(b.user, &call, &e))
                fail_msg("attend: %s", e.msg);
            if (!at)
                continue;
            for (int32_t h = 0; h < NKV; h++) { /* the new token's row, after its append */
                float *x = rows + ((size_t)at * NKV + h) * 2 * D;
                kept[at * NKV + h] = kvq_kvcache_row(kc, l, h, at, x, x + D);
                assert_true(kept[at * NKV + h]);
            }
            const int64_t nvis = at + 1;
            for (int32_t h = 0; h < NKV; h++) {
                int64_t ns = 0, m = 0;
                const int32_t *sel = kvq_retrieval_last_selection(r, l, h, &ns);
                int32_t att[T];
                for (int64_t j = 0; j < nvis; j++) {
                    int in = j < SINK || j >= nvis - WIN;
                    for (int64_t a = 0; !in && a < ns; a++)
                        in = sel[a] == j;
                    if (in && !kept[j * NKV + h])
                        w->pruned_dropped++;
                    else if (in)
                        att[m++] = (int32_t)j;
                }
                const float *o = out + ((size_t)at * NH + (size_t)h * GS) * D;
                const float *q = s->q + ((size_t)at * NH + (size_t)h * GS) * D;
                if (nvis - WIN - SINK > BUDGET) { /* the oracle chose among candidates */
                    w->oracle_bad += oracle_check(&c, q, at, nvis, sel, ns, rows, kept, h);
                    w->oracle_steps++;
                }
                w->ok = fmax(w->ok, step_ref(&c, q, at, att, m, rows, h, o));
                w->exact = fmin(w->exact, step_ref(&c, q, at, att, m, exact, h, o));
                w->steps++;
            }
        }
    }
    for (int32_t l = 0; l < NL; l++) /* no rows of its own: none allocated */
        for (int32_t h = 0; h < NKV; h++)
            assert_true(r->layer[l].head[h].k == NULL && r->layer[l].head[h].v == NULL);
    kvq_retrieval_free(r);
    kvq_kvcache_free(kc);
    free(out);
    free(rows);
    free(exact);
    free(kept);
    free(s);
}

static void test_steps_read_compressed_rows(void **state)
{
    (void)state;
    const kvq_kv_kind kinds[] = {KVQ_KV_PATS, KVQ_KV_LEANKV, KVQ_KV_LEANKV_PATS};
    for (int i = 0; i < 3; i++) {
        worst w = {.ok = 0, .exact = INFINITY};
        check_kind(kinds[i], &w);
        printf("%-12s steps %lld: error against the compressed rows %.2e, against the exact "
               "rows >= %.2e; %lld pruned attended tokens dropped\n",
               kvq_kv_kind_name(kinds[i]), (long long)w.steps, w.ok, w.exact,
               (long long)w.pruned_dropped);
        assert_int_equal(w.steps, (T - P) * NL * NKV);
        assert_true(w.ok < 2e-6);   /* float sums against double */
        assert_true(w.exact > 1e-4); /* the compression is seen: not the exact rows */
        if (kinds[i] != KVQ_KV_PATS)
            assert_true(w.pruned_dropped > 0); /* the case is exercised */
        printf("%-12s oracle: %lld selections against the reference over the dequantized "
               "keys, %lld candidates off\n", kvq_kv_kind_name(kinds[i]),
               (long long)w.oracle_steps, (long long)w.oracle_bad);
        assert_true(w.oracle_steps > (T - P) * NL * NKV / 2);
        assert_int_equal(w.oracle_bad, 0);
    }
}

/* leankv+pats holds token t's rows as LeanKV's K8V4 of PATS's truncation by b(t) (the
 * schedule over the sequence's T tokens) of the rotated key and the value: the reader's
 * rows against kvq_rt_pats_truncate + kvq_rt_lkq_quantize (each against numpy in
 * test_kvcache.c). */
static void test_leankv_pats_rows(void **state)
{
    (void)state;
    const kvq_model_config c = test_synthetic_config(NL, NH, NKV, D);
    seq *s = malloc(sizeof *s);
    make_seq(s, 11);
    kvq_kvcache_params kp = kvq_kvcache_params_default();
    kp.kind = KVQ_KV_LEANKV_PATS;
    kp.alpha_h = kp.alpha_l = 0;
    kp.window = T; /* every token HIGH (K8V4) */
    kp.schedule = 2;
    kp.b_min = 2;
    kp.b_max = 10;
    kp.max_tokens = T;
    kvq_kvcache *kc = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_kvcache_create(&c, &kp, &kc, &e), KVQ_OK);
    for (int32_t l = 0; l < NL; l++)
        assert_int_equal(kvq_kvcache_append(kc, l, T, s->pos, s->k, s->v, &e), KVQ_OK);
    const kvq_rt_pats_params pp = {.schedule = 2, .b_min = 2, .b_max = 10};
    double theta[KVQ_ROPE_MAX_DIM / 2];
    kvq_rope_freqs(&c.rope, theta);
    int seen[11] = {0};
    for (int64_t j = 0; j < T; j++)
        for (int32_t h = 0; h < NKV; h++) {
            float k[D], v[D], kt[D], vt[D], kw[D], vw[D];
            uint8_t rk[4 + D], rv[4 + D / 2];
            const int32_t b = kvq_rt_pats_bits(&pp, j + 1, T);
            seen[b]++;
            memcpy(k, s->k + ((size_t)j * NKV + h) * D, sizeof k);
            kvq_rope_apply(&c.rope, theta, k, 1, j);
            assert_int_equal(kvq_rt_pats_truncate(k, D, b, kt, &e), KVQ_OK);
            assert_int_equal(kvq_rt_pats_truncate(s->v + ((size_t)j * NKV + h) * D, D, b, vt, &e),
                             KVQ_OK);
            assert_int_equal(kvq_rt_lkq_quantize(kt, D, 8, rk, &e), KVQ_OK);
            assert_int_equal(kvq_rt_lkq_quantize(vt, D, 4, rv, &e), KVQ_OK);
            kvq_rk_lkq_dequant(rk, D, 8, kw);
            kvq_rk_lkq_dequant(rv, D, 4, vw);
            for (int32_t l = 0; l < NL; l++) {
                assert_int_equal(kvq_kvcache_row(kc, l, h, j, k, v), 1);
                assert_memory_equal(k, kw, sizeof k);
                assert_memory_equal(v, vw, sizeof v);
            }
        }
    assert_true(seen[2] > 0 && seen[10] > 0); /* both ends of the schedule */
    kvq_kvcache_memory m;
    kvq_kvcache_memory_get(kc, &m); /* LeanKV's bytes: K8V4 rows, whatever b(t) */
    assert_true(m.bytes == (double)T * NL * NKV * (4 + D + 4 + D / 2));
    kvq_kvcache_free(kc);
    free(s);
}

/* A context of `selector` (positions rope, 256 bytes of RoPE table a position) over a
 * compressed cache, T tokens appended; its held bytes per token against the formats'
 * sizes, and no rows allocated. With the cache detached (f16 rows) the rows come back. */
static void test_held_bytes(void **state)
{
    (void)state;
    const kvq_model_config c = test_synthetic_config(NL, NH, NKV, D);
    seq *s = malloc(sizeof *s);
    make_seq(s, 5);
    const kvq_selector which[] = {KVQ_SELECT_ORACLE, KVQ_SELECT_QUEST, KVQ_SELECT_FIER};
    /* per layer and KV head: oracle nothing; Quest 2 D f32 per page of 16; FIER D / 8
     * bytes of bits and 2 D f32 per group of 32 */
    const double per_head[] = {0, 2.0 * D * 4 / 16, D / 8 + 2.0 * D * 4 / 32};
    for (int w = 0; w < 3; w++) {
        kvq_retrieval_params rp = retr_params(which[w]);
        rp.quest_page = 16;
        rp.fier_group = 32;
        kvq_retrieval *r = NULL;
        kvq_kvcache *kc = NULL;
        kvq_kvcache_params kp = kvq_kvcache_params_default();
        kp.kind = KVQ_KV_PATS;
        kp.max_tokens = T;
        kvq_err e = {0};
        assert_int_equal(kvq_retrieval_create(&c, NULL, &rp, &r, &e), KVQ_OK);
        assert_int_equal(kvq_kvcache_create(&c, &kp, &kc, &e), KVQ_OK);
        for (int attached = 1; attached >= 0; attached--) {
            kvq_retrieval_reset(r);
            assert_int_equal(kvq_retrieval_set_kvcache(r, attached ? kc : NULL, &e), KVQ_OK);
            for (int32_t l = 0; l < NL; l++) /* the selector's data, as an engine appends */
                assert_int_equal(kvq_retrieval_append(r, l, T, s->pos, s->k, s->v, &e), KVQ_OK);
            kvq_retrieval_held h;
            kvq_retrieval_held_get(r, &h);
            const double rows = attached ? 0 : (double)NL * NKV * 2 * D * 2; /* f16 K and V */
            assert_true(h.rows == rows);
            assert_true(h.selector == NL * NKV * per_head[w]);
            assert_true(h.positions == NL * 8.0); /* int64 positions, no row order */
            assert_true(h.rope == 4.0 * D);
            assert_true(h.total == rows + NL * NKV * per_head[w] + NL * 8.0 + 4.0 * D);
            for (int32_t l = 0; l < NL; l++)
                for (int32_t k = 0; k < NKV; k++)
                    assert_true((r->layer[l].head[k].k == NULL) == attached);
        }
        /* attaching mid-sequence is refused (the rows would be missing) */
        assert_int_equal(kvq_retrieval_set_kvcache(r, kc, &e), KVQ_E_INVALID_ARG);
        kvq_retrieval_free(r);
        kvq_kvcache_free(kc);
    }
    free(s);
}

/* The prompt prefilled in three calls (24, 24, 16 tokens): every row of every call
 * against the double reference over the earlier calls' tokens as the compressed cache
 * held them before the call (pruned ones left out) and the call's own tokens exact (an
 * f32 context: no rounding), and, where the cache compresses them, not the exact rows. */
static void check_prefill(kvq_kv_kind kind, int64_t prompt, double *ok, double *exact)
{
    const kvq_model_config c = test_synthetic_config(NL, NH, NKV, D);
    seq *s = malloc(sizeof *s);
    make_seq(s, 21 + (uint64_t)kind);
    kvq_retrieval_params rp = retr_params(KVQ_SELECT_ORACLE);
    rp.cache_dtype = KVQ_DT_F32;
    const kvq_kvcache_params kp = kv_params(kind, 8);
    kvq_retrieval *r;
    kvq_kvcache *kc;
    make_pair(&c, &rp, &kp, &r, &kc);
    kvq_err e = {0};
    float *out, *rows, *ex;
    int *kept;
    const kvq_attn_backend b = attach_run(&c, s, r, kc, prompt, &out, &rows, &ex, &kept);
    const int64_t cut[] = {0, 24, 48, 64};
    for (int ch = 0; ch < 3; ch++) {
        const int64_t at = cut[ch], n = cut[ch + 1] - at;
        for (int32_t l = 0; l < NL; l++) {
            snapshot(kc, l, at, rows, kept); /* before the call */
            kvq_attn_call call = {.layer = l, .n = (int32_t)n, .pos = s->pos + at,
                                  .q = s->q + at * NH * D, .k = s->k + at * NKV * D,
                                  .v = s->v + at * NKV * D, .out = out + at * NH * D};
            if (b.attend(b.user, &call, &e))
                fail_msg("attend: %s", e.msg);
            memcpy(rows + (size_t)at * NKV * 2 * D, ex + (size_t)at * NKV * 2 * D,
                   sizeof(float) * (size_t)n * NKV * 2 * D); /* the call's own: exact */
            for (int64_t i = 0; i < n; i++)
                for (int32_t h = 0; h < NKV; h++) {
                    int32_t att[T];
                    int64_t m = 0;
                    for (int64_t j = 0; j <= at + i; j++)
                        if (j >= at || kept[j * NKV + h])
                            att[m++] = (int32_t)j;
                    const size_t off = ((size_t)(at + i) * NH + (size_t)h * GS) * D;
                    *ok = fmax(*ok, step_ref(&c, s->q + off, at + i, att, m, rows, h, out + off));
                    if (at) /* later calls: the earlier tokens are read from the cache */
                        *exact = fmin(*exact,
                                      step_ref(&c, s->q + off, at + i, att, m, ex, h, out + off));
                }
        }
    }
    kvq_retrieval_free(r);
    kvq_kvcache_free(kc);
    free(out);
    free(rows);
    free(ex);
    free(kept);
    free(s);
}

static void test_prefill_in_calls(void **state)
{
    (void)state;
    const kvq_kv_kind kinds[] = {KVQ_KV_PATS, KVQ_KV_LEANKV, KVQ_KV_LEANKV_PATS, KVQ_KV_LEANKV};
    const int64_t prompt[] = {P, 0, 0, P}; /* LeanKV 0: generation phase from the start */
    for (int i = 0; i < 4; i++) {
        double ok = 0, exact = INFINITY;
        check_prefill(kinds[i], prompt[i], &ok, &exact);
        printf("%-12s prompt %2lld, prefill in 3 calls: error against the cache's rows %.2e, "
               "against the exact rows >= %.2e\n", kvq_kv_kind_name(kinds[i]),
               (long long)prompt[i], ok, exact);
        assert_true(ok < 2e-6);
        if (prompt[i] == 0 || kinds[i] == KVQ_KV_PATS)
            assert_true(exact > 1e-4); /* the earlier calls' rows are compressed */
        else
            assert_true(exact < 2e-6); /* LeanKV holds its prompt exactly until it ends */
    }
}

/* FIER (fier_group 8) with and without a compressed cache: every decode step's
 * selection against a double reference of FIER's definition (each held key's rotated
 * channels as one bit against its group's current range, (x - lo) 2 >= hi - lo; score
 * q . lo + the sum of q_c (hi_c - lo_c) over the set bits, q the group's summed rotated
 * query): the selected candidates are a top k of the reference's scores up to 1e-5 of
 * the largest. The bits are built at append from the call's keys, so the two contexts
 * select alike. */
static int64_t fier_check(const kvq_model_config *c, const float *q, int64_t pos, int64_t nvis,
                          const int32_t *sel, int64_t ns, const float *ex, int32_t h, int32_t fg)
{
    double qs[D], sc[T], top = 0;
    group_query(c, q, pos, qs);
    for (int64_t j = SINK; j < nvis - WIN; j++) {
        const int64_t g0 = j / fg * fg, g1 = g0 + fg < nvis ? g0 + fg : nvis;
        double x = 0;
        for (int32_t t = 0; t < D; t++) {
            double lo = INFINITY, hi = -INFINITY;
            for (int64_t u = g0; u < g1; u++) {
                lo = fmin(lo, ex[((size_t)u * NKV + h) * 2 * D + t]);
                hi = fmax(hi, ex[((size_t)u * NKV + h) * 2 * D + t]);
            }
            const double kx = ex[((size_t)j * NKV + h) * 2 * D + t];
            x += qs[t] * lo + ((kx - lo) * 2 >= hi - lo ? qs[t] * (hi - lo) : 0);
        }
        sc[j] = x;
        top = fmax(top, fabs(x));
    }
    return topk_off(sc, nvis - WIN, sel, ns, BUDGET, 1e-5 * top);
}

static void test_fier_selection(void **state)
{
    (void)state;
    const kvq_model_config c = test_synthetic_config(NL, NH, NKV, D);
    seq *s = malloc(sizeof *s);
    make_seq(s, 31);
    float *ex = malloc(sizeof(float) * T * NKV * 2 * D), *out = malloc(sizeof(float) * T * NH * D);
    exact_rows(&c, s, ex);
    for (int attached = 0; attached < 2; attached++) {
        kvq_retrieval_params rp = retr_params(KVQ_SELECT_FIER);
        rp.fier_group = 8;
        rp.sink = SINK;
        rp.window = WIN;
        rp.cache_dtype = KVQ_DT_F32;
        kvq_kvcache_params kp = kvq_kvcache_params_default();
        kp.kind = KVQ_KV_LEANKV;
        kp.max_tokens = T;
        kvq_retrieval *r = NULL;
        kvq_kvcache *kc = NULL;
        kvq_err e = {0};
        if (kvq_retrieval_create(&c, NULL, &rp, &r, &e) ||
            (attached && (kvq_kvcache_create(&c, &kp, &kc, &e) ||
                          kvq_retrieval_set_kvcache(r, kc, &e))))
            fail_msg("fier: %s", e.msg);
        const kvq_attn_backend b = kvq_retrieval_backend(r);
        b.reset(b.user);
        if (kc)
            assert_int_equal(kvq_kvcache_begin(kc, P, T, &e), KVQ_OK);
        int64_t steps = 0, bad = 0;
        for (int64_t at = 0; at < T; at = at ? at + 1 : P) {
            const int64_t n = at ? 1 : P;
            for (int32_t l = 0; l < NL; l++) {
                kvq_attn_call call = {.layer = l, .n = (int32_t)n, .pos = s->pos + at,
                                      .q = s->q + at * NH * D, .k = s->k + at * NKV * D,
                                      .v = s->v + at * NKV * D, .out = out + at * NH * D};
                if (b.attend(b.user, &call, &e))
                    fail_msg("attend: %s", e.msg);
                if (!at || at + 1 - WIN - SINK <= BUDGET)
                    continue;
                for (int32_t h = 0; h < NKV; h++) {
                    int64_t ns = 0;
                    const int32_t *sel = kvq_retrieval_last_selection(r, l, h, &ns);
                    bad += fier_check(&c, s->q + ((size_t)at * NH + (size_t)h * GS) * D, at,
                                      at + 1, sel, ns, ex, h, rp.fier_group);
                    steps++;
                }
            }
        }
        printf("fier %s: %lld selections against the reference, %lld candidates off\n",
               attached ? "over leankv" : "f32 rows", (long long)steps, (long long)bad);
        assert_true(steps > 0);
        assert_int_equal(bad, 0);
        kvq_retrieval_free(r);
        kvq_kvcache_free(kc);
    }
    free(ex);
    free(out);
    free(s);
}

/* measure = 1 over LeanKV (LOW and pruned tokens): the measurement is against full
 * attention over the rows the cache holds. Selector full attends every held token:
 * mass 1 and output error ~0 (over the exact rows it would be ~1e-2); the oracle
 * measured against its own selection over the same keys: recall 1. */
static void test_measure_over_cache(void **state)
{
    (void)state;
    const kvq_model_config c = test_synthetic_config(NL, NH, NKV, D);
    seq *s = malloc(sizeof *s);
    make_seq(s, 41);
    const kvq_selector which[] = {KVQ_SELECT_FULL, KVQ_SELECT_ORACLE};
    for (int w = 0; w < 2; w++) {
        kvq_retrieval_params rp = retr_params(which[w]);
        rp.sink = SINK;
        rp.window = WIN;
        rp.measure = 1;
        const kvq_kvcache_params kp = kv_params(KVQ_KV_LEANKV, WIN);
        kvq_retrieval *r;
        kvq_kvcache *kc;
        make_pair(&c, &rp, &kp, &r, &kc);
        kvq_err e = {0};
        float *out, *rows, *ex;
        int *kept;
        const kvq_attn_backend b = attach_run(&c, s, r, kc, P, &out, &rows, &ex, &kept);
        for (int64_t at = 0; at < T; at = at ? at + 1 : P)
            for (int32_t l = 0; l < NL; l++) {
                const int64_t n = at ? 1 : P;
                kvq_attn_call call = {.layer = l, .n = (int32_t)n, .pos = s->pos + at,
                                      .q = s->q + at * NH * D, .k = s->k + at * NKV * D,
                                      .v = s->v + at * NKV * D, .out = out + at * NH * D};
                if (b.attend(b.user, &call, &e))
                    fail_msg("attend: %s", e.msg);
            }
        kvq_retrieval_stats st;
        kvq_retrieval_stats_get(r, &st);
        kvq_kvcache_memory mem;
        kvq_kvcache_memory_get(kc, &mem);
        const double ms = (double)st.measured;
        printf("measure %-8s over leankv (%.0f pruned): %.0f steps, mass %.6f, output error "
               "%.2e, recall %.6f\n", kvq_selector_name(which[w]), mem.pruned, ms,
               st.recall_mass / ms, st.out_rel_err / ms, st.recall_topk / ms);
        assert_true(ms == (double)(T - P) * NL * NKV && mem.pruned > 0);
        if (which[w] == KVQ_SELECT_FULL) {
            assert_true(fabs(st.recall_mass / ms - 1) < 1e-5);
            assert_true(st.out_rel_err / ms < 1e-5);
        } else {
            assert_true(st.recall_topk == ms); /* the same oracle, the same keys */
            assert_true(st.recall_mass / ms < 1);
        }
        kvq_retrieval_free(r);
        kvq_kvcache_free(kc);
        free(out);
        free(rows);
        free(ex);
        free(kept);
    }
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_leankv_pats_rows),
        cmocka_unit_test(test_steps_read_compressed_rows),
        cmocka_unit_test(test_held_bytes),
        cmocka_unit_test(test_prefill_in_calls),
        cmocka_unit_test(test_fier_selection),
        cmocka_unit_test(test_measure_over_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
