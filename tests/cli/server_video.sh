#!/usr/bin/env bash
# Chat video inputs end to end over HTTP: a tiny m31 checkpoint (make-model's random vision tower) served
# by the real binary; clips are made here with the ffmpeg CLI from frames generated with Pillow and sent
# as data:video/...;base64 URLs (FFV1 in Matroska, H.264 MP4) and a file:// URL. Checks: a video chat
# answers 200, greedy and reproducible; /tokenize counts exactly the chat's prompt_tokens, and the prompt
# holds per temporal group the timestamp text, the start marker, the group's video tokens and the end
# marker; the same text with another video gives other logprobs and fewer prefix-cache hits than the same
# video again; --limit-mm-per-prompt's video limit is a 400 naming the numbers; every bad video (corrupt,
# truncated, not a video, too long for --mm-processor-kwargs max_duration, a data URL saying image/) is a
# 400 naming its content part, and the server keeps serving.
# Usage: server_video.sh <m3serve> <tests/data> <tmpdir>
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
command -v ffmpeg >/dev/null || fail "ffmpeg is needed (make deps)"
PY=/usr/bin/python3
$PY -c "import PIL" 2>/dev/null || fail "/usr/bin/python3 has no Pillow (make deps)"

"$BIN" make-model --layout m31 --preset tiny --seed 3 --out "$TMP/model" 2>/dev/null
cp "$DATA/chat/MiniMax-M3.jinja" "$TMP/model/chat_template.jinja"

# Two 4-frame 224x224 clips at 1 fps (grid 2 x 16 x 16: two temporal groups of 64 tokens), one 8 s clip.
$PY - "$TMP/media" <<'PYEOF'
import random, sys
from PIL import Image
d = sys.argv[1]
for name, seed, n in (("a", 1, 4), ("b", 2, 4), ("long", 3, 8)):
    r = random.Random(seed)
    for k in range(n):
        Image.frombytes("RGB", (224, 224), bytes(r.randrange(256) for _ in range(224 * 224 * 3))).save(f"{d}/{name}{k:02d}.png")
PYEOF
mk() { ffmpeg -hide_banner -loglevel error -y -framerate 1 -i "$TMP/media/$1%02d.png" "${@:3}" "$TMP/media/$2"; }
mk a a.mkv -c:v ffv1 -pix_fmt bgr0
mk b b.mkv -c:v ffv1 -pix_fmt bgr0
mk long long.mkv -c:v ffv1 -pix_fmt bgr0
ENC=libx264; ffmpeg -hide_banner -encoders 2>/dev/null | grep -q libx264 || ENC=mpeg4
mk a a.mp4 -c:v $ENC -pix_fmt yuv420p
head -c $(( $(stat -c %s "$TMP/media/a.mp4") / 2 )) "$TMP/media/a.mp4" >"$TMP/media/truncated.mp4"
$PY -c "
import sys; b = bytearray(open(sys.argv[1], 'rb').read()); b[200:4000] = bytes(3800); open(sys.argv[2], 'wb').write(b)
" "$TMP/media/a.mkv" "$TMP/media/corrupt.mkv"
cp "$TMP/media/a00.png" "$TMP/media/still.png"

url() { echo "data:video/$2;base64,$(base64 -w0 "$TMP/media/$1")"; }
chat_body() { media_chat_body video_url "$@"; }  # chat_body TEXT URL...: the videos, then the text
req() { post_json "$1" "$2"; }  # req PATH BODYFILE: sets STATUS and BODY
expect_400() { expect_chat_400 "$@"; }  # expect_400 PATTERN WHAT (body file in $TMP/body.json)
hits() { prefix_cache_hits; }

"$BIN" serve "$TMP/model" --host 127.0.0.1 --port 0 --max-model-len 4000 --kv-cache-memory 0.05 --block-size 128 \
  --limit-mm-per-prompt '{"image": 2, "video": 2}' --allowed-local-media-path "$TMP/media" \
  --mm-processor-kwargs '{"max_duration": 6}' >"$TMP/server.log" 2>&1 &
PID=$!
trap 'kill -9 $PID 2>/dev/null || true' EXIT
wait_server_health "$TMP/server.log" $PID
grep -q 'video: at most 2 per prompt; 1 fps sampled, up to 6 s' "$TMP/server.log" || fail "video settings not reported"

