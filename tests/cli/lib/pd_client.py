"""Client side of tests/cli/pd_disagg.sh: OpenAI requests (streamed or not) and the two legs of vLLM's
kv_transfer_params protocol done by hand, with the checks that need JSON. Each subcommand prints what it
found or exits non-zero with the reason."""
import http.client
import json
import sys
import urllib.parse


def post(url, path, body, timeout=120):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode()
    return r.status, r.getheader("Content-Type") or "", data


def get_metric(url, name):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def answer(url, api, prompt, stream, max_tokens=12):
    """(text, usage, kv_transfer_params) of one request; streams are reassembled from their events."""
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    body = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    status, ctype, data = post(url, path, body)
    if status != 200:
        sys.exit(f"{api} stream={stream}: HTTP {status}: {data}")
    if not stream:
        j = json.loads(data)
        ch = j["choices"][0]
        text = ch["message"]["content"] if api == "chat" else ch["text"]
        return text, j["usage"], ch["finish_reason"]
    if not ctype.startswith("text/event-stream"):
        sys.exit(f"{api} stream: content type {ctype}")
    text, usage, finish, done = "", None, None, False
    for block in data.split("\n\n"):
        if not block.startswith("data: "):
            continue
        payload = block[6:]
        if payload == "[DONE]":
            done = True
            continue
        j = json.loads(payload)
        if "error" in j:
            sys.exit(f"{api} stream: error event {payload}")
        if j.get("usage") and not j["choices"]:
            usage = j["usage"]
        for ch in j["choices"]:
            text += (ch["delta"].get("content") or "") if api == "chat" else ch["text"]
            finish = ch.get("finish_reason") or finish
    if not done:
        sys.exit(f"{api} stream: no [DONE]")
    return text, usage, finish


def cmd_compare(ref, proxy, decode):
    """Greedy answers through the proxy equal one aggregated engine's, chat and completions, streamed and
    not, with the same usage; the decode engine computes one prompt token per request (the last)."""
    prompts = ["Tell me a story about a fox who lived in a small house by the river, and what it found there one day.",
               "Hi", "In the beginning God created the heaven and the earth. And the earth was without form, and void;" * 3]
    before = get_metric(decode, "m3serve:prompt_tokens_computed_total") or 0
    n = 0
    for api in ("completions", "chat"):
        for stream in (False, True):
            for p in prompts:
                want = answer(ref, api, p, stream)
                got = answer(proxy, api, p, stream)
                n += 1
                if got[0] != want[0] or got[2] != want[2]:
                    sys.exit(f"{api} stream={stream} prompt {p[:20]!r}: proxy {got[0]!r} ({got[2]}), "
                             f"aggregated {want[0]!r} ({want[2]})")
                for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
                    if got[1][k] != want[1][k]:
                        sys.exit(f"{api} stream={stream}: usage {k} {got[1][k]} != {want[1][k]}")
    after = get_metric(decode, "m3serve:prompt_tokens_computed_total")
    if after - before != n:
        sys.exit(f"the decode engine computed {after - before} prompt tokens for {n} requests (expected one each)")
    print(f"{n} requests identical to the aggregated engine; decode computed {int(after - before)} prompt tokens")


def prefill_leg(prefill, prompt):
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                   "remote_block_ids": None, "remote_host": None, "remote_port": None}}
    status, _, data = post(prefill, "/v1/completions", body)
    if status != 200:
        sys.exit(f"prefill leg: HTTP {status}: {data}")
    kv = json.loads(data)["kv_transfer_params"]
    for k in ("remote_engine_id", "remote_block_ids", "remote_host", "remote_port", "remote_request_id"):
        if k not in kv or kv[k] in (None, ""):
            sys.exit(f"prefill leg: kv_transfer_params lacks {k}: {kv}")
    if kv["do_remote_prefill"] is not True:
        sys.exit(f"prefill leg: do_remote_prefill not true: {kv}")
    return kv


def decode_leg(decode, prompt, kv, max_tokens=8):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "kv_transfer_params": kv}
    return post(decode, "/v1/completions", body)


PROMPT = "And God said, Let there be light: and there was light. And God saw the light, that it was good." * 2


def cmd_lease(prefill, out):
    """The prefill leg alone: writes its kv_transfer_params to `out`."""
    with open(out, "w") as f:
        json.dump(prefill_leg(prefill, PROMPT), f)


def expect_status(resp, status, needle, what):
    """needle: the text the error must hold, or a tuple of texts of which it must hold one."""
    needles = needle if isinstance(needle, tuple) else (needle,)
    if resp[0] != status or not any(n in resp[2] for n in needles):
        sys.exit(f"{what}: expected HTTP {status} with {' or '.join(map(repr, needles))}, got {resp[0]}: {resp[2]}")


