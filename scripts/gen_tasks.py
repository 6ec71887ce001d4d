#!/usr/bin/env python3
"""Long-context retrieval prompts in natural filler text, as a jsonl task corpus.

Writes one JSON object per line, {"text": PROMPT, "answer": ANSWER, "task": KIND}, that
`kvq eval --corpus jsonl:FILE` scores as task documents (the prompt attended exactly,
the answer decoded greedily: correct when the continuation starts with ANSWER). The
filler is natural text (paragraphs of the files under --filler, in name order, rst
underlines dropped), cut to about --tokens tokens of --model's tokenizer (llama.cpp's,
through llama-cpp-python), with the needles at evenly spread depths:

  passkey   one needle "The pass key is NNNNN. Remember it. NNNNN is the pass key."
            and the question "What is the pass key? The pass key is"
  kv-recall --keys needles "The special magic number for WORD is NNNNNNN." (distinct
            words) and the question for one of them (RULER's multi-key needle):
            "What is the special magic number for WORD? The special magic number for
            WORD is"

With --check the prompts are also answered by llama.cpp with full attention (greedy),
the reference for how many the model can solve at all.

  scripts/gen_tasks.py --model M.gguf --filler DIR --tokens 4096 --n 8 --kind passkey \
      -o tasks.jsonl [--check]
  scripts/gen_tasks.py --model M.gguf --input tasks.jsonl   # check a file written before
                                                            # (context sized to its prompts)
"""
import argparse
import json
import os
import random
import re
import sys

WORDS = ["apple", "river", "candle", "tiger", "violin", "harbor", "meadow", "copper",
         "falcon", "lantern", "orchid", "pepper", "saddle", "thunder", "walnut", "zebra"]


INTRO = {"passkey": "There is an important piece of information hidden inside a lot of "
         "irrelevant text. Find it and memorize it. I will quiz you about it afterwards.",
         "kv-recall": "Some special magic numbers are hidden inside a lot of irrelevant "
         "text. Find them and memorize them. I will quiz you about one of them afterwards."}


def paragraphs(root):
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                   if f.endswith(".txt"))
    for path in files:
        text = open(path, encoding="utf-8", errors="replace").read()
        for p in re.split(r"\n\s*\n", text):
            lines = [ln for ln in p.split("\n") if ln.strip() and not re.fullmatch(r"\s*([=\-~^*#.])\1+\s*", ln)]
            if lines:
                yield "\n".join(lines)


def build(tok, paras, n_tokens, intro, needles, question, rng):
    """Filler paragraphs up to about n_tokens with the needles at spread depths."""
    body, total = [], 0
    budget = n_tokens - len(tok(intro)) - len(tok(question)) - sum(len(tok(nd)) for nd in needles) - 8
    while total < budget:
        p = next(paras)
        total += len(tok(p + "\n\n"))
        body.append(p)
    k = len(needles)
    depths = sorted(rng.sample(range(1, len(body)), k)) if len(body) > k else list(range(k))
    for off, (at, nd) in enumerate(zip(depths, needles)):
        body.insert(at + off, nd)
    return intro + "\n\n" + "\n\n".join(body) + "\n\n" + question


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--filler", help="directory of *.txt files (required unless --input)")
    ap.add_argument("--input", help="check this jsonl (written before) instead of writing one")
    ap.add_argument("--kind", choices=["passkey", "kv-recall"], default="passkey")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--n", type=int, help="prompts to write (default 8); with --keep, the most kept")
    ap.add_argument("--keys", type=int, default=4, help="needles per kv-recall prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", type=int, default=0, help="filler paragraphs skipped first")
    ap.add_argument("-o", "--out")
    ap.add_argument("--check", action="store_true", help="answer with llama.cpp too")
    ap.add_argument("--keep", metavar="FILE",
                    help="with --check/--input: write the prompts full attention answers to FILE "
                         "(at most --n, in order)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if a.keep and not (a.check or a.input):
        ap.error("--keep needs --check or --input")
    if a.keep and os.path.abspath(a.keep) in {os.path.abspath(p) for p in (a.input, a.out) if p}:
        ap.error(f"--keep {a.keep}: the same file as the prompts it filters")
    from llama_cpp import Llama
    n_ctx = a.tokens + 512
    if a.input:  # the context must hold the longest prompt of the file, whatever --tokens says
        v = Llama(a.model, vocab_only=True, verbose=False)
        longest = max((len(v.tokenize(json.loads(ln)["text"].encode("utf-8"), add_bos=True, special=False))
                       for ln in open(a.input) if ln.strip()), default=0)
        n_ctx = max(n_ctx, longest + 64)
        del v
    m = Llama(a.model, n_ctx=n_ctx, n_batch=512, verbose=False, n_threads=a.threads,
              n_threads_batch=a.threads, vocab_only=not (a.check or a.input))
    tok = lambda s: m.tokenize(s.encode("utf-8"), add_bos=False, special=False)
    if a.input:
        docs = [json.loads(ln) for ln in open(a.input) if ln.strip()]
        a.check = True
    elif not a.filler or not a.out:
        ap.error("--filler and -o are required unless --input")
    else:
        docs = generate(a, tok)
        with open(a.out, "w") as f:
            for d in docs:
                f.write(json.dumps(d) + "\n")
    if a.check:
        good = check(m, tok, docs)
        if a.keep:
            kept = [d for d, g in zip(docs, good) if g][:a.n]
            with open(a.keep, "w") as f:
                for d in kept:
                    f.write(json.dumps(d) + "\n")
            print(f"kept {len(kept)} answered prompts in {a.keep} "
                  f"({len(docs) - sum(good)} of {len(docs)} not answered by full attention)")


def generate(a, tok):
    rng = random.Random(a.seed)
    paras = paragraphs(a.filler)
    for _ in range(a.skip):
        next(paras)
    docs = []
    for i in range(a.n or 8):
        if a.kind == "passkey":
            ans = str(rng.randrange(10000, 100000))
            needles = [f"The pass key is {ans}. Remember it. {ans} is the pass key."]
            q = "What is the pass key? The pass key is"
        else:
            words = rng.sample(WORDS, a.keys)
            nums = [str(rng.randrange(1000000, 10000000)) for _ in words]
            needles = [f"The special magic number for {w} is {n}." for w, n in zip(words, nums)]
            j = rng.randrange(a.keys)
            ans, w = nums[j], words[j]
            q = f"What is the special magic number for {w}? The special magic number for {w} is"
        text = build(tok, paras, a.tokens, INTRO[a.kind], needles, q, rng)
        docs.append({"text": text, "answer": ans, "task": a.kind})
    return docs


def check(m, tok, docs):
    answered = []
    for i, d in enumerate(docs):
        ids = m.tokenize(d["text"].encode("utf-8"), add_bos=True, special=False)
        m.reset()
        m.eval(ids)
        out = []
        for _ in range(len(tok(" " + d["answer"])) + 2):
            t = m.sample(temp=0.0, top_k=1)
            out.append(t)
            m.eval([t])
        cont = m.detokenize(out).decode("utf-8", "replace").lstrip(" \n")
        good = cont.startswith(d["answer"])
        answered.append(good)
        print(f"{i}: {len(ids)} tokens, answer {d['answer']}, got {cont!r} {'ok' if good else 'WRONG'}",
              file=sys.stderr, flush=True)
    print(f"llama.cpp full attention: {sum(answered)}/{len(docs)}")
    return answered


if __name__ == "__main__":
    main()
