#!/usr/bin/env bash
# Chat image inputs end to end over HTTP: a tiny m31 checkpoint (make-model writes a random vision tower)
# served by the real binary; images are generated with Pillow (/usr/bin/python3) and sent as data: URLs
# (PNG, JPEG), a file:// URL under --allowed-local-media-path and http:// from a local stdlib server. Checks: greedy round trips are
# reproducible; the same text with another image gives other logprobs and fewer prefix-cache hits than
# the same image again; /tokenize counts the expanded image tokens exactly as the chat's prompt_tokens;
# --limit-mm-per-prompt; every bad image is a 400 naming its content part; --language-model-only
# refuses image parts by name; audio limits are refused at start (video: server_video.sh).
# Usage: server_vision.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP/media"
fail() { echo "FAIL: $*" >&2; echo "--- server log:" >&2; cat "$TMP/server.log" >&2 || true; exit 1; }
. "$(dirname "$0")/lib/server_port.sh"
. "$(dirname "$0")/lib/http_json.sh"
command -v curl >/dev/null || fail "curl is needed"
PY=/usr/bin/python3
$PY -c "import PIL" 2>/dev/null || { echo "FAIL: /usr/bin/python3 has no Pillow (make deps installs python3-pil and python3-torch)" >&2; exit 1; }

"$BIN" make-model --layout m31 --preset tiny --seed 3 --out "$TMP/model" 2>/dev/null
cp "$DATA/chat/MiniMax-M3.jinja" "$TMP/model/chat_template.jinja"

# Images: two random 448x448 pictures (256 image tokens each: two of the 128-token KV pages), A also as JPEG, and the bad ones.
$PY - "$TMP/media" <<'PYEOF'
import io, random, struct, sys, zlib
from PIL import Image
d = sys.argv[1]
def noise(seed, w=448, h=448):
    r = random.Random(seed)
    return Image.frombytes("RGB", (w, h), bytes(r.randrange(256) for _ in range(w * h * 3)))
