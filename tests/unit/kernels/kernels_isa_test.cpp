// Every ISA build of the kernels this CPU can run (generic, AVX2, AVX-512) gives the same matmul
// results as the reference decode-then-dot path, for every weight format.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "formats/dtype.h"
#include "base/aligned_vector.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/linear.h"

namespace {

struct Mat {
  std::vector<uint8_t> w, s;
  m3::Linear lin;
};

Mat make_matrix(m3::LinearKind kind, int64_t N, int64_t K, std::mt19937& rng) {
  Mat m;
  m.lin.kind = kind;
  m.lin.N = N;
  m.lin.K = K;
  std::normal_distribution<float> nd(0.f, 1.f);
  switch (kind) {
    case m3::LinearKind::F32:
      m.w.resize(N * K * 4);
      for (int64_t i = 0; i < N * K; ++i) {
        const float v = nd(rng);
        std::memcpy(&m.w[i * 4], &v, 4);
      }
      break;
    case m3::LinearKind::BF16:
      m.w.resize(N * K * 2);
      for (int64_t i = 0; i < N * K; ++i) {
        const uint16_t v = m3::float_to_bf16(nd(rng));
        std::memcpy(&m.w[i * 2], &v, 2);
      }
      break;
    case m3::LinearKind::MXFP8:
      m.w.resize(N * K);
      m.s.resize(N * K / 32);
      for (auto& b : m.w) b = uint8_t(rng() & 0xff);
      for (auto& b : m.w)
        if ((b & 0x7f) == 0x7f) b = 0x38;  // no NaN codes
      for (auto& b : m.s) b = uint8_t(120 + rng() % 14);
      break;
    case m3::LinearKind::NVFP4:
      m.w.resize(N * K / 2);
      m.s.resize(N * K / 16);
      for (auto& b : m.w) b = uint8_t(rng() & 0xff);
      for (auto& b : m.s) b = uint8_t(0x20 + rng() % 0x40);
      m.lin.global_div = 37.5f;
      break;
    default:
      break;
  }
  m.lin.w = m.w.data();
  m.lin.scales = m.s.empty() ? nullptr : m.s.data();
  m3::set_scale_range(m.lin);
  return m;
}

// Why the avx2-against-avx512 tests skip (dispatch.cpp's has_avx512).
constexpr const char* kNoAvx512 = "this CPU cannot run the avx512 build (AVX-512 F, BW, DQ, VL, VBMI, VNNI and GFNI)";

class KernelsIsa : public testing::TestWithParam<m3::LinearKind> {};

TEST_P(KernelsIsa, AllIsasMatchReference) {
  std::mt19937 rng(1);
  // K % 8 != 0 exercises the kernel tails for the plain formats; block formats need whole blocks.
  const bool plain = GetParam() == m3::LinearKind::F32 || GetParam() == m3::LinearKind::BF16;
  const int64_t N = 37, K = plain ? 260 : 256, T = 5;
  Mat m = make_matrix(GetParam(), N, K, rng);
  std::vector<float> x(T * K);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : x) v = nd(rng);
  // Reference: decode rows, double-precision dot.
  std::vector<float> wf(N * K);
  m3::linear_decode_rows(m.lin, 0, N, wf.data());
  // Tolerance scales with sum |x w| (the conditioning of each dot), not with |result|.
  std::vector<double> ref(T * N), mag(T * N);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, m = 0;
      for (int64_t k = 0; k < K; ++k) {
        s += double(x[t * K + k]) * wf[n * K + k];
        m += std::fabs(double(x[t * K + k]) * wf[n * K + k]);
      }
      ref[t * N + n] = s;
      mag[t * N + n] = m;
    }
  int tested = 0;
  for (const char* isa : {"generic", "avx2", "avx512"}) {
    const m3::CpuOps* ops = m3::cpu_ops_for(isa);
    if (!ops) continue;
    ++tested;
    std::vector<float> y(T * N), scratch(m3::kLinearTileRows * K);
    ops->linear_rows(m.lin, x.data(), T, y.data(), 0, N, scratch.data());
    double worst = 0;
    for (int64_t i = 0; i < T * N; ++i) worst = std::max(worst, std::fabs(y[i] - ref[i]) / (1e-30 + mag[i]));
    EXPECT_LT(worst, 4e-6) << isa;
    // One token at a time (the decode step takes a fused decode+dot path in the SIMD builds).
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> y1(N);
      ops->linear_rows(m.lin, x.data() + t * K, 1, y1.data(), 0, N, scratch.data());
      for (int64_t n = 0; n < N; ++n) {
        EXPECT_NEAR(y1[n], ref[t * N + n], 4e-6 * mag[t * N + n]) << isa << " T=1";
        // Batch invariance: a row's result is bit-identical whatever the number of tokens in the step.
        EXPECT_EQ(y1[n], y[t * N + n]) << isa << " row " << n << " token " << t;
      }
    }
    // The public entry (threaded, dispatched) agrees as well.
    std::vector<float> y2(T * N);
    m3::linear_forward(m.lin, x.data(), T, y2.data());
    for (int64_t i = 0; i < T * N; ++i) EXPECT_NEAR(y2[i], ref[i], 4e-6 * mag[i]);
  }
  EXPECT_GE(tested, 1);
  std::printf("kernel table in use: %s\n", m3::cpu_ops().name);
}

INSTANTIATE_TEST_SUITE_P(Formats, KernelsIsa,
                         testing::Values(m3::LinearKind::F32, m3::LinearKind::BF16, m3::LinearKind::MXFP8,
                                         m3::LinearKind::NVFP4));

// linear_rows_claimed (the threaded matmul's entry: set up once, then the ranges a claim function
// hands out) gives each row the bits linear_rows gives, for ranges in any order and size (pairs of
// tiles, single tiles, the partial last tile), one token and several, row-major and tiled weights,
// fp32 and int8 activations.
namespace claimed {
struct Ranges {
  std::vector<std::pair<int64_t, int64_t>> r;
  size_t next = 0;
};
bool hand_out(void* ctx, int64_t* r0, int64_t* r1) {
  Ranges& c = *static_cast<Ranges*>(ctx);
  if (c.next == c.r.size()) return false;
  *r0 = c.r[c.next].first, *r1 = c.r[c.next].second;
  ++c.next;
  return true;
}
}  // namespace claimed

TEST(KernelsIsaClaimed, SameBitsAsLinearRows) {
  std::mt19937 rng(23);
  const int64_t N = 61, K = 256, T = 4;  // 15 full tiles and a 1-row tail
  std::vector<float> x(T * K);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : x) v = nd(rng);
  // Out of order, mixed sizes, every row exactly once.
  const std::vector<std::pair<int64_t, int64_t>> order = {{32, 48}, {0, 8}, {60, 61}, {8, 12}, {48, 60}, {12, 32}};
  int runs = 0;
  for (m3::LinearKind kind : {m3::LinearKind::F32, m3::LinearKind::BF16, m3::LinearKind::MXFP8, m3::LinearKind::NVFP4})
    for (int variant = 0; variant < 3; ++variant) {  // 0 row-major, 1 tiled, 2 int8 activations (NVFP4)
      if (variant == 2 && kind != m3::LinearKind::NVFP4) continue;
      Mat m = make_matrix(kind, N, K, rng);
      if (variant == 1 && !m3::tile_rows(m.lin, m.w.data())) continue;
      if (variant == 2) {
        ASSERT_TRUE(m3::enable_int8_activations(m.lin));
      }
      for (const char* isa : {"generic", "avx2", "avx512"}) {
        const m3::CpuOps* ops = m3::cpu_ops_for(isa);
        if (!ops) continue;
        std::vector<float> scratch(m3::kLinearTileRows * K);
        for (int64_t tok : {int64_t(1), T}) {
          std::vector<float> ya(tok * N), yb(tok * N, -7.f);
          ops->linear_rows(m.lin, x.data(), tok, ya.data(), 0, N, scratch.data());
          claimed::Ranges ranges{order};
          ops->linear_rows_claimed(m.lin, x.data(), tok, yb.data(), claimed::hand_out, &ranges, scratch.data());
          EXPECT_EQ(ranges.next, order.size());
          for (int64_t i = 0; i < tok * N; ++i)
            ASSERT_EQ(std::memcmp(&ya[i], &yb[i], 4), 0)
                << isa << " " << m3::linear_kind_name(kind) << " variant " << variant << " T=" << tok << " output "
                << i << ": " << ya[i] << " vs " << yb[i];
          ++runs;
        }
      }
    }
  EXPECT_GE(runs, 14);
}

