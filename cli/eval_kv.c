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
#include "cli/retrieval_opts.h"
#include "kvq/perplexity.h"

void cli_kv_init(cli_kv *o)
{
    memset(o, 0, sizeof *o);
    o->kind = KVQ_KV_F16;
    o->alpha_h = o->alpha_l = o->prompt_fraction = NAN;
    o->window = o->b_min = o->b_max = -1;
    o->schedule = -1;
}

static void kv_usage(FILE *f, int list)
{
    if (list)
        fprintf(f, "  --kv LIST            the KV cache kinds, comma-separated, or all (every kind\n"
                   "                       whose settings the artifact or the options give):\n"
                   "                       f16 (the exact rows), leankv, pats, leankv+pats\n"
                   "                       (LeanKV over PATS-truncated rows); the compressed\n"
                   "                       ones need --artifact ART (its profile) or the options.\n"
                   "                       One kind: full attention over it (its perplexity and\n"
                   "                       memory), or with --selectors/--budgets retrieval over\n"
                   "                       it, one row per selector x budget. A list: one table,\n"
                   "                       each kind alone (full attention over it; f16's row is\n"
                   "                       the reference) and with each selector x budget:\n"
                   "                       kind, attention, reference, predicted, ppl, d_ppl,\n"
                   "                       attended share, bytes/token, of f16, high/low, pruned,\n"
                   "                       held/tok (retrieval: the cache's bytes plus the\n"
                   "                       context's, kvq_retrieval_held_get)\n"
                   "                       (--json: one object with \"references\" and \"rows\").\n"
                   "                       References: full attention over the exact rows, once\n"
                   "                       per command in each schedule: \"chunks\" (the prompt\n"
                   "                       and the rest in chunks, as the alone rows run) and\n"
                   "                       \"decode\" (an exact prefill, then one token per call,\n"
                   "                       as the retrieval rows run)\n");
    else
        fprintf(f, "  --kv KIND            the KV cache: f16 (exact, default), leankv, pats or\n"
                   "                       leankv+pats (LeanKV over PATS-truncated rows); needs\n"
                   "                       --artifact ART (its profile's settings) or the options;\n"
                   "                       with --selector(s) or --budget(s): retrieval over it:\n");
    fprintf(f, "  --alpha-h X, --alpha-l X   LeanKV thresholds (0 <= alpha_l <= alpha_h)\n"
               "  --kv-window N        LeanKV recent window (default: the artifact's, else 64)\n"
               "  --pats-schedule S    old-heavy | new-heavy | middle-heavy\n"
               "  --pats-b MIN:MAX     PATS truncated bits, 0 <= MIN <= MAX <= 10\n"
               "  --kv-prompt F        each sequence's prompt share, 0..1 (default: the\n"
               "                       artifact's thresholds.prompt_fraction, else 0.5)\n");
}

void cli_kv_usage(FILE *f) { kv_usage(f, 0); }
void cli_kv_usage_list(FILE *f) { kv_usage(f, 1); }

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

int cli_kv_opt_list(const char *cmd, cli_kv *o, int argc, char **argv, int *i)
{
    const char *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (strcmp(argv[*i], "--kv"))
        return cli_kv_opt(cmd, o, argc, argv, i);
    if (!val || !*val)
        return cli_failf(2, "%s: --kv needs a value: a cache kind (f16, leankv, pats, "
                         "leankv+pats), a list of them separated by commas, or all", cmd);
    o->n_kinds = 0;
    o->all = !strcmp(val, "all");
    if (o->all) {
        for (int32_t k = 0; k < 4; k++)
            o->kinds[o->n_kinds++] = (kvq_kv_kind)k;
    }
    for (const char *p = val; !o->all && *p;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        char name[32];
        kvq_kv_kind k;
        snprintf(name, sizeof name, "%.*s", (int)(len < sizeof name ? len : sizeof name - 1), p);
        if (!len || len >= sizeof name || kvq_kv_kind_parse(name, &k))
            return cli_failf(2, "%s: --kv: unknown cache kind '%.*s' (f16, leankv, pats, "
                             "leankv+pats, a list of them separated by commas, or all)", cmd,
                             (int)len, p);
        for (int32_t j = 0; j < o->n_kinds; j++)
            if (o->kinds[j] == k)
                return cli_failf(2, "%s: --kv: %s is listed twice", cmd, name);
        o->kinds[o->n_kinds++] = k;
        p += len + (end != NULL);
        if (end && !*p)
            return cli_failf(2, "%s: --kv: unknown cache kind '' (the list ends with a comma)",
                             cmd);
    }
    o->kind = o->kinds[0];
    o->list = o->all || o->n_kinds > 1;
    o->given = 1;
    (*i)++;
    return 0;
}

