/* eval_kv_retr.c — `kvq eval --kv KIND --selectors S --budgets B`: retrieval over a
 * compressed KV cache (kvq/kvcache.h kvq_retrieval_set_kvcache), against full attention.
 * Each sequence's first floor(prompt_fraction n) tokens are its prompt, prefilled
 * exactly in one pass; the others are decoded one token per call and predicted
 * (kvq_perplexity_seq_last), full attention run the same way as the reference. One row
 * per selector x budget: perplexity, the attended share, the memory the compressed
 * cache held (f16: an f16 cache's). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/eval_kv.h"
#include "cli/retrieval_opts.h"
#include "kvq/perplexity.h"

typedef struct kvr {
    const cli_kv *o;
    kvq_kvcache_params kp;
    double frac;
    const kvq_seq_set *sl;
    kvq_forward *f;
    float *logits;
    int32_t chunk, vocab;
} kvr;

/* Perplexity over x->sl with the forward's attention; kc (or NULL) laid out per sequence. */
static kvq_status kvr_ppl(const kvr *x, kvq_kvcache *kc, double *nll, uint64_t *n_pred,
                          kvq_err *err)
{
    kvq_nll_sum sum = {0};
    for (size_t q = 0; q < x->sl->n; q++) {
        const int64_t n = x->sl->off[q + 1] - x->sl->off[q];
        const int64_t P = (int64_t)floor(x->frac * (double)n), n_last = n - 1 - P;
        if (n_last < 1 || P < 2)
            continue; /* nothing decoded after a prefill of two or more tokens */
        kvq_status s = kc ? kvq_kvcache_begin(kc, P, n, err) : KVQ_OK;
        if (!s)
            s = kvq_perplexity_seq_last(x->f, x->sl->ids + x->sl->off[q], n, n_last, x->chunk,
                                        x->vocab, x->logits, &sum, err);
        if (s)
            return s;
    }
    *nll = sum.n_pred ? sum.nll / (double)sum.n_pred : NAN;
    *n_pred = sum.n_pred;
    return KVQ_OK;
}

/* ---- held memory (kvq/runtime.h kvq_retrieval_held_get): the compressed cache's bytes
 * per token plus the retrieval context's (selector data, positions, RoPE table; its own
 * rows only without a compressed cache) = what the process holds for the KV. One line
 * (text) or a JSON fragment ending ", " (json), after the row's fields. */
static void kvr_print_held(const kvq_retrieval *r, const kvq_kvcache_memory *mem, int has_kc,
                           int json)
{
    kvq_retrieval_held h;
    kvq_retrieval_held_get(r, &h);
    const double tok = mem->tokens > 0 ? mem->tokens : 1;
    const double cache = has_kc ? mem->bytes / tok : 0, held = cache + h.total;
    if (json)
        printf("\"held_bytes_per_token\": %.2f, \"held_of_f16\": %.6f, "
               "\"context_bytes_per_token\": %.2f, \"context_rows\": %.2f, "
               "\"context_selector\": %.2f, \"context_positions\": %.2f, "
               "\"context_rope\": %.2f, \"context_scratch_bytes\": %.0f, ",
               held, held / (mem->bytes_f16 / tok), h.total, h.rows, h.selector, h.positions,
               h.rope, h.scratch);
    else
        printf("    held %.1f bytes/token (%.1f%% of f16): cache %.1f + context %.1f (rows %.1f, "
               "selector %.1f, positions %.1f, rope %.1f); context scratch %.0f bytes\n", held,
               100 * held / (mem->bytes_f16 / tok), cache, h.total, h.rows, h.selector,
               h.positions, h.rope, h.scratch);
}

static void kvr_print(const kvr *x, const cli_row *row, double ref, double nll, uint64_t n_pred,
                      const kvq_kvcache_memory *mem, const kvq_retrieval_stats *st, int32_t d,
                      int json, const kvq_retrieval *r, int has_kc)
{
    const double tok = mem->tokens > 0 ? mem->tokens : 1, ppl0 = exp(ref), ppl = exp(nll);
    const double att = st->visible > 0 ? st->attended / st->visible : 1;
    const double cells = mem->bytes_f16 / (4.0 * d);
    const double pruned = cells > 0 ? mem->pruned / cells : 0;
    char set[200];
    cli_kv_settings_json(&x->kp, set, sizeof set);
    if (json) {
        printf("{\"kv\": \"%s\", %s%s\"selector\": \"%s\", \"budget\": \"%s\", "
               "\"prompt_fraction\": %g, \"predicted\": %llu, \"ppl_full\": %.6f, \"ppl\": %.6f, "
               "\"dppl_pct\": %.4f, \"attended\": %.6f, \"bytes_per_token\": %.2f, "
               "\"bytes_high_per_token\": %.2f, \"bytes_low_per_token\": %.2f, "
               "\"f16_bytes_per_token\": %.2f, \"of_f16\": %.6f, ",
               kvq_kv_kind_name(x->kp.kind), set, set[0] ? ", " : "", row->name, row->budget_str,
               x->frac, (unsigned long long)n_pred, ppl0, ppl, 100 * (ppl / ppl0 - 1), att,
               mem->bytes / tok, mem->bytes_high / tok, mem->bytes_low / tok,
               mem->bytes_f16 / tok, mem->bytes / mem->bytes_f16);
        kvr_print_held(r, mem, has_kc, json);
        printf("\"pruned_share\": %.6f}\n", pruned);
        return;
    }
    printf("kv %-12s %-10s %-8s ppl %.4f (full %.4f) %+.3f%%  attended %.2f%%  "
           "%.1f bytes/token (%.1f%% of f16; high %.1f, low %.1f; pruned %.1f%%)\n",
           kvq_kv_kind_name(x->kp.kind), row->name, row->budget_str, ppl, ppl0,
           100 * (ppl / ppl0 - 1), 100 * att, mem->bytes / tok, 100 * mem->bytes / mem->bytes_f16,
           mem->bytes_high / tok, mem->bytes_low / tok, 100 * pruned);
    kvr_print_held(r, mem, has_kc, json);
}

