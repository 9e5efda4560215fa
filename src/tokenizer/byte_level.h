// The GPT-2 byte-level mapping used by ByteLevel pre-tokenizers and decoders: each of the 256 byte
// values is given a printable Unicode code point (printable Latin-1 bytes map to themselves, the
// others to U+0100 and up, e.g. space -> U+0120 'Ġ').
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace m3::tok {

// Code point standing for byte `b`.
uint32_t byte_to_codepoint(uint8_t b);

// Byte standing behind code point `cp`, or -1 when `cp` is not one of the 256 mapped code points.
int codepoint_to_byte(uint32_t cp);

// Raw bytes -> byte-level string (UTF-8 of the mapped code points).
std::string byte_level_encode(std::string_view raw);

// Byte-level string -> raw bytes, following the Hugging Face ByteLevel decoder: if every character
// of `s` is a mapped code point, the bytes behind them; otherwise `s` itself, unchanged.
std::string byte_level_decode(std::string_view s);

}  // namespace m3::tok
