/* test_half.c — f32 <-> f16 / bf16: the references against an independent oracle and
 * hand-checked edge cases, and every SIMD path against the references bit for bit on
 * all 65,536 16-bit patterns, f32 edge cases, tails and random bit patterns. */
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
#include "kvq/common.h"
#include "kvq/half.h"
#include "kvq/util.h"
#include "formats/half_simd.h"

static uint32_t bits(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}

static float from_bits(uint32_t b)
{
    float x;
    memcpy(&x, &b, 4);
    return x;
}

/* ---- the paths under test ---------------------------------------------------------- */

typedef struct path {
    const char *name;
    void (*to16)(const float *, uint16_t *, size_t);
    void (*from16)(const uint16_t *, float *, size_t);
    void (*tobf)(const float *, uint16_t *, size_t);
    void (*frombf)(const uint16_t *, float *, size_t);
} path;

static const path all_paths[] = {
    {"scalar", kvq_f32_to_f16_scalar, kvq_f16_to_f32_scalar, kvq_f32_to_bf16_scalar,
     kvq_bf16_to_f32_scalar},
    {"dispatch", kvq_f32_to_f16, kvq_f16_to_f32, kvq_f32_to_bf16, kvq_bf16_to_f32},
#if KVQ_HAVE_X86_SIMD
    {"avx2", kvq_f32_to_f16_avx2, kvq_f16_to_f32_avx2, kvq_f32_to_bf16_avx2,
     kvq_bf16_to_f32_avx2},
    {"avx512", kvq_f32_to_f16_avx512, kvq_f16_to_f32_avx512, kvq_f32_to_bf16_avx512,
     kvq_bf16_to_f32_avx512},
#endif
};
enum { N_PATHS = sizeof all_paths / sizeof all_paths[0] };

/* Whether this CPU can run path p (scalar and dispatch always can). */
static int runnable(size_t p)
{
    const char *n = all_paths[p].name;
    if (!strcmp(n, "avx2"))
        return kvq_half_simd_level() >= KVQ_SIMD_AVX2;
    if (!strcmp(n, "avx512"))
        return kvq_half_simd_level() >= KVQ_SIMD_AVX512;
    return 1;
}

/* ---- an independent oracle: nearest representable value, ties to even -------------
 * val(h) must increase with h on [0, max_finite]; a is a non-negative finite number. */
static uint16_t oracle_round(double a, float (*val)(uint16_t), uint16_t max_finite,
                             uint16_t inf, double overflow)
{
    if (a >= overflow)
        return inf;
    uint16_t lo = 0, hi = max_finite; /* largest h with val(h) <= a */
    while (lo < hi) {
        const uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
        if ((double)val(mid) <= a)
            lo = mid;
        else
            hi = (uint16_t)(mid - 1);
    }
    if (lo == max_finite)
        return lo; /* below the overflow threshold: rounds down to max finite */
    const double below = val(lo), above = val((uint16_t)(lo + 1));
    if (a - below < above - a)
        return lo;
    if (a - below > above - a)
        return (uint16_t)(lo + 1);
    return (lo & 1) ? (uint16_t)(lo + 1) : lo;
}

static uint16_t oracle_f16(float x)
{
    const uint16_t sign = (bits(x) >> 16) & 0x8000;
    /* 65504 + half an ulp (16): ties at the threshold go to the even neighbour, Inf */
    return (uint16_t)(sign | oracle_round(fabs((double)x), kvq_f16_to_f32_ref, 0x7bff, 0x7c00,
                                          65520.0));
}

static uint16_t oracle_bf16(float x)
{
    const uint16_t sign = (bits(x) >> 16) & 0x8000;
    const double max = (double)from_bits(0x7f7f0000u);
    return (uint16_t)(sign | oracle_round(fabs((double)x), kvq_bf16_to_f32_ref, 0x7f7f, 0x7f80,
                                          max + ldexp(1.0, 119)));
}

