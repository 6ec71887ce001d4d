/*
 * corpus.c — corpus spec parsing, streaming document iteration (files, directories,
 * jsonl, pre-tokenized ids) and sequence cutting. The synthetic generators are in
 * corpus_synth.c.
 */
#include "kvq/corpus.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvq/util.h"

#include "calib/corpus_internal.h"

#define MAX_GEN_DOCS 10000000ULL

/* ==========================================================================
 * parameters and spec parsing
 * ========================================================================== */

void kvq_corpus_params_default(kvq_corpus_params *p)
{
    memset(p, 0, sizeof *p);
    p->seed = 0;
    p->uuid_lines = 64;
    p->passkey_filler = 40;
    p->kv_pairs = 32;
    p->max_doc_bytes = 1u << 16;
}

void kvq_seq_params_default(kvq_seq_params *p)
{
    memset(p, 0, sizeof *p);
    p->seq_len = 512;
    p->max_tokens = 0;
    p->add_bos = 1;
    p->per_document = 0;
    p->sep = KVQ_DOC_SEP_BOS;
    p->keep_partial = 1;
}

void kvq_seq_params_model_bos(kvq_seq_params *p, const kvq_tokenizer *t)
{
    p->add_bos = kvq_tokenizer_add_bos(t) && kvq_tokenizer_bos(t) >= 0;
    p->sep = p->add_bos ? KVQ_DOC_SEP_BOS
                        : kvq_tokenizer_eos(t) >= 0 ? KVQ_DOC_SEP_EOS : KVQ_DOC_SEP_NONE;
}

static const struct {
    const char *name;
    kvq_corpus_kind kind;
} KINDS[] = {
    {"file", KVQ_CORPUS_FILE},   {"dir", KVQ_CORPUS_DIR},         {"jsonl", KVQ_CORPUS_JSONL},
    {"ids", KVQ_CORPUS_IDS},     {"uuid", KVQ_CORPUS_UUID},       {"passkey", KVQ_CORPUS_PASSKEY},
    {"kv-recall", KVQ_CORPUS_KV_RECALL},
};

const char *kvq_corpus_kind_name(kvq_corpus_kind k)
{
    for (size_t i = 0; i < sizeof KINDS / sizeof *KINDS; i++)
        if (KINDS[i].kind == k)
            return KINDS[i].name;
    return "?";
}

static int is_generator(kvq_corpus_kind k)
{
    return k == KVQ_CORPUS_UUID || k == KVQ_CORPUS_PASSKEY || k == KVQ_CORPUS_KV_RECALL;
}

void kvq_corpus_free(kvq_corpus *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n_src; i++)
        free((char *)c->src[i].path);
    free(c->src);
    free(c->ordinal);
    free(c->spec);
    free(c);
}

const char *kvq_corpus_spec(const kvq_corpus *c) { return c->spec; }
size_t kvq_corpus_source_count(const kvq_corpus *c) { return c->n_src; }

const kvq_corpus_source *kvq_corpus_source_at(const kvq_corpus *c, size_t i)
{
    return i < c->n_src ? &c->src[i] : NULL;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Parses one item (NUL-terminated, already split at commas) into *s. */
static kvq_status parse_item(char *item, kvq_corpus_source *s, kvq_err *err)
{
    memset(s, 0, sizeof *s);
    if (!*item)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "corpus: empty item in the spec");
    const char *arg = item;
    int kind = 0;
    char *colon = strchr(item, ':');
    if (colon) {
        for (size_t i = 0; i < sizeof KINDS / sizeof *KINDS; i++)
            if (strlen(KINDS[i].name) == (size_t)(colon - item) &&
                !strncmp(item, KINDS[i].name, (size_t)(colon - item))) {
                kind = KINDS[i].kind;
                arg = colon + 1;
            }
    }
    if (kind && is_generator((kvq_corpus_kind)kind)) {
        int64_t n;
        kvq_err e2 = {0};
        if (kvq_parse_i64(arg, 1, (int64_t)MAX_GEN_DOCS, &n, &e2))
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "corpus: '%s': the count must be an "
                               "integer in [1, %llu]", item, MAX_GEN_DOCS);
        s->kind = (kvq_corpus_kind)kind;
        s->count = (uint64_t)n;
        return KVQ_OK;
    }
    if (!*arg)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "corpus: '%s' has no path", item);
    struct stat sb;
    if (stat(arg, &sb) != 0 && !kind && colon && errno == ENOENT &&
        strspn(item, "abcdefghijklmnopqrstuvwxyz-") == (size_t)(colon - item))
        /* "word:..." that is no file: a misspelt kind, not a missing file */
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "corpus: '%s': unknown kind '%.*s' (kinds: "
                           "file:, dir:, jsonl:, ids:, uuid:N, passkey:N, kv-recall:N, or a "
                           "path) and no such file", item, (int)(colon - item), item);
    if (stat(arg, &sb) != 0)
        return kvq_err_set(err, errno == ENOENT ? KVQ_E_NOT_FOUND : KVQ_E_IO, "corpus: %s: %s",
                           arg, strerror(errno));
    if (!kind)
        kind = S_ISDIR(sb.st_mode) ? KVQ_CORPUS_DIR
             : ends_with(arg, ".jsonl") ? KVQ_CORPUS_JSONL : KVQ_CORPUS_FILE;
    if (kind == KVQ_CORPUS_DIR && !S_ISDIR(sb.st_mode))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "corpus: %s: not a directory", arg);
    if (kind != KVQ_CORPUS_DIR && !S_ISREG(sb.st_mode))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "corpus: %s: not a regular file", arg);
    s->kind = (kvq_corpus_kind)kind;
    s->path = strdup(arg);
    if (!s->path)
        return kvq_err_set(err, KVQ_E_NOMEM, "corpus: out of memory");
    return KVQ_OK;
}

