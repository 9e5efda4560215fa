// Element codes, exhaustively: E2M1 / E4M3 / E8M0 decoding of every code against values built
// independently from the docs/formats.md section 1 definitions, the encoders' round-to-nearest-even /
// saturation rules, and the section 9 test vectors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "formats/dtype.h"
#include "formats/quantize.h"

namespace {

// E4M3FN by the definition: exponent field e (bias 7), mantissa m; e == 0 is subnormal m/8*2^-6.
double e4m3_reference(int code) {
  const int s = code >> 7, e = (code >> 3) & 0xf, m = code & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

double e2m1_reference(int code) {
  const int s = (code >> 3) & 1, e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + m / 2.0, e - 1);  // bias 1
  return s ? -mag : mag;
}

}  // namespace

TEST(Codes, E4M3DecodeAllCodes) {
  for (int c = 0; c < 256; ++c) {
    const double ref = e4m3_reference(c);
    const float got = m3::e4m3_to_float(uint8_t(c));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
    } else {
      EXPECT_EQ(double(got), ref) << "code " << c;
      EXPECT_EQ(std::signbit(got), bool(c & 0x80)) << "code " << c;
    }
  }
  // A few spot values from the section 1.2 table.
  EXPECT_EQ(m3::e4m3_to_float(0x1D), 0.1015625f);
  EXPECT_EQ(m3::e4m3_to_float(0x45), 3.25f);
  EXPECT_EQ(m3::e4m3_to_float(0x77), 240.0f);
  EXPECT_EQ(m3::e4m3_to_float(0x07), 0.013671875f);
}

TEST(Codes, E2M1DecodeAllCodes) {
  const float table[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(double(m3::e2m1_to_float(uint8_t(c))), e2m1_reference(c)) << "code " << c;
    EXPECT_EQ(std::fabs(m3::e2m1_to_float(uint8_t(c))), table[c & 7]) << "code " << c;
  }
}

TEST(Codes, E8M0DecodeAllCodes) {
  for (int e = 0; e < 255; ++e) EXPECT_EQ(double(m3::e8m0_to_float(uint8_t(e))), std::ldexp(1.0, e - 127)) << e;
  EXPECT_TRUE(std::isnan(m3::e8m0_to_float(0xff)));
  EXPECT_EQ(m3::e8m0_to_float(0x7f), 1.0f);
  EXPECT_EQ(m3::e8m0_to_float(0x80), 2.0f);
}

TEST(Codes, E4M3EncodeDecodeRoundTrip) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(int(m3::float_to_e4m3(m3::e4m3_to_float(uint8_t(c)))), c) << "code " << c;
  }
  EXPECT_EQ(m3::float_to_e4m3(NAN) & 0x7f, 0x7f);
}

TEST(Codes, E2M1EncodeDecodeRoundTrip) {
  for (int c = 0; c < 16; ++c) EXPECT_EQ(int(m3::float_to_e2m1(m3::e2m1_to_float(uint8_t(c)))), c) << "code " << c;
}

