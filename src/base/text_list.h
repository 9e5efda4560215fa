// Comma-separated (or other separator) flag values, as vLLM's command lines write lists: items with
// surrounding spaces and tabs trimmed, empty items dropped. Used by --allowed-origins and friends and by
// `bench serve`'s --percentile-metrics / --metric-percentiles.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace m3 {

// `s` without leading and trailing spaces and tabs.
inline std::string trim_blanks(std::string_view s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string_view::npos ? std::string() : std::string(s.substr(a, b - a + 1));
}

// The non-empty trimmed items of `s` between separators.
inline std::vector<std::string> split_trimmed(std::string_view s, char sep = ',') {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    size_t end = s.find(sep, at);
    if (end == std::string_view::npos) end = s.size();
    if (std::string item = trim_blanks(s.substr(at, end - at)); !item.empty()) out.push_back(std::move(item));
    at = end + 1;
  }
  return out;
}

}  // namespace m3
