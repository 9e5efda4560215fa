// KVView: how the forward pass sees one sequence's cache: the K, V and (sparse layers) index-K
// lanes addressed by *logical* token position. The simple fp32 SeqCache and the engine's paged,
// possibly quantised cache both implement it; a read hands out the rows as stored (KVRows: address,
// stride, format), which the attention functions (kernels/cpu/attention.h) read in place or decode. A
// read never crosses a multiple of chunk() positions (one page = one MSA block), so a paged
// implementation serves it from a single page.
#pragma once
#include <cstdint>

#include "kernels/cpu/kv_format.h"

namespace m3 {

class KVView {
 public:
  virtual ~KVView() = default;
  // Positions [0, size()) hold data.
  virtual int64_t size() const = 0;
  // Granularity of reads (the page size; reads never cross a multiple of it).
  virtual int chunk() const = 0;
  // Writes the post-norm post-RoPE k [n_kv_heads*head_dim], raw v, and index key ik (sparse layers,
  // else nullptr) of one token.
  virtual void store(int layer, int64_t pos, const float* k, const float* v, const float* ik) = 0;
  // The rows from position lo on (up to the next multiple of chunk()) of KV head g's K / V lane, and of
  // the index-key lane.
  virtual KVRows k_rows(int layer, int g, int64_t lo) const = 0;
  virtual KVRows v_rows(int layer, int g, int64_t lo) const = 0;
  virtual KVRows ik_rows(int layer, int64_t lo) const = 0;
};

}  // namespace m3
