// The opt-in BF16 activations of MXFP8 and NVFP4 matmuls (`--mxfp8-activations bf16`,
// `--nvfp4-activations bf16`, Linear::act_bf16): on
// every ISA build this CPU runs, and on every path (one token, a few, the prefill panels, tiled or
// row-major weights, partial tiles, MXFP8 scale codes outside the BF16 panels' range), each output equals
// the sum over k of the decoded weight times x[k] rounded to BF16, within fp32 summation error; and
// it is not the exact path's result (the rounding happens).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/dtype.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/linear.h"

namespace {

struct Mat {
  std::vector<uint8_t> w, s;
  m3::Linear lin;
  // MXFP8: random E4M3 codes (subnormals and zeros included, no NaN) and E8M0 scale codes in [lo, hi].
  // NVFP4: random E2M1 codes, E4M3 scale codes in [lo, hi] (no NaN), global divisor 37.5.
  Mat(m3::LinearKind kind, int64_t N, int64_t K, int lo, int hi, uint32_t seed)
      : w(size_t(kind == m3::LinearKind::NVFP4 ? N * K / 2 : N * K)),
        s(size_t(kind == m3::LinearKind::NVFP4 ? N * K / 16 : N * K / 32)) {
    std::mt19937 rng(seed);
    for (auto& b : w) {
      b = uint8_t(rng());
      if (kind == m3::LinearKind::MXFP8 && (b & 0x7f) == 0x7f) b = 0x3e;
    }
    for (auto& b : s) b = uint8_t(lo + int(rng() % uint32_t(hi - lo + 1)));
    lin.kind = kind;
    lin.N = N;
    lin.K = K;
    if (kind == m3::LinearKind::NVFP4) lin.global_div = 37.5f;
    lin.w = w.data();
    lin.scales = s.data();
    m3::set_scale_range(lin);
  }
};

constexpr m3::LinearKind kMx = m3::LinearKind::MXFP8, kNv = m3::LinearKind::NVFP4;

float bf16_round(float v) { return m3::bf16_to_float(m3::float_to_bf16(v)); }

struct Case {
  m3::LinearKind kind;
  int64_t N, K;
  int lo, hi;  // scale codes
  bool tiled;
  int x_exp;  // x drawn from N(0, 1) times 2^x_exp (keeps extreme scales' products normal and finite)
};

// y (T x N) against the decoded weights w (N x K): within 4 * K * 2^-24 of the sum of |terms|, and
// equal to the bf16-activation reference rather than to the exact one for some output.
void check(const std::vector<float>& y, const std::vector<float>& w, const std::vector<float>& x, int64_t T,
           int64_t N, int64_t K, const std::string& what) {
  int away_from_exact = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < N; ++r) {
      double ref = 0, exact = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double wk = w[size_t(r * K + k)], xk = x[size_t(t * K + k)];
        ref += wk * double(bf16_round(float(xk)));
        exact += wk * xk;
        mag += std::fabs(wk * xk);
      }
      const double tol = 4.0 * double(K) * std::ldexp(1.0, -24) * mag;
      ASSERT_NEAR(y[size_t(t * N + r)], ref, tol) << what << " token " << t << " row " << r;
      away_from_exact += std::fabs(y[size_t(t * N + r)] - exact) > tol ? 1 : 0;
    }
  EXPECT_GT(away_from_exact, 0) << what << ": no output shows the BF16 rounding of x";
}

