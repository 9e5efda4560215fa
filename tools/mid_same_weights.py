#!/usr/bin/env python3
# Checks that make-model checkpoints of one seed in different layouts hold the same BF16 master weights
# (docs/benchmarks.md 3.11: llama.cpp's GGUFs are converted from the m3-bf16 layout, m3serve runs
# m3-mxfp8 and m31). Dequantises a few MXFP8 and NVFP4 matrices and compares them with the BF16 master
# (relative Frobenius error: about 0.026 for E4M3, about 0.1 for NVFP4 E2M1), and checks that the
# tensors two layouts share in one format are byte-identical. Needs numpy only.
# Usage: tools/mid_same_weights.py BF16_DIR MXFP8_DIR M31_DIR
import json
import struct
import sys

import numpy as np


def index(d):
    path = f"{d}/model.safetensors"
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    return {k: (v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items() if k != "__metadata__"}


def bf16(t):
    shape, raw = t
    return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)


def e4m3_table():
    t = np.zeros(256, np.float32)
    for i in range(256):
        s, e, m = -1.0 if i >> 7 else 1.0, (i >> 3) & 15, i & 7
        t[i] = s * (2.0 ** (e - 7) * (1 + m / 8) if e else 2.0 ** -6 * m / 8)
    return t


E4M3 = e4m3_table()
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def mxfp8(ck, base):
    shape, w = ck[base + ".weight"]
    sshape, s = ck[base + ".weight_scale_inv"]
    sc = np.exp2(np.frombuffer(s, np.uint8).astype(np.float32) - 127).reshape(sshape)
    return E4M3[np.frombuffer(w, np.uint8)].reshape(shape) * np.repeat(sc, 32, axis=1)


def nvfp4(ck, base):
    shape, p = ck[base + ".weight_packed"]
    sshape, s = ck[base + ".weight_scale"]
    g = np.frombuffer(bytes(ck[base + ".weight_global_scale"][1]), np.float32)[0]
    p = np.frombuffer(p, np.uint8)
    v = np.stack([E2M1[p & 15], E2M1[p >> 4]], axis=1).reshape(shape[0], shape[1] * 2)
    # the stored global scale divides: value = e2m1 x e4m3 block scale / global
    return v * np.repeat(E4M3[np.frombuffer(s, np.uint8)].reshape(sshape), 16, axis=1) / g


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__ if __doc__ else "usage: mid_same_weights.py BF16_DIR MXFP8_DIR M31_DIR")
    b, x, m = (index(d) for d in sys.argv[1:])
    P = "language_model.model.layers."
    ok = True
    for base in [P + "0.mlp.down_proj", P + "1.self_attn.q_proj", P + "5.block_sparse_moe.shared_experts.up_proj",
                 P + "3.block_sparse_moe.experts.7.w2"]:
        e = rel(mxfp8(x, base), bf16(b[base + ".weight"]))
        line = f"{base}: m3-mxfp8 vs BF16 master {e:.4f}"
        ok &= e < 0.04
        if base + ".weight_packed" in m:
            e4 = rel(nvfp4(m, base), bf16(b[base + ".weight"]))
            line += f"; m31 NVFP4 vs BF16 master {e4:.4f}"
            ok &= e4 < 0.15
        else:
            same = bytes(m[base + ".weight"][1]) == bytes(x[base + ".weight"][1])
            line += f"; m31 MXFP8 bytes identical to m3-mxfp8: {same}"
            ok &= same
        print(line)
    for name in ["language_model.model.embed_tokens.weight", "language_model.lm_head.weight",
                 P + "2.block_sparse_moe.gate.weight", P + "2.block_sparse_moe.e_score_correction_bias"]:
        same = bytes(b[name][1]) == bytes(x[name][1]) == bytes(m[name][1])
        ok &= same
        print(f"{name}: identical in all three: {same}")
    print("same master weights" if ok else "DIFFERENT weights")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
