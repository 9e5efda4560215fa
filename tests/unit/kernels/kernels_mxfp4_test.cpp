// MXFP4 (LinearKind::MXFP4, AMD Quark OCP-MX) matmuls: every ISA build against the format reference
// (mxfp4_dequant_row, float64 dots), with exact and dynamic MXFP4 activations, row-major and tiled weights,
// the decode step and batches; the AVX2 and AVX-512 builds bit for bit; each ISA's activation quantiser
// bit for bit against the format's (mxfp4_qdq_row); the general path for scale codes below the placed
// table's range.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "formats/block_dequant.h"
#include "formats/quantize.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/linear.h"

namespace {

constexpr const char* kNoAvx512 = "this CPU cannot run the avx512 build (AVX-512 F, BW, DQ, VL, VBMI, VNNI and GFNI)";

struct Mx {
  std::vector<uint8_t> w, s;
  m3::Linear lin;
};

// Random packed codes, scale codes in [lo, lo + span).
Mx make_mxfp4(int64_t N, int64_t K, int lo, int span, std::mt19937& rng) {
  Mx m;
  m.w.resize(size_t(N * K / 2));
  m.s.resize(size_t(N * K / 32));
  for (auto& b : m.w) b = uint8_t(rng() & 0xff);
  for (auto& b : m.s) b = uint8_t(lo + int(rng() % unsigned(span)));
  m.lin.kind = m3::LinearKind::MXFP4;
  m.lin.N = N;
  m.lin.K = K;
  m.lin.w = m.w.data();
  m.lin.scales = m.s.data();
  m3::set_scale_range(m.lin);
  return m;
}

// Reference from the checkpoint bytes (before any tiling): dequantised rows, float64 dots.
void reference(const Mx& m, const std::vector<float>& x, int64_t T, bool act, std::vector<double>& ref,
               std::vector<double>& mag) {
  const int64_t N = m.lin.N, K = m.lin.K;
  std::vector<float> wf(size_t(N * K)), xq = x;
  for (int64_t n = 0; n < N; ++n) m3::mxfp4_dequant_row(m.w.data() + n * K / 2, m.s.data() + n * K / 32, K, wf.data() + n * K);
  if (act) m3::mxfp4_qdq_row(x.data(), T * K, m3::Mxfp4ScaleMode::Even, xq.data());
  ref.assign(size_t(T * N), 0.0);
  mag.assign(size_t(T * N), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(xq[size_t(t * K + k)]) * wf[size_t(n * K + k)];
        ref[size_t(t * N + n)] += p;
        mag[size_t(t * N + n)] += std::fabs(p);
      }
}

TEST(KernelsMxfp4, AllIsasMatchReference) {
  std::mt19937 rng(3);
  const int64_t N = 37, K = 256;
  int tested = 0;
  for (bool act : {false, true})
    for (bool tiled : {false, true})
      for (int lo : {0, 118}) {  // codes 0..: the general path (no placed scales); 118..: the fused kernels
        Mx m = make_mxfp4(N, K, lo, 14, rng);
        m.lin.act_mxfp4 = act;
        std::vector<float> x0;
        for (int64_t T : {1, 2, 3, 5, 12, 70}) {
          std::vector<float> x(size_t(T * K));
          std::normal_distribution<float> nd(0.f, 1.f);
          for (auto& v : x) v = nd(rng);
          std::vector<double> ref, mag;
          reference(m, x, T, act, ref, mag);
          Mx t = m;  // tiled copy (tile_rows rewrites the bytes it owns)
          t.lin.w = t.w.data();
          t.lin.scales = t.s.data();
          if (tiled) {
            ASSERT_TRUE(m3::tile_rows(t.lin, t.w.data()));
          }
          for (const char* isa : {"generic", "avx2", "avx512"}) {
            const m3::CpuOps* ops = m3::cpu_ops_for(isa);
            if (!ops) continue;
            ++tested;
            std::vector<float> y(size_t(T * N)), scratch(size_t(m3::kLinearTileRows * K));
            ops->linear_rows(t.lin, x.data(), T, y.data(), 0, N, scratch.data());
            for (int64_t i = 0; i < T * N; ++i)
              ASSERT_NEAR(y[size_t(i)], ref[size_t(i)], 4e-6 * mag[size_t(i)] + 1e-30)
                  << isa << (act ? " mxfp4 act" : " fp32 act") << (tiled ? " tiled" : "") << " lo " << lo << " T=" << T;
            // Batch invariance: token 0 alone gives the bits it gets in the batch.
            std::vector<float> y1(static_cast<size_t>(N));
            ops->linear_rows(t.lin, x.data(), 1, y1.data(), 0, N, scratch.data());
            for (int64_t n = 0; n < N; ++n) ASSERT_EQ(y1[size_t(n)], y[size_t(n)]) << isa << " T=" << T << " row " << n;
          }
        }
      }
  EXPECT_GE(tested, 2 * 2 * 2 * 6);
}

TEST(KernelsMxfp4, Avx512SameBitsAsAvx2) {
  const m3::CpuOps *a2 = m3::cpu_ops_for("avx2"), *a5 = m3::cpu_ops_for("avx512");
  if (!a2 || !a5) GTEST_SKIP() << kNoAvx512;
  std::mt19937 rng(9);
  const int64_t N = 73, K = 512;
  for (bool act : {false, true})
    for (bool tiled : {true, false}) {
      Mx m = make_mxfp4(N, K, 100, 40, rng);
      m.lin.act_mxfp4 = act;
      if (tiled) {
        ASSERT_TRUE(m3::tile_rows(m.lin, m.w.data()));
      }
      for (int64_t T : {1, 2, 3, 4, 6, 7, 11, 12, 40, 64, 131}) {
        std::vector<float> x(size_t(T * K)), scratch(size_t(m3::kLinearTileRows * K));
        std::normal_distribution<float> nd(0.f, 2.f);
        for (auto& v : x) v = nd(rng);
        std::vector<float> y2(size_t(T * N)), y5(size_t(T * N));
        a2->linear_rows(m.lin, x.data(), T, y2.data(), 0, N, scratch.data());
        a5->linear_rows(m.lin, x.data(), T, y5.data(), 0, N, scratch.data());
        for (int64_t i = 0; i < T * N; ++i)
          ASSERT_EQ(std::memcmp(&y2[size_t(i)], &y5[size_t(i)], 4), 0)
              << (act ? "mxfp4 act" : "fp32 act") << (tiled ? " tiled" : "") << " T=" << T << " at " << i;
      }
    }
}

// Each ISA's activation quantiser gives mxfp4_qdq_row's values bit for bit: a matrix whose row n holds
// a single 1.0 at column n (code 2, scale 2^0) returns the quantised activations themselves. Inputs: ties
// at every E2M1 midpoint, zero blocks, amax at both sides of the "even" rounding edge (1.75 * 2^e),
// subnormals, huge values, random magnitudes; both scale rules.
TEST(KernelsMxfp4, ActivationQuantiserMatchesFormatEveryIsa) {
  const int64_t K = 64 * 32, N = K;
  Mx m;
  m.w.assign(size_t(N * K / 2), 0);
  m.s.assign(size_t(N * K / 32), 127);
  for (int64_t n = 0; n < N; ++n) m.w[size_t(n * K / 2 + n / 2)] = uint8_t(n % 2 ? 0x20 : 0x02);
  m.lin.kind = m3::LinearKind::MXFP4;
  m.lin.N = N;
  m.lin.K = K;
  m.lin.w = m.w.data();
  m.lin.scales = m.s.data();
  m3::set_scale_range(m.lin);
  m.lin.act_mxfp4 = true;
  std::mt19937 rng(4);
  std::vector<float> x(static_cast<size_t>(K));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f};
  for (int64_t b = 0; b < K / 32; ++b) {
    float* xb = x.data() + b * 32;
    const float sc = std::ldexp(1.0f, int(b % 40) - 20);
    for (int i = 0; i < 32; ++i) xb[i] = u(rng) * 6.0f * sc;
    switch (b % 8) {
      case 0: for (int i = 0; i < 32; ++i) xb[i] = (i % 2 ? -1.f : 1.f) * mids[i % 8] * sc; break;
      case 1: for (int i = 0; i < 32; ++i) xb[i] = 0.f; break;
      case 2: xb[5] = 7.0f * sc; break;                       // amax exactly 1.75 * 2^2: the next scale ("even")
      case 3: xb[5] = std::nextafter(7.0f, 0.f) * sc; break;  // just below
      case 4: for (int i = 0; i < 32; ++i) xb[i] = std::ldexp(float(i % 7) - 3.f, -128 - int(i % 3)); break;  // subnormals
      case 5: xb[0] = 1.5e38f; break;  // near the top of the scale range
      default: break;
    }
  }
  for (uint8_t mode : {uint8_t(0), uint8_t(1)}) {
    m.lin.act_mxfp4_mode = mode;
    std::vector<float> want(static_cast<size_t>(K));
    m3::mxfp4_qdq_row(x.data(), K, mode ? m3::Mxfp4ScaleMode::Floor : m3::Mxfp4ScaleMode::Even, want.data());
    for (const char* isa : {"generic", "avx2", "avx512"}) {
      const m3::CpuOps* ops = m3::cpu_ops_for(isa);
      if (!ops) continue;
      std::vector<float> y(static_cast<size_t>(N)), scratch(size_t(m3::kLinearTileRows * K));
      ops->linear_rows(m.lin, x.data(), 1, y.data(), 0, N, scratch.data());
      for (int64_t k = 0; k < K; ++k)
        ASSERT_EQ(y[size_t(k)], want[size_t(k)]) << isa << " mode " << int(mode) << " element " << k << " x " << x[size_t(k)];
    }
  }
}

}  // namespace
