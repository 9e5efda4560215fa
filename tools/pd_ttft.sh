#!/usr/bin/env bash
# Prefill/decode disaggregation, measured on localhost: the added time to first token of the P/D path
# (prefill engine + UCX transfer + decode engine, through `m3serve proxy`) against one aggregated engine,
# and the transfer's throughput (the decode engine's m3serve:kv_transfer_{received_bytes,seconds}_total),
# one request at a time, A (aggregated) and B (P/D) alternated, fresh random prompts each (no prefix hit).
# Usage: tools/pd_ttft.sh BIN MODEL "4096 16384" REPS [threads]
# Prints one line per run: length, path, TTFT ms, and for P/D the bytes and GB/s of that run's transfer.
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
"$BIN" proxy --prefill "$URL_P" --decode "$URL_D" --port 0 >"$TMP/proxy.log" 2>&1 &
PIDS+=($!)
wait_server_health "$TMP/proxy.log" $!
URL_X=$U
metric() { curl -s "$URL_D/metrics" | sed -n "s/^$1 //p"; }
seed=1
for len in $LENS; do
  for rep in $(seq 1 "$REPS"); do
    for path in A X; do
      url=URL_$path
      b0=$(metric m3serve:kv_transfer_received_bytes_total); s0=$(metric m3serve:kv_transfer_seconds_total)
      out=$("$BIN" bench serve --base-url "${!url}" --tokenizer "$MODEL" --dataset-name random \
        --random-input-len "$len" --random-output-len 2 --ignore-eos --num-prompts 1 --max-concurrency 1 \
        --seed $((seed++)) 2>&1)
      ttft=$(echo "$out" | sed -n 's/^Mean TTFT (ms): *//p')
      [ -n "$ttft" ] || fail "no TTFT: $out"
      if [ "$path" = X ]; then
        b1=$(metric m3serve:kv_transfer_received_bytes_total); s1=$(metric m3serve:kv_transfer_seconds_total)
        python3 -c "b=$b1-$b0; s=$s1-$s0; print(f'$len P/D        TTFT {float(\"$ttft\"):9.1f} ms  transfer {b/1e6:8.1f} MB in {s*1e3:7.1f} ms = {b/s/1e9:5.2f} GB/s')"
      else
        printf '%s aggregated TTFT %9.1f ms\n' "$len" "$ttft"
      fi
    done
  done
done
