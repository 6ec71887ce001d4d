/*
 * tests/test_kvc_rows.c — the SIMD readers of the compressed caches' rows
 * (runtime/kernels/kvc_rows.h) against the scalar specification, bit for bit: LeanKV
 * rows at every width 1..8 (and widths mixed in a call) and PATS rows at every
 * truncation 0..10, several queries,
 * rows of the SIMD widths and of widths the scalar code reads alone, zero weights, and
 * values across f16's range (subnormals, large ones, zeros, equal values). The scalar code itself is
 * checked against numpy in test_kvcache.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/util.h"
#include "runtime/cache/kvc.h"
#include "runtime/kernels/kvc_rows_simd.h"

enum { M = 37, NQ = 9 };

static const int32_t dims[] = {16, 64, 128, 512, 40};

/* A value of a wide dynamic range: normals, a few subnormals and exact extremes. */
static float value(kvq_rng *r, int32_t i)
{
    switch (i % 29) {
    case 0: return 6e-8f;    /* f16 subnormal */
    case 1: return -3e-6f;
    case 2: return 30000.0f;
    case 3: return 0.0f;
    default: return (float)(kvq_rng_normal(r) * (i % 7 == 0 ? 300.0 : 1.0));
    }
}

/* LeanKV widths mixed in one call (width -1 .. -4 picks a set: the K and V widths of
 * HIGH and LOW tokens, all three fast widths, one the SIMD code reads element by element). */
static const int32_t mixed_sets[4][4] = {{2, 8, 4}, {2, 4, 2}, {3, 2, 4, 8}, {3, 8, 4, 3}};

/* m rows into one buffer (padded), row pointers and widths; LeanKV (pats 0) or PATS. */
static uint8_t *make_rows(kvq_rng *r, int pats, int32_t n, int32_t width, const uint8_t **row,
                          int8_t *bits)
{
    const int32_t *set = width < 0 ? mixed_sets[-width - 1] : NULL;
    if (set)
        width = 8; /* the rows' stride: the widest */
    const size_t rb = pats ? kvq_rk_pats_row_bytes(n, width) : kvq_rk_lkq_row_bytes(n, width);
    uint8_t *buf = malloc(rb * M + KVQ_RK_PATS_PAD);
    float x[512];
    kvq_err e = {0};
    for (int64_t i = 0; i < M; i++) {
        int32_t w = pats ? (int32_t)((width + i) % 11) : width; /* PATS: widths vary */
        if (set)
            w = set[1 + (int)(kvq_rng_u64(r) % (uint64_t)set[0])];
        const size_t off = (size_t)i * rb;
        for (int32_t t = 0; t < n; t++)
            x[t] = value(r, (int32_t)(i * n + t));
        if (!pats && i % 5 == 4)
            for (int32_t t = 0; t < n; t++)
                x[t] = 1.25f; /* a vector of equal values */
        row[i] = buf + off;
        bits[i] = (int8_t)w;
        if (pats && kvq_rk_pats_row_bytes(n, w) > rb) /* a wider row: keep this one's width */
            bits[i] = (int8_t)(w = width);
        kvq_status s = pats ? kvq_rt_pats_pack_f32(x, n, w, buf + off, &e)
                            : kvq_rt_lkq_quantize(x, n, w, buf + off, &e);
        assert_int_equal(s, KVQ_OK);
    }
    return buf;
}

