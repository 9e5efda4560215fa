// Reference (scalar) dequantisation of MXFP8, NVFP4 and MXFP4 weight rows to float (docs/formats.md 2-3).
// Used by tests and by the reference forward pass; fast kernels must agree with these.
#pragma once
#include <cstdint>

namespace m3 {

// out[k] = e4m3(q[k]) * 2^(scales_e8m0[k/32] - 127); K % 32 == 0.
void mxfp8_dequant_row(const uint8_t* q, const uint8_t* scales_e8m0, int64_t K, float* out);

// out[k] = e2m1(code k) * e4m3(scales_e4m3[k/16]) / global_scale_divisor, code k in the low
// nibble of packed[k/2] for even k, the high nibble for odd k. The product is exact in fp32,
// followed by one fp32 division. K % 16 == 0.
void nvfp4_dequant_row(const uint8_t* packed, const uint8_t* scales_e4m3, float global_scale_divisor, int64_t K,
                       float* out);

// MXFP4 (OCP MX / AMD Quark, docs/formats.md section 4): out[k] = e2m1(code k) * 2^(scales_e8m0[k/32] - 127),
// code k in the low nibble of packed[k/2] for even k, the high nibble for odd k. Exact in fp32 for every
// code pair (a scale byte 0xFF gives NaN; the loader refuses it). K % 32 == 0.
void mxfp4_dequant_row(const uint8_t* packed, const uint8_t* scales_e8m0, int64_t K, float* out);

}  // namespace m3
