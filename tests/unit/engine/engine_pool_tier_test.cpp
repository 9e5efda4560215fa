// The local KV tier: pages evicted from a small pool are offloaded (lazily, on eviction) and loaded
// back on a prefix hit instead of recomputed; outputs equal a run without any tier. In host memory and
// in a folder (found again after a restart); a corrupted page file is detected by its checksum and
// recomputed; pages of another cache layout are never loaded. Built into loader_tests, so `make
// test-asan` runs it under ASan + UBSan + LeakSanitizer too.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "engine_test_util.h"
#include "base/error.h"
#include "model/model.h"

namespace {

m3::Model& model() {
  static m3::Model m(m3test::small_engine_model());
  return m;
}

using m3test::greedy;

m3::EngineConfig small_pool(double tier_gib, const std::string& dir = {}) {
  m3::EngineConfig c;
  c.num_pages = 12;  // 192 tokens: one other request evicts the conversation's prefix
  c.max_num_batched_tokens = 64;
  c.watermark = 0;
  c.kv_offloading_gib = tier_gib;
  c.kv_offloading_dir = dir;
  return c;
}

struct Turn {
  std::vector<int32_t> tokens;
  int64_t cached = 0;
};

Turn run(m3::Engine& e, const std::string& id, const std::vector<int32_t>& prompt, int n) {
  e.add_request(id, prompt, greedy(n));
  Turn r;
  while (e.has_work())
    for (auto& o : e.step())
      if (o.request_id == id) {
        r.tokens.insert(r.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
        r.cached = o.num_cached_tokens;
      }
  return r;
}

// Turn 1 of a conversation (a 128-token prefix), traffic that evicts it from the pool, then turn 2.
struct Workload {
  std::vector<int32_t> prefix, turn1, turn2;
  std::vector<std::vector<int32_t>> others;
  Workload() {
    std::mt19937 rng(21);
    prefix = m3test::random_tokens(rng, 128, 256);
    turn1 = prefix;
    const auto q1 = m3test::random_tokens(rng, 10, 256);
    turn1.insert(turn1.end(), q1.begin(), q1.end());
    turn2 = prefix;
    const auto q2 = m3test::random_tokens(rng, 20, 256);
    turn2.insert(turn2.end(), q2.begin(), q2.end());
    for (int i = 0; i < 3; ++i) others.push_back(m3test::random_tokens(rng, 150, 256));
  }
};

Turn turn2_without_tier(const Workload& w) {
  m3::EngineConfig c;
  c.num_pages = 40;
  c.enable_prefix_caching = false;
  m3::Engine e(model(), nullptr, c);
  return run(e, "ref", w.turn2, 8);
}

Turn conversation(m3::Engine& e, const Workload& w) {
  run(e, "t1", w.turn1, 4);
  for (size_t i = 0; i < w.others.size(); ++i) run(e, "o" + std::to_string(i), w.others[i], 4);
  return run(e, "t2", w.turn2, 8);
}

TEST(KvTier, EvictedPrefixLoadsFromHostMemoryInsteadOfRecomputing) {
  const Workload w;
  const Turn ref = turn2_without_tier(w);
  {
    // Without a tier the prefix was evicted: recomputed.
    m3::Engine e(model(), nullptr, small_pool(0));
    EXPECT_EQ(conversation(e, w).cached, 0);
  }
  m3::Engine e(model(), nullptr, small_pool(0.01));
  const Turn r = conversation(e, w);
  const auto st = e.stats();
  EXPECT_GE(r.cached, 128 * 9 / 10) << "the 128-token prefix should come from the tier";
  EXPECT_EQ(r.tokens, ref.tokens);
  EXPECT_GT(st.tier_offloaded_pages, 0);
  EXPECT_GE(st.tier_loaded_pages, 8);  // 8 pages of 16
  EXPECT_EQ(st.tier_load_failures, 0);
  EXPECT_EQ(st.free_pages, st.total_pages);
}

// Eager offload (SimpleCPUOffloadConnector's lazy_offload: false): the prefix pages are in the host
// tier as soon as they are computed, before any eviction; the returning turn loads them after other
// traffic evicted them from the pool, with the output of a run without any tier.
TEST(KvTier, EagerOffloadWritesPagesAsComputed) {
  const Workload w;
  const Turn ref = turn2_without_tier(w);
  m3::EngineConfig c = small_pool(0.01);
  c.kv_offloading_lazy = false;
  m3::Engine e(model(), nullptr, c);
  run(e, "t1", w.turn1, 4);
  EXPECT_GE(e.stats().tier.stored_pages, 8) << "the 8 prefix pages should be offloaded as computed";
  const int64_t stored = e.stats().tier.stored_pages;
  for (size_t i = 0; i < w.others.size(); ++i) run(e, "o" + std::to_string(i), w.others[i], 4);
  const Turn r = run(e, "t2", w.turn2, 8);
  EXPECT_GE(r.cached, 128 * 9 / 10);
  EXPECT_EQ(r.tokens, ref.tokens);
  // Evicting a page already in the tier writes nothing again.
  EXPECT_LE(e.stats().tier.stored_pages, stored + int64_t(w.others.size() * 12 + 16));
}

TEST(KvTier, FolderTierSurvivesARestartAndRefusesCorruptedPages) {
  const Workload w;
  const Turn ref = turn2_without_tier(w);
  const std::string dir = m3test::test_tmp_dir() + "/kv_tier_disk";
  std::filesystem::remove_all(dir);
  std::string folder;
  {
    m3::Engine e(model(), nullptr, small_pool(0.01, dir));
    run(e, "t1", w.turn1, 4);
    for (size_t i = 0; i < w.others.size(); ++i) run(e, "o" + std::to_string(i), w.others[i], 4);
    EXPECT_GT(e.stats().tier_offloaded_pages, 0);
    folder = static_cast<m3::LocalKvTier*>(e.kv_tier())->folder();
  }  // the tier writes everything before the engine goes
  size_t files = 0;
  for (const auto& f : std::filesystem::directory_iterator(folder)) files += f.path().extension() == ".kvpage";
  EXPECT_GT(files, 8u);
  {
    // A new process (a new engine) finds the prefix in the folder.
    m3::Engine e(model(), nullptr, small_pool(0.01, dir));
    const Turn r = run(e, "t2", w.turn2, 8);
    EXPECT_GE(r.cached, 128 * 9 / 10);
    EXPECT_EQ(r.tokens, ref.tokens);
    EXPECT_EQ(e.stats().tier_load_failures, 0);
  }
  // Damage the payload of every stored page: each is detected, dropped and recomputed.
  for (const auto& f : std::filesystem::directory_iterator(folder)) {
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(-5, std::ios::end);
    io.put('\x5a');
  }
  {
    m3::Engine e(model(), nullptr, small_pool(0.01, dir));
    const Turn r = run(e, "t2", w.turn2, 8);
    EXPECT_EQ(r.cached, 0);
    EXPECT_EQ(r.tokens, ref.tokens);
    EXPECT_GE(e.stats().tier_load_failures, 1);
  }
  // Another cache layout (fp8 KV) uses another subfolder: nothing of the bf16 pages is loaded.
  {
    m3::EngineConfig c = small_pool(0.01, dir);
    c.kv_cache_dtype = "fp8";
    m3::Engine e(model(), nullptr, c);
    EXPECT_NE(static_cast<m3::LocalKvTier*>(e.kv_tier())->folder(), folder);
    EXPECT_EQ(run(e, "t2", w.turn2, 8).cached, 0);
  }
}

// A shared tier that fetches ahead, under the test's control: what Redis does over the network.
class FakeSharedTier : public m3::KvTier {
 public:
  explicit FakeSharedTier(std::map<uint64_t, std::string>& store) : store_(store) {}
  const char* name() const override { return "fake-shared"; }
  void put(uint64_t hash, std::string&& blob) override { store_[hash] = std::move(blob); }
  m3::TierRead get(uint64_t hash, std::string& out) override {
    if (failing.count(hash)) return m3::TierRead::Failed;  // held, but the transfer breaks off
    auto it = store_.find(hash);
    if (it == store_.end()) return m3::TierRead::Miss;
    out = it->second;
    return m3::TierRead::Hit;
  }
  void erase(uint64_t hash) override { store_.erase(hash); }
  m3::KvTierStats stats() const override { return {}; }
  // Only a fetch that brings pages holds its request back (a round with nothing to bring ends at once).
  bool prefetch(uint64_t ticket, const std::vector<uint64_t>& hashes) override {
    bool any = false;
    for (uint64_t h : hashes) any |= store_.count(h) > 0;
    if (!any) return false;
    ++prefetches;
    pending.insert(ticket);
    return true;
  }
  bool fetched(uint64_t ticket) override { return !hold || !pending.count(ticket); }
  std::set<uint64_t> pending;
  std::set<uint64_t> failing;  // pages whose load fails
  bool hold = false;  // fetches do not end until the test clears it
  int prefetches = 0;

 private:
  std::map<uint64_t, std::string>& store_;
};

// Instance A computes a conversation's first turn (its pages go to the shared store as computed);
// instance B continues it: the turn waits for its pages off the queue while another request runs to
// completion, then loads them instead of recomputing, with the output of a run without any tier.
TEST(KvTier, SharedTierFetchAheadLetsOthersRun) {
  const Workload w;
  const Turn ref = turn2_without_tier(w);
  std::map<uint64_t, std::string> store;
  {
    m3::Engine a(model(), nullptr, small_pool(0));
    a.set_shared_tier(std::make_unique<FakeSharedTier>(store), false);
    run(a, "t1", w.turn1, 4);
  }
  ASSERT_GE(store.size(), 8u);  // the 8 prefix pages (and not the generated ones: save_decode off)
  m3::Engine b(model(), nullptr, small_pool(0));
  auto tier = std::make_unique<FakeSharedTier>(store);
  FakeSharedTier* t = tier.get();
  t->hold = true;
  b.set_shared_tier(std::move(tier), false);
  b.add_request("t2", w.turn2, greedy(8));
  b.add_request("other", w.others[0], greedy(4));
  std::map<std::string, Turn> got;
  auto step = [&] {
    for (auto& o : b.step()) {
      auto& g = got[o.request_id];
      g.tokens.insert(g.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      g.cached = o.num_cached_tokens;
    }
  };
  for (int i = 0; i < 200 && got["other"].tokens.size() < 4; ++i) step();
  EXPECT_EQ(got["other"].tokens.size(), 4u) << "the other request should run while t2 waits for its pages";
  EXPECT_TRUE(got["t2"].tokens.empty()) << "t2 ran before its pages arrived";
  EXPECT_GE(t->prefetches, 1);
  t->hold = false;
  for (int i = 0; i < 1000 && b.has_work(); ++i) step();
  EXPECT_FALSE(b.has_work());
  EXPECT_GE(got["t2"].cached, 128 * 9 / 10);
  EXPECT_EQ(got["t2"].tokens, ref.tokens);
  EXPECT_EQ(b.stats().free_pages, b.stats().total_pages);
}

// kv_load_failure_policy: a page the shared tier holds but cannot deliver (the transfer breaks off)
// is recomputed under "recompute" (same output, fewer cached tokens) and ends the request with an
// error naming the page under "fail"; either way every page returns to the pool and the next request
// is served. A page that fails verification counts as a failed load too.
TEST(KvTier, LoadFailurePolicy) {
  const Workload w;
  const Turn ref = turn2_without_tier(w);
  std::map<uint64_t, std::string> store;
  {
    m3::Engine a(model(), nullptr, small_pool(0));
    a.set_shared_tier(std::make_unique<FakeSharedTier>(store), false);
    run(a, "t1", w.turn1, 4);
  }
  ASSERT_GE(store.size(), 8u);
  // The fourth prefix page is the one whose load fails (the chain's order: hash of parent and tokens).
  std::vector<uint64_t> chain;
  for (auto& [h, blob] : store) chain.push_back(h);
  for (const std::string policy : {"recompute", "fail"}) {
    m3::EngineConfig c = small_pool(0);
    c.kv_load_failure_policy = policy;
    m3::Engine b(model(), nullptr, c);
    auto tier = std::make_unique<FakeSharedTier>(store);
    for (uint64_t h : chain) tier->failing.insert(h);  // every held page fails to load
    b.set_shared_tier(std::move(tier), false);
    b.add_request("t2", w.turn2, greedy(8));
    Turn got;
    std::string error;
    m3::FinishReason reason = m3::FinishReason::None;
    while (b.has_work())
      for (auto& o : b.step()) {
        got.tokens.insert(got.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
        got.cached = o.num_cached_tokens;
        if (o.finished) reason = o.finish_reason, error = o.error;
      }
    if (policy == "recompute") {
      EXPECT_EQ(reason, m3::FinishReason::Length);
      EXPECT_EQ(got.tokens, ref.tokens);
      EXPECT_EQ(got.cached, 0);
    } else {
      EXPECT_EQ(reason, m3::FinishReason::Error);
      EXPECT_TRUE(got.tokens.empty());
      EXPECT_NE(error.find("could not be loaded from the fake-shared tier"), std::string::npos) << error;
      EXPECT_NE(error.find("kv_load_failure_policy"), std::string::npos) << error;
    }
    EXPECT_GE(b.stats().tier_load_failures, 1);
    EXPECT_EQ(b.stats().free_pages, b.stats().total_pages);
    // The engine goes on: the next request is served.
    EXPECT_EQ(run(b, "next", w.others[0], 4).tokens.size(), 4u);
  }
  // A corrupted page in a local folder tier, policy "fail": the request fails, naming the check.
  const std::string dir = m3test::test_tmp_dir() + "/kv_tier_fail";
  std::filesystem::remove_all(dir);
  std::string folder;
  {
    m3::Engine e(model(), nullptr, small_pool(0.01, dir));
    run(e, "t1", w.turn1, 4);
    for (size_t i = 0; i < w.others.size(); ++i) run(e, "o" + std::to_string(i), w.others[i], 4);
    folder = static_cast<m3::LocalKvTier*>(e.kv_tier())->folder();
  }
  for (const auto& f : std::filesystem::directory_iterator(folder)) {
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(-5, std::ios::end);
    io.put('\x5a');
  }
  m3::EngineConfig c = small_pool(0.01, dir);
  c.kv_load_failure_policy = "fail";
  m3::Engine e(model(), nullptr, c);
  e.add_request("t2", w.turn2, greedy(8));
  std::string error;
  while (e.has_work())
    for (auto& o : e.step())
      if (o.finished) {
        EXPECT_EQ(o.finish_reason, m3::FinishReason::Error);
        error = o.error;
      }
  EXPECT_NE(error.find("failed verification"), std::string::npos) << error;
  EXPECT_EQ(e.stats().free_pages, e.stats().total_pages);
  m3::EngineConfig bad = small_pool(0);
  bad.kv_load_failure_policy = "retry";
  EXPECT_THROW(m3::Engine(model(), nullptr, bad), m3::Error);
}

TEST(KvTier, FlagErrors) {
  m3::EngineConfig c = small_pool(0);
  c.kv_offloading_dir = "/tmp/x";
  EXPECT_THROW(m3::Engine(model(), nullptr, c), m3::Error);
  c = small_pool(0.01);
  c.enable_prefix_caching = false;
  EXPECT_THROW(m3::Engine(model(), nullptr, c), m3::Error);
}

}  // namespace
