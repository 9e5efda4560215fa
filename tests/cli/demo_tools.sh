#!/usr/bin/env bash
# The shipped demo model (models/demo) calls tools through the real server: starts `m3serve serve` with the
# minimax_m3 reasoning and tool-call parsers, sends the held-out synthetic tool tasks of
# tests/data/demo/tool_tasks.jsonl (one /v1/chat/completions request a line: the task's messages, the OpenAI
# `tools` array, thinking_mode in chat_template_kwargs, temperature 0; written by
# tools/train/eval_server.py --write-test, arguments never seen in training) and asserts that at least 80%
# of the responses carry non-empty message.tool_calls (issue 5's bar), that at least 40% call the expected
# tools (tool_tasks_expected.txt: the names, in order; a guard against a model that ignores the question: the
# shipped model gets 15 of these 30, and its arguments are not yet right, see tools/train/README.md), and that
# every thinking-enabled response that calls a tool has its reasoning in message.reasoning_content with no
# markup left in content; and that thinking_token_budget / the Messages API's thinking.budget_tokens close the
# reasoning after that many tokens. Greedy, so deterministic. Usage: demo_tools.sh <m3serve> <tests/data> <tmpdir>
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
TASKS="$DATA/demo/tool_tasks.jsonl"
EXPECTED="$DATA/demo/tool_tasks_expected.txt"
[ -f "$MODEL/config.json" ] || fail "no demo model at $MODEL"

"$BIN" serve "$MODEL" --host 127.0.0.1 --port 0 --served-model-name demo \
  --reasoning-parser minimax_m3 --tool-call-parser minimax_m3 --enable-auto-tool-choice \
  --kv-cache-memory 0.25 >"$TMP/server.log" 2>&1 &
PID=$!
trap 'kill -9 $PID 2>/dev/null || true' EXIT
wait_server_health "$TMP/server.log" $PID

n=0; wf=0; named=0; think_calls=0; think_ok=0
exec 3<"$EXPECTED"
while IFS= read -r REQ; do
  IFS= read -r WANT <&3 || fail "tool_tasks_expected.txt is shorter than tool_tasks.jsonl"
  n=$((n + 1))
  BODY=$(curl -s --max-time 120 -H "Content-Type: application/json" "$U/v1/chat/completions" --data-binary "$REQ") \
    || fail "request $n failed"
  echo "$BODY" >>"$TMP/responses.jsonl"
  echo "$BODY" | grep -q '"choices":\[{' || fail "request $n: no choices: $BODY"
  if echo "$BODY" | grep -q '"tool_calls":\[{"id":"[^"]*","type":"function","function":{"name":"'; then
    wf=$((wf + 1))
    GOT=$(echo "$BODY" | grep -o '"function":{"name":"[A-Za-z_]*"' | sed 's/.*"name":"\(.*\)"/\1/' | tr '\n' ' ' | sed 's/ $//')
    [ "$GOT" = "$WANT" ] && named=$((named + 1))
    if echo "$REQ" | grep -q '"thinking_mode": *"enabled"'; then
      think_calls=$((think_calls + 1))
      if echo "$BODY" | grep -q '"reasoning_content":"[^"]' && ! echo "$BODY" | grep -q '"content":"[^"]*mm:think'; then
        think_ok=$((think_ok + 1))
      fi
    fi
  fi
done <"$TASKS"
echo "demo tool tasks: $n, well-formed tool_calls $wf, expected tools $named, thinking-enabled calls $think_calls (reasoning in reasoning_content: $think_ok)"
[ "$n" -ge 10 ] || fail "too few tasks ($n)"
[ $((wf * 100)) -ge $((n * 80)) ] || fail "well-formed tool_calls on $wf of $n tasks (< 80%)"
[ $((named * 100)) -ge $((n * 40)) ] || fail "expected tools called on $named of $n tasks (< 40%)"
[ "$think_calls" -gt 0 ] || fail "no thinking-enabled task called a tool"
[ "$think_ok" = "$think_calls" ] || fail "reasoning not in reasoning_content on $((think_calls - think_ok)) of $think_calls thinking-enabled calls"

# thinking_token_budget (and the Messages API's thinking.budget_tokens): the reasoning stops after at most
# that many tokens, the end tag forced, and the answer follows; the same request without the budget thinks longer.
python3 - "$U" <<'PY' || fail "thinking_token_budget"
import json, sys, urllib.request
base = sys.argv[1]
def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())
def ntok(text):
    return post("/tokenize", {"prompt": text or ""})["count"]
chat = {"model": "demo", "messages": [{"role": "user", "content": "What is the weather in Paris tomorrow?"}],
        "chat_template_kwargs": {"thinking_mode": "enabled"}, "temperature": 0, "max_tokens": 60, "logprobs": True}
free = post("/v1/chat/completions", chat)["choices"][0]
free_tokens = [t["token"] for t in free["logprobs"]["content"]]
assert "</mm:think>" not in free_tokens[:4], free_tokens  # the model thinks longer than the budget below
for budget in (0, 3):
    c = post("/v1/chat/completions", {**chat, "thinking_token_budget": budget})["choices"][0]
    toks = [t["token"] for t in c["logprobs"]["content"]]
    assert toks[budget] == "</mm:think>", (budget, toks)  # forced right after the budget
    assert toks[:budget] == free_tokens[:budget], (toks, free_tokens)  # the same reasoning until then
    assert ntok(c["message"]["reasoning"]) <= budget and c["message"]["content"], c["message"]
m = post("/v1/messages", {"model": "demo", "max_tokens": 40, "temperature": 0,
                          "thinking": {"type": "enabled", "budget_tokens": 2},
                          "messages": [{"role": "user", "content": "What is the weather in Paris tomorrow?"}]})
thinking = [b["thinking"] for b in m["content"] if b["type"] == "thinking"]
assert sum(ntok(t) for t in thinking) <= 2 and any(b["type"] != "thinking" for b in m["content"]), m
print("thinking budget: forced at 0 and 3 tokens; unbounded reasoning ran", free_tokens.index("</mm:think>") if "</mm:think>" in free_tokens else "past 60", "tokens")
PY

kill -TERM $PID
wait $PID || fail "server did not exit cleanly"
trap - EXIT
echo "ok"
