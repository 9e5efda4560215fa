#!/usr/bin/env bash
# `m3serve serve` end to end over HTTP (curl): starts the real server on a free port (--port 0, the
# bound port is read from its log), waits for /health with a bounded retry loop, then checks chat and
# completions (streamed and not, usage, n), models, health, version, metrics names, tokenize /
# detokenize (ids equal `m3serve tokenize`), every error case with its status and error JSON, the
# API key, a client that disconnects mid-stream or during a long non-streaming request (its request is
# aborted: running goes back to 0),
# and a clean exit 0 on SIGTERM. The server is always killed at the end.
# Usage: server.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP"
fail() { echo "FAIL: $*" >&2; echo "--- server log:" >&2; cat "$TMP/server.log" >&2 || true; exit 1; }
. "$(dirname "$0")/lib/server_port.sh"
command -v curl >/dev/null || fail "curl is needed"

"$BIN" make-model --layout m31 --preset tiny --seed 3 --out "$TMP/model" 2>/dev/null
cp "$DATA/chat/MiniMax-M3.jinja" "$TMP/model/chat_template.jinja"

# Unknown flags are rejected by name; GPU-only recipe flags are accepted and reported.
if "$BIN" serve "$TMP/model" --no-such-flag 2>"$TMP/unknown.err"; then fail "unknown flag accepted"; fi
grep -q -- '--no-such-flag' "$TMP/unknown.err" || fail "unknown flag not named: $(cat "$TMP/unknown.err")"

# --speculative-config on a checkpoint without a dspark/ folder fails at start, naming the folder.
if "$BIN" serve "$TMP/model" --port 0 --speculative-config '{"method":"dspark","num_speculative_tokens":3}' \
  2>"$TMP/spec.err"; then fail "speculative config without a draft accepted"; fi
grep -q 'needs the draft model in .*/dspark' "$TMP/spec.err" || fail "missing draft not explained: $(cat "$TMP/spec.err")"

KEY=test-key-123
"$BIN" serve "$TMP/model" --host 127.0.0.1 --port 0 --api-key "$KEY" --served-model-name tiny \
  --max-model-len 4000 --kv-cache-memory 0.05 --block-size 128 --max-request-bytes 200000 \
  --reasoning-parser minimax_m3 --tool-call-parser minimax_m3 --enable-auto-tool-choice \
  --tensor-parallel-size 8 --compilation-config '{"cudagraph_mode": "FULL_AND_PIECEWISE"}' \
  --quantization-config.moe mxfp8 \
  --disable-hybrid-kv-cache-manager --enable-dbo --gpu-memory-utilization 0.9 --no-enable-log-requests \
  --limit-mm-per-prompt '{"video": 0}' --stream-interval 1 >"$TMP/server.log" 2>&1 &
PID=$!
trap 'kill -9 $PID 2>/dev/null || true' EXIT

wait_server_health "$TMP/server.log" $PID
grep -q 'not applicable on this build.*--compilation-config' "$TMP/server.log" || fail "GPU flags not reported"
grep -q 'KV cache:' "$TMP/server.log" || fail "engine describe() line missing"

