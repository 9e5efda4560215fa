#!/usr/bin/env bash
# Structured outputs end to end: one request of 128 tokens (temperature 1, seed 1, ignore_eos) through
# `m3serve generate --input`, free against a small and a large JSON schema (the two schemas of
# src/bench/micro/structured_bench.cpp), alternated ROUNDS times so the host's noise falls on all three.
# Prints "round variant seconds tokens/s" per run and the median per variant.
# Usage: tools/structured_ab.sh [m3serve] [model] [rounds]   (model e.g. from make-model --preset mid)
set -euo pipefail
BIN=${1:-build/m3serve}
MODEL=${2:?model directory}
ROUNDS=${3:-5}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 - "$TMP" <<'PY'
import json, sys
d = sys.argv[1]
kinds = [{"type": "string", "maxLength": 64}, {"type": "integer", "minimum": -1000, "maximum": 100000},
         {"enum": ["alpha", "beta", "gamma", "delta"]}, {"type": "array", "items": {"$ref": "#/$defs/item"}, "maxItems": 8},
         {"type": "number"}, {"type": "string", "format": "date-time"}]
large = {"type": "object", "properties": {f"field_{i}": kinds[i % 6] for i in range(60)},
         "required": [f"field_{i}" for i in range(0, 60, 3)],
         "$defs": {"item": {"type": "object", "properties": {"k": {"type": "string"}, "v": {"type": "number"},
                                                             "sub": {"$ref": "#/$defs/item"}}, "required": ["k"]}}}
small = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
         "email": {"type": "string", "format": "email"}}, "required": ["name", "age"]}
base = {"prompt": "hello", "max_tokens": 128, "temperature": 1.0, "seed": 1, "ignore_eos": True}
open(f"{d}/free.jsonl", "w").write(json.dumps(base) + "\n")
open(f"{d}/small.jsonl", "w").write(json.dumps(dict(base, guided_json=small)) + "\n")
open(f"{d}/large.jsonl", "w").write(json.dumps(dict(base, guided_json=large)) + "\n")
PY
for r in $(seq 1 "$ROUNDS"); do
  for v in free small large; do
    line=$("$BIN" generate --model "$MODEL" --input "$TMP/$v.jsonl" --output "$TMP/$v.out" 2>&1 |
      grep -o 'in [0-9.]* s: [0-9.]* output tokens/s')
    echo "$r $v $(echo "$line" | awk '{print $2, $4}')" | tee -a "$TMP/all.txt"
  done
done
for v in free small large; do
  awk -v v="$v" '$2 == v {print $3}' "$TMP/all.txt" | sort -n |
    awk -v v="$v" '{a[NR] = $1} END {m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2;
      printf "%s: median %.2f s for 128 tokens (%.1f ms per step), range %.2f-%.2f s\n", v, m, m / 128 * 1000, a[1], a[NR]}'
done
