// A KV tier shared by every engine that points at the same Redis (Debian's redis-server, through
// hiredis): page blobs under "m3kv:<layout id>:<page hash>", so only engines with the same model and
// cache layout ever see each other's pages (and each blob is verified again when loaded).
//
// Writes go through a bounded queue to a writer thread with its own connection (pipelined SETs): a
// step never waits on Redis to store. Reads happen on the engine thread when a prefix misses the pool
// and the local tier, with a timeout. When Redis is unreachable or times out, lookups answer "not
// here" at once for a second before reconnecting, and writes are dropped (counted): requests are
// recomputed, never hung, and the tier recovers by itself when Redis comes back.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "engine/kv_tier.h"

struct redisContext;

namespace m3::store {

struct RedisTierOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  int timeout_ms = 500;         // connect and command timeout
  size_t max_pending = 4096;    // pages queued for writing; more are dropped
  int64_t ttl_seconds = 0;      // 0: no expiry (Redis' own maxmemory policy decides)
  // "redis://host:port" -> host, port; throws m3::Error naming the URL.
  static RedisTierOptions from_url(const std::string& url);
};

class RedisKvTier : public KvTier {
 public:
  RedisKvTier(const RedisTierOptions& opt, uint64_t layout_id, size_t blob_bytes);
  ~RedisKvTier() override;  // writes what is queued (at most a few seconds), then closes
  const char* name() const override { return "redis"; }
  void put(uint64_t hash, std::string&& blob) override;
  bool get(uint64_t hash, std::string& out) override;
  void erase(uint64_t hash) override;
  KvTierStats stats() const override;
  // Waits until the queued writes are done (tests).
  void flush();
  int64_t errors() const { return errors_.load(); }
  int64_t dropped_writes() const { return dropped_.load(); }

 private:
  struct Conn;
  std::string key(uint64_t hash) const;
  bool ensure(Conn& c);  // connected, or false (backing off)
  void writer();

  RedisTierOptions opt_;
  std::string prefix_;
  size_t blob_bytes_;
  std::unique_ptr<Conn> read_, write_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::pair<uint64_t, std::string>> pending_;
  bool writing_ = false, stop_ = false;
  KvTierStats st_;
  std::atomic<int64_t> errors_{0}, dropped_{0};
  std::thread thread_;
};

}  // namespace m3::store
