#!/usr/bin/env bash
# eval_long.sh — the long-context evaluation of `kvq eval`: --score last:N (exact
# prefill, the last N tokens of each sequence scored, with retrieval each a one-token
# decode step): the scored positions and counts, llama.cpp's loss of the same
# positions, and the `full` selector equal to full attention over them; and task
# prompts from a jsonl corpus ("answer", "task"). Run by tests/run-tests.sh.
. tests/helpers/clitest.sh

expect_error eval_last_zero 2 '^kvq eval: --score: ' -- \
  "$KVQ" eval --model x --corpus uuid:1 --score last:0
expect_error eval_last_bad 2 '^kvq eval: --score: ' -- \
  "$KVQ" eval --model x --corpus uuid:1 --score last:8x
expect_error eval_score_bad 2 '^kvq eval: --score must be second-half, all or last:N$' -- \
  "$KVQ" eval --model x --corpus uuid:1 --score first:8
# stories260K, else the committed stand-in (tests/data/tiny_spm.gguf; spm_model)
spm_model
MODEL=$M
if [ "$IS_STORIES" = 1 ]; then NLL=tests/data/stories260K_nll.json; else NLL=tests/data/tiny_spm_nll.json; fi

# the text of $NLL (llama.cpp's NLL per cut, made by scripts/gen_stories260K_nll.py with
# llama-cpp-python, --model and --out for the stand-in): sequences of 32 (BOS + 31, ...);
# the last 8 predictions of each (stories260K: 51 tokens, 2 sequences, 16 predictions)
golden="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to"
T=$CLI_TMP/last
mkdir -p "$T"
printf '%s\n' "$golden" >"$T/story.txt"
G=$("$PYTHON" -c 'import json, sys; d = json.load(open(sys.argv[1])); a, b = d["seq_len_32_last_8"], d["seq_len_32"]; print(a["nll"], b["nll"], a["sequences"], b["tokens"], a["predicted"], b["predicted"])' "$NLL")
read -r last8 all32 nseq ntok npred8 npred <<<"$G"

# full attention: the predicted count and llama.cpp's loss of the same 16 positions
# (2e-4 nats/token: the mean of the 16 hardest predictions, not of all 49)
expect_json eval_last_llama "
assert d['score'] == 'last:8' and d['sequences'] == $nseq and d['tokens'] == $ntok, d
assert d['predicted'] == $npred8, d
assert abs(d['nll'] - $last8) < max(2e-4, 2e-5 * $last8), (d['nll'], 'llama.cpp: $last8')
" -- "$KVQ" eval --model "$MODEL" --corpus "file:$T/story.txt" --seq-len 32 --score last:8 --json -q

# N longer than the sequences: every prediction, as --score all
expect_json eval_last_longer "
assert d['predicted'] == $npred and abs(d['nll'] - $all32) < max(1e-4, 2e-5 * $all32), (d, 'llama.cpp: $all32')
" -- "$KVQ" eval --model "$MODEL" --corpus "file:$T/story.txt" --seq-len 32 --score last:100 --json -q

# retrieval: the reference is full attention over the same 16 positions; `full` (every
# token, exact positions, an f32 cache) decodes them one step each after an exact
# prefill and gives the same loss; one retrieval step per scored token, layer (5) and KV
# head of the model (llama.block_count, head_count_kv; stories260K 16 x 5 x 4), every scored
# position (23..30 and 11..18) having candidates beyond 4 sinks + a window of 4
expect_json eval_last_retrieval "
assert d['scored'] == 'last:8' and d['predicted'] == $npred8, d
assert abs(d['reference']['nll'] - $last8) < max(2e-4, 2e-5 * $last8), (d['reference'], 'llama.cpp: $last8')
rows = {r['selector']: r for r in d['rows']}
full, ref = rows['full'], d['reference']['perplexity']
assert abs(full['perplexity'] - ref) < 1e-5 * ref, (full, ref)
assert full['recall_topk'] == 1 and abs(full['kv_read_fraction'] - 1) < 1e-9, full
lens = [32] * ($ntok // 32) + ([$ntok % 32] if $ntok % 32 else [])
steps = sum(1 for L in lens for p in range(max(0, L - 9), L - 1) if p >= 8)  # > sinks + window
assert steps <= $npred8 and ('$IS_STORIES' != '1' or steps == 16), steps
for r in d['rows']:
    assert r['steps'] == steps * $MI_LAYERS * $MI_KV_HEADS, r
assert rows['oracle']['kv_read_fraction'] < 0.95 and rows['oracle']['perplexity'] != ref, rows
" -- "$KVQ" eval --model "$MODEL" --corpus "file:$T/story.txt" --seq-len 32 --score last:8 \
    --selectors full,oracle --budgets 4 --sink 4 --window 4 --positions rope --cache f32 \
    --threads 1 --json -q

# jsonl task prompts: $GOLDEN is the model's greedy continuation after BOS (llama.cpp's,
# spm_model), so after its first words the model answers the next word (right) and not
# "Tom" (counted wrong)
read -r w1 w2 w3 w4 w5 w6 w7 _ <<<"$GOLDEN"
if [ "$IS_STORIES" = 1 ]; then prompt="Once upon a time, there was a little girl named" answer=Lily
else prompt="$w1 $w2 $w3 $w4 $w5 $w6" answer=$w7; fi
"$PYTHON" -c '
import json, sys
p, a = sys.argv[1], sys.argv[2]
for d in ({"text": p, "answer": a}, {"text": p, "answer": "Tom", "task": "kv-recall"}, {"text": p}):
    print(json.dumps(d))' "$prompt" "$answer" >"$T/tasks.jsonl"
# (the stand-in's random weights need not continue a retokenized prefix as they did
# after BOS alone: there only the counts and the wrong answer are checked)
right=1; [ "$IS_STORIES" = 1 ] || right="d['reference']['passkey'][0]"
expect_json eval_jsonl_tasks "
assert d['reference']['passkey'] == [$right, 1] and d['reference']['kv_recall'] == [0, 1], d['reference']
assert d['rows'][0]['passkey'] == [$right, 1] and d['rows'][0]['kv_recall'] == [0, 1], d['rows']
assert d['reference']['answers'] == str(d['reference']['passkey'][0]) + '0', d['reference']
assert d['rows'][0]['answers'] == d['reference']['answers'], d['rows']
" -- "$KVQ" eval --model "$MODEL" --corpus "jsonl:$T/tasks.jsonl" --selectors full --max-tokens 2 \
    --positions rope --threads 1 --json -q

cli_done