kvq_status kvq_corpus_open(const char *spec, const kvq_corpus_params *p, kvq_corpus **out,
                           kvq_err *err)
{
    kvq_status st = KVQ_OK;
    char *copy = NULL;
    kvq_corpus *c = NULL;
    *out = NULL;
    if (!spec || !*spec)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "corpus: empty spec");
    kvq_corpus_params dp;
    if (!p) {
        kvq_corpus_params_default(&dp);
        p = &dp;
    }
    if (p->uuid_lines < 1 || p->uuid_lines > 1000000 || p->passkey_filler > 1000000 ||
        p->kv_pairs < 1 || p->kv_pairs > 65536 || p->max_doc_bytes < 4096 ||
        p->max_doc_bytes > ((size_t)1 << 31))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "corpus: parameter out of range "
                           "(uuid_lines %u, passkey_filler %u, kv_pairs %u, max_doc_bytes %zu)",
                           p->uuid_lines, p->passkey_filler, p->kv_pairs, p->max_doc_bytes);
    c = calloc(1, sizeof *c);
    copy = strdup(spec);
    if (!c || !copy || !(c->spec = strdup(spec))) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "corpus: out of memory");
        goto done;
    }
    c->p = *p;
    size_t items = 1;
    for (const char *q = spec; *q; q++)
        items += *q == ',';
    c->src = calloc(items, sizeof *c->src);
    c->ordinal = calloc(items, sizeof *c->ordinal);
    if (!c->src || !c->ordinal) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "corpus: out of memory");
        goto done;
    }
    char *item = copy;
    for (size_t i = 0; i < items; i++) {
        char *comma = strchr(item, ',');
        if (comma)
            *comma = '\0';
        if ((st = parse_item(item, &c->src[i], err)))
            goto done;
        c->n_src = i + 1;
        for (size_t k = 0; k < i; k++)
            c->ordinal[i] += c->src[k].kind == c->src[i].kind;
        item = comma ? comma + 1 : item + strlen(item);
    }
done:
    free(copy);
    if (st) {
        kvq_corpus_free(c);
        return st;
    }
    *out = c;
    return KVQ_OK;
}

/* ==========================================================================
 * iteration state
 * ========================================================================== */

kvq_status kvq_corpus_iter_new(const kvq_corpus *c, kvq_corpus_iter **out, kvq_err *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return kvq_err_set(err, KVQ_E_NOMEM, "corpus: out of memory");
    (*out)->c = c;
    return KVQ_OK;
}

static void dir_pop(kvq_corpus_iter *it)
{
    dir_level *l = &it->stack[--it->depth];
    for (size_t k = 0; k < l->n; k++)
        free(l->names[k]);
    free(l->names);
    free(l->path);
}

static void close_file(kvq_corpus_iter *it)
{
    if (it->fp)
        fclose(it->fp);
    it->fp = NULL;
    free(it->fpath);
    it->fpath = NULL;
    it->buf_len = 0;
    it->eof = 0;
    it->part = 0;
    it->line_no = 0;
    it->ids_read = 0;
}

void kvq_corpus_iter_free(kvq_corpus_iter *it)
{
    if (!it)
        return;
    close_file(it);
    while (it->depth > 0)
        dir_pop(it);
    free(it->stack);
    free(it->buf);
    free(it->line);
    free(it->text);
    free(it->ids);
    free(it->label);
    free(it);
}

