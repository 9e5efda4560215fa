#!/usr/bin/env bash
# `m3serve bench serve` smoke run against a real `m3serve serve` of a tiny model (port 0, read from
# the log): the random dataset on /v1/completions (4 prompts, small lengths, --save-result and
# --plot) and the agentic dataset on chat completions (prefix-cache hit rate from /metrics); checks
# the report and the result JSON fields. Also `bench roofline` argument errors. Server always killed.
# Usage: bench.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP"
fail() { echo "FAIL: $*" >&2; echo "--- server log:" >&2; tail -20 "$TMP/server.log" >&2 || true; exit 1; }
. "$(dirname "$0")/lib/server_port.sh"

"$BIN" make-model --layout m31 --preset tiny --seed 5 --out "$TMP/model" 2>/dev/null
cp "$DATA/chat/MiniMax-M3.jinja" "$TMP/model/chat_template.jinja"
"$BIN" serve "$TMP/model" --host 127.0.0.1 --port 0 --served-model-name tiny --max-model-len 1024 \
  --kv-cache-memory 0.05 >"$TMP/server.log" 2>&1 &
PID=$!
trap 'kill -9 $PID 2>/dev/null || true' EXIT
wait_server_port "$TMP/server.log" $PID

# Random dataset, model name from /v1/models, prompts built with the server's tokenizer endpoints.
"$BIN" bench serve --base-url "http://127.0.0.1:$PORT" --dataset-name random --num-prompts 4 \
  --random-input-len 32 --random-output-len 8 --max-concurrency 2 --ignore-eos --seed 1 \
  --save-result "$TMP/random.json" --plot "$TMP/random.svg" >"$TMP/random.out" 2>"$TMP/random.err" \
  || fail "bench serve random: $(cat "$TMP/random.err")"
for k in "Successful requests:" "Mean TTFT (ms):" "P99 TPOT (ms):" "Median ITL (ms):" "P90 E2EL (ms):" \
  "Output token throughput" "Total token throughput"; do
  grep -q "$k" "$TMP/random.out" || fail "report lacks $k"
done
J=$TMP/random.json
for k in completed failed duration total_input_tokens total_output_tokens request_throughput output_throughput \
  total_token_throughput mean_ttft_ms median_ttft_ms p90_ttft_ms p99_ttft_ms mean_tpot_ms p99_tpot_ms mean_itl_ms \
  p99_itl_ms mean_e2el_ms p99_e2el_ms model_id tokenizer_id burstiness input_lens output_lens ttfts itls \
  generated_texts errors; do
  grep -q "\"$k\":" "$J" || fail "result JSON lacks $k"
