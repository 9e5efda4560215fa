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
