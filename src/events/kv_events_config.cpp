// Parsing of --kv-events-config (see kv_events_config.h).
#include "events/kv_events_config.h"

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json_flag.h"

namespace m3::events {

KvEventsConfig KvEventsConfig::parse(const std::string& text) {
  KvEventsConfig c;
  if (text.empty()) return c;
  const nlohmann::json j = parse_json_flag(text, "--kv-events-config");
  auto bad = [](const std::string& k, const char* want, const nlohmann::json& v) {
    return Error("--kv-events-config: " + k + " must be " + want + ", got " + v.dump());
  };
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const nlohmann::json& v = it.value();
    auto str = [&](std::string& out, bool nullable) {
      if (nullable && v.is_null()) {
        out.clear();
        return;
      }
      if (!v.is_string()) throw bad(k, nullable ? "a string or null" : "a string", v);
      out = v.get<std::string>();
    };
    auto positive = [&](int64_t& out) {
      if (!v.is_number_integer() || v.get<int64_t>() < 1) throw bad(k, "a positive integer", v);
      out = v.get<int64_t>();
    };
    if (k == "enable_kv_cache_events") {
      if (!v.is_boolean()) throw bad(k, "true or false", v);
      c.enable_kv_cache_events = v.get<bool>();
    } else if (k == "publisher") {
      str(c.publisher, false);
      if (c.publisher != "zmq" && c.publisher != "null")
        throw Error("--kv-events-config: publisher \"" + c.publisher + "\" is not known (zmq or null)");
    } else if (k == "endpoint") {
      str(c.endpoint, false);
    } else if (k == "replay_endpoint") {
      str(c.replay_endpoint, true);
    } else if (k == "topic") {
      str(c.topic, false);
    } else if (k == "buffer_steps") {
      positive(c.buffer_steps);
    } else if (k == "hwm") {
      positive(c.hwm);
    } else if (k == "max_queue_size") {
      positive(c.max_queue_size);
    } else {
      throw Error("--kv-events-config: unknown key \"" + k +
                  "\" (known: enable_kv_cache_events, publisher, endpoint, replay_endpoint, buffer_steps, hwm, "
                  "max_queue_size, topic)");
    }
  }
  // As recent vLLM: enabling events without naming a publisher means the ZMQ one.
  if (c.enable_kv_cache_events && !j.contains("publisher")) c.publisher = "zmq";
  return c;
}

std::string KvEventsConfig::describe() const {
  if (!enable_kv_cache_events) return "KV events off";
  if (!publishing()) return "KV events off (publisher \"null\")";
  return "KV events published on " + endpoint + " (ZMQ PUB, topic \"" + topic + "\")";
}

}  // namespace m3::events
