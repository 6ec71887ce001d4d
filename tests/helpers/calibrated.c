/* calibrated.c — see calibrated.h. */
#include "helpers/calibrated.h"

#include <stdio.h>
#include <stdlib.h>

#include "helpers/testutil.h"
#include "kvq.h"
#include "kvq/util.h"

int tinyllama_calibrated(const tinyllama *t, const char *dir, const char *art,
                         const char *ids_path, uint64_t seed, size_t n_ids, int32_t iters,
                         int32_t *tokens, int n_tokens, char *fp)
{
    if (tinyllama_write_hf(t, dir))
        return -1;
    /* calibration tokens: pre-tokenized ids (the tiny model has no tokenizer) */
    kvq_rng rng;
    kvq_rng_seed(&rng, seed);
    int32_t *ids = malloc(n_ids * sizeof *ids);
    if (!ids)
        return -1;
    for (size_t i = 0; i < n_ids; i++)
        ids[i] = (int32_t)kvq_rng_below(&rng, (uint64_t)t->s.vocab);
    for (int i = 0; i < n_tokens; i++)
        tokens[i] = (int32_t)kvq_rng_below(&rng, (uint64_t)t->s.vocab);
    const int wrc = test_write_file(ids_path, ids, n_ids * sizeof *ids);
    free(ids);
    if (wrc)
        return -1;
    char spec[1100];
    snprintf(spec, sizeof spec, "ids:%s", ids_path);
    kvq_calibrate_params p = kvq_calibrate_params_default();
    p.corpus = spec;
    p.capture.seq_len = 128;
    p.capture.max_tokens = (int64_t)n_ids;
    p.heldout_tokens = 0;
    p.profile = 0;
    p.fit.codebook_size = 16;
    p.fit.iters = iters;
    kvq_calibrate_summary sum;
    kvq_err e = {0};
    kvq_model *m = NULL;
    if (kvq_calibrate_run(dir, art, &p, &sum, &e) || kvq_model_open(dir, NULL, &m, &e)) {
        fprintf(stderr, "calibrate %s: %s\n", dir, e.msg);
        return -1;
    }
    snprintf(fp, KVQ_FINGERPRINT_CAP, "%s", kvq_model_fingerprint(m));
    kvq_model_close(m);
    return 0;
}
