#!/usr/bin/env bash
# What the server refuses, by name, over HTTP against the real binary:
# - start: --max-model-len longer than the KV pool holds fails with both numbers and both fixes; without
#   --max-model-len the length in force is the pool's, said at start and reported by /v1/models;
# - every request field vLLM or OpenAI defines that this build does not implement (400, `param` = the
#   field) on chat and completions, streamed or not, while the same fields at their defaults pass;
# - image / audio / video / file content parts and malformed parts (400, param "messages"), on chat and
#   /tokenize; a field neither defines is served and warned about once in the log;
#   the same for /tokenize's (continue_final_message, chat_template, mm_processor_kwargs);
# - integers out of range: token ids >= 2^31 or past the vocabulary (prompt, stop_token_ids, logit_bias),
#   max_tokens 2^63 - 1 and 2^64 - 1 (400, never wrapped);
# - a prompt + max_tokens over the length in force (400 with the numbers).
# Usage: server_refusals.sh <m3serve> <tests/data> <tmpdir>
set -euo pipefail
BIN=$1
DATA=$2
TMP=$3
rm -rf "$TMP"
mkdir -p "$TMP"
fail() { echo "FAIL: $*" >&2; echo "--- server log:" >&2; cat "$TMP/server.log" >&2 || true; exit 1; }
. "$(dirname "$0")/lib/server_port.sh"

"$BIN" make-model --layout m31 --preset tiny --seed 3 --out "$TMP/model" 2>/dev/null
cp "$DATA/chat/MiniMax-M3.jinja" "$TMP/model/chat_template.jinja"

# Start-time check: one sequence of --max-model-len must fit the pool.
if "$BIN" serve "$TMP/model" --port 0 --max-model-len 1048576 --kv-cache-memory 0.01 >"$TMP/start.err" 2>&1; then
  fail "--max-model-len over the pool accepted"
fi
grep -q -- '--max-model-len 1048576 needs 8192 KV pages' "$TMP/start.err" || fail "start check: $(cat "$TMP/start.err")"
grep -q -- 'Lower --max-model-len to at most [0-9]*, or raise --kv-cache-memory to at least' "$TMP/start.err" ||
  fail "start check fixes: $(cat "$TMP/start.err")"

"$BIN" serve "$TMP/model" --host 127.0.0.1 --port 0 --kv-cache-memory 0.01 >"$TMP/server.log" 2>&1 &
PID=$!
trap 'kill -9 $PID 2>/dev/null || true' EXIT
wait_server_health "$TMP/server.log" $PID
LEN=$(sed -n 's/.*max-model-len \([0-9]*\) (the most the KV cache holds.*/\1/p' "$TMP/server.log" | head -1)
[ -n "$LEN" ] || fail "the start-up line does not say the length in force comes from the pool"

python3 - "$U" "$LEN" <<'PY' || fail "HTTP checks"
import json, sys, urllib.request, urllib.error

base, length = sys.argv[1], int(sys.argv[2])
failures = []

def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

def check(cond, what):
    if not cond:
        failures.append(what)

models = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=10).read())
check(models["data"][0]["max_model_len"] == length, f"/v1/models max_model_len {models['data'][0]['max_model_len']} != {length}")

chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
comp = {"prompt": "hi", "max_tokens": 2}

def expect_refused(path, base_body, field, value, param=None, text=None):
    body = dict(base_body)
    body[field] = value
    for stream in (False, True):
        b = dict(body)
        if stream:
            b["stream"] = True
        status, out = post(path, b)
        where = f"{path} {field}={json.dumps(value)} stream={stream}"
        if status != 400:
            failures.append(f"{where}: status {status}: {out[:200]}")
            continue
        err = json.loads(out)["error"]
        if err["param"] != (param or field):
            failures.append(f"{where}: param {err['param']!r}")
        if text and text not in err["message"]:
            failures.append(f"{where}: message lacks {text!r}: {err['message']}")
        elif not text and f"'{field}'" not in err["message"]:
            failures.append(f"{where}: message does not name the field: {err['message']}")

both = {
    "min_tokens": (3, 0),
    "prompt_logprobs": (1, None),
    "use_beam_search": (True, False),
    "length_penalty": (0.5, 1.0),
    "bad_words": (["x"], []),
    "allowed_token_ids": ([1, 2], None),
    "truncate_prompt_tokens": (5, None),
    "spaces_between_special_tokens": (False, True),
    "return_token_ids": (True, False),
    "priority": (2, 0),
    "request_id": ("abc", None),
    "cache_salt": ("s", None),
    "kv_transfer_params": ({"do_remote_decode": True}, None),
    "service_tier": ("flex", "auto"),
}
chat_only = {
    "continue_final_message": (True, False),
    "include_reasoning": (False, True),
    "chat_template": ("{{ messages }}", None),
    "functions": ([{"name": "f"}], None),
    "audio": ({"voice": "alloy"}, None),
    "modalities": (["text", "audio"], ["text"]),
    "store": (True, False),
}
for path, body, fields in (("/v1/chat/completions", chat, {**both, **chat_only}), ("/v1/completions", comp, both)):
    for f, (bad, default) in fields.items():
        expect_refused(path, body, f, bad)
        ok = dict(body)
        ok[f] = default
        status, out = post(path, ok)
        check(status == 200, f"{path} {f}={json.dumps(default)} (its default): status {status}: {out[:200]}")

