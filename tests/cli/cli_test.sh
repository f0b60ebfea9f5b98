#!/usr/bin/env bash
# End-to-end checks of the dsinfer command line: every subcommand on a fixture or synthetic
# model, JSONL generation with bad lines, and clear errors (exit code + message) on bad input.
# Usage: cli_test.sh path/to/dsinfer SOURCE_DIR
set -uo pipefail
DSI=$1
SRC=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
pass=0
check() {  # check NAME CONDITION...
  local name=$1
  shift
  if "$@"; then pass=$((pass + 1)); else echo "FAIL: $name"; fails=$((fails + 1)); fi
}
contains() { grep -q -- "$2" "$1"; }
# The CUDA-only features' refusals: the CUDA build names the device, a build without CUDA says so.
no_cuda_msg="this build has no CUDA backend"

FIX=$SRC/tests/fixtures/tiny-a/official

# inspect: plan and inventory; a missing directory is a clear error, not a crash.
"$DSI" inspect --model "$FIX" >"$TMP/inspect.txt" 2>&1
check "inspect prints the plan" contains "$TMP/inspect.txt" "csa"
"$DSI" inspect --model "$TMP/nope" >"$TMP/err.txt" 2>&1
rc=$?
check "inspect missing dir exits 2" test "$rc" -eq 2
check "inspect missing dir names it" contains "$TMP/err.txt" "$TMP/nope"

# inspect on V4.1 checkpoints (both layouts): the producer/consumer split, owners, Engram, state.
V41=$SRC/tests/fixtures/v41-tiny
for layout in official hf; do
  "$DSI" inspect --model "$V41/$layout" >"$TMP/v41.txt" 2>&1
  check "v41 $layout inspect shows the YOCO split" contains "$TMP/v41.txt" \
    "YOCO: producers 0-4 (5 layers), consumers 5-7 (3 layers)"
  check "v41 $layout inspect shows Engram" contains "$TMP/v41.txt" "Engram layer 3:"
  check "v41 $layout inspect shows the state" contains "$TMP/v41.txt" "state per sequence"
done
check "v41 inspect names the model" contains "$TMP/v41.txt" "model: DeepSeek V4.1"
# generate runs V4.1 through the engine on the CPU (exact and with prefill early exit; the tokens
# are checked against the forward alone in backend_v41_engine_test); placeholder ids are refused.
"$DSI" generate --model "$V41/official" --prompt-token-ids 0,5,6,7 --max-tokens 3 --temperature 0 \
  >"$TMP/v41gen.txt" 2>"$TMP/err.txt"
check "v41 generate" grep -qE '^\[[0-9]+,[0-9]+,[0-9]+\]$' "$TMP/v41gen.txt"
"$DSI" generate --model "$V41/hf" --prompt-token-ids 0,5,6,7 --max-tokens 3 --temperature 0 \
  --prefill-keep-rows 22 >"$TMP/v41gen2.txt" 2>"$TMP/err.txt"
check "v41 generate early exit" cmp -s "$TMP/v41gen.txt" "$TMP/v41gen2.txt"
"$DSI" generate --model "$V41/official" --prompt-token-ids 0,5,6 --prefill-keep-rows 8 \
  >"$TMP/err.txt" 2>&1
check "v41 generate keep-rows too small" contains "$TMP/err.txt" "window + max backtracking"
"$DSI" generate --model "$V41/official" --prompt-token-ids 0,100 >"$TMP/err.txt" 2>&1
rc=$?
check "v41 placeholder id exits 2" test "$rc" -eq 2
check "v41 placeholder id is named" contains "$TMP/err.txt" "multimodal placeholder"
# --engram-placement: the host placements give the same tokens; bad values and `device` off CUDA
# are named errors.
"$DSI" generate --model "$V41/official" --prompt-token-ids 0,5,6,7 --max-tokens 3 --temperature 0 \
  --engram-placement mapped >"$TMP/v41gen3.txt" 2>"$TMP/err.txt"