A=(-H "Authorization: Bearer $KEY" -H "Content-Type: application/json")
# req METHOD PATH [BODY]: prints "STATUS BODY"
req() {
  local out
  if [ $# -ge 3 ]; then out=$(curl -s -X "$1" "${A[@]}" -w '\n%{http_code}' "$U$2" --data-binary "$3")
  else out=$(curl -s -X "$1" "${A[@]}" -w '\n%{http_code}' "$U$2"); fi
  STATUS=$(echo "$out" | tail -1)
  BODY=$(echo "$out" | sed '$d')
}
expect() {  # expect STATUS PATTERN WHAT
  [ "$STATUS" = "$1" ] || fail "$3: status $STATUS, expected $1: $BODY"
  echo "$BODY" | grep -q -- "$2" || fail "$3: body lacks $2: $BODY"
}
expect_error() {  # expect_error STATUS TYPE PARAM WHAT
  expect "$1" "\"error\":{\"message\":\"[^\"]" "$4"
  echo "$BODY" | grep -q "\"type\":\"$2\"" || fail "$4: error type: $BODY"
  echo "$BODY" | grep -q "\"param\":$3" || fail "$4: error param: $BODY"
  echo "$BODY" | grep -q "\"code\":$1" || fail "$4: error code: $BODY"
}

[ "$(curl -s -o /dev/null -w '%{http_code}' "$U/health")" = 200 ] || fail "/health"
req GET /version; expect 200 '"version"' "/version"
req GET /v1/models; expect 200 '"object":"list","data":\[{"id":"tiny","object":"model"' "/v1/models"
echo "$BODY" | grep -q '"max_model_len":4000' || fail "/v1/models max_model_len: $BODY"

# API key.
out=$(curl -s -w '\n%{http_code}' "$U/v1/models"); STATUS=$(echo "$out" | tail -1); BODY=$(echo "$out" | sed '$d')
expect_error 401 AuthenticationError null "no API key"
out=$(curl -s -H "Authorization: Bearer wrong" -w '\n%{http_code}' "$U/v1/models"); STATUS=$(echo "$out" | tail -1); BODY=$(echo "$out" | sed '$d')
expect_error 401 AuthenticationError null "wrong API key"

# Chat, non-streaming.
CHAT='{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"max_tokens":6,"temperature":0}'
req POST /v1/chat/completions "$CHAT"
expect 200 '"object":"chat.completion"' "chat"
echo "$BODY" | grep -q '"message":{"role":"assistant","content":' || fail "chat message: $BODY"
echo "$BODY" | grep -q '"reasoning":' || fail "chat reasoning field: $BODY"
echo "$BODY" | grep -q '"finish_reason":"\(length\|stop\)"' || fail "chat finish_reason: $BODY"
echo "$BODY" | grep -q '"completion_tokens":[1-6],' || fail "chat usage: $BODY"
FIRST=$BODY
req POST /v1/chat/completions "$CHAT"
[ "$(echo "$BODY" | sed 's/.*"message":\({[^}]*}\).*/\1/')" = "$(echo "$FIRST" | sed 's/.*"message":\({[^}]*}\).*/\1/')" ] ||
  fail "greedy chat not reproducible"
req POST /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_completion_tokens":3,"n":2,"seed":5,"logprobs":true,"top_logprobs":2}'
expect 200 '"index":1' "chat n=2"
echo "$BODY" | grep -q '"top_logprobs":\[{"token"' || fail "chat logprobs: $BODY"
echo "$BODY" | grep -q '"completion_tokens":6,' || fail "chat n=2 usage: $BODY"

# Chat, streaming with usage.
curl -sN "${A[@]}" "$U/v1/chat/completions" \
  -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":5,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}' \
  >"$TMP/stream.txt"
grep -v '^$' "$TMP/stream.txt" | grep -v '^data: ' && fail "non-data SSE line"
[ "$(grep -v '^$' "$TMP/stream.txt" | tail -1)" = "data: [DONE]" ] || fail "stream does not end with [DONE]"
head -1 "$TMP/stream.txt" | grep -q '"object":"chat.completion.chunk".*"delta":{"role":"assistant","content":""}' ||
  fail "first chunk: $(head -1 "$TMP/stream.txt")"
grep -q '"choices":\[\],"usage":{"prompt_tokens":[0-9]*,"completion_tokens":5,' "$TMP/stream.txt" || fail "usage chunk"
grep -q '"finish_reason":"length"' "$TMP/stream.txt" || fail "stream finish_reason"
[ "$(grep -c '^data: {' "$TMP/stream.txt")" -ge 3 ] || fail "too few chunks"

# Completions: text, token-id prompt, n, echo, stop handling, streaming.
req POST /v1/completions '{"model":"tiny","prompt":"Hello world","max_tokens":4,"n":2,"temperature":0.7,"seed":1}'
expect 200 '"object":"text_completion"' "completions"
echo "$BODY" | grep -q '"index":1,"text":' || fail "completions n=2: $BODY"
req POST /v1/completions '{"prompt":[72,297,394],"max_tokens":2,"echo":true}'
expect 200 '"text":"Hello' "completions token prompt + echo"
req POST /v1/completions '{"prompt":[72,297,394],"max_tokens":2,"logprobs":1}'
expect 200 '"token_logprobs":\[' "completion logprobs"
# echo + logprobs would need the prompt's log-probabilities: refused by name, not half answered.
req POST /v1/completions '{"prompt":[72,297,394],"max_tokens":2,"echo":true,"logprobs":1}'
expect 400 '"param":"echo"' "echo with logprobs refused"
curl -sN "${A[@]}" "$U/v1/completions" -d '{"prompt":"Hi","max_tokens":3,"stream":true}' >"$TMP/cstream.txt"
grep -q '"object":"text_completion"' "$TMP/cstream.txt" || fail "completion stream chunks"
[ "$(grep -v '^$' "$TMP/cstream.txt" | tail -1)" = "data: [DONE]" ] || fail "completion stream [DONE]"

# Tokenize / detokenize.
req POST /tokenize '{"prompt":"Hello world, how are you?"}'
expect 200 '"count":' "tokenize"
IDS=$(echo "$BODY" | sed 's/.*"tokens":\(\[[^]]*\]\).*/\1/')
CLI_IDS=$("$BIN" tokenize --model "$TMP/model" --text "Hello world, how are you?" 2>/dev/null)
[ "$IDS" = "$CLI_IDS" ] || fail "/tokenize ids $IDS != m3serve tokenize $CLI_IDS"
req POST /detokenize "{\"tokens\":$IDS}"
expect 200 '"prompt":"Hello world, how are you?"' "detokenize round trip"
req POST /tokenize '{"messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":true,"chat_template_kwargs":{"thinking_mode":"enabled"}}'
expect 200 '"tokens":\[' "tokenize messages"

# return_token_strs (vLLM): the tokens in tokenizer.json's byte-level form, one per id; logit_bias moves
# greedy decoding onto the biased token; a special token the model emits stays out of a chat reply
# unless skip_special_tokens is false (the parsers read it either way).
python3 - "$U" "$KEY" <<'PY' || fail "return_token_strs / logit_bias / skip_special_tokens"
import json, sys, urllib.request, urllib.error
base, key = sys.argv[1], sys.argv[2]
def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())
t = post("/tokenize", {"prompt": "Hello world", "return_token_strs": True})
assert len(t["token_strs"]) == t["count"] == len(t["tokens"]), t
assert "".join(t["token_strs"]).replace("\u0120", " ") == "Hello world", t
(a, b), (sa, sb) = t["tokens"][:2], [x.replace("\u0120", " ") for x in t["token_strs"][:2]]
def greedy(bias):
    c = post("/v1/completions", {"prompt": "Once", "max_tokens": 3, "temperature": 0, "logit_bias": bias})
    return c["choices"][0]["text"]
