// MXFP4 (OCP MX, AMD Quark; docs/formats.md sections 1, 4, 8, 9): every E2M1 code under every E8M0 code
// against a plain reference (0xFF: NaN), the activation / weight scale rule ("even" and "floor") against a
// float64 log2 reference over crafted and random amax values, the dynamic activation quantiser on crafted
// blocks (ties, zeros, amax at the scale edges, subnormals, NaN) and random ones, and the packing.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>
#include <vector>

#include "formats/block_dequant.h"
#include "formats/dtype.h"
#include "formats/quantize.h"

namespace {

using m3::Mxfp4ScaleMode;

double e2m1_plain(int code) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8) ? -mag[code & 7] : mag[code & 7];
}

// Scale byte by the definitions: floor(log2(amax)) (of amax rounded to two significant bits for "even")
// minus 2, biased by 127, clamped to [0, 254]; 0 for amax == 0.
int scale_byte_plain(double amax, Mxfp4ScaleMode mode) {
  if (amax == 0) return 0;
  int e;
  const double f = std::frexp(amax, &e);  // amax = f * 2^e, f in [0.5, 1)
  int k = e - 1;
  if (mode == Mxfp4ScaleMode::Even && f >= 0.875) ++k;  // mantissa 1.75 and above rounds up
  return std::clamp(k - 2 + 127, 0, 254);
}

// Nearest E2M1 magnitude, ties to the even code, saturating at 6.
double e2m1_round_plain(double v) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double a = std::fabs(v);
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const double d = std::fabs(a - mag[c]), db = std::fabs(a - mag[best]);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return std::copysign(mag[best], v);
}

std::vector<double> qdq_plain(const std::vector<float>& x, Mxfp4ScaleMode mode) {
  std::vector<double> out(x.size());
  for (size_t b = 0; b < x.size(); b += 32) {
    double amax = 0;
    bool nan = false;
    for (size_t i = b; i < b + 32; ++i) {
      amax = std::max(amax, std::fabs(double(x[i])));
      nan |= std::isnan(x[i]);
    }
    const double scale = std::ldexp(1.0, scale_byte_plain(amax, mode) - 127);
    for (size_t i = b; i < b + 32; ++i) out[i] = nan ? NAN : e2m1_round_plain(double(x[i]) / scale) * scale;
  }
  return out;
}

}  // namespace

TEST(Mxfp4, DequantEveryE2m1CodeUnderEveryE8m0Code) {
  for (int s = 0; s < 256; ++s)
    for (int c = 0; c < 16; ++c) {
      uint8_t packed[16] = {}, scale = uint8_t(s);
      packed[0] = uint8_t(c);                  // element 0: low nibble
      packed[7] = uint8_t(c << 4);             // element 15: high nibble
      float out[32];
      m3::mxfp4_dequant_row(packed, &scale, 32, out);
      if (s == 0xff) {
        EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[15])) << "scale 0xFF must decode to NaN";
        continue;
      }
      const double want = e2m1_plain(c) * std::ldexp(1.0, s - 127);
      if (std::fabs(want) > FLT_MAX) {  // codes 2.0 and up under 2^127 overflow fp32: infinity
        EXPECT_TRUE(std::isinf(out[0]) && std::isinf(out[15])) << "code " << c << " scale " << s;
      } else {
        EXPECT_EQ(double(out[0]), want) << "code " << c << " scale " << s;
        EXPECT_EQ(double(out[15]), want) << "code " << c << " scale " << s;
      }
      EXPECT_EQ(std::signbit(out[0]), bool(c & 8)) << "code " << c << " scale " << s;
      EXPECT_EQ(out[1], 0.0f);
    }
}

