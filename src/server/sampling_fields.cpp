// Reading sampling fields (see sampling_fields.h).
#include "server/sampling_fields.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "server/errors.h"

namespace m3::server {

using json = nlohmann::ordered_json;

namespace {
// A value as an offline message shows it (the API's messages never hold one: its bodies may carry
// invalid UTF-8, which a plain dump() throws on).
std::string shown(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }
}  // namespace

void FieldStyle::refuse(const std::string& key, const std::string& api_why, const std::string& offline_why) const {
  if (api) throw bad_request(api_why, key);
  throw Error(where + ": \"" + key + "\": " + offline_why);
}

double read_number(const std::string& key, const json& v, const FieldStyle& s) {
  if (!v.is_number()) s.refuse(key, "'" + key + "' must be a number", "expected a number, got " + shown(v));
  return v.get<double>();
}

int64_t read_integer(const std::string& key, const json& v, const FieldStyle& s) {
  if (s.api && v.is_number_float()) {
    const double d = v.get<double>();
    if (d == std::floor(d) && std::abs(d) < 9e15) return int64_t(d);
    // An integer too large for 64 bits reaches here as a float.
    if (std::isfinite(d) && d == std::floor(d)) s.refuse(key, "'" + key + "' is out of range", "");
  }
  if (!v.is_number_integer())
    s.refuse(key, "'" + key + "' must be an integer", "expected an integer, got " + shown(v));
  // An unsigned value above 2^63 - 1 would wrap to a negative one.
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
    s.refuse(key, "'" + key + "' is out of range", "out of range: " + shown(v));
  return v.get<int64_t>();
}

bool read_bool(const std::string& key, const json& v, const FieldStyle& s) {
  if (!v.is_boolean()) s.refuse(key, "'" + key + "' must be a boolean", "expected true or false");
  return v.get<bool>();
}

int32_t read_int32(const std::string& key, const json& v, int64_t lo, const FieldStyle& s) {
  const int64_t x = read_integer(key, v, s);
  if (x < lo || x > INT32_MAX)
    s.refuse(key, "'" + key + "' is out of range",
             "out of range: " + shown(v) + " (expected " + std::to_string(lo) + " to " + std::to_string(INT32_MAX) + ")");
  return int32_t(x);
}

int32_t read_token_id(const std::string& key, const json& x, const std::string& api_shape, const FieldStyle& s) {
  if (!s.api) return read_int32(key, x, 0, s);
  if (!x.is_number_integer()) s.refuse(key, api_shape, api_shape);
  if (x.is_number_unsigned() ? x.get<uint64_t>() > uint64_t(INT32_MAX)
                             : (x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX))
    s.refuse(key, "token id " + x.dump() + " is outside the vocabulary", "");
  return int32_t(x.get<int64_t>());
}

const std::vector<std::string>& sampling_field_names() {
  static const std::vector<std::string> names = {
      "temperature",        "top_p", "top_k",      "min_p", "presence_penalty", "frequency_penalty",
      "repetition_penalty", "seed",  "ignore_eos", "stop",  "stop_token_ids", "logit_bias"};
  return names;
}

bool read_sampling_field(const std::string& k, const json& v, SamplingParams& p, const FieldStyle& s) {
  if (k == "temperature") {
    p.temperature = float(read_number(k, v, s));
  } else if (k == "top_p") {
    p.top_p = float(read_number(k, v, s));
  } else if (k == "top_k") {
    if (!s.api) {
      p.top_k = read_int32(k, v, -1, s);
    } else {
      const int64_t top_k = read_integer(k, v, s);
      if (top_k < -1 || top_k > INT32_MAX) s.refuse(k, "'top_k' must be -1 (off) or positive", "");
      p.top_k = int(top_k);
    }
  } else if (k == "min_p") {
    p.min_p = float(read_number(k, v, s));
  } else if (k == "presence_penalty") {
    p.presence_penalty = float(read_number(k, v, s));
  } else if (k == "frequency_penalty") {
    p.frequency_penalty = float(read_number(k, v, s));
  } else if (k == "repetition_penalty") {
    p.repetition_penalty = float(read_number(k, v, s));
  } else if (k == "seed") {
    if (!v.is_null()) {
      p.seed = uint64_t(read_integer(k, v, s));
      p.has_seed = true;
    }
  } else if (k == "ignore_eos") {
    p.ignore_eos = read_bool(k, v, s);
  } else if (k == "stop") {
    const std::string shape = "'stop' must be a string or a list of strings";
    if (v.is_string()) {
      p.stop.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      for (const auto& x : v) {
        if (!x.is_string()) s.refuse(k, shape, "expected strings");
        p.stop.push_back(x.get<std::string>());
      }
    } else if (!v.is_null()) {
      s.refuse(k, shape, "expected a string or an array of strings");
    }
    // Offline lines leave empty strings to SamplingParams::validate.
    if (s.api)
      for (const auto& x : p.stop)
        if (x.empty()) s.refuse(k, "'stop' strings must not be empty", "");
  } else if (k == "stop_token_ids") {
    const std::string shape = "'stop_token_ids' must be a list of integers";
    if (!v.is_array()) s.refuse(k, shape, "expected an array of token ids");
    for (const auto& x : v) p.stop_token_ids.push_back(read_token_id(k, x, shape, s));
  } else if (k == "logit_bias") {
    // {"token id": bias}: JSON keys are strings, so the ids are decimal integers written as keys.
    const std::string shape = "'logit_bias' must be an object mapping token ids to numbers in [-100, 100]";
    if (v.is_null()) return true;
    if (!v.is_object()) s.refuse(k, shape, "expected an object mapping token ids to biases");
    p.logit_bias.clear();
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string& key = it.key();
      int64_t id = -1;
      const bool digits = !key.empty() && key.size() <= 10 &&
                          std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (digits) id = std::stoll(key);
      if (!digits || id > INT32_MAX)
        s.refuse(k, "'logit_bias' keys must be token ids (got " + shown(json(key.substr(0, 40))) + ")",
                 "key " + shown(json(key.substr(0, 40))) + " is not a token id");
      if (!it.value().is_number()) s.refuse(k, shape, "the bias of token " + key + " is not a number");
      const double b = it.value().get<double>();
      if (!(b >= -100.0 && b <= 100.0))
        s.refuse(k, "'logit_bias' for token " + key + " must be in [-100, 100]",
                 "the bias of token " + key + " must be in [-100, 100]");
      p.logit_bias.push_back({int32_t(id), float(b)});
    }
  } else {
    return false;
  }
  return true;
}

