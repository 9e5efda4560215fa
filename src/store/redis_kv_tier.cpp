// Redis KV tier (see redis_kv_tier.h).
#include "store/redis_kv_tier.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "base/error.h"

namespace m3::store {

namespace {
using Clock = std::chrono::steady_clock;
timeval to_tv(int ms) { return timeval{ms / 1000, (ms % 1000) * 1000}; }
}  // namespace

struct RedisKvTier::Conn {
  redisContext* c = nullptr;
  Clock::time_point retry_after{};
  ~Conn() { close(); }
  void close() {
    if (c) redisFree(c);
    c = nullptr;
  }
};

RedisTierOptions RedisTierOptions::from_url(const std::string& url) {
  RedisTierOptions o;
  std::string rest = url;
  if (rest.rfind("redis://", 0) == 0) rest = rest.substr(8);
  else if (rest.find("://") != std::string::npos)
    throw Error("KV store url " + url + ": expected redis://HOST:PORT");
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) {
    o.host = rest;
  } else {
    o.host = rest.substr(0, colon);
    try {
      o.port = std::stoi(rest.substr(colon + 1));
    } catch (...) {
      throw Error("KV store url " + url + ": bad port");
    }
  }
  if (o.host.empty() || o.port <= 0 || o.port > 65535) throw Error("KV store url " + url + ": expected redis://HOST:PORT");
  return o;
}

RedisKvTier::RedisKvTier(const RedisTierOptions& opt, uint64_t layout_id, size_t blob_bytes)
    : opt_(opt),
      blob_bytes_(blob_bytes),
      read_(std::make_unique<Conn>()),
      write_(std::make_unique<Conn>()),
      fetch_(std::make_unique<Conn>()) {
  char p[40];
  std::snprintf(p, sizeof p, "m3kv:%016llx:", (unsigned long long)layout_id);
  prefix_ = p;
  // Say at start whether Redis answers; serving goes on without it (pages are recomputed).
  if (!ensure(*read_))
    std::fprintf(stderr, "[m3serve] warning: KV store redis://%s:%d does not answer yet; retrying in the background\n",
                 opt_.host.c_str(), opt_.port);
  thread_ = std::thread([this] { writer(); });
  fetch_thread_ = std::thread([this] { fetcher(); });
}

RedisKvTier::~RedisKvTier() {
  {
    std::unique_lock lk(mu_);
    idle_cv_.wait_for(lk, std::chrono::seconds(3), [&] { return pending_.empty() && !writing_; });
    stop_ = true;
  }
  cv_.notify_all();
  fetch_cv_.notify_all();
  thread_.join();
  fetch_thread_.join();
}

bool RedisKvTier::prefetch(uint64_t ticket, const std::vector<uint64_t>& hashes) {
  {
    std::lock_guard lk(mu_);
    if (Clock::now() < down_until_) return false;  // Redis was unreachable a moment ago
    fetch_q_.emplace_back(ticket, hashes);
    fetch_pending_.insert(ticket);
  }
  fetch_cv_.notify_one();
  return true;
}

bool RedisKvTier::fetched(uint64_t ticket) {
  std::lock_guard lk(mu_);
  return !fetch_pending_.count(ticket);
}

void RedisKvTier::wait_fetch(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  if (fetch_pending_.empty()) return;
  const size_t before = fetch_pending_.size();
  fetched_cv_.wait_for(lk, timeout, [&] { return fetch_pending_.size() < before || stop_; });
}

