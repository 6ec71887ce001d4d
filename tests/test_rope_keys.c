/*
 * test_rope_keys.c — under positions ROPE the cache holds its keys rotated by their
 * positions in the cache dtype (runtime/cache/keys.c), as llama.cpp's KV cache does: the f32
 * key rotated in f32, then rounded to the cache dtype once.
 *
 * The reference here is that rule, written out: the f32 key rotated by (float) cos /
 * sin of p theta_m (theta from kvq_rope_freqs) as kvq_rope_apply does, then rounded to
 * the cache dtype (f16 round to nearest even), the query rotated by its own position,
 * then the step's kernels (kvq_rk_logits, kvq_rk_softmax, kvq_rk_mix) over every
 * visible token. Positions are not the token indices (7 + 3 j), so a key rotated by its
 * row or token index, twice, or not at all gives other outputs; and with an f16 cache
 * the former rule (round the pre-RoPE key, then rotate, kept in f32) gives other
 * outputs too (checked here to be so for this data, so the bit-for-bit comparison
 * tells the two rules apart).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers/testutil.h"
#include "kvq.h"
#include "kvq/codebook.h"
#include "kvq/half.h"
#include "kvq/model.h"
#include "kvq/runtime.h"
#include "kvq/util.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/rk.h"

static const kvq_isa isas[] = {KVQ_ISA_SCALAR, KVQ_ISA_AVX2, KVQ_ISA_AVX512};

enum { NH = 4, NKV = 2, GS = NH / NKV, D = 16, T = 160, PREFILL = 120 };

typedef struct seq {
    float q[T * NH * D], k[T * NKV * D], v[T * NKV * D];
    int64_t pos[T];
} seq;

static void fill_seq(seq *s, uint64_t seed)
{
    test_random_qkv(seed, s->q, T * NH * D, s->k, s->v, T * NKV * D);
    for (int j = 0; j < T; j++)
        s->pos[j] = 7 + 3 * (int64_t)j;
}

static kvq_model_config small_config(kvq_rope_layout layout)
{
    kvq_model_id id;
    memset(&id, 0, sizeof id);
    snprintf(id.path, sizeof id.path, "synthetic");
    snprintf(id.source, sizeof id.source, "gguf");
    snprintf(id.architecture, sizeof id.architecture, "llama");
    id.n_layers = 1;
    id.dim = NH * D;
    id.hidden_dim = 4 * NH * D;
    id.n_heads = NH;
    id.n_kv_heads = NKV;
    id.head_dim = D;
    id.vocab_size = 512;
    id.context_length = 2048;
    id.norm_eps = 1e-5;
    id.rope = kvq_rope_default(D);
    id.rope.layout = layout;
    kvq_model_config c = kvq_model_config_from_id(&id);
    c.bos_id = 1;
    c.eos_id = 2;
    return c;
}

/* x rotated by position p as kvq_rope_apply rotates: angle p theta_m in double, its
 * cos / sin rounded to float, the pair rotated in float. */
static void rotate_ref(const kvq_model_config *c, const float *x, int64_t p, float *y)
{
    double theta[D / 2];
    kvq_rope_freqs(&c->rope, theta);
    for (int m = 0; m < D / 2; m++) {
        const int i0 = c->rope.layout == KVQ_ROPE_HALF ? m : 2 * m;
        const int i1 = c->rope.layout == KVQ_ROPE_HALF ? m + D / 2 : 2 * m + 1;
        const float cs = (float)cos((double)p * theta[m]), sn = (float)sin((double)p * theta[m]);
        const float a = x[i0], b = x[i1];
        y[i0] = a * cs - b * sn;
        y[i1] = a * sn + b * cs;
    }
}

/* The value the cache dtype holds of x [D]. */
static void cache_round(kvq_dtype dt, const float *x, float *y)
{
    if (dt == KVQ_DT_F16) {
        uint16_t h[D];
        kvq_f32_to_f16(x, h, D);
        kvq_f16_to_f32(h, y, D);
    } else {
        memcpy(y, x, sizeof(float) * D);
    }
}

