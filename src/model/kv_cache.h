// SeqCache: the simple per-sequence cache of the foundation path: per layer, the post-norm
// post-RoPE K, the raw V and (sparse layers) the post-norm post-RoPE index key of every token,
// in fp32, indexed by logical position. The paged engine cache replaces it in src/engine.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace m3 {

struct SeqCache {
  int64_t n_tokens = 0;  // positions [0, n_tokens) are filled
  int64_t capacity = 0;
  int kv_width = 0;  // n_kv_heads * head_dim
  int index_dim = 0;
  std::vector<std::vector<float>> k, v, ik;  // [layer][pos * width]

  SeqCache() = default;
  SeqCache(const ModelConfig& cfg, int64_t capacity);
  // Grows to hold at least `cap` positions (amortised; no-op when large enough).
  void reserve(int64_t cap);
  void clear() { n_tokens = 0; }

  float* k_at(int l, int64_t pos) { return k[l].data() + pos * kv_width; }
  float* v_at(int l, int64_t pos) { return v[l].data() + pos * kv_width; }
  float* ik_at(int l, int64_t pos) { return ik[l].data() + pos * index_dim; }
  const float* k_at(int l, int64_t pos) const { return k[l].data() + pos * kv_width; }
  const float* v_at(int l, int64_t pos) const { return v[l].data() + pos * kv_width; }
  const float* ik_at(int l, int64_t pos) const { return ik[l].data() + pos * index_dim; }

 private:
  std::vector<uint8_t> sparse_;
};

}  // namespace m3
