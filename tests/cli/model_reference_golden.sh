#!/usr/bin/env bash
# Proves tests/tools/model_reference.py (the float64 PyTorch text model the vision logits test relies
# on) against the golden float64 NumPy logits of an independent implementation: the first 300 tokens of
# m3-tiny-topk2 (BF16, MSA selection decides from position 256 on) and of m31-tiny (MXFP8 + NVFP4
# experts, every layer sparse, init block 1; selection from 384 on, so here only the init/local forcing
# and the 300-token prefix). Both sides are float64 rounded to float32, so the tolerance is 1e-5 max-abs
# with every argmax equal (measured: 0 and 2.3e-13; on all 3000 tokens 0, 0 and 7.3e-12). The
# reference's routing and block-selection margins must equal the golden margins files too.
# Usage: model_reference_golden.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
DATA=$2
TMP=$3
TOOLS=$(cd "$DATA/../tools" && pwd)
rm -rf "$TMP"
mkdir -p "$TMP"
PY=/usr/bin/python3
$PY -c "import torch, numpy" 2>/dev/null || { echo "FAIL: /usr/bin/python3 lacks torch or numpy (make deps installs python3-pil and python3-torch)" >&2; exit 1; }
G="$DATA/golden"
# m3-tiny-topk2 ships only its config.json: the weights are m3-tiny's.
mkdir -p "$TMP/m3-tiny-topk2"
ln -s "$G/m3-tiny-topk2/hf/config.json" "$TMP/m3-tiny-topk2/config.json"
ln -s "$G/m3-tiny/hf/model.safetensors" "$TMP/m3-tiny-topk2/model.safetensors"
for m in m3-tiny-topk2 m31-tiny; do
  dir="$G/$m/hf"
  [ "$m" = m3-tiny-topk2 ] && dir="$TMP/m3-tiny-topk2"
  awk '{ for (i = 1; i <= 300; i++) printf "%s ", $i; print "" }' "$G/$m/tokens_3000.txt" >"$TMP/$m.tokens"
  $PY "$TOOLS/model_reference.py" "$dir" "$TMP/$m.tokens" "$TMP/$m.f32" --margins "$TMP/$m.margins.tsv"
  $PY - "$TMP/$m.f32" "$G/$m/logits/numpy.3000.f32" "$TMP/$m.margins.tsv" "$G/$m/logits/margins.3000.tsv" "$m" <<'PYEOF'
import sys
import numpy as np
got_p, want_p, gm_p, wm_p, name = sys.argv[1:6]
V = 427
got = np.fromfile(got_p, dtype="<f4").reshape(-1, V).astype(np.float64)
want = np.fromfile(want_p, dtype="<f4").reshape(-1, V)[: got.shape[0]].astype(np.float64)
d = np.abs(got - want)
print(f"{name}: {got.shape[0]} positions, max-abs {d.max():.3g}, mean-abs {d.mean():.3g}")
if d.max() > 1e-5:
    sys.exit(f"FAIL: {name}: max-abs {d.max():.3g} > 1e-5 at position {int(d.max(1).argmax())}")
if (got.argmax(1) != want.argmax(1)).any():
    sys.exit(f"FAIL: {name}: argmax differs")
gm = np.loadtxt(gm_p, skiprows=1, ndmin=2)
wm = np.loadtxt(wm_p, skiprows=1, ndmin=2)[: gm.shape[0]]
fin = np.isfinite(wm)
if not (np.isfinite(gm) == fin).all() or np.abs(gm[fin] - wm[fin]).max() > 1e-5 * (1 + np.abs(wm[fin]).max()):
    sys.exit(f"FAIL: {name}: routing / block margins differ from the golden margins file")
PYEOF
done
echo "PASS"
