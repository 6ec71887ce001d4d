/* test_kvcache.c — the runtime's compressed KV caches (runtime/cache/kvc.h): LeanKV
 * quantization and PATS truncation / packing bit for bit against the numpy reference
 * of scripts/gen_kvcache_golden.py (tests/data/kvcache_golden.bin: edge values, refused
 * infinities and NaN), the b(t) schedules, LeanKV's prompt rule and Algorithm 1 on
 * recorded significance sequences (the classes of every token after every step), the
 * readers of the rows (dot, axpy) against the dequantized rows, the caches of one head
 * (attention read from the rows against attention over the dequantized rows,
 * significance against the probabilities, bytes held) and out-of-range parameters. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cache/kvc.h"

#define GOLDEN "tests/data/kvcache_golden.bin"

typedef struct golden {
    uint8_t *buf;
    size_t len, at;
} golden;

static void take(golden *g, void *dst, size_t n)
{
    assert_true(g->at + n <= g->len);
    memcpy(dst, g->buf + g->at, n);
    g->at += n;
}

static uint32_t u32(golden *g)
{
    uint32_t v;
    take(g, &v, 4);
    return v;
}

static void golden_open(golden *g)
{
    FILE *f = fopen(GOLDEN, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    g->len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    g->buf = malloc(g->len);
    assert_int_equal(fread(g->buf, 1, g->len, f), g->len);
    fclose(f);
    g->at = 0;
    char magic[4];
    take(g, magic, 4);
    assert_memory_equal(magic, "KVCG", 4);
    assert_int_equal(u32(g), 1);
}

/* Every record of one kind through fn; returns how many. */
typedef void (*rec_fn)(golden *g, int *counts);

/* Checks what the cache made of a record's input against the record: s the status of
 * making row (rb bytes); a refused input (ok 0) must fail with KVQ_E_NUMERIC (counts[1]);
 * else row must be the record's row and dec(row) (into mine, n floats) the record's
 * dequantized values (read into xh). Returns ok. */
typedef void (*row_dec)(const uint8_t *row, int32_t n, int32_t b, float *out);
static int row_matches(golden *g, uint32_t ok, kvq_status s, const uint8_t *row, size_t rb,
                       row_dec dec, int32_t n, int32_t b, float *xh, float *mine, int *counts)
{
    if (!ok) {
        assert_int_equal(s, KVQ_E_NUMERIC);
        counts[1]++;
        return 0;
    }
    assert_int_equal(s, KVQ_OK);
    uint8_t *want = malloc(rb);
    take(g, want, rb);
    take(g, xh, sizeof(float) * n);
    assert_memory_equal(row, want, rb);
    dec(row, n, b, mine);
    assert_memory_equal(mine, xh, sizeof(float) * n);
    free(want);
    return 1;
}

static void lkq_record(golden *g, int *counts)
{
    const int32_t n = (int32_t)u32(g), bits = (int32_t)u32(g);
    float *x = malloc(sizeof(float) * n), *xh = malloc(sizeof(float) * n);
    float *mine = malloc(sizeof(float) * n), *q = malloc(sizeof(float) * n);
    take(g, x, sizeof(float) * n);
    const uint32_t ok = u32(g);
    const size_t rb = kvq_rk_lkq_row_bytes(n, bits);
    uint8_t *row = malloc(rb);
    kvq_err err = {0};
    kvq_status s = kvq_rt_lkq_quantize(x, n, bits, row, &err);
    if (!row_matches(g, ok, s, row, rb, kvq_rk_lkq_dequant, n, bits, xh, mine, counts)) {
        assert_true(strlen(err.msg) > 0);
    } else {
        /* the readers against the dequantized row */
        double ref = 0, mag = 0;
        for (int32_t t = 0; t < n; t++) {
            q[t] = (float)((t * 37 % 11) - 5) * 0.25f;
            ref += (double)q[t] * xh[t];
            mag += fabs((double)q[t] * xh[t]) + fabs((double)q[t]) * 1e-3;
        }
        const float dot1 = kvq_rk_lkq_dot(q, row, n, bits);
        assert_true(fabs(dot1 - ref) <= 1e-5 * mag + 1e-30);
        float dn[2], an[2] = {0.5f, 0}, yn[2 * 512] = {0};
        const uint8_t *rows[1] = {row};
        const int8_t bb[1] = {(int8_t)bits};
        const float qs[2] = {kvq_rk_qsum(q, n), kvq_rk_qsum(q, n)};
        /* the many-rows form, SIMD where the CPU has it: the same bits */
        kvq_rk_lkq_logits(KVQ_ISA_AVX512, q, 2, 0, qs, rows, bb, 1, n, 1.0f, dn, 1);
        assert_true(dn[0] == dot1 && dn[1] == dot1);
        kvq_rk_lkq_mix(KVQ_ISA_AVX512, an, 2, 1, rows, bb, 1, n, yn, n);
        memset(mine, 0, sizeof(float) * n);
        kvq_rk_lkq_axpy(0.5f, row, n, bits, mine);
        for (int32_t t = 0; t < n; t++)
            assert_true(mine[t] == 0.5f * xh[t] && yn[t] == mine[t] && yn[n + t] == 0);
        counts[0]++;
    }
    free(x), free(xh), free(mine), free(q), free(row);
}

