/* test_thresholds.c — the thresholds stage: per-vector quantization error bounds, LeanKV
 * significance and classes on hand-built attention patterns (prompt rule and Algorithm 1),
 * PATS schedules against their formulas, truncation bits, memory against hand counts
 * (LeanKV bytes, PATS 64-byte packing, through the simulated cache), the simulated cache
 * against exact attention, the profile on a synthetic capture (the chosen setting meets
 * its tolerance when measured again, thread-count independence, an unmeetable tolerance,
 * another model's artifact, empty captures, the written artifact), and the real tiny
 * model's perplexity through the simulated cache. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "helpers/testutil.h"
#include "kvq/util.h"
#include "kvq.h"
#include "kvq/capture.h"
#include "kvq/model.h"
#include "kvq/thresholds.h"
#include "kvq/tokenizer.h"
#include "runtime/cache/kvc.h"

/* ==========================================================================
 * Per-vector quantization
 * ========================================================================== */

static void test_asymq_hand_values(void **state)
{
    (void)state;
    const float x[4] = {0, 1, 2, 3};
    uint8_t codes[4];
    kvq_asymq_meta m;
    float y[4];
    kvq_err e = {0};
    assert_int_equal(kvq_asymq_quantize_ref(x, 4, 2, codes, &m, &e), KVQ_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(codes[i], i);
    assert_int_equal(m.scale, 0x3c00); /* 1.0 */
    assert_int_equal(m.zero, 0x0000);
    kvq_asymq_dequantize_ref(codes, 4, m, y);
    for (int i = 0; i < 4; i++)
        assert_true(y[i] == x[i]);
    /* a constant vector: scale 0, every code 0, value f16(x) */
    const float c[3] = {-2.5f, -2.5f, -2.5f};
    assert_int_equal(kvq_asymq_roundtrip(c, 3, 4, y, &e), KVQ_OK);
    for (int i = 0; i < 3; i++)
        assert_true(y[i] == -2.5f);
    /* bytes: ceil(n bits / 8) + 4 */
    assert_int_equal(kvq_asymq_bytes(128, 8), 132);
    assert_int_equal(kvq_asymq_bytes(128, 4), 68);
    assert_int_equal(kvq_asymq_bytes(3, 2), 5);
    /* bad input */
    assert_int_equal(kvq_asymq_quantize_ref(x, 4, 0, codes, &m, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_asymq_quantize_ref(x, 4, 9, codes, &m, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_asymq_quantize_ref(x, 0, 4, codes, &m, &e), KVQ_E_INVALID_ARG);
    const float bad[2] = {1.0f, NAN};
    assert_int_equal(kvq_asymq_quantize_ref(bad, 2, 4, codes, &m, &e), KVQ_E_NUMERIC);
    const float huge[2] = {-1e6f, 1.0f};
    assert_int_equal(kvq_asymq_quantize_ref(huge, 2, 4, codes, &m, &e), KVQ_E_NUMERIC);
}

static void test_asymq_error_bound(void **state)
{
    (void)state;
    kvq_rng r;
    kvq_rng_seed(&r, 7);
    const int bits[] = {2, 3, 4, 8};
    float x[64], y[64];
    uint8_t codes[64];
    kvq_err e = {0};
    for (int trial = 0; trial < 400; trial++) {
        const int b = bits[trial % 4], n = 1 + (int)kvq_rng_below(&r, 64);
        const double scale = pow(10.0, -3 + 5 * kvq_rng_uniform(&r));
        const double shift = (kvq_rng_uniform(&r) - 0.5) * 4 * scale;
        float lo = INFINITY, hi = -INFINITY;
        for (int i = 0; i < n; i++) {
            x[i] = (float)(shift + scale * kvq_rng_normal(&r));
            lo = x[i] < lo ? x[i] : lo;
            hi = x[i] > hi ? x[i] : hi;
        }
        kvq_asymq_meta m;
        assert_int_equal(kvq_asymq_quantize_ref(x, n, b, codes, &m, &e), KVQ_OK);
        kvq_asymq_dequantize_ref(codes, n, m, y);
        const double s16 = kvq_f16_to_f32_ref(m.scale), z16 = kvq_f16_to_f32_ref(m.zero);
        assert_true(s16 >= (hi - lo) / ((1 << b) - 1) * (1 - 1e-6)); /* rounded up */
        const double bound = s16 / 2 + fabs(lo + z16) + 1e-6 * (fabs(lo) + fabs(hi));
        for (int i = 0; i < n; i++) {
            assert_true(codes[i] < (1u << b));
            if (!(fabs((double)x[i] - y[i]) <= bound))
                fail_msg("bits %d: |%g - %g| > %g", b, (double)x[i], (double)y[i], bound);
        }
    }
}

/* ==========================================================================
 * LeanKV
 * ========================================================================== */

/* Two query heads over 6 tokens; rows are causal distributions. Significance by hand:
 *   token 1: head 0 (.5+.6+.7+.45+.5)/5 = .55, head 1 (1+.8+.25+.3+.1)/5 = .49 -> .55
 *   token 2: (.2+.1+.1+.1)/4 = .125, (.2+.25+.2+.1)/4 = .1875               -> .1875
 *   token 3: (.1+.3+.1)/3 = 1/6, (.25+.2+.1)/3 = .18333                     -> .18333
 *   token 4: (.05+.1)/2 = .075, (.1+.1)/2 = .1                              -> .1
 *   token 5: .1, .1                                                          -> .1
 *   token 6: no later query                                                  -> +inf */
static void fill_attention(double *A)
{
    static const double a0[6][6] = {{1}, {.5, .5}, {.6, .2, .2}, {.7, .1, .1, .1},
                                    {.45, .1, .3, .05, .1}, {.5, .1, .1, .1, .1, .1}};
    static const double a1[6][6] = {{1}, {1, 0}, {.8, .2, 0}, {.25, .25, .25, .25},
                                    {.3, .2, .2, .1, .2}, {.1, .1, .1, .1, .1, .5}};
    for (int r = 0; r < 6; r++)
        for (int j = 0; j < 6; j++) {
            A[r * 6 + j] = a0[r][j];
            A[36 + r * 6 + j] = a1[r][j];
        }
}

static void test_leankv_hand_pattern(void **state)
{
    (void)state;
    double A[72], sig[6];
    fill_attention(A);
    kvq_leankv_significance(A, 2, 6, sig);
    const double want[5] = {0.55, 0.1875, 0.55 / 3, 0.1, 0.1};
    for (int j = 0; j < 5; j++)
        assert_true(fabs(sig[j] - want[j]) < 1e-12);
    assert_true(isinf(sig[5]));

    kvq_leankv_params p = kvq_leankv_params_default();
    uint8_t cls[6];
    enum { P = KVQ_LEANKV_PRUNED, L = KVQ_LEANKV_LOW, H = KVQ_LEANKV_HIGH };
    /* alpha_h .5, alpha_l .3, window 1:
     * i=1 .55 >= .5 H; i=2 .1875 < .25, >= .15 L; i=3 .1833 >= .1667 H; i=4 .1 < .125,
     * >= .075 L; i=5 .1 >= .1 H (equality counts); i=6 window H */
    p.alpha_h = 0.5, p.alpha_l = 0.3, p.window = 1;
    kvq_leankv_classify_prompt(sig, 6, &p, cls);
    const uint8_t c1[6] = {H, L, H, L, H, H};
    assert_memory_equal(cls, c1, 6);
    /* the window of 3 keeps tokens 4..6 high */
    p.window = 3;
    kvq_leankv_classify_prompt(sig, 6, &p, cls);
    const uint8_t c2[6] = {H, L, H, H, H, H};
    assert_memory_equal(cls, c2, 6);
    /* alpha_h .6, alpha_l .4, window 1:
     * i=1 .55 in [.4, .6) L; i=2 .1875 < .2 P; i=3 .1833 in [.1333, .2) L; i=4 .1 >= .1 L;
     * i=5 .1 in [.08, .12) L */
    p.alpha_h = 0.6, p.alpha_l = 0.4, p.window = 1;
    kvq_leankv_classify_prompt(sig, 6, &p, cls);
    const uint8_t c3[6] = {L, P, L, L, L, H};
    assert_memory_equal(cls, c3, 6);
    /* alpha_h 0: everything high; alpha_l 0: nothing pruned */
    p.alpha_h = 0, p.alpha_l = 0, p.window = 0;
    kvq_leankv_classify_prompt(sig, 6, &p, cls);
    for (int j = 0; j < 6; j++)
        assert_int_equal(cls[j], H);
    assert_int_equal(kvq_leankv_rule(NAN, 3, &p), KVQ_LEANKV_PRUNED);

    kvq_err e = {0};
    p = kvq_leankv_params_default();
    assert_int_equal(kvq_leankv_check(&p, &e), KVQ_OK);
    p.alpha_l = -1;
    assert_int_equal(kvq_leankv_check(&p, &e), KVQ_E_INVALID_ARG);
    p = kvq_leankv_params_default();
    p.k_low = 9;
    assert_int_equal(kvq_leankv_check(&p, &e), KVQ_E_INVALID_ARG);
    /* one check with the runtime cache's: alpha_l above alpha_h is refused by both */
    p = kvq_leankv_params_default();
    p.alpha_h = 0, p.alpha_l = 0.02;
    assert_int_equal(kvq_leankv_check(&p, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "alpha_l"));
    const kvq_rt_lk_params r = {p.alpha_h, p.alpha_l, p.window, p.k_high, p.v_high, p.k_low,
                                p.v_low};
    assert_int_equal(kvq_rt_lk_check(&r, &e), KVQ_E_INVALID_ARG);
    p.alpha_l = 0;
    assert_int_equal(kvq_leankv_check(&p, &e), KVQ_OK);
    /* one default: the paper's, as the runtime's */
    const kvq_leankv_params d = kvq_leankv_params_default();
    const kvq_rt_lk_params rd = kvq_rt_lk_params_default();
    assert_true(d.alpha_h == rd.alpha_h && d.alpha_l == rd.alpha_l && d.window == rd.window);
    assert_true(d.alpha_h == 1.0 && d.alpha_l == 0.02 && d.window == 64);
    assert_true(d.k_high == rd.k_high && d.v_high == rd.v_high && d.k_low == rd.k_low &&
                d.v_low == rd.v_low);
}

static void test_leankv_generation_steps(void **state)
{
    (void)state;
    enum { P = KVQ_LEANKV_PRUNED, L = KVQ_LEANKV_LOW, H = KVQ_LEANKV_HIGH };
    kvq_leankv_params p = kvq_leankv_params_default();
    p.alpha_h = 1, p.alpha_l = 0.5, p.window = 2;
    uint8_t cls[8] = {H, H, H, H};
    /* n = 5: T_h .2, T_l .1; token 2 (sig .3) leaves the window -> H; the least
     * significant H is token 1 (.15), in [.1, .2): -> L */
    const double s5[5] = {0.5, 0.15, 0.3, 0.12, INFINITY};
    assert_int_equal(kvq_leankv_generation_step(s5, 5, &p, cls), 1);
    const uint8_t w5[5] = {H, L, H, H, H};
    assert_memory_equal(cls, w5, 5);
    /* n = 6: T_l = .0833; token 3 (.05) is pruned, no victim */
    const double s6[6] = {0.5, 0.15, 0.3, 0.05, 0.3, INFINITY};
    assert_int_equal(kvq_leankv_generation_step(s6, 6, &p, cls), -1);
    const uint8_t w6[6] = {H, L, H, P, H, H};
    assert_memory_equal(cls, w6, 6);
    /* n = 7: T_h .142857, T_l .071429; token 4 (.1) -> L; the least significant L is
     * token 1 (.06 < T_l): pruned */
    const double s7[7] = {0.5, 0.06, 0.3, 0.05, 0.1, 0.2, INFINITY};
    assert_int_equal(kvq_leankv_generation_step(s7, 7, &p, cls), 1);
    const uint8_t w7[7] = {H, P, H, P, L, H, H};
    assert_memory_equal(cls, w7, 7);
    /* n = 8: token 5 (.2) -> H; victim: the least significant H among 0, 2, 5 is 5 (.2
     * >= T_h .125): stays */
    const double s8[8] = {0.5, 0.06, 0.3, 0.05, 0.1, 0.2, 0.4, INFINITY};
    assert_int_equal(kvq_leankv_generation_step(s8, 8, &p, cls), 5);
    const uint8_t w8[8] = {H, P, H, P, L, H, H, H};
    assert_memory_equal(cls, w8, 8);
}

static void test_leankv_bytes(void **state)
{
    (void)state;
    const kvq_leankv_params p = kvq_leankv_params_default();
    /* K8V4: 128 + 64 code bytes + 2 x (f16 scale + f16 zero) */
    assert_int_equal(kvq_leankv_token_bytes(128, KVQ_LEANKV_HIGH, &p), 200);
    assert_int_equal(kvq_leankv_token_bytes(128, KVQ_LEANKV_LOW, &p), 104);
    assert_int_equal(kvq_leankv_token_bytes(128, KVQ_LEANKV_PRUNED, &p), 0);
    assert_int_equal(kvq_leankv_token_bytes(8, KVQ_LEANKV_HIGH, &p), 20);
    assert_int_equal(kvq_leankv_token_bytes(8, KVQ_LEANKV_LOW, &p), 14);
}

/* ==========================================================================
 * PATS
 * ========================================================================== */

static void test_pats_schedules(void **state)
{
    (void)state;
    kvq_pats_params p = {.schedule = KVQ_PATS_OLD_HEAVY, .b_min = 2, .b_max = 8,
                         .dtype = KVQ_DT_F16};
    kvq_err e = {0};
    assert_int_equal(kvq_pats_check(&p, &e), KVQ_OK);
    /* T = 11, D = 6, den = 10 */
    const int t_at[6] = {1, 2, 3, 4, 6, 11};
    const int old_b[6] = {8, 7, 7, 6, 5, 2};   /* 8 - round(0, .6, 1.2, 1.8, 3, 6) */
    const int new_b[6] = {2, 3, 3, 4, 5, 8};   /* 2 + the same */
    for (int i = 0; i < 6; i++) {
        p.schedule = KVQ_PATS_OLD_HEAVY;
        assert_int_equal(kvq_pats_bits(&p, t_at[i], 11), old_b[i]);
        p.schedule = KVQ_PATS_NEW_HEAVY;
        assert_int_equal(kvq_pats_bits(&p, t_at[i], 11), new_b[i]);
    }
    /* middle-heavy: 8 - round(6 |2t - 12| / 10) */
    p.schedule = KVQ_PATS_MIDDLE_HEAVY;
    const int mt[6] = {1, 3, 4, 6, 8, 11}, mb[6] = {2, 4, 6, 8, 6, 2};
    for (int i = 0; i < 6; i++)
        assert_int_equal(kvq_pats_bits(&p, mt[i], 11), mb[i]);
    /* halves round up: T = 5, b 2..3, t = 3 -> 1 * 2 / 4 = .5 -> 1 */
    p.schedule = KVQ_PATS_OLD_HEAVY, p.b_max = 3;
    assert_int_equal(kvq_pats_bits(&p, 3, 5), 2);
    /* every schedule stays in [b_min, b_max] */
    for (int sc = 0; sc < KVQ_PATS_N_SCHEDULES; sc++)
        for (int T = 1; T < 40; T++)
            for (int t = 1; t <= T; t++) {
                kvq_pats_params q = {.schedule = (kvq_pats_schedule)sc, .b_min = 1, .b_max = 10,
                                     .dtype = KVQ_DT_F16};
                const int b = kvq_pats_bits(&q, t, T);
                assert_true(b >= 1 && b <= 10);
            }
    /* never into the exponent; names */
    p = (kvq_pats_params){.schedule = KVQ_PATS_MIDDLE_HEAVY, .b_min = 2, .b_max = 11,
                          .dtype = KVQ_DT_F16};
    assert_int_equal(kvq_pats_check(&p, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "exponent"));
    p.dtype = KVQ_DT_BF16, p.b_max = 8;
    assert_int_equal(kvq_pats_check(&p, &e), KVQ_E_INVALID_ARG);
    p.b_max = 7;
    assert_int_equal(kvq_pats_check(&p, &e), KVQ_OK);
    p.b_min = 8;
    assert_int_equal(kvq_pats_check(&p, &e), KVQ_E_INVALID_ARG);
    p.dtype = KVQ_DT_F32, p.b_min = 2;
    assert_int_equal(kvq_pats_check(&p, &e), KVQ_E_INVALID_ARG);
    kvq_pats_schedule s;
    assert_int_equal(kvq_pats_schedule_parse("middle-heavy", &s), 0);
    assert_int_equal(s, KVQ_PATS_MIDDLE_HEAVY);
    assert_int_equal(kvq_pats_schedule_parse("heavy", &s), -1);
    assert_string_equal(kvq_pats_schedule_name(KVQ_PATS_OLD_HEAVY), "old-heavy");
}

static void test_pats_truncate_and_pack(void **state)
{
    (void)state;
    float x[5] = {kvq_f16_to_f32_ref(0x3c01), kvq_f16_to_f32_ref(0x3fff),
                  -kvq_f16_to_f32_ref(0x3fff), INFINITY, NAN};
    float y[5];
    kvq_pats_truncate(x, 5, KVQ_DT_F16, 1, y);
    assert_true(y[0] == 1.0f);
    kvq_pats_truncate(x, 5, KVQ_DT_F16, 4, y);
    assert_true(y[1] == kvq_f16_to_f32_ref(0x3ff0));
    assert_true(y[2] == -kvq_f16_to_f32_ref(0x3ff0));
    assert_true(isinf(y[3]) && isnan(y[4]));
    kvq_pats_truncate(x, 5, KVQ_DT_F16, 0, y); /* 0 bits: the f16 value itself */
    assert_true(y[0] == x[0] && y[1] == x[1]);
    const float b = kvq_bf16_to_f32_ref(0x3fff);
    kvq_pats_truncate(&b, 1, KVQ_DT_BF16, 7, y);
    assert_true(y[0] == 1.0f);
    /* packing: w = 16 - b bits in 64-byte blocks of floor(512 / w) elements per row */
    assert_int_equal(kvq_pats_row_bytes(128, 0), 256); /* 32 per block: 4 blocks */
    assert_int_equal(kvq_pats_row_bytes(128, 4), 256); /* 42 per block: 4 */
    assert_int_equal(kvq_pats_row_bytes(128, 6), 192); /* 51 per block: 3 */
    assert_int_equal(kvq_pats_row_bytes(128, 8), 128); /* 64 per block: 2 */
    assert_int_equal(kvq_pats_row_bytes(128, 10), 128); /* 85 per block: 2 */
    assert_int_equal(kvq_pats_row_bytes(8, 10), 64);
}

/* ==========================================================================
 * Simulated cache
 * ========================================================================== */

static kvq_model_config small_config(int32_t n_heads, int32_t n_kv, int32_t d)
{
    kvq_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = KVQ_ARCH_LLAMA;
    c.n_layers = 1;
    c.n_heads = n_heads;
    c.n_kv_heads = n_kv;
    c.head_dim = d;
    c.dim = n_heads * d;
    c.rope = kvq_rope_default(d);
    return c;
}

static float *randn(size_t n, uint64_t seed, double scale)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(scale * kvq_rng_normal(&r));
    return x;
}

/* Feeds n tokens through the backend in chunks of `chunk`; out: [n, nh, d]. */
static void feed(kvq_attn_backend b, int64_t n, int32_t chunk, int32_t nh, int32_t nkv, int32_t d,
                 const float *q, const float *k, const float *v, float *out)
{
    int64_t pos[64];
    kvq_err e = {0};
    for (int64_t at = 0; at < n; at += chunk) {
        const int32_t cn = (int32_t)(n - at < chunk ? n - at : chunk);
        for (int32_t i = 0; i < cn; i++)
            pos[i] = at + i;
        kvq_attn_call c = {.layer = 0, .n = cn, .pos = pos, .q = q + at * nh * d,
                           .k = k + at * nkv * d, .v = v + at * nkv * d,
                           .out = out + at * nh * d};
        assert_int_equal(b.attend(b.user, &c, &e), KVQ_OK);
    }
}

static void test_simcache_memory_hand_count(void **state)
{
    (void)state;
    const int32_t nh = 4, nkv = 2, d = 16, n = 40;
    kvq_model_config cfg = small_config(nh, nkv, d);
    float *q = randn((size_t)n * nh * d, 1, 1), *k = randn((size_t)n * nkv * d, 2, 1);
    float *v = randn((size_t)n * nkv * d, 3, 1), *out = malloc(sizeof(float) * n * nh * d);
    kvq_err e = {0};
    kvq_simcache *s = NULL;
    kvq_simcache_memory m;

    /* LeanKV, the whole sequence a prompt, thresholds nothing reaches: all but the
     * window of 8 pruned. Per KV head: 8 x (16 + 8 + 8) bytes = 256. */
    kvq_leankv_params lk = kvq_leankv_params_default();
    lk.alpha_h = lk.alpha_l = 1e9;
    lk.window = 8;
    assert_int_equal(kvq_simcache_create(&cfg, KVQ_SIMCACHE_LEANKV, &lk, NULL, 1, &s, &e), KVQ_OK);
    kvq_attn_backend b = kvq_simcache_backend(s);
    b.reset(b.user);
    kvq_simcache_begin(s, n, n);
    feed(b, n, 16, nh, nkv, d, q, k, v, out);
    kvq_simcache_memory_get(s, &m);
    assert_true(m.bytes == 2 * 256);
    assert_true(m.bytes_f16 == 2.0 * n * 4 * d);
    assert_true(m.n_high == 16 && m.n_low == 0 && m.n_pruned == 64);
    kvq_simcache_free(s);

    /* PATS middle-heavy 2..8 over T = 3 at d = 128: b = 2, 8, 2; rows of 256, 128, 256
     * bytes, K and V: 2 (256 + 128 + 256) = 1280 bytes per KV head */
    cfg = small_config(2, 1, 128);
    kvq_pats_params pt = {.schedule = KVQ_PATS_MIDDLE_HEAVY, .b_min = 2, .b_max = 8,
                          .dtype = KVQ_DT_F16};
    assert_int_equal(kvq_simcache_create(&cfg, KVQ_SIMCACHE_PATS, NULL, &pt, 1, &s, &e), KVQ_OK);
    b = kvq_simcache_backend(s);
    kvq_simcache_begin(s, 3, 0);
    feed(b, 3, 2, 2, 1, 128, q, k, v, out);
    kvq_simcache_memory_get(s, &m);
    assert_true(m.bytes == 1280);
    assert_true(m.bits == 2.0 * 128 * (14 + 8 + 14));
    assert_true(m.bytes_f16 == 3 * 4 * 128);
    kvq_simcache_free(s);

    /* a model with a sliding window: refused past the window, with the reason */
    cfg.sliding_window = 2;
    assert_int_equal(kvq_simcache_create(&cfg, KVQ_SIMCACHE_PATS, NULL, &pt, 1, &s, &e), KVQ_OK);
    b = kvq_simcache_backend(s);
    kvq_simcache_begin(s, 3, 0);
    {
        int64_t pos[3] = {0, 1, 2};
        kvq_attn_call c = {.layer = 0, .n = 3, .pos = pos, .q = q, .k = k, .v = v, .out = out};
        assert_int_equal(b.attend(b.user, &c, &e), KVQ_E_UNSUPPORTED);
        assert_non_null(strstr(e.msg, "sliding window of 2 tokens"));
        c.n = 2; /* within the window: simulated */
        assert_int_equal(b.attend(b.user, &c, &e), KVQ_OK);
    }
    kvq_simcache_free(s);
    cfg.sliding_window = 0;

    /* bad arguments */
    assert_int_equal(kvq_simcache_create(&cfg, KVQ_SIMCACHE_PATS, NULL, NULL, 1, &s, &e),
                     KVQ_E_INVALID_ARG);
    pt.b_max = 11;
    assert_int_equal(kvq_simcache_create(&cfg, KVQ_SIMCACHE_PATS, NULL, &pt, 1, &s, &e),
                     KVQ_E_INVALID_ARG);
    free(q);
    free(k);
    free(v);
    free(out);
}

/* PATS with no truncated bit is exact attention over the f16-rounded cache: checked
 * against a direct computation (RoPE, GQA mapping, causal mask), chunking included. */
static void test_simcache_matches_exact(void **state)
{
    (void)state;
    const int32_t nh = 4, nkv = 2, gs = 2, d = 8, n = 37;
    kvq_model_config cfg = small_config(nh, nkv, d);
    float *q = randn((size_t)n * nh * d, 11, 1), *k = randn((size_t)n * nkv * d, 12, 1);
    float *v = randn((size_t)n * nkv * d, 13, 1), *out = malloc(sizeof(float) * n * nh * d);
    kvq_pats_params pt = {.schedule = KVQ_PATS_OLD_HEAVY, .b_min = 0, .b_max = 0,
                          .dtype = KVQ_DT_F16};
    kvq_simcache *s = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_simcache_create(&cfg, KVQ_SIMCACHE_PATS, NULL, &pt, 2, &s, &e), KVQ_OK);
    kvq_simcache_begin(s, n, 0);
    feed(kvq_simcache_backend(s), n, 5, nh, nkv, d, q, k, v, out);

    double theta[KVQ_ROPE_MAX_DIM / 2];
    kvq_rope_freqs(&cfg.rope, theta);
    float *kr = malloc(sizeof(float) * n * nkv * d), *vr = malloc(sizeof(float) * n * nkv * d);
    for (int t = 0; t < n; t++) {
        memcpy(kr + t * nkv * d, k + t * nkv * d, sizeof(float) * nkv * d);
        kvq_rope_apply(&cfg.rope, theta, kr + t * nkv * d, nkv, t);
    }
    for (int i = 0; i < n * nkv * d; i++) {
        kr[i] = kvq_f16_to_f32_ref(kvq_f32_to_f16_ref(kr[i]));
        vr[i] = kvq_f16_to_f32_ref(kvq_f32_to_f16_ref(v[i]));
    }
    double maxerr = 0;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < nh; h++) {
            float qq[8];
            memcpy(qq, q + (t * nh + h) * d, sizeof qq);
            kvq_rope_apply(&cfg.rope, theta, qq, 1, t);
            const int kvh = h / gs;
            double w[64], mx = -INFINITY, sum = 0, o[8] = {0};
            for (int j = 0; j <= t; j++) {
                double sdot = 0;
                for (int c = 0; c < d; c++)
                    sdot += (double)qq[c] * kr[(j * nkv + kvh) * d + c];
                w[j] = sdot / sqrt((double)d);
                mx = w[j] > mx ? w[j] : mx;
            }
            for (int j = 0; j <= t; j++)
                sum += (w[j] = exp(w[j] - mx));
            for (int j = 0; j <= t; j++)
                for (int c = 0; c < d; c++)
                    o[c] += w[j] / sum * vr[(j * nkv + kvh) * d + c];
            for (int c = 0; c < d; c++) {
                const double err = fabs(o[c] - out[(t * nh + h) * d + c]);
                maxerr = err > maxerr ? err : maxerr;
            }
        }
    assert_true(maxerr < 1e-5);
    kvq_simcache_free(s);
    free(q);
    free(k);
    free(v);
    free(kr);
    free(vr);
    free(out);
}

