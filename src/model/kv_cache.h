// SeqCache: the simple per-sequence cache (fp32, contiguous by logical position) used by the
// foundation path, the tools and as the parity reference for the engine's paged cache. Per layer
// it keeps the post-norm post-RoPE K, the raw V and (sparse layers) the post-norm post-RoPE index key.
// K and V are stored per KV head (group-major): a selected block of one group is one contiguous
// run of rows, which streams from memory at a much higher rate than rows strided by the other
// groups (speed at long context).
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/kv_view.h"

namespace m3 {

class SeqCache : public KVView {
 public:
  SeqCache() = default;
  SeqCache(const ModelConfig& cfg, int64_t capacity);

  int64_t n_tokens = 0;  // positions [0, n_tokens) are filled

  // Grows to hold at least `cap` positions (amortised; no-op when large enough).
  void reserve(int64_t cap);
  void clear() { n_tokens = 0; }
  int64_t capacity() const { return capacity_; }

  int64_t size() const override { return n_tokens; }
  int chunk() const override { return chunk_; }
  void store(int layer, int64_t pos, const float* k, const float* v, const float* ik) override;
  KVRows k_rows(int layer, int g, int64_t lo) const override;
  KVRows v_rows(int layer, int g, int64_t lo) const override;
  KVRows ik_rows(int layer, int64_t lo) const override;

 private:
  int64_t capacity_ = 0;
  int n_groups_ = 0, head_dim_ = 0, index_dim_ = 0, chunk_ = 128;
  std::vector<uint8_t> sparse_;
  std::vector<std::vector<float>> k_, v_;  // [layer * n_groups + g][pos * head_dim]
  std::vector<std::vector<float>> ik_;     // [layer][pos * index_dim]
};

}  // namespace m3
