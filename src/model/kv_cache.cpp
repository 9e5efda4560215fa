// Per-sequence fp32 cache (see kv_cache.h).
#include "model/kv_cache.h"

#include <algorithm>

namespace m3 {

SeqCache::SeqCache(const ModelConfig& cfg, int64_t cap) {
  kv_width = cfg.n_kv_heads * cfg.head_dim;
  index_dim = cfg.index_dim;
  sparse_ = cfg.sparse_layer;
  k.resize(cfg.n_layers);
  v.resize(cfg.n_layers);
  ik.resize(cfg.n_layers);
  reserve(cap);
}

void SeqCache::reserve(int64_t cap) {
  if (cap <= capacity) return;
  cap = std::max(cap, capacity + capacity / 2);
  for (size_t l = 0; l < k.size(); ++l) {
    k[l].resize(size_t(cap) * kv_width);
    v[l].resize(size_t(cap) * kv_width);
    if (sparse_[l]) ik[l].resize(size_t(cap) * index_dim);
  }
  capacity = cap;
}

}  // namespace m3
