#!/usr/bin/env bash
# Issue-6 performance figures on the `mid` shapes, reproducibly: builds the two mid models (m31 =
# MXFP8 + NVFP4, m3-mxfp8) if missing, runs `bench roofline` at context 512 and 16384 RUNS times each
# (m31 with exact and with int8 NVFP4 activations; interleaved, so machine noise hits all alike) and
# prints best and median decode times (steady: steps in a row; cold: one step from flushed caches),
# the 16K/512 ratios (also measured pairwise: each 16K run followed by one at 512) and the prefill rate; then serves the m31 model
# and runs `bench serve` (random 1024 in / 128 out) at concurrency 1, 8 and 32 (roofline with
# OMP_WAIT_POLICY=active unless set; the server with m3serve's default wait policy unless
# SERVE_WAIT_POLICY is set). Not part of `make test` (about 20 minutes on 2 cores).
# Usage: tools/perf_report.sh [m3serve] [workdir]
#   (RUNS=3, RUNS=0 skips the roofline runs, LONG=1 adds decode after a real 16K-token prompt (LONG_VARIANTS,
#    LONG_FLAGS: see below), SERVE=0
#    skips bench serve, SERVE_ACT=int8 serves with --nvfp4-activations int8 (bf16: BF16 activations for
#    NVFP4 and MXFP8), SERVE_FLAGS=--mmap adds
#    flags to serve, PORT=8011, VARIANTS="layout:act[:map[:kv]] ..." chooses the roofline variants)
set -euo pipefail
BIN=$(realpath "${1:-build/m3serve}")
WORK=${2:-/tmp/m3perf}
RUNS=${RUNS:-3}
PORT=${PORT:-8011}
mkdir -p "$WORK"
# Roofline and generate runs spin without limit (the fastest on a dedicated machine); the server runs
# with m3serve's default (a short spin, then sleep) unless SERVE_WAIT_POLICY is set: spinning workers
# starve its HTTP thread and the bench client on two cores (mid m31, c1: TPOT 16.6 ms by default, 28.1
# with OMP_WAIT_POLICY=active).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-active}
SERVE_ENV=(env -u OMP_WAIT_POLICY)
[ -n "${SERVE_WAIT_POLICY:-}" ] && SERVE_ENV=(env OMP_WAIT_POLICY="$SERVE_WAIT_POLICY")

for layout in m31 m3-mxfp8; do
  [ -f "$WORK/mid-$layout/config.json" ] || "$BIN" make-model --layout "$layout" --preset mid --out "$WORK/mid-$layout" >/dev/null
done

# decode_ms FILE: whole-step ms of the DECODE table; prefill_tps FILE: tokens/s of the PREFILL table
decode_ms() { sed -n '/^DECODE/,/tokens\/s/p' "$1" | awk '/^whole step/ {print $4}'; }
# steady_ms FILE: the steady decode step (32 steps in a row, no flush), ms
steady_ms() { awk '/^steady decode/ {for (i = 1; i < NF; ++i) if ($(i + 1) == "ms") print $i}' "$1"; }
# paired_pct FILE: the steady decode's weight read rate over a read probe taken just before each run,
# median over the runs, %
paired_pct() { sed -n 's/.*paired with a read probe.*(median \([0-9]*\)%).*/\1/p' "$1"; }
# inter_pct FILE: the median over 32 steps of each step's weight read rate over the two probe passes
# around it (the interleaved line), %
inter_pct() { sed -n 's/.*interleaved with the read probe.*weights at a median \([0-9]*\)%.*/\1/p' "$1"; }
# roof_pct FILE: the decode roof (each weight class at the lower of its kernels' in-cache rate and the
# read bandwidth of the run's first probe) as a share of that bandwidth: the most of it a step's
# weights could be read at if reads and decode overlapped perfectly, %
roof_pct() { sed -n 's/.* MB = \([0-9]*\)% of read BW; the steady.*/\1/p' "$1"; }
# pair_ratio FILE: the 16K run's median ratio of its steady rate over the rate at 512 tokens measured
# right after each run (--compare-context 512: the ratio within seconds, not across minutes)
pair_ratio() { sed -n 's/.*per pair .*(median \([0-9.]*\)).*/\1/p' "$1"; }
prefill_tps() { sed -n '/^PREFILL/,$p' "$1" | awk '/-> / {print $2}'; }
# best median (an even count's median is the mean of the two middle values: with RUNS=2 the lower one
# alone was the best run again)
stats() { sort -g | awk '{v[NR]=$1} END {m = NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2; printf "%s %.3f\n", v[1], m}'; }

