// MXFP8 / NVFP4 block dequantisation on hand-built blocks with known results, and quantise ->
// dequantise round trips with error bounds derived from the element formats.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "formats/block_dequant.h"
#include "formats/dtype.h"
#include "formats/quantize.h"

TEST(BlockQuant, MxFp8HandBuiltBlocks) {
  std::vector<uint8_t> q(64);
  for (int i = 0; i < 32; ++i) q[i] = 0x38;                 // 1.0
  for (int i = 32; i < 64; ++i) q[i] = (i % 2) ? 0xC5 : 0x01;  // -3.25, 2^-9
  const uint8_t scales[2] = {128, 120};                      // 2.0, 2^-7
  std::vector<float> out(64);
  m3::mxfp8_dequant_row(q.data(), scales, 64, out.data());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], 2.0f);
  for (int i = 32; i < 64; ++i) EXPECT_EQ(out[i], (i % 2) ? -3.25f / 128 : std::ldexp(1.0f, -16)) << i;
  // Scale byte 0 is 2^-127 (no zero scale); 448 * 2^-127 is still representable.
  uint8_t q1[32] = {0x7E};
  const uint8_t s0 = 0;
  float o1[32];
  m3::mxfp8_dequant_row(q1, &s0, 32, o1);
  EXPECT_EQ(o1[0], std::ldexp(448.0f, -127));
  EXPECT_EQ(o1[1], 0.0f);
}

TEST(BlockQuant, NvFp4HandBuiltBlocks) {
  // Block 0: codes 0..15 in order (even element in the low nibble); scale 1.625; global 2.
  // Block 1: all codes 7 (6.0); scale 448; global 2 -> 6 * 448 / 2 = 1344.
  uint8_t packed[16];
  for (int i = 0; i < 8; ++i) packed[i] = uint8_t((2 * i) | ((2 * i + 1) << 4));
  for (int i = 8; i < 16; ++i) packed[i] = 0x77;
  const uint8_t scales[2] = {0x3D, 0x7E};
  float out[32];
  m3::nvfp4_dequant_row(packed, scales, 2.0f, 32, out);
  const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  for (int k = 0; k < 16; ++k) {
    const float v = (k & 8) ? -mag[k & 7] : mag[k & 7];
    EXPECT_EQ(out[k], v * 1.625f / 2.0f) << k;
  }
  for (int k = 16; k < 32; ++k) EXPECT_EQ(out[k], 1344.0f);
  // The 9.4 byte: (1.0, -3.0) with scale 1 and global 1.
  const uint8_t b = 0xD2, one = 0x38;
  uint8_t row[8] = {b};
  float o2[16];
  m3::nvfp4_dequant_row(row, &one, 1.0f, 16, o2);
  EXPECT_EQ(o2[0], 1.0f);
  EXPECT_EQ(o2[1], -3.0f);
  // Product exact, then one division: 1.5 * 1.125 / 3 rounded once.
  const uint8_t p3 = 0x03, s3 = 0x39;  // code 3 = 1.5, scale 1.125
  float o3[16];
  uint8_t r3[8] = {p3};
  m3::nvfp4_dequant_row(r3, &s3, 3.0f, 16, o3);
  EXPECT_EQ(o3[0], (1.5f * 1.125f) / 3.0f);
}

TEST(BlockQuant, MxFp8ZeroBlock) {
  float x[32] = {};
  uint8_t q[32], s;
  m3::mxfp8_quantize_row(x, 32, q, &s);
  EXPECT_EQ(s, 0);
  for (uint8_t v : q) EXPECT_EQ(v, 0);
}

TEST(BlockQuant, MxFp8RoundTripBound) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int K = 32 * 64;
  std::vector<float> x(K), y(K);
  for (int i = 0; i < K; ++i) x[i] = u(rng) * std::ldexp(1.0f, (i / 32) % 20 - 10);  // blocks of varied range
  std::vector<uint8_t> q(K), s(K / 32);
  m3::mxfp8_quantize_row(x.data(), K, q.data(), s.data());
  m3::mxfp8_dequant_row(q.data(), s.data(), K, y.data());
  for (int b = 0; b < K / 32; ++b) {
    const float descale = m3::e8m0_to_float(s[b]);
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    EXPECT_LE(amax / descale, 448.0f);
    EXPECT_GT(amax / descale, 224.0f);  // the smallest scale that fits
    for (int i = 0; i < 32; ++i) {
      const float xi = x[b * 32 + i], yi = y[b * 32 + i];
      // 3 mantissa bits: half-ulp relative error 2^-4 for normals, 2^-10 * descale absolute in
      // the subnormal range.
      EXPECT_LE(std::fabs(xi - yi), std::max(std::fabs(xi) * 0.0625f, std::ldexp(descale, -10))) << b << " " << i;
    }
  }
}

TEST(BlockQuant, NvFp4RoundTripBound) {
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.f, 0.05f);
  const int N = 8, K = 256;
  std::vector<float> w(N * K), y(K);
  for (auto& v : w) v = n(rng);
  w[5] = 0.9f;  // a tensor outlier: makes the global scale small for most blocks
  std::vector<uint8_t> packed(N * K / 2), scales(N * K / 16);
  const float global = m3::nvfp4_quantize(w.data(), N, K, packed.data(), scales.data());
  EXPECT_EQ(global, 6.0f * 448.0f / 0.9f);
  double err2 = 0, sig2 = 0;
  for (int r = 0; r < N; ++r) {
    m3::nvfp4_dequant_row(packed.data() + r * K / 2, scales.data() + r * K / 16, global, K, y.data());
    for (int b = 0; b < K / 16; ++b) {
      float amax = 0;
      for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(w[r * K + b * 16 + i]));
      const float unit = m3::e4m3_to_float(scales[r * K / 16 + b]) / global;  // value of code 1.0
      EXPECT_LE(unit, amax / 6 * 1.07f + 1e-7f);
      for (int i = 0; i < 16; ++i) {
        const float wi = w[r * K + b * 16 + i], yi = y[b * 16 + i];
        // Widest E2M1 gap is 2 units (4..6), plus saturation of at most 6 * 1/16 units.
        EXPECT_LE(std::fabs(wi - yi), unit * 1.0f + 1e-7f) << r << " " << b << " " << i;
        err2 += double(wi - yi) * (wi - yi);
        sig2 += double(wi) * wi;
      }
    }
  }
  EXPECT_LT(std::sqrt(err2 / sig2), 0.15);
}

TEST(BlockQuant, NvFp4ExactValuesSurvive) {
  // Values that are E2M1 codes times a power of two survive exactly when amax hits 6 * unit.
  const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  float w[32];
  for (int i = 0; i < 32; ++i) w[i] = ((i / 8) % 2 ? -1.f : 1.f) * mag[i % 8] / 64.f;
  uint8_t packed[16], scales[2];
  const float g = m3::nvfp4_quantize(w, 1, 32, packed, scales);
  float y[32];
  m3::nvfp4_dequant_row(packed, scales, g, 32, y);
  for (int i = 0; i < 32; ++i) EXPECT_FLOAT_EQ(y[i], w[i]) << i;
}
