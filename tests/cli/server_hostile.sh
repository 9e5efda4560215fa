#!/usr/bin/env bash
# Hostile and careless clients against `m3serve serve` (issue 47): deep JSON on every JSON endpoint,
# the API key on /tokenize and /detokenize, a gzip bomb, chunked over-size bodies, ambiguous framing
# (conflicting Content-Length, Content-Length with chunked), pipelining, header / body / keep-alive
# timeouts, slowloris (200 trickling connections while a normal client is served), the connection cap,
# backpressure (503 + Retry-After past --max-waiting-requests, /health under load), per-request limits,
# the SIGTERM drain (every stream ends with finish_reason abort and [DONE]), a second signal, and a busy
# port. The cases are in lib/hostile.py (python3, standard library, raw sockets on 127.0.0.1).
# Usage: server_hostile.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP"
command -v python3 >/dev/null || { echo "FAIL: python3 is needed" >&2; exit 1; }
"$BIN" make-model --layout m31 --preset tiny --seed 3 --out "$TMP/model" 2>/dev/null
cp "$DATA/chat/MiniMax-M3.jinja" "$TMP/model/chat_template.jinja"
exec python3 "$(dirname "$0")/lib/hostile.py" "$BIN" "$TMP/model" "$TMP"
