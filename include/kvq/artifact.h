/*
 * kvq/artifact.h — the .kvq artifact: one file, shipped next to the weights.
 *
 * Layout (docs/format.md is the full specification):
 *   1. a zstd skippable frame (magic 0x184D2A5B, u32 LE size = 24) whose content is
 *      "KVQA" (4 bytes), u32 LE major version, u32 LE minor version, u32 LE flags (0),
 *      u64 LE payload size (bytes of the decompressed safetensors payload);
 *   2. one zstd frame with the content checksum on, holding a safetensors file:
 *      tensors plus __metadata__ (model identity, method settings, provenance).
 * A reader refuses a major version it does not know (KVQ_E_VERSION) and accepts a
 * higher minor version (minor versions only add tensors or metadata keys).
 * `zstd -d` plus any safetensors reader can open an artifact.
 */
#ifndef KVQ_ARTIFACT_H
#define KVQ_ARTIFACT_H

#include "kvq/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_ARTIFACT_SKIPPABLE_MAGIC 0x184D2A5Bu
#define KVQ_ARTIFACT_TAG "KVQA"
#define KVQ_ARTIFACT_MAJOR 1
#define KVQ_ARTIFACT_MINOR 0
#define KVQ_ARTIFACT_MAX_PAYLOAD ((uint64_t)64 << 30) /* 64 GiB sanity bound */

typedef struct kvq_artifact kvq_artifact;

/* Reads, checks and decompresses an artifact. Errors: NOT_FOUND, IO, BAD_MAGIC,
 * VERSION, TRUNCATED_HEADER, TRUNCATED_DATA, TOO_LARGE, CHECKSUM, CORRUPT, NOMEM and
 * every safetensors error of the payload. */
kvq_status kvq_artifact_open(const char *path, kvq_artifact **out, kvq_err *err);
kvq_status kvq_artifact_open_memory(const void *data, size_t size, const char *label,
                                    kvq_artifact **out, kvq_err *err);
void kvq_artifact_close(kvq_artifact *a);

uint32_t kvq_artifact_major(const kvq_artifact *a);
uint32_t kvq_artifact_minor(const kvq_artifact *a);
/* The payload: tensors and __metadata__ through the safetensors API. */
const kvq_st *kvq_artifact_payload(const kvq_artifact *a);

/* Compresses a serialized safetensors payload (e.g. from a kvq_st_writer in buffer
 * mode) into an artifact at `path`, atomically. zstd_level 0 = default (19).
 * The output depends only on the payload and the level. */
kvq_status kvq_artifact_write(const char *path, int overwrite, const void *payload,
                              size_t payload_size, int zstd_level, kvq_err *err);
/* The same into a malloc'd buffer (free()). */
kvq_status kvq_artifact_encode(const void *payload, size_t payload_size, int zstd_level,
                               void **out, size_t *out_size, kvq_err *err);

#ifdef __cplusplus
}
#endif
#endif
