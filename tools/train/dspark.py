# Trains and exports the demo model's DSpark draft (models/demo/dspark/; docs/serving.md section 1,
# docs/model.md section 3.8): fused target-layer taps -> fc -> hidden_norm as context K/V, a non-causal block of
# dspark_block_size slots (anchor + noise tokens) through small dense decoder layers, the target's lm_head,
# a low-rank Markov head and a confidence head. Trained on the (dequantised) target's hidden states to predict
# the target's greedy tokens; reports acceptance length at 3 and 7 draft tokens (greedy verification, exact
# simulation along target-greedy trajectories).
import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from bpe import Tokenizer
from export import DEFAULT_OUT, bf16_bits, load_dequantised, mxfp8_encode, write_safetensors
from model import MLP, Linear, RMSNorm, apply_rope, rope_tables

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, "work")


class DraftLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, d = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.d, self.rot = c["num_attention_heads"], c["num_key_value_heads"], d, c["rotary_dim"]
        std = 0.02
        self.input_layernorm = RMSNorm(h, 1e-6)
        self.post_attention_layernorm = RMSNorm(h, 1e-6)
        self.q_proj = Linear(h, self.nh * d, "mxfp8", std)
        self.k_proj = Linear(h, self.nkv * d, "mxfp8", std)
        self.v_proj = Linear(h, self.nkv * d, "mxfp8", std)
        self.o_proj = Linear(self.nh * d, h, "mxfp8", std / 2)
        self.q_norm = RMSNorm(d, 1e-6)
        self.k_norm = RMSNorm(d, 1e-6)
        self.mlp = MLP(h, c["dense_intermediate_size"], "mxfp8", std, std / 2)

    def context_kv(self, ctx, cos, sin):
        """ctx [B, T, H] fused features -> K [B, T, nkv, d] (k_norm + RoPE, no input norm), V."""
        B, T, _ = ctx.shape
        k = apply_rope(self.k_norm(self.k_proj(ctx).view(B, T, self.nkv, self.d)), cos, sin, self.rot)
        return k, self.v_proj(ctx).view(B, T, self.nkv, self.d)

    def forward(self, x, pos, ck, cv, ctx_mask):
        """x [B, A, S, H] block slots at positions pos [B, A, S]; ck/cv [B, T, nkv, d]; ctx_mask [B, A, T]."""
        B, A, S, H = x.shape
        a = self.input_layernorm(x)
        q = self.q_norm(self.q_proj(a).view(B, A, S, self.nh, self.d))
        k = self.k_norm(self.k_proj(a).view(B, A, S, self.nkv, self.d))
        v = self.v_proj(a).view(B, A, S, self.nkv, self.d)
        cos, sin = rope_tables(int(pos.max()) + 1, self.rot, self.theta)
        c, s = cos[pos][..., None, :], sin[pos][..., None, :]
        hr = self.rot // 2

        def rope(t):
            t1, t2, rest = t[..., :hr], t[..., hr:self.rot], t[..., self.rot:]
            return torch.cat([t1 * c - t2 * s, t2 * c + t1 * s, rest], -1)

        q, k = rope(q), rope(k)
        G = self.nh // self.nkv
        qg = q.view(B, A, S, self.nkv, G, self.d)
        sc_ctx = torch.einsum("basgjd,btgd->basgjt", qg, ck) / math.sqrt(self.d)  # [B,A,S,nkv,G,T]
        sc_ctx = sc_ctx.masked_fill(~ctx_mask[:, :, None, None, None, :], float("-inf"))
        sc_blk = torch.einsum("basgjd,bargd->basgjr", qg, k) / math.sqrt(self.d)  # non-causal within block
        p = torch.softmax(torch.cat([sc_ctx, sc_blk], -1), -1)
        T = ck.shape[1]
        o = torch.einsum("basgjt,btgd->basgjd", p[..., :T], cv) + torch.einsum("basgjr,bargd->basgjd", p[..., T:], v)
        x = x + self.o_proj(o.reshape(B, A, S, self.nh * self.d))
        return x + self.mlp(self.post_attention_layernorm(x))


