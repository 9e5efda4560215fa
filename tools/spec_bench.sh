#!/usr/bin/env bash
# DSpark speed-up on the demo model: output tokens/s and acceptance length of `m3serve generate --input`
# (offline batch through the engine) without speculation and with 3 / 7 draft tokens, block vs standard
# verification, at concurrency 1 and 8 (--max-num-seqs). 16 requests: the demo's fixed prompts (plain text,
# reasoning, chat, tool use) and held-out KJV passages, 128 tokens each, temperature 0.7 (seeded) so the
# two verification rules differ; set TEMP=0 for greedy. Usage: tools/spec_bench.sh [m3serve] [model]
set -euo pipefail
BIN=${1:-build/m3serve}
MODEL=${2:-models/demo}
TEMP=${TEMP:-0.7}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 - "$TMP/req.jsonl" "$TEMP" <<'PY'
import json, sys
out, temp = sys.argv[1], float(sys.argv[2])
rows = [json.loads(l)["prompt"] for l in open("tests/data/demo/greedy.jsonl")]
for l in open("tests/data/demo/heldout_tokens.txt"):
    rows.append([int(x) for x in l.split()][:96])
with open(out, "w") as f:
    for i in range(16):
        f.write(json.dumps({"prompt_token_ids": rows[i % len(rows)], "max_tokens": 128, "ignore_eos": True,
                            "temperature": temp, "seed": i}) + "\n")
PY
printf "%-34s %5s %12s %8s\n" "config" "conc" "out tok/s" "AL"
for conc in 1 8; do
  for cfg in none "3 block" "3 standard" "7 block" "7 standard"; do
    args=()
    if [ "$cfg" != none ]; then
      set -- $cfg
      args=(--speculative-config "{\"method\":\"dspark\",\"num_speculative_tokens\":$1,\"rejection_sample_method\":\"$2\",\"draft_sample_method\":\"probabilistic\"}")
    fi
    "$BIN" generate --model "$MODEL" --input "$TMP/req.jsonl" --output "$TMP/out.jsonl" --max-num-seqs "$conc" \
      --kv-cache-memory 0.25 "${args[@]}" 2>"$TMP/err" >/dev/null
    tps=$(sed -n 's/.* s: \([0-9.]*\) output tokens\/s.*/\1/p' "$TMP/err")
    al=$(sed -n 's/.*acceptance length \([0-9.]*\);.*/\1/p' "$TMP/err")
    printf "%-34s %5s %12s %8s\n" "${cfg/none/no speculation}" "$conc" "$tps" "${al:--}"
  done
done
