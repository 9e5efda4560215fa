// The compute-bound GEMM and dense attention (kernels/cpu/gemm.h) against float64 references, on shapes
// that hit every edge of the blocking (rows not a multiple of the micro-tile, columns not a multiple of a
// panel, K across several kGemmKc blocks), for F32 and BF16 weights, the [K, N] form and a bias; with
// every ISA build this CPU runs. Also the promise the vision tower relies on: a row's result has the
// same bits whatever the other rows and the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "formats/dtype.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/gemm.h"

namespace {

uint16_t to_bf16(float f) {  // round to nearest even (the values are finite)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

struct Case {
  int64_t M, N, K;
};

struct Operands {
  std::vector<float> a, bf, bias;
  std::vector<uint16_t> bb;
};

Operands make(const Case& c, bool kn, std::mt19937& rng) {
  Operands o;
  std::normal_distribution<float> nd(0.f, 1.f);
  o.a.resize(size_t(c.M * (c.K + 3)));  // lda = K + 3
  for (float& x : o.a) x = nd(rng);
  const int64_t ld = (kn ? c.N : c.K) + 5, rows = kn ? c.K : c.N;
  o.bb.resize(size_t(rows * ld));
  o.bf.resize(size_t(rows * ld));
  for (size_t i = 0; i < o.bb.size(); ++i) {
    o.bb[i] = to_bf16(nd(rng));
    o.bf[i] = m3::bf16_to_float(o.bb[i]);
  }
  o.bias.resize(size_t(c.N));
  for (float& x : o.bias) x = nd(rng);
  return o;
}

// max |got - ref| over C, relative to max |ref|.
double rel_err(const Case& c, const Operands& o, bool kn, bool bias, const std::vector<float>& C, int64_t ldc) {
  const int64_t lda = c.K + 3, ld = (kn ? c.N : c.K) + 5;
  double worst = 0, big = 0;
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t n = 0; n < c.N; ++n) {
      double r = bias ? o.bias[size_t(n)] : 0.0;
      for (int64_t k = 0; k < c.K; ++k)
        r += double(o.a[size_t(i * lda + k)]) * o.bf[size_t(kn ? k * ld + n : n * ld + k)];
      worst = std::max(worst, std::fabs(double(C[size_t(i * ldc + n)]) - r));
      big = std::max(big, std::fabs(r));
    }
  return worst / std::max(big, 1e-30);
}

const Case kCases[] = {{1, 1, 1}, {5, 7, 3}, {6, 64, 256}, {13, 130, 300}, {37, 200, 513}, {70, 17, 1024}, {600, 90, 40}};

TEST(Gemm, MatchesFloat64Reference) {
  std::mt19937 rng(5);
  for (const Case& c : kCases)
    for (int form = 0; form < 4; ++form) {
      const bool bf16 = form & 1, kn = form & 2;
      const Operands o = make(c, kn, rng);
      m3::GemmB B;
      B.p = bf16 ? static_cast<const void*>(o.bb.data()) : o.bf.data();
      B.bf16 = bf16;
      B.kn = kn;
      B.ld = (kn ? c.N : c.K) + 5;
      const int64_t ldc = c.N + 2;
      for (int path = 0; path < 3; ++path) {
        std::vector<float> C(size_t(c.M * ldc), 12345.f);
        const bool bias = path != 1;
        if (path == 0) m3::gemm_parallel(c.M, c.N, c.K, o.a.data(), c.K + 3, B, C.data(), ldc, o.bias.data());
        if (path == 1) m3::gemm_serial(c.M, c.N, c.K, o.a.data(), c.K + 3, B, C.data(), ldc, nullptr);
        if (path == 2) {
          m3::GemmPacked P;
          m3::gemm_pack(B, c.N, c.K, P);
          m3::gemm_serial_packed(c.M, o.a.data(), c.K + 3, P, C.data(), ldc, o.bias.data());
        }
        // fp32 sums of K products of unit normals: error about sqrt(K) ulp of the terms.
        EXPECT_LT(rel_err(c, o, kn, bias, C, ldc), 2e-6 * std::sqrt(double(c.K)))
            << c.M << "x" << c.N << "x" << c.K << " bf16 " << bf16 << " kn " << kn << " path " << path;
        for (int64_t i = 0; i < c.M; ++i)  // the padding between rows is left alone
          for (int64_t n = c.N; n < ldc; ++n) ASSERT_EQ(C[size_t(i * ldc + n)], 12345.f);
      }
    }
}

// Every ISA table this CPU runs: pack + block directly, same tolerance; the AVX2 and AVX-512 builds give
// the same bits (each lane sums its products in the same order with FMAs), as the other kernels do.
TEST(Gemm, EveryIsaBuild) {
  std::mt19937 rng(9);
  const Case c{29, 150, 300};
  const Operands o = make(c, false, rng);
  m3::GemmB B;
  B.p = o.bb.data();
  B.bf16 = true;
  B.ld = c.K + 5;
  const m3::GemmOps* tables[] = {&m3::isa_generic::kGemmOps, &m3::isa_avx2::kGemmOps, &m3::isa_avx512::kGemmOps};
  std::vector<float> avx2_result;
  for (const m3::GemmOps* ops : tables) {
    if (!m3::cpu_ops_for(ops->name)) continue;
    std::vector<float> C(size_t(c.M * c.N), 0.f), buf;
    for (int64_t k0 = 0; k0 < c.K; k0 += m3::kGemmKc) {
      const int64_t kc = std::min(m3::kGemmKc, c.K - k0);
      buf.assign(size_t((c.N + ops->nr - 1) / ops->nr * kc * ops->nr) + 16, 0.f);
      float* aligned = buf.data() + (16 - (reinterpret_cast<uintptr_t>(buf.data()) / 4) % 16) % 16;
      ops->pack(B, 0, c.N, k0, kc, aligned);
      ops->block(c.M, c.N, kc, o.a.data() + k0, c.K + 3, aligned, kc * ops->nr, C.data(), c.N);
    }
    EXPECT_LT(rel_err(c, o, false, false, C, c.N), 2e-6 * std::sqrt(double(c.K))) << ops->name;
    if (ops == &m3::isa_avx2::kGemmOps) avx2_result = C;
    if (ops == &m3::isa_avx512::kGemmOps && !avx2_result.empty()) {
      EXPECT_EQ(0, std::memcmp(C.data(), avx2_result.data(), C.size() * sizeof(float))) << "avx512 vs avx2 bits";
    }
  }
}

TEST(Gemm, RowResultIndependentOfBatchAndThreads) {
  std::mt19937 rng(3);
  const Case c{700, 300, 600};
  const Operands o = make(c, false, rng);
  m3::GemmB B;
  B.p = o.bb.data();
  B.bf16 = true;
  B.ld = c.K + 5;
  std::vector<float> all(size_t(c.M * c.N)), one(size_t(c.N));
  m3::gemm_parallel(c.M, c.N, c.K, o.a.data(), c.K + 3, B, all.data(), c.N, o.bias.data());
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  for (int64_t i : {int64_t(0), int64_t(5), int64_t(511), int64_t(699)}) {
    m3::gemm_parallel(1, c.N, c.K, o.a.data() + i * (c.K + 3), c.K + 3, B, one.data(), c.N, o.bias.data());
    EXPECT_EQ(0, std::memcmp(one.data(), all.data() + i * c.N, one.size() * sizeof(float))) << "row " << i;
  }
  omp_set_num_threads(threads);
}

TEST(Gemm, AttentionDenseMatchesFloat64Reference) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const int64_t n : {int64_t(1), int64_t(7), int64_t(130), int64_t(300)}) {
    const int heads = 3, D = 20;
    const int64_t ld = heads * D + 4;
    std::vector<float> q(static_cast<size_t>(n * ld)), k(q.size()), v(q.size()), out(q.size(), 777.f);
    for (auto* z : {&q, &k, &v})
      for (float& x : *z) x = 2.f * nd(rng);
    const float scale = 1.0f / std::sqrt(float(D));
    m3::attention_dense(q.data(), k.data(), v.data(), ld, n, heads, D, scale, out.data());
    double worst = 0, big = 0;
    for (int h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n; ++i) {
        std::vector<double> s(static_cast<size_t>(n));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          double d = 0;
          for (int e = 0; e < D; ++e) d += double(q[size_t(i * ld + h * D + e)]) * k[size_t(j * ld + h * D + e)];
          s[size_t(j)] = d * double(scale);
          mx = std::max(mx, s[size_t(j)]);
        }
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int e = 0; e < D; ++e) {
          double r = 0;
          for (int64_t j = 0; j < n; ++j) r += s[size_t(j)] / sum * v[size_t(j * ld + h * D + e)];
          worst = std::max(worst, std::fabs(r - out[size_t(i * ld + h * D + e)]));
          big = std::max(big, std::fabs(r));
        }
      }
    EXPECT_LT(worst / big, 2e-6) << "n " << n;
    for (int64_t i = 0; i < n; ++i)  // columns past the heads are left alone
      for (int64_t c = heads * D; c < ld; ++c) ASSERT_EQ(out[size_t(i * ld + c)], 777.f);
  }
}

