// Paged KV memory and the per-sequence view (see kv_pool.h).
#include "engine/kv_pool.h"

#include "base/error.h"

namespace m3 {

size_t KVPool::page_bytes(const ModelConfig& cfg, int B, KVDtype kv, KVDtype ik) {
  size_t per_token = 0;
  for (int l = 0; l < cfg.n_layers; ++l) {
    per_token += 2 * size_t(cfg.n_kv_heads) * kv_row_bytes(kv, cfg.head_dim);
    if (cfg.sparse_layer[l]) per_token += kv_row_bytes(ik, cfg.index_dim);
  }
  return per_token * size_t(B);
}

KVPool::KVPool(const ModelConfig& cfg, int block_size, KVDtype kv, KVDtype ik, int64_t num_pages)
    : cfg_(cfg), block_size_(block_size), kv_(kv), ikd_(ik), num_pages_(num_pages) {
  if ((kv == KVDtype::NVFP4 && cfg.head_dim % 16) || (ik == KVDtype::NVFP4 && cfg.any_sparse() && cfg.index_dim % 16))
    throw Error("nvfp4 KV cache needs head_dim and index_dim to be multiples of 16");
  kv_row_ = kv_row_bytes(kv, cfg.head_dim);
  ik_row_ = cfg.any_sparse() ? kv_row_bytes(ik, cfg.index_dim) : 0;
  const size_t slots = size_t(num_pages) * size_t(block_size);
  k_.resize(cfg.n_layers);
  v_.resize(cfg.n_layers);
  ik_.resize(cfg.n_layers);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const std::string what = "KV cache layer " + std::to_string(l);
    k_[l] = HugePageBuffer(slots * cfg.n_kv_heads * kv_row_, what + " keys");
    v_[l] = HugePageBuffer(slots * cfg.n_kv_heads * kv_row_, what + " values");
    if (cfg.sparse_layer[l]) ik_[l] = HugePageBuffer(slots * ik_row_, what + " index keys");
  }
  std::vector<HugePageBuffer*> all;
  for (auto* lane : {&k_, &v_, &ik_})
    for (HugePageBuffer& b : *lane) all.push_back(&b);
  commit_memory(all, "KV cache (" + std::to_string(num_pages) + " pages)");
}

PagedKV::PagedKV(KVPool& pool, const std::vector<int32_t>& table, int64_t size)
    : pool_(pool), table_(table), size_(size), head_dim_(pool.config().head_dim), index_dim_(pool.config().index_dim) {}

void PagedKV::store(int layer, int64_t pos, const float* k, const float* v, const float* ik) {
  const int B = pool_.block_size();
  const int64_t page = table_[pos / B];
  const int slot = int(pos % B);
  for (int g = 0; g < pool_.config().n_kv_heads; ++g) {
    kv_encode_row(pool_.kv_dtype(), k + g * head_dim_, head_dim_, 1.0f, pool_.k_row(layer, page, slot, g));
    kv_encode_row(pool_.kv_dtype(), v + g * head_dim_, head_dim_, 1.0f, pool_.v_row(layer, page, slot, g));
  }
  if (ik) kv_encode_row(pool_.ik_dtype(), ik, index_dim_, 1.0f, pool_.ik_row(layer, page, slot));
}

// Rows of one page's lane are contiguous (one KV head's rows of a block; see KVPool::row), one row's
// bytes apart.
KVRows PagedKV::k_rows(int layer, int g, int64_t lo) const {
  const int B = pool_.block_size();
  return {pool_.k_row(layer, table_[lo / B], int(lo % B), g), int64_t(pool_.kv_row_size()), pool_.kv_dtype()};
}

KVRows PagedKV::v_rows(int layer, int g, int64_t lo) const {
  const int B = pool_.block_size();
  return {pool_.v_row(layer, table_[lo / B], int(lo % B), g), int64_t(pool_.kv_row_size()), pool_.kv_dtype()};
}

KVRows PagedKV::ik_rows(int layer, int64_t lo) const {
  const int B = pool_.block_size();
  return {pool_.ik_row(layer, table_[lo / B], int(lo % B)), int64_t(pool_.ik_row_size()), pool_.ik_dtype()};
}

}  // namespace m3