// linear_forward_many splits the tiles of all jobs over the threads in chunks that threads take from
// each other's shares: with 1, 2 and 3 threads (more than this machine's cores: shares are then
// taken while their owner waits) every job's rows equal linear_rows' bits, for jobs of different
// formats, widths and token counts, including a job too small to make one chunk, one that the lane
// GEMM takes (whole 16-row panels), one that runs as token slices (more than kLaneGemmMaxTokens) and a
// wide one that runs as slices of fewer tokens (lane_slice_tokens: 67 + 66 here, each a lane GEMM).
TEST(KernelsIsaClaimed, ManyJobsAnyThreadCountSameBits) {
  std::mt19937 rng(29);
  struct Spec {
    m3::LinearKind kind;
    int64_t N, K, T;
  };
  const std::vector<Spec> specs = {{m3::LinearKind::MXFP8, 96, 512, 1}, {m3::LinearKind::NVFP4, 130, 256, 1},
                                   {m3::LinearKind::BF16, 4, 256, 1},   {m3::LinearKind::MXFP8, 200, 256, 3},
                                   {m3::LinearKind::F32, 37, 260, 2},   {m3::LinearKind::NVFP4, 64, 512, 5},
                                   {m3::LinearKind::MXFP8, 72, 256, m3::kLaneGemmMinTokens + 2},  // lane GEMM
                                   {m3::LinearKind::NVFP4, 48, 256, m3::kLaneGemmMaxTokens + 70},  // in slices
                                   {m3::LinearKind::MXFP8, 20, 8192, 2 * m3::kLaneGemmMinTokens + 5}};  // wide
  static_assert(m3::kLaneGemmMaxFloats / 8192 <= 2 * m3::kLaneGemmMinTokens, "the wide job must be sliced");
  std::vector<Mat> mats;
  std::vector<std::vector<float>> xs, want;
  for (const Spec& sp : specs) {
    mats.push_back(make_matrix(sp.kind, sp.N, sp.K, rng));
    xs.emplace_back(size_t(sp.T * sp.K));
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : xs.back()) v = nd(rng);
  }
  const m3::CpuOps& ops = m3::cpu_ops();
  for (size_t j = 0; j < specs.size(); ++j) {
    mats[j].lin.w = mats[j].w.data();
    mats[j].lin.scales = mats[j].s.empty() ? nullptr : mats[j].s.data();
    want.emplace_back(size_t(specs[j].T * specs[j].N));
    std::vector<float> scratch(m3::kLinearTileRows * specs[j].K);
    ops.linear_rows(mats[j].lin, xs[j].data(), specs[j].T, want[j].data(), 0, specs[j].N, scratch.data());
  }
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<std::vector<float>> got;
      std::vector<m3::LinearJob> jobs;
      for (size_t j = 0; j < specs.size(); ++j) got.emplace_back(want[j].size(), -7.f);
      for (size_t j = 0; j < specs.size(); ++j) jobs.push_back({&mats[j].lin, xs[j].data(), specs[j].T, got[j].data()});
      m3::linear_forward_many(jobs.data(), int(jobs.size()));
      for (size_t j = 0; j < specs.size(); ++j)
        ASSERT_EQ(std::memcmp(got[j].data(), want[j].data(), want[j].size() * 4), 0)
            << "job " << j << " (" << m3::linear_kind_name(specs[j].kind) << "), " << threads << " threads, rep " << rep;
    }
  }
  omp_set_num_threads(saved);
}

// T random tokens through ops->linear_rows at once and one at a time: the index of the first token
// whose outputs differ in any bit, or -1.
int64_t first_token_differing_from_alone(const m3::CpuOps* ops, const m3::Linear& lin, int64_t T, std::mt19937& rng) {
  const int64_t N = lin.N, K = lin.K;
  std::vector<float> scratch(static_cast<size_t>(m3::kLinearTileRows * K)), x(static_cast<size_t>(T * K));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : x) v = nd(rng);
  std::vector<float> y(static_cast<size_t>(T * N)), y1(static_cast<size_t>(N));
  ops->linear_rows(lin, x.data(), T, y.data(), 0, N, scratch.data());
  for (int64_t t = 0; t < T; ++t) {
    ops->linear_rows(lin, x.data() + t * K, 1, y1.data(), 0, N, scratch.data());
    if (std::memcmp(y1.data(), y.data() + t * N, size_t(N) * 4) != 0) return t;
  }
  return -1;
}

// Steps of 2..8 tokens run each BF16 / MXFP8 / NVFP4 tile through the in-register decode for up to three
// tokens at once (linear_kernels.h, tile_tokens); more tokens, and matrices the fast forms do not
// cover (an MXFP8 scale code above kMxfp8PrescaleMaxCode, NVFP4 scales the placed form would round),
// take the decoded-tile path (the avx512 build: even groups of up to six in registers, then panels).
// Every output keeps the bits of the same token computed alone, for every token count from 2 to 17,
// row-major and tiled, full tiles and a tail row.
TEST(KernelsIsaFewTokens, EveryTokenCountSameBitsAsOneToken) {
  std::mt19937 rng(41);
  const int64_t N = 13, K = 256;  // 3 tiles and a tail row
  int runs = 0;
  for (int variant = 0; variant < 5; ++variant)
    for (bool tiled : {false, true}) {
      const m3::LinearKind kind =
          variant < 2 ? m3::LinearKind::MXFP8 : variant < 4 ? m3::LinearKind::NVFP4 : m3::LinearKind::BF16;
      Mat m = make_matrix(kind, N, K, rng);
      if (variant == 1) m.s[5] = uint8_t(m3::kMxfp8PrescaleMaxCode + 3);  // row 0 of tile 0: outside the fast form
      if (variant == 3) m.lin.global_div = 3 * 0x1p100f;  // placed NVFP4 scales would round
      m3::set_scale_range(m.lin);
      if (tiled && !m3::tile_rows(m.lin, m.w.data())) continue;
      for (const char* isa : {"generic", "avx2", "avx512"}) {
        const m3::CpuOps* ops = m3::cpu_ops_for(isa);
        if (!ops) continue;
        for (int64_t T = 2; T <= 17; ++T) {  // the avx512 build moves to panels at 12 (NVFP4) and 16 (MXFP8)
          ASSERT_EQ(first_token_differing_from_alone(ops, m.lin, T, rng), -1)
              << isa << " " << m3::linear_kind_name(kind) << " variant " << variant << (tiled ? " tiled" : "") << " T=" << T;
          ++runs;
        }
      }
    }
  EXPECT_GE(runs, 10 * 16);
}

// The NVFP4 nibble reorder of tiled chunks (SSE2) against its definition, both ways, on random chunks.
TEST(KernelsTiled, Nvfp4ChunkNibblesMatchDefinition) {
  std::mt19937 rng(7);
  auto code = [](const uint8_t* b, int e) { return (b[e / 2] >> (4 * (e % 2))) & 0x0f; };  // checkpoint order
  for (int it = 0; it < 2000; ++it) {
    uint8_t in[16], tiled[16], back[16];
    for (auto& b : in) b = uint8_t(rng());
    m3::nvfp4_chunk_nibbles(in, tiled, true);
    for (int j = 0; j < 16; ++j) {
      ASSERT_EQ(tiled[j] & 0x0f, code(in, j)) << it << " " << j;
      ASSERT_EQ(tiled[j] >> 4, code(in, 16 + j)) << it << " " << j;
    }
    m3::nvfp4_chunk_nibbles(tiled, back, false);
    ASSERT_EQ(std::memcmp(in, back, 16), 0) << it;
  }
}

// Activation and panel buffers start on a cache line whatever their size (the 512-bit kernels load
// whole lines from them; see aligned_vector.h).
TEST(KernelsAlignedVector, StartsOnCacheLine) {
  for (size_t n : {size_t(1), size_t(3), size_t(17), size_t(4096), size_t(1) << 20}) {
    m3::AlignedVector<float> v(n, 1.0f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u) << n;
    v.resize(3 * n + 5);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u) << n;
    EXPECT_EQ(v[0], 1.0f);
  }
}

// Products of 128 tokens and more (the AVX2 build: the lane GEMM on two 16-row panels, then one
// decoded tile by dot products; the avx512 build: its panels) keep every output's bits of the same
// token computed alone, for every format, row-major and tiled, 37 rows (9 tiles and a tail row) and
// token counts that end on a group of three, two and one of the tile path.
TEST(KernelsIsaPanels, ManyTokensSameBitsAsOneToken) {
  std::mt19937 rng(31);
  const int64_t N = 37, K = 256;
  int runs = 0;
  for (m3::LinearKind kind : {m3::LinearKind::F32, m3::LinearKind::BF16, m3::LinearKind::MXFP8, m3::LinearKind::NVFP4})
    for (bool tiled : {false, true}) {
      Mat m = make_matrix(kind, N, K, rng);
      if (tiled && !m3::tile_rows(m.lin, m.w.data())) continue;
      for (const char* isa : {"generic", "avx2", "avx512"}) {
        const m3::CpuOps* ops = m3::cpu_ops_for(isa);
        if (!ops) continue;
        for (int64_t T : {int64_t(129), int64_t(130), int64_t(131)}) {
          ASSERT_EQ(first_token_differing_from_alone(ops, m.lin, T, rng), -1)
              << isa << " " << m3::linear_kind_name(kind) << (tiled ? " tiled" : "") << " T=" << T;
          ++runs;
        }
      }
    }
  EXPECT_GE(runs, 12);
}