void RedisKvTier::fetcher() {
  std::unique_lock lk(mu_);
  for (;;) {
    fetch_cv_.wait(lk, [&] { return stop_ || !fetch_q_.empty(); });
    if (stop_) break;
    auto [ticket, hashes] = std::move(fetch_q_.front());
    fetch_q_.pop_front();
    lk.unlock();
    // First which pages Redis holds (one pipelined round of EXISTS, small replies): those are the
    // request's matched pages, and a GET of one of them that then fails is a failed load (the
    // kv_load_failure_policy decides), where a page Redis never held is only a miss. Then one GET per
    // held page, in order, on this thread's connection. (Pipelining every GET of a long prefix in one
    // round was 4x slower on pages of megabytes: hiredis's reader handles many large replies in flight
    // poorly; the requests wait here off the queue either way.)
    std::vector<std::pair<uint64_t, std::string>> got;
    std::vector<uint64_t> held, lost;
    bool failed = !ensure(*fetch_);
    if (!failed) {
      for (uint64_t h : hashes) {
        const std::string k = key(h);
        redisAppendCommand(fetch_->c, "EXISTS %b", k.data(), k.size());
      }
      for (uint64_t h : hashes) {
        redisReply* r = nullptr;
        if (redisGetReply(fetch_->c, reinterpret_cast<void**>(&r)) != REDIS_OK || !r) {
          failed = true;
          break;
        }
        if (r->type == REDIS_REPLY_INTEGER && r->integer == 1) held.push_back(h);
        else got.emplace_back(h, std::string());
        freeReplyObject(r);
      }
    }
    if (failed) {
      held.clear();  // nothing is known to be held: every page is a miss
      got.clear();
    }
    const auto t_get = Clock::now();
    int64_t got_bytes = 0;
    for (size_t i = 0; i < held.size() && !failed; ++i) {
      const std::string k = key(held[i]);
      auto* r = static_cast<redisReply*>(redisCommand(fetch_->c, "GET %b", k.data(), k.size()));
      if (!r) {
        failed = true;
        lost.assign(held.begin() + long(i), held.end());
        break;
      }
      got.emplace_back(held[i], r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : std::string());
      got_bytes += int64_t(got.back().second.size());
      freeReplyObject(r);
    }
    const double get_seconds = std::chrono::duration<double>(Clock::now() - t_get).count();
    if (failed && fetch_->c) {  // lost mid-round: reconnect after the back-off
      fetch_->close();
      fetch_->retry_after = Clock::now() + std::chrono::seconds(1);
      errors_.fetch_add(1);
    }
    lk.lock();
    // The tier's read time and bytes are what came from Redis here (a page taken later from the
    // prefetched ones costs a map lookup, not a read).
    st_.read_seconds += get_seconds;
    st_.bytes_read += got_bytes;
    if (failed) mark_down("a prefetch");
    else if (!hashes.empty()) mark_up();
    for (uint64_t h : lost) prefetch_failed_.insert(h);
    if (prefetch_failed_.size() > 65536) prefetch_failed_.clear();  // failures nobody asked for again
    for (auto& [h, blob] : got) {
      if (prefetched_.count(h)) continue;
      prefetched_bytes_ += blob.size();
      prefetched_order_.push_back(h);
      prefetched_.emplace(h, std::move(blob));
    }
    while (prefetched_bytes_ > opt_.prefetch_bytes && !prefetched_order_.empty()) {
      auto it = prefetched_.find(prefetched_order_.front());
      prefetched_order_.pop_front();
      if (it == prefetched_.end()) continue;
      prefetched_bytes_ -= it->second.size();
      prefetched_.erase(it);
    }
    fetch_pending_.erase(ticket);
    fetched_cv_.notify_all();
  }
}

std::string RedisKvTier::key(uint64_t hash) const {
  char h[20];
  std::snprintf(h, sizeof h, "%016llx", (unsigned long long)hash);
  return prefix_ + h;
}

bool RedisKvTier::ensure(Conn& c) {
  if (c.c && !c.c->err) return true;
  c.close();
  const auto now = Clock::now();
  if (now < c.retry_after) return false;
  c.c = redisConnectWithTimeout(opt_.host.c_str(), opt_.port, to_tv(opt_.timeout_ms));
  if (!c.c || c.c->err) {
    c.close();
    c.retry_after = now + std::chrono::seconds(1);
    errors_.fetch_add(1);
    return false;
  }
  redisSetTimeout(c.c, to_tv(opt_.timeout_ms));
  return true;
}

void RedisKvTier::put(uint64_t hash, std::string&& blob) {
  {
    std::lock_guard lk(mu_);
    if (pending_.size() >= opt_.max_pending) {
      dropped_.fetch_add(1);
      return;
    }
    pending_.emplace_back(hash, std::move(blob));
    ++st_.stored_pages;
  }
  cv_.notify_one();
}

