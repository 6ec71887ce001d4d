#!/usr/bin/env python3
"""Golden token ids for tests/data/tok_corpus.jsonl, from two independent tokenizers:
llama.cpp (SmolLM2's own GGUF tokenizer) and HF `tokenizers` (one file per
pre-tokenizer family, on SmolLM2's vocabulary and merges).

What it makes
    tests/data/tok_smollm2_llamacpp.tsv
        llama.cpp's ids for every document: llama_cpp.Llama(model, vocab_only=True)
        .tokenize(text.encode("utf-8"), add_bos=True, special=False). add_bos=True asks
        for BOS *if the model adds one*; llama.cpp consults tokenizer.ggml.add_bos_token,
        which SmolLM2's file sets to false, so no BOS appears (the header records it).
        Full id lists.
    tests/data/tok_hf_<family>.tsv, one per tests/data/hf_pre/<family>.json
        HF tokenizers' ids: Tokenizer.from_file(<tokenizer.json assembled by
        scripts/hf_tokenizer_json.py in a temporary directory>)
        .encode(text, add_special_tokens=False).ids. First 64 ids + hashes (below).
        The header says how many documents differ from the smollm family's ids and
        from llama.cpp's.

    File format (UTF-8, "\\n" line ends): lines starting with "#" are header lines,
    "# key: value"; then one tab-separated line per document, in corpus order:
        id  n_tokens  fnv1a64  sha256  ids
    ids: space-separated decimal token ids (all of them in the llama.cpp file; the
    first min(32, n) in the HF files). Both hashes are over the whole id list written
    as little-endian int32 (4 * n bytes): sha256 as 64 lowercase hex digits; fnv1a64
    is 64-bit FNV-1a (offset basis 0xcbf29ce484222325, prime 0x100000001b3, one byte at
    a time, i.e. kvq_fnv1a64(bytes, 4n, KVQ_FNV1A64_INIT)) as 16 lowercase hex digits.
    An empty list hashes the empty string.

From what
    The corpus, the GGUF (default .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf, fetched
    by scripts/fetch-model.sh), llama-cpp-python (tested with 0.3.16) and HF
    tokenizers (tested with 0.23). Never from kvq.

How to rerun
    python3 scripts/gen_tok_golden.py [--model PATH] [--corpus tests/data/tok_corpus.jsonl]
    (seconds). Regenerate tests/data/hf_pre/ first with scripts/gen_hf_pre.py if the
    family specs change.
"""
import argparse
import hashlib
import json
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_tokenizer_json as htj  # noqa: E402

FAMILIES = ["smollm", "llama3", "qwen2", "deepseek-r1-qwen", "deepseek-llm", "tekken", "gpt-4o", "gpt-2"]
HF_PREFIX = 32


