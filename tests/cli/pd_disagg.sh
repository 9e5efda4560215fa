#!/usr/bin/env bash
# Prefill/decode disaggregation, 1P1D on localhost over UCX (TCP): a prefill engine (NixlConnector
# kv_producer), decode engines (kv_consumer; policies recompute and fail), `m3serve proxy` in front, and
# one aggregated engine as the reference, all serving the demo model.
# (1) Through the proxy, greedy answers equal the aggregated engine's for chat and completions, streamed
#     and not, with the same usage; the decode engine computes one prompt token per request (the last,
#     for its logits), from its /metrics; the prefill engine's leases are read and its pages returned.
#     A streamed prefill leg (chat, completions) carries kv_transfer_params on its last chunk.
# (2) Forged remote_block_ids, forged or foreign remote_request_id and a stale lease: 400, never served.
# (3) A lease not read within kv_lease_duration expires: its pages return (metrics), a later read is 400.
# (4) The prefill engine dying mid-transfer (M3_KV_TRANSFER_FAULT: it exits after sending one page of
#     two), or killed before the read: the decode leg recomputes (policy recompute, same text) or fails
#     cleanly with 500 naming the policy (policy fail), leaking no page either way.
# (5) Errors from either side reach the proxy's client: the prefill engine's 400 (n = 2) as it gave it;
#     an engine that cannot be reached as a 502 naming it.
# (6) At start: kv_buffer_device "cuda" (the recipe's GPU deployments) listed as not applicable, any
#     other device refused by name; per request: do_remote_decode on a server without a producer role.
# Usage: pd_disagg.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
TMP=$3
MODEL=$(cd "$(dirname "$0")/../.." && pwd)/models/demo
PY="python3 $(dirname "$0")/lib/pd_client.py"
rm -rf "$TMP"
mkdir -p "$TMP"
. "$(dirname "$0")/lib/pd_servers.sh"
# dead PID: the process has exited (gone, or a zombie not yet waited for); bounded poll.
wait_dead() {
  for _ in $(seq 1 100); do
    local st
    st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)
    [ -z "$st" ] || [ "$st" = Z ] && return 0
    sleep 0.1
  done
  return 1
}
start ref
start P --kv-transfer-config "$(nixl kv_producer)"
start D --kv-transfer-config "$(nixl kv_consumer)"
start DF --kv-transfer-config "$(nixl kv_consumer ', "kv_load_failure_policy": "fail"')"
start P2 --kv-transfer-config "$(nixl kv_producer ', "kv_connector_extra_config": {"kv_lease_duration": 1}')"
start P3 --kv-transfer-config "$(nixl kv_producer)"
start PC --kv-transfer-config "$(nixl kv_producer ', "kv_buffer_device": "cuda"')"
M3_KV_TRANSFER_FAULT=die-after-pages:1 start P4 --kv-transfer-config "$(nixl kv_producer)"
M3_KV_TRANSFER_FAULT=die-after-pages:1 start P5 --kv-transfer-config "$(nixl kv_producer)"
grep -q "KV transfer listening on 127.0.0.1:[0-9]* (4 serving threads), leases of 480 s" "$TMP/P.log" || fail "the listener is not said at start"
"$BIN" proxy --prefill "$URL_P" --decode "$URL_D" --port 0 >"$TMP/proxy.log" 2>&1 &
PIDS+=($!)
wait_server_health "$TMP/proxy.log" $!
URL_X=$U

# (1)
$PY compare "$URL_ref" "$URL_X" "$URL_D" || fail "proxy answers differ from the aggregated engine"
[ "$($PY metric "$URL_P" m3serve:kv_leases_read_total)" = 12 ] || fail "the prefill engine's leases were not all read"
[ "$($PY metric "$URL_P" m3serve:kv_leased_pages)" = 0 ] || fail "read leases still hold pages"
total=$($PY metric "$URL_P" m3serve:kv_free_pages)
[ "$($PY metric "$URL_D" m3serve:kv_remote_load_failures_total)" = 0 ] || fail "pulled pages failed verification"

$PY streamed_legs "$URL_ref" "$URL_P" "$URL_D" || fail "streamed prefill legs"

# (2)
$PY forged "$URL_ref" "$URL_P" "$URL_D" || fail "forged reads"
[ "$($PY metric "$URL_P" m3serve:kv_lease_reads_refused_total)" -ge 5 ] || fail "refusals not counted"

# (3) The lease expires on the prefill engine's own timer (no request drives it): bounded wait for it.
$PY lease "$URL_P2" "$TMP/kv2.json" || fail "prefill leg on P2"
[ "$($PY metric "$URL_P2" m3serve:kv_leases_granted_total)" = 1 ] || fail "no lease granted"
for i in $(seq 1 100); do
  [ "$($PY metric "$URL_P2" m3serve:kv_leases_expired_total)" = 1 ] && break
  [ "$i" = 100 ] && fail "the lease never expired"
  sleep 0.1
