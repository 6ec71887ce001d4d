/* tiny_spm.h — the committed stand-in for stories260K (scripts/gen_tiny_spm.py): a small
 * llama with a SentencePiece vocabulary in GGUF (tests/data/tiny_spm.gguf) and in
 * llama2.c's formats (tiny_spm.bin, tiny_spm_tok.bin), and its golden values from
 * llama.cpp (tests/data/tiny_spm_golden.json). The SPM / llama2.c tests run on it always,
 * and on stories260K too when ../shared has it, so a machine without ../shared skips
 * nothing. Paths are relative to the repository root (where tests/run-tests.sh runs). */
#ifndef KVQ_TEST_TINY_SPM_H
#define KVQ_TEST_TINY_SPM_H
#include <stddef.h>
#include <stdint.h>

#define TINY_SPM_GGUF "tests/data/tiny_spm.gguf"
#define TINY_SPM_BIN "tests/data/tiny_spm.bin"
#define TINY_SPM_TOK "tests/data/tiny_spm_tok.bin"
#define TINY_SPM_GOLDEN "tests/data/tiny_spm_golden.json"

typedef struct tiny_spm_text {
    char *text;
    int32_t *ids; /* llama.cpp's ids, no BOS */
    size_t n;
} tiny_spm_text;

typedef struct tiny_spm_gold {
    int32_t n_vocab;
    tiny_spm_text *texts;
    size_t n_texts;
    tiny_spm_text greedy; /* llama.cpp's greedy continuation of BOS and its text */
} tiny_spm_gold;

/* Reads TINY_SPM_GOLDEN; aborts the test (fail_msg) when it is missing or malformed. */
tiny_spm_gold *tiny_spm_gold_load(void);
void tiny_spm_gold_free(tiny_spm_gold *g);

#endif
