#!/usr/bin/env bash
# Batch-1 decode of m3serve against llama.cpp on the same weights, in alternated pairs (issue 46,
# docs/benchmarks.md 3.11). Each pair runs m3serve `generate` (greedy, --ignore-eos, TOKENS tokens after
# a short prompt) and `llama-bench` tg (TOKENS tokens at a depth equal to m3serve's prompt length, one
# repetition), with THREADS threads each (OMP_NUM_THREADS for m3serve, -t for llama-bench); odd pairs start with m3serve, even pairs with llama.cpp, so a
# drift in the host's load falls on both alike. Prints both rates and the ratio per pair, the median
# ratio, and each engine's spread (max/min). llama.cpp is a measurement peer: nothing here builds or
# installs it, and no test depends on it.
#
# Usage: tools/llama_cpp_pairs.sh M3SERVE LLAMA_BUILD_DIR MODEL_DIR GGUF [PAIRS=5]
#   M3SERVE          m3serve binary (e.g. build/m3serve)
#   LLAMA_BUILD_DIR  llama.cpp build directory holding bin/llama-bench
#   MODEL_DIR        make-model checkpoint m3serve decodes (e.g. --layout m3-mxfp8 --preset mid)
#   GGUF             the same weights for llama.cpp (tools/gguf_from_mid.sh: Q8_0 or MXFP4_MOE)
# Environment: TOKENS (128), THREADS (2), PROMPT (default "Once upon a time, there was a king": 16 tokens with make-model's tokenizer),
#   M3_FLAGS (extra generate flags), LLAMA_FLAGS (extra llama-bench flags; default "-fa 1": MSA needs
#   flash attention in llama.cpp, without it the graph falls back to dense attention),
#   WORK (a directory for the raw logs; default a new one under /tmp), PERF=1 (each run under
#   `perf stat -e task-clock,context-switches,cpu-migrations,page-faults`, lines added to the logs and
#   to the table), M3_ENV / LLAMA_ENV ("VAR=VALUE ..." set for one engine only, e.g.
#   LLAMA_ENV=OMP_WAIT_POLICY=passive), LLAMA_THREADS (llama-bench -t, default THREADS), QUIET=PCT (before
#   each pair, wait until the CPUs were at least PCT% idle over 3 s, at most QUIET_WAIT seconds, default
#   1800: on a shared host, the pairs then run in the neighbours' pauses). Each engine keeps
#   its own default thread wait policy; OMP_* / GOMP_* set in the environment apply to both.
set -euo pipefail

usage() { sed -n '10,14p' "$0" >&2; exit 2; }
[ $# -ge 4 ] || usage
M3=$1 LLB=$2 MODEL=$3 GGUF=$4 PAIRS=${5:-5}
TOKENS=${TOKENS:-128}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-"Once upon a time, there was a king"}
LLAMA_FLAGS=${LLAMA_FLAGS:--fa 1}
M3_FLAGS=${M3_FLAGS:-}
LLAMA_THREADS=${LLAMA_THREADS:-$THREADS}
read -r -a M3_ENVV <<<"${M3_ENV:-}"
read -r -a LLAMA_ENVV <<<"${LLAMA_ENV:-}"
BENCH=$LLB/bin/llama-bench

[ -x "$M3" ] || { echo "llama_cpp_pairs: no m3serve binary at '$M3'" >&2; exit 1; }
[ -x "$BENCH" ] || { echo "llama_cpp_pairs: no llama-bench at '$BENCH' (build llama.cpp with: cmake --build DIR --target llama-bench)" >&2; exit 1; }
[ -f "$MODEL/config.json" ] || { echo "llama_cpp_pairs: '$MODEL' is not a checkpoint directory (no config.json)" >&2; exit 1; }
[ -f "$GGUF" ] || { echo "llama_cpp_pairs: no GGUF at '$GGUF'" >&2; exit 1; }
WORK=${WORK:-$(mktemp -d /tmp/llama_cpp_pairs.XXXXXX)}
mkdir -p "$WORK"

PERF_CMD=()
if [ "${PERF:-0}" = 1 ]; then
  command -v perf >/dev/null || { echo "llama_cpp_pairs: PERF=1 needs perf (linux-perf)" >&2; exit 1; }
  PERF_CMD=(perf stat -x, -e task-clock,context-switches,cpu-migrations,page-faults -o)
fi
# perf_summary LOG: "cs=N mig=N cpu=Ns" from a perf stat -x, file
perf_summary() {
  awk -F, '/context-switches/ {cs=$1} /cpu-migrations/ {mi=$1} /task-clock/ {tc=$1/1000}
           END {printf "cs=%s mig=%s cpu=%.2fs", cs, mi, tc}' "$1"
}

# m3serve's prompt length, so that llama.cpp decodes at the same depth.
"$M3" generate --model "$MODEL" --prompt "$PROMPT" --max-tokens 1 --temperature 0 $M3_FLAGS \
  >/dev/null 2>"$WORK/probe.err" || { cat "$WORK/probe.err" >&2; exit 1; }
