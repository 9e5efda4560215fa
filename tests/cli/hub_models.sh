#!/usr/bin/env bash
# Model references as Hugging Face Hub ids, against a local stand-in of the Hub API
# (tests/tools/fake_hub.py serving tests/data/golden/m31-tiny/hf; no internet): download into the
# cache layout huggingface_hub uses (only the needed files, checksums verified, logits equal to the
# directory's), revisions by branch, commit and commit prefix, HF_HUB_OFFLINE (no request at all),
# an interrupted download resumed with Range (within a run and by the next run), corrupted bytes
# detected and deleted, a gated repository without, with a wrong and with the right HF_TOKEN (never
# sent to the CDN), --tokenizer from another id, --hf-overrides, `serve ORG/NAME` with that id in
# /v1/models, a Hub that is down (the cache is used), and the errors naming the id, the revision and
# the places looked; and HTTPS with the server's certificate verified.
# Usage: hub_models.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP"
fail() {
  echo "FAIL: $*" >&2
  for f in "$TMP"/*.log; do [ -f "$f" ] && { echo "--- $f:" >&2; tail -20 "$f" >&2; }; done
  exit 1
}
. "$(dirname "$0")/lib/server_port.sh"
. "$(dirname "$0")/lib/fake_hub.sh"
command -v curl >/dev/null || fail "curl is needed"

SRC=$DATA/golden/m31-tiny/hf
TOKENS=$DATA/golden/m31-tiny/tokens_16.txt
ID=MiniMaxAI/MiniMax-M3.1-Flash
# Branch v2: the same checkpoint with another generation_config.json (another commit).
mkdir -p "$TMP/v2" "$TMP/tok"
cp "$SRC"/* "$TMP/v2/"
echo '{"temperature": 0.5}' >"$TMP/v2/generation_config.json"
cp "$SRC/tokenizer.json" "$SRC/tokenizer_config.json" "$TMP/tok/"
start_fake_hub "$TMP/hub.port" "$TMP/hub.log" --repo "$ID=$SRC" --repo "$ID@v2=$TMP/v2" \
  --repo "Org/Gated=$SRC" --gated Org/Gated --token hf_right --repo "Org/Tok=$TMP/tok"
trap 'kill $HUB_PID 2>/dev/null || true; [ -n "${PID:-}" ] && kill -9 $PID 2>/dev/null || true' EXIT
export HF_ENDPOINT=$HUB HF_HUB_CACHE=$TMP/cache
unset HF_TOKEN HF_HUB_OFFLINE HF_HOME TRANSFORMERS_OFFLINE HUGGING_FACE_HUB_TOKEN || true
export HF_TOKEN_PATH=$TMP/no-token

"$BIN" logits --model "$SRC" --tokens "$TOKENS" --out "$TMP/direct.f32" 2>/dev/null
logits() {  # logits OUT ARGS...: m3serve logits with ARGS, stderr to $TMP/run.log
  local out=$1
  shift
  "$BIN" logits --tokens "$TOKENS" --out "$out" "$@" 2>"$TMP/run.log"
}
main_commit=$(curl -sf "$HUB/api/models/$ID/revision/main" | python3 -c 'import json,sys; print(json.load(sys.stdin)["sha"])')
v2_commit=$(curl -sf "$HUB/api/models/$ID/revision/v2" | python3 -c 'import json,sys; print(json.load(sys.stdin)["sha"])')
REPO=$TMP/cache/models--MiniMaxAI--MiniMax-M3.1-Flash

# 1. Download: the cache layout of huggingface_hub, only the needed files, the same logits.
logits "$TMP/hub.f32" --model "$ID" || fail "download: $(cat "$TMP/run.log")"
cmp -s "$TMP/direct.f32" "$TMP/hub.f32" || fail "logits of the downloaded model differ from the directory's"
[ "$(cat "$REPO/refs/main")" = "$main_commit" ] || fail "refs/main does not hold $main_commit"
SNAP=$REPO/snapshots/$main_commit
for f in config.json generation_config.json model.safetensors.index.json model-00001-of-00002.safetensors \
  model-00002-of-00002.safetensors tokenizer.json tokenizer_config.json; do
  [ -L "$SNAP/$f" ] || fail "$f is not a symlink in the snapshot"
  cmp -s "$SNAP/$f" "$SRC/$f" || fail "$f differs from the source"
done
shard_sha=$(sha256sum "$SRC/model-00001-of-00002.safetensors" | cut -d' ' -f1)
[ "$(readlink "$SNAP/model-00001-of-00002.safetensors")" = "../../blobs/$shard_sha" ] ||
  fail "an LFS file's blob is not named by its sha256: $(readlink "$SNAP/model-00001-of-00002.safetensors")"
[ ! -e "$SNAP/special_tokens_map.json" ] || fail "a file the engine does not read was downloaded"
grep -q "sha256 verified" "$TMP/run.log" || fail "no sha256 check reported: $(cat "$TMP/run.log")"
grep -q "git blob sha1 verified" "$TMP/run.log" || fail "no git sha1 check reported"
curl -sf "$HUB/_fake/log" | grep -q '"HEAD", "path": "/api/resolve-cache/models/' ||
  fail "the relative redirect of a small file was not followed"

# 2. Cached: the next online run fetches nothing (one API request).
n0=$(hub_requests)
logits "$TMP/hub.f32" --model "$ID" || fail "cached run: $(cat "$TMP/run.log")"
grep -q "0 files fetched (0.0 MB), 7 already cached" "$TMP/run.log" || fail "cached run fetched: $(cat "$TMP/run.log")"
[ $(($(hub_requests) - n0)) -le 2 ] || fail "the cached run made more than the revision request"

# 3. HF_HUB_OFFLINE=1: no request at all; by branch, commit and commit prefix.
n0=$(hub_requests)
for rev in "" main "$main_commit" "${main_commit:0:10}"; do
  HF_HUB_OFFLINE=1 logits "$TMP/off.f32" --model "$ID" ${rev:+--revision "$rev"} ||
    fail "offline --revision '$rev': $(cat "$TMP/run.log")"
  cmp -s "$TMP/direct.f32" "$TMP/off.f32" || fail "offline logits differ"
done
n1=$(hub_requests)
[ $((n1 - n0)) = 1 ] || fail "offline runs made $((n1 - n0 - 1)) requests to the Hub"
if HF_HUB_OFFLINE=1 logits "$TMP/x.f32" --model MiniMaxAI/Missing --revision dev; then fail "offline miss accepted"; fi
for want in "MiniMaxAI/Missing" "revision dev" "no directory" "$TMP/cache/models--MiniMaxAI--Missing/refs/dev" \
  "HF_HUB_OFFLINE"; do
  grep -qF -- "$want" "$TMP/run.log" || fail "offline miss error lacks '$want': $(cat "$TMP/run.log")"
done

# 4. Branch v2: its own commit, ref and snapshot; then by commit offline.
logits "$TMP/v2.f32" --model "$ID" --revision v2 || fail "--revision v2: $(cat "$TMP/run.log")"
[ "$(cat "$REPO/refs/v2")" = "$v2_commit" ] || fail "refs/v2 does not hold $v2_commit"
grep -q 0.5 "$REPO/snapshots/$v2_commit/generation_config.json" || fail "v2 snapshot has main's files"
grep -q "1 files fetched (0.0 MB), 6 already cached" "$TMP/run.log" || fail "v2 did not reuse main's blobs: $(cat "$TMP/run.log")"
HF_HUB_OFFLINE=1 logits "$TMP/v2.f32" --model "$ID" --revision "$v2_commit" || fail "offline v2 by commit"
if logits "$TMP/x.f32" --model "$ID" --revision nosuch; then fail "unknown revision accepted"; fi
grep -q "revision nosuch not found in $ID" "$TMP/run.log" || fail "unknown revision: $(cat "$TMP/run.log")"

# 5. Interrupted downloads resume with Range: within a run, then across runs.
export HF_HUB_CACHE=$TMP/cache2
hub_mode '{"cut": 1, "match": "/_cdn/"}'
logits "$TMP/r.f32" --model "$ID" || fail "resume within a run: $(cat "$TMP/run.log")"
cmp -s "$TMP/direct.f32" "$TMP/r.f32" || fail "logits differ after a resumed download"
curl -sf "$HUB/_fake/log" | grep -q '"/_cdn/[0-9a-f]*", "range": "bytes=[1-9]' || fail "no Range request after the cut"
export HF_HUB_CACHE=$TMP/cache3
hub_mode '{"cut": 100, "match": "/_cdn/"}'
if logits "$TMP/x.f32" --model "$ID"; then fail "a download cut every time succeeded"; fi
grep -q "interrupted after .* run again to resume" "$TMP/run.log" || fail "interruption: $(cat "$TMP/run.log")"
part=$(ls "$HF_HUB_CACHE"/models--MiniMaxAI--MiniMax-M3.1-Flash/blobs/*.incomplete)
kept=$(stat -c %s "$part")
[ ! -e "$HF_HUB_CACHE/models--MiniMaxAI--MiniMax-M3.1-Flash/refs/main" ] || fail "ref written for an incomplete snapshot"
hub_mode '{"cut": 0}'
logits "$TMP/r.f32" --model "$ID" || fail "resume across runs: $(cat "$TMP/run.log")"
cmp -s "$TMP/direct.f32" "$TMP/r.f32" || fail "logits differ after a download resumed by the next run"
curl -sf "$HUB/_fake/log" | grep -q "\"range\": \"bytes=$kept-\"" || fail "the next run did not resume from byte $kept"
[ ! -e "$part" ] || fail "$part left behind"

# 6. Corrupted bytes: detected, the file deleted, an error naming it.
export HF_HUB_CACHE=$TMP/cache4
hub_mode '{"corrupt": true, "match": "/_cdn/"}'
if logits "$TMP/x.f32" --model "$ID"; then fail "corrupted download accepted"; fi
grep -q "model-0000.-of-00002.safetensors: the downloaded bytes have sha256 .*the file was deleted" "$TMP/run.log" ||
  fail "corruption: $(cat "$TMP/run.log")"
for f in "$shard_sha" "$shard_sha.incomplete"; do
  [ ! -e "$HF_HUB_CACHE/models--MiniMaxAI--MiniMax-M3.1-Flash/blobs/$f" ] || fail "the corrupted file $f was kept"
done
hub_mode '{"corrupt": false, "match": ""}'

# 7. A gated repository: no token, a wrong one, the right one (sent to the Hub, not to the CDN).
export HF_HUB_CACHE=$TMP/cache5
if logits "$TMP/x.f32" --model Org/Gated; then fail "gated repo without a token accepted"; fi
grep -q "Org/Gated is a gated repository.*set HF_TOKEN" "$TMP/run.log" || fail "gated, no token: $(cat "$TMP/run.log")"
if HF_TOKEN=hf_wrong logits "$TMP/x.f32" --model Org/Gated; then fail "gated repo with a wrong token accepted"; fi
grep -q "has not been granted access" "$TMP/run.log" || fail "gated, wrong token: $(cat "$TMP/run.log")"
echo -n hf_right >"$TMP/token"
HF_TOKEN_PATH=$TMP/token logits "$TMP/g.f32" --model Org/Gated || fail "gated with the saved token: $(cat "$TMP/run.log")"
cmp -s "$TMP/direct.f32" "$TMP/g.f32" || fail "gated logits differ"
curl -sf "$HUB/_fake/log" | python3 -c '
import json, sys
log = json.load(sys.stdin)
assert any(e["auth"] == "Bearer hf_right" and "Org/Gated/resolve" in e["path"] for e in log), "no token sent"
assert not any(e["auth"] and e["path"].startswith("/_cdn/") for e in log), "token sent to the CDN"
' || fail "token handling"

# 8. --hf-overrides: merged before the config is read; a non-object refused by name.
if HF_HUB_OFFLINE=1 HF_HUB_CACHE=$TMP/cache logits "$TMP/x.f32" --model "$ID" --hf-overrides '[1]'; then
  fail "--hf-overrides [1] accepted"
fi
grep -q -- "--hf-overrides: expected a JSON object" "$TMP/run.log" || fail "bad overrides: $(cat "$TMP/run.log")"
if HF_HUB_OFFLINE=1 HF_HUB_CACHE=$TMP/cache logits "$TMP/x.f32" --model "$ID" \
  --hf-overrides '{"text_config": {"vocab_size": 7}}'; then fail "overridden vocab_size ignored"; fi
# (the config check sees it first: the checkpoint's bos_token_id is past a vocabulary of 7)
grep -q "is outside the vocabulary (vocab_size 7)" "$TMP/run.log" || fail "override not applied: $(cat "$TMP/run.log")"

# 9. Local directories and paths: --revision refused; a missing path is not looked up on the Hub.
if logits "$TMP/x.f32" --model "$SRC" --revision main; then fail "--revision with a directory accepted"; fi
grep -q "is a local directory: a revision (main) applies only to a Hugging Face Hub id" "$TMP/run.log" ||
  fail "revision on a directory: $(cat "$TMP/run.log")"
if logits "$TMP/x.f32" --model ./no/such/dir; then fail "missing directory accepted"; fi
grep -q "no such directory" "$TMP/run.log" || fail "missing directory: $(cat "$TMP/run.log")"

# 10. A Hub that is down: the cache is used (with a warning); without a cache, the error says both.
export HF_HUB_CACHE=$TMP/cache
hub_mode '{"down": true}'
logits "$TMP/d.f32" --model "$ID" || fail "cached model with the Hub down: $(cat "$TMP/run.log")"
grep -q "warning: .*HTTP 503.*using the cached snapshot" "$TMP/run.log" || fail "no warning: $(cat "$TMP/run.log")"
if HF_HUB_CACHE=$TMP/empty logits "$TMP/x.f32" --model "$ID"; then fail "down Hub, empty cache accepted"; fi
for want in "$ID (revision main) not found" "$TMP/empty/models--MiniMaxAI--MiniMax-M3.1-Flash/refs/main" "HTTP 503"; do
  grep -qF -- "$want" "$TMP/run.log" || fail "down Hub error lacks '$want': $(cat "$TMP/run.log")"
done
hub_mode '{"down": false}'

# 11. `serve ORG/NAME` (as the recipe's `vllm serve` line), the tokenizer from another id, /v1/models.
"$BIN" serve "$ID" --host 127.0.0.1 --port 0 --max-model-len 1024 --kv-cache-memory 0.02 --tokenizer Org/Tok \
  --hf-overrides '{"text_config": {"max_position_embeddings": 1536}}' >"$TMP/server.log" 2>&1 &
PID=$!
wait_server_health "$TMP/server.log" $PID
grep -q -- "--tokenizer Org/Tok: .*models--Org--Tok/snapshots/" "$TMP/server.log" || fail "tokenizer not from Org/Tok"
ls "$HF_HUB_CACHE/models--Org--Tok/snapshots/"*/ | sort | tr '\n' ' ' | grep -qx "tokenizer.json tokenizer_config.json " ||
  fail "the tokenizer id fetched more than its tokenizer files"
models=$(curl -sf "$U/v1/models")
echo "$models" | python3 -c '
import json, sys
m = json.load(sys.stdin)["data"]
assert [e["id"] for e in m] == ["MiniMaxAI/MiniMax-M3.1-Flash"], m
assert m[0]["root"] == "MiniMaxAI/MiniMax-M3.1-Flash", m
' || fail "/v1/models: $models"
out=$(curl -sf "$U/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$ID\", \"prompt\": \"hello\", \"max_tokens\": 2}") || fail "completion with the Hub id as model"
echo "$out" | grep -q '"text_completion"' || fail "completion: $out"
kill $PID
wait $PID 2>/dev/null || true
PID=
# generate: --tokenizer with --tokenizer-revision, from the cache offline.
HF_HUB_OFFLINE=1 "$BIN" generate --model "$ID" --tokenizer Org/Tok --tokenizer-revision main --prompt hello \
  --max-tokens 2 >"$TMP/gen.out" 2>"$TMP/run.log" || fail "generate with a Hub tokenizer: $(cat "$TMP/run.log")"
grep -q -- "--tokenizer Org/Tok@main: .*models--Org--Tok/snapshots/.*(HF cache" "$TMP/run.log" ||
  fail "tokenizer revision: $(cat "$TMP/run.log")"
# --max-model-len past the overridden max_position_embeddings: the override is what the engine read.
if "$BIN" serve "$ID" --port 0 --max-model-len 2048 --hf-overrides '{"text_config": {"max_position_embeddings": 1536}}' \
  >"$TMP/server.log" 2>&1; then fail "overridden max_position_embeddings ignored"; fi
grep -q "exceeds the model's max_position_embeddings 1536" "$TMP/server.log" || fail "override: $(cat "$TMP/server.log")"
# 12. HTTPS (Debian's cpp-httplib is built with OpenSSL): the Hub's certificate is verified; an unknown
# one is refused, one trusted through SSL_CERT_FILE works.
kill $HUB_PID
wait $HUB_PID 2>/dev/null || true
start_fake_hub "$TMP/tls.port" "$TMP/tls.log" --tls "$DATA/hub/tls_cert.pem" "$DATA/hub/tls_key.pem" --repo "$ID=$SRC"
export HF_ENDPOINT=https://127.0.0.1:$(cat "$TMP/tls.port") HF_HUB_CACHE=$TMP/cache6
if logits "$TMP/x.f32" --model "$ID"; then fail "an unknown TLS certificate was accepted"; fi
grep -q "TLS certificate check failed" "$TMP/run.log" || fail "TLS refusal: $(cat "$TMP/run.log")"
SSL_CERT_FILE=$DATA/hub/tls_cert.pem logits "$TMP/t.f32" --model "$ID" || fail "HTTPS download: $(cat "$TMP/run.log")"
cmp -s "$TMP/direct.f32" "$TMP/t.f32" || fail "logits differ after an HTTPS download"
echo "hub_models: OK"