check "v41 generate engram mapped" cmp -s "$TMP/v41gen.txt" "$TMP/v41gen3.txt"
"$DSI" generate --model "$V41/official" --prompt-token-ids 0,5 --engram-placement gpu \
  >"$TMP/err.txt" 2>&1
rc=$?
check "v41 bad engram placement exits 2" test "$rc" -eq 2
check "v41 bad engram placement is named" contains "$TMP/err.txt" \
  "--engram-placement: Engram placement must be auto, host, mapped or device, got \`gpu\`"
"$DSI" generate --model "$V41/official" --prompt-token-ids 0,5 --engram-placement device \
  >"$TMP/err.txt" 2>&1
check "v41 engram device needs cuda" contains "$TMP/err.txt" \
  "--engram-placement device needs --device cuda"
"$DSI" bench --device cpu --model "$V41/official" --engram-compare >"$TMP/err.txt" 2>&1
check "v41 bench engram-compare needs cuda" grep -q -E -- "needs --device cuda|$no_cuda_msg" "$TMP/err.txt"
# bench --device cpu on V4.1: the spec's state figures (here and at the real config) and the
# prefill early exit's saving in the same run.
"$DSI" bench --device cpu --model "$V41/official" --prefill 40 --decode-batch 2 --context 30 \
  --decode-steps 1 --repeats 1 --prefill-keep-rows 22 --output "$TMP/v41bench.json" \
  >"$TMP/v41bench.txt" 2>&1
check "v41 bench real-config state" contains "$TMP/v41bench.txt" \
  "at the real V4.1-Flash config: KV 891 B/token, state 3128928 B/sequence"
check "v41 bench early exit" contains "$TMP/v41bench.json" '"layer_rows_ratio"'

# score runs V4.1 on the CPU (whole, chunked, early exit); the numbers are checked against the
# golden fixture in backend_v41_golden_test.
"$DSI" score --model "$V41/official" --input-ids 0,5,6,7,8,9,10 --chunk 3 \
  --output "$TMP/v41s.safetensors" >"$TMP/v41score.txt" 2>&1
check "v41 score chunked" contains "$TMP/v41score.txt" "7 tokens, V4.1, reference numerics"
"$DSI" score --model "$V41/hf" --input-ids "$(seq -s, 3 40)" --keep-rows 22 \
  --output "$TMP/v41e.safetensors" >"$TMP/v41score.txt" 2>&1
check "v41 score early exit" contains "$TMP/v41score.txt" "logits of positions 16..37"
"$DSI" score --model "$V41/hf" --input-ids 0,5,6 --keep-rows 8 --output "$TMP/v41e.safetensors" \
  >"$TMP/err.txt" 2>&1
check "v41 keep-rows too small" contains "$TMP/err.txt" "below window + max backtracking"
mkdir -p "$TMP/v41bad" && cp "$V41/official/"* "$TMP/v41bad/"
sed -i 's/"candidate_source_layer_id": 5/"candidate_source_layer_id": 6/' "$TMP/v41bad/config.json"
"$DSI" inspect --model "$TMP/v41bad" >"$TMP/err.txt" 2>&1
rc=$?
check "v41 bad schedule exits 2" test "$rc" -eq 2
check "v41 bad schedule is named" contains "$TMP/err.txt" "wrong layer schedule"
"$DSI" make-checkpoint --preset v4.1-tiny --out "$TMP/v41mk" --seed 3 --threads 2 \
  >"$TMP/mk.txt" 2>&1
check "v41 make-checkpoint tiny" contains "$TMP/mk.txt" "10 safetensors files"
"$DSI" inspect --model "$TMP/v41mk" >"$TMP/v41.txt" 2>&1
check "v41 made checkpoint opens" contains "$TMP/v41.txt" "DSpark blocks loaded"
check "v41 make-checkpoint writes an Engram token map" test -s "$TMP/v41mk/engram_token_map.json"
"$DSI" bench --device cpu --model "$TMP/v41mk" --prefill 16 --decode-batch 1 --context 16 \
  --decode-steps 1 --repeats 1 --output "$TMP/v41mkbench.json" >"$TMP/v41mkbench.txt" 2>&1
