#!/usr/bin/env python3
# Writes a llama.cpp GGUF (architecture "minimax-m3", BF16) from a BF16 `m3serve make-model` checkpoint,
# so that llama.cpp can be measured on the very weights m3serve runs (docs/benchmarks.md 3.11).
#
# Why our own converter and not llama.cpp's convert_hf_to_gguf.py: that script needs `transformers`
# (AutoConfig at import, AutoTokenizer for the vocabulary) and torch >= 2.1 (float8 dtypes at class
# level); this host has neither as a Debian package. This script needs only numpy and the gguf-py
# package that lives inside the llama.cpp tree (pass --llama-cpp). It writes what that converter's
# MiniMaxM3Model class writes (conversion/minimax.py, checked at llama.cpp 34af94cd9):
#   - the hyper-parameters of TextModel.set_gguf_parameters + MiniMaxM2Model + MiniMaxM3Model;
#   - the tensors under gguf-py's own name map, experts stacked [E, out, in], "+1" baked into every
#     *norm.weight (Gemma-style (1 + w) RMSNorm), F32 for 1-D tensors, norms, the router and the MSA
#     indexer projections, BF16 for the rest (the converter's --outtype bf16);
#   - the vocabulary as _set_vocab_gpt2 does, with pre-tokenizer "minimax-m2" (our tokenizer.json has
#     the M3 split regex, which is MiniMax-M2's).
# What llama.cpp's M3 architecture cannot express is dropped, loudly: MSA index projections on the
# leading dense layers (the M3.1 plan runs MSA on every layer; llama.cpp runs dense attention on the
# leading dense layers) and the vision tower. At contexts below top_k_blocks x block_size (2048 for
# `mid`) MSA selects every block, so dense and sparse attention agree there.
import argparse
import json
import struct
import sys
from pathlib import Path


def fail(msg):
    print(f"gguf_from_mid: {msg}", file=sys.stderr)
    sys.exit(1)


def read_safetensors(path):
    """Yields (name, dtype, shape, memoryview-backed numpy array of raw bytes) for one file."""
    import numpy as np
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        yield name, meta["dtype"], meta["shape"], data[a:b]


