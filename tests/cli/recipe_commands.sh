#!/usr/bin/env bash
# Every `vllm serve` command line of the vLLM recipe for MiniMax-M3.1-Flash (tests/data/recipe, a copy
# of the recipe's JSON: its recommended command, the runbook's commands, and each per-hardware,
# per-feature and per-preset argument list appended to the recommended command, as the recipe's
# builder composes them) starts `m3serve serve` verbatim, the Hugging Face id found offline in a cache
# that holds the tiny checkpoint (as after `huggingface-cli download`): the server reaches "listening" (GPU-only options are accepted and reported, never an error), and an
# option given twice takes its last value as in vLLM. A tiny M3.1 checkpoint with a DSpark draft stands
# in for the real one; the port is 0 and the KV cache small. Each server is killed once it listens.
# Usage: recipe_commands.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP"
fail() { echo "FAIL: $*" >&2; [ -f "$TMP/server.log" ] && { echo "--- server log:" >&2; cat "$TMP/server.log" >&2; }; exit 1; }
. "$(dirname "$0")/lib/server_port.sh"

"$BIN" make-model --layout m31 --preset tiny --seed 3 --dspark-layers 1 --out "$TMP/model" 2>/dev/null
cp "$DATA/chat/MiniMax-M3.jinja" "$TMP/model/chat_template.jinja"
commit=0123456789abcdef0123456789abcdef01234567
hf=$TMP/hf/models--MiniMaxAI--MiniMax-M3.1-Flash
mkdir -p "$hf/snapshots" "$hf/refs"
ln -s "$TMP/model" "$hf/snapshots/$commit"
echo -n $commit >"$hf/refs/main"
export HF_HUB_OFFLINE=1 HF_HUB_CACHE=$TMP/hf

# One shell-quoted argument list per line (the arguments after `vllm serve`).
python3 - "$DATA/recipe/MiniMax-M3.1-Flash.recipe.json" >"$TMP/commands.txt" <<'PY'
import json, re, shlex, sys
recipe = json.load(open(sys.argv[1]))
base = recipe["recommended_command"]["argv"][2:]  # after "vllm serve"
out = []
def add(args):
    if args not in out:
        out.append(args)
add(base)
def walk(o):
    if isinstance(o, dict):
        for k, v in o.items():
            if k in ("args", "extra_args") and isinstance(v, list) and v and all(isinstance(x, str) for x in v):
                add(base + v)
            elif k == "json_args" and isinstance(v, dict):
                args = []
                for flag, val in v.items():
                    args += [flag, json.dumps(val)]
                add(base + args)
            elif isinstance(v, str) and "vllm serve " in v:
                text = v.replace("\\\n", " ")
                for m in re.finditer(r"vllm serve ([\w./-]+)(?=[ \n])([^\n`]*)", text):
                    try:
                        add([m.group(1)] + shlex.split(m.group(2)))
                    except ValueError:
                        pass  # a fragment cut by the markdown (an unclosed quote): not a command
            walk(v)
    elif isinstance(o, list):
        for x in o:
            walk(x)
walk(recipe)
for args in out:
    print(shlex.join(args))
PY
n=$(wc -l <"$TMP/commands.txt")
[ "$n" -ge 30 ] || fail "only $n command lines found in the recipe"

