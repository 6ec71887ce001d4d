/* full.c — kvq_eval_full (kvq/eval.h): perplexity of a corpus with full attention,
 * streamed sequence by sequence as the corpus is tokenized: llama.cpp's chunks with the
 * second half scored, every prediction of each sequence, or the last N of each. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eval/eval_internal.h"

typedef struct full_state {
    kvq_forward *f;
    float *logits;        /* [chunk, vocab] */
    int32_t chunk, vocab;
    kvq_nll_sum sum;      /* summed negative log-likelihood (nats), predicted tokens */
    uint64_t n_seq;
    /* second half: the token stream re-cut into chunks of n_ctx */
    int half;
    int64_t last;         /* N of the last N, else 0 */
    int32_t bos;          /* BOS when the model adds one, else -1 */
    int32_t *buf;         /* [n_ctx] the chunk being filled */
    int64_t n_ctx, n_buf;
    uint64_t n_stream;    /* tokens of the stream (BOS included) */
} full_state;

/* Appends tokens to the chunk buffer, scoring each chunk as it fills. */
static kvq_status full_stream(full_state *s, const int32_t *ids, int64_t n, kvq_err *err)
{
    for (int64_t i = 0; i < n; i++) {
        s->buf[s->n_buf++] = ids[i];
        s->n_stream++;
        if (s->n_buf < s->n_ctx)
            continue;
        s->n_buf = 0;
        kvq_status st = kvq_perplexity_chunk_llama(s->f, s->buf, s->n_ctx, s->bos, s->chunk,
                                                   s->vocab, s->logits, &s->sum, err);
        if (st != KVQ_OK)
            return st;
        s->n_seq++;
    }
    return KVQ_OK;
}

static kvq_status full_seq(void *user, const kvq_corpus_seq *seq, kvq_err *err)
{
    full_state *s = user;
    if (s->half) {
        kvq_status st = KVQ_OK;
        if (s->n_stream == 0 && s->bos >= 0)
            st = full_stream(s, &s->bos, 1, err); /* the text starts with BOS */
        return st ? st : full_stream(s, seq->ids, seq->n, err);
    }
    const int64_t from = s->last && seq->n > s->last + 1 ? seq->n - s->last - 1 : 0;
    kvq_status st = kvq_perplexity_seq(s->f, seq->ids, seq->n, from, s->chunk, s->vocab,
                                       s->logits, &s->sum, err);
    if (st != KVQ_OK)
        return st;
    s->n_seq++;
    return KVQ_OK;
}

/* The forward pass and buffers of s. */
static kvq_status full_open(const kvq_model *m, int64_t seq_len, const kvq_eval_params *p,
                            full_state *s, kvq_err *err)
{
    kvq_forward_params fp = kvq_forward_params_default();
    fp.threads = p->threads;
    fp.max_tokens = seq_len;
    fp.cb = p->cb;
    fp.cb.progress = NULL; /* progress comes from the corpus reader, per token */
    kvq_model_memory mem;
    kvq_model_memory_estimate(m, &fp, seq_len, &mem);
    kvq_log(&p->cb, KVQ_LOG_INFO, "memory: about %.1f MiB (weights %.1f MiB mapped, KV cache "
            "%.1f MiB)", mem.total_bytes / 1048576.0, mem.mapped_bytes / 1048576.0,
            mem.kv_cache_bytes / 1048576.0);
    kvq_status st = kvq_forward_create(m, &fp, &s->f, err);
    if (st)
        return st;
    s->chunk = fp.chunk;
    s->vocab = kvq_model_config_get(m)->vocab_size;
    s->logits = malloc(sizeof(float) * (size_t)s->chunk * (size_t)s->vocab);
    if (s->half)
        s->buf = malloc(sizeof *s->buf * (size_t)seq_len);
    if (!s->logits || (s->half && !s->buf))
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", p->name);
    return KVQ_OK;
}

kvq_status kvq_eval_full(const kvq_model *m, const kvq_corpus *corpus, const kvq_tokenizer *tok,
                         int64_t seq_len, int64_t max_tokens, int second_half,
                         const kvq_eval_params *p, kvq_eval_full_result *out, kvq_err *err)
{
    memset(out, 0, sizeof *out);
    full_state s = {.half = second_half, .last = second_half ? 0 : p->last, .n_ctx = seq_len};
    kvq_seq_params sp;
    kvq_seq_params_default(&sp);
    kvq_seq_params_model_bos(&sp, tok);
    sp.seq_len = (uint32_t)seq_len;
    sp.max_tokens = (uint64_t)max_tokens;
    s.bos = sp.add_bos ? kvq_tokenizer_bos(tok) : -1;
    if (s.half) {
        sp.add_bos = 0; /* the stream's BOS comes from full_seq, each chunk's from the loop */
        if (sp.max_tokens > 1 && s.bos >= 0)
            sp.max_tokens--;
    }
    kvq_status st = full_open(m, seq_len, p, &s, err);
    const double t0 = kvq_now();
    if (!st)
        st = kvq_corpus_tokenize(corpus, tok, &sp, &p->cb, full_seq, &s, &out->stats, err);
    out->seconds = kvq_now() - t0;
    if (!st && s.half)
        out->stats.n_tokens = s.n_stream;
    if (!st && s.sum.n_pred == 0)
        st = s.half ? kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: %llu tokens, fewer than one chunk "
                                  "of --seq-len %lld with a token to score", p->name,
                                  (unsigned long long)s.n_stream, (long long)seq_len)
                    : kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: no token to predict (sequences "
                                  "too short)", p->name);
    if (!st) {
        out->n_seq = s.n_seq;
        out->n_pred = s.sum.n_pred;
        out->nll = s.sum.nll / (double)s.sum.n_pred;
        out->ppl = exp(out->nll);
    }
    free(s.buf);
    free(s.logits);
    kvq_forward_free(s.f);
    return st;
}