check "v41 made checkpoint benches on the CPU" contains "$TMP/v41mkbench.json" '"decode"'
"$DSI" make-checkpoint --preset v4.1-flash --layers 3 --out "$TMP/v41x" >"$TMP/err.txt" 2>&1
check "v41 flash needs both halves" contains "$TMP/err.txt" "both YOCO halves"
# --tokenizer: a tiny V4.1 sized to a V4 tokenizer, with the tokenizer files and an Engram token
# map beside it, runs chat requests with V4.1 rendering (auto); tokenizers breaking V4.1's policy
# ids are refused (fit_v41_config_to_tokenizer); --tokenizer with a V4 preset is an error.
if [ -f "$SRC/models/dsv4-mini/tokenizer.json" ]; then
  "$DSI" make-checkpoint --preset v4.1-tiny --tokenizer "$SRC/models/dsv4-mini/tokenizer.json" \
    --out "$TMP/v41tok" >"$TMP/mk.txt" 2>&1
  check "v41 tiny with a tokenizer" test -s "$TMP/v41tok/engram_token_map.json"
  echo '{"messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}],"max_tokens":3}' \
    >"$TMP/v41in.jsonl"
  "$DSI" generate --model "$TMP/v41tok" --input "$TMP/v41in.jsonl" --output "$TMP/v41out.jsonl" \
    --no-progress >/dev/null 2>&1
  check "v41 tiny with a tokenizer generates" contains "$TMP/v41out.jsonl" '"completion_tokens":3'
fi
"$DSI" make-checkpoint --preset tiny --tokenizer "$SRC/tests/fixtures/tokenizer/tiny/tokenizer.json" \
  --out "$TMP/v4tok" >"$TMP/err.txt" 2>&1
check "make-checkpoint --tokenizer is for v4.1-tiny" contains "$TMP/err.txt" "v4.1-tiny"

# score: full and chunked logits agree in shape; bad ids are rejected.
"$DSI" score --model "$FIX" --input-ids 0,5,6,7,8 --output "$TMP/s.safetensors" --mtp 2>/dev/null
check "score writes logits" test -s "$TMP/s.safetensors"
"$DSI" score --model "$FIX" --input-ids 0,5,x --output "$TMP/s2.safetensors" >"$TMP/err.txt" 2>&1
check "score rejects a bad id" contains "$TMP/err.txt" "item 3"
"$DSI" score --model "$FIX" --input-ids 0,99999 --output "$TMP/s3.safetensors" >"$TMP/err.txt" 2>&1
check "score rejects an id outside the vocabulary" contains "$TMP/err.txt" "outside the vocabulary"

# --device: a bad value is a clear error; cuda without a GPU (CI) or without the CUDA build says so.
"$DSI" score --model "$FIX" --input-ids 0,5 --output "$TMP/d.safetensors" --device tpu >"$TMP/err.txt" 2>&1
check "score rejects an unknown device" contains "$TMP/err.txt" "not one of cpu, cuda, cuda:N"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then
  "$DSI" score --model "$FIX" --input-ids 0,5 --output "$TMP/d.safetensors" --device cuda >"$TMP/err.txt" 2>&1
  rc=$?
  check "score --device cuda without a GPU fails" test "$rc" -ne 0
  check "score --device cuda without a GPU says why" grep -qiE "no CUDA device|no CUDA backend" "$TMP/err.txt"
  "$DSI" bench --model "$FIX" --no-ceilings >"$TMP/err.txt" 2>&1
  rc=$?
  check "bench without a GPU fails" test "$rc" -ne 0
  check "bench without a GPU says why" grep -qiE "no CUDA device|no CUDA backend" "$TMP/err.txt"
  "$DSI" generate --model "$FIX" --prompt-token-ids 0,5 --max-tokens 2 --device cuda >"$TMP/err.txt" 2>&1
  check "generate --device cuda without a GPU says why" grep -qiE "no CUDA device|no CUDA backend" "$TMP/err.txt"
