// Validators for numeric flags whose messages name the value given ("--kv-cache-memory: must be positive,
// got -1"), where CLI11's PositiveNumber / NonNegativeNumber print a range up to 1.8e308.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace m3::cli {

namespace detail {
inline CLI::Validator number_at_least(bool allow_zero) {
  return CLI::Validator(
      [allow_zero](std::string& s) -> std::string {
        double d = 0;
        try {
          size_t used = 0;
          d = std::stod(s, &used);
          if (used != s.size()) return "expected a number, got " + s;
        } catch (...) {
          return "expected a number, got " + s;
        }
        if (allow_zero ? d >= 0 : d > 0) return {};
        return std::string(allow_zero ? "must be 0 or more" : "must be positive") + ", got " + s;
      },
      allow_zero ? "NONNEGATIVE" : "POSITIVE");
}
}  // namespace detail

inline CLI::Validator positive_number() { return detail::number_at_least(false); }
inline CLI::Validator non_negative_number() { return detail::number_at_least(true); }

}  // namespace m3::cli
