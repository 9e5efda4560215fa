// Checkpoint -> Weights: name tables, format detection by tensor suffix, and shape/dtype checks
// (see weights.h). Every failure names the tensor, its file and what was expected.
#include "model/weights.h"

#include <cmath>
#include <cstring>

#include "base/error.h"
#include "kernels/cpu/dispatch.h"
#include "model/tensor_loader.h"

namespace m3 {


Weights::Weights(const ModelConfig& cfg, WeightMemory mem) {
  store_ = std::make_unique<TensorStore>(cfg.dir, mem);
  TensorLoader ld(*store_);
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
  lm_head_ = ld.linear(pre + "lm_head", V, H, cfg.format_of(pre + "lm_head", WeightFormat::Plain));
  final_norm_ = ld.vec(pre + "model.norm.weight", H, true);
  const double embed_row_bytes = double(embed_->nbytes) / double(V);
  active_bytes_ = double(lm_head_.bytes()) + embed_row_bytes;
  total_bytes_ = double(embed_->nbytes + lm_head_.bytes());

  layers_.resize(cfg.n_layers);
  for (int l = 0; l < cfg.n_layers; ++l) {
    LayerWeights& L = layers_[l];
    const std::string P = pre + "model.layers." + std::to_string(l) + ".";
    const std::string A = P + "self_attn.";
    const WeightFormat df = cfg.dense_format;  // per module through cfg.format_of (a Quark exclude list)
    L.input_norm = ld.vec(P + "input_layernorm.weight", H, true);
    L.post_attn_norm = ld.vec(P + "post_attention_layernorm.weight", H, true);
    L.attn.q = ld.linear(A + "q_proj", int64_t(cfg.n_heads) * D, H, cfg.format_of(A + "q_proj", df));
    L.attn.k = ld.linear(A + "k_proj", int64_t(cfg.n_kv_heads) * D, H, cfg.format_of(A + "k_proj", df));
    L.attn.v = ld.linear(A + "v_proj", int64_t(cfg.n_kv_heads) * D, H, cfg.format_of(A + "v_proj", df));
    L.attn.o = ld.linear(A + "o_proj", H, int64_t(cfg.n_heads) * D, cfg.format_of(A + "o_proj", df));
    L.attn.q_norm = ld.vec(A + "q_norm.weight", D, true);
    L.attn.k_norm = ld.vec(A + "k_norm.weight", D, true);
    double layer_bytes = double(L.attn.q.bytes() + L.attn.k.bytes() + L.attn.v.bytes() + L.attn.o.bytes());
    double layer_total = layer_bytes;
    const bool has_index = store_->has(A + "index_q_proj.weight") || store_->has(A + "index_q_proj.weight_packed");
    if (cfg.sparse_layer[l]) {
      if (!has_index)
        throw Error(cfg.dir + ": missing tensor " + A + "index_q_proj.weight (config.json sparse_attention_freq[" +
                    std::to_string(l) + "] = 1 makes layer " + std::to_string(l) + " an MSA layer)");
      L.attn.index_q = ld.linear(A + "index_q_proj", int64_t(cfg.index_heads) * cfg.index_dim, H, cfg.format_of(A + "index_q_proj", df));
      L.attn.index_k = ld.linear(A + "index_k_proj", cfg.index_dim, H, cfg.format_of(A + "index_k_proj", df));
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
      L.mlp.gate = ld.linear(M + "gate_proj", cfg.dense_inter, H, cfg.format_of(M + "gate_proj", df));
      L.mlp.up = ld.linear(M + "up_proj", cfg.dense_inter, H, cfg.format_of(M + "up_proj", df));
      L.mlp.down = ld.linear(M + "down_proj", H, cfg.dense_inter, cfg.format_of(M + "down_proj", df));
      const double b = double(L.mlp.gate.bytes() + L.mlp.up.bytes() + L.mlp.down.bytes());
      layer_bytes += b;
      layer_total += b;
    } else {
      const std::string M = P + "block_sparse_moe.";
      // A Quark checkpoint must leave the router unquantised (m3serve keeps it FP32, docs/model.md 3.5).
      if (cfg.format_of(M + "gate", WeightFormat::Plain) == WeightFormat::MXFP4 && store_->has(M + "gate.weight_scale"))
        throw Error(cfg.dir + ": tensor " + M + "gate.weight is MXFP4 (quark exclude does not name it): an MXFP4 "
                    "router is not supported; routers stay FP32");
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
        X.gate = ld.linear(E + "w1", cfg.moe_inter, H, cfg.format_of(E + "w1", cfg.expert_format));
        X.up = ld.linear(E + "w3", cfg.moe_inter, H, cfg.format_of(E + "w3", cfg.expert_format));
        X.down = ld.linear(E + "w2", H, cfg.moe_inter, cfg.format_of(E + "w2", cfg.expert_format));
        expert_bytes = double(X.gate.bytes() + X.up.bytes() + X.down.bytes());
        layer_total += expert_bytes;
      }
      layer_bytes += expert_bytes * cfg.experts_per_tok + double(L.router.size() * 4);
      if (cfg.n_shared_experts) {
        const std::string S = M + "shared_experts.";
        L.has_shared = true;
        L.shared.gate = ld.linear(S + "gate_proj", cfg.shared_inter, H, cfg.format_of(S + "gate_proj", df));
        L.shared.up = ld.linear(S + "up_proj", cfg.shared_inter, H, cfg.format_of(S + "up_proj", df));
        L.shared.down = ld.linear(S + "down_proj", H, cfg.shared_inter, cfg.format_of(S + "down_proj", df));
        const double b = double(L.shared.gate.bytes() + L.shared.up.bytes() + L.shared.down.bytes());
        layer_bytes += b;
        layer_total += b;
      }
    }
    active_bytes_ += layer_bytes;
    total_bytes_ += layer_total;
  }
}

