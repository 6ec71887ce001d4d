/* ruler_gen.c — the RULER-style task prompts (kvq/eval.h; the task definitions of
 * arXiv 2404.06654, written here, docs/ruler.md): the filler text, the random choices
 * of one sample, the prompt built for a haystack of k filler words (or k rare words of
 * the word list), and the largest k whose tokens plus the answer budget fit the asked
 * length, found by bisection on the model's own token counts. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "eval/ruler_internal.h"

/* ---- the filler --------------------------------------------------------------------- */

#define FILLER_MAX (4u << 20) /* bytes of filler text kept */
#define VOCAB_MAX 65536       /* distinct words kept for keys and the word list */

void kvq_ruler_filler_free(kvq_ruler_filler *f)
{
    if (!f)
        return;
    free(f->text);
    free(f->word);
    free(f->sent);
    free(f->vocab);
    free(f);
}

/* Appends text[0, n) to b with every run of white space folded into one space. */
static void fold_append(kvq_strbuf *b, const char *text, size_t n)
{
    for (size_t i = 0; i < n && b->len < FILLER_MAX; i++) {
        const unsigned char ch = (unsigned char)text[i];
        if (isspace(ch) || ch < 0x20) {
            if (b->len && b->s[b->len - 1] != ' ')
                kvq_sb_put(b, " ", 1);
        } else {
            kvq_sb_put(b, text + i, 1);
        }
    }
}

/* A word of 3-12 letters (trailing , . ; : ! ? dropped) as lower case into out. */
static int vocab_word(const char *w, size_t n, char out[16])
{
    while (n && strchr(",.;:!?", w[n - 1]))
        n--;
    if (n < 3 || n > 12)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (!isalpha((unsigned char)w[i]))
            return 0;
        out[i] = (char)tolower((unsigned char)w[i]);
    }
    out[n] = 0;
    return 1;
}

/* The word starts, sentence starts and the distinct words of f->text. */
static kvq_status filler_index(kvq_ruler_filler *f, kvq_err *err)
{
    size_t cap_w = 0, cap_v = 0;
    uint64_t *seen = calloc(1u << 18, sizeof *seen); /* open addressing on hashes */
    if (!seen)
        return kvq_err_set(err, KVQ_E_NOMEM, "ruler: out of memory");
    int prev_end = 1;
    for (size_t i = 0; i < f->len;) {
        while (i < f->len && f->text[i] == ' ')
            i++;
        if (i >= f->len)
            break;
        size_t j = i;
        while (j < f->len && f->text[j] != ' ')
            j++;
        if (j - i > 24) { /* rules, URLs, long code: not prose */
            prev_end = 1;
            i = j;
            continue;
        }
        if (kvq_grow((void **)&f->word, &cap_w, f->n_words + 1, sizeof *f->word) ||
            kvq_resize((void **)&f->sent, f->n_words + 1, 1)) {
            free(seen);
            return kvq_err_set(err, KVQ_E_NOMEM, "ruler: out of memory");
        }
        f->sent[f->n_words] = (uint8_t)prev_end;
        f->word[f->n_words++] = (uint32_t)i;
        prev_end = strchr(".!?", f->text[j - 1]) != NULL;
        char w[16];
        if (f->n_vocab < VOCAB_MAX && vocab_word(f->text + i, j - i, w) &&
            !ruler_template_word(w)) {
            uint64_t h = kvq_xxh64(w, strlen(w), 0) | 1;
            size_t k = h & ((1u << 18) - 1);
            while (seen[k] && seen[k] != h)
                k = (k + 1) & ((1u << 18) - 1);
            if (!seen[k]) {
                seen[k] = h;
                if (kvq_grow((void **)&f->vocab, &cap_v, f->n_vocab + 1, sizeof *f->vocab)) {
                    free(seen);
                    return kvq_err_set(err, KVQ_E_NOMEM, "ruler: out of memory");
                }
                memcpy(f->vocab[f->n_vocab++], w, sizeof w);
            }
        }
        i = j;
    }
    free(seen);
    return KVQ_OK;
}

