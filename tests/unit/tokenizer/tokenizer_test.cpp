// Tokenizer tests: o200k_base golden ids (from Hugging Face `tokenizers`), byte round trips of random
// UTF-8, exact ids on the tiny m3 tokenizer, special-token handling and error reporting.
//
// The tiny-tokenizer expected ids (tests/data/tokenizer/m3-tiny/expected.jsonl) were produced by
// tests/data/tokenizer/reference_bpe.py, an independent Python implementation of HF byte-level BPE
// (the `tokenizers` package is not installed here); that script reproduces all 200 o200k golden
// cases exactly before being used on the tiny tokenizer.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using json = nlohmann::json;
const std::string kData = std::string(M3_TEST_DATA) + "/tokenizer";

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<Case> read_cases(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  std::vector<Case> out;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    const json j = json::parse(line);
    out.push_back({j["text"].get<std::string>(), j["ids"].get<std::vector<int32_t>>()});
  }
  return out;
}

// Random valid UTF-8 covering 1- to 4-byte sequences, with plenty of spaces, newlines and digits.
std::string random_utf8(std::mt19937& rng, size_t n_chars) {
  std::string s;
  std::uniform_int_distribution<int> kind(0, 9);
  for (size_t i = 0; i < n_chars; ++i) {
    uint32_t cp;
    switch (kind(rng)) {
      case 0: cp = " \n\t\r"[rng() % 4]; break;
      case 1: case 2: case 3: cp = 0x20 + rng() % 0x5F; break;  // printable ASCII
      case 4: cp = rng() % 0x80; break;                          // any ASCII incl. controls
      case 5: cp = 0x80 + rng() % (0x800 - 0x80); break;
      case 6: case 7:
        do cp = 0x800 + rng() % (0x10000 - 0x800); while (cp >= 0xD800 && cp <= 0xDFFF);
        break;
      default: cp = 0x10000 + rng() % (0x110000 - 0x10000); break;
    }
    m3::tok::append_utf8(s, cp);
  }
  return s;
}

class TokenizerO200k : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto t0 = std::chrono::steady_clock::now();
    tok_ = new m3::Tokenizer(m3::Tokenizer::from_dir(kData + "/o200k"));
    load_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  static m3::Tokenizer* tok_;
  static double load_s_;
};
m3::Tokenizer* TokenizerO200k::tok_ = nullptr;
double TokenizerO200k::load_s_ = 0;

TEST_F(TokenizerO200k, GoldenIdsAndDecode) {
  const auto cases = read_cases(kData + "/o200k/tests.jsonl");
  ASSERT_EQ(cases.size(), 200u);
  for (const Case& c : cases) {
    EXPECT_EQ(tok_->encode(c.text), c.ids) << "text: " << c.text;
    EXPECT_EQ(tok_->decode(c.ids), c.text);
  }
}

TEST_F(TokenizerO200k, Metadata) {
  EXPECT_EQ(tok_->vocab_size(), 200019);
  EXPECT_EQ(tok_->bos_id(), 199998);
  EXPECT_EQ(tok_->eos_id(), 199999);
  EXPECT_TRUE(tok_->is_special(199999));
  EXPECT_FALSE(tok_->is_special(40));
  EXPECT_EQ(tok_->token_to_id("<|endoftext|>"), 199999);
  EXPECT_EQ(tok_->token_to_id("I"), 40);
  EXPECT_EQ(tok_->token_to_id("\xC4\xA0"), 220);  // "Ġ" = the space token
  EXPECT_FALSE(tok_->token_to_id("not a token at all").has_value());
  EXPECT_EQ(tok_->token_bytes(220), " ");
  EXPECT_EQ(tok_->token_bytes(199999), "<|endoftext|>");
}

TEST_F(TokenizerO200k, RandomUtf8RoundTrip) {
  std::mt19937 rng(1234);
  for (int i = 0; i < 300; ++i) {
    const std::string s = random_utf8(rng, 1 + rng() % 200);
    const auto ids = tok_->encode(s);
    ASSERT_EQ(tok_->decode(ids), s) << "case " << i;
  }
}

TEST_F(TokenizerO200k, SpecialTokensCanBeTextOnly) {
  const std::string s = "a<|endoftext|>b";
  const auto with = tok_->encode(s);
  const auto without = tok_->encode(s, /*parse_special=*/false);
  EXPECT_NE(std::find(with.begin(), with.end(), 199999), with.end());
  EXPECT_EQ(std::find(without.begin(), without.end(), 199999), without.end());
  EXPECT_EQ(tok_->decode(without), s);
  EXPECT_EQ(tok_->decode(with, /*skip_special=*/true), "ab");
}

