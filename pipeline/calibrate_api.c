/* calibrate_api.c — kvq_calibrate_files (kvq/calibrate.h): the stable entry point, the
 * plain options mapped onto kvq_calibrate_params (every other field at its default). */
#include "kvq/calibrate.h"

kvq_status kvq_calibrate_files(const char *model_path, const char *out_path,
                               const kvq_calibrate_options *o, kvq_calibrate_summary *summary,
                               kvq_err *err)
{
    kvq_calibrate_params p = kvq_calibrate_params_default();
    if (o) {
        p.corpus = o->corpus;
        p.work_dir = o->work_dir;
        if (o->seed)
            p.seed = o->seed;
        if (o->threads > 0)
            p.threads = o->threads;
        p.force = o->force;
        if (o->seq_len)
            p.capture.seq_len = o->seq_len;
        if (o->max_tokens)
            p.capture.max_tokens = o->max_tokens;
        if (o->heldout_tokens)
            p.heldout_tokens = o->heldout_tokens < 0 ? 0 : o->heldout_tokens;
        if (o->positions_tokens)
            p.positions_tokens = o->positions_tokens;
        if (o->codebook_size)
            p.fit.codebook_size = o->codebook_size;
        if (o->iters)
            p.fit.iters = o->iters;
        p.profile = !o->no_profile;
        p.positions = !o->no_positions;
        p.cb = o->cb;
    }
    return kvq_calibrate_run(model_path, out_path, &p, summary, err);
}