kvq_status kvq_ruler_filler_read(const kvq_corpus *corpus, const kvq_tokenizer *tok,
                                 kvq_ruler_filler **out, kvq_err *err)
{
    (void)tok;
    *out = NULL;
    kvq_corpus_iter *it = NULL;
    const kvq_corpus_doc *doc;
    kvq_strbuf b = {0};
    kvq_status s = kvq_corpus_iter_new(corpus, &it, err);
    while (!s && b.len < FILLER_MAX && !(s = kvq_corpus_iter_next(it, &doc, err)) && doc) {
        if (doc->task != KVQ_TASK_NONE || !doc->text)
            continue;
        if (b.len && b.s[b.len - 1] != ' ')
            kvq_sb_put(&b, " ", 1);
        fold_append(&b, doc->text, doc->len);
    }
    kvq_corpus_iter_free(it);
    while (!s && b.len && b.s[b.len - 1] == ' ')
        b.s[--b.len] = 0;
    kvq_ruler_filler *f = s ? NULL : calloc(1, sizeof *f);
    if (!s && (b.oom || !f))
        s = kvq_err_set(err, KVQ_E_NOMEM, "ruler: out of memory for the filler");
    if (s) {
        kvq_sb_free(&b);
        free(f);
        return s;
    }
    f->text = b.s;
    f->len = b.len;
    if ((s = filler_index(f, err))) {
        kvq_ruler_filler_free(f);
        return s;
    }
    if (f->n_words < 16 || f->n_vocab < 64) {
        s = kvq_err_set(err, KVQ_E_INVALID_ARG, "ruler: the filler text has %zu words, %zu "
                        "distinct (3-12 letters); it needs at least 16 and 64", f->n_words,
                        f->n_vocab);
        kvq_ruler_filler_free(f);
        return s;
    }
    *out = f;
    return KVQ_OK;
}

/* ---- one sample's random choices ------------------------------------------------------ */

/* Distinct vocabulary indices into idx[n] (partial Fisher-Yates on a scratch copy). */
static kvq_status pick_words(const kvq_ruler_filler *f, kvq_rng *r, size_t n, uint32_t *idx,
                             kvq_err *err)
{
    if (n > f->n_vocab)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "ruler: the filler has %zu distinct words; "
                           "this prompt needs %zu", f->n_vocab, n);
    uint32_t *all = malloc(sizeof *all * f->n_vocab);
    if (!all)
        return kvq_err_set(err, KVQ_E_NOMEM, "ruler: out of memory");
    for (size_t i = 0; i < f->n_vocab; i++)
        all[i] = (uint32_t)i;
    for (size_t i = 0; i < n; i++) {
        size_t j = i + (size_t)kvq_rng_below(r, f->n_vocab - i);
        uint32_t t = all[i];
        all[i] = all[j];
        all[j] = t;
        idx[i] = all[i];
    }
    free(all);
    return KVQ_OK;
}

static void rand_number(kvq_rng *r, char *out, size_t cap)
{
    snprintf(out, cap, "%u", (unsigned)(1000000 + kvq_rng_below(r, 9000000)));
}

static void rand_uuid(kvq_rng *r, char *out)
{
    static const char hex[] = "0123456789abcdef";
    const char *form = "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx";
    for (size_t i = 0; form[i]; i++) {
        unsigned v = (unsigned)kvq_rng_below(r, 16);
        out[i] = form[i] == 'x' ? hex[v] : form[i] == 'y' ? hex[8 + (v & 3)] : form[i];
    }
    out[36] = 0;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The sample's keys, values, depths, variables or word list, seeded by (seed + sample,
 * task, length). */
