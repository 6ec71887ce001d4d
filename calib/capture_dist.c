/*
 * capture_dist.c — kvq_capture_tokens on several ranks (kvq/dist.h, kvq/capture.h).
 *
 * The sequences are cut into contiguous shares of about equal token counts. Each rank
 * captures each of its sequences on its own into "<dir>.tmp.<random>/seq.NNNNNNNNNN/"
 * (the temporary directory rank 0 made; the file system is shared), then rank 0 merges
 * them in sequence order with kvq_capture_merge and restores the corpus provenance one
 * capture would have written, and renames the result to dir.
 *
 * Why one capture per sequence: a capture adds each sequence's moment sum to a running
 * total, and kvq_capture_merge adds the inputs' totals left to right; with one sequence
 * per input the merge performs exactly the additions of one process, in the same order
 * (docs/capture.md), and every other tensor is a concatenation. So the result has the
 * bytes of one capture for any number of ranks. A query sample (0 < n_queries <
 * n_tokens) is drawn over the whole capture: such a capture runs on rank 0 alone.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/capture.h"
#include "kvq/util.h"

#include "calib/capture_internal.h"

typedef struct share_cb {
    const kvq_callbacks *user;
    const kvq_dist *d;
    uint64_t base, total;     /* tokens of this rank's share before this sequence, all */
    uint64_t all;             /* tokens of the whole capture */
} share_cb;

/* A sequence's own capture logs one level lower (its INFO lines would repeat per
 * sequence); its progress becomes the share's. */
static void share_log(void *u, kvq_log_level level, const char *msg)
{
    const share_cb *s = u;
    if (s->user->log)
        s->user->log(s->user->user, level == KVQ_LOG_INFO ? KVQ_LOG_DEBUG : level, msg);
}

static int share_progress(void *u, const char *what, uint64_t done, uint64_t total)
{
    const share_cb *s = u;
    if (strcmp(what, "capture") != 0)
        return 0;
    /* the whole capture's progress, estimated from this rank's share (kvq_dist_progress) */
    return kvq_progress(s->user, "capture", kvq_dist_progress(s->d, s->base + done, s->total, s->all),
                        s->all);
}

/* Captures sequences [first, end) of the run, each into tmp/seq.NNNNNNNNNN. */
static kvq_status capture_share(const kvq_model *m, const int32_t *tokens,
                                const int64_t *sequences, int64_t n_sequences, int64_t first,
                                int64_t end,
                                const kvq_capture_corpus *corpus, const kvq_capture_params *p,
                                const char *tmp, kvq_err *err)
{
    share_cb sc = {&p->cb, p->dist, 0, 0, 0};
    for (int64_t s = first; s < end; s++)
        sc.total += (uint64_t)sequences[2 * s + 1];
    for (int64_t s = 0; s < n_sequences; s++)
        sc.all += (uint64_t)sequences[2 * s + 1];
    kvq_capture_params lp = *p;
    lp.dist = NULL;
    lp.overwrite = 0;
    lp.cb.log = share_log;
    lp.cb.progress = share_progress;
    lp.cb.user = &sc;
    for (int64_t s = first; s < end; s++) {
        char name[32];
        snprintf(name, sizeof name, "seq.%010" PRId64, s);
        char *dir = kvq_path_join(tmp, name);
        if (!dir)
            return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", tmp);
        const int64_t one[2] = {0, sequences[2 * s + 1]};
        kvq_status st = kvq_capture_tokens(m, tokens + sequences[2 * s], one[1], one, 1, corpus,
                                           &lp, dir, err);
        free(dir);
        if (st)
            return st;
        sc.base += (uint64_t)one[1];
    }
    return KVQ_OK;
}

/* Rank 0: merges tmp/seq.* into tmp/merged, writes the corpus fields of one capture of
 * the whole run into its capture.json and renames it to dir. */
