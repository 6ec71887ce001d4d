#!/usr/bin/env bash
# mpi.sh — `kvq calibrate`, `kvq capture`, `kvq fit` and `kvq profile` under mpirun
# (docs/mpi.md), on one machine over loopback: the outputs of 2 and 3 ranks have the
# bytes of one process (plain kvq, no mpirun); a rank killed mid-fit, mid-profile or
# mid-capture, then a rerun, gives the same bytes and leaves no temporary; an error on
# one rank stops all of them with the rank and the message and no output; a
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
# Under an ASan build (make asan) Open MPI's allocations kept until exit read as leaks
# of every rank: suppressed, with the malloc stacks unwound in full so that the
# suppressions see the MPI libraries' frames (the fast unwinder stops at the first frame
# of a library built without frame pointers). No effect on other builds.
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$PWD/tests/helpers/lsan_mpi.supp:print_suppressions=0"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
mpi() { local n=$1; shift; $MPIRUN -x KVQ_TEST_KILL -x LSAN_OPTIONS -x ASAN_OPTIONS -np "$n" "$@"; }
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

# kvq profile on its own: the LeanKV/PATS grid and the budget/tau passes split by layers
# (stories260K's 5 layers: rank 0 runs 0..1 of 2 ranks, 0..1 of 3; both re-measure settings near the
# tolerance on every row here, so the second passes and their rank-0 decisions are
# covered), the split logged by rank 0; same bytes as one process (and as calibrate's
# profile stage, which ran the same profile).
W=$T/one.kvq.work
prof() { $RUN "$KVQ" profile --capture "$W/heldout" --artifact "$W/fit.kvq" --threads 1 "$@"; }
RUN= prof -q -o "$T/p1.kvq" >/dev/null 2>"$T/p1.err" || fail mpi_profile_reference "$(cat "$T/p1.err")"
for n in 2 3; do
  if RUN="mpi $n" prof -o "$T/p$n.kvq" >/dev/null 2>"$T/p$n.err" && cmp "$T/p1.kvq" "$T/p$n.kvq" &&
     cmp "$W/profile.kvq" "$T/p$n.kvq" &&
     grep -q "^kvq: profile: leankv/pats: $n ranks split $MI_LAYERS layers; rank 0 runs layers 0\.\.[0-9];" "$T/p$n.err" &&
     grep -q "^kvq: profile: budget: $n ranks split $MI_LAYERS layers; rank 0 runs layers 0\.\.[0-9];" "$T/p$n.err"; then
    ok "mpi_profile_np${n}_same_bytes"
  else
    fail "mpi_profile_np${n}_same_bytes" "$(grep -v '[0-9]/[0-9]' "$T/p$n.err" | tail -3)"
  fi
done
# The job sample of the LeanKV/PATS grid (--sample-jobs 0.5: 4 of stories260K's 8 jobs
# a layer, 20 in all; the stand-in model has too few jobs for one, so every job): the
# same bytes for 1, 2 and 3 ranks (the sampled jobs' sums gathered to rank 0 and sent
# back to every rank for the second pass's decision).
RUN= prof -q --sample-jobs 0.5 --json -o "$T/j1.kvq" >"$T/j1.json" 2>"$T/j1.err" ||
  fail mpi_profile_job_sample_reference "$(cat "$T/j1.err")"
for n in 2 3; do
  if RUN="mpi $n" prof -q --sample-jobs 0.5 -o "$T/j$n.kvq" >/dev/null 2>"$T/j$n.err" &&
     cmp "$T/j1.kvq" "$T/j$n.kvq" &&
     { [ "$MI_LAYERS" != 5 ] || grep -q '"jobs": 40, "sampled_jobs": 20' "$T/j1.json"; }; then
    ok "mpi_profile_job_sample_np${n}_same_bytes"
  else
    fail "mpi_profile_job_sample_np${n}_same_bytes" "$(tail -3 "$T/j$n.err")"
  fi
done

# The budget/tau pass's job sample (the sequences of a layer): 8 held-out sequences of
# 128 tokens, 4 of them a layer with --sample-jobs 0.5 (stories260K: 20 in all; the
# stand-in has too few layers for one): the same bytes for 1 and 2 ranks, the sampled
# sequences' sums sent to rank 0, which decides which settings run on the others.
"$KVQ" capture --model "$M" --corpus uuid:3 --seq-len 128 --max-tokens 1024 --threads 1 -q \
  -o "$T/hj" 2>"$T/hj.err" || fail mpi_budget_job_sample_capture "$(cat "$T/hj.err")"