g = greedy({str(a): 100})
assert g == sa * 3, (g, sa, t)
# -100 on every other token of the vocabulary (its size read from the refusal of an id past it).
req = urllib.request.Request(base + "/v1/completions", headers={"Content-Type": "application/json", "Authorization": "Bearer " + key},
                             data=json.dumps({"prompt": "Once", "logit_bias": {"99999999": 1}}).encode())
try:
    urllib.request.urlopen(req, timeout=60)
    assert False, "an id past the vocabulary was accepted"
except urllib.error.HTTPError as e:
    msg = json.loads(e.read())["error"]["message"]
vocab = int(msg.split("ids 0 to ")[1].split(")")[0]) + 1
g = greedy({str(i): -100 for i in range(vocab) if i != b})
assert g == sb * 3, (g, sb, t)
bos = post("/tokenize", {"prompt": "]~b]"})["tokens"]
assert len(bos) == 1, bos
chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0,
        "logit_bias": {str(bos[0]): 100}}
r = post("/v1/chat/completions", chat)
m = r["choices"][0]["message"]
assert r["usage"]["completion_tokens"] == 4, r
assert "]~b]" not in json.dumps(m) and not m["content"], m
m = post("/v1/chat/completions", {**chat, "skip_special_tokens": False})["choices"][0]["message"]
assert (m["content"] or "") + (m["reasoning"] or "") == "]~b]" * 4, m
PY

