// UTF-8 helpers for the tokenizer (see utf8.h).
#include "tokenizer/utf8.h"

namespace m3::tok {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

// Result of inspecting the sequence at one position.
struct Step {
  size_t len;       // bytes covered (valid sequence, or the maximal invalid subpart)
  bool valid;       // a complete, valid sequence
  bool truncated;   // valid so far but the input ended before the sequence completed
  uint32_t cp;
};

Step inspect(std::string_view s, size_t pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) return {1, true, false, b0};
  size_t n;
  uint8_t lo = 0x80, hi = 0xBF;
  uint32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2; cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3; cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4; cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, false, false, 0};
  }
  for (size_t k = 1; k < n; ++k) {
    if (pos + k >= s.size()) return {k, false, true, 0};
    const auto b = static_cast<uint8_t>(s[pos + k]);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {k, false, false, 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {n, true, false, cp};
}

}  // namespace

size_t decode_utf8(std::string_view s, size_t pos, uint32_t& cp) {
  if (pos >= s.size()) return 0;
  const Step st = inspect(s, pos);
  if (!st.valid) return 0;
  cp = st.cp;
  return st.len;
}

size_t find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) { ++i; continue; }
    const Step st = inspect(s, i);
    if (!st.valid) return i;
    i += st.len;
  }
  return std::string_view::npos;
}

size_t append_utf8_lossy(std::string& out, std::string_view s, bool hold_incomplete_tail) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    while (i < s.size() && static_cast<uint8_t>(s[i]) < 0x80) ++i;
    out.append(s.data() + start, i - start);
    if (i >= s.size()) break;
    const Step st = inspect(s, i);
    if (st.valid) {
      out.append(s.data() + i, st.len);
    } else {
      if (st.truncated && hold_incomplete_tail) return i;
      out += "\xEF\xBF\xBD";
    }
    i += st.len;
  }
  return s.size();
}

}  // namespace m3::tok