// Steps of kLaneGemmMinTokens tokens or more run whole 16-row panels through the AVX2 lane GEMM
// (lane_gemm.h, one product per lane of the dot form, added in hsum8's order): every output
// keeps the bits of the same token computed alone, for every format, row-major and tiled; 37 rows (two
// panels, a tile and a tail row); token counts at the threshold, around the groups of six and past one
// chunk of 96 tokens (the rows past one block of steps: 130 only); K below one step (F32 / BF16: 4), with a tail (260 = 32 steps + 4), and past one
// block of 256 steps (2080 / 2084).
TEST(KernelsIsaLaneGemm, ManyTokensSameBitsAsOneToken) {
  std::mt19937 rng(37);
  const int64_t N = 37;
  int runs = 0;
  for (m3::LinearKind kind : {m3::LinearKind::F32, m3::LinearKind::BF16, m3::LinearKind::MXFP8, m3::LinearKind::NVFP4}) {
    const bool plain = kind == m3::LinearKind::F32 || kind == m3::LinearKind::BF16;
    for (int64_t K : {int64_t(4), int64_t(256), int64_t(2080)}) {
      if (K == 4 && !plain) continue;
      const int64_t k = plain && K > 4 ? K + 4 : K;
      for (bool tiled : {false, true}) {
        Mat m = make_matrix(kind, N, k, rng);
        if (tiled && !m3::tile_rows(m.lin, m.w.data())) continue;
        for (const char* isa : {"avx2", "avx512"}) {
          const m3::CpuOps* ops = m3::cpu_ops_for(isa);
          if (!ops) continue;
          for (int64_t T : {m3::kLaneGemmMinTokens, m3::kLaneGemmMinTokens + 1, m3::kLaneGemmMinTokens + 5,
                            int64_t(97), int64_t(130)}) {
            if (k > 512 && T != 130) continue;  // the long rows: one count past a chunk
            ASSERT_EQ(first_token_differing_from_alone(ops, m.lin, T, rng), -1)
                << isa << " " << m3::linear_kind_name(kind) << " K=" << k << (tiled ? " tiled" : "") << " T=" << T;
            ++runs;
          }
        }
      }
    }
  }
  EXPECT_GE(runs, 40);
}

// The lane GEMM decodes tiled panels straight into its per-lane layout (lane_decode_pack_tiled); MXFP8
// rows holding a block-scale code above 246 take decode_tile's two-multiply form there too: same bits
// as the token alone, for rows with such a block (first and second panel) and rows without.
TEST(KernelsIsaLaneGemm, Mxfp8LargeScaleCodesSameBits) {
  std::mt19937 rng(41);
  const int64_t N = 37, K = 256;
  for (bool tiled : {false, true}) {
    Mat m = make_matrix(m3::LinearKind::MXFP8, N, K, rng);
    for (int64_t row : {int64_t(3), int64_t(21)}) {
      const int64_t b = 1;  // block 1 of the row: code 247 (2^120), weights below 0.5 so that none overflows
      m.s[size_t(row * (K / 32) + b)] = 247;
      for (int64_t k = 0; k < 32; ++k) {
        uint8_t& q = m.w[size_t(row * K + b * 32 + k)];
        q = uint8_t((q & 0x87) | 0x28);
      }
    }
    m3::set_scale_range(m.lin);
    if (tiled) {
      ASSERT_TRUE(m3::tile_rows(m.lin, m.w.data()));
    }
    for (const char* isa : {"avx2", "avx512"}) {
      const m3::CpuOps* ops = m3::cpu_ops_for(isa);
      if (!ops) continue;
      ASSERT_EQ(first_token_differing_from_alone(ops, m.lin, m3::kLaneGemmMinTokens + 5, rng), -1)
          << isa << (tiled ? " tiled" : "");
    }
  }
}

// The avx512 build's 512-bit kernels (linear_avx512.h: two rows per vector, each lane fed as the
// AVX2 kernel's) give the AVX2 build's bits: tiled MXFP8 / NVFP4 / BF16 in the decode step, steps of
// a few tokens (in registers, groups of six) and many (panels, 18 tiles: one panel of 16 and one of
// 2), with a tail row; and the matrices they leave to the AVX2 kernels (row-major, MXFP8 codes above
// kMxfp8PrescaleMaxCode, NVFP4 scales the placed form would round).
TEST(KernelsIsaAvx512, SameBitsAsAvx2) {
  const m3::CpuOps *a2 = m3::cpu_ops_for("avx2"), *a5 = m3::cpu_ops_for("avx512");
  if (!a2 || !a5) GTEST_SKIP() << kNoAvx512;
  std::mt19937 rng(77);
  const int64_t N = 73, K = 256;
  int runs = 0;
  for (int variant = 0; variant < 5; ++variant)
    for (bool tiled : {true, false}) {
      const m3::LinearKind kind =
          variant < 2 ? m3::LinearKind::MXFP8 : variant < 4 ? m3::LinearKind::NVFP4 : m3::LinearKind::BF16;
      Mat m = make_matrix(kind, N, K, rng);
      if (variant == 1) m.s[9] = uint8_t(m3::kMxfp8PrescaleMaxCode + 3);
      if (variant == 3) m.lin.global_div = 3 * 0x1p100f;
      m3::set_scale_range(m.lin);
      if (tiled) {
        ASSERT_TRUE(m3::tile_rows(m.lin, m.w.data()));
      }
      for (int64_t T : {1, 2, 3, 4, 5, 6, 7, 8, 11, 13, 40, 41, 64, 131}) {
        std::vector<float> x(size_t(T * K)), scratch(size_t(m3::kLinearTileRows * K));
        std::normal_distribution<float> nd(0.f, 1.f);
        for (auto& v : x) v = nd(rng);
        std::vector<float> y2(size_t(T * N)), y5(size_t(T * N));
        a2->linear_rows(m.lin, x.data(), T, y2.data(), 0, N, scratch.data());
        a5->linear_rows(m.lin, x.data(), T, y5.data(), 0, N, scratch.data());
        for (int64_t i = 0; i < T * N; ++i)
          ASSERT_EQ(std::memcmp(&y2[i], &y5[i], 4), 0)
              << m3::linear_kind_name(kind) << " variant " << variant << (tiled ? " tiled" : "") << " T=" << T
              << " token " << i / N << " row " << i % N << ": " << y2[i] << " vs " << y5[i];
        ++runs;
      }
    }
  EXPECT_EQ(runs, 5 * 2 * 14);
}

// BF16 bytes of an N x K matrix with magnitudes within a factor of 40 (a packed BF16 chunk needs no
// escape); with `escapes`, about one weight in 50 zero or tiny (beyond 7 steps of 4: its chunk escapes);
// with `specials`, an infinity at (5, 7) and a NaN at (9, 40).
m3::AlignedVector<uint8_t> narrow_bf16_matrix(int64_t N, int64_t K, bool escapes, bool specials, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  m3::AlignedVector<uint8_t> w(size_t(N * K * 2));
  for (size_t i = 0; i < w.size(); i += 2) {
    const float g = nd(rng);
    float f = std::copysign(0.005f + 0.02f * std::fabs(g), g);
    if (escapes && rng() % 50 == 0) f = rng() % 2 ? 0.0f : 1e-30f;
    const uint16_t h = m3::float_to_bf16(f);
    std::memcpy(&w[i], &h, 2);
  }
  if (specials) {
    const uint16_t inf = 0x7f80, nan = 0x7fc1;
    std::memcpy(&w[2 * (5 * K + 7)], &inf, 2);
    std::memcpy(&w[2 * (9 * K + 40)], &nan, 2);
  }
  return w;
}

