// Threading of the matmul over rows of W (see linear.h); the per-ISA inner loops are in
// linear_impl.inc.
#include "kernels/cpu/linear.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/cpu/dispatch.h"

namespace m3 {

const char* linear_kind_name(LinearKind k) {
  switch (k) {
    case LinearKind::None: return "none";
    case LinearKind::F32: return "F32";
    case LinearKind::BF16: return "BF16";
    case LinearKind::F16: return "F16";
    case LinearKind::MXFP8: return "MXFP8";
    case LinearKind::NVFP4: return "NVFP4";
  }
  return "?";
}

size_t Linear::bytes() const {
  const size_t n = size_t(N) * size_t(K);
  switch (kind) {
    case LinearKind::None: return 0;
    case LinearKind::F32: return n * 4;
    case LinearKind::BF16:
    case LinearKind::F16: return n * 2;
    case LinearKind::MXFP8: return n + n / 32;
    case LinearKind::NVFP4: return n / 2 + n / 16;
  }
  return 0;
}

size_t Linear::element_row_bytes() const {
  switch (kind) {
    case LinearKind::None: return 0;
    case LinearKind::F32: return size_t(K) * 4;
    case LinearKind::BF16:
    case LinearKind::F16: return size_t(K) * 2;
    case LinearKind::MXFP8: return size_t(K);
    case LinearKind::NVFP4: return size_t(K) / 2;
  }
  return 0;
}

void set_scale_range(Linear& W) {
  if (W.kind != LinearKind::MXFP8 || !W.scales) return;
  const size_t n = size_t(W.N) * size_t(W.K / 32);
  uint8_t lo = 255, hi = 0;
  for (size_t i = 0; i < n; ++i) {
    lo = std::min(lo, W.scales[i]);
    hi = std::max(hi, W.scales[i]);
  }
  if (n == 0) lo = 0, hi = 255;
  W.scale_lo = lo;
  W.scale_hi = hi;
}

bool mxfp8_prescale_exact(const float* x, int64_t K, int lo, int hi) {
  // Integer loop over the bit patterns (no libm).
  uint32_t emax = 0, emin = 255;
  for (int64_t k = 0; k < K; ++k) {
    uint32_t u;
    std::memcpy(&u, x + k, 4);
    u &= 0x7fffffffu;
    const uint32_t e = u >> 23;
    emax = std::max(emax, e);
    emin = std::min(emin, u ? e : 255u);
  }
  return mxfp8_prescale_exact_fields(emin, emax, lo, hi);
}

bool mxfp8_prescale_exact_fields(uint32_t emin, uint32_t emax, int lo, int hi) {
  if (lo < 0 || hi > kMxfp8PrescaleMaxCode || lo > hi) return false;
  // x * 2^j with j = c - 7 is exact iff the result's exponent field stays in [1, 254] (no overflow,
  // no rounding to a subnormal; a subnormal x scaled up is exact), so the extreme exponent fields of
  // the nonzero x decide for every c.
  if (emin == 255) return emax < 255;  // all zero (or only inf / NaN, rejected)
  return emax <= 254 && int(emax) + hi - 7 <= 254 && int(emin) + lo - 7 >= 1;
}

int64_t tile_chunk_bytes(const Linear& W) {
  switch (W.kind) {
    case LinearKind::MXFP8: return W.K % 32 == 0 ? 32 : 0;
    case LinearKind::NVFP4: return W.K % 32 == 0 && !W.act_int8 ? 16 : 0;
    case LinearKind::BF16: return W.K % 8 == 0 ? 16 : 0;
    default: return 0;
  }
}

bool tile_rows(Linear& W, uint8_t* bytes) {
  const int64_t cb = tile_chunk_bytes(W);
  if (cb == 0 || W.N < kLinearTileRows || W.tiled || bytes != W.w) return false;
  const int64_t rb = int64_t(W.element_row_bytes());
  const int64_t tiles = W.N / kLinearTileRows, chunks = rb / cb;
  auto rewrite = [&](int64_t t0, int64_t t1) {
    std::vector<uint8_t> tile(size_t(kLinearTileRows * rb));  // once per thread and matrix, at load
    for (int64_t t = t0; t < t1; ++t) {
      uint8_t* dst = bytes + t * kLinearTileRows * rb;
      std::memcpy(tile.data(), dst, tile.size());
      for (int64_t c = 0; c < chunks; ++c)
        for (int i = 0; i < kLinearTileRows; ++i) {
          uint8_t* out = dst + (c * kLinearTileRows + i) * cb;
          const uint8_t* in = tile.data() + i * rb + c * cb;
          if (W.kind == LinearKind::NVFP4)
            nvfp4_chunk_nibbles(in, out, true);
          else
            std::memcpy(out, in, size_t(cb));
        }
    }
  };
  // Plain threads, not OpenMP: the loading thread is often not the one that runs the model (serve's
  // engine thread), and an OpenMP team created here would keep a worker spinning beside the engine's
  // under OMP_WAIT_POLICY=active (measured: one core busy while the server idled).
  const int64_t nt = std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), (tiles + 63) / 64);
  if (nt <= 1) {
    rewrite(0, tiles);
  } else {
    std::vector<std::thread> pool;
    for (int64_t k = 0; k < nt; ++k) pool.emplace_back(rewrite, tiles * k / nt, tiles * (k + 1) / nt);
    for (auto& th : pool) th.join();
  }
  W.tiled = true;
  return true;
}

