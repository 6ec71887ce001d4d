/* test_ruler.c — the RULER-style suite (kvq/eval.h, eval/ruler_*.c): per task, every
 * answer sits in the prompt exactly where the generator says (bytes and tokens, in the
 * context); the prompt's tokens plus the answer budget are within 2% of the asked
 * length and never over it, in the model's tokens (stories260K's tokenizer, and
 * SmolLM2's when the fetched model is there); one seed gives identical prompts, another
 * sample another prompt (sample k of seed s is sample 0 of seed s + k); the
 * string-match scores against cases written from the paper's definition (arXiv
 * 2404.06654: string_match_all, the share of references found in the prediction,
 * case-insensitive); task lists; and the suite through the harness on the
 * tiny model gives the same scores and continuations at 1 and 2 threads. */
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
#include "kvq.h"
#include "kvq/eval.h"
#include "kvq/tokenizer.h"

#define FILLER "file:docs/design.md"

static kvq_ruler_filler *filler(const kvq_tokenizer *tok)
{
    kvq_corpus *c = NULL;
    kvq_corpus_params cp;
    kvq_corpus_params_default(&cp);
    kvq_err e = {0};
    if (kvq_corpus_open(FILLER, &cp, &c, &e))
        fail_msg("%s: %s", FILLER, e.msg);
    kvq_ruler_filler *f = NULL;
    if (kvq_ruler_filler_read(c, tok, &f, &e))
        fail_msg("filler: %s", e.msg);
    kvq_corpus_free(c);
    return f;
}

static kvq_tokenizer *load_tok(const char *path)
{
    kvq_tokenizer *t = NULL;
    kvq_err e = {0};
    if (kvq_tokenizer_load(path, NULL, &t, &e))
        fail_msg("%s: %s", path, e.msg);
    return t;
}

/* The checks of one prompt against its own claims and an independent re-encoding. */
static void check_prompt(const kvq_tokenizer *tok, const kvq_ruler_prompt *p, int64_t length)
{
    const char *name = kvq_ruler_task_name(p->task);
    /* length: tokens + answer budget within 2% of the asked length, never over */
    const int64_t total = (int64_t)p->n_ids + p->n_gen;
    if (total > length || (double)total < 0.98 * (double)length)
        fail_msg("%s: %zu tokens + %d for the answer, asked %lld", name, p->n_ids, p->n_gen,
                 (long long)length);
    int32_t *ids = NULL;
    size_t n = 0;
    kvq_err e = {0};
    assert_int_equal(kvq_tokenizer_encode(tok, p->text, p->len, KVQ_ENCODE_MODEL_BOS, &ids, &n,
                                          &e), KVQ_OK);
    assert_int_equal(n, p->n_ids);
    assert_memory_equal(ids, p->ids, sizeof(int32_t) * n);
    free(ids);
    assert_true(p->n_ctx > 0 && p->n_ctx < p->n_ids);
    assert_true(p->ctx_chars > 0 && p->ctx_chars < p->len);
    /* every answer has a place, each place holds its answer, in bytes and tokens, inside
     * the context */
    assert_true(p->n_answers > 0 && p->n_spans >= p->n_answers);
    int seen[64] = {0};
    for (size_t i = 0; i < p->n_spans; i++) {
        const kvq_ruler_span *s = &p->spans[i];
        assert_true(s->answer < p->n_answers);
        const char *a = p->answers[s->answer];
        seen[s->answer] = 1;
        assert_int_equal(s->char_end - s->char_begin, strlen(a));
        if (memcmp(p->text + s->char_begin, a, strlen(a)))
            fail_msg("%s: span %zu: '%.*s' is not '%s'", name, i, (int)strlen(a),
                     p->text + s->char_begin, a);
        assert_true(s->char_end <= p->ctx_chars);
        assert_true(s->tok_begin >= 0 && s->tok_begin < s->tok_end);
        assert_true(s->tok_end <= (int64_t)p->n_ctx);
        char *piece = NULL;
        size_t len = 0;
        assert_int_equal(kvq_tokenizer_decode(tok, p->ids + s->tok_begin,
                                              (size_t)(s->tok_end - s->tok_begin),
                                              KVQ_DECODE_KEEP_PREFIX, &piece, &len, &e), KVQ_OK);
        if (!strstr(piece, a))
            fail_msg("%s: tokens %lld..%lld give '%s', not '%s'", name, (long long)s->tok_begin,
                     (long long)s->tok_end, piece, a);
        free(piece);
    }
    for (size_t i = 0; i < p->n_answers && i < 64; i++)
        assert_true(seen[i]);
    /* the question names what is asked: the answers are not in it (VT: the value only) */
    for (size_t i = 0; i < p->n_answers; i++)
        if (strstr(p->text + p->ctx_chars, p->answers[i]))
            fail_msg("%s: answer '%s' in the question", name, p->answers[i]);
}