# Variants: layout, activation mode (int8 = the opt-in --nvfp4-activations int8; bf16 = the opt-in
# --nvfp4-activations bf16 --mxfp8-activations bf16, BF16 activations for every quantised matrix; m3-mxfp8 has no
# NVFP4 matrix, so only fp32 applies there), and optionally map (= --mmap: weights read from the mapped
# checkpoint instead of huge-page memory, the default for models that fit), and optionally the K/V and
# index-key cache dtype (bf16 by default; fp8 or nvfp4, the recipe's, e.g. "m31:fp32::nvfp4").
VARIANTS=${VARIANTS:-"m31:fp32:map m31:fp32 m31:int8 m3-mxfp8:fp32:map m3-mxfp8:fp32"}
[ "$RUNS" = 0 ] && VARIANTS=""
# act_flags ACT: the activation flags of a mode into actf (bf16 covers MXFP8 and NVFP4)
act_flags() {
  actf=(--nvfp4-activations "$1")
  [ "$1" = bf16 ] && actf+=(--mxfp8-activations bf16)
  return 0
}
# parse VARIANT: sets layout, act, mem ("" or "ram"), flags and tag (the report file infix)
parse() {
  IFS=: read -r layout act mem kv <<<"$1"
  act_flags "$act"
  flags=("${actf[@]}")
  [ "$mem" = map ] && flags+=(--mmap)
  [ -n "$kv" ] && flags+=(--kv-cache-dtype "$kv" --indexer-kv-dtype "$kv")
  tag="$layout.$act${mem:+.$mem}${kv:+.$kv}"
}
for i in $(seq 1 "$RUNS"); do
  for v in $VARIANTS; do
    parse "$v"
    "$BIN" bench roofline --model "$WORK/mid-$layout" --context 512 --repeats 5 "${flags[@]}" \
      >"$WORK/roof.$tag.512.$i.txt"
    "$BIN" bench roofline --model "$WORK/mid-$layout" --context 16384 --compare-context 512 --prefill 16 --repeats 5 \
      "${flags[@]}" >"$WORK/roof.$tag.16k.$i.txt"
  done
done

# Two decode figures per context: the steady step (32 steps in a row, as generate and serve decode)
# and the cold whole step (each from flushed caches, the roofline's per-class baseline).
for kind in steady cold; do
  printf "\n%-22s %-26s %-26s %-22s %-24s %-22s %-22s %-18s %s\n" "variant ($kind)" "decode 512 ms best/median" \
    "decode 16K ms best/median" "16K/512 best/median" "prefill 512 tok/s best" "512 % of paired probe" \
    "512 % interleaved" "512 roof % of BW" "16K/512 paired runs"
  get=decode_ms
  [ "$kind" = steady ] && get=steady_ms
  for v in $VARIANTS; do
    parse "$v"
    read -r b512 m512 < <(for f in "$WORK"/roof.$tag.512.*.txt; do $get "$f"; done | stats)
    read -r b16 m16 < <(for f in "$WORK"/roof.$tag.16k.*.txt; do $get "$f"; done | stats)
    pf=$(for f in "$WORK"/roof.$tag.512.*.txt; do prefill_tps "$f"; done | sort -gr | head -1)
    pp=-
    pi=-
    pr=-
    po=-
    [ "$kind" = steady ] && pp=$(for f in "$WORK"/roof.$tag.512.*.txt; do paired_pct "$f"; done | xargs echo) &&
      pi=$(for f in "$WORK"/roof.$tag.512.*.txt; do inter_pct "$f"; done | xargs echo) &&
      po=$(for f in "$WORK"/roof.$tag.512.*.txt; do roof_pct "$f"; done | xargs echo) &&
      pr=$(for f in "$WORK"/roof.$tag.16k.*.txt; do pair_ratio "$f"; done | xargs echo)
    printf "%-22s %-26s %-26s %-22s %-24s %-22s %-22s %-18s %s\n" "$layout $act $mem $kv" "$b512 / $m512" "$b16 / $m16" \
      "$(awk -v a="$b512" -v b="$b16" -v c="$m512" -v d="$m16" 'BEGIN {printf "%.2f / %.2f", a/b, c/d}')" "$pf" "$pp" "$pi" \
      "$po" "$pr"
  done