int kvq_corpus_set_label(kvq_corpus_iter *it, const char *fmt_path, uint64_t num, int with_num)
{
    size_t need = strlen(fmt_path) + 32;
    if (kvq_grow((void **)&it->label, &it->label_cap, need, 1))
        return -1;
    if (with_num)
        snprintf(it->label, it->label_cap, "%s%llu", fmt_path, (unsigned long long)num);
    else
        snprintf(it->label, it->label_cap, "%s", fmt_path);
    return 0;
}

/* Appends s[0..n) to the current document text. */
int kvq_corpus_text_put(kvq_corpus_iter *it, const char *s, size_t n)
{
    if (kvq_grow((void **)&it->text, &it->text_cap, it->text_len + n + 1, 1))
        return -1;
    memcpy(it->text + it->text_len, s, n);
    it->text_len += n;
    it->text[it->text_len] = '\0';
    return 0;
}

static kvq_status open_file(kvq_corpus_iter *it, const char *path, kvq_err *err)
{
    close_file(it);
    it->fpath = strdup(path);
    if (!it->fpath)
        return kvq_err_set(err, KVQ_E_NOMEM, "corpus: out of memory");
    int fd;
    struct stat sb; /* a FIFO that replaced the file since the spec was checked: refused */
    kvq_status st = kvq_open_regular(path, &fd, &sb, err);
    if (st)
        return st;
    if (!(it->fp = fdopen(fd, "rb"))) {
        close(fd);
        return kvq_err_set(err, KVQ_E_IO, "%s: %s", path, strerror(errno));
    }
    return KVQ_OK;
}

/* Fills the read buffer up to max bytes. */
static kvq_status fill(kvq_corpus_iter *it, size_t max, kvq_err *err)
{
    if (kvq_grow((void **)&it->buf, &it->buf_cap, max + 1, 1))
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", it->fpath);
    while (it->buf_len < max && !it->eof) {
        size_t got = fread(it->buf + it->buf_len, 1, max - it->buf_len, it->fp);
        if (got == 0) {
            if (ferror(it->fp))
                return kvq_err_set(err, KVQ_E_IO, "%s: read error", it->fpath);
            it->eof = 1;
        }
        it->buf_len += got;
    }
    return KVQ_OK;
}

/* Removes the first n bytes of the read buffer. */
static void consume(kvq_corpus_iter *it, size_t n)
{
    memmove(it->buf, it->buf + n, it->buf_len - n);
    it->buf_len -= n;
}

/* The next part of the open text file as the current document; *got = 0 at its end. */
static kvq_status next_text_part(kvq_corpus_iter *it, int *got, kvq_err *err)
{
    *got = 0;
    size_t max = it->c->p.max_doc_bytes;
    kvq_status st = fill(it, max, err);
    if (st || it->buf_len == 0)
        return st;
    size_t cut = it->buf_len;
    if (!it->eof) {
        /* cut after the last newline, else before a code point cut in two */
        size_t k = it->buf_len;
        while (k > 0 && it->buf[k - 1] != '\n')
            k--;
        if (k > 0) {
            cut = k;
        } else {
            const unsigned char *b = (const unsigned char *)it->buf;
            size_t s = it->buf_len - 1;
            while (s > 0 && it->buf_len - s < 4 && (b[s] & 0xC0) == 0x80)
                s--;
            size_t need = b[s] >= 0xF0 ? 4 : b[s] >= 0xE0 ? 3 : b[s] >= 0xC0 ? 2 : 1;
            if (s > 0 && it->buf_len - s < need)
                cut = s;
        }
    }
    it->text_len = 0;
    if (kvq_corpus_text_put(it, it->buf, cut))
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", it->fpath);
    consume(it, cut);
    if (kvq_corpus_set_label(it, it->fpath, 0, 0))
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", it->fpath);
    it->doc.text = it->text;
    it->doc.len = it->text_len;
    it->doc.part = it->part++;
    *got = 1;
    return KVQ_OK;
}