done
python3 - "$J" <<'PY' || fail "per-request lists: $(cat "$J")"
import json, sys
r = json.load(open(sys.argv[1]))
assert all(len(r[k]) == 4 for k in ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")), r
assert r["output_lens"] == [8] * 4 and all(t > 0 for t in r["ttfts"]) and r["errors"] == [""] * 4, r
assert all(1 <= len(i) <= 7 for i in r["itls"]) and all(t for t in r["generated_texts"]), r  # one gap per text chunk after the first
PY
# A reply that ends at its first token (max_tokens 1, the text may be empty) is a success, as vLLM counts it.
"$BIN" bench serve --base-url "http://127.0.0.1:$PORT" --dataset-name random --num-prompts 2 \
  --random-input-len 16 --random-output-len 1 --seed 2 --no-progress >"$TMP/one.out" 2>&1 || fail "bench serve, 1 token: $(cat "$TMP/one.out")"
grep -q "Successful requests: *2" "$TMP/one.out" || fail "one-token replies: $(cat "$TMP/one.out")"
grep -q '"completed": 4' "$J" || fail "not all 4 requests completed: $(cat "$J")"
grep -q '"failed": 0' "$J" || fail "failed requests: $(cat "$J")"
grep -q '"total_output_tokens": 32' "$J" || fail "ignore_eos: expected 4 x 8 output tokens: $(cat "$J")"
grep -q '"model_id": "tiny"' "$J" || fail "model name not taken from /v1/models"
grep -q '<svg' "$TMP/random.svg" || fail "no SVG plot"

# Agentic multi-turn sessions on chat completions.
"$BIN" bench serve --port "$PORT" --dataset-name agentic --num-sessions 2 --turns 2 --random-input-len 64 \
  --tool-result-len 16 --random-output-len 4 --no-progress --save-result "$TMP/agentic.json" >"$TMP/agentic.out" \
  2>"$TMP/agentic.err" || fail "bench serve agentic: $(cat "$TMP/agentic.err")"
grep -q "Prefix cache hit rate:" "$TMP/agentic.out" || fail "agentic report lacks the hit rate"
for k in tok_per_s tok_per_s_per_user p90_ttft_ms prefix_cache_hit_rate num_sessions turns; do
  grep -q "\"$k\":" "$TMP/agentic.json" || fail "agentic JSON lacks $k"
done
grep -q '"completed": 4' "$TMP/agentic.json" || fail "agentic: not all 4 turns completed"
grep -q '"prefix_cache_hit_rate": 0\.[0-9]' "$TMP/agentic.json" || fail "agentic: no prefix-cache hits: $(cat "$TMP/agentic.json")"

# Bad arguments are refused by name.
if "$BIN" bench serve --port "$PORT" --endpoint /v1/nothing --num-prompts 1 >/dev/null 2>"$TMP/bad.err"; then
  fail "bad endpoint accepted"
fi
grep -q -- "--endpoint" "$TMP/bad.err" || fail "bad endpoint not named: $(cat "$TMP/bad.err")"
if "$BIN" bench roofline >/dev/null 2>"$TMP/roof.err"; then fail "roofline without --model accepted"; fi
grep -q -- "--model" "$TMP/roof.err" || fail "roofline: --model not named"
if "$BIN" bench roofline --model "$TMP/none" --kv-cache-dtype fp7 >/dev/null 2>"$TMP/roof.err"; then fail "roofline: bad KV dtype accepted"; fi
grep -q -- "--kv-cache-dtype" "$TMP/roof.err" || fail "roofline: bad KV dtype not named"
# A small roofline run on the tiny model: the report's sections and, per steady run, the weights' read
# rate over a read probe taken just before it (one figure per --repeats, and their median).
# With --compare-context, one rate ratio per run against the other context (run right after it).
"$BIN" bench roofline --model "$TMP/model" --context 64 --compare-context 16 --prefill 8 --repeats 3 --probe-mib 8 \
  >"$TMP/roof.txt" 2>&1 ||
  fail "roofline run: $(tail -3 "$TMP/roof.txt")"
for want in "memory read bandwidth" "^DECODE" "^PREFILL" "^steady decode" "everything a step reads"; do
  grep -q "$want" "$TMP/roof.txt" || fail "roofline: no '$want' line"
done
grep -Eq "paired with a read probe just before each run: weights at [0-9]+% [0-9]+% [0-9]+% of it \(median [0-9]+%\)" \
  "$TMP/roof.txt" || fail "roofline: no paired line for 3 runs: $(grep -i paired "$TMP/roof.txt")"
# And 32 steps each between two passes of that probe (the rate of each against the passes around it).
grep -Eq "interleaved with the read probe \(32 steps, each between two 8 MiB passes\): weights at a median [0-9]+% \(quartiles [0-9]+-[0-9]+%\)" \
  "$TMP/roof.txt" || fail "roofline: no interleaved line: $(grep -i interleaved "$TMP/roof.txt")"
grep -Eq "against context 16, .*rate at 64 over rate at 16, per pair [0-9.]+ [0-9.]+ [0-9.]+ \(median [0-9.]+\)" \
  "$TMP/roof.txt" || fail "roofline: no ratio line for 3 runs: $(grep -i 'against' "$TMP/roof.txt")"
# The decode kernels' in-cache rates, one line per kernel class with its format (the tiny m31 model:
# MXFP8 projections, NVFP4 experts, BF16 lm_head), and the decode roof built from them.
for want in "attention projections +MXFP8" "routed experts +NVFP4" "lm_head +BF16"; do
  grep -Eq "^  $want +[0-9.]+ G weights/s = +[0-9.]+ GB/s = [0-9.]+x read BW$" "$TMP/roof.txt" ||
    fail "roofline: no in-cache line '$want': $(grep -A7 'decode kernels in cache' "$TMP/roof.txt")"
done
grep -Eq "decode overlapped perfectly\): [0-9.]+ ms for [0-9.]+ MB = [0-9]+% of read BW; the steady step's weights$" \
  "$TMP/roof.txt" || fail "roofline: no decode roof line: $(grep -A2 'decode roof' "$TMP/roof.txt")"
grep -Eq "^  reach [0-9]+% of the roof's rate; classes bound by their decode: " "$TMP/roof.txt" ||
  fail "roofline: no roof share line: $(grep -A2 'decode roof' "$TMP/roof.txt")"
if "$BIN" bench roofline --model "$TMP/model" --compare-context -1 >/dev/null 2>"$TMP/roof.err"; then
  fail "roofline: negative --compare-context accepted"
fi
grep -q -- "--compare-context" "$TMP/roof.err" || fail "roofline: bad --compare-context not named"
echo "bench.sh: OK"