# Content parts: refused by kind, on chat and /tokenize (image_url and video_url parts are served:
# server_vision.sh, server_video.sh).
parts = {
    "image": {"type": "image"},
    "input_audio": {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    "video": {"type": "video", "video": "http://127.0.0.1/v.mp4"},
    "file": {"type": "file", "file": {"file_id": "x"}},
}
for name, part in parts.items():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}]
    for path in ("/v1/chat/completions", "/tokenize"):
        status, out = post(path, {"messages": msgs, "max_tokens": 2})
        if status != 400:
            failures.append(f"{path} {name} part: status {status}: {out[:200]}")
            continue
        err = json.loads(out)["error"]
        check(err["param"] == "messages", f"{path} {name} part: param {err['param']}")
        check(f"'{name}'" in err["message"] and "not supported" in err["message"], f"{path} {name}: {err['message']}")
for bad in ([1, 2, 3], [{"text": "no type"}], [{"type": "text"}], [{"type": "hologram"}]):
    status, out = post("/v1/chat/completions", {"messages": [{"role": "user", "content": bad}], "max_tokens": 2})
    check(status == 400 and json.loads(out)["error"]["param"] == "messages", f"content {bad}: {status} {out[:200]}")
status, out = post("/v1/chat/completions",
                   {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 2})
check(status == 200, f"a text part: {status} {out[:200]}")

# /tokenize: the chat form's fields vLLM defines and this server does not serve are refused by name too.
for f, bad in (("continue_final_message", True), ("chat_template", "{{ messages }}"), ("mm_processor_kwargs", {"a": 1})):
    status, out = post("/tokenize", {"messages": [{"role": "user", "content": "hi"}], f: bad})
    check(status == 400 and json.loads(out)["error"]["param"] == f, f"/tokenize {f}: {status} {out[:200]}")
status, out = post("/tokenize", {"messages": [{"role": "user", "content": "hi"}], "continue_final_message": False})
check(status == 200, f"/tokenize continue_final_message false: {status} {out[:200]}")

# Unknown fields are served, and warned about once.
for _ in range(2):
    status, out = post("/v1/chat/completions", {**chat, "x_no_such_field": 1})
    check(status == 200, f"unknown field: {status} {out[:200]}")

# Integers out of range, and prompts over the length in force.
for body, param in (({"prompt": [4294967400], "max_tokens": 1}, "prompt"),
                    ({"prompt": [2147483648], "max_tokens": 1}, "prompt"),
                    ({"prompt": "hi", "max_tokens": 9223372036854775807}, "max_tokens"),
                    ({"prompt": "hi", "max_tokens": 18446744073709551615}, "max_tokens"),
                    ({"prompt": "hi", "max_tokens": 2, "stop_token_ids": [4294967297]}, "stop_token_ids"),
                    ({"prompt": "hi", "max_tokens": 2, "stop_token_ids": [99999999]}, "stop_token_ids"),
                    ({"prompt": "hi", "max_tokens": 2, "logit_bias": {"99999999": 1}}, "logit_bias"),
                    ({"prompt": "hi", "max_tokens": 2, "logit_bias": {"5": 100.5}}, "logit_bias"),
                    ({"prompt": "hi", "max_tokens": 2, "top_k": 4294967301}, "top_k"),
                    ({"prompt": [1] * length, "max_tokens": 1}, "prompt"),
                    ({"prompt": [1] * (length - 10), "max_tokens": 11}, "max_tokens")):
    status, out = post("/v1/completions", body)
    shown = {k: (v if not isinstance(v, list) or len(v) < 4 else f"[{len(v)} ids]") for k, v in body.items()}
    if status != 400:
        failures.append(f"{shown}: status {status}: {out[:200]}")
        continue
    err = json.loads(out)["error"]
    check(err["param"] == param, f"{shown}: param {err['param']} (expected {param}): {err['message']}")
status, out = post("/v1/completions", {"prompt": [1] * (length - 10), "max_tokens": 10})
check(status == 200, f"prompt + max_tokens = the length in force: {status} {out[:200]}")

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
PY
n=$(grep -c "ignored the request field 'x_no_such_field'" "$TMP/server.log" || true)
[ "$n" = 1 ] || fail "unknown field warned $n times (expected once)"
kill -TERM $PID
wait $PID || fail "server exit status $?"
echo "server_refusals: all refusals named"