bprof() { $RUN "$KVQ" profile --capture "$T/hj" --artifact "$W/fit.kvq" --threads 1 \
  --knobs budget,mass --sample-jobs 0.5 "$@"; }
RUN= bprof -o "$T/b1.kvq" >/dev/null 2>"$T/b1.err" || fail mpi_budget_job_sample_reference "$(cat "$T/b1.err")"
if RUN="mpi 2" bprof -q -o "$T/b2.kvq" >/dev/null 2>"$T/b2.err" && cmp "$T/b1.kvq" "$T/b2.kvq" &&
   { [ "$MI_LAYERS" != 5 ] || grep -q "^kvq: profile: budget, job sample" "$T/b1.err"; }; then
  ok mpi_profile_budget_job_sample_np2_same_bytes
else
  fail mpi_profile_budget_job_sample_np2_same_bytes "$(tail -3 "$T/b2.err")"
fi

# Rank 1 profiles layers too: killed (SIGKILL) after its first layer, the run fails
# with no output; a rerun writes the same bytes.
KVQ_TEST_KILL=1:1:profile RUN="mpi 2" prof -q -o "$T/pk.kvq" >/dev/null 2>"$T/pk.err"; rc=$?
if [ $rc != 0 ] && [ ! -e "$T/pk.kvq" ] && ! ls "$T" | grep -q '^pk\.kvq\.tmp\.' &&
   RUN="mpi 2" prof -q -o "$T/pk.kvq" >/dev/null 2>"$T/pk2.err" && cmp "$T/p1.kvq" "$T/pk.kvq"; then
  ok mpi_profile_rank_killed_rerun_same_bytes
else
  fail mpi_profile_rank_killed_rerun_same_bytes "exit $rc" "$(tail -n 2 "$T/pk.err" "$T/pk2.err")"
fi
# An error on rank 1 only (the last layer file, which rank 1 profiles, is truncated):
# every rank stops, rank 0 names rank 1 and the file, and there is no output.
cp -r "$W/heldout" "$T/hbad"
LAST_FILE=$(printf 'layer_%03d.safetensors' $((MI_LAYERS - 1)))
truncate -s 2000 "$T/hbad/$LAST_FILE"
_cli_run mpi 2 "$KVQ" profile --capture "$T/hbad" --artifact "$W/fit.kvq" --threads 1 -q \
  -o "$T/pe.kvq"
if [ "$(cat "$CLI_TMP/rc")" = 1 ] && [ ! -e "$T/pe.kvq" ] && ! ls "$T" | grep -q '^pe\.kvq\.' &&
   grep -q "^kvq profile: rank 1 of 2: .*hbad/${LAST_FILE%.safetensors}\\.safetensors: tensors need [0-9]* data bytes but the file holds" \
     "$CLI_TMP/stderr" && [ "$(grep -c '^kvq' "$CLI_TMP/stderr")" = 1 ]; then
  ok mpi_profile_error_on_one_rank_stops_all
else
  fail mpi_profile_error_on_one_rank_stops_all "$(head -3 "$CLI_TMP/stderr")"
fi

# kvq capture on its own, with a query sample (rank 0 captures alone) and without.
for q in all 700; do
  "$KVQ" capture --model "$M" --corpus uuid:3 --seq-len 64 --queries $q -q -o "$T/cap1.$q" &&
  mpi 3 "$KVQ" capture --model "$M" --corpus uuid:3 --seq-len 64 --queries $q -q -o "$T/cap3.$q" &&
  diff -r "$T/cap1.$q" "$T/cap3.$q" >/dev/null && ok "mpi_capture_np3_queries_${q}_same_bytes" ||
    fail "mpi_capture_np3_queries_${q}_same_bytes"
done

# A corpus given by path: the capture records the file's name only, as one process does.
TXT=/usr/share/doc/python3.11/html/_sources/tutorial/classes.rst.txt
if [ -f "$TXT" ]; then
  "$KVQ" capture --model "$M" --corpus "$TXT" --seq-len 64 --max-tokens 512 -q -o "$T/capf1" &&
  mpi 2 "$KVQ" capture --model "$M" --corpus "$TXT" --seq-len 64 --max-tokens 512 -q -o "$T/capf2" &&
  diff -r "$T/capf1" "$T/capf2" >/dev/null && ok mpi_capture_np2_corpus_path_same_bytes ||
    fail mpi_capture_np2_corpus_path_same_bytes "$(diff "$T/capf1/capture.json" "$T/capf2/capture.json" | head -4)"
