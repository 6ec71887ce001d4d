/* test_corpus.c — corpus specs, every source kind, mixing, generator determinism, jsonl
 * error lines, the provenance hash, and sequence cutting (exact ids, BOS positions,
 * separators, max_tokens, partial sequences, errors). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers/testutil.h"
#include "kvq/util.h"
#include "kvq.h"

/* ---- helpers ------------------------------------------------------------------ */

static void write_str(const char *path, const char *s)
{
    assert_int_equal(test_write_file(path, s, strlen(s)), 0);
}

static void write_ids(const char *path, const int32_t *ids, size_t n)
{
    uint8_t *b = malloc(4 * n + 1);
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++)
            b[4 * i + k] = (uint8_t)((uint32_t)ids[i] >> (8 * k));
    assert_int_equal(test_write_file(path, b, 4 * n), 0);
    free(b);
}

static kvq_corpus *open_ok(const char *spec, const kvq_corpus_params *p)
{
    kvq_corpus *c = NULL;
    kvq_err e = {0};
    if (kvq_corpus_open(spec, p, &c, &e))
        fail_msg("open '%s': %s", spec, e.msg);
    return c;
}

/* All documents of a corpus, texts concatenated with '|' after each, labels likewise. */
typedef struct docs {
    char text[1 << 16];
    char labels[4096];
    int n;
    uint32_t source[64], part[64];
} docs;

static kvq_status read_all(const kvq_corpus *c, docs *d, kvq_err *e)
{
    kvq_corpus_iter *it = NULL;
    memset(d, 0, sizeof *d);
    assert_int_equal(kvq_corpus_iter_new(c, &it, e), KVQ_OK);
    const kvq_corpus_doc *doc;
    kvq_status st;
    while ((st = kvq_corpus_iter_next(it, &doc, e)) == KVQ_OK && doc) {
        assert_int_equal(doc->index, (uint64_t)d->n);
        assert_true(doc->text != NULL && doc->len > 0);
        assert_int_equal(strlen(doc->text), doc->len);
        strncat(d->text, doc->text, sizeof d->text - strlen(d->text) - 2);
        strcat(d->text, "|");
        strncat(d->labels, doc->label, sizeof d->labels - strlen(d->labels) - 2);
        strcat(d->labels, "|");
        if (d->n < 64) {
            d->source[d->n] = doc->source;
            d->part[d->n] = doc->part;
        }
        d->n++;
    }
    kvq_corpus_iter_free(it);
    return st;
}

static const char *tmp_sub(const char *name)
{
    const char *p = test_path(name);
    mkdir(p, 0755);
    return p;
}

/* ---- sources ------------------------------------------------------------------- */

static void test_file_and_parts(void **state)
{
    const char *a = test_path("a.txt");
    write_str(a, "hello world\n");
    char spec[4200];
    snprintf(spec, sizeof spec, "file:%s", a);
    kvq_corpus *c = open_ok(spec, NULL);
    assert_int_equal(kvq_corpus_source_count(c), 1);
    assert_int_equal(kvq_corpus_source_at(c, 0)->kind, KVQ_CORPUS_FILE);
    assert_string_equal(kvq_corpus_source_at(c, 0)->path, a);
    assert_null(kvq_corpus_source_at(c, 1));
    docs *d = malloc(sizeof *d);
    kvq_err e = {0};
    assert_int_equal(read_all(c, d, &e), KVQ_OK);
    assert_int_equal(d->n, 1);
    assert_string_equal(d->text, "hello world\n|");
    char want[4200];
    snprintf(want, sizeof want, "%s|", a);
    assert_string_equal(d->labels, want);
    kvq_corpus_free(c);

    /* 10,000 bytes of lines, read in 4096-byte parts: each part ends at a newline and
     * the parts concatenate to the file, so the hash is the file's */
    char big[10001];
    for (int i = 0; i < 1000; i++)
        snprintf(big + 10 * i, 11, "line %04d\n", i);
    const char *b = test_path("big.txt");
    write_str(b, big);
    kvq_corpus_params p;
    kvq_corpus_params_default(&p);
    p.max_doc_bytes = 4096;
    c = open_ok(b, &p); /* a plain path: auto-detected as a file */
    assert_int_equal(kvq_corpus_source_at(c, 0)->kind, KVQ_CORPUS_FILE);
    kvq_corpus_iter *it;
    assert_int_equal(kvq_corpus_iter_new(c, &it, &e), KVQ_OK);
    const kvq_corpus_doc *doc;
    size_t off = 0;
    uint32_t parts = 0;
    while (kvq_corpus_iter_next(it, &doc, &e) == KVQ_OK && doc) {
        assert_int_equal(doc->part, parts);
        assert_true(doc->len <= 4096);
        assert_int_equal(doc->text[doc->len - 1], '\n');
        assert_memory_equal(doc->text, big + off, doc->len);
        off += doc->len;
        parts++;
    }
    assert_int_equal(off, 10000);
    assert_int_equal(parts, 3);
    kvq_corpus_iter_free(it);
    uint64_t h, nd, nb;
    assert_int_equal(kvq_corpus_hash(c, &h, &nd, &nb, &e), KVQ_OK);
    assert_true(h == kvq_fnv1a64(big, 10000, KVQ_FNV1A64_INIT));
    assert_int_equal(nd, 3);
    assert_int_equal(nb, 10000);
    kvq_corpus_free(c);

    /* no newline at all: cut between code points (é is 2 bytes, 4096 is even, so put
     * one ASCII byte first to make the cut land inside a character) */
    char *u = malloc(9002);
    u[0] = 'x';
    for (int i = 0; i < 4500; i++) {
        u[1 + 2 * i] = '\xc3';
        u[2 + 2 * i] = '\xa9';
    }
    u[9001] = 0;
    const char *up = test_path("utf8.txt");
    write_str(up, u);
    c = open_ok(up, &p);
    assert_int_equal(kvq_corpus_iter_new(c, &it, &e), KVQ_OK);
    off = 0;
    while (kvq_corpus_iter_next(it, &doc, &e) == KVQ_OK && doc) {
        assert_true(kvq_utf8_valid(doc->text, doc->len));
        assert_memory_equal(doc->text, u + off, doc->len);
        off += doc->len;
    }
    assert_int_equal(off, 9001);
    kvq_corpus_iter_free(it);
    kvq_corpus_free(c);
    free(u);
    free(d);
}

