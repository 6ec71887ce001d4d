#!/usr/bin/env python3
"""test_unicode_classes.py - the pre-tokenizer's character classes.

model/unicode_classes.h must be what scripts/gen_unicode_classes.py generates from
this Python's Unicode database, and its classes must agree with the `regex` module's
\\p{L} and \\p{N} (the expressions the tokenizers' pre-tokenizers are written in) on
every code point assigned in that database. Exit 0 pass, 77 skip (reason on the last
line), else fail.
"""
import bisect
import os
import subprocess
import sys
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import gen_unicode_classes as gen  # noqa: E402


def main():
    check = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_unicode_classes.py"),
                            "--check"], capture_output=True, text=True)
    if check.returncode != 0:
        print(check.stdout + check.stderr)
        print("FAIL: model/unicode_classes.h differs from the generator's output")
        return 1
    try:
        import regex
    except ImportError:
        print("table current; needs the regex module for the comparison (make deps installs it)")
        return 77
    runs = gen.runs()
    starts = [r[0] for r in runs]

    def table(cp):
        i = bisect.bisect_right(starts, cp) - 1
        return runs[i][2] if i >= 0 and runs[i][0] <= cp <= runs[i][1] else 0

    letter, number = regex.compile(r"\p{L}"), regex.compile(r"\p{N}")
    checked, wrong = 0, []
    for cp in range(0x80, 0x110000):
        ch = chr(cp)
        if unicodedata.category(ch) in ("Cn", "Cs"):
            continue  # unassigned in this database, surrogates
        checked += 1
        want = 1 if letter.match(ch) else 2 if number.match(ch) else 0
        if table(cp) != want:
            wrong.append((cp, unicodedata.category(ch), want, table(cp)))
    print(f"{checked} assigned code points above U+007F (Unicode {unicodedata.unidata_version}), "
          f"{len(wrong)} differ from regex {regex.__version__}")
    for cp, cat, want, got in wrong[:10]:
        print(f"  U+{cp:04X} {cat}: regex class {want}, table {got}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
