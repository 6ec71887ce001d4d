#!/usr/bin/env bash
# userfiles.sh — the corruption battery's user-file and overlap cases (issue 30 items 3,
# 5 and 6): replacing a capture directory never deletes a file kvq did not write (capture
# --force, capture --merge --force, calibrate's capture and held-out stages), an output
# that is one of the command's inputs is refused for every command, and so is an input
# given twice. Run by tests/run-tests.sh.
. tests/helpers/clitest.sh

T=$CLI_TMP/userfiles
mkdir -p "$T"
spm_model
cap() { "$KVQ" capture --model "$M" --corpus uuid:2 --seq-len 64 --max-tokens 256 --threads 1 -q "$@"; }
cap -o "$T/c" && cap -o "$T/d" --seed 2 || fail userfiles_setup "capture failed"
"$KVQ" moments --capture "$T/c" -q -o "$T/m.safetensors" &&
  "$KVQ" fit --capture "$T/c" --moments "$T/m.safetensors" --codebook 8 --iters 2 --threads 1 \
    -q -o "$T/a.kvq" 2>/dev/null || fail userfiles_setup "moments or fit failed"

# ---- 5. a file kvq did not write is never deleted
echo "my notes" >"$T/c/notes.txt"
expect_error capture_force_keeps_user_file 1 'c/notes\.txt: not written by kvq; kvq does not delete' \
  -- cap --force -o "$T/c"
expect_error merge_force_keeps_user_file 1 'c/notes\.txt: not written by kvq' \
  -- "$KVQ" capture --merge "$T/d" --force -q -o "$T/c"
[ "$(cat "$T/c/notes.txt")" = "my notes" ] && [ -s "$T/c/capture.json" ] &&
  ok capture_user_file_kept || fail capture_user_file_kept "$(ls -A "$T/c")"
rm "$T/c/notes.txt"
# a user's subdirectory counts as well
mkdir "$T/d/mine"
expect_error capture_force_keeps_user_dir 1 'd/mine: not written by kvq' -- cap --force -o "$T/d"
[ -d "$T/d/mine" ] && ok capture_user_dir_kept || fail capture_user_dir_kept
rmdir "$T/d/mine"

# calibrate --force and a changed seed rerun the capture stage in kvq's own work directory
W=$T/w
calib() {
  "$KVQ" calibrate --model "$M" --seq-len 64 --max-tokens 256 --heldout-tokens 64 --codebook 8 \
    --iters 2 --threads 1 --no-positions --knobs budget -q --work "$W" -o "$T/cal.kvq" "$@"
}
calib >/dev/null 2>&1 || fail calibrate_setup "$(calib 2>&1 | tail -2)"
echo "mine" >"$W/capture/keep.me"
expect_error calibrate_seed_keeps_user_file 1 'capture/keep\.me: not written by kvq' -- calib --seed 7
expect_error calibrate_force_keeps_user_file 1 'capture/keep\.me: not written by kvq' -- calib --force
[ "$(cat "$W/capture/keep.me")" = mine ] && ok calibrate_user_file_kept || fail calibrate_user_file_kept
rm "$W/capture/keep.me"

# ---- 3, 6. an output that is an input; an input given twice
cp "$T/a.kvq" "$T/a.before"
expect_error card_output_is_input 2 'a\.kvq: the output is also an input of this command' \
  -- "$KVQ" card "$T/a.kvq" -o "$T/a.kvq" --force
cmp -s "$T/a.kvq" "$T/a.before" && ok card_output_is_input_untouched || fail card_output_is_input_untouched
expect_error merge_output_is_input 2 'c: the output is also an input of this command' \
  -- "$KVQ" capture --merge "$T/c" "$T/d" --force -o "$T/c"
expect_error merge_input_twice 2 'given twice as an input' \
  -- "$KVQ" capture --merge "$T/c" "$T/c" --force -o "$T/cc"
[ ! -e "$T/cc" ] && ok merge_input_twice_no_output || fail merge_input_twice_no_output
expect_error merge_input_twice_other_spelling 2 'given twice as an input' \
  -- "$KVQ" capture --merge "$T/c" "$T/./c/" -o "$T/cc"
expect_error moments_output_is_input 2 'the output is also an input' \
  -- "$KVQ" moments --capture "$T/c" --force -o "$T/c/capture.json"
expect_error moments_output_inside_input 2 'c/m\.safetensors: the output is also an input' \
  -- "$KVQ" moments --capture "$T/c" -o "$T/c/m.safetensors"
expect_error fit_output_is_moments 2 'm\.safetensors: the output is also an input' \
  -- "$KVQ" fit --capture "$T/c" --moments "$T/m.safetensors" --force -o "$T/m.safetensors"
expect_error profile_output_is_input 2 'a\.kvq: the output is also an input' \
  -- "$KVQ" profile --capture "$T/c" --artifact "$T/a.kvq" --force -o "$T/a.kvq"
expect_error capture_output_is_model 2 'the output is also an input' \
  -- cap --force -o "$M"
cmp -s "$T/a.kvq" "$T/a.before" && ok outputs_that_are_inputs_untouched ||
  fail outputs_that_are_inputs_untouched