static void test_dir(void **state)
{
    const char *root = tmp_sub("corpus");
    char p[4200], q[4200];
    snprintf(p, sizeof p, "%s/b.txt", root);
    write_str(p, "B");
    snprintf(p, sizeof p, "%s/a.md", root);
    write_str(p, "A");
    snprintf(p, sizeof p, "%s/c.bin", root);
    write_str(p, "not text");
    snprintf(p, sizeof p, "%s/.hidden.txt", root);
    write_str(p, "hidden");
    snprintf(p, sizeof p, "%s/empty.txt", root);
    write_str(p, "");
    snprintf(p, sizeof p, "%s/sub", root);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/sub/x.txt", root);
    write_str(p, "X");
    snprintf(p, sizeof p, "%s/sub/deeper", root);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/sub/deeper/y.md", root);
    write_str(p, "Y");
    snprintf(p, sizeof p, "%s/z.txt", root);
    write_str(p, "Z");
    snprintf(p, sizeof p, "%s/outside.txt", test_tmpdir());
    write_str(p, "L");
    snprintf(q, sizeof q, "%s/l.txt", root); /* a link to a file is followed */
    assert_int_equal(symlink(p, q), 0);
    snprintf(p, sizeof p, "%s/sub", root);
    snprintf(q, sizeof q, "%s/link", root); /* a link to a directory is not */
    assert_int_equal(symlink(p, q), 0);

    char spec[4200];
    snprintf(spec, sizeof spec, "dir:%s", root);
    kvq_corpus *c = open_ok(spec, NULL);
    docs *d = malloc(sizeof *d);
    kvq_err e = {0};
    assert_int_equal(read_all(c, d, &e), KVQ_OK);
    /* a.md b.txt l.txt sub/deeper/y.md sub/x.txt z.txt: strcmp order, depth first */
    assert_string_equal(d->text, "A|B|L|Y|X|Z|");
    char want[8192];
    snprintf(want, sizeof want, "%s/a.md|%s/b.txt|%s/l.txt|%s/sub/deeper/y.md|%s/sub/x.txt|"
             "%s/z.txt|", root, root, root, root, root, root);
    assert_string_equal(d->labels, want);
    kvq_corpus_free(c);
    /* plain path: auto-detected as a directory */
    c = open_ok(root, NULL);
    assert_int_equal(kvq_corpus_source_at(c, 0)->kind, KVQ_CORPUS_DIR);
    kvq_corpus_free(c);
    free(d);
}

