/* test_common.c — status strings, checked parsing, UTF-8, atomic output, RNG. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <math.h>
#include <stdlib.h>

#include "helpers/testutil.h"
#include "kvq/util.h"
#include "kvq.h"

static void test_status_strings(void **state)
{
    assert_string_equal(kvq_status_str(KVQ_OK), "ok");
    assert_string_equal(kvq_status_str(KVQ_E_TRUNCATED_HEADER), "truncated header");
    assert_string_equal(kvq_status_str(KVQ_E_CHECKSUM), "checksum mismatch");
    assert_string_equal(kvq_status_str((kvq_status)12345), "unknown status");
    kvq_err e = {0};
    assert_int_equal(kvq_err_set(&e, KVQ_E_IO, "%s: %d", "f", 3), KVQ_E_IO);
    assert_int_equal(e.status, KVQ_E_IO);
    assert_string_equal(e.msg, "f: 3");
    assert_int_equal(kvq_err_set(NULL, KVQ_E_NOMEM, "x"), KVQ_E_NOMEM);
    /* text quoted from a damaged file: control bytes do not break the line; UTF-8 stays */
    kvq_err_set(&e, KVQ_E_CORRUPT, "m.gguf: token '%s'", "a\nb\x1d\tc\x7f\xc3\xa9");
    assert_string_equal(e.msg, "m.gguf: token 'a?b??c?\xc3\xa9'");
}

static void test_parse_numbers(void **state)
{
    int64_t v;
    double d;
    kvq_err e = {0};
    assert_int_equal(kvq_parse_i64("42", 0, 100, &v, &e), KVQ_OK);
    assert_int_equal(v, 42);
    assert_int_equal(kvq_parse_i64("-3", -5, 5, &v, &e), KVQ_OK);
    assert_int_equal(v, -3);
    assert_int_equal(kvq_parse_i64("42x", 0, 100, &v, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "42x"));
    assert_int_equal(kvq_parse_i64("", 0, 100, &v, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_parse_i64("101", 0, 100, &v, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_parse_i64("99999999999999999999", INT64_MIN, INT64_MAX, &v, &e),
                     KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_parse_f64("0.25", 0, 1, &d, &e), KVQ_OK);
    assert_true(d == 0.25);
    assert_int_equal(kvq_parse_f64("nan", -1e9, 1e9, &d, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_parse_f64("1e3 ", 0, 1e9, &d, &e), KVQ_E_INVALID_ARG);
}

static void test_parse_list(void **state)
{
    int32_t *l = NULL;
    size_t n = 0;
    kvq_err e = {0};
    assert_int_equal(kvq_parse_index_list("4,0-2,2", 5, &l, &n, &e), KVQ_OK);
    assert_int_equal(n, 4);
    assert_int_equal(l[0], 0);
    assert_int_equal(l[1], 1);
    assert_int_equal(l[2], 2);
    assert_int_equal(l[3], 4);
    free(l);
    assert_int_equal(kvq_parse_index_list("3-1", 5, &l, &n, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_parse_index_list("5", 5, &l, &n, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_parse_index_list("a", 5, &l, &n, &e), KVQ_E_INVALID_ARG);
    assert_null(l);
}

static void test_utf8(void **state)
{
    assert_true(kvq_utf8_valid("plain", 5));
    assert_true(kvq_utf8_valid("\xe2\x96\x81x", 4));       /* U+2581 */
    assert_true(kvq_utf8_valid("\xf0\x9f\x98\x80", 4));    /* U+1F600 */
    assert_false(kvq_utf8_valid("\xc0\xaf", 2));           /* overlong '/' */
    assert_false(kvq_utf8_valid("\xed\xa0\x80", 3));       /* surrogate */
    assert_false(kvq_utf8_valid("\xe2\x96", 2));           /* truncated */
    assert_false(kvq_utf8_valid("\xf4\x90\x80\x80", 4));   /* > U+10FFFF */
    assert_false(kvq_utf8_valid("\xff", 1));
}

static void test_atomic_file(void **state)
{
    const char *p = test_path("atomic.txt");
    kvq_atomic_file af;
    kvq_err e = {0};
    assert_int_equal(kvq_atomic_open(p, 0, &af, &e), KVQ_OK);
    fputs("hello", af.fp);
    assert_int_not_equal(access(p, F_OK), 0); /* nothing at the final name yet */
    assert_int_equal(kvq_atomic_commit(&af, &e), KVQ_OK);
    uint8_t *buf;
    size_t n;
    assert_int_equal(kvq_read_file(p, &buf, &n, &e), KVQ_OK);
    assert_int_equal(n, 5);
    assert_memory_equal(buf, "hello", 5);
    free(buf);
    /* refuses to overwrite unless asked */
    assert_int_equal(kvq_atomic_open(p, 0, &af, &e), KVQ_E_EXISTS);
    /* an aborted write leaves the old file untouched */
    assert_int_equal(kvq_atomic_open(p, 1, &af, &e), KVQ_OK);
    fputs("partial", af.fp);
    kvq_atomic_abort(&af);
    assert_int_equal(kvq_read_file(p, &buf, &n, &e), KVQ_OK);
    assert_int_equal(n, 5);
    free(buf);
    assert_int_equal(kvq_read_file(test_path("missing"), &buf, &n, &e), KVQ_E_NOT_FOUND);
}

/* The output rules of common/output.c: --force replaces only what the owner predicate
 * recognises, a failed rename puts the old directory back, stale temporaries of a dead
 * process go and nothing else does, and the signal-time cleanup removes the live ones. */
static int has_keep(const char *dir)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/keep", dir);
    return access(p, F_OK) == 0;
}

static int count_prefix(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)))
        n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d)
        closedir(d);
    return n;
}

