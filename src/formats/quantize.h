// Bit-exact encoders for the low-precision weight formats (docs/formats.md sections 1-3): float ->
// E4M3 / E2M1 / E8M0 element codes, MXFP8 block quantisation of a weight row and NVFP4
// (compressed-tensors convention) quantisation of a weight matrix. Used by make-model to write
// quantised checkpoints and by tests; the rounding rules are the spec's, so bytes match the
// reference kernels.
#pragma once
#include <cstdint>

namespace m3 {

// float -> E4M3FN byte: round to nearest even, saturating to +-448 (satfinite). The sign of zero
// is kept (-0.0009 -> 0x80). NaN -> 0x7F with the input's sign.
uint8_t float_to_e4m3(float x);

// float -> E2M1 code (4 bits, sign in bit 3): round to nearest with ties to the even code,
// saturating to +-6. A negative value that rounds to zero keeps its sign (0x8). NaN -> 0x7.
uint8_t float_to_e2m1(float x);

// Exact E8M0 byte of the MXFP8 block scale for a block with absolute maximum `amax`:
// 0 for amax == 0, else clamp(ceil(log2(amax / 448)) + 127, 0, 254) (vLLM / FlashInfer rule,
// also the rule used for the golden checkpoints' weights).
uint8_t mxfp8_scale_byte(float amax);

// MXFP8-quantise one row of K floats (K % 32 == 0): q[K] E4M3 bytes, scales[K/32] E8M0 bytes.
void mxfp8_quantize_row(const float* x, int64_t K, uint8_t* q, uint8_t* scales);

// NVFP4 compressed-tensors weight quantisation of W [N, K] (K % 16 == 0):
//   global = 6 * 448 / amax(W)     (stored as a divisor; 1.0 for an all-zero tensor)
//   scale[n, b] = E4M3(amax(W[n, 16b:16b+16]) / 6 * global)
//   code[n, k]  = E2M1(W[n, k] * global / float(scale[n, b]))   (0 where the scale is 0)
// packed [N, K/2] (low nibble = even element), scales [N, K/16]. Returns global.
float nvfp4_global_scale(float amax_tensor);
void nvfp4_quantize_row(const float* w, int64_t K, float global, uint8_t* packed, uint8_t* scales);
float nvfp4_quantize(const float* w, int64_t N, int64_t K, uint8_t* packed, uint8_t* scales);

// MXFP4 (OCP MX, AMD Quark exports; docs/formats.md section 4): E2M1 elements, one E8M0 scale per 32
// along K, no global scale. How the scale exponent is chosen from the block's amax (Quark's
// scale_calculation_mode, read from quantization_config):
//   Floor: OCP reference, shared_exp = floor(log2(amax)) - 2 (2 = emax of E2M1);
//   Even:  Quark's default ("even") and what vLLM's Quark OCP-MX emulation runs: amax first rounded to
//          two significant bits (its fp32 bits + 2^21, mantissa then cleared), so a block whose amax is
//          at least 1.75 * 2^e takes the next scale instead of saturating at 6 (x / scale in [7, 8)).
// byte = clamp(shared_exp + 127, 0, 254), read from the exponent field of the (rounded) amax: an all-zero
// block and every amax below 2^-125 give byte 0 (2^-127, the smallest scale); a NaN in the block gives
// 0xFF. Elements: q = E2M1(x * 2^(127 - byte)), round to nearest even, saturating at +-6.
enum class Mxfp4ScaleMode { Even, Floor };
uint8_t mxfp4_scale_byte(float amax, Mxfp4ScaleMode mode);
// One row of K floats (K % 32 == 0) to packed [K/2] (element 2i in the low nibble) and scales [K/32].
void mxfp4_quantize_row(const float* x, int64_t K, Mxfp4ScaleMode mode, uint8_t* packed, uint8_t* scales);
// Dynamic MXFP4 activation quantisation (W4A4) of one row, quantised and dequantised in one go:
// out[k] = e2m1(q[k]) * 2^(byte - 127), exactly the values an MXFP4 x MXFP4 GEMM multiplies (every
// product of two such values, and every partial sum kernels form of them, is then an fp32 operation on
// the same numbers). A NaN block stays NaN. K % 32 == 0.
void mxfp4_qdq_row(const float* x, int64_t K, Mxfp4ScaleMode mode, float* out);

// NVFP4 dynamic activation quantisation of one 16-element block with static global G
// (docs/formats.md 2.6): s = E4M3(G * amax / 6); multiplier = s ? 1 / (float(s) / G) : 0;
// q_i = E2M1(x_i * multiplier). Writes 8 packed bytes and returns the scale byte.
uint8_t nvfp4_quantize_activation_block(const float* x16, float G, uint8_t* packed8);

}  // namespace m3