i=0
while IFS= read -r line; do
  i=$((i + 1))
  eval "args=($line)"
  for j in "${!args[@]}"; do
    if [ "$j" -gt 0 ] && [ "${args[$((j - 1))]}" = --port ]; then args[$j]=0; fi
  done
  # A `json_args` speculative config carries only the keys it changes; the recipe merges it into the
  # recommended one. Here the last --speculative-config wins, so give it the method it merges into.
  for j in "${!args[@]}"; do
    if [ "${args[$j]}" = --speculative-config ] && ! grep -q '"method"' <<<"${args[$((j + 1))]}"; then
      args[$((j + 1))]=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.setdefault("method","dspark"); d.setdefault("num_speculative_tokens",7); print(json.dumps(d))' "${args[$((j + 1))]}")
    fi
    # Likewise a --kv-transfer-config of extra keys merges into the preset's host-memory offload connector.
    if [ "${args[$j]}" = --kv-transfer-config ] && ! grep -q '"kv_connector"' <<<"${args[$((j + 1))]}"; then
      args[$((j + 1))]=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.setdefault("kv_connector","SimpleCPUOffloadConnector"); d.setdefault("kv_role","kv_both"); print(json.dumps(d))' "${args[$((j + 1))]}")
    fi
  done
  # The recipe serves --max-model-len 1048576: one sequence of that length must fit the pool (checked at
  # start, as vLLM does), about 0.5 GiB of KV for the tiny model (more with the draft's).
  # The previous command's log goes first: its "listening" line must not pass for this server's.
  rm -f "$TMP/server.log"
  "$BIN" serve "${args[@]}" --port 0 --kv-cache-memory 1 >"$TMP/server.log" 2>&1 &
  PID=$!
  wait_server_port "$TMP/server.log" $PID
  kill -9 $PID 2>/dev/null || true
  wait $PID 2>/dev/null || true
  if grep -q 'error' "$TMP/server.log"; then fail "command $i: $line"; fi
  grep -q 'MODEL MiniMaxAI/MiniMax-M3.1-Flash: .*(HF cache' "$TMP/server.log" || fail "command $i: the id was not found in the cache"
  # SimpleCPUOffloadConnector is the host KV tier here (capped to this host's memory, said at start).
  if grep -q 'SimpleCPUOffloadConnector' <<<"${args[*]}"; then
    grep -q 'KV tier memory' "$TMP/server.log" || fail "command $i: SimpleCPUOffloadConnector gave no host KV tier"
  fi
done <"$TMP/commands.txt"
[ "$i" = "$n" ] || fail "ran $i of $n commands"

# The recommended command itself reports its GPU-only options, the recipe's attention-config keys included.
"$BIN" serve "$TMP/model" --port 0 --kv-cache-memory 0.05 --tensor-parallel-size 8 \
  --attention-config '{"indexer_kv_dtype": "nvfp4", "use_prefill_query_quantization": true}' >"$TMP/server.log" 2>&1 &
PID=$!
wait_server_port "$TMP/server.log" $PID
kill -9 $PID 2>/dev/null || true
wait $PID 2>/dev/null || true
grep -q 'not applicable on this build.*--tensor-parallel-size 8.*--attention-config use_prefill_query_quantization' \
  "$TMP/server.log" || fail "ignored attention-config key not reported"
grep -q 'index-K nvfp4' "$TMP/server.log" || fail "indexer_kv_dtype not applied"

# A non-boolean value of a boolean key, and an unknown key, are refused by name.
if "$BIN" serve "$TMP/model" --port 0 --attention-config '{"use_prefill_query_quantization": "yes"}' 2>"$TMP/bad.err"; then
  fail "non-boolean use_prefill_query_quantization accepted"
fi
grep -q 'use_prefill_query_quantization must be true or false' "$TMP/bad.err" || fail "bad value not named: $(cat "$TMP/bad.err")"
if "$BIN" serve "$TMP/model" --port 0 --attention-config '{"no_such_key": 1}' 2>"$TMP/bad.err"; then
  fail "unknown attention-config key accepted"
fi
grep -q 'unknown key "no_such_key"' "$TMP/bad.err" || fail "unknown key not named: $(cat "$TMP/bad.err")"

# An option given twice takes its last value (vLLM's argparse), list options keep every value.
"$BIN" serve "$TMP/model" --port 0 --kv-cache-memory 0.05 --kv-cache-dtype fp8 --kv-cache-dtype nvfp4 \
  --served-model-name a b --numa-bind-nodes 0 0 1 1 >"$TMP/server.log" 2>&1 &
PID=$!
trap 'kill -9 $PID 2>/dev/null || true' EXIT
wait_server_health "$TMP/server.log" $PID
grep -q 'kv nvfp4' "$TMP/server.log" || fail "the last --kv-cache-dtype did not win"
models=$(curl -s "$U/v1/models")
grep -q '"id":"a"' <<<"$models" && grep -q '"id":"b"' <<<"$models" || fail "served names: $models"
echo "recipe_commands: $n recipe command lines start the server"
