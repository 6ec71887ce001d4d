/*
 * test_logits_order.c — the AVX-512 path of kvq_rk_logits (runtime/kernels/kernels_avx512.c)
 * sums in one fixed order, bit for bit: the order the rerank's and the attention's
 * logits have had since the kernel was written, which `kvq eval` outputs depend on. The
 * tolerance test of every ISA against the scalar reference (test_runtime.c,
 * test_attention_paths) cannot see a change of order; this one can.
 *
 * The order, written out here from the kernel's definition (independent of its code):
 * per query row h and key row j, sixteen lane sums x[l] (l < 16), each the fused
 * multiply-adds fmaf(q[t], k[t], x) over t = l, l + 16, l + 32, ... in order from +0
 * (lanes past d add fmaf(0, 0, x), the masked loads' zeros); then
 *   s_L = (x[4L] + x[4L+2]) + (x[4L+1] + x[4L+3])   for L = 0..3
 *   logit = ((s_0 + s_2) + (s_1 + s_3)) * scale      (float adds, one float multiply)
 * Keys f16 (converted exactly) or f32, rows by index or consecutive, 1 to 9 query rows
 * (blocks of four heads and their remainders), d from 8 to 136 (tails of a vector),
 * 1 to 67 rows (tails of four rows), an output stride wider than m: the columns past m
 * must stay untouched. Fails with the rows' sums regrouped ((s_0 + s_1) + (s_2 + s_3)),
 * a head's or a row's logit in another's place, or a tail store that writes past m.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/half.h"
#include "kvq/runtime.h"
#include "kvq/util.h"
#include "runtime/kernels/rk.h"
#include "helpers/testutil.h"

/* The AVX-512 order for one (query row, key row): q [d], k [d] as floats. */
static float logit_ref(const float *q, const float *k, int32_t d, float scale)
{
    float x[16];
    for (int l = 0; l < 16; l++) {
        x[l] = 0.0f;
        for (int32_t t = 0; t < d; t += 16) {
            const int in = t + l < d;
            x[l] = fmaf(in ? q[t + l] : 0.0f, in ? k[t + l] : 0.0f, x[l]);
        }
    }
    float s[4];
    for (int L = 0; L < 4; L++)
        s[L] = (x[4 * L] + x[4 * L + 2]) + (x[4 * L + 1] + x[4 * L + 3]);
    return ((s[0] + s[2]) + (s[1] + s[3])) * scale;
}

static void run_case(kvq_rng *rng, int32_t nq, int32_t d, int64_t m, int f16, int use_idx)
{
    const int64_t rows = 3 * m + 5, ld = m + 7;
    float *q = malloc(sizeof(float) * (size_t)nq * d), *K32 = malloc(sizeof(float) * rows * d);
    uint16_t *K16 = malloc(sizeof(uint16_t) * rows * d);
    float *Kf = malloc(sizeof(float) * rows * d); /* the keys as the kernel reads them */
    float *got = malloc(sizeof(float) * (size_t)nq * ld);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)m);
    assert_true(q && K32 && K16 && Kf && got && idx);
    for (int64_t i = 0; i < (int64_t)nq * d; i++)
        q[i] = (float)kvq_rng_normal(rng);
    for (int64_t i = 0; i < rows * d; i++)
        K32[i] = (float)(2.0 * kvq_rng_normal(rng));
    kvq_f32_to_f16(K32, K16, (size_t)(rows * d));
    for (int64_t i = 0; i < rows * d; i++)
        Kf[i] = f16 ? kvq_f16_to_f32_ref(K16[i]) : K32[i];
    for (int64_t j = 0; j < m; j++) /* out of order, repeats allowed */
        idx[j] = (int32_t)kvq_rng_below(rng, (uint64_t)rows);
    const float scale = d == 128 ? (float)(1.0 / sqrt(128.0)) : 0.3f;
    const float sentinel = -12345.0f;
    for (int64_t i = 0; i < (int64_t)nq * ld; i++)
        got[i] = sentinel;
    kvq_rk_logits(KVQ_ISA_AVX512, q, nq, d, f16 ? (const void *)K16 : (const void *)K32,
                  f16 ? KVQ_DT_F16 : KVQ_DT_F32, d, use_idx ? idx : NULL, m, scale, got, ld);
    for (int32_t h = 0; h < nq; h++) {
        for (int64_t j = 0; j < m; j++) {
            const int64_t r = use_idx ? idx[j] : j;
            const float want = logit_ref(q + (size_t)h * d, Kf + (size_t)r * d, d, scale);
            uint32_t a, b;
            memcpy(&a, &want, 4);
            memcpy(&b, &got[(size_t)h * ld + j], 4);
            if (a != b)
                fail_msg("nq %d d %d m %lld f16 %d idx %d: head %d row %lld: %.9g, want %.9g", nq,
                         d, (long long)m, f16, use_idx, h, (long long)j, (double)got[h * ld + j],
                         (double)want);
        }
        for (int64_t j = m; j < ld; j++)
            if (got[(size_t)h * ld + j] != sentinel)
                fail_msg("nq %d d %d m %lld: head %d column %lld past m written", nq, d,
                         (long long)m, h, (long long)j);
    }
    free(q);
    free(K32);
    free(K16);
    free(Kf);
    free(got);
    free(idx);
}

static void test_avx512_logits_order(void **state)
{
    (void)state;
    if (kvq_isa_clamp(KVQ_ISA_AVX512) != KVQ_ISA_AVX512)
        TEST_SKIP("no AVX-512 on this CPU");
    kvq_rng rng;
    kvq_rng_seed(&rng, 14);
    static const int32_t nqs[] = {1, 2, 3, 4, 5, 8, 9}, ds[] = {8, 24, 64, 72, 128, 136};
    static const int64_t ms[] = {1, 2, 3, 4, 5, 17, 67};
    for (size_t a = 0; a < sizeof nqs / sizeof *nqs; a++)
        for (size_t b = 0; b < sizeof ds / sizeof *ds; b++)
            for (size_t c = 0; c < sizeof ms / sizeof *ms; c++)
                for (int f16 = 0; f16 < 2; f16++)
                    for (int use_idx = 0; use_idx < 2; use_idx++)
                        run_case(&rng, nqs[a], ds[b], ms[c], f16, use_idx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_avx512_logits_order)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