fi
# bench --device cpu: the CPU backend, fast path vs reference in one run (JSON with speed-ups).
"$DSI" bench --model "$FIX" --device cpu --prefill 8 --decode-batch 1,2 --context 8 \
  --decode-steps 2 --repeats 1 --output "$TMP/bench_cpu.json" >"$TMP/err.txt" 2>&1
check "bench --device cpu runs" test $? -eq 0
check "bench --device cpu compares fast and reference" \
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert [r["kernels"] for r in d["runs"]]==["fast","reference"] and d["speedups"][0]["decode"][1]["batch"]==2' "$TMP/bench_cpu.json"
"$DSI" bench --model "$FIX" --device cpu --cpu-kernels turbo >"$TMP/err.txt" 2>&1
check "bench --cpu-kernels rejects an unknown name" contains "$TMP/err.txt" "--cpu-kernels must be"
"$DSI" bench --model "$FIX" --device cpu --long-context 4096 >"$TMP/err.txt" 2>&1
check "bench --long-context on the CPU says it is the CUDA bench's" \
  grep -q -E -- "the V4 CUDA bench only|$no_cuda_msg" "$TMP/err.txt"

# --ep: expert parallelism needs CUDA; serve --ep is not built yet (clear errors, no ranks start).
"$DSI" generate --model "$FIX" --prompt-token-ids 0,5 --max-tokens 2 --ep 2 >"$TMP/err.txt" 2>&1
check "generate --ep on the CPU says it needs cuda" contains "$TMP/err.txt" "needs --device cuda"
"$DSI" generate --model "$FIX" --prompt-token-ids 0,5 --max-tokens 2 --ep -1 --device cuda >"$TMP/err.txt" 2>&1
check "generate --ep -1 is rejected" contains "$TMP/err.txt" "--ep must be >= 0"

# make-checkpoint -> inspect -> generate on the synthetic model.
"$DSI" make-checkpoint --preset tiny --seed 3 --out "$TMP/m" 2>/dev/null
check "make-checkpoint writes config" test -s "$TMP/m/config.json"
"$DSI" generate --model "$TMP/m" --prompt-token-ids 0,5,6 --max-tokens 4 --temperature 0 \
  >"$TMP/g.txt" 2>"$TMP/g.err"
check "generate prints token ids" contains "$TMP/g.txt" "\["
check "generate prints a summary" contains "$TMP/g.err" "TTFT p50"
# The bundled model: the fast CPU path (default) and the reference give the same greedy text.
MINI=$SRC/models/dsv4-mini
for k in fast reference; do
  "$DSI" generate --model "$MINI" --prompt $'def fibonacci(n):\n' --max-tokens 24 --temperature 0 \
    --cpu-kernels "$k" >"$TMP/g_$k.txt" 2>/dev/null
done
check "generate: fast and reference CPU kernels give the same greedy output" \
  cmp -s "$TMP/g_fast.txt" "$TMP/g_reference.txt"
check "generate: greedy output is not empty" test -s "$TMP/g_fast.txt"
# bench --speculative at batch 1 measures many prompts, not one deterministic greedy sequence
# (its single prompt fell into a cycle whose drafts never got past depth 3: acceptance 0.00 at
# depths 4 and 5 in every round).
"$DSI" bench --device cpu --model "$MINI" --speculative fixed:5 --decode-batch 1 --repeats 1 --warmup 1 \
  --decode-steps 24 --output "$TMP/bench_spec.json" >/dev/null 2>&1
