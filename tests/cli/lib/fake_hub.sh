# Sourced by the Hub round-trip scripts: starts tests/tools/fake_hub.py (a local stand-in for the
# Hugging Face Hub API) on a free port and waits, bounded and polling, for the port file it writes.
# Sets HUB_PID and HUB (the base URL). Needs a `fail` function in the caller.
# Usage: start_fake_hub PORT_FILE LOG [fake_hub.py arguments...]
start_fake_hub() {
  local port_file=$1 log=$2
  shift 2
  rm -f "$port_file"
  python3 "$(dirname "${BASH_SOURCE[0]}")/../../tools/fake_hub.py" --port-file "$port_file" "$@" >"$log" 2>&1 &
  HUB_PID=$!
  for _ in $(seq 1 300); do
    if [ -s "$port_file" ]; then
      HUB=http://127.0.0.1:$(cat "$port_file")
      return 0
    fi
    kill -0 "$HUB_PID" 2>/dev/null || fail "fake hub exited during start-up: $(cat "$log")"
    sleep 0.1
  done
  fail "fake hub did not write its port"
}

# hub_mode JSON: changes the fake hub's mode (cut, corrupt, match, down).
hub_mode() { curl -sf -X POST "$HUB/_fake/mode" --data-binary "$1" >/dev/null || fail "fake hub mode $1"; }

# hub_requests: the number of requests the fake hub has answered (the control requests included).
hub_requests() { curl -sf "$HUB/_fake/log" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))'; }
