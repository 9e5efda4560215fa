// Threading of the matmul over rows of W (see linear.h); the per-ISA inner loops are in
// linear_impl.inc.
#include "kernels/cpu/linear.h"

#include <emmintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>
#include <string>
#include <vector>

#include "kernels/cpu/aligned_vector.h"
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

namespace {
// x[0, K)'s extreme exponent fields as mxfp8_prescale_exact_fields takes them, and whether some
// element is +-0: an integer loop over the bit patterns (no libm; the decode kernels' vector scan
// finds the same).
void exponent_fields(const float* x, int64_t K, uint32_t& emin, uint32_t& emax, bool& zero) {
  emax = 0, emin = 255, zero = false;
  for (int64_t k = 0; k < K; ++k) {
    uint32_t u;
    std::memcpy(&u, x + k, 4);
    u &= 0x7fffffffu;
    const uint32_t e = u >> 23;
    emax = std::max(emax, e);
    emin = std::min(emin, u ? e : 255u);
    zero |= u == 0;
  }
}
}  // namespace

bool mxfp8_prescale_exact(const float* x, int64_t K, int lo, int hi) {
  uint32_t emin, emax;
  bool zero;
  exponent_fields(x, K, emin, emax, zero);
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

bool mxfp8_x_shift_exact(const float* x, int64_t K, int lo, int hi) {
  uint32_t emin, emax;
  bool zero;
  exponent_fields(x, K, emin, emax, zero);
  return mxfp8_x_shift_exact_fields(emin, emax, zero, lo, hi);
}

bool mxfp8_x_shift_exact_fields(uint32_t emin, uint32_t emax, bool zero, int lo, int hi) {
  // The copies' condition (the scaled field stays in [1, 254]) for normal, nonzero x only.
  return !zero && emin >= 1 && mxfp8_prescale_exact_fields(emin, emax, lo, hi);
}

namespace {
std::atomic<int> g_mxfp8_permute_form{-1};
}  // namespace

void set_mxfp8_permute_form(int form) { g_mxfp8_permute_form.store(form, std::memory_order_relaxed); }

bool mxfp8_two_source_permute() {
  static const bool amd = __builtin_cpu_is("amd");
  const int f = g_mxfp8_permute_form.load(std::memory_order_relaxed);
  return f < 0 ? amd : f == 1;
}

int64_t tile_chunk_bytes(const Linear& W) {
  switch (W.kind) {
    case LinearKind::MXFP8: return W.K % 32 == 0 ? 32 : 0;
    case LinearKind::NVFP4: return W.K % 32 == 0 && !W.act_int8 ? 16 : 0;
    case LinearKind::BF16: return W.K % 8 == 0 ? 16 : 0;
    default: return 0;
  }
}

namespace {
// f(i0, i1) over [0, n) split among the hardware threads, at least `grain` items each. Plain threads, not
// OpenMP: the loading thread is often not the one that runs the model (serve's engine thread), and an
// OpenMP team created here would keep a worker spinning beside the engine's under
// OMP_WAIT_POLICY=active (measured: one core busy while the server idled).
void on_load_threads(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& f) {
  const int64_t nt = std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), (n + grain - 1) / grain);
  if (nt <= 1) return f(0, n);
  std::vector<std::thread> pool;
  for (int64_t k = 0; k < nt; ++k) pool.emplace_back(f, n * k / nt, n * (k + 1) / nt);
  for (auto& th : pool) th.join();
}
}  // namespace

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
  on_load_threads(tiles, 64, rewrite);
  W.tiled = true;
  return true;
}

// SSE2 (every x86-64 CPU) rather than one nibble at a time: the reorder runs over every NVFP4 byte
// of the checkpoint at load, where the scalar form took several times as long.
void nvfp4_chunk_nibbles(const uint8_t* in, uint8_t* out, bool to_tiled) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in)), m = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
  __m128i r;
  if (to_tiled) {
    // Checkpoint byte j holds elements 2j (low) and 2j + 1 (high): interleaving the low and high
    // nibbles gives elements 0..15, then 16..31; tiled byte j = element j | element 16 + j << 4.
    const __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi);
    r = _mm_or_si128(e0, _mm_slli_epi16(e1, 4));  // e1's bytes are below 16: no bits cross a byte
  } else {
    // Tiled: low nibbles are elements 0..15, high nibbles 16..31. Within each 16-bit lane of
    // (elements 2i, 2i + 1) the shift puts element 2i + 1 above element 2i in the low byte; packing the
    // low bytes gives checkpoint bytes 0..7 (from lo) and 8..15 (from hi).
    const __m128i b = _mm_set1_epi16(0x00ff);
    const __m128i p0 = _mm_and_si128(_mm_or_si128(lo, _mm_srli_epi16(lo, 4)), b);
    const __m128i p1 = _mm_and_si128(_mm_or_si128(hi, _mm_srli_epi16(hi, 4)), b);
    r = _mm_packus_epi16(p0, p1);
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), r);
}

