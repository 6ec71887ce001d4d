/*
 * capture_internal.h — what the capture writer (capture.c) shares with the capture from
 * a model (capture_run.c). Not a public header.
 */
#ifndef KVQ_CAPTURE_INTERNAL_H
#define KVQ_CAPTURE_INTERNAL_H

#include "kvq/capture.h"
#include "kvq/safetensors.h"

#define COPY_CHUNK ((size_t)4 << 20) /* bytes per read when assembling a layer file */

/* "f32", "f16" or "bf16": the capture.json word for a storage dtype; NULL for a dtype a
 * capture cannot store. */
const char *kvq_capture_dtype_word(kvq_dtype t);

/* The corpus provenance of a capture into ci (spec with local paths redacted to their
 * names, seed, hash, document count), or, without a corpus, the hash of the token ids:
 * one rule for one process and for the merge of several ranks (same bytes). */
void capture_set_corpus(kvq_capture_info *ci, const kvq_capture_corpus *corpus,
                        const int32_t *tokens, int64_t n_tokens);

/* kvq_capture_tokens when p->dist has several ranks (capture_dist.c). */
kvq_status capture_tokens_dist(const kvq_model *m, const int32_t *tokens, int64_t n_tokens,
                               const int64_t *sequences, int64_t n_sequences,
                               const kvq_capture_corpus *corpus, const kvq_capture_params *p,
                               const char *dir, kvq_err *err);

#endif