class DSpark(nn.Module):
    def __init__(self, c, target):
        super().__init__()
        self.c = c
        h, r = c["hidden_size"], c["dspark_markov_rank"]
        self.fc = Linear(h * len(c["dspark_target_layer_ids"]), h, "bf16", 0.02)
        self.hidden_norm = RMSNorm(h, 1e-6)
        self.final_norm = RMSNorm(h, 1e-6)
        self.layers = nn.ModuleList([DraftLayer(c) for _ in range(c["num_hidden_layers"])])
        for l in self.layers:
            l.theta = c["rope_theta"]
        V = c["vocab_size"]
        self.markov_w1 = nn.Parameter(torch.randn(V, r) * 0.02)
        self.markov_w2 = nn.Parameter(torch.zeros(V, r))
        self.conf = nn.Linear(h + r, 1)
        self.embed = target.embed_tokens.weight.detach()
        self.lm_head = target.lm_head.weight.detach()

    def fuse(self, taps):
        return self.hidden_norm(self.fc(taps))

    def block_logits(self, ctx, anchors, anchor_pos, ctx_mask):
        """ctx [B,T,H]; anchors [B,A] ids; anchor_pos [B,A] -> (z [B,A,S,V] before Markov, x [B,A,S,H])."""
        B, A = anchors.shape
        S = self.c["dspark_block_size"]
        x = self.embed[self.c["dspark_noise_token_id"]].expand(B, A, S, -1).clone()
        x[:, :, 0] = self.embed[anchors]
        pos = anchor_pos[..., None] + torch.arange(S)
        T = ctx.shape[1]
        cos, sin = rope_tables(T, self.c["rotary_dim"], self.c["rope_theta"])
        for l in self.layers:
            ck, cv = l.context_kv(ctx, cos, sin)
            x = l(x, pos, ck, cv, ctx_mask)
        h = self.final_norm(x)
        return h @ self.lm_head.t(), h

    def markov(self, prev):
        return self.markov_w1[prev] @ self.markov_w2.t()

    def confidence(self, h, prev):
        return self.conf(torch.cat([h, self.markov_w1[prev]], -1)).squeeze(-1)


def draft_config(tc, noise_id):
    L = tc["num_hidden_layers"]
    return {
        "num_hidden_layers": 2, "layer_types": ["sliding_attention"] * 2, "sliding_window": 4096,
        "hidden_size": tc["hidden_size"], "vocab_size": tc["vocab_size"], "num_attention_heads": tc["num_attention_heads"],
        "num_key_value_heads": tc["num_key_value_heads"], "head_dim": tc["head_dim"], "rotary_dim": tc["rotary_dim"],
        "partial_rotary_factor": tc["partial_rotary_factor"], "rope_theta": tc["rope_theta"],
        "rms_norm_eps": tc["rms_norm_eps"], "hidden_act": "swigluoai", "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
        "dense_intermediate_size": 512, "dspark_ffn_hidden_size": 512, "moe_layer_freq": [0, 0],
        "use_gemma_norm": True, "use_qk_norm": True, "qk_norm_type": "per_head", "sparse_attention_config": None,
        "dspark_block_size": 7, "dspark_noise_token_id": noise_id, "dspark_target_layer_ids": list(range(L)),
        "dspark_markov_rank": 32, "dspark_markov_head_type": "vanilla", "enable_confidence_head": True,
        "confidence_head_with_markov": True, "dspark_config": {"hybrid_context_fusion": False},
        "max_position_embeddings": tc["max_position_embeddings"], "tie_word_embeddings": False,
    }


@torch.no_grad()
def target_pass(target, ids, taps_ids):
    logits, _, hidden = target(ids, return_hidden=True)
    return torch.cat([hidden[i] for i in taps_ids], -1), logits.argmax(-1)


def sample_sequences(n, T, seed):
    rng = np.random.default_rng(seed)
    out = []
    for kind, frac in (("conv", 0.6), ("kjv", 0.4)):
        ids = np.load(os.path.join(WORK, "train_%s_ids.npy" % kind)).astype(np.int64)
        offs = np.load(os.path.join(WORK, "train_%s_offs.npy" % kind))
        for _ in range(int(n * frac)):
            s = offs[rng.integers(len(offs) - 1)]
            s = min(s, len(ids) - T)
            out.append(ids[s:s + T])
    return torch.from_numpy(np.stack(out))