static void test_jsonl(void **state)
{
    const char *j = test_path("d.jsonl");
    write_str(j, "{\"text\": \"one\"}\n\n  \n{\"text\": \"\"}\n{\"id\": 3, \"text\": \"two\\nlines "
                 "\\u00e9\"}\n");
    kvq_corpus *c = open_ok(j, NULL); /* auto-detected by the .jsonl suffix */
    assert_int_equal(kvq_corpus_source_at(c, 0)->kind, KVQ_CORPUS_JSONL);
    docs *d = malloc(sizeof *d);
    kvq_err e = {0};
    assert_int_equal(read_all(c, d, &e), KVQ_OK);
    assert_string_equal(d->text, "one|two\nlines \xc3\xa9|");
    char want[4200];
    snprintf(want, sizeof want, "%s:1|%s:5|", j, j);
    assert_string_equal(d->labels, want);
    kvq_corpus_free(c);

    struct {
        const char *body;
        const char *where;
        const char *what;
    } bad[] = {
        {"{\"text\": \"ok\"}\n{\"text\": \"ok\"\n", ":2:", "not valid JSON"},
        {"{\"text\": \"ok\"}\n\n[1, 2]\n", ":3:", "not a JSON object"},
        {"{\"txt\": \"x\"}\n", ":1:", "no \"text\""},
        {"{\"text\": 5}\n", ":1:", "no \"text\""},
        {"{\"text\": \"a\"} trailing\n", ":1:", "not valid JSON"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        write_str(j, bad[k].body);
        char spec[4200];
        snprintf(spec, sizeof spec, "jsonl:%s", j);
        c = open_ok(spec, NULL);
        assert_int_equal(read_all(c, d, &e), KVQ_E_BAD_JSON);
        snprintf(want, sizeof want, "%s%s", j, bad[k].where);
        if (!strstr(e.msg, want) || !strstr(e.msg, bad[k].what))
            fail_msg("case %zu: '%s'", k, e.msg);
        kvq_corpus_free(c);
    }
    free(d);
}

/* jsonl task documents: "answer" (and "task") make a line a task; a line without them,
 * also after a skipped empty one that had them, is plain text; bad fields are refused
 * naming the line. */
static void test_jsonl_tasks(void **state)
{
    (void)state;
    const char *j = test_path("t.jsonl");
    write_str(j, "{\"text\": \"a\", \"answer\": \"12345\"}\n"
                 "{\"text\": \"\", \"answer\": \"9\", \"task\": \"kv-recall\"}\n"
                 "{\"text\": \"b\"}\n"
                 "{\"text\": \"c\", \"answer\": \"0f\", \"task\": \"kv-recall\"}\n");
    kvq_corpus *c = open_ok(j, NULL);
    kvq_corpus_iter *it;
    const kvq_corpus_doc *doc;
    kvq_err e = {0};
    assert_int_equal(kvq_corpus_iter_new(c, &it, &e), KVQ_OK);
    const struct {
        const char *text, *answer;
        kvq_corpus_task task;
    } want[] = {{"a", "12345", KVQ_TASK_PASSKEY}, {"b", NULL, KVQ_TASK_NONE},
                {"c", "0f", KVQ_TASK_KV_RECALL}};
    for (size_t k = 0; k < 3; k++) {
        assert_int_equal(kvq_corpus_iter_next(it, &doc, &e), KVQ_OK);
        assert_non_null(doc);
        assert_string_equal(doc->text, want[k].text);
        assert_int_equal(doc->task, want[k].task);
        if (want[k].answer)
            assert_string_equal(doc->answer, want[k].answer);
        else
            assert_null(doc->answer);
    }
    assert_int_equal(kvq_corpus_iter_next(it, &doc, &e), KVQ_OK);
    assert_null(doc);
    kvq_corpus_iter_free(it);
    kvq_corpus_free(c);

    const struct {
        const char *body, *what;
    } bad[] = {
        {"{\"text\": \"x\", \"answer\": 5}\n", "\"answer\" is not a string"},
        {"{\"text\": \"x\", \"answer\": \"\"}\n", "\"answer\" is not a string"},
        {"{\"text\": \"x\", \"answer\": \"0123456789012345678901234567890123\"}\n",
         "\"answer\" is not a string of 1 to 31 bytes"},
        {"{\"text\": \"x\", \"answer\": \"1\", \"task\": \"qa\"}\n", "\"task\" is not"},
        {"{\"text\": \"x\", \"task\": \"passkey\"}\n", "without an \"answer\""},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        write_str(j, bad[k].body);
        c = open_ok(j, NULL);
        assert_int_equal(kvq_corpus_iter_new(c, &it, &e), KVQ_OK);
        assert_int_equal(kvq_corpus_iter_next(it, &doc, &e), KVQ_E_BAD_JSON);
        char where[4200];
        snprintf(where, sizeof where, "%s:1: ", j);
        if (!strstr(e.msg, where) || !strstr(e.msg, bad[k].what))
            fail_msg("case %zu: '%s'", k, e.msg);
        kvq_corpus_iter_free(it);
        kvq_corpus_free(c);
    }
}

static int is_hex(char ch) { return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'); }

static void test_generators(void **state)
{
    kvq_corpus_params p;
    kvq_corpus_params_default(&p);
    p.seed = 7;
    p.uuid_lines = 3;
    p.passkey_filler = 5;
    p.kv_pairs = 4;
    kvq_corpus *c = open_ok("uuid:2,passkey:3,kv-recall:2", &p);
    kvq_corpus_iter *it;
    kvq_err e = {0};
    assert_int_equal(kvq_corpus_iter_new(c, &it, &e), KVQ_OK);
    const kvq_corpus_doc *doc;
    char first_passkey[32] = "";
    for (int k = 0; k < 7; k++) {
        assert_int_equal(kvq_corpus_iter_next(it, &doc, &e), KVQ_OK);
        assert_non_null(doc);
        const char *t = doc->text;
        if (k < 2) { /* 3 lines of UUID v4 */
            assert_int_equal(doc->task, KVQ_TASK_NONE);
            assert_null(doc->answer);
            assert_int_equal(doc->len, 3 * 37);
            for (int l = 0; l < 3; l++) {
                const char *u = t + 37 * l;
                for (int i = 0; i < 36; i++) {
                    if (i == 8 || i == 13 || i == 18 || i == 23)
                        assert_int_equal(u[i], '-');
                    else
                        assert_true(is_hex(u[i]));
                }
                assert_int_equal(u[14], '4');
                assert_non_null(strchr("89ab", u[19]));
                assert_int_equal(u[36], '\n');
            }
            char lab[16];
            snprintf(lab, sizeof lab, "uuid#%d", k);
            assert_string_equal(doc->label, lab);
        } else if (k < 5) {
            assert_int_equal(doc->task, KVQ_TASK_PASSKEY);
            assert_int_equal(strlen(doc->answer), 5);
            assert_true(doc->answer[0] >= '1' && doc->answer[0] <= '9');
            char line[128];
            snprintf(line, sizeof line, "The pass key is %s. Remember it. %s is the pass key.\n",
                     doc->answer, doc->answer);
            assert_non_null(strstr(t, line));
            const char *q = "What is the pass key? The pass key is";
            assert_string_equal(t + doc->len - strlen(q), q);
            int filler = 0;
            for (const char *s = t; (s = strstr(s, "The grass is green.")); s++)
                filler++;
            assert_int_equal(filler, 5);
            if (k == 2)
                snprintf(first_passkey, sizeof first_passkey, "%s", doc->answer);
        } else {
            assert_int_equal(doc->task, KVQ_TASK_KV_RECALL);
            assert_int_equal(strlen(doc->answer), 8);
            /* the question names a key whose line holds the answer */
            const char *q = strstr(t, "What is the value of key ");
            assert_non_null(q);
            char key[9];
            memcpy(key, q + 25, 8);
            key[8] = 0;
            char line[32];
            snprintf(line, sizeof line, "%s: %s\n", key, doc->answer);
            assert_non_null(strstr(t, line));
            char tail[64];
            snprintf(tail, sizeof tail, "The value of key %s is", key);
            assert_string_equal(t + doc->len - strlen(tail), tail);
            int lines = 0;
            for (const char *s = t; (s = strstr(s, ": ")); s++)
                lines++;
            assert_int_equal(lines, 4);
        }
    }
    assert_int_equal(kvq_corpus_iter_next(it, &doc, &e), KVQ_OK);
    assert_null(doc);
    kvq_corpus_iter_free(it);

    /* determinism: same seed, same bytes; another seed, other bytes */
    uint64_t h1, h2, h3;
    assert_int_equal(kvq_corpus_hash(c, &h1, NULL, NULL, &e), KVQ_OK);
    assert_int_equal(kvq_corpus_hash(c, &h2, NULL, NULL, &e), KVQ_OK);
    assert_true(h1 == h2);
    kvq_corpus_free(c);
    c = open_ok("uuid:2,passkey:3,kv-recall:2", &p);
    assert_int_equal(kvq_corpus_hash(c, &h2, NULL, NULL, &e), KVQ_OK);
    assert_true(h1 == h2);
    kvq_corpus_free(c);
    p.seed = 8;
    c = open_ok("uuid:2,passkey:3,kv-recall:2", &p);
    assert_int_equal(kvq_corpus_hash(c, &h3, NULL, NULL, &e), KVQ_OK);
    assert_true(h1 != h3);
    kvq_corpus_free(c);

    /* a passkey source keeps its documents when other sources come before it */
    p.seed = 7;
    const char *f = test_path("x.txt");
    write_str(f, "filler file");
    char spec[4200];
    snprintf(spec, sizeof spec, "file:%s,uuid:1,passkey:1", f);
    c = open_ok(spec, &p);
    assert_int_equal(kvq_corpus_iter_new(c, &it, &e), KVQ_OK);
    for (int k = 0; k < 3; k++)
        assert_int_equal(kvq_corpus_iter_next(it, &doc, &e), KVQ_OK);
    assert_int_equal(doc->source, 2);
    assert_string_equal(doc->answer, first_passkey);
    kvq_corpus_iter_free(it);
    kvq_corpus_free(c);
    /* two sources of the same kind differ */
    docs *d = malloc(sizeof *d);
    c = open_ok("uuid:1,uuid:1", &p);
    assert_int_equal(read_all(c, d, &e), KVQ_OK);
    assert_int_equal(d->n, 2);
    assert_memory_not_equal(d->text, d->text + 3 * 37 + 1, 3 * 37);
    kvq_corpus_free(c);
    free(d);
}

static void test_mixing_and_spec_errors(void **state)
{
    const char *a = test_path("m.txt");
    write_str(a, "text A");
    const char *j = test_path("m.jsonl");
    write_str(j, "{\"text\":\"J1\"}\n{\"text\":\"J2\"}\n");
    char spec[8400];
    kvq_corpus_params p;
    kvq_corpus_params_default(&p);
    p.uuid_lines = 1;
    snprintf(spec, sizeof spec, "%s,uuid:1,jsonl:%s", a, j);
    kvq_corpus *c = open_ok(spec, &p);
    assert_string_equal(kvq_corpus_spec(c), spec);
    assert_int_equal(kvq_corpus_source_count(c), 3);
    assert_int_equal(kvq_corpus_source_at(c, 1)->kind, KVQ_CORPUS_UUID);
    assert_int_equal(kvq_corpus_source_at(c, 1)->count, 1);
    docs *d = malloc(sizeof *d);
    kvq_err e = {0};
    assert_int_equal(read_all(c, d, &e), KVQ_OK);
    assert_int_equal(d->n, 4);
    assert_int_equal(d->source[0], 0);
    assert_int_equal(d->source[1], 1);
    assert_int_equal(d->source[2], 2);
    assert_int_equal(d->source[3], 2);
    assert_memory_equal(d->text, "text A|", 7);
    assert_non_null(strstr(d->text, "|J1|J2|"));
    kvq_corpus_free(c);
    free(d);
    assert_string_equal(kvq_corpus_kind_name(KVQ_CORPUS_KV_RECALL), "kv-recall");

    const char *dir = tmp_sub("specdir");
    struct {
        const char *spec;
        kvq_status want;
        const char *msg;
    } bad[] = {
        {"", KVQ_E_INVALID_ARG, "empty"},
        {"uuid:0", KVQ_E_INVALID_ARG, "uuid:0"},
        {"passkey:x", KVQ_E_INVALID_ARG, "passkey:x"},
        {"kv-recall:10000001", KVQ_E_INVALID_ARG, "kv-recall"},
        {"uuid:3,,uuid:1", KVQ_E_INVALID_ARG, "empty item"},
        {"uuid:3,", KVQ_E_INVALID_ARG, "empty item"},
        {"file:", KVQ_E_INVALID_ARG, "no path"},
        {"file:/nonexistent/kvq/x.txt", KVQ_E_NOT_FOUND, "/nonexistent/kvq/x.txt"},
        {"/nonexistent/kvq/y", KVQ_E_NOT_FOUND, "/nonexistent/kvq/y"},
        {NULL, KVQ_E_INVALID_ARG, "not a directory"},  /* dir:FILE */
        {NULL, KVQ_E_INVALID_ARG, "not a regular file"}, /* file:DIR */
    };
    char s1[4200], s2[4200];
    snprintf(s1, sizeof s1, "dir:%s", a);
    snprintf(s2, sizeof s2, "jsonl:%s", dir);
    bad[9].spec = s1;
    bad[10].spec = s2;
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        c = NULL;
        kvq_status st = kvq_corpus_open(bad[k].spec, NULL, &c, &e);
        if (st != bad[k].want || !strstr(e.msg, bad[k].msg))
            fail_msg("'%s': got %d '%s'", bad[k].spec, st, e.msg);
        assert_null(c);
    }
    p.kv_pairs = 0;
    assert_int_equal(kvq_corpus_open("uuid:1", &p, &c, &e), KVQ_E_INVALID_ARG);
    p.kv_pairs = 4;
    p.max_doc_bytes = 100;
    assert_int_equal(kvq_corpus_open("uuid:1", &p, &c, &e), KVQ_E_INVALID_ARG);
}

/* ---- sequences ------------------------------------------------------------------- */

typedef struct seqs {
    int32_t ids[64][16];
    uint32_t n[64];
    uint64_t first[64], last[64], offset[64];
    int count;
    int fail_at; /* return KVQ_E_IO at this sequence (-1 never) */
} seqs;

static kvq_status collect(void *user, const kvq_corpus_seq *q, kvq_err *err)
{
    seqs *s = user;
    assert_int_equal(q->index, (uint64_t)s->count);
    if (s->count == s->fail_at)
        return kvq_err_set(err, KVQ_E_IO, "capture: disk full");
    if (s->count < 64 && q->n <= 16) {
        memcpy(s->ids[s->count], q->ids, q->n * sizeof *q->ids);
        s->n[s->count] = q->n;
        s->first[s->count] = q->first_doc;
        s->last[s->count] = q->last_doc;
        s->offset[s->count] = q->token_offset;
    }
    s->count++;
    return KVQ_OK;
}

static void expect_seqs(const seqs *s, const int32_t (*want)[5], const uint32_t *wn, int count)
{
    assert_int_equal(s->count, count);
    for (int i = 0; i < count; i++) {
        assert_int_equal(s->n[i], wn[i]);
        assert_memory_equal(s->ids[i], want[i], wn[i] * sizeof(int32_t));
    }
}

static kvq_status run(const kvq_corpus *c, const kvq_tokenizer *t, const kvq_seq_params *p,
                      seqs *s, kvq_corpus_stats *st, kvq_err *e)
{
    memset(s, 0, sizeof *s);
    s->fail_at = -1;
    return kvq_corpus_tokenize(c, t, p, NULL, collect, s, st, e);
}

static void test_sequences_ids(void **state)
{
    const int32_t a[] = {10, 11, 12, 13, 14}, b[] = {20, 21};
    const char *pa = test_path("a.ids"), *pb = test_path("b.ids");
    write_ids(pa, a, 5);
    write_ids(pb, b, 2);
    char spec[8400];
    snprintf(spec, sizeof spec, "ids:%s,ids:%s", pa, pb);
    kvq_corpus *c = open_ok(spec, NULL);
    kvq_tokenizer *t = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_tokenizer_new_ids(100, 1, 2, &t, &e), KVQ_OK);
    kvq_seq_params p;
    kvq_seq_params_default(&p);
    assert_int_equal(p.seq_len, 512);
    p.seq_len = 4;
    seqs *s = malloc(sizeof *s);
    kvq_corpus_stats st;

    /* packed, BOS between documents: a separator may end a sequence, never start one */
    assert_int_equal(run(c, t, &p, s, &st, &e), KVQ_OK);
    expect_seqs(s, (const int32_t[][5]){{1, 10, 11, 12}, {1, 13, 14, 1}, {1, 20, 21}},
                (const uint32_t[]){4, 4, 3}, 3);
    assert_int_equal(s->first[2], 1);
    assert_int_equal(s->last[1], 0);
    assert_int_equal(s->offset[2], 8);
    assert_int_equal(st.n_seqs, 3);
    assert_int_equal(st.n_tokens, 11);
    assert_int_equal(st.n_doc_tokens, 7);
    assert_int_equal(st.n_dropped, 0);
    assert_int_equal(st.n_docs, 2);
    assert_int_equal(st.n_bytes, 28);
    uint64_t h;
    assert_int_equal(kvq_corpus_hash(c, &h, NULL, NULL, &e), KVQ_OK);
    assert_true(st.hash == h);

    p.sep = KVQ_DOC_SEP_EOS;
    assert_int_equal(run(c, t, &p, s, &st, &e), KVQ_OK);
    expect_seqs(s, (const int32_t[][5]){{1, 10, 11, 12}, {1, 13, 14, 2}, {1, 20, 21}},
                (const uint32_t[]){4, 4, 3}, 3);
    p.sep = KVQ_DOC_SEP_NONE;
    assert_int_equal(run(c, t, &p, s, &st, &e), KVQ_OK);
    expect_seqs(s, (const int32_t[][5]){{1, 10, 11, 12}, {1, 13, 14, 20}, {1, 21}},
                (const uint32_t[]){4, 4, 2}, 3);
    assert_int_equal(s->first[1], 0);
    assert_int_equal(s->last[1], 1);
    /* no partial sequences: the lone 21 is dropped */
    p.keep_partial = 0;
    assert_int_equal(run(c, t, &p, s, &st, &e), KVQ_OK);
    expect_seqs(s, (const int32_t[][5]){{1, 10, 11, 12}, {1, 13, 14, 20}},
                (const uint32_t[]){4, 4}, 2);
    assert_int_equal(st.n_dropped, 1);
    p.keep_partial = 1;
    /* one document per sequence */
    p.per_document = 1;
    assert_int_equal(run(c, t, &p, s, &st, &e), KVQ_OK);
    expect_seqs(s, (const int32_t[][5]){{1, 10, 11, 12}, {1, 13, 14}, {1, 20, 21}},
                (const uint32_t[]){4, 3, 3}, 3);
    p.per_document = 0;
    /* max_tokens: 6 = one full sequence and a 2-token tail; b.ids is never read */
    p.max_tokens = 6;
    assert_int_equal(run(c, t, &p, s, &st, &e), KVQ_OK);
    expect_seqs(s, (const int32_t[][5]){{1, 10, 11, 12}, {1, 13}}, (const uint32_t[]){4, 2}, 2);
    assert_int_equal(st.n_tokens, 6);
    assert_int_equal(st.n_docs, 1);
    assert_int_equal(st.n_dropped, 1);
    /* a 1-token tail is not a sequence; nor any tail without keep_partial */
    p.max_tokens = 5;
    assert_int_equal(run(c, t, &p, s, &st, &e), KVQ_OK);
    assert_int_equal(s->count, 1);
    assert_int_equal(st.n_tokens, 4);
    p.max_tokens = 7;
    p.keep_partial = 0;
    assert_int_equal(run(c, t, &p, s, &st, &e), KVQ_OK);
    assert_int_equal(s->count, 1);
    p.max_tokens = 0;
    p.keep_partial = 1;
    /* without BOS */
    p.add_bos = 0;
    assert_int_equal(run(c, t, &p, s, &st, &e), KVQ_OK);
    expect_seqs(s, (const int32_t[][5]){{10, 11, 12, 13}, {14, 20, 21}},
                (const uint32_t[]){4, 3}, 2);
    p.add_bos = 1;
    /* the callback's error stops everything and comes back unchanged */
    memset(s, 0, sizeof *s);
    s->fail_at = 1;
    assert_int_equal(kvq_corpus_tokenize(c, t, &p, NULL, collect, s, &st, &e), KVQ_E_IO);
    assert_string_equal(e.msg, "capture: disk full");
    assert_int_equal(st.n_seqs, 1);
    /* parameter errors */
    p.seq_len = 1;
    assert_int_equal(run(c, t, &p, s, &st, &e), KVQ_E_INVALID_ARG);
    p.seq_len = 4;
    kvq_tokenizer *nobos = NULL;
    assert_int_equal(kvq_tokenizer_new_ids(100, -1, -1, &nobos, &e), KVQ_OK);
    assert_int_equal(run(c, nobos, &p, s, &st, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "BOS"));
    p.add_bos = 0;
    p.sep = KVQ_DOC_SEP_BOS; /* ... nor to separate documents */
    assert_int_equal(run(c, nobos, &p, s, &st, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "separate"));
    p.sep = KVQ_DOC_SEP_NONE;
    assert_int_equal(run(c, nobos, &p, s, &st, &e), KVQ_OK);
    kvq_tokenizer_free(nobos);
    kvq_tokenizer_free(t);
    /* ids outside the vocabulary */
    assert_int_equal(kvq_tokenizer_new_ids(21, 1, 2, &t, &e), KVQ_OK);
    assert_int_equal(run(c, t, &p, s, &st, &e), KVQ_E_MISMATCH);
    assert_non_null(strstr(e.msg, pb));
    assert_non_null(strstr(e.msg, "index 1"));
    kvq_tokenizer_free(t);
    kvq_corpus_free(c);
    /* an ids file that is not whole int32s */
    assert_int_equal(test_write_file(pa, "\x01\x00\x00\x00\x02", 5), 0);
    snprintf(spec, sizeof spec, "ids:%s", pa);
    c = open_ok(spec, NULL);
    assert_int_equal(kvq_tokenizer_new_ids(100, 1, 2, &t, &e), KVQ_OK);
    assert_int_equal(run(c, t, &p, s, &st, &e), KVQ_E_CORRUPT);
    assert_non_null(strstr(e.msg, "5 bytes"));
    kvq_tokenizer_free(t);
    kvq_corpus_free(c);
    free(s);
}

