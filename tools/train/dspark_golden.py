# Reference outputs of the demo's DSpark draft for the C++ parity test (tests/data/demo/dspark_golden.*):
# the PyTorch draft of dspark.py, built from the EXPORTED models/demo/dspark/ bytes (BF16 / MXFP8 decoded
# exactly), fed the taps of the dequantised PyTorch target along a held-out KJV passage. For a few anchor
# positions it records the block pass's pre-Markov logits z_j (slots 0, 3, 6) and the Markov bias after the
# anchor. Run after dspark.py: `python3 dspark_golden.py` (a few seconds).
import argparse
import json
import os
import struct

import numpy as np
import torch

from bpe import Tokenizer
from dspark import DSpark, target_pass
from export import DEFAULT_OUT, bf16_value, e4m3_decode, load_dequantised

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, "work")
ROOT = os.path.dirname(os.path.dirname(HERE))


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    out = {}
    for name, m in hdr.items():
        if name == "__metadata__":
            continue
        a, b = m["data_offsets"]
        out[name] = (m["dtype"], m["shape"], raw[8 + n + a:8 + n + b])
    return out


def decode(ts, name):
    dt, shape, b = ts[name]
    if dt == "BF16":
        return torch.from_numpy(bf16_value(np.frombuffer(b, np.uint16)).astype(np.float32).reshape(shape))
    if dt == "F8_E4M3":
        w = e4m3_decode(np.frombuffer(b, np.uint8)).astype(np.float32).reshape(shape)
        _, sshape, sb = ts[name + "_scale_inv"]
        s = np.exp2(np.frombuffer(sb, np.uint8).astype(np.float32) - 127.0).reshape(sshape)
        return torch.from_numpy((w.reshape(shape[0], -1, 32) * s[:, :, None]).reshape(shape))
    raise ValueError(name + ": " + dt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default=os.path.join(WORK, "ckpt.pt"))
    ap.add_argument("--model", default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    target = load_dequantised(args.ckpt)
    c = json.load(open(os.path.join(args.model, "dspark", "config.json")))["text_config"]
    dm = DSpark(c, target)
    ts = read_safetensors(os.path.join(args.model, "dspark", "model.safetensors"))
    P = "language_model.model.dspark."
    with torch.no_grad():
        dm.fc.weight.copy_(decode(ts, P + "fc.weight"))
        dm.hidden_norm.weight.copy_(decode(ts, P + "hidden_norm.weight"))
        dm.final_norm.weight.copy_(decode(ts, P + "final_norm.weight"))
        dm.markov_w1.copy_(decode(ts, P + "markov_head.markov_w1.weight"))
        dm.markov_w2.copy_(decode(ts, P + "markov_head.markov_w2.weight"))
        for i, l in enumerate(dm.layers):
            q = P + "layers.%d.decoder_layer." % i
            l.input_layernorm.weight.copy_(decode(ts, q + "input_layernorm.weight"))
            l.post_attention_layernorm.weight.copy_(decode(ts, q + "post_attention_layernorm.weight"))
            l.q_norm.weight.copy_(decode(ts, q + "self_attn.q_norm.weight"))
            l.k_norm.weight.copy_(decode(ts, q + "self_attn.k_norm.weight"))
            for name, lin in (("self_attn.q_proj", l.q_proj), ("self_attn.k_proj", l.k_proj),
                              ("self_attn.v_proj", l.v_proj), ("self_attn.o_proj", l.o_proj),
                              ("mlp.gate_proj", l.mlp.gate_proj), ("mlp.up_proj", l.mlp.up_proj),
                              ("mlp.down_proj", l.mlp.down_proj)):
                lin.weight.copy_(decode(ts, q + name + ".weight"))
    for m in dm.modules():
        if hasattr(m, "fq"):
            m.fq = False
    tok = Tokenizer(os.path.join(args.model, "tokenizer.json"))
    held = json.load(open(os.path.join(WORK, "heldout.json")))
    ids = tok.encode(held["kjv"][0])[:300]
    taps, _ = target_pass(target, torch.tensor([ids]), c["dspark_target_layer_ids"])
    slots = [0, 3, 6]
    cases, blob = [], []
    with torch.no_grad():
        for p in (1, 97, 290):
            ctx = dm.fuse(taps[:, :p])
            mask = torch.ones(1, 1, p, dtype=torch.bool)
            z, _ = dm.block_logits(ctx, torch.tensor([[ids[p]]]), torch.tensor([[p]]), mask)
            for j in slots:
                blob.append(z[0, 0, j].numpy().astype(np.float32))
            blob.append(dm.markov(torch.tensor(ids[p])).numpy().astype(np.float32))
            cases.append({"pos": p, "anchor": ids[p]})
    d = os.path.join(ROOT, "tests", "data", "demo")
    np.concatenate(blob).tofile(os.path.join(d, "dspark_golden.f32"))
    json.dump({"tokens": ids, "slots": slots, "cases": cases, "vocab": c["vocab_size"],
               "layout": "per case: z of each slot in `slots`, then the Markov bias after the anchor; float32"},
              open(os.path.join(d, "dspark_golden.json"), "w"))
    print("wrote %d cases" % len(cases))


if __name__ == "__main__":
    main()
