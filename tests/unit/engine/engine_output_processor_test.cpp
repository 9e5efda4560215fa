// OutputProcessor at the text level: the engine's way (text released at once, the stop string left
// out, even when it began in text already released) and a stream's way (what could still become a
// stop string held back, on a UTF-8 boundary; include_stop_str; the stop string that ended it).
#include <gtest/gtest.h>

#include "engine/output_processor.h"

namespace {

m3::OutputProcessor make(std::vector<std::string> stop, bool hold_back, bool include = false) {
  m3::OutputOptions o;
  o.stop = std::move(stop);
  o.hold_back = hold_back;
  o.include_stop_str = include;
  return m3::OutputProcessor(nullptr, o);
}

TEST(OutputProcessor, EngineReleasesAtOnceAndEndsOnAStopString) {
  auto p = make({"END", "xy"}, false);
  EXPECT_EQ(p.push_text("abc E", false), "abc E");
  EXPECT_FALSE(p.stopped());
  EXPECT_EQ(p.push_text("ND tail", false), "");  // "E" was released already; nothing after the stop
  ASSERT_TRUE(p.stopped());
  EXPECT_EQ(*p.stop_string(), "END");
  EXPECT_EQ(p.push_text("more", false), "");
}

TEST(OutputProcessor, StreamHoldsBackAPossibleStopString) {
  auto p = make({"END"}, true);
  EXPECT_EQ(p.push_text("abc", false), "a");
  EXPECT_EQ(p.push_text(" EN", false), "bc ");
  EXPECT_EQ(p.push_text("D tail", true), "");
  EXPECT_EQ(*p.stop_string(), "END");
}

TEST(OutputProcessor, IncludeStopStringAndEarliestMatch) {
  auto p = make({"cd", "bcd"}, true, true);
  EXPECT_EQ(p.push_text("abcde", false), "abcd");
  EXPECT_EQ(*p.stop_string(), "bcd");
}

TEST(OutputProcessor, HoldBackNeverSplitsACharacter) {
  auto p = make({"zz"}, true);
  EXPECT_EQ(p.push_text("a\xc3\xa9", false), "a");  // the last byte is held, so the whole é is
  EXPECT_EQ(p.push_text("b", true), "\xc3\xa9" "b");
  EXPECT_FALSE(p.stopped());
}

}  // namespace
