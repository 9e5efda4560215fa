# Shared by the speculation benchmarks (tools/spec_adaptive_bench.sh, tools/spec_confidence_bench.sh):
# the request file and one timed `m3serve generate --input` run. Source it after setting BIN, MODEL, TMP.

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

# spec_run CONC [SPEC_JSON]: generate over $TMP/req.jsonl at --max-num-seqs CONC; its stderr in $TMP/err;
# prints "tok/s AL" (AL "-" without speculation).
spec_run() {
  local args=()
  [ -n "${2:-}" ] && args=(--speculative-config "$2")
  "$BIN" generate --model "$MODEL" --input "$TMP/req.jsonl" --output "$TMP/out.jsonl" --max-num-seqs "$1" \
    --kv-cache-memory 0.5 "${args[@]}" 2>"$TMP/err" >/dev/null
  local tps al
  tps=$(sed -n 's/.* s: \([0-9.]*\) output tokens\/s.*/\1/p' "$TMP/err")
  al=$(sed -n 's/.*acceptance length \([0-9.]*\);.*/\1/p' "$TMP/err")
  echo "$tps ${al:--}"
}
