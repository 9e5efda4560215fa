// Model: a loaded checkpoint (config + weights) and the forward pass of one step of T tokens of one
// sequence over its SeqCache (prefill when T > 1, decode when T == 1; the same semantics either way).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/aligned_vector.h"
#include "model/attention.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/weights.h"

namespace m3 {

struct ForwardOptions {
  AttentionPath attention = AttentionPath::Sparse;
  bool all_logits = false;  // forward(): logits for every token of the step, else only the last
};

// One sequence's share of a batched step: n tokens at positions start..start+n-1, appended to its
// cache. Logits are produced for rows [logits_from, n) (logits_from == n: none).
struct BatchItem {
  KVView* kv = nullptr;
  const int32_t* tokens = nullptr;
  int64_t n = 0;
  int64_t start = 0;
  int64_t logits_from = 0;
  // Per row, an input embedding [hidden] that replaces the token's own (merged vision features at image
  // placeholder tokens, model.md 9.9), or null; a null array: every row embeds its token.
  const float* const* embeds = nullptr;
};

// Load-time choices that change how the weights are multiplied (not what they are).
struct ModelOptions {
  // NVFP4 matmuls with int8 activations (faster on CPUs, not exact; see kernels/cpu/linear.h).
  bool nvfp4_int8_activations = false;
  // MXFP8 / NVFP4 matmuls with activations rounded to BF16 (BF16 dot products where the CPU has them;
  // faster, not exact; see kernels/cpu/linear.h). nvfp4_bf16_activations excludes nvfp4_int8_activations.
  bool mxfp8_bf16_activations = false;
  bool nvfp4_bf16_activations = false;
  // MXFP4 (Quark) matmuls: "auto" (default) what the checkpoint's quantization_config says (dynamic
  // MXFP4 activations when input_tensors is set, W4A4; else the exact fp32 activations), "mxfp4" the
  // dynamic MXFP4 activations (refused on a weight-only checkpoint), "fp32" exact fp32 activations against
  // the dequantised weights (not what the checkpoint was calibrated for; closer to the BF16 model).
  std::string mxfp4_activations = "auto";
  // Auto (default): read into huge-page memory when the checkpoint fits comfortably, else mapped;
  // Mmap (`--mmap`) / Ram (`--no-mmap`) force one (see formats/safetensors.h).
  WeightMemory weight_memory = WeightMemory::Auto;
  // A JSON object merged into config.json before it is read (--hf-overrides); empty: none.
  std::string config_overrides;
};

class Model {
 public:
  explicit Model(const std::string& dir, const ModelOptions& opt = {});

  // Matrices switched to int8 activations at load (0 unless ModelOptions asked and NVFP4 exists).
  int int8_activation_matrices() const { return int8_matrices_; }
  // Matrices switched to BF16 activations at load, MXFP8 and NVFP4 (0 unless ModelOptions asked and
  // the format exists).
  int bf16_activation_matrices(LinearKind kind) const {
    return kind == LinearKind::MXFP8 ? mxfp8_bf16_matrices_ : kind == LinearKind::NVFP4 ? nvfp4_bf16_matrices_ : 0;
  }
  // Matrices stored in 4-row tiles for the decode step (weights read into memory; 0 when mapped).
  int tiled_matrices() const { return tiled_matrices_; }
  // MXFP4 matrices with dynamic MXFP4 activations (W4A4) after load.
  int mxfp4_activation_matrices() const { return mxfp4_act_matrices_; }

  const ModelConfig& config() const { return cfg_; }
  const Weights& weights() const { return *weights_; }
  SeqCache new_cache(int64_t capacity) const { return SeqCache(cfg_, capacity); }

  // Runs tokens[0..T) at positions cache.n_tokens.. and appends them to the cache. Writes
  // [T, vocab] logits when opt.all_logits, else [1, vocab] for the last token.
  void forward(const int32_t* tokens, int64_t T, SeqCache& cache, float* logits, const ForwardOptions& opt = {});

  // One step over several sequences: the linear layers and experts run once over all rows; the
  // attention of each row reads its own sequence's cache. Logit rows are written in item order.
  // When `taps` is non-null, also writes the residual stream after each layer of tap_layers() for
  // every row of the step: taps[row, i*hidden ...] = output of layer tap_layers()[i] (DSpark).
  void forward_batch(const BatchItem* items, int nitems, float* logits, AttentionPath path = AttentionPath::Sparse,
                     float* taps = nullptr);

  // Layers whose outputs forward_batch copies into `taps` (in this order).
  void set_tap_layers(std::vector<int> layers) { tap_layers_ = std::move(layers); }
  const std::vector<int>& tap_layers() const { return tap_layers_; }

 private:
  void ensure_workspace(int64_t T);

  ModelConfig cfg_;
  std::unique_ptr<Weights> weights_;
  // Step workspace, grown on demand (decode reuses it without allocating).
  int64_t ws_tokens_ = 0;
  AlignedVector<float> x_, a_, q_, k_, v_, iq_, ik_, att_, tmp_, rope_cos_, rope_sin_;
  std::vector<int32_t> tok_;
  std::vector<int64_t> pos_, item_of_;
  std::vector<const float*> embed_of_;  // per row: BatchItem::embeds' row or null
  std::vector<AttnSeq> seqs_;
  std::vector<int> tap_layers_;
  int int8_matrices_ = 0;
  int mxfp8_bf16_matrices_ = 0, nvfp4_bf16_matrices_ = 0;
  int mxfp4_act_matrices_ = 0;
  int tiled_matrices_ = 0;
};

// Row `tok` of the embedding table as fp32 (BF16 / F16 / F32 tables).
void embedding_row(const TensorView& emb, int32_t tok, int64_t H, float* out);

}  // namespace m3