check "bench --speculative: drafts at depths 4 and 5 are accepted at batch 1" \
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["speculative"][0]; a=r["acceptance_by_position"]; assert r["batch"]==1 and len(a)==5 and a[3]>0 and a[4]>0, a' "$TMP/bench_spec.json"
check "bench --speculative: batch 1 ran whole batches (full_batch)" \
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["speculative"][0]; assert r["full_batch"] is True and r["tokens_per_s"] > 0, r' "$TMP/bench_spec.json"
check "bench --speculative: no GPU idle figure where nothing measures it (CPU)" \
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["speculative"][0]; assert "gpu_idle_fraction" in r and r["gpu_idle_fraction"] is None, r' "$TMP/bench_spec.json"
check "bench --speculative: no backend host phases where nothing measures them (CPU)" \
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["speculative"][0]; assert "backend_host_ms" in r and r["backend_host_ms"] is None, r' "$TMP/bench_spec.json"
# A batch the state memory cannot hold at once: flagged, and the whole waves' figure stands in
# (not 0 tokens/s for a window that never opened).
"$DSI" bench --device cpu --model "$MINI" --speculative off --decode-batch 16 --repeats 1 --warmup 1 \
  --decode-steps 4 --state-memory 24MiB --output "$TMP/bench_short.json" >/dev/null 2>&1
check "bench --speculative: a batch that never ran whole is flagged, with the waves' figure" \
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["speculative"][0]; assert r["full_batch"] is False and r["tokens_per_s"] == r["wave_tokens_per_s"] > 0, r' "$TMP/bench_short.json"
# --prompt-text: prompts are windows of a tokenized text (natural text: the drafter's acceptance).
"$DSI" bench --device cpu --model "$MINI" --speculative fixed:2 --decode-batch 1 --repeats 1 \
  --warmup 1 --decode-steps 8 --prompt-text "$SRC/tools/train/data.py" --output "$TMP/bench_text.json" \
  >"$TMP/bench_text.txt" 2>&1
check "bench --prompt-text takes its prompts from the text" \
  contains "$TMP/bench_text.txt" "prompts: windows of 32 tokens of .*tools/train/data.py"
check "bench --prompt-text measures acceptance" \
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["speculative"][0]; assert r["acceptance_by_position"][0]>0, r' "$TMP/bench_text.json"
"$DSI" bench --device cpu --model "$FIX" --speculative fixed:2 --warmup 0 >"$TMP/err.txt" 2>&1
check "bench --speculative --warmup 0 is refused" contains "$TMP/err.txt" "--warmup >= 1"
# --interleave-modes: every engine alive, each round runs every mode in turn (round 1 of the
# second mode before round 2 of the first).
"$DSI" bench --device cpu --model "$FIX" --speculative off,fixed:1,auto --interleave-modes \
  --decode-batch 1 --repeats 2 --warmup 1 --decode-steps 8 --output "$TMP/bench_il.json" \
  >/dev/null 2>"$TMP/bench_il.err"
check "bench --interleave-modes: rounds round-robin over the modes" \
  python3 -c 'import sys; t=open(sys.argv[1]).read(); a=t.index("round 1 batch 1 fixed:1"); b=t.index("round 2 batch 1 off"); assert a < b' "$TMP/bench_il.err"
check "bench --interleave-modes: said in the JSON, every mode measured twice" \
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["interleaved"] is True and all(len(r["tokens_per_s_runs"])==2 for r in d["speculative"]), d' "$TMP/bench_il.json"
check "bench --speculative: auto against the best other mode, and each round's shape warm-ups" \
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); v=d["auto_vs_best"]; assert len(v)==1 and v[0]["batch"]==1 and v[0]["best_mode"] in ("off","fixed:1") and v[0]["ratio"]>0 and isinstance(v[0]["ranges_overlap"],bool), v; assert all(r["shape_warmups_runs"]==[0,0] for r in d["speculative"]), d["speculative"]' "$TMP/bench_il.json"
printf 'def f' >"$TMP/short.txt"
"$DSI" bench --device cpu --model "$MINI" --speculative fixed:2 --prompt-text "$TMP/short.txt" \
  >"$TMP/err.txt" 2>&1