/* Runs the sequence: a prompt of PREFILL tokens, then one token a step. out [T, NH, D]. */
static void run_seq(const kvq_attn_backend *b, const seq *s, float *out)
{
    if (b->reset)
        b->reset(b->user);
    for (int64_t at = 0; at < T;) {
        const int64_t n = at < PREFILL ? PREFILL : 1;
        kvq_attn_call call = {.layer = 0,
                              .n = (int32_t)n,
                              .pos = s->pos + at,
                              .q = s->q + at * NH * D,
                              .k = s->k + at * NKV * D,
                              .v = s->v + at * NKV * D,
                              .out = out + at * NH * D};
        kvq_err e = {0};
        if (b->attend(b->user, &call, &e) != KVQ_OK)
            fail_msg("attend: %s", e.msg);
        at += n;
    }
}

/* Key j of KV head h as the cache holds it, in f32: rotated by its position, then
 * rounded to the cache dtype (round_first = 0, the rule), or rounded first, then
 * rotated (round_first = 1: the former rule, read-time rotation of a pre-RoPE cache). */
static void cached_key(const kvq_model_config *c, const seq *s, kvq_dtype dt, int round_first,
                       int64_t j, int h, float *kr)
{
    float x[D];
    if (round_first) {
        cache_round(dt, s->k + (j * NKV + h) * D, x);
        rotate_ref(c, x, s->pos[j], kr);
    } else {
        rotate_ref(c, s->k + (j * NKV + h) * D, s->pos[j], x);
        cache_round(dt, x, kr);
    }
}

/* The reference of decode step i (tokens [0, i] visible), KV head h: out [GS, D]. */
static void step_ref(const kvq_model_config *c, const seq *s, kvq_dtype dt, int round_first,
                     kvq_isa isa, int64_t i, int h, float *out)
{
    const int64_t m = i + 1;
    float *kr = malloc(sizeof(float) * (size_t)m * D), *lg = malloc(sizeof(float) * GS * m);
    void *vc = malloc((dt == KVQ_DT_F16 ? 2 : 4) * (size_t)m * D);
    float qi[GS * D];
    for (int64_t j = 0; j < m; j++) {
        cached_key(c, s, dt, round_first, j, h, kr + j * D);
        if (dt == KVQ_DT_F16)
            kvq_f32_to_f16(s->v + (j * NKV + h) * D, (uint16_t *)vc + j * D, D);
        else
            memcpy((float *)vc + j * D, s->v + (j * NKV + h) * D, sizeof(float) * D);
    }
    for (int g = 0; g < GS; g++)
        rotate_ref(c, s->q + (i * NH + h * GS + g) * D, s->pos[i], qi + g * D);
    const float scale = (float)(1.0 / sqrt((double)D));
    kvq_rk_logits(isa, qi, GS, D, kr, KVQ_DT_F32, D, NULL, m, scale, lg, m);
    kvq_rk_softmax(isa, lg, GS, m, m);
    kvq_rk_mix(isa, lg, GS, m, vc, dt, D, NULL, m, D, out);
    free(kr);
    free(lg);
    free(vc);
}

/* The same attention in double (prefill rows: the runtime's are matrix products). */
static double prefill_err(const kvq_model_config *c, const seq *s, kvq_dtype dt, int64_t i, int h,
                          const float *got)
{
    const int64_t m = i + 1;
    double *lg = malloc(sizeof(double) * (size_t)m), worst = 0;
    float kr[D], qi[D], v[D];
    for (int g = 0; g < GS; g++) {
        rotate_ref(c, s->q + (i * NH + h * GS + g) * D, s->pos[i], qi);
        double mx = -INFINITY, sum = 0, o[D] = {0}, on = 0, en = 0;
        for (int64_t j = 0; j < m; j++) {
            cached_key(c, s, dt, 0, j, h, kr);
            double a = 0;
            for (int t = 0; t < D; t++)
                a += (double)qi[t] * kr[t];
            lg[j] = a / sqrt((double)D);
            mx = lg[j] > mx ? lg[j] : mx;
        }
        for (int64_t j = 0; j < m; j++) {
            const double w = exp(lg[j] - mx);
            sum += w;
            cache_round(dt, s->v + (j * NKV + h) * D, v);
            for (int t = 0; t < D; t++)
                o[t] += w * v[t];
        }
        for (int t = 0; t < D; t++) {
            const double y = o[t] / sum, e = got[g * D + t] - y;
            on += y * y;
            en += e * e;
        }
        worst = sqrt(en / on) > worst ? sqrt(en / on) : worst;
    }
    free(lg);
    return worst;
}

