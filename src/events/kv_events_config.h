// --kv-events-config: vLLM's KVEventsConfig JSON (enable_kv_cache_events, publisher, endpoint,
// replay_endpoint, buffer_steps, hwm, max_queue_size, topic), with vLLM's defaults. Unknown keys
// and wrong types are refused by name.
#pragma once
#include <cstdint>
#include <string>

namespace m3::events {

struct KvEventsConfig {
  bool enable_kv_cache_events = false;
  std::string publisher = "null";  // "zmq" | "null"
  std::string endpoint = "tcp://*:5557";
  std::string replay_endpoint;  // empty: no replay socket
  int64_t buffer_steps = 10000;
  int64_t hwm = 100000;
  int64_t max_queue_size = 100000;
  std::string topic;

  // Events are published (enabled with the zmq publisher).
  bool publishing() const { return enable_kv_cache_events && publisher == "zmq"; }
  // Throws m3::Error naming the key.
  static KvEventsConfig parse(const std::string& json);
  std::string describe() const;
};

}  // namespace m3::events