check "bench --prompt-text shorter than a prompt is refused" \
  contains "$TMP/err.txt" "fewer than a prompt"
"$DSI" bench --device cpu --model "$FIX" --speculative fixed:2 --forced-acceptance 1.5 \
  >"$TMP/err.txt" 2>&1
check "bench --forced-acceptance out of [0, 1] is refused" \
  contains "$TMP/err.txt" "--forced-acceptance must be in"
if "$DSI" serve --help >/dev/null 2>&1; then
  "$DSI" serve --model "$FIX" --prefix-cache --kv-device-bytes lots >"$TMP/err.txt" 2>&1
  check "serve --kv-device-bytes rejects a size it cannot parse" \
    contains "$TMP/err.txt" "--kv-device-bytes: cannot parse size"
fi
# --numerics auto (the default) is reference on the CPU (deepseek on CUDA: the GPU kernels' path).
"$DSI" generate --model "$FIX" --prompt-token-ids 0,5,6,7 --max-tokens 4 --temperature 0 \
  --numerics auto >"$TMP/n_auto.txt" 2>/dev/null
"$DSI" generate --model "$FIX" --prompt-token-ids 0,5,6,7 --max-tokens 4 --temperature 0 \
  --numerics reference >"$TMP/n_ref.txt" 2>/dev/null
check "generate --numerics auto is reference on the CPU" cmp -s "$TMP/n_auto.txt" "$TMP/n_ref.txt"
check "generate --numerics auto output is not empty" test -s "$TMP/n_auto.txt"
"$DSI" generate --model "$FIX" --prompt x --max-tokens 1 --numerics fp3 >"$TMP/err.txt" 2>&1
check "generate --numerics rejects an unknown name" \
  contains "$TMP/err.txt" "--numerics must be \`auto\`, \`reference\` or \`deepseek\`"
check "bench --speculative reports its numerics" \
  python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["numerics"]=="reference"' "$TMP/bench_spec.json"
"$DSI" generate --model "$MINI" --prompt x --max-tokens 1 --cpu-kernels turbo >"$TMP/err.txt" 2>&1
check "generate --cpu-kernels rejects an unknown name" contains "$TMP/err.txt" "--cpu-kernels must be"

# make-checkpoint argument errors (never writes a real-width checkpoint: that is GBs).
"$DSI" make-checkpoint --preset v4-flash --layers 0 --out "$TMP/flash" >"$TMP/err.txt" 2>&1
rc=$?
check "make-checkpoint --layers 0 exits 2" test "$rc" -eq 2
check "make-checkpoint --layers 0 explains" contains "$TMP/err.txt" "between 1 and 43"
check "make-checkpoint --layers 0 writes nothing" test ! -e "$TMP/flash"
"$DSI" make-checkpoint --preset nope --out "$TMP/nope-preset" >"$TMP/err.txt" 2>&1
rc=$?
check "make-checkpoint unknown preset exits 2" test "$rc" -eq 2
check "make-checkpoint unknown preset lists presets" \
  contains "$TMP/err.txt" "unknown preset .nope. (available: tiny, v4-flash, v4.1-tiny, v4.1-flash)"
"$DSI" make-checkpoint --preset tiny --layers 2 --no-mtp --out "$TMP/m2" 2>/dev/null
"$DSI" inspect --model "$TMP/m2" >"$TMP/inspect2.txt" 2>&1
check "make-checkpoint --layers 2 keeps two layers" \
  contains "$TMP/inspect2.txt" "num_hidden_layers          2"