void Weights::for_each_linear(const std::function<void(Linear&)>& fn) {
  auto mlp = [&](ExpertWeights& X) {
    fn(X.gate);
    fn(X.up);
    fn(X.down);
  };
  fn(lm_head_);
  for (LayerWeights& L : layers_) {
    for (Linear* W : {&L.attn.q, &L.attn.k, &L.attn.v, &L.attn.o, &L.attn.index_q, &L.attn.index_k}) fn(*W);
    mlp(L.mlp);
    mlp(L.shared);
    for (ExpertWeights& X : L.experts) mlp(X);
  }
}

int Weights::tile_for_decode() {
  if (!store_->set_writable(true)) return 0;
  int n = 0;
  // The pointers come from the store's own (now writable) memory.
  for_each_linear([&](Linear& W) { n += tile_rows(W, const_cast<uint8_t*>(W.w)) ? 1 : 0; });
  store_->set_writable(false);
  // The BF16 lm_head, read whole by every decode step, also packed losslessly for the avx512 decode
  // kernels (pack_bf16_tiles: about 77% of its bytes; the tiled copy stays for panels): in the mid
  // models the lm_head is about a third of a token's weight bytes.
  // The AVX2 decode kernels read their own packing of it (pack_bf16_nibbles, about 77% too).
  if (pack_bf16_for_decode(lm_head_, lm_head_packed_))
    active_bytes_ += double(lm_head_.decode_bytes()) - double(lm_head_.bytes());
  return n;
}

int Weights::enable_bf16_activations(LinearKind kind) {
  int n = 0;
  for_each_linear([&](Linear& W) { n += W.kind == kind && m3::enable_bf16_activations(W) ? 1 : 0; });
  return n;
}

int Weights::set_mxfp4_activations(bool on, uint8_t mode) {
  int n = 0;
  for_each_linear([&](Linear& W) {
    if (W.kind != LinearKind::MXFP4) return;
    W.act_mxfp4 = on;
    W.act_mxfp4_mode = mode;
    n += on ? 1 : 0;
  });
  return n;
}

int Weights::enable_int8_activations() {
  int n = 0;
  for_each_linear([&](Linear& W) { n += m3::enable_int8_activations(W) ? 1 : 0; });
  return n;
}

}  // namespace m3
