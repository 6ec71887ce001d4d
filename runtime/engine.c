/*
 * engine.c — the embedding API of kvq/engine.h: an artifact opened against an engine's
 * model description (kvq_codebook_set with the weight check), and per-sequence decoding
 * contexts (kvq_retrieval) fed rows by the engine instead of kvq's forward pass.
 */
#include "kvq/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/artifact.h"
#include "kvq/artifact_summary.h"
#include "kvq/half.h"
#include "kvq/kvcache.h"
#include "kvq/model_id.h"
#include "kvq/runtime.h"
#include "runtime/local.h"
#include "runtime/runtime_internal.h"

struct kvq_engine {
    kvq_codebook_set *set;
    kvq_model_config cfg;
    kvq_model_id art; /* the artifact's identity as recorded */
    char *path;       /* the artifact (the compressed caches' settings) */
};

struct kvq_engine_seq {
    const kvq_engine *e;
    kvq_retrieval *r;
    kvq_kvcache *kc;  /* kv_cache != 0: the compressed cache (r NULL with selector full,
                         else attached to r: retrieval reads its rows) */
    float *buf;      /* [2, rows, n_kv, d] f16 rows converted */
    int64_t buf_rows;
};

/* The identity the artifact records (full when it has all of it), with the engine's
 * attention shape, RoPE and fingerprint on top: what kvq_codebook_set_open_ex checks. */
static kvq_status engine_identity(const char *path, const kvq_engine_model *m, kvq_model_id *id,
                                  kvq_model_id *art, kvq_err *err)
{
    kvq_artifact *a = NULL;
    kvq_status s = kvq_artifact_open(path, &a, err);
    if (s)
        return s;
    const kvq_st *st = kvq_artifact_payload(a);
    kvq_err e = {0};
    memset(art, 0, sizeof *art);
    if (kvq_model_id_from_meta(st, KVQ_META_MODEL_PREFIX, path, art, &e) != KVQ_OK) {
        const char *v = kvq_st_meta_get(st, KVQ_META_ARCH);
        snprintf(art->architecture, sizeof art->architecture, "%s", v ? v : "llama");
        v = kvq_st_meta_get(st, KVQ_META_MODEL_FINGERPRINT);
        snprintf(art->fingerprint, sizeof art->fingerprint, "%s", v ? v : "");
        v = kvq_st_meta_get(st, KVQ_META_MODEL_NAME);
        snprintf(art->name, sizeof art->name, "%s", v ? v : "");
    }
    kvq_artifact_close(a);
    *id = *art;
    id->n_layers = m->n_layers;
    id->n_heads = m->n_heads;
    id->n_kv_heads = m->n_kv_heads;
    id->head_dim = m->head_dim;
    id->rope = kvq_rope_default(m->head_dim);
    id->rope.base = m->rope_base;
    id->rope.layout = m->rope_interleaved ? KVQ_ROPE_INTERLEAVED : KVQ_ROPE_HALF;
    if (m->rope_scaling && kvq_rope_scaling_parse(m->rope_scaling, &id->rope.scaling))
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "engine model: unknown rope_scaling \"%s\"",
                           m->rope_scaling);
    if (id->rope.scaling != KVQ_ROPE_SCALING_NONE)
        id->rope.factor = m->rope_factor;
    if (id->rope.scaling == KVQ_ROPE_SCALING_LLAMA3) { /* linear keeps the defaults */
        id->rope.low_freq_factor = m->rope_low_freq_factor;
        id->rope.high_freq_factor = m->rope_high_freq_factor;
        id->rope.original_max_pos = m->rope_original_max_pos;
    }
    if ((s = kvq_rope_check(&id->rope, err)))
        return s;
    snprintf(id->fingerprint, sizeof id->fingerprint, "%s", m->fingerprint ? m->fingerprint : "");
    if (!id->dim)
        id->dim = m->n_heads * m->head_dim;
    return KVQ_OK;
}

/* ---- per-layer attention (archs-rt) ------------------------------------------------- */

static int engine_describes_attention(const kvq_engine_model *m)
{
    return m->layers || m->attn_scale != 0 || m->attn_softcap != 0 || m->sliding_window != 0;
}

