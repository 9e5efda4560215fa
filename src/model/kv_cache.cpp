// Per-sequence fp32 cache (see kv_cache.h).
#include "model/kv_cache.h"

#include <algorithm>
#include <cstring>

namespace m3 {

SeqCache::SeqCache(const ModelConfig& cfg, int64_t cap) {
  kv_width_ = cfg.n_kv_heads * cfg.head_dim;
  head_dim_ = cfg.head_dim;
  index_dim_ = cfg.index_dim;
  chunk_ = cfg.any_sparse() ? cfg.block_size : 128;
  sparse_ = cfg.sparse_layer;
  k_.resize(cfg.n_layers);
  v_.resize(cfg.n_layers);
  ik_.resize(cfg.n_layers);
  reserve(cap);
}

void SeqCache::reserve(int64_t cap) {
  if (cap <= capacity_) return;
  cap = std::max(cap, capacity_ + capacity_ / 2);
  for (size_t l = 0; l < k_.size(); ++l) {
    k_[l].resize(size_t(cap) * kv_width_);
    v_[l].resize(size_t(cap) * kv_width_);
    if (sparse_[l]) ik_[l].resize(size_t(cap) * index_dim_);
  }
  capacity_ = cap;
}

void SeqCache::store(int layer, int64_t pos, const float* k, const float* v, const float* ik) {
  std::memcpy(k_[layer].data() + pos * kv_width_, k, size_t(kv_width_) * 4);
  std::memcpy(v_[layer].data() + pos * kv_width_, v, size_t(kv_width_) * 4);
  if (ik) std::memcpy(ik_[layer].data() + pos * index_dim_, ik, size_t(index_dim_) * 4);
}

const float* SeqCache::k_rows(int layer, int g, int64_t lo, int64_t, float*, int64_t* stride) const {
  *stride = kv_width_;
  return k_[layer].data() + lo * kv_width_ + int64_t(g) * head_dim_;
}

const float* SeqCache::v_rows(int layer, int g, int64_t lo, int64_t, float*, int64_t* stride) const {
  *stride = kv_width_;
  return v_[layer].data() + lo * kv_width_ + int64_t(g) * head_dim_;
}

const float* SeqCache::ik_rows(int layer, int64_t lo, int64_t, float*, int64_t* stride) const {
  *stride = index_dim_;
  return ik_[layer].data() + lo * index_dim_;
}

}  // namespace m3
