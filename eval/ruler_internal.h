/* ruler_internal.h — the RULER-style generators' internals (eval/ruler_gen.c,
 * eval/ruler_build.c): the filler text, one sample's random choices, one prompt built
 * for a given haystack size. */
#ifndef KVQ_RULER_INTERNAL_H
#define KVQ_RULER_INTERNAL_H

#include "kvq/eval.h"
#include "kvq/util.h"

#define RULER_NEEDLES 4      /* keys (multi-key, multi-query) or values (multi-value) */
#define RULER_VT_VARS 5      /* one chain of 4 hops */
#define RULER_CWE_COMMON 10  /* words asked for */
#define RULER_CWE_FREQ 30    /* occurrences of each common word */
#define RULER_CWE_RARE 3     /* occurrences of each other word */
#define RULER_CWE_POOL 4096  /* words drawn for the list */

struct kvq_ruler_filler {
    char *text;          /* folded text: words separated by one space */
    size_t len;
    uint32_t *word;      /* [n_words]: start of each word in text */
    uint8_t *sent;       /* [n_words]: 1 when the word starts a sentence */
    size_t n_words;
    char (*vocab)[16];   /* [n_vocab]: distinct words, lower case */
    size_t n_vocab;
};

/* One sample's draws (ruler_gen.c), fixed while the generator searches for the size. */
typedef struct ruler_sample {
    kvq_ruler_task t;
    uint64_t seed;
    size_t w0;           /* the haystack's first filler word (a sentence start) */
    size_t max_k;        /* largest haystack size */
    int n_needles;
    double depth[8];     /* of each needle or assignment, [0, 1) */
    char key[8][32];     /* needle keys (multi-value: key[0] for all), VT variables */
    char value[8][40];   /* needle values; VT: value[0] */
    int asked;           /* multi-key: the needle asked */
    uint32_t *pool;      /* CWE: vocabulary indices, the first RULER_CWE_COMMON common */
    size_t n_pool;
} ruler_sample;
void ruler_sample_free(ruler_sample *x);

/* One prompt (ruler_build.c). */
typedef struct ruler_text {
    kvq_strbuf text;
    size_t ctx_chars;
    char **answers;
    size_t n_answers;
    kvq_ruler_span *spans; /* char offsets only */
    size_t n_spans, cap_spans;
} ruler_text;

/* The prompt of x with k units of haystack: k filler words (needle tasks, VT) or k rare
 * words of the list (CWE). Errors: NOMEM. */
kvq_status ruler_build(const kvq_ruler_filler *f, const ruler_sample *x, size_t k,
                       ruler_text *b, kvq_err *err);
void ruler_build_free(ruler_text *b);

/* 1 when w (lower case) occurs anywhere in the templates' fixed text. */
int ruler_template_word(const char *w);

#endif
