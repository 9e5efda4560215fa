#!/usr/bin/env bash
# Prefill/decode disaggregation, measured on localhost: the time to first token of one aggregated engine
# against P/D's two legs (prefill engine, then UCX transfer + decode engine), and the transfer's
# throughput (the decode engine's m3serve:kv_transfer_{received_bytes,seconds}_total), one request at a
# time, aggregated and P/D alternated, fresh random prompts each (no prefix hit); tools/pd_measure.py.
# Usage: tools/pd_ttft.sh BIN MODEL "4096 16384" REPS [threads]
set -euo pipefail
BIN=$1
MODEL=$2
LENS=${3:-"4096 16384"}
REPS=${4:-3}
export OMP_NUM_THREADS=${5:-2}
export UCX_TLS=${UCX_TLS:-tcp}
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; tail -3 "$TMP"/*.log >&2; exit 1; }
. "$(dirname "$0")/../tests/cli/lib/server_port.sh"
start() {
  local name=$1
  shift
  "$BIN" serve "$MODEL" --host 127.0.0.1 --port 0 --mmap --kv-cache-memory 1 --max-model-len ${MAXLEN:-20000} \
    --max-num-batched-tokens 4096 "$@" >"$TMP/$name.log" 2>&1 &
  PIDS+=($!)
  wait_server_health "$TMP/$name.log" $!
  eval "URL_$name=$U"
}
start A
start P --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_port":0}'
start D --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'
VOCAB=$(python3 -c "import json; c=json.load(open('$MODEL/config.json')); print(c.get('text_config', c)['vocab_size'])")
python3 "$(dirname "$0")/pd_measure.py" "$URL_A" "$URL_P" "$URL_D" "$LENS" "$REPS" "$VOCAB"
