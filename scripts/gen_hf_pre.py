#!/usr/bin/env python3
"""Write tests/data/hf_pre/<family>.json: the normalizer and pre_tokenizer sections of
the real HF tokenizer.json of each pre-tokenizer family kvq implements.

What it makes
    One small JSON file per family, holding only
      "normalizer", "pre_tokenizer"   as the family's published tokenizer.json has them,
      "model"                         BPE model flags that change ids (only llama3:
                                      ignore_merges), merged into the BPE model section,
      "_family", "_llama_cpp_pre", "_source"   provenance (ignored by the assembler).
    scripts/hf_tokenizer_json.py joins one of them with a GGUF's vocabulary and merges.

From what
    The sections are transcribed from the checkpoints named in "_source" (their
    tokenizer.json), cross-checked against llama.cpp's src/llama-vocab.cpp, which
    quotes the same regexes per LLAMA_VOCAB_PRE_TYPE. Non-ASCII characters of the
    deepseek-llm classes are written here as code points (chr / \\u escapes), never
    pasted, because several are canonical singletons (U+1F7D, U+1FBE, U+1FD3, U+1FDB,
    U+2126, U+212A) that a copy through NFC-normalizing tools silently changes.

How to rerun
    python3 scripts/gen_hf_pre.py [-o tests/data/hf_pre]
"""
import argparse
import json
import os

GPT2_BYTELEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
BYTELEVEL_NOREGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
BYTELEVEL_NOREGEX_NOTRIM = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                            "use_regex": False}

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _cls(ranges):
    """A character class body from (lo, hi) code point pairs (hi None: one character)."""
    out = []
    for lo, hi in ranges:
        out.append(chr(lo) if hi is None else chr(lo) + "-" + chr(hi))
    return "".join(out)


# deepseek-llm's letter class (deepseek-ai/deepseek-llm-7b-base tokenizer.json, the same
# string as llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM), by code point.
DS_LETTERS = _cls([
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, None), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF),
    (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, None), (0x377, None), (0x37B, 0x37D),
    (0x37F, None), (0x386, None), (0x388, 0x38A), (0x38C, None), (0x38E, 0x3A1), (0x3A3, 0x3F5),
    (0x3F7, 0x481), (0x48A, 0x52F), (0x531, 0x556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD),
    (0x1C90, 0x1CBA), (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A),
    (0x1E00, 0x1F15), (0x1F18, 0x1F1D), (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57),
    (0x1F59, None), (0x1F5B, None), (0x1F5D, None), (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC),
    (0x1FBE, None), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC), (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB),
    (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, None), (0x2107, None), (0x210A, 0x2113),
    (0x2115, None), (0x2119, 0x211D), (0x2124, None), (0x2126, None), (0x2128, None), (0x212A, 0x212D),
    (0x212F, 0x2134), (0x2139, None), (0x213C, 0x213F), (0x2145, 0x2149), (0x214E, None), (0x2183, None),
    (0x2184, None), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE), (0x2CF2, None), (0x2CF3, None),
    (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787), (0xA78B, 0xA78E),
    (0xAB70, 0xABBF), (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A),
    (0x10400, 0x1044F), (0x104B0, 0x104D3), (0x104D8, 0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2),
    (0x118A0, 0x118DF), (0x1E900, 0x1E943),
])
DS_PUNCT = _cls([(0x21, 0x2F), (0x3A, 0x7E), (0xFF01, 0xFF0F), (0xFF1A, 0xFF5E), (0x2018, 0x201F),
                 (0x3000, 0x3002)])
DS_CJK = _cls([(0x4E00, 0x9FA5), (0x0800, 0x4E00), (0xAC00, 0xD7FF)])


def split(regex):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


def seq(*pts):
    return {"type": "Sequence", "pretokenizers": list(pts)}