# JSONL: good lines succeed, bad lines get an error line, order is kept.
cat >"$TMP/in.jsonl" <<'JSONL'
{"prompt_token_ids": [0, 5, 6], "max_tokens": 3, "temperature": 0}
{"prompt_token_ids": []}
{"prompt_token_ids": [0, 7], "max_tokens": 2, "temperature": 0.7, "seed": 4, "top_p": 0.9}
not json
{"prompt_token_ids": [0, 7], "temperature": -1}
JSONL
"$DSI" generate --model "$TMP/m" --input "$TMP/in.jsonl" --output "$TMP/out.jsonl" 2>"$TMP/jsonl.err"
rc=$?
check "jsonl: exit 0 while some requests succeed" test "$rc" -eq 0
check "jsonl: five output lines" test "$(wc -l <"$TMP/out.jsonl")" -eq 5
check "jsonl: the summary counts the failed lines" contains "$TMP/jsonl.err" "5 requests (3 failed)"
check "jsonl: the summary names the first error" contains "$TMP/jsonl.err" "first error: .*prompt is empty"
check "jsonl: line 1 ok" sh -c "sed -n 1p '$TMP/out.jsonl' | grep -q '\"finish_reason\":\"length\"'"
check "jsonl: empty prompt error" sh -c "sed -n 2p '$TMP/out.jsonl' | grep -q 'prompt is empty'"
check "jsonl: line 3 ok" sh -c "sed -n 3p '$TMP/out.jsonl' | grep -q '\"index\":2,\"text\"'"
check "jsonl: bad json error" sh -c "sed -n 4p '$TMP/out.jsonl' | grep -q 'not valid JSON'"
check "jsonl: bad temperature error" sh -c "sed -n 5p '$TMP/out.jsonl' | grep -q 'temperature'"
# Every request failed: exit 1, each line still answered.
printf '%s\n' 'not json' '{"prompt_token_ids": [0, 99999999]}' >"$TMP/bad.jsonl"
"$DSI" generate --model "$TMP/m" --input "$TMP/bad.jsonl" --output "$TMP/bad_out.jsonl" \
  2>"$TMP/bad.err"
rc=$?
check "jsonl: exit 1 when every request failed" test "$rc" -eq 1
check "jsonl: all-failed summary" contains "$TMP/bad.err" "2 requests (2 failed)"
check "jsonl: out-of-vocabulary id named" sh -c "sed -n 2p '$TMP/bad_out.jsonl' | grep -q '99999999'"

# Text prompts need a tokenizer; the error says so.
"$DSI" generate --model "$TMP/m" --prompt "hello" >"$TMP/err.txt" 2>&1
check "generate text without tokenizer explains" contains "$TMP/err.txt" "tokenizer.json"
"$DSI" generate --model "$TMP/nope" --prompt-token-ids 1 >"$TMP/err.txt" 2>&1
check "generate missing model dir names it" contains "$TMP/err.txt" "$TMP/nope"

# tokenize / detokenize round trip with the tiny fixture tokenizer.
TOK=$SRC/tests/fixtures/tokenizer/tiny/tokenizer.json
"$DSI" tokenize --tokenizer "$TOK" --text "def f(x): return x" >"$TMP/ids.json" 2>/dev/null
check "tokenize prints ids" contains "$TMP/ids.json" "\["

# recipe render / parse.
printf '%s' '{"model":"m","messages":[{"role":"user","content":"Hi"}],"thinking":{"type":"disabled"}}' \
  >"$TMP/req.json"
"$DSI" recipe render --protocol chat --request "$TMP/req.json" >"$TMP/r.txt" 2>&1
check "recipe render ends with the chat transition" contains "$TMP/r.txt" "Assistant｜></think>"
printf 'Thinking.</think>Answer.' >"$TMP/o.txt"
"$DSI" recipe parse --thinking on --text-file "$TMP/o.txt" >"$TMP/p.txt" 2>&1
check "recipe parse splits reasoning" contains "$TMP/p.txt" '"reasoning_delta","text":"Thinking."'

echo "cli: $pass passed, $fails failed"
[ "$fails" -eq 0 ]
