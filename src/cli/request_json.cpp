// Parsing of offline request lines (see request_json.h).
#include "cli/request_json.h"

#include <cstdint>

#include "formats/error.h"
#include "server/request_fields.h"

namespace m3::cli {

using json = nlohmann::ordered_json;

OfflineRequest parse_offline_request(const json& j, const Tokenizer& tok, const std::string& where) {
  auto bad = [&](const std::string& key, const std::string& why) { return Error(where + ": \"" + key + "\": " + why); };
  if (!j.is_object()) throw Error(where + ": expected a JSON object");
  OfflineRequest r;
  SamplingParams& p = r.params;
  bool have_prompt = false;
  auto num = [&](const std::string& k, const json& v) {
    if (!v.is_number()) throw bad(k, "expected a number, got " + v.dump());
    return v.get<double>();
  };
  auto integer = [&](const std::string& k, const json& v) {
    if (!v.is_number_integer()) throw bad(k, "expected an integer, got " + v.dump());
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) throw bad(k, "out of range: " + v.dump());
    return v.get<int64_t>();
  };
  // Checked before narrowing: 2^32 + 104 must not become 104.
  auto int32 = [&](const std::string& k, const json& v, int64_t lo) {
    const int64_t x = integer(k, v);
    if (x < lo || x > INT32_MAX)
      throw bad(k, "out of range: " + v.dump() + " (expected " + std::to_string(lo) + " to " +
                       std::to_string(INT32_MAX) + ")");
    return int32_t(x);
  };
  if (auto r = server::refused_field(j, server::Endpoint::Offline)) throw bad(r->name, r->message);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (k == "prompt") {
      if (!v.is_string()) throw bad(k, "expected a string");
      r.prompt_ids = tok.encode(v.get<std::string>());
      have_prompt = true;
    } else if (k == "prompt_token_ids") {
      if (!v.is_array()) throw bad(k, "expected an array of token ids");
      for (const auto& x : v) {
        r.prompt_ids.push_back(int32(k, x, 0));
      }
      have_prompt = true;
    } else if (k == "temperature") {
      p.temperature = float(num(k, v));
    } else if (k == "top_p") {
      p.top_p = float(num(k, v));
    } else if (k == "top_k") {
      p.top_k = int32(k, v, -1);
    } else if (k == "min_p") {
      p.min_p = float(num(k, v));
    } else if (k == "seed") {
      if (!v.is_null()) {
        p.seed = uint64_t(integer(k, v));
        p.has_seed = true;
      }
    } else if (k == "presence_penalty") {
      p.presence_penalty = float(num(k, v));
    } else if (k == "frequency_penalty") {
      p.frequency_penalty = float(num(k, v));
    } else if (k == "repetition_penalty") {
      p.repetition_penalty = float(num(k, v));
    } else if (k == "max_tokens") {
      p.max_tokens = int32(k, v, 1);
    } else if (k == "ignore_eos") {
      if (!v.is_boolean()) throw bad(k, "expected true or false");
      p.ignore_eos = v.get<bool>();
    } else if (k == "stop") {
      if (v.is_string()) {
        p.stop.push_back(v.get<std::string>());
      } else if (v.is_array()) {
        for (const auto& s : v) {
          if (!s.is_string()) throw bad(k, "expected strings");
          p.stop.push_back(s.get<std::string>());
        }
      } else if (!v.is_null()) {
        throw bad(k, "expected a string or an array of strings");
      }
    } else if (k == "stop_token_ids") {
      if (!v.is_array()) throw bad(k, "expected an array of token ids");
      for (const auto& x : v) p.stop_token_ids.push_back(int32(k, x, 0));
    } else if (k == "logprobs") {
      if (!v.is_null()) p.logprobs = int32(k, v, 0);
    } else if (!server::is_refused_field_name(k, server::Endpoint::Offline)) {  // sent with its default
      throw Error(where + ": unknown field \"" + k + "\"");
    }
  }
  if (!have_prompt) throw Error(where + ": needs \"prompt\" or \"prompt_token_ids\"");
  try {
    p.validate();
  } catch (const Error& e) {
    throw Error(where + ": " + e.what());
  }
  return r;
}

}  // namespace m3::cli