// The AVX2 one-token step over a BF16 matrix packed by pack_bf16_nibbles gives the bits of the tiled
// bytes, for full tiles and a tail row, K = 64 and 2080 (65 chunks); with magnitudes within a factor of
// 40 no row chunk escapes and the slots take under 77% of the bytes; with zeros and tiny values (and an
// infinity and a NaN) some row chunks are escaped and read from the tiled bytes, the others packed.
TEST(KernelsIsaAvx2, NibblePackedBf16SameBitsAsTiled) {
  const m3::CpuOps* a2 = m3::cpu_ops_for("avx2");
  if (!a2) GTEST_SKIP() << "no AVX2 + FMA on this CPU";
  std::mt19937 rng(93);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int variant = 0; variant < 2; ++variant)
    for (int64_t K : {int64_t(64), int64_t(2080)}) {
      const int64_t N = 41;
      m3::AlignedVector<uint8_t> w = narrow_bf16_matrix(N, K, variant == 1, variant == 1, rng);
      m3::Linear W;
      W.kind = m3::LinearKind::BF16, W.N = N, W.K = K, W.w = w.data();
      ASSERT_TRUE(m3::tile_rows(W, w.data()));
      std::vector<float> x(static_cast<size_t>(K)), scratch(size_t(m3::kLinearTileRows * K)), y0(static_cast<size_t>(N)),
          y1(static_cast<size_t>(N));
      for (auto& v : x) v = nd(rng);
      a2->linear_rows(W, x.data(), 1, y0.data(), 0, N, scratch.data());
      m3::AlignedVector<uint8_t> packed;
      ASSERT_TRUE(m3::pack_bf16_nibbles(W, packed));
      ASSERT_EQ(packed.size(), size_t(N / 4 * K / 32 * m3::kBf16NibbleSlot));
      size_t escaped = 0, rows = 0;
      for (size_t s = 0; s < packed.size(); s += m3::kBf16NibbleSlot)
        for (int i = 0; i < 4; ++i, ++rows) escaped += packed[s + size_t(i)] == m3::kBf16NibblesEscape;
      if (variant == 0) {
        EXPECT_EQ(escaped, 0u);
        EXPECT_LT(double(packed.size()), 0.77 * double(W.bytes()));
      } else {
        EXPECT_GT(escaped, 0u);
        EXPECT_LT(escaped, rows);
      }
      a2->linear_rows(W, x.data(), 1, y1.data(), 0, N, scratch.data());
      for (int64_t r = 0; r < N; ++r)
        ASSERT_TRUE(std::memcmp(&y1[size_t(r)], &y0[size_t(r)], 4) == 0)
            << "variant " << variant << " K=" << K << " row " << r << ": " << y1[size_t(r)] << " vs " << y0[size_t(r)];
    }
}

// The packed BF16 tiles (pack_bf16_tiles, read by the avx512 steps of up to 40 tokens) are lossless:
// the avx512 kernels give the bits of the tiled BF16 bytes and of the AVX2 build, for one to 40 tokens
// (and 41, which goes to the panels over the tiled bytes), full tiles and a tail row; with weights
// spread over a narrow exponent range the matrix packs to under 78% of its bytes with no escaped chunk,
// and with zeros, tiny values, an infinity and a NaN the chunks holding them are kept raw (escapes);
// also a matrix large enough for the packing to run on several threads.
TEST(KernelsIsaAvx512, PackedBf16SameBitsAsTiled) {
  const m3::CpuOps *a2 = m3::cpu_ops_for("avx2"), *a5 = m3::cpu_ops_for("avx512");
  if (!a2 || !a5) GTEST_SKIP() << kNoAvx512;
  std::mt19937 rng(91);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int variant = 0; variant < 3; ++variant) {
    // Variant 2: large enough (8200 chunks) for pack_bf16_tiles to split the work among threads.
    const int64_t N = variant < 2 ? 41 : 4100, K = variant < 2 ? 192 : 256;
    m3::AlignedVector<uint8_t> w = narrow_bf16_matrix(N, K, variant >= 1, variant == 1, rng);
    m3::Linear W;
    W.kind = m3::LinearKind::BF16, W.N = N, W.K = K, W.w = w.data();
    ASSERT_TRUE(m3::tile_rows(W, w.data()));
    m3::AlignedVector<uint8_t> packed;
    ASSERT_TRUE(m3::pack_bf16_tiles(W, packed));
    const size_t slots = size_t(N / 4 * K / 32), escaped = (packed.size() - slots * 196) / 256;
    if (variant == 0) {
      EXPECT_EQ(escaped, 0u);
      EXPECT_LT(double(packed.size()), 0.78 * double(W.bytes()));
    } else {
      EXPECT_GT(escaped, 0u);
      EXPECT_LT(escaped, slots);
    }
    for (int64_t T : {1, 2, 3, 4, 5, 7, 8, 13, 40, 41}) {
      if (variant == 2 && T != 1 && T != 5) continue;
      std::vector<float> x(size_t(T * K)), scratch(size_t(m3::kLinearTileRows * K));
      for (auto& v : x) v = nd(rng);
      std::vector<float> y[3];
      for (int k = 0; k < 3; ++k) {
        y[k].assign(size_t(T * N), 0.f);
        W.bf16_packed = k == 2 ? packed.data() : nullptr;
        (k == 0 ? a2 : a5)->linear_rows(W, x.data(), T, y[k].data(), 0, N, scratch.data());
      }
      for (int k = 1; k < 3; ++k)
        ASSERT_EQ(std::memcmp(y[0].data(), y[k].data(), y[0].size() * 4), 0)
            << "variant " << variant << " T=" << T << (k == 2 ? " packed" : " tiled");
    }
  }
}

// The tiled layout (Linear::tiled: each 4-row tile's rows interleaved in chunks, for the decode step's
// sequential read) changes where bytes lie, never a result: every ISA gives the same bits for one and
// several tokens as on the row-major bytes, for full tiles and the row-major tail rows, and the
// reference decode reads the same rows. MXFP8 runs both decode-step paths (scales on x, and the
// per-block multiply for a matrix whose scale codes span too many values).
TEST(KernelsIsaTiled, SameBitsAsRowMajor) {
  std::mt19937 rng(5);
  const int64_t N = 14, K = 256;  // 3 full tiles and 2 tail rows
  struct Kind {
    m3::LinearKind kind;
    bool wide_codes;
  };
  for (const Kind& kd : {Kind{m3::LinearKind::MXFP8, false}, Kind{m3::LinearKind::MXFP8, true},
                         Kind{m3::LinearKind::NVFP4, false}, Kind{m3::LinearKind::BF16, false}}) {
    Mat m = make_matrix(kd.kind, N, K, rng);
    if (kd.wide_codes) {
      for (size_t i = 0; i < m.s.size(); ++i) m.s[i] = uint8_t(100 + i % 30);
      m3::set_scale_range(m.lin);
    }
    Mat t = m;
    t.lin.w = t.w.data();
    t.lin.scales = t.s.empty() ? nullptr : t.s.data();
    ASSERT_TRUE(m3::tile_rows(t.lin, t.w.data())) << m3::linear_kind_name(kd.kind);
    EXPECT_TRUE(t.lin.tiled);
    EXPECT_NE(t.w, m.w);  // the bytes did move
    const size_t rb = m.lin.element_row_bytes();
    EXPECT_TRUE(std::equal(t.w.end() - 2 * rb, t.w.end(), m.w.end() - 2 * rb));  // tail rows stay
    EXPECT_FALSE(m3::tile_rows(t.lin, t.w.data()));  // once only
    std::vector<float> dm(N * K), dt(N * K);
    m3::linear_decode_rows(m.lin, 0, N, dm.data());
    m3::linear_decode_rows(t.lin, 0, N, dt.data());
    EXPECT_EQ(std::memcmp(dm.data(), dt.data(), dm.size() * 4), 0) << m3::linear_kind_name(kd.kind);
    const int64_t T = 5;
    std::vector<float> x(T * K);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : x) v = nd(rng);
    for (const char* isa : {"generic", "avx2", "avx512"}) {
      const m3::CpuOps* ops = m3::cpu_ops_for(isa);
      if (!ops) continue;
      std::vector<float> scratch(m3::kLinearTileRows * K);
      for (int64_t tok : {int64_t(1), T}) {
        std::vector<float> ym(tok * N), yt(tok * N);
        ops->linear_rows(m.lin, x.data(), tok, ym.data(), 0, N, scratch.data());
        ops->linear_rows(t.lin, x.data(), tok, yt.data(), 0, N, scratch.data());
        for (int64_t i = 0; i < tok * N; ++i)
          EXPECT_EQ(std::memcmp(&ym[i], &yt[i], 4), 0)
              << isa << " " << m3::linear_kind_name(kd.kind) << (kd.wide_codes ? " (wide codes)" : "") << " T=" << tok
              << " output " << i << ": " << ym[i] << " vs " << yt[i];
      }
    }
    std::vector<float> y1(N), y2(N);
    m3::linear_forward(m.lin, x.data(), 1, y1.data());
    m3::linear_forward(t.lin, x.data(), 1, y2.data());
    EXPECT_EQ(std::memcmp(y1.data(), y2.data(), N * 4), 0);
  }
  // Not tiled: plain fp32, NVFP4 whose in-features are no whole 32-element chunks, int8 activations,
  // fewer than 4 rows.
  Mat f = make_matrix(m3::LinearKind::F32, 8, 64, rng);
  EXPECT_FALSE(m3::tile_rows(f.lin, f.w.data()));
  Mat n48 = make_matrix(m3::LinearKind::NVFP4, 8, 48, rng);
  EXPECT_FALSE(m3::tile_rows(n48.lin, n48.w.data()));
  Mat q8 = make_matrix(m3::LinearKind::NVFP4, 8, 128, rng);
  ASSERT_TRUE(m3::enable_int8_activations(q8.lin));
  EXPECT_FALSE(m3::tile_rows(q8.lin, q8.w.data()));
  Mat small = make_matrix(m3::LinearKind::MXFP8, 3, 64, rng);
  EXPECT_FALSE(m3::tile_rows(small.lin, small.w.data()));
  // and a tiled matrix keeps the exact path
  Mat nt = make_matrix(m3::LinearKind::NVFP4, 8, 128, rng);
  ASSERT_TRUE(m3::tile_rows(nt.lin, nt.w.data()));
  EXPECT_FALSE(m3::enable_int8_activations(nt.lin));
}

