/* eval_kv.c — `kvq eval --kv leankv|pats`: perplexity over a compressed KV cache
 * (kvq/kvcache.h) against full attention, and the memory the cache held: bytes per
 * token in total and per precision section, as a share of an f16 cache.
 *
 * Parameters come from the options, else from the artifact's profile (the metadata
 * `kvq profile` writes: leankv.alpha_h, leankv.alpha_l, leankv.window, pats.schedule,
 * pats.b_min, pats.b_max, thresholds.prompt_fraction). A parameter that is neither
 * given nor in the artifact is an error naming it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/eval_kv.h"
#include "kvq/perplexity.h"

void cli_kv_init(cli_kv *o)
{
    memset(o, 0, sizeof *o);
    o->kind = KVQ_KV_F16;
    o->alpha_h = o->alpha_l = o->prompt_fraction = NAN;
    o->window = o->b_min = o->b_max = -1;
    o->schedule = -1;
}

void cli_kv_usage(FILE *f)
{
    fprintf(f, "  --kv KIND            the KV cache: f16 (exact, default), leankv, pats or\n"
               "                       leankv+pats (LeanKV over PATS-truncated rows); needs\n"
               "                       --artifact ART (its profile's settings) or the options;\n"
               "                       with --selector(s) or --budget(s): retrieval over it:\n"
               "  --alpha-h X, --alpha-l X   LeanKV thresholds (0 <= alpha_l <= alpha_h)\n"
               "  --kv-window N        LeanKV recent window (default: the artifact's, else 64)\n"
               "  --pats-schedule S    old-heavy | new-heavy | middle-heavy\n"
               "  --pats-b MIN:MAX     PATS truncated bits, 0 <= MIN <= MAX <= 10\n"
               "  --kv-prompt F        each sequence's prompt share, 0..1 (default: the\n"
               "                       artifact's thresholds.prompt_fraction, else 0.5)\n");
}

int cli_kv_opt(const char *cmd, cli_kv *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    int rc = 0;
    if (!strcmp(a, "--kv")) {
        if (!val || kvq_kv_kind_parse(val, &o->kind))
            return cli_failf(2, "%s: --kv must be f16, leankv, pats or leankv+pats", cmd);
        o->given = 1;
    } else if (!strcmp(a, "--alpha-h")) {
        rc = cli_opt_f64(cmd, a, val, 0, 1e6, &o->alpha_h);
    } else if (!strcmp(a, "--alpha-l")) {
        rc = cli_opt_f64(cmd, a, val, 0, 1e6, &o->alpha_l);
    } else if (!strcmp(a, "--kv-window")) {
        rc = cli_opt_i64(cmd, a, val, 0, 1 << 20, &o->window);
    } else if (!strcmp(a, "--kv-prompt")) {
        rc = cli_opt_f64(cmd, a, val, 0, 1, &o->prompt_fraction);
    } else if (!strcmp(a, "--pats-schedule")) {
        static const char *const names[] = {"old-heavy", "new-heavy", "middle-heavy"};
        o->schedule = -1;
        for (int32_t k = 0; val && k < 3; k++)
            if (!strcmp(val, names[k]))
                o->schedule = k;
        if (o->schedule < 0)
            return cli_failf(2, "%s: --pats-schedule must be old-heavy, new-heavy or "
                             "middle-heavy", cmd);
    } else if (!strcmp(a, "--pats-b")) {
        long long lo, hi;
        char tail;
        if (!val || sscanf(val, "%lld:%lld%c", &lo, &hi, &tail) != 2 || lo < 0 || lo > hi ||
            hi > 10)
            return cli_failf(2, "%s: --pats-b must be MIN:MAX with 0 <= MIN <= MAX <= 10 "
                             "(got '%s')", cmd, val ? val : "");
        o->b_min = lo, o->b_max = hi;
    } else {
        return -1;
    }
    (*i)++;
    return rc;
}

/* A number of the artifact's metadata, or NaN. */
static double meta_num(const kvq_st *st, const char *key)
{
    return st ? kvq_st_meta_num(st, key) : NAN;
}

/* The cache parameters: the options, else the artifact's. Prints and returns 1 (2 for
 * a usage error) when one is missing. */