/* <unk> <s> </s>, byte tokens 3..258, '▁' 259: every ASCII character is one token */
static kvq_tokenizer *byte_tokenizer(void)
{
    const char *tok[260];
    float sc[260] = {0};
    char bytes[256][8];
    tok[0] = "<unk>";
    tok[1] = "<s>";
    tok[2] = "</s>";
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        tok[3 + b] = bytes[b];
    }
    tok[259] = "\xe2\x96\x81";
    kvq_vocab v;
    kvq_vocab_default(&v);
    v.n_tokens = 260;
    v.tokens = tok;
    v.scores = sc;
    v.unk = 0;
    v.bos = 1;
    v.eos = 2;
    kvq_tokenizer *t = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_tokenizer_new(KVQ_TOKENIZER_SPM, &v, "bytes", NULL, &t, &e), KVQ_OK);
    return t;
}

static kvq_status count_only(void *user, const kvq_corpus_seq *q, kvq_err *err)
{
    uint64_t *n = user;
    assert_int_equal(q->ids[0], 1); /* every sequence starts with BOS */
    for (uint32_t i = 1; i < q->n; i++)
        assert_int_not_equal(q->ids[i], 0);
    *n += q->n;
    return KVQ_OK;
}

static int cancel_at_2(void *user, const char *what, uint64_t done, uint64_t total)
{
    assert_string_equal(what, "tokenize");
    return ++*(int *)user >= 2;
}

