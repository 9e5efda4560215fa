// The worker pool (src/kernels/cpu/worker_pool.h): every index of a job is done exactly once whoever
// joins, the caller returns only after every participant has left the job, nested and concurrent
// calls run alone, and a step's bits do not depend on which thread took which chunk.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/cpu/worker_pool.h"

namespace {

using m3::WorkerPool;

// Restores OpenMP's thread count (the pool's participant count) when a test changes it.
struct ThreadCount {
  int saved = omp_get_max_threads();
  explicit ThreadCount(int n) { omp_set_num_threads(n); }
  ~ThreadCount() { omp_set_num_threads(saved); }
};

TEST(WorkerPool, ParallelForCoversEveryIndexOnce) {
  ThreadCount tc(4);
  for (int64_t n : {0, 1, 7, 64, 1000, 4097})
    for (int64_t grain : {1, 3, 64, 5000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      for (int rep = 0; rep < 20; ++rep)
        WorkerPool::parallel_for(n, grain, [&](int64_t lo, int64_t hi) {
          ASSERT_LT(lo, hi);
          ASSERT_LE(hi - lo, grain);
          for (int64_t i = lo; i < hi; ++i) hits[size_t(i)].fetch_add(1);
        });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 20) << "n " << n << " grain " << grain << " i " << i;
    }
}

TEST(WorkerPool, SlotsAreDistinctAndTheCallerIsSlotZero) {
  ThreadCount tc(3);
  const std::thread::id caller = std::this_thread::get_id();
  for (int rep = 0; rep < 200; ++rep) {
    std::atomic<int> seen[3] = {0, 0, 0};
    std::atomic<bool> zero_on_caller{false};
    WorkerPool::run(3, [&](int slot) {
      ASSERT_GE(slot, 0);
      ASSERT_LT(slot, 3);
      seen[slot].fetch_add(1);
      if (slot == 0) zero_on_caller = std::this_thread::get_id() == caller;
    });
    EXPECT_EQ(seen[0].load(), 1);
    EXPECT_LE(seen[1].load(), 1);
    EXPECT_LE(seen[2].load(), 1);
    EXPECT_TRUE(zero_on_caller.load());
  }
}

// A participant still inside the job keeps run() from returning: the job's state lives on the
// caller's stack, so returning early would let a late worker write into a dead frame.
TEST(WorkerPool, ReturnsOnlyAfterEveryParticipantHasLeft) {
  ThreadCount tc(2);
  for (int rep = 0; rep < 200; ++rep) {
    std::atomic<int> inside{0};
    std::atomic<int64_t> next{0};
    WorkerPool::run(2, [&](int) {
      inside.fetch_add(1);
      // Small items, so that the worker, when it joins, is often still busy as the caller runs dry.
      for (int64_t i; (i = next.fetch_add(1)) < 64;) {
        volatile double x = 0;
        for (int k = 0; k < 200; ++k) x = x + double(k) * 1e-9;
      }
      inside.fetch_sub(1);
    });
    ASSERT_EQ(inside.load(), 0) << "rep " << rep;
    ASSERT_GE(next.load(), 64);
  }
}

// An exception from the caller's share leaves run() only after the workers have left the job, and the
// pool serves the next job.
TEST(WorkerPool, AnExceptionInTheCallersShareClosesTheJob) {
  ThreadCount tc(2);
  for (int rep = 0; rep < 50; ++rep) {
    std::atomic<int> inside{0};
    std::atomic<int64_t> next{0};
    EXPECT_THROW(WorkerPool::run(2,
                                 [&](int slot) {
                                   inside.fetch_add(1);
                                   for (int64_t i; (i = next.fetch_add(1)) < 32;) {
                                     volatile double x = 0;
                                     for (int k = 0; k < 200; ++k) x = x + double(k) * 1e-9;
                                   }
                                   inside.fetch_sub(1);
                                   if (slot == 0) throw std::runtime_error("caller's share failed");
                                 }),
                 std::runtime_error);
    ASSERT_EQ(inside.load(), 0);
  }
  std::atomic<int64_t> done{0};
  WorkerPool::parallel_for(100, 1, [&](int64_t a, int64_t b) { done.fetch_add(b - a); });
  EXPECT_EQ(done.load(), 100);
}

TEST(WorkerPool, NestedAndConcurrentCallsRunAlone) {
  ThreadCount tc(2);
  std::atomic<int64_t> total{0};
  auto job = [&] {
    WorkerPool::parallel_for(1000, 10, [&](int64_t lo, int64_t hi) {
      // A nested call inside a pool job runs on the participant's own thread.
      WorkerPool::parallel_for(hi - lo, 1, [&](int64_t a, int64_t b) { total.fetch_add(b - a); });
    });
  };
  std::thread other([&] {
    for (int rep = 0; rep < 50; ++rep) job();
  });
  for (int rep = 0; rep < 50; ++rep) job();
  other.join();
  EXPECT_EQ(total.load(), 100 * 1000);
  // Inside an OpenMP region the pool is not used either.
  std::atomic<int64_t> in_omp{0};
  std::atomic<int> team{0};
#pragma omp parallel num_threads(2)
  {
    team.fetch_add(1);
    WorkerPool::parallel_for(100, 1, [&](int64_t a, int64_t b) { in_omp.fetch_add(b - a); });
  }
  EXPECT_EQ(in_omp.load(), 100 * team.load());
}

}  // namespace