# ---- 12. checkpoint leftovers; 10. a full disk names the file and the bytes
# a kill -9 just after fit's final rename leaves OUT.kvq.ckpt/ older than OUT.kvq: the
# rerun (refused: the output exists) removes it
fitc() { "$KVQ" fit --capture "$T/c" --moments "$T/m.safetensors" --codebook 8 --iters 2 --threads 1 -q "$@" 2>&1; }
mkdir "$T/a.kvq.ckpt"
for h in 0 1; do echo x >"$T/a.kvq.ckpt/layer.0.head.$h.safetensors"; done
touch -d '1 hour ago' "$T/a.kvq.ckpt"/*
out=$(fitc -o "$T/a.kvq")
[ ! -e "$T/a.kvq.ckpt" ] && cmp -s "$T/a.kvq" "$T/a.before" && ok fit_rerun_removes_finished_ckpt ||
  fail fit_rerun_removes_finished_ckpt "$out" "$(ls -A "$T/a.kvq.ckpt" 2>&1)"
# checkpoints newer than the output (an interrupted --force run) are kept, and so is a
# folder holding anything else
mkdir "$T/a.kvq.ckpt"; echo x >"$T/a.kvq.ckpt/layer.0.head.0.safetensors"
touch -d '1 hour' "$T/a.kvq.ckpt/layer.0.head.0.safetensors"
fitc -o "$T/a.kvq" >/dev/null
[ -e "$T/a.kvq.ckpt/layer.0.head.0.safetensors" ] && ok fit_keeps_newer_ckpt || fail fit_keeps_newer_ckpt
rm -rf "$T/a.kvq.ckpt"
# a full disk (a file size limit: writes fail with EFBIG) in fit and moments: the message
# names the file, the bytes and the reason; no empty checkpoint folder is left
full() { (trap '' XFSZ; ulimit -f 2; "$@"); }
expect_error fit_disk_full_names_file 1 \
  'f\.kvq\.ckpt/layer\.0\.head\.0\.safetensors: write failed \([0-9]+ bytes\): File too large' \
  -- full "$KVQ" fit --capture "$T/c" --moments "$T/m.safetensors" --codebook 4 --iters 2 \
    --threads 1 -q -o "$T/f.kvq"
[ ! -e "$T/f.kvq.ckpt" ] && [ ! -e "$T/f.kvq" ] && ok fit_disk_full_no_empty_ckpt ||
  fail fit_disk_full_no_empty_ckpt "$(ls -A "$T")"
expect_error moments_disk_full_names_file 1 \
  'm2\.safetensors: write failed \((the header, )?[0-9]+ bytes[^)]*\): File too large' \
  -- full "$KVQ" moments --capture "$T/c" -q -o "$T/m2.safetensors"

# ---- 7. a FIFO (or any non-regular file) as an input is refused at once, not waited on
mkfifo "$T/fifo.gguf" "$T/fifo.kvq" "$T/fifo.txt" "$T/fifo.safetensors"
fifo='not a regular file \(a FIFO\)'
to() { timeout 20 "$@"; }  # a hang fails as exit 124
expect_error fifo_model_run 1 "fifo\.gguf: $fifo" -- to "$KVQ" run --model "$T/fifo.gguf" -n 1 -q
expect_error fifo_model_inspect 1 "fifo\.gguf: $fifo" -- to "$KVQ" inspect "$T/fifo.gguf"
expect_error fifo_model_capture 1 "fifo\.gguf: $fifo" -- \
  to "$KVQ" capture --model "$T/fifo.gguf" --corpus uuid:1 -q -o "$T/fc"
expect_error fifo_model_calibrate 1 "fifo\.gguf: $fifo" -- \
  to "$KVQ" calibrate --model "$T/fifo.gguf" -q -o "$T/fc.kvq"
expect_error fifo_artifact_inspect 1 "fifo\.kvq: $fifo" -- to "$KVQ" inspect "$T/fifo.kvq"
expect_error fifo_artifact_card 1 "fifo\.kvq: $fifo" -- to "$KVQ" card "$T/fifo.kvq"
expect_error fifo_artifact_run 1 "fifo\.kvq: $fifo" -- \
  to "$KVQ" run --model "$M" --artifact "$T/fifo.kvq" -n 1 -q
expect_error fifo_moments_fit 1 "fifo\.safetensors: $fifo" -- \
  to "$KVQ" fit --capture "$T/c" --moments "$T/fifo.safetensors" -q -o "$T/ff.kvq"
expect_error fifo_corpus_capture 2 "fifo\.txt: not a regular file" -- \
  to "$KVQ" capture --model "$M" --corpus "$T/fifo.txt" -q -o "$T/fc"
expect_error fifo_corpus_file_kind 2 "fifo\.txt: not a regular file" -- \
  to "$KVQ" calibrate --model "$M" --corpus "file:$T/fifo.txt" -q -o "$T/fc.kvq"
[ ! -e "$T/fc" ] && [ ! -e "$T/fc.kvq" ] && [ ! -e "$T/fc.kvq.work" ] && [ ! -e "$T/ff.kvq" ] &&
  ok fifo_inputs_leave_nothing || fail fifo_inputs_leave_nothing "$(ls "$T")"
cli_done
