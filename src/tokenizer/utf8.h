// UTF-8 helpers for the tokenizer: code point encoding, validation, and lossy repair that replaces
// each maximal invalid subpart with U+FFFD (the same rule as Rust's String::from_utf8_lossy).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace m3::tok {

// Appends the UTF-8 encoding of code point `cp` to `out`.
void append_utf8(std::string& out, uint32_t cp);

// Decodes the code point starting at s[pos]; returns its byte length, or 0 if the bytes there are
// not a complete valid sequence.
size_t decode_utf8(std::string_view s, size_t pos, uint32_t& cp);

// Index of the first byte that is not part of a valid UTF-8 sequence, or npos when `s` is valid.
size_t find_invalid_utf8(std::string_view s);
inline bool is_valid_utf8(std::string_view s) { return find_invalid_utf8(s) == std::string_view::npos; }

// Appends `s` to `out`, replacing invalid bytes with U+FFFD. When `hold_incomplete_tail` is true, a
// trailing truncated-but-so-far-valid sequence is not emitted; the return value is the number of
// bytes of `s` consumed (the rest is the held-back tail). Otherwise everything is consumed.
size_t append_utf8_lossy(std::string& out, std::string_view s, bool hold_incomplete_tail);

inline std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  append_utf8_lossy(out, s, false);
  return out;
}

}  // namespace m3::tok
