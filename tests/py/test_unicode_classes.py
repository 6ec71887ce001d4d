#!/usr/bin/env python3
"""test_unicode_classes.py - the tokenizers' Unicode tables.

model/unicode_classes.h is pinned to one Unicode version (its TOK_UNICODE_VERSION,
scripts/gen_unicode_classes.py PINNED). This test reads the committed table itself and
compares it with the `regex` module's \\p{Lu} \\p{Ll} \\p{Lt} \\p{Lm} \\p{Lo} \\p{M} \\p{N}
\\p{P} and \\s (the expressions the tokenizers' pre-tokenizers are written in) on every
code point the table says is assigned, so it does not depend on this Python's Unicode
version. Code points whose class the Unicode Consortium changed after the pinned
version are listed in CHANGED (with the version of the change) and must differ from
the newer `regex` data exactly as listed. When this Python's unicodedata has the pinned
version, the headers must also be exactly what the generator writes (--check).
Exit 0 pass, 77 skip (reason on the last line), else fail.
"""
import bisect
import os
import re
import subprocess
import sys
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = os.path.join(ROOT, "model", "unicode_classes.h")
NAMES = ["other", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "N", "P", "unassigned"]

# Code points assigned in the pinned version whose general category changed later:
# {code point: class name in the newer data}.
CHANGED = {
    0x0295: "Lo",  # LATIN LETTER PHARYNGEAL VOICED FRICATIVE: Ll until 15.1, Lo from 16.0
}


def read_header():
    with open(HEADER, encoding="utf-8") as f:
        text = f.read()
    version = re.search(r'#define TOK_UNICODE_VERSION "([0-9.]+)"', text).group(1)
    body = text[text.index("TOK_CLASS_RUNS["):text.index("TOK_WHITE_SPACE[")]
    runs = [(int(a, 16), int(b, 16), int(c)) for a, b, c in
            re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+), (\d+)\}", body)]
    ws_body = text[text.index("TOK_WHITE_SPACE["):]
    ws_body = ws_body[:ws_body.index("};")]
    ws = {int(x, 16) for x in re.findall(r"0x([0-9A-F]+)", ws_body.split("=", 1)[1])}
    return version, runs, ws


def main():
    version, runs, ws = read_header()
    # the runs must tile U+0000..U+10FFFF
    nxt = 0
    for lo, hi, c in runs:
        if lo != nxt or hi < lo or not 0 <= c < len(NAMES):
            print(f"FAIL: model/unicode_classes.h: run {lo:X}..{hi:X} class {c} does not "
                  f"continue at U+{nxt:04X}")
            return 1
        nxt = hi + 1
    if nxt != 0x110000:
        print("FAIL: model/unicode_classes.h: the runs stop at U+%04X" % nxt)
        return 1
    if unicodedata.unidata_version == version:
        check = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_unicode_classes.py"),
                                "--check"], capture_output=True, text=True)
        if check.returncode != 0:
            print(check.stdout + check.stderr)
            print("FAIL: the Unicode headers differ from the generator's output")
            return 1
        gen_note = "headers current"
    else:
        gen_note = (f"generator check not run (this Python has Unicode "
                    f"{unicodedata.unidata_version}, the tables {version})")
    try:
        import regex
    except ImportError:
        print(f"{gen_note}; needs the regex module for the comparison (make deps installs it)")
        return 77
    starts = [r[0] for r in runs]

    def table(cp):
        return runs[bisect.bisect_right(starts, cp) - 1][2]

    pats = [(i, regex.compile(r"\p{%s}" % NAMES[i])) for i in range(1, 9)]
    space = regex.compile(r"\s")
    checked, wrong = 0, []
    for cp in range(0x110000):
        ch = chr(cp)
        if (space.match(ch) is not None) != (cp in ws):
            wrong.append((cp, "\\s" if cp not in ws else "not \\s", "White_Space table"))
        t = table(cp)
        if t == 9 or 0xD800 <= cp <= 0xDFFF:
            continue  # unassigned in the pinned version, surrogates
        checked += 1
        want = next((i for i, p in pats if p.match(ch)), 0)
        if cp in CHANGED:
            if NAMES[want] != CHANGED[cp]:
                wrong.append((cp, NAMES[want], f"listed as changed to {CHANGED[cp]}"))
            continue
        if t != want:
            wrong.append((cp, NAMES[want], NAMES[t]))
    print(f"{gen_note}; {checked} code points assigned in Unicode {version}, "
          f"{len(wrong)} differ from regex {regex.__version__}")
    for cp, want, got in wrong[:10]:
        print(f"  U+{cp:04X}: regex {want}, table {got}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