# Errors.
req POST /v1/chat/completions '{"messages": [oops'; expect_error 400 BadRequestError null "malformed JSON"
req POST /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"temperature":"hot"}'
expect_error 400 BadRequestError '"temperature"' "wrong field type"
req POST /v1/completions '{"prompt":"Hi","max_tokens":"5"}'; expect_error 400 BadRequestError '"max_tokens"' "max_tokens type"
req POST /v1/chat/completions '{"messages":"Hi"}'; expect_error 400 BadRequestError '"messages"' "messages type"
req POST /v1/chat/completions '{"model":"gpt-4","messages":[{"role":"user","content":"Hi"}]}'
expect_error 404 NotFoundError '"model"' "unknown model"
req POST /v1/completions '{"prompt":"Hi","top_p":1.5}'; expect_error 400 BadRequestError '"top_p"' "invalid top_p"
req POST /v1/completions '{"prompt":"Hi","temperature":-1}'; expect_error 400 BadRequestError '"temperature"' "negative temperature"
req POST /v1/completions '{"prompt":"Hi","n":0}'; expect_error 400 BadRequestError '"n"' "n = 0"
LONG=$(printf 'word %.0s' $(seq 1 4500))
req POST /v1/completions "{\"prompt\":\"$LONG\"}"
expect_error 400 BadRequestError '"prompt"' "prompt longer than --max-model-len"
echo "$BODY" | grep -q "maximum context length is 4000" || fail "too-long message: $BODY"
req POST /v1/completions '{"prompt":"Hi","max_tokens":5000}'; expect_error 400 BadRequestError '"max_tokens"' "max_tokens over the context"
# Structured outputs: a json_schema response_format holds even a random tiny model to the schema (the
# grammar ends after the value, so only the end token is left); an unsupported keyword is refused by name.
req POST /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":60,"temperature":1.5,"seed":4,"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"enum":["yes","no",7]}}}}'
expect 200 '"finish_reason":"stop"' "response_format json_schema"
echo "$BODY" | python3 -c 'import json,sys; c=json.loads(json.load(sys.stdin)["choices"][0]["message"]["content"]); assert c in ("yes","no",7), c' ||
  fail "response_format json_schema: content is not one of the enum values: $BODY"
req POST /v1/completions '{"prompt":"Hi","max_tokens":30,"guided_regex":"[a-c]{3}-[0-9]{2}","seed":1}'
expect 200 '"text":"[a-c][a-c][a-c]-[0-9][0-9]"' "guided_regex"
req POST /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"string","format":"hostname"}}}}'
expect_error 400 BadRequestError '"response_format"' "response_format with an unsupported format"
echo "$BODY" | grep -q "hostname" || fail "the refusal does not name the format: $BODY"
# oneOf whose branches may overlap (an integer is a number) is refused, not loosened to anyOf.
req POST /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"response_format":{"type":"json_schema","json_schema":{"schema":{"oneOf":[{"type":"number"},{"type":"integer"}]}}}}'
expect_error 400 BadRequestError '"response_format"' "response_format with an overlapping oneOf"
echo "$BODY" | grep -q "oneOf' whose branches 0 and 1 may both match" || fail "the refusal does not explain the oneOf: $BODY"
# An exclusive oneOf (different JSON types) is served.
req POST /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":40,"seed":2,"response_format":{"type":"json_schema","json_schema":{"schema":{"oneOf":[{"type":"boolean"},{"enum":["a","b"]}]}}}}'
expect 200 '"finish_reason":"stop"' "response_format with an exclusive oneOf"
echo "$BODY" | python3 -c 'import json,sys; c=json.loads(json.load(sys.stdin)["choices"][0]["message"]["content"]); assert c in (True,False,"a","b"), c' ||
  fail "exclusive oneOf: content is not one of the branches: $BODY"
