// Lease table and transfer chain (see kv_lease.h).
#include "engine/kv_lease.h"

#include <random>

#include "engine/block_pool.h"
#include "engine/hash64.h"

namespace m3 {

std::vector<TransferPage> transfer_chain(const std::vector<int32_t>& tokens, int B, const std::vector<uint64_t>& page_salts) {
  std::vector<TransferPage> out;
  uint64_t parent = 0;
  for (size_t start = 0; start < tokens.size(); start += size_t(B)) {
    TransferPage p;
    p.tokens.assign(size_t(B), -1);
    for (size_t j = 0; j < size_t(B) && start + j < tokens.size(); ++j) p.tokens[j] = tokens[start + j];
    p.parent = parent;
    p.hash = hash_block(parent, p.tokens.data(), B);
    const size_t i = start / size_t(B);
    if (i < page_salts.size() && page_salts[i]) p.hash = mix64(p.hash ^ page_salts[i]);
    parent = p.hash;
    out.push_back(std::move(p));
  }
  return out;
}

std::string KvLeaseTable::grant(std::vector<int32_t> pages, std::vector<TransferPage> chain, Clock::time_point now) {
  static thread_local std::random_device rd;
  char id[40];
  std::snprintf(id, sizeof id, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  std::lock_guard lk(mu_);
  Lease l;
  st_.pages += int64_t(pages.size());
  l.pages = std::move(pages);
  l.chain = std::move(chain);
  l.expiry = now + duration_;
  leases_.emplace(id, std::move(l));
  ++st_.granted;
  ++st_.active;
  return id;
}

std::vector<int32_t> KvLeaseTable::take_released(Clock::time_point now) {
  std::vector<int32_t> out;
  std::lock_guard lk(mu_);
  for (auto it = leases_.begin(); it != leases_.end();) {
    Lease& l = it->second;
    const bool expired = !l.reading && !l.done && now >= l.expiry;
    if (!l.done && !expired) {
      ++it;
      continue;
    }
    if (expired) ++st_.expired;
    out.insert(out.end(), l.pages.begin(), l.pages.end());
    st_.pages -= int64_t(l.pages.size());
    --st_.active;
    it = leases_.erase(it);
  }
  return out;
}

std::optional<KvLeaseTable::Clock::time_point> KvLeaseTable::next_deadline() const {
  std::lock_guard lk(mu_);
  std::optional<Clock::time_point> t;
  for (const auto& [id, l] : leases_)
    if (!t || l.expiry < *t) t = l.expiry;
  return t;
}

std::string KvLeaseTable::begin_read(const std::string& id, const std::vector<int32_t>& block_ids,
                                     std::vector<TransferPage>& chain, Clock::time_point now) {
  std::lock_guard lk(mu_);
  auto it = leases_.find(id);
  // One message for unknown and finished leases: a reader learns nothing about other requests' ids.
  if (it == leases_.end() || it->second.done) {
    ++st_.refused;
    return "remote_request_id \"" + id + "\" names no live KV lease (unknown, already read, or expired)";
  }
  Lease& l = it->second;
  if (now >= l.expiry) {
    ++st_.refused;
    return "the KV lease of remote_request_id \"" + id + "\" has expired";
  }
  if (l.reading) {
    ++st_.refused;
    return "the KV lease of remote_request_id \"" + id + "\" is being read by another transfer";
  }
  if (block_ids != l.pages) {
    ++st_.refused;
    return "remote_block_ids do not match the pages leased to remote_request_id \"" + id + "\" (" +
           std::to_string(block_ids.size()) + " ids given, " + std::to_string(l.pages.size()) + " leased)";
  }
  l.reading = true;
  chain = l.chain;
  return {};
}

void KvLeaseTable::end_read(const std::string& id, bool ok, int64_t bytes) {
  std::function<void()> notify;
  {
    std::lock_guard lk(mu_);
    auto it = leases_.find(id);
    if (it == leases_.end()) return;
    it->second.reading = false;
    if (ok) {
      it->second.done = true;
      ++st_.read;
      st_.bytes_sent += bytes;
    }
    notify = notify_;
  }
  if (notify) notify();
}

void KvLeaseTable::set_notify(std::function<void()> f) {
  std::lock_guard lk(mu_);
  notify_ = std::move(f);
}

KvLeaseStats KvLeaseTable::stats() const {
  std::lock_guard lk(mu_);
  return st_;
}

}  // namespace m3
