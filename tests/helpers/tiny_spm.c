/* tiny_spm.c — see tiny_spm.h. */
#include "helpers/tiny_spm.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/util.h"

static const cJSON *member(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v)
        fail_msg("%s: no member '%s'", TINY_SPM_GOLDEN, key);
    return v;
}

static void read_text(const cJSON *o, const char *text_key, tiny_spm_text *t)
{
    const cJSON *s = member(o, text_key), *ids = member(o, "ids"), *v;
    if (!cJSON_IsString(s) || !cJSON_IsArray(ids))
        fail_msg("%s: malformed text entry", TINY_SPM_GOLDEN);
    t->text = strdup(s->valuestring);
    t->n = (size_t)cJSON_GetArraySize(ids);
    t->ids = malloc((t->n + 1) * sizeof *t->ids);
    size_t i = 0;
    cJSON_ArrayForEach(v, ids) t->ids[i++] = (int32_t)v->valueint;
}

tiny_spm_gold *tiny_spm_gold_load(void)
{
    uint8_t *raw = NULL;
    size_t n = 0;
    kvq_err e = {0};
    if (kvq_read_file(TINY_SPM_GOLDEN, &raw, &n, &e))
        fail_msg("%s", e.msg);
    cJSON *j = cJSON_ParseWithLength((const char *)raw, n);
    free(raw);
    if (!j)
        fail_msg("%s: not JSON", TINY_SPM_GOLDEN);
    tiny_spm_gold *g = calloc(1, sizeof *g);
    g->n_vocab = (int32_t)member(member(j, "vocab"), "n_vocab")->valueint;
    const cJSON *texts = member(j, "texts"), *t;
    g->n_texts = (size_t)cJSON_GetArraySize(texts);
    g->texts = calloc(g->n_texts, sizeof *g->texts);
    size_t i = 0;
    cJSON_ArrayForEach(t, texts) read_text(t, "text", &g->texts[i++]);
    read_text(member(j, "greedy"), "text", &g->greedy);
    cJSON_Delete(j);
    return g;
}

void tiny_spm_gold_free(tiny_spm_gold *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->n_texts; i++) {
        free(g->texts[i].text);
        free(g->texts[i].ids);
    }
    free(g->texts);
    free(g->greedy.text);
    free(g->greedy.ids);
    free(g);
}