static void test_sequences_text(void **state)
{
    kvq_tokenizer *t = byte_tokenizer();
    const char *j = test_path("s.jsonl");
    write_str(j, "{\"text\":\"ab\"}\n{\"text\":\"cd\"}\n");
    char spec[4200];
    snprintf(spec, sizeof spec, "jsonl:%s", j);
    kvq_corpus *c = open_ok(spec, NULL);
    kvq_seq_params p;
    kvq_seq_params_default(&p);
    p.seq_len = 8;
    seqs *s = malloc(sizeof *s);
    kvq_corpus_stats st;
    kvq_err e = {0};
    /* each document gets its dummy prefix '▁' (259); BOS separates them */
    assert_int_equal(run(c, t, &p, s, &st, &e), KVQ_OK);
    const int32_t want[8] = {1, 259, 3 + 'a', 3 + 'b', 1, 259, 3 + 'c', 3 + 'd'};
    assert_int_equal(s->count, 1);
    assert_int_equal(s->n[0], 8);
    assert_memory_equal(s->ids[0], want, sizeof want);
    kvq_corpus_free(c);

    /* a file read in parts: only the first part gets the dummy prefix, and no separator
     * goes between parts, so the tokens are exactly 1 + the file's bytes */
    char *big = malloc(12001);
    for (int i = 0; i < 4000; i++)
        memcpy(big + 3 * i, "ab\n", 3);
    big[12000] = 0;
    const char *f = test_path("parts.txt");
    write_str(f, big);
    kvq_corpus_params cp;
    kvq_corpus_params_default(&cp);
    cp.max_doc_bytes = 4096;
    snprintf(spec, sizeof spec, "file:%s", f);
    c = open_ok(spec, &cp);
    p.seq_len = 100;
    uint64_t total = 0;
    assert_int_equal(kvq_corpus_tokenize(c, t, &p, NULL, count_only, &total, &st, &e), KVQ_OK);
    assert_int_equal(st.n_docs, 3);
    assert_int_equal(st.n_doc_tokens, 12001);
    /* 99 document tokens per sequence: 121 full sequences and a tail of 22 + BOS */
    assert_int_equal(st.n_seqs, 122);
    assert_int_equal(st.n_tokens, 12001 + 122);
    assert_int_equal(total, st.n_tokens);
    assert_true(st.hash == kvq_fnv1a64(big, 12000, KVQ_FNV1A64_INIT));
    /* progress can cancel */
    int calls = 0;
    kvq_callbacks cb = {NULL, cancel_at_2, &calls};
    assert_int_equal(kvq_corpus_tokenize(c, t, &p, &cb, count_only, &total, &st, &e),
                     KVQ_E_CANCELLED);
    assert_int_equal(st.n_seqs, 2);
    kvq_corpus_free(c);
    free(big);

    /* empty corpora */
    const char *empty = test_path("empty.txt");
    write_str(empty, "");
    const char *blank = test_path("blank.jsonl");
    write_str(blank, "\n\n{\"text\":\"\"}\n");
    const char *edir = tmp_sub("emptydir");
    const char *specs[3] = {empty, blank, edir};
    for (int k = 0; k < 3; k++) {
        c = open_ok(specs[k], NULL);
        assert_int_equal(run(c, t, &p, s, &st, &e), KVQ_E_INVALID_ARG);
        assert_non_null(strstr(e.msg, "contains no text"));
        assert_non_null(strstr(e.msg, specs[k]));
        kvq_corpus_free(c);
    }
    /* text but not enough for one sequence when partial ones are refused */
    p.keep_partial = 0;
    c = open_ok(spec, &cp);
    p.seq_len = 20000;
    assert_int_equal(run(c, t, &p, s, &st, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "no sequence"));
    kvq_corpus_free(c);
    /* the ids tokenizer cannot read text */
    kvq_tokenizer *ids = NULL;
    assert_int_equal(kvq_tokenizer_new_ids(10, 1, 2, &ids, &e), KVQ_OK);
    c = open_ok("uuid:1", NULL);
    assert_int_equal(run(c, ids, &p, s, &st, &e), KVQ_E_UNSUPPORTED);
    kvq_corpus_free(c);
    kvq_tokenizer_free(ids);
    kvq_tokenizer_free(t);
    free(s);
}

