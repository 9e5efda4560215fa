#!/usr/bin/env bash
# A stop string that only the reasoning parser's text holds ends the request in the engine (issue 39: one
# output processor, in the engine, making the text the request asked for): the shipped demo model behind
# `m3serve serve --reasoning-parser minimax_m3`, greedy, thinking enabled, end-of-sequence ignored, writes
# its reasoning, the </mm:think> marker (a special token), then its answer. With stop ["</mm:think>"],
# streamed and not: finish_reason "stop", stop_reason the marker, the same reasoning as the free run and no
# content, completion_tokens = the tokens up to and with the marker, and /metrics
# vllm:generation_tokens_total grows by that many, not by max_tokens (before, the text was cut in the
# server but the engine ran on to max_tokens: "length", and the extra tokens counted and computed).
# Usage: serve_stop_marker.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP"
fail() { echo "FAIL: $*" >&2; echo "--- server log:" >&2; tail -50 "$TMP/server.log" >&2 || true; exit 1; }
. "$(dirname "$0")/lib/server_port.sh"
command -v curl >/dev/null || fail "curl is needed"
MODEL="$DATA/../../models/demo"
[ -f "$MODEL/config.json" ] || fail "no demo model at $MODEL"

"$BIN" serve "$MODEL" --host 127.0.0.1 --port 0 --served-model-name demo --reasoning-parser minimax_m3 \
  --kv-cache-memory 0.25 >"$TMP/server.log" 2>&1 &
PID=$!
trap 'kill -9 $PID 2>/dev/null || true' EXIT
wait_server_health "$TMP/server.log" $PID

MAX=100
ask() {  # ask EXTRA_FIELDS: the chat completion's body (or SSE stream)
  curl -s --max-time 120 -H "Content-Type: application/json" "$U/v1/chat/completions" --data-binary \
    '{"messages":[{"role":"user","content":"What is 2+2?"}],"temperature":0,"max_tokens":'$MAX',"ignore_eos":true,
      "chat_template_kwargs":{"thinking_mode":"enabled"}'"$1"'}'
}
generated() { curl -s "$U/metrics" | sed -n 's/^vllm:generation_tokens_total{[^}]*} \([0-9]*\).*/\1/p'; }

ask ',"logprobs":true' >"$TMP/free.json"
ask ',"stop":["</mm:think>"]' >"$TMP/stop.json"
G0=$(generated)
ask ',"stop":["</mm:think>"]' >/dev/null
G1=$(generated)
ask ',"stop":["</mm:think>"],"stream":true,"stream_options":{"include_usage":true}' >"$TMP/stream.txt"
G2=$(generated)

python3 - "$TMP" "$MAX" "$((G1 - G0))" "$((G2 - G1))" <<'EOF' || fail "see above"
import json, sys
tmp, max_tokens, grew, grew_stream = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
free = json.load(open(tmp + "/free.json"))
tokens = [t["token"] for t in free["choices"][0]["logprobs"]["content"]]
assert "</mm:think>" in tokens, f"premise: the free run has no </mm:think> token: {tokens}"
upto = tokens.index("</mm:think>") + 1
assert upto < max_tokens, f"premise: the marker comes too late ({upto})"
reasoning = free["choices"][0]["message"]["reasoning"]
assert reasoning, f"premise: no reasoning in the free run: {free}"

def check(where, finish, stop_reason, got_reasoning, content, completion):
    assert finish == "stop", f"{where}: finish_reason {finish!r}, expected 'stop'"
    assert stop_reason == "</mm:think>", f"{where}: stop_reason {stop_reason!r}"
    assert got_reasoning == reasoning, f"{where}: reasoning {got_reasoning!r}, expected {reasoning!r}"
    assert not content, f"{where}: content {content!r} after the stop string"
    assert completion == upto, f"{where}: completion_tokens {completion}, expected {upto} (the tokens up to the marker)"

s = json.load(open(tmp + "/stop.json"))
c = s["choices"][0]
check("non-streamed", c["finish_reason"], c["stop_reason"], c["message"]["reasoning"], c["message"]["content"],
      s["usage"]["completion_tokens"])
assert grew == upto, f"generation_tokens_total grew by {grew}, expected {upto}"

finish = stop_reason = usage = None
got_reasoning = content = ""
for line in open(tmp + "/stream.txt"):
    if not line.startswith("data: {"):
        continue
    j = json.loads(line[6:])
    if j.get("usage"):
        usage = j["usage"]
    for ch in j["choices"]:
        got_reasoning += ch["delta"].get("reasoning") or ""
        content += ch["delta"].get("content") or ""
        if ch["finish_reason"]:
            finish, stop_reason = ch["finish_reason"], ch.get("stop_reason")
assert usage, "streamed: no usage chunk"
check("streamed", finish, stop_reason, got_reasoning, content, usage["completion_tokens"])
assert grew_stream == upto, f"streamed: generation_tokens_total grew by {grew_stream}, expected {upto}"
print(f"stop on </mm:think>: {upto} tokens of {max_tokens}, finish_reason stop, streamed and not")
EOF