/* ==========================================================================
 * The profile on a synthetic capture
 * ========================================================================== */

enum { NL = 2, NH = 4, NKV = 2, D = 16, SEQ = 96, NSEQ = 4, NTOK = SEQ * NSEQ };

static kvq_model_id synth_id(int32_t n_layers)
{
    kvq_model_id m;
    memset(&m, 0, sizeof m);
    snprintf(m.path, sizeof m.path, "synthetic");
    snprintf(m.source, sizeof m.source, "gguf");
    snprintf(m.architecture, sizeof m.architecture, "llama");
    m.n_layers = n_layers;
    m.dim = NH * D;
    m.hidden_dim = 64;
    m.n_heads = NH;
    m.n_kv_heads = NKV;
    m.head_dim = D;
    m.vocab_size = 16;
    m.context_length = 2048;
    m.norm_eps = 1e-5;
    m.rope = kvq_rope_default(D);
    return m;
}

static void fill_info(kvq_capture_info *info, int64_t *seqs, int32_t *layers, int64_t n_seq,
                      int64_t seq_len)
{
    memset(info, 0, sizeof *info);
    info->model = synth_id(NL);
    snprintf(info->corpus_spec, sizeof info->corpus_spec, "synthetic");
    snprintf(info->corpus_hash, sizeof info->corpus_hash, "0123456789abcdef");
    info->n_documents = n_seq;
    info->dtype = KVQ_DT_F32;
    info->seq_len = seq_len;
    info->n_tokens = n_seq * seq_len;
    for (int64_t s = 0; s < n_seq; s++)
        seqs[2 * s] = s * seq_len, seqs[2 * s + 1] = seq_len;
    info->n_sequences = n_seq;
    info->sequences = seqs;
    for (int l = 0; l < NL; l++)
        layers[l] = l;
    info->n_files = NL;
    info->layers = layers;
    info->has_values = 1;
}