/* Layer l's attention as the engine describes it (rope: the engine's model RoPE). */
static kvq_status engine_layer_attn(const kvq_engine_model *m, const kvq_rope *rope, int32_t l,
                                    kvq_layer_attn *a, kvq_err *err)
{
    memset(a, 0, sizeof *a);
    a->rope = *rope;
    a->use_rope = 1;
    double scale = m->attn_scale, cap = m->attn_softcap;
    int32_t window = m->sliding_window;
    if (m->layers) {
        const kvq_engine_layer *L = &m->layers[l];
        scale = L->attn_scale;
        cap = L->attn_softcap;
        window = L->window;
        if (L->no_rope)
            return kvq_err_set(err, KVQ_E_UNSUPPORTED, "engine model: layers[%d] has no RoPE: "
                               "the retrieval runtime does not implement no-RoPE layers (none "
                               "of the models kvq reads has one)", (int)l);
        if (L->rope_base < 0 || !isfinite(L->rope_base))
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "engine model: layers[%d].rope_base %g",
                               (int)l, L->rope_base);
        if (L->rope_base > 0)
            a->rope.base = L->rope_base;
        if (L->rope_scaling) {
            if (kvq_rope_scaling_parse(L->rope_scaling, &a->rope.scaling))
                return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                                   "engine model: layers[%d]: unknown rope_scaling \"%s\"",
                                   (int)l, L->rope_scaling);
            a->rope.factor = a->rope.scaling == KVQ_ROPE_SCALING_NONE ? 1.0
                             : L->rope_factor > 0                     ? L->rope_factor
                                                                      : m->rope_factor;
        }
    }
    if (!(scale >= 0) || !(cap >= 0) || window < 0 || !isfinite(scale) || !isfinite(cap)) {
        char at[32] = "";
        if (m->layers)
            snprintf(at, sizeof at, "layers[%d]: ", (int)l);
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "engine model: %sattn_scale %g, attn_softcap "
                           "%g, window %d: need values >= 0", at, scale, cap, (int)window);
    }
    a->scale = scale > 0 ? scale : 1.0 / sqrt((double)m->head_dim);
    a->softcap = cap;
    a->window = window;
    return KVQ_OK;
}

/* The engine's description against the artifact's (id: the artifact's attention with
 * the engine's shape and RoPE, already checked), layer by layer. */
static kvq_status engine_check_layers(const char *path, const kvq_engine_model *m,
                                      const kvq_model_id *id, kvq_err *err)
{
    if (!engine_describes_attention(m))
        return KVQ_OK; /* the artifact's description, as before */
    for (int32_t l = 0; l < m->n_layers; l++) {
        kvq_layer_attn want, have;
        kvq_status s = engine_layer_attn(m, &id->rope, l, &want, err);
        if (s)
            return s;
        kvq_model_id_layer_attn(id, l, &have);
        double va = 0, vb = 0;
        const char *what = kvq_layer_attn_diff(&have, &want, &va, &vb);
        if (what)
            return kvq_err_set(err, KVQ_E_MISMATCH,
                               "%s vs engine model: layer %d's attention differs: %s %.9g vs "
                               "%.9g", path, (int)l, what, va, vb);
    }
    return KVQ_OK;
}

int32_t kvq_engine_layer_window(const kvq_engine *e, int32_t layer)
{
    if (!e || layer < 0 || layer >= e->cfg.n_layers || !kvq_rt_layer_local(&e->cfg, layer))
        return 0;
    return e->cfg.sliding_window;
}