static void test_output_rules(void **state)
{
    kvq_err e = {0};
    char keep[4200], tmp[4200], stale[4200], live[4200], other[4200];
    const char *dir = test_path("out_dir");
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(keep, sizeof keep, "%s/keep", dir);
    assert_int_equal(test_write_file(keep, "x", 1), 0);
    /* exists: refused without overwrite, and with it when the predicate says "not ours" */
    assert_int_equal(kvq_output_check(dir, 0, has_keep, "ours", &e), KVQ_E_EXISTS);
    assert_int_equal(kvq_output_check(dir, 1, NULL, "ours", &e), KVQ_E_EXISTS);
    assert_non_null(strstr(e.msg, "exists and is not ours"));
    assert_int_equal(kvq_output_check(dir, 1, has_keep, "ours", &e), KVQ_OK);
    assert_int_equal(kvq_output_check(test_path("no/such/dir"), 0, NULL, "x", &e), KVQ_E_IO);
    /* a commit whose rename fails keeps the old directory */
    snprintf(tmp, sizeof tmp, "%s.tmp.missing", dir);
    assert_int_not_equal(kvq_tmpdir_commit(tmp, dir, 1, has_keep, "ours", &e), KVQ_OK);
    assert_true(access(keep, F_OK) == 0);
    /* a successful one replaces it, and leaves nothing beside it */
    char *t = NULL;
    assert_int_equal(kvq_tmpdir_create(dir, 1, has_keep, "ours", &t, &e), KVQ_OK);
    assert_int_equal(kvq_tmpdir_commit(t, dir, 1, has_keep, "ours", &e), KVQ_OK);
    free(t);
    assert_false(access(keep, F_OK) == 0);
    assert_int_equal(count_prefix(test_tmpdir(), "out_dir."), 0);
    /* stale temporaries: a dead pid's go; ours, and names not of kvq's form, stay */
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    waitpid(child, NULL, 0);
    snprintf(stale, sizeof stale, "%s.tmp.%d.0123abcd", test_path("o.kvq"), (int)child);
    snprintf(live, sizeof live, "%s.tmp.%d.0123abcd", test_path("o.kvq"), (int)getpid());
    snprintf(other, sizeof other, "%s.tmp.notes", test_path("o.kvq"));
    assert_int_equal(test_write_file(stale, "s", 1), 0);
    assert_int_equal(test_write_file(live, "l", 1), 0);
    assert_int_equal(test_write_file(other, "o", 1), 0);
    kvq_output_clean_stale(test_path("o.kvq"));
    assert_false(access(stale, F_OK) == 0);
    assert_true(access(live, F_OK) == 0 && access(other, F_OK) == 0);
    /* the signal-time cleanup removes the open temporaries (a file and a directory) */
    kvq_atomic_file af;
    assert_int_equal(kvq_atomic_open(test_path("sig.kvq"), 0, &af, &e), KVQ_OK);
    fputs("partial", af.fp);
    fflush(af.fp);
    assert_int_equal(kvq_tmpdir_create(test_path("sigdir"), 0, NULL, "x", &t, &e), KVQ_OK);
    snprintf(tmp, sizeof tmp, "%s/layer", t);
    assert_int_equal(test_write_file(tmp, "z", 1), 0);
    kvq_output_remove_temporaries();
    assert_int_equal(count_prefix(test_tmpdir(), "sig.kvq.tmp."), 0);
    assert_int_equal(count_prefix(test_tmpdir(), "sigdir.tmp."), 0);
    kvq_atomic_abort(&af);
    free(t);
}

