#!/usr/bin/env python3
"""test_quant_golden.py - tests/data/quant_golden.bin (the golden data of
tests/test_quant.c) must be exactly what scripts/gen_quant_golden.py writes with the
`gguf` PyPI package's numpy dequantization. Exit 0 pass, 77 skip (reason on the last
line), else fail.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    try:
        import gguf.quants  # noqa: F401
    except ImportError:
        print("the gguf PyPI package is not installed (make deps installs it)")
        return 77
    check = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_quant_golden.py"),
                            "--check"], capture_output=True, text=True)
    print(check.stdout + check.stderr, end="")
    if check.returncode != 0:
        print("FAIL: tests/data/quant_golden.bin differs from gguf's dequantization")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
