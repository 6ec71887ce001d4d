#!/usr/bin/env python3
"""Make tests/data/tok_corpus.jsonl: the text corpus the tokenizer golden tests run on.

What it makes
    One JSON object per line, {"id": ..., "text": ...}, written with
    json.dumps(..., ensure_ascii=False) and "\\n" line ends:
      * 280 documents "py/<path>": the first 1,500 bytes of 280 reStructuredText
        sources of the Python 3.11 documentation, cut back to a UTF-8 character
        boundary. The sources are all files matching
        /usr/share/doc/python3.11/html/_sources/**/*.rst.txt (Debian package
        python3.11-doc), sorted by path; the 280 taken are those at indices
        floor(i * N / 280), i = 0..279, where N is the number of files.
      * 24 hand-written hard cases "hard/<name>" (below): contractions, digit runs,
        whitespace runs, CJK, NFC/NFD Latin, emoji/ZWJ, Arabic/Devanagari,
        punctuation runs, code, control bytes the SmolLM2 vocabulary lacks.
    The text is committed so that the tests never depend on the Debian package.

From what
    python3.11-doc (Debian), plus the literals in this file. Nothing else.

How to rerun
    python3 scripts/gen_tok_corpus.py [--src DIR] [-o tests/data/tok_corpus.jsonl]
    Deterministic: the same package version gives the same bytes. After
    regenerating, rerun scripts/gen_tok_golden.py (the golden ids follow the corpus).
"""
import argparse
import json
import os
import sys
import unicodedata

N_DOCS = 280
DOC_BYTES = 1500

# Each entry: (name, text). Keep them free of "<|", so that no literal special-token
# string appears (llama.cpp is asked with special=False, HF would match added tokens).
_LATIN = "Café naïve résumé façade Ångström Øresund Škoda Zürich coöperate"
HARD = [
    ("contractions",
     "I'm sure they'll say it's fine, don't you think? We've seen it, you're right, "
     "he'd go. IT'S LOUD, DON'T SHOUT, WE'VE, I'M, THEY'LL, HE'D, YOU'RE. "
     "Mixed: It'S, Don'T, we'Ve, I'M. Quotes: 'single' and the dog's bone's."),
    ("contractions_apostrophes",
     "rock'n'roll o'clock ma'am y'all 'tis '90s ''double'' 's 't 're 've 'm 'll 'd "
     "'S 'T 'RE 'VE 'M 'LL 'D curly: it’s don’t"),
    ("digit_runs",
     "1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890 "
     "a1b22c333d4444e55555 3.14159 1,000,000 2024-01-31 0x1F 1e-10 +44 (0)20 "
     "v1.2.3 #42 100% $9.99 ¹²³ ½ Ⅻ ٠١٢٣ १२३ ４５６"),
    ("whitespace_runs",
     "a  b   c    d     e\t\tf\t g \t h\n\ni\n\n\nj \n k\r\nl\r\n\r\nm   \n   n\u00a0o\u2003p"),
    ("trailing_spaces", "trailing spaces   \nand tabs\t\t\nend with space "),
    ("leading_spaces", "   leading spaces\n\tand a tab then text"),
    ("only_whitespace", " \t \n  \n\n   "),
    ("cjk",
     "你好，世界！这是一个测试。日本語のテキストとカタカナ ー、ひらがな。한국어 텍스트입니다. "
     "中文标点：“引号”《书名》（括号）"),
    ("latin_nfc", unicodedata.normalize("NFC", _LATIN)),
    ("latin_nfd", unicodedata.normalize("NFD", _LATIN)),
    ("combining_marks", "e\u0301 a\u0308 n\u0303 o\u0302\u0323 Z\u0335\u0321\u0347a\u0337lgo x\u20d7"),
    ("greek_cyrillic", "Ελληνικά γράμματα ΑΒΓ; Россия и Україна, Ђорђе — ёжик ЁЖИК"),
    ("emoji",
     "Emoji: 😀👍🏽🇺🇸 and ❤️ 👨‍👩‍👧‍👦 👩🏿‍💻 🏳️‍🌈 ☺︎ 1️⃣ #️⃣ 🧑‍🤝‍🧑"),
    ("arabic_devanagari",
     "مرحبا بالعالم، هذا اختبار. ١٢٣ — नमस्ते दुनिया, यह एक परीक्षण है। क्षत्रिय"),
    ("punctuation_runs",
     "Wait!!! Really??? ... --- (parens) [brackets] {braces} <angle> ?!?! ;;; ::: "
     "~~~ ``` ''' \"\"\" ___ *** ### @@@ $$$ %%% ^^^ &&& ||| \\\\\\ /// ==> <=> !== …"),
    ("code_python",
     "def foo(x: int) -> int:\n    \"\"\"Return x squared.\"\"\"\n    return x ** 2  # comment\n\n"
     "class A(B):\n\tpass\n\nif __name__ == '__main__':\n    print(f\"{foo(3)=}\")\n"),
    ("code_c",
     "int main(void) {\n    for (int i = 0; i < 10; ++i) { a[i] += b[i] >> 2; }\n"
     "    return x != y && p->q || !r;\n}\n/* comment */ // line\n"),
    ("urls_paths",
     "https://docs.python.org/3/library/os.path.html#os.path.join user@example.com "
     "C:\\Users\\me\\file.txt /usr/share/doc/python3.11/ ~/.config/kvq.toml"),
    ("mixed_case_words",
     "camelCaseWord PascalCaseWord snake_case_word SCREAMING_CASE kebab-case-word "
     "iPhone eBay McDonald's HTTPServer XMLHttpRequest ABCdef DEFghi"),
    ("control_bytes",
     "ctrl\x04char\x06here\x13and\x14more\x16bytes\x1dend \x01\x02\x07\x08\x0b\x0c\x1b[0m\x7f"),
    ("rare_planes", "old italic 𐌀𐌁𐌂 math 𝔸𝔹ℂ 𝟘𝟙𝟚 private \ue000 cuneiform 𒀀 tag \U000e0041 plane5 \U00050000 plane9 \U00090123"),
    ("quotes_dashes", "“Smart quotes” and ‘single’ — em dash – en dash ‐ hyphen « guillemets » „low“"),
    ("long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis supercalifragilisticexpialidocious "
     "Donaudampfschifffahrtsgesellschaftskapitän " + "x" * 60),
    ("markup",
     "<html><body class=\"a\">Hello&nbsp;world &amp; &#x27; &lt;tag&gt;</body></html> "
     "**bold** _it_ `code` [link](http://x.y) | a | b |\n|---|---|"),
]


