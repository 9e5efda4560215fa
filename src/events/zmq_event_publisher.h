// The ZMQ publisher of KV cache events, with vLLM's ZmqEventPublisher behaviour: a PUB socket sends
// each step's batch as the multipart message [topic, sequence number (8 bytes, big-endian), msgpack
// payload]; an optional ROUTER socket replays missed batches from a bounded buffer (a request is the
// first wanted sequence number as 8 big-endian bytes; the answer is one [seq, payload] message per
// buffered batch from there, then [-1, ""]). The endpoint is bound when it has a wildcard ("*" or
// "::") or is ipc:// / inproc://, else connected (vLLM's rule); "tcp://*:*" binds a free port.
//
// publish() only moves the events into a bounded queue: the engine step never waits on encoding or
// the network. A full queue drops the batch and counts it (m3serve:kv_events_dropped in /metrics).
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
#include <vector>

#include "engine/kv_events.h"
#include "events/kv_events_config.h"

namespace m3::events {

class ZmqEventPublisher : public KvEventSink {
 public:
  // Binds or connects the sockets; throws m3::Error naming the endpoint when that fails.
  explicit ZmqEventPublisher(const KvEventsConfig& cfg, int data_parallel_rank = 0);
  ~ZmqEventPublisher() override;  // sends what is queued (at most a second), then closes

  void publish(double ts, int block_size, std::vector<KvCacheEvent>&& events) override;

  struct Stats {
    uint64_t published = 0;  // batches sent (= the next sequence number)
    uint64_t dropped = 0;    // batches dropped because the queue was full
    uint64_t events = 0;     // events in the batches sent
    double publish_seconds = 0;  // time the engine thread spent in publish() (the cost to a step)
  };
  Stats stats() const;
  // Waits until every batch queued before the call has been sent (or the timeout passed); true if so.
  bool flush(std::chrono::milliseconds timeout);
  // The endpoints as bound (a wildcard port resolved), for the start-up line and tests.
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }

 private:
  struct Batch {
    double ts;
    int block_size;
    std::vector<KvCacheEvent> events;
  };
  struct Sockets;
  void loop();
  void serve_replays();

  KvEventsConfig cfg_;
  int dp_rank_;
  std::unique_ptr<Sockets> z_;
  std::string endpoint_, replay_endpoint_;
  mutable std::mutex mu_;
  std::condition_variable cv_, sent_cv_;
  std::deque<Batch> queue_;
  uint64_t enqueued_ = 0;  // batches accepted into the queue so far
  bool stop_ = false;
  std::deque<std::pair<uint64_t, std::string>> replay_buffer_;  // publisher thread only
  std::atomic<uint64_t> published_{0}, dropped_{0}, events_{0}, publish_ns_{0};
  std::thread thread_;
};

}  // namespace m3::events
