// The JSON value of a command-line flag (--speculative-config, --attention-config, --kv-events-config,
// --kv-transfer-config): parsed as an object, or an m3::Error that names the flag.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "base/error.h"

namespace m3 {

inline nlohmann::json parse_json_flag(const std::string& text, const std::string& flag) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw Error(flag + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw Error(flag + ": expected a JSON object, got " + j.dump());
  return j;
}

}  // namespace m3
