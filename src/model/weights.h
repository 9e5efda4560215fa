// Weights: typed views of every tensor the text model uses, looked up by the checkpoint's real
// names (prefix `language_model.`), with dtype and shape checked against ModelConfig. Quantised
// linears stay in their checkpoint encoding (MXFP8 / NVFP4) and are decoded inside the kernels;
// only small vectors (norm gammas as 1+w, routers) are converted to fp32 once at load.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "base/aligned_vector.h"
#include "kernels/cpu/linear.h"
#include "model/config.h"

namespace m3 {

struct AttentionWeights {
  Linear q, k, v, o;
  std::vector<float> q_norm, k_norm;  // 1 + w, fp32
  // MSA index branch (sparse layers only).
  Linear index_q, index_k;
  std::vector<float> index_q_norm, index_k_norm;
};

struct ExpertWeights {
  Linear gate, up, down;  // w1, w3, w2
};

struct LayerWeights {
  std::vector<float> input_norm, post_attn_norm;  // 1 + w
  AttentionWeights attn;
  // Dense MLP (moe_layer[l] == 0).
  ExpertWeights mlp;
  // MoE (moe_layer[l] == 1).
  std::vector<float> router;       // [n_experts, hidden] fp32
  std::vector<float> router_bias;  // [n_experts] fp32 (zeros when absent)
  std::vector<ExpertWeights> experts;
  bool has_shared = false;
  ExpertWeights shared;
};

class Weights {
 public:
  // Opens the checkpoint in cfg.dir and validates every tensor. Throws m3::Error.
  explicit Weights(const ModelConfig& cfg, WeightMemory mem = WeightMemory::Mmap);

  const TensorView& embed() const { return *embed_; }
  const Linear& lm_head() const { return lm_head_; }
  const std::vector<float>& final_norm() const { return final_norm_; }
  const LayerWeights& layer(int l) const { return layers_[l]; }

  // Bytes of weights read for one decoded token (attention + index + dense/shared + top-k experts
  // + lm_head + one embedding row): the numerator of "achieved GB/s".
  double active_bytes_per_token() const { return active_bytes_; }
  double total_bytes() const { return total_bytes_; }
  // The checkpoint's files: bytes, and whether they were read into memory or mapped.
  const TensorStore& store() const { return *store_; }

  // Switches every NVFP4 matrix whose K is a multiple of 128 to int8 activations (the opt-in,
  // inexact fast path, see kernels/cpu/linear.h); returns how many matrices switched.
  int enable_int8_activations();
  // Switches every matrix of `kind` (MXFP8 or NVFP4) to BF16 activations (the opt-in, inexact fast
  // path, see kernels/cpu/linear.h); returns how many matrices switched.
  int enable_bf16_activations(LinearKind kind);
  // Sets every MXFP4 matrix's dynamic MXFP4 activations (Linear::act_mxfp4) on or off, scale rule
  // `mode` (0 even, 1 floor); returns how many matrices have them on.
  int set_mxfp4_activations(bool on, uint8_t mode);

  // Weights read into memory only (WeightMemory::Ram): rewrites every matrix the decode kernels can
  // read tiled into the 4-row tile layout (kernels/cpu/linear.h, tile_rows), in place; returns how
  // many. Mapped checkpoints stay as the files hold them (0). Call after enable_int8_activations
  // (int8 matrices stay row-major).
  int tile_for_decode();

 private:
  // Every matrix of the model (empty ones included: the callers' operations skip them).
  void for_each_linear(const std::function<void(Linear&)>& fn);

  std::unique_ptr<TensorStore> store_;
  const TensorView* embed_ = nullptr;
  Linear lm_head_;
  std::vector<float> final_norm_;
  std::vector<LayerWeights> layers_;
  double active_bytes_ = 0, total_bytes_ = 0;
  AlignedVector<uint8_t> lm_head_packed_;  // pack_bf16_tiles (avx512) or pack_bf16_nibbles (avx2) of lm_head_, else empty
};

}  // namespace m3
