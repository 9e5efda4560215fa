// Threading of the matmul over rows of W (see linear.h): tiles of all jobs of one call split over the
// threads (WorkerPool) by estimated cost, with stealing. The per-ISA inner loops are behind the kernel table
// (dispatch.h; linear_kernels.h); the weight layouts are in linear_layout.cpp.
#include "kernels/cpu/linear.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "base/aligned_vector.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/worker_pool.h"

namespace m3 {

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
  const int nthreads = int(std::max<int64_t>(1, std::min<int64_t>(WorkerPool::threads(), chunks)));
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
  // A thread that does not join in time (a neighbour holds its core) has its run taken by the others.
  WorkerPool::run(nthreads, [&](int me) {
    float* scratch = tile_scratch(maxK);
    for (int64_t ch = plan.next(me); ch >= 0;) {
      JobClaims c{&plan, me, plan.job_of(ch), ch};
      const LinearJob& job = jobs[c.job];
      ops.linear_rows_claimed(*job.W, job.x, job.T, job.y, claim_rows, &c, scratch);
      ch = c.carry;
    }
  });
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
  if (WorkerPool::threads() == 1 || tiles <= 1 || macs < 32768) {  // too small to share
    const CpuOps& ops = cpu_ops();
    float* scratch = tile_scratch(maxK);
    for (int j = 0; j < njobs; ++j) ops.linear_rows(*jobs[j].W, jobs[j].x, jobs[j].T, jobs[j].y, 0, jobs[j].W->N, scratch);
    return;
  }
  run_chunked(jobs, njobs, maxK);
}

void linear_decode_rows(const Linear& W, int64_t r0, int64_t n, float* out) {
  isa_generic::kLinearOps.decode_rows(W, r0, n, out);
}

}  // namespace m3
