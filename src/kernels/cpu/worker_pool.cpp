// The decode step's worker pool (worker_pool.h): lazily started workers, a job word they join through,
// a futex they sleep on. Hand-written rather than an OpenMP region for the reason given in the header:
// the caller must not wait for a worker that has not joined.
#include "kernels/cpu/worker_pool.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <omp.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace m3 {

namespace {

// The job word: the job's number (bits 33-63), closed (bit 32), the job's slot count (bits 24-31),
// the next slot to hand out (bits 16-23), participants inside the job besides the caller (bits
// 0-15). One word, so that joining (a slot and a place, if the job is open and has slots left) and
// closing are single atomic steps.
constexpr uint64_t kActive = 1, kSlot = uint64_t(1) << 16, kClosed = uint64_t(1) << 32;
constexpr int kSlotsShift = 24, kJobShift = 33;
constexpr int kMaxSlots = 255;
constexpr uint64_t active_of(uint64_t w) { return w & 0xffff; }
constexpr uint64_t slot_of(uint64_t w) { return (w >> 16) & 0xff; }
constexpr uint64_t slots_of(uint64_t w) { return (w >> kSlotsShift) & 0xff; }

// Set on pool workers, and on a caller while it runs its own share of a job: a pool call from there
// runs alone (the pool is busy with the enclosing job; its lock is the caller's own).
thread_local bool t_inside_job = false;

// An idle worker's spin before it sleeps when the cores are not contended: long enough to span the
// gaps between the regions of one decode step (norms, routing, small attention on the calling
// thread). Measured on mid m31 decode (2 cores): 200 us beat 50 us and no spin on a quiet host; with
// a busy neighbour, no spin won (docs/benchmarks.md section 3.4).
constexpr int kSpinUs = 200;
// Contention: more involuntary context switches per second than this, judged over windows of kWindow.
constexpr double kContendedPerSecond = 50;
constexpr std::chrono::milliseconds kWindow{50}, kHold{500};

struct Pool {
  std::mutex mu;                   // one job at a time; a second caller runs its job alone
  std::atomic<uint64_t> job{kClosed};
  std::atomic<uint32_t> wake{0};   // futex word: bumped for every job
  std::atomic<int> sleepers{0};
  // The open job's body: written before `job` opens (release), read after joining it (acquire).
  std::atomic<WorkerPool::Fn> fn{nullptr};
  std::atomic<void*> ctx{nullptr};
  uint64_t number = 0;             // jobs posted (mu held)
  std::vector<std::thread> workers;
  int spin_us = kSpinUs;
  bool fixed_spin = false;           // M3_POOL_SPIN_US given: no adaptation
  std::atomic<bool> contended{false};

  Pool() {
    if (const char* s = std::getenv("M3_POOL_SPIN_US")) spin_us = std::max(0, std::atoi(s)), fixed_spin = true;
  }
  ~Pool() = delete;  // workers run until the process exits (the pool is never destroyed)

