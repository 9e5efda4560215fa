#!/usr/bin/env python3
"""A small multi-turn agentic workload for the deployment tests (standard library only).

Usage: agentic_sessions.py PROXY_URL INSTANCE_URL... [--sessions S] [--turns T] [--kill-pid PID]

Each session is one conversation with its own long context, sent turn by turn through the proxy with
an X-Dynamo-Session-ID header, greedy, the reply and a tool result appended before the next turn (raw
completions, so that sessions share no prefix, not even a chat template's preamble: the prefix-cache
hits of one instance and of several with affinity are then the same number). Then
sessionless requests, and one streamed request compared with its non-streamed twin. With --kill-pid,
that instance is then killed and every session sends one more turn (the proxy must route around it).
Prints JSON: the replies per session, the upstream that answered each request (X-M3-Upstream), and each
instance's prefix-cache hits and queries read from its own /metrics.
"""
import argparse
import json
import os
import random
import signal
import urllib.request

WORDS = ("def return self import class value config error build test file path module result "
         "assert check list index token cache page block state").split()


def post(url, body, headers=None, stream=False):
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers=h)
    with urllib.request.urlopen(req, timeout=300) as r:
        upstream = r.headers.get("X-M3-Upstream", "")
        if not stream:
            return json.loads(r.read())["choices"][0]["text"], upstream
        text, done = "", False
        for line in r:
            line = line.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                delta = json.loads(line[6:])["choices"]
                if delta:
                    text += delta[0]["text"]
        assert done, "stream ended without [DONE]"
        return text, upstream


def metric(url, name):
    total = 0.0
    for line in urllib.request.urlopen(url + "/metrics", timeout=30).read().decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("proxy")
    ap.add_argument("instances", nargs="+")
    ap.add_argument("--sessions", type=int, default=5)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--kill-pid", type=int, default=0)
    a = ap.parse_args()
    out = {"replies": {}, "upstreams": {}, "sessionless": [], "errors": []}
    convs = {}
    for s in range(a.sessions):
        rng = random.Random(s)
        context = " ".join(rng.choice(WORDS) for _ in range(700))
        convs[s] = f"Session {s}. Repository files:\n{context}\nFix the failing test.\n"

    def turn(s, key="replies"):
        body = {"prompt": convs[s], "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        text, up = post(a.proxy, body, {"X-Dynamo-Session-ID": f"session-{s}"})
        out[key].setdefault(str(s), []).append(text)
        if key == "replies":
            out["upstreams"].setdefault(str(s), []).append(up)
        rng = random.Random(1000 + 31 * s + len(convs[s]))
        convs[s] += text + "\nTool result:\n" + " ".join(rng.choice(WORDS) for _ in range(150)) + "\n"

    for t in range(a.turns):
        for s in range(a.sessions):
            turn(s)
    for i in range(4):
        body = {"prompt": f"sessionless {i}", "max_tokens": 4, "temperature": 0}
        out["sessionless"].append(post(a.proxy, body)[1])
    body = {"prompt": convs[0], "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    plain = post(a.proxy, body, {"X-Dynamo-Session-ID": "session-0"})[0]
    streamed = post(a.proxy, dict(body, stream=True), {"X-Dynamo-Session-ID": "session-0"}, stream=True)[0]
    out["stream_equal"] = plain == streamed
    out["hits"] = [metric(u, "vllm:prefix_cache_hits_total") for u in a.instances]
    out["queries"] = [metric(u, "vllm:prefix_cache_queries_total") for u in a.instances]
    if a.kill_pid:
        os.kill(a.kill_pid, signal.SIGKILL)
        out["after_kill"] = {}
        for s in range(a.sessions):
            try:
                turn(s, "after_kill")
            except Exception as e:  # noqa: BLE001 - reported, the test fails on it
                out["errors"].append(f"session {s} after the kill: {e}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
