/*
 * capture_internal.h — what the capture writer (capture.c) shares with the capture from
 * a model (capture_run.c). Not a public header.
 */
#ifndef KVQ_CAPTURE_INTERNAL_H
#define KVQ_CAPTURE_INTERNAL_H

#include "kvq/safetensors.h"

#define COPY_CHUNK ((size_t)4 << 20) /* bytes per read when assembling a layer file */

/* "f32", "f16" or "bf16": the capture.json word for a storage dtype; NULL for a dtype a
 * capture cannot store. */
const char *kvq_capture_dtype_word(kvq_dtype t);

#endif