static void pats_record(golden *g, int *counts)
{
    const int32_t n = (int32_t)u32(g), b = (int32_t)u32(g);
    float *x = malloc(sizeof(float) * n), *xt = malloc(sizeof(float) * n);
    float *mine = malloc(sizeof(float) * n);
    take(g, x, sizeof(float) * n);
    const uint32_t ok = u32(g);
    const size_t rb = kvq_rk_pats_row_bytes(n, b);
    uint8_t *row = malloc(rb + KVQ_RK_PATS_PAD);
    kvq_err err = {0};
    kvq_status s = kvq_rt_pats_pack_f32(x, n, b, row, &err);
    if (row_matches(g, ok, s, row, rb, kvq_rk_pats_unpack, n, b, xt, mine, counts)) {
        double ref = 0, mag = 0;
        for (int32_t t = 0; t < n; t++) {
            ref += (double)xt[t] * (t % 3 - 1);
            mag += fabs((double)xt[t]);
        }
        float *q = mine;
        for (int32_t t = 0; t < n; t++)
            q[t] = (float)(t % 3 - 1);
        /* float sums in 16 lanes (kvc_rows.h): exact products, at most n / 16 + 4 roundings
         * on the way to any partial sum */
        const float dot1 = kvq_rk_pats_dot(q, row, n, b);
        assert_true(fabs(dot1 - ref) <= (n / 16.0 + 4.0) * 0x1p-24 * mag);
        float dn[1];
        const uint8_t *rows[1] = {row};
        const int8_t bb[1] = {(int8_t)b};
        kvq_rk_pats_logits(KVQ_ISA_AVX512, q, 1, 0, rows, bb, 1, n, 1.0f, dn, 1);
        assert_true(dn[0] == dot1);
        counts[0]++;
    }
    free(x), free(xt), free(mine), free(row);
}

/* leankv+pats: the cache's two steps (kvq_rt_pats_truncate, then kvq_rt_lkq_quantize
 * of the truncated values) against the reference's row and dequantized values. */
static void lkpats_record(golden *g, int *counts)
{
    const int32_t n = (int32_t)u32(g), b = (int32_t)u32(g), bits = (int32_t)u32(g);
    float *x = malloc(sizeof(float) * n), *xh = malloc(sizeof(float) * n);
    float *t = malloc(sizeof(float) * n), *mine = malloc(sizeof(float) * n);
    take(g, x, sizeof(float) * n);
    const uint32_t ok = u32(g);
    const size_t rb = kvq_rk_lkq_row_bytes(n, bits);
    uint8_t *row = malloc(rb);
    kvq_err err = {0};
    kvq_status s = kvq_rt_pats_truncate(x, n, b, t, &err);
    if (!s)
        s = kvq_rt_lkq_quantize(t, n, bits, row, &err);
    if (row_matches(g, ok, s, row, rb, kvq_rk_lkq_dequant, n, bits, xh, mine, counts))
        counts[0]++;
    free(x), free(xh), free(t), free(mine), free(row);
}

static void schedule_record(golden *g, int *counts)
{
    kvq_rt_pats_params p;
    p.schedule = (int32_t)u32(g);
    p.b_min = (int32_t)u32(g);
    p.b_max = (int32_t)u32(g);
    const int64_t T = u32(g);
    for (int64_t t = 1; t <= T; t++) {
        int32_t want;
        take(g, &want, 4);
        assert_int_equal(kvq_rt_pats_bits(&p, t, T), want);
    }
    counts[0]++;
}

