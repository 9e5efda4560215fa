#!/usr/bin/env bash
# Images through the agent APIs end to end over HTTP, against the chat path as the reference: a tiny m31
# checkpoint with make-model's random vision tower, served by the real binary. Checks:
# - /v1/responses input_image parts (a data: URL, a file:// URL under --allowed-local-media-path) and
#   /v1/messages image blocks (a base64 source, a url source) give the same greedy text, the same number of
#   output tokens and the same prompt length as the equivalent chat request, also with two images between
#   text and with an image in a tool output (tool_result, function_call_output); /v1/messages/count_tokens
#   counts the image's tokens as chat does;
# - prefix caching keys the image by its content, as chat: after the chat request, the same image through
#   either API reuses the image's pages (cached_tokens / cache_read_input_tokens), another image does not;
# - refusals by name, with the API's own path to the part: Responses file_id and detail "high", Messages
#   file sources and images in assistant turns, bad images, --limit-mm-per-prompt, --language-model-only.
# Usage: server_vision_apis.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP/media"
fail() { echo "FAIL: $*" >&2; echo "--- server log:" >&2; tail -30 "$TMP/server.log" >&2 || true; exit 1; }
. "$(dirname "$0")/lib/server_port.sh"
. "$(dirname "$0")/lib/http_json.sh"
command -v curl >/dev/null || fail "curl is needed"
PY=/usr/bin/python3
$PY -c "import PIL" 2>/dev/null || { echo "FAIL: /usr/bin/python3 has no Pillow (make deps installs python3-pil and python3-torch)" >&2; exit 1; }

"$BIN" make-model --layout m31 --preset tiny --seed 3 --out "$TMP/model" 2>/dev/null
cp "$DATA/chat/MiniMax-M3.jinja" "$TMP/model/chat_template.jinja"

# Two random 448x448 pictures (256 image tokens each, after the template's ~500-token system text), and a truncated PNG.
$PY - "$TMP/media" <<'PYEOF'
import random, sys
from PIL import Image
d = sys.argv[1]
def noise(seed, w=448, h=448):
    r = random.Random(seed)
    return Image.frombytes("RGB", (w, h), bytes(r.randrange(256) for _ in range(w * h * 3)))
