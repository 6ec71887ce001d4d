/*
 * corpus_synth.c — the synthetic corpus generators (uuid:, passkey:, kv-recall:), one
 * document per call of the corpus iterator (corpus.c).
 */
#include "kvq/corpus.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/util.h"

#include "calib/corpus_internal.h"

/* The document's RNG: a hash of (seed, kind, ordinal, number), byte order fixed. */
static void gen_rng(kvq_rng *r, uint64_t seed, kvq_corpus_kind kind, uint32_t ordinal,
                    uint64_t i)
{
    uint64_t v[4] = {seed, (uint64_t)kind, ordinal, i};
    uint8_t b[32];
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 8; j++)
            b[8 * k + j] = (uint8_t)(v[k] >> (8 * j));
    kvq_rng_seed(r, kvq_fnv1a64(b, sizeof b, KVQ_FNV1A64_INIT));
}

static void hex_digits(kvq_rng *r, char *out, int n)
{
    static const char hex[] = "0123456789abcdef";
    for (int k = 0; k < n; k++)
        out[k] = hex[kvq_rng_below(r, 16)];
    out[n] = '\0';
}

/* A random UUID v4 in canonical form (36 characters + NUL). */
static void uuid4(kvq_rng *r, char out[37])
{
    static const char hex[] = "0123456789abcdef";
    uint8_t b[16];
    for (int k = 0; k < 16; k++)
        b[k] = (uint8_t)(kvq_rng_u64(r) >> 56);
    b[6] = (uint8_t)((b[6] & 0x0F) | 0x40); /* version 4 */
    b[8] = (uint8_t)((b[8] & 0x3F) | 0x80); /* variant 10 */
    int w = 0;
    for (int k = 0; k < 16; k++) {
        if (k == 4 || k == 6 || k == 8 || k == 10)
            out[w++] = '-';
        out[w++] = hex[b[k] >> 4];
        out[w++] = hex[b[k] & 15];
    }
    out[w] = '\0';
}

static const char PASSKEY_INTRO[] =
    "There is an important piece of information hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about it afterwards.\n";
static const char PASSKEY_FILLER[] =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
    "again.\n";
static const char KV_INTRO[] =
    "Below is a list of keys and their values. Remember the value of every key.\n";

static int text_putf(kvq_corpus_iter *it, const char *fmt, const char *a, const char *b)
{
    char line[256];
    int n = snprintf(line, sizeof line, fmt, a, b);
    return n < 0 || (size_t)n >= sizeof line ? -1 : kvq_corpus_text_put(it, line, (size_t)n);
}

kvq_status kvq_corpus_generate(kvq_corpus_iter *it, kvq_err *err)
{
    const kvq_corpus *c = it->c;
    const kvq_corpus_source *s = &c->src[it->si];
    kvq_rng r;
    gen_rng(&r, c->p.seed, s->kind, c->ordinal[it->si], it->gen_i);
    int oom = 0;
    it->text_len = 0;
    it->answer[0] = '\0';
    it->doc.task = KVQ_TASK_NONE;
    if (s->kind == KVQ_CORPUS_UUID) {
        for (uint32_t k = 0; k < c->p.uuid_lines && !oom; k++) {
            char u[37];
            uuid4(&r, u);
            u[36] = '\n';
            oom = kvq_corpus_text_put(it, u, 37);
        }
    } else if (s->kind == KVQ_CORPUS_PASSKEY) {
        snprintf(it->answer, sizeof it->answer, "%05u",
                 (unsigned)(10000 + kvq_rng_below(&r, 90000)));
        uint64_t at = kvq_rng_below(&r, (uint64_t)c->p.passkey_filler + 1);
        oom = kvq_corpus_text_put(it, PASSKEY_INTRO, sizeof PASSKEY_INTRO - 1);
        for (uint64_t k = 0; k <= c->p.passkey_filler && !oom; k++) {
            if (k == at)
                oom = text_putf(it, "The pass key is %s. Remember it. %s is the pass key.\n",
                                it->answer, it->answer);
            if (k < c->p.passkey_filler && !oom)
                oom = kvq_corpus_text_put(it, PASSKEY_FILLER, sizeof PASSKEY_FILLER - 1);
        }
        static const char question[] = "What is the pass key? The pass key is";
        if (!oom)
            oom = kvq_corpus_text_put(it, question, sizeof question - 1);
        it->doc.task = KVQ_TASK_PASSKEY;
    } else {
        uint32_t n = c->p.kv_pairs;
        char(*keys)[9] = malloc(n * sizeof *keys);
        if (!keys)
            return kvq_err_set(err, KVQ_E_NOMEM, "corpus: out of memory");
        uint64_t q = kvq_rng_below(&r, n);
        oom = kvq_corpus_text_put(it, KV_INTRO, sizeof KV_INTRO - 1);
        for (uint32_t k = 0; k < n && !oom; k++) {
            char value[9];
            for (int fresh = 0; !fresh;) { /* keys are distinct */
                hex_digits(&r, keys[k], 8);
                fresh = 1;
                for (uint32_t j = 0; j < k && fresh; j++)
                    fresh = memcmp(keys[j], keys[k], 8) != 0;
            }
            hex_digits(&r, value, 8);
            if (k == q)
                memcpy(it->answer, value, 9);
            oom = text_putf(it, "%s: %s\n", keys[k], value);
        }
        if (!oom)
            oom = text_putf(it, "What is the value of key %s? The value of key %s is", keys[q],
                            keys[q]);
        free(keys);
        it->doc.task = KVQ_TASK_KV_RECALL;
    }
    char name[32];
    snprintf(name, sizeof name, "%s#", kvq_corpus_kind_name(s->kind));
    if (oom || kvq_corpus_set_label(it, name, it->gen_i, 1))
        return kvq_err_set(err, KVQ_E_NOMEM, "corpus: out of memory");
    it->doc.text = it->text;
    it->doc.len = it->text_len;
    it->doc.answer = it->doc.task != KVQ_TASK_NONE ? it->answer : NULL;
    it->gen_i++;
    return KVQ_OK;
}
