// Page bookkeeping: reference counts, LRU eviction of cached pages, exact prefix-cache lookups, and
// 1000 requests with random aborts leaving the pool exactly as it started (also run under
// LeakSanitizer by `make test-asan`).
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "engine/block_pool.h"
#include "engine/kv_pool.h"
#include "engine_test_util.h"
#include "model/model.h"

namespace {

TEST(EnginePool, RefcountsAndLruEviction) {
  m3::BlockPool pool(4, 2, true);
  EXPECT_EQ(pool.num_free(), 4);
  const int32_t a = pool.allocate(), b = pool.allocate();
  EXPECT_EQ(pool.num_free(), 2);
  const int32_t ta[2] = {1, 2}, tb[2] = {3, 4};
  const uint64_t ha = m3::hash_block(0, ta, 2), hb = m3::hash_block(ha, tb, 2);
  pool.publish(a, ha, 0, ta);
  pool.publish(b, hb, ha, tb);
  pool.release(b);
  pool.release(a);  // a freed last: evicted last
  EXPECT_EQ(pool.num_free(), 4);
  // A cached page can be taken back while free.
  EXPECT_EQ(pool.acquire_cached(ha, 0, ta), a);
  EXPECT_EQ(pool.refcount(a), 1);
  EXPECT_EQ(pool.acquire_cached(ha, 0, ta), a);
  EXPECT_EQ(pool.refcount(a), 2);
  pool.release(a);
  pool.release(a);
  // Wrong parent or tokens never hit, even with the right hash.
  const int32_t other[2] = {1, 3};
  EXPECT_EQ(pool.acquire_cached(ha, 0, other), -1);
  EXPECT_EQ(pool.acquire_cached(ha, 7, ta), -1);
  // Allocation takes the never-cached pages first, then b (freed before a), then a.
  const int32_t c = pool.allocate(), d = pool.allocate(), e = pool.allocate();
  EXPECT_NE(c, a);
  EXPECT_NE(c, b);
  EXPECT_NE(d, a);
  EXPECT_NE(d, b);
  EXPECT_EQ(e, b);
  EXPECT_FALSE(pool.is_cached(b));
  EXPECT_EQ(pool.acquire_cached(hb, ha, tb), -1);
  EXPECT_EQ(pool.acquire_cached(ha, 0, ta), a);
  EXPECT_EQ(pool.allocate(), -1);
}

TEST(EnginePool, ThousandRequestsWithAbortsLeaveThePoolAsItStarted) {
  m3::Model model(m3test::small_engine_model());
  m3::EngineConfig c;
  c.num_pages = 10;  // small: preemption happens too
  c.max_num_batched_tokens = 96;
  c.max_num_seqs = 16;
  c.watermark = 0.0;
  m3::Engine e(model, nullptr, c);
  const int64_t total = e.stats().total_pages;
  std::mt19937 rng(1);
  const auto shared = m3test::random_tokens(rng, 48, 256);
  std::vector<std::string> live;
  int added = 0, aborted = 0, finished = 0;
  while (added < 1000 || e.has_work()) {
    for (int k = 0; k < 4 && added < 1000; ++k, ++added) {
      std::vector<int32_t> p;
      if (rng() % 2) p = shared;
      const auto more = m3test::random_tokens(rng, 1 + rng() % 60, 256);
      p.insert(p.end(), more.begin(), more.end());
      m3::SamplingParams sp;
      sp.temperature = (rng() % 2) ? 0.0f : 0.8f;
      sp.max_tokens = 1 + int(rng() % 6);
      sp.ignore_eos = true;
      const std::string id = std::to_string(added);
      e.add_request(id, p, sp);
      live.push_back(id);
    }
    if (!live.empty() && rng() % 3 == 0) {
      const size_t i = rng() % live.size();
      if (e.abort(live[i])) ++aborted;
      live.erase(live.begin() + long(i));
    }
    for (const auto& o : e.step())
      if (o.finished) {
        ++finished;
        live.erase(std::remove(live.begin(), live.end(), o.request_id), live.end());
      }
  }
  std::printf("1000 requests: %d finished, %d aborted, %lld preemptions\n", finished, aborted,
              (long long)e.stats().preemptions);
  EXPECT_EQ(finished + aborted, 1000);
  EXPECT_GT(aborted, 50);
  EXPECT_EQ(e.stats().free_pages, total);
  for (int32_t b = 0; b < total; ++b) EXPECT_EQ(e.block_pool().refcount(b), 0) << "page " << b;
  EXPECT_EQ(e.stats().running, 0u);
  EXPECT_EQ(e.stats().waiting, 0u);
}

}  // namespace

namespace {

// Resident bytes of this process (/proc/self/statm), -1 if unknown.
int64_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long size = 0, resident = 0;
  const int n = std::fscanf(f, "%ld %ld", &size, &resident);
  std::fclose(f);
  return n == 2 ? int64_t(resident) * 4096 : -1;
}

// The KV pool's memory is committed when the pool is made (no page faults inside a decode step).
TEST(EnginePool, KvPoolMemoryIsResidentOnceMade) {
  m3::Model model(m3test::small_engine_model());
  const m3::ModelConfig& c = model.config();
  const size_t page = m3::KVPool::page_bytes(c, 128, m3::KVDtype::BF16, m3::KVDtype::BF16);
  const int64_t pages = int64_t((size_t(64) << 20) / page) + 1;  // >= 64 MiB
  const int64_t before = resident_bytes();
  if (before < 0) GTEST_SKIP() << "no /proc/self/statm";
  m3::KVPool pool(c, 128, m3::KVDtype::BF16, m3::KVDtype::BF16, pages);
  EXPECT_GE(resident_bytes() - before, int64_t(page) * pages * 9 / 10);
}

// With the default memory, a pool sized by kv_tokens_needed holds that many tokens and a page per
// sequence; an explicit size wins.
TEST(EnginePool, PoolSizedToTheTokensNeeded) {
  m3::Model model(m3test::small_engine_model());
  m3::EngineConfig c;
  c.kv_tokens_needed = 1000;
  c.kv_sequences = 2;
  const int B = model.config().any_sparse() ? model.config().block_size : 128;
  EXPECT_EQ(m3::Engine(model, nullptr, c).stats().total_pages, (1000 + B - 1) / B + 2);
  c.num_pages = 40;
  EXPECT_EQ(m3::Engine(model, nullptr, c).stats().total_pages, 40);
}

}  // namespace
