#!/usr/bin/env bash
# make-model end to end: every layout with the tiny preset writes the full HF file set, and the
# output is byte-identical across runs with the same seed (and differs for another seed).
# Usage: make_model.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP"
fail() { echo "FAIL: $*" >&2; exit 1; }

for layout in m3-bf16 m3-mxfp8 m31; do
  for run in a b; do
    "$BIN" make-model --layout "$layout" --preset tiny --seed 7 --out "$TMP/$layout.$run" 2>/dev/null ||
      fail "make-model --layout $layout exited non-zero"
  done
  for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json \
           special_tokens_map.json; do
    [ -s "$TMP/$layout.a/$f" ] || fail "$layout: missing $f"
    cmp -s "$TMP/$layout.a/$f" "$TMP/$layout.b/$f" || fail "$layout: $f differs between two runs with the same seed"
  done
  grep -q '"model_type": "minimax_m3_vl"' "$TMP/$layout.a/config.json" || fail "$layout: config.json model_type"
done
grep -q quantization_config "$TMP/m3-bf16.a/config.json" && fail "m3-bf16 must not have quantization_config"
grep -q '"moe_quant_format": "nvfp4-pack-quantized"' "$TMP/m31.a/config.json" || fail "m31: quantization_config"
grep -q weight_packed "$TMP/m31.a/model.safetensors" || fail "m31: no NVFP4 expert tensors"
grep -q 'weight_scale_inv' "$TMP/m3-mxfp8.a/model.safetensors" || fail "m3-mxfp8: no MXFP8 scales"

# Another seed gives other weights.
"$BIN" make-model --layout m31 --preset tiny --seed 8 --out "$TMP/m31.seed8" 2>/dev/null
cmp -s "$TMP/m31.a/model.safetensors" "$TMP/m31.seed8/model.safetensors" && fail "seed 8 gave the same weights as seed 7"

# Sharded output: index + shards, reproducible, and the same tensors as the single file.
for run in a b; do
  "$BIN" make-model --layout m31 --preset tiny --seed 7 --shards 2 --out "$TMP/m31s.$run" 2>/dev/null
done
for f in model-00001-of-00002.safetensors model-00002-of-00002.safetensors model.safetensors.index.json; do
  [ -s "$TMP/m31s.a/$f" ] || fail "sharded: missing $f"
  cmp -s "$TMP/m31s.a/$f" "$TMP/m31s.b/$f" || fail "sharded: $f differs between runs"
done
[ -e "$TMP/m31s.a/model.safetensors" ] && fail "sharded: unexpected model.safetensors"
grep -q '"total_size"' "$TMP/m31s.a/model.safetensors.index.json" || fail "sharded: index lacks total_size"

# Size flags override the preset; bad combinations are rejected with a message.
"$BIN" make-model --layout m3-bf16 --preset tiny --hidden 128 --layers 2 --experts 4 --vocab 600 \
  --out "$TMP/custom" 2>/dev/null || fail "custom sizes"
grep -q '"hidden_size": 128' "$TMP/custom/config.json" || fail "custom: hidden_size"
grep -q '"vocab_size": 600' "$TMP/custom/config.json" || fail "custom: vocab_size"
if "$BIN" make-model --layout m31 --preset tiny --index-heads 3 --out "$TMP/bad" 2>"$TMP/bad.err"; then
  fail "--index-heads != --kv-heads accepted"
fi
grep -q "index-heads" "$TMP/bad.err" || fail "error message does not name --index-heads"

# --dspark-layers writes a random draft in the dspark/ layout that the engine loads; greedy output is
# the same with and without speculation.
"$BIN" make-model --layout m31 --preset tiny --dspark-layers 2 --out "$TMP/ds" 2>/dev/null || fail "--dspark-layers"
grep -q '"dspark_block_size": 7' "$TMP/ds/dspark/config.json" || fail "dspark config"
a=$("$BIN" generate --model "$TMP/ds" --prompt "hello world" --max-tokens 24 --temperature 0 2>/dev/null)
b=$("$BIN" generate --model "$TMP/ds" --prompt "hello world" --max-tokens 24 --temperature 0 \
  --speculative-config '{"method":"dspark","num_speculative_tokens":5}' 2>"$TMP/ds.err")
