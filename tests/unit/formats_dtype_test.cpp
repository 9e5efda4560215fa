// Element decoders (E4M3, E8M0, E2M1, BF16) against the spec tables (formats.md section 1).
#include <gtest/gtest.h>

#include <cmath>

#include "formats/dtype.h"

TEST(Dtype, E4M3SpotValues) {
  EXPECT_EQ(m3::e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(m3::e4m3_to_float(0xB8), -1.0f);
  EXPECT_EQ(m3::e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(m3::e4m3_to_float(0x01), 0.001953125f);
  EXPECT_TRUE(std::isnan(m3::e4m3_to_float(0x7F)));
}