static void policy_record(golden *g, int *counts)
{
    const int64_t N = u32(g), P = u32(g);
    kvq_rt_lk_params p = kvq_rt_lk_params_default();
    p.window = (int32_t)u32(g);
    take(g, &p.alpha_h, 8);
    take(g, &p.alpha_l, 8);
    double *sig = malloc(sizeof(double) * N);
    uint8_t *cls = malloc(N), *want = malloc(N);
    for (int64_t n = P; n <= N; n++) {
        take(g, sig, sizeof(double) * n);
        take(g, want, n);
        if (n == P)
            kvq_rt_lk_classify_prompt(sig, n, &p, cls);
        else
            kvq_rt_lk_generation_step(sig, n, &p, cls);
        assert_memory_equal(cls, want, n);
        for (int64_t j = 0; j < n; j++)
            counts[1 + cls[j]]++; /* the sections seen, over all steps */
    }
    counts[0]++;
    free(sig), free(cls), free(want);
}

static void test_golden(void **state)
{
    (void)state;
    golden g;
    golden_open(&g);
    const uint32_t n_rec = u32(&g);
    int lkq[2] = {0}, pats[2] = {0}, sched[1] = {0}, pol[4] = {0}, lkp[2] = {0};
    for (uint32_t i = 0; i < n_rec; i++) {
        switch (u32(&g)) {
        case 1: lkq_record(&g, lkq); break;
        case 2: pats_record(&g, pats); break;
        case 3: schedule_record(&g, sched); break;
        case 4: policy_record(&g, pol); break;
        case 5: lkpats_record(&g, lkp); break;
        default: fail_msg("unknown record kind");
        }
    }
    assert_int_equal(g.at, g.len);
    /* the file exercises what it should: refusals, every section at some step */
    assert_true(lkq[0] > 50 && lkq[1] >= 5 && pats[0] > 100 && pats[1] >= 4);
    assert_int_equal(sched[0], 21);
    assert_int_equal(pol[0], 7);
    assert_true(lkp[0] > 80 && lkp[1] >= 4); /* leankv+pats rows and their refusals */
    assert_true(pol[1] > 0 && pol[2] > 0 && pol[3] > 0);
    free(g.buf);
}

/* ==========================================================================
 * The caches of one head
 * ========================================================================== */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Softmax attention of q [d] over rows K, V [n, d] (f32, kept[j] != 0) in double: the
 * output into o [d], the probabilities into pr [n]; returns sum_j p_j |v_j|_1. */
static double attend_ref(const float *q, const float *K, const float *V, const uint8_t *kept,
                         int64_t n, int32_t d, float scale, double *o, double *pr)
{
    double mx = -INFINITY, sum = 0, mag = 0;
    for (int64_t j = 0; j < n; j++) {
        double s = 0;
        for (int32_t t = 0; t < d; t++)
            s += (double)q[t] * K[j * d + t];
        pr[j] = kept[j] ? s * scale : -INFINITY;
        mx = pr[j] > mx ? pr[j] : mx;
    }
    for (int64_t j = 0; j < n; j++)
        sum += (pr[j] = kept[j] ? exp(pr[j] - mx) : 0);
    memset(o, 0, sizeof(double) * d);
    for (int64_t j = 0; j < n; j++) {
        pr[j] /= sum;
        for (int32_t t = 0; t < d; t++) {
            o[t] += pr[j] * V[j * d + t];
            mag += pr[j] * fabs(V[j * d + t]);
        }
    }
    return mag;
}

enum { HD = 64, HGS = 2, HP = 48, HN = 100 };

/* The head's rows as f32 (dequantized from its pools; the prompt's exact rows before
 * the prompt ends) into K, V [n, d]; kept [n]; checks the pools' counts. */