noise(1).save(d + "/a.png"); noise(2).save(d + "/b.png")
png = open(d + "/a.png", "rb").read()
open(d + "/truncated.png", "wb").write(png[: len(png) // 2])
PYEOF
b64() { base64 -w0 "$TMP/media/$1"; }
QUESTION="What is in this picture?"

# body KIND IMAGE... : writes $TMP/body.json, a greedy 6-token request with the images then the question.
# KIND: chat | responses (data: URLs) | responses_file (file:// URLs) | messages (base64) | messages_url (file://)
body() {
  $PY - "$TMP" "$QUESTION" "$@" <<'PYEOF'
import base64, json, sys
tmp, question, kind, images = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def b64(name): return base64.b64encode(open(f"{tmp}/media/{name}", "rb").read()).decode()
def data_url(name): return "data:image/png;base64," + b64(name)
def file_url(name): return f"file://{tmp}/media/{name}"
text = {"chat": "text", "responses": "input_text", "responses_file": "input_text"}.get(kind, "text")
if kind == "chat":
    parts = [{"type": "image_url", "image_url": {"url": data_url(n)}} for n in images]
    body = {"messages": [{"role": "user", "content": parts + [{"type": "text", "text": question}]}], "max_tokens": 6}
elif kind.startswith("responses"):
    url = data_url if kind == "responses" else file_url
    parts = [{"type": "input_image", "image_url": url(n), "detail": "auto"} for n in images]
    body = {"input": [{"role": "user", "content": parts + [{"type": "input_text", "text": question}]}],
            "max_output_tokens": 6}
else:
    if kind == "messages":
        src = lambda n: {"type": "base64", "media_type": "image/png", "data": b64(n)}
    else:
        src = lambda n: {"type": "url", "url": file_url(n)}
    parts = [{"type": "image", "source": src(n)} for n in images]
    body = {"messages": [{"role": "user", "content": parts + [{"type": "text", "text": question}]}], "max_tokens": 6}
body["temperature"] = 0
json.dump(body, open(f"{tmp}/body.json", "w"))
PYEOF
}
req() { post_json "$1" "${2:-$TMP/body.json}"; }  # req PATH [BODYFILE]: sets STATUS and BODY
# answer PATH: "TEXT|OUTPUT_TOKENS|INPUT_TOKENS|CACHED" of the request in $TMP/body.json, whichever API.
answer() {
  req "$1"
  [ "$STATUS" = 200 ] || fail "$1: status $STATUS: ${BODY:0:400}"
  echo "$BODY" | $PY -c '
import json, sys
j = json.load(sys.stdin)
if j.get("object") == "chat.completion":
    u = j["usage"]
    print(json.dumps([j["choices"][0]["message"]["content"], u["completion_tokens"], u["prompt_tokens"],
                      (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)]))
elif j.get("object") == "response":
    text = "".join(c["text"] for o in j["output"] if o["type"] == "message" for c in o["content"])
    u = j["usage"]
    print(json.dumps([text, u["output_tokens"], u["input_tokens"], u["input_tokens_details"]["cached_tokens"]]))
else:
    # (Messages usage carries no cache figure here: the caller reads the prefix-cache hits from /metrics)
    text = "".join(b["text"] for b in j["content"] if b["type"] == "text")
    u = j["usage"]
    print(json.dumps([text, u["output_tokens"], u["input_tokens"], None]))
'
}
hits() { prefix_cache_hits; }
hits_since() { $PY -c "print(int(float('$(hits)') - float('$1')))"; }
field() { echo "$1" | $PY -c "import json,sys; print(json.load(sys.stdin)[$2])"; }
expect_400() {  # expect_400 PATH PATTERN WHAT (body in $TMP/body.json)
  req "$1"
  [ "$STATUS" = 400 ] || fail "$3: status $STATUS, expected 400: ${BODY:0:400}"
  echo "$BODY" | grep -q -- "$2" || fail "$3: the error lacks '$2': ${BODY:0:600}"
}

"$BIN" serve "$TMP/model" --host 127.0.0.1 --port 0 --max-model-len 4000 --kv-cache-memory 0.05 --block-size 128 \
  --limit-mm-per-prompt '{"image": 2}' --allowed-local-media-path "$TMP/media" >"$TMP/server.log" 2>&1 &
PID=$!
trap 'kill -9 $PID 2>/dev/null || true' EXIT
wait_server_health "$TMP/server.log" $PID
grep -q 'vision tower:' "$TMP/server.log" || fail "the vision tower was not loaded"

# The reference: chat, image a. Every API form of the same request answers the same.
body chat a.png
REF=$(answer /v1/chat/completions)
PT=$(field "$REF" 2)
[ "$PT" -gt 256 ] || fail "chat prompt of $PT tokens holds no image"
same() {  # same WHAT GOT: text, output tokens and prompt length as the chat reference; CACHED echoed
  [ "$(field "$2" 0)" = "$(field "$REF" 0)" ] || fail "$1: text $(field "$2" 0 | head -c 200) != chat's $(field "$REF" 0 | head -c 200)"
  [ "$(field "$2" 1)" = "$(field "$REF" 1)" ] || fail "$1: $(field "$2" 1) output tokens, chat gave $(field "$REF" 1)"
  [ "$(field "$2" 2)" = "$PT" ] || fail "$1: prompt of $(field "$2" 2) tokens, chat's is $PT"
}
for kind in responses responses_file; do
  body $kind a.png
  GOT=$(answer /v1/responses)
  same "$kind" "$GOT"
  # The image's pages were cached by the chat request: found again by content (two 128-token pages at least).
  [ "$(field "$GOT" 3)" -ge $((PT - 128)) ] || fail "$kind: only $(field "$GOT" 3) of $PT prompt tokens cached after the same image"
done
for kind in messages messages_url; do
  body $kind a.png
  H=$(hits)
  GOT=$(answer /v1/messages)
  same "$kind" "$GOT"
  [ "$(hits_since "$H")" -ge $((PT - 128)) ] || fail "$kind: only $(hits_since "$H") of $PT prompt tokens hit the cache after the same image"
done
body messages a.png
req /v1/messages/count_tokens
[ "$STATUS" = 200 ] || fail "count_tokens with an image: $STATUS $BODY"
[ "$(echo "$BODY" | $PY -c 'import json,sys; print(json.load(sys.stdin)["input_tokens"])')" = "$PT" ] ||
  fail "count_tokens with an image: $BODY, chat's prompt is $PT tokens"
# Another image with the same text: the image's pages are not taken from the cache.
body responses b.png
GOT=$(answer /v1/responses)
# (the template's system text before the image is shared; no page holding image tokens is)
[ "$(field "$GOT" 3)" -lt $((PT - 256)) ] || fail "responses: image b reused $(field "$GOT" 3) cached tokens after image a"
body messages b.png
H=$(hits)
answer /v1/messages >/dev/null
# (image b's own pages are cached now; the Messages request reads them: that is the same content)
[ "$(hits_since "$H")" -ge $((PT - 128)) ] || fail "messages: image b after image b: only $(hits_since "$H") prefix-cache hits"
# Text and images interleaved keep their order: two images and the text between them, as chat.
$PY - "$TMP" <<'PYEOF'
import base64, json, sys
tmp = sys.argv[1]
u = lambda n: "data:image/png;base64," + base64.b64encode(open(f"{tmp}/media/{n}", "rb").read()).decode()
json.dump({"messages": [{"role": "user", "content": [{"type": "text", "text": "First "}, {"type": "image_url", "image_url": {"url": u("a.png")}},
          {"type": "text", "text": " then "}, {"type": "image_url", "image_url": {"url": u("b.png")}}, {"type": "text", "text": " compare."}]}],
          "max_tokens": 6, "temperature": 0}, open(f"{tmp}/chat2.json", "w"))
json.dump({"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "First "},
          {"type": "input_image", "image_url": u("a.png")}, {"type": "input_text", "text": " then "},
          {"type": "input_image", "image_url": u("b.png")}, {"type": "input_text", "text": " compare."}]}],
          "max_output_tokens": 6, "temperature": 0}, open(f"{tmp}/resp2.json", "w"))