TEST(Mxfp4, ScaleByteRuleMatchesLog2Definition) {
  std::vector<float> amaxes = {0.f, FLT_MIN, FLT_TRUE_MIN, 1e-40f, 1e-38f, 1.f, 1.5f, 1.75f, 2.f, 6.f, 7.f, 8.f,
                               1e-30f, 3.4e38f, FLT_MAX};
  for (int e = -149; e <= 127; ++e)
    for (double m : {1.0, 1.5, 1.74, 1.75, 1.76, 1.9999}) {
      const float a = float(std::ldexp(m, e));
      if (std::isfinite(a)) {
        amaxes.push_back(a);
        amaxes.push_back(std::nextafter(a, 0.f));
        amaxes.push_back(std::nextafter(a, INFINITY));
      }
    }
  std::mt19937 rng(2);
  std::uniform_real_distribution<double> ex(-140, 127);
  for (int i = 0; i < 20000; ++i) amaxes.push_back(float(std::exp2(ex(rng))));
  for (float a : amaxes) {
    if (!std::isfinite(a)) continue;
    for (Mxfp4ScaleMode mode : {Mxfp4ScaleMode::Even, Mxfp4ScaleMode::Floor})
      ASSERT_EQ(int(m3::mxfp4_scale_byte(a, mode)), scale_byte_plain(a, mode))
          << "amax " << a << (mode == Mxfp4ScaleMode::Even ? " even" : " floor");
  }
  // Edges by hand: amax 7 = 1.75 * 4 takes scale 2 (byte 128) under "even", 1 (byte 127) under floor.
  EXPECT_EQ(m3::mxfp4_scale_byte(7.0f, Mxfp4ScaleMode::Even), 128);
  EXPECT_EQ(m3::mxfp4_scale_byte(7.0f, Mxfp4ScaleMode::Floor), 127);
  EXPECT_EQ(m3::mxfp4_scale_byte(std::nextafter(7.0f, 0.f), Mxfp4ScaleMode::Even), 127);
  EXPECT_EQ(m3::mxfp4_scale_byte(6.0f, Mxfp4ScaleMode::Even), 127);
  EXPECT_EQ(m3::mxfp4_scale_byte(0.0f, Mxfp4ScaleMode::Even), 0);
  EXPECT_EQ(m3::mxfp4_scale_byte(NAN, Mxfp4ScaleMode::Even), 0xff);
}

TEST(Mxfp4, ActivationQuantiserCraftedBlocks) {
  // Ties at every E2M1 midpoint under scale 1 (amax 6: byte 127): 0.25 -> 0, 0.75 -> 1, 1.25 -> 1,
  // 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4 (formats.md 1.1), with both signs.
  std::vector<float> x(32, 0.f);
  const float in[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f};
  const float want[] = {0.f, 1.f, 1.f, 2.f, 2.f, 4.f, 4.f, 6.f};
  for (int i = 0; i < 16; ++i) x[size_t(i)] = (i < 8 ? 1.f : -1.f) * in[i % 8];
  std::vector<float> out(32);
  m3::mxfp4_qdq_row(x.data(), 32, Mxfp4ScaleMode::Even, out.data());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out[size_t(i)], (i < 8 ? 1.f : -1.f) * want[i % 8]) << i;
  EXPECT_TRUE(std::signbit(out[8]));  // -0.25 -> -0

  // Zeros: zero out, byte 0.
  std::fill(x.begin(), x.end(), 0.f);
  m3::mxfp4_qdq_row(x.data(), 32, Mxfp4ScaleMode::Even, out.data());
  for (float v : out) EXPECT_EQ(v, 0.f);

  // amax 7 (1.75 * 4): "even" takes scale 2, so 7 -> 3.5 -> 4 (ties to even) -> 8 and 3 -> 1.5 -> 3;
  // floor keeps scale 1: 7 saturates to 6.
  x[0] = 7.f, x[1] = 3.f, x[2] = -0.5f;
  m3::mxfp4_qdq_row(x.data(), 32, Mxfp4ScaleMode::Even, out.data());
  EXPECT_EQ(out[0], 8.f);
  EXPECT_EQ(out[1], 3.f);
  EXPECT_EQ(out[2], -0.f);  // -0.25 on the grid of scale 2: a tie, to zero
  m3::mxfp4_qdq_row(x.data(), 32, Mxfp4ScaleMode::Floor, out.data());
  EXPECT_EQ(out[0], 6.f);
  EXPECT_EQ(out[1], 3.f);
  EXPECT_EQ(out[2], -0.5f);

  // Subnormals: amax below 2^-125 gives the smallest scale 2^-127; 3 * 2^-128 = 1.5 * 2^-127 stays.
  std::fill(x.begin(), x.end(), 0.f);
  x[0] = std::ldexp(3.f, -128), x[1] = std::ldexp(1.f, -130), x[2] = -std::ldexp(1.f, -127);
  EXPECT_EQ(m3::mxfp4_scale_byte(x[0], Mxfp4ScaleMode::Even), 0);
  m3::mxfp4_qdq_row(x.data(), 32, Mxfp4ScaleMode::Even, out.data());
  EXPECT_EQ(out[0], x[0]);
  EXPECT_EQ(out[1], 0.f);  // 2^-3 on the grid: 0
  EXPECT_EQ(out[2], x[2]);

  // A NaN poisons its block only.
  std::vector<float> two(64, 1.f);
  two[3] = NAN;
  std::vector<float> o2(64);
  m3::mxfp4_qdq_row(two.data(), 64, Mxfp4ScaleMode::Even, o2.data());
  for (int i = 0; i < 32; ++i) EXPECT_TRUE(std::isnan(o2[size_t(i)])) << i;
  for (int i = 32; i < 64; ++i) EXPECT_EQ(o2[size_t(i)], 1.f) << i;
}

