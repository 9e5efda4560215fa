#!/usr/bin/env python3
"""Float64 PyTorch reference of the M3 / M3.1 text model (spec model.md sections 4 and 9.9), written
for the tests from the spec alone and sharing no code with m3serve: Gemma RMSNorm (1 + w), per-head
QK norm before a partial NEOX RoPE, GQA, MSA block-sparse attention on the layers
sparse_attention_freq marks (index branch, raw dot-product scores max-pooled per block, per-group
top-k with the forced init and local blocks), the sigmoid router whose correction bias only selects,
renormalised unbiased weights times routed_scaling_factor, the shared expert, SwiGLU-OAI, dense MLP
layers per moe_layer_freq. Weights: BF16 / F32, MXFP8 (F8_E4M3 + E8M0 scale per 32 along K) and
NVFP4 (compressed-tensors weight_packed / weight_scale / weight_global_scale), dequantised exactly
and widened to float64. Every position is computed in one batch (prefill).

usage: model_reference.py CHECKPOINT_DIR TOKENS_FILE OUT_F32
           [--embeds POSITIONS_FILE EMBEDS_F64]   rows that replace the token embedding (image tokens):
                                                  whitespace-separated positions, raw float64 [n, hidden]
           [--margins OUT_TSV]                    per position: pos, route_margin, block_margin (near ties)
           [--attention sparse|dense]             dense: plain causal attention everywhere (to show that
                                                  MSA selection matters; not the model)
OUT_F32: raw little-endian float32 [n_tokens, vocab].
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch

torch.set_default_dtype(torch.float64)

# ---------------------------------------------------------------------------------------------- weights


def e4m3_table():
    # FN variant: bias 7, no infinities, 0x7f / 0xff are NaN.
    t = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 7
        if e == 0xF and m == 7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * (m / 8.0) * 2.0 ** -6
        else:
            t[b] = s * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return t


E4M3 = e4m3_table()
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


class Checkpoint:
    """Raw tensors of a safetensors checkpoint (one file or shards with an index), read on demand."""

    def __init__(self, d):
        idx = os.path.join(d, "model.safetensors.index.json")
        files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
        self.where = {}
        for fn in files:
            path = os.path.join(d, fn)
            with open(path, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(n))
            data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
            for name, meta in header.items():
                if name != "__metadata__":
                    self.where[name] = (data, meta)

    def has(self, name):
        return name in self.where

    def raw(self, name):
        if name not in self.where:
            raise KeyError(f"tensor {name} is not in the checkpoint")
        data, meta = self.where[name]
        a, b = meta["data_offsets"]
        return np.asarray(data[a:b]), meta["dtype"], meta["shape"]

    def plain(self, name):
        raw, dt, shape = self.raw(name)
        if dt == "F32":
            arr = raw.view(np.float32).astype(np.float64)
        elif dt == "BF16":
            arr = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        elif dt == "F8_E4M3":
            arr = E4M3[raw]
        else:
            raise ValueError(f"{name}: dtype {dt} is not a plain float tensor")
        return arr.reshape(shape)

    def linear(self, base):
        """The [out, in] weight of a Linear at `base` (without ".weight"), dequantised to float64."""
        if self.has(base + ".weight_packed"):  # NVFP4, compressed-tensors packing
            packed, _, shape = self.raw(base + ".weight_packed")
            packed = packed.reshape(shape)
            codes = np.empty((shape[0], shape[1] * 2), dtype=np.uint8)
            codes[:, 0::2] = packed & 0xF  # low nibble: the even element
            codes[:, 1::2] = packed >> 4
            scale = self.plain(base + ".weight_scale")  # E4M3 [N, K/16]
            g = self.plain(base + ".weight_global_scale").reshape(-1)[0]
            # The product code * scale is exact in fp32; the division by the global scale is rounded
            # once in fp32 (the golden README's convention), then widened.
            prod = (E2M1[codes] * np.repeat(scale, 16, axis=1)).astype(np.float32)
            w = (prod / np.float32(g)).astype(np.float32).astype(np.float64)
            return torch.from_numpy(w)
        w = self.plain(base + ".weight")
        if self.has(base + ".weight_scale_inv"):  # MXFP8: one E8M0 exponent per 1 x 32 along K
            s, _, sshape = self.raw(base + ".weight_scale_inv")
            exp = s.reshape(sshape).astype(np.float64) - 127.0
            w = w * np.repeat(np.exp2(exp), 32, axis=1)[:, : w.shape[1]]
        return torch.from_numpy(np.ascontiguousarray(w))

    def vec(self, name):
        return torch.from_numpy(np.ascontiguousarray(self.plain(name)))


# ---------------------------------------------------------------------------------------------- model


def rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * (1.0 + w)


def swiglu_oai(g, u, alpha, limit):
    g = torch.clamp(g, max=limit)
    u = torch.clamp(u, -limit, limit)
    return (u + 1.0) * g * torch.sigmoid(alpha * g)


def rope_tables(T, rd, theta):
    inv = theta ** (-torch.arange(0, rd // 2, dtype=torch.float64) * 2.0 / rd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def rope(x, cos, sin, rd):  # x [T, heads, d]: NEOX rotate-half on the first rd dims
    h = rd // 2
    a, b, rest = x[..., :h], x[..., h:rd], x[..., rd:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([a * c - b * s, b * c + a * s, rest], dim=-1)


def msa_selection(iq, ik, B, K, local, init, margins):
    """Per index head g and query p, the allowed key mask [G, T, T] (block-sparse, causal)."""
    T = ik.shape[0]
    G = iq.shape[1]
    C = (T + B - 1) // B
    pos = torch.arange(T)
    causal = pos[None, :] <= pos[:, None]  # [p, j]
    s = torch.einsum("pgd,jd->gpj", iq, ik)
    s = s.masked_fill(~causal[None], -math.inf)
    pad = C * B - T
    if pad:
        s = torch.cat([s, torch.full((G, T, pad), -math.inf)], dim=-1)
    S = s.reshape(G, T, C, B).amax(-1)  # block max-pool; -inf where no visible key
    cq = pos // B
    blk = torch.arange(C)
    visible = blk[None, :] <= cq[:, None]  # [T, C]
    forced = visible & ((blk[None, :] >= (cq[:, None] - local + 1)) | (blk[None, :] < init))
    score = S.masked_fill(forced[None], math.inf).masked_fill(~visible[None], -math.inf)
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices  # ties: lower block first
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(C).expand_as(order).contiguous())
    kk = torch.clamp(cq + 1, max=K)  # [T]
    keep = (rank < kk[None, :, None]) & visible[None]  # [G, T, C]
    if margins is not None:
        for g in range(G):
            for p in range(T):
                sc = score[g, p]
                chosen = [sc[c].item() for c in range(C) if keep[g, p, c] and not forced[p, c]]
                dropped = [sc[c].item() for c in range(C) if visible[p, c] and not keep[g, p, c]]
                if chosen and dropped:
                    margins[p] = min(margins[p], min(chosen) - max(dropped))
    block_of = pos // B
    return keep[:, :, block_of] & causal[None]  # [G, p, j]


def attention(q, k, v, allowed, scale):
    """q [T, nh, d], k/v [T, nkv, d], allowed [nkv, T, T] (per GQA group) -> [T, nh*d]."""
    T, nh, d = q.shape
    nkv = k.shape[1]
    grp = nh // nkv
    out = torch.empty(T, nh, d)
    for h in range(nh):
        g = h // grp
        sc = (q[:, h, :] @ k[:, g, :].T) * scale
        sc = sc.masked_fill(~allowed[g], -math.inf)
        out[:, h, :] = torch.softmax(sc, dim=-1) @ v[:, g, :]
    return out.reshape(T, nh * d)


def main():
    args = sys.argv[1:]
    if len(args) < 3:
        sys.exit(__doc__)
    ckpt_dir, tokens_path, out_path = args[:3]
    embeds = margins_path = None
    dense = False
    i = 3
    while i < len(args):
        if args[i] == "--embeds" and i + 2 < len(args):
            embeds = (args[i + 1], args[i + 2])
            i += 3
        elif args[i] == "--margins" and i + 1 < len(args):
            margins_path = args[i + 1]
            i += 2
        elif args[i] == "--attention" and i + 1 < len(args) and args[i + 1] in ("sparse", "dense"):
            dense = args[i + 1] == "dense"
            i += 2
        else:
            sys.exit(f"model_reference.py: unknown or incomplete argument {args[i]!r}\n{__doc__}")

    cfg = json.load(open(os.path.join(ckpt_dir, "config.json")))
    tc = cfg.get("text_config", cfg)
    sac = tc.get("sparse_attention_config", {})
    H, L = tc["hidden_size"], tc["num_hidden_layers"]
    nh, nkv, d = tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    eps, theta = tc["rms_norm_eps"], float(tc["rope_theta"])
    rd = tc.get("rotary_dim", int(d * tc.get("partial_rotary_factor", 1.0)))
    alpha, limit = tc.get("swiglu_alpha", 1.702), tc.get("swiglu_limit", 7.0)
    topk, scaling = tc["num_experts_per_tok"], tc.get("routed_scaling_factor", 1.0)
    moe_freq = tc["moe_layer_freq"]
    sparse_freq = sac.get("sparse_attention_freq", [0] * L) if sac.get("use_sparse_attention", False) else [0] * L
    B, KB = sac.get("sparse_block_size", 128), sac.get("sparse_topk_blocks", 16)
    local, init = sac.get("sparse_local_block", 1), sac.get("sparse_init_block", 0)
    if not tc.get("use_gemma_norm", True):
        sys.exit("model_reference.py: only use_gemma_norm = true is modelled")
    if sac.get("use_sparse_attention", False) and sac.get("sparse_num_index_heads", nkv) != nkv:
        sys.exit("model_reference.py: index heads must equal KV heads (one index head per GQA group)")

    W = Checkpoint(ckpt_dir)
    P = "language_model.model."
    ids = [int(w) for w in open(tokens_path).read().split()]
    T = len(ids)
    x = W.vec(P + "embed_tokens.weight")[torch.tensor(ids)].clone()
    if embeds is not None:
        rows = [int(w) for w in open(embeds[0]).read().split()]
        e = torch.from_numpy(np.fromfile(embeds[1], dtype=np.float64)).reshape(len(rows), H)
        for r, p in enumerate(rows):
            x[p] = e[r]
    cos, sin = rope_tables(T, rd, theta)
    route_margin = [math.inf] * T
    block_margin = [math.inf] * T
    pos = torch.arange(T)
    dense_mask = (pos[None, :] <= pos[:, None])[None].expand(nkv, T, T)

    for l in range(L):
        lp = P + f"layers.{l}."
        a = rms(x, W.vec(lp + "input_layernorm.weight"), eps)
        q = (a @ W.linear(lp + "self_attn.q_proj").T).reshape(T, nh, d)
        k = (a @ W.linear(lp + "self_attn.k_proj").T).reshape(T, nkv, d)
        v = (a @ W.linear(lp + "self_attn.v_proj").T).reshape(T, nkv, d)
        q = rope(rms(q, W.vec(lp + "self_attn.q_norm.weight"), eps), cos, sin, rd)
        k = rope(rms(k, W.vec(lp + "self_attn.k_norm.weight"), eps), cos, sin, rd)
        if sparse_freq[l] and not dense:
            di = sac["sparse_index_dim"]
            iq = (a @ W.linear(lp + "self_attn.index_q_proj").T).reshape(T, nkv, di)
            ik = (a @ W.linear(lp + "self_attn.index_k_proj").T).reshape(T, 1, di)
            iq = rope(rms(iq, W.vec(lp + "self_attn.index_q_norm.weight"), eps), cos, sin, rd)
            ik = rope(rms(ik, W.vec(lp + "self_attn.index_k_norm.weight"), eps), cos, sin, rd)[:, 0, :]
            allowed = msa_selection(iq, ik, B, KB, local, init, block_margin if margins_path else None)
        else:
            allowed = dense_mask
        o = attention(q, k, v, allowed, 1.0 / math.sqrt(d))
        x = x + o @ W.linear(lp + "self_attn.o_proj").T
        m = rms(x, W.vec(lp + "post_attention_layernorm.weight"), eps)
        if moe_freq[l]:
            mp = lp + "block_sparse_moe."
            s = torch.sigmoid(m @ W.vec(mp + "gate.weight").T)  # [T, E]
            biased = s + W.vec(mp + "e_score_correction_bias")[None, :]
            order = torch.sort(biased, dim=-1, descending=True, stable=True).indices
            top = order[:, :topk]
            if margins_path:
                srt = torch.gather(biased, 1, order)
                if srt.shape[1] > topk:
                    gap = srt[:, topk - 1] - srt[:, topk]
                    for p in range(T):
                        route_margin[p] = min(route_margin[p], gap[p].item())
            ws = torch.gather(s, 1, top)
            ws = ws / ws.sum(-1, keepdim=True) * scaling
            y = torch.zeros(T, H)
            for e in torch.unique(top).tolist():
                rows, slot = (top == e).nonzero(as_tuple=True)
                ep = mp + f"experts.{e}."
                xe = m[rows]
                he = swiglu_oai(xe @ W.linear(ep + "w1").T, xe @ W.linear(ep + "w3").T, alpha, limit)
                y[rows] += ws[rows, slot][:, None] * (he @ W.linear(ep + "w2").T)
            sp = mp + "shared_experts."
            y += swiglu_oai(m @ W.linear(sp + "gate_proj").T, m @ W.linear(sp + "up_proj").T, alpha, limit) @ \
                W.linear(sp + "down_proj").T
            x = x + y
        else:
            x = x + swiglu_oai(m @ W.linear(lp + "mlp.gate_proj").T, m @ W.linear(lp + "mlp.up_proj").T, alpha,
                               limit) @ W.linear(lp + "mlp.down_proj").T
    h = rms(x, W.vec(P + "norm.weight"), eps)
    logits = h @ W.vec("language_model.lm_head.weight").T
    logits.numpy().astype("<f4").tofile(out_path)
    if margins_path:
        with open(margins_path, "w") as f:
            f.write("pos\troute_margin\tblock_margin\n")
            for p in range(T):
                f.write(f"{p}\t{route_margin[p]:.6g}\t{block_margin[p]:.6g}\n")


if __name__ == "__main__":
    main()