TEST_F(TokenizerO200k, LongRunsAndSpeed) {
  // Long single pieces must not blow up (the BPE merge loop is heap-based).
  const std::string spaces(100000, ' '), letters(100000, 'a');
  EXPECT_EQ(tok_->decode(tok_->encode(spaces)), spaces);
  EXPECT_EQ(tok_->decode(tok_->encode(letters)), letters);

  std::mt19937 rng(7);
  std::string text;
  const auto cases = read_cases(kData + "/o200k/tests.jsonl");
  while (text.size() < (1u << 20)) text += cases[rng() % cases.size()].text + " ";
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok_->encode(text);
  const double enc_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(tok_->decode(ids), text);
  std::cout << "[o200k] load " << load_s_ << " s; encode " << text.size() / 1e6 / enc_s << " MB/s ("
            << ids.size() << " tokens)\n";
}

class TokenizerTiny : public ::testing::Test {
 protected:
  m3::Tokenizer tok_ = m3::Tokenizer::from_dir(kData + "/m3-tiny");
};

TEST_F(TokenizerTiny, ExactIds) {
  const auto cases = read_cases(kData + "/m3-tiny/expected.jsonl");
  ASSERT_GE(cases.size(), 40u);
  for (const Case& c : cases) {
    EXPECT_EQ(tok_.encode(c.text), c.ids) << "text: " << c.text;
    EXPECT_EQ(tok_.decode(c.ids), c.text);
  }
}

TEST_F(TokenizerTiny, SplitRegexKeepsSlashWithPunctuation) {
  // The regex comes from tokenizer.json (its 4th alternative is ` ?[^\s\p{L}\p{N}]+[\r\n/]*`); "/b"
  // is one piece (alternative 1 with a punctuation prefix). In the tiny vocabulary, ids 0..255 are
  // the single bytes and there is no merge for "/b".
  EXPECT_EQ(tok_.encode("a/b\n"), (std::vector<int32_t>{97, 47, 98, 10}));
  EXPECT_EQ(tok_.decode(tok_.encode("-->/")), "-->/");
}

TEST_F(TokenizerTiny, SpecialTokens) {
  EXPECT_EQ(tok_.vocab_size(), 427);
  EXPECT_EQ(tok_.bos_id(), 420);
  EXPECT_EQ(tok_.eos_id(), 421);
  const auto ids = tok_.encode("]~!b[hi[e~[");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 420);
  EXPECT_EQ(ids.back(), 421);
  EXPECT_EQ(tok_.decode(ids), "]~!b[hi[e~[");
  EXPECT_EQ(tok_.decode(ids, true), "hi");
  // Longest match wins: "</think>" rather than stopping at a shorter candidate.
  EXPECT_EQ(tok_.encode("</think>"), (std::vector<int32_t>{426}));
}

TEST_F(TokenizerTiny, RandomUtf8RoundTrip) {
  std::mt19937 rng(99);
  for (int i = 0; i < 300; ++i) {
    const std::string s = random_utf8(rng, 1 + rng() % 100);
    ASSERT_EQ(tok_.decode(tok_.encode(s)), s) << "case " << i;
  }
}

TEST_F(TokenizerTiny, Errors) {
  EXPECT_THROW(tok_.decode({427}), m3::Error);
  EXPECT_THROW(tok_.decode({-1}), m3::Error);
  try {
    tok_.token_bytes(100000);
    FAIL();
  } catch (const m3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("100000"), std::string::npos);
  }
  EXPECT_THROW(tok_.encode("bad \xFF utf8"), m3::Error);
  // Lone bytes of a multi-byte character decode to U+FFFD.
  EXPECT_EQ(tok_.decode({240, 159}), "\xEF\xBF\xBD");
}

TEST(TokenizerLoad, ErrorsNameTheFile) {
  try {
    m3::Tokenizer::from_dir(kData + "/does-not-exist");
    FAIL();
  } catch (const m3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos);
  }
  // A file that is JSON but not a tokenizer.
  try {
    m3::Tokenizer::from_file(kData + "/o200k/tokenizer_config.json");
    FAIL();
  } catch (const m3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("model"), std::string::npos);
  }
}

TEST(TokenizerUtf8, LossyMatchesMaximalSubparts) {
  using m3::tok::utf8_lossy;
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_lossy("abc"), "abc");
  EXPECT_EQ(utf8_lossy("a\xFF" "b"), "a" + r + "b");
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), r);           // truncated 4-byte sequence: one U+FFFD
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98x"), r + "x");
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), r + r + r);   // surrogate: each byte replaced
  EXPECT_EQ(utf8_lossy("\xC0\x80"), r + r);           // overlong
  EXPECT_TRUE(m3::tok::is_valid_utf8("\xF0\x9F\x98\x80"));
  EXPECT_FALSE(m3::tok::is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
}

}  // namespace