static int resolve(const cli_kv *o, const char *artifact, const kvq_st *st,
                   kvq_kvcache_params *p, double *frac)
{
    const char *what = kvq_kv_kind_name(o->kind);
    const char *src = artifact ? artifact : "options", *sep = artifact ? ": " : "";
    if (!artifact)
        src = "";
    *p = kvq_kvcache_params_default();
    p->kind = o->kind;
    *frac = !isnan(o->prompt_fraction) ? o->prompt_fraction
                                       : !isnan(meta_num(st, KVQ_META_THR_PROMPT_FRACTION))
                                           ? meta_num(st, KVQ_META_THR_PROMPT_FRACTION)
                                           : 0.5;
    if (!(*frac >= 0 && *frac < 1))
        return cli_failf(1, "%s%sprompt fraction %g out of range [0, 1)", src, sep, *frac);
    if (o->kind != KVQ_KV_PATS) { /* leankv, leankv+pats */
        p->alpha_h = !isnan(o->alpha_h) ? o->alpha_h : meta_num(st, KVQ_META_LEANKV_ALPHA_H);
        p->alpha_l = !isnan(o->alpha_l) ? o->alpha_l : meta_num(st, KVQ_META_LEANKV_ALPHA_L);
        const double w = o->window >= 0 ? (double)o->window : meta_num(st, KVQ_META_LEANKV_WINDOW);
        p->window = isnan(w) ? 64 : (int32_t)w;
        if (isnan(p->alpha_h) || isnan(p->alpha_l))
            return cli_failf(artifact ? 1 : 2, "%s%s--kv %s needs %s (run kvq profile), or "
                             "--alpha-h and --alpha-l", src, sep, what,
                             artifact ? "leankv.alpha_h and leankv.alpha_l in the artifact"
                                      : "--artifact with a profile");
        const char *bits = st ? kvq_st_meta_get(st, KVQ_META_LEANKV_BITS) : NULL;
        if (bits && strcmp(bits, "K8V4,K4V2"))
            return cli_failf(1, "%s%sleankv.bits %s: the runtime's cache is K8V4,K4V2 only", src,
                             sep, bits);
        if (!isnan(w) && !(w >= 0 && w <= (1 << 20)))
            return cli_failf(1, "%s%sleankv.window %g out of range", src, sep, w);
    }
    if (o->kind != KVQ_KV_LEANKV) { /* pats, leankv+pats */
        const char *sched = st ? kvq_st_meta_get(st, KVQ_META_PATS_SCHEDULE) : NULL;
        const char *dt = st ? kvq_st_meta_get(st, KVQ_META_PATS_DTYPE) : NULL;
        if (dt && strcmp(dt, "f16"))
            return cli_failf(1, "%s%spats.dtype %s: the runtime's PATS cache is f16 only", src,
                             sep, dt);
        static const char *const names[] = {"old-heavy", "new-heavy", "middle-heavy"};
        p->schedule = o->schedule;
        for (int32_t k = 0; p->schedule < 0 && sched && k < 3; k++)
            if (!strcmp(sched, names[k]))
                p->schedule = k;
        const double lo = o->b_min >= 0 ? (double)o->b_min : meta_num(st, KVQ_META_PATS_B_MIN);
        const double hi = o->b_max >= 0 ? (double)o->b_max : meta_num(st, KVQ_META_PATS_B_MAX);
        if (p->schedule < 0 || isnan(lo) || isnan(hi))
            return cli_failf(artifact ? 1 : 2, "%s%s--kv %s needs %s, or --pats-schedule "
                             "and --pats-b", src, sep, kvq_kv_kind_name(o->kind),
                             sched && p->schedule < 0 ? "a known pats.schedule in the artifact"
                             : artifact ? "pats.schedule, pats.b_min and pats.b_max in the "
                                          "artifact (run kvq profile)"
                                        : "--artifact with a profile");
        if (!(lo >= 0 && lo <= hi && hi <= 10) || lo != floor(lo) || hi != floor(hi))
            return cli_failf(1, "%s%spats.b_min %g, pats.b_max %g out of range (0 <= b_min <= "
                             "b_max <= 10, integers)", src, sep, lo, hi);
        p->b_min = (int32_t)lo;
        p->b_max = (int32_t)hi;
    }
    return 0;
}

int cli_kv_resolve(const cli_kv *o, const char *artifact, kvq_kvcache_params *p, double *frac)
{
    kvq_err e = {0};
    kvq_artifact *a = NULL;
    if (o->kind == KVQ_KV_F16)
        return cli_failf(2, "--kv f16 is the exact cache (no compressed cache to make)");
    if (artifact && kvq_artifact_open(artifact, &a, &e))
        return cli_fail(&e);
    int rc = resolve(o, artifact, a ? kvq_artifact_payload(a) : NULL, p, frac);
    kvq_artifact_close(a);
    return rc;
}

/* ---- the run ---------------------------------------------------------------------- */

typedef struct kv_begin {
    kvq_kvcache *kc; /* NULL for the reference */
    double frac;
    kvq_err err;
} kv_begin;

