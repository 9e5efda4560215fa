#!/usr/bin/env bash
# Command-line values that cannot work are refused at start, naming the flag or field and the value,
# instead of being replaced by a default, wrapped around, ignored, or left to the out-of-memory killer:
# - numbers: --kv-cache-memory / --block-size / --max-model-len 0 or below, --max-request-bytes and
#   --max-waiting-requests below 0, bench serve's --num-prompts below 1;
# - memory: a KV pool or an in-memory KV tier larger than MemAvailable (refused before any page is touched);
# - generate: --prompt's sampling flags with --input, --output with --prompt; --seed is honoured, and --input
#   lines take generation_config.json's defaults;
# - an unknown option is named as such (CLI11 lists extras backwards); --version prints the version;
# - config.json: max_position_embeddings 0, an eos_token_id past the vocabulary;
# - bench serve against a port nobody listens on says it could not connect;
# - --enable-log-requests logs each request as it arrives; vLLM's --dtype auto, --disable-log-stats,
#   --enable-chunked-prefill are accepted (other values refused); --seed seeds requests without one;
#   /metrics escapes label values; HEAD works on GET routes; the process keeps its name.
# Usage: flag_checks.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP"
fail() { echo "FAIL: $*" >&2; exit 1; }
. "$(dirname "$0")/lib/server_port.sh"

"$BIN" make-model --layout m31 --preset tiny --seed 3 --out "$TMP/model" 2>/dev/null
cp "$DATA/chat/MiniMax-M3.jinja" "$TMP/model/chat_template.jinja"
M="$TMP/model"

# refused WHAT PATTERN ARGS...: the command exits non-zero at once and its stderr matches PATTERN.
refused() {
  local what=$1 pattern=$2
  shift 2
  if timeout 60 "$BIN" "$@" >"$TMP/out.txt" 2>"$TMP/err.txt"; then fail "$what: accepted"; fi
  grep -q -- "$pattern" "$TMP/err.txt" || fail "$what: stderr lacks '$pattern': $(tail -3 "$TMP/err.txt")"
  if grep -q "Killed\|Segmentation\|terminate called" "$TMP/err.txt"; then fail "$what: crashed"; fi
}

refused "kv-cache-memory -1" '--kv-cache-memory: must be positive, got -1' serve "$M" --port 0 --kv-cache-memory -1
refused "kv-cache-memory 0" '--kv-cache-memory: must be positive, got 0' serve "$M" --port 0 --kv-cache-memory 0
refused "block-size 0" '--block-size: must be positive, got 0' serve "$M" --port 0 --block-size 0
refused "max-model-len 0" '--max-model-len: must be positive, got 0' generate --model "$M" --prompt hi --max-model-len 0
refused "max-request-bytes -1" '--max-request-bytes: must be positive, got -1' serve "$M" --port 0 --max-request-bytes -1
refused "max-waiting-requests -5" '--max-waiting-requests: must be 0 or more, got -5' serve "$M" --port 0 \
  --max-waiting-requests -5
refused "KV pool over the RAM" 'MiB is available (MemAvailable); choose a smaller --kv-cache-memory' serve "$M" --port 0 \
  --kv-cache-memory 100000
refused "KV tier over the RAM" '--kv-offloading-size 100000.* is more than the .* MiB of memory available' \
  serve "$M" --port 0 --kv-cache-memory 0.01 --kv-offloading-size 100000
refused "generate --input with --max-tokens" '--input excludes --max-tokens' generate --model "$M" \
  --input "$TMP/none.jsonl" --output "$TMP/o.jsonl" --max-tokens 3
refused "generate --input with --temperature" '--input excludes --temperature' generate --model "$M" \
  --input "$TMP/none.jsonl" --output "$TMP/o.jsonl" --temperature 0
refused "generate --prompt with --output" '--prompt excludes --output' generate --model "$M" --prompt hi \
  --output "$TMP/o.jsonl"
refused "generate --seed -1" '--seed: must be 0 or more, got -1' generate --model "$M" --prompt hi --seed -1
refused "generate --temperature -1" '--temperature: must be in \[0, 100\]' generate --model "$M" --prompt hi --temperature -1
refused "a file as the model" 'config.json is a file: pass the checkpoint directory' generate --model "$M/config.json" --prompt hi
refused "unknown option" 'unknown option: --swap-space (with 4); see .m3serve serve --help.' serve "$M" --swap-space 4
refused "bench serve --num-prompts -5" '--num-prompts: must be positive, got -5' bench serve --num-prompts -5
refused "no subcommand" 'a subcommand is required'
[ "$("$BIN" --version)" = "$("$BIN" --version | grep -E '^[0-9]+\.[0-9]+\.[0-9]+$')" ] || fail "--version: $("$BIN" --version)"

# config.json values that cannot work.
cp -r "$M" "$TMP/bad"
python3 - "$TMP/bad/config.json" <<'PY'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
tc = c.get("text_config", c)
tc["max_position_embeddings"] = 0
json.dump(c, open(p, "w"))
PY
refused "max_position_embeddings 0" 'max_position_embeddings' generate --model "$TMP/bad" --prompt hi
grep -q 'positive' "$TMP/err.txt" || fail "max_position_embeddings 0: $(cat "$TMP/err.txt")"
cp "$M/config.json" "$TMP/bad/config.json"
python3 - "$TMP/bad/config.json" <<'PY'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
tc = c.get("text_config", c)
tc["eos_token_id"] = tc["vocab_size"] + 7
json.dump(c, open(p, "w"))
PY
refused "eos_token_id past the vocabulary" 'eos_token_id.*is outside the vocabulary (vocab_size' generate --model "$TMP/bad" \
  --prompt hi

