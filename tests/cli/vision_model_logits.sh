#!/usr/bin/env bash
# The whole model's logits for a chat prompt with two images against an independent float64 reference
# (issue 43). A make-model m31 checkpoint (MXFP8 + NVFP4 experts, every layer MSA, init block 1) with
# a random vision tower and small MSA blocks (32 tokens, top-3), so block selection decides the
# attention in and after the image region. Two different Pillow PNGs (different sizes) go through the
# real chat path (`m3serve logits --input`: the template renders the markers, they expand into the
# placeholder tokens, the tower's embeddings replace them) and m3serve writes every position's logits.
# The reference side shares no code with m3serve: Pillow preprocessing (tests/tools/
# vision_pillow_reference.py), the float64 PyTorch tower (vision_tower_reference.py) and the float64
# PyTorch text model (model_reference.py) fed with the tower's embeddings at the placeholder positions.
# Tolerance: max-abs 1e-4 on positions whose routing and block-selection margins are not tiny
# (route >= 1e-4, block >= 1e-3, as tests/data/golden/README.md section 5), every argmax equal there;
# measured about 2e-6. Also checked: the placeholder runs are exactly grid_h*grid_w/4 long, the two images'
# embeddings differ, and the logits with the images differ from those of the bare placeholder tokens and
# from dense attention (so the check sees the images and the selection); the token-by-token path
# (--decode) meets the same tolerance; request fields logits does not read are refused by name.
# Usage: vision_model_logits.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
TOOLS=$(cd "$DATA/../tools" && pwd)
rm -rf "$TMP"
mkdir -p "$TMP"
PY=/usr/bin/python3
$PY -c "import PIL, torch, numpy" 2>/dev/null || { echo "FAIL: /usr/bin/python3 lacks Pillow, torch or numpy (make deps installs python3-pil and python3-torch)" >&2; exit 1; }

"$BIN" make-model --layout m31 --preset tiny --seed 43 --block-size 32 --topk-blocks 3 --out "$TMP/model" 2>/dev/null
cp "$DATA/chat/MiniMax-M3.jinja" "$TMP/model/chat_template.jinja"

# Two different pictures of different sizes, and the chat request that carries them as data: URLs.
$PY - "$TMP" <<'PYEOF'
import base64, io, json, sys
import numpy as np
from PIL import Image
d = sys.argv[1]
rng = np.random.default_rng(43)
def picture(w, h):
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x * y) % 256], -1)
    noise = rng.integers(0, 256, size=(h, w, 3))
    return Image.fromarray(np.where(rng.random((h, w, 1)) < 0.4, noise, base).astype(np.uint8), "RGB")
urls = []
for name, (w, h) in (("a", (230, 170)), ("b", (150, 200))):
    buf = io.BytesIO()
    picture(w, h).save(buf, "PNG")
    open(f"{d}/{name}.png", "wb").write(buf.getvalue())
    urls.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
img = lambda u: {"type": "image_url", "image_url": {"url": u}}
text = lambda t: {"type": "text", "text": t}
body = {"messages": [
    {"role": "system", "content": "You compare pictures."},
    {"role": "user", "content": [text("Here is the first picture:"), img(urls[0]),
                                 text("and here the second one, taken later on the same day:"), img(urls[1]),
                                 text("What changed between them? Answer in one short sentence.")]}]}
json.dump(body, open(f"{d}/request.json", "w"))
PYEOF

"$BIN" logits --model "$TMP/model" --input "$TMP/request.json" --out "$TMP/m3.f32" --tokens-out "$TMP/ids.txt" \
  2>"$TMP/logits.log" || { cat "$TMP/logits.log" >&2; echo "FAIL: logits --input" >&2; exit 1; }
# The same prompt token by token through the cache (each image row fed with its embedding).
"$BIN" logits --model "$TMP/model" --input "$TMP/request.json" --decode --out "$TMP/m3dec.f32" 2>>"$TMP/logits.log" ||
  { cat "$TMP/logits.log" >&2; echo "FAIL: logits --input --decode" >&2; exit 1; }

# Refusals: a request field logits does not read is named, and --tokens with --input is refused.
refused() {  # refused PATTERN ARGS...: the command fails and says PATTERN
  local pat=$1; shift
  if "$BIN" logits --model "$TMP/model" --out "$TMP/x.f32" "$@" >"$TMP/err.txt" 2>&1; then
    echo "FAIL: accepted: $*" >&2; exit 1
  fi
  grep -q -- "$pat" "$TMP/err.txt" || { cat "$TMP/err.txt" >&2; echo "FAIL: no '$pat' in the error" >&2; exit 1; }
}
$PY -c "import json,sys; b=json.load(open(sys.argv[1])); b['temperature']=0; json.dump(b, open(sys.argv[2], 'w'))" \
  "$TMP/request.json" "$TMP/extra.json"
refused "field 'temperature' is not read by logits --input" --input "$TMP/extra.json"
echo 1 2 3 >"$TMP/t.txt"
refused "excludes" --input "$TMP/request.json" --tokens "$TMP/t.txt"

# The reference side: expected placeholder runs, Pillow patches, the tower, the text model.
$PY - "$TMP" "$TOOLS" <<'PYEOF'
import json, subprocess, sys
import numpy as np
from PIL import Image
d, tools = sys.argv[1], sys.argv[2]
sys.path.insert(0, tools)
import vision_pillow_reference as pil
def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)
cfg = json.load(open(f"{d}/model/config.json"))
H, V = cfg["text_config"]["hidden_size"], cfg["text_config"]["vocab_size"]
img_id = cfg["image_token_index"]
ids = [int(w) for w in open(f"{d}/ids.txt").read().split()]
T = len(ids)

