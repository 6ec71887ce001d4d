#!/usr/bin/env python3
"""check_layout.py's rule 4 (runtime/'s parts) on a made-up tree: each forbidden include
is reported, the allowed ones and the named exceptions are not, and a file outside every
part is reported. Exits 1 naming the first wrong answer."""
import os
import sys
import tempfile

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(root, "scripts"))
import check_layout  # noqa: E402

# file -> (its includes, how many problems rule 4 must report for it)
TREE: dict[str, tuple[list[str], int]] = {
    "runtime/kernels/k.c": (["runtime/kernels/rk.h"], 0),
    "runtime/kernels/bad.c": (["runtime/runtime_internal.h"], 1),
    "runtime/cache/c.c": (["runtime/runtime_internal.h", "runtime/select/selector.h"], 0),
    "runtime/cache/bad.c": (["runtime/select/codebook/codebook.h", "runtime/select/mass.h"], 2),
    "runtime/select/fier.c": (["runtime/select/selector.h", "runtime/kernels/kernels.h"], 0),
    "runtime/select/bad.c": (["runtime/select/codebook/codebook.h"], 1),
    "runtime/select/mass.c": (["runtime/select/codebook/codes.h"], 0),
    "runtime/select/codebook/cb.c": (["runtime/select/mass.h", "runtime/cuda/x.h"], 0),
    "runtime/top.c": (["runtime/select/selector.h", "runtime/kernels/rk.h"], 0),
    "runtime/bad_top.c": (["runtime/select/mass.h", "runtime/cache/cache.h"], 2),
    "runtime/probe.c": (["runtime/select/mass.h"], 0),
    "runtime/nowhere/x.c": ([], 1),
}


def main() -> int:
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            for path, (incs, _) in TREE.items():
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.write("".join(f'#include "{i}"\n' for i in incs))
            bad = check_layout.runtime_problems(list(TREE))
        finally:
            os.chdir(here)
    for path, (_, want) in TREE.items():
        got = sum(1 for b in bad if b.startswith(path + ":"))
        if got != want:
            sys.stderr.write(f"test_layout_runtime: {path}: {got} problems, expected {want}: "
                             f"{bad}\n")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