void check_token_ids_in_vocab(const SamplingParams& p, int64_t vocab, const FieldStyle& s) {
  if (vocab <= 0) return;
  const std::string range = " is outside the vocabulary (ids 0 to " + std::to_string(vocab - 1) + ")";
  for (int32_t id : p.stop_token_ids)
    if (id >= vocab) s.refuse("stop_token_ids", "token id " + std::to_string(id) + range, "token id " + std::to_string(id) + range);
  for (const auto& [id, b] : p.logit_bias)
    if (id >= vocab) s.refuse("logit_bias", "token id " + std::to_string(id) + range, "token id " + std::to_string(id) + range);
}

void check_sampling_ranges(const SamplingParams& p) {
  if (p.temperature < 0 || p.temperature > 100) throw bad_request("'temperature' must be in [0, 100]", "temperature");
  if (!(p.top_p > 0 && p.top_p <= 1)) throw bad_request("'top_p' must be in (0, 1]", "top_p");
  if (p.top_k < -1) throw bad_request("'top_k' must be -1 (off) or positive", "top_k");
  if (p.min_p < 0 || p.min_p > 1) throw bad_request("'min_p' must be in [0, 1]", "min_p");
  if (std::abs(p.presence_penalty) > 2) throw bad_request("'presence_penalty' must be in [-2, 2]", "presence_penalty");
  if (std::abs(p.frequency_penalty) > 2)
    throw bad_request("'frequency_penalty' must be in [-2, 2]", "frequency_penalty");
  if (p.repetition_penalty <= 0) throw bad_request("'repetition_penalty' must be > 0", "repetition_penalty");
}

}  // namespace m3::server