/* One selector x budget row: a retrieval context over a fresh compressed cache. */
static int kvr_row(kvr *x, cli_retrieval *ro, const kvq_codebook_set *rt, const cli_row *row,
                   const kvq_model_config *c, int64_t seq_len, int32_t threads, double ref,
                   int json)
{
    kvq_err e = {0};
    kvq_retrieval *r = NULL;
    kvq_kvcache *kc = NULL;
    kvq_retrieval_params rp = ro->p;
    double nll;
    uint64_t n_pred;
    int rc = 0;
    rp.selector = row->selector;
    rp.budget = row->budget;
    rp.max_tokens = seq_len;
    rp.threads = threads > 0 ? threads : 1;
    rp.prefill_full = 1;
    if (kvq_retrieval_create(c, rt, &rp, &r, &e) ||
        (x->kp.kind != KVQ_KV_F16 &&
         (kvq_kvcache_create(c, &x->kp, &kc, &e) || kvq_retrieval_set_kvcache(r, kc, &e)))) {
        rc = cli_fail(&e);
        goto done;
    }
    const kvq_attn_backend b = kvq_retrieval_backend(r);
    kvq_forward_set_attention(x->f, &b);
    if (kvr_ppl(x, kc, &nll, &n_pred, &e)) {
        rc = cli_fail(&e);
        goto done;
    }
    kvq_kvcache_memory mem;
    memset(&mem, 0, sizeof mem);
    if (kc) {
        kvq_kvcache_memory_get(kc, &mem);
    } else { /* r's f16 rows */
        int64_t tokens = 0;
        for (size_t q = 0; q < x->sl->n; q++)
            tokens += x->sl->off[q + 1] - x->sl->off[q];
        mem.tokens = (double)tokens;
        mem.bytes_f16 = (double)tokens * c->n_layers * c->n_kv_heads * 4.0 * c->head_dim;
        mem.bytes = mem.bytes_high = mem.bytes_f16;
    }
    kvq_retrieval_stats st;
    kvq_retrieval_stats_get(r, &st);
    kvr_print(x, row, ref, nll, n_pred, &mem, &st, c->head_dim, json, r, kc != NULL);
done:
    kvq_forward_set_attention(x->f, NULL);
    kvq_retrieval_free(r);
    kvq_kvcache_free(kc);
    return rc;
}

int cli_eval_kv_retrieval(const cli_kv *o, cli_retrieval *ro, const kvq_model *m,
                          const char *model_path, const char *spec, const kvq_corpus *corpus,
                          const kvq_tokenizer *tok, int64_t seq_len, int64_t max_tokens,
                          int32_t threads, int json, const kvq_callbacks *cb)
{
    const kvq_model_config *c = kvq_model_config_get(m);
    kvq_err e = {0};
    kvq_seq_set sl = {0};
    kvq_codebook_set *rt = NULL;
    cli_row *rows = NULL;
    size_t n_rows = 0;
    kvr x = {.o = o, .sl = &sl, .vocab = c->vocab_size};
    double ref;
    uint64_t n_ref;
    int rc = 0;
    if (o->kind != KVQ_KV_F16) {
        if ((rc = cli_kv_resolve(o, ro->artifact, &x.kp, &x.frac)))
            return rc;
    } else {
        x.kp = kvq_kvcache_params_default();
        x.kp.kind = KVQ_KV_F16;
        x.frac = !isnan(o->prompt_fraction) ? o->prompt_fraction : 0.5;
    }
    x.kp.max_tokens = seq_len;
    x.kp.threads = threads;
    if ((rc = cli_retrieval_open(ro, m, model_path, cb, &rt)) ||
        (rc = cli_retrieval_rows("eval", ro, rt, &rows, &n_rows)))
        goto done;
    if ((rc = cli_kv_seq_forward(m, model_path, corpus, tok, seq_len, max_tokens, threads, cb,
                                 &sl, &x.f, &x.chunk, &x.logits)))
        goto done;
    double t0 = kvq_now();
    if (kvr_ppl(&x, NULL, &ref, &n_ref, &e)) {
        rc = cli_fail(&e);
        goto done;
    }
    if ((rc = cli_kv_reference_done(ref, n_ref, t0, spec, cb)))
        goto done;
    for (size_t i = 0; i < n_rows && !rc; i++) {
        t0 = kvq_now();
        rc = kvr_row(&x, ro, rt, &rows[i], c, seq_len, threads, ref, json);
        kvq_log(cb, KVQ_LOG_INFO, "%s, %s %s: %.2f s", kvq_kv_kind_name(x.kp.kind),
                rows[i].name, rows[i].budget_str, kvq_now() - t0);
    }
done:
    kvq_forward_free(x.f);
    kvq_codebook_set_close(rt);
    free(rows);
    kvq_seq_set_free(&sl);
    free(x.logits);
    return rc;
}
