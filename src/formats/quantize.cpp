// Encoders for E4M3 / E2M1 / E8M0 and the MXFP8 / NVFP4 block quantisers (see quantize.h).
// Hand-written from the rules in docs/formats.md; each step is done in the order the spec gives so
// the bytes are reproducible.
#include "formats/quantize.h"

#include <algorithm>
#include <cmath>

#include "formats/dtype.h"

namespace m3 {

uint8_t float_to_e4m3(float x) {
  const uint32_t bits = float_to_bits(x);
  const uint8_t sign = uint8_t((bits >> 24) & 0x80u);
  const uint32_t abits = bits & 0x7fffffffu;
  if (abits > 0x7f800000u) return uint8_t(sign | 0x7f);  // NaN
  const float a = bits_to_float(abits);
  if (a >= 448.0f) return uint8_t(sign | 0x7e);  // satfinite (also +-inf)
  if (a < 0.015625f) {
    // Subnormal range: value = m * 2^-9, m in 0..8 (8 is the smallest normal, code 0x08).
    // a * 512 is exact; nearbyint rounds half to even in the default rounding mode.
    const float m = std::nearbyint(a * 512.0f);
    return uint8_t(sign | uint8_t(m));
  }
  // Normal: keep 3 mantissa bits with round-half-even on the float bit pattern; a carry out of
  // the mantissa increments the exponent, which is what we want.
  uint32_t t = abits + 0x7ffffu + ((abits >> 20) & 1u);
  t >>= 20;                           // (float exponent << 3) | 3-bit mantissa
  uint32_t code = t - ((127u - 7u) << 3);  // rebias 127 -> 7
  if (code > 0x7eu) code = 0x7eu;     // rounding up past 448 saturates
  return uint8_t(sign | code);
}

uint8_t float_to_e2m1(float x) {
  if (std::isnan(x)) return 0x7;
  const uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);
  // Decision points are the midpoints between neighbouring magnitudes {0,.5,1,1.5,2,3,4,6};
  // at an exact midpoint the even code wins (<= rounds down to even, < rounds up to even).
  uint8_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return uint8_t(sign | c);
}

uint8_t mxfp8_scale_byte(float amax) {
  if (!(amax > 0.0f)) return 0;
  if (std::isinf(amax)) return 254;
  // Smallest integer e with amax <= 448 * 2^e, found with exact comparisons (double holds
  // 448 * 2^e exactly over the whole range) instead of trusting log2 near powers of two.
  int e = std::ilogb(amax) - 8;
  const double a = amax;
  while (std::ldexp(448.0, e) < a) ++e;
  while (std::ldexp(448.0, e - 1) >= a) --e;
  return uint8_t(std::clamp(e + 127, 0, 254));
}

void mxfp8_quantize_row(const float* x, int64_t K, uint8_t* q, uint8_t* scales) {
  for (int64_t b = 0; b < K / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const uint8_t s = mxfp8_scale_byte(amax);
    scales[b] = s;
    const int shift = 127 - int(s);  // x / 2^(s-127), exact (power-of-two scaling)
    for (int i = 0; i < 32; ++i) q[b * 32 + i] = amax == 0.0f ? 0 : float_to_e4m3(std::ldexp(xb[i], shift));
  }
}

float nvfp4_global_scale(float amax_tensor) {
  if (!(amax_tensor > 0.0f) || std::isinf(amax_tensor)) return 1.0f;
  return 6.0f * 448.0f / amax_tensor;
}

void nvfp4_quantize_row(const float* w, int64_t K, float global, uint8_t* packed, uint8_t* scales) {
  for (int64_t b = 0; b < K / 16; ++b) {
    const float* wb = w + b * 16;
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(wb[i]));
    const uint8_t s = float_to_e4m3(amax / 6.0f * global);
    scales[b] = s;
    const float sv = e4m3_to_float(s);
    uint8_t codes[16];
    for (int i = 0; i < 16; ++i) codes[i] = sv == 0.0f ? 0 : float_to_e2m1(wb[i] * global / sv);
    for (int i = 0; i < 8; ++i) packed[b * 8 + i] = uint8_t((codes[2 * i] & 0xf) | ((codes[2 * i + 1] & 0xf) << 4));
  }
}