static void test_rng_reproducible(void **state)
{
    kvq_rng a, b;
    kvq_rng_seed(&a, 7);
    kvq_rng_seed(&b, 7);
    for (int i = 0; i < 100; i++)
        assert_true(kvq_rng_u64(&a) == kvq_rng_u64(&b));
    kvq_rng_seed(&b, 8);
    assert_true(kvq_rng_u64(&a) != kvq_rng_u64(&b));
    /* below() stays in range and hits every value */
    int hit[7] = {0};
    for (int i = 0; i < 1000; i++) {
        uint64_t x = kvq_rng_below(&a, 7);
        assert_true(x < 7);
        hit[x] = 1;
    }
    for (int i = 0; i < 7; i++)
        assert_true(hit[i]);
    double s = 0, s2 = 0;
    for (int i = 0; i < 20000; i++) {
        double x = kvq_rng_normal(&a);
        s += x;
        s2 += x * x;
    }
    assert_true(fabs(s / 20000) < 0.05);
    assert_true(fabs(s2 / 20000 - 1.0) < 0.05);
}

static void test_small_helpers(void **state)
{
    (void)state;
    /* JSON strings: one escaper for files and string buffers. */
    const char *in = "a\"b\\c\n\t\x01\x7f\xc3\xa9";
    const char *want = "\"a\\\"b\\\\c\\n\\t\\u0001\\u007f\xc3\xa9\"";
    kvq_strbuf b = {0};
    kvq_sb_json_str(&b, in);
    assert_false(b.oom);
    assert_string_equal(b.s, want);
    char buf[64] = {0};
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    assert_non_null(f);
    kvq_json_write_str(f, in);
    kvq_json_write_str(f, NULL);
    fclose(f);
    char both[64];
    snprintf(both, sizeof both, "%snull", want);
    assert_string_equal(buf, both);
    /* Not UTF-8: the high bytes become '?' so the JSON stays readable. */
    kvq_sb_free(&b);
    kvq_sb_json_str(&b, "x\xff");
    assert_string_equal(b.s, "\"x?\"");
    kvq_sb_free(&b);
    kvq_sb_put(&b, "ab", 2);
    kvq_sb_printf(&b, "%d-%s", 42, "z");
    kvq_sb_puts(&b, "!");
    assert_int_equal(b.len, 7);
    assert_string_equal(b.s, "ab42-z!");
    kvq_sb_free(&b);
    assert_null(b.s);

    /* Growth keeps the contents and at least the room asked for. */
    int32_t *v = NULL;
    size_t cap = 0;
    for (int32_t i = 0; i < 1000; i++) {
        assert_int_equal(kvq_grow((void **)&v, &cap, (size_t)i + 1, sizeof *v), 0);
        assert_true(cap > (size_t)i);
        v[i] = 999 - i;
    }
    assert_int_equal(kvq_grow((void **)&v, &cap, SIZE_MAX, sizeof *v), -1);
    assert_int_equal(kvq_resize((void **)&v, SIZE_MAX / 2, sizeof *v), -1);
    qsort(v, 1000, sizeof *v, kvq_cmp_i32);
    for (int32_t i = 0; i < 1000; i++)
        assert_int_equal(v[i], i);
    assert_int_equal(kvq_resize((void **)&v, 10, sizeof *v), 0);
    assert_int_equal(v[9], 9);
    free(v);
    int64_t w[3] = {INT64_MAX, INT64_MIN, 0};
    qsort(w, 3, sizeof *w, kvq_cmp_i64);
    assert_true(w[0] == INT64_MIN && w[1] == 0 && w[2] == INT64_MAX);

    char *p = kvq_path_join("dir", "name.json");
    assert_string_equal(p, "dir/name.json");
    free(p);
}

