// KV cache events: what the prefix cache gained and lost in one engine step, for KV-aware routers
// (vLLM's BlockStored / BlockRemoved / AllBlocksCleared). The block pool records them as pages
// enter the cache (a full page published under its hash), leave it (a cached page evicted for
// reuse) or are all dropped (reset); the engine hands each step's events to a sink. The engine knows
// nothing of the transport: the ZMQ publisher lives in src/events.
//
// Block hashes are the pool's hash chain: H(parent hash, the page's token ids), see hash_block() in
// block_pool.cpp; the first page of a sequence has no parent. Every stored event also carries the
// pages' token ids, so a router that hashes tokens itself needs nothing of ours.
#pragma once
#include <cstdint>
#include <vector>

namespace m3 {

struct KvCacheEvent {
  enum class Kind : uint8_t { Stored, Removed, Cleared };
  Kind kind = Kind::Stored;
  std::vector<uint64_t> hashes;  // Stored / Removed: a chain of pages (Stored: each the parent of the next)
  bool has_parent = false;       // Stored: the first page's parent is in the cache's chain
  uint64_t parent = 0;
  std::vector<int32_t> tokens;  // Stored: the pages' token ids, block_size per page, in order
};

// Receives one step's events; must not block (a publisher queues them for its own thread).
class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  // `ts`: seconds since the epoch; `block_size`: tokens per page.
  virtual void publish(double ts, int block_size, std::vector<KvCacheEvent>&& events) = 0;
};

}  // namespace m3
