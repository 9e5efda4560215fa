// Parsing of the KV cache dtype flags (see kv_format.h).
#include "engine/kv_format.h"

#include "base/error.h"

namespace m3 {

KVDtype parse_kv_dtype(const std::string& s, const std::string& what) {
  if (s == "auto" || s == "bf16" || s == "bfloat16") return KVDtype::BF16;
  if (s == "fp8" || s == "fp8_e4m3") return KVDtype::FP8;
  if (s == "nvfp4") return KVDtype::NVFP4;
  if (s == "fp32" || s == "float32") return KVDtype::F32;
  throw Error(what + ": unknown KV dtype \"" + s + "\" (expected auto, bf16, fp8, nvfp4 or fp32)");
}

}  // namespace m3
