# Shared by the prefill/decode tests: engines on free localhost ports, killed when the test exits.
# Source after setting BIN, TMP and MODEL (the checkpoint `start` serves); SERVE_FLAGS: flags every engine
# gets besides its own.
export UCX_TLS=tcp  # loopback TCP: what every host has (RDMA and shared memory where UCX finds them otherwise)
fail() { echo "FAIL: $*" >&2; for f in "$TMP"/*.log; do echo "--- $f" >&2; tail -5 "$f" >&2; done; exit 1; }
. "$(dirname "${BASH_SOURCE[0]}")/server_port.sh"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
# start NAME [flags]: sets URL_NAME and PID_NAME
start() {
  local name=$1
  shift
  # shellcheck disable=SC2086
  "$BIN" serve "$MODEL" --host 127.0.0.1 --port 0 ${SERVE_FLAGS:-} --kv-cache-memory 0.05 "$@" >"$TMP/$name.log" 2>&1 &
  PIDS+=($!)
  eval "PID_$name=$!"
  wait_server_health "$TMP/$name.log" $!
  eval "URL_$name=$U"
}
# nixl ROLE [EXTRA]: a --kv-transfer-config for the NixlConnector on a free port; EXTRA: more keys (", ...").
nixl() { echo "{\"kv_connector\": \"NixlConnector\", \"kv_role\": \"$1\", \"kv_port\": 0${2:-}}"; }
