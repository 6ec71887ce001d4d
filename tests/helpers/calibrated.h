/* calibrated.h — a tiny llama checkpoint calibrated into an artifact, the fixture of the
 * embedding API's tests (test_engine.c, test_engine_positions.c). */
#ifndef KVQ_TEST_CALIBRATED_H
#define KVQ_TEST_CALIBRATED_H

#include <stddef.h>
#include <stdint.h>

#include "helpers/tinyllama.h"

/* t written as an HF checkpoint to dir and calibrated (kvq_calibrate_run) into art on
 * n_ids random token ids below t's vocab (a kvq_rng seeded with seed; the ids written to
 * ids_path, an "ids:" corpus; sequences of 128, no held-out tokens, no profile, 16
 * centroids, iters Lloyd iterations); then n_tokens more ids from the same generator into
 * tokens, and the checkpoint's fingerprint into fp (KVQ_FINGERPRINT_CAP bytes). Returns
 * 0, or -1 with the error on stderr. */
int tinyllama_calibrated(const tinyllama *t, const char *dir, const char *art,
                         const char *ids_path, uint64_t seed, size_t n_ids, int32_t iters,
                         int32_t *tokens, int n_tokens, char *fp);

#endif