static kvq_status sample_draw(const kvq_ruler_filler *f, kvq_ruler_task t, int64_t length,
                              uint64_t seed, uint32_t sample, ruler_sample *x, kvq_err *err)
{
    memset(x, 0, sizeof *x);
    x->t = t;
    /* sample k of seed s is sample 0 of seed s + k: runs of one sample each add up */
    const uint64_t mix[4] = {seed + sample, (uint64_t)t, (uint64_t)length, 0};
    x->seed = kvq_xxh64(mix, sizeof mix, 0x52554c4552ull);
    kvq_rng r;
    kvq_rng_seed(&r, x->seed);
    x->max_k = (size_t)1 << 24;
    x->w0 = (size_t)kvq_rng_below(&r, f->n_words);
    while (x->w0 > 0 && !f->sent[x->w0]) /* start at a sentence */
        x->w0--;
    kvq_status s;
    if (t == KVQ_RULER_CWE) {
        x->n_pool = f->n_vocab < RULER_CWE_POOL ? f->n_vocab : RULER_CWE_POOL;
        x->pool = malloc(sizeof *x->pool * x->n_pool);
        if (!x->pool)
            return kvq_err_set(err, KVQ_E_NOMEM, "ruler: out of memory");
        x->max_k = x->n_pool - RULER_CWE_COMMON;
        return pick_words(f, &r, x->n_pool, x->pool, err);
    }
    const int multi = t == KVQ_RULER_NIAH_MULTIKEY || t == KVQ_RULER_NIAH_MULTIQUERY ||
                      t == KVQ_RULER_NIAH_MULTIVALUE;
    x->n_needles = t == KVQ_RULER_VT ? RULER_VT_VARS : multi ? RULER_NEEDLES : 1;
    for (int i = 0; i < x->n_needles; i++)
        x->depth[i] = kvq_rng_uniform(&r);
    if (t == KVQ_RULER_VT) {
        qsort(x->depth, (size_t)x->n_needles, sizeof *x->depth, cmp_double);
        for (int i = 0; i < x->n_needles; i++)
            for (int c = 0; c < 5; c++)
                x->key[i][c] = (char)('A' + kvq_rng_below(&r, 26));
        snprintf(x->value[0], sizeof x->value[0], "%u", (unsigned)(10000 + kvq_rng_below(&r, 90000)));
        return KVQ_OK;
    }
    uint32_t kw[2 * RULER_NEEDLES];
    if ((s = pick_words(f, &r, 2 * (size_t)x->n_needles, kw, err)))
        return s;
    for (int i = 0; i < x->n_needles; i++) {
        const int k = t == KVQ_RULER_NIAH_MULTIVALUE ? 0 : i;
        snprintf(x->key[i], sizeof x->key[i], "%s-%s", f->vocab[kw[2 * k]], f->vocab[kw[2 * k + 1]]);
        if (t == KVQ_RULER_NIAH_SINGLE_UUID)
            rand_uuid(&r, x->value[i]);
        else
            rand_number(&r, x->value[i], sizeof x->value[i]);
    }
    x->asked = (int)kvq_rng_below(&r, (uint64_t)x->n_needles);
    return KVQ_OK;
}

/* ---- names, parsing, scoring ------------------------------------------------------------ */

static const char *const task_names[KVQ_RULER_N_TASKS] = {
    "niah_single_number", "niah_single_uuid", "niah_multikey", "niah_multivalue",
    "niah_multiquery",    "vt",               "cwe"};

const char *kvq_ruler_task_name(kvq_ruler_task t)
{
    return (unsigned)t < KVQ_RULER_N_TASKS ? task_names[t] : "?";
}

int kvq_ruler_task_match_all(kvq_ruler_task t)
{
    (void)t; /* every synthetic task of RULER; match_part is its QA tasks' */
    return 1;
}

kvq_status kvq_ruler_tasks_parse(const char *spec, unsigned *mask, kvq_err *err)
{
    *mask = 0;
    if (!spec || strncmp(spec, "ruler", 5) || (spec[5] && spec[5] != ':'))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "suite '%s': the suite is ruler or "
                           "ruler:TASK,TASK", spec ? spec : "");
    if (!spec[5]) {
        *mask = (1u << KVQ_RULER_N_TASKS) - 1;
        return KVQ_OK;
    }
    for (const char *p = spec + 6;;) {
        const size_t n = strcspn(p, ",");
        int found = -1;
        for (int t = 0; t < KVQ_RULER_N_TASKS; t++)
            if (strlen(task_names[t]) == n && !strncmp(p, task_names[t], n))
                found = t;
        if (found < 0)
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "suite '%s': unknown task '%.*s' (tasks: "
                               "niah_single_number, niah_single_uuid, niah_multikey, "
                               "niah_multivalue, niah_multiquery, vt, cwe)", spec, (int)n, p);
        *mask |= 1u << found;
        if (!p[n])
            break;
        p += n + 1;
    }
    return KVQ_OK;
}

/* Whether needle occurs in hay, ASCII case folded. */
static int contains_nocase(const char *hay, const char *needle)
{
    const size_t n = strlen(needle);
    if (!n)
        return 1;
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i]))
            i++;
        if (i == n)
            return 1;
    }
    return 0;
}

