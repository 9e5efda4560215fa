// Page bookkeeping and prefix cache (see block_pool.h).
#include "engine/block_pool.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "engine/hash64.h"

namespace m3 {

uint64_t hash_block(uint64_t parent, const int32_t* tokens, int n) {
  uint64_t h = mix64(parent ^ 0x6d3a5e1f00000000ull);
  for (int i = 0; i < n; ++i) h = mix64(h ^ uint64_t(uint32_t(tokens[i])) ^ (uint64_t(i) << 32));
  return h;
}

BlockPool::BlockPool(int64_t n, int block_size, bool caching)
    : n_(n), block_size_(block_size), caching_(caching), ref_(n, 0), prev_(n, -1), next_(n, -1), in_free_(n, 0),
      has_hash_(n, 0), hash_(n, 0), parent_(n, 0) {
  if (caching) tokens_.resize(size_t(n) * block_size);
  for (int32_t b = 0; b < n; ++b) push_back(b);
}

void BlockPool::unlink(int32_t b) {
  if (prev_[b] >= 0) next_[prev_[b]] = next_[b]; else head_ = next_[b];
  if (next_[b] >= 0) prev_[next_[b]] = prev_[b]; else tail_ = prev_[b];
  prev_[b] = next_[b] = -1;
  in_free_[b] = 0;
  --free_count_;
}

void BlockPool::push_back(int32_t b) {
  prev_[b] = tail_;
  next_[b] = -1;
  if (tail_ >= 0) next_[tail_] = b; else head_ = b;
  tail_ = b;
  in_free_[b] = 1;
  ++free_count_;
}

void BlockPool::push_front(int32_t b) {
  next_[b] = head_;
  prev_[b] = -1;
  if (head_ >= 0) prev_[head_] = b; else tail_ = b;
  head_ = b;
  in_free_[b] = 1;
  ++free_count_;
}

int32_t BlockPool::allocate() {
  if (head_ < 0) return -1;
  const int32_t b = head_;
  unlink(b);
  if (has_hash_[b]) drop_identity(b);
  ref_[b] = 1;
  return b;
}

void BlockPool::drop_identity(int32_t b) {
  if (on_evict_) on_evict_(b, hash_[b], parent_[b], &tokens_[size_t(b) * block_size_]);
  auto range = by_hash_.equal_range(hash_[b]);
  for (auto it = range.first; it != range.second; ++it)
    if (it->second == b) {
      by_hash_.erase(it);
      break;
    }
  has_hash_[b] = 0;
  if (events_) {
    if (events_->empty() || events_->back().kind != KvCacheEvent::Kind::Removed)
      events_->push_back(KvCacheEvent{KvCacheEvent::Kind::Removed, {}, false, 0, {}});
    events_->back().hashes.push_back(hash_[b]);
  }
}

void BlockPool::release(int32_t b) {
  assert(ref_[b] > 0);
  if (--ref_[b] == 0) {
    if (has_hash_[b]) push_back(b); else push_front(b);
  }
}

int32_t BlockPool::find_cached(uint64_t hash, uint64_t parent, const int32_t* tokens) const {
  auto range = by_hash_.equal_range(hash);
  for (auto it = range.first; it != range.second; ++it) {
    const int32_t b = it->second;
    if (parent_[b] == parent &&
        std::memcmp(&tokens_[size_t(b) * block_size_], tokens, size_t(block_size_) * sizeof(int32_t)) == 0)
      return b;
  }
  return -1;
}

int32_t BlockPool::acquire_cached(uint64_t hash, uint64_t parent, const int32_t* tokens) {
  if (!caching_) return -1;
  const int32_t b = find_cached(hash, parent, tokens);
  if (b < 0) return -1;
  if (ref_[b] == 0) unlink(b);
  ++ref_[b];
  return b;
}

bool BlockPool::publish(int32_t b, uint64_t hash, uint64_t parent, const int32_t* tokens) {
  if (!caching_ || has_hash_[b]) return false;
  // An identical page may already be cached (two requests computed the same prefix at once): keep one.
  if (find_cached(hash, parent, tokens) >= 0) return false;
  has_hash_[b] = 1;
  hash_[b] = hash;
  parent_[b] = parent;
  std::memcpy(&tokens_[size_t(b) * block_size_], tokens, size_t(block_size_) * sizeof(int32_t));
  by_hash_.emplace(hash, b);
  if (events_) {
    // The next page of the chain the last event stored: one event (vLLM's BlockStored holds a chain).
    const bool extend = !events_->empty() && events_->back().kind == KvCacheEvent::Kind::Stored &&
                        events_->back().hashes.back() == parent;
    if (!extend) events_->push_back(KvCacheEvent{KvCacheEvent::Kind::Stored, {}, parent != 0, parent, {}});
    KvCacheEvent& e = events_->back();
    e.hashes.push_back(hash);
    e.tokens.insert(e.tokens.end(), tokens, tokens + block_size_);
  }
  return true;
}

void BlockPool::clear_cache() {
  by_hash_.clear();
  std::fill(has_hash_.begin(), has_hash_.end(), 0);
  if (events_) events_->push_back(KvCacheEvent{KvCacheEvent::Kind::Cleared, {}, false, 0, {}});
}

std::vector<uint64_t> BlockPool::cached_hashes() const {
  std::vector<uint64_t> out;
  for (int32_t b = 0; b < n_; ++b)
    if (has_hash_[b]) out.push_back(hash_[b]);
  return out;
}

}  // namespace m3
