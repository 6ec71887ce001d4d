#!/usr/bin/env python3
"""Assemble a HF tokenizer.json from a GGUF's byte-level BPE vocabulary and one
committed pre-tokenizer family (tests/data/hf_pre/<family>.json).

What it makes
    A complete tokenizer.json (HF `tokenizers` format 1.0):
      model          BPE, vocab = tokenizer.ggml.tokens (id = index), merges =
                     tokenizer.ggml.merges in file order (rank = index), no unk token,
                     no byte fallback, ignore_merges from the family file (default false);
      added_tokens   every token whose tokenizer.ggml.token_type is 3 (control), as
                     special, non-normalized added tokens with their GGUF ids
                     (SmolLM2: ids 0..16, <|endoftext|> .. <empty_output>);
      normalizer,
      pre_tokenizer  copied verbatim from the family file;
      decoder        ByteLevel; post_processor null (no BOS/EOS template: callers
                     encode with add_special_tokens=False).
    Only the vocabulary is SmolLM2's; the split rules are the family's. That is how
    the golden ids in tests/data/tok_hf_<family>.tsv exercise every family's
    pre-tokenizer on one small vocabulary.

From what
    The GGUF file (read with the `gguf` package's GGUFReader) and the family file.

How to rerun
    python3 scripts/hf_tokenizer_json.py --family qwen2 \\
        [--model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf] -o /tmp/qwen2/tokenizer.json
    scripts/gen_tok_golden.py imports build_tokenizer_json() from here and writes the
    files to a temporary directory only.
"""
import argparse
import json
import os

DEFAULT_MODEL = ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
HF_PRE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "hf_pre")


def read_gguf_vocab(model_path):
    """(tokens, token_types, merges) from a GGUF, as Python lists."""
    import gguf
    r = gguf.GGUFReader(model_path)
    f = r.fields
    if f["tokenizer.ggml.model"].contents() != "gpt2":
        raise SystemExit(f"{model_path}: tokenizer.ggml.model is not gpt2 (byte-level BPE)")
    tokens = f["tokenizer.ggml.tokens"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    merges = f["tokenizer.ggml.merges"].contents()
    return tokens, types, merges


def load_family(family, hf_pre_dir=HF_PRE_DIR):
    with open(os.path.join(hf_pre_dir, family + ".json"), encoding="utf-8") as fh:
        return json.load(fh)


def build_tokenizer_json(tokens, types, merges, fam):
    """The tokenizer.json object for one family spec (a dict read from hf_pre/<family>.json)."""
    vocab = {}
    for i, t in enumerate(tokens):
        if t in vocab:
            raise SystemExit(f"duplicate token string {t!r} at ids {vocab[t]} and {i}")
        vocab[t] = i
    pairs = []
    for m in merges:
        a, b = m.split(" ")            # byte-level strings hold no raw space: exactly two parts
        pairs.append([a, b])
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3]
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": False, "vocab": vocab, "merges": pairs}
    model.update(fam.get("model", {}))
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": fam["normalizer"], "pre_tokenizer": fam["pre_tokenizer"],
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": model}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--family", required=True, help="name of a file in tests/data/hf_pre/ (no .json)")
    ap.add_argument("-o", "--out", required=True, help="tokenizer.json to write")
    a = ap.parse_args()
    tokens, types, merges = read_gguf_vocab(a.model)
    tj = build_tokenizer_json(tokens, types, merges, load_family(a.family))
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as fh:
        json.dump(tj, fh, ensure_ascii=False)
    print(f"{a.out}: {len(tokens)} tokens, {len(merges)} merges, family {a.family}")


if __name__ == "__main__":
    main()
