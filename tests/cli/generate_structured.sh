#!/usr/bin/env bash
# Structured outputs in `m3serve generate --input` on the demo model (models/demo): request lines
# with response_format (json_schema, json_object), structured_outputs (json, regex, choice), the
# guided_* fields and a GBNF grammar are served by the same parser as the server; every output is
# checked (JSON with the independent validator, tests/tools/ajv; regex, choice and grammar in
# Python). A schema the grammar cannot hold exactly (an overlapping oneOf) and a refused field get
# an {"error": ...} line naming them while the others go on. With DSpark speculation the greedy
# lines come out token for token the same.
# Usage: generate_structured.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP"
fail() { echo "FAIL: $*" >&2; exit 1; }
MODEL="$DATA/../../models/demo"

python3 - "$TMP" <<'PY'
import json, sys
tmp = sys.argv[1]
person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
          "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"],
          "additionalProperties": False}
pets = {"oneOf": [{"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
                   "required": ["kind", "lives"], "additionalProperties": False},
                  {"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"],
                   "additionalProperties": False}]}
base = {"prompt": "Reply with JSON only.\n", "max_tokens": 120, "temperature": 0}
lines = [
    dict(base, response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": person}}),
    dict(base, response_format={"type": "json_object"}, max_tokens=40),  # the demo model rambles in a key: a prefix
    dict(base, structured_outputs={"json": pets}),
    dict(base, guided_json={"type": "array", "items": {"type": "boolean"}, "maxItems": 3}),
    dict(base, prompt="In the beginning", structured_outputs={"regex": "( [a-z]+){2,6}\\."}),
    dict(base, prompt="In the beginning", guided_choice=["God created", "there was light", "nothing"]),
    dict(base, prompt="And God said", guided_grammar='root ::= "Let " word (" " word)* "."\nword ::= [a-z]+'),
    dict(base, prompt="Give a person.", temperature=1.2, seed=5,
         response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": person}}),
    # refused: an overlapping oneOf, a field we do not implement
    dict(base, guided_json={"oneOf": [{"type": "number"}, {"type": "integer"}]}),
    dict(base, guided_regex="[a-z]+", guided_whitespace_pattern="[ ]*"),
]
open(f"{tmp}/in.jsonl", "w").write("\n".join(json.dumps(l) for l in lines) + "\n")
json.dump({"person": person, "pets": pets}, open(f"{tmp}/schemas.json", "w"))
PY

"$BIN" generate --model "$MODEL" --input "$TMP/in.jsonl" --output "$TMP/plain.jsonl" 2>"$TMP/plain.err" ||
  fail "plain run: $(cat "$TMP/plain.err")"
grep -q '2 of 10 requests failed' "$TMP/plain.err" || fail "failure summary: $(cat "$TMP/plain.err")"
"$BIN" generate --model "$MODEL" --input "$TMP/in.jsonl" --output "$TMP/spec.jsonl" \
  --speculative-config '{"method":"dspark","num_speculative_tokens":5}' 2>"$TMP/spec.err" ||
  fail "speculative run: $(cat "$TMP/spec.err")"
grep -q 'speculative: .* accepted' "$TMP/spec.err" || fail "no speculation summary: $(cat "$TMP/spec.err")"

python3 - "$TMP" <<'PY' || fail "outputs"
import json, re, sys
tmp = sys.argv[1]
read = lambda f: [json.loads(l) for l in open(f"{tmp}/{f}")]
plain, spec = read("plain.jsonl"), read("spec.jsonl")
s = json.load(open(f"{tmp}/schemas.json"))
ok = True
def bad(msg):
    global ok
    print(msg)
    ok = False
for i in range(8):
    if i != 1 and plain[i].get("finish_reason") != "stop":
        bad(f"line {i + 1}: did not end by itself: {plain[i]}")
cases = [{"schema": s["person"], "outputs": [plain[0]["text"], plain[7]["text"]]},
         {"schema": s["pets"], "outputs": [plain[2]["text"]]},
         {"schema": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}, "outputs": [plain[3]["text"]]}]
json.dump(cases, open(f"{tmp}/cases.json", "w"))
if not plain[1]["text"].lstrip(" \t\n").startswith("{"): bad(f"json_object: {plain[1]['text']!r}")
if not re.fullmatch(r"( [a-z]+){2,6}\.", plain[4]["text"]): bad(f"regex: {plain[4]['text']!r}")
if plain[5]["text"] not in ("God created", "there was light", "nothing"): bad(f"choice: {plain[5]['text']!r}")
if not re.fullmatch(r"Let [a-z]+( [a-z]+)*\.", plain[6]["text"]): bad(f"grammar: {plain[6]['text']!r}")
if "oneOf' whose branches 0 and 1 may both match" not in plain[8].get("error", ""): bad(f"oneOf line: {plain[8]}")
if "guided_whitespace_pattern" not in plain[9].get("error", ""): bad(f"refused field line: {plain[9]}")
for i in range(10):
    if i == 7: continue  # sampled: same law, not the same draws
    if plain[i].get("token_ids") != spec[i].get("token_ids") or plain[i].get("error") != spec[i].get("error"):
        bad(f"line {i + 1}: speculation changed the output: {plain[i]} vs {spec[i]}")
sys.exit(0 if ok else 1)
PY

AJV="$DATA/../tools/ajv"
if node --version >/dev/null 2>&1 && [ -d "$AJV/node_modules/ajv" ]; then
  node "$AJV/validate.js" "$TMP/cases.json" >"$TMP/ajv.out" 2>&1 || fail "ajv: $(cat "$TMP/ajv.out")"
else
  python3 "$AJV/validate.py" "$TMP/cases.json" >"$TMP/ajv.out" 2>&1 || fail "jsonschema: $(cat "$TMP/ajv.out")"
fi
echo "generate_structured: 8 constrained lines valid (json_object: a prefix) ($(tail -1 "$TMP/ajv.out")), 2 refused by name, greedy lines unchanged under speculation"
