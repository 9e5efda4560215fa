// Local KV tier (see kv_tier.h).
#include "engine/kv_tier.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "base/error.h"

namespace m3 {

namespace fs = std::filesystem;

LocalKvTier::LocalKvTier(int64_t max_bytes, const std::string& dir, uint64_t layout_id, size_t blob_bytes)
    : max_bytes_(max_bytes), blob_bytes_(blob_bytes) {
  if (max_bytes < int64_t(blob_bytes)) throw Error("--kv-offloading-size holds no KV page");
  if (dir.empty()) return;
  char sub[32];
  std::snprintf(sub, sizeof sub, "%016llx", (unsigned long long)layout_id);
  dir_ = (fs::path(dir) / sub).string();
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw Error("--kv-offloading-dir " + dir + ": cannot create " + dir_ + " (" + ec.message() + ")");
  // Pages kept by an earlier run, oldest first into the LRU order (verified when loaded).
  std::vector<std::pair<fs::file_time_type, uint64_t>> found;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() != 16 + 7 || n.substr(16) != ".kvpage" || e.file_size() != blob_bytes_) continue;
    found.emplace_back(e.last_write_time(), std::stoull(n.substr(0, 16), nullptr, 16));
  }
  std::sort(found.begin(), found.end());
  for (const auto& [t, h] : found) {
    lru_.push_front(h);
    Entry en;
    en.on_disk = true;
    en.lru = lru_.begin();
    map_.emplace(h, std::move(en));
    st_.held_bytes += int64_t(blob_bytes_);
  }
  evict_to_fit();
  thread_ = std::thread([this] { writer(); });
}

LocalKvTier::~LocalKvTier() {
  if (!thread_.joinable()) return;
  flush();
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::string LocalKvTier::path(uint64_t hash) const {
  char n[32];
  std::snprintf(n, sizeof n, "%016llx.kvpage", (unsigned long long)hash);
  return (fs::path(dir_) / n).string();
}

void LocalKvTier::evict_to_fit() {
  while (st_.held_bytes > max_bytes_ && !lru_.empty()) {
    const uint64_t h = lru_.back();
    lru_.pop_back();
    auto it = map_.find(h);
    if (it != map_.end()) {
      if (it->second.on_disk) {
        std::error_code ec;
        fs::remove(path(h), ec);
      }
      map_.erase(it);
    }
    st_.held_bytes -= int64_t(blob_bytes_);
    ++st_.evicted_pages;
  }
}

void LocalKvTier::put(uint64_t hash, std::string&& blob) {
  {
    std::lock_guard lk(mu_);
    auto it = map_.find(hash);
    if (it != map_.end()) {  // already held: the same page (its hash chain names its content)
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      return;
    }
    lru_.push_front(hash);
    Entry e;
    e.blob = std::move(blob);
    e.lru = lru_.begin();
    map_.emplace(hash, std::move(e));
    st_.held_bytes += int64_t(blob_bytes_);
    ++st_.stored_pages;
    if (!dir_.empty()) pending_.push_back(hash);
    evict_to_fit();
  }
  if (!dir_.empty()) cv_.notify_one();
}

TierRead LocalKvTier::get(uint64_t hash, std::string& out) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock lk(mu_);
  auto it = map_.find(hash);
  if (it == map_.end()) {
    ++st_.misses;
    return TierRead::Miss;
  }
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  if (!it->second.on_disk) {
    out = it->second.blob;
  } else {
    const std::string p = path(hash);
    lk.unlock();
    std::ifstream f(p, std::ios::binary);
    out.resize(blob_bytes_);
    if (!f.read(out.data(), std::streamsize(blob_bytes_))) {
      lk.lock();
      ++st_.misses;
      return TierRead::Failed;  // the tier holds the page but its file cannot be read whole
    }
    lk.lock();
  }
  ++st_.hits;
  st_.bytes_read += int64_t(out.size());
  st_.read_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return TierRead::Hit;
}

bool LocalKvTier::holds(uint64_t hash) {
  std::lock_guard lk(mu_);
  return map_.count(hash) > 0;
}

void LocalKvTier::erase(uint64_t hash) {
  std::lock_guard lk(mu_);
  auto it = map_.find(hash);
  if (it == map_.end()) return;
  if (it->second.on_disk) {
    std::error_code ec;
    fs::remove(path(hash), ec);
  }
  lru_.erase(it->second.lru);
  map_.erase(it);
  st_.held_bytes -= int64_t(blob_bytes_);
}

KvTierStats LocalKvTier::stats() const {
  std::lock_guard lk(mu_);
  KvTierStats s = st_;
  s.held_pages = int64_t(map_.size());
  return s;
}

void LocalKvTier::flush() {
  if (dir_.empty()) return;
  std::unique_lock lk(mu_);
  idle_cv_.wait(lk, [&] { return pending_.empty() && !writing_; });
}

void LocalKvTier::writer() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
    if (pending_.empty() && stop_) break;
    const uint64_t h = pending_.front();
    pending_.pop_front();
    auto it = map_.find(h);
    if (it == map_.end() || it->second.on_disk) continue;  // evicted before it was written
    std::string blob = it->second.blob;  // a copy: the entry may be evicted while the lock is released
    writing_ = true;
    lk.unlock();
    const std::string p = path(h), tmp = p + ".tmp";
    bool ok = false;
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      ok = bool(f.write(blob.data(), std::streamsize(blob.size())));
    }
    std::error_code ec;
    if (ok) fs::rename(tmp, p, ec);
    if (!ok || ec) fs::remove(tmp, ec);
    lk.lock();
    writing_ = false;
    it = map_.find(h);
    if (it != map_.end() && ok) {
      it->second.on_disk = true;
      it->second.blob.clear();
      it->second.blob.shrink_to_fit();
      st_.bytes_written += int64_t(blob.size());
    } else if (it == map_.end() && ok) {
      fs::remove(p, ec);  // evicted while being written
    }
    if (pending_.empty()) idle_cv_.notify_all();
  }
  idle_cv_.notify_all();
}

}  // namespace m3