/* ---- f16 -> f32 --------------------------------------------------------------------- */

static void test_f16_to_f32_all(void **state)
{
    static uint16_t in[65536];
    static float ref[65536], out[65536];
    for (uint32_t h = 0; h < 65536; h++) {
        in[h] = (uint16_t)h;
        ref[h] = kvq_f16_to_f32_ref((uint16_t)h);
        const uint32_t s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
        if (e == 31 && m) { /* NaN: quiet, sign and payload kept */
            assert_int_equal(bits(ref[h]), (s << 31) | 0x7fc00000u | (m << 13));
            continue;
        }
        const double mag = e == 31 ? INFINITY : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, (int)e - 25);
        assert_true((double)ref[h] == (s ? -mag : mag));
        assert_int_equal(bits(ref[h]) >> 31, s); /* signed zero too */
    }
    for (size_t p = 0; p < N_PATHS; p++) {
        if (!runnable(p))
            continue;
        memset(out, 0xa5, sizeof out);
        all_paths[p].from16(in, out, 65536);
        for (uint32_t h = 0; h < 65536; h++)
            if (bits(out[h]) != bits(ref[h]))
                fail_msg("%s: f16 %04x -> %08x, ref %08x", all_paths[p].name, h, bits(out[h]),
                         bits(ref[h]));
    }
    assert_int_equal(bits(kvq_f16_to_f32_ref(0x3c00)), bits(1.0f));
    assert_true(kvq_f16_to_f32_ref(0x7bff) == 65504.0f);
    assert_true(kvq_f16_to_f32_ref(0x0001) == ldexpf(1.0f, -24));
    assert_true(kvq_f16_to_f32_ref(0x03ff) == ldexpf(1023.0f, -24));
    assert_true(kvq_f16_to_f32_ref(0xc000) == -2.0f);
}

/* ---- f32 -> f16 --------------------------------------------------------------------- */

static void check_to16_paths(const float *in, size_t n)
{
    uint16_t *ref = malloc(n * 2), *out = malloc(n * 2);
    assert_non_null(ref);
    assert_non_null(out);
    for (size_t i = 0; i < n; i++)
        ref[i] = kvq_f32_to_f16_ref(in[i]);
    for (size_t p = 0; p < N_PATHS; p++) {
        if (!runnable(p))
            continue;
        memset(out, 0xa5, n * 2);
        all_paths[p].to16(in, out, n);
        for (size_t i = 0; i < n; i++)
            if (out[i] != ref[i])
                fail_msg("%s: f32 %08x -> f16 %04x, ref %04x", all_paths[p].name, bits(in[i]),
                         out[i], ref[i]);
    }
    free(ref);
    free(out);
}

static void check_tobf_paths(const float *in, size_t n)
{
    uint16_t *ref = malloc(n * 2), *out = malloc(n * 2);
    assert_non_null(ref);
    assert_non_null(out);
    for (size_t i = 0; i < n; i++)
        ref[i] = kvq_f32_to_bf16_ref(in[i]);
    for (size_t p = 0; p < N_PATHS; p++) {
        if (!runnable(p))
            continue;
        memset(out, 0xa5, n * 2);
        all_paths[p].tobf(in, out, n);
        for (size_t i = 0; i < n; i++)
            if (out[i] != ref[i])
                fail_msg("%s: f32 %08x -> bf16 %04x, ref %04x", all_paths[p].name,
                         bits(in[i]), out[i], ref[i]);
    }
    free(ref);
    free(out);
}

/* Every f16 value survives f16 -> f32 -> f16; NaNs come back quieted. */
static void test_f16_round_trip_all(void **state)
{
    static float in[65536];
    for (uint32_t h = 0; h < 65536; h++) {
        in[h] = kvq_f16_to_f32_ref((uint16_t)h);
        const int nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        assert_int_equal(kvq_f32_to_f16_ref(in[h]), nan ? (h | 0x200) : h);
    }
    check_to16_paths(in, 65536);
}

