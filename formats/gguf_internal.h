/* gguf_internal.h — what the GGUF reader (formats/gguf.c) and writer
 * (formats/gguf_write.c) share. Not installed. */
#ifndef KVQ_FORMATS_GGUF_INTERNAL_H
#define KVQ_FORMATS_GGUF_INTERNAL_H

#include <stdint.h>

/* Counts and lengths that would need more than this many bytes are TOO_LARGE rather
 * than TRUNCATED_HEADER: no real file is that big, so the number itself is garbage. */
#define GGUF_MAX_BYTES (UINT64_C(1) << 48)

/* Bytes one value of a GGUF metadata type takes in the file; strings and arrays give
 * their minimum (an empty string, an empty array). 0 for an invalid type. */
uint64_t kvq_gguf_type_min_bytes(uint32_t t);

#endif