/* On the real model: the golden text cut into sequences of 16 gives back its ids, each
 * sequence starting with BOS when the model adds one (stories260K; SmolLM2 does not). */
static void test_sequences_stories(void **state)
{
    int stories;
    const char *model = test_real_model(&stories);
    if (!model)
        TEST_SKIP("neither stories260K (KVQ_TEST_MODEL) nor SmolLM2 (KVQ_SMOLLM2) found");
    /* 36 ids, scripts/gen_smollm2_story_ids.py (llama.cpp) */
    static const int32_t gold_smollm2[36] = {
        6403, 1980, 253, 655, 28, 665, 436, 253, 1838, 8180, 3365, 14176,
        30, 2306, 5732, 288, 1238, 2856, 281, 260, 5949, 30, 1963, 1194,
        28, 1041, 3680, 253, 2066, 28, 2382, 4405, 30, 2306, 4146, 288};
    static const int32_t gold_stories[48] = {
        403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
        401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385,
        328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267};
    kvq_tokenizer *t = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_tokenizer_load(model, NULL, &t, &e), KVQ_OK);
    const char *f = test_path("story.txt");
    write_str(f, "Once upon a time, there was a little girl named Lily. She loved to play outside "
                 "in the park. One day, she saw a big, red ball. She wanted to");
    kvq_corpus *c = open_ok(f, NULL);
    kvq_seq_params p;
    kvq_seq_params_default(&p);
    kvq_seq_params_model_bos(&p, t); /* BOS as the model says */
    p.seq_len = 16;
    seqs *s = malloc(sizeof *s);
    kvq_corpus_stats st;
    assert_int_equal(run(c, t, &p, s, &st, &e), KVQ_OK);
    const int32_t *gold = stories ? gold_stories : gold_smollm2;
    const int n_gold = stories ? 48 : 36, bos = stories, per = 16 - bos;
    /* stories: 15 + 15 + 15 + 3 text tokens; SmolLM2: 16 + 16 + 4 */
    const int n_seq = (n_gold + per - 1) / per;
    assert_int_equal(s->count, n_seq);
    assert_int_equal(s->n[n_seq - 1], bos + n_gold - (n_seq - 1) * per);
    int32_t back[48];
    int k = 0;
    for (int i = 0; i < n_seq; i++) {
        if (bos)
            assert_int_equal(s->ids[i][0], 1);
        for (uint32_t j = (uint32_t)bos; j < s->n[i]; j++)
            back[k++] = s->ids[i][j];
    }
    assert_int_equal(k, n_gold);
    assert_memory_equal(back, gold, sizeof(int32_t) * (size_t)n_gold);
    kvq_corpus_free(c);
    kvq_tokenizer_free(t);
    free(s);
}

static int teardown(void **state)
{
    test_tmpdir_cleanup();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_and_parts),
        cmocka_unit_test(test_dir),
        cmocka_unit_test(test_jsonl),
        cmocka_unit_test(test_jsonl_tasks),
        cmocka_unit_test(test_generators),
        cmocka_unit_test(test_mixing_and_spec_errors),
        cmocka_unit_test(test_sequences_ids),
        cmocka_unit_test(test_sequences_text),
        cmocka_unit_test(test_sequences_stories),
    };
    return cmocka_run_group_tests_name("corpus", tests, NULL, teardown);
}
