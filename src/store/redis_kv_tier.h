// A KV tier shared by every engine that points at the same Redis (Debian's redis-server, through
// hiredis): page blobs under "m3kv:<layout id>:<page hash>", so only engines with the same model and
// cache layout ever see each other's pages (and each blob is verified again when loaded).
//
// Writes go through a bounded queue to a writer thread with its own connection (pipelined SETs): a
// step never waits on Redis to store. Reads are fetched ahead: when a request is first admitted, the
// prefix pages the pool lacks are fetched by a third connection on its own thread (prefetch),
// while the request waits off the queue and the others run; its lookups then answer from what
// arrived. A lookup that was not fetched ahead is a GET on the engine thread, with a timeout. When Redis is unreachable or times out, lookups answer "not
// here" at once for a second before reconnecting, and writes are dropped (counted): requests are
// recomputed, never hung, and the tier recovers by itself when Redis comes back.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/kv_tier.h"

struct redisContext;

namespace m3::store {

struct RedisTierOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  int timeout_ms = 500;         // connect and command timeout
  size_t max_pending = 4096;    // pages queued for writing; more are dropped
  int64_t ttl_seconds = 0;      // 0: no expiry (Redis' own maxmemory policy decides)
  size_t prefetch_bytes = size_t(1) << 30;  // pages fetched ahead and not yet taken, at most
  // "redis://host:port" -> host, port; throws m3::Error naming the URL.
  static RedisTierOptions from_url(const std::string& url);
};

class RedisKvTier : public KvTier {
 public:
  RedisKvTier(const RedisTierOptions& opt, uint64_t layout_id, size_t blob_bytes);
  ~RedisKvTier() override;  // writes what is queued (at most a few seconds), then closes
  const char* name() const override { return "redis"; }
  void put(uint64_t hash, std::string&& blob) override;
  TierRead get(uint64_t hash, std::string& out) override;
  void erase(uint64_t hash) override;
  KvTierStats stats() const override;
  bool prefetch(uint64_t ticket, const std::vector<uint64_t>& hashes) override;
  bool fetched(uint64_t ticket) override;
  void wait_fetch(std::chrono::milliseconds timeout) override;
  // Waits until the queued writes are done (tests).
  void flush();
  int64_t errors() const { return errors_.load(); }
  int64_t dropped_writes() const { return dropped_.load(); }

 private:
  struct Conn;
  std::string key(uint64_t hash) const;
  bool ensure(Conn& c);  // connected, or false (backing off)
  void writer();
  void fetcher();

  RedisTierOptions opt_;
  std::string prefix_;
  size_t blob_bytes_;
  std::unique_ptr<Conn> read_, write_, fetch_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::pair<uint64_t, std::string>> pending_;
  bool writing_ = false, stop_ = false;
  KvTierStats st_;
  std::atomic<int64_t> errors_{0}, dropped_{0};
  std::thread thread_;
  // Fetching ahead (under mu_): tickets queued or in flight, and the pages that arrived (an empty
  // string records a page Redis does not hold), oldest first out past prefetch_bytes.
  std::condition_variable fetch_cv_, fetched_cv_;
  std::deque<std::pair<uint64_t, std::vector<uint64_t>>> fetch_q_;
  std::unordered_set<uint64_t> fetch_pending_;
  std::unordered_map<uint64_t, std::string> prefetched_;
  // Pages Redis said it holds (EXISTS) whose GET then failed: a failed load, not a miss.
  std::unordered_set<uint64_t> prefetch_failed_;
  std::deque<uint64_t> prefetched_order_;
  size_t prefetched_bytes_ = 0;
  // Redis did not answer (a timeout, a lost connection): until then no read path waits on it again (a
  // frozen Redis cost every request timeout_ms per path before); the wait doubles per failure in a row. Set and cleared under mu_, with one
  // log line when it goes down and one when it answers again.
  std::chrono::steady_clock::time_point down_until_{};
  std::chrono::milliseconds down_for_{0};  // the back-off: 1 s, doubled per failure in a row, at most 30 s
  bool down_logged_ = false;
  void mark_down(const char* what);  // the caller holds mu_
  void mark_up();                    // the caller holds mu_
  std::thread fetch_thread_;
};

}  // namespace m3::store
