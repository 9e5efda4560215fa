# Shared by the speculation benchmarks (tools/spec_adaptive_bench.sh, spec_confidence_bench.sh,
# spec_draft_weights_bench.sh, spec_flags_bench.sh): their arguments, the request file, one timed
# `m3serve generate --input` run, and the rounds of none / A / B runs. Source it, then call spec_init.

# spec_init DEFAULT_CONCS [m3serve] [model] [label=fragment]...: the script's arguments into BIN
# (build/m3serve), MODEL (models/demo) and SETTINGS (default the block verification of a trained draft);
# the settings every speculation benchmark reads from the environment (ROUNDS=2, K=7 drafts, N=16
# requests, TOKENS=128, TEMP=0.7, CONCS, EXTRA), a temporary folder TMP removed on exit, and the request
# file $TMP/req.jsonl.
spec_init() {
  local concs=$1
  shift
  BIN=${1:-build/m3serve} MODEL=${2:-models/demo}
  shift 2 || true
  SETTINGS=("$@")
  [ ${#SETTINGS[@]} -gt 0 ] || SETTINGS=('block="rejection_sample_method":"block"')
  ROUNDS=${ROUNDS:-2} K=${K:-7} N=${N:-16} TOKENS=${TOKENS:-128} TEMP=${TEMP:-0.7} CONCS=${CONCS:-$concs} EXTRA=${EXTRA:-}
  TMP=$(mktemp -d)
  trap 'rm -rf "$TMP"' EXIT
  spec_requests "$TMP/req.jsonl" "$TEMP" "$N" "$TOKENS"
}

# spec_requests FILE TEMP N TOKENS: N requests of TOKENS tokens at TEMP (seeded), the demo's fixed
# prompts and held-out passages in turn (token ids below every vocabulary here).
spec_requests() {
  python3 - "$@" <<'PY'
import json, sys
out, temp, n, toks = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = [json.loads(l)["prompt"] for l in open("tests/data/demo/greedy.jsonl")]
for l in open("tests/data/demo/heldout_tokens.txt"):
    rows.append([int(x) for x in l.split()][:96])
with open(out, "w") as f:
    for i in range(n):
        f.write(json.dumps({"prompt_token_ids": rows[i % len(rows)], "max_tokens": toks, "ignore_eos": True,
                            "temperature": temp, "seed": i}) + "\n")
PY
}

# spec_run CONC [SPEC_JSON]: generate over $TMP/req.jsonl at --max-num-seqs CONC (and $RUN_FLAGS); its
# stderr in $TMP/err; prints "tok/s AL" (AL "-" without speculation).
spec_run() {
  local args=()
  [ -n "${2:-}" ] && args=(--speculative-config "$2")
  "$BIN" generate --model "$MODEL" --input "$TMP/req.jsonl" --output "$TMP/out.jsonl" --max-num-seqs "$1" \
    --kv-cache-memory 0.5 ${RUN_FLAGS:-} "${args[@]}" 2>"$TMP/err" >/dev/null
  local tps al
  tps=$(sed -n 's/.* s: \([0-9.]*\) output tokens\/s.*/\1/p' "$TMP/err")
  al=$(sed -n 's/.*acceptance length \([0-9.]*\);.*/\1/p' "$TMP/err")
  echo "$tps ${al:--}"
}

# spec_rounds NAME_A SUFFIX_A NAME_B SUFFIX_B SETTING...: for every round ($ROUNDS), concurrency ($CONCS)
# and SETTING (label=JSON fragment), runs none, then A and B (the dspark config with $K drafts, the
# fragment and $EXTRA, closed by SUFFIX_A / SUFFIX_B), through the caller's `run` (CONC [SPEC_JSON] ->
# "tok/s AL"), and prints a row with both rates and the ratios A/none, B/none, B/A.
spec_rounds() {
  local na=$1 sa=$2 nb=$3 sb=$4
  shift 4
  local fmt="%-6s %-5s %-10s %-11s %-10s %-10s %-10s %-10s %s\n"
  printf "$fmt" round conc setting "none tok/s" "$na" "$na AL" "$nb" "$nb AL" "$na/none $nb/none $nb/$na"
  local round conc lv label frag base none a aal b bal
  for round in $(seq 1 "$ROUNDS"); do
    for conc in $CONCS; do
      for lv in "$@"; do
        label=${lv%%=*} frag=${lv#*=}
        base="{\"method\":\"dspark\",\"num_speculative_tokens\":$K,\"draft_sample_method\":\"probabilistic\",$frag${EXTRA:-}"
        read -r none _ < <(run "$conc" "")
        read -r a aal < <(run "$conc" "$base$sa")
        read -r b bal < <(run "$conc" "$base$sb")
        printf "$fmt" "$round" "$conc" "$label" "$none" "$a" "$aal" "$b" "$bal" \
          "$(python3 -c "print(f'{$a/$none:.2f} {$b/$none:.2f} {$b/$a:.2f}')")"
      done
    done
  done
}
