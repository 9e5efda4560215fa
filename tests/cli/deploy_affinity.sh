#!/usr/bin/env bash
# Several m3serve instances behind nginx (deploy/run-local.sh with deploy/nginx/m3serve.conf), and
# behind HAProxy (deploy/haproxy/m3serve.cfg, active /health checks), on localhost: a multi-turn agentic workload (tests/tools/agentic_sessions.py, greedy, one
# X-Dynamo-Session-ID per conversation) through 2 instances with session affinity, through 2 with
# plain round robin, and straight to 1 instance. With affinity every session stays on one instance and
# the prefix-cache hits equal the single instance's; round robin gets visibly fewer; the replies are the
# same in all; sessionless requests reach both instances; a stream through the proxy equals the
# non-streamed reply; after one instance is killed every session is still answered. HAProxy with
# affinity must do the same as nginx.
# Usage: deploy_affinity.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$TMP"
mkdir -p "$TMP"
fail() { echo "FAIL: $*" >&2; for f in "$TMP"/*/instance*.log "$TMP"/*/nginx/error.log "$TMP"/*/haproxy/error.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -5 "$f" >&2; }; done; exit 1; }
for p in nginx haproxy; do
  [ -x /usr/sbin/$p ] || command -v $p >/dev/null || fail "$p is needed (make deps installs it)"
done

"$BIN" make-model --layout m31 --preset tiny --seed 3 --out "$TMP/model" 2>/dev/null
cp "$DATA/chat/MiniMax-M3.jinja" "$TMP/model/chat_template.jinja"

# Three consecutive free ports (nginx, instance 1, instance 2).
free_base() {
  python3 - <<'PY'
import random, socket
for _ in range(200):
    base = random.randrange(20000, 60000)
    socks = []
    try:
        for p in range(base, base + 3):
            s = socket.socket()
            s.bind(("127.0.0.1", p))
            socks.append(s)
        print(base)
        break
    except OSError:
        pass
    finally:
        for s in socks:
            s.close()
PY
}

RUN_PID=""
cleanup() { [ -n "$RUN_PID" ] && { kill -TERM "$RUN_PID" 2>/dev/null || true; wait "$RUN_PID" 2>/dev/null || true; }; RUN_PID=""; }
trap cleanup EXIT

# run NAME N AFFINITY [--kill]: starts the deployment, runs the workload, stops it; result in $TMP/NAME.json
# (PROXY in the environment picks the proxy)
run() {
  local name=$1 n=$2 aff=$3 kill=${4:-} base urls=() i
  base=$(free_base)
  mkdir -p "$TMP/$name"
  WORKDIR=$TMP/$name AFFINITY=$aff PROXY=${PROXY:-nginx} M3SERVE=$BIN "$ROOT/deploy/run-local.sh" "$TMP/model" "$n" "$base" -- \
    --kv-cache-memory 0.05 --max-model-len 8192 >"$TMP/$name/run.out" 2>"$TMP/$name/run.err" &
  RUN_PID=$!
  for t in $(seq 1 900); do
    grep -q '^ready:' "$TMP/$name/run.out" && break
    kill -0 $RUN_PID 2>/dev/null || fail "$name: run-local.sh exited: $(cat "$TMP/$name/run.err")"
    [ "$t" = 900 ] && fail "$name: not ready"
    sleep 0.1
  done
  for i in $(seq 1 "$n"); do urls+=("http://127.0.0.1:$((base + i))"); done
  local args=()
  if [ -n "$kill" ]; then
    args=(--kill-pid "$(pgrep -f -- "--port $((base + 1)) " | head -1)")
  fi
  python3 "$ROOT/tests/tools/agentic_sessions.py" "http://127.0.0.1:$base" "${urls[@]}" "${args[@]}" \
    >"$TMP/$name.json" || fail "$name: workload failed"
  if [ "$name" = roundrobin ]; then
    # bench serve through the balancer: its /metrics reads may reach different instances, which it must
    # notice (m3serve:instance_info) rather than report a hit rate from two instances' counters.
    "$BIN" bench serve --base-url "http://127.0.0.1:$base" --dataset-name agentic --num-sessions 2 --turns 2 \
      --random-input-len 64 --tool-result-len 16 --random-output-len 4 --no-progress >"$TMP/$name/bench.out" 2>&1 ||
      fail "$name: bench serve: $(tail -3 "$TMP/$name/bench.out")"
    if ! grep -q "came from different server instances" "$TMP/$name/bench.out"; then
      rate=$(sed -n 's/^Prefix cache hit rate: *\([0-9.]*\)%.*/\1/p' "$TMP/$name/bench.out")
      [ -n "$rate" ] && python3 -c "import sys; sys.exit(0 if float('$rate') <= 100 else 1)" ||
        fail "$name: bench serve hit rate '$rate' through the balancer: $(grep -i prefix "$TMP/$name/bench.out")"
    fi
  fi
  cleanup
}

run single 1 1
run affinity 2 1 --kill
run roundrobin 2 0
PROXY=haproxy run haproxy 2 1 --kill

python3 - "$TMP" <<'PY' || fail "checks"
import json, sys
tmp = sys.argv[1]
r = {n: json.load(open(f"{tmp}/{n}.json")) for n in ("single", "affinity", "roundrobin", "haproxy")}
bad = []
for n in ("affinity", "roundrobin", "haproxy"):
    if r[n]["replies"] != r["single"]["replies"]:
        bad.append(f"{n}: replies differ from one instance's")
    if not r[n]["stream_equal"]:
        bad.append(f"{n}: the stream through nginx differs from the plain reply")
for n in ("affinity", "haproxy"):
    for s, ups in r[n]["upstreams"].items():
        if len(set(ups)) != 1:
            bad.append(f"{n}: session {s} moved between {sorted(set(ups))}")
    if len(set(r[n]["sessionless"])) != 2:
        bad.append(f"{n}: sessionless requests not spread: {r[n]['sessionless']}")
    if r[n]["errors"] or len(r[n].get("after_kill", {})) != 5:
        bad.append(f"{n}: after killing an instance: {r[n]['errors']}")
# Which instance a session hashes to depends on the ports taken; how the 5 spread is only reported.
print("affinity: sessions per instance:", {u: [s for s, v in r["affinity"]["upstreams"].items() if v[0] == u]
                                          for u in sorted({v[0] for v in r["affinity"]["upstreams"].values()})})
hits = {n: sum(r[n]["hits"]) for n in r}
queries = {n: sum(r[n]["queries"]) for n in r}
rate = {n: hits[n] / queries[n] for n in r}
print("prefix-cache hits / queries:", {n: f"{hits[n]:.0f}/{queries[n]:.0f} ({rate[n]:.2f})" for n in r})
# Sessions share no prefix, so affinity loses nothing against one instance (the sessionless requests
# share nothing either, and the streamed one repeats session 0 on its instance).
for n in ("affinity", "haproxy"):
    if hits[n] != hits["single"]:
        bad.append(f"{n} hits {hits[n]} != one instance's {hits['single']}")
if not hits["roundrobin"] < 0.8 * hits["affinity"]:
    bad.append(f"round robin hits {hits['roundrobin']} not visibly below affinity's {hits['affinity']}")
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
echo "deploy_affinity: affinity keeps one instance's prefix-cache hits through nginx and HAProxy"
