// Element formats: the checkpoint dtypes and the bit-exact decoders for BF16, F16, E4M3 (FN),
// E8M0 and E2M1 (docs/formats.md section 1). Decoders are table-free inline functions; hot loops use
// the lookup tables in element_tables.h.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace m3 {

enum class DType { F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U8, BOOL };

// Safetensors dtype name -> DType; returns false for names we do not know.
bool dtype_from_name(std::string_view name, DType* out);
const char* dtype_name(DType t);
size_t dtype_size(DType t);

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_float(uint16_t v) { return bits_to_float(uint32_t(v) << 16); }

// Round-to-nearest-even float -> bf16 (NaN kept quiet).
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    float v = std::ldexp(float(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | (man << 13));
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// OCP E4M3FN: bias 7, no infinities, NaN only at S.1111.111, max 448.
inline float e4m3_to_float(uint8_t b) {
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t man = b & 0x7u;
  float v;
  if (exp == 0xf && man == 0x7) {
    v = NAN;
  } else if (exp == 0) {
    v = float(man) * 0.001953125f;  // m * 2^-9
  } else {
    v = bits_to_float(((exp + 120u) << 23) | (man << 20));
  }
  return (b & 0x80u) ? -v : v;
}

// Index of the first E4M3 NaN code (S.1111.111: 0x7F or 0xFF) in p[0, n), or n when there is none.
// The loader rejects such codes in weights and scales: quantisers never emit them, and the fast
// MXFP8 kernels place E4M3 bits in fp32 fields, where 0x7F would read as a finite 480.
size_t find_e4m3_nan(const uint8_t* p, size_t n);

// UE8M0: 2^(e-127); 0xFF is NaN.
inline float e8m0_to_float(uint8_t e) {
  if (e == 0xff) return NAN;
  if (e == 0) return bits_to_float(0x00400000u);  // 2^-127 (subnormal)
  return bits_to_float(uint32_t(e) << 23);
}

// E2M1 code (low 4 bits): sign bit 3, magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}.
inline float e2m1_to_float(uint8_t code) {
  static constexpr float kMag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  const float v = kMag[code & 7u];
  return (code & 8u) ? -v : v;
}

}  // namespace m3