FAMILIES = {
    "smollm": dict(
        _llama_cpp_pre=["smollm"],
        _source="HuggingFaceTB/SmolLM2-135M-Instruct tokenizer.json (the StarCoder tokenizer: "
                "Digits(individual_digits) then GPT-2 ByteLevel with its regex); llama.cpp: "
                "regex_exprs {\\p{N}, GPT-2 regex}",
        normalizer=None,
        pre_tokenizer=seq({"type": "Digits", "individual_digits": True}, GPT2_BYTELEVEL)),
    "llama3": dict(
        _llama_cpp_pre=["llama3", "llama-bpe", "llama-v3"],
        _source="meta-llama/Meta-Llama-3-8B tokenizer.json (model.ignore_merges = true there too)",
        normalizer=None,
        pre_tokenizer=seq(split(LLAMA3), BYTELEVEL_NOREGEX),
        model={"ignore_merges": True}),
    "qwen2": dict(
        _llama_cpp_pre=["qwen2"],
        _source="Qwen/Qwen2-7B tokenizer.json",
        normalizer={"type": "NFC"},
        pre_tokenizer=seq(split(QWEN2), BYTELEVEL_NOREGEX_NOTRIM)),
    "deepseek-r1-qwen": dict(
        _llama_cpp_pre=["deepseek-r1-qwen"],
        _source="deepseek-ai/DeepSeek-R1-Distill-Qwen-7B tokenizer.json: Qwen2.5's file with some "
                "special tokens renamed; same NFC normalizer and split as qwen2 (llama.cpp maps "
                "deepseek-r1-qwen to LLAMA_VOCAB_PRE_TYPE_QWEN2)",
        normalizer={"type": "NFC"},
        pre_tokenizer=seq(split(QWEN2), BYTELEVEL_NOREGEX_NOTRIM)),
    "deepseek-llm": dict(
        _llama_cpp_pre=["deepseek-llm"],
        _source="deepseek-ai/deepseek-llm-7b-base tokenizer.json. Note: HF isolates single digits "
                "(Digits individual_digits=true) where llama.cpp's DEEPSEEK_LLM list ends in \\p{N}+",
        normalizer={"type": "Sequence", "normalizers": []},
        pre_tokenizer=seq(split("[\r\n]"), split("\\s?[" + DS_LETTERS + "]+"),
                          split("\\s?[" + DS_PUNCT + "]+"), split("\\s+$"), split("[" + DS_CJK + "]+"),
                          {"type": "Digits", "individual_digits": True}, BYTELEVEL_NOREGEX)),
    "tekken": dict(
        _llama_cpp_pre=["tekken"],
        _source="mistralai/Mistral-Nemo-Base-2407 tokenizer.json",
        normalizer=None,
        pre_tokenizer=seq(split(TEKKEN), BYTELEVEL_NOREGEX)),
    "gpt-4o": dict(
        _llama_cpp_pre=["gpt-4o"],
        _source="Xenova/gpt-4o tokenizer.json (tiktoken o200k_base pattern)",
        normalizer=None,
        pre_tokenizer=seq(split(O200K), BYTELEVEL_NOREGEX)),
    "gpt-2": dict(
        _llama_cpp_pre=["gpt-2"],
        _source="openai-community/gpt2 tokenizer.json (ByteLevel with its built-in GPT-2 regex). "
                "llama.cpp's 'default' pre-type is NOT this: it runs 4 regexes "
                "(punctuation runs, GPT-2, \\p{N}+, [0-9]{3})",
        normalizer=None,
        pre_tokenizer=GPT2_BYTELEVEL),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--out", default="tests/data/hf_pre")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for fam, spec in FAMILIES.items():
        obj = {"_family": fam}
        obj.update(spec)
        path = os.path.join(a.out, fam + ".json")
        with open(path, "w", encoding="utf-8", newline="\n") as fh:
            json.dump(obj, fh, ensure_ascii=False, indent=1)
            fh.write("\n")
        print(path)


if __name__ == "__main__":
    main()
