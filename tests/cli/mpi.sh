#!/usr/bin/env bash
# mpi.sh — `kvq calibrate`, `kvq capture` and `kvq fit` under mpirun (docs/mpi.md), on
# one machine over loopback: the outputs of 2 and 3 ranks have the bytes of one process
# (plain kvq, no mpirun); a rank killed mid-fit, then a rerun, gives the same bytes; an
# error on one rank stops all of them with the rank and the message and no output; a
# command that does not split its work runs once. Skipped only when mpirun is absent
# (scripts/install-deps.sh installs openmpi-bin). Run by tests/run-tests.sh.
. tests/helpers/clitest.sh

T=$CLI_TMP/mpi
mkdir -p "$T"
if ! command -v mpirun >/dev/null 2>&1; then
  skip mpi "mpirun not found (scripts/install-deps.sh installs openmpi-bin)"; cli_done; exit
fi
# Loopback only, any number of ranks on this machine, root allowed (CI containers).
MPIRUN="mpirun --oversubscribe --allow-run-as-root --mca btl self,vader --mca btl_vader_single_copy_mechanism none"
mpi() { local n=$1; shift; $MPIRUN -x KVQ_TEST_KILL -np "$n" "$@"; }
export KVQ_TEST_KILL=

if "$KVQ" version | grep -q '^mpi: off'; then
  # A build without MPI refuses to run as several processes, in one line from rank 0.
  _cli_run mpi 2 "$KVQ" version
  if [ "$(cat "$CLI_TMP/rc")" != 0 ] &&
     grep -q "^kvq: started as 2 processes by mpirun/srun, but this kvq was built without MPI" \
       "$CLI_TMP/stderr"; then ok mpi_off_refuses; else fail mpi_off_refuses "$(cat "$CLI_TMP/stderr")"; fi
  skip mpi_ranks "this kvq was built without MPI (make MPI=0, or no libopenmpi-dev)"
  cli_done; exit
fi
"$KVQ" version | grep -q '^mpi: on' && ok mpi_version_on || fail mpi_version_on "$("$KVQ" version)"

# stories260K (5 layers x 4 KV heads), or without ../shared its stand-in
# tests/data/tiny_spm.gguf (4 x 2): spm_model sets M and HEADS
spm_model
LAST_HEAD="layer.$((MI_LAYERS - 1)).head.$((MI_KV_HEADS - 1))"

# A command that does not split its work runs on rank 0 alone: one output.
_cli_run mpi 2 "$KVQ" inspect "$M"
[ "$(cat "$CLI_TMP/rc")" = 0 ] && [ "$(grep -c '^format' "$CLI_TMP/stdout")" -le 1 ] &&
  "$KVQ" inspect "$M" | cmp -s - "$CLI_TMP/stdout" && ok mpi_unsplit_command_runs_once ||
  fail mpi_unsplit_command_runs_once "$(head -3 "$CLI_TMP/stderr")"

# Small settings: 2048 calibration tokens in 16 sequences of 128, 256 held out.
# RUN: empty (one plain process) or "mpi N".
cal() {
  $RUN "$KVQ" calibrate --model "$M" --seq-len 128 --max-tokens 2048 --heldout-tokens 256 \
    --codebook 16 --iters 3 --threads 1 -q "$@"
}
RUN= cal -o "$T/one.kvq" >/dev/null 2>"$T/one.err" || fail mpi_reference "$(cat "$T/one.err")"
for n in 2 3; do
  if RUN="mpi $n" cal -o "$T/np$n.kvq" >/dev/null 2>"$T/np$n.err" &&
     cmp "$T/one.kvq" "$T/np$n.kvq" && diff -r "$T/one.kvq.work/capture" "$T/np$n.kvq.work/capture" &&
     diff -r "$T/one.kvq.work/heldout" "$T/np$n.kvq.work/heldout" &&
     cmp "$T/one.kvq.work/fit.kvq" "$T/np$n.kvq.work/fit.kvq"; then
    ok "mpi_calibrate_np${n}_same_bytes"
  else
    fail "mpi_calibrate_np${n}_same_bytes" "$(tail -3 "$T/np$n.err")"
  fi
done

# kvq capture on its own, with a query sample (rank 0 captures alone) and without.
for q in all 700; do
  "$KVQ" capture --model "$M" --corpus uuid:3 --seq-len 64 --queries $q -q -o "$T/cap1.$q" &&
  mpi 3 "$KVQ" capture --model "$M" --corpus uuid:3 --seq-len 64 --queries $q -q -o "$T/cap3.$q" &&
  diff -r "$T/cap1.$q" "$T/cap3.$q" >/dev/null && ok "mpi_capture_np3_queries_${q}_same_bytes" ||
    fail "mpi_capture_np3_queries_${q}_same_bytes"
done

# Rank 1 is killed (SIGKILL) after its third head: the run fails, leaves no artifact,
# keeps the finished heads' checkpoints; a rerun resumes them and writes the same bytes.
W=$T/one.kvq.work
fit() { $RUN "$KVQ" fit --capture "$W/capture" --moments "$W/moments.safetensors" \
          --codebook 16 --iters 3 --threads 1 --seed 1234 "$@"; }
KVQ_TEST_KILL=1:3 RUN="mpi 2" fit -o "$T/k.kvq" >/dev/null 2>"$T/k.err"; rc=$?
nck=$(ls "$T/k.kvq.ckpt" 2>/dev/null | grep -c '\.safetensors$')
if [ $rc != 0 ] && [ ! -e "$T/k.kvq" ] && [ "$nck" -ge 3 ] && [ "$nck" -lt "$HEADS" ]; then
  ok mpi_fit_rank_killed_no_output
else
  fail mpi_fit_rank_killed_no_output "exit $rc, $nck checkpoints" "$(tail -3 "$T/k.err")"
fi
if RUN="mpi 3" fit -o "$T/k.kvq" >/dev/null 2>"$T/k2.err" && cmp "$W/fit.kvq" "$T/k.kvq" &&
   grep -q "resumed $nck of $HEADS heads" "$T/k2.err" && [ ! -e "$T/k.kvq.ckpt" ]; then
  ok mpi_fit_rerun_after_kill_same_bytes
else
  fail mpi_fit_rerun_after_kill_same_bytes "$(grep -v '^kvq: layer' "$T/k2.err" | tail -4)"
fi

# An error on rank 1 only (its last head's checkpoint path is taken by a directory):
# every rank stops, rank 0 names rank 1 and the problem, and there is no artifact.
mkdir -p "$T/e.kvq.ckpt/$LAST_HEAD.safetensors"
RUN="mpi 2" _cli_run fit -q -o "$T/e.kvq"
if [ "$(cat "$CLI_TMP/rc")" = 1 ] && [ ! -e "$T/e.kvq" ] &&
   grep -q "^kvq fit: rank 1 of 2: .*${LAST_HEAD//./\\.}\\.safetensors: rename failed: Is a directory\$" \
     "$CLI_TMP/stderr" && [ "$(grep -c '^kvq' "$CLI_TMP/stderr")" = 1 ]; then
  ok mpi_error_on_one_rank_stops_all
else
  fail mpi_error_on_one_rank_stops_all "$(head -3 "$CLI_TMP/stderr")"
fi
cli_done