def cmd_forged(ref, prefill, decode):
    """Forged and stale reads are refused with 400, never served; the genuine read then works once."""
    kv = prefill_leg(prefill, PROMPT)
    other = prefill_leg(prefill, PROMPT + " Amen.")  # another request's lease, live
    want = answer(ref, "completions", PROMPT, False, 8)[0]
    forged = dict(kv, remote_block_ids=other["remote_block_ids"])
    expect_status(decode_leg(decode, PROMPT, forged), 400, "do not match", "another lease's block ids")
    forged = dict(kv, remote_block_ids=kv["remote_block_ids"][:-1] + [kv["remote_block_ids"][-1] + 1000])
    expect_status(decode_leg(decode, PROMPT, forged), 400, "do not match", "a forged block id")
    forged = dict(kv, remote_request_id="0" * 32)
    expect_status(decode_leg(decode, PROMPT, forged), 400, "names no live KV lease", "a forged request id")
    forged = dict(kv, remote_request_id=other["remote_request_id"])
    expect_status(decode_leg(decode, PROMPT, forged), 400, "do not match", "another request's id with these ids")
    st, _, data = decode_leg(decode, PROMPT, kv)
    if st != 200 or json.loads(data)["choices"][0]["text"] != want:
        sys.exit(f"the genuine read after forged ones: HTTP {st}: {data}")
    # The decode engine answers once it has acknowledged every page; the prefill engine marks the lease
    # read when that acknowledgement reaches its transfer thread, which may come after this next read
    # arrives: then the lease is still "being read". Refused either way, never served.
    expect_status(decode_leg(decode, PROMPT, kv), 400, ("names no live KV lease", "is being read by another transfer"),
                  "a stale (already read) lease")
    st, _, _ = decode_leg(decode, PROMPT + " Amen.", other)
    if st != 200:
        sys.exit("the other lease was spoiled by the forged reads")
    print("forged block ids, forged and foreign request ids, and a stale lease refused (400); genuine reads served")


def cmd_decode(decode, ref, kvfile, expect):
    """The decode leg with saved params: `ok` (same text as ref), or an HTTP status with a needle."""
    kv = json.load(open(kvfile))
    resp = decode_leg(decode, PROMPT, kv)
    if expect == "ok":
        want = answer(ref, "completions", PROMPT, False, 8)[0]
        if resp[0] != 200 or json.loads(resp[2])["choices"][0]["text"] != want:
            sys.exit(f"decode leg: HTTP {resp[0]}: {resp[2]} (want {want!r})")
        print("decode leg: same text as the aggregated engine")
    else:
        status, needle = expect.split(":", 1)
        expect_status(resp, int(status), needle, "decode leg")
        print(f"decode leg: HTTP {status} ({needle})")


def cmd_streamed_legs(ref, prefill, decode):
    """The prefill leg streamed (chat and completions): its last chunk carries kv_transfer_params, and a
    decode leg with them answers as the aggregated engine does."""
    for api in ("chat", "completions"):
        path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
        body = {"max_tokens": 1, "temperature": 0, "stream": True, "kv_transfer_params": {"do_remote_decode": True}}
        if api == "chat":
            body["messages"] = [{"role": "user", "content": PROMPT}]
        else:
            body["prompt"] = PROMPT
        status, _, data = post(prefill, path, body)
        if status != 200:
            sys.exit(f"streamed prefill leg ({api}): HTTP {status}: {data}")
        kv = None
        for block in data.split("\n\n"):
            if block.startswith("data: {"):
                j = json.loads(block[6:])
                if j.get("kv_transfer_params"):
                    if not j["choices"] or not j["choices"][0].get("finish_reason"):
                        sys.exit(f"kv_transfer_params on a chunk that does not finish the choice: {block}")
                    kv = j["kv_transfer_params"]
        if not kv or not kv.get("remote_request_id"):
            sys.exit(f"streamed prefill leg ({api}): no kv_transfer_params in its chunks: {data[-400:]}")
        dbody = {k: v for k, v in body.items() if k not in ("stream",)}
        dbody.update(max_tokens=8, ignore_eos=True, kv_transfer_params=kv)
        status, _, data = post(decode, path, dbody)
        want = answer(ref, api, PROMPT, False, 8)[0]
        got = json.loads(data)["choices"][0]
        got = got["message"]["content"] if api == "chat" else got["text"]
        if status != 200 or got != want:
            sys.exit(f"decode leg after a streamed prefill ({api}): HTTP {status}: {got!r}, want {want!r}")
    print("streamed prefill legs carry kv_transfer_params on their last chunk (chat, completions)")


def cmd_metric(url, name):
    v = get_metric(url, name)
    print("none" if v is None else int(v))


if __name__ == "__main__":
    globals()["cmd_" + sys.argv[1]](*sys.argv[2:])