namespace {
// The BF16 packings' view of a tiled matrix: slot s = (tile s / chunks, 32-element chunk s % chunks), whose
// 256 bytes hold row i's elements 32c + 8j .. + 7 at 64j + 16i.
const uint8_t* tiled_bf16_chunk(const Linear& W, int64_t slot) {
  const int64_t chunks = W.K / 32;
  return W.w + slot / chunks * kLinearTileRows * W.K * 2 + slot % chunks * 256;
}
uint16_t tiled_bf16_value(const uint8_t* chunk, int row, int k) {
  uint16_t v;
  std::memcpy(&v, chunk + 64 * (k / 8) + 16 * row + 2 * (k % 8), 2);
  return v;
}
// A row's base in a chunk (its largest top seven exponent bits), or -1 when some weight lies more than 7
// steps below it (the chunk or row is then kept raw).
int tiled_bf16_row_base(const uint8_t* chunk, int row) {
  int hi = 0, lo = 127;
  for (int k = 0; k < 32; ++k) {
    const int e = (tiled_bf16_value(chunk, row, k) >> 8) & 0x7f;
    hi = std::max(hi, e), lo = std::min(lo, e);
  }
  return hi - lo > 7 ? -1 : hi;
}
}  // namespace

bool pack_bf16_tiles(Linear& W, AlignedVector<uint8_t>& out) {
  if (W.kind != LinearKind::BF16 || !W.tiled || W.K % 32 != 0 || W.N < kLinearTileRows) return false;
  const int64_t slots = W.N / kLinearTileRows * (W.K / 32);
  // Row bases, or kBf16PackedEscape when a weight of any row is out of reach.
  auto bases = [&](const uint8_t* chunk) {
    uint32_t b = 0;
    for (int r = 0; r < kLinearTileRows; ++r) {
      const int base = tiled_bf16_row_base(chunk, r);
      if (base < 0) return kBf16PackedEscape;
      b |= uint32_t(base) << (8 * r);
    }
    return b;
  };
  // On load threads over ranges of slots (the recipe model's lm_head, 200k x 6k, is 1.2 G weights:
  // seconds on one thread). Pass 1 finds the bases, then the escaped
  // chunks are numbered in slot order, pass 2 writes the bytes.
  std::vector<uint32_t> base(static_cast<size_t>(slots)), esc(static_cast<size_t>(slots), 0);
  on_load_threads(slots, 4096, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) base[size_t(s)] = bases(tiled_bf16_chunk(W, s));
  });
  int64_t escapes = 0;
  for (int64_t s = 0; s < slots; ++s)
    if (base[size_t(s)] == kBf16PackedEscape) esc[size_t(s)] = uint32_t(escapes++);
  out.assign(size_t(slots) * 196 + size_t(escapes) * 256, 0);
  uint8_t* const slot0 = out.data();
  uint8_t* const base0 = slot0 + slots * 192;
  uint8_t* const esc0 = base0 + slots * 4;
  on_load_threads(slots, 4096, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const uint8_t* chunk = tiled_bf16_chunk(W, s);
      uint8_t* slot = slot0 + s * 192;
      const uint32_t b = base[size_t(s)];
      std::memcpy(base0 + s * 4, &b, 4);
      if (b == kBf16PackedEscape) {
        std::memcpy(slot, &esc[size_t(s)], 4);
        std::memcpy(esc0 + size_t(esc[size_t(s)]) * 256, chunk, 256);
        continue;
      }
      for (int half = 0; half < 2; ++half)  // rows 0, 1 then rows 2, 3
        for (int w = 0; w < 64; ++w) {
          const int r = 2 * half + w / 32;
          const uint16_t v = tiled_bf16_value(chunk, r, w % 32);
          const int off = int((b >> (8 * r)) & 0xff) - ((v >> 8) & 0x7f);
          slot[64 * half + w] = uint8_t(v & 0xff);
          slot[128 + w] |= uint8_t(((v >> 15) << 3 | off) << (4 * half));
        }
    }
  });
  W.bf16_packed = out.data();
  W.bf16_packed_bytes = out.size();
  return true;
}

