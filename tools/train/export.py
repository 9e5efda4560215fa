# Exports a trained checkpoint (work/ckpt.pt) to the MiniMax-M3.1 checkpoint format in models/demo/:
# config.json (layout of the golden m31-tiny config), two safetensors shards + index, MXFP8 attention / index /
# dense / shared-expert linears (F8_E4M3 + U8 E8M0 per 1x32), NVFP4 routed experts (compressed-tensors
# weight_packed / weight_scale / weight_global_scale divisor), F32 router + bias, BF16 norms / embed / lm_head,
# generation_config.json. Encoders are numpy, bit-exact per docs/formats.md. Also provides
# load_dequantised(): the PyTorch model with exactly the exported (dequantised) weights, for verification.
import json
import os
import struct
import sys

import numpy as np
import torch

from model import M3Model

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.normpath(os.path.join(HERE, "..", "..", "models", "demo"))


# ------------------------------------------------------------------------------ element encoders
def bf16_bits(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even (no NaNs here)
    return u.astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


E4M3_VALUES = np.array([(0 if e == 0 else 1) * 2.0 ** (e - 7) * (1 + m / 8) if e else m * 2.0 ** -9
                        for e in range(16) for m in range(8)], dtype=np.float64)[:127]  # bytes 0x00..0x7E


def e4m3_encode(x):
    """float -> E4M3FN byte, round to nearest even, saturating (docs/formats.md 1.2)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), 448.0)
    hi = np.searchsorted(E4M3_VALUES, a, side="left").clip(0, 126)
    lo = (hi - 1).clip(0, 126)
    dlo, dhi = a - E4M3_VALUES[lo], E4M3_VALUES[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    code = np.where(a == 0, 0, code).astype(np.uint8)
    neg = (x < 0) & (code != 0)
    return (code | np.where(neg, 0x80, 0)).astype(np.uint8)


def e4m3_decode(b):
    b = np.asarray(b, dtype=np.uint8)
    v = E4M3_VALUES[np.minimum(b & 0x7F, 126)]
    return np.where(b & 0x80, -v, v)


E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


def e2m1_encode(x):
    """float -> 4-bit E2M1 code, round to nearest with ties to the even code, saturating at 6 (docs/formats.md 1.1)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), 6.0)
    hi = np.searchsorted(E2M1_VALUES, a, side="left").clip(0, 7)
    lo = (hi - 1).clip(0, 7)
    dlo, dhi = a - E2M1_VALUES[lo], E2M1_VALUES[hi] - a
    code = np.where((dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0)), hi, lo)
    code = np.where(a == 0, 0, code)
    return (code | np.where((x < 0) & (code != 0), 8, 0)).astype(np.uint8)


def e2m1_decode(c):
    c = np.asarray(c, dtype=np.uint8)
    v = E2M1_VALUES[c & 7]
    return np.where(c & 8, -v, v)


