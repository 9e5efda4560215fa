// BlockPool: bookkeeping of the KV pages (vLLM's block pool): reference counts, a free queue in
// LRU order, and the prefix cache. A full page is identified by a hash chain H(parent hash, its
// token ids); the page keeps its hash and tokens after it is freed, so a later request with the
// same prefix can take it back until it is evicted (least recently freed first). Lookups compare
// the stored parent hash and token ids too, so a hash collision can never hand out wrong KV.
#pragma once
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "engine/kv_events.h"

namespace m3 {

uint64_t hash_block(uint64_t parent, const int32_t* tokens, int n);

class BlockPool {
 public:
  BlockPool(int64_t num_blocks, int block_size, bool enable_caching);

  int64_t num_blocks() const { return n_; }
  int64_t num_free() const { return free_count_; }  // free, including cached pages that may be evicted
  bool caching() const { return caching_; }

  // Takes the least recently freed page (evicting its cached identity); -1 when none is free.
  int32_t allocate();
  // Drops one reference; at zero the page joins the free queue (cached pages at the back, so they are
  // evicted last; uncached ones at the front).
  void release(int32_t b);
  int32_t refcount(int32_t b) const { return ref_[b]; }
  // One more reference to a page already held (a lease keeps a finished request's pages).
  void retain(int32_t b) { ++ref_[b]; }

  // Prefix cache: the page holding (parent, tokens[0..B)) if cached; takes a reference to it.
  int32_t acquire_cached(uint64_t hash, uint64_t parent, const int32_t* tokens);
  // Publishes a full, computed page under its hash (no-op when caching is off or already cached);
  // true when the page entered the cache.
  bool publish(int32_t b, uint64_t hash, uint64_t parent, const int32_t* tokens);
  bool is_cached(int32_t b) const { return has_hash_[b]; }
  // Whether the page (hash, parent, tokens) is in the prefix cache (held or free).
  bool contains(uint64_t hash, uint64_t parent, const int32_t* tokens) const {
    return caching_ && find_cached(hash, parent, tokens) >= 0;
  }

  // Drops every cached identity (free pages stay free). For resets and tests.
  void clear_cache();

  // Records KV cache events into *log (null: off): a page entering the cache, a cached page evicted,
  // the cache cleared. Consecutive pages of one chain are merged into one event.
  void set_event_log(std::vector<KvCacheEvent>* log) { events_ = log; }
  // Called with a cached page's identity just before it is evicted for reuse (its bytes still intact):
  // the KV tiers offload it there.
  using EvictFn = std::function<void(int32_t page, uint64_t hash, uint64_t parent, const int32_t* tokens)>;
  void set_on_evict(EvictFn f) { on_evict_ = std::move(f); }
  // The hashes of every page now in the prefix cache (held or free), in page order. For tests.
  std::vector<uint64_t> cached_hashes() const;

 private:
  // The cached page with exactly this identity (hash, parent, tokens), or -1.
  int32_t find_cached(uint64_t hash, uint64_t parent, const int32_t* tokens) const;
  void unlink(int32_t b);
  void drop_identity(int32_t b);  // eviction: offload hook, index, Removed event
  void push_back(int32_t b);
  void push_front(int32_t b);

  int64_t n_;
  int block_size_;
  bool caching_;
  std::vector<int32_t> ref_, prev_, next_;
  std::vector<uint8_t> in_free_, has_hash_;
  std::vector<uint64_t> hash_, parent_;
  std::vector<int32_t> tokens_;  // [n * block_size], valid when has_hash_
  int32_t head_ = -1, tail_ = -1;
  int64_t free_count_ = 0;
  std::unordered_multimap<uint64_t, int32_t> by_hash_;
  std::vector<KvCacheEvent>* events_ = nullptr;
  EvictFn on_evict_;
};

}  // namespace m3