/* The low 16 bits that matter for rounding to f16 (bit 13 is the f16 lsb) and bf16. */
static const uint16_t low_patterns[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff,
                                        0x2000, 0x3000, 0x7fff, 0x8000, 0x8001, 0xffff};
enum { N_LOW = sizeof low_patterns / sizeof low_patterns[0] };

/* Every upper half (all exponents and signs, both NaN kinds) with low bits chosen at
 * the rounding boundaries, against the oracle and across paths. */
static void test_f32_patterns(void **state)
{
    const size_t n = 65536 * (N_LOW + 1);
    float *in = malloc(n * sizeof *in);
    assert_non_null(in);
    kvq_rng rng;
    kvq_rng_seed(&rng, 1);
    size_t k = 0;
    for (uint32_t hi = 0; hi < 65536; hi++) {
        for (int l = 0; l < N_LOW; l++)
            in[k++] = from_bits(hi << 16 | low_patterns[l]);
        in[k++] = from_bits(hi << 16 | (uint32_t)(kvq_rng_u64(&rng) & 0xffff));
    }
    for (size_t i = 0; i < n; i++) {
        const float x = in[i];
        if (isnan(x)) {
            const uint32_t b = bits(x);
            assert_int_equal(kvq_f32_to_f16_ref(x),
                             ((b >> 16) & 0x8000) | 0x7e00 | ((b & 0x7fffff) >> 13));
            assert_int_equal(kvq_f32_to_bf16_ref(x), (b >> 16) | 0x40);
            continue;
        }
        if (kvq_f32_to_f16_ref(x) != oracle_f16(x))
            fail_msg("f32 %08x -> f16 %04x, oracle %04x", bits(x), kvq_f32_to_f16_ref(x),
                     oracle_f16(x));
        if (kvq_f32_to_bf16_ref(x) != oracle_bf16(x))
            fail_msg("f32 %08x -> bf16 %04x, oracle %04x", bits(x), kvq_f32_to_bf16_ref(x),
                     oracle_bf16(x));
    }
    check_to16_paths(in, n);
    check_tobf_paths(in, n);
    free(in);
}

static void test_f16_edge_cases(void **state)
{
    static const struct { uint32_t f; uint16_t h; } cases[] = {
        {0x3f800000, 0x3c00}, /* 1 */
        {0x3f801000, 0x3c00}, /* 1 + 2^-11: tie, to even */
        {0x3f803000, 0x3c02}, /* 1 + 3*2^-11: tie, to even (up) */
        {0x3f801001, 0x3c01}, /* just above the tie */
        {0x477fe000, 0x7bff}, /* 65504, max finite */
        {0x477fef00, 0x7bff}, /* 65519 */
        {0x477ff000, 0x7c00}, /* 65520: tie between max and Inf, to even = Inf */
        {0x7f7fffff, 0x7c00}, /* FLT_MAX */
        {0xff7fffff, 0xfc00},
        {0x33800000, 0x0001}, /* 2^-24, smallest subnormal */
        {0x33000000, 0x0000}, /* 2^-25: tie, to even = 0 */
        {0xb3000000, 0x8000},
        {0x33000001, 0x0001}, /* just above 2^-25 */
        {0x32ffffff, 0x0000},
        {0x33c00000, 0x0002}, /* 1.5 * 2^-24: tie, to even = 2 */
        {0x34200000, 0x0002}, /* 2.5 * 2^-24: tie, to even = 2 */
        {0x387fc000, 0x03ff}, /* largest subnormal */
        {0x387fe000, 0x0400}, /* halfway to 2^-14: to even = smallest normal */
        {0x38800000, 0x0400}, /* 2^-14 */
        {0x00000001, 0x0000}, /* f32 subnormals vanish, sign kept */
        {0x80000001, 0x8000},
        {0x80000000, 0x8000},
        {0x7f800000, 0x7c00},
        {0xff800000, 0xfc00},
        {0x7fc00000, 0x7e00}, /* quiet NaN */
        {0x7f800001, 0x7e00}, /* signalling NaN, payload below f16 precision: quieted */
        {0xffa00000, 0xff00}, /* signalling NaN, payload kept, quieted */
        {0x7fffffff, 0x7fff},
    };
    float in[sizeof cases / sizeof cases[0]];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        in[i] = from_bits(cases[i].f);
        if (kvq_f32_to_f16_ref(in[i]) != cases[i].h)
            fail_msg("f32 %08x -> f16 %04x, expected %04x", cases[i].f,
                     kvq_f32_to_f16_ref(in[i]), cases[i].h);
    }
    check_to16_paths(in, sizeof cases / sizeof cases[0]);
}

