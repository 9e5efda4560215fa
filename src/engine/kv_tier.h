// KV tiers: stores of page blobs (kv_page_codec.h) beyond the pool, keyed by the page's prefix-chain
// hash. Pages that leave the pool (evicted for reuse) are offloaded to a tier; a prefix lookup that
// misses the pool asks the tier before recomputing. A tier only stores and returns bytes: the codec
// verifies every blob against the page it should be before the pool takes it.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace m3 {

// What a tier read gives: the page, no page (not stored: the block is simply computed), or a failed
// load of a page the tier holds (unreadable, cut off mid-transfer): the request's
// kv_load_failure_policy decides (recompute the block, or fail the request).
enum class TierRead { Hit, Miss, Failed };

struct KvTierStats {
  int64_t stored_pages = 0;   // put() calls accepted
  int64_t hits = 0, misses = 0;
  int64_t bytes_written = 0, bytes_read = 0;
  int64_t evicted_pages = 0;  // dropped to stay within the size
  int64_t held_pages = 0, held_bytes = 0;
  double read_seconds = 0;
};

class KvTier {
 public:
  virtual ~KvTier() = default;
  virtual const char* name() const = 0;
  // Stores a page (may complete asynchronously; a later get() sees it at once).
  virtual void put(uint64_t hash, std::string&& blob) = 0;
  // Copies the page into `out` if held.
  virtual TierRead get(uint64_t hash, std::string& out) = 0;
  // Drops a page (one that failed verification).
  virtual void erase(uint64_t hash) = 0;
  virtual KvTierStats stats() const = 0;

  // Tiers behind a network fetch ahead: prefetch() starts fetching these pages in the background (true
  // when it did), fetched() says when the fetch under `ticket` is over (once true, it forgets the
  // ticket), and get() then answers from what was fetched without a round trip. wait_fetch() waits a
  // little for any fetch to end. Local tiers answer at once and keep the defaults.
  virtual bool prefetch(uint64_t ticket, const std::vector<uint64_t>& hashes) { return false; }
  // Whether the tier holds the page now, answered at once (local tiers; remote ones say false).
  virtual bool holds(uint64_t hash) { return false; }
  virtual bool fetched(uint64_t ticket) { return true; }
  virtual void wait_fetch(std::chrono::milliseconds timeout) {}
};

// A local tier of at most `max_bytes`, least recently used out first: in memory, or (with a directory)
// in files there, written by a background thread (off the engine step), and found again after a
// restart (files of another layout live in another subfolder; every page is verified when loaded).
class LocalKvTier : public KvTier {
 public:
  // `dir` empty: memory only. `layout_id` names the subfolder. `blob_bytes`: the size of every page.
  LocalKvTier(int64_t max_bytes, const std::string& dir, uint64_t layout_id, size_t blob_bytes);
  ~LocalKvTier() override;
  const char* name() const override { return dir_.empty() ? "memory" : "disk"; }
  void put(uint64_t hash, std::string&& blob) override;
  TierRead get(uint64_t hash, std::string& out) override;
  void erase(uint64_t hash) override;
  KvTierStats stats() const override;
  bool holds(uint64_t hash) override;
  // Waits until every page put so far is on disk (tests, shutdown).
  void flush();
  const std::string& folder() const { return dir_; }

 private:
  struct Entry {
    std::string blob;  // memory mode, or not yet written
    bool on_disk = false;
    std::list<uint64_t>::iterator lru;
  };
  std::string path(uint64_t hash) const;
  void evict_to_fit();  // under mu_
  void writer();

  int64_t max_bytes_;
  std::string dir_;
  size_t blob_bytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::unordered_map<uint64_t, Entry> map_;
  std::list<uint64_t> lru_;  // front = most recently used
  std::deque<uint64_t> pending_;  // pages to write
  bool writing_ = false, stop_ = false;
  KvTierStats st_;
  std::thread thread_;
};

}  // namespace m3