float nvfp4_quantize(const float* w, int64_t N, int64_t K, uint8_t* packed, uint8_t* scales) {
  float amax = 0.0f;
  for (int64_t i = 0; i < N * K; ++i) amax = std::max(amax, std::fabs(w[i]));
  const float global = nvfp4_global_scale(amax);
  for (int64_t n = 0; n < N; ++n) nvfp4_quantize_row(w + n * K, K, global, packed + n * (K / 2), scales + n * (K / 16));
  return global;
}

uint8_t nvfp4_quantize_activation_block(const float* x16, float G, uint8_t* packed8) {
  float amax = 0.0f;
  for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x16[i]));
  const uint8_t s = float_to_e4m3(G * amax / 6.0f);
  const float sv = e4m3_to_float(s);
  const float mult = sv != 0.0f ? 1.0f / (sv / G) : 0.0f;
  for (int i = 0; i < 8; ++i) {
    const uint8_t lo = float_to_e2m1(x16[2 * i] * mult), hi = float_to_e2m1(x16[2 * i + 1] * mult);
    packed8[i] = uint8_t((lo & 0xf) | ((hi & 0xf) << 4));
  }
  return s;
}

uint8_t mxfp4_scale_byte(float amax, Mxfp4ScaleMode mode) {
  if (std::isnan(amax)) return 0xff;
  uint32_t bits = float_to_bits(std::fabs(amax));
  // Even: + half of the last kept mantissa step of a 1-bit mantissa (2^21), then drop the mantissa; a
  // carry moves the exponent up. The exponent field then is floor(log2) + 127 for normal values (an
  // amax that rounds to infinity gives field 255, i.e. byte 253, as the bit-level rule in Quark/torchao).
  if (mode == Mxfp4ScaleMode::Even) bits = (bits + 0x200000u) & 0x7f800000u;
  const int field = int(bits >> 23);  // 0 for zero and subnormal amax: floor(log2) <= -127, clamped
  return uint8_t(std::clamp(field - 2, 0, 254));
}

namespace {
uint8_t pack2(uint8_t lo, uint8_t hi) { return uint8_t((lo & 0xf) | ((hi & 0xf) << 4)); }

// The E8M0 scale byte of one block of 32: 0xFF (NaN) when the block holds a NaN, else the mode's rule on amax.
uint8_t mxfp4_block_scale(const float* xb, Mxfp4ScaleMode mode) {
  float amax = 0.0f;
  bool nan = false;
  for (int i = 0; i < 32; ++i) {
    nan |= std::isnan(xb[i]);
    amax = std::max(amax, std::fabs(xb[i]));
  }
  return nan ? uint8_t(0xff) : mxfp4_scale_byte(amax, mode);
}
}  // namespace

void mxfp4_quantize_row(const float* x, int64_t K, Mxfp4ScaleMode mode, uint8_t* packed, uint8_t* scales) {
  for (int64_t b = 0; b < K / 32; ++b) {
    const float* xb = x + b * 32;
    const uint8_t s = mxfp4_block_scale(xb, mode);
    scales[b] = s;
    const int shift = 127 - int(s);  // x / 2^(s - 127), exact up to results far below E2M1's 0.25
    for (int i = 0; i < 16; ++i)
      packed[b * 16 + i] = pack2(float_to_e2m1(std::ldexp(xb[2 * i], shift)), float_to_e2m1(std::ldexp(xb[2 * i + 1], shift)));
  }
}

void mxfp4_qdq_row(const float* x, int64_t K, Mxfp4ScaleMode mode, float* out) {
  for (int64_t b = 0; b < K / 32; ++b) {
    const float* xb = x + b * 32;
    const uint8_t s = mxfp4_block_scale(xb, mode);
    const float scale = e8m0_to_float(s);  // NaN for 0xFF
    const int shift = 127 - int(s);
    for (int i = 0; i < 32; ++i)
      out[b * 32 + i] = s == 0xff ? NAN : e2m1_to_float(float_to_e2m1(std::ldexp(xb[i], shift))) * scale;
  }
}

}  // namespace m3
