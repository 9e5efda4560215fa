// Checkpoint -> Weights: name tables, format detection by tensor suffix, and shape/dtype checks
// (see weights.h). Every failure names the tensor, its file and what was expected.
#include "model/weights.h"

#include <cmath>
#include <cstring>

#include "formats/error.h"

namespace m3 {

namespace {

std::string shape_of(std::initializer_list<int64_t> s) {
  std::string r = "[";
  size_t i = 0;
  for (int64_t d : s) r += (i++ ? ", " : "") + std::to_string(d);
  return r + "]";
}

class Loader {
 public:
  Loader(const TensorStore& st, const ModelConfig& cfg) : st_(st), cfg_(cfg) {}

  const TensorView& tensor(const std::string& name) const {
    const TensorView* v = st_.find(name);
    if (!v) throw Error(st_.dir() + ": missing tensor " + name);
    return *v;
  }

  void expect_shape(const TensorView& v, std::initializer_list<int64_t> shape) const {
    if (v.shape != std::vector<int64_t>(shape))
      throw Error(where(v) + ": shape " + v.shape_str() + ", expected " + shape_of(shape) + " (from config.json)");
  }
  void expect_dtype(const TensorView& v, std::initializer_list<DType> ok, const char* what) const {
    for (DType d : ok)
      if (v.dtype == d) return;
    throw Error(where(v) + ": dtype " + dtype_name(v.dtype) + ", expected " + what);
  }
  std::string where(const TensorView& v) const { return st_.dir() + "/" + v.file + ": tensor " + v.name; }

  // A [n] vector (norm gamma, bias) as fp32; `plus_one` stores the Gemma scale 1 + w (in fp32).
  std::vector<float> vec(const std::string& name, int64_t n, bool plus_one) const {
    const TensorView& v = tensor(name);
    expect_dtype(v, {DType::BF16, DType::F16, DType::F32}, "BF16, F16 or F32");
    expect_shape(v, {n});
    std::vector<float> out(n);
    to_float(v, out.data());
    if (plus_one)
      for (float& x : out) x += 1.0f;
    return out;
  }

  // A small matrix (the router) as fp32.
  std::vector<float> matrix_f32(const std::string& name, int64_t r, int64_t c) const {
    const TensorView& v = tensor(name);
    expect_dtype(v, {DType::BF16, DType::F16, DType::F32}, "F32 (or BF16/F16)");
    expect_shape(v, {r, c});
    std::vector<float> out(size_t(r * c));
    to_float(v, out.data());
    return out;
  }