/* A capture of NSEQ sequences with peaked attention: queries twice the keys' scale, a
 * strong first token. */
static const char *make_capture(void)
{
    static char dir[512];
    snprintf(dir, sizeof dir, "%s", test_path("cap"));
    kvq_capture_info info;
    int64_t seqs[2 * NSEQ];
    int32_t layers[NL];
    fill_info(&info, seqs, layers, NSEQ, SEQ);
    int32_t *tokens = calloc(NTOK, sizeof *tokens);
    kvq_capture_writer_params wp = kvq_capture_writer_params_default();
    wp.threads = 1;
    kvq_capture_writer *w = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_capture_writer_create(dir, &info, tokens, &wp, &w, &e), KVQ_OK);
    for (int l = 0; l < NL; l++) {
        float *q = randn((size_t)NTOK * NH * D, 100 + l, 2.0);
        float *k = randn((size_t)NTOK * NKV * D, 200 + l, 1.0);
        float *v = randn((size_t)NTOK * NKV * D, 300 + l, 1.0);
        for (int s = 0; s < NSEQ; s++) /* a sink: the first key of each sequence aligned */
            for (int c = 0; c < NKV * D; c++)
                k[(size_t)s * SEQ * NKV * D + c] *= 3.0f;
        assert_int_equal(kvq_capture_writer_append(w, l, NTOK, q, k, v, &e), KVQ_OK);
        free(q);
        free(k);
        free(v);
    }
    kvq_status s = kvq_capture_writer_finish(w, &e);
    if (s)
        print_error("%s\n", e.msg);
    assert_int_equal(s, KVQ_OK);
    kvq_capture_writer_free(w);
    free(tokens);
    return dir;
}