static kvq_status next_ids_part(kvq_corpus_iter *it, int *got, kvq_err *err)
{
    *got = 0;
    size_t max = it->c->p.max_doc_bytes & ~(size_t)3;
    kvq_status st = fill(it, max, err);
    if (st || it->buf_len == 0)
        return st;
    if (it->buf_len % 4 != 0) /* only possible at the end of the file */
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: %llu bytes is not a whole number of int32 "
                           "token ids", it->fpath,
                           (unsigned long long)(it->ids_read * 4 + it->buf_len));
    size_t n = it->buf_len / 4;
    if (kvq_grow((void **)&it->ids, &it->ids_cap, n * sizeof *it->ids, 1))
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", it->fpath);
    const uint8_t *b = (const uint8_t *)it->buf;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 |
                     (uint32_t)b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24;
        if ((int32_t)u < 0)
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: token id %d at index %llu is negative",
                               it->fpath, (int32_t)u, (unsigned long long)(it->ids_read + i));
        it->ids[i] = (int32_t)u;
    }
    consume(it, it->buf_len);
    it->ids_read += n;
    if (kvq_corpus_set_label(it, it->fpath, 0, 0))
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", it->fpath);
    it->doc.ids = it->ids;
    it->doc.n_ids = n;
    it->doc.part = it->part++;
    *got = 1;
    return KVQ_OK;
}

/* A jsonl line's optional task fields: "answer" (1 .. 31 bytes) makes it a task
 * document of kind "task" ("passkey", the default, or "kv-recall"). NULL, or what is
 * wrong with them. */
static const char *jsonl_task(kvq_corpus_iter *it, const cJSON *j)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "answer");
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "task");
    it->doc.task = KVQ_TASK_NONE; /* a skipped line's ("text": "") must not stay */
    it->doc.answer = NULL;
    if (!a)
        return k ? "\"task\" without an \"answer\"" : NULL;
    if (!cJSON_IsString(a) || !a->valuestring[0] || strlen(a->valuestring) >= sizeof it->answer)
        return "\"answer\" is not a string of 1 to 31 bytes";
    if (k && (!cJSON_IsString(k) || (strcmp(k->valuestring, "passkey") &&
                                     strcmp(k->valuestring, "kv-recall"))))
        return "\"task\" is not \"passkey\" or \"kv-recall\"";
    snprintf(it->answer, sizeof it->answer, "%s", a->valuestring);
    it->doc.task = k && !strcmp(k->valuestring, "kv-recall") ? KVQ_TASK_KV_RECALL
                                                              : KVQ_TASK_PASSKEY;
    it->doc.answer = it->answer;
    return NULL;
}

static kvq_status next_jsonl(kvq_corpus_iter *it, int *got, kvq_err *err)
{
    *got = 0;
    for (;;) {
        errno = 0;
        ssize_t n = getline(&it->line, &it->line_cap, it->fp);
        if (n < 0) {
            if (ferror(it->fp))
                return kvq_err_set(err, KVQ_E_IO, "%s: read error", it->fpath);
            return KVQ_OK;
        }
        it->line_no++;
        size_t k = 0;
        while (k < (size_t)n && (it->line[k] == ' ' || it->line[k] == '\t' ||
                                 it->line[k] == '\r' || it->line[k] == '\n'))
            k++;
        if (k == (size_t)n)
            continue; /* blank line */
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(it->line, (size_t)n, &end, 0);
        if (j && end) { /* only whitespace may follow the object */
            for (; end < it->line + n; end++)
                if (*end != ' ' && *end != '\t' && *end != '\r' && *end != '\n') {
                    cJSON_Delete(j);
                    j = NULL;
                    break;
                }
        }
        const cJSON *t = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "text") : NULL;
        if (!cJSON_IsString(t)) {
            kvq_status st = kvq_err_set(err, KVQ_E_BAD_JSON, "%s:%llu: %s", it->fpath,
                                        (unsigned long long)it->line_no,
                                        !j ? "not valid JSON"
                                        : !cJSON_IsObject(j) ? "not a JSON object"
                                        : "no \"text\" string field");
            cJSON_Delete(j);
            return st;
        }
        const char *bad = jsonl_task(it, j);
        if (bad) {
            kvq_status st = kvq_err_set(err, KVQ_E_BAD_JSON, "%s:%llu: %s", it->fpath,
                                        (unsigned long long)it->line_no, bad);
            cJSON_Delete(j);
            return st;
        }
        it->text_len = 0;
        int oom = kvq_corpus_text_put(it, t->valuestring, strlen(t->valuestring));
        cJSON_Delete(j);
        if (oom)
            return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", it->fpath);
        if (it->text_len == 0)
            continue; /* "text": "" */
        size_t need = strlen(it->fpath) + 32;
        if (kvq_grow((void **)&it->label, &it->label_cap, need, 1))
            return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", it->fpath);
        snprintf(it->label, it->label_cap, "%s:%llu", it->fpath,
                 (unsigned long long)it->line_no);
        it->doc.text = it->text;
        it->doc.len = it->text_len;
        *got = 1;
        return KVQ_OK;
    }
}