static void head_rows(const kvq_rt_lk_head *H, float *K, float *V, uint8_t *kept)
{
    int64_t cnt[3] = {0};
    for (int64_t j = 0; j < H->n; j++) {
        const int c = H->cls[j];
        cnt[c]++;
        kept[j] = c != KVQ_RT_LK_PRUNED;
        if (!H->prompt_done) {
            memcpy(K + j * HD, H->exact + j * 2 * HD, sizeof(float) * HD);
            memcpy(V + j * HD, H->exact + (j * 2 + 1) * HD, sizeof(float) * HD);
        } else if (kept[j]) {
            const kvq_rt_lk_pool *P = &H->pool[c];
            const uint8_t *row = P->data + (size_t)H->slot[j] * P->row;
            kvq_rk_lkq_dequant(row, HD, P->kb, K + j * HD);
            kvq_rk_lkq_dequant(row + P->krow, HD, P->vb, V + j * HD);
        } else {
            assert_int_equal(H->slot[j], -1);
        }
    }
    if (H->prompt_done) {
        assert_int_equal(H->pool[KVQ_RT_LK_LOW].used, cnt[KVQ_RT_LK_LOW]);
        assert_int_equal(H->pool[KVQ_RT_LK_HIGH].used, cnt[KVQ_RT_LK_HIGH]);
        double lo, hi, ex;
        kvq_rt_lk_bytes(H, &lo, &hi, &ex);
        assert_true(lo == (double)cnt[1] * (4 + HD * 4 / 8 + 4 + HD * 2 / 8));
        assert_true(hi == (double)cnt[2] * (4 + HD + 4 + HD * 4 / 8));
    }
}

static void run_leankv_head(double alpha_h, double alpha_l, int32_t window, int64_t *counts)
{
    kvq_rt_lk_params p = kvq_rt_lk_params_default();
    p.alpha_h = alpha_h, p.alpha_l = alpha_l, p.window = window;
    kvq_rt_lk_head H;
    kvq_err err = {0};
    assert_int_equal(kvq_rt_lk_head_init(&H, HD, HGS, &p, &err), KVQ_OK);
    float *K = malloc(sizeof(float) * HN * HD), *V = malloc(sizeof(float) * HN * HD);
    float k[HD], v[HD], q[HGS * HD], o[HGS * HD];
    double oref[HD], pr[HN], acc[HN][HGS] = {{0}}, sig[HN];
    int64_t qafter[HN] = {0};
    uint8_t kept[HN], cls[HN];
    const float scale = 0.125f;
    for (int64_t n = 1; n <= HN; n++) {
        for (int32_t t = 0; t < HD; t++)
            k[t] = 2 * rnd() + (n % 7 == 0 ? 1.5f : 0), v[t] = rnd();
        for (int32_t t = 0; t < HGS * HD; t++)
            q[t] = 2 * rnd();
        assert_int_equal(kvq_rt_lk_append(&H, k, v, &err), KVQ_OK);
        head_rows(&H, K, V, kept);
        kvq_rt_lk_attend(&H, q, scale, o);
        for (int32_t g = 0; g < HGS; g++) {
            const double mag = attend_ref(q + g * HD, K, V, kept, n, HD, scale, oref, pr);
            for (int32_t t = 0; t < HD; t++)
                assert_true(fabs(o[g * HD + t] - oref[t]) <= 2e-5 * mag + 1e-7);
            for (int64_t j = 0; j + 1 < n; j++)
                acc[j][g] += pr[j];
        }
        for (int64_t j = 0; j + 1 < n; j++)
            qafter[j]++;
        for (int64_t j = 0; j < n; j++)
            sig[j] = qafter[j] ? fmax(acc[j][0], acc[j][1]) / (double)qafter[j] : INFINITY;
        if (n == HP) {
            assert_int_equal(kvq_rt_lk_end_prompt(&H, &err), KVQ_OK);
            kvq_rt_lk_classify_prompt(sig, n, &p, cls);
        } else if (n > HP) {
            assert_int_equal(kvq_rt_lk_step(&H, &err), KVQ_OK);
            kvq_rt_lk_generation_step(sig, n, &p, cls);
        }
        if (n >= HP) {
            for (int64_t j = 0; j < n; j++)
                assert_true(fabs(H.sig[j] - sig[j]) <= 1e-6 * fabs(sig[j]) || H.sig[j] == sig[j]);
            assert_memory_equal(H.cls, cls, n);
        }
    }
    for (int64_t j = 0; j < HN; j++)
        counts[cls[j]]++;
    kvq_rt_lk_head_free(&H);
    free(K), free(V);
}

static void test_leankv_head(void **state)
{
    (void)state;
    int64_t c[3] = {0};
    run_leankv_head(1.0, 0.3, 8, c);
    assert_true(c[0] > 0 && c[1] > 0 && c[2] > 0); /* every section used */
    int64_t all[3] = {0};
    run_leankv_head(0.0, 0.0, 8, all); /* alpha 0: every token HIGH, 104 of 256 bytes */
    assert_int_equal(all[KVQ_RT_LK_HIGH], HN);
    int64_t w0[3] = {0};
    run_leankv_head(2.0, 0.5, 0, w0);
}

