/* testutil.h — small helpers shared by the cmocka tests. */
#ifndef KVQ_TESTUTIL_H
#define KVQ_TESTUTIL_H
#include <stddef.h>
#include <stdint.h>

/* Path of the real test model (KVQ_TEST_MODEL, default
 * ../shared/models/stories260K.gguf), or NULL when the file is absent. */
const char *test_model_path(void);
/* Same for the llama2.c checkpoint and tokenizer next to it (NULL if absent). */
const char *test_model_bin_path(void);
const char *test_tokenizer_bin_path(void);

/* Creates a fresh temporary directory; returns a static path, removed by test_tmpdir_cleanup. */
const char *test_tmpdir(void);
void test_tmpdir_cleanup(void);
/* Joins test_tmpdir() and name into a static buffer (one of 8 rotating buffers). */
const char *test_path(const char *name);

/* Writes bytes to a file; returns 0 on success. */
int test_write_file(const char *path, const void *data, size_t n);

/* Skip the current cmocka test with a reason printed first. */
#define TEST_SKIP(...) do { printf("[  SKIP    ] " __VA_ARGS__); printf("\n"); skip(); } while (0)
#endif