/* ---- directories ---- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *join_path(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static kvq_status dir_push(kvq_corpus_iter *it, const char *path, kvq_err *err)
{
    if (kvq_grow((void **)&it->stack, &it->stack_cap, (it->depth + 1) * sizeof *it->stack, 1))
        return kvq_err_set(err, KVQ_E_NOMEM, "corpus: out of memory");
    DIR *d = opendir(path);
    if (!d)
        return kvq_err_set(err, errno == ENOENT ? KVQ_E_NOT_FOUND : KVQ_E_IO, "%s: %s", path,
                           strerror(errno));
    dir_level l = {0};
    size_t cap = 0;
    kvq_status st = KVQ_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (kvq_grow((void **)&l.names, &cap, (l.n + 1) * sizeof *l.names, 1) ||
            !(l.names[l.n] = strdup(e->d_name))) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "corpus: out of memory");
            break;
        }
        l.n++;
    }
    closedir(d);
    if (st == KVQ_OK && !(l.path = strdup(path)))
        st = kvq_err_set(err, KVQ_E_NOMEM, "corpus: out of memory");
    if (st) {
        for (size_t k = 0; k < l.n; k++)
            free(l.names[k]);
        free(l.names);
        free(l.path);
        return st;
    }
    if (l.n > 1)
        qsort(l.names, l.n, sizeof *l.names, cmp_str);
    it->stack[it->depth++] = l;
    return KVQ_OK;
}

/* Opens the next *.txt / *.md file of the walk; *got = 0 when the walk is over. */
static kvq_status dir_next_file(kvq_corpus_iter *it, int *got, kvq_err *err)
{
    *got = 0;
    while (it->depth > 0) {
        dir_level *l = &it->stack[it->depth - 1];
        if (l->i == l->n) {
            dir_pop(it);
            continue;
        }
        char *full = join_path(l->path, l->names[l->i++]);
        if (!full)
            return kvq_err_set(err, KVQ_E_NOMEM, "corpus: out of memory");
        struct stat lsb, sb;
        kvq_status st = KVQ_OK;
        if (lstat(full, &lsb) != 0 || stat(full, &sb) != 0) {
            /* a dangling link or an entry that vanished: nothing to read */
        } else if (S_ISDIR(sb.st_mode)) {
            if (!S_ISLNK(lsb.st_mode))
                st = dir_push(it, full, err);
        } else if (S_ISREG(sb.st_mode) && (ends_with(full, ".txt") || ends_with(full, ".md"))) {
            st = open_file(it, full, err);
            if (st == KVQ_OK)
                *got = 1;
        }
        free(full);
        if (st || *got)
            return st;
    }
    return KVQ_OK;
}

/* ==========================================================================
 * the iterator
 * ========================================================================== */

kvq_status kvq_corpus_iter_next(kvq_corpus_iter *it, const kvq_corpus_doc **doc, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    *doc = NULL;
    if (it->failed)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "corpus: iterator used after an error");
    while (it->si < it->c->n_src) {
        const kvq_corpus_source *s = &it->c->src[it->si];
        int got = 0;
        memset(&it->doc, 0, sizeof it->doc);
        switch (s->kind) {
        case KVQ_CORPUS_FILE:
        case KVQ_CORPUS_JSONL:
        case KVQ_CORPUS_IDS:
            if (!it->started && (st = open_file(it, s->path, err)))
                break;
            it->started = 1;
            st = s->kind == KVQ_CORPUS_FILE ? next_text_part(it, &got, err)
               : s->kind == KVQ_CORPUS_IDS ? next_ids_part(it, &got, err)
               : next_jsonl(it, &got, err);
            break;
        case KVQ_CORPUS_DIR:
            if (!it->started && (st = dir_push(it, s->path, err)))
                break;
            it->started = 1;
            while (st == KVQ_OK && !got) {
                if (it->fp && (st = next_text_part(it, &got, err)))
                    break;
                if (got)
                    break;
                close_file(it);
                int opened = 0;
                if ((st = dir_next_file(it, &opened, err)) || !opened)
                    break;
            }
            break;
        default: /* generators */
            if (it->gen_i < s->count) {
                st = kvq_corpus_generate(it, err);
                got = st == KVQ_OK;
            }
            break;
        }
        if (st)
            break;
        if (got) {
            it->doc.index = it->next_index++;
            it->doc.source = (uint32_t)it->si;
            it->doc.label = it->label;
            *doc = &it->doc;
            return KVQ_OK;
        }
        close_file(it); /* this source is done */
        while (it->depth > 0)
            dir_pop(it);
        it->started = 0;
        it->gen_i = 0;
        it->si++;
    }
    if (st)
        it->failed = 1;
    return st;
}

