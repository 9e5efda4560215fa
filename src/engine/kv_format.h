// Element formats of the paged KV cache lanes (docs/formats.md sections 5-7): one row (a K or V head of
// one token, or one index key) encoded as fp32, bf16, fp8 E4M3 (per-layer scale, 1.0 when the
// checkpoint ships none) or NVFP4 (16-element E4M3 block scales; the row stores its packed E2M1
// codes followed by its scales: dim/2 + dim/16 bytes, 72 B for a 128-dim row).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace m3 {

enum class KVDtype { F32, BF16, FP8, NVFP4 };

// "auto" (= bf16, the checkpoint's activation dtype), "bf16", "fp8" / "fp8_e4m3", "nvfp4", "fp32".
// Throws m3::Error naming `what` (the flag) and the accepted values.
KVDtype parse_kv_dtype(const std::string& s, const std::string& what);
const char* kv_dtype_name(KVDtype d);

size_t kv_row_bytes(KVDtype d, int dim);
void kv_encode_row(KVDtype d, const float* x, int dim, float scale, uint8_t* dst);
void kv_decode_row(KVDtype d, const uint8_t* src, int dim, float scale, float* out);

}  // namespace m3
