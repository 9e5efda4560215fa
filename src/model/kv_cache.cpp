// Per-sequence fp32 cache (see kv_cache.h).
#include "model/kv_cache.h"

#include <algorithm>
#include <cstring>

namespace m3 {

SeqCache::SeqCache(const ModelConfig& cfg, int64_t cap) {
  n_groups_ = cfg.n_kv_heads;
  head_dim_ = cfg.head_dim;
  index_dim_ = cfg.index_dim;
  chunk_ = cfg.any_sparse() ? cfg.block_size : 128;
  sparse_ = cfg.sparse_layer;
  k_.resize(size_t(cfg.n_layers) * size_t(n_groups_));
  v_.resize(size_t(cfg.n_layers) * size_t(n_groups_));
  ik_.resize(cfg.n_layers);
  reserve(cap);
}

void SeqCache::reserve(int64_t cap) {
  if (cap <= capacity_) return;
  cap = std::max(cap, capacity_ + capacity_ / 2);
  for (size_t i = 0; i < k_.size(); ++i) {
    k_[i].resize(size_t(cap) * head_dim_);
    v_[i].resize(size_t(cap) * head_dim_);
  }
  for (size_t l = 0; l < ik_.size(); ++l)
    if (sparse_[l]) ik_[l].resize(size_t(cap) * index_dim_);
  capacity_ = cap;
}

void SeqCache::store(int layer, int64_t pos, const float* k, const float* v, const float* ik) {
  for (int g = 0; g < n_groups_; ++g) {
    const size_t i = size_t(layer) * size_t(n_groups_) + size_t(g);
    std::memcpy(k_[i].data() + pos * head_dim_, k + int64_t(g) * head_dim_, size_t(head_dim_) * 4);
    std::memcpy(v_[i].data() + pos * head_dim_, v + int64_t(g) * head_dim_, size_t(head_dim_) * 4);
  }
  if (ik) std::memcpy(ik_[layer].data() + pos * index_dim_, ik, size_t(index_dim_) * 4);
}

namespace {
// fp32 rows `dim` floats apart from row `lo` of a lane.
KVRows f32_rows(const std::vector<float>& lane, int64_t lo, int dim) {
  return {reinterpret_cast<const uint8_t*>(lane.data() + lo * dim), int64_t(dim) * 4, KVDtype::F32};
}
}  // namespace

KVRows SeqCache::k_rows(int layer, int g, int64_t lo) const {
  return f32_rows(k_[size_t(layer) * size_t(n_groups_) + size_t(g)], lo, head_dim_);
}

KVRows SeqCache::v_rows(int layer, int g, int64_t lo) const {
  return f32_rows(v_[size_t(layer) * size_t(n_groups_) + size_t(g)], lo, head_dim_);
}

KVRows SeqCache::ik_rows(int layer, int64_t lo) const { return f32_rows(ik_[layer], lo, index_dim_); }

}  // namespace m3