/* ---- bf16 ----------------------------------------------------------------------------- */

static void test_bf16_all(void **state)
{
    static uint16_t in[65536];
    static float ref[65536], out[65536], wide[65536];
    for (uint32_t h = 0; h < 65536; h++) {
        in[h] = (uint16_t)h;
        ref[h] = kvq_bf16_to_f32_ref((uint16_t)h);
        const int nan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
        assert_int_equal(bits(ref[h]), (h << 16) | (nan ? 0x00400000u : 0));
        assert_int_equal(kvq_f32_to_bf16_ref(ref[h]), nan ? (h | 0x40) : h);
        wide[h] = ref[h];
    }
    for (size_t p = 0; p < N_PATHS; p++) {
        if (!runnable(p))
            continue;
        memset(out, 0xa5, sizeof out);
        all_paths[p].frombf(in, out, 65536);
        for (uint32_t h = 0; h < 65536; h++)
            if (bits(out[h]) != bits(ref[h]))
                fail_msg("%s: bf16 %04x -> %08x, ref %08x", all_paths[p].name, h, bits(out[h]),
                         bits(ref[h]));
    }
    check_tobf_paths(wide, 65536);
}

static void test_bf16_edge_cases(void **state)
{
    static const struct { uint32_t f; uint16_t h; } cases[] = {
        {0x3f800000, 0x3f80}, {0x3f808000, 0x3f80}, /* tie, to even */
        {0x3f818000, 0x3f82}, {0x3f808001, 0x3f81}, {0x3f807fff, 0x3f80},
        {0x7f7fffff, 0x7f80}, /* FLT_MAX rounds to Inf */
        {0x7f7f7fff, 0x7f7f}, {0x7f7f8000, 0x7f80}, /* tie at max, odd: to Inf */
        {0x00008000, 0x0000}, {0x00018000, 0x0002}, {0x00000001, 0x0000},
        {0x80008001, 0x8001}, {0x80000000, 0x8000},
        {0x7f800000, 0x7f80}, {0xff800000, 0xff80},
        {0x7f800001, 0x7fc0}, {0xff810000, 0xffc1}, {0x7fc00000, 0x7fc0},
    };
    float in[sizeof cases / sizeof cases[0]];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        in[i] = from_bits(cases[i].f);
        if (kvq_f32_to_bf16_ref(in[i]) != cases[i].h)
            fail_msg("f32 %08x -> bf16 %04x, expected %04x", cases[i].f,
                     kvq_f32_to_bf16_ref(in[i]), cases[i].h);
    }
    check_tobf_paths(in, sizeof cases / sizeof cases[0]);
}

/* ---- random bit patterns, strided sweep of all f32, tails ------------------------------ */

static void test_random_and_sweep(void **state)
{
    const size_t n = 1u << 21;
    float *in = malloc(n * sizeof *in);
    assert_non_null(in);
    kvq_rng rng;
    kvq_rng_seed(&rng, 42);
    for (size_t i = 0; i < n / 2; i++)
        in[i] = from_bits((uint32_t)kvq_rng_u64(&rng));
    /* a strided sweep over all 2^32 patterns (stride 4099, prime) */
    for (size_t i = n / 2; i < n; i++)
        in[i] = from_bits((uint32_t)((i - n / 2) * 4099u));
    check_to16_paths(in, n);
    check_tobf_paths(in, n);
    free(in);
}