kvq_status kvq_engine_open(const char *artifact_path, const kvq_engine_model *model,
                           unsigned flags, kvq_engine **out, kvq_err *err)
{
    if (!out || !artifact_path || !model)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "engine: NULL argument");
    *out = NULL;
    const kvq_engine_model *m = model;
    if (m->n_layers < 1 || m->n_heads < 1 || m->n_kv_heads < 1 || m->n_heads % m->n_kv_heads ||
        m->head_dim < 2 || m->head_dim % 2 || m->head_dim > KVQ_ROPE_MAX_DIM ||
        !(m->rope_base > 0))
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "engine model: n_layers %d, n_heads %d, n_kv_heads %d, head_dim %d, "
                           "rope_base %g: need counts >= 1, n_kv_heads dividing n_heads, an "
                           "even head_dim <= %d and a positive base",
                           m->n_layers, m->n_heads, m->n_kv_heads, m->head_dim, m->rope_base,
                           KVQ_ROPE_MAX_DIM);
    kvq_engine *e = calloc(1, sizeof *e);
    if (!e)
        return kvq_err_set(err, KVQ_E_NOMEM, "engine: out of memory");
    kvq_model_id id;
    kvq_status s = engine_identity(artifact_path, m, &id, &e->art, err);
    const unsigned f = flags & KVQ_ENGINE_ACCEPT_MODEL_MISMATCH ? KVQ_OPEN_ACCEPT_MODEL_MISMATCH : 0;
    if (!s)
        s = kvq_codebook_set_open_ex(artifact_path, &id, "engine model", f, &e->set, err);
    if (!s && (s = engine_check_layers(artifact_path, m, &id, err)))
        kvq_codebook_set_close(e->set);
    if (s) {
        free(e);
        return s;
    }
    e->cfg = kvq_model_config_from_id(&id);
    if (!(e->path = strdup(artifact_path))) {
        kvq_engine_close(e);
        return kvq_err_set(err, KVQ_E_NOMEM, "engine: out of memory");
    }
    *out = e;
    return KVQ_OK;
}

void kvq_engine_close(kvq_engine *e)
{
    if (!e)
        return;
    kvq_codebook_set_close(e->set);
    free(e->path);
    free(e);
}

const char *kvq_engine_weights_note(const kvq_engine *e)
{
    return kvq_codebook_set_weights_note(e->set);
}
const char *kvq_engine_artifact_fingerprint(const kvq_engine *e) { return e->art.fingerprint; }
const char *kvq_engine_artifact_model_name(const kvq_engine *e) { return e->art.name; }
uint64_t kvq_engine_bytes(const kvq_engine *e) { return kvq_codebook_set_bytes(e->set); }

kvq_engine_seq_params kvq_engine_seq_params_default(void)
{
    const kvq_retrieval_params d = kvq_retrieval_params_default();
    kvq_engine_seq_params p = {0};
    p.budget_tokens = d.budget.count;
    p.budget_fraction = d.budget.fraction;
    p.sink = d.sink;
    p.window = d.window;
    p.cache_f16 = d.cache_dtype == KVQ_DT_F16;
    p.max_tokens = d.max_tokens;
    p.threads = d.threads;
    p.kv_alpha_h = p.kv_alpha_l = -1;
    p.kv_window = p.kv_pats_schedule = p.kv_pats_b_min = p.kv_pats_b_max = -1;
    return p;
}

/* ---- the compressed KV caches (kv_cache != 0) -------------------------------------- */

/* A setting: the option where >= 0, else the artifact's metadata key (NaN when absent). */
static double kv_setting(double opt, const kvq_st *st, const char *key)
{
    return opt >= 0 ? opt : st ? kvq_st_meta_num(st, key) : NAN;
}