// Tiling runs at load on the loading thread, which is often not the one that runs the model (serve's
// engine thread): it must leave no threads behind (an OpenMP team would, with a worker spinning beside
// the engine's under OMP_WAIT_POLICY=active). Checked from a fresh thread, which has no team yet.
TEST(KernelsIsaTiled, LeavesNoThreadsBehind) {
  auto threads = [] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.is_directory() ? 1 : 0;
    return n;
  };
  std::mt19937 rng(9);
  Mat m = make_matrix(m3::LinearKind::MXFP8, 1024, 256, rng);  // 256 tiles: worth several threads
  int before = 0, after = 0;
  bool tiled = false;
  std::thread loader([&] {
    before = threads();
    tiled = m3::tile_rows(m.lin, m.w.data());
    after = threads();
    // joined helper threads leave /proc as they finish exiting; a bounded wait for that, not a sleep
    for (int i = 0; i < 100000 && after > before; ++i) {
      std::this_thread::yield();
      after = threads();
    }
  });
  loader.join();
  EXPECT_TRUE(tiled);
  EXPECT_EQ(after, before) << "threads left running after tile_rows";
}

// The MXFP8 decode step applies the block scales to copies of x (one per scale code) when that is
// exact: the decision follows the exponent range of x and of the codes, and on either side of it the
// one-token result equals the batched path's bit for bit (near overflow, near the subnormal range,
// with inf / NaN activations, and for a matrix whose codes span too many values).
TEST(KernelsIsaMxfp8, PrescaledActivationsExactOrNotTaken) {
  // The copy for code c is x * 2^(c - 7).
  const int64_t K = 64;
  std::vector<float> x(K, 1.5f);
  EXPECT_TRUE(m3::mxfp8_prescale_exact(x.data(), K, 120, 127));
  x[3] = std::ldexp(1.0f, 7);  // exponent field 134: times 2^(127 - 7) is 2^127, finite
  EXPECT_TRUE(m3::mxfp8_prescale_exact(x.data(), K, 120, 127));
  x[3] = std::ldexp(1.0f, 8);  // 2^128 would overflow
  EXPECT_FALSE(m3::mxfp8_prescale_exact(x.data(), K, 120, 127));
  EXPECT_TRUE(m3::mxfp8_prescale_exact(x.data(), K, 110, 126));
  x[3] = std::ldexp(1.0f, -126 + 7);  // times 2^(0 - 7) = 2^-126: still normal
  EXPECT_TRUE(m3::mxfp8_prescale_exact(x.data(), K, 0, 14));
  x[3] = std::ldexp(1.0f, -126 + 6);  // would become subnormal
  EXPECT_FALSE(m3::mxfp8_prescale_exact(x.data(), K, 0, 14));
  EXPECT_TRUE(m3::mxfp8_prescale_exact(x.data(), K, 1, 14));
  x[3] = 0.f;  // zeros never matter
  EXPECT_TRUE(m3::mxfp8_prescale_exact(x.data(), K, 0, 14));
  x[3] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(m3::mxfp8_prescale_exact(x.data(), K, 110, 126));
  x[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(m3::mxfp8_prescale_exact(x.data(), K, 110, 126));
  x[3] = std::numeric_limits<float>::denorm_min();  // scaled up: exact
  EXPECT_TRUE(m3::mxfp8_prescale_exact(x.data(), K, 8, 20));
  EXPECT_FALSE(m3::mxfp8_prescale_exact(x.data(), K, 7, 20));
  x[3] = 1.5f;
  EXPECT_TRUE(m3::mxfp8_prescale_exact(x.data(), K, 120, 134));   // 1.5 * 2^127, finite
  EXPECT_FALSE(m3::mxfp8_prescale_exact(x.data(), K, 120, 135));  // 2^128 is no float

  std::mt19937 rng(21);
  const int64_t N = 12, Kb = 256;
  // Codes 110..123 (copies of x scaled by 2^103 .. 2^116; block 0, element 5's, holds the largest)
  // and codes 2..15 (2^-5 .. 2^8; block 0 holds the smallest): the overflow and the underflow side.
  // make_matrix draws codes 120..133; `shift` moves them, block 0 of every row gets `block0`.
  auto coded = [&](int shift, uint8_t block0) {
    Mat mat = make_matrix(m3::LinearKind::MXFP8, N, Kb, rng);
    for (auto& c : mat.s) c = uint8_t(c + shift);
    for (int64_t n = 0; n < N; ++n) mat.s[n * (Kb / 32)] = block0;
    m3::set_scale_range(mat.lin);
    return mat;
  };
  Mat m = coded(-10, 123);
  ASSERT_EQ(m.lin.scale_lo, 110);
  ASSERT_EQ(m.lin.scale_hi, 123);
  Mat low = coded(-118, 2);
  ASSERT_EQ(low.lin.scale_lo, 2);
  ASSERT_EQ(low.lin.scale_hi, 15);
  Mat wide = make_matrix(m3::LinearKind::MXFP8, N, Kb, rng);
  for (size_t i = 0; i < wide.s.size(); i += 7) wide.s[i] = uint8_t(100 + i % 40);  // 40 codes: not taken
  m3::set_scale_range(wide.lin);
  // 35 codes up to kMxfp8PrescaleMaxCode: no copies of x either, but the decode step multiplies each
  // placed weight by 2^(code - 7) instead of widening through FP16.
  Mat wide134 = make_matrix(m3::LinearKind::MXFP8, N, Kb, rng);
  for (size_t i = 0; i < wide134.s.size(); ++i) wide134.s[i] = uint8_t(100 + (i * 13) % 35);
  m3::set_scale_range(wide134.lin);
  ASSERT_EQ(wide134.lin.scale_lo, 100);
  ASSERT_EQ(wide134.lin.scale_hi, m3::kMxfp8PrescaleMaxCode);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto same_bits = [](float a, float b) { return std::memcmp(&a, &b, 4) == 0 || (a != a && b != b); };
  const float low_bit = 1.0f + std::ldexp(1.0f, -23);  // a mantissa that rounding would change
  struct Case {
    const char* what;
    float x5;
    bool special;
  };
  // x5 * 2^(c - 7) for element 5's code c: the largest exact copy has exponent field 254 (high codes),
  // the smallest exact one field 1 (low codes; there the products underflow whatever the copy, so that
  // side shows bit-identity with low codes and placed subnormal weights more than the decision).
  const int chi = m.s[0] - 7, clo = low.s[0] - 7;
  const std::vector<Case> high_cases = {{"plain", 1.f, false},
                                        {"largest exact", std::ldexp(1.75f, 127 - chi), false},
                                        {"overflowing copy", std::ldexp(1.75f, 128 - chi), false},
                                        {"inf and NaN", 1.f, true}};
  const std::vector<Case> low_cases = {{"plain", 1.f, false},
                                       {"smallest exact", std::ldexp(low_bit, -126 - clo), false},
                                       {"subnormal copy", std::ldexp(low_bit, -127 - clo), false},
                                       {"inf and NaN", 1.f, true}};
  for (const char* isa : {"generic", "avx2", "avx512"}) {
    const m3::CpuOps* ops = m3::cpu_ops_for(isa);
    if (!ops) continue;
    for (const Mat* mat : {&m, &low, &wide, &wide134}) {
      for (const Case& c : mat == &low ? low_cases : high_cases) {
        std::vector<float> xx(2 * Kb);
        for (int64_t k = 0; k < Kb; ++k) xx[k] = nd(rng) * 1e-3f;
        xx[5] = c.x5;
        if (c.special) xx[7] = std::numeric_limits<float>::infinity(), xx[9] = std::nanf("");
        std::copy(xx.begin(), xx.begin() + Kb, xx.begin() + Kb);  // token 1 = token 0
        std::vector<float> y2(2 * N), y1(N), scratch(m3::kLinearTileRows * Kb);
        ops->linear_rows(mat->lin, xx.data(), 2, y2.data(), 0, N, scratch.data());
        ops->linear_rows(mat->lin, xx.data(), 1, y1.data(), 0, N, scratch.data());
        for (int64_t n = 0; n < N; ++n)
          EXPECT_TRUE(same_bits(y1[n], y2[n])) << isa << " " << c.what << " row " << n << ": " << y1[n] << " vs "
                                               << y2[n] << (mat == &wide ? " (wide codes)" : mat == &wide134 ? " (35 codes)" : "");
      }
    }
  }
}

// The 512-bit MXFP8 decode step of one token adds each block scale's exponent offset to the bits of x
// instead of multiplying every decoded weight: only where that equals x * 2^(c - 7) exactly (normal x,
// no zero, the scaled exponent field inside [1, 254] for every code). On either side of the decision
// the one-token result equals the two-token path's and the AVX2 build's bit for bit (the generic build
// sums in another order), over two tiles at once and a single last tile (12 rows), for the cases the
// decision turns on, with either byte placement of the avx512 step.
TEST(KernelsIsaMxfp8, ExponentShiftedActivationsExactOrNotTaken) {
  const int64_t K = 64;
  std::vector<float> x(K, -1.5f);
  EXPECT_TRUE(m3::mxfp8_x_shift_exact(x.data(), K, 120, 127));
  x[3] = 0.f;  // its bits plus an offset would read as a tiny nonzero value
  EXPECT_FALSE(m3::mxfp8_x_shift_exact(x.data(), K, 120, 127));
  x[3] = -0.f;
  EXPECT_FALSE(m3::mxfp8_x_shift_exact(x.data(), K, 120, 127));
  x[3] = std::numeric_limits<float>::denorm_min();  // exponent field 0: adding to it is no scaling
  EXPECT_FALSE(m3::mxfp8_x_shift_exact(x.data(), K, 120, 127));
  EXPECT_FALSE(m3::mxfp8_x_shift_exact(x.data(), K, 20, 27));
  x[3] = std::ldexp(1.0f, 7);  // field 134 + (127 - 7) = 254
  EXPECT_TRUE(m3::mxfp8_x_shift_exact(x.data(), K, 120, 127));
  EXPECT_FALSE(m3::mxfp8_x_shift_exact(x.data(), K, 120, 128));
  x[3] = std::ldexp(1.0f, -126 + 7);  // field 8 + (0 - 7) = 1
  EXPECT_TRUE(m3::mxfp8_x_shift_exact(x.data(), K, 0, 14));
  x[3] = std::ldexp(1.0f, -126 + 6);
  EXPECT_FALSE(m3::mxfp8_x_shift_exact(x.data(), K, 0, 14));
  EXPECT_TRUE(m3::mxfp8_x_shift_exact(x.data(), K, 1, 14));
  x[3] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(m3::mxfp8_x_shift_exact(x.data(), K, 110, 126));
  x[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(m3::mxfp8_x_shift_exact(x.data(), K, 110, 126));
  x[3] = 1.5f;
  EXPECT_TRUE(m3::mxfp8_x_shift_exact(x.data(), K, 120, 134));
  EXPECT_FALSE(m3::mxfp8_x_shift_exact(x.data(), K, 120, 135));  // 2^(135 - 7) is no float

  std::mt19937 rng(31);
  const int64_t N = 12, Kb = 256;
  Mat m = make_matrix(m3::LinearKind::MXFP8, N, Kb, rng);  // codes 120..133, random E4M3 bytes
  for (int64_t n = 0; n < N; ++n) m.s[n * (Kb / 32)] = 133;  // block 0 (element 5's) holds the largest
  m3::set_scale_range(m.lin);
  ASSERT_TRUE(m3::tile_rows(m.lin, m.w.data()));
  const int lo = m.lin.scale_lo, hi = m.lin.scale_hi;
  ASSERT_EQ(hi, 133);
  std::normal_distribution<float> nd(0.f, 1.f);
  // A zero x shifted would read as 2^-127 (times the weight's scale): lost next to activations near 1,
  // so the zero cases also run with every other activation near 2^-118, where it would show.
  struct Case {
    const char* what;
    float x5;
    bool taken;
    float rest = 1.f;  // the scale of the other activations
  };
  const float tiny = std::ldexp(1.f, -118);
  const std::vector<Case> cases = {{"plain", 0.75f, true},
                                   {"largest exact", std::ldexp(1.75f, 127 - (hi - 7)), true},
                                   {"overflowing", std::ldexp(1.75f, 128 - (hi - 7)), false},
                                   {"zero", 0.f, false},
                                   {"negative zero", -0.f, false},
                                   {"tiny, plain", tiny, true, tiny},
                                   {"tiny, zero", 0.f, false, tiny},
                                   {"tiny, negative zero", -0.f, false, tiny},
                                   {"subnormal", std::ldexp(1.25f, -130), false}};
  for (const Case& c : cases) {
    std::vector<float> xx(2 * Kb);
    for (int64_t k = 0; k < Kb; ++k) xx[k] = (nd(rng) * 0.01f + (k % 2 ? 0.5f : -0.5f)) * c.rest;  // no zeros
    xx[5] = c.x5;
    std::copy(xx.begin(), xx.begin() + Kb, xx.begin() + Kb);  // token 1 = token 0
    EXPECT_EQ(m3::mxfp8_x_shift_exact(xx.data(), Kb, lo, hi), c.taken) << c.what;
    std::vector<float> avx2;
    for (const char* isa : {"generic", "avx2", "avx512"})
      for (int form : {0, 1}) {  // the avx512 step's two byte placements (set_mxfp8_permute_form)
        const m3::CpuOps* ops = m3::cpu_ops_for(isa);
        if (!ops || (form == 1 && std::string(isa) != "avx512")) continue;
        m3::set_mxfp8_permute_form(form);
        std::vector<float> y2(2 * N), y1(N), scratch(m3::kLinearTileRows * Kb);
        ops->linear_rows(m.lin, xx.data(), 2, y2.data(), 0, N, scratch.data());
        ops->linear_rows(m.lin, xx.data(), 1, y1.data(), 0, N, scratch.data());
        m3::set_mxfp8_permute_form(-1);
        if (std::string(isa) == "avx2") avx2 = y1;
        for (int64_t n = 0; n < N; ++n) {
          EXPECT_EQ(std::memcmp(&y1[n], &y2[n], 4), 0) << isa << " form " << form << " " << c.what << " row " << n
                                                       << ": " << y1[n] << " vs two tokens " << y2[n];
          if (std::string(isa) == "avx512" && !avx2.empty()) {
            EXPECT_EQ(std::memcmp(&y1[n], &avx2[n], 4), 0) << "form " << form << " " << c.what << " row " << n << ": "
                                                           << y1[n] << " vs avx2 " << avx2[n];
          }
        }
      }
  }
}

// The NVFP4 decode step (one token) multiplies the E2M1 integers, placed in the top byte of each lane,
// by scales carrying a 2^-24; the result equals the batched path's bit for bit: with an odd number of
// blocks per row (the last block takes the unplaced decode), with scales near the bottom of the normal
// range, and with a global divisor so large that the 2^-24 would lose bits (the step then takes the
// general path). Each case also stays close to a double-precision reference.
TEST(KernelsIsaNvfp4, DecodeStepSameBitsAsBatched) {
  std::mt19937 rng(5);
  struct Case {
    const char* what;
    int64_t K;
    float global_div;
  };
  const std::vector<Case> cases = {{"even blocks", 256, 37.5f},
                                   {"odd blocks", 272, 37.5f},
                                   {"small scales", 256, std::ldexp(1.37f, 80)},
                                   {"scales below 2^-102", 256, std::ldexp(1.37f, 100)}};
  for (const Case& c : cases) {
    const int64_t N = 13, K = c.K;
    Mat m = make_matrix(m3::LinearKind::NVFP4, N, K, rng);
    m.lin.global_div = c.global_div;
    std::vector<float> x(2 * K);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (int64_t k = 0; k < K; ++k) x[k] = x[K + k] = nd(rng);
    std::vector<float> wf(N * K);
    m3::linear_decode_rows(m.lin, 0, N, wf.data());
    for (const char* isa : {"generic", "avx2", "avx512"}) {
      const m3::CpuOps* ops = m3::cpu_ops_for(isa);
      if (!ops) continue;
      std::vector<float> y1(N), y2(2 * N), scratch(m3::kLinearTileRows * K);
      ops->linear_rows(m.lin, x.data(), 1, y1.data(), 0, N, scratch.data());
      ops->linear_rows(m.lin, x.data(), 2, y2.data(), 0, N, scratch.data());
      for (int64_t n = 0; n < N; ++n) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          ref += double(x[k]) * wf[n * K + k];
          mag += std::fabs(double(x[k]) * wf[n * K + k]);
        }
        EXPECT_EQ(std::memcmp(&y1[n], &y2[n], 4), 0) << isa << " " << c.what << " row " << n << ": " << y1[n] << " vs "
                                                     << y2[n];
        EXPECT_NEAR(y1[n], ref, 4e-6 * mag + 1e-37) << isa << " " << c.what << " row " << n;
      }
    }
  }
}