  // A linear `base` with out N and in K, stored as base.weight (plain or MXFP8 with
  // base.weight_scale_inv) or base.weight_packed (NVFP4 compressed-tensors).
  Linear linear(const std::string& base, int64_t N, int64_t K, WeightFormat expect) const {
    Linear L;
    L.name = base;
    L.N = N;
    L.K = K;
    if (st_.has(base + ".weight_packed")) {
      const TensorView& p = tensor(base + ".weight_packed");
      if (expect != WeightFormat::NVFP4)
        throw Error(where(p) + ": NVFP4 weight found, but config.json quantization_config implies " +
                    weight_format_name(expect) + " for this tensor");
      if (K % 16) throw Error(where(p) + ": in-features " + std::to_string(K) + " not a multiple of 16 (NVFP4 block)");
      expect_dtype(p, {DType::U8, DType::I8}, "U8 (two E2M1 codes per byte)");
      expect_shape(p, {N, K / 2});
      const TensorView& s = tensor(base + ".weight_scale");
      expect_dtype(s, {DType::F8_E4M3}, "F8_E4M3 (one scale per 16 elements)");
      expect_shape(s, {N, K / 16});
      const TensorView& g = tensor(base + ".weight_global_scale");
      expect_dtype(g, {DType::F32}, "F32 scalar");
      if (g.numel() != 1) throw Error(where(g) + ": shape " + g.shape_str() + ", expected a scalar ([] or [1])");
      float gv;
      std::memcpy(&gv, g.data, 4);
      if (!std::isfinite(gv) || gv <= 0)
        throw Error(where(g) + ": value " + std::to_string(gv) + ", expected a positive finite divisor");
      for (size_t i = 0; i < s.nbytes; ++i)
        if ((s.data[i] & 0x7f) == 0x7f) throw Error(where(s) + ": NaN E4M3 scale byte at index " + std::to_string(i));
      L.kind = LinearKind::NVFP4;
      L.w = p.data;
      L.scales = s.data;
      L.global_div = gv;
      return L;
    }
    const TensorView& w = tensor(base + ".weight");
    if (st_.has(base + ".weight_scale_inv")) {
      if (expect != WeightFormat::MXFP8)
        throw Error(where(w) + ": MXFP8 weight found, but config.json quantization_config implies " +
                    weight_format_name(expect) + " for this tensor");
      if (K % 32) throw Error(where(w) + ": in-features " + std::to_string(K) + " not a multiple of 32 (MXFP8 block)");
      expect_dtype(w, {DType::F8_E4M3}, "F8_E4M3 (MXFP8 elements)");
      expect_shape(w, {N, K});
      const TensorView& s = tensor(base + ".weight_scale_inv");
      expect_dtype(s, {DType::U8}, "U8 (E8M0 scale bytes)");
      expect_shape(s, {N, K / 32});
      for (size_t i = 0; i < s.nbytes; ++i)
        if (s.data[i] == 0xff) throw Error(where(s) + ": E8M0 scale byte 0xFF (NaN) at index " + std::to_string(i));
      L.kind = LinearKind::MXFP8;
      L.w = w.data;
      L.scales = s.data;
      return L;
    }
    if (w.dtype == DType::F8_E4M3)
      throw Error(where(w) + ": F8_E4M3 weight without " + base + ".weight_scale_inv (MXFP8 needs its scales)");
    if (expect != WeightFormat::Plain)
      throw Error(where(w) + ": " + dtype_name(w.dtype) + " weight, but config.json quantization_config says " +
                  weight_format_name(expect) + " (expected " + base +
                  (expect == WeightFormat::NVFP4 ? ".weight_packed)" : ".weight_scale_inv)"));
    expect_dtype(w, {DType::BF16, DType::F16, DType::F32}, "BF16, F16 or F32");
    expect_shape(w, {N, K});
    L.kind = w.dtype == DType::BF16 ? LinearKind::BF16 : w.dtype == DType::F16 ? LinearKind::F16 : LinearKind::F32;
    L.w = w.data;
    return L;
  }

 private:
  static void to_float(const TensorView& v, float* out) {
    const int64_t n = v.numel();
    for (int64_t i = 0; i < n; ++i) {
      if (v.dtype == DType::F32) {
        std::memcpy(out + i, v.data + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, v.data + 2 * i, 2);
        out[i] = v.dtype == DType::BF16 ? bf16_to_float(h) : f16_to_float(h);
      }
    }
  }