PYEOF
cp "$TMP/chat2.json" "$TMP/body.json"
REF=$(answer /v1/chat/completions)
PT=$(field "$REF" 2)
cp "$TMP/resp2.json" "$TMP/body.json"
same "responses, two images interleaved" "$(answer /v1/responses)"

# A tool output carrying an image (a screenshot tool): Messages tool_result and Responses
# function_call_output answer as chat with the image in the tool message.
$PY - "$TMP" <<'PYEOF'
import base64, json, sys
tmp = sys.argv[1]
u = "data:image/png;base64," + base64.b64encode(open(f"{tmp}/media/a.png", "rb").read()).decode()
ask = "Take a screenshot."
json.dump({"messages": [{"role": "user", "content": ask},
          {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "Here it is."}, {"type": "image_url", "image_url": {"url": u}}]}],
          "max_tokens": 6, "temperature": 0}, open(f"{tmp}/chat_tool.json", "w"))
json.dump({"messages": [{"role": "user", "content": ask},
          {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "screenshot", "input": {}}]},
          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "Here it is."},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": u.split(",", 1)[1]}}]}]}],
          "max_tokens": 6, "temperature": 0}, open(f"{tmp}/messages_tool.json", "w"))
json.dump({"input": [{"role": "user", "content": ask}, {"type": "function_call", "call_id": "call_1", "name": "screenshot", "arguments": "{}"},
          {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "Here it is."},
            {"type": "input_image", "image_url": u}]}], "max_output_tokens": 6, "temperature": 0}, open(f"{tmp}/responses_tool.json", "w"))
PYEOF
cp "$TMP/chat_tool.json" "$TMP/body.json"
REF=$(answer /v1/chat/completions)
PT=$(field "$REF" 2)
[ "$PT" -gt 256 ] || fail "chat with a tool image: a prompt of $PT tokens holds no image"
cp "$TMP/messages_tool.json" "$TMP/body.json"
same "messages, tool_result with an image" "$(answer /v1/messages)"
cp "$TMP/responses_tool.json" "$TMP/body.json"
same "responses, function_call_output with an image" "$(answer /v1/responses)"

# Refusals, named with the API's own path.
body responses a.png
$PY - "$TMP/body.json" <<'PYEOF'
import json, sys
p = sys.argv[1]; b = json.load(open(p))
img = b["input"][0]["content"][0]
json.dump(dict(b, input=[{"role": "user", "content": [{"type": "input_image", "file_id": "file-abc", "detail": "auto"}]}]), open(p + ".file_id", "w"))
json.dump(dict(b, input=[{"role": "user", "content": [dict(img, detail="high")]}]), open(p + ".high", "w"))
json.dump(dict(b, input=[{"role": "user", "content": [{"type": "input_text", "text": "x"},
          {"type": "input_image", "image_url": "data:image/png;base64,@@@"}]}]), open(p + ".b64", "w"))
