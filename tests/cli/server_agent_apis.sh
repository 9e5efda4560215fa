#!/usr/bin/env bash
# /v1/responses and /v1/messages with the official SDKs (openai and @anthropic-ai/sdk from npm, pinned in
# tests/tools/sdk/package.json, installed under the build dir by `make sdk-clients`, which `make test` runs)
# against the real server: the demo model with the minimax_m3 reasoning and tool-call parsers, greedy, an
# API key (the OpenAI SDK sends it as Authorization: Bearer, Anthropic's as x-api-key). The checks are in
# tests/tools/sdk/agent_apis.cjs: Responses (streamed and not, a function_call / function_call_output round
# trip, reasoning items, usage, refused fields) and Messages (streamed and not, a tool_use / tool_result
# round trip, thinking blocks, stop reasons, count_tokens, Anthropic's error shape).
# Usage: server_agent_apis.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP"
fail() { echo "FAIL: $*" >&2; echo "--- server log:" >&2; tail -50 "$TMP/server.log" >&2 || true; exit 1; }
. "$(dirname "$0")/lib/server_port.sh"
MODULES="$(dirname "$BIN")/sdk-clients/node_modules"
command -v node >/dev/null || fail "node is needed (make deps installs nodejs)"
[ -d "$MODULES/openai" ] && [ -d "$MODULES/@anthropic-ai/sdk" ] ||
  fail "the SDKs are not installed in $MODULES: run 'make sdk-clients' (npm install from registry.npmjs.org; if the registry is unreachable this test cannot run)"
MODEL="$DATA/../../models/demo"
[ -f "$MODEL/config.json" ] || fail "no demo model at $MODEL"

"$BIN" serve "$MODEL" --host 127.0.0.1 --port 0 --served-model-name demo \
  --reasoning-parser minimax_m3 --tool-call-parser minimax_m3 --enable-auto-tool-choice \
  --kv-cache-memory 0.25 --api-key test-key >"$TMP/server.log" 2>&1 &
PID=$!
trap 'kill -9 $PID 2>/dev/null || true' EXIT
wait_server_health "$TMP/server.log" $PID  # (/health needs no key)

node "$(dirname "$0")/../tools/sdk/agent_apis.cjs" "$U" test-key "$MODULES" || fail "SDK checks failed"

kill -TERM $PID
wait $PID || fail "server did not exit cleanly"
trap - EXIT
echo "ok"