# generate --prompt honours --seed (sampled text repeats); generate --input takes generation_config.json's
# sampling defaults as serve does (a checkpoint asking for temperature 0 samples greedily when a line
# leaves temperature out).
a=$("$BIN" generate --model "$M" --prompt "Once upon" --max-tokens 12 --temperature 1 --seed 7 2>/dev/null)
b=$("$BIN" generate --model "$M" --prompt "Once upon" --max-tokens 12 --temperature 1 --seed 7 2>/dev/null)
[ "$a" = "$b" ] || fail "generate --seed 7 gave two texts: '$a' / '$b'"
cp -r "$M" "$TMP/greedy"
echo '{"temperature": 0.0, "top_p": 0.5}' >"$TMP/greedy/generation_config.json"
printf '%s\n' '{"prompt": "Once upon", "max_tokens": 12}' '{"prompt": "Once upon", "max_tokens": 12, "temperature": 0}' \
  '{"prompt": "Once upon", "max_tokens": 12, "temperature": 1, "seed": 3}' >"$TMP/lines.jsonl"
"$BIN" generate --model "$TMP/greedy" --input "$TMP/lines.jsonl" --output "$TMP/out.jsonl" 2>/dev/null
python3 - "$TMP/out.jsonl" <<'PY' || fail "generate --input defaults: $(cat "$TMP/out.jsonl")"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert r[0]["token_ids"] == r[1]["token_ids"], r  # the default is the checkpoint's temperature 0
PY

# bench serve against a port nobody listens on (bound and closed again by python, so it is free).
FREE=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
refused "bench serve, no server" 'could not connect' bench serve --base-url "http://127.0.0.1:$FREE" --model x \
  --num-prompts 1 --no-progress

# vLLM flags with no other meaning here are accepted; their other values are refused by name.
refused "--dtype float16" '--dtype float16: each tensor is computed in the format the checkpoint stores it' \
  serve "$M" --port 0 --dtype float16
refused "--no-enable-chunked-prefill" '--no-enable-chunked-prefill: chunked prefill is always on' serve "$M" --port 0 \
  --no-enable-chunked-prefill
refused "log requests both ways" 'contradict each other' serve "$M" --port 0 --enable-log-requests --disable-log-requests

# A served server: --enable-log-requests logs one line per request; the model name is escaped in /metrics'
# labels; HEAD answers a GET route's headers; the process keeps its name; --seed makes requests without
# a seed sample the same text in a rerun.
start() {
  "$BIN" serve "$M" --host 127.0.0.1 --port 0 --kv-cache-memory 0.01 --enable-log-requests --seed 11 \
    --served-model-name 'team\x "v2"' --disable-log-stats --enable-chunked-prefill --dtype auto >"$TMP/server.log" 2>&1 &
  PID=$!
  trap 'kill -9 $PID 2>/dev/null || true' EXIT
  wait_server_health "$TMP/server.log" $PID
}
sampled() {
  curl -s "$U/v1/completions" -H 'Content-Type: application/json' -d '{"prompt":"Once","max_tokens":12,"temperature":1}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'
}
start
FIRST=$(sampled)
curl -s "$U/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt":"Hello there","max_tokens":2,"temperature":0,"seed":5}' >/dev/null
grep -q 'request cmpl-[0-9a-f]*: completion, 1 prompt(s) of [0-9]* tokens, n 1, max_tokens 2, temperature 0,.*seed 5.*prompt "Hello there"' \
  "$TMP/server.log" || fail "request not logged: $(grep -v weights "$TMP/server.log" | tail -3)"
# (each answer saved first: with pipefail, grep -q closing the pipe early would fail the curl before it)
curl -s "$U/metrics" >"$TMP/metrics.txt"
grep -qF 'vllm:num_requests_running{model_name="team\\x \"v2\"",engine="0"}' "$TMP/metrics.txt" ||
  fail "model name not escaped in /metrics: $(grep -m1 'num_requests_running{' "$TMP/metrics.txt")"
H=$(curl -sI "$U/health" -w '%{http_code}' -o "$TMP/head.txt")
[ "$H" = 200 ] || fail "HEAD /health: $H"
curl -sI "$U/metrics" >"$TMP/head_metrics.txt"
grep -qi '^content-length: [1-9]' "$TMP/head_metrics.txt" || fail "HEAD /metrics: $(cat "$TMP/head_metrics.txt")"
[ "$(cat /proc/$PID/comm)" = m3serve ] || fail "process name $(cat /proc/$PID/comm)"
kill -TERM $PID
wait $PID || fail "server exit status $?"
start
[ "$(sampled)" = "$FIRST" ] || fail "--seed 11: the first sampled request differs between two runs"
kill -TERM $PID
wait $PID || fail "server exit status $?"
echo "flag_checks: every impossible value refused by name"
