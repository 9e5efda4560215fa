# Shared by the HTTP round-trip tests (source it; U is the server's base URL): JSON POSTs that keep the
# status and the body apart, and the server's prefix-cache hit counter from /metrics.
# post_json PATH BODYFILE: sets STATUS and BODY.
post_json() {
  local out
  out=$(curl -s -X POST -H "Content-Type: application/json" -w '\n%{http_code}' "$U$1" --data-binary "@$2")
  STATUS=$(echo "$out" | tail -1)
  BODY=$(echo "$out" | sed '$d')
}
# prefix_cache_hits: vllm:prefix_cache_hits_total now.
prefix_cache_hits() { curl -s "$U/metrics" | sed -n 's/^vllm:prefix_cache_hits_total{[^}]*} \([0-9.e+]*\).*/\1/p' | head -1; }
# media_chat_body KIND TEXT URL...: a user message with one KIND part (image_url, video_url) per URL, then
# the text; greedy, 4 tokens, logprobs.
media_chat_body() {
  local kind=$1 text=$2; shift 2
  local parts=""
  for u in "$@"; do parts+="{\"type\":\"$kind\",\"$kind\":{\"url\":\"$u\"}},"; done
  echo "{\"messages\":[{\"role\":\"user\",\"content\":[${parts}{\"type\":\"text\",\"text\":\"$text\"}]}],\"max_tokens\":4,\"temperature\":0,\"logprobs\":true}"
}
# expect_chat_400 PATTERN WHAT: the chat body in $TMP/body.json gets a 400 whose error holds PATTERN
# (needs the caller's fail()).
expect_chat_400() {
  post_json /v1/chat/completions "$TMP/body.json"
  [ "$STATUS" = 400 ] || fail "$2: status $STATUS, expected 400: ${BODY:0:400}"
  echo "$BODY" | grep -q -- "$1" || fail "$2: the error lacks '$1': $BODY"
}