def draft_tokens(dm, taps, anchor, p, k):
    """Greedy draft of k tokens for anchor at position p with context features taps[:, :p]."""
    ctx = dm.fuse(taps[:, :p]) if p > 0 else dm.fuse(taps[:, :1])
    mask = torch.ones(1, 1, ctx.shape[1], dtype=torch.bool) if p > 0 else torch.zeros(1, 1, 1, dtype=torch.bool)
    z, h = dm.block_logits(ctx, torch.tensor([[anchor]]), torch.tensor([[p]]), mask)
    out, prev = [], anchor
    for j in range(k):
        t = int((z[0, 0, j] + dm.markov(torch.tensor(prev))).argmax())
        out.append(t)
        prev = t
    return out


@torch.no_grad()
def acceptance(dm, target, trajectories, start, ks=(3, 7)):
    """Exact greedy-verification acceptance length along target-greedy trajectories."""
    res = {}
    for k in ks:
        steps = emitted = 0
        for traj in trajectories:
            taps, _ = target_pass(target, traj[None], dm.c["dspark_target_layer_ids"])
            p = traj.shape[0] - start  # the first generated token is the first anchor
            while p < traj.shape[0] - 1 - k:
                d = draft_tokens(dm, taps, int(traj[p]), p, k)
                tau = 0
                while tau < k and d[tau] == int(traj[p + 1 + tau]):
                    tau += 1
                steps += 1
                emitted += tau + 1
                p += tau + 1
        res[k] = emitted / max(1, steps)
    return res


@torch.no_grad()
def greedy_trajectory(target, ids, n):
    ids = list(ids)
    for _ in range(n):
        ids.append(int(target(torch.tensor([ids]))[0][0, -1].argmax()))
    return torch.tensor(ids)