/* XXH64 against the Python xxhash package (scripts/gen_xxh64_golden.py): inputs
 * (i * 31 + 7) mod 256, every tail length, two seeds; one shot and streamed in pieces. */
static void test_xxh64_golden(void **state)
{
    (void)state;
    static const struct { size_t n; uint64_t seed, h; } golden[] = {
    {0, 0x0000000000000000ULL, 0xef46db3751d8e999ULL},
    {1, 0x0000000000000000ULL, 0xa96c7f0ce858bbb7ULL},
    {2, 0x0000000000000000ULL, 0xac378c5993cd5f9aULL},
    {3, 0x0000000000000000ULL, 0x56e6957632a487f9ULL},
    {4, 0x0000000000000000ULL, 0xc60d15b1e3ff8f04ULL},
    {5, 0x0000000000000000ULL, 0x808815858624dd4eULL},
    {7, 0x0000000000000000ULL, 0xafbefc3d6c6f9a8eULL},
    {8, 0x0000000000000000ULL, 0x3da5c7aa269683e0ULL},
    {9, 0x0000000000000000ULL, 0x4b17a9ba9e215c09ULL},
    {31, 0x0000000000000000ULL, 0x4a74f3a1a39ad4a1ULL},
    {32, 0x0000000000000000ULL, 0x8d57d6a4671cc43dULL},
    {33, 0x0000000000000000ULL, 0x62c9fd21ed857664ULL},
    {63, 0x0000000000000000ULL, 0x5c320a0d2707057fULL},
    {64, 0x0000000000000000ULL, 0x7bbabbc45729d17eULL},
    {100, 0x0000000000000000ULL, 0xefa0ad2d3e70c151ULL},
    {1000, 0x0000000000000000ULL, 0x99594f4828043d35ULL},
    {4099, 0x0000000000000000ULL, 0x98531e44aa4f969dULL},
    {0, 0x9e3779b97f4a7c15ULL, 0xc4349fc93c010000ULL},
    {1, 0x9e3779b97f4a7c15ULL, 0x585882422a6165e7ULL},
    {2, 0x9e3779b97f4a7c15ULL, 0x641d1a59667ae544ULL},
    {3, 0x9e3779b97f4a7c15ULL, 0x5acb303e78133c22ULL},
    {4, 0x9e3779b97f4a7c15ULL, 0x7d51d5e2461732b3ULL},
    {5, 0x9e3779b97f4a7c15ULL, 0x7f8b72856a42bb63ULL},
    {7, 0x9e3779b97f4a7c15ULL, 0x2ce9adec2b2c8104ULL},
    {8, 0x9e3779b97f4a7c15ULL, 0x758848f033fa76a2ULL},
    {9, 0x9e3779b97f4a7c15ULL, 0xd4576cf554b7d929ULL},
    {31, 0x9e3779b97f4a7c15ULL, 0x8137041f5af88413ULL},
    {32, 0x9e3779b97f4a7c15ULL, 0x184ebcf3745cd46cULL},
    {33, 0x9e3779b97f4a7c15ULL, 0x52fac3c981f3cc2eULL},
    {63, 0x9e3779b97f4a7c15ULL, 0x64ef99a2e94cc7bdULL},
    {64, 0x9e3779b97f4a7c15ULL, 0xf7f22435fe1ab128ULL},
    {100, 0x9e3779b97f4a7c15ULL, 0xbc7ab33be7528c18ULL},
    {1000, 0x9e3779b97f4a7c15ULL, 0xda717f741f399f3fULL},
    {4099, 0x9e3779b97f4a7c15ULL, 0xc30ffd8b19f6086bULL},
    };
    static uint8_t data[4099];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)((i * 31 + 7) % 256);
    for (size_t g = 0; g < sizeof golden / sizeof golden[0]; g++) {
        assert_int_equal(kvq_xxh64(data, golden[g].n, golden[g].seed), golden[g].h);
        static const size_t steps[] = {1, 3, 7, 31, 33, 64};
        for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
            kvq_xxh64_state s;
            kvq_xxh64_init(&s, golden[g].seed);
            for (size_t i = 0; i < golden[g].n; i += steps[k])
                kvq_xxh64_update(&s, data + i,
                                 golden[g].n - i < steps[k] ? golden[g].n - i : steps[k]);
            assert_int_equal(kvq_xxh64_digest(&s), golden[g].h);
        }
    }
}

