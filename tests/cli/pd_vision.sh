#!/usr/bin/env bash
# Prefill/decode disaggregation with images, 1P1D on localhost over UCX (TCP): a tiny m31 checkpoint with
# make-model's random vision tower; a prefill engine (kv_producer), a decode engine (kv_consumer),
# `m3serve proxy` in front (it sends the same body, images included, to both legs) and one aggregated
# engine as the reference.
# (1) Through the proxy, a greedy chat request with an image (streamed and not) answers as the aggregated
#     engine, with the same usage; the decode engine computes one prompt token per request (the last, for its
#     logits) and every pulled page verifies: pages are named by the image's hash on both sides.
# (2) The legs by hand: a decode leg whose request carries another image than the prefill leg's (the same
#     tokens) refuses the pages that hold the image and recomputes them with its own image: it answers as
#     the aggregated engine does for that image.
# Usage: pd_vision.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP/media"
MODEL=$TMP/model
SERVE_FLAGS="--max-model-len 4000"
. "$(dirname "$0")/lib/pd_servers.sh"
PY=/usr/bin/python3
$PY -c "import PIL" 2>/dev/null || { echo "FAIL: /usr/bin/python3 has no Pillow (make deps installs python3-pil and python3-torch)" >&2; exit 1; }

"$BIN" make-model --layout m31 --preset tiny --seed 3 --out "$TMP/model" 2>/dev/null
cp "$DATA/chat/MiniMax-M3.jinja" "$TMP/model/chat_template.jinja"
$PY - "$TMP/media" <<'PYEOF'
import random, sys
from PIL import Image
d = sys.argv[1]
for seed, name in ((1, "a"), (2, "b")):
    r = random.Random(seed)
    Image.frombytes("RGB", (448, 448), bytes(r.randrange(256) for _ in range(448 * 448 * 3))).save(f"{d}/{name}.png")
PYEOF

start ref
start P --kv-transfer-config "$(nixl kv_producer)"
start D --kv-transfer-config "$(nixl kv_consumer)"
"$BIN" proxy --prefill "$URL_P" --decode "$URL_D" --port 0 >"$TMP/proxy.log" 2>&1 &
PIDS+=($!)
wait_server_health "$TMP/proxy.log" $!
URL_X=$U

$PY - "$TMP/media" "$URL_ref" "$URL_X" "$URL_P" "$URL_D" <<'PYEOF' || fail "P/D with images"
import base64, http.client, json, sys, urllib.parse
media, ref, proxy, prefill, decode = sys.argv[1:6]

def post(url, path, body):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, r.read().decode()

def metric(url, name):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    sys.exit(f"no {name} in {url}/metrics")

def chat(image, stream=False, extra=None):
    url = "data:image/png;base64," + base64.b64encode(open(f"{media}/{image}.png", "rb").read()).decode()
    b = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                   {"type": "text", "text": "What is in this picture?"}]}],
         "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    if stream:
        b["stream"] = True
        b["stream_options"] = {"include_usage": True}
    b.update(extra or {})
    return b

def answer(url, body):
    """(text, usage, kv_transfer_params) of a chat request, streamed or not."""
    st, data = post(url, "/v1/chat/completions", body)
    if st != 200:
        sys.exit(f"{url}: HTTP {st}: {data[:500]}")
    if not body.get("stream"):
        j = json.loads(data)
        return j["choices"][0]["message"]["content"], j["usage"], j.get("kv_transfer_params")
    text, usage = "", None
    for block in data.split("\n\n"):
        if block.startswith("data: ") and block[6:] != "[DONE]":
            j = json.loads(block[6:])
            if j.get("usage") and not j["choices"]:
                usage = j["usage"]
            for ch in j["choices"]:
                text += ch["delta"].get("content") or ""
    return text, usage, None

strip = lambda u: {k: u[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
# (1)
before = metric(decode, "m3serve:prompt_tokens_computed_total")
for stream in (False, True):
    want, wu, _ = answer(ref, chat("a", stream))
    got, gu, _ = answer(proxy, chat("a", stream))
    if got != want or strip(gu) != strip(wu):
        sys.exit(f"proxy (stream={stream}): {got!r} {gu} != aggregated {want!r} {wu}")
    if wu["prompt_tokens"] < 256:
        sys.exit(f"the prompt of {wu['prompt_tokens']} tokens holds no image")
computed = metric(decode, "m3serve:prompt_tokens_computed_total") - before
if computed != 2:
    sys.exit(f"the decode engine computed {computed} prompt tokens for 2 requests, expected 1 each")
if metric(decode, "m3serve:kv_remote_load_failures_total") != 0:
    sys.exit("pulled pages of an image prompt failed verification")
print("proxy: same answers as the aggregated engine; the decode engine computed 1 prompt token per request")

# (2) The prefill leg with image a, the decode leg with image b and a's pages.
_, _, kv = answer(prefill, chat("a", extra={"max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}))
if not kv or not kv.get("do_remote_prefill"):
    sys.exit(f"the prefill leg returned no kv_transfer_params: {kv}")
want_b, _, _ = answer(ref, chat("b"))
fails = metric(decode, "m3serve:kv_remote_load_failures_total")
before = metric(decode, "m3serve:prompt_tokens_computed_total")
got, gu, _ = answer(decode, chat("b", extra={"kv_transfer_params": kv}))
if got != want_b:
    sys.exit(f"decode leg with another image: {got!r} != aggregated {want_b!r}")
if metric(decode, "m3serve:kv_remote_load_failures_total") <= fails:
    sys.exit("the decode engine took pages computed with another image")
if metric(decode, "m3serve:prompt_tokens_computed_total") - before <= 1:
    sys.exit("the decode leg with another image did not recompute the image's pages")
print("another image on the decode leg: pages refused, recomputed, same answer as the aggregated engine")
PYEOF
echo "pd_vision: OK"
