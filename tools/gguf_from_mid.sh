#!/usr/bin/env bash
# Reproduces the llama.cpp GGUFs of a make-model checkpoint (docs/benchmarks.md 3.11): a BF16 GGUF written
# by tools/gguf_from_mid.py with the gguf-py of the given llama.cpp checkout, then llama-quantize to Q8_0
# (the peer of m3serve's MXFP8 layout) and MXFP4_MOE (MXFP4 experts, Q8_0 elsewhere: the peer of m31).
# llama.cpp is a measurement peer kept outside the project; nothing here builds it.
#
# Usage: tools/gguf_from_mid.sh LLAMA_CPP_DIR BF16_CHECKPOINT OUT_DIR [LLAMA_BUILD_DIR]
#   LLAMA_CPP_DIR    a llama.cpp checkout (gguf-py/ is read from it)
#   BF16_CHECKPOINT  `m3serve make-model --layout m3-bf16 --preset mid --out DIR` (same --seed as the
#                    m3-mxfp8 / m31 checkpoints m3serve runs: make-model quantises every layout from the
#                    same BF16 master, so the GGUFs hold the same weights)
#   OUT_DIR          receives mid-bf16.gguf, mid-q8_0.gguf, mid-mxfp4_moe.gguf
#   LLAMA_BUILD_DIR  where bin/llama-quantize is (default LLAMA_CPP_DIR/build)
# Environment: PYTHON (default /usr/bin/python3 when present: Debian's python3-numpy lives there).
set -euo pipefail

[ $# -ge 3 ] || { sed -n '7,14p' "$0" >&2; exit 2; }
LLAMA=$1 MODEL=$2 OUT=$3 BUILD=${4:-$1/build}
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  [ -x /usr/bin/python3 ] && PYTHON=/usr/bin/python3
fi

[ -d "$LLAMA" ] || { echo "gguf_from_mid: llama.cpp checkout '$LLAMA' does not exist" >&2; exit 1; }
[ -f "$LLAMA/gguf-py/gguf/__init__.py" ] || { echo "gguf_from_mid: '$LLAMA' is not a llama.cpp checkout (no gguf-py/gguf)" >&2; exit 1; }
QUANT=$BUILD/bin/llama-quantize
[ -x "$QUANT" ] || { echo "gguf_from_mid: no llama-quantize at '$QUANT' (cmake --build $BUILD --target llama-quantize)" >&2; exit 1; }
[ -f "$MODEL/config.json" ] || { echo "gguf_from_mid: '$MODEL' is not a checkpoint directory (no config.json)" >&2; exit 1; }
"$PYTHON" -c 'import numpy' 2>/dev/null || { echo "gguf_from_mid: $PYTHON has no numpy (apt-get install python3-numpy)" >&2; exit 1; }
mkdir -p "$OUT"

"$PYTHON" "$HERE/gguf_from_mid.py" --model "$MODEL" --llama-cpp "$LLAMA" --out "$OUT/mid-bf16.gguf"
"$QUANT" "$OUT/mid-bf16.gguf" "$OUT/mid-q8_0.gguf" Q8_0 > "$OUT/quantize-q8_0.log" 2>&1 \
  || { tail -20 "$OUT/quantize-q8_0.log" >&2; exit 1; }
"$QUANT" "$OUT/mid-bf16.gguf" "$OUT/mid-mxfp4_moe.gguf" MXFP4_MOE > "$OUT/quantize-mxfp4_moe.log" 2>&1 \
  || { tail -20 "$OUT/quantize-mxfp4_moe.log" >&2; exit 1; }
for f in q8_0 mxfp4_moe; do
  echo "gguf_from_mid: $OUT/mid-$f.gguf: $(grep -h 'model size\|quant size' "$OUT/quantize-$f.log" | tr -s ' ' | paste -sd' ')"
done