static void check1(int pats, int32_t n, int32_t width, kvq_isa isa, int32_t nq)
{
    kvq_rng r;
    kvq_rng_seed(&r, (uint64_t)(n * 131 + width * 7 + pats));
    const uint8_t *row[M];
    int8_t bits[M];
    uint8_t *buf = make_rows(&r, pats, n, width, row, bits);
    float *q = malloc(sizeof(float) * NQ * n), qs[NQ], p[NQ * M];
    for (int32_t i = 0; i < NQ * n; i++)
        q[i] = (float)kvq_rng_normal(&r);
    for (int32_t g = 0; g < NQ; g++)
        qs[g] = kvq_rk_qsum(q + g * n, n);
    for (int32_t i = 0; i < NQ * M; i++)
        p[i] = i % 11 == 3 ? 0.0f : (float)kvq_rng_uniform(&r);
    float lref[NQ * M], lsimd[NQ * M];
    float *yref = calloc((size_t)NQ * n, sizeof(float)), *ysimd = calloc((size_t)NQ * n, sizeof(float));
    for (int32_t i = 0; i < NQ * n; i++)
        yref[i] = ysimd[i] = (float)kvq_rng_normal(&r); /* accumulated into */
    const float scale = 0.125f;
    if (pats) {
        kvq_rk_pats_logits(KVQ_ISA_SCALAR, q, nq, n, row, bits, M, n, scale, lref, M);
        kvq_rk_pats_logits(isa, q, nq, n, row, bits, M, n, scale, lsimd, M);
        kvq_rk_pats_mix(KVQ_ISA_SCALAR, p, nq, M, row, bits, M, n, yref, n);
        kvq_rk_pats_mix(isa, p, nq, M, row, bits, M, n, ysimd, n);
    } else {
        kvq_rk_lkq_logits(KVQ_ISA_SCALAR, q, nq, n, qs, row, bits, M, n, scale, lref, M);
        kvq_rk_lkq_logits(isa, q, nq, n, qs, row, bits, M, n, scale, lsimd, M);
        kvq_rk_lkq_mix(KVQ_ISA_SCALAR, p, nq, M, row, bits, M, n, yref, n);
        kvq_rk_lkq_mix(isa, p, nq, M, row, bits, M, n, ysimd, n);
    }
    assert_memory_equal(lref, lsimd, sizeof(float) * (size_t)nq * M);
    assert_memory_equal(yref, ysimd, sizeof(float) * NQ * n);
    /* the specification is not trivially satisfied: the logits vary */
    assert_true(lref[0] != lref[1] || lref[1] != lref[2]);
    free(buf), free(q), free(yref), free(ysimd);
}

/* Nine queries (the general paths), one, three, four and eight (AVX-512 holds the
 * decoded rows of 64 and 128 elements and the mix's sums in registers for up to eight). */
static void check(int pats, int32_t n, int32_t width, kvq_isa isa)
{
    static const int32_t nqs[] = {NQ, 1, 3, 4, 8};
    for (size_t i = 0; i < sizeof nqs / sizeof nqs[0]; i++)
        check1(pats, n, width, isa, nqs[i]);
}

static void test_lkq_simd(void **state)
{
    (void)state;
    if (kvq_isa_best() == KVQ_ISA_SCALAR)
        skip(); /* no SIMD path on this CPU */
    for (int isa = KVQ_ISA_AVX2; isa <= (int)kvq_isa_best(); isa++)
        for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++)
            for (int32_t bits = 1; bits <= 8; bits++)
                check(0, dims[k], bits, (kvq_isa)isa);
}

/* Rows of different widths in one call, in random order (LeanKV's HIGH and LOW tokens):
 * the readers that group a block's rows by width, or decode them without a branch on it. */
static void test_lkq_mixed(void **state)
{
    (void)state;
    if (kvq_isa_best() == KVQ_ISA_SCALAR)
        skip();
    for (int isa = KVQ_ISA_AVX2; isa <= (int)kvq_isa_best(); isa++)
        for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++)
            for (int32_t set = 1; set <= 4; set++)
                check(0, dims[k], -set, (kvq_isa)isa);
}

static void test_pats_simd(void **state)
{
    (void)state;
    if (kvq_isa_best() == KVQ_ISA_SCALAR)
        skip();
    for (int isa = KVQ_ISA_AVX2; isa <= (int)kvq_isa_best(); isa++)
        for (int vbmi = 0; vbmi <= (isa == KVQ_ISA_AVX512); vbmi++) {
            /* AVX-512: the gather path, then vpermi2b where the CPU has it */
            if (isa == KVQ_ISA_AVX512 && !kvq_kvc_avx512_vbmi(vbmi) && vbmi)
                break;
            for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++)
                for (int32_t b = 0; b <= 10; b++)
                    check(1, dims[k], b, (kvq_isa)isa);
        }
    kvq_kvc_avx512_vbmi(1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lkq_simd),
        cmocka_unit_test(test_lkq_mixed),
        cmocka_unit_test(test_pats_simd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