  void futex_wait(uint32_t seen) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&wake), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
  }
  void futex_wake_all() {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&wake), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
  }

  // Whether the cores are shared with other runnable threads, judged by how often this worker was
  // preempted (involuntary context switches: taken off a core while it wanted to run) over the last
  // window. Alone on its core a spinning worker is almost never preempted; beside a busy neighbour the
  // scheduler takes it off every few milliseconds.
  struct Preemptions {
    std::chrono::steady_clock::time_point since{};
    long switches = -1;
  };
  // Once contended, the spin stays off for kHold (a worker that does not spin is preempted less, so
  // the next window alone would turn it back on), then one window spinning judges again.
  void judge_contention(Preemptions& p) {
    const auto now = std::chrono::steady_clock::now();
    if (p.switches >= 0 && now - p.since < (contended.load(std::memory_order_relaxed) ? kHold : kWindow)) return;
    rusage u{};
    if (getrusage(RUSAGE_THREAD, &u) != 0) return;
    if (p.switches >= 0) {
      const double s = std::chrono::duration<double>(now - p.since).count();
      const bool was = contended.load(std::memory_order_relaxed);
      // After a hold the window's count is of a worker that slept: judge again from a spinning window.
      contended.store(!was && double(u.ru_nivcsw - p.switches) / s > kContendedPerSecond, std::memory_order_relaxed);
    }
    p.since = now, p.switches = u.ru_nivcsw;
  }

  // Waits until `wake` differs from `seen`: spin for spin_us (none while the cores are contended),
  // then sleep.
  uint32_t wait_for_job(uint32_t seen, Preemptions& pre) {
    uint32_t now = wake.load(std::memory_order_acquire);
    if (now != seen) return now;
    if (!fixed_spin) judge_contention(pre);
    const int us = fixed_spin || !contended.load(std::memory_order_relaxed) ? spin_us : 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
    for (int i = 0; us > 0; ++i) {
      for (int k = 0; k < 16; ++k) _mm_pause();
      if ((now = wake.load(std::memory_order_acquire)) != seen) return now;
      if ((i & 15) == 15 && std::chrono::steady_clock::now() >= until) break;
    }
    for (;;) {
      sleepers.fetch_add(1, std::memory_order_seq_cst);
      if ((now = wake.load(std::memory_order_seq_cst)) == seen) futex_wait(seen);
      sleepers.fetch_sub(1, std::memory_order_relaxed);
      if ((now = wake.load(std::memory_order_acquire)) != seen) return now;
    }
  }

  void worker_loop() {
    t_inside_job = true;
    uint32_t seen = 0;
    Preemptions pre;
    for (;;) {
      seen = wait_for_job(seen, pre);
      uint64_t w = job.load(std::memory_order_acquire);
      while (!(w & kClosed)) {
        if (slot_of(w) >= slots_of(w)) break;
        if (job.compare_exchange_weak(w, w + kSlot + kActive, std::memory_order_acq_rel)) {
          fn.load(std::memory_order_relaxed)(ctx.load(std::memory_order_relaxed), int(slot_of(w)));
          job.fetch_sub(kActive, std::memory_order_release);
          break;
        }
      }
    }
  }

  void run(int nslots, WorkerPool::Fn f, void* c) {
    std::unique_lock<std::mutex> lock(mu, std::try_to_lock);
    if (!lock.owns_lock()) return f(c, 0);
    nslots = std::min(nslots, kMaxSlots);
    while (int(workers.size()) < nslots - 1) workers.emplace_back([this] { worker_loop(); });
    fn.store(f, std::memory_order_relaxed);
    ctx.store(c, std::memory_order_relaxed);
    ++number;
    // Open, slot 0 being the caller's.
    job.store((number << kJobShift) | (uint64_t(nslots) << kSlotsShift) | kSlot, std::memory_order_release);
    wake.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all();
    // Closed on every way out, an exception from the caller's share included: the job lives in the
    // caller's frame, so no worker may still be inside it once run() is left.
    struct Close {
      Pool& p;
      ~Close() {
        t_inside_job = false;
        p.close_and_wait();
      }
    } close{*this};
    t_inside_job = true;
    f(c, 0);
  }

  // From here no worker joins; waits for those inside (each finishing work it has claimed).
  void close_and_wait() {
    uint64_t w = job.fetch_or(kClosed, std::memory_order_acq_rel) | kClosed;
    for (int i = 0; active_of(w) != 0; ++i) {
      if (i < 4096) _mm_pause();
      else sched_yield();  // a participant was descheduled mid-claim: let it run
      w = job.load(std::memory_order_acquire);
    }
  }
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: its workers outlive static destruction
  return *p;
}

}  // namespace

int WorkerPool::threads() { return omp_get_max_threads(); }

void WorkerPool::run_impl(int slots, Fn fn, void* ctx) {
  if (slots <= 1 || t_inside_job || omp_in_parallel()) return fn(ctx, 0);
  pool().run(slots, fn, ctx);
}

}  // namespace m3