static void run_tokenizer(const kvq_tokenizer *tok, const int64_t *lengths, size_t n_len)
{
    kvq_ruler_filler *f = filler(tok);
    kvq_err e = {0};
    for (int t = 0; t < KVQ_RULER_N_TASKS; t++)
        for (size_t l = 0; l < n_len; l++) {
            kvq_ruler_prompt a, b, c;
            if (kvq_ruler_generate(f, tok, (kvq_ruler_task)t, lengths[l], 7, 0, &a, &e))
                fail_msg("%s at %lld: %s", kvq_ruler_task_name((kvq_ruler_task)t),
                         (long long)lengths[l], e.msg);
            check_prompt(tok, &a, lengths[l]);
            /* same seed: the same bytes; another sample: another prompt */
            assert_int_equal(kvq_ruler_generate(f, tok, (kvq_ruler_task)t, lengths[l], 7, 0, &b,
                                                &e), KVQ_OK);
            assert_int_equal(a.len, b.len);
            assert_memory_equal(a.text, b.text, a.len);
            assert_int_equal(a.n_spans, b.n_spans);
            assert_memory_equal(a.spans, b.spans, sizeof *a.spans * a.n_spans);
            assert_int_equal(kvq_ruler_generate(f, tok, (kvq_ruler_task)t, lengths[l], 7, 1, &c,
                                                &e), KVQ_OK);
            check_prompt(tok, &c, lengths[l]);
            assert_true(a.len != c.len || memcmp(a.text, c.text, a.len));
            /* sample 1 of seed 7 is sample 0 of seed 8 (runs of one sample add up) */
            kvq_ruler_prompt_free(&b);
            assert_int_equal(kvq_ruler_generate(f, tok, (kvq_ruler_task)t, lengths[l], 8, 0, &b,
                                                &e), KVQ_OK);
            assert_int_equal(b.len, c.len);
            assert_memory_equal(b.text, c.text, c.len);
            kvq_ruler_prompt_free(&a);
            kvq_ruler_prompt_free(&b);
            kvq_ruler_prompt_free(&c);
        }
    kvq_ruler_filler_free(f);
}

static void test_prompts_spm(void **state)
{
    (void)state;
    const char *path = test_model_path();
    if (!path) /* the committed stand-in: another SentencePiece vocabulary */
        path = "tests/data/tiny_spm.gguf";
    kvq_tokenizer *tok = load_tok(path);
    const int64_t lengths[] = {4096, 6000};
    run_tokenizer(tok, lengths, 2);
    kvq_tokenizer_free(tok);
}

static void test_prompts_smollm2(void **state)
{
    (void)state;
    const char *path = test_smollm2_path();
    if (!path)
        TEST_SKIP("SmolLM2-135M-Instruct.Q4_1.gguf not found");
    kvq_tokenizer *tok = load_tok(path);
    const int64_t lengths[] = {4096, 8192};
    run_tokenizer(tok, lengths, 2);
    kvq_tokenizer_free(tok);
}

/* Cases from the definition: string_match_all is the mean over the references of
 * "reference in prediction" (lower-cased); string_match_part is the max. */
static void test_score(void **state)
{
    (void)state;
    const char *three[] = {"4821937", "1029384", "5551234"};
    assert_true(kvq_ruler_score("are 4821937, 1029384 and 7", three, 3, 1) == 2.0 / 3.0);
    assert_true(kvq_ruler_score("are 4821937, 1029384 and 7", three, 3, 0) == 1.0);
    assert_true(kvq_ruler_score("5551234 1029384 4821937", three, 3, 1) == 1.0);
    assert_true(kvq_ruler_score("none of them", three, 3, 1) == 0.0);
    assert_true(kvq_ruler_score("none of them", three, 3, 0) == 0.0);
    assert_true(kvq_ruler_score("482193", three, 3, 1) == 0.0); /* a prefix is no match */
    const char *words[] = {"Harbor", "quiet"};
    assert_true(kvq_ruler_score(" HARBOR, Quiet.", words, 2, 1) == 1.0); /* case folded */
    assert_true(kvq_ruler_score(" harbors", words, 2, 1) == 0.5);       /* a substring */
    assert_true(kvq_ruler_score("", words, 2, 1) == 0.0);
    const char *uuid[] = {"0f1e2d3c-4b5a-4697-8877-665544332211"};
    assert_true(kvq_ruler_score("is: 0F1E2D3C-4B5A-4697-8877-665544332211.", uuid, 1, 1) == 1.0);
    assert_true(kvq_ruler_score("is: 0f1e2d3c-4b5a-4697-8877-66554433221", uuid, 1, 1) == 0.0);
}