TierRead RedisKvTier::get(uint64_t hash, std::string& out) {
  const auto t0 = Clock::now();
  auto count = [&](bool hit, bool read_here = true) {
    std::lock_guard lk(mu_);
    if (hit) {
      ++st_.hits;
      if (read_here) {  // prefetched pages were counted when they were read
        st_.bytes_read += int64_t(out.size());
        st_.read_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      }
    } else {
      ++st_.misses;
    }
    return hit ? TierRead::Hit : TierRead::Miss;
  };
  {
    // Fetched ahead: taken from what arrived (an empty entry: Redis did not hold it).
    std::unique_lock lk(mu_);
    if (prefetch_failed_.erase(hash)) {
      ++st_.misses;
      return TierRead::Failed;
    }
    auto it = prefetched_.find(hash);
    if (it != prefetched_.end()) {
      out = std::move(it->second);
      prefetched_bytes_ -= out.size();
      prefetched_.erase(it);
      lk.unlock();
      return count(!out.empty(), false);
    }
    if (Clock::now() < down_until_) {  // Redis did not answer a moment ago: a miss, not another wait
      ++st_.misses;
      return TierRead::Miss;
    }
  }
  if (!ensure(*read_)) {
    {
      std::lock_guard lk(mu_);
      mark_down("a connection");
    }
    return count(false);
  }
  const std::string k = key(hash);
  auto* r = static_cast<redisReply*>(redisCommand(read_->c, "GET %b", k.data(), k.size()));
  if (!r) {  // timeout or connection lost: back off, recompute
    read_->close();
    read_->retry_after = Clock::now() + std::chrono::seconds(1);
    errors_.fetch_add(1);
    {
      std::lock_guard lk(mu_);
      mark_down("a read");
    }
    return count(false);
  }
  {
    std::lock_guard lk(mu_);
    mark_up();
  }
  const bool hit = r->type == REDIS_REPLY_STRING;
  if (hit) out.assign(r->str, r->len);
  freeReplyObject(r);
  return count(hit);
}

void RedisKvTier::mark_down(const char* what) {
  down_for_ = std::min<std::chrono::milliseconds>(std::max<std::chrono::milliseconds>(down_for_ * 2, std::chrono::seconds(1)),
                                                  std::chrono::seconds(30));
  down_until_ = Clock::now() + down_for_;
  if (down_logged_) return;
  down_logged_ = true;
  std::fprintf(stderr,
               "[m3serve] warning: KV store redis://%s:%d did not answer %s within %d ms (or the connection was "
               "lost): its pages are recomputed, retrying after 1 s, then less and less often\n",
               opt_.host.c_str(), opt_.port, what, opt_.timeout_ms);
}

void RedisKvTier::mark_up() {
  down_for_ = std::chrono::milliseconds(0);
  if (!down_logged_) return;
  down_logged_ = false;
  std::fprintf(stderr, "[m3serve] KV store redis://%s:%d answers again\n", opt_.host.c_str(), opt_.port);
}

void RedisKvTier::erase(uint64_t hash) {
  if (!ensure(*read_)) return;
  const std::string k = key(hash);
  if (auto* r = static_cast<redisReply*>(redisCommand(read_->c, "DEL %b", k.data(), k.size()))) freeReplyObject(r);
  else read_->close();
}

KvTierStats RedisKvTier::stats() const {
  std::lock_guard lk(mu_);
  KvTierStats s = st_;
  s.held_pages = -1;  // Redis holds what its memory policy keeps
  return s;
}

void RedisKvTier::flush() {
  std::unique_lock lk(mu_);
  idle_cv_.wait(lk, [&] { return pending_.empty() && !writing_; });
}

void RedisKvTier::writer() {
  std::deque<std::pair<uint64_t, std::string>> batch;
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
    if (pending_.empty() && stop_) break;
    batch.swap(pending_);
    writing_ = true;
    lk.unlock();
    int64_t written = 0;
    if (ensure(*write_)) {
      // Pipelined: every SET appended, then the replies read.
      for (auto& [h, blob] : batch) {
        const std::string k = key(h);
        if (opt_.ttl_seconds > 0)
          redisAppendCommand(write_->c, "SET %b %b EX %lld", k.data(), k.size(), blob.data(), blob.size(),
                             (long long)opt_.ttl_seconds);
        else
          redisAppendCommand(write_->c, "SET %b %b", k.data(), k.size(), blob.data(), blob.size());
      }
      for (auto& [h, blob] : batch) {
        void* reply = nullptr;
        if (redisGetReply(write_->c, &reply) != REDIS_OK) {
          write_->close();
          write_->retry_after = Clock::now() + std::chrono::seconds(1);
          errors_.fetch_add(1);
          break;
        }
        freeReplyObject(reply);
        written += int64_t(blob.size());
      }
    } else {
      dropped_.fetch_add(int64_t(batch.size()));
    }
    batch.clear();
    lk.lock();
    st_.bytes_written += written;
    writing_ = false;
    if (pending_.empty()) idle_cv_.notify_all();
  }
  idle_cv_.notify_all();
}

}  // namespace m3::store
