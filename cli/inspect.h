/* inspect.h — the pieces of `kvq inspect` (cli/cmd_inspect.c: detection and entry;
 * one file per kind: inspect_gguf.c, inspect_safetensors.c, inspect_artifact.c,
 * inspect_capture.c; shared rendering: inspect_render.c). Each inspect_KIND prints
 * the text report, or with json = 1 one JSON document, and returns the exit code. */
#ifndef KVQ_CLI_INSPECT_H
#define KVQ_CLI_INSPECT_H

#include <cJSON.h>
#include <stdint.h>
#include <stdio.h>

#include "kvq.h"

/* Arrays with more items than this are shown as "[N x type]". */
#define SHORT_ARRAY 8
/* Strings longer than this are cut in the text output ("... (N bytes)"). */
#define SHORT_STRING 64

int inspect_gguf(const char *path, uint64_t file_size, int json);
int inspect_safetensors(const char *path, uint64_t file_size, int json);
int inspect_kvq(const char *path, uint64_t file_size, int json);
int inspect_capture(const char *path, int json);

/* ---- text (inspect_render.c) */

/* Writes s[0..n) with control characters, quotes and backslashes escaped; cuts
 * strings longer than `max` bytes (0 = never) at a UTF-8 boundary. */
void put_escaped(FILE *f, const char *s, size_t n, size_t max);
/* "s", escaped and cut at SHORT_STRING. */
void put_quoted(FILE *f, const char *s, size_t n);
/* [d0, d1, ...] */
void put_dims(FILE *f, int n, const int64_t *dims);
/* Width of the widest of n strings (NULLs skipped). */
int widest(const char *const *s, size_t n);

/* ---- JSON (inspect_render.c; a NULL from an allocation failure drops the field, the
 * final print then fails and reports it) */

cJSON *json_u64(uint64_t v);   /* above 2^53: a decimal string */
cJSON *json_i64(int64_t v);
cJSON *json_f32(double v);     /* the shortest decimal that reads back to the float32 */
cJSON *json_dims(int n, const int64_t *dims);
cJSON *json_num_or_null(double x); /* shortest exact decimal; null when not finite */
cJSON *json_str_or_null(const char *s);
/* {"path", "format", "file_size"}: the head of every document. */
cJSON *json_header(const char *path, const char *format, uint64_t file_size);
/* Prints and frees doc; returns the exit code. */
int json_emit(const char *path, cJSON *doc);

/* ---- reading a description back for the text (inspect_render.c). The text of every
 * kind is rendered from the JSON document that --json prints: one description. */

/* The string o[key], or dflt when absent or not a string (o may be NULL). */
const char *jstr(const cJSON *o, const char *key, const char *dflt);
/* A number (or a raw number of json_num_or_null) as a double; NaN otherwise. */
double jvalue(const cJSON *x);
/* A json_i64 value (a number, or a decimal string beyond 2^53); 0 otherwise. */
int64_t jint(const cJSON *x);
/* o[key] as a number, or dflt when absent, null or not a number. */
double jnum_or(const cJSON *o, const char *key, double dflt);
/* o[key] of json_u64 (a number, or a decimal string above 2^53); 0 when absent. */
uint64_t ju64(const cJSON *o, const char *key);
/* The metadata value md[key] (a string) as a number: NaN when absent or not entirely
 * a number. */
double jmeta_num(const cJSON *md, const char *key);

/* ---- safetensors listings (inspect_safetensors.c), shared by the artifact's payload and
 * the capture's layer files */

/* The keys of a st_meta_json object whose name passes `want` (NULL = all) under
 * "\nTITLE (N):", one "  key  value" line each (nothing when none passes). */
void meta_text(const cJSON *md, const char *title, int (*want)(const char *));
/* The table of a st_tensors_json array; data_size: the bytes of the data section. */
void tensors_text(const cJSON *ts, uint64_t data_size);
/* {key: value} of the keys that pass `want`, prefix_strip cut from the key. */
cJSON *st_meta_json(const kvq_st *st, const char *prefix_strip, int (*want)(const char *));
/* [{name, dtype, shape, offset, nbytes}] */
cJSON *st_tensors_json(const kvq_st *st);

#endif