def to_f32(dtype, shape, raw):
    import numpy as np
    if dtype == "BF16":
        u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
        return u.view(np.float32).reshape(shape)
    if dtype == "F32":
        return np.frombuffer(raw, dtype=np.float32).reshape(shape).copy()
    fail(f"tensor dtype {dtype} is not BF16/F32: convert a --layout m3-bf16 checkpoint")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True, help="make-model checkpoint directory (--layout m3-bf16)")
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp checkout (its gguf-py is used)")
    ap.add_argument("--out", required=True, help="output .gguf")
    ap.add_argument("--outtype", choices=["bf16", "f32"], default="bf16",
                    help="type of the matrices (bf16, as the checkpoint; f32 for an exact-activation reference)")
    args = ap.parse_args()

    gguf_py = Path(args.llama_cpp) / "gguf-py"
    if not (gguf_py / "gguf" / "__init__.py").is_file():
        fail(f"no gguf-py under {args.llama_cpp!r}: pass a llama.cpp checkout with --llama-cpp")
    sys.path.insert(0, str(gguf_py))
    import numpy as np
    import gguf

    model = Path(args.model)
    cfg = json.loads((model / "config.json").read_text())
    if "quantization_config" in cfg:
        fail(f"{model} is a quantised checkpoint; make one with `m3serve make-model --layout m3-bf16`")
    tc = cfg.get("text_config", cfg)

    arch = gguf.MODEL_ARCH.MINIMAXM3
    n_layer = int(tc["num_hidden_layers"])
    moe_freq = tc["moe_layer_freq"]
    n_dense = 0
    for v in moe_freq:
        if v != 0:
            break
        n_dense += 1
    sac = tc["sparse_attention_config"]
    if tc["shared_intermediate_size"] != tc["intermediate_size"] * tc["n_shared_experts"]:
        fail("llama.cpp assumes shared width = intermediate_size x n_shared_experts; this checkpoint differs")
    if tc.get("scoring_func") != "sigmoid":
        fail("expected a sigmoid router (scoring_func)")

    w = gguf.GGUFWriter(args.out, gguf.MODEL_ARCH_NAMES[arch])
    w.add_name(model.name)
    # TextModel.set_gguf_parameters
    w.add_block_count(n_layer)
    w.add_context_length(int(tc["max_position_embeddings"]))
    w.add_embedding_length(int(tc["hidden_size"]))
    w.add_feed_forward_length(int(tc["dense_intermediate_size"]))
    w.add_head_count(int(tc["num_attention_heads"]))
    w.add_head_count_kv(int(tc["num_key_value_heads"]))
    w.add_rope_freq_base(float(tc["rope_theta"]))
    w.add_layer_norm_rms_eps(float(tc["rms_norm_eps"]))
    w.add_expert_count(int(tc["num_local_experts"]))
    w.add_expert_used_count(int(tc["num_experts_per_tok"]))
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_key_length(int(tc["head_dim"]))
    w.add_value_length(int(tc["head_dim"]))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if args.outtype == "bf16" else gguf.LlamaFileType.ALL_F32)
    # MiniMaxM2Model / MiniMaxM3Model.set_gguf_parameters
    w.add_expert_feed_forward_length(int(tc["intermediate_size"]))
    w.add_rope_dimension_count(int(tc["rotary_dim"]))
    w.add_expert_shared_count(int(tc["n_shared_experts"]))
    w.add_expert_weights_scale(float(tc["routed_scaling_factor"]))
    w.add_expert_weights_norm(True)
    w.add_indexer_head_count(int(sac["sparse_num_index_heads"]))
    w.add_indexer_key_length(int(sac["sparse_index_dim"]))
    w.add_indexer_top_k(int(sac["sparse_topk_blocks"]))
    w.add_indexer_block_size(int(sac["sparse_block_size"]))
    w.add_indexer_local_blocks(int(sac["sparse_local_block"]))
    w.add_leading_dense_block_count(n_dense)
    if int(sac.get("sparse_init_block", 0)) != 0:
        print(f"gguf_from_mid: note: sparse_init_block {sac['sparse_init_block']} is not expressible in llama.cpp "
              "(no sink block); it changes nothing below top_k_blocks x block_size tokens", file=sys.stderr)

    # Vocabulary, as _set_vocab_gpt2 (tokens by id, added specials CONTROL, [PADi] for holes).
    tj = json.loads((model / "tokenizer.json").read_text())
    vocab_size = int(tc["vocab_size"])
    rev = {i: t for t, i in tj["model"]["vocab"].items()}
    added = {a["id"]: a for a in tj.get("added_tokens", [])}
    tokens, toktypes = [], []
    for i in range(vocab_size):
        if i in added:
            tokens.append(added[i]["content"])
            toktypes.append(gguf.TokenType.CONTROL if added[i].get("special") else gguf.TokenType.USER_DEFINED)
        elif i in rev:
            tokens.append(rev[i])
            toktypes.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            toktypes.append(gguf.TokenType.UNUSED)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("minimax-m2")
    w.add_token_list(tokens)
    w.add_token_types(toktypes)
    gguf.SpecialVocab(model, load_merges=True).add_to_gguf(w)

    # Tensors.
    tmap = gguf.get_tensor_name_map(arch, n_layer)
    files = sorted(model.glob("*.safetensors"))
    if not files:
        fail(f"no .safetensors in {model}")
    n_expert = int(tc["num_local_experts"])
    experts = {}  # (layer, w1|w2|w3) -> {expert: f32 array}
    dropped = []
    n_bytes = 0

    def add(hf_name, arr, bid):
        nonlocal n_bytes
        name = hf_name.replace("language_model.", "", 1)
        if name.endswith("e_score_correction_bias"):  # as ModelBase.filter_tensors
            name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            fail(f"no GGUF name for {hf_name}")
        if name.endswith("norm.weight"):
            arr = arr + np.float32(1.0)  # Gemma-style (1 + w), as MiniMaxM3Model.modify_tensors
        f32 = (arr.ndim <= 1 or new.endswith("_norm.weight") or ".indexer." in new
               or new.endswith("ffn_gate_inp.weight") or not new.endswith(".weight"))
        if f32 or args.outtype == "f32":
            data, qt = arr.astype(np.float32), gguf.GGMLQuantizationType.F32
        else:
            qt = gguf.GGMLQuantizationType.BF16
            data = gguf.quants.quantize(arr.astype(np.float32), qt)
        w.add_tensor(new, data, raw_dtype=qt)
        n_bytes += data.nbytes

    for path in files:
        for hf_name, dtype, shape, raw in read_safetensors(path):
            if not hf_name.startswith("language_model."):
                dropped.append(hf_name)  # vision tower and projectors
                continue
            parts = hf_name.split(".")
            bid = int(parts[3]) if len(parts) > 3 and parts[2] == "layers" else None
            if bid is not None and bid < n_dense and ".self_attn.index_" in hf_name:
                dropped.append(hf_name)  # M3.1 plan: MSA on a dense layer, not expressible
                continue
            arr = to_f32(dtype, shape, raw)
            if ".block_sparse_moe.experts." in hf_name:
                e, which = int(parts[6]), parts[7]
                slot = experts.setdefault((bid, which), {})
                slot[e] = arr
                if len(slot) == n_expert:
                    stacked = np.stack([slot[i] for i in range(n_expert)], axis=0)
                    del experts[(bid, which)]
                    add(f"language_model.model.layers.{bid}.block_sparse_moe.experts.{which}.weight", stacked, bid)
                continue
            add(hf_name, arr, bid)
    if experts:
        fail(f"incomplete expert sets: {sorted(experts)}")

    vision = sum(1 for d in dropped if not d.startswith("language_model."))
    if vision:
        print(f"gguf_from_mid: dropped {vision} vision tensors (text model only)", file=sys.stderr)
    for d in dropped:
        if d.startswith("language_model."):
            print(f"gguf_from_mid: dropped {d} (MSA on a leading dense layer: llama.cpp runs dense attention there)",
                  file=sys.stderr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    print(f"gguf_from_mid: wrote {args.out} ({n_bytes / 1e6:.1f} MB of tensors, {n_layer} layers, "
          f"{n_dense} dense, {n_expert} experts top-{tc['num_experts_per_tok']})")


if __name__ == "__main__":
    main()