def export_dspark(dm, outdir):
    os.makedirs(outdir, exist_ok=True)
    P = "language_model.model.dspark."
    t = {}
    bf = lambda a: ("BF16", bf16_bits(a.detach().float().numpy()))
    t[P + "fc.weight"] = bf(dm.fc.weight)
    t[P + "hidden_norm.weight"] = bf(dm.hidden_norm.weight)
    t[P + "final_norm.weight"] = bf(dm.final_norm.weight)
    t[P + "markov_head.markov_w1.weight"] = bf(dm.markov_w1)
    t[P + "markov_head.markov_w2.weight"] = bf(dm.markov_w2)
    t[P + "confidence_head.proj.weight"] = bf(dm.conf.weight)
    t[P + "confidence_head.proj.bias"] = bf(dm.conf.bias)
    for i, l in enumerate(dm.layers):
        q = P + "layers.%d.decoder_layer." % i
        t[q + "input_layernorm.weight"] = bf(l.input_layernorm.weight)
        t[q + "post_attention_layernorm.weight"] = bf(l.post_attention_layernorm.weight)
        t[q + "self_attn.q_norm.weight"] = bf(l.q_norm.weight)
        t[q + "self_attn.k_norm.weight"] = bf(l.k_norm.weight)
        for name, lin in (("self_attn.q_proj", l.q_proj), ("self_attn.k_proj", l.k_proj), ("self_attn.v_proj", l.v_proj),
                          ("self_attn.o_proj", l.o_proj), ("mlp.gate_proj", l.mlp.gate_proj),
                          ("mlp.up_proj", l.mlp.up_proj), ("mlp.down_proj", l.mlp.down_proj)):
            w8, sc, _ = mxfp8_encode(lin.weight.detach().float().numpy())
            t[q + name + ".weight"] = ("F8_E4M3", w8)
            t[q + name + ".weight_scale_inv"] = ("U8", sc)
    size = write_safetensors(os.path.join(outdir, "model.safetensors"), t)
    json.dump({"metadata": {"total_size": size}, "weight_map": {n: "model.safetensors" for n in sorted(t)}},
              open(os.path.join(outdir, "model.safetensors.index.json"), "w"), indent=2)
    cfg = {"architectures": ["DSparkMiniMaxDraftModel"], "model_type": "dspark_minimax_m3",
           "text_config": dm.c, "torch_dtype": "bfloat16",
           "quantization_config": {"quant_method": "mxfp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                   "weight_block_size": [1, 32]}}
    json.dump(cfg, open(os.path.join(outdir, "config.json"), "w"), indent=2)
    print("dspark: %d tensors, %.2f MB" % (len(t), size / 1e6))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default=os.path.join(WORK, "ckpt.pt"))
    ap.add_argument("--out", default=os.path.join(DEFAULT_OUT, "dspark"))
    ap.add_argument("--seqs", type=int, default=160)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--traj-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=3, help="held-out tool prompts and as many KJV prompts")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    target = load_dequantised(args.ckpt)
    for p in target.parameters():
        p.requires_grad_(False)
    tok = Tokenizer(os.path.join(DEFAULT_OUT, "tokenizer.json"))
    c = draft_config(target.c, tok.added["]<]minimax[>["])
    dm = DSpark(c, target)
    T = 512
    t0 = time.time()
    seqs = sample_sequences(args.seqs, T, args.seed)
    taps, labels = [], []
    for i in range(0, len(seqs), 4):
        a, b = target_pass(target, seqs[i:i + 4], c["dspark_target_layer_ids"])
        taps.append(a)
        labels.append(b)
    taps, labels = torch.cat(taps), torch.cat(labels)  # labels[p] = target greedy token after position p
    print("target features for %d sequences: %.0fs" % (len(seqs), time.time() - t0), flush=True)
    S = c["dspark_block_size"]
    params = [p for n, p in dm.named_parameters()]
    opt = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.0)
    rng = np.random.default_rng(args.seed)
    B, A = 8, 24
    for step in range(args.steps):
        lr = 2e-3 * min(1.0, (step + 1) / 30) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        bi = torch.from_numpy(rng.integers(len(seqs), size=B))
        ids, tp, lab = seqs[bi], taps[bi], labels[bi]
        pos = torch.from_numpy(rng.integers(1, T - S - 1, size=(B, A)))
        ctx = dm.fuse(tp)
        ctx_mask = torch.arange(T)[None, None, :] < pos[..., None]
        anchors = torch.gather(ids, 1, pos)
        z, h = dm.block_logits(ctx, anchors, pos, ctx_mask)
        jpos = pos[..., None] + torch.arange(S)  # slot j predicts the target's token after position p+j
        y = torch.gather(lab, 1, jpos.view(B, -1)).view(B, A, S)
        prev = torch.cat([anchors[..., None], torch.gather(lab, 1, (jpos[..., :-1]).reshape(B, -1)).view(B, A, S - 1)], -1)
        logits = z + dm.markov(prev)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        hit = (logits.argmax(-1) == y).float()
        conf = F.binary_cross_entropy_with_logits(dm.confidence(h.detach(), prev), hit)
        loss = ce + 0.1 * conf
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0 or step == args.steps - 1:
            print("dspark step %d ce %.4f conf %.4f acc/slot %s %.0fs" % (
                step, ce.item(), conf.item(), [round(v, 2) for v in hit.mean((0, 1)).tolist()], time.time() - t0),
                flush=True)
    export_dspark(dm, args.out)
    torch.save(dm.state_dict(), os.path.join(WORK, "dspark.pt"))
    # Acceptance along target-greedy continuations of held-out prompts.
    tasks = [json.loads(l) for l in open(os.path.join(WORK, "eval_tasks.jsonl"))][:args.prompts]
    held = json.load(open(os.path.join(WORK, "heldout.json")))
    prompts = [tok.encode(t["prompt"]) for t in tasks] + [tok.encode(k[:600]) for k in held["kjv"][:args.prompts]]
    trajs = [greedy_trajectory(target, p[-400:], args.traj_tokens) for p in prompts]
    al = acceptance(dm, target, trajs, args.traj_tokens)
    print(json.dumps({"dspark_acceptance_length": al, "training_time_s": round(time.time() - t0)}), flush=True)
    json.dump({"acceptance_length": al}, open(os.path.join(WORK, "dspark_report.json"), "w"))


if __name__ == "__main__":
    main()
