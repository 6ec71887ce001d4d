/*
 * kvq/model_id.h — a model's identity: the shape and RoPE of a llama-family model as
 * every stage records it (capture.json's "model" object, the artifact's "model.*"
 * metadata) and compares it, plus the two conversions to and from kvq_model_config
 * (kvq/model.h). Implemented in model/model_id.c.
 *
 * In __metadata__ the identity is flat keys ("model.n_heads", "model.rope.base", ...:
 * the capture.json "model" object, keys joined with dots, numbers in decimal with
 * round-trip precision).
 */
#ifndef KVQ_MODEL_ID_H
#define KVQ_MODEL_ID_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/model_id.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kvq/common.h"
#include "kvq/rope.h"
#include "kvq/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest magnitude of an identity's numbers (norm_eps, the rope's), in capture.json
 * as in metadata, so that what one reader takes the other takes too. */
#define KVQ_MODEL_ID_NUM_MAX 1e300

/* The weight fingerprint: 32 lowercase hex digits (128 bits) plus the NUL. */
#define KVQ_FINGERPRINT_CAP 33

/* What decides each layer's attention beyond the shape and the RoPE (the fields of
 * kvq_model_config of the same names; kvq_model_layer_attn, kvq/model.h, turns them into
 * one layer's description). Written as "attention.*" keys, only when not 0. */
typedef struct kvq_model_attn {
    int32_t sliding_window;   /* W > 0: windowed layers attend only the last W tokens */
    int32_t sliding_from;     /* windowed layers: from this one on (sliding_period 0) ... */
    int32_t sliding_period;   /* ... or P > 0: layer l iff (l + 1) % P != 0 (gemma) */
    double rope_local_base;   /* > 0: the RoPE base of windowed layers, unscaled (gemma3) */
    double scale;             /* > 0: score scale; 0: 1/sqrt(head_dim) */
    double softcap;           /* > 0: scores become c tanh(s / c) (gemma2) */
} kvq_model_attn;

/* Model identity: the capture.json "model" object. Two files come from the same
 * model when every field except `path`, `source`, `name` and `fingerprint` agrees
 * (kvq_model_id_compare); the same checkpoint when, in addition, the fingerprints
 * agree (kvq_model_id_compare_weights). */
typedef struct kvq_model_id {
    char path[1024];          /* the model's file or directory name, without directories
                                 (provenance: a shipped file holds no local path) */
    char source[16];          /* "gguf" | "hf" */
    char name[128];           /* GGUF general.name, else the file or directory name; ""
                                 when not recorded */
    char fingerprint[KVQ_FINGERPRINT_CAP]; /* weight fingerprint (kvq_model_fingerprint,
                                 docs/format.md "Weight fingerprint"); "" when not recorded */
    char architecture[32];    /* "llama" | "mistral" | "qwen2" */
    int32_t n_layers;         /* 1 .. KVQ_CAPTURE_MAX_LAYERS in a capture.json */
    int32_t dim;
    int32_t hidden_dim;
    int32_t n_heads;          /* query heads */
    int32_t n_kv_heads;       /* divides n_heads (GQA group size n_heads / n_kv_heads) */
    int32_t head_dim;         /* even */
    int32_t vocab_size;
    int32_t context_length;
    double norm_eps;
    kvq_rope rope;            /* rope.head_dim == head_dim */
    kvq_model_attn attn;      /* sliding windows, local RoPE base, score scale, softcap:
                                 all 0 for the llama family (and in files before them) */
} kvq_model_id;

/* ---- model identity ------------------------------------------------------------ */

/* KVQ_OK when a and b describe the same model; otherwise KVQ_E_MISMATCH with the
 * message "LABEL_A vs LABEL_B: model.FIELD differs (A vs B)" for the first field that
 * differs (architecture, layer and head counts, dims, vocabulary, context length,
 * norm_eps, rope base, layout, scaling and scaling parameters; not path or source). */
kvq_status kvq_model_id_compare(const kvq_model_id *a, const char *label_a,
                                const kvq_model_id *b, const char *label_b, kvq_err *err);

/* The attention shape only (what the runtime's codebooks and caches depend on): layer,
 * head and KV-head counts, head dim, RoPE base, layout, scaling and, for a scaling other
 * than none, its parameters (linear: factor; llama3: all four), in that order. KVQ_OK
 * when they agree; else KVQ_E_MISMATCH with the message of kvq_model_id_compare,
 * "LABEL_A vs LABEL_B: model.FIELD differs (A vs B)", naming both shapes' values. */
kvq_status kvq_model_id_compare_attention(const kvq_model_id *a, const char *label_a,
                                          const kvq_model_id *b, const char *label_b,
                                          kvq_err *err);

/* Each layer's attention as kvq_model_layer_attn (kvq/model.h) describes it under a and
 * under b: window, RoPE (use, base, scaling, factor), score scale and softcap, layer by
 * layer. KVQ_OK when they agree; else KVQ_E_MISMATCH, "LABEL_A vs LABEL_B: layer L's
 * attention differs: FIELD A vs B". kvq_model_id_compare_attention calls it when both
 * identities carry an attention description (kvq_model_attn not all 0). */
kvq_status kvq_model_id_compare_layers(const kvq_model_id *a, const char *label_a,
                                       const kvq_model_id *b, const char *label_b, kvq_err *err);

/* The weight check: KVQ_OK when either fingerprint is empty (not recorded: the caller
 * decides what that means) or both are equal; else KVQ_E_MISMATCH with the message
 * "LABEL_A vs LABEL_B: the weights differ (fingerprint A (NAME_A) vs B (NAME_B)): the
 * artifact was calibrated on another checkpoint". */
kvq_status kvq_model_id_compare_weights(const kvq_model_id *a, const char *label_a,
                                        const kvq_model_id *b, const char *label_b, kvq_err *err);

/* The last path component of `path` ("dir/model.gguf" -> "model.gguf", "dir/hf/" ->
 * "hf") into out[cap]: what identities record instead of a local path. */
void kvq_path_basename(const char *path, char *out, size_t cap);
/* A comma-separated list of sources (a corpus spec, kvq/corpus.h) with every path cut
 * to its last component: "dir:/home/u/text/,uuid:4" -> "dir:text,uuid:4" (an item's
 * "KIND:" prefix, when the ':' comes before the first '/', is kept). Into out[cap]. */
void kvq_spec_redact_paths(const char *spec, char *out, size_t cap);

/* Sets the identity as __metadata__ keys PREFIX + "n_heads", PREFIX + "rope.base",
 * ... (prefix usually "model."). Errors: those of kvq_st_writer_set_meta. */
kvq_status kvq_model_id_set_meta(const kvq_model_id *m, const char *prefix, kvq_st_writer *w,
                                 kvq_err *err);
/* Reads what kvq_model_id_set_meta wrote (name and fingerprint are optional: "" when
 * absent, as in files written before they existed). `label` names the file in messages.
 * Errors: KVQ_E_NOT_FOUND (a key is missing, named), KVQ_E_CORRUPT (a value does not
 * parse or is out of range), KVQ_E_UNSUPPORTED (unknown layout or scaling). */
kvq_status kvq_model_id_from_meta(const kvq_st *st, const char *prefix, const char *label,
                                  kvq_model_id *m, kvq_err *err); /* *m untouched on failure */

#ifdef __cplusplus
}
#endif
#endif