/* A number of the artifact's metadata, or NaN. */
static double meta_num(const kvq_st *st, const char *key)
{
    return st ? kvq_st_meta_num(st, key) : NAN;
}

/* The cache parameters: the options, else the artifact's. Prints and returns 1 (2 for
 * a usage error) when one is missing. */
static int resolve(const cli_kv *o, kvq_kv_kind kind, const char *artifact, const kvq_st *st,
                   kvq_kvcache_params *p, double *frac)
{
    const char *what = kvq_kv_kind_name(kind);
    const char *src = artifact ? artifact : "options", *sep = artifact ? ": " : "";
    if (!artifact)
        src = "";
    *p = kvq_kvcache_params_default();
    p->kind = kind;
    *frac = !isnan(o->prompt_fraction) ? o->prompt_fraction
                                       : !isnan(meta_num(st, KVQ_META_THR_PROMPT_FRACTION))
                                           ? meta_num(st, KVQ_META_THR_PROMPT_FRACTION)
                                           : 0.5;
    if (!(*frac >= 0 && *frac < 1))
        return cli_failf(1, "%s%sprompt fraction %g out of range [0, 1)", src, sep, *frac);
    if (kind == KVQ_KV_F16)
        return 0;
    if (kind != KVQ_KV_PATS) { /* leankv, leankv+pats */
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
    if (kind != KVQ_KV_LEANKV) { /* pats, leankv+pats */
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
                             "and --pats-b", src, sep, what,
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
    int rc = resolve(o, o->kind, artifact, a ? kvq_artifact_payload(a) : NULL, p, frac);
    kvq_artifact_close(a);
    return rc;
}

/* ---- the rows -------------------------------------------------------------------- */

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

void cli_kv_row_print(const cli_kv_row *r, int32_t d, int style, int json)
{
    const kvq_kvcache_params *p = &r->kp;
    const kvq_kvcache_memory *m = &r->mem;
    const double tok = m->tokens > 0 ? m->tokens : 1, ppl0 = exp(r->ref), ppl = exp(r->nll);
    const double cells = m->bytes_f16 / (4.0 * d); /* tokens x layers x KV heads */
    const double pruned = cells > 0 ? m->pruned / cells : 0, dppl = 100 * (ppl / ppl0 - 1);
    const char *kind = kvq_kv_kind_name(p->kind);
    static const char *const sched[] = {"old-heavy", "new-heavy", "middle-heavy"};
    char set[200];
    cli_kv_settings_json(p, set, sizeof set);
    if (json) { /* the fields of today's single-kind objects; a table's row has them all */
        printf("{\"kv\": \"%s\", %s%s", kind, set, set[0] ? ", " : "");
        if (style == CLI_KV_TABLE)
            printf("\"attention\": \"%s\", \"reference\": \"%s\", ", r->sel ? "retrieval" : "full",
                   r->sel ? "decode" : "chunks");
        if (r->sel)
            printf("\"selector\": \"%s\", \"budget\": \"%s\", ", r->sel->name, r->sel->budget_str);
        printf("\"prompt_fraction\": %g, \"predicted\": %llu, \"ppl_full\": %.6f, \"ppl\": %.6f, "
               "\"dppl_pct\": %.4f, ", r->frac, (unsigned long long)r->n_pred, ppl0, ppl, dppl);
        if (style != CLI_KV_ALONE)
            printf("\"attended\": %.6f, ", r->attended);
        printf("\"bytes_per_token\": %.2f, \"bytes_high_per_token\": %.2f, "
               "\"bytes_low_per_token\": %.2f, ", m->bytes / tok, m->bytes_high / tok,
               m->bytes_low / tok);
        if (style != CLI_KV_RETR)
            printf("\"bytes_exact_per_token\": %.2f, ", m->bytes_exact / tok);
        printf("\"f16_bytes_per_token\": %.2f, \"of_f16\": %.6f, \"pruned_share\": %.6f",
               m->bytes_f16 / tok, m->bytes / m->bytes_f16, pruned);
        if (!isnan(r->held))
            printf(", \"held_bytes_per_token\": %.2f, \"held_of_f16\": %.6f, "
                   "\"context_bytes_per_token\": %.2f, \"context_rows\": %.2f, "
                   "\"context_selector\": %.2f, \"context_positions\": %.2f, "
                   "\"context_rope\": %.2f, \"context_scratch_bytes\": %.0f", r->held,
                   r->held / (m->bytes_f16 / tok), r->ctx.total, r->ctx.rows, r->ctx.selector,
                   r->ctx.positions, r->ctx.rope, r->ctx.scratch);
        if (style == CLI_KV_TABLE)
            printf(", \"seconds\": %.3f}", r->seconds);
        else
            printf("}\n");
        return;
    }
    if (style == CLI_KV_TABLE || style == CLI_KV_RETR) {
        char att[80];
        snprintf(att, sizeof att, "%s%s%s", r->sel ? r->sel->name : "full", r->sel ? " " : "",
                 r->sel ? r->sel->budget_str : "");
        if (style == CLI_KV_TABLE)
            printf("%-12s %-16s %-6s %9llu %10.4f %10.4f %+8.3f%% %8.2f%% %9.1f %6.1f%% "
                   "%8.1f/%-8.1f %6.1f%%", kind, att, r->sel ? "decode" : "chunks",
                   (unsigned long long)r->n_pred, ppl, ppl0, dppl, 100 * r->attended,
                   m->bytes / tok, 100 * m->bytes / m->bytes_f16, m->bytes_high / tok,
                   m->bytes_low / tok, 100 * pruned);
        else
            printf("kv %-12s %-10s %-8s ppl %.4f (full %.4f) %+.3f%%  attended %.2f%%  "
                   "%.1f bytes/token (%.1f%% of f16; high %.1f, low %.1f; pruned %.1f%%)", kind,
                   r->sel->name, r->sel->budget_str, ppl, ppl0, dppl, 100 * r->attended,
                   m->bytes / tok, 100 * m->bytes / m->bytes_f16, m->bytes_high / tok,
                   m->bytes_low / tok, 100 * pruned);
        if (style == CLI_KV_TABLE && isnan(r->held))
            printf(" %9s", "-");
        else if (style == CLI_KV_TABLE)
            printf(" %9.1f", r->held);
        else if (!isnan(r->held))
            printf("\n    held %.1f bytes/token (%.1f%% of f16): context %.1f (rows %.1f, "
                   "selector %.1f, positions %.1f, rope %.1f); context scratch %.0f bytes",
                   r->held, 100 * r->held / (m->bytes_f16 / tok), r->ctx.total, r->ctx.rows,
                   r->ctx.selector, r->ctx.positions, r->ctx.rope, r->ctx.scratch);
        printf("\n");
        return;
    }
    if (p->kind != KVQ_KV_PATS)
        printf("kv          %s alpha_h %g alpha_l %g window %d (K8V4 / K4V2)", kind, p->alpha_h,
               p->alpha_l, (int)p->window);
    else
        printf("kv          pats");
    if (p->kind != KVQ_KV_LEANKV)
        printf("%s %s b %d..%d", p->kind == KVQ_KV_PATS ? "" : ", truncated by", sched[p->schedule],
               (int)p->b_min, (int)p->b_max);
    printf("\n");
    printf("prompt      first %.3g of each sequence; %llu tokens predicted after it\n", r->frac,
           (unsigned long long)r->n_pred);
    printf("perplexity  %.4f (full attention %.4f): %+.3f%%\n", ppl, ppl0, dppl);
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

/* kvq_observe_fn: a row's progress, counted at layer 0 (tokens, or one-token calls). */
static kvq_status observe(void *user, const kvq_attn_call *call, kvq_err *err)
{
    cli_kv_run *x = user;
    if (call->layer != 0 || (x->decode && call->n != 1))
        return KVQ_OK;
    x->done += (uint64_t)call->n;
    if (kvq_progress(x->cb, x->what, x->done < x->total ? x->done : x->total, x->total))
        return kvq_err_set(err, KVQ_E_CANCELLED, "eval: cancelled");
    return KVQ_OK;
}

void cli_kv_progress(cli_kv_run *x, const char *what, int decode, uint64_t total)
{
    snprintf(x->what, sizeof x->what, "%s", what);
    x->decode = decode;
    x->done = 0;
    x->total = total;
}

/* Mean NLL over x's sequences, the prompt and the rest in chunks, with the forward's
 * attention (kc, or NULL, laid out per sequence), and the count. */
static kvq_status chunks_ppl(cli_kv_run *x, kvq_kvcache *kc, double *nll, uint64_t *n_pred,
                             kvq_err *err)
{
    kv_begin b = {.kc = kc, .frac = x->frac};
    kvq_nll_sum sum = {0};
    kvq_status st = kvq_perplexity_set(x->f, &x->sl, x->chunk, x->c->vocab_size, x->logits,
                                       begin_seq, &b, &sum, err);
    *nll = sum.n_pred ? sum.nll / (double)sum.n_pred : NAN;
    *n_pred = sum.n_pred;
    return st;
}

/* The sequences of corpus (seq_len tokens each, max_tokens in all, the tokenizer's BOS)
 * and a forward pass over m (threads, max_tokens seq_len, cb without progress, the
 * progress observer) with logits for one chunk. 0, else prints the error and returns
 * the exit code; what was made is left for the caller to free either way. */
static int run_open(cli_kv_run *x, const kvq_model *m, const char *model_path,
                    const kvq_corpus *corpus, const kvq_tokenizer *tok, int64_t max_tokens)
{
    kvq_err e = {0};
    kvq_seq_params sp;
    kvq_seq_params_default(&sp);
    kvq_seq_params_model_bos(&sp, tok);
    sp.seq_len = (uint32_t)x->seq_len;
    sp.max_tokens = (uint64_t)max_tokens;
    kvq_forward_params fp = kvq_forward_params_default();
    fp.threads = x->threads;
    fp.max_tokens = x->seq_len;
    fp.cb = *x->cb;
    fp.cb.progress = NULL;
    if (kvq_seq_set_collect(corpus, tok, &sp, x->cb, &x->sl, NULL, &e) ||
        kvq_forward_create(m, &fp, &x->f, &e))
        return cli_fail(&e);
    kvq_forward_set_observer(x->f, observe, x);
    x->chunk = fp.chunk;
    if (!(x->logits = malloc(sizeof(float) * (size_t)fp.chunk * (size_t)x->c->vocab_size)))
        return cli_failf(1, "%s: out of memory", model_path);
    return 0;
}

void cli_kv_f16_memory(const cli_kv_run *x, kvq_kvcache_memory *mem)
{
    const kvq_model_config *c = x->c;
    memset(mem, 0, sizeof *mem);
    mem->tokens = (double)x->sl.n_ids;
    mem->bytes_f16 = mem->tokens * c->n_layers * c->n_kv_heads * 4.0 * c->head_dim;
    mem->bytes = mem->bytes_high = mem->bytes_f16;
}

/* The alone row of r->kp: full attention over a fresh compressed cache, in chunks
 * (f16: the exact rows, the reference itself). dry: only makes the cache. */
static int alone_row(cli_kv_run *x, cli_kv_row *r, int dry)
{
    kvq_err e = {0};
    kvq_kvcache *kc = NULL;
    if (r->kp.kind == KVQ_KV_F16) {
        cli_kv_f16_memory(x, &r->mem);
        return 0;
    }
    if (kvq_kvcache_create(x->c, &r->kp, &kc, &e))
        return cli_fail(&e);
    int rc = 0;
    if (!dry) {
        const kvq_attn_backend kb = kvq_kvcache_backend(kc);
        kvq_forward_set_attention(x->f, &kb);
        if (chunks_ppl(x, kc, &r->nll, &r->n_pred, &e))
            rc = cli_fail(&e);
        kvq_kvcache_memory_get(kc, &r->mem);
        kvq_forward_set_attention(x->f, NULL);
    }
    kvq_kvcache_free(kc);
    return rc;
}

/* Why kind k cannot run with o's options and the artifact's metadata st (NULL: it can):
 * the setting missing (--kv all leaves such a kind out). */
static const char *kind_missing(const cli_kv *o, const kvq_st *st, kvq_kv_kind k)
{
    if (k == KVQ_KV_LEANKV || k == KVQ_KV_LEANKV_PATS) {
        if (isnan(o->alpha_h) && isnan(meta_num(st, KVQ_META_LEANKV_ALPHA_H)))
            return "neither leankv.alpha_h in the artifact nor --alpha-h";
        if (isnan(o->alpha_l) && isnan(meta_num(st, KVQ_META_LEANKV_ALPHA_L)))
            return "neither leankv.alpha_l in the artifact nor --alpha-l";
    }
    if (k == KVQ_KV_PATS || k == KVQ_KV_LEANKV_PATS) {
        if (o->schedule < 0 && !(st && kvq_st_meta_get(st, KVQ_META_PATS_SCHEDULE)))
            return "neither pats.schedule in the artifact nor --pats-schedule";
        if (o->b_min < 0 && isnan(meta_num(st, KVQ_META_PATS_B_MIN)))
            return "neither pats.b_min in the artifact nor --pats-b";
        if (o->b_max < 0 && isnan(meta_num(st, KVQ_META_PATS_B_MAX)))
            return "neither pats.b_max in the artifact nor --pats-b";
    }
    return NULL;
}

/* The kinds of o (--kv all: those whose settings are there, the others logged) with
 * their settings into kp [4], *n_kp of them, and the prompt share. 0, else the error is
 * printed and the exit code returned. */
static int plan_kinds(const cli_kv *o, const char *artifact, const cli_kv_run *x,
                      kvq_kvcache_params *kp, int *n_kp, double *frac)
{
    kvq_err e = {0};
    kvq_artifact *a = NULL;
    const kvq_kv_kind one = o->kind;
    const kvq_kv_kind *kinds = o->n_kinds ? o->kinds : &one;
    const int n = o->n_kinds ? o->n_kinds : 1;
    if (artifact && kvq_artifact_open(artifact, &a, &e))
        return cli_fail(&e);
    const kvq_st *st = a ? kvq_artifact_payload(a) : NULL;
    int rc = 0;
    *n_kp = 0;
    for (int i = 0; i < n && !rc; i++) {
        const char *miss = o->all ? kind_missing(o, st, kinds[i]) : NULL;
        if (miss) {
            kvq_log(x->cb, KVQ_LOG_INFO, "--kv all: %s left out (%s)",
                    kvq_kv_kind_name(kinds[i]), miss);
            continue;
        }
        if (!(rc = resolve(o, kinds[i], artifact, st, &kp[*n_kp], frac))) {
            kp[*n_kp].max_tokens = x->seq_len;
            kp[*n_kp].threads = x->threads;
            (*n_kp)++;
        }
    }
    kvq_artifact_close(a);
    return rc;
}

/* The references the rows need (full attention over the exact rows: "chunks" for the
 * alone rows, "decode" for the retrieval ones), each computed once, into ref [2] and
 * every row's ref. 0, else the error is printed and the exit code returned. */
static int references(cli_kv_run *x, cli_kv_row *rows, size_t n_rows, const char *spec,
                      cli_kv_row ref[2])
{
    static const char *const name[] = {"chunks", "decode"};
    int need[2] = {0, 0}, rc = 0;
    kvq_err e = {0};
    for (size_t i = 0; i < n_rows; i++)
        need[rows[i].sel != NULL] = 1;
    for (int s = 0; s < 2 && !rc; s++) {
        if (!need[s])
            continue;
        char what[96];
        snprintf(what, sizeof what, "eval: reference (%s)", name[s]);
        cli_kv_progress(x, what, s, s ? cli_kv_decode_steps(x) : (uint64_t)x->sl.n_ids);
        const double t0 = kvq_now();
        if (s ? cli_kv_decode_ppl(x, NULL, &ref[s].nll, &ref[s].n_pred, &e)
              : chunks_ppl(x, NULL, &ref[s].nll, &ref[s].n_pred, &e))
            return cli_fail(&e);
        ref[s].seconds = kvq_now() - t0;
        if (ref[s].n_pred == 0)
            return cli_failf(1, "%s: no token to predict (sequences too short)", spec);
        kvq_log(x->cb, KVQ_LOG_INFO, "full attention (reference %s): perplexity %.4f (%.2f s)",
                name[s], exp(ref[s].nll), ref[s].seconds);
    }
    for (size_t i = 0; i < n_rows; i++)
        rows[i].ref = ref[rows[i].sel != NULL].nll;
    return 0;
}

/* The head of a --kv LIST table: text (the settings and the references) or the JSON
 * object's members before its rows. */
static void table_head(const cli_kv_run *x, const kvq_kvcache_params *kp, int n_kp,
                       const cli_kv_row ref[2], const char *model_path, const char *spec,
                       int json)
{
    static const char *const name[] = {"chunks", "decode"};
    static const char *const how[] = {"the prompt and the rest in chunks, as the full rows",
                                      "an exact prefill, then one token per call, as the "
                                      "retrieval rows"};
    if (json) {
        cli_eval_json_head(model_path, spec);
        printf(", \"seq_len\": %lld, \"sequences\": %llu, \"tokens\": %lld, "
               "\"prompt_fraction\": %g, \"references\": {", (long long)x->seq_len,
               (unsigned long long)x->sl.n, (long long)x->sl.n_ids, x->frac);
        for (int s = 0, k = 0; s < 2; s++)
            if (ref[s].n_pred)
                printf("%s\"%s\": {\"ppl\": %.6f, \"predicted\": %llu, \"seconds\": %.3f}",
                       k++ ? ", " : "", name[s], exp(ref[s].nll),
                       (unsigned long long)ref[s].n_pred, ref[s].seconds);
        printf("}, \"rows\": [");
        return;
    }
    static const char *const sched[] = {"old-heavy", "new-heavy", "middle-heavy"};
    printf("model       %s\ncorpus      %s\n", model_path, spec);
    printf("sequences   %llu of up to %lld tokens (%lld in all), the first %.3g of each its "
           "prompt\n", (unsigned long long)x->sl.n, (long long)x->seq_len,
           (long long)x->sl.n_ids, x->frac);
    for (int k = 0; k < n_kp; k++) {
        const kvq_kvcache_params *p = &kp[k];
        printf("%-11s %-12s", k ? "" : "kinds", kvq_kv_kind_name(p->kind));
        if (p->kind == KVQ_KV_F16)
            printf(" the exact rows");
        if (p->kind == KVQ_KV_LEANKV || p->kind == KVQ_KV_LEANKV_PATS)
            printf(" alpha_h %g alpha_l %g window %d (K8V4 / K4V2)", p->alpha_h, p->alpha_l,
                   (int)p->window);
        if (p->kind == KVQ_KV_PATS || p->kind == KVQ_KV_LEANKV_PATS)
            printf("%s %s b %d..%d", p->kind == KVQ_KV_PATS ? "" : ", truncated by",
                   sched[p->schedule], (int)p->b_min, (int)p->b_max);
        printf("\n");
    }
    for (int s = 0; s < 2; s++)
        if (ref[s].n_pred)
            printf("reference   %-6s full attention over the exact rows, %s: ppl %.6f "
                   "(%llu predicted)\n", name[s], how[s], exp(ref[s].nll),
                   (unsigned long long)ref[s].n_pred);
    printf("\n%-12s %-16s %-6s %9s %10s %10s %9s %9s %9s %7s %17s %7s %9s\n", "kind",
           "attention", "ref", "predicted", "ppl", "full ppl", "d_ppl", "attended", "bytes/tok",
           "of f16", "high/low", "pruned", "held/tok");
}

/* The rows: per kind, alone (a list, or one kind without selectors), then with each of
 * sel [n_sel]. */
static cli_kv_row *plan_rows(const cli_kv *o, const kvq_kvcache_params *kp, int n_kp,
                             const cli_row *sel, size_t n_sel, double frac, size_t *n_rows)
{
    cli_kv_row *rows = calloc((size_t)n_kp * (1 + n_sel) + 1, sizeof *rows);
    *n_rows = 0;
    for (int k = 0; rows && k < n_kp; k++)
        for (size_t s = (o->list || !n_sel) ? 0 : 1; s <= n_sel; s++) {
            cli_kv_row *r = &rows[(*n_rows)++];
            r->kp = kp[k];
            r->sel = s ? &sel[s - 1] : NULL;
            r->frac = frac;
            r->attended = 1;
            r->held = NAN;
        }
    return rows;
}

/* Runs row i of n (its reference set): its figures and time; 0 or the exit code. */
static int run_row(cli_kv_run *x, const cli_retrieval *ro, const kvq_codebook_set *rt,
                   const cli_kv_row ref[2], cli_kv_row *r, size_t i, size_t n)
{
    char what[160];
    const char *kind = kvq_kv_kind_name(r->kp.kind);
    if (r->sel)
        snprintf(what, sizeof what, "eval %zu/%zu: %s, %s %s", i + 1, n, kind, r->sel->name,
                 r->sel->budget_str);
    else
        snprintf(what, sizeof what, "eval %zu/%zu: %s, full", i + 1, n, kind);
    const double t0 = kvq_now();
    int rc = 0;
    if (r->sel) {
        cli_kv_progress(x, what, 1, cli_kv_decode_steps(x));
        rc = cli_kv_retr_row(x, ro, rt, r, 0);
    } else if (r->kp.kind == KVQ_KV_F16) { /* the reference itself */
        r->nll = ref[0].nll;
        r->n_pred = ref[0].n_pred;
        alone_row(x, r, 0);
    } else {
        cli_kv_progress(x, what, 0, (uint64_t)x->sl.n_ids);
        rc = alone_row(x, r, 0);
    }
    r->seconds = r->kp.kind == KVQ_KV_F16 && !r->sel ? ref[0].seconds : kvq_now() - t0;
    if (!rc)
        kvq_log(x->cb, KVQ_LOG_INFO, "%s: perplexity %.4f (%.2f s)", what + 5, exp(r->nll),
                r->seconds);
    return rc;
}

int cli_eval_kv(const cli_kv *o, cli_retrieval *ro, const kvq_model *m, const char *model_path,
                const char *spec, const kvq_corpus *corpus, const kvq_tokenizer *tok,
                int64_t seq_len, int64_t max_tokens, int32_t threads, int json,
                const kvq_callbacks *cb)
{
    cli_kv_run x = {.c = kvq_model_config_get(m), .threads = threads, .seq_len = seq_len,
                    .cb = cb};
    kvq_kvcache_params kp[4];
    kvq_codebook_set *rt = NULL;
    cli_row *sel = NULL;
    cli_kv_row *rows = NULL, ref[2];
    size_t n_sel = 0, n_rows = 0;
    int n_kp = 0, rc, warned = 0;
    memset(ref, 0, sizeof ref);
    if ((rc = plan_kinds(o, ro->artifact, &x, kp, &n_kp, &x.frac)))
        return rc;
    if ((ro->selectors || ro->budgets) &&
        ((rc = cli_retrieval_open(ro, m, model_path, cb, &rt)) ||
         (rc = cli_retrieval_rows("eval", ro, rt, &sel, &n_sel))))
        goto done;
    if (!(rows = plan_rows(o, kp, n_kp, sel, n_sel, x.frac, &n_rows))) {
        rc = cli_failf(1, "%s: out of memory", model_path);
        goto done;
    }
    for (size_t i = 0; i < n_rows && !rc; i++) { /* every cache and context can be made */
        if (!rows[i].sel && rows[i].kp.kind != KVQ_KV_F16 &&
            ro->p.device == KVQ_RETRIEVAL_DEVICE_CUDA && !(warned & (1 << rows[i].kp.kind))) {
            warned |= 1 << rows[i].kp.kind;
            kvq_log(cb, KVQ_LOG_WARN, "--kv %s has no CUDA path: it runs on the CPU",
                    kvq_kv_kind_name(rows[i].kp.kind));
        }
        rc = rows[i].sel ? cli_kv_retr_row(&x, ro, rt, &rows[i], 1) : alone_row(&x, &rows[i], 1);
    }
    if (rc || (rc = run_open(&x, m, model_path, corpus, tok, max_tokens)) ||
        (rc = references(&x, rows, n_rows, spec, ref)))
        goto done;
    if (o->list && !json)
        table_head(&x, kp, n_kp, ref, model_path, spec, 0);
    for (size_t i = 0; i < n_rows && !rc; i++) {
        if ((rc = run_row(&x, ro, rt, ref, &rows[i], i, n_rows)))
            break;
        if (!o->list || !json) {
            cli_kv_row_print(&rows[i], x.c->head_dim,
                             o->list ? CLI_KV_TABLE : rows[i].sel ? CLI_KV_RETR : CLI_KV_ALONE,
                             json);
            fflush(stdout);
        }
    }
    if (!rc && o->list && json) { /* all or nothing */
        table_head(&x, kp, n_kp, ref, model_path, spec, 1);
        for (size_t i = 0; i < n_rows; i++) {
            printf("%s\n  ", i ? "," : "");
            cli_kv_row_print(&rows[i], x.c->head_dim, CLI_KV_TABLE, 1);
        }
        printf("]}\n");
    }
done:
    kvq_forward_free(x.f);
    kvq_codebook_set_close(rt);
    kvq_seq_set_free(&x.sl);
    free(x.logits);
    free(sel);
    free(rows);
    return rc;
}
