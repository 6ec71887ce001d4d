#!/usr/bin/env python3
"""corrupt.py - the corruption battery's driver (tests/cli/corrupt.sh, make fuzz).

  corrupt.py NAME FILE CASES SEED [--refuse-from OFFSET] -- CMD...

Makes CASES damaged copies of FILE, in place (FILE is restored after each case and at
the end): half are truncations at spread and random lengths (0, 1, the first bytes,
then evenly over the file), half flip one byte (XOR with a random non-zero value; the
first 256 bytes, where the headers are, get one case in three). For each it runs CMD
(the string FILE in CMD is the damaged file's path) with a time limit and checks that
the case is refused or accepted and nothing else:
  exit 0 (accepted), or exit 1 with stderr's last line starting "kvq: " and naming
  the file (its base name, or its directory's for a file inside a capture directory);
  never a signal (a crash, an abort), a timeout, another exit code, or an empty message.
With --refuse-from OFFSET, a file whose bytes from OFFSET on are checksummed (a capture
layer file: 0; a moments file: its data section), every truncation and every flip at or
after OFFSET must be refused: accepting one is a failure (issue 30 item 9).
Prints "ok NAME (N cases: R refused, A accepted)" or "FAIL NAME" with the cases.
"""
import os
import random
import shutil
import subprocess
import sys

TIMEOUT = float(os.environ.get("KVQ_CORRUPT_TIMEOUT", "20"))


def cases(size, n, rng):
    n_trunc = n // 2
    lens = sorted({0, 1, 4, 8, 16, 24, 32, min(64, size - 1)} |
                  {size * k // max(n_trunc, 1) for k in range(1, n_trunc)} |
                  {rng.randrange(size) for _ in range(n_trunc // 3)})
    lens = [x for x in lens if 0 <= x < size][:max(n_trunc, 1)]
    out = [("truncate", x, 0) for x in lens]
    while len(out) < n:
        pos = rng.randrange(min(size, 256)) if rng.random() < 1 / 3 else rng.randrange(size)
        out.append(("flip", pos, rng.randrange(1, 256)))
    return out


def main():
    name, path, n, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    cmd = sys.argv[sys.argv.index("--") + 1:]
    opts = sys.argv[5:sys.argv.index("--")]
    refuse_from = int(opts[1]) if opts[:1] == ["--refuse-from"] else None
    with open(path, "rb") as f:
        orig = f.read()
    backup = path + ".battery-orig"
    shutil.copyfile(path, backup)
    names = {os.path.basename(path), os.path.basename(os.path.dirname(os.path.abspath(path)))}
    rng = random.Random(seed)
    refused = accepted = 0
    bad = []
    try:
        for kind, pos, x in cases(len(orig), n, rng):
            data = orig[:pos] if kind == "truncate" else \
                orig[:pos] + bytes([orig[pos] ^ x]) + orig[pos + 1:]
            with open(path, "wb") as f:
                f.write(data)
            what = f"{kind} at {pos}" + (f" ^ 0x{x:02x}" if kind == "flip" else "")
            try:
                r = subprocess.run(cmd, capture_output=True, timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                bad.append(f"{what}: no answer in {TIMEOUT:g} s (a hang)")
                continue
            err = r.stderr.decode("utf-8", "replace").strip().splitlines()
            last = err[-1] if err else ""
            must_refuse = refuse_from is not None and (kind == "truncate" or pos >= refuse_from)
            if r.returncode == 0 and must_refuse:
                bad.append(f"{what}: accepted, but the bytes from {refuse_from} on are "
                           "checksummed")
            elif r.returncode == 0:
                accepted += 1
            elif r.returncode == 1 and last.startswith("kvq") and any(s in last for s in names):
                refused += 1
            elif r.returncode < 0:
                bad.append(f"{what}: killed by signal {-r.returncode}: {last[:200]}")
            else:
                bad.append(f"{what}: exit {r.returncode}, message {last[:200]!r}")
    finally:
        shutil.move(backup, path)
    if bad:
        print(f"FAIL {name} ({len(bad)} of {refused + accepted + len(bad)} cases)")
        for b in bad[:15]:
            print("  " + b)
        return 1
    print(f"ok {name} ({refused + accepted} cases: {refused} refused, {accepted} accepted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