// Between every two neighbouring positive E4M3 values: the midpoint goes to the even code, a
// hair above it to the upper code, a hair below to the lower one.
TEST(Codes, E4M3RoundsNearestEven) {
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = m3::e4m3_to_float(uint8_t(c)), hi = m3::e4m3_to_float(uint8_t(c + 1));
    const float mid = (lo + hi) / 2;  // exact in float
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(int(m3::float_to_e4m3(mid)), even) << "between codes " << c << " and " << c + 1;
    EXPECT_EQ(int(m3::float_to_e4m3(-mid)), even | 0x80);
    EXPECT_EQ(int(m3::float_to_e4m3(std::nextafter(mid, 1000.f))), c + 1);
    EXPECT_EQ(int(m3::float_to_e4m3(std::nextafter(mid, 0.f))), c);
  }
  // Saturation (satfinite).
  EXPECT_EQ(m3::float_to_e4m3(449.f), 0x7e);
  EXPECT_EQ(m3::float_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(m3::float_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(m3::float_to_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(m3::float_to_e4m3(1e-30f), 0x00);
}

TEST(Codes, E4M3TestVectors91) {
  EXPECT_EQ(m3::float_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(m3::float_to_e4m3(-1.0f), 0xB8);
  EXPECT_EQ(m3::float_to_e4m3(0.1f), 0x1D);
  EXPECT_EQ(m3::float_to_e4m3(3.14159f), 0x45);
  EXPECT_EQ(m3::float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(m3::float_to_e4m3(500.0f), 0x7E);
  EXPECT_EQ(m3::float_to_e4m3(-0.0009f), 0x80);
}

TEST(Codes, E2M1TiesAndSaturation) {
  const std::pair<float, float> cases[] = {{0.25f, 0.f}, {0.75f, 1.f}, {1.25f, 1.f}, {1.75f, 2.f}, {2.5f, 2.f},
                                           {3.5f, 4.f},  {5.0f, 4.f},  {6.0f, 6.f},  {7.0f, 6.f},  {1e9f, 6.f},
                                           {0.26f, 0.5f}, {0.74f, 0.5f}, {5.01f, 6.f}, {2.6f, 3.f}};
  for (auto [in, want] : cases) {
    EXPECT_EQ(m3::e2m1_to_float(m3::float_to_e2m1(in)), want) << in;
    EXPECT_EQ(m3::e2m1_to_float(m3::float_to_e2m1(-in)), -want) << -in;
  }
}

TEST(Codes, NvFp4ActivationBlock92) {
  const float x[16] = {10, 5, -2.4f, 0.3f, 1.1f, -7.5f, 0, 0.9f, 2.2f, 3.3f, 0.01f, 4.4f, 6.0f, -1.6f, 0.7f, 8.0f};
  uint8_t packed[8];
  const uint8_t s = m3::nvfp4_quantize_activation_block(x, 1.0f, packed);
  EXPECT_EQ(s, 0x3D);
  EXPECT_EQ(m3::e4m3_to_float(s), 1.625f);
  const uint8_t want[8] = {0x57, 0x0B, 0xE1, 0x10, 0x43, 0x50, 0xA6, 0x61};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(packed[i], want[i]) << "byte " << i;
  const float deq[16] = {9.75f, 4.875f, -2.4375f, 0, 0.8125f, -6.5f, 0, 0.8125f,
                         2.4375f, 3.25f, 0, 4.875f, 6.5f, -1.625f, 0.8125f, 6.5f};
  for (int i = 0; i < 16; ++i) {
    const uint8_t code = (i % 2 == 0) ? (packed[i / 2] & 0xf) : (packed[i / 2] >> 4);
    EXPECT_EQ(m3::e2m1_to_float(code) * 1.625f, deq[i]) << i;
  }
}

TEST(Codes, MxFp8ScaleByte93) {
  EXPECT_EQ(m3::mxfp8_scale_byte(10.f), 122);
  EXPECT_EQ(m3::mxfp8_scale_byte(15.f), 123);
  EXPECT_EQ(m3::mxfp8_scale_byte(0.3f), 117);
  EXPECT_EQ(m3::mxfp8_scale_byte(448.f), 127);
  EXPECT_EQ(m3::mxfp8_scale_byte(1000.f), 129);
  EXPECT_EQ(m3::mxfp8_scale_byte(0.f), 0);
  EXPECT_EQ(m3::mxfp8_scale_byte(896.f), 128);                    // exactly 448 * 2
  EXPECT_EQ(m3::mxfp8_scale_byte(std::nextafter(896.f, 1e9f)), 129);
  EXPECT_EQ(m3::mxfp8_scale_byte(1e-45f), 0);                     // clamped low
  EXPECT_EQ(m3::mxfp8_scale_byte(3e38f), 247);                    // 3e38/448 is just above 2^119
  EXPECT_EQ(m3::mxfp8_scale_byte(INFINITY), 254);                 // clamped high
}

TEST(Codes, E2M1Packing94) {
  EXPECT_EQ(m3::float_to_e2m1(1.0f), 0x2);
  EXPECT_EQ(m3::float_to_e2m1(-3.0f), 0xD);
  // nvfp4_quantize_row packs even elements into the low nibble: a 16-block whose amax is 6 and
  // global 448 has scale 448, so the elements pass through unchanged.
  float w[16] = {1.0f, -3.0f};
  w[15] = 6.0f;
  uint8_t packed[8], scale;
  m3::nvfp4_quantize_row(w, 16, 448.0f, packed, &scale);
  EXPECT_EQ(scale, 0x7E);
  EXPECT_EQ(packed[0], 0xD2);
  EXPECT_EQ(packed[7], 0x70);
}