bool pack_bf16_nibbles(Linear& W, AlignedVector<uint8_t>& out) {
  if (W.kind != LinearKind::BF16 || !W.tiled || W.K % 32 != 0 || W.N < kLinearTileRows) return false;
  const int64_t slots = W.N / kLinearTileRows * (W.K / 32);
  out.assign(size_t(slots * kBf16NibbleSlot), 0);
  on_load_threads(slots, 4096, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const uint8_t* chunk = tiled_bf16_chunk(W, s);
      uint8_t* slot = out.data() + s * kBf16NibbleSlot;
      for (int i = 0; i < kLinearTileRows; ++i) {
        const int hi = tiled_bf16_row_base(chunk, i);
        if (hi < 0) {
          slot[i] = kBf16NibblesEscape;
          continue;
        }
        slot[i] = uint8_t(0x7f - hi);
        uint8_t* row = slot + 4 + 48 * i;
        for (int p = 0; p < 32; ++p) {
          const uint16_t e = tiled_bf16_value(chunk, i, p < 16 ? 8 * (p / 4) + p % 4 : 8 * ((p - 16) / 4) + 4 + p % 4);
          row[p] = uint8_t(e & 0xff);
          row[32 + p % 16] |= uint8_t(((e >> 15) << 3 | (hi - ((e >> 8) & 0x7f))) << (p < 16 ? 0 : 4));
        }
      }
    }
  });
  W.bf16_nibbles = out.data();
  W.bf16_nibbles_bytes = out.size();
  return true;
}

bool pack_bf16_for_decode(Linear& W, AlignedVector<uint8_t>& out) {
  const std::string isa = cpu_ops().name;
  if (isa == "avx512") return pack_bf16_tiles(W, out);
  if (isa == "avx2") return pack_bf16_nibbles(W, out);
  return false;
}

bool enable_int8_activations(Linear& W) {
  if (W.kind != LinearKind::NVFP4 || W.K % 128 != 0 || W.tiled) return false;
  W.act_int8 = true;
  return true;
}

bool enable_bf16_activations(Linear& W) {
  if (W.kind != LinearKind::MXFP8 && W.kind != LinearKind::NVFP4) return false;
  if (W.act_int8) return false;
  W.act_bf16 = true;
  return true;
}

bool bf16_dot_products() { return std::string(cpu_ops().name) == "avx512" && __builtin_cpu_supports("avx512bf16"); }

namespace {

// The work of one parallel matmul call (one or several jobs) as chunks of whole 4-row tiles, numbered
// across the jobs. Each thread owns a contiguous run of chunks (an equal share of the estimated cost),
// takes chunks from its front, and when its run is empty takes them from the back of another thread's
// run (speed: with a fixed half each, one thread waited at the end of most calls: the cores of a
// shared VM do not run at the same speed, and which one is slower changes). The set-up a matrix needs
// per call (copies of x, scale
// tables) is done once per run of chunks, not per chunk (CpuOps::linear_rows_claimed).
struct alignas(64) ChunkRun {
  std::atomic<uint64_t> v;  // next chunk (low 32 bits), end (high 32 bits)
};
constexpr uint64_t pack_run(uint64_t lo, uint64_t hi) { return lo | hi << 32; }

struct ChunkPlan {
  static constexpr int kMaxJobs = 64;
  const LinearJob* jobs = nullptr;
  int njobs = 0;
  int64_t tiles_per_chunk[kMaxJobs];
  int64_t first_chunk[kMaxJobs + 1];  // job j holds chunks [first_chunk[j], first_chunk[j + 1])
  ChunkRun* runs = nullptr;           // one per thread
  int nthreads = 1;

