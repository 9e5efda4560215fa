#!/usr/bin/env bash
# DSpark speculative decoding through the real server on the demo model (models/demo + dspark/):
# greedy completions (plain and streamed), a greedy chat answer and a greedy json_schema answer are
# identical with and without --speculative-config; /metrics exposes vLLM's spec_decode_* counters with the acceptance per position;
# `bench serve` reports the speculative section; bad speculative configs fail at start with clear messages.
# Usage: spec_server.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
MODEL="$DATA/../../models/demo"
rm -rf "$TMP"
mkdir -p "$TMP"
fail() { echo "FAIL: $*" >&2; echo "--- server log:" >&2; cat "$TMP/server.log" >&2 || true; exit 1; }
. "$(dirname "$0")/lib/server_port.sh"
command -v curl >/dev/null || fail "curl is needed"

# Bad configurations: named key and allowed values.
if "$BIN" serve "$MODEL" --port 0 --speculative-config '{"method":"dspark","num_speculative_tokens":9}' 2>"$TMP/e1"; then
  fail "9 drafts accepted for a block of 7"; fi
grep -q "exceeds the draft's dspark_block_size 7" "$TMP/e1" || fail "block size not explained: $(cat "$TMP/e1")"
if "$BIN" serve "$MODEL" --port 0 --speculative-config '{"method":"medusa","num_speculative_tokens":3}' 2>"$TMP/e2"; then
  fail "unknown method accepted"; fi
grep -q '"medusa" is not supported' "$TMP/e2" || fail "unknown method not explained: $(cat "$TMP/e2")"

PROMPT='In the beginning God created'
run_server() {  # $1 = label, rest = extra flags; fills $TMP/$1.*
  local label=$1
  shift
  "$BIN" serve "$MODEL" --host 127.0.0.1 --port 0 --kv-cache-memory 0.05 "$@" >"$TMP/server.log" 2>&1 &
  PID=$!
  trap 'kill -9 $PID 2>/dev/null || true' EXIT
  wait_server_port "$TMP/server.log" $PID
  U=http://127.0.0.1:$PORT
  curl -sf "$U/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\":\"$PROMPT\",\"max_tokens\":48,\"temperature\":0,\"ignore_eos\":true}" >"$TMP/$label.completion" ||
    fail "$label: completion request failed"
  curl -sfN "$U/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\":\"$PROMPT\",\"max_tokens\":48,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}" >"$TMP/$label.stream" ||
    fail "$label: streamed request failed"
  curl -sf "$U/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"messages":[{"role":"user","content":"What is 37 * 12?"}],"max_tokens":40,"temperature":0}' >"$TMP/$label.chat" ||
    fail "$label: chat request failed"
  # Structured output (json_schema), greedy: speculated through masked drafts and verification.
  curl -sf "$U/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"messages":[{"role":"user","content":"Give a person as JSON."}],"max_tokens":80,"temperature":0,"response_format":{"type":"json_schema","json_schema":{"name":"p","schema":{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":120}},"required":["name","age"],"additionalProperties":false}}}}' \
    >"$TMP/$label.structured" || fail "$label: structured request failed"
  # The 7 streamed pieces of a mixed batch (sampled requests with seeds run alongside).
  for s in 1 2 3; do
    curl -sf "$U/v1/completions" -H 'Content-Type: application/json' \
      -d "{\"prompt\":\"And Jesus said\",\"max_tokens\":32,\"temperature\":0.9,\"seed\":$s}" >/dev/null &
  done
  wait $(jobs -p | grep -v "^$PID\$") 2>/dev/null || true
  curl -sf "$U/metrics" >"$TMP/$label.metrics" || fail "$label: metrics failed"
  if [ "$label" = spec ]; then
    "$BIN" bench serve --port "$PORT" --dataset-name random --random-input-len 32 --random-output-len 24 \
      --num-prompts 4 --max-concurrency 2 --ignore-eos --save-result "$TMP/bench.json" >"$TMP/bench.out" 2>"$TMP/bench.err" ||
      fail "bench serve failed: $(cat "$TMP/bench.err")"
  fi
  kill -TERM $PID
  wait $PID || fail "$label: server did not exit cleanly"
  trap - EXIT
}
text_of() { sed -n 's/.*"text":"\([^"]*\)".*/\1/p' "$1" | head -1; }
stream_text() { sed -n 's/^data: \(.*\)$/\1/p' "$1" | grep -v '^\[DONE\]' | sed -n 's/.*"text":"\([^"]*\)".*/\1/p' | tr -d '\n'; }

