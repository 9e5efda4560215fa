// IncrementalDetokenizer tests: pushing ids one by one concatenates to decode(all ids), and no
// chunk ever carries a broken UTF-8 sequence (characters split across byte tokens are held back).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

const std::string kData = std::string(M3_TEST_DATA) + "/tokenizer";

// Streams `ids`, checking each chunk; returns the concatenation.
std::string stream(const m3::Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  m3::IncrementalDetokenizer d(tok, skip_special);
  std::string all;
  for (int32_t id : ids) {
    const std::string chunk = d.push(id);
    EXPECT_TRUE(m3::tok::is_valid_utf8(chunk)) << "chunk after id " << id;
    all += chunk;
  }
  const std::string rest = d.flush();
  EXPECT_TRUE(m3::tok::is_valid_utf8(rest));
  return all + rest;
}

TEST(TokenizerIncremental, TinyEmojiAndCjk) {
  const auto tok = m3::Tokenizer::from_dir(kData + "/m3-tiny");
  for (const std::string s : {"日本語のテキスト", "🤖🚀 👨‍👩‍👧 🇯🇵", "mixed 中文 and emoji 😀!", "]~!b[你好[e~[",
                              "𝔘𝔫𝔦 <think>思考</think> done"}) {
    const auto ids = tok.encode(s);
    EXPECT_EQ(stream(tok, ids, false), tok.decode(ids)) << s;
    EXPECT_EQ(stream(tok, ids, false), s);
    EXPECT_EQ(stream(tok, ids, true), tok.decode(ids, true)) << s;
  }
}

TEST(TokenizerIncremental, HoldsBackPartialCharacter) {
  const auto tok = m3::Tokenizer::from_dir(kData + "/m3-tiny");
  // In the tiny vocabulary ids 0..255 are single bytes: U+1F600 = F0 9F 98 80.
  m3::IncrementalDetokenizer d(tok, false);
  EXPECT_EQ(d.push('a'), "a");
  EXPECT_EQ(d.push(0xF0), "");
  EXPECT_EQ(d.push(0x9F), "");
  EXPECT_EQ(d.push(0x98), "");
  EXPECT_EQ(d.push(0x80), "\xF0\x9F\x98\x80");
  // An unfinished character followed by a special token becomes U+FFFD, as in decode().
  EXPECT_EQ(d.push(0xE4), "");
  EXPECT_EQ(d.push(421), "\xEF\xBF\xBD[e~[");
  EXPECT_EQ(d.push(0xE4), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.flush(), "");
  EXPECT_EQ(tok.decode({0xE4, 421, 0xE4}), "\xEF\xBF\xBD[e~[\xEF\xBF\xBD");
}

TEST(TokenizerIncremental, O200kRandomText) {
  const auto tok = m3::Tokenizer::from_file(kData + "/o200k/tokenizer.json");
  std::mt19937 rng(42);
  const std::vector<std::string> parts = {"héllo ", "世界", "🤖", "👨‍👩‍👧", "e\u0301", "  \n", "123", "<|endoftext|>",
                                          "𐍈", "كتاب", "ok"};
  for (int i = 0; i < 50; ++i) {
    std::string s;
    for (int k = 0; k < 30; ++k) s += parts[rng() % parts.size()];
    const auto ids = tok.encode(s);
    ASSERT_EQ(stream(tok, ids, false), s);
    ASSERT_EQ(stream(tok, ids, true), tok.decode(ids, true));
  }
}

}  // namespace