// NVFP4 with int8 activations (the opt-in path): every ISA computes the same documented arithmetic
// bit for bit, whatever the number of tokens in the step; the result is the exact dot product of the
// int8-rounded activations with the weights (up to fp32 rounding), and its distance from the exact
// fp32 result stays within the rounding bound (half a quantisation step per element).
TEST(KernelsIsaInt8Act, IsasAgreeAndErrorWithinQuantisationBound) {
  std::mt19937 rng(11);
  const int64_t N = 37, K = 384, T = 8;  // token groups of 4 + 4 (AVX2) and 6 + 2 (AVX-512)
  Mat m = make_matrix(m3::LinearKind::NVFP4, N, K, rng);
  ASSERT_TRUE(m3::enable_int8_activations(m.lin));
  std::vector<float> x(T * K);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : x) v = nd(rng) * (1.f + 4.f * float(rng() % 2));  // blocks of unequal magnitude
  std::vector<float> wf(N * K);
  m3::linear_decode_rows(m.lin, 0, N, wf.data());
  // Reference: the quantised activations (round half to even of x * 127 / amax, per 16) in double.
  std::vector<double> ref_q(T * N), ref_exact(T * N), bound(T * N), mag(T * N);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double sq = 0, se = 0, b = 0, mg = 0;
      for (int64_t g = 0; g < K / 16; ++g) {
        float amax = 0;
        for (int64_t e = 0; e < 16; ++e) amax = std::max(amax, std::fabs(x[t * K + g * 16 + e]));
        const float id = 127.0f / amax, xs = amax / 127.0f;
        for (int64_t e = 0; e < 16; ++e) {
          const int64_t k = g * 16 + e;
          const double w = wf[n * K + k], xv = x[t * K + k];
          sq += double(std::nearbyint(float(xv) * id)) * double(xs) * w;
          se += xv * w;
          b += 0.5 * double(xs) * std::fabs(w);
          mg += std::fabs(xv * w);
        }
      }
      ref_q[t * N + n] = sq;
      ref_exact[t * N + n] = se;
      bound[t * N + n] = b;
      mag[t * N + n] = mg;
    }
  std::vector<float> first;
  for (const char* isa : {"generic", "avx2", "avx512"}) {
    const m3::CpuOps* ops = m3::cpu_ops_for(isa);
    if (!ops) continue;
    std::vector<float> y(T * N), scratch(m3::kLinearTileRows * K);
    ops->linear_rows(m.lin, x.data(), T, y.data(), 0, N, scratch.data());
    for (int64_t i = 0; i < T * N; ++i) {
      EXPECT_NEAR(y[i], ref_q[i], 1e-5 * mag[i]) << isa << " " << i;
      EXPECT_LE(std::fabs(y[i] - ref_exact[i]), bound[i] * 1.001 + 1e-5 * mag[i]) << isa << " " << i;
    }
    if (first.empty()) first = y;
    for (int64_t i = 0; i < T * N; ++i) EXPECT_EQ(y[i], first[i]) << isa << " differs from generic at " << i;
    for (int64_t t = 0; t < T; ++t) {  // the decode step's fused kernel: the same bits
      std::vector<float> y1(N);
      ops->linear_rows(m.lin, x.data() + t * K, 1, y1.data(), 0, N, scratch.data());
      for (int64_t n = 0; n < N; ++n) EXPECT_EQ(y1[n], y[t * N + n]) << isa << " row " << n << " token " << t;
    }
  }
  std::vector<float> y2(T * N);
  m3::linear_forward(m.lin, x.data(), T, y2.data());
  for (int64_t i = 0; i < T * N; ++i) EXPECT_EQ(y2[i], first[i]);
  // Not exact: the path must actually differ from the fp32 one somewhere.
  double diff = 0;
  for (int64_t i = 0; i < T * N; ++i) diff = std::max(diff, std::fabs(first[i] - ref_exact[i]) / mag[i]);
  EXPECT_GT(diff, 1e-5);
}

