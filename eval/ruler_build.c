/* ruler_build.c — one RULER-style prompt for a haystack of k units (ruler_internal.h):
 * the task's instruction, the haystack with its needles or assignments at their depths
 * (snapped back to a sentence start), or the numbered word list, then the question and
 * the start of the answer (the tasks of arXiv 2404.06654 section 3, in this project's
 * words; docs/ruler.md). */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "eval/ruler_internal.h"

/* The fixed words of every template (a word of the list or a key must not be one). */
static const char template_words[] =
    "Some special magic numbers UUIDs are hidden in the text below. Memorize them: a "
    "question about them follows the text. One of the special magic for is: What is the "
    "mentioned above? are all and Memorize the variable assignments (VAR name = value) "
    "hidden in the text below; Question: Find every variable that is assigned the value in "
    "Answer: Following the chain of assignments variables they Below is a numbered list of "
    "words. Some of them occur in it much more often than the others: memorize which. What "
    "are the most common words in the list above? The words that occur most often";

int ruler_template_word(const char *w)
{
    const size_t n = strlen(w);
    for (const char *p = template_words; *p; p++)
        if (!strncasecmp(p, w, n))
            return 1;
    return 0;
}

void ruler_build_free(ruler_text *b)
{
    kvq_sb_free(&b->text);
    for (size_t i = 0; i < b->n_answers; i++)
        free(b->answers[i]);
    free(b->answers);
    free(b->spans);
    memset(b, 0, sizeof *b);
}

static int add_answer(ruler_text *b, const char *s)
{
    char **na = realloc(b->answers, sizeof *na * (b->n_answers + 1));
    if (!na)
        return -1;
    b->answers = na;
    if (!(na[b->n_answers] = strdup(s)))
        return -1;
    b->n_answers++;
    return 0;
}

/* Appends s, recording it as an occurrence of answer a (a < 0: not an answer). */
static int put(ruler_text *b, const char *s, int a)
{
    const size_t at = b->text.len;
    kvq_sb_puts(&b->text, s);
    if (a < 0)
        return 0;
    if (kvq_grow((void **)&b->spans, &b->cap_spans, b->n_spans + 1, sizeof *b->spans))
        return -1;
    b->spans[b->n_spans++] = (kvq_ruler_span){.answer = (uint32_t)a, .char_begin = at,
                                              .char_end = at + strlen(s)};
    return 0;
}

static const char *kind_word(kvq_ruler_task t)
{
    return t == KVQ_RULER_NIAH_SINGLE_UUID ? "UUID" : "number";
}

/* The needle or assignment i, as a sentence of its own. */
static int put_insert(ruler_text *b, const ruler_sample *x, int i)
{
    if (x->t == KVQ_RULER_VT) {
        put(b, "VAR ", -1);
        if (put(b, x->key[i], i))
            return -1;
        put(b, " = ", -1);
        if (i)
            put(b, "VAR ", -1);
        put(b, i ? x->key[i - 1] : x->value[0], -1);
        return put(b, ".", -1);
    }
    kvq_sb_printf(&b->text, "One of the special magic %ss for %s is: ", kind_word(x->t),
                  x->key[i]);
    /* multi-key: only the asked needle's value is an answer */
    const int a = x->t == KVQ_RULER_NIAH_MULTIKEY ? (i == x->asked ? 0 : -1)
                  : x->t == KVQ_RULER_NIAH_MULTIVALUE || x->t == KVQ_RULER_NIAH_MULTIQUERY ? i
                                                                                             : 0;
    if (put(b, x->value[i], a))
        return -1;
    return put(b, ".", -1);
}

/* Where insert i goes among the k haystack words: its depth's word, moved back to the
 * sentence that holds it. */
static size_t insert_at(const kvq_ruler_filler *f, const ruler_sample *x, size_t k, int i)
{
    size_t pos = (size_t)(x->depth[i] * (double)k + 0.5);
    if (pos > k)
        pos = k;
    while (pos > 0 && pos < k && !f->sent[(x->w0 + pos) % f->n_words])
        pos--;
    return pos;
}

static void put_word(ruler_text *b, const kvq_ruler_filler *f, size_t j)
{
    const char *w = f->text + f->word[j];
    const char *e = memchr(w, ' ', f->len - f->word[j]);
    kvq_sb_put(&b->text, w, e ? (size_t)(e - w) : f->len - f->word[j]);
}

static void put_keys(ruler_text *b, const ruler_sample *x)
{
    for (int i = 0; i < x->n_needles; i++)
        kvq_sb_printf(&b->text, "%s%s", i == 0 ? "" : i + 1 < x->n_needles ? ", " : " and ",
                      x->key[i]);
}

