#!/usr/bin/env bash
# bench_profile_cpu.sh — the CPU time (user + sys) of `kvq profile` for two builds, run
# alternately N times on the same capture and fit (a shared, noisy machine: the pairs
# back to back, the mean and the least of each build), and whether their `--json`
# outputs agree: every figure, and the chosen row of every table.
#
#   bench/bench_profile_cpu.sh BASE_KVQ NEW_KVQ CAPTURE ARTIFACT [N] [KNOBS] [THREADS]
#
# e.g. bench/bench_profile_cpu.sh /tmp/base/build/kvq build/kvq HELDOUT fit.kvq 5 leankv,pats
# CAPTURE: a held-out capture (bench_profile.sh writes one to $KVQ_BENCH_DIR/heldout).
set -euo pipefail
BASE=$1 NEW=$2 CAP=$3 ART=$4 N=${5:-5} KNOBS=${6:-leankv,pats} THREADS=${7:-2}
W=$(mktemp -d /tmp/kvq-bench-cpu.XXXXXX)
trap 'rm -rf "$W"' EXIT
for i in $(seq "$N"); do
  for b in base new; do
    k=$BASE
    [ "$b" = new ] && k=$NEW
    /usr/bin/time -f "%U %S" -o "$W/t" "$k" profile --capture "$CAP" --artifact "$ART" \
      -o "$W/$b.kvq" --force --threads "$THREADS" -q --knobs "$KNOBS" --json >"$W/$b.json" 2>"$W/$b.err" || { cat "$W/$b.err" >&2; exit 1; }
    echo "$b $(awk '{printf "%.2f", $1 + $2}' "$W/t")"
  done
done | awk '{ s[$1] = s[$1] " " $2; t[$1] += $2; n[$1]++; if (!($1 in m) || $2 < m[$1]) m[$1] = $2 }
  END { for (b in t) printf "%-4s %s s   mean %.2f, least %.2f\n", b, s[b], t[b] / n[b], m[b] }'
python3 - "$W/base.json" "$W/new.json" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for k, ta in a["tables"].items():
    tb = b["tables"][k]
    if "rows" not in ta:
        continue
    worst, moved = 0.0, 0
    for ra, rb in zip(ta["rows"], tb["rows"]):
        for x, y in zip(ra, rb):
            if x != y:
                moved += 1
                if x is not None and y is not None:
                    worst = max(worst, abs(x - y) / max(abs(x), 1e-300))
    print(f"{k}: chosen {ta.get('chosen')} -> {tb.get('chosen')}, met {ta.get('met')} -> "
          f"{tb.get('met')}; {moved} figures differ, at most {worst:.3g} relative")
EOF
