// Lookup tables for the 8-bit and 4-bit element codes, built once from the bit-exact decoders in
// formats/dtype.h. Hot loops index these instead of decoding bits.
#pragma once
#include <array>

#include "formats/dtype.h"

namespace m3 {

struct ElementTables {
  std::array<float, 256> e4m3;
  std::array<float, 16> e2m1;
  ElementTables() {
    for (int i = 0; i < 256; ++i) e4m3[i] = e4m3_to_float(uint8_t(i));
    for (int i = 0; i < 16; ++i) e2m1[i] = e2m1_to_float(uint8_t(i));
  }
};

inline const ElementTables& element_tables() {
  static const ElementTables t;
  return t;
}

}  // namespace m3