done
[ "$($PY metric "$URL_P2" m3serve:kv_leased_pages)" = 0 ] || fail "an expired lease kept its pages"
[ "$($PY metric "$URL_P2" m3serve:kv_free_pages)" = "$total" ] || fail "pages did not return to the pool"
$PY decode "$URL_D" "$URL_ref" "$TMP/kv2.json" "400:names no live KV lease" || fail "an expired lease was served"

# (4)
$PY lease "$URL_P4" "$TMP/kv4.json" || fail "prefill leg on P4"
$PY decode "$URL_D" "$URL_ref" "$TMP/kv4.json" ok || fail "policy recompute, prefill dead mid-transfer"
wait_dead "$PID_P4" || fail "P4 did not die mid-transfer"
$PY lease "$URL_P5" "$TMP/kv5.json" || fail "prefill leg on P5"
$PY decode "$URL_DF" "$URL_ref" "$TMP/kv5.json" '500:kv_load_failure_policy \"fail\"' ||
  fail "policy fail, prefill dead mid-transfer"
wait_dead "$PID_P5" || fail "P5 did not die mid-transfer"
$PY lease "$URL_P3" "$TMP/kv3.json" || fail "prefill leg on P3"
kill -9 "$PID_P3"
wait "$PID_P3" 2>/dev/null || true
$PY decode "$URL_D" "$URL_ref" "$TMP/kv3.json" ok || fail "policy recompute"
grep -q 'recomputed here (kv_load_failure_policy "recompute")' "$TMP/D.log" || fail "the recompute is not logged"
$PY decode "$URL_DF" "$URL_ref" "$TMP/kv3.json" '500:kv_load_failure_policy \"fail\"' || fail "policy fail"
[ "$($PY metric "$URL_D" m3serve:kv_free_pages)" = "$total" ] || fail "D leaked pages"
[ "$($PY metric "$URL_DF" m3serve:kv_free_pages)" = "$total" ] || fail "DF leaked pages"
$PY lease "$URL_P" "$TMP/kv6.json" || fail "prefill leg on P"
$PY decode "$URL_DF" "$URL_ref" "$TMP/kv6.json" ok || fail "DF does not serve after a failed transfer"

# (5)
code=$(curl -s -o "$TMP/r.json" -w '%{http_code}' "$URL_X/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "hi", "max_tokens": 3, "n": 2}')
[ "$code" = 400 ] && grep -q 'one prompt and n = 1' "$TMP/r.json" || fail "the prefill engine's 400 not passed on: $code $(cat "$TMP/r.json")"
DEAD=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN" proxy --prefill "http://127.0.0.1:$DEAD" --decode "$URL_D" --port 0 >"$TMP/proxy2.log" 2>&1 &
PIDS+=($!)
wait_server_health "$TMP/proxy2.log" $!
code=$(curl -s -o "$TMP/r.json" -w '%{http_code}' "$U/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": true}')
[ "$code" = 502 ] && grep -q "prefill engine 127.0.0.1:$DEAD could not be reached" "$TMP/r.json" ||
  fail "an unreachable prefill engine: $code $(cat "$TMP/r.json")"
# Its /health says so (a readiness probe stops sending it traffic); the working proxy's says ok.
code=$(curl -s -o "$TMP/h.json" -w '%{http_code}' "$U/health")
[ "$code" = 503 ] && grep -q '"prefill_up":0' "$TMP/h.json" || fail "proxy /health with no prefill engine: $code $(cat "$TMP/h.json")"
code=$(curl -s -o "$TMP/h.json" -w '%{http_code}' "$URL_X/health")
[ "$code" = 200 ] && grep -q '"decode_up":1' "$TMP/h.json" || fail "proxy /health: $code $(cat "$TMP/h.json")"

# (6)
if "$BIN" serve "$MODEL" --port 0 --kv-transfer-config \
    '{"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "xpu"}' >"$TMP/xpu.log" 2>&1; then
  fail "kv_buffer_device xpu accepted"
fi
grep -q 'kv_buffer_device "xpu" is not served' "$TMP/xpu.log" || fail "kv_buffer_device xpu not refused by name"
grep -q 'not applicable.*kv_buffer_device "cuda"\|kv_buffer_device "cuda".*host memory' "$TMP/PC.log" ||
  fail "kv_buffer_device cuda is not listed at start as not applicable"
code=$(curl -s -o "$TMP/r.json" -w '%{http_code}' "$URL_ref/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "hi", "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": true}}')
[ "$code" = 400 ] && grep -q "do_remote_decode" "$TMP/r.json" || fail "do_remote_decode without a producer role: $code"
echo "pd_disagg: OK"