// The erf GELU against float64 over the range activations take, element by element (relative), and
// every element (vector body and scalar tail) of an odd length.
TEST(Gemm, GeluMatchesFloat64Reference) {
  std::vector<float> x;
  for (int i = -60000; i <= 60000; ++i) x.push_back(float(i) * 1e-4f);  // [-6, 6]
  x.push_back(0.f);
  x.push_back(30.f);
  x.push_back(-30.f);  // GELU(-30) is about 1e-197: 0 in fp32
  std::vector<float> y = x;
  m3::gelu_erf(y.data(), int64_t(y.size()));
  // Relative error in fp32 grows with x^2 in the negative tail (the exp's argument -x^2/2 is rounded);
  // the form 1 + erf loses that tail completely (GELU(-6) would be 0).
  double worst_core = 0, worst_tail = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double r = 0.5 * double(x[i]) * std::erfc(-double(x[i]) / std::sqrt(2.0));
    const double e = std::fabs(r) < 1e-30 ? std::fabs(double(y[i])) : std::fabs(double(y[i]) - r) / std::fabs(r);
    (std::fabs(x[i]) <= 3 ? worst_core : worst_tail) = std::max(std::fabs(x[i]) <= 3 ? worst_core : worst_tail, e);
  }
  std::printf("gelu: worst relative error %.3g for |x| <= 3, %.3g for 3 < |x| <= 6 and +-30\n", worst_core, worst_tail);
  EXPECT_LT(worst_core, 2e-6);
  EXPECT_LT(worst_tail, 1e-5);
}

}  // namespace