static uint64_t hash_doc(const kvq_corpus_doc *d, uint64_t h, uint64_t *bytes)
{
    if (d->text) {
        *bytes += d->len;
        return kvq_fnv1a64(d->text, d->len, h);
    }
    for (size_t i = 0; i < d->n_ids; i++) {
        uint8_t b[4] = {(uint8_t)d->ids[i], (uint8_t)(d->ids[i] >> 8),
                        (uint8_t)(d->ids[i] >> 16), (uint8_t)(d->ids[i] >> 24)};
        h = kvq_fnv1a64(b, 4, h);
    }
    *bytes += 4 * (uint64_t)d->n_ids;
    return h;
}

kvq_status kvq_corpus_hash(const kvq_corpus *c, uint64_t *hash, uint64_t *n_docs,
                           uint64_t *n_bytes, kvq_err *err)
{
    kvq_corpus_iter *it = NULL;
    uint64_t h = KVQ_FNV1A64_INIT, docs = 0, bytes = 0;
    kvq_status st = kvq_corpus_iter_new(c, &it, err);
    const kvq_corpus_doc *d;
    while (st == KVQ_OK && (st = kvq_corpus_iter_next(it, &d, err)) == KVQ_OK && d) {
        h = hash_doc(d, h, &bytes);
        docs++;
    }
    kvq_corpus_iter_free(it);
    if (st == KVQ_OK) {
        if (hash)
            *hash = h;
        if (n_docs)
            *n_docs = docs;
        if (n_bytes)
            *n_bytes = bytes;
    }
    return st;
}

/* ==========================================================================
 * sequences
 * ========================================================================== */

typedef struct seq_state {
    const kvq_seq_params *p;
    const kvq_callbacks *cb;
    kvq_seq_fn fn;
    void *user;
    int32_t *buf;        /* [seq_len] */
    uint32_t n;          /* tokens in buf; 0 = no sequence started */
    uint32_t cap;        /* this sequence's length limit */
    uint32_t head;       /* tokens at the start that are not document tokens (BOS) */
    uint64_t first_doc, last_doc;
    int has_doc;         /* buf holds a document token */
    uint32_t n_doc;      /* document tokens in buf */
    kvq_corpus_stats *stats;
    int done;            /* the max_tokens budget is spent */
    int32_t bos;
} seq_state;

static kvq_status seq_emit(seq_state *s, kvq_err *err)
{
    kvq_corpus_seq q = {s->buf, s->n, s->stats->n_seqs, s->stats->n_tokens, s->first_doc,
                        s->last_doc};
    kvq_status st = s->fn ? s->fn(s->user, &q, err) : KVQ_OK;
    if (st)
        return st;
    s->stats->n_seqs++;
    s->stats->n_tokens += s->n;
    s->n = 0;
    s->n_doc = 0;
    s->has_doc = 0;
    if (s->p->max_tokens && s->stats->n_tokens >= s->p->max_tokens)
        s->done = 1;
    if (kvq_progress(s->cb, "tokenize", s->stats->n_tokens, s->p->max_tokens))
        return kvq_err_set(err, KVQ_E_CANCELLED, "tokenize: cancelled");
    return KVQ_OK;
}

/* Opens a sequence: its length limit given the budget, and BOS. 0 when none fits. */
static int seq_start(seq_state *s)
{
    uint64_t cap = s->p->seq_len;
    if (s->p->max_tokens) {
        uint64_t left = s->p->max_tokens - s->stats->n_tokens;
        if (left < cap) {
            if (!s->p->keep_partial || left < 2) {
                s->done = 1;
                return 0;
            }
            cap = left;
        }
    }
    s->cap = (uint32_t)cap;
    s->n = 0;
    if (s->p->add_bos)
        s->buf[s->n++] = s->bos;
    s->head = s->n;
    s->has_doc = 0;
    s->n_doc = 0;
    return 1;
}

/* The current sequence is cut short (end of corpus or of a document). */
static kvq_status seq_flush(seq_state *s, kvq_err *err)
{
    if (s->n == 0)
        return KVQ_OK;
    if (s->has_doc && s->p->keep_partial && s->n >= 2)
        return seq_emit(s, err);
    s->stats->n_dropped += s->n_doc;
    s->n = 0;
    s->n_doc = 0;
    s->has_doc = 0;
    return KVQ_OK;
}

