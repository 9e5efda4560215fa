#!/usr/bin/env bash
# CLI round trip for `m3serve tokenize` / `detokenize` with the tiny m3 tokenizer:
# text -> ids -> text must give back the text exactly, for --text/--ids and for --jsonl files.
# Usage: tokenize.sh <m3serve-binary> <tests/data> <tmpdir>
set -euo pipefail
bin=$1; data=$2; tmp=$3
model="$data/tokenizer/m3-tiny"
mkdir -p "$tmp"
fail() { echo "FAIL: $*" >&2; exit 1; }

# 1. One string on the command line (detokenize prints the text plus one newline).
text=$'Hello ]~!b[world 日本語 🤖 a/b\n-->/  tabs\there'
ids=$("$bin" tokenize --model "$model" --text "$text")
[[ $ids == \[*\] ]] || fail "tokenize output is not a JSON array: $ids"
"$bin" detokenize --model "$model" --ids "$ids" > "$tmp/out.txt"
printf '%s\n' "$text" > "$tmp/want.txt"
cmp -s "$tmp/out.txt" "$tmp/want.txt" || fail "--text/--ids round trip differs: $(cat "$tmp/out.txt")"
# The special token is parsed by default and kept as text with --no-special.
[[ $ids == *420* ]] || fail "special token ]~!b[ (420) not found in $ids"
ids_plain=$("$bin" tokenize --model "$model" --no-special --text "$text")
[[ $ids_plain != *420* ]] || fail "--no-special still produced id 420: $ids_plain"
# --skip-special drops it.
skipped=$("$bin" detokenize --model "$model" --skip-special --ids "$ids")
[[ $skipped == "Hello world"* ]] || fail "--skip-special gave: $skipped"

# 2. JSON-lines: one JSON string per line in, one array per line out, and back.
cat > "$tmp/in.jsonl" <<'JSONL'
"plain text"
"line\nbreaks\r\n and   spaces "
"[e~[<think>x</think>"
"emoji 👨‍👩‍👧 and CJK 中文"
""
JSONL
"$bin" tokenize --model "$model" --jsonl "$tmp/in.jsonl" > "$tmp/ids.jsonl"
[[ $(wc -l < "$tmp/ids.jsonl") -eq 5 ]] || fail "expected 5 lines of ids"
"$bin" detokenize --model "$model" --jsonl "$tmp/ids.jsonl" > "$tmp/back.jsonl"
cmp -s "$tmp/in.jsonl" "$tmp/back.jsonl" || { diff "$tmp/in.jsonl" "$tmp/back.jsonl" >&2; fail "--jsonl round trip differs"; }

# 3. Errors exit non-zero with a message.
if "$bin" detokenize --model "$model" --ids "[999999]" 2> "$tmp/err.txt"; then fail "unknown id accepted"; fi
grep -q "999999" "$tmp/err.txt" || fail "error does not name the id: $(cat "$tmp/err.txt")"
if "$bin" tokenize --model "$tmp/nowhere" --text x 2> "$tmp/err.txt"; then fail "missing model dir accepted"; fi
grep -q "tokenizer.json" "$tmp/err.txt" || fail "error does not name tokenizer.json"
if "$bin" tokenize --model "$model" 2> /dev/null; then fail "missing --text/--jsonl accepted"; fi
echo "tokenize.sh: OK"
