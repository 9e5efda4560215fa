// Element decoders (E4M3, E8M0, E2M1, BF16) against the spec tables (docs/formats.md section 1); the E4M3
// NaN scan the loader runs over FP8 tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "formats/dtype.h"

TEST(Dtype, E4M3SpotValues) {
  EXPECT_EQ(m3::e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(m3::e4m3_to_float(0xB8), -1.0f);
  EXPECT_EQ(m3::e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(m3::e4m3_to_float(0x01), 0.001953125f);
  EXPECT_TRUE(std::isnan(m3::e4m3_to_float(0x7F)));
}

// find_e4m3_nan: the first 0x7F / 0xFF byte, at every offset within the 8-byte words and across the
// 1 MiB chunks scanned in parallel; the finite neighbours (0x7E, 0xFE, 0x80, 0x00) are never taken.
TEST(Dtype, E4M3NanScan) {
  for (uint8_t b = 0;; ++b) {
    std::vector<uint8_t> one(1, b);
    EXPECT_EQ(m3::find_e4m3_nan(one.data(), 1), (b & 0x7f) == 0x7f ? 0u : 1u) << int(b);
    if (b == 255) break;
  }
  std::vector<uint8_t> v(37);
  for (size_t i = 0; i < v.size(); ++i) v[i] = uint8_t(i % 2 ? 0x7e : 0xfe);
  EXPECT_EQ(m3::find_e4m3_nan(v.data(), v.size()), v.size());
  EXPECT_EQ(m3::find_e4m3_nan(v.data(), 0), 0u);
  for (size_t at = 0; at < v.size(); ++at) {
    std::vector<uint8_t> w = v;
    w[at] = at % 3 ? 0x7f : 0xff;
    EXPECT_EQ(m3::find_e4m3_nan(w.data(), w.size()), at);
    if (at + 5 < w.size()) w[at + 5] = 0xff;  // a later one does not hide the first
    EXPECT_EQ(m3::find_e4m3_nan(w.data(), w.size()), at);
  }
  std::vector<uint8_t> big((size_t(3) << 20) + 11, 0x80);
  EXPECT_EQ(m3::find_e4m3_nan(big.data(), big.size()), big.size());
  const size_t late = (size_t(2) << 20) + 3, early = (size_t(1) << 20) - 1, last = big.size() - 1;
  big[last] = 0x7f;
  EXPECT_EQ(m3::find_e4m3_nan(big.data(), big.size()), last);
  big[late] = 0xff;
  EXPECT_EQ(m3::find_e4m3_nan(big.data(), big.size()), late);
  big[early] = 0x7f;
  EXPECT_EQ(m3::find_e4m3_nan(big.data(), big.size()), early);
}