[ "$a" = "$b" ] || fail "greedy output differs with the random draft"
grep -q "acceptance length" "$TMP/ds.err" || fail "no speculative summary: $(cat "$TMP/ds.err")"
# The random draft has a confidence head: adaptive verification runs with it, greedy output unchanged.
grep -q '"enable_confidence_head": true' "$TMP/ds/dspark/config.json" || fail "dspark config: no confidence head"
c=$("$BIN" generate --model "$TMP/ds" --prompt "hello world" --max-tokens 24 --temperature 0 \
  --speculative-config '{"method":"dspark","num_speculative_tokens":5,"enable_adaptive_verification":true}' 2>"$TMP/dsc.err")
[ "$a" = "$c" ] || fail "greedy output differs with adaptive verification: $(cat "$TMP/dsc.err")"
grep -q "confidence head says" "$TMP/dsc.err" || fail "adaptive verification not reported: $(cat "$TMP/dsc.err")"

# --nvfp4-activations int8 (opt-in int8 activations): reported on an NVFP4 checkpoint, "no effect" on
# a BF16 one; a bad value is rejected naming the flag.
"$BIN" generate --model "$TMP/m31.a" --prompt "hello" --max-tokens 4 --temperature 0 --nvfp4-activations int8 \
  >/dev/null 2>"$TMP/i8.err" || fail "generate --nvfp4-activations int8: $(cat "$TMP/i8.err")"
grep -q "NVFP4 matrices use int8 activations" "$TMP/i8.err" || fail "int8 activations not reported: $(cat "$TMP/i8.err")"
"$BIN" generate --model "$TMP/m3-bf16.a" --prompt "hello" --max-tokens 2 --nvfp4-activations int8 \
  >/dev/null 2>"$TMP/i8b.err" || fail "int8 on a BF16 checkpoint failed"
grep -q "no effect" "$TMP/i8b.err" || fail "int8 on a BF16 checkpoint: no notice"
# BF16 activations (--mxfp8-activations bf16, --nvfp4-activations bf16): both reported on an M3.1
# checkpoint (with the kernels they run on), "no effect" on a BF16 one; the logits move (not the exact
# path); a bad value is rejected naming the flag.
"$BIN" generate --model "$TMP/m31.a" --prompt "hello" --max-tokens 4 --temperature 0 --nvfp4-activations bf16 \
  --mxfp8-activations bf16 >/dev/null 2>"$TMP/b16.err" || fail "generate with BF16 activations: $(cat "$TMP/b16.err")"
grep -q "MXFP8 matrices use BF16 activations" "$TMP/b16.err" || fail "MXFP8 bf16 not reported: $(cat "$TMP/b16.err")"
grep -q "NVFP4 matrices use BF16 activations" "$TMP/b16.err" || fail "NVFP4 bf16 not reported: $(cat "$TMP/b16.err")"
grep -Eq "BF16 dot products|no AVX512-BF16" "$TMP/b16.err" || fail "bf16: kernels not said: $(cat "$TMP/b16.err")"
"$BIN" generate --model "$TMP/m3-bf16.a" --prompt "hello" --max-tokens 2 --mxfp8-activations bf16 \
  >/dev/null 2>"$TMP/b16b.err" || fail "bf16 on a BF16 checkpoint failed"
grep -q "no effect" "$TMP/b16b.err" || fail "bf16 on a BF16 checkpoint: no notice"
echo "1 2 3 4 5 6 7 8 9 10 11 12" >"$TMP/toks.txt"
"$BIN" logits --model "$TMP/m31.a" --tokens "$TMP/toks.txt" --out "$TMP/l.exact" 2>/dev/null || fail "logits (exact)"
"$BIN" logits --model "$TMP/m31.a" --tokens "$TMP/toks.txt" --out "$TMP/l.bf16" --mxfp8-activations bf16 \
  --nvfp4-activations bf16 2>/dev/null || fail "logits with BF16 activations"
