/*
 * corpus_internal.h — the corpus and iterator structures shared by corpus.c (spec
 * parsing, files, directories, sequences) and corpus_synth.c (synthetic generators).
 * Not a public header.
 */
#ifndef KVQ_CORPUS_INTERNAL_H
#define KVQ_CORPUS_INTERNAL_H

#include <stdio.h>

#include "kvq/corpus.h"

struct kvq_corpus {
    char *spec;
    kvq_corpus_params p;
    kvq_corpus_source *src; /* [n_src] */
    uint32_t *ordinal;      /* [n_src] index among the sources of the same kind */
    size_t n_src;
};

typedef struct dir_level {
    char *path;
    char **names; /* [n], sorted */
    size_t n, i;
} dir_level;

struct kvq_corpus_iter {
    const kvq_corpus *c;
    size_t si;             /* current source */
    int started;           /* the current source has been opened */
    uint64_t next_index;   /* index of the next document */
    int failed;

    /* files (file:, dir: members, jsonl:, ids:) */
    FILE *fp;
    char *fpath;           /* the open file's path (owned) */
    uint32_t part;
    char *buf;             /* [buf_cap] read buffer */
    size_t buf_len, buf_cap;
    int eof;
    uint64_t line_no;      /* jsonl */
    char *line;            /* jsonl getline buffer */
    size_t line_cap;
    uint64_t ids_read;     /* ids: ids before the current part */

    dir_level *stack;      /* dir: */
    size_t depth, stack_cap;

    uint64_t gen_i;        /* generators: next document number */

    /* the current document */
    char *text;            /* owned text storage */
    size_t text_len, text_cap;
    int32_t *ids;
    size_t ids_cap;
    char *label;
    size_t label_cap;
    char answer[32];
    kvq_corpus_doc doc;
};

/* The current document's label: fmt_path, followed by num when with_num. 0, or -1 when
 * out of memory. */
int kvq_corpus_set_label(kvq_corpus_iter *it, const char *fmt_path, uint64_t num, int with_num);

/* Appends s[0..n) to the current document text. 0, or -1 when out of memory. */
int kvq_corpus_text_put(kvq_corpus_iter *it, const char *s, size_t n);

/* The next document (number it->gen_i) of the current generator source (uuid:,
 * passkey:, kv-recall:) as the current document; advances it->gen_i. */
kvq_status kvq_corpus_generate(kvq_corpus_iter *it, kvq_err *err);

#endif