TOOLS='[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"location":{"type":"string"}}}}}]'
# tool_choice required / named: the opener is forced into the prompt (a random tiny model may not
# finish the call, so only the shape is checked here; the parsing is unit-tested on canned output).
req POST /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"tools\":$TOOLS,\"tool_choice\":\"required\",\"max_tokens\":4}"
expect 200 '"tool_calls":\[' "tool_choice required"
req POST /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"tools\":$TOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},\"max_tokens\":4}"
expect 200 '"tool_calls":\[' "tool_choice named"
req POST /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"tools\":$TOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}"
expect_error 400 BadRequestError '"tool_choice"' "tool_choice names an unknown function"
req POST /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"}],\"tools\":$TOOLS,\"max_tokens\":4}"
expect 200 '"tool_calls":\[' "chat with tools (auto)"
head -c 300000 /dev/zero | tr '\0' 'a' >"$TMP/big.txt"
out=$(curl -s "${A[@]}" -w '\n%{http_code}' "$U/v1/completions" --data-binary @"$TMP/big.txt")
STATUS=$(echo "$out" | tail -1); BODY=$(echo "$out" | sed '$d')
expect_error 413 RequestTooLargeError null "body over the limit"
req GET /v1/nothing-here; expect_error 404 NotFoundError null "unknown route"

# Metrics names.
curl -s "$U/metrics" >"$TMP/metrics.txt"
for m in vllm:num_requests_running vllm:num_requests_waiting vllm:kv_cache_usage_perc vllm:prefix_cache_queries_total \
  vllm:prefix_cache_hits_total vllm:prompt_tokens_total vllm:generation_tokens_total \
  vllm:time_to_first_token_seconds_bucket vllm:inter_token_latency_seconds_bucket vllm:e2e_request_latency_seconds_bucket \
  vllm:request_success_total m3serve:step_latency_tail_steps_total m3serve:step_latency_tail_held_total m3serve:instance_info; do
  grep -q "^$m{" "$TMP/metrics.txt" || fail "metric $m missing"
done
# vLLM's request-phase histograms and cache info (its Grafana dashboard), and the text format itself: one
# HELP and one TYPE per family before its samples, cumulative buckets whose +Inf equals _count.
for m in vllm:request_queue_time_seconds_bucket vllm:request_prefill_time_seconds_bucket \
  vllm:request_decode_time_seconds_bucket vllm:request_inference_time_seconds_bucket \
  vllm:request_time_per_output_token_seconds_bucket vllm:iteration_tokens_total_bucket vllm:request_params_n_bucket \
  vllm:request_params_max_tokens_bucket vllm:cache_config_info; do
  grep -q "^$m{" "$TMP/metrics.txt" || fail "metric $m missing"
done
python3 - "$TMP/metrics.txt" <<'PY' || fail "/metrics text format"
import re, sys
help_, type_, seen, buckets, counts, bad = {}, {}, set(), {}, {}, []
for line in open(sys.argv[1]):
    line = line.rstrip("\n")
    if line.startswith("# HELP "):
        name = line.split()[2]
        if name in help_: bad.append(f"two HELP lines for {name}")
        help_[name] = 1
    elif line.startswith("# TYPE "):
        name, kind = line.split()[2:4]
        if name in type_: bad.append(f"two TYPE lines for {name}")
        type_[name] = kind
    elif line:
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$', line)
        if not m:
            bad.append(f"unparsable sample: {line}")
            continue
        name, labels, value = m.groups()
        fam = re.sub(r'_(bucket|sum|count)$', '', name) if re.sub(r'_(bucket|sum|count)$', '', name) in type_ else name
        if fam not in type_ or fam not in help_:
            bad.append(f"{name}: no HELP/TYPE before it")
        if name.endswith("_bucket"):
            key = (fam, re.sub(r',?le="[^"]*"', '', labels or ""))
            buckets.setdefault(key, []).append(float(value))
            if 'le="+Inf"' in labels: counts.setdefault(key, {})["inf"] = float(value)
        elif name.endswith("_count") and type_.get(fam) == "histogram":
            counts.setdefault((fam, labels or ""), {})["count"] = float(value)