static kvq_status kv_params(const kvq_engine *e, const kvq_engine_seq_params *p,
                            kvq_kvcache_params *kp, kvq_err *err)
{
    kvq_artifact *a = NULL;
    kvq_status s = kvq_artifact_open(e->path, &a, err);
    if (s)
        return s;
    const kvq_st *st = kvq_artifact_payload(a);
    *kp = kvq_kvcache_params_default();
    kp->kind = p->kv_cache == KVQ_ENGINE_KV_LEANKV   ? KVQ_KV_LEANKV
               : p->kv_cache == KVQ_ENGINE_KV_PATS ? KVQ_KV_PATS
                                                   : KVQ_KV_LEANKV_PATS;
    kp->prompt_tokens = 0;
    kp->max_tokens = p->max_tokens;
    kp->threads = p->threads;
    const char *miss = NULL;
    if (kp->kind != KVQ_KV_PATS) { /* leankv, leankv+pats */
        kp->alpha_h = kv_setting(p->kv_alpha_h, st, KVQ_META_LEANKV_ALPHA_H);
        kp->alpha_l = kv_setting(p->kv_alpha_l, st, KVQ_META_LEANKV_ALPHA_L);
        const double w = kv_setting(p->kv_window, st, KVQ_META_LEANKV_WINDOW);
        kp->window = isnan(w) ? 64 : w > (1 << 20) ? -1 : (int32_t)w;
        miss = isnan(kp->alpha_h) ? KVQ_META_LEANKV_ALPHA_H
               : isnan(kp->alpha_l) ? KVQ_META_LEANKV_ALPHA_L : NULL;
    }
    if (kp->kind != KVQ_KV_LEANKV && !miss) { /* pats, leankv+pats */
        const char *sc = st ? kvq_st_meta_get(st, KVQ_META_PATS_SCHEDULE) : NULL;
        int32_t sched = p->kv_pats_schedule;
        if (sched < 0 && sc && kvq_kvcache_schedule_parse(sc, &sched))
            sched = 99; /* an unknown name: out of range below */
        const double lo = kv_setting(p->kv_pats_b_min, st, KVQ_META_PATS_B_MIN);
        const double hi = kv_setting(p->kv_pats_b_max, st, KVQ_META_PATS_B_MAX);
        miss = sched < 0 ? KVQ_META_PATS_SCHEDULE : isnan(lo) ? KVQ_META_PATS_B_MIN
               : isnan(hi) ? KVQ_META_PATS_B_MAX : NULL;
        kp->schedule = sched;
        kp->b_min = isnan(lo) || lo != floor(lo) || lo > 99 ? -1 : (int32_t)lo;
        kp->b_max = isnan(hi) || hi != floor(hi) || hi > 99 ? 99 : (int32_t)hi;
    }
    kvq_artifact_close(a);
    if (miss)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "engine: kv_cache %s needs %s: set it in the "
                           "sequence parameters, or profile the artifact %s (kvq profile)",
                           kvq_kv_kind_name(kp->kind), miss, e->path);
    return KVQ_OK;
}

/* kv_cache != 0. Selector full: the compressed cache's own backend, full attention over
 * it. Another selector: retrieval (rp) with the cache attached (kvq_retrieval_set_kvcache,
 * as kvq run --kv and kvq eval do); it needs the artifact's positions rope. */
static kvq_status kv_seq_create(kvq_engine *e, const kvq_engine_seq_params *p,
                                const kvq_retrieval_params *rp, kvq_engine_seq **out,
                                kvq_err *err)
{
    kvq_kvcache_params kp;
    if (p->kv_cache != KVQ_ENGINE_KV_LEANKV && p->kv_cache != KVQ_ENGINE_KV_PATS &&
        p->kv_cache != KVQ_ENGINE_KV_LEANKV_PATS)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "engine: kv_cache %d (0, KVQ_ENGINE_KV_LEANKV, "
                           "KVQ_ENGINE_KV_PATS or KVQ_ENGINE_KV_LEANKV_PATS)", (int)p->kv_cache);
    kvq_status st = kv_params(e, p, &kp, err);
    if (st)
        return st;
    const int retr = p->selector != KVQ_ENGINE_SELECT_FULL;
    if (retr && rp->positions != KVQ_POSITIONS_ROPE)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "engine: kv_cache %s with a selection needs "
                           "the artifact's positions rope (it has %s: the compressed cache "
                           "holds rotated keys); selector full attends the whole compressed "
                           "cache", kvq_kv_kind_name(kp.kind), kvq_positions_name(rp->positions));
    kvq_engine_seq *s = calloc(1, sizeof *s);
    if (!s)
        return kvq_err_set(err, KVQ_E_NOMEM, "engine: out of memory");
    s->e = e;
    if ((st = kvq_kvcache_create(&e->cfg, &kp, &s->kc, err)) ||
        (retr && ((st = kvq_retrieval_create(&e->cfg, e->set, rp, &s->r, err)) ||
                  (st = kvq_retrieval_set_kvcache(s->r, s->kc, err))))) {
        kvq_engine_seq_free(s);
        return st;
    }
    *out = s;
    return KVQ_OK;
}

/* ---- selectors, measurement and the artifact's positions (kvq eval's rows) --------- */

/* The selector settings of p, and the position mode and scoring query the artifact
 * records (kvq calibrate's choice, as kvq run applies it), into rp. */
