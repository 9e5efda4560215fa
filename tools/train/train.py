# Trains the demo M3.1 model (model.py) on the encoded data (bpe.py output in work/): packed sequences that
# start at a document boundary, cross-entropy + MSA index KL loss, fake-quant (QAT) forward, aux-loss-free
# router load balancing through e_score_correction_bias. Deterministic from --seed. Writes work/ckpt.pt.
import argparse
import json
import math
import os
import time

import numpy as np
import torch

from model import M3Model, default_config

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, "work")


def load(name, kind):
    return (np.load(os.path.join(WORK, "%s_%s_ids.npy" % (name, kind))).astype(np.int64),
            np.load(os.path.join(WORK, "%s_%s_offs.npy" % (name, kind))))


def make_seq(rng, data, T):
    """T+1 tokens: documents from a random one onward (wrapping)."""
    ids, offs = data
    nd = len(offs) - 1
    d = rng.integers(nd)
    start = offs[d]
    if start + T + 1 <= len(ids):
        return ids[start:start + T + 1]
    return np.concatenate([ids[start:], ids[:T + 1]])[:T + 1]


def batch(rng, datasets, probs, B, T):
    out = []
    for _ in range(B):
        k = rng.choice(len(datasets), p=probs)
        out.append(make_seq(rng, datasets[k], T))
    return torch.from_numpy(np.stack(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=768)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--conv-frac", type=float, default=0.6)
    ap.add_argument("--out", default=os.path.join(WORK, "ckpt.pt"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--qat-from", type=float, default=0.75, help="fraction of steps after which fake quant is on")
    ap.add_argument("--kl-every", type=int, default=4)
    ap.add_argument("--init", default=None, help="continue from this checkpoint (new schedule)")
    ap.add_argument("--mix", default=None, help="datasets (work/<name>_{ids,offs}.npy) and weights, name:w,...")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    vocab = json.load(open(os.path.join(WORK, "..", "..", "..", "models", "demo", "tokenizer.json")))
    vocab_size = len(vocab["model"]["vocab"]) + len(vocab["added_tokens"])
    cfg = default_config(vocab_size)
    model = M3Model(cfg, seed=args.seed)
    if args.init:
        model.load_state_dict(torch.load(args.init)["model"])
    n_params = sum(p.numel() for p in model.parameters())
    print("parameters: %d (%.2f M)" % (n_params, n_params / 1e6), flush=True)
    if args.mix:  # e.g. "train_kjv:0.2,train_conv:0.15,train3_conv:0.65"
        parts = [p.split(":") for p in args.mix.split(",")]
        datasets = [load(*n.rsplit("_", 1)) for n, _ in parts]
        probs = np.array([float(w) for _, w in parts])
        probs = list(probs / probs.sum())
    else:
        datasets = [load("train", "kjv"), load("train", "conv")]
        probs = [1 - args.conv_frac, args.conv_frac]
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "gate.weight" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "gate.weight" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    warm = max(20, args.steps // 30)
    t0 = time.time()
    for step in range(args.steps):
        lr = args.lr * (step + 1) / warm if step < warm else \
            args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, args.steps - warm))))
        for g in opt.param_groups:
            g["lr"] = lr
        model.set_fake_quant(step >= int(args.qat_from * args.steps))
        want_kl = step % args.kl_every == 0
        x = batch(rng, datasets, probs, args.batch, args.seq)
        logits, kl = model(x[:, :-1], want_kl=want_kl)
        if kl is None:
            kl = torch.zeros(())
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss = ce + kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():  # aux-loss-free balancing: nudge the selection bias toward uniform load
            for layer in model.layers:
                if layer.is_moe:
                    moe = layer.block_sparse_moe
                    ld = moe.last_load
                    moe.e_score_correction_bias += 1e-3 * torch.sign(ld.mean() - ld)
        if step % 10 == 0 or step == args.steps - 1:
            el = time.time() - t0
            print("step %d/%d loss %.4f ce %.4f kl %.4f lr %.2e  %.0f tok/s  %.0fs" % (
                step, args.steps, loss.item(), ce.item(), kl.item(), lr,
                (step + 1) * args.batch * args.seq / el, el), flush=True)
        if (step + 1) % 100 == 0 or step == args.steps - 1:
            torch.save({"config": cfg, "model": model.state_dict(), "step": step + 1}, args.out + ".tmp")
            os.replace(args.out + ".tmp", args.out)
    print("training time %.0f s" % (time.time() - t0), flush=True)


if __name__ == "__main__":
    main()
