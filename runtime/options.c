/*
 * options.c — the small parsers and names of kvq/runtime.h: selectors (their names and
 * properties from their tables, runtime/select/), budgets.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/artifact.h"
#include "kvq/runtime.h"
#include "kvq/util.h"
#include "runtime/runtime_internal.h"
#include "runtime/select/selector.h"

/* ==========================================================================
 * Selectors and budgets
 * ========================================================================== */

/* The selectors' names are their tables' (runtime/select/select.c's registry). */
const char *kvq_selector_name(kvq_selector s)
{
    const rt_selector *t = kvq_rt_selector(s);
    return t ? t->name : "unknown";
}

kvq_status kvq_selector_parse(const char *s, kvq_selector *sel, int *method, kvq_err *err)
{
    if (method)
        *method = -1;
    if (!s)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "selector: NULL");
    for (int i = 0; i < KVQ_SELECT_COUNT; i++)
        if (!strcmp(s, kvq_rt_selector((kvq_selector)i)->name)) {
            *sel = (kvq_selector)i;
            return KVQ_OK;
        }
    if (!strcmp(s, "artifact")) {
        *sel = KVQ_SELECT_CODEBOOK;
        return KVQ_OK;
    }
    kvq_codebook_method m;
    if (kvq_codebook_method_parse(s, &m, NULL) == KVQ_OK) {
        *sel = KVQ_SELECT_CODEBOOK;
        if (method)
            *method = (int)m;
        return KVQ_OK;
    }
    char names[256] = "";
    size_t used = 0;
    for (int i = 0; i < KVQ_SELECT_COUNT && used < sizeof names; i++) {
        const char *nm = kvq_rt_selector((kvq_selector)i)->name;
        used += (size_t)snprintf(names + used, sizeof names - used, "%s%s%s", i ? ", " : "", nm,
                                 i == KVQ_SELECT_CODEBOOK ? " or the artifact's method name" : "");
    }
    return kvq_err_set(err, KVQ_E_INVALID_ARG, "unknown selector '%s' (%s)", s, names);
}

int kvq_selector_needs_artifact(kvq_selector s)
{
    const rt_selector *t = kvq_rt_selector(s);
    return t && t->needs_artifact;
}

/* 1 when s[0..n) is made of a number's characters only (digits, sign, point, exponent)
 * and holds a digit. */
static int looks_numeric(const char *s, size_t n)
{
    size_t digits = 0;
    for (size_t i = 0; i < n; i++) {
        if (!strchr("0123456789+-.eE", s[i]) || !s[i])
            return 0;
        digits += s[i] >= '0' && s[i] <= '9';
    }
    return digits > 0;
}

kvq_status kvq_budget_parse(const char *s, kvq_budget *b, kvq_err *err)
{
    kvq_err e = {0};
    if (!s || !*s)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "budget: empty");
    if (!strcmp(s, "all")) {
        *b = (kvq_budget){.count = 0, .fraction = 1.0};
        return KVQ_OK;
    }
    const size_t n = strlen(s);
    if (!looks_numeric(s, s[n - 1] == '%' ? n - 1 : n))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "budget '%s': not a token count (256), a "
                           "percentage (6%%), a fraction (0.06) or all", s);
    if (s[n - 1] == '%') {
        char buf[64];
        double pct;
        if (n - 1 >= sizeof buf)
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "budget '%s': too long", s);
        memcpy(buf, s, n - 1);
        buf[n - 1] = 0;
        if (kvq_parse_f64(buf, 0, 100, &pct, &e) || !(pct > 0))
            return kvq_err_set(err, KVQ_E_INVALID_ARG,
                               "budget '%s': a percentage must be in (0, 100]", s);
        *b = (kvq_budget){.count = 0, .fraction = pct / 100.0};
        return KVQ_OK;
    }
    if (!strchr(s, '.') && !strchr(s, 'e') && !strchr(s, 'E')) {
        int64_t c;
        if (kvq_parse_i64(s, 1, (int64_t)1 << 40, &c, &e))
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "budget '%s': a count must be in [1, 2^40]",
                               s);
        *b = (kvq_budget){.count = c, .fraction = 0};
        return KVQ_OK;
    }
    double f;
    if (kvq_parse_f64(s, 0, 1, &f, &e) || !(f > 0))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "budget '%s': a fraction must be in (0, 1]", s);
    *b = (kvq_budget){.count = 0, .fraction = f};
    return KVQ_OK;
}

int64_t kvq_budget_tokens(const kvq_budget *b, int64_t n)
{
    if (n <= 0)
        return 0;
    if (b->count > 0)
        return b->count;
    if (b->fraction >= 1.0)
        return n;
    int64_t k = (int64_t)ceil(b->fraction * (double)n);
    return k < 1 ? 1 : k > n ? n : k;
}

void kvq_budget_format(const kvq_budget *b, char *buf, size_t cap)
{
    if (b->count > 0)
        snprintf(buf, cap, "%lld", (long long)b->count);
    else if (b->fraction >= 1.0)
        snprintf(buf, cap, "all");
    else
        snprintf(buf, cap, "%.6g%%", b->fraction * 100.0);
}

double kvq_selector_bits_per_key(kvq_selector s, const kvq_retrieval_params *p,
                                 const kvq_codebook_set *rt, int32_t d)
{
    const rt_selector *t = kvq_rt_selector(s);
    return t && t->bits_per_key ? t->bits_per_key(p, rt, d) : 0.0;
}