/* Appends one token (doc >= 0: a document token of that document; -1: separator). */
static kvq_status seq_push(seq_state *s, int32_t tok, int64_t doc, kvq_err *err)
{
    if (s->done) {
        if (doc >= 0)
            s->stats->n_dropped++;
        return KVQ_OK;
    }
    if (s->n == 0) {
        if (doc < 0)
            return KVQ_OK; /* a separator never starts a sequence */
        if (!seq_start(s)) {
            s->stats->n_dropped++;
            return KVQ_OK;
        }
    }
    if (doc >= 0) {
        if (!s->has_doc)
            s->first_doc = (uint64_t)doc;
        s->last_doc = (uint64_t)doc;
        s->has_doc = 1;
        s->n_doc++;
    }
    s->buf[s->n++] = tok;
    if (s->n == s->cap)
        return seq_emit(s, err);
    return KVQ_OK;
}

/* Checks p against the tokenizer; *sep = the token between documents, or -1. */
static kvq_status tokenize_check(const kvq_tokenizer *t, const kvq_seq_params *p,
                                 int32_t *sep_out, kvq_err *err)
{
    if (p->seq_len < 2)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "tokenize: seq_len %u is less than 2",
                           p->seq_len);
    if (p->seq_len > (1u << 30))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "tokenize: seq_len %u is too large",
                           p->seq_len);
    int32_t sep = -1;
    if (!p->per_document && p->sep == KVQ_DOC_SEP_BOS)
        sep = kvq_tokenizer_bos(t);
    else if (!p->per_document && p->sep == KVQ_DOC_SEP_EOS)
        sep = kvq_tokenizer_eos(t);
    if (p->add_bos && kvq_tokenizer_bos(t) < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "tokenize: tokenizer '%s' has no BOS token "
                           "(set add_bos = 0)", kvq_tokenizer_model(t));
    if (!p->per_document && p->sep != KVQ_DOC_SEP_NONE && sep < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "tokenize: tokenizer '%s' has no %s token "
                           "to separate documents", kvq_tokenizer_model(t),
                           p->sep == KVQ_DOC_SEP_BOS ? "BOS" : "EOS");
    *sep_out = sep;
    return KVQ_OK;
}

/* The tokens of one document: its text encoded into *ids (which it then owns), or its
 * pre-tokenized ids checked against the vocabulary.               *toks: [*nt] */
static kvq_status doc_tokens(const kvq_tokenizer *t, const kvq_corpus_doc *d, uint32_t n_vocab,
                             int32_t **ids, const int32_t **toks_out, size_t *nt_out,
                             kvq_err *err)
{
    kvq_status st = KVQ_OK;
    const int32_t *toks;
    size_t nt;
    if (d->text) {
        free(*ids);
        *ids = NULL;
        unsigned flags = d->part > 0 ? KVQ_ENCODE_NO_PREFIX : 0;
        if ((st = kvq_tokenizer_encode(t, d->text, d->len, flags, ids, &nt, err)))
            return st;
        toks = *ids;
    } else {
        toks = d->ids;
        nt = d->n_ids;
        for (size_t i = 0; i < nt; i++)
            if ((uint32_t)toks[i] >= n_vocab) {
                st = kvq_err_set(err, KVQ_E_MISMATCH, "%s: token id %d at index %zu of part "
                                 "%u is outside the vocabulary of %u", d->label, toks[i], i,
                                 d->part, n_vocab);
                break;
            }
        if (st)
            return st;
    }
    *toks_out = toks;
    *nt_out = nt;
    return KVQ_OK;
}

