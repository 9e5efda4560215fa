// Scalar MXFP8 / NVFP4 / MXFP4 row dequantisers (see block_dequant.h); written to follow the spec
// formulas literally so they can serve as the reference for optimised kernels.
#include "formats/block_dequant.h"

#include <cmath>

#include "formats/dtype.h"

namespace m3 {

void mxfp8_dequant_row(const uint8_t* q, const uint8_t* scales_e8m0, int64_t K, float* out) {
  for (int64_t b = 0; b < K / 32; ++b) {
    // 2^(s-127) as a float multiplier (e8m0_to_float handles the subnormal 2^-127 and NaN).
    const float s = e8m0_to_float(scales_e8m0[b]);
    for (int i = 0; i < 32; ++i) out[b * 32 + i] = e4m3_to_float(q[b * 32 + i]) * s;
  }
}

void nvfp4_dequant_row(const uint8_t* packed, const uint8_t* scales_e4m3, float global_scale_divisor, int64_t K,
                       float* out) {
  for (int64_t b = 0; b < K / 16; ++b) {
    const float s = e4m3_to_float(scales_e4m3[b]);
    for (int i = 0; i < 8; ++i) {
      const uint8_t byte = packed[b * 8 + i];
      out[b * 16 + 2 * i] = (e2m1_to_float(byte & 0xf) * s) / global_scale_divisor;
      out[b * 16 + 2 * i + 1] = (e2m1_to_float(byte >> 4) * s) / global_scale_divisor;
    }
  }
}

void mxfp4_dequant_row(const uint8_t* packed, const uint8_t* scales_e8m0, int64_t K, float* out) {
  for (int64_t b = 0; b < K / 32; ++b) {
    const float s = e8m0_to_float(scales_e8m0[b]);
    for (int i = 0; i < 16; ++i) {
      const uint8_t byte = packed[b * 16 + i];
      out[b * 32 + 2 * i] = e2m1_to_float(byte & 0xf) * s;
      out[b * 32 + 2 * i + 1] = e2m1_to_float(byte >> 4) * s;
    }
  }
}

}  // namespace m3
