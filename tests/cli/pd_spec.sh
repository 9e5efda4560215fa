#!/usr/bin/env bash
# Prefill/decode disaggregation with DSpark speculative decoding (the demo model's trained draft), 1P1D on
# localhost over UCX: both engines run the same --speculative-config, so the pulled pages carry the
# draft's K/V of the prompt too (kv_page_codec: the draft's lanes are part of every page, and the draft
# is part of the layout both engines must share); the decode engine drafts from the first token on.
# (1) Through the proxy, greedy answers equal an aggregated engine's with the same draft and one's without
#     (chat and completions, streamed and not, same usage), the decode engine computing one prompt token
#     per request; and its drafts are accepted exactly as often as the aggregated engine's
#     (vllm:spec_decode_* on both /metrics): the draft's prompt state came with the pages.
# (2) A decode engine without the draft pulling from a prefill engine with it: its pages have another
#     layout, so the read is refused by the handshake with 400 naming the cache, never imported.
# Usage: pd_spec.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
TMP=$3
MODEL=$(cd "$(dirname "$0")/../.." && pwd)/models/demo
PY="python3 $(dirname "$0")/lib/pd_client.py"
rm -rf "$TMP"
mkdir -p "$TMP"
. "$(dirname "$0")/lib/pd_servers.sh"
# Every draft verified (adaptive speculation off), so that drafting does not hang on this minute's timings.
SPEC='{"method":"dspark","num_speculative_tokens":4,"adaptive_num_speculative_tokens":false}'
start ref
start refspec --speculative-config "$SPEC"
start P --kv-transfer-config "$(nixl kv_producer)" --speculative-config "$SPEC"
start D --kv-transfer-config "$(nixl kv_consumer)" --speculative-config "$SPEC"
start Dplain --kv-transfer-config "$(nixl kv_consumer)"
"$BIN" proxy --prefill "$URL_P" --decode "$URL_D" --port 0 >"$TMP/proxy.log" 2>&1 &
PIDS+=($!)
wait_server_health "$TMP/proxy.log" $!
URL_X=$U

# (1) Against the aggregated engine with the same draft, the decode engine's drafts are accepted exactly as
# often: the draft's state of the prompt arrived with the pages (greedy output alone could not tell, as
# verification keeps it exact whatever the draft proposes).
$PY compare "$URL_refspec" "$URL_X" "$URL_D" || fail "P/D with speculation differs from the aggregated engine"
for m in vllm:spec_decode_num_drafts_total vllm:spec_decode_num_accepted_tokens_total; do
  a=$($PY metric "$URL_refspec" $m) b=$($PY metric "$URL_D" $m)
  echo "$m: aggregated $a, P/D decode $b"
  [ "$a" = "$b" ] || fail "$m: aggregated $a, P/D decode engine $b"
done
$PY compare "$URL_ref" "$URL_X" "$URL_D" || fail "P/D with speculation differs from the engine without it"
[ "$($PY metric "$URL_D" vllm:spec_decode_num_drafts_total)" -gt 0 ] || fail "the decode engine did not draft"
[ "$($PY metric "$URL_D" vllm:spec_decode_num_accepted_tokens_total)" -gt 0 ] || fail "no draft token accepted"
[ "$($PY metric "$URL_D" m3serve:kv_remote_load_failures_total)" = 0 ] || fail "pulled pages failed verification"

# (2)
$PY lease "$URL_P" "$TMP/kv.json" || fail "prefill leg"
$PY decode "$URL_Dplain" "$URL_ref" "$TMP/kv.json" "400:another cache" || fail "a draftless decode engine read draft pages"
echo "pd_spec: OK"
