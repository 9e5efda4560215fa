#!/usr/bin/env python3
# Soak client for `m3serve serve` (tools/soak.sh): computes a reference output per prompt with one
# non-concurrent greedy /v1/completions request, then runs N concurrent streaming clients for a
# given time, each repeating greedy requests and checking that the streamed tokens (logprobs.tokens,
# one entry per generated token) and text equal the reference: a lost or duplicated token fails the
# request. Samples the server's VmRSS before, during and after, and prints the figures.
import http.client, json, sys, threading, time, argparse

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--pid", type=int, required=True)
ap.add_argument("--clients", type=int, default=64)
ap.add_argument("--seconds", type=float, default=60)
ap.add_argument("--max-tokens", type=int, default=32)
a = ap.parse_args()

PROMPTS = [f"Soak prompt number {i}: the quick brown fox {'jumps ' * (i % 5)}over" for i in range(16)]


def rss_kb():
    with open(f"/proc/{a.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def body(prompt, stream):
    return json.dumps({"prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True,
                       "logprobs": 0, "stream": stream})


def request(prompt, stream):
    """Returns (tokens, text, finish_reason)."""
    c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=120)
    c.request("POST", "/v1/completions", body(prompt, stream), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:200]!r}")
    toks, text, fin = [], "", None
    if not stream:
        ch = json.loads(r.read())["choices"][0]
        c.close()
        return ch["logprobs"]["tokens"], ch["text"], ch["finish_reason"]
    done = False
    buf = b""
    while not done:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            done = True
            break
        j = json.loads(data)
        if "error" in j:
            raise RuntimeError(f"stream error: {j['error']}")
        for ch in j.get("choices", []):
            text += ch.get("text", "")
            if ch.get("logprobs"):
                toks += ch["logprobs"]["tokens"]
            if ch.get("finish_reason"):
                fin = ch["finish_reason"]
    c.close()
    if not done:
        raise RuntimeError("stream ended without [DONE]")
    return toks, text, fin


rss_start = rss_kb()
ref = {}
for p in PROMPTS:
    ref[p] = request(p, False)
    assert len(ref[p][0]) == a.max_tokens, f"reference has {len(ref[p][0])} tokens"
rss_before = rss_kb()

lock = threading.Lock()
stats = {"requests": 0, "tokens": 0, "errors": 0, "mismatches": 0}
errors = []
stop_at = time.time() + a.seconds


def client(k):
    i = k
    while time.time() < stop_at:
        p = PROMPTS[i % len(PROMPTS)]
        i += 1
        try:
            toks, text, fin = request(p, True)
            bad = (toks, text) != (ref[p][0], ref[p][1]) or fin != "length"
            with lock:
                stats["requests"] += 1
                stats["tokens"] += len(toks)
                if bad:
                    stats["mismatches"] += 1
                    if len(errors) < 5:
                        errors.append(f"mismatch on {p!r}: {len(toks)} tokens vs {len(ref[p][0])}, finish {fin}")
        except Exception as e:  # noqa: BLE001 - every failure is counted
            with lock:
                stats["errors"] += 1
                if len(errors) < 5:
                    errors.append(repr(e))


threads = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
t0 = time.time()
for t in threads:
    t.start()
rss_during = []
while any(t.is_alive() for t in threads):
    time.sleep(5)
    rss_during.append(rss_kb())
for t in threads:
    t.join()
elapsed = time.time() - t0
time.sleep(2)
rss_after = rss_kb()
# After the load: the same reference requests once more, non-concurrent.
post_ok = all(request(p, False)[:2] == ref[p][:2] for p in PROMPTS)

print(f"soak: {a.clients} clients for {elapsed:.1f} s")
print(f"requests {stats['requests']}  tokens {stats['tokens']}  ({stats['tokens'] / elapsed:.0f} tok/s)  "
      f"errors {stats['errors']}  mismatches {stats['mismatches']}  post-load reference {'ok' if post_ok else 'DIFFERS'}")
print(f"VmRSS kB: start {rss_start}  before load {rss_before}  during max {max(rss_during or [0])} "
      f"(samples {rss_during})  after {rss_after}  (after - before = {rss_after - rss_before} kB)")
for e in errors:
    print("  " + e)
sys.exit(0 if stats["errors"] == 0 and stats["mismatches"] == 0 and post_ok and stats["requests"] > 0 else 1)
