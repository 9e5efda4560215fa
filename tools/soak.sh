#!/usr/bin/env bash
# Soak test of `m3serve serve` (make soak; not part of make test): generates a tiny M3.1 model with
# the M3 chat template, serves it on a free port, and runs tools/soak_client.py: CLIENTS concurrent
# streaming clients for SECONDS, every streamed token checked against a non-concurrent greedy
# reference, errors counted, and the server's VmRSS printed before, during and after.
# Usage: tools/soak.sh [m3serve] ; env SOAK_CLIENTS (64), SOAK_SECONDS (60), SOAK_MAX_TOKENS (32)
set -euo pipefail
BIN=${1:-build/m3serve}
DIR=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$DIR/.." && pwd)
TMP=$(mktemp -d /tmp/m3soak.XXXXXX)
"$BIN" make-model --layout m31 --preset tiny --seed 5 --out "$TMP/model" 2>/dev/null
cp "$ROOT/tests/data/chat/MiniMax-M3.jinja" "$TMP/model/chat_template.jinja"
"$BIN" serve "$TMP/model" --host 127.0.0.1 --port 0 --max-num-seqs 64 >"$TMP/server.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; sleep 1; kill -9 $PID 2>/dev/null || true; rm -rf "$TMP"' EXIT
PORT=""
for _ in $(seq 1 600); do
  PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$TMP/server.log" | head -1)
  [ -n "$PORT" ] && break
  kill -0 $PID 2>/dev/null || { cat "$TMP/server.log"; echo "server exited"; exit 1; }
  sleep 0.1
done
[ -n "$PORT" ] || { echo "server did not start"; exit 1; }
echo "m3serve serve pid $PID on port $PORT"
python3 "$DIR/soak_client.py" --port "$PORT" --pid "$PID" --clients "${SOAK_CLIENTS:-64}" \
  --seconds "${SOAK_SECONDS:-60}" --max-tokens "${SOAK_MAX_TOKENS:-32}"
