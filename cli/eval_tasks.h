/* eval_tasks.h — the task documents of `kvq eval` (passkey, kv-recall) and their
 * answers, with full attention and under every selector x budget row. */
#ifndef KVQ_CLI_EVAL_TASKS_H
#define KVQ_CLI_EVAL_TASKS_H

#include "cli/retrieval_opts.h"

typedef struct task {
    kvq_corpus_task kind;
    int32_t *ids; /* prompt, BOS first */
    size_t n;
    char *answer;
    int32_t n_gen; /* tokens to generate */
} task;

typedef struct task_list {
    task *t;
    size_t n;
    int64_t longest; /* prompt + generated */
} task_list;

void tasks_free(task_list *tl);

/* The corpus's task documents (passkey, kv-recall) as prompts and answers. */
kvq_status tasks_read(const kvq_corpus *corpus, const kvq_tokenizer *tok, task_list *tl,
                      kvq_err *err);

/* Correct answers per task kind [3] (indexed by kvq_corpus_task) with f's current
 * attention: each prompt run through f, the answer decoded greedily. ids: [longest];
 * answers [tl->n + 1]: '1' (correct) or '0' per task in corpus order, then NUL. */
kvq_status tasks_answer(kvq_forward *f, const kvq_tokenizer *tok, const task_list *tl,
                        int32_t vocab, float *logits, int32_t *ids, int correct[3], char *answers,
                        kvq_err *err);

/* Every row's correct answers (correct[row][kind]) with an exact prompt and retrieval
 * while decoding, the prompt prefilled once for all rows: per task, one exact prefill
 * under a retrieval context of the first row's settings (prefill_full) while an
 * observer records every layer's pre-RoPE keys and values; per row, a fresh context
 * gets them appended chunk by chunk (kvq_retrieval_append), the forward resumes after
 * them (kvq_forward_resume) and decodes the answer. The exact prefill depends on the
 * position mode, cache dtype and window but not on the selector or budget, so every
 * row decodes exactly what a prefill of its own would give; a last prompt chunk of one
 * token (decoded with retrieval by a prefill of its own) is run per row. p: the rows'
 * shared parameters (selector and budget set per row); chunk: f's prefill chunk;
 * answers [n_rows][tl->n + 1]: each row's string of tasks_answer; cb: a log line per task. Memory: the recorded keys and values, 8 x layers x prompt
 * x KV heads x head dim bytes (190 MB for SmolLM2 at 4K). */
kvq_status tasks_answer_rows(kvq_forward *f, const kvq_tokenizer *tok, const task_list *tl,
                             const kvq_model_config *c, const kvq_codebook_set *rt,
                             const kvq_retrieval_params *p, const cli_row *rows, size_t n_rows,
                             int32_t chunk, float *logits, int32_t *ids, int (*correct)[3],
                             char *answers, const kvq_callbacks *cb, kvq_err *err);

#endif
