#!/usr/bin/env bash
# Starts N m3serve instances and a proxy in front of them on this machine, for a try-out of a multi-
# instance deployment: nginx (deploy/nginx/m3serve.conf) or HAProxy (deploy/haproxy/m3serve.cfg), both
# with session affinity, least-busy for the rest, retries on another instance, unbuffered streams;
# HAProxy also polls /health.
#
#   deploy/run-local.sh MODEL N [PORT] [-- serve flags...]
#
# The proxy listens on 127.0.0.1:PORT (default 8000); instance i on PORT+i. Prints "ready: URL" once
# every instance answers /health through the proxy; Ctrl-C (or SIGTERM) stops everything.
# Environment: M3SERVE (default: build/m3serve next to this folder), WORKDIR (logs, proxy files;
# default a new temporary folder), PROXY=nginx|haproxy (default nginx), AFFINITY=0 (nginx: plain round
# robin instead of session affinity, to compare).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { sed -n '2,11p' "$0"; exit 2; }
MODEL=$1
N=$2
shift 2
PORT=8000
if [ $# -gt 0 ] && [ "$1" != -- ]; then PORT=$1; shift; fi
[ $# -gt 0 ] && [ "$1" = -- ] && shift
M3SERVE=${M3SERVE:-$here/../build/m3serve}
WORKDIR=${WORKDIR:-$(mktemp -d /tmp/m3deploy.XXXXXX)}
AFFINITY=${AFFINITY:-1}
PROXY=${PROXY:-nginx}
case $PROXY in nginx|haproxy) ;; *) echo "PROXY must be nginx or haproxy" >&2; exit 2 ;; esac
PROXY_BIN=$(command -v "$PROXY" || echo "/usr/sbin/$PROXY")
[ -x "$PROXY_BIN" ] || { echo "$PROXY is needed (apt-get install $PROXY)" >&2; exit 1; }
mkdir -p "$WORKDIR/nginx" "$WORKDIR/haproxy"

pids=()
stop() {
  trap - EXIT INT TERM
  for f in "$WORKDIR/nginx/nginx.pid" "$WORKDIR/haproxy/haproxy.pid"; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop EXIT
trap 'exit 0' INT TERM

for i in $(seq 1 "$N"); do
  "$M3SERVE" serve "$MODEL" --host 127.0.0.1 --port $((PORT + i)) "$@" >"$WORKDIR/instance$i.log" 2>&1 &
  pids+=($!)
done

# The shipped configuration, with one `server` line per instance and the chosen ports.
servers=""
for i in $(seq 1 "$N"); do servers+="    server 127.0.0.1:$((PORT + i)) max_fails=1 fail_timeout=10s;\n"; done
awk -v servers="$servers" -v port="$PORT" -v affinity="$AFFINITY" '
  /^ *server 127\.0\.0\.1:/ { if (!done[block]++) printf "%s", servers; next }
  /^upstream / { block = $2 }
  /hash \$m3_session consistent;/ && affinity == "0" { next }
  /listen 127\.0\.0\.1:/ { sub(/:[0-9]+;/, ":" port ";") }
  { print }' "$here/nginx/m3serve.conf" >"$WORKDIR/nginx/m3serve.conf"
cat >"$WORKDIR/nginx/nginx.conf" <<CONF
daemon on;
pid $WORKDIR/nginx/nginx.pid;
error_log $WORKDIR/nginx/error.log warn;
events { worker_connections 4096; }
http {
    access_log $WORKDIR/nginx/access.log;
    client_body_temp_path $WORKDIR/nginx/body;
    proxy_temp_path $WORKDIR/nginx/proxy;
    fastcgi_temp_path $WORKDIR/nginx/fastcgi;
    uwsgi_temp_path $WORKDIR/nginx/uwsgi;
    scgi_temp_path $WORKDIR/nginx/scgi;
    include $WORKDIR/nginx/m3serve.conf;
}
CONF

# Instances first (each /health), then nginx.
for i in $(seq 1 "$N"); do
  for t in $(seq 1 600); do
    curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$((PORT + i))/health" && break
    kill -0 "${pids[$((i - 1))]}" 2>/dev/null || { echo "instance $i exited:" >&2; cat "$WORKDIR/instance$i.log" >&2; exit 1; }
    [ "$t" = 600 ] && { echo "instance $i never answered /health" >&2; exit 1; }
    sleep 0.1
  done
done
if [ "$PROXY" = nginx ]; then
  "$PROXY_BIN" -p "$WORKDIR/nginx" -c "$WORKDIR/nginx/nginx.conf"
else
  hservers=""
  for i in $(seq 1 "$N"); do hservers+="    server m3_$i 127.0.0.1:$((PORT + i))\n"; done
  awk -v servers="$hservers" -v port="$PORT" '
    /^ *server m3_[0-9]+ / { if (!done[block]++) printf "%s", servers; next }
    /^backend / { block = $2 }
    /^ *bind 127\.0\.0\.1:/ { sub(/:[0-9]+$/, ":" port) }
    { print }' "$here/haproxy/m3serve.cfg" >"$WORKDIR/haproxy/m3serve.cfg"
  "$PROXY_BIN" -D -p "$WORKDIR/haproxy/haproxy.pid" -f "$WORKDIR/haproxy/m3serve.cfg" 2>"$WORKDIR/haproxy/error.log"
fi
for t in $(seq 1 200); do
  curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/health" && break
  [ "$t" = 200 ] && { echo "$PROXY never answered:" >&2; cat "$WORKDIR/$PROXY/error.log" >&2; exit 1; }
  sleep 0.1
done
echo "ready: http://127.0.0.1:$PORT ($PROXY, $N instances on ports $((PORT + 1))-$((PORT + N)), affinity $AFFINITY; logs in $WORKDIR)"
wait "${pids[@]}"
