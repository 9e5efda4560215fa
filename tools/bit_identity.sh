#!/usr/bin/env bash
# Byte-compares two m3serve builds under every kernel ISA (M3_ISA=generic, avx2, avx512): `logits`
# (prefill and one-token decode; exact, int8 and bf16 activations) on the golden tiny checkpoints and
# the demo model, and greedy `generate` output with BF16 / FP8 / NVFP4 KV and index-key caches. For
# changes that must not move a bit (restructuring, kernel moves). Exit status 1 when any case differs.
# Usage: tools/bit_identity.sh OLD_M3SERVE NEW_M3SERVE [workdir]
set -uo pipefail
OLD=$1
NEW=$2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=${3:-/tmp/m3-bit-identity}
G=$ROOT/tests/data/golden
DEMO=$ROOT/models/demo
mkdir -p "$W"
# Demo-model token files: the first held-out tokens (a long prefill, a short decode).
head -c 2000 "$ROOT/tests/data/demo/heldout_tokens.txt" | awk '{$NF=""; print}' >"$W/demo_tok.txt"
head -c 300 "$ROOT/tests/data/demo/heldout_tokens.txt" | awk '{$NF=""; print}' >"$W/demo_tok_short.txt"
fail=0
n=0
compare() {  # compare NAME ISA EXT: both outputs present, non-empty and byte-identical
  n=$((n + 1))
  if [ -s "$W/old.$1.$2.$3" ] && cmp -s "$W/old.$1.$2.$3" "$W/new.$1.$2.$3"; then
    echo "identical $1 $2"
  else
    echo "DIFFER $1 $2"
    fail=1
  fi
}
logits() {  # logits NAME MODEL TOKENS [flags...]
  local name=$1 model=$2 tok=$3
  shift 3
  for isa in generic avx2 avx512; do
    for v in old new; do
      bin=$OLD
      [ $v = new ] && bin=$NEW
      M3_ISA=$isa "$bin" logits --model "$model" --tokens "$tok" --out "$W/$v.$name.$isa.f32" "$@" >/dev/null 2>&1
    done
    compare "$name" $isa f32
  done
}
gen() {  # gen NAME MODEL [flags...]
  local name=$1 model=$2
  shift 2
  for isa in generic avx2 avx512; do
    for v in old new; do
      bin=$OLD
      [ $v = new ] && bin=$NEW
      M3_ISA=$isa "$bin" generate --model "$model" --prompt "The quick brown fox jumps over the lazy dog and then" \
        --max-tokens 48 --ignore-eos --temperature 0 --kv-cache-memory 0.25 "$@" >"$W/$v.$name.$isa.txt" 2>/dev/null
    done
    compare "$name" $isa txt
  done
}
logits m3tiny-prefill "$G/m3-tiny/hf" "$G/m3-tiny/tokens_3000.txt"
logits m3tiny-decode "$G/m3-tiny/hf" "$G/m3-tiny/tokens_16.txt" --decode
logits m31tiny-prefill "$G/m31-tiny/hf" "$G/m31-tiny/tokens_3000.txt"
logits m31tiny-decode "$G/m31-tiny/hf" "$G/m31-tiny/tokens_16.txt" --decode
logits m31tiny-int8 "$G/m31-tiny/hf" "$G/m31-tiny/tokens_3000.txt" --nvfp4-activations int8
logits m31tiny-bf16act "$G/m31-tiny/hf" "$G/m31-tiny/tokens_3000.txt" --nvfp4-activations bf16 --mxfp8-activations bf16
logits m31tiny-bf16act-decode "$G/m31-tiny/hf" "$G/m31-tiny/tokens_16.txt" --decode --nvfp4-activations bf16 --mxfp8-activations bf16
logits demo-prefill "$DEMO" "$W/demo_tok.txt"
logits demo-decode "$DEMO" "$W/demo_tok_short.txt" --decode
gen m31-kv-bf16 "$G/m31-tiny/hf"
gen m31-kv-fp8 "$G/m31-tiny/hf" --kv-cache-dtype fp8 --attention-config '{"indexer_kv_dtype": "fp8"}'
gen m31-kv-nvfp4 "$G/m31-tiny/hf" --kv-cache-dtype nvfp4 --attention-config '{"indexer_kv_dtype": "nvfp4"}'
gen demo-kv-fp8 "$DEMO" --kv-cache-dtype fp8
gen demo-kv-nvfp4 "$DEMO" --kv-cache-dtype nvfp4 --attention-config '{"indexer_kv_dtype": "nvfp4"}'
echo "bit_identity: $n cases, $([ $fail = 0 ] && echo all identical || echo SOME DIFFER)"
exit $fail
