#!/usr/bin/env bash
# `m3serve generate --input` in a tight KV pool, as the lost-request report ran it: the golden M3 model,
# --kv-cache-memory 0.004 (27 pages = 3456 tokens), budget 256, 16 sequences, 24 greedy requests
# (twelve of 3000-3400 prompt tokens, six sharing a 3000-token prefix, one of 3340; twelve of 1-300),
# max_tokens 12, ignore_eos. Every request must come back with its 12 tokens, equal to a run whose pool
# holds them all at once. Lines that can never run (a prompt over the pool, a refused field, bad JSON)
# get an {"error": ...} line naming the cause while the others go on. --max-model-len over the pool
# fails at start with both fixes.
# Usage: generate_admission.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP"
fail() { echo "FAIL: $*" >&2; exit 1; }
MODEL=$DATA/golden/m3-tiny/hf

python3 - "$TMP" <<'PY'
import json, random, sys
tmp = sys.argv[1]
rng = random.Random(7)
V = 420
prefix = [rng.randrange(V) for _ in range(3000)]
lines = []
for i in range(12):
    n = 3340 if i == 4 else rng.randrange(3000, 3401)
    p = (prefix if i % 2 == 0 else [rng.randrange(V) for _ in range(3000)]) + [rng.randrange(V) for _ in range(n - 3000)]
    lines.append(json.dumps({"prompt_token_ids": p, "max_tokens": 12, "ignore_eos": True, "temperature": 0}))
    s = [rng.randrange(V) for _ in range(rng.randrange(1, 301))]
    lines.append(json.dumps({"prompt_token_ids": s, "max_tokens": 12, "ignore_eos": True, "temperature": 0}))
open(f"{tmp}/in.jsonl", "w").write("\n".join(lines) + "\n")
bad = list(lines)
bad.insert(3, json.dumps({"prompt_token_ids": [1] * 3500, "max_tokens": 12}))    # over the pool
bad.insert(7, json.dumps({"prompt_token_ids": [1, 2, 3], "min_tokens": 4}))      # refused field
bad.insert(11, '{"prompt_token_ids": [1, 2, 3], ')                                 # not JSON
bad.insert(15, json.dumps({"prompt_token_ids": [4294967400], "max_tokens": 1}))  # id out of range
open(f"{tmp}/bad.jsonl", "w").write("\n".join(bad) + "\n")
PY

TIGHT=(--max-num-batched-tokens 256 --max-num-seqs 16 --kv-cache-memory 0.004)
"$BIN" generate --model "$MODEL" --input "$TMP/in.jsonl" --output "$TMP/tight.jsonl" "${TIGHT[@]}" 2>"$TMP/tight.err" ||
  fail "tight run: $(cat "$TMP/tight.err")"
grep -q '27 pages x 128 tokens = 3456 tokens' "$TMP/tight.err" || fail "pool: $(cat "$TMP/tight.err")"
"$BIN" generate --model "$MODEL" --input "$TMP/in.jsonl" --output "$TMP/roomy.jsonl" 2>"$TMP/roomy.err" ||
  fail "roomy run: $(cat "$TMP/roomy.err")"
"$BIN" generate --model "$MODEL" --input "$TMP/bad.jsonl" --output "$TMP/bad.out.jsonl" "${TIGHT[@]}" 2>"$TMP/bad.err" ||
  fail "run with bad lines: $(cat "$TMP/bad.err")"
grep -q '4 of 28 requests failed' "$TMP/bad.err" || fail "failure summary: $(cat "$TMP/bad.err")"

python3 - "$TMP" <<'PY' || fail "outputs differ"
import json, sys
tmp = sys.argv[1]
read = lambda f: [json.loads(l) for l in open(f"{tmp}/{f}")]
tight, roomy, bad = read("tight.jsonl"), read("roomy.jsonl"), read("bad.out.jsonl")
ok = True
assert len(tight) == len(roomy) == 24 and len(bad) == 28
for i, (t, r) in enumerate(zip(tight, roomy)):
    if len(t["token_ids"]) != 12 or t["finish_reason"] != "length" or t["token_ids"] != r["token_ids"]:
        print(f"request {i + 1}: tight {t['token_ids']} ({t['finish_reason']}), roomy {r['token_ids']}")
        ok = False
errors = {3: "--max-model-len is 3456", 7: "min_tokens", 11: "not valid JSON", 15: "out of range"}
good = [b for i, b in enumerate(bad) if i not in errors]
for i, want in errors.items():
    if want not in bad[i].get("error", ""):
        print(f"line {i + 1}: expected an error naming {want!r}, got {bad[i]}")
        ok = False
for i, (g, t) in enumerate(zip(good, tight)):
    if g.get("token_ids") != t["token_ids"]:
        print(f"request {i + 1} beside the bad lines: {g} vs {t['token_ids']}")
        ok = False
sys.exit(0 if ok else 1)
PY

if "$BIN" generate --model "$MODEL" --input "$TMP/in.jsonl" --output "$TMP/x.jsonl" "${TIGHT[@]}" --max-model-len 4000 \
  2>"$TMP/start.err"; then fail "--max-model-len over the pool accepted"; fi
grep -q -- '--max-model-len 4000 needs 32 KV pages of 128 tokens' "$TMP/start.err" || fail "start: $(cat "$TMP/start.err")"
grep -q -- 'Lower --max-model-len to at most 3456, or raise --kv-cache-memory' "$TMP/start.err" ||
  fail "start fixes: $(cat "$TMP/start.err")"
echo "generate_admission: 24 requests in 27 pages as in a roomy pool; 4 bad lines answered with errors"