def mxfp8_encode(w):
    """w [N, K] float32 -> (F8_E4M3 bytes [N, K], E8M0 bytes [N, K/32], dequantised float32 [N, K])."""
    n, k = w.shape
    b = w.reshape(n, k // 32, 32).astype(np.float32)
    amax = np.abs(b).max(-1)
    with np.errstate(divide="ignore"):
        e = np.ceil(np.log2(amax.astype(np.float64) / 448.0))
    sb = np.where(amax == 0, 0, np.clip(e + 127, 0, 254)).astype(np.uint8)
    scale = np.exp2(sb.astype(np.float64) - 127)[..., None]
    q = e4m3_encode(b / scale)
    deq = (e4m3_decode(q) * scale).astype(np.float32).reshape(n, k)
    return q.reshape(n, k), sb, deq


def nvfp4_encode(w):
    """w [N, K] -> (packed U8 [N, K/2], E4M3 scale bytes [N, K/16], global divisor f32, dequantised [N, K])."""
    n, k = w.shape
    w = w.astype(np.float32)
    amax = np.float32(max(np.abs(w).max(), 1e-12))
    gdiv = np.float32(6.0 * 448.0) / amax  # weight_global_scale (divisor convention)
    b = w.reshape(n, k // 16, 16)
    s = e4m3_encode(np.abs(b).max(-1).astype(np.float32) / np.float32(6.0) * gdiv)
    sval = (e4m3_decode(s).astype(np.float32) / gdiv)[..., None]  # effective block scale
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.where(sval > 0, e2m1_encode(b / np.where(sval > 0, sval, 1)), 0).astype(np.uint8)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).reshape(n, k // 2).astype(np.uint8)
    deq = (e2m1_decode(codes).astype(np.float32) * e4m3_decode(s).astype(np.float32)[..., None] / gdiv)
    return packed, s, np.array([gdiv], dtype=np.float32), deq.reshape(n, k).astype(np.float32)


# --------------------------------------------------------------------------------- safetensors I/O
DT = {np.dtype(np.uint16): "BF16", np.dtype(np.float32): "F32"}


def write_safetensors(path, tensors):
    """tensors: {name: (dtype_str, np.ndarray of the raw element type)}."""
    header, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, (dt, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return off


# ------------------------------------------------------------------------------------------ export
MXFP8_SUFFIXES = ("q_proj", "k_proj", "v_proj", "o_proj", "index_q_proj", "index_k_proj", "gate_proj", "up_proj",
                  "down_proj")


def to_checkpoint(state):
    """state_dict -> ({checkpoint name: (dtype, array)}, {our param name: dequantised float32 array})."""
    out, deq = {}, {}
    for name, t in state.items():
        a = t.detach().float().numpy()
        base = name[:-len(".weight")] if name.endswith(".weight") else name
        if name == "lm_head.weight":
            ck = "language_model.lm_head.weight"
        else:
            ck = "language_model.model." + name
        leaf = base.split(".")[-1]
        if name.endswith("e_score_correction_bias") or name.endswith("gate.weight"):
            out[ck] = ("F32", a.astype(np.float32))
            deq[name] = a.astype(np.float32)
        elif ".experts." in name and leaf in ("w1", "w2", "w3"):
            packed, s, g, d = nvfp4_encode(a)
            out[ck + "_packed"] = ("U8", packed)
            out[ck + "_scale"] = ("F8_E4M3", s)
            out[ck + "_global_scale"] = ("F32", g)
            deq[name] = d
        elif a.ndim == 2 and leaf in MXFP8_SUFFIXES:
            q, sb, d = mxfp8_encode(a)
            out[ck] = ("F8_E4M3", q)
            out[ck + "_scale_inv"] = ("U8", sb)
            deq[name] = d
        else:  # norms, embed_tokens, lm_head
            bits = bf16_bits(a)
            out[ck] = ("BF16", bits)
            deq[name] = bf16_value(bits)
    return out, deq


def config_json(c, tok):
    tc = dict(c)
    tc.update({"bos_token_id": tok["]~!b["], "eos_token_id": tok["[e~["], "torch_dtype": "bfloat16",
               "architectures": ["MiniMaxM3SparseForCausalLM"], "model_type": "minimax_m3"})
    return {
        "architectures": ["MiniMaxM3SparseForConditionalGeneration"], "model_type": "minimax_m3_vl",
        "text_config": tc, "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "mxfp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [1, 32],
            "moe_quant_algo": "NVFP4", "moe_quant_format": "nvfp4-pack-quantized", "moe_group_size": 16,
            "modules_to_not_convert": ["language_model.lm_head", "language_model.model.embed_tokens",
                                       "re:.*block_sparse_moe\\.gate$"]},
    }


def special_ids(outdir):
    j = json.load(open(os.path.join(outdir, "tokenizer.json")))
    return {t["content"]: t["id"] for t in j["added_tokens"]}


def export(ckpt_path, outdir):
    ck = torch.load(ckpt_path)
    c, state = ck["config"], ck["model"]
    tensors, _ = to_checkpoint(state)
    L = c["num_hidden_layers"]
    shard_of = lambda n: 1 if (".layers." not in n and "embed" in n) or any(
        (".layers.%d." % i) in n for i in range(L // 2)) else 2
    index, total = {}, 0
    for s in (1, 2):
        fn = "model-%05d-of-00002.safetensors" % s
        part = {n: v for n, v in tensors.items() if shard_of(n) == s}
        total += write_safetensors(os.path.join(outdir, fn), part)
        index.update({n: fn for n in part})
    json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(index.items()))},
              open(os.path.join(outdir, "model.safetensors.index.json"), "w"), indent=2)
    tok = special_ids(outdir)
    json.dump(config_json(c, tok), open(os.path.join(outdir, "config.json"), "w"), indent=2)
    json.dump({"bos_token_id": tok["]~!b["], "eos_token_id": tok["[e~["], "do_sample": True, "temperature": 0.6,
               "top_p": 0.9, "top_k": 20}, open(os.path.join(outdir, "generation_config.json"), "w"), indent=2)
    print("exported %d tensors, %.2f MB of weights to %s (trained %s steps)" % (
        len(tensors), total / 1e6, outdir, ck.get("step")))


def load_dequantised(ckpt_path):
    """The PyTorch model whose weights are exactly the exported ones (dequantised), fake quant off."""
    ck = torch.load(ckpt_path)
    _, deq = to_checkpoint(ck["model"])
    m = M3Model(ck["config"])
    m.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in deq.items()})
    m.set_fake_quant(False)
    m.eval()
    return m


def self_test():
    # docs/formats.md 9.1 / 9.4 / 9.2 test vectors
    assert list(e4m3_encode([1.0, -1.0, 0.1, 3.14159, 448, 500])) == [0x38, 0xB8, 0x1D, 0x45, 0x7E, 0x7E]
    assert e4m3_encode([-0.0009])[0] in (0x80, 0x00)
    assert list(e2m1_encode([1.0, -3.0])) == [0x2, 0xD]
    assert list(e2m1_encode([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0])) == [0, 2, 2, 4, 4, 6, 6, 7]
    x = np.array([10, 5, -2.4, 0.3, 1.1, -7.5, 0, 0.9, 2.2, 3.3, 0.01, 4.4, 6.0, -1.6, 0.7, 8.0])
    s = e4m3_encode([1.0 * 10 / 6])[0]
    assert s == 0x3D
    codes = e2m1_encode(x / e4m3_decode(s))
    assert list(codes) == [7, 5, 0xB, 0, 1, 0xE, 0, 1, 3, 4, 0, 5, 6, 0xA, 1, 6]
    packed = codes[0::2] | (codes[1::2] << 4)
    assert bytes(packed.astype(np.uint8)).hex() == "570be1104350a661"


if __name__ == "__main__":
    self_test()
    export(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "work", "ckpt.pt"),
           sys.argv[2] if len(sys.argv) > 2 else DEFAULT_OUT)
