// GPT-2 byte <-> unicode mapping (see byte_level.h).
#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace m3::tok {

namespace {

struct Tables {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 512> to_byte{};  // every mapped code point is below 0x144
  Tables() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
      to_cp[b] = cp;
      to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) { return tables().to_cp[b]; }

int codepoint_to_byte(uint32_t cp) { return cp < 512 ? tables().to_byte[cp] : -1; }

std::string byte_level_encode(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) append_utf8(out, byte_to_codepoint(static_cast<uint8_t>(c)));
  return out;
}

std::string byte_level_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp = 0;
    const size_t n = decode_utf8(s, i, cp);
    const int b = n ? codepoint_to_byte(cp) : -1;
    if (b < 0) return std::string(s);
    out += static_cast<char>(b);
    i += n;
  }
  return out;
}

}  // namespace m3::tok
