# Tool use through the real server: starts `m3serve serve` on the demo model (minimax_m3 reasoning and
# tool-call parsers, auto tool choice), sends every held-out task (work/eval_tasks.jsonl: the task's
# messages and OpenAI `tools` array, thinking_mode as chat_template_kwargs) to /v1/chat/completions at
# temperature 0, and counts responses whose message.tool_calls is non-empty (well-formed), whose calls
# have the expected names and arguments (exact), and, for tasks that reason (thinking enabled, or
# adaptive / unset when the model chose to), whether the reasoning landed in message.reasoning_content
# and not in content. Writes work/eval_server.json; --write-test writes tests/data/demo/tool_tasks.jsonl
# and tool_tasks_expected.txt
# (the requests of the first N tasks and the expected tool names, for tests/cli/demo_tools.sh).
import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
WORK = os.path.join(HERE, "work")


def request_body(t, max_tokens):
    body = {"model": "demo", "messages": t["messages"], "tools": t["tool_defs"], "temperature": 0,
            "max_tokens": max_tokens}
    if t["mode"] is not None:
        body["chat_template_kwargs"] = {"thinking_mode": t["mode"]}
    return body


def same_value(got, want):
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        try:
            return abs(float(got) - float(want)) < 1e-9
        except (TypeError, ValueError):
            return False
    return str(got) == str(want)


def exact(calls, expected):
    if len(calls) != len(expected):
        return False
    for c, e in zip(calls, expected):
        if c["function"]["name"] != e["name"]:
            return False
        try:
            args = json.loads(c["function"]["arguments"])
        except ValueError:
            return False
        if not isinstance(args, dict) or set(args) != set(e["arguments"]):
            return False
        if not all(same_value(args[k], v) for k, v in e["arguments"].items()):
            return False
    return True


def start_server(binary, model, log):
    p = subprocess.Popen([binary, "serve", model, "--host", "127.0.0.1", "--port", "0",
                          "--served-model-name", "demo", "--reasoning-parser", "minimax_m3",
                          "--tool-call-parser", "minimax_m3", "--enable-auto-tool-choice",
                          "--kv-cache-memory", "0.25"], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        txt = open(log.name).read()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", txt)
        if m:
            url = "http://127.0.0.1:%s" % m.group(1)
            for _ in range(100):
                try:
                    urllib.request.urlopen(url + "/health", timeout=2)
                    return p, url
                except OSError:
                    time.sleep(0.1)
        if p.poll() is not None:
            sys.exit("server exited:\n" + txt)
        time.sleep(0.1)
    p.kill()
    sys.exit("server did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m3serve", default=os.environ.get("M3SERVE", os.path.join(ROOT, "build", "m3serve")))
    ap.add_argument("--model-dir", default=os.path.join(ROOT, "models", "demo"))
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--write-test", type=int, default=0, help="write the first N requests for the ctest")
    ap.add_argument("--show", type=int, default=6, help="print this many sample responses")
    args = ap.parse_args()
    tasks = [json.loads(l) for l in open(os.path.join(WORK, "eval_tasks.jsonl"))][:args.tasks]
    log = open(os.path.join(WORK, "eval_server.log"), "w")
    proc, url = start_server(args.m3serve, args.model_dir, log)
    rows = []
    t0 = time.time()
    try:
        for i, t in enumerate(tasks):
            body = json.dumps(request_body(t, args.max_tokens)).encode()
            req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            resp = json.loads(urllib.request.urlopen(req, timeout=300).read())
            msg = resp["choices"][0]["message"]
            calls = msg.get("tool_calls") or []
            content = msg.get("content") or ""
            reasoning = msg.get("reasoning_content") or ""
            row = dict(mode=t["mode"], expected=t["calls"], well_formed=bool(calls), exact=exact(calls, t["calls"]),
                       names=[c["function"]["name"] for c in calls] == [e["name"] for e in t["calls"]],
                       reasoning=reasoning, content=content, tool_calls=calls,
                       finish=resp["choices"][0]["finish_reason"],
                       leaked="<mm:think>" in content or "</mm:think>" in content or "<tool_call>" in content)
            rows.append(row)
            if i < args.show:
                print("--- task %d (%s) user: %s" % (i, t["mode"], t["messages"][-1]["content"]))
                print(json.dumps(msg, ensure_ascii=False)[:700], flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    n = len(rows)
    enabled = [r for r in rows if r["mode"] == "enabled"]
    reasoned = [r for r in rows if r["reasoning"]]
    rep = {
        "tasks": n, "seconds": round(time.time() - t0, 1),
        "tool_calls_well_formed": sum(r["well_formed"] for r in rows) / n,
        "tool_calls_right_names": sum(r["names"] for r in rows) / n,
        "tool_calls_exact": sum(r["exact"] for r in rows) / n,
        "finish_reason_tool_calls": sum(r["finish"] == "tool_calls" for r in rows) / n,
        "markup_leaked_into_content": sum(r["leaked"] for r in rows) / n,
        "thinking_enabled_tasks": len(enabled),
        "thinking_enabled_reasoning_in_field": sum(bool(r["reasoning"]) and not r["leaked"] for r in enabled)
        / max(1, len(enabled)),
        "responses_with_reasoning": len(reasoned),
        "by_mode": {str(m): {"n": len(g), "well_formed": sum(r["well_formed"] for r in g) / max(1, len(g)),
                             "exact": sum(r["exact"] for r in g) / max(1, len(g)),
                             "reasoning": sum(bool(r["reasoning"]) for r in g) / max(1, len(g))}
                    for m in ("enabled", "disabled", "adaptive", None)
                    for g in [[r for r in rows if r["mode"] == m]]},
        "by_tool": {k: {"n": len(g), "well_formed": sum(r["well_formed"] for r in g) / max(1, len(g)),
                        "exact": sum(r["exact"] for r in g) / max(1, len(g))}
                    for k in ("calculator", "verse_lookup", "convert_units", "two_calls")
                    for g in [[r for r in rows if (len(r["expected"]) > 1 and k == "two_calls") or
                               (len(r["expected"]) == 1 and r["expected"][0]["name"] == k)]]},
    }
    print(json.dumps(rep, indent=1))
    json.dump(dict(report=rep, rows=rows), open(os.path.join(WORK, "eval_server.json"), "w"), indent=1)
    if args.write_test:
        d = os.path.join(ROOT, "tests", "data", "demo")
        with open(os.path.join(d, "tool_tasks.jsonl"), "w") as f, \
                open(os.path.join(d, "tool_tasks_expected.txt"), "w") as g:
            for t in tasks[:args.write_test]:
                f.write(json.dumps(request_body(t, args.max_tokens), ensure_ascii=False) + "\n")
                g.write(" ".join(e["name"] for e in t["calls"]) + "\n")


if __name__ == "__main__":
    main()
