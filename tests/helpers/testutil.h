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

/* SmolLM2-135M-Instruct Q4_1 (KVQ_SMOLLM2, default
 * .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf, fetched by `make test`), or NULL. */
const char *test_smollm2_path(void);
/* The real model a model-neutral test runs on: stories260K when present, else SmolLM2
 * (so a machine without ../shared skips nothing); NULL when neither is. *is_stories is
 * set to 1 for stories260K, 0 for SmolLM2. Shapes of each, from the GGUF metadata (as
 * the `gguf` package reads it, tests/helpers/model_info.py): stories260K 5 layers x 4
 * KV heads (8 heads, head dim 8, vocab 512, BOS added); SmolLM2 30 layers x 3 KV heads
 * (9 heads, head dim 64, vocab 49152, no BOS). */
const char *test_real_model(int *is_stories);

/* Creates a fresh temporary directory; returns a static path, removed by test_tmpdir_cleanup. */
const char *test_tmpdir(void);
void test_tmpdir_cleanup(void);
/* Joins test_tmpdir() and name into a static buffer (one of 8 rotating buffers). */
const char *test_path(const char *name);

/* Writes bytes to a file; returns 0 on success. */
int test_write_file(const char *path, const void *data, size_t n);

/* Random attention rows from one kvq_rng seeded with seed, standard normal: q [nq] first,
 * then k and v [nkv] each, drawn in turn (k[0], v[0], k[1], ...). */
void test_random_qkv(uint64_t seed, float *q, size_t nq, float *k, float *v, size_t nkv);

/* Skip the current cmocka test with a reason printed first. */
#define TEST_SKIP(...) do { printf("[  SKIP    ] " __VA_ARGS__); printf("\n"); skip(); } while (0)
/* The identity and config of a small synthetic llama-shaped model (no weights): n_layers layers,
 * n_heads query heads of head_dim d over n_kv KV heads, default RoPE. */
#ifdef KVQ_UNSTABLE_API /* test_stable_api.c includes this header without it */
#include "kvq/model.h"
kvq_model_id test_synthetic_id(int32_t n_layers, int32_t n_heads, int32_t n_kv, int32_t d);
kvq_model_config test_synthetic_config(int32_t n_layers, int32_t n_heads, int32_t n_kv,
                                       int32_t d);
#endif

#endif
