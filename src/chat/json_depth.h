// JSON parsing with a nesting limit. nlohmann's parser is iterative, but copies, dumps and
// conversions of the parsed value recurse once per level, so a body nested 60,000 deep overflows the
// stack after it parsed. The parser callback sees each container's depth as it opens and refuses the
// document there, before anything deep is built.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/error.h"

namespace m3::chat {

// Request bodies and tool-call arguments nest a few levels (JSON schemas a few dozen at most).
inline constexpr int kMaxJsonDepth = 128;

// Thrown for a document deeper than the limit (a client error, like a syntax error).
class JsonTooDeep : public Error {
 public:
  explicit JsonTooDeep(int limit)
      : Error("the JSON nests deeper than " + std::to_string(limit) + " levels (objects and arrays)") {}
};

// Parses `text`; throws JsonTooDeep past `max_depth` levels and nlohmann's parse_error on bad syntax.
template <class J = nlohmann::ordered_json>
J parse_json_limited(std::string_view text, int max_depth = kMaxJsonDepth) {
  typename J::parser_callback_t cb = [max_depth](int depth, typename J::parse_event_t ev, J&) {
    if ((ev == J::parse_event_t::object_start || ev == J::parse_event_t::array_start) && depth >= max_depth)
      throw JsonTooDeep(max_depth);
    return true;
  };
  return J::parse(text, cb);
}

// Same, without exceptions for syntax errors: a discarded value when `text` is not JSON or too deep.
template <class J = nlohmann::ordered_json>
J parse_json_limited_or_discarded(std::string_view text, int max_depth = kMaxJsonDepth) {
  try {
    return parse_json_limited<J>(text, max_depth);
  } catch (const JsonTooDeep&) {
  } catch (const nlohmann::json::exception&) {
  }
  return J(J::value_t::discarded);
}

// True when `j` nests more than `limit` levels. Recurses at most `limit` frames, so it is safe to run
// on a value that would overflow the stack when copied or dumped.
template <class J>
bool nests_deeper_than(const J& j, int limit) {
  if (!j.is_structured()) return false;
  if (limit <= 0) return true;
  for (const auto& e : j)
    if (nests_deeper_than(e, limit - 1)) return true;
  return false;
}

}  // namespace m3::chat
