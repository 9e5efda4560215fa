// Small text helpers shared by the streaming parsers: whitespace test and the length of a
// trailing partial marker that must be held back until the next delta.
#pragma once
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace m3::chat {

inline bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Length of the longest suffix of `s` that is a proper prefix of one of `pats`.
inline size_t partial_suffix(std::string_view s, const std::vector<std::string>& pats) {
  size_t best = 0;
  for (const auto& p : pats)
    for (size_t n = std::min(s.size(), p.size() - 1); n > best; --n)
      if (s.substr(s.size() - n) == std::string_view(p).substr(0, n)) {
        best = n;
        break;
      }
  return best;
}

}  // namespace m3::chat