def cut_utf8(b: bytes, n: int) -> bytes:
    """The first n bytes of b, shortened so as not to end inside a UTF-8 sequence."""
    if len(b) <= n:
        return b
    end = n
    while end > 0 and (b[end] & 0xC0) == 0x80:   # b[end] continues a character: back off
        end -= 1
    return b[:end]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default="/usr/share/doc/python3.11/html/_sources")
    ap.add_argument("-o", "--out", default="tests/data/tok_corpus.jsonl")
    a = ap.parse_args()

    paths = []
    for root, _dirs, files in os.walk(a.src):
        for f in files:
            if f.endswith(".rst.txt"):
                paths.append(os.path.relpath(os.path.join(root, f), a.src))
    paths.sort()
    if len(paths) < N_DOCS:
        sys.exit(f"gen_tok_corpus: only {len(paths)} .rst.txt files under {a.src} "
                 f"(need {N_DOCS}; apt-get install python3.11-doc)")
    picked = [paths[i * len(paths) // N_DOCS] for i in range(N_DOCS)]

    docs = []
    for p in picked:
        with open(os.path.join(a.src, p), "rb") as fh:
            raw = fh.read()
        text = cut_utf8(raw, DOC_BYTES).decode("utf-8")
        docs.append({"id": "py/" + p[: -len(".rst.txt")], "text": text})
    for name, text in HARD:
        docs.append({"id": "hard/" + name, "text": text})

    for d in docs:
        if "<|" in d["text"]:
            sys.exit(f"gen_tok_corpus: {d['id']} holds '<|' (a special-token-like string)")
    ids = [d["id"] for d in docs]
    assert len(set(ids)) == len(ids)

    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    tmp = a.out + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        for d in docs:
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    os.replace(tmp, a.out)
    print(f"{a.out}: {len(docs)} documents ({len(picked)} from {len(paths)} python docs sources, "
          f"{len(HARD)} hard cases), {os.path.getsize(a.out)} bytes")


if __name__ == "__main__":
    main()