static void test_pats_head(void **state)
{
    (void)state;
    for (int32_t sch = 0; sch < KVQ_RT_PATS_N_SCHEDULES; sch++) {
        kvq_rt_pats_params p = {.schedule = sch, .b_min = 2, .b_max = 8};
        kvq_rt_pats_head H;
        kvq_err err = {0};
        const int64_t T = 50;
        assert_int_equal(kvq_rt_pats_head_init(&H, HD, HGS, T, &p, &err), KVQ_OK);
        float *K = malloc(sizeof(float) * T * HD), *V = malloc(sizeof(float) * T * HD);
        float k[HD], v[HD], q[HGS * HD], o[HGS * HD];
        double oref[HD], pr[50];
        uint8_t kept[50];
        int64_t bytes = 0;
        for (int64_t t = 0; t < T; t++) {
            for (int32_t i = 0; i < HD; i++)
                k[i] = 3 * rnd(), v[i] = rnd();
            assert_int_equal(kvq_rt_pats_append(&H, k, v, &err), KVQ_OK);
            const int32_t b = kvq_rt_pats_bits(&p, t + 1, T);
            const size_t rb = kvq_rk_pats_row_bytes(HD, b);
            bytes += 2 * (int64_t)rb;
            kvq_rk_pats_unpack(H.data + H.off[t], HD, b, K + t * HD);
            kvq_rk_pats_unpack(H.data + H.off[t] + rb, HD, b, V + t * HD);
            kept[t] = 1;
        }
        assert_int_equal(H.bytes, bytes);
        assert_true(bytes < T * 4 * HD); /* fewer bytes than the f16 cache */
        for (int32_t i = 0; i < HGS * HD; i++)
            q[i] = rnd();
        kvq_rt_pats_attend(&H, q, 0.125f, o);
        for (int32_t g = 0; g < HGS; g++) {
            const double mag = attend_ref(q + g * HD, K, V, kept, T, HD, 0.125f, oref, pr);
            for (int32_t i = 0; i < HD; i++)
                assert_true(fabs(o[g * HD + i] - oref[i]) <= 2e-5 * mag + 1e-7);
        }
        assert_int_equal(kvq_rt_pats_append(&H, k, v, &err), KVQ_E_INVALID_ARG); /* full */
        kvq_rt_pats_head_free(&H);
        free(K), free(V);
    }
}

static void test_bad_params(void **state)
{
    (void)state;
    kvq_err err = {0};
    kvq_rt_lk_params p = kvq_rt_lk_params_default();
    assert_int_equal(kvq_rt_lk_check(&p, &err), KVQ_OK);
    p.alpha_h = -1;
    assert_int_equal(kvq_rt_lk_check(&p, &err), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "alpha_h"));
    p = kvq_rt_lk_params_default();
    p.alpha_l = NAN;
    assert_int_equal(kvq_rt_lk_check(&p, &err), KVQ_E_INVALID_ARG);
    p = kvq_rt_lk_params_default();
    p.alpha_l = 2, p.alpha_h = 1;
    assert_int_equal(kvq_rt_lk_check(&p, &err), KVQ_E_INVALID_ARG);
    p = kvq_rt_lk_params_default();
    p.v_low = 9;
    assert_int_equal(kvq_rt_lk_check(&p, &err), KVQ_E_INVALID_ARG);
    kvq_rt_pats_params q = {.schedule = 2, .b_min = 2, .b_max = 11};
    assert_int_equal(kvq_rt_pats_check(&q, &err), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "exponent"));
    q.b_max = 1;
    assert_int_equal(kvq_rt_pats_check(&q, &err), KVQ_E_INVALID_ARG);
    q.b_max = 8, q.schedule = 3;
    assert_int_equal(kvq_rt_pats_check(&q, &err), KVQ_E_INVALID_ARG);
    int32_t s;
    assert_int_equal(kvq_rt_pats_schedule_parse("middle-heavy", &s), 0);
    assert_int_equal(s, KVQ_RT_PATS_MIDDLE_HEAVY);
    assert_int_equal(kvq_rt_pats_schedule_parse("middle", &s), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_leankv_head),
        cmocka_unit_test(test_pats_head),
        cmocka_unit_test(test_bad_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
