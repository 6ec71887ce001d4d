#!/usr/bin/env python3
"""Summarize the stderr of a KVQ_RT_DIAG_NEEDLE build of `kvq eval` (runtime/diag_needle.c).

Build and run (docs/QUALITY.md "Why the passkey prompt is missed (session 5)"):
  make clean && make OPT='-O2 -DKVQ_RT_DIAG_NEEDLE -DKVQ_RT_DIAG_LO=2896 \
      -DKVQ_RT_DIAG_HI=2916' build/kvq
  ./build/kvq eval ... --threads 1 2> diag.err
  python3 scripts/diag_needle.py diag.err

Prints, per decode position, how many of the exact top k (group-summed exact scores)
outside and inside the token range each stage keeps (codebook k1, residual stage k2,
final k), the same over the steps where the exact attention puts >= 30% of its mass on
the range, and the mean true (exact - first) and estimated (stage - first) residual part
of the score for the exact top k that reached the residual stage.
"""
import collections
import sys


def main(path):
    per = collections.defaultdict(lambda: [[0] * 4, [0] * 4])
    heavy = [[0] * 4, [0] * 4]
    gap = [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    last_mass = 0.0
    for line in open(path):
        f = line.split()
        if not f:
            continue
        if f[0] == "NEEDLE":
            pos, last_mass = int(f[2]), float(f[16])
            o, r = list(map(int, f[18:22])), list(map(int, f[23:27]))
            for i in range(4):
                per[pos][0][i] += o[i]
                per[pos][1][i] += r[i]
                if last_mass >= 0.3:
                    heavy[0][i] += o[i]
                    heavy[1][i] += r[i]
        elif f[0] == "GAP":
            for g, base in ((0, 2), (1, 6)):
                n = float(f[base])
                gap[g][0] += n * float(f[base + 1])
                gap[g][1] += n * float(f[base + 2])
                gap[g][2] += n

    def fr(c):
        return " ".join("%.3f" % (c[i] / c[0] if c[0] else 0) for i in (1, 2, 3))

    print("pos   | other: n  k1 k2 final         | range: n  k1 k2 final")
    for pos in sorted(per):
        o, r = per[pos]
        print("%5d | %6d %s | %4d %s" % (pos, o[0], fr(o), r[0], fr(r)))
    print("mass >= 0.3 steps | other %d %s | range %d %s" % (heavy[0][0], fr(heavy[0]),
                                                              heavy[1][0], fr(heavy[1])))
    for g, name in ((0, "other"), (1, "range")):
        n = gap[g][2]
        if n:
            print("%s: %d top-k stage candidates, mean exact-first %.1f, stage-first %.1f"
                  % (name, n, gap[g][0] / n, gap[g][1] / n))


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) == 2 else 2)
    main(sys.argv[1])