run_server plain
# Every draft verified (adaptive speculation off): the counters and bench's speculative section below
# must not depend on whether this minute's measured step costs make drafts pay on these short requests.
run_server spec --speculative-config '{"method":"dspark","num_speculative_tokens":7,"draft_sample_method":"probabilistic","rejection_sample_method":"block","kv_cache_dtype":"fp8","attention_backend":"FLASHINFER_TS","adaptive_num_speculative_tokens":false}'

[ -n "$(text_of "$TMP/plain.completion")" ] || fail "empty completion: $(cat "$TMP/plain.completion")"
[ "$(text_of "$TMP/plain.completion")" = "$(text_of "$TMP/spec.completion")" ] ||
  fail "greedy completion differs with speculation: $(cat "$TMP/plain.completion") vs $(cat "$TMP/spec.completion")"
[ "$(stream_text "$TMP/plain.stream")" = "$(stream_text "$TMP/spec.stream")" ] || fail "streamed greedy text differs"
[ "$(stream_text "$TMP/spec.stream")" = "$(text_of "$TMP/spec.completion")" ] || fail "streamed text differs from the plain response"
[ "$(sed 's/"id":"[^"]*"//; s/"created":[0-9]*//' "$TMP/plain.chat")" = "$(sed 's/"id":"[^"]*"//; s/"created":[0-9]*//' "$TMP/spec.chat")" ] ||
  fail "greedy chat answer differs: $(cat "$TMP/plain.chat") vs $(cat "$TMP/spec.chat")"

[ "$(sed 's/"id":"[^"]*"//; s/"created":[0-9]*//' "$TMP/plain.structured")" = "$(sed 's/"id":"[^"]*"//; s/"created":[0-9]*//' "$TMP/spec.structured")" ] ||
  fail "greedy structured answer differs: $(cat "$TMP/plain.structured") vs $(cat "$TMP/spec.structured")"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); c=json.loads(r["choices"][0]["message"]["content"]); assert r["choices"][0]["finish_reason"]=="stop" and set(c)=={"name","age"} and isinstance(c["age"],int) and 0<=c["age"]<=120 and len(c["name"])<=12, c' \
  "$TMP/spec.structured" || fail "structured answer does not follow the schema: $(cat "$TMP/spec.structured")"

M="$TMP/spec.metrics"
for n in spec_decode_num_drafts_total spec_decode_num_draft_tokens_total spec_decode_num_accepted_tokens_total; do
  v=$(sed -n "s/^vllm:$n{[^}]*} \([0-9.e+]*\)$/\1/p" "$M")
  [ -n "$v" ] || fail "vllm:$n missing from /metrics"
  awk -v v="$v" 'BEGIN { exit !(v > 0) }' || fail "vllm:$n is $v"
done
[ "$(grep -c '^vllm:spec_decode_num_accepted_tokens_per_pos_total{.*position="[0-6]"}' "$M")" = 7 ] ||
  fail "per-position acceptance missing: $(grep per_pos "$M")"
if grep -q spec_decode "$TMP/plain.metrics"; then fail "spec counters exported without speculation"; fi
grep -q "Speculative Decoding" "$TMP/bench.out" || fail "bench serve has no speculative section: $(cat "$TMP/bench.out")"
grep -q '"spec_decode_acceptance_length"' "$TMP/bench.json" || fail "bench JSON lacks the acceptance length"
echo "spec_server: OK"
