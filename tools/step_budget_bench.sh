#!/usr/bin/env bash
# Time-budgeted steps against today's scheduling, side by side: serves one checkpoint twice (the
# latency budget off, --step-latency-factor 0, and on, the default) and runs `bench serve` (random 1024 in
# / 128 out) at each concurrency against both, alternating which goes first each round; a fresh seed per
# round and concurrency, shared by both servers, so neither finds the other's prompts in its prefix cache.
# Usage: tools/step_budget_bench.sh [m3serve] [model dir] [workdir]
#   ROUNDS=2, CONFIGS="8:16 32:32" (concurrency:prompts), ON_FLAGS (extra flags of the budgeted server),
#   PORT=8031 (off) and PORT+1 (on); NEW_BIN: a second build served on PORT+2 ("new") with its defaults
#   and NEW_FLAGS (not ON_FLAGS), run in every round beside the other two (the order rotates), to compare
#   two schedulers, or two settings of one build (NEW_BIN = BIN).
set -euo pipefail
BIN=$(realpath "${1:-build/m3serve}")
MODEL=${2:-/tmp/m3perf/mid-m31}
WORK=${3:-/tmp/step_budget}
ROUNDS=${ROUNDS:-2}
CONFIGS=${CONFIGS:-"8:16 32:32"}
PORT=${PORT:-8031}
mkdir -p "$WORK"
[ -d "$MODEL" ] || "$BIN" make-model --layout m31 --preset mid --out "$MODEL"
"$BIN" serve "$MODEL" --kv-cache-memory 3 --max-model-len 4096 --port "$PORT" --step-latency-factor 0 \
  >"$WORK/serve_off.log" 2>&1 &
OFF=$!
"$BIN" serve "$MODEL" --kv-cache-memory 3 --max-model-len 4096 --port $((PORT + 1)) ${ON_FLAGS:-} \
  >"$WORK/serve_on.log" 2>&1 &
ON=$!
NEW=
if [ -n "${NEW_BIN:-}" ]; then
  "$(realpath "$NEW_BIN")" serve "$MODEL" --kv-cache-memory 3 --max-model-len 4096 --port $((PORT + 2)) ${NEW_FLAGS:-} \
    >"$WORK/serve_new.log" 2>&1 &
  NEW=$!
fi
trap 'kill $OFF $ON $NEW 2>/dev/null || true' EXIT
for p in "$PORT" $((PORT + 1)) ${NEW:+$((PORT + 2))}; do
  for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$p/v1/models" >/dev/null && break; sleep 1; done
done
printf "%-6s %-5s %-4s %-10s %-11s %-16s %-18s %s\n" "round" "C(N)" "mode" "out tok/s" "total tok/s" \
  "ITL median/p99" "TTFT p50/p90 ms" "p99/median"
run() {  # mode port C N seed round
  local out="$WORK/$1_c$3_r$6.json"
  "$BIN" bench serve --port "$2" --random-input-len 1024 --random-output-len 128 --ignore-eos --seed "$5" \
    --max-concurrency "$3" --num-prompts "$4" --no-progress \
    --save-result "$out" >"${out%.json}.txt" 2>&1
  python3 - "$out" "$6" "$3($4)" "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:<6} {sys.argv[3]:<5} {sys.argv[4]:<4} {r['output_throughput']:<10.1f} "
      f"{r['total_token_throughput']:<11.1f} {r['median_itl_ms']:.1f}/{r['p99_itl_ms']:<10.1f} "
      f"{r['median_ttft_ms']:.0f}/{r['p90_ttft_ms']:<12.0f} {r['p99_itl_ms'] / r['median_itl_ms']:.1f}")
PY
}
for round in $(seq 1 "$ROUNDS"); do
  for cfg in $CONFIGS; do
    c=${cfg%%:*} n=${cfg##*:} seed=$((100 * c + round))
    modes=("off:$PORT" "on:$((PORT + 1))")
    [ -n "$NEW" ] && modes+=("new:$((PORT + 2))")
    for i in "${!modes[@]}"; do  # the order rotates by one each round
      m=${modes[$(((i + round - 1) % ${#modes[@]}))]}
      run "${m%%:*}" "${m##*:}" "$c" "$n" "$seed" "$round"
    done
  done
done
echo "full results: $WORK/{on,off,new}_c*_r*.{txt,json}"
