#!/usr/bin/env bash
# `bench serve` as vLLM's users type it, against a real `m3serve serve` of a tiny model served under
# the recipe's Hub id: the recipe's own benchmark command line (tests/data/recipe, with small lengths),
# `--backend` names, argparse-style option prefixes, the sharegpt and custom datasets (tests/data/bench),
# --goodput, --percentile-metrics / --metric-percentiles, --burstiness, and the errors for what is not
# supported. Every run's result JSON is checked. Server always killed.
# Usage: bench_vllm_lines.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP"
fail() { echo "FAIL: $*" >&2; echo "--- server log:" >&2; tail -20 "$TMP/server.log" >&2 || true; exit 1; }
. "$(dirname "$0")/lib/server_port.sh"
NAME=MiniMaxAI/MiniMax-M3.1-Flash

"$BIN" make-model --layout m31 --preset tiny --seed 5 --out "$TMP/model" 2>/dev/null
cp "$DATA/chat/MiniMax-M3.jinja" "$TMP/model/chat_template.jinja"
"$BIN" serve "$TMP/model" --host 127.0.0.1 --port 0 --served-model-name "$NAME" --max-model-len 1024 \
  --kv-cache-memory 0.05 >"$TMP/server.log" 2>&1 &
PID=$!
trap 'kill -9 $PID 2>/dev/null || true' EXIT
wait_server_port "$TMP/server.log" $PID

# jq-free checks of the result JSON: key == value (numbers compared as floats when VALUE is numeric).
check() {  # check <json> <python expression over r> <message>
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1" \
    || fail "$3: $(cat "$1")"
}

# 1. Every `vllm bench serve` line of the recipe, with small lengths and this server's port.
python3 - "$DATA/recipe/MiniMax-M3.1-Flash.recipe.json" >"$TMP/lines.txt" <<'PY'
import json, shlex, sys
recipe = json.load(open(sys.argv[1]))
found = set()
def walk(o):
    if isinstance(o, dict):
        for v in o.values(): walk(v)
    elif isinstance(o, list):
        for v in o: walk(v)
    elif isinstance(o, str) and "vllm bench serve" in o:
        text = o[o.index("vllm bench serve"):].replace("\\\n", " ")
        text = text.split("\n")[0]
        found.add(text)
walk(recipe)
small = {"--random-input": "32", "--random-input-len": "32", "--random-output": "8", "--random-output-len": "8",
         "--num-prompts": "8", "--max-concurrency": "4"}
for line in sorted(found):
    args = shlex.split(line)[3:]
    for i in range(len(args) - 1):
        if args[i] in small: args[i + 1] = small[args[i]]
    print(shlex.join(args))
PY
[ -s "$TMP/lines.txt" ] || fail "no vllm bench serve line found in the recipe"
n=0
while IFS= read -r line; do
  n=$((n + 1))
  eval "set -- $line"
  "$BIN" bench serve "$@" --port "$PORT" --ignore-eos --no-progress --save-result "$TMP/recipe$n.json" \
    >"$TMP/recipe$n.out" 2>"$TMP/recipe$n.err" || fail "recipe line $n ($line): $(cat "$TMP/recipe$n.err")"
  check "$TMP/recipe$n.json" "r['completed'] == 8 and r['failed'] == 0 and r['model_id'] == '$NAME'" "recipe line $n"
done <"$TMP/lines.txt"
grep -q -- '--random-input 32' "$TMP/lines.txt" || fail "the recipe line's --random-input prefix was not exercised"
check "$TMP/recipe1.json" "r['backend'] == 'vllm' and r['endpoint'] == '/v1/completions'" "backend vllm"

# 2. openai-chat picks the chat endpoint itself.
"$BIN" bench serve --port "$PORT" --backend openai-chat --num-prompts 3 --random-input 24 --random-output 4 \
  --ignore-eos --save-result "$TMP/chat.json" >"$TMP/chat.out" 2>"$TMP/chat.err" || fail "openai-chat: $(cat "$TMP/chat.err")"
check "$TMP/chat.json" "r['endpoint'] == '/v1/chat/completions' and r['completed'] == 3" "openai-chat"

# 3. ShareGPT: 3 usable pairs of 6 entries (one prompt under 4 tokens, one single turn, one empty),
#    topped up to 5 requests; output lengths from the replies unless --sharegpt-output-len.
"$BIN" bench serve --port "$PORT" --dataset-name sharegpt --dataset-path "$DATA/bench/sharegpt_small.json" \
  --num-prompts 5 --sharegpt-output-len 6 --ignore-eos --save-result "$TMP/sharegpt.json" \
  >"$TMP/sharegpt.out" 2>"$TMP/sharegpt.err" || fail "sharegpt: $(cat "$TMP/sharegpt.err")"
