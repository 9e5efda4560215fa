#!/usr/bin/env bash
# CORS against the real server, as a browser meets it: preflights (OPTIONS with Origin and
# Access-Control-Request-Method) answered before the API key, with vLLM's defaults (any origin, method
# and header) and with explicit --allowed-origins / --allowed-methods / --allowed-headers /
# --allow-credentials (disallowed origin, method and header refused with 400 and the reason); simple,
# error (401) and streamed responses carrying Access-Control-Allow-Origin; none without an Origin.
# Usage: server_cors.sh <m3serve> <tests/data> <tmpdir>
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
start() {  # start <extra serve flags...>
  "$BIN" serve "$TMP/model" --host 127.0.0.1 --port 0 --served-model-name tiny --max-model-len 512 \
    --kv-cache-memory 0.05 "$@" >"$TMP/server.log" 2>&1 &
  PID=$!
  wait_server_port "$TMP/server.log" $PID
}
trap 'kill -9 ${PID:-0} 2>/dev/null || true' EXIT
# headers <name> <curl args...>: the response head (status line + headers, CR stripped) into $TMP/<name>.
headers() {
  local name=$1
  shift
  curl -s -o "$TMP/$name.body" -D "$TMP/$name" "$@" || fail "curl $*"
  tr -d '\r' <"$TMP/$name" >"$TMP/$name.tmp" && mv "$TMP/$name.tmp" "$TMP/$name"
}
has() { grep -qi "^$2" "$TMP/$1" || fail "$1 lacks '$2': $(cat "$TMP/$1")"; }
lacks() { grep -qi "^$2" "$TMP/$1" && fail "$1 has '$2': $(cat "$TMP/$1")" || true; }
URL() { echo "http://127.0.0.1:$PORT$1"; }

# 1. vLLM's defaults: any origin, method, header.
start
headers pre -X OPTIONS "$(URL /v1/chat/completions)" -H 'Origin: http://page.example' \
  -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: content-type, authorization'
has pre 'HTTP/1.1 200'
has pre 'Access-Control-Allow-Origin: \*'
has pre 'Access-Control-Allow-Methods: .*POST'
has pre 'Access-Control-Allow-Headers: content-type, authorization'
has pre 'Access-Control-Max-Age: 600'
headers models "$(URL /v1/models)" -H 'Origin: http://page.example'
has models 'HTTP/1.1 200'
has models 'Access-Control-Allow-Origin: \*'
headers plain "$(URL /v1/models)"
lacks plain 'Access-Control-Allow-Origin'
headers stream "$(URL /v1/completions)" -H 'Origin: http://page.example' -H 'Content-Type: application/json' \
  -d '{"model":"tiny","prompt":"hi","max_tokens":3,"stream":true}'
has stream 'HTTP/1.1 200'
has stream 'Access-Control-Allow-Origin: \*'
grep -q '\[DONE\]' "$TMP/stream.body" || fail "stream not completed: $(cat "$TMP/stream.body")"
kill -9 $PID

# 2. Explicit lists, credentials, an API key.
start --api-key sekret --allowed-origins '["https://app.example"]' --allowed-methods POST,GET \
  --allowed-headers content-type --allowed-headers authorization --allow-credentials
pre() {  # pre <name> <origin> <method> <headers>
  headers "$1" -X OPTIONS "$(URL /v1/chat/completions)" -H "Origin: $2" -H "Access-Control-Request-Method: $3" \
    -H "Access-Control-Request-Headers: $4"
}
pre ok https://app.example POST 'Content-Type, Authorization'
has ok 'HTTP/1.1 200'
has ok 'Access-Control-Allow-Origin: https://app.example'
has ok 'Vary: Origin'
has ok 'Access-Control-Allow-Credentials: true'
has ok 'Access-Control-Allow-Methods: POST, GET'
pre evil https://evil.example POST content-type
has evil 'HTTP/1.1 400'
lacks evil 'Access-Control-Allow-Origin'
grep -q 'Disallowed CORS origin' "$TMP/evil.body" || fail "no reason: $(cat "$TMP/evil.body")"
pre method https://app.example DELETE content-type
has method 'HTTP/1.1 400'
grep -q 'Disallowed CORS method' "$TMP/method.body" || fail "no method reason: $(cat "$TMP/method.body")"
pre hdr https://app.example POST 'content-type, x-secret'
has hdr 'HTTP/1.1 400'
grep -q 'Disallowed CORS headers' "$TMP/hdr.body" || fail "no headers reason: $(cat "$TMP/hdr.body")"
headers unauth "$(URL /v1/models)" -H 'Origin: https://app.example'
has unauth 'HTTP/1.1 401'
has unauth 'Access-Control-Allow-Origin: https://app.example'
headers authed "$(URL /v1/models)" -H 'Origin: https://app.example' -H 'Authorization: Bearer sekret'
has authed 'HTTP/1.1 200'
has authed 'Access-Control-Allow-Origin: https://app.example'
headers other "$(URL /v1/models)" -H 'Origin: https://evil.example' -H 'Authorization: Bearer sekret'
has other 'HTTP/1.1 200'
lacks other 'Access-Control-Allow-Origin'
kill -9 $PID

# 3. A malformed list is refused at start, naming the flag.
if "$BIN" serve "$TMP/model" --port 0 --allowed-origins '["a", 3]' >"$TMP/bad.log" 2>&1; then fail "bad list accepted"; fi
grep -q -- '--allowed-origins' "$TMP/bad.log" || fail "error does not name the flag: $(cat "$TMP/bad.log")"
echo "server_cors: OK"
