#!/usr/bin/env python3
"""Float64 PyTorch reference of the M3 vision tower (model.md section 9) for
tests/unit/model/vision_tower_test.cpp, written for the tests from the spec: Conv3d patch embedding
as a matmul, pre_layrnorm, pre-LN CLIP layers with bidirectional attention confined to each image and
the 3-D rotate-half RoPE (head_dim // 6 frequencies per axis, the last dims passed through), no
post-LN, the per-patch projector, the 2x2 merge and its MLP. Weights are read from the checkpoint's
safetensors (BF16 / F32) and widened to float64. A video grid (t > 1) attends in segments of at most
vision_config.vision_segment_max_frames temporal groups, RoPE t counted from 0 in each (model.md 9.4-9.5,
vLLM's _apply_max_frames_limit).

usage: vision_tower_reference.py CHECKPOINT_DIR PATCHES_F32 GRIDS_JSON OUT_F64
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch

torch.set_default_dtype(torch.float64)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        raw = np.frombuffer(data[a:b], dtype=np.uint8)
        if meta["dtype"] == "F32":
            arr = raw.view(np.float32).astype(np.float64)
        elif meta["dtype"] == "BF16":
            arr = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            continue
        out[name] = torch.from_numpy(arr.reshape(meta["shape"]).copy())
    return out


def main():
    ckpt, patches_path, grids_path, out_path = sys.argv[1:5]
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    vc = cfg["vision_config"]
    W = load_safetensors(os.path.join(ckpt, "model.safetensors"))
    H, NH, L = vc["hidden_size"], vc["num_attention_heads"], vc["num_hidden_layers"]
    D = H // NH
    eps = vc.get("layer_norm_eps", 1e-5)
    theta = vc.get("rope_theta", 10000.0)
    M = 2
    grids = json.load(open(grids_path))
    max_f = vc.get("vision_segment_max_frames")
    segs = []
    for t, gh, gw in grids:
        if not max_f or t <= max_f:
            segs.append((t, gh, gw))
        else:
            segs.extend((min(max_f, t - i), gh, gw) for i in range(0, t, max_f))
    pd = 3 * 2 * 14 * 14
    x = torch.from_numpy(np.fromfile(patches_path, dtype=np.float32).astype(np.float64)).reshape(-1, pd)
    VM = "vision_tower.vision_model."

    def lin(h, base):
        return h @ W[base + ".weight"].T + W[base + ".bias"]

    def ln(h, base):
        return torch.nn.functional.layer_norm(h, (H,), W[base + ".weight"], W[base + ".bias"], eps)

    def gelu(h):
        return 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))

    h = x @ W[VM + "embeddings.patch_embedding.weight"].reshape(H, pd).T
    h = ln(h, VM + "pre_layrnorm")
    # Positions (t, h, w) in merge-window order and the rotary angles.
    F = D // 6
    inv = theta ** (-torch.arange(0, F, dtype=torch.float64) * 2 / (2 * F))
    pos = []
    for t, gh, gw in segs:
        for tt in range(t):
            for bh in range(gh // M):
                for bw in range(gw // M):
                    for mh in range(M):
                        for mw in range(M):
                            pos.append((tt, bh * M + mh, bw * M + mw))
    pos = torch.tensor(pos, dtype=torch.float64)
    freqs = torch.cat([pos[:, a:a + 1] * inv[None, :] for a in range(3)], dim=1)  # [T, 3F]
    emb = torch.cat([freqs, freqs], dim=1)  # [T, 6F]
    cos, sin = emb.cos(), emb.sin()
    R = 6 * F

    def rope(z):  # z [T, NH, D]
        r, rest = z[..., :R], z[..., R:]
        rot = torch.cat([-r[..., R // 2:], r[..., :R // 2]], dim=-1)
        return torch.cat([r * cos[:, None, :] + rot * sin[:, None, :], rest], dim=-1)

    bounds = []
    off = 0
    for t, gh, gw in segs:
        bounds.append((off, off + t * gh * gw))
        off += t * gh * gw
    T = h.shape[0]
    for l in range(L):
        P = VM + f"encoder.layers.{l}."
        a = ln(h, P + "layer_norm1")
        q = rope(lin(a, P + "self_attn.q_proj").reshape(T, NH, D))
        k = rope(lin(a, P + "self_attn.k_proj").reshape(T, NH, D))
        v = lin(a, P + "self_attn.v_proj").reshape(T, NH, D)
        o = torch.zeros(T, NH, D)
        for s, e in bounds:
            sc = torch.einsum("ihd,jhd->hij", q[s:e], k[s:e]) / math.sqrt(D)
            o[s:e] = torch.einsum("hij,jhd->ihd", sc.softmax(-1), v[s:e])
        h = h + lin(o.reshape(T, H), P + "self_attn.out_proj")
        h = h + lin(gelu(lin(ln(h, P + "layer_norm2"), P + "mlp.fc1")), P + "mlp.fc2")
    p = lin(gelu(lin(h, "multi_modal_projector.linear_1")), "multi_modal_projector.linear_2")
    p = p.reshape(T // 4, -1)
    y = lin(gelu(lin(p, "patch_merge_mlp.linear_1")), "patch_merge_mlp.linear_2")
    y.numpy().astype(np.float64).tofile(out_path)


if __name__ == "__main__":
    main()
