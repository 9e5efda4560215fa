// KVPool: the memory of the paged cache. One page = one MSA block (block_size tokens) and holds,
// for every layer, the K and V rows of its tokens and, for sparse layers, their index keys: three
// lanes addressed by one page id, so they are allocated, shared, cached and freed together.
// PagedKV is one sequence's view of it through its block table (a KVView for the forward pass).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/kv_format.h"
#include "base/host_memory.h"
#include "model/config.h"
#include "model/kv_view.h"

namespace m3 {

class KVPool {
 public:
  KVPool(const ModelConfig& cfg, int block_size, KVDtype kv, KVDtype ik, int64_t num_pages);

  // Bytes of one page over all layers and lanes.
  static size_t page_bytes(const ModelConfig& cfg, int block_size, KVDtype kv, KVDtype ik);

  int block_size() const { return block_size_; }
  int64_t num_pages() const { return num_pages_; }
  KVDtype kv_dtype() const { return kv_; }
  KVDtype ik_dtype() const { return ikd_; }
  const ModelConfig& config() const { return cfg_; }

  uint8_t* k_row(int layer, int64_t page, int slot, int g) { return row(k_, layer, page, slot, g, kv_row_); }
  uint8_t* v_row(int layer, int64_t page, int slot, int g) { return row(v_, layer, page, slot, g, kv_row_); }
  uint8_t* ik_row(int layer, int64_t page, int slot) { return ik_[layer].data() + ((page * block_size_) + slot) * ik_row_; }
  const uint8_t* k_row(int layer, int64_t page, int slot, int g) const { return const_cast<KVPool*>(this)->k_row(layer, page, slot, g); }
  const uint8_t* v_row(int layer, int64_t page, int slot, int g) const { return const_cast<KVPool*>(this)->v_row(layer, page, slot, g); }
  const uint8_t* ik_row(int layer, int64_t page, int slot) const { return const_cast<KVPool*>(this)->ik_row(layer, page, slot); }
  size_t kv_row_size() const { return kv_row_; }
  size_t ik_row_size() const { return ik_row_; }

  // Calls f(pointer, bytes) for each contiguous run of one page's bytes over every lane (K and V per
  // layer and KV head, index keys per sparse layer), always in the same order: the page's whole state,
  // for copying it out of the pool and back (KV tiers, transfers).
  template <class F>
  void for_each_page_run(int64_t page, F&& f) {
    const size_t kv_run = size_t(block_size_) * kv_row_, ik_run = size_t(block_size_) * ik_row_;
    for (int l = 0; l < cfg_.n_layers; ++l) {
      for (int g = 0; g < cfg_.n_kv_heads; ++g) {
        f(k_row(l, page, 0, g), kv_run);
        f(v_row(l, page, 0, g), kv_run);
      }
      if (cfg_.sparse_layer[l]) f(ik_row(l, page, 0), ik_run);
    }
  }

 private:
  uint8_t* row(std::vector<HugePageBuffer>& lane, int layer, int64_t page, int slot, int g, size_t rb) {
    // One KV head's rows of a block are contiguous (read in place or decoded as one stream). Dense
    // layers keep each head's pages together, so that a head's consecutive pages form one stream for
    // the thread that attends with it; sparse layers keep a page's heads together, since the head-major
    // order was slower on a sparse layer's few selected pages (figures: docs/benchmarks.md section 5).
    const int64_t i = cfg_.sparse_layer[layer] ? page * cfg_.n_kv_heads + g : int64_t(g) * num_pages_ + page;
    return lane[layer].data() + (i * block_size_ + slot) * rb;
  }
  ModelConfig cfg_;
  int block_size_;
  KVDtype kv_, ikd_;
  int64_t num_pages_;
  size_t kv_row_, ik_row_;
  // Per layer, committed at construction (no page faults inside a step), on transparent huge pages
  // where the kernel offers them (attention at long context walks tens of MB of rows: fewer TLB
  // misses; see formats/host_memory.h).
  std::vector<HugePageBuffer> k_, v_, ik_;
};

// One sequence's pages: a KVView over the pool. Positions are logical; page i of the table holds
// positions [i*B, (i+1)*B).
class PagedKV : public KVView {
 public:
  PagedKV(KVPool& pool, const std::vector<int32_t>& block_table, int64_t size);
  int64_t size() const override { return size_; }
  int chunk() const override { return pool_.block_size(); }
  void store(int layer, int64_t pos, const float* k, const float* v, const float* ik) override;
  KVRows k_rows(int layer, int g, int64_t lo) const override;
  KVRows v_rows(int layer, int g, int64_t lo) const override;
  KVRows ik_rows(int layer, int64_t lo) const override;

 private:

  KVPool& pool_;
  const std::vector<int32_t>& table_;
  int64_t size_;
  int head_dim_, index_dim_;
};

}  // namespace m3
