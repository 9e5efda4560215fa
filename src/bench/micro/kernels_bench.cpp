// Google Benchmark micro-benchmarks of the CPU matmul kernels, per weight format: one decode-step
// matrix-vector product (T = 1) and a batched product (T = 8), on a matrix that stays in cache
// ("hot": measures the kernel's compute rate) and on a set of matrices larger than the last-level
// cache visited in turn ("cold": measures how close the kernel gets to memory bandwidth); and the
// decode kernel alone on one thread with its matrix in cache (BM_linear_resident: cost per weight);
// and the matrix products of a 512-token prefill as the model issues them (BM_prefill_products).
// The matrices are tiled as the engine holds weights read into memory (tile_rows), with quantiser-like
// scale codes. Bytes processed are the weight bytes read (Linear::bytes()). Not part of `make test`:
// `make bench-kernels` builds and runs it.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/linear.h"
#include "model/attention.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "engine/kv_format.h"
#include "engine/kv_pool.h"

namespace {

using m3::Linear;
using m3::LinearKind;

// Random weights with realistic scale codes (finite E4M3 / E8M0 values near 1).
struct Matrix {
  std::vector<uint8_t> w, s;
  Linear L;
  Matrix(LinearKind kind, int64_t N, int64_t K, uint32_t seed) {
    std::mt19937 rng(seed);
    L.kind = kind;
    L.N = N;
    L.K = K;
    size_t wb = 0, sb = 0;
    switch (kind) {
      case LinearKind::BF16: wb = size_t(N * K * 2); break;
      case LinearKind::MXFP8: wb = size_t(N * K); sb = size_t(N * K / 32); break;
      case LinearKind::NVFP4: wb = size_t(N * K / 2); sb = size_t(N * K / 16); break;
      default: break;
    }
    w.resize(wb);
    s.resize(sb);
    for (auto& b : w) b = uint8_t(rng());
    if (kind == LinearKind::BF16)  // keep values finite: exponent byte near 0x3f
      for (size_t i = 1; i < w.size(); i += 2) w[i] = uint8_t(0x3c + (w[i] & 3) + (w[i] & 0x80));
    if (kind == LinearKind::MXFP8)  // no NaN codes, and no subnormal codes: quantised weights hold about
                                    // 1e-4 of them (the mid model 8e-5), random bytes 6%, which an Intel
                                    // CPU's multiply takes through a microcode assist (see Mxfp8Tile)
      for (size_t i = 0; i < w.size(); ++i) {
        if ((w[i] & 0x7f) == 0x7f) w[i] = 0x7e;
        if ((w[i] & 0x78) == 0 && (w[i] & 7) != 0) w[i] |= 0x08;
      }
    // MXFP8 block scales as a quantiser leaves them: two neighbouring codes (the mid model's matrices
    // hold 2 codes in 99.9% of their blocks, 3-4 in all), which decides how many scaled copies of x
    // the AVX2 decode step keeps (one per code).
    for (auto& b : s) b = kind == LinearKind::MXFP8 ? uint8_t(121 + (rng() % 3 == 0)) : uint8_t(0x30 + rng() % 16);
    L.w = w.data();
    L.scales = s.empty() ? nullptr : s.data();
    L.global_div = 1.0f;
    m3::set_scale_range(L);
  }
  // As the engine holds weights read into memory: int8-activation matrices first (they stay
  // row-major), then the 4-row tile layout for the rest (Weights::tile_for_decode).
  void hold_as_engine(bool int8_act, bool bf16_act = false) {
    if (int8_act) m3::enable_int8_activations(L);
    if (bf16_act) m3::enable_bf16_activations(L);
    m3::tile_rows(L, w.data());
  }
};

// n activations drawn from N(0, 1) with a fixed seed (the same x in every matmul benchmark).
std::vector<float> normal_x(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  return x;
}

constexpr int64_t kK = 2048;

// state.range(0): weight kind; range(1): T; range(2): 1 = cold (matrices > LLC), 0 = hot.
constexpr int64_t kNvfp4Int8 = 100;  // range(0) value: NVFP4 with int8 activations (opt-in path)
constexpr int64_t kMxfp8Bf16 = 101;  // range(0) value: MXFP8 with BF16 activations (opt-in path)
constexpr int64_t kNvfp4Bf16 = 102;  // range(0) value: NVFP4 with BF16 activations (opt-in path)
constexpr int64_t kBf16Packed = 103;  // range(0) value: BF16 tiled and packed as the lm_head (pack_bf16_tiles / _nibbles)

// A matmul benchmark's range(0): a LinearKind, kNvfp4Int8, kMxfp8Bf16 or kNvfp4Bf16 (BM_linear_resident
// also kBf16Packed).
struct KindArg {
  LinearKind kind;
  bool int8_act, bf16_act;
  explicit KindArg(int64_t arg)
      : kind(arg == kNvfp4Int8 || arg == kNvfp4Bf16 ? LinearKind::NVFP4
             : arg == kMxfp8Bf16                    ? LinearKind::MXFP8
                                                    : LinearKind(arg)),
        int8_act(arg == kNvfp4Int8),
        bf16_act(arg == kMxfp8Bf16 || arg == kNvfp4Bf16) {}
  std::string name() const {
    return std::string(m3::linear_kind_name(kind)) + (int8_act ? " int8-act" : "") + (bf16_act ? " bf16-act" : "");
  }
};

void BM_linear(benchmark::State& state) {
  const KindArg kind(state.range(0));
  const int64_t T = state.range(1);
  const bool cold = state.range(2) != 0;
  const int64_t N = 512;  // 0.5-2 MiB per matrix: stays in L2/L3 when hot
  const int count = cold ? 64 : 1;
  std::vector<Matrix> mats;
  mats.reserve(size_t(count));
  for (int i = 0; i < count; ++i) {
    mats.emplace_back(kind.kind, N, kK, uint32_t(i + 1));
    mats.back().hold_as_engine(kind.int8_act, kind.bf16_act);
  }
  const std::vector<float> x = normal_x(T * kK);
  std::vector<float> y(size_t(T * N));
  int i = 0;
  for (auto _ : state) {
    m3::linear_forward(mats[size_t(i)].L, x.data(), T, y.data());
    benchmark::DoNotOptimize(y.data());
    i = (i + 1) % count;
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(mats[0].L.bytes()));
  state.counters["threads"] = omp_get_max_threads();
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(N) * double(kK) * double(T) * double(state.iterations()),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.SetLabel(kind.name() + (cold ? " cold" : " hot") + " isa=" + m3::cpu_ops().name);
}

void kinds(benchmark::internal::Benchmark* b) {
  for (int64_t k : {int64_t(LinearKind::BF16), int64_t(LinearKind::MXFP8), int64_t(LinearKind::NVFP4), kNvfp4Int8,
                    kMxfp8Bf16, kNvfp4Bf16})
    for (int64_t T : {1, 8, 16, 64, 128})
      for (int cold : {0, 1})
        if (T < 64 || !cold) b->Args({k, T, cold});  // T = 64: a prefill expert's tokens; 128: a prefill chunk (compute-bound)
}
BENCHMARK(BM_linear)->Apply(kinds)->UseRealTime();

// The decode kernels' own rate: one token over a matrix that stays in cache, range(1) rows (128: in L2,
// 512 KiB for BF16; 8: BF16 in L1, 32 KiB, where the per-call set-up of the quantised formats, such as
// the scan of x, weighs more), on the calling thread only (CpuOps::linear_rows, no OpenMP region). Its
// weights/s against the core clock gives the cycles per weight a format's decode costs; where that rate
// times the bytes per weight is below the memory read bandwidth one core gets, the decode step is bound
// by instructions, not by memory. range(0) = kBf16Packed: BF16 as the decode step reads the lm_head
// (tiled and packed, pack_bf16_tiles / pack_bf16_nibbles; bytes/s counts the packed bytes).
void BM_linear_resident(benchmark::State& state) {
  const bool packed = state.range(0) == kBf16Packed;
  const KindArg kind(packed ? int64_t(LinearKind::BF16) : state.range(0));
  const int64_t N = state.range(1);
  Matrix m(kind.kind, N, kK, 3);
  m.hold_as_engine(kind.int8_act, kind.bf16_act);
  m3::AlignedVector<uint8_t> pack;
  if (packed && !m3::pack_bf16_for_decode(m.L, pack))
    state.SkipWithError("not packable");
  const std::vector<float> x = normal_x(kK);
  std::vector<float> y(static_cast<size_t>(N)), scratch(static_cast<size_t>(m3::kLinearTileRows * kK));
  const m3::CpuOps& ops = m3::cpu_ops();
  for (auto _ : state) {
    ops.linear_rows(m.L, x.data(), 1, y.data(), 0, N, scratch.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(m.L.decode_bytes()));
  state.counters["weights/s"] = benchmark::Counter(double(N) * double(kK) * double(state.iterations()),
                                                   benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.SetLabel(kind.name() + (packed ? " packed" : "") + " isa=" + ops.name);
}
BENCHMARK(BM_linear_resident)
    ->ArgsProduct({{int64_t(LinearKind::BF16), int64_t(LinearKind::MXFP8), int64_t(LinearKind::NVFP4), kNvfp4Int8,
                    kMxfp8Bf16, kNvfp4Bf16, kBf16Packed},
                   {128, 8}})
    ->UseRealTime();

// One linear_forward_many call over matrices of the given row counts (K wide, weights held as the engine
// holds them), all reading the same T tokens' activations, timed with its GFLOP/s.
void run_products(benchmark::State& state, LinearKind kind, int64_t K, int64_t T, const std::vector<int64_t>& rows,
                  bool bf16_act, const std::string& label) {
  std::vector<Matrix> mats;
  mats.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    mats.emplace_back(kind, rows[i], K, uint32_t(100 + i));
    mats.back().hold_as_engine(false, bf16_act);
  }
  const std::vector<float> x = normal_x(T * K);
  std::vector<std::vector<float>> y;
  std::vector<m3::LinearJob> jobs;
  double flops = 0;
  for (Matrix& m : mats) {
    y.emplace_back(size_t(T * m.L.N));
    jobs.push_back({&m.L, x.data(), T, y.back().data()});
    flops += 2.0 * double(m.L.N) * double(K) * double(T);
  }
  for (auto _ : state) {
    m3::linear_forward_many(jobs.data(), int(jobs.size()));
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * double(state.iterations()), benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.SetLabel(label + " isa=" + m3::cpu_ops().name);
}

// The matrix products of a 512-token prefill of the mid preset, as the model issues them (one
// linear_forward_many per group, weights tiled as read into memory): range(0) = 0: the attention's
// q projection (MXFP8 2048 x 2048, 512 tokens); 1: the routed experts' gate and up products (32
// experts x 2 NVFP4 matrices of 512 x 2048, 64 tokens each: 512 tokens x top-4 spread evenly); 2:
// their down products (32 NVFP4 matrices of 2048 x 512, 64 tokens each). range(1) = 1: with BF16
// activations (--mxfp8-activations bf16 / --nvfp4-activations bf16).
void BM_prefill_products(benchmark::State& state) {
  // The products of a 512-token mid prefill as the model issues them: one linear_forward_many call
  // over matrices of the given row counts, all reading the same T tokens' activations (K wide).
  struct Case {
    const char* label;
    LinearKind kind;
    int64_t K, T;
    std::vector<int64_t> rows;  // one entry per matrix
  };
  static const Case cases[] = {
      {"q projection", LinearKind::MXFP8, 2048, 512, {2048}},
      {"experts gate+up", LinearKind::NVFP4, 2048, 64, std::vector<int64_t>(64, 512)},
      {"experts down", LinearKind::NVFP4, 512, 64, std::vector<int64_t>(32, 2048)},
      {"dense gate+up", LinearKind::MXFP8, 2048, 512, {6144, 6144}},
      {"dense down", LinearKind::MXFP8, 6144, 512, {2048}},
      {"q k v index-q index-k", LinearKind::MXFP8, 2048, 512, {2048, 512, 512, 512, 128}},
  };
  const Case& c = cases[state.range(0)];
  run_products(state, c.kind, c.K, c.T, c.rows, state.range(1) != 0,
               std::string(c.label) + (state.range(1) ? " bf16-act" : ""));
}
BENCHMARK(BM_prefill_products)->ArgsProduct({benchmark::CreateDenseRange(0, 5, 1), {0, 1}})->UseRealTime();

// The routed experts' products at the token counts a chunked prefill step gives each expert (a chunk
// of C tokens over 32 experts at top-4: C / 8 each): range(0) = 0: gate and up (64 NVFP4 matrices of
// 512 x 2048), 1: down (32 of 2048 x 512); range(1) = tokens per expert.
void BM_expert_products(benchmark::State& state) {
  const bool down = state.range(0) != 0;
  run_products(state, LinearKind::NVFP4, down ? 512 : 2048, state.range(1),
               std::vector<int64_t>(down ? 32 : 64, down ? 2048 : 512), false,
               down ? "experts down" : "experts gate+up");
}
BENCHMARK(BM_expert_products)->ArgsProduct({{0, 1}, {1, 4, 8, 11, 12, 16, 24, 32, 48, 64, 128}})->UseRealTime();

// The mid preset's attention and index projections (MXFP8, 2048 wide: q 2048, k, v, index-q 512
// rows each, index-k 128) at the few tokens of a decode batch or a verification step (range(0)).
void BM_mxfp8_few_tokens(benchmark::State& state) {
  run_products(state, LinearKind::MXFP8, 2048, state.range(0), {2048, 512, 512, 512, 128}, false,
               "q k v index-q index-k");
}
BENCHMARK(BM_mxfp8_few_tokens)->Arg(1)->Arg(2)->Arg(3)->Arg(4)->Arg(6)->Arg(8)->Arg(12)->UseRealTime();

// The mid preset's lm_head: one BF16 matrix of 32768 x 2048 (134 MB, larger than the last-level
// cache): the largest single read of a decode step. range(0): 0 = row-major bytes, 1 = tiled for
// decode (as weights read into memory), 2 = tiled and packed as this ISA's decode step reads it
// (pack_bf16_tiles for avx512, pack_bf16_nibbles for avx2; bytes/s counts the packed bytes), 3 = an
// MXFP8 matrix of the same shape (the DSpark draft's copy, draft_weights "mxfp8"), 4 = the same on BF16
// activations (the copy under draft_activations "bf16"); range(1): tokens (a verification step's rows,
// the DSpark draft pass's drafted slots).
void BM_lm_head(benchmark::State& state) {
  const bool mx = state.range(0) >= 3;
  Matrix m(mx ? LinearKind::MXFP8 : LinearKind::BF16, 32768, kK, 9);
  m3::AlignedVector<uint8_t> packed;
  if (mx) m.hold_as_engine(false, state.range(0) == 4);
  else if (state.range(0) >= 1) m3::tile_rows(m.L, m.w.data());
  if (state.range(0) == 2 && !m3::pack_bf16_for_decode(m.L, packed))
    state.SkipWithError("not packable");
  const int64_t T = state.range(1);
  const std::vector<float> x = normal_x(T * kK);
  std::vector<float> y(size_t(32768 * T));
  for (auto _ : state) {
    m3::linear_forward(m.L, x.data(), T, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(m.L.decode_bytes()));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * 32768 * double(kK) * double(T) * double(state.iterations()),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.SetLabel(state.range(0) == 0 ? "row-major" : state.range(0) == 1 ? "tiled" : state.range(0) == 2 ? "tiled + packed" : state.range(0) == 3 ? "mxfp8" : "mxfp8 bf16-act");
}
BENCHMARK(BM_lm_head)->ArgsProduct({{0, 1, 2}, {1}})->ArgsProduct({{2, 3, 4}, {1, 2, 3, 4, 7, 8, 16, 32}})->UseRealTime();

// Plain read bandwidth over the same cold footprint (the ceiling for the cold rows above).
void BM_read_bandwidth(benchmark::State& state) {
  std::vector<float> buf(size_t(64) << 20);  // 64 Mi floats = 256 MiB
  for (size_t j = 0; j < buf.size(); ++j) buf[j] = float(j & 7);
  for (auto _ : state) {
    float total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static)
    for (int64_t j = 0; j < int64_t(buf.size()); j += 16) total += buf[size_t(j)] + buf[size_t(j + 8)];
    benchmark::DoNotOptimize(total);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(buf.size() * 4));
}
BENCHMARK(BM_read_bandwidth)->UseRealTime();


// Attention kernels on one 128-key block (single thread, hot): MSA index scan (4 index heads x
// 128 dims) and one block of online-softmax attention (4 query heads of a GQA group, head dim 128).
// range(0): key row stride in floats (128 = contiguous rows, 512 = one group of 4 interleaved).
void BM_max_dots(benchmark::State& state) {
  const int64_t ks = state.range(0), n = 128;
  const int H = 4, D = 128;
  std::vector<float> q(size_t(H * D)), k(size_t(n * ks)), m(static_cast<size_t>(H));
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (auto& v : q) v = nd(rng);
  for (auto& v : k) v = nd(rng);
  const m3::CpuOps& ops = m3::cpu_ops();
  for (auto _ : state) {
    for (auto& v : m) v = -1e30f;
    ops.max_dots(q.data(), D, H, k.data(), ks, n, D, m.data());
    benchmark::DoNotOptimize(m.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * n * D * 4);
}
BENCHMARK(BM_max_dots)->Arg(128)->Arg(512);

// The same scan and block over paged-cache rows read in place: range(0) 1 = BF16, 2 = FP8, 3 = NVFP4
// (the recipe's --kv-cache-dtype / indexer_kv_dtype), 128 contiguous rows of 128 elements.
struct CacheRows {
  m3::KVDtype dt;
  size_t rb;
  std::vector<uint8_t> k, v;
  std::vector<float> q;
  explicit CacheRows(int64_t kind, int64_t n, int H, int D)
      : dt(kind == 1 ? m3::KVDtype::BF16 : kind == 2 ? m3::KVDtype::FP8 : m3::KVDtype::NVFP4),
        rb(m3::kv_row_bytes(dt, D)), k(rb * size_t(n)), v(k.size()), q(size_t(H) * size_t(D)) {
    std::mt19937 rng(6);
    std::normal_distribution<float> nd;
    std::vector<float> x(static_cast<size_t>(D));
    for (int64_t j = 0; j < n; ++j) {
      for (auto& e : x) e = nd(rng);
      m3::kv_encode_row(dt, x.data(), D, 1.0f, k.data() + size_t(j) * rb);
      for (auto& e : x) e = nd(rng);
      m3::kv_encode_row(dt, x.data(), D, 1.0f, v.data() + size_t(j) * rb);
    }
    for (auto& e : q) e = nd(rng);
  }
  const char* label() const { return m3::kv_dtype_name(dt); }
};

void BM_max_dots_cache(benchmark::State& state) {
  const int64_t n = 128;
  const int H = 4, D = 128;
  CacheRows c(state.range(0), n, H, D);
  std::vector<float> m(static_cast<size_t>(H));
  const m3::CpuOps& ops = m3::cpu_ops();
  const auto* kb = reinterpret_cast<const uint16_t*>(c.k.data());
  for (auto _ : state) {
    for (auto& x : m) x = -1e30f;
    if (c.dt == m3::KVDtype::BF16)
      ops.max_dots_bf16(c.q.data(), D, H, kb, D, n, D, m.data());
    else
      ops.max_dots_rows(c.dt, c.q.data(), D, H, c.k.data(), int64_t(c.rb), n, D, m.data());
    benchmark::DoNotOptimize(m.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * n);
  state.SetLabel(c.label());
}
BENCHMARK(BM_max_dots_cache)->Arg(1)->Arg(2)->Arg(3);

void BM_attn_block_cache(benchmark::State& state) {
  const int64_t n = 128;
  const int H = 4, D = 128;
  CacheRows c(state.range(0), n, H, D);
  std::vector<float> m(static_cast<size_t>(H)), l(static_cast<size_t>(H)), acc(size_t(H * D)), scratch(size_t(H * (n + 8)));
  const m3::CpuOps& ops = m3::cpu_ops();
  for (auto _ : state) {
    for (int h = 0; h < H; ++h) m[size_t(h)] = -std::numeric_limits<float>::infinity(), l[size_t(h)] = 0;
    if (c.dt == m3::KVDtype::BF16)
      ops.attn_block_bf16(c.q.data(), D, H, reinterpret_cast<const uint16_t*>(c.k.data()), D,
                          reinterpret_cast<const uint16_t*>(c.v.data()), D, n, D, 0.088f, m.data(), l.data(), acc.data(),
                          scratch.data(), nullptr, 0, 0);
    else
      ops.attn_block_rows(c.dt, c.q.data(), D, H, c.k.data(), int64_t(c.rb), c.v.data(), int64_t(c.rb), n, D, 0.088f,
                          m.data(), l.data(), acc.data(), scratch.data(), nullptr, 0, 0);
    benchmark::DoNotOptimize(acc.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * n);
  state.SetLabel(c.label());
}
BENCHMARK(BM_attn_block_cache)->Arg(1)->Arg(2)->Arg(3);

void BM_attn_block(benchmark::State& state) {
  const int64_t ks = state.range(0), n = 128;
  const int H = 4, D = 128;
  std::vector<float> q(size_t(H * D)), k(size_t(n * ks)), v(size_t(n * ks)), m(static_cast<size_t>(H)), l(static_cast<size_t>(H)),
      acc(size_t(H * D)), scratch(size_t(H * (n + 8)));
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  for (auto& x : q) x = nd(rng);
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  const m3::CpuOps& ops = m3::cpu_ops();
  for (auto _ : state) {
    for (int h = 0; h < H; ++h) m[size_t(h)] = -std::numeric_limits<float>::infinity(), l[size_t(h)] = 0;
    ops.attn_block(q.data(), D, H, k.data(), ks, v.data(), ks, n, D, 0.088f, m.data(), l.data(), acc.data(),
                   scratch.data(), nullptr, 0, 0);
    benchmark::DoNotOptimize(acc.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * n * D * 4 * 2);
}
BENCHMARK(BM_attn_block)->Arg(128)->Arg(512);

// One decode step's attention for one layer of the `mid` preset shapes (16 heads / 4 KV heads x 128,
// 4 index heads x 128, MSA blocks of 128, top-16), all threads: the index scan, block selection
// and block-sparse attention over a random cache. range(0): context length (512: every block
// visible; 16384: scan of 128 blocks + 16 selected; K/V then exceed the last-level cache);
// range(1): 0 = fp32 SeqCache, 1 = the engine's paged BF16 cache (read in place), 2 = paged NVFP4 K/V and
// index keys (the recipe's --kv-cache-dtype nvfp4 / indexer_kv_dtype nvfp4), 3 = paged FP8 K/V and index
// keys; range(2): 1 = a dense layer; range(3): 1 = cold, every step after reading 1 GiB of other data
// (as in a real decode step, where the weights and the other layers' K/V pass through the caches
// between two visits of a layer; this CPU's last-level cache is 480 MB).
void BM_attention_decode(benchmark::State& state) {
  const int64_t ctx = state.range(0);
  const char* config_json = R"({"architectures": ["MiniMaxM3SparseForCausalLM"],
    "model_type": "minimax_m3", "hidden_size": 2048, "intermediate_size": 512, "num_hidden_layers": 1,
    "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 32768,
    "max_position_embeddings": 1048576, "rms_norm_eps": 1e-06, "rope_theta": 5000000, "rotary_dim": 64,
    "hidden_act": "swigluoai", "use_qk_norm": true, "dense_intermediate_size": 6144, "shared_intermediate_size": 512,
    "num_local_experts": 32, "num_experts_per_tok": 4, "n_shared_experts": 1, "scoring_func": "sigmoid",
    "use_routing_bias": true, "moe_layer_freq": [0], "qk_norm_type": "per_head", "swiglu_alpha": 1.702,
    "swiglu_limit": 7.0, "routed_scaling_factor": 2.0, "torch_dtype": "bfloat16",
    "sparse_attention_config": {"use_sparse_attention": true, "sparse_index_dim": 128, "sparse_num_index_heads": 4,
      "sparse_topk_blocks": 16, "sparse_block_size": 128, "sparse_disable_index_value": [1], "sparse_score_type": "max",
      "sparse_init_block": 1, "sparse_local_block": 1, "sparse_attention_freq": [SPARSE]}})";
  const bool dense = state.range(2) != 0;  // a dense layer (M3's layer 0): every key is read
  const std::string json = std::regex_replace(config_json, std::regex("SPARSE"), dense ? "0" : "1");
  const m3::ModelConfig c = m3::ModelConfig::from_json_text(json, "kernels_bench");
  const bool paged = state.range(1) != 0, quantised = state.range(1) >= 2;
  const m3::KVDtype kvd = state.range(1) == 2   ? m3::KVDtype::NVFP4
                          : state.range(1) == 3 ? m3::KVDtype::FP8
                                                : m3::KVDtype::BF16;
  m3::SeqCache seq_cache(c, paged ? 1 : ctx + 1);
  const int B = 128;
  std::vector<int32_t> table(size_t((ctx + 1 + B - 1) / B));
  for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
  m3::KVPool pool(c, B, kvd, kvd, paged ? int64_t(table.size()) : 1);
  m3::PagedKV paged_cache(pool, table, ctx + 1);
  m3::KVView& cache = paged ? static_cast<m3::KVView&>(paged_cache) : static_cast<m3::KVView&>(seq_cache);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int64_t kvw = int64_t(c.n_kv_heads) * c.head_dim, qw = int64_t(c.n_heads) * c.head_dim;
  std::vector<float> k(static_cast<size_t>(kvw)), v(static_cast<size_t>(kvw)), ik(static_cast<size_t>(c.index_dim));
  for (int64_t p = 0; p <= ctx; ++p) {
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (auto& x : ik) x = nd(rng);
    cache.store(0, p, k.data(), v.data(), ik.data());
  }
  seq_cache.n_tokens = ctx + 1;
  std::vector<float> q(static_cast<size_t>(qw)), iq(static_cast<size_t>(c.index_heads * c.index_dim)), out(static_cast<size_t>(qw));
  for (auto& x : q) x = nd(rng);
  for (auto& x : iq) x = nd(rng);
  const m3::AttnSeq seq{&cache, ctx, 1, 0};
  const bool cold = state.range(3) != 0;
  static std::vector<float> junk;
  if (cold && junk.empty()) junk.assign(size_t(1) << 28, 1.0f);
  for (auto _ : state) {
    if (cold) {  // manual time: only the attention call is timed
      float sum = 0;
#pragma omp parallel for reduction(+ : sum)
      for (size_t i = 0; i < junk.size(); i += 16) sum += junk[i];
      benchmark::DoNotOptimize(sum);
    }
    const auto t0 = std::chrono::steady_clock::now();
    m3::attention_batch(c, 0, &seq, 1, q.data(), iq.data(), m3::AttentionPath::Sparse, out.data());
    benchmark::DoNotOptimize(out.data());
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const int64_t keys = dense ? ctx + 1 : std::min<int64_t>(ctx + 1, 16 * 128);
  const int64_t idx = !dense && ctx + 1 > 16 * 128 ? ctx + 1 : 0;
  const double row_bytes = quantised ? double(m3::kv_row_bytes(kvd, c.head_dim)) / c.head_dim : paged ? 2.0 : 4.0;
  state.SetBytesProcessed(int64_t(double(state.iterations()) * double(keys * kvw * 2 + idx * c.index_dim) * row_bytes));
  const char* what = kvd == m3::KVDtype::NVFP4 ? "paged NVFP4 cache (recipe)"
                     : kvd == m3::KVDtype::FP8 ? "paged FP8 cache"
                     : paged                   ? "paged BF16 cache (serve default)"
                                               : "fp32 SeqCache";
  state.SetLabel(std::string(what) + (dense ? ", dense layer" : "") + (cold ? ", cold" : ""));
}
BENCHMARK(BM_attention_decode)
    ->Args({512, 0, 0, 0})
    ->Args({16384, 0, 0, 0})
    ->Args({512, 1, 0, 0})
    ->Args({16384, 1, 0, 0})
    ->Args({16384, 1, 1, 0})
    ->Args({16384, 2, 0, 0})
    ->Args({16384, 2, 1, 0})
    ->Args({16384, 3, 0, 0})
    ->Args({16384, 3, 1, 0})
    ->UseManualTime();
// Cold: a fixed number of steps (each reads 1 GiB first, untimed).
BENCHMARK(BM_attention_decode)
    ->Args({16384, 1, 0, 1})
    ->Args({16384, 1, 1, 1})
    ->Args({16384, 2, 0, 1})
    ->Args({16384, 2, 1, 1})
    ->Args({16384, 3, 0, 1})
    ->Args({16384, 3, 1, 1})
    ->Iterations(40)
    ->UseManualTime();

// The vision tower's products at the real tower's dimensions for one 448x448 image (1024 patches, 256
// merged tokens): state.range(0) the shape (kVisionShapes), range(1) 0 = the shared linear kernels
// (linear_forward, + bias), 1 = the compute-bound GEMM (gemm_linear, bias fused). Weights BF16 except
// the F32 patch embedding, as the checkpoint holds them. Process CPU time (all threads): the GFLOP/s
// counter is per CPU-second, i.e. per busy core.
struct VisionShape {
  const char* name;
  int64_t M, N, K;
  LinearKind kind;
};
constexpr VisionShape kVisionShapes[] = {
    {"patch_embed", 1024, 1280, 1176, LinearKind::F32}, {"q/k/v/o", 1024, 1280, 1280, LinearKind::BF16},
    {"fc1", 1024, 5120, 1280, LinearKind::BF16},        {"fc2", 1024, 1280, 5120, LinearKind::BF16},
    {"proj1", 1024, 6144, 1280, LinearKind::BF16},      {"proj2", 1024, 6144, 6144, LinearKind::BF16},
    {"merge1", 256, 6144, 24576, LinearKind::BF16},     {"merge2", 256, 6144, 6144, LinearKind::BF16},
};

void BM_vision_matmul(benchmark::State& state) {
  const VisionShape& v = kVisionShapes[state.range(0)];
  const bool gemm = state.range(1) == 1;
  std::vector<uint8_t> w(size_t(v.N * v.K) * (v.kind == LinearKind::F32 ? 4 : 2));
  {
    const std::vector<float> f = normal_x(v.N * v.K);
    for (int64_t i = 0; i < v.N * v.K; ++i) {
      const float x = f[size_t(i)] * 0.03f;
      if (v.kind == LinearKind::F32) {
        std::memcpy(&w[size_t(i) * 4], &x, 4);
      } else {
        uint32_t u;
        std::memcpy(&u, &x, 4);
        const uint16_t b = uint16_t(u >> 16);
        std::memcpy(&w[size_t(i) * 2], &b, 2);
      }
    }
  }
  Linear L;
  L.kind = v.kind;
  L.N = v.N;
  L.K = v.K;
  L.w = w.data();
  const std::vector<float> x = normal_x(v.M * v.K), bias = normal_x(v.N);
  std::vector<float> y(size_t(v.M * v.N));
  for (auto _ : state) {
    if (gemm) {
      m3::gemm_linear(L, bias.data(), x.data(), v.M, y.data());
    } else {
      m3::linear_forward(L, x.data(), v.M, y.data());
      for (int64_t t = 0; t < v.M; ++t)
        for (int64_t n = 0; n < v.N; ++n) y[size_t(t * v.N + n)] += bias[size_t(n)];
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(std::string(v.name) + (gemm ? " gemm" : " linear_forward"));
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * double(v.M * v.N * v.K) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_vision_matmul)
    ->Apply([](benchmark::internal::Benchmark* b) {  // old and new side by side, shape by shape
      for (int64_t s = 0; s < 8; ++s) b->Args({s, 0})->Args({s, 1});
    })
    ->MeasureProcessCPUTime()
    ->Unit(benchmark::kMillisecond);

// One layer's attention of the real tower over one 448x448 image (1024 patches, 16 heads of 80):
// range(0) 0 = per head as two linear_forward products (what the tower did before attention_dense:
// Q_h·K_h^T with K_h as an F32 weight, softmax, P·V_h with V_h^T as a weight), 1 = attention_dense.
void BM_vision_attention(benchmark::State& state) {
  constexpr int64_t n = 1024, NH = 16, D = 80, H = NH * D;
  const std::vector<float> q = normal_x(n * H), k = normal_x(n * H + 1), v = normal_x(n * H + 2);
  std::vector<float> out(size_t(n * H)), qh(size_t(n * D)), kh(size_t(n * D)), vt(size_t(D * n)), sc(size_t(n * n)),
      oh(size_t(n * D));
  const float scale = 1.0f / std::sqrt(float(D));
  for (auto _ : state) {
    if (state.range(0) == 1) {
      m3::attention_dense(q.data(), k.data(), v.data(), H, n, int(NH), int(D), scale, out.data());
    } else {
      for (int64_t hd = 0; hd < NH; ++hd) {
        for (int64_t i = 0; i < n; ++i)
          for (int64_t d = 0; d < D; ++d) {
            qh[size_t(i * D + d)] = q[size_t(i * H + hd * D + d)] * scale;
            kh[size_t(i * D + d)] = k[size_t(i * H + hd * D + d)];
            vt[size_t(d * n + i)] = v[size_t(i * H + hd * D + d)];
          }
        Linear KW;
        KW.kind = LinearKind::F32;
        KW.N = n;
        KW.K = D;
        KW.w = reinterpret_cast<const uint8_t*>(kh.data());
        m3::linear_forward(KW, qh.data(), n, sc.data());
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) {
          float* r = sc.data() + i * n;
          float mx = -INFINITY;
          for (int64_t j = 0; j < n; ++j) mx = std::max(mx, r[j]);
          float sum = 0.f;
          for (int64_t j = 0; j < n; ++j) sum += (r[j] = std::exp(r[j] - mx));
          for (int64_t j = 0; j < n; ++j) r[j] /= sum;
        }
        Linear VW;
        VW.kind = LinearKind::F32;
        VW.N = D;
        VW.K = n;
        VW.w = reinterpret_cast<const uint8_t*>(vt.data());
        m3::linear_forward(VW, sc.data(), n, oh.data());
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(out.data() + i * H + hd * D, oh.data() + i * D, size_t(D) * sizeof(float));
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(state.range(0) == 1 ? "attention_dense" : "per head, linear_forward");
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * double(n * n * H) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_vision_attention)->Arg(0)->Arg(1)->MeasureProcessCPUTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