double kvq_ruler_score(const char *pred, const char *const *answers, size_t n, int all)
{
    if (!n)
        return 0.0;
    size_t hit = 0;
    for (size_t i = 0; i < n; i++)
        hit += contains_nocase(pred ? pred : "", answers[i]);
    return all ? (double)hit / (double)n : hit > 0 ? 1.0 : 0.0;
}

void kvq_ruler_prompt_free(kvq_ruler_prompt *p)
{
    if (!p)
        return;
    free(p->text);
    free(p->ids);
    for (size_t i = 0; i < p->n_answers; i++)
        free(p->answers[i]);
    free(p->answers);
    free(p->spans);
    memset(p, 0, sizeof *p);
}

void ruler_sample_free(ruler_sample *x)
{
    free(x->pool);
    x->pool = NULL;
}

/* ---- the generator ------------------------------------------------------------------------ */

/* Tokens of text (BOS as the model adds it). */
static kvq_status count_tokens(const kvq_tokenizer *tok, const char *text, size_t len,
                               int32_t **ids, size_t *n, kvq_err *err)
{
    return kvq_tokenizer_encode(tok, text, len, KVQ_ENCODE_MODEL_BOS, ids, n, err);
}

/* The answer budget: the answers' tokens joined by ", " and 24 more. */
static kvq_status answer_budget(const kvq_tokenizer *tok, const ruler_text *b, int32_t *n_gen,
                                kvq_err *err)
{
    kvq_strbuf s = {0};
    kvq_sb_put(&s, " ", 1);
    for (size_t i = 0; i < b->n_answers; i++)
        kvq_sb_printf(&s, "%s%s", i ? ", " : "", b->answers[i]);
    if (s.oom) {
        kvq_sb_free(&s);
        return kvq_err_set(err, KVQ_E_NOMEM, "ruler: out of memory");
    }
    int32_t *ids = NULL;
    size_t n = 0;
    kvq_status st = kvq_tokenizer_encode(tok, s.s, s.len, KVQ_ENCODE_NO_PREFIX, &ids, &n, err);
    free(ids);
    kvq_sb_free(&s);
    *n_gen = (int32_t)n + 24;
    return st;
}

/* Builds the prompt of k units and counts its tokens into *n (ids kept in *ids). */
static kvq_status build_count(const kvq_ruler_filler *f, const kvq_tokenizer *tok,
                              const ruler_sample *x, size_t k, ruler_text *b, int32_t **ids,
                              size_t *n, kvq_err *err)
{
    ruler_build_free(b);
    free(*ids);
    *ids = NULL;
    kvq_status s = ruler_build(f, x, k, b, err);
    return s ? s : count_tokens(tok, b->text.s, b->text.len, ids, n, err);
}

/* Char offset of every token (starts[n + 1]) from the pieces; INVALID_ARG when they do
 * not spell the text (a tokenizer that does not round-trip it). */
static kvq_status token_starts(const kvq_tokenizer *tok, const int32_t *ids, size_t n,
                               const char *text, size_t len, size_t *starts, kvq_err *err)
{
    size_t off = 0, skip = kvq_tokenizer_adds_prefix(tok, text, len, KVQ_ENCODE_MODEL_BOS);
    for (size_t i = 0; i < n; i++) {
        size_t pl = 0;
        const char *pc = kvq_tokenizer_piece(tok, ids[i], &pl);
        if (!pc)
            pl = 0;
        if (skip && pl) { /* the dummy prefix: one space that is not in the text */
            pc++, pl--, skip = 0;
        }
        starts[i] = off;
        if (off + pl > len || memcmp(text + off, pc, pl))
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "ruler: the tokenizer does not spell "
                               "the prompt back at byte %zu (token %zu)", off, i);
        off += pl;
    }
    starts[n] = off;
    if (off != len)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "ruler: the tokenizer spells %zu of the "
                           "prompt's %zu bytes", off, len);
    return KVQ_OK;
}

/* First token whose start is at or past c. */
static int64_t tok_at(const size_t *starts, size_t n, size_t c)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (starts[mid] < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (int64_t)lo;
}

