#!/usr/bin/env bash
# Speculation of two builds side by side, alternated in each round, with the process's CPU seconds beside
# tokens/s (on a shared host CPU time moves less than wall time): fixed k drafts and adaptive for the old
# and the new build, then no speculation (new build). 8 requests x 64 tokens of the demo's prompts,
# temperature 0.7, synthetic acceptance length AL.
# Usage: C=8 AL=2.3 ROUNDS=1 tools/spec_cpu_bench.sh NEW_M3SERVE OLD_M3SERVE MODEL_DIR
set -uo pipefail
NEW=$1 OLD=$2 MODEL=$3
C=${C:-8} AL=${AL:-2.3} ROUNDS=${ROUNDS:-1} K=${K:-7}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 - "$TMP/req.jsonl" <<'PY'
import json, sys
rows = [json.loads(l)["prompt"] for l in open("tests/data/demo/greedy.jsonl")]
for l in open("tests/data/demo/heldout_tokens.txt"):
    rows.append([int(x) for x in l.split()][:96])
with open(sys.argv[1], "w") as f:
    for i in range(8):
        f.write(json.dumps({"prompt_token_ids": rows[i % len(rows)], "max_tokens": 64, "ignore_eos": True,
                            "temperature": 0.7, "seed": i}) + "\n")
PY
B="{\"method\":\"dspark\",\"num_speculative_tokens\":$K,\"draft_sample_method\":\"probabilistic\",\"rejection_sample_method\":\"synthetic\",\"synthetic_acceptance_length\":$AL"
run() {  # bin [args] -> "tok/s cpu S steps N drafts N"
  local bin=$1
  shift
  /usr/bin/time -f "%U %S" -o "$TMP/time" "$bin" generate --model "$MODEL" --input "$TMP/req.jsonl" --output "$TMP/out" \
    --max-num-seqs "$C" --kv-cache-memory 0.5 "$@" 2>"$TMP/err" >/dev/null
  echo "$(sed -n 's/.* s: \([0-9.]*\) output tokens\/s.*/\1/p' "$TMP/err") cpu $(awk '{print $1+$2}' "$TMP/time")" \
    "$(sed -n 's/.*speculative: \([0-9]*\) drafts, \([0-9]*\) draft tokens.*/steps \1 drafts \2/p' "$TMP/err")"
}
for r in $(seq 1 "$ROUNDS"); do
  echo "r$r old fixed  $(run "$OLD" --speculative-config "$B,\"adaptive_num_speculative_tokens\":false}")"
  echo "r$r new fixed  $(run "$NEW" --speculative-config "$B,\"adaptive_num_speculative_tokens\":false}")"
  echo "r$r old adapt  $(run "$OLD" --speculative-config "$B}")"
  echo "r$r new adapt  $(run "$NEW" --speculative-config "$B}")"
  echo "r$r none       $(run "$NEW")"
done
