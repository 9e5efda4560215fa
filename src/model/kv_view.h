// KVView: how the forward pass sees one sequence's cache: the K, V and (sparse layers) index-K
// lanes addressed by *logical* token position. The simple fp32 SeqCache and the engine's paged,
// possibly quantised cache both implement it; reads come back as fp32 rows, either pointing into
// the cache or decoded into caller scratch. A read never crosses a multiple of chunk() positions
// (one page = one MSA block), so a paged implementation serves it from a single page.
#pragma once
#include <cstdint>

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
  // n rows (positions lo..lo+n-1) of KV head g: returns a pointer to the first row; rows are
  // *stride floats apart. `scratch` has room for n * head_dim floats.
  virtual const float* k_rows(int layer, int g, int64_t lo, int64_t n, float* scratch, int64_t* stride) const = 0;
  virtual const float* v_rows(int layer, int g, int64_t lo, int64_t n, float* scratch, int64_t* stride) const = 0;
  // True when k_rows / v_rows / ik_rows return pointers into the cache itself and never write the
  // scratch (then re-reading a block costs nothing; a decoding cache is worth reusing).
  virtual bool rows_in_place() const { return false; }
  // Rows stored as BF16, read in place by the BF16 kernels: the address of row lo of KV head g
  // (index keys: of the index lane) and the stride in elements; nullptr when stored otherwise.
  virtual const uint16_t* k_rows_bf16(int layer, int g, int64_t lo, int64_t* stride) const { return nullptr; }
  virtual const uint16_t* v_rows_bf16(int layer, int g, int64_t lo, int64_t* stride) const { return nullptr; }
  virtual const uint16_t* ik_rows_bf16(int layer, int64_t lo, int64_t* stride) const { return nullptr; }
  // Index keys stored as FP8 or NVFP4 (scale 1), for the fused scan: the address of row lo, the
  // row stride in bytes and the row kind (a KvRowKind value); nullptr when stored otherwise.
  virtual const uint8_t* ik_rows_quantised(int layer, int64_t lo, int64_t* stride_bytes, int* kind) const {
    return nullptr;
  }
  // The same for the K and V rows of KV head g (read in place by block attention).
  virtual const uint8_t* k_rows_quantised(int layer, int g, int64_t lo, int64_t* stride_bytes, int* kind) const {
    return nullptr;
  }
  virtual const uint8_t* v_rows_quantised(int layer, int g, int64_t lo, int64_t* stride_bytes, int* kind) const {
    return nullptr;
  }
  // n index-key rows (scratch: n * index_dim floats).
  virtual const float* ik_rows(int layer, int64_t lo, int64_t n, float* scratch, int64_t* stride) const = 0;
};

}  // namespace m3
