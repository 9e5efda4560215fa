# PyTorch implementation of the MiniMax-M3.1 text model (written from docs/model.md section 4) used to
# train the demo model: Gemma (1+w) RMSNorms, per-head QK norm, partial NEOX RoPE, MSA on every layer (index
# branch + per-GQA-group block top-k attention with forced init/local blocks), leading dense SwiGLU-OAI MLP
# layer(s), then MoE layers (sigmoid router, e_score_correction_bias for selection only, renormalised top-k x
# routed_scaling_factor, unscaled shared expert). Optional fake quantisation (MXFP8 for dense/attention/index/
# shared weights, NVFP4 for routed experts, BF16 for norms/embeddings) with straight-through gradients.
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# ------------------------------------------------------------------------------- fake quantisation
def round_e4m3(x):
    """Round to the nearest E4M3FN value (ties to even), saturating at +-448."""
    a = x.abs().clamp(max=448.0)
    e = torch.floor(torch.log2(a.clamp(min=2.0 ** -30))).clamp(min=-6.0)
    step = torch.exp2(e - 3.0)
    return torch.sign(x) * (torch.round(a / step) * step).clamp(max=448.0)


def round_e2m1(x):
    """Round to the nearest E2M1 value (ties to even code), saturating at +-6."""
    a = x.abs().clamp(max=6.0)
    e = torch.floor(torch.log2(a.clamp(min=2.0 ** -30))).clamp(min=0.0)
    step = torch.exp2(e - 1.0)
    return torch.sign(x) * (torch.round(a / step) * step).clamp(max=6.0)


def mxfp8_dequant(w):
    """MXFP8 (E4M3 elements, E8M0 scale per 1x32 block along the input dim), returned dequantised."""
    n, k = w.shape
    b = w.reshape(n, k // 32, 32)
    amax = b.abs().amax(dim=-1, keepdim=True)
    ex = torch.ceil(torch.log2(amax.clamp(min=2.0 ** -127) / 448.0)).clamp(-127, 127)
    scale = torch.exp2(ex)
    return (round_e4m3(b / scale) * scale).reshape(n, k)


def nvfp4_dequant(w):
    """NVFP4 (E2M1 elements, E4M3 scale per 16 along the input dim, FP32 global), returned dequantised."""
    n, k = w.shape
    amax = w.abs().max().clamp(min=1e-12)
    ws2 = amax / (6.0 * 448.0)
    b = w.reshape(n, k // 16, 16)
    s = round_e4m3(b.abs().amax(dim=-1, keepdim=True) / (6.0 * ws2))
    denom = (s * ws2)
    q = torch.where(denom > 0, round_e2m1(b / denom.clamp(min=1e-30)), torch.zeros_like(b))
    return (q * denom).reshape(n, k)


def ste(w, fn):
    return w + (fn(w.detach()) - w.detach())


def bf16(w):
    return w.to(torch.bfloat16).to(torch.float32)


# ------------------------------------------------------------------------------------------ modules
class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps
        self.fq = False

    def forward(self, x):
        w = ste(self.weight, bf16) if self.fq else self.weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + w)


class Linear(nn.Module):
    """y = x W^T with W [out, in]; quant in {None, 'mxfp8', 'nvfp4', 'bf16'} applied when fq is on."""

    def __init__(self, n_in, n_out, quant, std):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * std)
        self.quant = quant
        self.fq = False

    def w(self):
        if not self.fq or self.quant is None:
            return self.weight
        return ste(self.weight, {"mxfp8": mxfp8_dequant, "nvfp4": nvfp4_dequant, "bf16": bf16}[self.quant])

    def forward(self, x):
        return x @ self.w().t()


def swiglu_oai(g, u, alpha=1.702, limit=7.0):
    g = g.clamp(max=limit)
    u = u.clamp(min=-limit, max=limit)
    return (u + 1.0) * g * torch.sigmoid(alpha * g)