TEST(KernelsIsaInt8Act, OnlyNvfp4WithWholeGroups) {
  std::mt19937 rng(12);
  Mat a = make_matrix(m3::LinearKind::NVFP4, 8, 144, rng);  // 144 % 128 != 0
  EXPECT_FALSE(m3::enable_int8_activations(a.lin));
  EXPECT_FALSE(a.lin.act_int8);
  Mat b = make_matrix(m3::LinearKind::MXFP8, 8, 128, rng);
  EXPECT_FALSE(m3::enable_int8_activations(b.lin));
  Mat c = make_matrix(m3::LinearKind::NVFP4, 8, 256, rng);
  EXPECT_TRUE(m3::enable_int8_activations(c.lin));
}

}  // namespace

// The attention kernels (MSA index scan and one online-softmax key block) of every ISA build agree
// with a double-precision reference, for head counts and widths off the SIMD tile sizes.
namespace {

const char* kIsas[] = {"generic", "avx2", "avx512"};

TEST(KernelsIsaAttention, MaxDotsMatchReference) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const char* isa : kIsas) {
    const m3::CpuOps* ops = m3::cpu_ops_for(isa);
    if (!ops) continue;
    for (int H : {1, 3, 4, 5}) {
      for (int D : {128, 20}) {
        for (int64_t n : {1, 7, 128}) {
          const int64_t qs = D + 3, ks = D + 5;
          std::vector<float> q(H * qs), k(n * ks);
          for (auto& v : q) v = nd(rng);
          for (auto& v : k) v = nd(rng);
          std::vector<float> m(H, -1e30f);
          ops->max_dots(q.data(), qs, H, k.data(), ks, n, D, m.data());
          for (int h = 0; h < H; ++h) {
            double best = -1e300;
            for (int64_t j = 0; j < n; ++j) {
              double s = 0;
              for (int d = 0; d < D; ++d) s += double(q[h * qs + d]) * k[j * ks + d];
              best = std::max(best, s);
            }
            EXPECT_NEAR(m[h], best, 1e-4) << isa << " H=" << H << " D=" << D << " n=" << n;
          }
        }
      }
    }
  }
}

TEST(KernelsIsaAttention, AttnBlocksMatchReference) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const char* isa : kIsas) {
    const m3::CpuOps* ops = m3::cpu_ops_for(isa);
    if (!ops) continue;
    for (int H : {1, 4, 6}) {
      for (int D : {128, 36}) {
        const int64_t blocks[] = {128, 5, 64, 1};  // keys per block, visited in order
        int64_t N = 0;
        for (int64_t b : blocks) N += b;
        const int64_t qs = D + 1, ks = D + 2, vs = D + 4;
        std::vector<float> q(H * qs), K(N * ks), V(N * vs);
        for (auto& v : q) v = 2.f * nd(rng);
        for (auto& v : K) v = nd(rng);
        for (auto& v : V) v = nd(rng);
        const float scale = 1.0f / std::sqrt(float(D));
        std::vector<float> m(H, -std::numeric_limits<float>::infinity()), l(H, 0.f), acc(size_t(H) * D, 0.f),
            scratch(size_t(H) * (128 + 8));
        int64_t lo = 0;
        for (size_t b = 0; b < std::size(blocks); ++b) {  // each call is told the next block's K rows
          const int64_t n = blocks[b], n_next = b + 1 < std::size(blocks) ? blocks[b + 1] : 0;
          ops->attn_block(q.data(), qs, H, K.data() + lo * ks, ks, V.data() + lo * vs, vs, n, D, scale, m.data(),
                          l.data(), acc.data(), scratch.data(), n_next ? K.data() + (lo + n) * ks : nullptr, ks,
                          n_next);
          lo += n;
        }
        for (int h = 0; h < H; ++h) {
          std::vector<double> s(N);
          double mx = -1e300, sum = 0;
          for (int64_t j = 0; j < N; ++j) {
            double t = 0;
            for (int d = 0; d < D; ++d) t += double(q[h * qs + d]) * K[j * ks + d];
            s[j] = t * scale;
            mx = std::max(mx, s[j]);
          }
          for (auto& v : s) sum += v = std::exp(v - mx);
          for (int d = 0; d < D; ++d) {
            double o = 0;
            for (int64_t j = 0; j < N; ++j) o += s[j] * V[j * vs + d];
            EXPECT_NEAR(acc[h * D + d] / l[h], o / sum, 2e-6) << isa << " H=" << H << " D=" << D << " d=" << d;
          }
        }
      }
    }
  }
}

