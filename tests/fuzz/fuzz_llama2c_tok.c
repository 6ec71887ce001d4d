/* fuzz_llama2c_tok.c — libFuzzer target for the llama2.c tokenizer.bin loader.
 *
 * Loads the input with kvq_tokenizer_from_llama2c_memory; a failure must carry a
 * documented status, a message starting with the label and no tokenizer. A tokenizer
 * that loads must follow llama2.c's conventions (0 <unk>, 1 BOS, 2 EOS, SPM) and goes
 * through tok_check.h: query consistency, encode of fixed texts and of the input's last
 * bytes, decode(encode(s)) == s where the contract promises it, BOS/EOS handling,
 * decode of out-of-range ids. Also built as a plain corpus replayer
 * (tests/fuzz/replay_main.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/tokenizer.h"
#include "tok_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvq_tokenizer *t = (kvq_tokenizer *)data; /* must be overwritten */
    kvq_err err = {0};
    const kvq_status st = kvq_tokenizer_from_llama2c_memory(data, size, "tok", &t, &err);
    if (st != KVQ_OK) {
        CHECK(t == NULL && err.status == st && strncmp(err.msg, "tok: ", 5) == 0);
        CHECK(st == KVQ_E_TRUNCATED_HEADER || st == KVQ_E_TRUNCATED_DATA ||
              st == KVQ_E_CORRUPT || st == KVQ_E_TOO_LARGE || st == KVQ_E_NOMEM);
        return 0;
    }
    CHECK(t != NULL && kvq_tokenizer_kind_of(t) == KVQ_TOKENIZER_SPM);
    const uint32_t n = kvq_tokenizer_n_vocab(t);
    CHECK(kvq_tokenizer_unk(t) == 0);
    CHECK(kvq_tokenizer_bos(t) == (n > 1 ? 1 : -1) && kvq_tokenizer_eos(t) == (n > 2 ? 2 : -1));
    const size_t tail = size < 64 ? size : 64;
    tok_check(t, (const char *)data + size - tail, tail);
    kvq_tokenizer_free(t);
    return 0;
}
