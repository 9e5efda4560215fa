// ZMQ publisher thread for KV cache events (see zmq_event_publisher.h), on Debian's libzmq + cppzmq.
#include "events/zmq_event_publisher.h"

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "events/kv_event_encoding.h"
#include "base/error.h"

namespace m3::events {

namespace {

std::string seq_bytes(int64_t seq) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, seq >>= 8) s[size_t(i)] = char(seq & 0xff);
  return s;
}

bool binds(const std::string& ep) {
  return ep.find('*') != std::string::npos || ep.find("::") != std::string::npos || ep.rfind("ipc://", 0) == 0 ||
         ep.rfind("inproc://", 0) == 0;
}

}  // namespace

struct ZmqEventPublisher::Sockets {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  std::unique_ptr<zmq::socket_t> replay;
};

ZmqEventPublisher::ZmqEventPublisher(const KvEventsConfig& cfg, int dp_rank)
    : cfg_(cfg), dp_rank_(dp_rank), z_(std::make_unique<Sockets>()) {
  try {
    z_->pub.set(zmq::sockopt::sndhwm, int(std::min<int64_t>(cfg.hwm, INT32_MAX)));
    z_->pub.set(zmq::sockopt::linger, 0);
    if (binds(cfg.endpoint)) {
      z_->pub.bind(cfg.endpoint);
      endpoint_ = z_->pub.get(zmq::sockopt::last_endpoint);
    } else {
      z_->pub.connect(cfg.endpoint);
      endpoint_ = cfg.endpoint;
    }
  } catch (const zmq::error_t& e) {
    throw Error("--kv-events-config endpoint " + cfg.endpoint + ": " + e.what());
  }
  if (!cfg.replay_endpoint.empty()) {
    try {
      z_->replay = std::make_unique<zmq::socket_t>(z_->ctx, zmq::socket_type::router);
      z_->replay->set(zmq::sockopt::linger, 0);
      z_->replay->bind(cfg.replay_endpoint);
      replay_endpoint_ = z_->replay->get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      throw Error("--kv-events-config replay_endpoint " + cfg.replay_endpoint + ": " + e.what());
    }
  }
  thread_ = std::thread([this] { loop(); });
}

ZmqEventPublisher::~ZmqEventPublisher() {
  flush(std::chrono::milliseconds(1000));
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ZmqEventPublisher::publish(double ts, int block_size, std::vector<KvCacheEvent>&& events) {
  const auto t0 = std::chrono::steady_clock::now();
  bool queued = false;
  {
    std::lock_guard lk(mu_);
    if (int64_t(queue_.size()) >= cfg_.max_queue_size) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
    } else {
      queue_.push_back(Batch{ts, block_size, std::move(events)});
      ++enqueued_;
      queued = true;
    }
  }
  if (queued) cv_.notify_one();
  publish_ns_.fetch_add(uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now() - t0).count()),
                        std::memory_order_relaxed);
}

ZmqEventPublisher::Stats ZmqEventPublisher::stats() const {
  return Stats{published_.load(), dropped_.load(), events_.load(), double(publish_ns_.load()) * 1e-9};
}

bool ZmqEventPublisher::flush(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  const uint64_t target = enqueued_;
  return sent_cv_.wait_for(lk, timeout, [&] { return published_.load() >= target; });
}

void ZmqEventPublisher::serve_replays() {
  if (!z_->replay) return;
  for (;;) {
    std::vector<zmq::message_t> req;
    if (!zmq::recv_multipart(*z_->replay, std::back_inserter(req), zmq::recv_flags::dontwait)) return;
    // [client identity, empty delimiter, first sequence number]; anything else is not a request.
    if (req.size() != 3 || req[2].size() != 8) continue;
    uint64_t start = 0;
    for (size_t i = 0; i < 8; ++i) start = (start << 8) | req[2].data<uint8_t>()[i];
    const std::string id = req[0].to_string();
    auto send = [&](const std::string& seq, const std::string& payload) {
      z_->replay->send(zmq::buffer(id), zmq::send_flags::sndmore);
      z_->replay->send(zmq::message_t(), zmq::send_flags::sndmore);
      z_->replay->send(zmq::buffer(seq), zmq::send_flags::sndmore);
      z_->replay->send(zmq::buffer(payload), zmq::send_flags::none);
    };
    for (const auto& [seq, payload] : replay_buffer_)
      if (seq >= start) send(seq_bytes(int64_t(seq)), payload);
    send(seq_bytes(-1), std::string());
  }
}

void ZmqEventPublisher::loop() {
  std::vector<Batch> work;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      // Wake for new batches; poll the replay socket every 20 ms meanwhile.
      cv_.wait_for(lk, std::chrono::milliseconds(20), [&] { return stop_ || !queue_.empty(); });
      if (stop_ && queue_.empty()) break;
      work.clear();
      while (!queue_.empty()) {
        work.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    for (const Batch& b : work) {
      const uint64_t seq = published_.load();
      std::string payload = encode_kv_event_batch(b.ts, b.block_size, b.events, dp_rank_);
      try {
        z_->pub.send(zmq::buffer(cfg_.topic), zmq::send_flags::sndmore);
        z_->pub.send(zmq::buffer(seq_bytes(int64_t(seq))), zmq::send_flags::sndmore);
        z_->pub.send(zmq::buffer(payload), zmq::send_flags::none);
      } catch (const zmq::error_t&) {
        // A PUB socket drops for slow subscribers rather than block; an error here is the context
        // closing. The batch stays replayable.
      }
      replay_buffer_.emplace_back(seq, std::move(payload));
      if (int64_t(replay_buffer_.size()) > cfg_.buffer_steps) replay_buffer_.pop_front();
      events_.fetch_add(b.events.size(), std::memory_order_relaxed);
      {
        std::lock_guard lk(mu_);
        published_.store(seq + 1);
      }
      sent_cv_.notify_all();
    }
    try {
      serve_replays();
    } catch (const zmq::error_t&) {
    }
  }
}

}  // namespace m3::events
