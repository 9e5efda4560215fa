// Structured outputs: regular expressions (the ECMAScript subset vLLM documents for `regex` and
// JSON Schema `pattern`) compiled to grammar expressions over UTF-8 bytes.
// Supported: literals, escapes (\n \r \t \f \v \0 \xHH \uHHHH \u{H..} and escaped punctuation),
// classes [...] with ranges and negation, \d \D \w \W \s \S (ECMAScript sets), `.` (any code point
// but line terminators), groups ( ), (?: ), (?<name> ), alternation, ? * + {n} {n,} {n,m} (lazy
// forms accepted: same language), ^ at the very start and $ at the very end.
// Refused by name: backreferences, lookahead/lookbehind, word boundaries, ^/$ elsewhere, flags.
#pragma once
#include <string_view>

#include "structured/grammar.h"

namespace m3::structured {

enum class RegexMode {
  Raw,         // the whole text must match; characters are their UTF-8 bytes
  JsonString,  // JSON Schema `pattern`: matched against a JSON string's content, written as JSON
               // would write it (canonical escapes for '"', '\\' and controls); ECMAScript search
               // semantics (unanchored ends may have any text around the match)
};

// `what` names the field in messages (e.g. "regex", "pattern at /properties/id").
ExprPtr regex_expr(std::string_view pattern, RegexMode mode, const Limits& limits, const std::string& what);

// One JSON string character (as JSON text) from a set of code points: plain UTF-8 when JSON
// allows it raw, the canonical escape otherwise.
ExprPtr json_chars(const std::vector<std::pair<uint32_t, uint32_t>>& cps);

}  // namespace m3::structured