/* A lock is held by one taker at a time, names its holder, and is free again (and its
 * file gone) after release; a FIFO is refused at once rather than waited on. */
static void test_lock_and_regular(void **state)
{
    (void)state;
    const char *lp = test_path("x.lock");
    kvq_lock a, b;
    kvq_err e = {0};
    assert_int_equal(kvq_lock_take(lp, "thing", &a, &e), KVQ_OK);
    assert_int_equal(kvq_lock_take(lp, "thing", &b, &e), KVQ_E_EXISTS);
    char want[64];
    snprintf(want, sizeof want, "(pid %ld on host ", (long)getpid());
    assert_non_null(strstr(e.msg, "thing is in use by another kvq run"));
    assert_non_null(strstr(e.msg, want));
    assert_int_equal(b.fd, -1);
    kvq_lock_release(&a);
    assert_int_not_equal(access(lp, F_OK), 0);
    assert_int_equal(kvq_lock_take(lp, "thing", &b, &e), KVQ_OK);
    kvq_lock_release(&b);
    kvq_lock_release(&b); /* safe twice */

    const char *fifo = test_path("f.fifo");
    assert_int_equal(mkfifo(fifo, 0644), 0);
    int fd = -1;
    struct stat st;
    assert_int_equal(kvq_open_regular(fifo, &fd, &st, &e), KVQ_E_IO);
    assert_non_null(strstr(e.msg, "not a regular file (a FIFO)"));
    assert_int_equal(fd, -1);
    uint8_t *d = NULL;
    size_t n = 0;
    assert_int_equal(kvq_read_file(fifo, &d, &n, &e), KVQ_E_IO);
    kvq_map m;
    assert_int_equal(kvq_map_file(fifo, &m, &e), KVQ_E_IO);
    assert_int_equal(kvq_read_file(test_tmpdir(), &d, &n, &e), KVQ_E_IO);
    assert_non_null(strstr(e.msg, "(a directory)"));
}

static int teardown(void **state)
{
    test_tmpdir_cleanup();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_output_rules),
        cmocka_unit_test(test_parse_numbers),
        cmocka_unit_test(test_parse_list),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_atomic_file),
        cmocka_unit_test(test_rng_reproducible),
        cmocka_unit_test(test_small_helpers),
        cmocka_unit_test(test_xxh64_golden),
        cmocka_unit_test(test_lock_and_regular),
    };
    return cmocka_run_group_tests_name("common", tests, NULL, teardown);
}
