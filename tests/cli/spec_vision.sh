#!/usr/bin/env bash
# DSpark speculation with images is lossless: a tiny m31 checkpoint with make-model's random vision tower
# and a random DSpark draft (--dspark-layers 1), served with and without --speculative-config (drafts at every
# decode step); greedy chat
# answers with an image (two images, streamed and not, and a Responses request) are the same text and the
# same token count both ways, and the speculative server did draft at its decode steps (vllm:spec_decode_*).
# The draft's context at image positions is the target's hidden states computed from the image embeddings
# (DSparkDraft::write_context takes the target's taps); the draft embeds only the anchor (a sampled token)
# and the noise token, never a prompt token (docs/serving.md section 1).
# Usage: spec_vision.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP/media"
fail() { echo "FAIL: $*" >&2; echo "--- server log:" >&2; tail -30 "$TMP/server.log" >&2 || true; exit 1; }
. "$(dirname "$0")/lib/server_port.sh"
command -v curl >/dev/null || fail "curl is needed"
PY=/usr/bin/python3
$PY -c "import PIL" 2>/dev/null || { echo "FAIL: /usr/bin/python3 has no Pillow (make deps installs python3-pil and python3-torch)" >&2; exit 1; }

"$BIN" make-model --layout m31 --preset tiny --seed 3 --dspark-layers 1 --out "$TMP/model" 2>/dev/null
cp "$DATA/chat/MiniMax-M3.jinja" "$TMP/model/chat_template.jinja"
$PY - "$TMP" <<'PYEOF'
import base64, io, json, random, sys
from PIL import Image
tmp = sys.argv[1]
def url(seed):
    r = random.Random(seed)
    b = io.BytesIO()
    Image.frombytes("RGB", (448, 448), bytes(r.randrange(256) for _ in range(448 * 448 * 3))).save(b, "PNG")
    return "data:image/png;base64," + base64.b64encode(b.getvalue()).decode()
a, b = url(1), url(2)
img = lambda u: {"type": "image_url", "image_url": {"url": u}}
def chat(parts, **kw):
    return dict({"messages": [{"role": "user", "content": parts}], "max_tokens": 32, "temperature": 0, "ignore_eos": True}, **kw)
bodies = {
    "one": chat([img(a), {"type": "text", "text": "What is in this picture?"}]),
    "two": chat([{"type": "text", "text": "Compare "}, img(a), {"type": "text", "text": " and "}, img(b)]),
    "stream": chat([img(b), {"type": "text", "text": "Describe."}], stream=True, stream_options={"include_usage": True}),
}
for k, v in bodies.items():
    json.dump(v, open(f"{tmp}/{k}.json", "w"))
json.dump({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": a},
          {"type": "input_text", "text": "What is in this picture?"}]}], "max_output_tokens": 32, "temperature": 0,
          "ignore_eos": True}, open(f"{tmp}/responses.json", "w"))
PYEOF

# The answer's text and token count, whichever shape (chat, chat stream, Responses).
summary() {
  $PY -c '
import json, sys
data = open(sys.argv[1]).read()
if data.startswith("data: "):
    text, n = "", None
    for block in data.split("\n\n"):
        if block.startswith("data: ") and block[6:] != "[DONE]":
            j = json.loads(block[6:])
            if j.get("usage") and not j["choices"]:
                n = j["usage"]["completion_tokens"]
            for ch in j["choices"]:
                text += ch["delta"].get("content") or ""
    print(json.dumps([text, n]))
else:
    j = json.loads(data)
    if j.get("object") == "response":
        print(json.dumps(["".join(c["text"] for o in j["output"] if o["type"] == "message" for c in o["content"]),
                          j["usage"]["output_tokens"]]))
    else:
        print(json.dumps([j["choices"][0]["message"]["content"], j["usage"]["completion_tokens"]]))
' "$1"
}
run_server() {  # run_server LABEL [flags]: answers in $TMP/LABEL.*
  local label=$1
  shift
  "$BIN" serve "$TMP/model" --host 127.0.0.1 --port 0 --max-model-len 4000 --kv-cache-memory 0.05 "$@" \
    >"$TMP/server.log" 2>&1 &
  PID=$!
  trap 'kill -9 $PID 2>/dev/null || true' EXIT
  wait_server_health "$TMP/server.log" $PID
  for k in one two; do
    curl -sf "$U/v1/chat/completions" -H 'Content-Type: application/json' --data-binary "@$TMP/$k.json" >"$TMP/$label.$k" ||
      fail "$label: $k failed"
  done
  curl -sfN "$U/v1/chat/completions" -H 'Content-Type: application/json' --data-binary "@$TMP/stream.json" \
    >"$TMP/$label.stream" || fail "$label: stream failed"
  curl -sf "$U/v1/responses" -H 'Content-Type: application/json' --data-binary "@$TMP/responses.json" >"$TMP/$label.responses" ||
    fail "$label: responses failed"
  curl -sf "$U/metrics" >"$TMP/$label.metrics" || fail "$label: metrics failed"
  kill -TERM $PID
  wait $PID || fail "$label: server exit status $?"
  trap - EXIT
}
run_server plain
# Not adaptive: a random draft's drafts are all rejected, and adaptive speculation would soon stop drafting.
run_server spec --speculative-config '{"method": "dspark", "num_speculative_tokens": 3, "adaptive_num_speculative_tokens": false}'
grep -q 'vision tower:' "$TMP/server.log" || fail "the vision tower was not loaded"
for k in one two stream responses; do
  P=$(summary "$TMP/plain.$k")
  S=$(summary "$TMP/spec.$k")
  [ "$P" = "$S" ] || fail "$k: speculative answer $S differs from the plain one $P"
  [ "$(echo "$P" | $PY -c 'import json,sys; print(json.load(sys.stdin)[1])')" = 32 ] || fail "$k: not 32 tokens: $P"
done
DRAFTS=$(sed -n 's/^vllm:spec_decode_num_draft_tokens_total{[^}]*} \([0-9.e+]*\).*/\1/p' "$TMP/spec.metrics" | head -1)
[ -n "$DRAFTS" ] && $PY -c "import sys; sys.exit(0 if float('$DRAFTS') >= 300 else 1)" ||
  fail "the speculative server proposed $DRAFTS draft tokens, expected 3 at most every decode step (>= 300)"
echo "spec_vision: OK ($DRAFTS draft tokens proposed)"