TEST(Mxfp4, ActivationQuantiserMatchesPlainReferenceOnRandomBlocks) {
  std::mt19937 rng(8);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> ex(-135, 120);
  for (Mxfp4ScaleMode mode : {Mxfp4ScaleMode::Even, Mxfp4ScaleMode::Floor}) {
    std::vector<float> x(32 * 4096);
    for (size_t b = 0; b < x.size(); b += 32) {
      const int e = ex(rng);
      for (size_t i = b; i < b + 32; ++i) x[i] = std::ldexp(nd(rng), e);
    }
    std::vector<float> out(x.size());
    m3::mxfp4_qdq_row(x.data(), int64_t(x.size()), mode, out.data());
    const std::vector<double> ref = qdq_plain(x, mode);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(double(out[i]), ref[i]) << "element " << i << " x " << x[i];
  }
}

TEST(Mxfp4, WeightQuantiserPacksLowNibbleFirst) {
  // formats.md 9.4: (1.0, -3.0) are codes 0x2, 0xD -> byte 0xD2 (scale 1: the block's amax is 4).
  std::vector<float> w(32, 0.f);
  w[0] = 1.f, w[1] = -3.f, w[2] = 4.f;
  uint8_t packed[16], scale;
  m3::mxfp4_quantize_row(w.data(), 32, Mxfp4ScaleMode::Even, packed, &scale);
  EXPECT_EQ(scale, 127);
  EXPECT_EQ(packed[0], 0xD2);
  EXPECT_EQ(packed[1], 0x06);
  // Quantise then dequantise equals the activation quantiser's values (one rule for both).
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::vector<float> r(32 * 64), deq(r.size()), qdq(r.size());
  for (auto& v : r) v = nd(rng);
  std::vector<uint8_t> p(r.size() / 2), s(r.size() / 32);
  m3::mxfp4_quantize_row(r.data(), int64_t(r.size()), Mxfp4ScaleMode::Even, p.data(), s.data());
  m3::mxfp4_dequant_row(p.data(), s.data(), int64_t(r.size()), deq.data());
  m3::mxfp4_qdq_row(r.data(), int64_t(r.size()), Mxfp4ScaleMode::Even, qdq.data());
  for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(deq[i], qdq[i]) << i;
}
