#!/usr/bin/env bash
# Prefill/decode disaggregation under a mixed load, on one host: inter-token latency of streams that
# decode while long prompts arrive, with one aggregated engine (A) against P/D (prefill engine P, decode
# engine D, `m3serve proxy` in front). Each engine gets one pinned core (taskset) and one thread, so the
# decode side has the same CPU in both runs: in A the long prefills share its core with the decodes, in
# P/D they run on P's core and D only imports their pages. Two `bench serve` at once: decodes
# (DEC_IN-token prompts, DEC_OUT tokens, DEC_CONC at a time) and long prompts (LONG_IN tokens, 1 token,
# one at a time); prints the decodes' TTFT and ITL (p50, p99) for A then P/D, REPS times alternated.
# Usage: tools/pd_itl.sh BIN MODEL [REPS] (env: LONG_IN=3000 DEC_IN=64 DEC_OUT=200 DEC_CONC=4 LONG_N=6
# CORE_P=0 CORE_D=1)
set -euo pipefail
BIN=$1
MODEL=$2
REPS=${3:-2}
LONG_IN=${LONG_IN:-3000} DEC_IN=${DEC_IN:-64} DEC_OUT=${DEC_OUT:-200} DEC_CONC=${DEC_CONC:-4} LONG_N=${LONG_N:-6}
CORE_P=${CORE_P:-0} CORE_D=${CORE_D:-1}
export OMP_NUM_THREADS=1 UCX_TLS=${UCX_TLS:-tcp}
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; tail -3 "$TMP"/*.log >&2; exit 1; }
. "$(dirname "$0")/../tests/cli/lib/server_port.sh"
start() {
  local name=$1 core=$2
  shift 2
  taskset -c "$core" "$BIN" serve "$MODEL" --host 127.0.0.1 --port 0 --kv-cache-memory 0.2 "$@" >"$TMP/$name.log" 2>&1 &
  PIDS+=($!)
  wait_server_health "$TMP/$name.log" $!
  eval "URL_$name=$U"
}
start A "$CORE_D"
start P "$CORE_P" --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_port":0}'
start D "$CORE_D" --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'
"$BIN" proxy --prefill "$URL_P" --decode "$URL_D" --port 0 >"$TMP/proxy.log" 2>&1 &
PIDS+=($!)
wait_server_health "$TMP/proxy.log" $!
URL_X=$U
run() {
  local url=$1 seed=$2
  "$BIN" bench serve --base-url "$url" --tokenizer "$MODEL" --dataset-name random --random-input-len "$LONG_IN" \
    --random-output-len 1 --num-prompts "$LONG_N" --max-concurrency 1 --seed $((seed + 1000)) >"$TMP/long.txt" 2>&1 &
  local long=$!
  "$BIN" bench serve --base-url "$url" --tokenizer "$MODEL" --dataset-name random --random-input-len "$DEC_IN" \
    --random-output-len "$DEC_OUT" --num-prompts $((2 * DEC_CONC)) --max-concurrency "$DEC_CONC" --ignore-eos \
    --seed "$seed" --percentile-metrics ttft,itl --metric-percentiles 50,99 >"$TMP/dec.txt" 2>&1
  wait $long || fail "long prompts: $(tail -3 "$TMP/long.txt")"
  sed -n 's/^\(P50\|P99\) \(TTFT\|ITL\) (ms): *\(.*\)/\1 \2 \3/p' "$TMP/dec.txt" | tr '\n' ' '
}
for r in $(seq 1 "$REPS"); do
  echo "aggregated: $(run "$URL_A" $((r * 10)))"
  echo "P/D:        $(run "$URL_X" $((r * 10 + 5)))"
done