a, b = noise(1), noise(2)
a.save(d + "/a.png"); b.save(d + "/b.png"); a.save(d + "/a.jpg", quality=90)
png = open(d + "/a.png", "rb").read()
open(d + "/truncated.png", "wb").write(png[: len(png) // 2])
open(d + "/corrupt.png", "wb").write(png[:40] + bytes(200) + png[240:])
Image.new("RGB", (17000, 1)).save(d + "/huge.png")
a.save(d + "/a.bmp")
# A PNG whose header says 0 x 0 (valid CRC, so the decoder's size check is what refuses it).
ihdr = struct.pack(">IIBBBBB", 0, 0, 8, 2, 0, 0, 0)
chunk = lambda t, p: struct.pack(">I", len(p)) + t + p + struct.pack(">I", zlib.crc32(t + p))
open(d + "/zero.png", "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b""))
PYEOF
b64() { base64 -w0 "$1"; }
url() { echo "data:image/$2;base64,$(b64 "$TMP/media/$1")"; }
chat_body() { media_chat_body image_url "$@"; }  # chat_body TEXT URL...: the images, then the text
req() { post_json "$1" "$2"; }  # req PATH BODYFILE: sets STATUS and BODY
expect_400() { expect_chat_400 "$@"; }  # expect_400 PATTERN WHAT (body file in $TMP/body.json)
hits() { prefix_cache_hits; }

# An audio limit above 0 is refused at start, by name.
if "$BIN" serve "$TMP/model" --port 0 --limit-mm-per-prompt '{"audio": 1}' 2>"$TMP/audio.err"; then
  fail "audio limit accepted"; fi
grep -q 'audio input is not supported' "$TMP/audio.err" || fail "audio limit not explained: $(cat "$TMP/audio.err")"

"$BIN" serve "$TMP/model" --host 127.0.0.1 --port 0 --max-model-len 4000 --kv-cache-memory 0.05 --block-size 128 \
  --limit-mm-per-prompt '{"image": 2, "video": 0}' --allowed-local-media-path "$TMP/media" >"$TMP/server.log" 2>&1 &
PID=$!
trap 'kill -9 $PID 2>/dev/null || true' EXIT
wait_server_health "$TMP/server.log" $PID
grep -q 'vision tower:' "$TMP/server.log" || fail "the vision tower was not loaded"
[ -n "$(hits)" ] || fail "no vllm:prefix_cache_hits_total in /metrics"

# PNG round trip, greedy and reproducible; /tokenize counts what the chat ran.
chat_body "What is in this picture?" "$(url a.png png)" >"$TMP/a.json"
req /v1/chat/completions "$TMP/a.json"
[ "$STATUS" = 200 ] || fail "PNG chat: $STATUS $BODY"
A1=$BODY
PT=$(echo "$A1" | sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p')
req /tokenize "$TMP/a.json"
[ "$STATUS" = 200 ] || fail "tokenize with an image: $STATUS $BODY"
COUNT=$(echo "$BODY" | sed -n 's/.*"count":\([0-9]*\).*/\1/p')
[ "$COUNT" = "$PT" ] || fail "/tokenize count $COUNT != prompt_tokens $PT"
# Without the image the prompt is at least 256 tokens (32 x 32 patches / 4) shorter.
echo '{"messages":[{"role":"user","content":[{"type":"text","text":"What is in this picture?"}]}]}' >"$TMP/t.json"
req /tokenize "$TMP/t.json"
TEXT_COUNT=$(echo "$BODY" | sed -n 's/.*"count":\([0-9]*\).*/\1/p')
[ $((COUNT - TEXT_COUNT)) -ge 256 ] || fail "image adds $((COUNT - TEXT_COUNT)) tokens, expected at least 256"

H0=$(hits)
req /v1/chat/completions "$TMP/a.json"
[ "$STATUS" = 200 ] || fail "PNG chat again: $STATUS"
content() { echo "$1" | sed 's/.*"choices"://; s/"usage":.*//'; }
[ "$(content "$BODY")" = "$(content "$A1")" ] || fail "greedy image chat not reproducible: $A1 vs $BODY"
H1=$(hits)
SAME=$($PY -c "print(int(float('$H1') - float('$H0')))")

# Streamed, and n = 2: every choice sees the image (the same greedy answer as above).
sed 's/"max_tokens":4,/"max_tokens":4,"stream":true,"stream_options":{"include_usage":true},/' "$TMP/a.json" >"$TMP/s.json"
curl -sN -H "Content-Type: application/json" "$U/v1/chat/completions" --data-binary "@$TMP/s.json" >"$TMP/stream.txt"
[ "$(grep -v '^$' "$TMP/stream.txt" | tail -1)" = "data: [DONE]" ] || fail "image stream does not end with [DONE]"
grep -q "\"usage\":{\"prompt_tokens\":$PT," "$TMP/stream.txt" || fail "image stream usage: $(tail -3 "$TMP/stream.txt")"
sed 's/"max_tokens":4,/"max_tokens":4,"n":2,/' "$TMP/a.json" >"$TMP/n2.json"
req /v1/chat/completions "$TMP/n2.json"
[ "$STATUS" = 200 ] || fail "n=2 image chat: $STATUS $BODY"
WANT=$(echo "$A1" | grep -o '"message":{[^}]*}')
[ "$(echo "$BODY" | grep -o '"message":{[^}]*}' | sort -u)" = "$WANT" ] || fail "n=2 choices differ from the single answer: $BODY"
[ "$(echo "$BODY" | grep -o '"message":{' | wc -l)" = 2 ] || fail "n=2: not two choices: $BODY"

# The same text with another image: other logprobs, and the image's pages are not shared.
chat_body "What is in this picture?" "$(url b.png png)" >"$TMP/b.json"
H1=$(hits)
req /v1/chat/completions "$TMP/b.json"
[ "$STATUS" = 200 ] || fail "second image: $STATUS $BODY"
H2=$(hits)
OTHER=$($PY -c "print(int(float('$H2') - float('$H1')))")
[ "$SAME" -gt "$OTHER" ] || fail "prefix hits: same image $SAME tokens, other image $OTHER (expected more for the same)"
[ "$SAME" -ge $((PT - 128)) ] || fail "same image hit only $SAME of $PT prompt tokens"
lp() { echo "$1" | grep -o '"logprob":[-0-9.e]*' | head -1; }
[ "$(lp "$BODY")" != "$(lp "$A1")" ] || fail "another image gave the same first logprob: $(lp "$BODY")"

# JPEG, file:// inside the allowed folder, two images (the limit).
chat_body "Describe." "$(url a.jpg jpeg)" >"$TMP/body.json"
req /v1/chat/completions "$TMP/body.json"; [ "$STATUS" = 200 ] || fail "JPEG chat: $STATUS $BODY"
chat_body "Describe." "file://$TMP/media/a.png" >"$TMP/body.json"
req /v1/chat/completions "$TMP/body.json"; [ "$STATUS" = 200 ] || fail "file:// chat: $STATUS $BODY"
chat_body "Compare." "$(url a.png png)" "$(url b.png png)" >"$TMP/two.json"
req /v1/chat/completions "$TMP/two.json"; [ "$STATUS" = 200 ] || fail "two images: $STATUS $BODY"
PT2=$(echo "$BODY" | sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p')
req /tokenize "$TMP/two.json"
[ "$(echo "$BODY" | sed -n 's/.*"count":\([0-9]*\).*/\1/p')" = "$PT2" ] || fail "/tokenize of two images != $PT2"

# Limits and bad images: 400 naming the content part, and the server stays up.
chat_body "Three." "$(url a.png png)" "$(url b.png png)" "$(url a.jpg jpeg)" >"$TMP/body.json"
expect_400 '3 images in the prompt; this server takes at most 2' "three images"
chat_body "x" "data:image/png;base64,@@@notbase64" >"$TMP/body.json"
expect_400 'messages\[0\].content\[0\]: the data URL is not valid base64' "bad base64"
chat_body "x" "$(url truncated.png png)" >"$TMP/body.json"
expect_400 'messages\[0\].content\[0\]: corrupt or truncated PNG' "truncated PNG"
chat_body "x" "$(url corrupt.png png)" >"$TMP/body.json"
expect_400 'messages\[0\].content\[0\]: corrupt or truncated PNG' "corrupt PNG"
chat_body "x" "$(url zero.png png)" >"$TMP/body.json"
expect_400 'messages\[0\].content\[0\]: .*PNG' "zero-sized PNG"
chat_body "x" "$(url huge.png png)" >"$TMP/body.json"
expect_400 'messages\[0\].content\[0\]: PNG image is 17000x1, above the decode limit' "huge PNG"
chat_body "x" "$(url a.bmp bmp)" >"$TMP/body.json"
expect_400 'messages\[0\].content\[0\]: unsupported image format' "BMP"
chat_body "x" "data:image/png;base64," >"$TMP/body.json"
expect_400 'messages\[0\].content\[0\]: the data URL holds no bytes' "empty data URL"
chat_body "x" "data:text/plain;base64,aGVsbG8=" >"$TMP/body.json"
expect_400 'messages\[0\].content\[0\]: the data URL.s media type must be image' "text data URL"
# http(s): fetched (a local stdlib server), a 404 and a closed port are 400s naming the part.
$PY -u -m http.server 0 --bind 127.0.0.1 --directory "$TMP/media" >"$TMP/http.log" 2>&1 &
HPID=$!
trap 'kill -9 $PID $HPID 2>/dev/null || true' EXIT
HPORT=""
for _ in $(seq 1 100); do
  HPORT=$(sed -n 's/.*port \([0-9]*\).*/\1/p' "$TMP/http.log" | head -1)
  [ -n "$HPORT" ] && break
  sleep 0.1
done
[ -n "$HPORT" ] || fail "the media HTTP server did not start: $(cat "$TMP/http.log")"
chat_body "What is in this picture?" "http://127.0.0.1:$HPORT/a.png" >"$TMP/body.json"
req /v1/chat/completions "$TMP/body.json"
[ "$STATUS" = 200 ] || fail "http image: $STATUS $BODY"
[ "$(content "$BODY")" = "$(content "$A1")" ] || fail "the fetched image answers differently from its data URL: $BODY"
chat_body "x" "http://127.0.0.1:$HPORT/missing.png" >"$TMP/body.json"
expect_400 "messages\[0\].content\[0\]: fetching 'http://127.0.0.1:$HPORT/missing.png' answered HTTP 404" "http 404"
kill $HPID; wait $HPID 2>/dev/null || true
chat_body "x" "http://127.0.0.1:$HPORT/a.png" >"$TMP/body.json"
expect_400 "messages\[0\].content\[0\]: cannot fetch 'http://127.0.0.1:$HPORT/a.png'" "http closed port"
chat_body "x" "ftp://127.0.0.1/a.png" >"$TMP/body.json"
expect_400 'messages\[0\].content\[0\]: unsupported image URL scheme' "ftp URL"
chat_body "x" "file:///etc/passwd" >"$TMP/body.json"
expect_400 'messages\[0\].content\[0\]: .*outside --allowed-local-media-path' "file:// outside"
echo '{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"video_url","video_url":{"url":"x"}}]}]}' >"$TMP/body.json"
expect_400 '1 videos in the prompt; this server takes at most 0 per prompt' "video part under a video limit of 0"
echo '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"high"}}]}]}' >"$TMP/body.json"
expect_400 "messages\[0\].content\[0\].image_url: 'detail' is not supported" "detail high"
kill -0 $PID || fail "the server died on a bad image"
req /v1/chat/completions "$TMP/a.json"; [ "$STATUS" = 200 ] || fail "chat after the bad images: $STATUS"
kill -TERM $PID; wait $PID || fail "server exit status $?"

# --mm-processor-kwargs: max_pixels 224 x 224 takes the 448 x 448 image down to 16 x 16 patches, 64 tokens;
# a key the processor does not have is refused at start, by name.
if "$BIN" serve "$TMP/model" --port 0 --mm-processor-kwargs '{"do_pan_and_scan": true}' 2>"$TMP/kw.err"; then
  fail "--mm-processor-kwargs do_pan_and_scan accepted"; fi
grep -q "mm-processor-kwargs: 'do_pan_and_scan' is not supported" "$TMP/kw.err" ||
  fail "do_pan_and_scan not refused by name: $(cat "$TMP/kw.err")"
"$BIN" serve "$TMP/model" --host 127.0.0.1 --port 0 --max-model-len 4000 --kv-cache-memory 0.05 \
  --mm-processor-kwargs '{"max_pixels": 50176}' >"$TMP/server.log" 2>&1 &
PID=$!
wait_server_health "$TMP/server.log" $PID
grep -q 'pixels' "$TMP/server.log" && grep -q -- '-50176 pixels' "$TMP/server.log" || fail "max_pixels not applied: $(cat "$TMP/server.log")"
req /tokenize "$TMP/a.json"
[ "$STATUS" = 200 ] || fail "tokenize under max_pixels: $STATUS $BODY"
SMALL=$(echo "$BODY" | sed -n 's/.*"count":\([0-9]*\).*/\1/p')
[ $((COUNT - SMALL)) = $((256 - 64)) ] || fail "max_pixels 50176: $SMALL tokens against $COUNT at the default, expected 192 fewer"
kill -TERM $PID; wait $PID || fail "server exit status $?"

# --language-model-only: the tower is not loaded, image parts are refused by name.
"$BIN" serve "$TMP/model" --host 127.0.0.1 --port 0 --max-model-len 4000 --kv-cache-memory 0.05 \
  --language-model-only >"$TMP/server.log" 2>&1 &
PID=$!
wait_server_health "$TMP/server.log" $PID
grep -q 'vision tower: ' "$TMP/server.log" && fail "--language-model-only loaded the tower"
cp "$TMP/a.json" "$TMP/body.json"
expect_400 'messages\[0\].content\[0\]: image input is disabled on this server (--language-model-only)' "language-model-only"
kill -TERM $PID; wait $PID || fail "server exit status $?"
echo "server_vision: OK"