kvq_status kvq_corpus_tokenize(const kvq_corpus *c, const kvq_tokenizer *t,
                               const kvq_seq_params *p, const kvq_callbacks *cb, kvq_seq_fn fn,
                               void *user, kvq_corpus_stats *stats, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    kvq_corpus_iter *it = NULL;
    int32_t *ids = NULL;
    kvq_corpus_stats local;
    seq_state s = {0};
    kvq_seq_params dp;
    if (!stats)
        stats = &local;
    memset(stats, 0, sizeof *stats);
    stats->hash = KVQ_FNV1A64_INIT;
    if (!p) {
        kvq_seq_params_default(&dp);
        p = &dp;
    }
    int32_t sep = -1;
    if ((st = tokenize_check(t, p, &sep, err)))
        return st;
    s.p = p;
    s.cb = cb;
    s.fn = fn;
    s.user = user;
    s.stats = stats;
    s.bos = kvq_tokenizer_bos(t);
    s.buf = malloc((size_t)p->seq_len * sizeof *s.buf);
    if (!s.buf)
        return kvq_err_set(err, KVQ_E_NOMEM, "tokenize: out of memory");
    if ((st = kvq_corpus_iter_new(c, &it, err)))
        goto done;
    const uint32_t n_vocab = kvq_tokenizer_n_vocab(t);
    int any_doc_tokens = 0, any_text = 0; /* any_text: a byte other than white space */
    while (!s.done) {
        const kvq_corpus_doc *d;
        if ((st = kvq_corpus_iter_next(it, &d, err)) || !d)
            break;
        stats->n_docs++;
        stats->hash = hash_doc(d, stats->hash, &stats->n_bytes);
        for (size_t i = 0; !any_text && i < (d->text ? d->len : 0); i++)
            any_text = !strchr(" \t\n\r\v\f", d->text[i]);
        any_text |= d->ids != NULL; /* token ids are what they are */
        const int32_t *toks;
        size_t nt;
        if ((st = doc_tokens(t, d, n_vocab, &ids, &toks, &nt, err)))
            break;
        if (nt == 0)
            continue;
        stats->n_doc_tokens += nt;
        if (d->part == 0) {
            if (p->per_document)
                st = seq_flush(&s, err);
            else if (any_doc_tokens && sep >= 0 && s.n > s.head)
                st = seq_push(&s, sep, -1, err);
            if (st)
                break;
        }
        any_doc_tokens = 1;
        for (size_t i = 0; i < nt && st == KVQ_OK; i++)
            st = seq_push(&s, toks[i], (int64_t)d->index, err);
        if (st)
            break;
    }
    if (st == KVQ_OK && !s.done)
        st = seq_flush(&s, err);
    if (st == KVQ_OK && stats->n_doc_tokens == 0)
        st = kvq_err_set(err, KVQ_E_INVALID_ARG, "corpus '%s' contains no text", c->spec);
    else if (st == KVQ_OK && !any_text)
        st = kvq_err_set(err, KVQ_E_INVALID_ARG, "corpus '%s' contains only white space "
                         "(%llu bytes): nothing to calibrate on", c->spec,
                         (unsigned long long)stats->n_bytes);
    else if (st == KVQ_OK && stats->n_seqs == 0 && p->max_tokens > 0 && p->max_tokens < 2)
        st = kvq_err_set(err, KVQ_E_INVALID_ARG, "corpus '%s': max tokens %llu makes no "
                         "sequence: a sequence needs 2 tokens or more (one prediction)", c->spec,
                         (unsigned long long)p->max_tokens);
    else if (st == KVQ_OK && stats->n_seqs == 0)
        st = kvq_err_set(err, KVQ_E_INVALID_ARG, "corpus '%s': its %llu tokens make no "
                         "sequence (seq_len %u, keep_partial %d)", c->spec,
                         (unsigned long long)stats->n_doc_tokens, p->seq_len, p->keep_partial);
done:
    free(ids);
    free(s.buf);
    kvq_corpus_iter_free(it);
    return st;
}

/* ==========================================================================
 * A corpus held in memory
 * ========================================================================== */

kvq_status kvq_seq_set_add(void *user, const kvq_corpus_seq *seq, kvq_err *err)
{
    return kvq_seq_set_push(user, seq->ids, (int64_t)seq->n, err);
}

kvq_status kvq_seq_set_collect(const kvq_corpus *c, const kvq_tokenizer *t,
                               const kvq_seq_params *p, const kvq_callbacks *cb,
                               kvq_seq_set *out, kvq_corpus_stats *stats, kvq_err *err)
{
    return kvq_corpus_tokenize(c, t, p, cb, kvq_seq_set_add, out, stats, err);
}

kvq_status kvq_corpus_check_no_tokenizer(const kvq_corpus *c, const char *model_path,
                                         kvq_err *err)
{
    static const char *const kinds[] = {"text", "file", "dir", "jsonl", "ids", "uuid",
                                        "passkey", "kv-recall"};
    for (size_t i = 0; i < kvq_corpus_source_count(c); i++) {
        const kvq_corpus_source *s = kvq_corpus_source_at(c, i);
        if (s && s->kind != KVQ_CORPUS_IDS)
            return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: has no tokenizer (no vocabulary in "
                               "its metadata), so corpus item %zu (%s%s%s) cannot be read: give "
                               "token ids (ids:FILE)", model_path, i + 1,
                               (unsigned)s->kind < 8 ? kinds[s->kind] : "text",
                               s->path ? " " : "", s->path ? s->path : "");
    }
    return KVQ_OK;
}