// The avx512 build's attention kernels (attention_avx512.h: two heads per vector for the scores, 16
// dimensions per vector for P·V) give the AVX2 build's bits: the index scan and block attention over
// fp32 and BF16 rows, for head counts whose groups of four take the 512-bit scores (4, 8) and others
// (6: a group of 2 on the AVX2 path), D = 128 and 136 (P·V slices of 48, 32 and 16, then 8), blocks
// of 128, 5 and 1 keys.
TEST(KernelsIsaAttention, Avx512SameBitsAsAvx2) {
  const m3::CpuOps *a2 = m3::cpu_ops_for("avx2"), *a5 = m3::cpu_ops_for("avx512");
  if (!a2 || !a5) GTEST_SKIP() << kNoAvx512;
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int H : {4, 6, 8})
    for (int D : {128, 136}) {
      const int64_t N = 128 + 5 + 1, qs = D + 8, ks = D + 16;
      std::vector<float> q(size_t(H * qs)), K(size_t(N * ks)), V(size_t(N * ks));
      for (auto& v : q) v = 2.f * nd(rng);
      for (auto& v : K) v = nd(rng);
      for (auto& v : V) v = nd(rng);
      std::vector<uint16_t> Kb(K.size()), Vb(V.size());
      for (size_t i = 0; i < K.size(); ++i) Kb[i] = m3::float_to_bf16(K[i]), Vb[i] = m3::float_to_bf16(V[i]);
      for (int bf16 = 0; bf16 < 2; ++bf16) {
        std::vector<float> mx2(size_t(H), -1e30f), mx5 = mx2;
        if (bf16) {
          a2->max_dots_bf16(q.data(), qs, H, Kb.data(), ks, N, D, mx2.data());
          a5->max_dots_bf16(q.data(), qs, H, Kb.data(), ks, N, D, mx5.data());
        } else {
          a2->max_dots(q.data(), qs, H, K.data(), ks, N, D, mx2.data());
          a5->max_dots(q.data(), qs, H, K.data(), ks, N, D, mx5.data());
        }
        EXPECT_EQ(std::memcmp(mx2.data(), mx5.data(), mx2.size() * 4), 0) << "max_dots H=" << H << " D=" << D << " bf16=" << bf16;
        std::vector<float> out[2];
        for (int w = 0; w < 2; ++w) {
          const m3::CpuOps* ops = w ? a5 : a2;
          std::vector<float> m(size_t(H), -std::numeric_limits<float>::infinity()), l(size_t(H), 0.f),
              acc(size_t(H) * D, 0.f), scratch(size_t(H) * (128 + 8));
          int64_t lo = 0;
          for (int64_t n : {128, 5, 1}) {
            if (bf16)
              ops->attn_block_bf16(q.data(), qs, H, Kb.data() + lo * ks, ks, Vb.data() + lo * ks, ks, n, D, 0.09f,
                                   m.data(), l.data(), acc.data(), scratch.data(), nullptr, 0, 0);
            else
              ops->attn_block(q.data(), qs, H, K.data() + lo * ks, ks, V.data() + lo * ks, ks, n, D, 0.09f, m.data(),
                              l.data(), acc.data(), scratch.data(), nullptr, 0, 0);
            lo += n;
          }
          out[w] = acc;
          out[w].insert(out[w].end(), m.begin(), m.end());
          out[w].insert(out[w].end(), l.begin(), l.end());
        }
        for (size_t i = 0; i < out[0].size(); ++i)
          ASSERT_EQ(std::memcmp(&out[0][i], &out[1][i], 4), 0)
              << "attn_block H=" << H << " D=" << D << " bf16=" << bf16 << " value " << i << ": " << out[0][i]
              << " vs " << out[1][i];
      }
    }
}

// The BF16 variants (reading a BF16 cache in place) give exactly the fp32 kernels' results on the
// widened rows, in every ISA build, including off-tile head counts, widths and key counts.
TEST(KernelsIsaAttention, Bf16KernelsEqualFp32KernelsOnWidenedRows) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const char* isa : kIsas) {
    const m3::CpuOps* ops = m3::cpu_ops_for(isa);
    if (!ops) continue;
    for (int H : {1, 4, 6, 8}) {
      for (int D : {128, 36}) {
        for (int64_t n : {1, 5, 128}) {
          const int64_t qs = D + 1, ks = D + 6;
          std::vector<float> q(size_t(H * qs));
          for (auto& v : q) v = nd(rng);
          std::vector<uint16_t> kb(size_t(n * ks)), vb(size_t(n * ks));
          std::vector<float> kf(kb.size()), vf(vb.size());
          for (size_t i = 0; i < kb.size(); ++i) {
            kb[i] = m3::float_to_bf16(nd(rng));
            vb[i] = m3::float_to_bf16(nd(rng));
            kf[i] = m3::bf16_to_float(kb[i]);
            vf[i] = m3::bf16_to_float(vb[i]);
          }
          std::vector<float> m1(size_t(H), -1e30f), m2 = m1;
          ops->max_dots(q.data(), qs, H, kf.data(), ks, n, D, m1.data());
          ops->max_dots_bf16(q.data(), qs, H, kb.data(), ks, n, D, m2.data());
          EXPECT_EQ(m1, m2) << isa << " max_dots H=" << H << " D=" << D << " n=" << n;

          const float scale = 0.1f;
          std::vector<float> ma(size_t(H), -std::numeric_limits<float>::infinity()), la(size_t(H), 0.f),
              acca(size_t(H) * D, 0.f), scr(size_t(H) * (128 + 8));
          std::vector<float> mb = ma, lb = la, accb = acca;
          for (int rep = 0; rep < 2; ++rep) {  // two blocks: the rescale path too
            ops->attn_block(q.data(), qs, H, kf.data(), ks, vf.data(), ks, n, D, scale, ma.data(), la.data(),
                            acca.data(), scr.data(), rep == 0 ? kf.data() : nullptr, ks, n);
            ops->attn_block_bf16(q.data(), qs, H, kb.data(), ks, vb.data(), ks, n, D, scale, mb.data(), lb.data(),
                                 accb.data(), scr.data(), rep == 0 ? kb.data() : nullptr, ks, n);
          }
          EXPECT_EQ(ma, mb) << isa << " attn_block H=" << H << " D=" << D << " n=" << n;
          EXPECT_EQ(la, lb) << isa << " attn_block H=" << H << " D=" << D << " n=" << n;
          EXPECT_EQ(acca, accb) << isa << " attn_block H=" << H << " D=" << D << " n=" << n;
        }
      }
    }
  }
}

// The index scan of several tokens at once (prefill tiles) gives each token the bits of its own scan,
// in every ISA build: 1..6 tokens (the avx512 build's passes of 4 and their tails), head counts on
// and off the 4-head groups, widths on and off the 8-element steps, key-count tails, running maxima
// that start above some scores.
TEST(KernelsIsaAttention, MultiTokenIndexScanSameBitsAsEachToken) {
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.f, 1.f);
  int checked = 0;
  for (const char* isa : kIsas) {
    const m3::CpuOps* ops = m3::cpu_ops_for(isa);
    if (!ops) continue;
    for (int H : {4, 8, 3})
      for (int D : {128, 36})
        for (int64_t n : {1, 5, 128})
          for (int Q = 1; Q <= 6; ++Q) {
            const int64_t qs = D + 4, ks = D + 8;
            std::vector<float> q(size_t(Q) * H * qs);
            for (auto& v : q) v = nd(rng);
            std::vector<uint16_t> k(size_t(n * ks));
            for (auto& v : k) v = m3::float_to_bf16(nd(rng));
            std::vector<float> want(size_t(Q) * H), got;
            for (size_t i = 0; i < want.size(); ++i) want[i] = i % 3 == 0 ? 2.0f : -1e30f;
            got = want;
            std::vector<const float*> qp(static_cast<size_t>(Q));
            std::vector<float*> mp(static_cast<size_t>(Q));
            for (int i = 0; i < Q; ++i) {
              ops->max_dots_bf16(q.data() + size_t(i) * H * qs, qs, H, k.data(), ks, n, D, want.data() + i * H);
              qp[size_t(i)] = q.data() + size_t(i) * H * qs;
              mp[size_t(i)] = got.data() + i * H;
            }
            ops->max_dots_bf16_multi(Q, qp.data(), qs, H, k.data(), ks, n, D, mp.data());
            ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0)
                << isa << " H=" << H << " D=" << D << " n=" << n << " Q=" << Q;
            ++checked;
          }
  }
  EXPECT_GT(checked, 0);
}

// rms_norm_rows (prefill rows and per-head norms, four rows' sums at once) gives each row the bits
// of rms_norm on that row alone: any row count (full groups of four and tails), strided rows, in
// place and not, rows whose magnitudes differ by many powers of two.
TEST(ElementwiseRmsNormRows, SameBitsAsOneRowAtATime) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t n : {128, 2048, 37}) {
    std::vector<float> g1p(static_cast<size_t>(n));
    for (auto& g : g1p) g = 1.0f + 0.1f * nd(rng);
    for (int64_t rows = 0; rows <= 9; ++rows) {
      const int64_t xs = n + 3;  // rows further apart than their length
      std::vector<float> x(size_t(rows * xs));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < n; ++i) x[size_t(r * xs + i)] = nd(rng) * std::ldexp(1.0f, int(r * 7 % 41) - 20);
      std::vector<float> want(size_t(rows * n)), got(size_t(rows * n)), inplace = x;
      for (int64_t r = 0; r < rows; ++r) m3::rms_norm(&x[size_t(r * xs)], g1p.data(), n, 1e-6f, &want[size_t(r * n)]);
      m3::rms_norm_rows(x.data(), xs, g1p.data(), n, rows, 1e-6f, got.data(), n);
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4)) << "n=" << n << " rows=" << rows;
      m3::rms_norm_rows(inplace.data(), xs, g1p.data(), n, rows, 1e-6f, inplace.data(), xs);
      for (int64_t r = 0; r < rows; ++r)
        EXPECT_EQ(0, std::memcmp(&want[size_t(r * n)], &inplace[size_t(r * xs)], size_t(n) * 4))
            << "in place, n=" << n << " rows=" << rows << " row " << r;
    }
  }
}

}  // namespace
