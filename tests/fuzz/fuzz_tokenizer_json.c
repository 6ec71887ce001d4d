/* fuzz_tokenizer_json.c — libFuzzer target for the HF tokenizer.json loader.
 *
 * Input: tokenizer.json, optionally followed by a NUL byte and tokenizer_config.json
 * (so the fuzzer can reach both). Loads it with kvq_tokenizer_from_hf_json_memory; a
 * failure must carry a documented status, a message starting with the label and no
 * tokenizer. A tokenizer that loads goes through tok_check.h: query consistency,
 * encode of fixed texts and of the input's last bytes, decode(encode(s)) == s where
 * the contract promises it, BOS/EOS handling, decode of out-of-range ids. Log messages
 * must be non-empty. Also built as a plain corpus replayer (tests/fuzz/replay_main.c).
 *
 * No input is skipped: the loader refuses a sparse vocabulary (largest id at least
 * 2 x entries + 1024), so the tokenizer it builds is at most a few times the input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/tokenizer.h"
#include "tok_check.h"

static void on_log(void *user, kvq_log_level level, const char *msg)
{
    CHECK(level >= KVQ_LOG_DEBUG && level <= KVQ_LOG_ERROR && msg && msg[0]);
    ++*(int *)user;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    const size_t json_len = nul ? (size_t)(nul - data) : size;
    char *config = NULL;
    if (nul) { /* the rest, NUL-terminated */
        const size_t cn = size - json_len - 1;
        config = malloc(cn + 1);
        CHECK(config);
        memcpy(config, nul + 1, cn);
        config[cn] = '\0';
    }
    int logs = 0;
    const kvq_callbacks cb = {on_log, NULL, &logs};
    kvq_tokenizer *t = (kvq_tokenizer *)config; /* must be overwritten */
    kvq_err err = {0};
    const kvq_status st = kvq_tokenizer_from_hf_json_memory((const char *)data, json_len, config,
                                                            "tok", &cb, &t, &err);
    if (st != KVQ_OK) {
        CHECK(t == NULL && err.status == st && strncmp(err.msg, "tok: ", 5) == 0);
        CHECK(st == KVQ_E_BAD_JSON || st == KVQ_E_UNSUPPORTED || st == KVQ_E_CORRUPT ||
              st == KVQ_E_TOO_LARGE || st == KVQ_E_NOMEM);
    } else {
        CHECK(t != NULL && kvq_tokenizer_kind_of(t) == KVQ_TOKENIZER_BPE);
        const size_t tail = json_len < 64 ? json_len : 64;
        tok_check(t, (const char *)data + json_len - tail, tail);
        kvq_tokenizer_free(t);
    }
    free(config);
    return 0;
}