else
  skip mpi_capture_np2_corpus_path_same_bytes "$TXT not found (Debian python3.11-doc)"
fi

# A capture killed on rank 1 leaves rank 0's temporary directory with the ranks' pieces
# in it. Their processes are gone, but their pids are replaced by a live one ($$), as
# for ranks that ran on other machines (where a pid says nothing): the rerun, which owns
# its output's temporaries, removes them, writes the same bytes and leaves none.
capk() { mpi 3 "$KVQ" capture --model "$M" --corpus uuid:3 --seq-len 64 --queries all -q \
           -o "$T/capk"; }
KVQ_TEST_KILL=1:100:capture capk >/dev/null 2>"$T/capk.err"; rc=$?
left=$(find "$T" -maxdepth 2 -name 'capk*.tmp.*' | wc -l)
for t in "$T"/capk.tmp.*; do [ -e "$t" ] && mv "$t" "$T/capk.tmp.$$.${t##*.}"; done
# Rank 0 may also see rank 1's death before mpirun kills it, and remove its own
# temporary directory (a loaded machine, seen once in CI): then one as a lost rank 0
# would have left it stands in for it.
if [ "$left" = 0 ]; then
  mkdir -p "$T/capk.tmp.$$.0123abcd/seq.0000000000" &&
    touch "$T/capk.tmp.$$.0123abcd/seq.0000000000/capture.json" && left=1
fi
if [ $rc != 0 ] && [ "$left" -ge 1 ] && [ ! -e "$T/capk" ] && capk >/dev/null 2>"$T/capk2.err" &&
   diff -r "$T/cap1.all" "$T/capk" >/dev/null && [ -z "$(find "$T" -name 'capk*.tmp.*')" ]; then
  ok mpi_capture_killed_rerun_cleans_temporaries
else
  fail mpi_capture_killed_rerun_cleans_temporaries "exit $rc, $left temporaries" \
    "$(find "$T" -name 'capk*.tmp.*' | head -3)" "$(tail -2 "$T/capk2.err")"
fi

# Rank 1 is killed (SIGKILL) after its third head: the run fails, leaves no artifact,
# keeps the finished heads' checkpoints; a rerun resumes them and writes the same bytes.
fit() { $RUN "$KVQ" fit --capture "$W/capture" --moments "$W/moments.safetensors" \
          --codebook 16 --iters 3 --threads 1 --seed 1234 "$@"; }
# (KVQ_TEST_KILL counts the progress the rank reports, the whole job's estimate: rank
# 1 of 2 reports 2 per head of its half.)
KVQ_TEST_KILL=1:6 RUN="mpi 2" fit -o "$T/k.kvq" >/dev/null 2>"$T/k.err"; rc=$?
nck=$(ls "$T/k.kvq.ckpt" 2>/dev/null | grep -c '\.safetensors$')
if [ $rc != 0 ] && [ ! -e "$T/k.kvq" ] && [ "$nck" -ge 3 ] && [ "$nck" -lt "$HEADS" ]; then
  ok mpi_fit_rank_killed_no_output
else
  fail mpi_fit_rank_killed_no_output "exit $rc, $nck checkpoints" "$(tail -3 "$T/k.err")"
fi
# Temporaries of the output and of a checkpoint, as ranks killed while writing them on
# another machine leave (a pid alive here): the rerun removes them.
touch "$T/k.kvq.tmp.$$.0123abcd" "$T/k.kvq.ckpt/layer.4.head.0.safetensors.tmp.$$.89abcdef"
if RUN="mpi 3" fit -o "$T/k.kvq" >/dev/null 2>"$T/k2.err" && cmp "$W/fit.kvq" "$T/k.kvq" &&
   grep -q "resumed $nck of $HEADS heads" "$T/k2.err" && [ ! -e "$T/k.kvq.ckpt" ] &&
   grep -q "^kvq: fit: removed 2 temporaries of an earlier run of $T/k.kvq$" "$T/k2.err" &&
   [ -z "$(find "$T" -name 'k.kvq*.tmp.*')" ]; then
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
