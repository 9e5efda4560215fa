// Paged KV memory and the per-sequence view (see kv_pool.h).
#include "engine/kv_pool.h"

#include "formats/error.h"
#include "kernels/cpu/dispatch.h"

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

// Decodes n rows starting at position lo (all in one page) of a lane into scratch.
namespace {
// The kernels' name for a quantised cache dtype's row encoding.
KvRowKind row_kind(KVDtype dt) {
  return dt == KVDtype::BF16 ? KvRowKind::BF16 : dt == KVDtype::FP8 ? KvRowKind::FP8 : KvRowKind::NVFP4;
}
}  // namespace

template <class RowFn>
const float* PagedKV::decode_rows(int64_t lo, int64_t n, KVDtype dt, int dim, float* scratch, int64_t* stride,
                                  RowFn row) const {
  const int B = pool_.block_size();
  const int64_t page = table_[lo / B];
  const int slot = int(lo % B);
  *stride = dim;
  // fp32 rows of one page are contiguous (group-major pages): read in place.
  if (dt == KVDtype::F32) return reinterpret_cast<const float*>(row(page, slot));
  // The rows are contiguous too: one vectorised decode over the run.
  const uint8_t* first = row(page, slot);
  cpu_ops().decode_kv_rows(int(row_kind(dt)), first, n > 1 ? row(page, slot + 1) - first : 0, n, dim, scratch);
  return scratch;
}

const float* PagedKV::k_rows(int layer, int g, int64_t lo, int64_t n, float* scratch, int64_t* stride) const {
  return decode_rows(lo, n, pool_.kv_dtype(), head_dim_, scratch, stride,
                     [&](int64_t page, int slot) { return pool_.k_row(layer, page, slot, g); });
}

const float* PagedKV::v_rows(int layer, int g, int64_t lo, int64_t n, float* scratch, int64_t* stride) const {
  return decode_rows(lo, n, pool_.kv_dtype(), head_dim_, scratch, stride,
                     [&](int64_t page, int slot) { return pool_.v_row(layer, page, slot, g); });
}

const float* PagedKV::ik_rows(int layer, int64_t lo, int64_t n, float* scratch, int64_t* stride) const {
  return decode_rows(lo, n, pool_.ik_dtype(), index_dim_, scratch, stride,
                     [&](int64_t page, int slot) { return pool_.ik_row(layer, page, slot); });
}

// Rows [lo, ...) of a lane stored as BF16, in place (one page's rows of a lane are contiguous).
template <class RowFn>
const uint16_t* PagedKV::bf16_rows(int64_t lo, KVDtype dt, int dim, int64_t* stride, RowFn row) const {
  if (dt != KVDtype::BF16) return nullptr;
  const int B = pool_.block_size();
  *stride = dim;
  return reinterpret_cast<const uint16_t*>(row(table_[lo / B], int(lo % B)));
}

const uint16_t* PagedKV::k_rows_bf16(int layer, int g, int64_t lo, int64_t* stride) const {
  return bf16_rows(lo, pool_.kv_dtype(), head_dim_, stride,
                   [&](int64_t page, int slot) { return pool_.k_row(layer, page, slot, g); });
}

const uint16_t* PagedKV::v_rows_bf16(int layer, int g, int64_t lo, int64_t* stride) const {
  return bf16_rows(lo, pool_.kv_dtype(), head_dim_, stride,
                   [&](int64_t page, int slot) { return pool_.v_row(layer, page, slot, g); });
}

const uint16_t* PagedKV::ik_rows_bf16(int layer, int64_t lo, int64_t* stride) const {
  return bf16_rows(lo, pool_.ik_dtype(), index_dim_, stride,
                   [&](int64_t page, int slot) { return pool_.ik_row(layer, page, slot); });
}

// Rows [lo, ...) of a lane stored as FP8 or NVFP4, in place. Rows of a page are contiguous
// (group-major pages); the stride is one row's bytes.
template <class RowFn>
const uint8_t* PagedKV::quantised_rows(int64_t lo, KVDtype dt, int dim, int64_t* stride_bytes, int* kind,
                                       RowFn row) const {
  if (dt != KVDtype::FP8 && dt != KVDtype::NVFP4) return nullptr;
  const int B = pool_.block_size();
  *stride_bytes = int64_t(kv_row_bytes(dt, dim));
  *kind = int(row_kind(dt));
  return row(table_[lo / B], int(lo % B));
}

const uint8_t* PagedKV::ik_rows_quantised(int layer, int64_t lo, int64_t* stride_bytes, int* kind) const {
  return quantised_rows(lo, pool_.ik_dtype(), index_dim_, stride_bytes, kind,
                        [&](int64_t page, int slot) { return pool_.ik_row(layer, page, slot); });
}

const uint8_t* PagedKV::k_rows_quantised(int layer, int g, int64_t lo, int64_t* stride_bytes, int* kind) const {
  return quantised_rows(lo, pool_.kv_dtype(), head_dim_, stride_bytes, kind,
                        [&](int64_t page, int slot) { return pool_.k_row(layer, page, slot, g); });
}

const uint8_t* PagedKV::v_rows_quantised(int layer, int g, int64_t lo, int64_t* stride_bytes, int* kind) const {
  return quantised_rows(lo, pool_.kv_dtype(), head_dim_, stride_bytes, kind,
                        [&](int64_t page, int slot) { return pool_.v_row(layer, page, slot, g); });
}

}  // namespace m3