static kvq_status merge_shares(const int32_t *tokens, int64_t n_tokens, int64_t n_sequences,
                               const kvq_capture_corpus *corpus, const kvq_capture_params *p,
                               const char *tmp, const char *dir, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    char **in = calloc((size_t)n_sequences, sizeof *in);
    char *merged = kvq_path_join(tmp, "merged"), *json = NULL;
    kvq_capture_info *ci = NULL;
    if (!in || !merged) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    for (int64_t s = 0; s < n_sequences; s++) {
        char name[32];
        snprintf(name, sizeof name, "seq.%010" PRId64, s);
        if (!(in[s] = kvq_path_join(tmp, name))) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
            goto done;
        }
    }
    if ((st = kvq_capture_merge((const char *const *)in, (size_t)n_sequences, merged, 0, &p->cb,
                                err)) ||
        (st = kvq_capture_info_read(merged, &ci, err)))
        goto done;
    capture_set_corpus(ci, corpus, tokens, n_tokens); /* as one capture records it */
    if (!(json = kvq_path_join(merged, KVQ_CAPTURE_JSON))) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    if ((st = kvq_capture_info_write(ci, NULL, json, 1, err)))
        goto done;
    st = kvq_tmpdir_commit(merged, dir, p->overwrite, kvq_capture_dir_is_capture,
                           "a kvq capture directory", err);
done:
    for (int64_t s = 0; in && s < n_sequences; s++)
        free(in[s]);
    free(in);
    free(merged);
    free(json);
    kvq_capture_info_free(ci);
    return st;
}

kvq_status capture_tokens_dist(const kvq_model *m, const int32_t *tokens, int64_t n_tokens,
                               const int64_t *sequences, int64_t n_sequences,
                               const kvq_capture_corpus *corpus, const kvq_capture_params *p,
                               const char *dir, kvq_err *err)
{
    const kvq_dist *d = p->dist;
    kvq_capture_params one = *p;
    one.dist = NULL;
    /* A killed run leaves its temporaries (rank 0's directory, the ranks' pieces in it);
     * their pids say nothing across machines, so the job removes every one of them. */
    const int n_old = d->rank == 0 ? kvq_output_clean_job(dir, NULL) : 0;
    if (n_old)
        kvq_log(&p->cb, KVQ_LOG_INFO, "capture: removed %d temporaries of an earlier run of %s",
                n_old, dir);
    if (p->n_queries > 0 && p->n_queries < n_tokens) {
        /* A sample over the whole capture: rank 0 alone. */
        kvq_status st = KVQ_OK;
        if (d->rank == 0) {
            kvq_log(&p->cb, KVQ_LOG_INFO, "capture: a query sample is drawn over the whole "
                    "capture: rank 0 captures alone");
            st = kvq_capture_tokens(m, tokens, n_tokens, sequences, n_sequences, corpus, &one,
                                    dir, err);
        }
        return kvq_dist_share(d, st, err);
    }
    char tmp_path[4096];
    char *tmp = NULL;
    memset(tmp_path, 0, sizeof tmp_path);
    kvq_status st = KVQ_OK;
    if (d->rank == 0 && p->overwrite)
        st = kvq_capture_dir_check_own(dir, err);
    if (d->rank == 0 && !st &&
        !(st = kvq_tmpdir_create(dir, p->overwrite, kvq_capture_dir_is_capture,
                                 "a kvq capture directory", &tmp, err))) {
        if (strlen(tmp) >= sizeof tmp_path)
            st = kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: path too long", dir);
        else
            memcpy(tmp_path, tmp, strlen(tmp));
    }
    if ((st = kvq_dist_share(d, st, err)) ||
        (st = kvq_dist_bcast(d, tmp_path, sizeof tmp_path, err)))
        goto done;
    double *cost = malloc((size_t)n_sequences * sizeof *cost);
    int64_t first = 0, end = 0;
    if (!cost) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
    } else {
        for (int64_t s = 0; s < n_sequences; s++)
            cost[s] = (double)sequences[2 * s + 1];
        kvq_dist_split(n_sequences, cost, d->rank, d->size, &first, &end);
        free(cost);
        if (d->rank == 0)
            kvq_log(&p->cb, KVQ_LOG_INFO, "capture: %" PRId64 " sequences on %d ranks; rank 0 "
                    "captures %" PRId64 " of them; the progress is the whole capture's, "
                    "estimated from rank 0's share (the shares are balanced)", n_sequences, (int)d->size, end - first);
        st = capture_share(m, tokens, sequences, n_sequences, first, end, corpus, p, tmp_path,
                           err);
    }
    if ((st = kvq_dist_agree(d, st, err)))
        goto done;
    if (d->rank == 0)
        st = merge_shares(tokens, n_tokens, n_sequences, corpus, &one, tmp_path, dir, err);
    st = kvq_dist_share(d, st, err);
done:
    if (tmp)
        kvq_rmtree(tmp);
    free(tmp);
    return st;
}