grids, chunks = [], []
for name in ("a", "b"):
    rgb = pil.to_rgb(Image.open(f"{d}/{name}.png"))
    rh, rw = pil.smart_resize(rgb.height, rgb.width)
    grids.append([1, rh // 14, rw // 14])
    chunks.append(pil.patches(rgb.resize((rw, rh), Image.BICUBIC)))
np.concatenate(chunks).astype(np.float32).tofile(f"{d}/patches.f32")
json.dump(grids, open(f"{d}/grids.json", "w"))
want = [g[1] * g[2] // 4 for g in grids]

# Placeholder runs in m3serve's prompt: exactly two, in order, of grid_h * grid_w / 4 tokens each.
runs, p = [], 0
while p < T:
    if ids[p] == img_id:
        q = p
        while q < T and ids[q] == img_id:
            q += 1
        runs.append((p, q - p))
        p = q
    else:
        p += 1
if [n for _, n in runs] != want:
    fail(f"image token runs {runs}, expected lengths {want} (grids {grids})")
# The template's own special tokens after the images are still special tokens (end of turn, role marker).
added = {a["content"]: a["id"] for a in json.load(open(f"{d}/model/tokenizer.json"))["added_tokens"]}
tail = ids[runs[-1][0] + runs[-1][1]:]
if added["[e~["] not in tail or added["]~b]"] not in tail:
    fail("the end-of-turn / role tokens after the images were tokenized as text")
positions = [p + i for p, n in runs for i in range(n)]
open(f"{d}/positions.txt", "w").write(" ".join(map(str, positions)) + "\n")
open(f"{d}/placeholders.txt", "w").write(" ".join(map(str, ids)) + "\n")

subprocess.run(["/usr/bin/python3", f"{tools}/vision_tower_reference.py", f"{d}/model", f"{d}/patches.f32",
                f"{d}/grids.json", f"{d}/embeds.f64"], check=True)
emb = np.fromfile(f"{d}/embeds.f64", dtype=np.float64).reshape(-1, H)
if emb.shape[0] != sum(want):
    fail(f"the tower gave {emb.shape[0]} embeddings, expected {sum(want)}")
ea, eb = emb[:want[0]], emb[want[0]:]
if np.abs(ea.mean(0) - eb.mean(0)).max() < 1e-3:
    fail("the two images' embeddings are (nearly) the same")

def reference(out, *extra):
    subprocess.run(["/usr/bin/python3", f"{tools}/model_reference.py", f"{d}/model", f"{d}/ids.txt", out, *extra],
                   check=True)
    return np.fromfile(out, dtype="<f4").reshape(T, V).astype(np.float64)
ref = reference(f"{d}/ref.f32", "--embeds", f"{d}/positions.txt", f"{d}/embeds.f64", "--margins", f"{d}/margins.tsv")
bare = reference(f"{d}/bare.f32")
dense = reference(f"{d}/dense.f32", "--embeds", f"{d}/positions.txt", f"{d}/embeds.f64", "--attention", "dense")
got = np.fromfile(f"{d}/m3.f32", dtype="<f4").reshape(T, V).astype(np.float64)
dec = np.fromfile(f"{d}/m3dec.f32", dtype="<f4").reshape(T, V).astype(np.float64)

rows = np.loadtxt(f"{d}/margins.tsv", skiprows=1, ndmin=2)
ok = (rows[:, 1] >= 1e-4) & (rows[:, 2] >= 1e-3)
diff = np.abs(got - ref)
row_max = diff.max(1)
first = positions[0]
img_block = first // 32
print(f"prompt {T} tokens; image runs {runs} (grids {grids}); first image token in MSA block {img_block}")
print(f"m3serve vs reference: max-abs {diff.max():.3g} over all {T} positions, {row_max[ok].max():.3g} over the "
      f"{int(ok.sum())} positions with comfortable margins; mean-abs {diff.mean():.3g}; "
      f"image-region rows max {row_max[first:].max():.3g}")
ddec = np.abs(dec - ref).max(1)
print(f"m3serve --decode vs reference: max-abs {ddec.max():.3g}, {ddec[ok].max():.3g} with comfortable margins")
print(f"images vs bare placeholders (reference): max-abs {np.abs(ref - bare).max():.3g} from position {first}; "
      f"MSA vs dense (reference): max-abs {np.abs(ref - dense).max():.3g}")
if row_max[ok].max() > 1e-4:
    worst = int(np.argmax(np.where(ok, row_max, -1)))
    fail(f"max-abs {row_max[ok].max():.3g} > 1e-4 at position {worst} (margins {rows[worst, 1:]})")
if ddec[ok].max() > 1e-4:
    fail(f"--decode: max-abs {ddec[ok].max():.3g} > 1e-4 at position {int(np.argmax(np.where(ok, ddec, -1)))}")
if (got[ok].argmax(1) != ref[ok].argmax(1)).any() or (dec[ok].argmax(1) != ref[ok].argmax(1)).any():
    fail("argmax differs at a position with comfortable margins")
if ok[first:].sum() < 0.9 * (T - first):
    fail(f"only {int(ok[first:].sum())} of {T - first} image-region positions have comfortable margins")
if np.abs(ref - bare)[first:].max() < 1e-2 or np.abs(ref - bare)[:first].max() > 1e-9:
    fail("the images do not move the logits from their first position on (or move earlier ones)")
if np.abs(ref - dense)[first:].max() < 1e-2:
    fail("MSA block selection does not matter in the image region: the check would not see it")
PYEOF
echo "PASS"