static kvq_status engine_selection(const kvq_engine *e, const kvq_engine_seq_params *p,
                                   kvq_retrieval_params *rp, kvq_err *err)
{
    static const kvq_selector sel[] = {KVQ_SELECT_CODEBOOK, KVQ_SELECT_FULL, KVQ_SELECT_ORACLE,
                                       KVQ_SELECT_FIER,     KVQ_SELECT_QUEST, KVQ_SELECT_MASS};
    if (p->selector < 0 || p->selector > KVQ_ENGINE_SELECT_MASS)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "engine: selector %d (KVQ_ENGINE_SELECT_*, "
                           "0 .. %d)", (int)p->selector, KVQ_ENGINE_SELECT_MASS);
    if (p->tau < 0 || p->tau > 1 || p->fier_group < 0 || p->quest_page < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "engine: tau %g, fier_group %d, quest_page %d: "
                           "need tau in [0, 1] and sizes >= 0 (0: the default)", p->tau,
                           (int)p->fier_group, (int)p->quest_page);
    rp->selector = sel[p->selector];
    if (p->tau > 0)
        rp->tau = p->tau;
    if (p->fier_group > 0)
        rp->fier_group = p->fier_group;
    if (p->quest_page > 0)
        rp->quest_page = p->quest_page;
    rp->measure = p->measure != 0;
    kvq_positions pm;
    kvq_score_pos ps;
    if (kvq_codebook_set_positions(e->set, &pm, &ps)) {
        rp->positions = pm;
        rp->score_pos = ps;
    }
    return KVQ_OK;
}

void kvq_engine_seq_stats(const kvq_engine_seq *s, kvq_engine_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!s || !s->r)
        return;
    kvq_retrieval_stats st;
    kvq_retrieval_stats_get(s->r, &st);
    out->steps = st.steps;
    out->visible = st.visible;
    out->attended = st.attended;
    out->bytes_read = st.bytes_read;
    out->bytes_full = st.bytes_full;
    out->measured = st.measured;
    out->recall_topk = st.recall_topk;
    out->recall_mass = st.recall_mass;
    out->out_rel_err = st.out_rel_err;
}

kvq_status kvq_engine_seq_create(kvq_engine *e, const kvq_engine_seq_params *p,
                                 kvq_engine_seq **out, kvq_err *err)
{
    if (!e || !out)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "engine: NULL argument");
    *out = NULL;
    kvq_engine_seq_params def = kvq_engine_seq_params_default();
    if (!p)
        p = &def;
    kvq_retrieval_params rp = kvq_retrieval_params_default();
    rp.selector = KVQ_SELECT_CODEBOOK;
    rp.budget.count = p->budget_tokens > 0 ? p->budget_tokens : 0;
    rp.budget.fraction = p->budget_tokens > 0 ? 0 : p->budget_fraction;
    rp.sink = p->sink;
    rp.window = p->window;
    rp.cache_dtype = p->cache_f16 ? KVQ_DT_F16 : KVQ_DT_F32;
    rp.max_tokens = p->max_tokens;
    rp.threads = p->threads;
    kvq_status st = engine_selection(e, p, &rp, err);
    if (st)
        return st;
    if (p->kv_cache)
        return kv_seq_create(e, p, &rp, out, err);
    kvq_engine_seq *s = calloc(1, sizeof *s);
    if (!s)
        return kvq_err_set(err, KVQ_E_NOMEM, "engine: out of memory");
    s->e = e;
    st = kvq_retrieval_create(&e->cfg, e->set, &rp, &s->r, err);
    if (st) {
        free(s);
        return st;
    }
    *out = s;
    return KVQ_OK;
}

void kvq_engine_seq_free(kvq_engine_seq *s)
{
    if (!s)
        return;
    kvq_retrieval_free(s->r);
    kvq_kvcache_free(s->kc);
    free(s->buf);
    free(s);
}

void kvq_engine_seq_reset(kvq_engine_seq *s)
{
    if (s->kc) {
        const kvq_attn_backend b = kvq_kvcache_backend(s->kc);
        b.reset(b.user);
    }
    if (s->r)
        kvq_retrieval_reset(s->r);
}

int64_t kvq_engine_seq_length(const kvq_engine_seq *s, int32_t layer)
{
    if (s->kc)
        return kvq_kvcache_length(s->kc, layer);
    /* every layer holds the same tokens once a step is complete */
    return kvq_retrieval_length(s->r);
}

