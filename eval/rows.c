/* rows.c — kvq_eval_rows_expand (kvq/eval.h): the selector x budget lists of `kvq eval`
 * and `kvq run` (and kvq_eval_files) as rows of retrieval parameters. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/eval_internal.h"

/* Splits s at commas into a malloc'd copy and pointers into it. */
static char **split(const char *s, size_t *n, char **buf)
{
    *buf = strdup(s);
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    char **v = malloc(sizeof *v * cap);
    if (!*buf || !v) {
        free(*buf);
        free(v);
        return NULL;
    }
    *n = 0;
    for (char *p = *buf, *tok; (tok = strsep(&p, ","));)
        v[(*n)++] = tok;
    return v;
}

/* Appends the rows of selector name sv (budgets[nb]) to out. */
static kvq_status add_selector(const char *sv, const kvq_budget *budgets, size_t nb,
                               const kvq_codebook_set *rt, const kvq_retrieval_params *base,
                               kvq_eval_row *out, size_t *n, kvq_err *err)
{
    const char *method = rt ? kvq_codebook_method_name(kvq_codebook_set_method(rt)) : NULL;
    kvq_selector sel;
    int m;
    kvq_status s = kvq_selector_parse(sv, &sel, &m, err);
    if (s)
        return s;
    if (kvq_selector_needs_artifact(sel) && !rt)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "the %s selector needs --artifact", sv);
    if (m >= 0 && (kvq_codebook_method)m != kvq_codebook_set_method(rt))
        return kvq_err_set(err, KVQ_E_MISMATCH, "selector %s: the artifact's method is %s", sv,
                           method);
    for (size_t b = 0; b < (sel == KVQ_SELECT_FULL ? 1 : nb); b++) {
        kvq_eval_row *r = &out[(*n)++];
        r->rp = *base;
        r->rp.selector = sel;
        r->rp.budget = sel == KVQ_SELECT_FULL ? (kvq_budget){.fraction = 1.0} : budgets[b];
        snprintf(r->name, sizeof r->name, "%s",
                 sel == KVQ_SELECT_CODEBOOK ? method : kvq_selector_name(sel));
        kvq_budget_format(&r->rp.budget, r->budget, sizeof r->budget);
    }
    return KVQ_OK;
}

kvq_status kvq_eval_rows_expand(const char *selectors, const char *budgets,
                                const kvq_codebook_set *rt, const kvq_retrieval_params *base,
                                kvq_eval_row **rows, size_t *n_rows, kvq_err *err)
{
    char defsel[128];
    const char *method = rt ? kvq_codebook_method_name(kvq_codebook_set_method(rt)) : NULL;
    snprintf(defsel, sizeof defsel,
             rt ? "full,oracle,%s,fier,quest,mass" : "full,oracle,fier,quest", method);
    char *sbuf = NULL, *bbuf = NULL;
    size_t ns = 0, nb = 0, n = 0;
    *rows = NULL;
    *n_rows = 0;
    char **sv = split(selectors ? selectors : defsel, &ns, &sbuf);
    char **bv = split(budgets ? budgets : "6%", &nb, &bbuf);
    kvq_eval_row *out = sv && bv ? calloc(ns * nb + 1, sizeof *out) : NULL;
    kvq_budget *bud = out ? calloc(nb, sizeof *bud) : NULL;
    kvq_status s = bud ? KVQ_OK : kvq_err_set(err, KVQ_E_NOMEM, "out of memory");
    for (size_t b = 0; b < nb && !s; b++)
        s = kvq_budget_parse(bv[b], &bud[b], err);
    for (size_t i = 0; i < ns && !s; i++)
        s = add_selector(sv[i], bud, nb, rt, base, out, &n, err);
    free(bud);
    free(sv);
    free(bv);
    free(sbuf);
    free(bbuf);
    if (s) {
        free(out);
        return s;
    }
    *rows = out;
    *n_rows = n;
    return KVQ_OK;
}
