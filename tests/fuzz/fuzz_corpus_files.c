/* fuzz_corpus_files.c — libFuzzer target for the file corpus readers (jsonl:, dir:,
 * file: read in parts).
 *
 * The input is cut at its first two 0x00 bytes into up to three parts, written to a
 * fresh directory as a.jsonl, b.txt and sub/c.md; the corpus "jsonl:a.jsonl,dir:DIR,
 * file:b.txt" (max_doc_bytes 4096, so longer files come in parts) is read to its end,
 * twice. Every document must be well formed (text NUL-terminated at len, no empty
 * document, a label naming its file, "a.jsonl:LINE" for jsonl, parts numbered in order);
 * a failure must carry a documented status and a message naming a file of the corpus;
 * the two readings must agree (the same documents, the same hash and the same error).
 * Any inconsistency aborts. Also built as a plain corpus replayer (replay_main.c). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvq/corpus.h"
#include "kvq/util.h"

#define CHECK(c) do { if (!(c)) abort(); } while (0)

static char dir[64];

static void remove_dir(void) { kvq_rmtree(dir); }

static void put(const char *name, const uint8_t *p, size_t n)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f && (n == 0 || fwrite(p, 1, n, f) == n) && fclose(f) == 0);
}

/* Reads the corpus to its end: documents counted and hashed, the status returned. */
static kvq_status read_all(const kvq_corpus *c, uint64_t *n_docs, uint64_t *h, char *msg)
{
    kvq_corpus_iter *it = NULL;
    kvq_err err = {0};
    kvq_status st = kvq_corpus_iter_new(c, &it, &err);
    *n_docs = 0;
    *h = KVQ_FNV1A64_INIT;
    uint32_t last_source = 0, last_part = 0;
    while (st == KVQ_OK) {
        const kvq_corpus_doc *d = NULL;
        if ((st = kvq_corpus_iter_next(it, &d, &err)) != KVQ_OK || !d)
            break;
        CHECK(d->index == *n_docs && d->text && d->text[d->len] == 0 && d->len > 0);
        CHECK(d->label && strstr(d->label, dir) == d->label);
        CHECK(d->source < 3 && d->source >= last_source);
        if (d->source == 0)
            CHECK(strstr(d->label, "a.jsonl:") != NULL && d->part == 0);
        if (d->part > 0)
            CHECK(d->source == last_source && d->part == last_part + 1);
        last_source = d->source;
        last_part = d->part;
        *h = kvq_fnv1a64(d->text, d->len, *h);
        ++*n_docs;
    }
    if (st != KVQ_OK) {
        CHECK(err.status == st && strstr(err.msg, dir) != NULL);
        CHECK(st == KVQ_E_BAD_JSON || st == KVQ_E_IO || st == KVQ_E_NOT_FOUND ||
              st == KVQ_E_NOMEM || st == KVQ_E_CORRUPT || st == KVQ_E_TOO_LARGE);
        snprintf(msg, 256, "%.200s", err.msg);
    }
    kvq_corpus_iter_free(it);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/kvq-fuzz-corpus-XXXXXX");
        CHECK(mkdtemp(dir) != NULL);
        atexit(remove_dir);
        char sub[96];
        snprintf(sub, sizeof sub, "%s/sub", dir);
        CHECK(mkdir(sub, 0755) == 0);
    }
    const uint8_t *part[3] = {data, NULL, NULL};
    size_t len[3] = {size, 0, 0};
    for (int k = 1; k < 3; k++) {
        const uint8_t *z = len[k - 1] ? memchr(part[k - 1], 0, len[k - 1]) : NULL;
        if (!z)
            break;
        part[k] = z + 1;
        len[k] = (size_t)(part[k - 1] + len[k - 1] - part[k]);
        len[k - 1] = (size_t)(z - part[k - 1]);
    }
    put("a.jsonl", part[0], len[0]);
    put("b.txt", part[1] ? part[1] : (const uint8_t *)"", len[1]);
    put("sub/c.md", part[2] ? part[2] : (const uint8_t *)"", len[2]);

    char spec[256];
    snprintf(spec, sizeof spec, "jsonl:%s/a.jsonl,dir:%s/sub,file:%s/b.txt", dir, dir, dir);
    kvq_corpus_params p;
    kvq_corpus_params_default(&p);
    p.max_doc_bytes = 4096;
    kvq_corpus *c = NULL;
    kvq_err err = {0};
    CHECK(kvq_corpus_open(spec, &p, &c, &err) == KVQ_OK);
    uint64_t n1, n2, h1, h2;
    char m1[256] = "", m2[256] = "";
    const kvq_status s1 = read_all(c, &n1, &h1, m1), s2 = read_all(c, &n2, &h2, m2);
    CHECK(s1 == s2 && n1 == n2 && h1 == h2 && strcmp(m1, m2) == 0);
    kvq_corpus_free(c);
    return 0;
}