done
echo "full reports: $WORK/roof.*.txt"

# LONG=1: decode through the engine after a real 16K-token prompt and after a 504-token one (by default
# m31 with int8 and exact activations, about 6 minutes; LONG_VARIANTS="layout:act ..." chooses, e.g.
# "m3-mxfp8:fp32", LONG_FLAGS adds generate flags such as the recipe's caches: --kv-cache-dtype nvfp4
# --attention-config '{"indexer_kv_dtype":"nvfp4"}'): deterministic word salad, cut to 22,487 and 700
# characters (16304 and 504 tokens with the mid preset's tokenizer).
if [ "${LONG:-0}" = 1 ]; then
  python3 - "$WORK" <<'PY'
import random, sys
random.seed(1)
w = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu".split()
t = " ".join(random.choice(w) + str(random.randint(0, 99)) for _ in range(6000))
open(sys.argv[1] + "/long.txt", "w").write(t[:22487])
open(sys.argv[1] + "/short.txt", "w").write(t[:700])
PY
  for v in ${LONG_VARIANTS:-m31:int8 m31:fp32}; do
    layout=${v%%:*} act=${v#*:}
    for p in short long; do
      echo "$layout $act ${LONG_FLAGS:-}, $p prompt:"
      # shellcheck disable=SC2086
      "$BIN" generate --model "$WORK/mid-$layout" --prompt "$(cat "$WORK/$p.txt")" --max-tokens 400 --ignore-eos \
        --kv-cache-memory 2 $(act_flags "$act"; echo "${actf[@]}") ${LONG_FLAGS:-} 2>&1 >/dev/null | grep "prompt"
    done
  done
fi

[ "${SERVE:-1}" = 0 ] && exit 0
"${SERVE_ENV[@]}" "$BIN" serve "$WORK/mid-m31" --kv-cache-memory 4 --max-model-len 4096 --port "$PORT" \
  $(act_flags "${SERVE_ACT:-fp32}"; echo "${actf[@]}") ${SERVE_FLAGS:-} >"$WORK/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && break; sleep 1; done
printf "\n%-13s %-10s %-12s %-22s %-18s %-20s %s\n" "conc(prompts)" "out tok/s" "total tok/s" "TTFT mean/p90 ms" \
  "TPOT mean/p90 ms" "ITL median/p99 ms" "E2EL mean/p99 ms"
for cfg in "1 4" "8 16" "32 32"; do
  set -- $cfg
  "$BIN" bench serve --port "$PORT" --random-input-len 1024 --random-output-len 128 --ignore-eos --seed 1 \
    --max-concurrency "$1" --num-prompts "$2" --no-progress --save-result "$WORK/serve_c$1.json" >"$WORK/serve_c$1.txt" 2>&1
  python3 - "$WORK/serve_c$1.json" "$1($2)" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
pair = lambda a, b, d: f"{r[a]:.{d}f}/{r[b]:.{d}f}"
print(f"{sys.argv[2]:<13} {r['output_throughput']:<10.1f} {r['total_token_throughput']:<12.1f} "
      f"{pair('mean_ttft_ms', 'p90_ttft_ms', 0):<22} {pair('mean_tpot_ms', 'p90_tpot_ms', 1):<18} "
      f"{pair('median_itl_ms', 'p99_itl_ms', 1):<20} {pair('mean_e2el_ms', 'p99_e2el_ms', 0)}")
PY
done
echo "full results: $WORK/serve_c*.txt / .json"
