// The decode step's worker pool: the calling thread plus pool workers share one job, and the caller
// never waits for a worker that has not started on it.
//
// Why not an OpenMP region (speed on a shared host): a region ends at a barrier every team thread must
// reach, so when a neighbour process holds a core, the caller waits for a descheduled worker to be
// scheduled again just to check in, even when it took no work. libgomp also fixes its wait policy
// (spin or sleep) at start-up, and neither is right on a shared host (docs/benchmarks.md section 3.4).
// Here participants claim their work from shared counters (the job must be finishable by the caller
// alone); a worker that arrives after the caller has closed the job skips it, and the caller waits only
// for workers that are inside it. Idle workers spin briefly (catching the short gaps between the
// regions of one step), then sleep on a futex; they do not spin while they see their core contended
// (a spinning thread then takes time from the neighbour and from the caller). M3_POOL_SPIN_US=N fixes
// the spin at N microseconds and turns the contention check off.
#pragma once

#include <atomic>
#include <cstdint>

namespace m3 {

class WorkerPool {
 public:
  using Fn = void (*)(void*, int);

  // The participants a job may have: OpenMP's thread count (OMP_NUM_THREADS, omp_set_num_threads).
  static int threads();

  // Calls body(slot) on the calling thread (slot 0) and on pool workers (slots 1 .. slots - 1) that join
  // before the caller's own call returns. Every slot below `slots` may be missing: body must claim its
  // work so that slot 0 alone completes the job. Returns once every participant has returned. Runs
  // body(0) alone when slots <= 1, inside a pool worker or an OpenMP region, or while another thread
  // holds the pool.
  template <class F>
  static void run(int slots, F&& body) {
    run_impl(slots, [](void* ctx, int slot) { (*static_cast<F*>(ctx))(slot); }, &body);
  }

  // Calls body(lo, hi) over [0, n) in chunks of `grain` indices claimed from a counter, on the pool when
  // there is more than one chunk. For loops whose indices are independent (each index computes the
  // same whichever thread takes it).
  template <class F>
  static void parallel_for(int64_t n, int64_t grain, F&& body) {
    if (n <= 0) return;
    grain = grain < 1 ? 1 : grain;
    if (n <= grain) return body(int64_t(0), n);
    std::atomic<int64_t> next{0};
    run(threads(), [&](int) {
      for (int64_t lo; (lo = next.fetch_add(grain, std::memory_order_relaxed)) < n;)
        body(lo, lo + grain < n ? lo + grain : n);
    });
  }


 private:
  static void run_impl(int slots, Fn fn, void* ctx);
};

}  // namespace m3