/* Moves the build and its tokens into the prompt, with the token spans. */
static kvq_status finish(const kvq_tokenizer *tok, ruler_text *b, int32_t *ids, size_t n,
                         kvq_ruler_prompt *out, kvq_err *err)
{
    size_t *starts = malloc(sizeof *starts * (n + 1));
    if (!starts)
        return kvq_err_set(err, KVQ_E_NOMEM, "ruler: out of memory");
    kvq_status s = token_starts(tok, ids, n, b->text.s, b->text.len, starts, err);
    if (s) {
        free(starts);
        return s;
    }
    out->text = b->text.s;
    out->len = b->text.len;
    b->text = (kvq_strbuf){0};
    out->ctx_chars = b->ctx_chars;
    out->ids = ids;
    out->n_ids = n;
    out->n_ctx = (size_t)tok_at(starts, n, b->ctx_chars);
    out->answers = b->answers;
    out->n_answers = b->n_answers;
    b->answers = NULL;
    b->n_answers = 0;
    out->spans = b->spans;
    out->n_spans = b->n_spans;
    b->spans = NULL;
    b->n_spans = 0;
    for (size_t i = 0; i < out->n_spans; i++) {
        kvq_ruler_span *sp = &out->spans[i];
        int64_t t0 = tok_at(starts, n, sp->char_begin);
        if (t0 >= (int64_t)n || starts[t0] > sp->char_begin)
            t0--; /* the token that holds char_begin */
        sp->tok_begin = t0;
        sp->tok_end = tok_at(starts, n, sp->char_end);
    }
    free(starts);
    return KVQ_OK;
}

kvq_status kvq_ruler_generate(const kvq_ruler_filler *f, const kvq_tokenizer *tok,
                              kvq_ruler_task t, int64_t length, uint64_t seed, uint32_t sample,
                              kvq_ruler_prompt *out, kvq_err *err)
{
    memset(out, 0, sizeof *out);
    if ((unsigned)t >= KVQ_RULER_N_TASKS || length < 16)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "ruler: bad task %d or length %lld", (int)t,
                           (long long)length);
    ruler_sample x;
    ruler_text b = {0};
    int32_t *ids = NULL, n_gen = 0;
    size_t n = 0;
    kvq_status s = sample_draw(f, t, length, seed, sample, &x, err);
    if (!s)
        s = build_count(f, tok, &x, 0, &b, &ids, &n, err);
    if (!s)
        s = answer_budget(tok, &b, &n_gen, err);
    if (!s && (int64_t)n + n_gen > length)
        s = kvq_err_set(err, KVQ_E_INVALID_ARG, "ruler: %s needs more than %lld tokens (%zu "
                        "without filler, %d for the answer)", kvq_ruler_task_name(t),
                        (long long)length, n, (int)n_gen);
    /* the largest k with tokens + n_gen <= length: double, then bisect */
    size_t lo = 0, hi = 64 < x.max_k ? 64 : x.max_k;
    while (!s) {
        if ((s = build_count(f, tok, &x, hi, &b, &ids, &n, err)))
            break;
        if ((int64_t)n + n_gen > length)
            break;
        lo = hi;
        if (hi == x.max_k)
            s = kvq_err_set(err, KVQ_E_INVALID_ARG, "ruler: %s at %lld tokens: the filler has "
                            "too few distinct words (%zu) for the word list",
                            kvq_ruler_task_name(t), (long long)length, f->n_vocab);
        hi = 2 * hi < x.max_k ? 2 * hi : x.max_k;
    }
    while (!s && hi - lo > 1) {
        const size_t mid = lo + (hi - lo) / 2;
        if ((s = build_count(f, tok, &x, mid, &b, &ids, &n, err)))
            break;
        if ((int64_t)n + n_gen > length)
            hi = mid;
        else
            lo = mid;
    }
    if (!s)
        s = build_count(f, tok, &x, lo, &b, &ids, &n, err);
    if (!s && (double)((int64_t)n + n_gen) < 0.98 * (double)length)
        s = kvq_err_set(err, KVQ_E_INVALID_ARG, "ruler: %s at %lld tokens: the closest prompt "
                        "has %zu tokens + %d for the answer (not within 2%%)",
                        kvq_ruler_task_name(t), (long long)length, n, (int)n_gen);
    if (!s) {
        out->task = t;
        out->length = length;
        out->sample = sample;
        out->n_gen = n_gen;
        s = finish(tok, &b, ids, n, out, err);
    }
    if (s) {
        free(ids);
        kvq_ruler_prompt_free(out);
    }
    ruler_build_free(&b);
    ruler_sample_free(&x);
    return s;
}
