// JsonReader: reads typed values out of one JSON object of a config file, and fails with a message
// naming the file, the key and what was expected (shared by config.json and dspark/config.json).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"

namespace m3 {

struct JsonReader {
  const nlohmann::json& obj;
  std::string where;  // e.g. "config.json: text_config"

  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw Error(where + "." + key + ": " + why);
  }
  bool has(const std::string& k) const { return obj.contains(k) && !obj[k].is_null(); }
  int64_t integer(const std::string& k) const {
    if (!has(k)) fail(k, "missing (expected an integer)");
    if (!obj[k].is_number_integer()) fail(k, "expected an integer, got " + obj[k].dump());
    return obj[k].get<int64_t>();
  }
  int positive(const std::string& k) const {
    int64_t v = integer(k);
    if (v <= 0 || v > (1 << 30)) fail(k, "expected a positive integer, got " + std::to_string(v));
    return int(v);
  }
  int64_t integer_or(const std::string& k, int64_t dflt) const { return has(k) ? integer(k) : dflt; }
  double number(const std::string& k) const {
    if (!has(k)) fail(k, "missing (expected a number)");
    if (!obj[k].is_number()) fail(k, "expected a number, got " + obj[k].dump());
    return obj[k].get<double>();
  }
  double number_or(const std::string& k, double dflt) const { return has(k) ? number(k) : dflt; }
  bool boolean_or(const std::string& k, bool dflt) const {
    if (!has(k)) return dflt;
    if (!obj[k].is_boolean()) fail(k, "expected true or false, got " + obj[k].dump());
    return obj[k].get<bool>();
  }
  std::string string_or(const std::string& k, const std::string& dflt) const {
    if (!has(k)) return dflt;
    if (!obj[k].is_string()) fail(k, "expected a string, got " + obj[k].dump());
    return obj[k].get<std::string>();
  }
  std::vector<uint8_t> flags(const std::string& k, int n) const {
    if (!has(k)) fail(k, "missing (expected a list of " + std::to_string(n) + " 0/1 values)");
    const nlohmann::json& a = obj[k];
    if (!a.is_array() || int(a.size()) != n)
      fail(k, "expected a list of " + std::to_string(n) + " 0/1 values (one per layer), got " + a.dump());
    std::vector<uint8_t> out;
    for (const auto& v : a) {
      if (!v.is_number_integer() || (v.get<int>() != 0 && v.get<int>() != 1))
        fail(k, "entries must be 0 or 1, got " + v.dump());
      out.push_back(uint8_t(v.get<int>()));
    }
    return out;
  }
};


}  // namespace m3
