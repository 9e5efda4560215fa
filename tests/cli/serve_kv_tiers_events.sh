#!/usr/bin/env bash
# serve with a local KV tier and KV events at once, over HTTP: a conversation's 256-token prefix is
# evicted from a 4-page pool by other traffic, offloaded to the tier, and its next turn reports it as
# cached (loaded from the tier) with the same greedy output as a server without a tier; /metrics shows
# the tier's and the events publisher's counters.
# Usage: serve_kv_tiers_events.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP"
fail() { echo "FAIL: $*" >&2; echo "--- server log:" >&2; cat "$TMP/server.log" >&2 || true; exit 1; }
. "$(dirname "$0")/lib/server_port.sh"
"$BIN" make-model --layout m31 --preset tiny --seed 3 --out "$TMP/model" 2>/dev/null

PID=""
trap '[ -n "$PID" ] && kill -9 $PID 2>/dev/null || true' EXIT
# turns URL: prints the second turn's cached tokens and token ids
turns() {
  python3 - "$1" <<'PY'
import json, random, sys, urllib.request
url = sys.argv[1]
rng = random.Random(5)
prefix = [rng.randrange(1, 400) for _ in range(256)]
def ask(ids):
    body = {"prompt": ids, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "logprobs": 0}
    r = urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                                      {"Content-Type": "application/json"}), timeout=60)
    j = json.loads(r.read())
    return j["usage"]["prompt_tokens_details"]["cached_tokens"], j["choices"][0]["logprobs"]["tokens"]
ask(prefix + [7, 8, 9])
for i in range(2):
    ask([rng.randrange(1, 400) for _ in range(400)])
cached, toks = ask(prefix + [11, 12, 13, 14])
print(json.dumps({"cached": cached, "tokens": toks}))
PY
}

start() {
  "$BIN" serve "$TMP/model" --host 127.0.0.1 --port 0 --kv-cache-memory 0.00062 "$@" >"$TMP/server.log" 2>&1 &
  PID=$!
  wait_server_health "$TMP/server.log" $PID
}
stop() { kill -TERM $PID; wait $PID || fail "server exit status $?"; PID=""; }

start
grep -q '4 pages x 128 tokens' "$TMP/server.log" || fail "expected a 4-page pool: $(grep 'KV cache' "$TMP/server.log")"
REF=$(turns "$U")
stop

start --kv-offloading-size 0.01 \
  --kv-events-config '{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:*", "topic": "kv"}'
grep -q 'KV tier memory 0.01 GiB' "$TMP/server.log" || fail "tier not described at start"
GOT=$(turns "$U")
curl -s "$U/metrics" >"$TMP/metrics.txt"
stop
python3 - "$REF" "$GOT" "$TMP/metrics.txt" <<'PY' || fail "checks"
import json, re, sys
ref, got, metrics = json.loads(sys.argv[1]), json.loads(sys.argv[2]), open(sys.argv[3]).read()
bad = []
if ref["cached"] != 0:
    bad.append(f"without a tier the prefix should be recomputed, cached {ref['cached']}")
if got["cached"] < 256:
    bad.append(f"with the tier, cached {got['cached']} < 256")
if got["tokens"] != ref["tokens"]:
    bad.append(f"outputs differ: {got['tokens']} vs {ref['tokens']}")
def value(name):
    m = re.search(r"^" + re.escape(name) + r"(\{[^}]*\})? (\S+)$", metrics, re.M)
    return float(m.group(2)) if m else None
for name in ("m3serve:kv_tier_loaded_pages_total", "m3serve:kv_tier_offloaded_pages_total",
             "m3serve:kv_events_published_total", "m3serve:kv_events_total"):
    v = value(name)
    if not v or v <= 0:
        bad.append(f"{name} = {v}")
if value("m3serve:kv_events_dropped_total") != 0:
    bad.append("events dropped")
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
echo "serve_kv_tiers_events: the evicted prefix came back from the tier, same output, counters in /metrics"