/* An artifact with method none (thresholds only) for the identity id, holding one
 * dummy tensor. Returns its path. */
static const char *make_none_artifact(const char *name, const kvq_model_id *id)
{
    static char path[2][512];
    static int slot;
    char *p = path[slot++ & 1];
    snprintf(p, sizeof path[0], "%s", test_path(name));
    kvq_st_writer *w = kvq_st_writer_new();
    kvq_err e = {0};
    const int64_t shape[1] = {2};
    const float dummy[2] = {1.5f, -2.0f};
    assert_int_equal(kvq_st_writer_declare(w, "diag.dummy", KVQ_DT_F32, 1, shape, &e), KVQ_OK);
    assert_int_equal(kvq_model_id_set_meta(id, "model.", w, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_set_meta(w, KVQ_META_METHOD, KVQ_METHOD_NONE, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_set_meta(w, KVQ_META_TOOL_VERSION, "kvq test", &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_set_meta(w, "leankv.alpha_h", "99", &e), KVQ_OK); /* stale */
    assert_int_equal(kvq_st_writer_begin_buffer(w, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_write(w, dummy, sizeof dummy, &e), KVQ_OK);
    assert_int_equal(kvq_st_writer_finish(w, &e), KVQ_OK);
    size_t n;
    const void *buf = kvq_st_writer_buffer(w, &n);
    assert_int_equal(kvq_artifact_write(p, 1, buf, n, 0, &e), KVQ_OK);
    kvq_st_writer_free(w);
    return p;
}

static const char *g_cap;

static int setup(void **state)
{
    (void)state;
    g_cap = make_capture();
    return 0;
}

static const double g_ah[] = {0, 1, 4}, g_al[] = {0, 0.05};

static kvq_profile_params small_params(void)
{
    kvq_profile_params p = kvq_profile_params_default();
    p.knobs = KVQ_KNOB_LEANKV | KVQ_KNOB_PATS;
    p.leankv.window = 16;
    p.alpha_h = g_ah, p.n_alpha_h = 3;
    p.alpha_l = g_al, p.n_alpha_l = 2;
    return p;
}

static void test_profile_chosen_meets_tolerance(void **state)
{
    (void)state;
    kvq_profile_params p = small_params();
    p.tolerance = 0.08;
    kvq_profile_result *r = NULL;
    kvq_err e = {0};
    kvq_status s = kvq_profile_capture(g_cap, NULL, &p, &r, &e);
    if (s)
        print_error("%s\n", e.msg);
    assert_int_equal(s, KVQ_OK);
    assert_int_equal(r->metric_ppl, 0);
    assert_true(r->tolerance == 0.08);
    assert_int_equal(r->n_sequences, NSEQ);
    assert_int_equal(r->n_queries, NL * NSEQ * (SEQ - SEQ / 2));
    const kvq_profile_table *lt = &r->table[KVQ_PROFILE_LEANKV], *pt = &r->table[KVQ_PROFILE_PATS];
    /* 3 x 2 points less (0, 0.05): alpha_l above alpha_h is refused by the cache */
    assert_int_equal(lt->n_rows, 5);
    for (int64_t i = 0; i < lt->n_rows; i++)
        assert_true(lt->rows[i * lt->n_cols + KVQ_PL_ALPHA_L] <=
                    lt->rows[i * lt->n_cols + KVQ_PL_ALPHA_H]);
    assert_true(lt->rows[lt->n_cols + KVQ_PL_ALPHA_H] == 1 &&
                lt->rows[lt->n_cols + KVQ_PL_ALPHA_L] == 0);
    assert_int_equal(pt->n_rows, 3 * 4); /* b_max 4, 6, 8, 10 (f16) per schedule */
    /* d = 16: no PATS setting saves memory (below), so none is chosen */
    assert_true(lt->chosen >= 0 && lt->met && pt->chosen < 0);
    assert_string_equal(r->table[KVQ_PROFILE_BUDGET].skipped, "not asked for");
    /* the chosen rows: within tolerance, and no row within tolerance uses less memory */
    const double *lc = lt->rows + lt->chosen * lt->n_cols;
    assert_true(lc[KVQ_PL_ERR] <= 0.08);
    for (int64_t i = 0; i < lt->n_rows; i++) {
        const double *row = lt->rows + i * lt->n_cols;
        if (row[KVQ_PL_ERR] <= 0.08)
            assert_true(row[KVQ_PL_MEMORY] >= lc[KVQ_PL_MEMORY]);
        assert_true(fabs(row[KVQ_PL_HIGH] + row[KVQ_PL_LOW] + row[KVQ_PL_PRUNED] - 1) < 1e-12);
        assert_true(isnan(row[KVQ_PL_PPL]));
    }
    /* alpha_h 0: every token K8V4: memory (16 + 8 + 8) / 64 exactly, no pruning */
    assert_true(lt->rows[KVQ_PL_MEMORY] == 0.5 && lt->rows[KVQ_PL_HIGH] == 1);
    /* measured again alone, the chosen setting gives the same figure */
    double ah = lc[KVQ_PL_ALPHA_H], al = lc[KVQ_PL_ALPHA_L];
    kvq_profile_params p1 = p;
    p1.knobs = KVQ_KNOB_LEANKV;
    p1.alpha_h = &ah, p1.n_alpha_h = 1;
    p1.alpha_l = &al, p1.n_alpha_l = 1;
    kvq_profile_result *r1 = NULL;
    assert_int_equal(kvq_profile_capture(g_cap, NULL, &p1, &r1, &e), KVQ_OK);
    assert_memory_equal(r1->table[KVQ_PROFILE_LEANKV].rows, lc, sizeof(double) * KVQ_PL_NCOLS);
    assert_true(r1->table[KVQ_PROFILE_LEANKV].rows[KVQ_PL_ERR] <= p.tolerance);
    kvq_profile_result_free(r1);
    /* PATS: d = 16 <= 32: one 64-byte block per row whatever b is, 2 x 64 / (4 x 16) of
     * the f16 cache: every row costs more than it saves, so none was chosen (above) */
    for (int64_t i = 0; i < pt->n_rows; i++) {
        const double *row = pt->rows + i * pt->n_cols;
        assert_true(row[KVQ_PP_MEMORY] == 2.0);
    }
    kvq_profile_result_free(r);
}

static void test_profile_threads_same_result(void **state)
{
    (void)state;
    kvq_profile_params p = small_params();
    kvq_profile_result *a = NULL, *b = NULL;
    kvq_err e = {0};
    p.threads = 1;
    assert_int_equal(kvq_profile_capture(g_cap, NULL, &p, &a, &e), KVQ_OK);
    p.threads = 3;
    assert_int_equal(kvq_profile_capture(g_cap, NULL, &p, &b, &e), KVQ_OK);
    for (int i = 0; i < 2; i++) {
        const kvq_profile_table *x = &a->table[i], *y = &b->table[i];
        assert_int_equal(x->n_rows, y->n_rows);
        assert_memory_equal(x->rows, y->rows, sizeof(double) * (size_t)(x->n_rows * x->n_cols));
        assert_int_equal(x->chosen, y->chosen);
    }
    kvq_profile_result_free(a);
    kvq_profile_result_free(b);
}

typedef struct log_count {
    int warnings;
    char last[512];
} log_count;

static void count_log(void *user, kvq_log_level level, const char *msg)
{
    log_count *c = user;
    if (level == KVQ_LOG_WARN) {
        c->warnings++;
        snprintf(c->last, sizeof c->last, "%s", msg);
    }
}

static void test_profile_unmeetable_tolerance(void **state)
{
    (void)state;
    kvq_profile_params p = small_params();
    p.tolerance = 0; /* quantization always leaves some error */
    p.knobs = KVQ_KNOB_LEANKV;
    log_count lc = {0};
    p.cb.log = count_log;
    p.cb.user = &lc;
    kvq_profile_result *r = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_profile_capture(g_cap, NULL, &p, &r, &e), KVQ_OK);
    const kvq_profile_table *t = &r->table[KVQ_PROFILE_LEANKV];
    assert_int_equal(t->met, 0);
    assert_true(t->chosen >= 0);
    /* the best found: the least error */
    for (int64_t i = 0; i < t->n_rows; i++)
        assert_true(t->rows[i * t->n_cols + KVQ_PL_ERR] >=
                    t->rows[t->chosen * t->n_cols + KVQ_PL_ERR]);
    assert_true(lc.warnings >= 1);
    assert_non_null(strstr(lc.last, "no setting meets the tolerance"));

    /* ... and the artifact says so */
    const kvq_model_id id = synth_id(NL);
    const char *in = make_none_artifact("none.kvq", &id);
    const char *out = test_path("unmet.kvq");
    assert_int_equal(kvq_profile_run(g_cap, in, out, 1, &p, NULL, &e), KVQ_OK);
    kvq_artifact *a = NULL;
    assert_int_equal(kvq_artifact_open(out, &a, &e), KVQ_OK);
    assert_string_equal(kvq_st_meta_get(kvq_artifact_payload(a), "thresholds.leankv.met"), "0");
    kvq_artifact_close(a);
    kvq_profile_result_free(r);
}

static void test_profile_writes_artifact(void **state)
{
    (void)state;
    kvq_profile_params p = small_params();
    p.knobs = KVQ_KNOB_ALL;
    p.tolerance = 0.08;
    const kvq_model_id id = synth_id(NL);
    const char *in = make_none_artifact("in.kvq", &id), *out = test_path("out.kvq");
    kvq_profile_result *r = NULL;
    kvq_err e = {0};
    kvq_status s = kvq_profile_run(g_cap, in, out, 0, &p, &r, &e);
    if (s)
        print_error("%s\n", e.msg);
    assert_int_equal(s, KVQ_OK);
    /* method none: no codebooks, so the budget knobs are skipped with the reason */
    assert_true(r->table[KVQ_PROFILE_BUDGET].skipped[0] != 0);
    kvq_artifact *a = NULL;
    assert_int_equal(kvq_artifact_open(out, &a, &e), KVQ_OK);
    assert_int_equal(kvq_artifact_validate(a, &e), KVQ_OK);
    const kvq_st *st = kvq_artifact_payload(a);
    const kvq_tensor_view *t = kvq_st_find(st, "diag.dummy");
    assert_non_null(t); /* the input's tensors are copied */
    const float want[2] = {1.5f, -2.0f};
    assert_memory_equal(t->data, want, sizeof want);
    const kvq_profile_table *lt = &r->table[KVQ_PROFILE_LEANKV];
    const double *lc = lt->rows + lt->chosen * lt->n_cols;
    t = kvq_st_find(st, KVQ_TENSOR_LEANKV_ALPHA_H);
    assert_non_null(t);
    assert_int_equal(t->dtype, KVQ_DT_F32);
    assert_int_equal(t->ndim, 0);
    float v;
    memcpy(&v, t->data, 4);
    assert_true(v == (float)lc[KVQ_PL_ALPHA_H]);
    t = kvq_st_find(st, "profile.leankv");
    assert_non_null(t);
    assert_int_equal(t->dtype, KVQ_DT_F64);
    assert_int_equal(t->shape[0], lt->n_rows);
    assert_int_equal(t->shape[1], KVQ_PL_NCOLS);
    assert_memory_equal(t->data, lt->rows, t->nbytes);
    assert_non_null(kvq_st_find(st, "profile.pats"));
    assert_null(kvq_st_find(st, "profile.budget"));
    char buf[64];
    snprintf(buf, sizeof buf, "%.17g", lc[KVQ_PL_ALPHA_H]);
    assert_string_equal(kvq_st_meta_get(st, "leankv.alpha_h"), buf); /* stale value replaced */
    assert_string_equal(kvq_st_meta_get(st, "thresholds.leankv.met"), "1");
    assert_string_equal(kvq_st_meta_get(st, "thresholds.metric"), "attn_rel_err");
    assert_string_equal(kvq_st_meta_get(st, "profile.leankv.columns"),
                        "alpha_h,alpha_l,memory,high,low,pruned,err,ppl");
    assert_null(kvq_st_meta_get(st, "pats.schedule")); /* d = 16: no PATS setting saves */
    assert_non_null(kvq_st_meta_get(st, "profile.budget.skipped"));
    assert_string_equal(kvq_st_meta_get(st, KVQ_META_METHOD), "none");
    kvq_artifact_close(a);
    /* no overwrite without asking */
    assert_int_equal(kvq_profile_run(g_cap, in, out, 0, &p, NULL, &e), KVQ_E_EXISTS);
    kvq_profile_result_free(r);
}

static void test_profile_bad_input(void **state)
{
    (void)state;
    kvq_profile_params p = small_params();
    kvq_profile_result *r = NULL;
    kvq_err e = {0};
    /* an artifact of another model */
    const kvq_model_id other = synth_id(NL + 1);
    const char *in = make_none_artifact("other.kvq", &other);
    assert_int_equal(kvq_profile_capture(g_cap, in, &p, &r, &e), KVQ_E_MISMATCH);
    assert_non_null(strstr(e.msg, "n_layers"));
    assert_null(r);
    /* bad parameters */
    p.prompt_fraction = 1;
    assert_int_equal(kvq_profile_capture(g_cap, NULL, &p, &r, &e), KVQ_E_INVALID_ARG);
    p = small_params();
    const double neg = -1;
    p.alpha_l = &neg, p.n_alpha_l = 1;
    assert_int_equal(kvq_profile_capture(g_cap, NULL, &p, &r, &e), KVQ_E_INVALID_ARG);
    p = small_params();
    const double zero = 0, low = 0.05; /* a grid with no point the cache accepts */
    p.alpha_h = &zero, p.n_alpha_h = 1;
    p.alpha_l = &low, p.n_alpha_l = 1;
    assert_int_equal(kvq_profile_capture(g_cap, NULL, &p, &r, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "alpha_l"));
    assert_null(r);
    p = small_params();
    p.pats_b_min = 11;
    assert_int_equal(kvq_profile_capture(g_cap, NULL, &p, &r, &e), KVQ_E_INVALID_ARG);
    p = small_params();
    /* no capture at all */
    assert_int_equal(kvq_profile_capture(test_path("nowhere"), NULL, &p, &r, &e), KVQ_E_NOT_FOUND);

    /* empty captures. Only one-token sequences: nothing to evaluate (refused before any
     * layer file is opened, so capture.json alone is enough) */
    kvq_capture_info info;
    int64_t seqs[6];
    int32_t layers[NL];
    const char *dir = test_path("empty");
    char json[600];
    fill_info(&info, seqs, layers, 3, 1);
    info.files = (char *[]){"layer_000.safetensors", "layer_001.safetensors"};
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(json, sizeof json, "%s/capture.json", dir);
    /* the writer records the listed files' checksums: empty stand-ins (never opened) */
    for (int i = 0; i < 2; i++) {
        char lf[700];
        snprintf(lf, sizeof lf, "%s/%s", dir, info.files[i]);
        assert_int_equal(test_write_file(lf, "", 0), 0);
    }
    assert_int_equal(kvq_capture_info_write(&info, NULL, json, 1, &e), KVQ_OK);
    assert_int_equal(kvq_profile_capture(dir, NULL, &p, &r, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "no sequence"));
    assert_null(r);
    /* no token or no layer at all: capture.json itself is refused */
    static const char *const edits[2][2] = {
        {"\"n_tokens\": 3", "\"n_tokens\": 0"},
        {"\"layers\": [0, 1]", "\"layers\": []"}};
    for (int i = 0; i < 2; i++) {
        uint8_t *text = NULL;
        size_t n = 0;
        assert_int_equal(kvq_capture_info_write(&info, NULL, json, 1, &e), KVQ_OK);
        assert_int_equal(kvq_read_file(json, &text, &n, &e), KVQ_OK);
        char *at = strstr((char *)text, edits[i][0]);
        assert_non_null(at);
        char edited[4096];
        snprintf(edited, sizeof edited, "%.*s%s%s", (int)(at - (char *)text), (char *)text,
                 edits[i][1], at + strlen(edits[i][0]));
        free(text);
        assert_int_equal(test_write_file(json, edited, strlen(edited)), 0);
        assert_int_equal(kvq_profile_capture(dir, NULL, &p, &r, &e), KVQ_E_CORRUPT);
        assert_null(r);
    }
}

/* ==========================================================================
 * The real tiny model
 * ========================================================================== */

/* Mean NLL of tokens[1..n) with the backend (NULL: full attention). */
static double model_nll(kvq_forward *f, kvq_simcache *sc, const int32_t *tok, int n, int32_t vocab)
{
    float *logits = malloc(sizeof(float) * (size_t)n * vocab);
    kvq_err e = {0};
    kvq_attn_backend b;
    if (sc) {
        b = kvq_simcache_backend(sc);
        kvq_forward_set_attention(f, &b);
    } else {
        kvq_forward_set_attention(f, NULL);
    }
    kvq_forward_reset(f);
    if (sc)
        kvq_simcache_begin(sc, n, n / 2);
    assert_int_equal(kvq_forward_tokens(f, tok, n, KVQ_LOGITS_ALL, logits, &e), KVQ_OK);
    double nll = 0;
    for (int i = 0; i + 1 < n; i++) {
        const float *row = logits + (size_t)i * vocab;
        double mx = row[0], sum = 0;
        for (int c = 1; c < vocab; c++)
            mx = row[c] > mx ? row[c] : mx;
        for (int c = 0; c < vocab; c++)
            sum += exp(row[c] - mx);
        nll += mx + log(sum) - row[tok[i + 1]];
    }
    free(logits);
    return nll / (n - 1);
}

static void test_real_model_simcache(void **state)
{
    (void)state;
    int stories; /* stories260K, else SmolLM2: the same properties */
    const char *path = test_real_model(&stories);
    if (!path)
        TEST_SKIP("neither stories260K (KVQ_TEST_MODEL) nor SmolLM2 (KVQ_SMOLLM2) found");
    kvq_model *m = NULL;
    kvq_err e = {0};
    kvq_model_params mp = kvq_model_params_default();
    assert_int_equal(kvq_model_open(path, &mp, &m, &e), KVQ_OK);
    const kvq_model_config *cfg = kvq_model_config_get(m);
    kvq_forward_params fp = kvq_forward_params_default();
    fp.chunk = 32;
    kvq_forward *f = NULL;
    assert_int_equal(kvq_forward_create(m, &fp, &f, &e), KVQ_OK);
    static const char text[] =
        "Once upon a time, there was a little boy named Tom. Tom had a red ball. He liked to "
        "play with his ball in the park. One day, Tom saw a big dog in the park. The dog "
        "wanted to play with the ball too. Tom was scared, but his mom said, \"Do not be "
        "scared, Tom. The dog is kind.\" Tom gave the ball to the dog. The dog ran and ran "
        "and then brought the ball back to Tom. Tom was happy. He said, \"Thank you, dog!\" "
        "From that day on, Tom and the dog were friends. They played in the park every day, "
        "and Tom was never scared of the big dog again.";
    const kvq_tokenizer *tk = kvq_model_tokenizer(m);
    assert_non_null(tk);
    int32_t *tok = NULL;
    size_t nt = 0;
    assert_int_equal(kvq_tokenizer_encode(tk, text, sizeof text - 1, KVQ_ENCODE_BOS, &tok, &nt, &e),
                     KVQ_OK);
    assert_true(nt > 100);
    const int N = (int)nt;
    const double full = model_nll(f, NULL, tok, N, cfg->vocab_size);

    /* PATS with no truncation = f16 rounding of the cache only */
    kvq_pats_params pt = {.schedule = KVQ_PATS_MIDDLE_HEAVY, .b_min = 0, .b_max = 0,
                          .dtype = KVQ_DT_F16};
    kvq_simcache *sc = NULL;
    assert_int_equal(kvq_simcache_create(cfg, KVQ_SIMCACHE_PATS, NULL, &pt, 1, &sc, &e), KVQ_OK);
    const double p0 = model_nll(f, sc, tok, N, cfg->vocab_size);
    kvq_simcache_free(sc);
    assert_true(fabs(p0 - full) < 1e-3 * full);
    /* truncating all 10 mantissa bits hurts more than truncating 4 */
    pt.b_min = pt.b_max = 4;
    assert_int_equal(kvq_simcache_create(cfg, KVQ_SIMCACHE_PATS, NULL, &pt, 1, &sc, &e), KVQ_OK);
    const double p4 = model_nll(f, sc, tok, N, cfg->vocab_size);
    kvq_simcache_free(sc);
    pt.b_min = pt.b_max = 10;
    assert_int_equal(kvq_simcache_create(cfg, KVQ_SIMCACHE_PATS, NULL, &pt, 1, &sc, &e), KVQ_OK);
    const double p10 = model_nll(f, sc, tok, N, cfg->vocab_size);
    kvq_simcache_free(sc);
    assert_true(fabs(p4 - full) < fabs(p10 - full));
    /* LeanKV that prunes nothing stays close; pruning everything outside the window
     * (window 8) is much worse */
    kvq_leankv_params lk = kvq_leankv_params_default();
    lk.alpha_h = 0, lk.alpha_l = 0;
    assert_int_equal(kvq_simcache_create(cfg, KVQ_SIMCACHE_LEANKV, &lk, NULL, 2, &sc, &e), KVQ_OK);
    const double l0 = model_nll(f, sc, tok, N, cfg->vocab_size);
    kvq_simcache_free(sc);
    lk.alpha_h = lk.alpha_l = 1e9, lk.window = 8;
    assert_int_equal(kvq_simcache_create(cfg, KVQ_SIMCACHE_LEANKV, &lk, NULL, 2, &sc, &e), KVQ_OK);
    const double lmax = model_nll(f, sc, tok, N, cfg->vocab_size);
    kvq_simcache_free(sc);
    print_message("nll: full %.4f, pats0 %.4f, pats4 %.4f, pats10 %.4f, leankv0 %.4f, "
                  "leankv-prune %.4f\n", full, p0, p4, p10, l0, lmax);
    assert_true(fabs(l0 - full) < 0.05 * full);
    assert_true(lmax > l0);
    free(tok);
    kvq_forward_free(f);
    kvq_model_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_asymq_hand_values),
        cmocka_unit_test(test_asymq_error_bound),
        cmocka_unit_test(test_leankv_hand_pattern),
        cmocka_unit_test(test_leankv_generation_steps),
        cmocka_unit_test(test_leankv_bytes),
        cmocka_unit_test(test_pats_schedules),
        cmocka_unit_test(test_pats_truncate_and_pack),
        cmocka_unit_test(test_simcache_memory_hand_count),
        cmocka_unit_test(test_simcache_matches_exact),
        cmocka_unit_test(test_profile_chosen_meets_tolerance),
        cmocka_unit_test(test_profile_threads_same_result),
        cmocka_unit_test(test_profile_unmeetable_tolerance),
        cmocka_unit_test(test_profile_writes_artifact),
        cmocka_unit_test(test_profile_bad_input),
        cmocka_unit_test(test_real_model_simcache),
    };
    int rc = cmocka_run_group_tests(tests, setup, NULL);
    test_tmpdir_cleanup();
    return rc;
}