  const TensorStore& st_;
  const ModelConfig& cfg_;
};

}  // namespace

Weights::Weights(const ModelConfig& cfg) {
  store_ = std::make_unique<TensorStore>(cfg.dir);
  Loader ld(*store_, cfg);
  std::string pre;
  if (store_->has("language_model.model.embed_tokens.weight")) {
    pre = "language_model.";
  } else if (!store_->has("model.embed_tokens.weight")) {
    throw Error(cfg.dir + ": missing tensor language_model.model.embed_tokens.weight");
  }
  const int64_t H = cfg.hidden, V = cfg.vocab, D = cfg.head_dim;
  embed_ = &ld.tensor(pre + "model.embed_tokens.weight");
  ld.expect_dtype(*embed_, {DType::BF16, DType::F16, DType::F32}, "BF16, F16 or F32");
  ld.expect_shape(*embed_, {V, H});
  lm_head_ = ld.linear(pre + "lm_head", V, H, WeightFormat::Plain);
  final_norm_ = ld.vec(pre + "model.norm.weight", H, true);
  const double embed_row_bytes = double(embed_->nbytes) / double(V);
  active_bytes_ = double(lm_head_.bytes()) + embed_row_bytes;
  total_bytes_ = double(embed_->nbytes + lm_head_.bytes());

  layers_.resize(cfg.n_layers);
  for (int l = 0; l < cfg.n_layers; ++l) {
    LayerWeights& L = layers_[l];
    const std::string P = pre + "model.layers." + std::to_string(l) + ".";
    const std::string A = P + "self_attn.";
    const WeightFormat df = cfg.dense_format;
    L.input_norm = ld.vec(P + "input_layernorm.weight", H, true);
    L.post_attn_norm = ld.vec(P + "post_attention_layernorm.weight", H, true);
    L.attn.q = ld.linear(A + "q_proj", int64_t(cfg.n_heads) * D, H, df);
    L.attn.k = ld.linear(A + "k_proj", int64_t(cfg.n_kv_heads) * D, H, df);
    L.attn.v = ld.linear(A + "v_proj", int64_t(cfg.n_kv_heads) * D, H, df);
    L.attn.o = ld.linear(A + "o_proj", H, int64_t(cfg.n_heads) * D, df);
    L.attn.q_norm = ld.vec(A + "q_norm.weight", D, true);
    L.attn.k_norm = ld.vec(A + "k_norm.weight", D, true);
    double layer_bytes = double(L.attn.q.bytes() + L.attn.k.bytes() + L.attn.v.bytes() + L.attn.o.bytes());
    double layer_total = layer_bytes;
    const bool has_index = store_->has(A + "index_q_proj.weight") || store_->has(A + "index_q_proj.weight_packed");
    if (cfg.sparse_layer[l]) {
      if (!has_index)
        throw Error(cfg.dir + ": missing tensor " + A + "index_q_proj.weight (config.json sparse_attention_freq[" +
                    std::to_string(l) + "] = 1 makes layer " + std::to_string(l) + " an MSA layer)");
      L.attn.index_q = ld.linear(A + "index_q_proj", int64_t(cfg.index_heads) * cfg.index_dim, H, df);
      L.attn.index_k = ld.linear(A + "index_k_proj", cfg.index_dim, H, df);
      L.attn.index_q_norm = ld.vec(A + "index_q_norm.weight", cfg.index_dim, true);
      L.attn.index_k_norm = ld.vec(A + "index_k_norm.weight", cfg.index_dim, true);
      layer_bytes += double(L.attn.index_q.bytes() + L.attn.index_k.bytes());
      layer_total += double(L.attn.index_q.bytes() + L.attn.index_k.bytes());
    } else if (has_index) {
      throw Error(cfg.dir + ": tensor " + A + "index_q_proj is present but config.json sparse_attention_freq[" +
                  std::to_string(l) + "] = 0; refusing to guess the layer plan");
    }
    if (!cfg.moe_layer[l]) {
      const std::string M = P + "mlp.";
      L.mlp.gate = ld.linear(M + "gate_proj", cfg.dense_inter, H, df);
      L.mlp.up = ld.linear(M + "up_proj", cfg.dense_inter, H, df);
      L.mlp.down = ld.linear(M + "down_proj", H, cfg.dense_inter, df);
      const double b = double(L.mlp.gate.bytes() + L.mlp.up.bytes() + L.mlp.down.bytes());
      layer_bytes += b;
      layer_total += b;
    } else {
      const std::string M = P + "block_sparse_moe.";
      L.router = ld.matrix_f32(M + "gate.weight", cfg.n_experts, H);
      if (cfg.use_routing_bias) {
        L.router_bias = ld.vec(M + "e_score_correction_bias", cfg.n_experts, false);
      } else {
        L.router_bias.assign(cfg.n_experts, 0.f);
      }
      L.experts.resize(cfg.n_experts);
      double expert_bytes = 0;
      for (int e = 0; e < cfg.n_experts; ++e) {
        const std::string E = M + "experts." + std::to_string(e) + ".";
        ExpertWeights& X = L.experts[e];
        X.gate = ld.linear(E + "w1", cfg.moe_inter, H, cfg.expert_format);
        X.up = ld.linear(E + "w3", cfg.moe_inter, H, cfg.expert_format);
        X.down = ld.linear(E + "w2", H, cfg.moe_inter, cfg.expert_format);
        expert_bytes = double(X.gate.bytes() + X.up.bytes() + X.down.bytes());
        layer_total += expert_bytes;
      }
      layer_bytes += expert_bytes * cfg.experts_per_tok + double(L.router.size() * 4);
      if (cfg.n_shared_experts) {
        const std::string S = M + "shared_experts.";
        L.has_shared = true;
        L.shared.gate = ld.linear(S + "gate_proj", cfg.shared_inter, H, df);
        L.shared.up = ld.linear(S + "up_proj", cfg.shared_inter, H, df);
        L.shared.down = ld.linear(S + "down_proj", H, cfg.shared_inter, df);
        const double b = double(L.shared.gate.bytes() + L.shared.up.bytes() + L.shared.down.bytes());
        layer_bytes += b;
        layer_total += b;
      }
    }
    active_bytes_ += layer_bytes;
    total_bytes_ += layer_total;
  }
}

}  // namespace m3