static void test_tasks_parse(void **state)
{
    (void)state;
    unsigned m = 0;
    kvq_err e = {0};
    assert_int_equal(kvq_ruler_tasks_parse("ruler", &m, &e), KVQ_OK);
    assert_int_equal(m, (1u << KVQ_RULER_N_TASKS) - 1);
    assert_int_equal(kvq_ruler_tasks_parse("ruler:vt,cwe", &m, &e), KVQ_OK);
    assert_int_equal(m, (1u << KVQ_RULER_VT) | (1u << KVQ_RULER_CWE));
    assert_int_equal(kvq_ruler_tasks_parse("ruler:niah_single_uuid", &m, &e), KVQ_OK);
    assert_int_equal(m, 1u << KVQ_RULER_NIAH_SINGLE_UUID);
    assert_int_equal(kvq_ruler_tasks_parse("ruler:vt,needle", &m, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "'needle'"));
    assert_int_equal(kvq_ruler_tasks_parse("ruler:", &m, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_ruler_tasks_parse("babilong", &m, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_ruler_tasks_parse("rulers", &m, &e), KVQ_E_INVALID_ARG);
    for (int t = 0; t < KVQ_RULER_N_TASKS; t++) {
        char spec[64];
        snprintf(spec, sizeof spec, "ruler:%s", kvq_ruler_task_name((kvq_ruler_task)t));
        assert_int_equal(kvq_ruler_tasks_parse(spec, &m, &e), KVQ_OK);
        assert_int_equal(m, 1u << t);
    }
}

/* The suite on the tiny model: scores in [0, 1], the same scores and continuations at
 * 1 and 2 threads, and the full row's answers the same as a second full row's. */
static void test_suite_threads(void **state)
{
    (void)state;
    const char *path = test_model_path();
    if (!path)
        TEST_SKIP("stories260K.gguf not found");
    kvq_model *m = NULL;
    kvq_err e = {0};
    kvq_model_params mp = kvq_model_params_default();
    assert_int_equal(kvq_model_open(path, &mp, &m, &e), KVQ_OK);
    const kvq_tokenizer *tok = kvq_model_tokenizer(m);
    kvq_ruler_filler *f = filler(tok);
    const int64_t lengths[] = {500};
    kvq_ruler_params rp = {.tasks = (1u << KVQ_RULER_NIAH_SINGLE_NUMBER) | (1u << KVQ_RULER_VT),
                           .lengths = lengths, .n_lengths = 1, .samples = 2, .seed = 3};
    kvq_retrieval_params rows[3];
    for (int i = 0; i < 3; i++) {
        rows[i] = kvq_retrieval_params_default();
        rows[i].window = 16;
        rows[i].sink = 4;
    }
    rows[0].selector = rows[2].selector = KVQ_SELECT_FULL;
    rows[1].selector = KVQ_SELECT_ORACLE;
    rows[1].budget = (kvq_budget){.count = 16};
    kvq_ruler_result r[2];
    for (int th = 0; th < 2; th++) {
        kvq_eval_params p = kvq_eval_params_default();
        p.threads = th + 1;
        if (kvq_eval_ruler_run(m, NULL, f, tok, &rp, &p, rows, 3, &r[th], &e))
            fail_msg("suite: %s", e.msg);
        assert_int_equal(r[th].n_cells, 2);
        assert_int_equal(r[th].task[1], KVQ_RULER_VT);
    }
    const size_t n = 3 * 2 * 2;
    for (size_t i = 0; i < n; i++) {
        assert_true(r[0].score[i] >= 0.0 && r[0].score[i] <= 1.0);
        assert_true(r[0].score[i] == r[1].score[i]);
        assert_string_equal(r[0].pred[i], r[1].pred[i]);
    }
    for (size_t i = 0; i < 4; i++) /* rows 0 and 2 are both full attention */
        assert_string_equal(r[0].pred[i], r[0].pred[2 * 4 + i]);
    kvq_ruler_result_free(&r[0]);
    kvq_ruler_result_free(&r[1]);
    kvq_ruler_filler_free(f);
    kvq_model_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_score),
        cmocka_unit_test(test_tasks_parse),
        cmocka_unit_test(test_prompts_spm),
        cmocka_unit_test(test_prompts_smollm2),
        cmocka_unit_test(test_suite_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