uint64_t kvq_engine_seq_bytes(const kvq_engine_seq *s)
{
    const kvq_model_config *c = &s->e->cfg;
    if (s->kc && s->r) { /* the compressed cache's rows and the context's data (no rows) */
        kvq_retrieval_held h;
        kvq_retrieval_held_get(s->r, &h);
        return (uint64_t)(kvq_kvcache_bytes(s->kc) +
                          h.total * (double)kvq_retrieval_length(s->r) + 0.5);
    }
    if (s->kc)
        return (uint64_t)kvq_kvcache_bytes(s->kc);
    const kvq_retrieval_params *p = kvq_retrieval_get_params(s->r);
    const uint64_t es = p->cache_dtype == KVQ_DT_F16 ? 2 : 4;
    const uint64_t nl = (uint64_t)(c->n_layers - kvq_rt_local_count(c)); /* local: rings */
    const uint64_t per = nl * (uint64_t)c->n_kv_heads *
                         (2 * (uint64_t)c->head_dim * es + 2 * (uint64_t)kvq_codebook_set_groups(
                                                                      s->e->set));
    return per * (uint64_t)kvq_retrieval_length(s->r) + kvq_rt_local_bytes(s->r->local);
}

/* k, v as f32: the inputs themselves, or f16 rows converted into s->buf. */
static kvq_status rows_f32(kvq_engine_seq *s, int32_t n, const void *k, const void *v,
                           kvq_engine_dtype dt, const float **kf, const float **vf, kvq_err *err)
{
    if (!k || !v)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "engine: NULL k or v");
    if (dt == KVQ_ENGINE_F32) {
        *kf = k;
        *vf = v;
        return KVQ_OK;
    }
    if (dt != KVQ_ENGINE_F16)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "engine: dtype %d is not f32 or f16", (int)dt);
    const size_t row = (size_t)s->e->cfg.n_kv_heads * (size_t)s->e->cfg.head_dim;
    if (n > s->buf_rows) {
        float *b = realloc(s->buf, 2 * (size_t)n * row * sizeof *b);
        if (!b)
            return kvq_err_set(err, KVQ_E_NOMEM, "engine: out of memory");
        s->buf = b;
        s->buf_rows = n;
    }
    kvq_f16_to_f32(k, s->buf, (size_t)n * row);
    kvq_f16_to_f32(v, s->buf + (size_t)n * row, (size_t)n * row);
    *kf = s->buf;
    *vf = s->buf + (size_t)n * row;
    return KVQ_OK;
}

kvq_status kvq_engine_seq_append(kvq_engine_seq *s, int32_t layer, int32_t n, const int64_t *pos,
                                 const void *k, const void *v, kvq_engine_dtype dt, kvq_err *err)
{
    const float *kf, *vf;
    kvq_status st = rows_f32(s, n < 1 ? 1 : n, k, v, dt, &kf, &vf, err);
    if (!st && s->r) /* retrieval's rows and codes (with a compressed cache: its data) */
        st = kvq_retrieval_append(s->r, layer, n, pos, kf, vf, err);
    if (!st && s->kc)
        st = kvq_kvcache_append(s->kc, layer, n, pos, kf, vf, err);
    return st;
}

kvq_status kvq_engine_seq_decode(kvq_engine_seq *s, int32_t layer, int64_t pos, const float *q,
                                 const void *k, const void *v, kvq_engine_dtype dt, float *out,
                                 kvq_err *err)
{
    const float *kf, *vf;
    if (!q || !out)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "engine: NULL q or out");
    if (layer < 0 || layer >= s->e->cfg.n_layers)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "engine: layer %d is outside [0, %d)",
                           (int)layer, (int)s->e->cfg.n_layers);
    kvq_status st = rows_f32(s, 1, k, v, dt, &kf, &vf, err);
    if (st)
        return st;
    const kvq_attn_call c = {.layer = layer, .n = 1, .pos = &pos, .q = q, .k = kf, .v = vf,
                             .out = out};
    kvq_attn_backend b = s->r ? kvq_retrieval_backend(s->r) : kvq_kvcache_backend(s->kc);
    return b.attend(b.user, &c, err);
}

const int32_t *kvq_engine_seq_last_selection(const kvq_engine_seq *s, int32_t layer,
                                             int32_t kv_head, int64_t *count)
{
    int64_t n = 0;
    const int32_t *sel = s && s->r ? kvq_retrieval_last_selection(s->r, layer, kv_head, &n) : NULL;
    if (count)
        *count = n;
    return sel;
}
