# Sourced by the server round-trip scripts: waits (bounded, polling the log, no fixed sleep as
# synchronisation) until `m3serve serve --port 0` reports its port, and sets PORT; wait_server_health
# then also waits until /health answers and sets U (the base URL). Needs a `fail` function in the caller.
wait_server_port() {
  local log=$1 pid=$2
  PORT=""
  for _ in $(seq 1 600); do
    # The log may not exist yet (the server has not opened it): no port yet, not an error.
    PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" 2>/dev/null | head -1 || true)
    [ -n "$PORT" ] && return 0
    kill -0 "$pid" 2>/dev/null || fail "server exited during start-up"
    sleep 0.1
  done
  fail "server did not report its port"
}

wait_server_health() {
  wait_server_port "$1" "$2"
  U=http://127.0.0.1:$PORT
  for i in $(seq 1 100); do
    curl -s -o /dev/null --max-time 2 "$U/health" && return 0
    [ "$i" = 100 ] && fail "/health never answered"
    sleep 0.1
  done
}
