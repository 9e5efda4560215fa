// The KV cache's row format, the one type every layer uses (docs/formats.md sections 5-7): one row (a
// K or V head of one token, or one index key) encoded as fp32, bf16, fp8 E4M3 (per-layer scale, 1.0
// when the checkpoint ships none) or NVFP4 (16-element E4M3 block scales; the row stores its packed
// E2M1 codes followed by its scales: dim/2 + dim/16 bytes, 72 B for a 128-dim row). The element codes
// decode through element_tables.h. Parsing the user's spelling of a dtype (--kv-cache-dtype,
// indexer_kv_dtype) stays at the edge: engine/kv_format.h.
#pragma once
#include <cstddef>
#include <cstdint>

namespace m3 {

enum class KVDtype { F32, BF16, FP8, NVFP4 };

const char* kv_dtype_name(KVDtype d);

size_t kv_row_bytes(KVDtype d, int dim);
void kv_encode_row(KVDtype d, const float* x, int dim, float scale, uint8_t* dst);
void kv_decode_row(KVDtype d, const uint8_t* src, int dim, float scale, float* out);

// Consecutive rows of one cache lane as stored (scale 1), what the attention kernels read in place: row j
// at data + j * stride_bytes.
struct KVRows {
  const uint8_t* data = nullptr;
  int64_t stride_bytes = 0;
  KVDtype dtype = KVDtype::F32;
};

}  // namespace m3