for key, vals in buckets.items():
    if vals != sorted(vals): bad.append(f"{key[0]}: buckets not cumulative")
for key, c in counts.items():
    if "inf" in c and "count" in c and c["inf"] != c["count"]: bad.append(f"{key[0]}: +Inf {c['inf']} != count {c['count']}")
for b in bad: print("FAIL:", b)
sys.exit(1 if bad else 0)
PY

# A client that disconnects mid-stream: its request is aborted and its pages freed. The request asks for
# 16 completions of 3950 tokens (about 14 s on two cores; one completion alone took 1.35 s through
# the server, too close to the client's timeouts on a fast machine), so it outlasts the client.
LONGREQ='"prompt":"Once upon a time","max_tokens":3950,"ignore_eos":true,"n":16'
curl -sN --max-time 0.5 "${A[@]}" "$U/v1/completions" -d "{$LONGREQ,\"stream\":true}" >"$TMP/cut.txt" || true
grep -q '^data: {' "$TMP/cut.txt" || fail "no chunk before the disconnect"
grep -q 'DONE' "$TMP/cut.txt" && fail "the long stream finished before the client left (make it longer)"
ok=""
for _ in $(seq 1 100); do
  M=$(curl -s "$U/metrics")
  if echo "$M" | grep -q '^vllm:num_requests_running{[^}]*} 0$' &&
     echo "$M" | grep -q '^vllm:request_success_total{[^}]*finished_reason="abort"} [1-9]'; then ok=1; break; fi
  sleep 0.1
done
[ -n "$ok" ] || fail "disconnected request still running: $(echo "$M" | grep -E 'running|abort')"
echo "$M" | grep -q '^vllm:kv_cache_usage_perc{[^}]*} 0$' || true  # cached prefix pages may stay allocated

# A client that disconnects during a long non-streaming request: the server notices the closed
# connection while it waits for the result, and the request is aborted (abort count goes up).
aborts() { curl -s "$U/metrics" | sed -n 's/^vllm:request_success_total{[^}]*finished_reason="abort"} \([0-9]*\).*/\1/p' | head -1; }
A0=$(aborts)
curl -s --max-time 1.5 "${A[@]}" "$U/v1/completions" -d "{$LONGREQ}" >"$TMP/cut2.txt" || true
grep -q '"choices"' "$TMP/cut2.txt" && fail "the long non-streaming request finished before the client left"
ok=""
for _ in $(seq 1 100); do
  M=$(curl -s "$U/metrics")
  if echo "$M" | grep -q '^vllm:num_requests_running{[^}]*} 0$' && [ "$(aborts)" -gt "$A0" ]; then ok=1; break; fi
  sleep 0.1
done
[ -n "$ok" ] || fail "disconnected non-streaming request not aborted: $(echo "$M" | grep -E 'running|abort')"
# A long non-streaming request is answered with its length once the result is known (no chunked body:
# the status is the result's).
curl -s -D "$TMP/long.h" "${A[@]}" "$U/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":300,"ignore_eos":true}' \
  >"$TMP/long.json"
grep -q '"finish_reason":"length"' "$TMP/long.json" || fail "long non-streaming request: $(head -c 300 "$TMP/long.json")"
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$TMP/long.json" || fail "long non-streaming body is not JSON"
grep -qi '^content-length: [0-9]' "$TMP/long.h" || fail "long non-streaming answer without Content-Length: $(cat "$TMP/long.h")"

# SIGTERM: exits 0.
kill -TERM $PID
rc=0; wait $PID || rc=$?
trap - EXIT
[ "$rc" = 0 ] || fail "exit status $rc after SIGTERM"
echo "server.sh: all checks passed"