/* The question and the start of the answer of a needle task or VT. */
static void put_question(ruler_text *b, const ruler_sample *x)
{
    const char *w = kind_word(x->t);
    switch (x->t) {
    case KVQ_RULER_VT:
        kvq_sb_printf(&b->text, "\nQuestion: Find every variable that is assigned the value %s "
                      "in the text above. Answer: Following the chain of assignments in the "
                      "text above, %d variables are assigned the value %s; they are:",
                      x->value[0], x->n_needles, x->value[0]);
        break;
    case KVQ_RULER_NIAH_MULTIVALUE:
        kvq_sb_printf(&b->text, "\nWhat are all the special magic %ss for %s mentioned in the "
                      "text above? The special magic %ss for %s mentioned in the text above "
                      "are", w, x->key[0], w, x->key[0]);
        break;
    case KVQ_RULER_NIAH_MULTIQUERY:
        kvq_sb_printf(&b->text, "\nWhat are all the special magic %ss for ", w);
        put_keys(b, x);
        kvq_sb_printf(&b->text, " mentioned in the text above? The special magic %ss for ", w);
        put_keys(b, x);
        kvq_sb_puts(&b->text, " mentioned in the text above are");
        break;
    default:
        kvq_sb_printf(&b->text, "\nWhat is the special magic %s for %s mentioned in the text "
                      "above? The special magic %s for %s mentioned in the text above is", w,
                      x->key[x->asked], w, x->key[x->asked]);
    }
}

/* Needle tasks and VT: instruction, k filler words with the inserts, question. */
static int build_haystack(const kvq_ruler_filler *f, const ruler_sample *x, size_t k,
                          ruler_text *b)
{
    if (x->t == KVQ_RULER_VT)
        kvq_sb_puts(&b->text, "Memorize the variable assignments (VAR name = value) hidden "
                    "in the text below; a question about them follows the text.\n");
    else
        kvq_sb_printf(&b->text, "Some special magic %ss are hidden in the text below. "
                      "Memorize them: a question about them follows the text.\n",
                      kind_word(x->t));
    size_t pos[8];
    for (int i = 0; i < x->n_needles; i++)
        pos[i] = insert_at(f, x, k, i);
    for (size_t j = 0; j <= k; j++) {
        for (int i = 0; i < x->n_needles; i++) {
            if (pos[i] != j)
                continue;
            if (j || i)
                kvq_sb_put(&b->text, " ", 1);
            if (put_insert(b, x, i))
                return -1;
        }
        if (j == k)
            break;
        if (j || b->text.s[b->text.len - 1] != '\n')
            kvq_sb_put(&b->text, " ", 1);
        put_word(b, f, (x->w0 + j) % f->n_words);
    }
    b->ctx_chars = b->text.len;
    put_question(b, x);
    if (x->t == KVQ_RULER_VT) {
        for (int i = 0; i < x->n_needles; i++)
            if (add_answer(b, x->key[i]))
                return -1;
    } else if (x->t == KVQ_RULER_NIAH_MULTIVALUE || x->t == KVQ_RULER_NIAH_MULTIQUERY) {
        for (int i = 0; i < x->n_needles; i++)
            if (add_answer(b, x->value[i]))
                return -1;
    } else if (add_answer(b, x->value[x->asked])) {
        return -1;
    }
    return 0;
}

/* CWE: the numbered list of the common words (RULER_CWE_FREQ times each) and k rare
 * ones (RULER_CWE_RARE times each), shuffled, then the question. */
static int build_cwe(const kvq_ruler_filler *f, const ruler_sample *x, size_t k, ruler_text *b)
{
    const size_t n = RULER_CWE_COMMON * RULER_CWE_FREQ + k * RULER_CWE_RARE;
    uint32_t *list = malloc(sizeof *list * n);
    if (!list)
        return -1;
    size_t m = 0;
    for (size_t w = 0; w < RULER_CWE_COMMON + k; w++)
        for (int r = 0; r < (w < RULER_CWE_COMMON ? RULER_CWE_FREQ : RULER_CWE_RARE); r++)
            list[m++] = (uint32_t)w;
    kvq_rng rng;
    kvq_rng_seed(&rng, x->seed ^ 0x637765ull);
    for (size_t i = n; i > 1; i--) {
        const size_t j = (size_t)kvq_rng_below(&rng, i);
        const uint32_t t = list[i - 1];
        list[i - 1] = list[j];
        list[j] = t;
    }
    kvq_sb_puts(&b->text, "Below is a numbered list of words. Some of them occur in it much "
                "more often than the others: memorize which.\n");
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        kvq_sb_printf(&b->text, "%s%zu. ", i ? " " : "", i + 1);
        const uint32_t w = list[i];
        rc = put(b, f->vocab[x->pool[w]], w < RULER_CWE_COMMON ? (int)w : -1);
    }
    free(list);
    b->ctx_chars = b->text.len;
    kvq_sb_printf(&b->text, "\nQuestion: What are the %d most common words in the list above? "
                  "Answer: The %d words that occur most often in the list are:",
                  RULER_CWE_COMMON, RULER_CWE_COMMON);
    for (int w = 0; w < RULER_CWE_COMMON && !rc; w++)
        rc = add_answer(b, f->vocab[x->pool[w]]);
    return rc;
}

kvq_status ruler_build(const kvq_ruler_filler *f, const ruler_sample *x, size_t k,
                       ruler_text *b, kvq_err *err)
{
    memset(b, 0, sizeof *b);
    const int rc = x->t == KVQ_RULER_CWE ? build_cwe(f, x, k, b) : build_haystack(f, x, k, b);
    if (rc || b->text.oom) {
        ruler_build_free(b);
        return kvq_err_set(err, KVQ_E_NOMEM, "ruler: out of memory");
    }
    return KVQ_OK;
}