DEPTH=$(sed -n 's/.*prompt \([0-9]*\) tokens.*/\1/p' "$WORK/probe.err" | tail -1)
[ -n "$DEPTH" ] || { echo "llama_cpp_pairs: could not read m3serve's prompt length" >&2; cat "$WORK/probe.err" >&2; exit 1; }

# idle_pct: the CPUs' idle share over 3 s, from /proc/stat
idle_pct() {
  local a b
  read -r -a a < /proc/stat; sleep 3; read -r -a b < /proc/stat
  local t1=$((a[1]+a[2]+a[3]+a[4]+a[5]+a[6]+a[7]+a[8])) t2=$((b[1]+b[2]+b[3]+b[4]+b[5]+b[6]+b[7]+b[8]))
  echo $(( 100 * ((b[4]+b[5]) - (a[4]+a[5])) / (t2 - t1) ))
}
wait_quiet() {
  [ -n "${QUIET:-}" ] || return 0
  local until=$(( $(date +%s) + ${QUIET_WAIT:-1800} ))
  while [ "$(idle_pct)" -lt "$QUIET" ]; do
    [ "$(date +%s)" -lt "$until" ] || { echo "llama_cpp_pairs: no ${QUIET}% idle moment within ${QUIET_WAIT:-1800} s" >&2; exit 1; }
  done
}

run_m3() {  # $1 = pair; prints tokens/s
  local log=$WORK/m3.$1.err
  local pre=()
  [ ${#PERF_CMD[@]} -gt 0 ] && pre=("${PERF_CMD[@]}" "$WORK/m3.$1.perf")
  env OMP_NUM_THREADS="$THREADS" "${M3_ENVV[@]}" "${pre[@]}" "$M3" generate --model "$MODEL" --prompt "$PROMPT" --max-tokens "$TOKENS" --temperature 0 \
    --ignore-eos $M3_FLAGS >/dev/null 2>"$log" || { cat "$log" >&2; exit 1; }
  sed -n 's/.*decode \([0-9.]*\) tokens\/s.*/\1/p' "$log" | tail -1
}
run_llama() {  # $1 = pair; prints tokens/s
  local log=$WORK/llama.$1.jsonl
  local pre=()
  [ ${#PERF_CMD[@]} -gt 0 ] && pre=("${PERF_CMD[@]}" "$WORK/llama.$1.perf")
  # shellcheck disable=SC2086
  env "${LLAMA_ENVV[@]}" "${pre[@]}" "$BENCH" -m "$GGUF" -p 0 -n "$TOKENS" -d "$DEPTH" -t "$LLAMA_THREADS" -r 1 $LLAMA_FLAGS -o jsonl \
    >"$log" 2>"$WORK/llama.$1.err" || { cat "$WORK/llama.$1.err" >&2; exit 1; }
  sed -n 's/.*"avg_ts": *\([0-9.e+-]*\).*/\1/p' "$log" | tail -1
}

echo "host: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs online; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "m3serve: OMP_NUM_THREADS=$THREADS ${M3_ENV:+$M3_ENV }$M3 generate --model $MODEL --prompt <$DEPTH tokens> --max-tokens $TOKENS --temperature 0 --ignore-eos $M3_FLAGS"
echo "llama.cpp: ${LLAMA_ENV:+$LLAMA_ENV }$BENCH -m $GGUF -p 0 -n $TOKENS -d $DEPTH -t $LLAMA_THREADS -r 1 $LLAMA_FLAGS"
echo "logs: $WORK"
printf '%-5s %-9s %12s %12s %7s %s\n' pair first m3serve llama.cpp ratio "load"
M3R=() LLR=() RAT=()
for ((i = 1; i <= PAIRS; ++i)); do
  wait_quiet
  if ((i % 2)); then first=m3serve; a=$(run_m3 "$i"); b=$(run_llama "$i")
  else first=llama.cpp; b=$(run_llama "$i"); a=$(run_m3 "$i"); fi
  [ -n "$a" ] && [ -n "$b" ] || { echo "llama_cpp_pairs: pair $i gave no rate (logs in $WORK)" >&2; exit 1; }
  r=$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", a / b}')
  M3R+=("$a") LLR+=("$b") RAT+=("$r")
  extra=""
  [ ${#PERF_CMD[@]} -gt 0 ] && extra="  m3serve $(perf_summary "$WORK/m3.$i.perf") | llama.cpp $(perf_summary "$WORK/llama.$i.perf")"
  printf '%-5s %-9s %12.2f %12.2f %7s %s%s\n' "$i" "$first" "$a" "$b" "$r" "$(cut -d' ' -f1 /proc/loadavg)" "$extra"
done

# stats V...: median min max max/min
stats() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {m = NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2;
  printf "median %.3f, min %.2f, max %.2f, spread (max/min) %.3f", m, v[1], v[NR], v[NR] / v[1]}'; }
echo "m3serve tokens/s:   $(stats "${M3R[@]}")"
echo "llama.cpp tokens/s: $(stats "${LLR[@]}")"
echo "ratio m3serve/llama.cpp: $(stats "${RAT[@]}" | sed 's/, spread.*//')"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