class MLP(nn.Module):
    def __init__(self, h, inter, quant, std, std_out):
        super().__init__()
        self.gate_proj = Linear(h, inter, quant, std)
        self.up_proj = Linear(h, inter, quant, std)
        self.down_proj = Linear(inter, h, quant, std_out)

    def forward(self, x):
        return self.down_proj(swiglu_oai(self.gate_proj(x), self.up_proj(x)))


class Expert(nn.Module):
    def __init__(self, h, inter, std, std_out):
        super().__init__()
        self.w1 = Linear(h, inter, "nvfp4", std)  # gate
        self.w3 = Linear(h, inter, "nvfp4", std)  # up
        self.w2 = Linear(inter, h, "nvfp4", std_out)  # down

    def forward(self, x):
        return self.w2(swiglu_oai(self.w1(x), self.w3(x)))


class Gate(nn.Module):
    def __init__(self, h, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, h) * 0.02)


class MoE(nn.Module):
    def __init__(self, c, std, std_out):
        super().__init__()
        h, n = c["hidden_size"], c["num_local_experts"]
        self.gate = Gate(h, n)
        self.register_buffer("e_score_correction_bias", torch.zeros(n))
        self.experts = nn.ModuleList([Expert(h, c["intermediate_size"], std, std_out) for _ in range(n)])
        self.shared_experts = MLP(h, c["shared_intermediate_size"], "mxfp8", std, std_out)
        self.k = c["num_experts_per_tok"]
        self.scale = c["routed_scaling_factor"]
        self.last_load = None

    def forward(self, x):
        shp = x.shape
        x2 = x.reshape(-1, shp[-1])
        s = torch.sigmoid(x2.float() @ self.gate.weight.t())
        _, sel = torch.topk(s + self.e_score_correction_bias, self.k, dim=-1)
        ws = torch.gather(s, 1, sel)
        ws = ws / ws.sum(-1, keepdim=True) * self.scale
        out = self.shared_experts(x2)
        load = torch.zeros(len(self.experts))
        for e, ex in enumerate(self.experts):
            tok, slot = torch.nonzero(sel == e, as_tuple=True)
            load[e] = tok.numel()
            if tok.numel() == 0:
                continue
            y = ex(x2.index_select(0, tok)) * ws[tok, slot].unsqueeze(-1)
            out = out.index_add(0, tok, y)
        self.last_load = load
        return out.reshape(shp)


