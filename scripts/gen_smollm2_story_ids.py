#!/usr/bin/env python3
"""gen_smollm2_story_ids.py — llama.cpp's SmolLM2 ids of the story sentence that
tests/test_corpus.c (test_sequences_real_model) cuts into sequences when stories260K is
absent. Independent of kvq: llama-cpp-python 0.3.16 (vocab only), the model's own BOS
rule (tokenizer.ggml.add_bos_token = false: no BOS). Prints a C array to paste.

    python3 scripts/gen_smollm2_story_ids.py [.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import sys

from llama_cpp import Llama

TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
        "in the park. One day, she saw a big, red ball. She wanted to")
path = sys.argv[1] if len(sys.argv) > 1 else ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
llm = Llama(model_path=path, vocab_only=True, verbose=False)
ids = llm.tokenize(TEXT.encode("utf-8"), add_bos=True, special=False)
print("/* %d ids, scripts/gen_smollm2_story_ids.py (llama.cpp) */" % len(ids))
print("static const int32_t gold_smollm2[%d] = {" % len(ids))
for i in range(0, len(ids), 12):
    print("    " + ", ".join(str(x) for x in ids[i:i + 12]) + ",")
print("};")
