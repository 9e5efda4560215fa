# Verifies and evaluates the exported demo model: m3serve logits vs the PyTorch forward of the dequantised
# export (max-abs difference), held-out perplexity from both, PyTorch greedy completions of fixed prompts (written
# to tests/data/demo/ for the C++ test), and the tool-call well-formedness rate on held-out synthetic tasks
# (prompts rendered here with the real template, generated greedily by m3serve, parsed here).
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch

import data as D
from bpe import Tokenizer
from export import DEFAULT_OUT, load_dequantised

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
WORK = os.path.join(HERE, "work")
M3SERVE = os.environ.get("M3SERVE", os.path.join(ROOT, "build", "m3serve"))
NS = "]<]minimax[>["


def heldout_sequences(n_each=4, T=512):
    """First T tokens of held-out conversations and held-out KJV text (concatenated chapters)."""
    seqs = []
    for kind in ("conv", "kjv"):
        ids = np.load(os.path.join(WORK, "heldout_%s_ids.npy" % kind)).astype(np.int64)
        offs = np.load(os.path.join(WORK, "heldout_%s_offs.npy" % kind))
        starts = [offs[i] for i in range(0, len(offs) - 1, max(1, (len(offs) - 1) // n_each))][:n_each]
        for s in starts:
            seqs.append(ids[s:s + T] if s + T <= len(ids) else ids[-T:])
    return seqs


def m3serve_logits(model_dir, ids, vocab):
    with tempfile.TemporaryDirectory() as d:
        tf, of = os.path.join(d, "t.txt"), os.path.join(d, "l.f32")
        open(tf, "w").write(" ".join(map(str, ids)))
        subprocess.run([M3SERVE, "logits", "--model", model_dir, "--tokens", tf, "--out", of], check=True,
                       capture_output=True)
        return np.fromfile(of, dtype=np.float32).reshape(len(ids), vocab)


def nll(logits, ids):
    lp = torch.log_softmax(torch.as_tensor(logits, dtype=torch.float64)[:-1], -1)
    return -lp.gather(1, torch.as_tensor(ids[1:]).long()[:, None]).sum().item(), len(ids) - 1


@torch.no_grad()
def greedy(model, ids, n, eos):
    ids = list(ids)
    out, margins = [], []
    for _ in range(n):
        lo = model(torch.tensor([ids]))[0][0, -1]
        top2 = torch.topk(lo, 2).values
        t = int(lo.argmax())
        margins.append(float(top2[0] - top2[1]))
        out.append(t)
        ids.append(t)
        if t == eos:
            break
    return out, margins


def parse_tool_calls(text):
    """M3 tool-call block -> list of (name, {param: value}) or None if malformed."""
    m = re.search(re.escape(NS + "<tool_call>") + r"\n(.*?)" + re.escape(NS + "</tool_call>"), text, re.S)
    if not m:
        return None
    calls = []
    body = m.group(1)
    inv_re = re.compile(re.escape(NS) + r'<invoke name="([^"]+)">(.*?)' + re.escape(NS) + r"</invoke>\n", re.S)
    pos = 0
    for im in inv_re.finditer(body):
        if im.start() != pos:
            return None
        pos = im.end()
        args, rest = {}, im.group(2)
        pm_re = re.compile(re.escape(NS) + r"<([A-Za-z_][\w-]*)>(.*?)" + re.escape(NS) + r"</\1>", re.S)
        p = 0
        for pm in pm_re.finditer(rest):
            if pm.start() != p:
                return None
            p = pm.end()
            args[pm.group(1)] = pm.group(2)
        if p != len(rest):
            return None
        calls.append((im.group(1), args))
    if pos != len(body) or not calls:
        return None
    return calls


def call_matches(calls, expected):
    if len(calls) != len(expected):
        return False
    for (n, a), e in zip(calls, expected):
        if n != e["name"] or set(a) != set(e["arguments"]):
            return False
        for k, v in e["arguments"].items():
            if str(v) != a[k]:
                return False
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default=os.path.join(WORK, "ckpt.pt"))
    ap.add_argument("--model-dir", default=DEFAULT_OUT)
    ap.add_argument("--tasks", type=int, default=60)
    ap.add_argument("--write-tests", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = Tokenizer(os.path.join(args.model_dir, "tokenizer.json"))
    model = load_dequantised(args.ckpt)
    V = model.c["vocab_size"]
    report = {}
    # 1. logits parity and perplexity
    seqs = heldout_sequences()
    tot_pt = tot_m3 = cnt = 0
    maxabs = 0.0
    per_kind = {}
    for i, s in enumerate(seqs):
        with torch.no_grad():
            lp = model(torch.tensor(s)[None])[0][0].numpy()
        lm = m3serve_logits(args.model_dir, s, V)
        maxabs = max(maxabs, float(np.abs(lp - lm).max()))
        a, n = nll(lp, s)
        b, _ = nll(lm, s)
        tot_pt += a
        kind = "conv" if i < len(seqs) // 2 else "kjv"
        per_kind[kind] = per_kind.get(kind, 0.0) + a / n / (len(seqs) // 2)
        tot_m3 += b
        cnt += n
    report["logits_max_abs_diff"] = maxabs
    report["ppl_pytorch"] = math.exp(tot_pt / cnt)
    report["ppl_m3serve"] = math.exp(tot_m3 / cnt)
    report["ppl_tokens"] = cnt
    report["ppl_pytorch_conv"] = math.exp(per_kind["conv"])
    report["ppl_pytorch_kjv"] = math.exp(per_kind["kjv"])
    print(json.dumps(report), flush=True)
    # 2. greedy completions of fixed prompts
    tmpl = D.make_env()
    eos = tok.added["[e~["]
    prompts = [
        ("plain", "In the beginning God", 32),
        ("plain2", "And the LORD said unto Moses,", 32),
        ("reasoning", D.render(tmpl, [{"role": "user", "content": "What is 7 + 5?"}], None, "enabled", gen=True), 48),
        ("chat", D.render(tmpl, [{"role": "user", "content": "Who are you?"}], None, "disabled", gen=True), 40),
        ("tool", D.render(tmpl, [{"role": "user", "content": "What is 37 * 12?"}], D.ALL_TOOLS, "enabled", gen=True), 80),
    ]
    greedy_rows = []
    for name, text, n in prompts:
        ids = tok.encode(text)
        out, margins = greedy(model, ids, n, eos)
        for i, m in enumerate(margins):  # keep the test away from near-ties (fp32 engines may flip them)
            if m < 2e-3:
                out, margins = out[:i], margins[:i]
                break
        greedy_rows.append({"name": name, "prompt": ids, "greedy": out, "min_margin": min(margins) if margins else None})
        print("[%s] %d tokens, min margin %s\n%s\n" % (name, len(out), min(margins) if margins else None, tok.decode(out)), flush=True)
    # 3. tool calls on held-out tasks (m3serve greedy generation)
    tasks = [json.loads(l) for l in open(os.path.join(WORK, "eval_tasks.jsonl"))][:args.tasks]
    wf = correct = 0
    for t in tasks:
        r = subprocess.run([M3SERVE, "generate", "--model", args.model_dir, "--prompt", t["prompt"],
                            "--max-tokens", "120", "--temperature", "0"], capture_output=True, text=True)
        calls = parse_tool_calls(r.stdout)
        wf += calls is not None
        correct += calls is not None and call_matches(calls, t["calls"])
    report["tool_tasks"] = len(tasks)
    report["tool_call_well_formed"] = wf / max(1, len(tasks))
    report["tool_call_exact"] = correct / max(1, len(tasks))
    print(json.dumps(report), flush=True)
    if args.write_tests:
        d = os.path.join(ROOT, "tests", "data", "demo")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "greedy.jsonl"), "w") as f:
            for row in greedy_rows:
                f.write(json.dumps(row) + "\n")
        with open(os.path.join(d, "heldout_tokens.txt"), "w") as f:
            for s in seqs:
                f.write(" ".join(map(str, s)) + "\n")
        json.dump({"ppl_pytorch": report["ppl_pytorch"], "ppl_m3serve": report["ppl_m3serve"],
                   "tokens": cnt}, open(os.path.join(d, "heldout_ppl.json"), "w"), indent=1)
    json.dump(report, open(os.path.join(WORK, "eval_report.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
