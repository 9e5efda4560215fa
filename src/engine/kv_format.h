// The user's spelling of a KV cache dtype (--kv-cache-dtype, the indexer_kv_dtype of --attention-config),
// parsed at the edge into the one row-format type, KVDtype (kernels/cpu/kv_format.h, with the row
// encoders and decoders).
#pragma once
#include <string>

#include "kernels/cpu/kv_format.h"

namespace m3 {

// "auto" (= bf16, the checkpoint's activation dtype), "bf16", "fp8" / "fp8_e4m3", "nvfp4", "fp32".
// Throws m3::Error naming `what` (the flag) and the accepted values.
KVDtype parse_kv_dtype(const std::string& s, const std::string& what);

}  // namespace m3