/* Every token attended (selector full) under ROPE: each decode step's outputs equal the
 * rotate-then-round reference bit for bit, for both RoPE layouts, both cache dtypes
 * and every ISA; the prompt's rows (attended as matrix products of the cached keys)
 * are within 1e-5 of the same attention in double. With an f16 cache the former
 * round-then-rotate rule must differ from the reference on some step (else the
 * comparison could not tell them apart); with f32 the two are the same. */
static void test_rope_keys_rotate_then_round(void **state)
{
    (void)state;
    seq *s = malloc(sizeof *s);
    float *out = malloc(sizeof(float) * T * NH * D), ref[GS * D], old[GS * D];
    fill_seq(s, 41);
    for (int lay = 0; lay < 2; lay++)
        for (int dt = 0; dt < 2; dt++)
            for (int ia = 0; ia < 3; ia++) {
                const kvq_model_config c =
                    small_config(lay ? KVQ_ROPE_HALF : KVQ_ROPE_INTERLEAVED);
                kvq_retrieval_params p = kvq_retrieval_params_default();
                p.selector = KVQ_SELECT_FULL;
                p.positions = KVQ_POSITIONS_ROPE;
                p.cache_dtype = dt ? KVQ_DT_F32 : KVQ_DT_F16;
                p.isa = isas[ia];
                kvq_retrieval *r = NULL;
                kvq_err e = {0};
                assert_int_equal(kvq_retrieval_create(&c, NULL, &p, &r, &e), KVQ_OK);
                const kvq_attn_backend b = kvq_retrieval_backend(r);
                run_seq(&b, s, out);
                for (int64_t i = 0; i < PREFILL; i++) /* the prompt: exact attention */
                    for (int h = 0; h < NKV; h++) {
                        const double err = prefill_err(&c, s, p.cache_dtype, i, h,
                                                       out + (i * NH + h * GS) * D);
                        if (!(err < 1e-5))
                            fail_msg("layout %d dtype %d: prompt row %lld head %d off the "
                                     "exact attention by %g", lay, dt, (long long)i, h, err);
                    }
                int64_t old_differs = 0;
                for (int64_t i = PREFILL; i < T; i++)
                    for (int h = 0; h < NKV; h++) {
                        step_ref(&c, s, p.cache_dtype, 0, kvq_isa_clamp(p.isa), i, h, ref);
                        if (memcmp(out + (i * NH + h * GS) * D, ref, sizeof ref))
                            fail_msg("layout %d dtype %d isa %d: step %lld head %d differs "
                                     "from rotate-then-round (%g vs %g)",
                                     lay, dt, ia, (long long)i, h,
                                     out[(i * NH + h * GS) * D], ref[0]);
                        step_ref(&c, s, p.cache_dtype, 1, kvq_isa_clamp(p.isa), i, h, old);
                        old_differs += memcmp(old, ref, sizeof ref) != 0;
                    }
                if (dt ? old_differs != 0 : old_differs == 0)
                    fail_msg("layout %d dtype %d isa %d: round-then-rotate differs from "
                             "rotate-then-round on %lld steps", lay, dt, ia,
                             (long long)old_differs);
                kvq_retrieval_free(r);
            }
    free(out);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope_keys_rotate_then_round),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