def rope_tables(T, rot, theta, device=None):
    inv = 1.0 / (theta ** (torch.arange(0, rot // 2, dtype=torch.float32) * 2.0 / rot))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cos(ang), torch.sin(ang)  # [T, rot/2]


def apply_rope(x, cos, sin, rot):
    """x [..., T, heads, d] (T at dim -3); NEOX rotate-half on the first rot dims."""
    h = rot // 2
    c = cos[:, None, :]
    s = sin[:, None, :]
    x1, x2, rest = x[..., :h], x[..., h:rot], x[..., rot:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)


class Attention(nn.Module):
    def __init__(self, c, std, std_out):
        super().__init__()
        h, d = c["hidden_size"], c["head_dim"]
        sa = c["sparse_attention_config"]
        self.nh, self.nkv, self.d = c["num_attention_heads"], c["num_key_value_heads"], d
        self.rot = c["rotary_dim"]
        self.q_proj = Linear(h, self.nh * d, "mxfp8", std)
        self.k_proj = Linear(h, self.nkv * d, "mxfp8", std)
        self.v_proj = Linear(h, self.nkv * d, "mxfp8", std)
        self.o_proj = Linear(self.nh * d, h, "mxfp8", std_out)
        self.q_norm = RMSNorm(d, c["rms_norm_eps"])
        self.k_norm = RMSNorm(d, c["rms_norm_eps"])
        self.nih, self.di = sa["sparse_num_index_heads"], sa["sparse_index_dim"]
        self.index_q_proj = Linear(h, self.nih * self.di, "mxfp8", std)
        self.index_k_proj = Linear(h, self.di, "mxfp8", std)
        self.index_q_norm = RMSNorm(self.di, c["rms_norm_eps"])
        self.index_k_norm = RMSNorm(self.di, c["rms_norm_eps"])
        self.B, self.K = sa["sparse_block_size"], sa["sparse_topk_blocks"]
        self.init, self.local = sa["sparse_init_block"], sa["sparse_local_block"]

    def select(self, a, cos, sin, causal):
        """Index branch -> (block-selection token mask [Bt, nih, T, T], index block log-probs, visible-block mask)."""
        Bt, T, _ = a.shape
        iq = self.index_q_norm(self.index_q_proj(a).view(Bt, T, self.nih, self.di))
        ik = self.index_k_norm(self.index_k_proj(a).view(Bt, T, 1, self.di))
        iq = apply_rope(iq, cos, sin, self.rot)
        ik = apply_rope(ik, cos, sin, self.rot)[:, :, 0]
        s = torch.einsum("bqhd,bkd->bhqk", iq, ik)  # fp32
        s = s.masked_fill(~causal, float("-inf"))
        nb = (T + self.B - 1) // self.B
        pad = nb * self.B - T
        if pad:
            s = F.pad(s, (0, pad), value=float("-inf"))
        S = s.view(Bt, self.nih, T, nb, self.B).amax(-1)  # [Bt, nih, T, nb]
        qb = torch.arange(T) // self.B
        blk = torch.arange(nb)
        visible = blk[None, :] <= qb[:, None]  # [T, nb]
        forced = ((blk[None, :] <= qb[:, None]) & (blk[None, :] > qb[:, None] - self.local)) | (blk[None, :] < self.init)
        forced = forced & visible
        Sf = torch.where(forced, torch.full_like(S, 1e30), S)
        k = min(self.K, nb)
        _, top = torch.topk(Sf.detach(), k, dim=-1)
        selb = torch.zeros_like(S, dtype=torch.bool).scatter_(-1, top, True) & visible
        tokmask = selb.repeat_interleave(self.B, dim=-1)[..., :T] & causal
        logp = torch.log_softmax(S.masked_fill(~visible, float("-inf")), dim=-1)
        return tokmask, logp, visible

    def forward(self, a, cos, sin, causal, want_kl):
        Bt, T, _ = a.shape
        q = self.q_norm(self.q_proj(a).view(Bt, T, self.nh, self.d))
        k = self.k_norm(self.k_proj(a).view(Bt, T, self.nkv, self.d))
        v = self.v_proj(a).view(Bt, T, self.nkv, self.d)
        q = apply_rope(q, cos, sin, self.rot)
        k = apply_rope(k, cos, sin, self.rot)
        tokmask, logp, visible = self.select(a.detach(), cos, sin, causal)
        G = self.nh // self.nkv
        qg = q.view(Bt, T, self.nkv, G, self.d).permute(0, 2, 3, 1, 4)  # [Bt, nkv, G, T, d]
        kg = k.permute(0, 2, 1, 3)[:, :, None]  # [Bt, nkv, 1, T, d]
        vg = v.permute(0, 2, 1, 3)[:, :, None]
        sc = (qg @ kg.transpose(-1, -2)) / math.sqrt(self.d)  # [Bt, nkv, G, T, T]
        p = torch.softmax(sc.masked_fill(~tokmask[:, :, None], float("-inf")), dim=-1)
        o = (p @ vg).permute(0, 3, 1, 2, 4).reshape(Bt, T, self.nh * self.d)
        kl = None
        if want_kl:
            with torch.no_grad():
                pd = torch.softmax(sc.detach().masked_fill(~causal, float("-inf")), dim=-1)
                nb = logp.shape[-1]
                pad = nb * self.B - T
                if pad:
                    pd = F.pad(pd, (0, pad))
                mass = pd.view(Bt, self.nkv, G, T, nb, self.B).sum(-1).mean(2)  # [Bt, nkv, T, nb]
            lp = logp.masked_fill(~visible, 0.0)
            kl = (mass * (torch.log(mass.clamp(min=1e-9)) - lp)).sum(-1).mean()
        return self.o_proj(o), kl


class Layer(nn.Module):
    def __init__(self, c, i, std, std_out):
        super().__init__()
        h = c["hidden_size"]
        self.input_layernorm = RMSNorm(h, c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(h, c["rms_norm_eps"])
        self.self_attn = Attention(c, std, std_out)
        self.is_moe = bool(c["moe_layer_freq"][i])
        if self.is_moe:
            self.block_sparse_moe = MoE(c, std, std_out)
        else:
            self.mlp = MLP(h, c["dense_intermediate_size"], "mxfp8", std, std_out)

    def forward(self, h, cos, sin, causal, want_kl):
        o, kl = self.self_attn(self.input_layernorm(h), cos, sin, causal, want_kl)
        h = h + o
        m = self.post_attention_layernorm(h)
        h = h + (self.block_sparse_moe(m) if self.is_moe else self.mlp(m))
        return h, kl


class M3Model(nn.Module):
    def __init__(self, c, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.c = c
        h, L = c["hidden_size"], c["num_hidden_layers"]
        std, std_out = 0.02, 0.02 / math.sqrt(2 * L)
        self.embed_tokens = nn.Embedding(c["vocab_size"], h)
        nn.init.normal_(self.embed_tokens.weight, std=0.02)
        self.layers = nn.ModuleList([Layer(c, i, std, std_out) for i in range(L)])
        self.norm = RMSNorm(h, c["rms_norm_eps"])
        self.lm_head = Linear(h, c["vocab_size"], "bf16", std)

    def set_fake_quant(self, on):
        for m in self.modules():
            if isinstance(m, (Linear, RMSNorm)):
                m.fq = on
        self.fq = on

    def forward(self, ids, want_kl=False, return_hidden=False):
        Bt, T = ids.shape
        w = self.embed_tokens.weight
        if getattr(self, "fq", False):
            w = ste(w, bf16)
        h = F.embedding(ids, w)
        cos, sin = rope_tables(T, self.c["rotary_dim"], self.c["rope_theta"])
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        kls, hidden = [], []
        for layer in self.layers:
            h, kl = layer(h, cos, sin, causal, want_kl)
            hidden.append(h)
            if kl is not None:
                kls.append(kl)
        logits = self.lm_head(self.norm(h))
        kl = torch.stack(kls).mean() if kls else None
        if return_hidden:
            return logits, kl, hidden
        return logits, kl


def default_config(vocab_size):
    L = 4
    return {
        "hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": L, "num_attention_heads": 8,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": vocab_size, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-06, "use_gemma_norm": True, "attention_output_gate": False, "rope_theta": 10000,
        "rotary_dim": 16, "partial_rotary_factor": 0.5, "hidden_act": "swigluoai", "use_qk_norm": True,
        "tie_word_embeddings": False, "dense_intermediate_size": 768, "shared_intermediate_size": 256,
        "num_local_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "scoring_func": "sigmoid",
        "use_routing_bias": True, "moe_layer_freq": [0] + [1] * (L - 1), "qk_norm_type": "per_head",
        "num_mtp_modules": 0, "num_nextn_predict_layers": 0, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
        "routed_scaling_factor": 2.0,
        "sparse_attention_config": {
            "use_sparse_attention": True, "sparse_index_dim": 32, "sparse_num_index_heads": 2,
            "sparse_topk_blocks": 8, "sparse_block_size": 32, "sparse_disable_index_value": [1] * L,
            "sparse_score_type": "max", "sparse_init_block": 1, "sparse_local_block": 1,
            "sparse_attention_freq": [1] * L},
    }
