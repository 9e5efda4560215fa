#!/usr/bin/env bash
# make-model --layout m31-mxfp4 (the M3.1 plan as an AMD Quark OCP-MXFP4 export) end to end: reproducible
# output with Quark's config keys and tensor names, `generate` runs on it (greedy, the same text under the
# avx2 and avx512 kernels, which give the same bits), the W4A4 default is reported, --mxfp4-activations fp32
# moves the logits (exact activations), a bad value is refused naming the flag, and mxfp4 on a checkpoint
# without MXFP4 matrices says it has no effect.
# Usage: make_model_mxfp4.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP"
fail() { echo "FAIL: $*" >&2; exit 1; }

for run in a b; do
  "$BIN" make-model --layout m31-mxfp4 --preset tiny --seed 7 --out "$TMP/mx.$run" 2>/dev/null ||
    fail "make-model --layout m31-mxfp4 exited non-zero"
done
for f in config.json model.safetensors tokenizer.json; do
  cmp -s "$TMP/mx.a/$f" "$TMP/mx.b/$f" || fail "$f differs between two runs with the same seed"
done
grep -q '"quant_method": "quark"' "$TMP/mx.a/config.json" || fail "config: quant_method"
grep -q '"scale_format": "e8m0"' "$TMP/mx.a/config.json" || fail "config: scale_format"
grep -q '"exclude"' "$TMP/mx.a/config.json" || fail "config: exclude"
grep -q 'experts.0.w1.weight_scale' "$TMP/mx.a/model.safetensors" || fail "no MXFP4 expert scales"
grep -q 'weight_packed\|weight_scale_inv' "$TMP/mx.a/model.safetensors" && fail "NVFP4 / MXFP8 tensors in the MXFP4 layout"

out=$("$BIN" generate --model "$TMP/mx.a" --prompt "hello world" --max-tokens 16 --temperature 0 2>"$TMP/g.err") ||
  fail "generate: $(cat "$TMP/g.err")"
[ -n "$out" ] || fail "generate wrote no text"
grep -q "MXFP4 activations: dynamic MXFP4 per 32 elements" "$TMP/g.err" || fail "W4A4 not reported: $(cat "$TMP/g.err")"
if grep -q avx512 /proc/cpuinfo && M3_ISA=avx512 "$BIN" generate --model "$TMP/mx.a" --prompt "x" --max-tokens 1 >/dev/null 2>&1; then
  a=$(M3_ISA=avx2 "$BIN" generate --model "$TMP/mx.a" --prompt "hello world" --max-tokens 16 --temperature 0 2>/dev/null)
  b=$(M3_ISA=avx512 "$BIN" generate --model "$TMP/mx.a" --prompt "hello world" --max-tokens 16 --temperature 0 2>/dev/null)
  [ "$a" = "$b" ] || fail "avx2 and avx512 kernels gave different greedy text: '$a' vs '$b'"
fi

echo "1 2 3 4 5 6 7 8 9 10 11 12" >"$TMP/toks.txt"
"$BIN" logits --model "$TMP/mx.a" --tokens "$TMP/toks.txt" --out "$TMP/l.w4a4" 2>/dev/null || fail "logits (W4A4)"
"$BIN" logits --model "$TMP/mx.a" --tokens "$TMP/toks.txt" --out "$TMP/l.mx" --mxfp4-activations mxfp4 2>/dev/null ||
  fail "logits --mxfp4-activations mxfp4"
"$BIN" logits --model "$TMP/mx.a" --tokens "$TMP/toks.txt" --out "$TMP/l.fp32" --mxfp4-activations fp32 \
  2>"$TMP/fp32.err" || fail "logits --mxfp4-activations fp32: $(cat "$TMP/fp32.err")"
cmp -s "$TMP/l.w4a4" "$TMP/l.mx" || fail "auto is not the checkpoint's W4A4 scheme"
cmp -s "$TMP/l.w4a4" "$TMP/l.fp32" && fail "--mxfp4-activations fp32 left the logits bit-identical"
grep -q "MXFP4 activations" "$TMP/fp32.err" && fail "fp32 activations reported as MXFP4: $(cat "$TMP/fp32.err")"
if "$BIN" generate --model "$TMP/mx.a" --prompt "hello" --mxfp4-activations int4 >/dev/null 2>"$TMP/bad.err"; then
  fail "--mxfp4-activations int4 accepted"
fi
grep -q "mxfp4-activations" "$TMP/bad.err" || fail "bad --mxfp4-activations: message does not name the flag"
"$BIN" make-model --layout m31 --preset tiny --seed 7 --out "$TMP/m31" 2>/dev/null
"$BIN" generate --model "$TMP/m31" --prompt "hello" --max-tokens 2 --mxfp4-activations mxfp4 >/dev/null \
  2>"$TMP/none.err" || fail "mxfp4 activations on an m31 checkpoint failed"
grep -q "mxfp4-activations mxfp4: no effect" "$TMP/none.err" || fail "no notice on m31: $(cat "$TMP/none.err")"
echo "make_model_mxfp4.sh: OK"
