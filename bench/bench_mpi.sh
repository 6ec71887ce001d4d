#!/usr/bin/env bash
# bench_mpi.sh — strong scaling of `kvq capture` and `kvq fit` under mpirun on this
# machine: 1 process (plain kvq, no mpirun) against N ranks of 1 thread each, on the
# same inputs; checks the outputs are byte-identical and prints, per stage, the wall
# times with speedup and efficiency (T1 / (N x TN)), and the CPU seconds of all
# processes (user + sys of mpirun's children) with the CPU efficiency CPU1 / CPUN: the
# work the split adds (merge, messages, start-up). Waiting ranks sleep, so on a machine
# shared with other work the CPU figure is the stable one; the wall figure needs N free
# cores. Last, the fit's CPU cost per (layer, KV head) job.
#
#   bash bench/bench_mpi.sh [MODEL] [RANKS] [TOKENS] [K] [ITERS]
#   defaults: .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch-model.sh),
#             2 ranks, 8192 tokens of python3.11-doc text in sequences of 512, K 128,
#             25 iterations
# Needs mpirun (scripts/install-deps.sh) and a kvq built with MPI (`kvq version`).
set -euo pipefail
KVQ=${KVQ:-build/kvq}
M=${1:-.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
N=${2:-2}
TOKENS=${3:-8192}
K=${4:-128}
ITERS=${5:-25}
CORPUS=${CORPUS:-/usr/share/doc/python3.11/html/_sources/library}
MPIRUN="mpirun --oversubscribe --allow-run-as-root --mca btl self,vader --bind-to none"
"$KVQ" version | grep -q '^mpi: on' || { echo "bench_mpi: $KVQ was built without MPI" >&2; exit 1; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
now() { date +%s.%N; }
calc() { python3 -c "print($1)"; }
# timed CMD...: runs CMD and prints "WALL CPU" (CPU: user + sys of the processes it waited for).
timed() {
  python3 -c 'import resource, subprocess, sys, time
t = time.time(); rc = subprocess.call(sys.argv[1:]); w = time.time() - t
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print("%.3f %.3f" % (w, r.ru_utime + r.ru_stime)); sys.exit(rc)' "$@"
}

cap() { timed $RUN "$KVQ" capture --model "$M" --corpus "$CORPUS" --seq-len 512 --max-tokens "$TOKENS" \
          --threads 1 -q "$@"; }
fit() { timed $RUN "$KVQ" fit --capture "$T/c1" --moments "$T/m" --codebook "$K" --iters "$ITERS" \
          --threads 1 -q "$@"; }

echo "bench_mpi: $M, $TOKENS tokens, K $K, $ITERS iterations, 1 thread per rank; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
c1=$(RUN= cap -o "$T/c1")
cN=$(RUN="$MPIRUN -np $N" cap -o "$T/cN")
diff -r "$T/c1" "$T/cN" >/dev/null && same_c=yes || same_c=NO
"$KVQ" moments --capture "$T/c1" -o "$T/m" -q
f1=$(RUN= fit -o "$T/f1.kvq")
fN=$(RUN="$MPIRUN -np $N" fit -o "$T/fN.kvq")
cmp -s "$T/f1.kvq" "$T/fN.kvq" && same_f=yes || same_f=NO
heads=$(python3 -c "import json;c=json.load(open('$T/c1/capture.json'));print(len(c['layers'])*c['model']['n_kv_heads'])")
printf '%-8s %9s %9s %8s %8s | %9s %9s %8s | %s\n' stage "wall 1" "wall $N" speedup effic. \
  "CPU 1" "CPU $N" "CPU eff." same-bytes
for s in capture fit; do
  if [ $s = capture ]; then a=$c1 b=$cN same=$same_c; else a=$f1 b=$fN same=$same_f; fi
  set -- $a $b   # wall1 cpu1 wallN cpuN
  printf '%-8s %9.2f %9.2f %8.2f %8.2f | %9.2f %9.2f %8.2f | %s\n' $s "$1" "$3" "$(calc "$1 / $3")" \
    "$(calc "$1 / ($N * $3)")" "$2" "$4" "$(calc "$2 / $4")" $same
done
set -- $f1
echo "fit: $heads heads, $(calc "'%.3f' % ($2 / $heads)") CPU s per head on 1 thread"