/* Every length 0..80 at every start offset 0..3: the tails of each path, and nothing
 * written past the end. */
static void test_lengths_and_tails(void **state)
{
    enum { MAXN = 80, PAD = 8 };
    float src[MAXN + 4], fout[MAXN + 4 + PAD], fref[MAXN + 4];
    uint16_t h[MAXN + 4], hout[MAXN + 4 + PAD], href[MAXN + 4];
    kvq_rng rng;
    kvq_rng_seed(&rng, 3);
    for (int i = 0; i < MAXN + 4; i++) {
        src[i] = (float)kvq_rng_normal(&rng) * 100.0f;
        h[i] = (uint16_t)kvq_rng_u64(&rng);
    }
    for (size_t p = 0; p < N_PATHS; p++) {
        if (!runnable(p))
            continue;
        const path *pa = &all_paths[p];
        for (size_t off = 0; off < 4; off++)
            for (size_t n = 0; n <= MAXN; n++) {
                /* f32 -> f16 and bf16 */
                for (int bf = 0; bf < 2; bf++) {
                    memset(hout, 0xee, sizeof hout);
                    (bf ? pa->tobf : pa->to16)(src + off, hout + off, n);
                    for (size_t i = 0; i < n; i++) {
                        href[i] = bf ? kvq_f32_to_bf16_ref(src[off + i])
                                     : kvq_f32_to_f16_ref(src[off + i]);
                        assert_int_equal(hout[off + i], href[i]);
                    }
                    for (size_t i = off + n; i < MAXN + 4 + PAD; i++)
                        assert_int_equal(hout[i], 0xeeee);
                    for (size_t i = 0; i < off; i++)
                        assert_int_equal(hout[i], 0xeeee);
                }
                /* f16 and bf16 -> f32 */
                for (int bf = 0; bf < 2; bf++) {
                    memset(fout, 0xee, sizeof fout);
                    (bf ? pa->frombf : pa->from16)(h + off, fout + off, n);
                    for (size_t i = 0; i < n; i++) {
                        fref[i] = bf ? kvq_bf16_to_f32_ref(h[off + i])
                                     : kvq_f16_to_f32_ref(h[off + i]);
                        assert_int_equal(bits(fout[off + i]), bits(fref[i]));
                    }
                    for (size_t i = off + n; i < MAXN + 4 + PAD; i++)
                        assert_int_equal(bits(fout[i]), 0xeeeeeeeeu);
                }
            }
    }
}

static void test_dispatch_level(void **state)
{
    const int level = kvq_half_simd_level();
    assert_true(level >= KVQ_SIMD_SCALAR && level <= KVQ_SIMD_AVX512);
    if (level == KVQ_SIMD_AVX512)
        assert_true(kvq_cpu_has_avx512());
    if (level >= KVQ_SIMD_AVX2)
        assert_true(kvq_cpu_has_avx2());
#if KVQ_HAVE_X86_SIMD
    if (kvq_cpu_has_avx512())
        assert_int_equal(level, KVQ_SIMD_AVX512);
#endif
    printf("[  INFO    ] half: SIMD level %d (%s)\n", level,
           level == 2 ? "AVX-512" : level == 1 ? "AVX2+F16C" : "scalar");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dispatch_level),
        cmocka_unit_test(test_f16_to_f32_all),
        cmocka_unit_test(test_f16_round_trip_all),
        cmocka_unit_test(test_f16_edge_cases),
        cmocka_unit_test(test_f32_patterns),
        cmocka_unit_test(test_bf16_all),
        cmocka_unit_test(test_bf16_edge_cases),
        cmocka_unit_test(test_random_and_sweep),
        cmocka_unit_test(test_lengths_and_tails),
    };
    return cmocka_run_group_tests_name("half", tests, NULL, NULL);
}