json.dump(dict(b, input=[{"role": "user", "content": [img, img, img]}]), open(p + ".three", "w"))
json.dump(dict(b, input=[{"role": "assistant", "content": [img]}]), open(p + ".assistant", "w"))
json.dump(dict(b, instructions="Be brief.", input=[{"role": "user", "content": "hi"},
          {"role": "user", "content": [{"type": "input_text", "text": "x"}, {"type": "input_file", "file_id": "f"}]}]), open(p + ".file", "w"))
PYEOF
cp "$TMP/body.json.file_id" "$TMP/body.json"
expect_400 /v1/responses "input\[0\].content\[0\].file_id: images from OpenAI's file store are not supported" "responses file_id"
cp "$TMP/body.json.high" "$TMP/body.json"
expect_400 /v1/responses 'input\[0\].content\[0\].detail: \\"high\\" is not supported' "responses detail high"
cp "$TMP/body.json.b64" "$TMP/body.json"
expect_400 /v1/responses 'input\[0\].content\[1\]: the data URL is not valid base64' "responses bad base64"
cp "$TMP/body.json.three" "$TMP/body.json"
expect_400 /v1/responses '3 images in the prompt; this server takes at most 2' "responses three images"
cp "$TMP/body.json.assistant" "$TMP/body.json"
expect_400 /v1/responses 'input\[0\].content\[0\]: input_image parts are served in user messages and function_call_output only' "responses assistant image"
cp "$TMP/body.json.file" "$TMP/body.json"
expect_400 /v1/responses "input\[1\].content\[1\]: content type 'input_file' is not supported" "responses input_file"

body messages a.png
$PY - "$TMP/body.json" "$TMP/media" <<'PYEOF'
import base64, json, sys
p, media = sys.argv[1], sys.argv[2]; b = json.load(open(p))
img = b["messages"][0]["content"][0]
def with_content(c, role="user"): return dict(b, messages=[{"role": role, "content": c}])
bad = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
       "data": base64.b64encode(open(media + "/truncated.png", "rb").read()).decode()}}
json.dump(with_content([{"type": "image", "source": {"type": "file", "file_id": "file_011"}}]), open(p + ".file", "w"))
json.dump(with_content([{"type": "text", "text": "x"}, bad]), open(p + ".bad", "w"))
json.dump(with_content([{"type": "image", "source": {"type": "base64", "media_type": "text/plain", "data": "aGk="}}]), open(p + ".mt", "w"))
json.dump(dict(b, messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": [img]}]), open(p + ".assistant", "w"))
json.dump(with_content([{"type": "text", "text": "x"}, {"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}}]), open(p + ".outside", "w"))
PYEOF
cp "$TMP/body.json.file" "$TMP/body.json"
expect_400 /v1/messages "messages\[0\].content\[0\].source: source type 'file' (Anthropic's Files API) is not supported" "messages file source"
grep -q '"type":"invalid_request_error"' <<<"$BODY" || fail "messages refusal not in Anthropic's error shape: $BODY"
cp "$TMP/body.json.bad" "$TMP/body.json"
expect_400 /v1/messages 'messages\[0\].content\[1\]: corrupt or truncated PNG' "messages truncated PNG"
cp "$TMP/body.json.mt" "$TMP/body.json"
expect_400 /v1/messages 'messages\[0\].content\[0\].source.media_type must be an image type' "messages text media type"
cp "$TMP/body.json.assistant" "$TMP/body.json"
expect_400 /v1/messages "messages\[1\].content\[0\]: block type 'image' is not supported in an assistant message" "messages assistant image"
cp "$TMP/body.json.outside" "$TMP/body.json"
expect_400 /v1/messages 'messages\[0\].content\[1\]: .*outside --allowed-local-media-path' "messages file:// outside"
kill -0 $PID || fail "the server died on a bad image"
kill -TERM $PID; wait $PID || fail "server exit status $?"

# --language-model-only: image parts of both APIs are refused by name.
"$BIN" serve "$TMP/model" --host 127.0.0.1 --port 0 --max-model-len 4000 --kv-cache-memory 0.05 \
  --language-model-only >"$TMP/server.log" 2>&1 &
PID=$!
wait_server_health "$TMP/server.log" $PID
body responses a.png
expect_400 /v1/responses 'input\[0\].content\[0\]: image input is disabled on this server (--language-model-only)' "responses, language-model-only"
body messages a.png
expect_400 /v1/messages 'messages\[0\].content\[0\]: image input is disabled on this server (--language-model-only)' "messages, language-model-only"
kill -TERM $PID; wait $PID || fail "server exit status $?"
trap - EXIT
echo "server_vision_apis: OK"