check "$TMP/sharegpt.json" "r['completed'] == 5 and r['total_output_tokens'] == 30 and r['dataset_name'] == 'sharegpt'" "sharegpt"

# 4. Custom JSONL on completions: the chat template applied by the server (more prompt tokens than
#    the same prompts sent as they are).
"$BIN" bench serve --port "$PORT" --dataset-name custom --dataset-path "$DATA/bench/custom_small.jsonl" \
  --num-prompts 3 --custom-output-len 4 --ignore-eos --save-result "$TMP/custom.json" \
  >"$TMP/custom.out" 2>"$TMP/custom.err" || fail "custom: $(cat "$TMP/custom.err")"
"$BIN" bench serve --port "$PORT" --dataset-name custom --dataset-path "$DATA/bench/custom_small.jsonl" \
  --num-prompts 3 --custom-output-len 4 --custom-skip-chat-template --ignore-eos --save-result "$TMP/custom_raw.json" \
  >"$TMP/custom_raw.out" 2>"$TMP/custom_raw.err" || fail "custom raw: $(cat "$TMP/custom_raw.err")"
check "$TMP/custom.json" "r['completed'] == 3 and r['total_output_tokens'] == 12" "custom"
python3 - "$TMP/custom.json" "$TMP/custom_raw.json" <<'PY' || fail "the chat template did not add prompt tokens"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
sys.exit(0 if a["total_input_tokens"] > b["total_input_tokens"] + 3 * 3 else 1)
PY

# 5. Goodput, percentile selection, burstiness.
"$BIN" bench serve --port "$PORT" --num-prompts 4 --random-input 24 --random-output 4 --ignore-eos \
  --goodput ttft:1000000 e2el:1000000 --percentile-metrics ttft,e2el --metric-percentiles 50,99.9 \
  --request-rate 40 --burstiness 0.5 --save-result "$TMP/good.json" >"$TMP/good.out" 2>"$TMP/good.err" \
  || fail "goodput: $(cat "$TMP/good.err")"
check "$TMP/good.json" "abs(r['request_goodput'] - r['request_throughput']) < 1e-9 and 'p99.9_e2el_ms' in r and 'p50_ttft_ms' in r and r['burstiness'] == 0.5" "goodput (all good)"
grep -q "Request goodput (req/s):" "$TMP/good.out" || fail "no goodput row: $(cat "$TMP/good.out")"
grep -q "P99.9 E2EL (ms):" "$TMP/good.out" || fail "no P99.9 E2EL row: $(cat "$TMP/good.out")"
grep -q "Inter-token Latency" "$TMP/good.out" && fail "ITL reported though not selected: $(cat "$TMP/good.out")"
"$BIN" bench serve --port "$PORT" --num-prompts 2 --random-input 24 --random-output 4 --ignore-eos \
  --goodput ttft:0 --save-result "$TMP/bad_good.json" >/dev/null 2>"$TMP/bad_good.err" || fail "goodput 0: $(cat "$TMP/bad_good.err")"
check "$TMP/bad_good.json" "r['request_goodput'] == 0 and r['completed'] == 2" "goodput (none good)"

# 6. What is not supported is refused by name, before any request.
expect_error() {  # expect_error <message regex> <args...>
  local want=$1
  shift
  if "$BIN" bench serve --port "$PORT" "$@" >/dev/null 2>"$TMP/err.txt"; then fail "accepted: $*"; fi
  grep -Eq -- "$want" "$TMP/err.txt" || fail "error for '$*' lacks '$want': $(cat "$TMP/err.txt")"
}
expect_error "--backend tgi: not supported" --backend tgi
expect_error "--backend vllm sends completions requests" --backend vllm --endpoint /v1/chat/completions
expect_error "ambiguous option: --random-in?p?u?t? could match|ambiguous option: --random could match" --random 5
expect_error "--goodput: unknown metric 'foo'" --goodput foo:1
expect_error "--dataset-name sonnet" --dataset-name sonnet
expect_error "--dataset-path is required" --dataset-name sharegpt
expect_error "--percentile-metrics: unknown metric 'ttfb'" --percentile-metrics ttfb
expect_error "--burstiness must be positive" --burstiness 0
echo "bench_vllm_lines: OK ($n recipe line(s))"
