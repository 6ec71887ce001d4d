#!/usr/bin/env python3
"""model_info.py GGUF — the model's shape and BOS rule as shell assignments, read with the
`gguf` package (an independent reader), for tests that run on whichever real model is
present (stories260K or SmolLM2): eval "$(python3 tests/helpers/model_info.py M)".

Prints MI_LAYERS MI_HEADS MI_KV_HEADS MI_HEAD_DIM MI_DIM MI_CTX MI_VOCAB MI_ADD_BOS
MI_BOS_ID (MI_ADD_BOS: 1 when sequences start with BOS; absent key = llama.cpp's default
for the tokenizer model: 1 for SPM "llama", else 0)."""
import sys

import gguf

r = gguf.GGUFReader(sys.argv[1])


def get(key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


arch = get("general.architecture")
heads = int(get(f"{arch}.attention.head_count"))
dim = int(get(f"{arch}.embedding_length"))
tok_model = get("tokenizer.ggml.model")
add_bos = get("tokenizer.ggml.add_bos_token", tok_model == "llama")
vocab = get(f"{arch}.vocab_size") or len(r.fields["tokenizer.ggml.tokens"].data)
print(f"MI_LAYERS={int(get(f'{arch}.block_count'))}")
print(f"MI_HEADS={heads}")
print(f"MI_KV_HEADS={int(get(f'{arch}.attention.head_count_kv', heads))}")
print(f"MI_HEAD_DIM={dim // heads}")
print(f"MI_DIM={dim}")
print(f"MI_CTX={int(get(f'{arch}.context_length'))}")
print(f"MI_VOCAB={int(vocab)}")
print(f"MI_ADD_BOS={1 if add_bos else 0}")
print(f"MI_BOS_ID={int(get('tokenizer.ggml.bos_token_id', 1))}")