[ "$(stat -c %s "$TMP/l.exact")" = "$(stat -c %s "$TMP/l.bf16")" ] || fail "BF16 activations: logits of another size"
cmp -s "$TMP/l.exact" "$TMP/l.bf16" && fail "BF16 activations left the logits bit-identical"
if "$BIN" generate --model "$TMP/m31.a" --prompt "hello" --mxfp8-activations int8 >/dev/null 2>"$TMP/b16c.err"; then
  fail "--mxfp8-activations int8 accepted"
fi
grep -q "mxfp8-activations" "$TMP/b16c.err" || fail "bad --mxfp8-activations: message does not name the flag"
# Weights read into memory (--no-mmap; the default for a checkpoint this small; matrices then in
# 4-row tiles) or mapped (--mmap): bit-identical logits over a sharded checkpoint, each reported; the
# two flags together are refused.
"$BIN" logits --model "$TMP/m31s.a" --tokens "$TMP/toks.txt" --out "$TMP/l.mmap" --mmap 2>"$TMP/mm.err" ||
  fail "logits --mmap: $(cat "$TMP/mm.err")"
grep -q "weights:" "$TMP/mm.err" && fail "--mmap: unexpected weights notice: $(cat "$TMP/mm.err")"
"$BIN" logits --model "$TMP/m31s.a" --tokens "$TMP/toks.txt" --out "$TMP/l.ram" --no-mmap 2>"$TMP/nm.err" ||
  fail "logits --no-mmap: $(cat "$TMP/nm.err")"
"$BIN" logits --model "$TMP/m31s.a" --tokens "$TMP/toks.txt" --out "$TMP/l.auto" 2>"$TMP/auto.err" ||
  fail "logits (default): $(cat "$TMP/auto.err")"
for f in l.mmap l.ram l.auto; do [ -s "$TMP/$f" ] || fail "logits wrote no $f"; done
cmp -s "$TMP/l.mmap" "$TMP/l.ram" || fail "--no-mmap changed the logits"
cmp -s "$TMP/l.mmap" "$TMP/l.auto" || fail "the default weight memory changed the logits"
grep -Eq "weights: read [0-9.]+ MB into memory" "$TMP/nm.err" || fail "--no-mmap notice: $(cat "$TMP/nm.err")"
# in memory the matrices are rewritten into 4-row tiles for decode (and the logits above still match)
grep -Eq " [1-9][0-9]* matrices in 4-row tiles for decode" "$TMP/nm.err" || fail "--no-mmap: no tiling: $(cat "$TMP/nm.err")"
if grep -Eqs '\[(always|madvise)\]' /sys/kernel/mm/transparent_hugepage/enabled; then
  grep -Eq "weights: read [0-9.]+ MB into memory" "$TMP/auto.err" || fail "default: not read into memory: $(cat "$TMP/auto.err")"
else  # without transparent huge pages the default keeps the mapping and says why
  grep -q "transparent huge pages are off" "$TMP/auto.err" || fail "default without THP: $(cat "$TMP/auto.err")"
fi
if "$BIN" logits --model "$TMP/m31s.a" --tokens "$TMP/toks.txt" --out "$TMP/l.x" --mmap --no-mmap 2>"$TMP/both.err"; then
  fail "--mmap --no-mmap accepted"
fi
grep -q "contradict" "$TMP/both.err" || fail "--mmap --no-mmap: message $(cat "$TMP/both.err")"

if "$BIN" generate --model "$TMP/m31.a" --prompt "hello" --nvfp4-activations int4 >/dev/null 2>"$TMP/i8c.err"; then
  fail "--nvfp4-activations int4 accepted"
fi
grep -q "nvfp4-activations" "$TMP/i8c.err" || fail "bad --nvfp4-activations: message does not name the flag"
echo "make_model.sh: OK"