/* kvq_ppl_begin_fn: the prompt of a sequence of n tokens, laid out in the cache. */
static int64_t begin_seq(void *user, int64_t n)
{
    kv_begin *b = user;
    const int64_t P = (int64_t)floor(b->frac * (double)n);
    if (b->kc)
        kvq_kvcache_begin(b->kc, P, n, &b->err); /* a failure: the first attend says so */
    return P;
}

static void print_result(const kvq_kvcache_params *p, double frac, double ref, double nll,
                         uint64_t n_pred, const kvq_kvcache_memory *m, int32_t d, int json)
{
    const double tok = m->tokens > 0 ? m->tokens : 1, ppl0 = exp(ref), ppl = exp(nll);
    const double cells = m->bytes_f16 / (4.0 * d); /* tokens x layers x KV heads */
    const double pruned = cells > 0 ? m->pruned / cells : 0;
    static const char *const sched[] = {"old-heavy", "new-heavy", "middle-heavy"};
    if (json) {
        char set[200];
        cli_kv_settings_json(p, set, sizeof set);
        printf("{\"kv\": \"%s\", %s, \"prompt_fraction\": %g, "
               "\"predicted\": %llu, \"ppl_full\": %.6f, \"ppl\": %.6f, \"dppl_pct\": %.4f, "
               "\"bytes_per_token\": %.2f, \"bytes_high_per_token\": %.2f, "
               "\"bytes_low_per_token\": %.2f, \"bytes_exact_per_token\": %.2f, "
               "\"f16_bytes_per_token\": %.2f, \"of_f16\": %.6f, \"pruned_share\": %.6f}\n",
               kvq_kv_kind_name(p->kind), set, frac,
               (unsigned long long)n_pred, ppl0, ppl, 100 * (ppl / ppl0 - 1), m->bytes / tok,
               m->bytes_high / tok, m->bytes_low / tok, m->bytes_exact / tok,
               m->bytes_f16 / tok, m->bytes / m->bytes_f16, pruned);
        return;
    }
    if (p->kind != KVQ_KV_PATS)
        printf("kv          %s alpha_h %g alpha_l %g window %d (K8V4 / K4V2)",
               kvq_kv_kind_name(p->kind), p->alpha_h, p->alpha_l, (int)p->window);
    else
        printf("kv          pats");
    if (p->kind != KVQ_KV_LEANKV)
        printf("%s %s b %d..%d", p->kind == KVQ_KV_PATS ? "" : ", truncated by", sched[p->schedule],
               (int)p->b_min, (int)p->b_max);
    printf("\n");
    printf("prompt      first %.3g of each sequence; %llu tokens predicted after it\n", frac,
           (unsigned long long)n_pred);
    printf("perplexity  %.4f (full attention %.4f): %+.3f%%\n", ppl, ppl0,
           100 * (ppl / ppl0 - 1));
    printf("memory      %.1f bytes/token (f16 %.1f): %.1f%% of f16\n", m->bytes / tok,
           m->bytes_f16 / tok, 100 * m->bytes / m->bytes_f16);
    if (p->kind != KVQ_KV_PATS)
        printf("sections    high %.1f, low %.1f, exact %.1f bytes/token; pruned %.1f%% of "
               "(token, layer, KV head)\n", m->bytes_high / tok, m->bytes_low / tok,
               m->bytes_exact / tok, 100 * pruned);
}

void cli_kv_settings_json(const kvq_kvcache_params *p, char *out, size_t size)
{
    static const char *const sched[] = {"old-heavy", "new-heavy", "middle-heavy"};
    int n = 0;
    out[0] = 0;
    if (p->kind != KVQ_KV_PATS && p->kind != KVQ_KV_F16)
        n = snprintf(out, size, "\"alpha_h\": %g, \"alpha_l\": %g, \"window\": %d",
                     p->alpha_h, p->alpha_l, (int)p->window);
    if ((p->kind == KVQ_KV_PATS || p->kind == KVQ_KV_LEANKV_PATS) && n >= 0 && (size_t)n < size)
        snprintf(out + n, size - (size_t)n, "%s\"schedule\": \"%s\", \"b_min\": %d, \"b_max\": %d",
                 n ? ", " : "", sched[p->schedule], (int)p->b_min, (int)p->b_max);
}