  int job_of(int64_t c) const {
    return int(std::upper_bound(first_chunk, first_chunk + njobs + 1, c) - first_chunk) - 1;
  }
  // The next chunk for thread `me`: the front of its own run, else the back of another's; -1 when
  // none is left.
  int64_t next(int me) const {
    for (int k = 0; k < nthreads; ++k) {
      std::atomic<uint64_t>& run = runs[(me + k) % nthreads].v;
      uint64_t cur = run.load(std::memory_order_relaxed);
      while (uint32_t(cur) < uint32_t(cur >> 32)) {
        const uint64_t lo = uint32_t(cur), hi = cur >> 32;
        const uint64_t want = k == 0 ? pack_run(lo + 1, hi) : pack_run(lo, hi - 1);
        if (run.compare_exchange_weak(cur, want, std::memory_order_relaxed)) return int64_t(k == 0 ? lo : hi - 1);
      }
    }
    return -1;
  }
};

// One thread's claims inside one job: the chunk it already holds, then further chunks while they
// belong to the same job (a chunk of another job is handed back through `carry`).
struct JobClaims {
  const ChunkPlan* plan;
  int me, job;
  int64_t held, carry = -1;
};

bool claim_rows(void* ctx, int64_t* r0, int64_t* r1) {
  JobClaims& c = *static_cast<JobClaims*>(ctx);
  int64_t ch = c.held;
  c.held = -1;
  if (ch < 0) {
    ch = c.plan->next(c.me);
    if (ch < 0) return false;
    if (c.plan->job_of(ch) != c.job) {
      c.carry = ch;
      return false;
    }
  }
  const ChunkPlan& p = *c.plan;
  const int64_t t0 = (ch - p.first_chunk[c.job]) * p.tiles_per_chunk[c.job];
  const Linear& W = *p.jobs[c.job].W;
  *r0 = t0 * kLinearTileRows;
  *r1 = std::min(W.N, (t0 + p.tiles_per_chunk[c.job]) * kLinearTileRows);
  return true;
}

// This thread's tile scratch for matrices up to maxK wide (grown only: no allocation in steady state).
float* tile_scratch(int64_t maxK) {
  static thread_local AlignedVector<float> scratch;
  if (scratch.size() < size_t(kLinearTileRows * maxK)) scratch.resize(size_t(kLinearTileRows * maxK));
  return scratch.data();
}

// Runs the jobs over the OpenMP threads (at most 64 jobs; see linear_forward_many).
void run_chunked(const LinearJob* jobs, int njobs, int64_t maxK) {
  const CpuOps& ops = cpu_ops();
  ChunkPlan plan;
  plan.jobs = jobs;
  plan.njobs = njobs;
  // Estimated cost of a tile: weight bytes read + multiply-adds, in rough byte-equivalents. A chunk
  // is about 96 KB-equivalents (8 tiles of a 2048-wide MXFP8 decode matrix), at least 2 tiles (the
  // decode kernels take tiles in pairs) and at most 16, whole 16-row panels for steps of
  // kLaneGemmMinTokens tokens or more; the cost of every chunk goes into the split.
  double cost_total = 0;
  double chunk_cost[ChunkPlan::kMaxJobs];
  plan.first_chunk[0] = 0;
  for (int j = 0; j < njobs; ++j) {
    const Linear& W = *jobs[j].W;
    const int64_t tiles = (W.N + kLinearTileRows - 1) / kLinearTileRows;
    const double tile_cost =
        double(W.row_bytes()) * kLinearTileRows + 0.5 * double(W.K) * kLinearTileRows * double(jobs[j].T);
    int64_t per = std::clamp<int64_t>(int64_t(98304.0 / std::max(tile_cost, 1.0)), 2, 16) & ~int64_t(1);
    constexpr int64_t panel_tiles = kLanePanelRows / kLinearTileRows;
    if (jobs[j].T >= kLaneGemmMinTokens) per = std::max(per, panel_tiles) / panel_tiles * panel_tiles;  // whole panels
    plan.tiles_per_chunk[j] = per;
    plan.first_chunk[j + 1] = plan.first_chunk[j] + (tiles + per - 1) / per;
    chunk_cost[j] = tile_cost * double(per);
    cost_total += chunk_cost[j] * double(plan.first_chunk[j + 1] - plan.first_chunk[j]);
  }
  const int64_t chunks = plan.first_chunk[njobs];
  const int nthreads = int(std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), chunks)));
  static thread_local std::unique_ptr<ChunkRun[]> runs;
  static thread_local int runs_size = 0;
  if (runs_size < nthreads) runs.reset(new ChunkRun[size_t(nthreads)]), runs_size = nthreads;
  plan.runs = runs.get();
  plan.nthreads = nthreads;
  // Thread t's run ends at the first chunk whose cost prefix passes (t+1)/nthreads of the total (the
  // last run ends at the last chunk). A smaller team than planned (a nested region) takes the runs
  // of the missing threads by stealing.
  double acc = 0;
  int t = 0;
  int64_t lo = 0;
  for (int j = 0; j < njobs; ++j)
    for (int64_t c = plan.first_chunk[j]; c < plan.first_chunk[j + 1]; acc += chunk_cost[j], ++c)
      while (t < nthreads - 1 && acc + 0.5 * chunk_cost[j] > cost_total * double(t + 1) / nthreads) {
        plan.runs[t++].v.store(pack_run(uint64_t(lo), uint64_t(c)), std::memory_order_relaxed);
        lo = c;
      }
  for (; t < nthreads; ++t, lo = chunks) plan.runs[t].v.store(pack_run(uint64_t(lo), uint64_t(chunks)), std::memory_order_relaxed);