void nvfp4_chunk_nibbles(const uint8_t* in, uint8_t* out, bool to_tiled) {
  auto code = [](const uint8_t* b, int e) { return (b[e / 2] >> (4 * (e % 2))) & 0x0f; };  // checkpoint order
  if (to_tiled) {
    for (int j = 0; j < 16; ++j) out[j] = uint8_t(code(in, j) | code(in, 16 + j) << 4);
    return;
  }
  auto tiled_code = [&](int e) { return e < 16 ? in[e] & 0x0f : in[e - 16] >> 4; };
  for (int j = 0; j < 16; ++j) out[j] = uint8_t(tiled_code(2 * j) | tiled_code(2 * j + 1) << 4);
}

bool enable_int8_activations(Linear& W) {
  if (W.kind != LinearKind::NVFP4 || W.K % 128 != 0 || W.tiled) return false;
  W.act_int8 = true;
  return true;
}

void linear_forward(const Linear& W, const float* x, int64_t T, float* y) {
  const CpuOps& ops = cpu_ops();
  const int64_t N = W.N;
  // Scratch per thread: one row tile; thread_local so steady-state decode does not allocate.
  static thread_local std::vector<float> scratch;
  const int64_t tiles = (N + kLinearTileRows - 1) / kLinearTileRows;
  const int nthreads = std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), tiles));
  if (nthreads == 1 || N * W.K * std::max<int64_t>(T, 1) < 32768) {
    if (scratch.size() < size_t(kLinearTileRows * W.K)) scratch.resize(kLinearTileRows * W.K);
    ops.linear_rows(W, x, T, y, 0, N, scratch.data());
    return;
  }
#pragma omp parallel num_threads(nthreads)
  {
    if (scratch.size() < size_t(kLinearTileRows * W.K)) scratch.resize(kLinearTileRows * W.K);
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t t0 = tiles * id / nt, t1 = tiles * (id + 1) / nt;
    const int64_t r0 = t0 * kLinearTileRows, r1 = std::min(N, t1 * kLinearTileRows);
    if (r0 < r1) ops.linear_rows(W, x, T, y, r0, r1, scratch.data());
  }
}

void linear_forward_many(const LinearJob* jobs, int njobs) {
  const CpuOps& ops = cpu_ops();
  static thread_local std::vector<float> scratch;
  // Cost of one tile of job j (weight bytes read + multiply-adds, in rough byte-equivalents) and
  // the running start of each job's range; fixed-size arrays: no allocation per step.
  constexpr int kMaxJobs = 64;
  if (njobs > kMaxJobs) {
    for (int j = 0; j < njobs; j += kMaxJobs) linear_forward_many(jobs + j, std::min(kMaxJobs, njobs - j));
    return;
  }
  double cost[kMaxJobs], start[kMaxJobs + 1];
  int64_t tiles[kMaxJobs];
  int64_t maxK = 0, macs = 0;
  start[0] = 0;
  for (int j = 0; j < njobs; ++j) {
    const Linear& W = *jobs[j].W;
    tiles[j] = (W.N + kLinearTileRows - 1) / kLinearTileRows;
    cost[j] = double(W.row_bytes()) * kLinearTileRows + 0.5 * double(W.K) * kLinearTileRows * double(jobs[j].T);
    start[j + 1] = start[j] + cost[j] * double(tiles[j]);
    maxK = std::max(maxK, W.K);
    macs += W.N * W.K * std::max<int64_t>(jobs[j].T, 1);
  }
  const int64_t total_tiles = [&] {
    int64_t s = 0;
    for (int j = 0; j < njobs; ++j) s += tiles[j];
    return s;
  }();
  const int nthreads = int(std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), total_tiles)));
  auto run = [&](int id, int nt) {
    if (scratch.size() < size_t(kLinearTileRows * maxK)) scratch.resize(size_t(kLinearTileRows * maxK));
    const double lo = start[njobs] * id / nt, hi = start[njobs] * (id + 1) / nt;
    for (int j = 0; j < njobs; ++j) {
      if (start[j + 1] <= lo || start[j] >= hi || tiles[j] == 0) continue;
      // Tile t belongs to the thread whose cost range holds the tile's start.
      const int64_t t0 = std::clamp<int64_t>(int64_t(std::ceil((lo - start[j]) / cost[j])), 0, tiles[j]);
      const int64_t t1 = id == nt - 1 ? tiles[j]
                                      : std::clamp<int64_t>(int64_t(std::ceil((hi - start[j]) / cost[j])), 0, tiles[j]);
      const Linear& W = *jobs[j].W;
      const int64_t r0 = t0 * kLinearTileRows, r1 = std::min(W.N, t1 * kLinearTileRows);
      if (r0 < r1) ops.linear_rows(W, jobs[j].x, jobs[j].T, jobs[j].y, r0, r1, scratch.data());
    }
  };
  if (nthreads == 1 || macs < 32768) {
    run(0, 1);
    return;
  }
#pragma omp parallel num_threads(nthreads)
  run(omp_get_thread_num(), omp_get_num_threads());
}

void linear_decode_rows(const Linear& W, int64_t r0, int64_t n, float* out) {
  isa_generic::kOps.decode_rows(W, r0, n, out);
}

}  // namespace m3