/* Perplexity over s with f's current attention; mean NLL and the count. */
static kvq_status ppl_run(kvq_forward *f, const kvq_seq_set *s, int32_t chunk, int32_t vocab,
                          float *logits, kv_begin *b, double *nll, uint64_t *n_pred,
                          kvq_err *err)
{
    kvq_nll_sum sum = {0};
    kvq_status st = kvq_perplexity_set(f, s, chunk, vocab, logits, begin_seq, b, &sum, err);
    *nll = sum.n_pred ? sum.nll / (double)sum.n_pred : NAN;
    *n_pred = sum.n_pred;
    return st;
}

int cli_kv_seq_forward(const kvq_model *m, const char *model_path, const kvq_corpus *corpus,
                       const kvq_tokenizer *tok, int64_t seq_len, int64_t max_tokens,
                       int32_t threads, const kvq_callbacks *cb, kvq_seq_set *sl,
                       kvq_forward **f, int32_t *chunk, float **logits)
{
    const kvq_model_config *c = kvq_model_config_get(m);
    kvq_err e = {0};
    kvq_seq_params sp;
    kvq_seq_params_default(&sp);
    kvq_seq_params_model_bos(&sp, tok);
    sp.seq_len = (uint32_t)seq_len;
    sp.max_tokens = (uint64_t)max_tokens;
    kvq_forward_params fp = kvq_forward_params_default();
    fp.threads = threads;
    fp.max_tokens = seq_len;
    fp.cb = *cb;
    fp.cb.progress = NULL;
    if (kvq_seq_set_collect(corpus, tok, &sp, cb, sl, NULL, &e) ||
        kvq_forward_create(m, &fp, f, &e))
        return cli_fail(&e);
    *chunk = fp.chunk;
    if (!(*logits = malloc(sizeof(float) * (size_t)fp.chunk * (size_t)c->vocab_size)))
        return cli_failf(1, "%s: out of memory", model_path);
    return 0;
}

int cli_kv_reference_done(double ref, uint64_t n_ref, double t0, const char *spec,
                          const kvq_callbacks *cb)
{
    if (n_ref == 0)
        return cli_failf(1, "%s: no token to predict (sequences too short)", spec);
    kvq_log(cb, KVQ_LOG_INFO, "full attention: perplexity %.4f (%.2f s)", exp(ref),
            kvq_now() - t0);
    return 0;
}

int cli_eval_kv(const cli_kv *o, const char *artifact, const kvq_model *m,
                const char *model_path, const char *spec, const kvq_corpus *corpus,
                const kvq_tokenizer *tok, int64_t seq_len, int64_t max_tokens, int32_t threads,
                int json, const kvq_callbacks *cb)
{
    const kvq_model_config *c = kvq_model_config_get(m);
    kvq_err e = {0};
    kvq_seq_set sl = {0};
    kvq_forward *f = NULL;
    kvq_kvcache *kc = NULL;
    float *logits = NULL;
    kvq_kvcache_params p;
    double frac, ref, nll;
    uint64_t n_ref, n_pred;
    int rc;
    if ((rc = cli_kv_resolve(o, artifact, &p, &frac)))
        return rc;
    p.max_tokens = seq_len;
    p.threads = threads;
    int32_t chunk;
    if ((rc = cli_kv_seq_forward(m, model_path, corpus, tok, seq_len, max_tokens, threads, cb,
                                 &sl, &f, &chunk, &logits)))
        goto done;
    if (kvq_kvcache_create(c, &p, &kc, &e)) {
        rc = cli_fail(&e);
        goto done;
    }
    kv_begin b0 = {.kc = NULL, .frac = frac}, b1 = {.kc = kc, .frac = frac};
    double t0 = kvq_now();
    if (ppl_run(f, &sl, chunk, c->vocab_size, logits, &b0, &ref, &n_ref, &e)) {
        rc = cli_fail(&e);
        goto done;
    }
    if ((rc = cli_kv_reference_done(ref, n_ref, t0, spec, cb)))
        goto done;
    const kvq_attn_backend kb = kvq_kvcache_backend(kc);
    kvq_forward_set_attention(f, &kb);
    t0 = kvq_now();
    if (ppl_run(f, &sl, chunk, c->vocab_size, logits, &b1, &nll, &n_pred, &e)) {
        rc = cli_fail(&e);
        goto done;
    }
    kvq_log(cb, KVQ_LOG_INFO, "%s: perplexity %.4f (%.2f s)", kvq_kv_kind_name(p.kind), exp(nll),
            kvq_now() - t0);
    kvq_kvcache_memory mem;
    kvq_kvcache_memory_get(kc, &mem);
    print_result(&p, frac, ref, nll, n_pred, &mem, c->head_dim, json);
done:
    kvq_forward_free(f);
    kvq_kvcache_free(kc);
    kvq_seq_set_free(&sl);
    free(logits);
    return rc;
}