#pragma omp parallel num_threads(nthreads)
  {
    const int me = omp_get_thread_num();
    float* scratch = tile_scratch(maxK);
    for (int64_t ch = plan.next(me); ch >= 0;) {
      JobClaims c{&plan, me, plan.job_of(ch), ch};
      const LinearJob& job = jobs[c.job];
      ops.linear_rows_claimed(*job.W, job.x, job.T, job.y, claim_rows, &c, scratch);
      ch = c.carry;
    }
  }
}

}  // namespace

void linear_forward(const Linear& W, const float* x, int64_t T, float* y) {
  const LinearJob job{&W, x, T, y};
  linear_forward_many(&job, 1);
}

void linear_forward_many(const LinearJob* jobs, int njobs) {
  if (std::any_of(jobs, jobs + njobs, [](const LinearJob& j) { return j.T > lane_slice_tokens(j.W->K); })) {
    std::vector<LinearJob> sliced;  // a long prefill step only: no allocation in decode
    for (int j = 0; j < njobs; ++j) {
      const int64_t T = std::max<int64_t>(jobs[j].T, 1), fit = lane_slice_tokens(jobs[j].W->K);
      const int64_t step = (T + (T + fit - 1) / fit - 1) / ((T + fit - 1) / fit);  // near-equal slices
      for (int64_t t0 = 0; t0 < T; t0 += step)
        sliced.push_back({jobs[j].W, jobs[j].x + t0 * jobs[j].W->K, std::min(step, jobs[j].T - t0),
                          jobs[j].y + t0 * jobs[j].W->N});
    }
    linear_forward_many(sliced.data(), int(sliced.size()));
    return;
  }
  constexpr int kMaxJobs = ChunkPlan::kMaxJobs;
  if (njobs > kMaxJobs) {
    for (int j = 0; j < njobs; j += kMaxJobs) linear_forward_many(jobs + j, std::min(kMaxJobs, njobs - j));
    return;
  }
  int64_t maxK = 0, macs = 0, tiles = 0;
  for (int j = 0; j < njobs; ++j) {
    const Linear& W = *jobs[j].W;
    maxK = std::max(maxK, W.K);
    macs += W.N * W.K * std::max<int64_t>(jobs[j].T, 1);
    tiles += (W.N + kLinearTileRows - 1) / kLinearTileRows;
  }
  if (omp_get_max_threads() == 1 || tiles <= 1 || macs < 32768) {  // too small to share
    const CpuOps& ops = cpu_ops();
    float* scratch = tile_scratch(maxK);
    for (int j = 0; j < njobs; ++j) ops.linear_rows(*jobs[j].W, jobs[j].x, jobs[j].T, jobs[j].y, 0, jobs[j].W->N, scratch);
    return;
  }
  run_chunked(jobs, njobs, maxK);
}

void linear_decode_rows(const Linear& W, int64_t r0, int64_t n, float* out) {
  isa_generic::kOps.decode_rows(W, r0, n, out);
}

}  // namespace m3