TEST(KernelsBf16Act, EveryIsaAndPathMatchesTheRoundedReference) {
  const Case cases[] = {
      {kMx, 44, 256, 118, 130, true, 0},   // 11 tiles: pairs and a lone tile, panel-range scales
      {kMx, 46, 256, 118, 130, true, 0},   // and 2 rows past the last full tile
      {kMx, 40, 128, 118, 130, false, 0},  // row-major (mapped weights)
      {kMx, 40, 128, 10, 16, true, 0},     // the panels' lowest scale codes
      {kMx, 40, 128, 3, 9, true, 60},      // below the panels' range (they fall back)
      {kMx, 16, 64, 240, 246, true, -40},  // the highest (above them some E4M3 values overflow fp32 too)
      {kNv, 44, 256, 0x20, 0x5f, true, 0}, // NVFP4: pairs, a lone tile
      {kNv, 46, 128, 0x01, 0x7e, true, 0}, // every finite positive scale code (subnormal ones too), 2 rows past
      {kNv, 40, 128, 0x81, 0xfe, true, 0}, // negative scale codes
      {kNv, 40, 96, 0x20, 0x5f, false, 0}, // row-major
      {kNv, 20, 96, 0x20, 0x5f, true, 0},  // three chunks per row, five tiles
      {kMx, 20, 96, 118, 130, true, 0},    // three blocks per row
  };
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const char* isa : {"generic", "avx2", "avx512"}) {
    const m3::CpuOps* ops = m3::cpu_ops_for(isa);
    if (!ops) continue;
    for (const Case& c : cases) {
      Mat m(c.kind, c.N, c.K, c.lo, c.hi, uint32_t(c.N * 7 + c.lo));
      std::vector<float> w(size_t(c.N * c.K));
      m3::linear_decode_rows(m.lin, 0, c.N, w.data());
      if (c.tiled) {
        ASSERT_TRUE(m3::tile_rows(m.lin, m.w.data()));
      }
      ASSERT_TRUE(m3::enable_bf16_activations(m.lin));
      for (int64_t T : {1, 2, 3, 4, 7, 12, 13, 70}) {  // one-step kernels to 12 tokens, then panels
        std::vector<float> x(size_t(T * c.K)), y(size_t(T * c.N)), scratch(size_t(m3::kLinearTileRows * c.K));
        for (auto& v : x) v = std::ldexp(nd(rng), c.x_exp);
        ops->linear_rows(m.lin, x.data(), T, y.data(), 0, c.N, scratch.data());
        check(y, w, x, T, c.N, c.K,
              std::string(isa) + " " + m3::linear_kind_name(c.kind) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) + " codes " +
                  std::to_string(c.lo) + ".." + std::to_string(c.hi) + (c.tiled ? " tiled" : "") +
                  " T=" + std::to_string(T));
      }
    }
  }
  // The threaded entry point (the CPU's own ISA) as the model calls it.
  for (const m3::LinearKind kind : {kMx, kNv}) {
    Mat m(kind, 64, 512, kind == kMx ? 120 : 0x30, kind == kMx ? 126 : 0x40, 3);
    std::vector<float> w(size_t(64 * 512));
    m3::linear_decode_rows(m.lin, 0, 64, w.data());
    ASSERT_TRUE(m3::tile_rows(m.lin, m.w.data()));
    ASSERT_TRUE(m3::enable_bf16_activations(m.lin));
    for (int64_t T : {1, 5, 100}) {
      std::vector<float> x(size_t(T * 512)), y(size_t(T * 64));
      for (auto& v : x) v = nd(rng);
      m3::linear_forward(m.lin, x.data(), T, y.data());
      check(y, w, x, T, 64, 512, std::string("linear_forward ") + m3::linear_kind_name(kind) + " T=" + std::to_string(T));
    }
  }
  std::printf("[ info ] BF16 dot products on this CPU: %s\n", m3::bf16_dot_products() ? "yes" : "no (fp32 kernels)");
}

// A NaN weight code (E4M3 0x7f / 0xff) makes its row's outputs NaN in the BF16 dot-product kernels,
// one step and panels (which fold block scales into BF16 exponents and must leave NaN words alone), as
// in the generic build's decode; the other rows stay finite. (The exact AVX2 and AVX-512 MXFP8 kernels,
// which the rounded activations take on other CPUs, place E4M3 bits in fp32 fields and read a NaN
// code as a finite value; quantisers do not emit NaN codes.)
TEST(KernelsBf16Act, NanCodesStayNan) {
  for (const char* isa : {"generic", "avx512"}) {
    const m3::CpuOps* ops = m3::cpu_ops_for(isa);
    if (!ops || (std::string(isa) == "avx512" && !m3::bf16_dot_products())) continue;
    Mat m(kMx, 16, 128, 118, 124, 11);
    m.w[size_t(5 * 128 + 40)] = 0x7f;  // row 5
    m.w[size_t(9 * 128 + 3)] = 0xff;   // row 9
    ASSERT_TRUE(m3::tile_rows(m.lin, m.w.data()));
    ASSERT_TRUE(m3::enable_bf16_activations(m.lin));
    for (int64_t T : {1, 70}) {
      std::vector<float> x(size_t(T * 128), 0.5f), y(size_t(T * 16)), scratch(size_t(m3::kLinearTileRows * 128));
      ops->linear_rows(m.lin, x.data(), T, y.data(), 0, 16, scratch.data());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < 16; ++r)
          EXPECT_EQ(std::isnan(y[size_t(t * 16 + r)]), r == 5 || r == 9) << isa << " T=" << T << " row " << r;
    }
  }
}

TEST(KernelsBf16Act, OnlyMxfp8AndNvfp4Switch) {
  Mat m(kMx, 8, 128, 120, 124, 1);
  m3::Linear other = m.lin;
  other.kind = m3::LinearKind::BF16;
  EXPECT_FALSE(m3::enable_bf16_activations(other));
  EXPECT_FALSE(other.act_bf16);
  EXPECT_TRUE(m3::enable_bf16_activations(m.lin));
  EXPECT_TRUE(m.lin.act_bf16);
  Mat n(kNv, 8, 128, 0x30, 0x40, 1);
  ASSERT_TRUE(m3::enable_int8_activations(n.lin));
  EXPECT_FALSE(m3::enable_bf16_activations(n.lin));  // int8 already
  Mat n2(kNv, 8, 128, 0x30, 0x40, 1);
  EXPECT_TRUE(m3::enable_bf16_activations(n2.lin));
}

}  // namespace