# FFV1 round trip, greedy and reproducible; /tokenize counts what the chat ran.
chat_body "What happens in this video?" "$(url a.mkv x-matroska)" >"$TMP/a.json"
req /v1/chat/completions "$TMP/a.json"
[ "$STATUS" = 200 ] || fail "video chat: $STATUS $BODY"
A1=$BODY
PT=$(echo "$A1" | sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p')
req /tokenize "$TMP/a.json"
[ "$STATUS" = 200 ] || fail "tokenize with a video: $STATUS $BODY"
COUNT=$(echo "$BODY" | sed -n 's/.*"count":\([0-9]*\).*/\1/p')
[ "$COUNT" = "$PT" ] || fail "/tokenize count $COUNT != prompt_tokens $PT"
# The prompt: per temporal group the timestamp, start marker, 64 video tokens, end marker.
IDS=$(echo "$BODY" | sed -n 's/.*"tokens":\[\([0-9,]*\)\].*/\1/p')
$PY - "$IDS" "$BIN" "$TMP/model" <<'PYEOF' || fail "the video's prompt tokens are not laid out as expected"
import json, subprocess, sys
ids = [int(x) for x in sys.argv[1].split(",")]
def tok(text):
    return json.loads(subprocess.run([sys.argv[2], "tokenize", "--model", sys.argv[3], "--text", text],
                                     capture_output=True, check=True).stdout)
video = json.load(open(sys.argv[3] + "/config.json"))["video_token_index"]
# The start/end markers where the tokenizer has them as single tokens (make-model's small vocabulary has not).
start, end = tok("]<]start of image[>["), tok("]<]end of image[>[")
start = start if len(start) == 1 else []
end = end if len(end) == 1 else []
runs, i = [], 0
while i < len(ids):
    if ids[i] == video:
        j = i
        while j < len(ids) and ids[j] == video: j += 1
        runs.append((i, j)); i = j
    else:
        i += 1
assert [j - i for i, j in runs] == [64, 64], runs
for g, (i, j) in enumerate(runs):
    head = tok(f"]<]{2 * g:.1f} seconds[>[") + start
    assert ids[i - len(head):i] == head, (g, ids[i - len(head):i], head)
    assert ids[j:j + len(end)] == end, (g, ids[j:j + len(end)], end)
# The template's text after the video keeps its special tokens (the end of the user turn is one token).
eot = tok("[e~[")
assert len(eot) == 1 and eot[0] in ids[runs[-1][1]:], (eot, ids[runs[-1][1]:])
print("video layout ok")
PYEOF
# Without the video the prompt is at least 128 tokens shorter.
echo '{"messages":[{"role":"user","content":[{"type":"text","text":"What happens in this video?"}]}]}' >"$TMP/t.json"
req /tokenize "$TMP/t.json"
TEXT_COUNT=$(echo "$BODY" | sed -n 's/.*"count":\([0-9]*\).*/\1/p')
[ $((COUNT - TEXT_COUNT)) -ge 128 ] || fail "the video adds $((COUNT - TEXT_COUNT)) tokens, expected at least 128"

H0=$(hits)
req /v1/chat/completions "$TMP/a.json"
[ "$STATUS" = 200 ] || fail "video chat again: $STATUS"
content() { echo "$1" | sed 's/.*"choices"://; s/"usage":.*//'; }
[ "$(content "$BODY")" = "$(content "$A1")" ] || fail "greedy video chat not reproducible: $A1 vs $BODY"
H1=$(hits)
SAME=$($PY -c "print(int(float('$H1') - float('$H0')))")

# The same text with another video: other logprobs, and the video's pages are not shared.
chat_body "What happens in this video?" "$(url b.mkv x-matroska)" >"$TMP/b.json"
req /v1/chat/completions "$TMP/b.json"
[ "$STATUS" = 200 ] || fail "second video: $STATUS $BODY"
H2=$(hits)
OTHER=$($PY -c "print(int(float('$H2') - float('$H1')))")
[ "$SAME" -gt "$OTHER" ] || fail "prefix hits: same video $SAME tokens, other video $OTHER (expected more for the same)"
lp() { echo "$1" | grep -o '"logprob":[-0-9.e]*' | head -1; }
[ "$(lp "$BODY")" != "$(lp "$A1")" ] || fail "another video gave the same first logprob: $(lp "$BODY")"

# H.264 MP4, file:// inside the allowed folder, two videos (the limit), a video with an image.
chat_body "Describe." "$(url a.mp4 mp4)" >"$TMP/body.json"
req /v1/chat/completions "$TMP/body.json"; [ "$STATUS" = 200 ] || fail "MP4 chat: $STATUS $BODY"
chat_body "Describe." "file://$TMP/media/a.mkv" >"$TMP/body.json"
req /v1/chat/completions "$TMP/body.json"; [ "$STATUS" = 200 ] || fail "file:// video chat: $STATUS $BODY"
# http:// from a local stdlib server: the same answer as the data URL (the fetch code is the images').
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
chat_body "What happens in this video?" "http://127.0.0.1:$HPORT/a.mkv" >"$TMP/body.json"
req /v1/chat/completions "$TMP/body.json"; [ "$STATUS" = 200 ] || fail "http video: $STATUS $BODY"
[ "$(content "$BODY")" = "$(content "$A1")" ] || fail "the fetched video answers differently from its data URL: $BODY"
chat_body "x" "http://127.0.0.1:$HPORT/missing.mkv" >"$TMP/body.json"
expect_400 "messages\[0\].content\[0\]: fetching 'http://127.0.0.1:$HPORT/missing.mkv' answered HTTP 404" "http 404"
kill $HPID; wait $HPID 2>/dev/null || true
chat_body "Compare." "$(url a.mkv x-matroska)" "$(url b.mkv x-matroska)" >"$TMP/body.json"
req /v1/chat/completions "$TMP/body.json"; [ "$STATUS" = 200 ] || fail "two videos: $STATUS $BODY"
echo "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,$(base64 -w0 "$TMP/media/still.png")\"}},{\"type\":\"video_url\",\"video_url\":{\"url\":\"$(url a.mkv x-matroska)\"}},{\"type\":\"text\",\"text\":\"Same scene?\"}]}],\"max_tokens\":2}" >"$TMP/mixed.json"
req /v1/chat/completions "$TMP/mixed.json"; [ "$STATUS" = 200 ] || fail "image + video: $STATUS $BODY"

# The limit, then bad videos: 400s naming the part; the server keeps serving.
chat_body "x" "$(url a.mkv x-matroska)" "$(url a.mkv x-matroska)" "$(url b.mkv x-matroska)" >"$TMP/body.json"
expect_400 '3 videos in the prompt; this server takes at most 2 per prompt (--limit-mm-per-prompt {\\"video\\": 2})' "3 videos"
chat_body "x" "$(url corrupt.mkv x-matroska)" >"$TMP/body.json"
expect_400 'messages\[0\].content\[0\]: video: ' "corrupt video"
chat_body "x" "$(url truncated.mp4 mp4)" >"$TMP/body.json"
expect_400 'messages\[0\].content\[0\]: video: ' "truncated MP4"
chat_body "x" "$(url long.mkv x-matroska)" >"$TMP/body.json"
expect_400 'messages\[0\].content\[0\]: video: 8.000000 s long; at most 6.000000 s are accepted' "too long"
chat_body "x" "data:video/mp4;base64,$(head -c 3000 /dev/zero | base64 -w0)" >"$TMP/body.json"
expect_400 'messages\[0\].content\[0\]: video: not a video container' "zeros"
chat_body "x" "$(echo "data:image/png;base64,$(base64 -w0 "$TMP/media/still.png")")" >"$TMP/body.json"
expect_400 "messages\[0\].content\[0\]: the data URL's media type must be video/" "image data URL in a video part"
echo '{"messages":[{"role":"user","content":[{"type":"video_url","video_url":{"url":"data:video/mp4;base64,AAAA","fps":2}}]}]}' >"$TMP/body.json"
expect_400 "messages\[0\].content\[0\].video_url: 'fps' is not supported" "unknown video_url key"
req /tokenize "$TMP/body.json"; [ "$STATUS" = 400 ] || fail "/tokenize with a bad video_url part: $STATUS"
kill -0 $PID || fail "the server died on a bad video"
req /v1/chat/completions "$TMP/a.json"; [ "$STATUS" = 200 ] || fail "chat after the bad videos: $STATUS"
kill -TERM $PID; wait $PID || fail "server exit status $?"

# --limit-mm-per-prompt '{"video": 0}' refuses video parts with the numbers.
"$BIN" serve "$TMP/model" --host 127.0.0.1 --port 0 --max-model-len 4000 --kv-cache-memory 0.05 \
  --limit-mm-per-prompt '{"video": 0}' >"$TMP/server.log" 2>&1 &
PID=$!
wait_server_health "$TMP/server.log" $PID
chat_body "x" "$(url a.mkv x-matroska)" >"$TMP/body.json"
expect_400 '1 videos in the prompt; this server takes at most 0 per prompt' "video limit 0"
kill -TERM $PID; wait $PID || fail "server exit status $?"
# --language-model-only: video parts are a 400 naming the flag.
"$BIN" serve "$TMP/model" --host 127.0.0.1 --port 0 --max-model-len 4000 --kv-cache-memory 0.05 \
  --language-model-only >"$TMP/server.log" 2>&1 &
PID=$!
wait_server_health "$TMP/server.log" $PID
chat_body "x" "$(url a.mkv x-matroska)" >"$TMP/body.json"
expect_400 'messages\[0\].content\[0\]: video input is disabled on this server (--language-model-only)' "language-model-only"
kill -TERM $PID; wait $PID || fail "server exit status $?"

# bench vision --video: the clip's grid and token count (timings are printed, not asserted).
"$BIN" bench vision --model "$TMP/model" --video "$TMP/media/a.mkv" --repeats 1 >"$TMP/bench.txt" 2>&1 ||
  fail "bench vision --video: $(cat "$TMP/bench.txt")"
grep -q 'grid 2x16x16' "$TMP/bench.txt" && grep -q '128 tokens' "$TMP/bench.txt" || fail "bench vision --video: $(cat "$TMP/bench.txt")"
echo "server_video: ok"
