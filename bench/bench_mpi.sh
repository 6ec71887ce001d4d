#!/usr/bin/env bash
# bench_mpi.sh — strong scaling of `kvq capture` and `kvq fit` under mpirun on this
# machine: 1 process (plain kvq, no mpirun) against N ranks of 1 thread each, on the
# same inputs; checks the outputs are byte-identical and prints wall times, speedup and
# efficiency (T1 / (N x TN)), and the fit's cost per (layer, KV head) job.
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
timed() { local t0; t0=$(now); "$@"; calc "$(now) - $t0"; }

cap() { $RUN "$KVQ" capture --model "$M" --corpus "$CORPUS" --seq-len 512 --max-tokens "$TOKENS" \
          --threads 1 -q "$@"; }
fit() { $RUN "$KVQ" fit --capture "$T/c1" --moments "$T/m" --codebook "$K" --iters "$ITERS" \
          --threads 1 -q "$@"; }

echo "bench_mpi: $M, $TOKENS tokens, K $K, $ITERS iterations, 1 thread per rank; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
c1=$(RUN= timed cap -o "$T/c1")
cN=$(RUN="$MPIRUN -np $N" timed cap -o "$T/cN")
diff -r "$T/c1" "$T/cN" >/dev/null && same_c=yes || same_c=NO
"$KVQ" moments --capture "$T/c1" -o "$T/m" -q
f1=$(RUN= timed fit -o "$T/f1.kvq")
fN=$(RUN="$MPIRUN -np $N" timed fit -o "$T/fN.kvq")
cmp -s "$T/f1.kvq" "$T/fN.kvq" && same_f=yes || same_f=NO
heads=$(python3 -c "import json;c=json.load(open('$T/c1/capture.json'));print(len(c['layers'])*c['model']['n_kv_heads'])")
printf '%-8s %10s %10s %8s %10s %s\n' stage "1 proc s" "$N ranks s" speedup efficiency same-bytes
for s in capture fit; do
  if [ $s = capture ]; then a=$c1 b=$cN same=$same_c; else a=$f1 b=$fN same=$same_f; fi
  printf '%-8s %10.2f %10.2f %8.2f %10.2f %s\n' $s "$a" "$b" "$(calc "$a / $b")" "$(calc "$a / ($N * $b)")" $same
done
echo "fit: $heads heads, $(calc "'%.3f' % ($f1 / $heads)") s per head on 1 thread"