def fnv1a64(b: bytes) -> int:
    h = 0xcbf29ce484222325
    for x in b:
        h ^= x
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def hashes(ids):
    b = struct.pack("<%di" % len(ids), *ids)
    return "%016x" % fnv1a64(b), hashlib.sha256(b).hexdigest()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_tsv(path, header, docs, idlists, prefix=None):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        for k, v in header:
            fh.write(f"# {k}: {v}\n")
        fh.write("# columns: id\tn_tokens\tfnv1a64\tsha256\tids\n")
        for d, ids in zip(docs, idlists):
            f, s = hashes(ids)
            shown = ids if prefix is None else ids[:prefix]
            fh.write(f"{d['id']}\t{len(ids)}\t{f}\t{s}\t{' '.join(map(str, shown))}\n")
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=htj.DEFAULT_MODEL)
    ap.add_argument("--corpus", default="tests/data/tok_corpus.jsonl")
    ap.add_argument("--outdir", default="tests/data")
    a = ap.parse_args()

    import gguf
    import llama_cpp
    import tokenizers

    with open(a.corpus, encoding="utf-8") as fh:
        docs = [json.loads(line) for line in fh]
    model_sha = sha256_file(a.model)
    corpus_sha = sha256_file(a.corpus)

    r = gguf.GGUFReader(a.model)
    meta = {k: r.fields[k].contents() for k in (
        "tokenizer.ggml.pre", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id") if k in r.fields}
    add_eos = r.fields["tokenizer.ggml.add_eos_token"].contents() \
        if "tokenizer.ggml.add_eos_token" in r.fields else "(absent)"
    del r

    # ---- llama.cpp --------------------------------------------------------------------
    llm = llama_cpp.Llama(a.model, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_cpp.llama_model_get_vocab(llm._model.model)
    add_bos = bool(llama_cpp.llama_cpp.llama_vocab_get_add_bos(vocab))
    bos, eos = llm.token_bos(), llm.token_eos()

    def piece(t):
        return llm._model.token_get_text(t) if hasattr(llm._model, "token_get_text") \
            else llm.detokenize([t], special=True).decode("utf-8", "replace")

    lc_ids = [llm.tokenize(d["text"].encode("utf-8"), add_bos=True, special=False) for d in docs]
    if add_bos:
        sys.exit("gen_tok_golden: the model asks for BOS; this script expects SmolLM2 (add_bos false)")
    header_common = [
        ("corpus", f"{os.path.basename(a.corpus)} ({len(docs)} documents, sha256 {corpus_sha})"),
        ("model", f"{os.path.basename(a.model)} (sha256 {model_sha})"),
        ("hash", "fnv1a64 and sha256 of the ids as little-endian int32 (see scripts/gen_tok_golden.py)"),
    ]
    lc_header = [
        ("source", f"llama.cpp via llama-cpp-python {llama_cpp.__version__}: "
                   "Llama(model, vocab_only=True).tokenize(text.encode('utf-8'), add_bos=True, special=False)"),
        *header_common,
        ("tokenizer.ggml.pre", meta.get("tokenizer.ggml.pre")),
        ("tokenizer.ggml.add_bos_token", str(meta.get("tokenizer.ggml.add_bos_token")).lower()),
        ("tokenizer.ggml.add_eos_token", str(add_eos).lower() if add_eos != "(absent)" else add_eos),
        ("llama_vocab_get_add_bos", str(add_bos).lower()),
        ("bos_id", f"{bos} {piece(bos)}"),
        ("eos_id", f"{eos} {piece(eos)}"),
        ("bos_in_ids", "no (add_bos false: sequences start with the first text token)"),
        ("ids", "all"),
    ]
    write_tsv(os.path.join(a.outdir, "tok_smollm2_llamacpp.tsv"), lc_header, docs, lc_ids)
    print(f"llama.cpp: {len(docs)} docs, {sum(map(len, lc_ids))} tokens, add_bos={add_bos}, "
          f"bos={bos} eos={eos}")

    # ---- HF tokenizers ------------------------------------------------------------------
    tokens, types, merges = htj.read_gguf_vocab(a.model)
    results = {}
    with tempfile.TemporaryDirectory() as td:
        for fam in FAMILIES:
            spec = htj.load_family(fam, os.path.join(a.outdir, "hf_pre"))
            path = os.path.join(td, fam, "tokenizer.json")
            os.makedirs(os.path.dirname(path))
            with open(path, "w", encoding="utf-8") as fh:
                json.dump(htj.build_tokenizer_json(tokens, types, merges, spec), fh, ensure_ascii=False)
            tk = tokenizers.Tokenizer.from_file(path)
            results[fam] = [tk.encode(d["text"], add_special_tokens=False).ids for d in docs]

    ref = results["smollm"]
    summary = []
    for fam in FAMILIES:
        ids = results[fam]
        nd_smollm = sum(x != y for x, y in zip(ids, ref))
        diff_lc = [d["id"] for d, x, y in zip(docs, ids, lc_ids) if x != y]
        spec = htj.load_family(fam, os.path.join(a.outdir, "hf_pre"))
        header = [
            ("source", f"HF tokenizers {tokenizers.__version__}: Tokenizer.from_file(tokenizer.json)"
                       ".encode(text, add_special_tokens=False).ids"),
            ("family", f"{fam} (tests/data/hf_pre/{fam}.json; llama.cpp pre names "
                       f"{', '.join(spec.get('_llama_cpp_pre', []))})"),
            ("tokenizer.json", "scripts/hf_tokenizer_json.py: SmolLM2's GGUF vocab + merges, "
                               "this family's normalizer and pre_tokenizer"),
            *header_common,
            ("docs_differing_from_hf_smollm", f"{nd_smollm} of {len(docs)}"),
            ("docs_differing_from_llamacpp", f"{len(diff_lc)} of {len(docs)}"),
            ("ids", f"first {HF_PREFIX} (n_tokens and the hashes cover all)"),
        ]
        write_tsv(os.path.join(a.outdir, f"tok_hf_{fam}.tsv"), header, docs, ids, prefix=HF_PREFIX)
        summary.append((fam, nd_smollm, diff_lc))
        print(f"hf {fam:17s} differs from hf smollm on {nd_smollm:3d}, from llama.cpp on "
              f"{len(diff_lc):3d} docs" + (f": {', '.join(diff_lc[:8])}" if fam == "smollm" and diff_lc else ""))


if __name__ == "__main__":
    main()
