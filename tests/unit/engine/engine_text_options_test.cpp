// The engine makes each request's text as its TextOptions ask (the one output processor, issue 39):
// special tokens kept or skipped, and stop strings matched on that same text, so a request that keeps
// them stops the moment a marker such as </mm:think> is generated; the matched stop string kept or
// left out; text held back for streams (never part of a stop string sent) and released at the end or
// on abort; the ending token's text left out; and speculative decoding stopping at the same token.
// On the shipped demo model, greedy, whose chat reply starts with its think-close marker.
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "tokenizer/tokenizer.h"

namespace {

using m3::Engine;
using m3::EngineConfig;
using m3::FinishReason;
using m3::RequestOutput;
using m3::TextOptions;

const std::string kDemo = std::string(M3_TEST_DATA) + "/../../models/demo";
const std::string kThinkEnd = "</mm:think>";

struct Demo {
  m3::Model model{kDemo};
  m3::Tokenizer tok = m3::Tokenizer::from_dir(kDemo);
  std::vector<int32_t> prompt = tok.encode("]~b]user\nWhat is 2+2?[e~[\n]~b]ai\n", true);
};
Demo& demo() {
  static Demo d;
  return d;
}

EngineConfig config() {
  EngineConfig c;
  c.num_pages = 16;
  return c;
}

// One request to completion, with every output kept.
struct Outcome {
  std::vector<RequestOutput> outs;
  m3test::Finished f;
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token;
};
Outcome run_one(const m3::SamplingParams& p, const TextOptions& t, const EngineConfig& c = config()) {
  Engine e(demo().model, &demo().tok, c);
  e.add_request("r", demo().prompt, p, t);
  Outcome r;
  while (e.has_work())
    for (auto& o : e.step()) {
      r.f.tokens.insert(r.f.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      r.f.text += o.new_text;
      if (o.finished) {
        r.f.reason = o.finish_reason;
        r.stop_string = o.stop_string;
        r.stop_token = o.stop_token;
      }
      r.outs.push_back(std::move(o));
    }
  return r;
}

TextOptions keep_special() {
  TextOptions t;
  t.skip_special = false;
  return t;
}

TEST(EngineTextOptions, SpecialTokensKeptOrSkipped) {
  const Outcome skip = run_one(m3test::greedy(30), {});
  const Outcome keep = run_one(m3test::greedy(30), keep_special());
  ASSERT_EQ(skip.f.tokens, keep.f.tokens);
  EXPECT_EQ(skip.f.text, demo().tok.decode(skip.f.tokens, true));
  EXPECT_EQ(keep.f.text, demo().tok.decode(keep.f.tokens, false));
  // The premise of the next test: the marker is a special token of this reply.
  EXPECT_EQ(keep.f.text.rfind(kThinkEnd, 0), 0u) << keep.f.text;
  EXPECT_EQ(skip.f.text.find(kThinkEnd), std::string::npos);
}

TEST(EngineTextOptions, StopStringOnAMarkerStopsWhenSpecialTokensAreKept) {
  m3::SamplingParams p = m3test::greedy(30);
  p.stop = {kThinkEnd};
  // Skipped special tokens: the marker is not in the text, so the request runs to its limit.
  const Outcome skip = run_one(p, {});
  EXPECT_EQ(skip.f.reason, FinishReason::Length);
  EXPECT_EQ(skip.f.tokens.size(), 30u);
  EXPECT_FALSE(skip.stop_string);
  // Kept: it ends on the marker's token at once, with nothing generated after it.
  const Outcome keep = run_one(p, keep_special());
  EXPECT_EQ(keep.f.reason, FinishReason::Stop);
  ASSERT_TRUE(keep.stop_string);
  EXPECT_EQ(*keep.stop_string, kThinkEnd);
  EXPECT_FALSE(keep.stop_token);
  EXPECT_EQ(keep.f.tokens, std::vector<int32_t>(skip.f.tokens.begin(), skip.f.tokens.begin() + 1));
  EXPECT_EQ(keep.f.text, "");
  TextOptions incl = keep_special();
  incl.include_stop_str = true;
  EXPECT_EQ(run_one(p, incl).f.text, kThinkEnd);
}

TEST(EngineTextOptions, HeldBackTextIsNeverPartOfAStopStringAndIsReleasedAtTheEnd) {
  m3::SamplingParams p = m3test::greedy(30);
  p.stop = {"zzz"};  // never generated: the whole text comes out, two bytes at a time behind
  TextOptions t;
  t.hold_back = true;
  const Outcome held = run_one(p, t);
  const Outcome plain = run_one(p, {});
  ASSERT_EQ(held.f.tokens, plain.f.tokens);
  EXPECT_EQ(held.f.text, plain.f.text);
  std::vector<int32_t> so_far;
  std::string released;
  for (const auto& o : held.outs) {
    so_far.insert(so_far.end(), o.new_tokens.begin(), o.new_tokens.end());
    released += o.new_text;
    if (o.finished) break;
    const std::string all = demo().tok.decode(so_far, true);
    EXPECT_LE(released.size() + 2, std::max<size_t>(all.size(), 2)) << "released \"" << released << "\" of \"" << all << "\"";
  }
}

TEST(EngineTextOptions, AbortReleasesTheHeldBackText) {
  m3::SamplingParams p = m3test::greedy(30);
  p.stop = {"zzz"};
  TextOptions t;
  t.hold_back = true;
  Engine e(demo().model, &demo().tok, config());
  e.add_request("r", demo().prompt, p, t);
  std::vector<int32_t> tokens;
  std::string text;
  for (int i = 0; i < 8; ++i)
    for (auto& o : e.step()) {
      tokens.insert(tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      text += o.new_text;
    }
  RequestOutput last;
  ASSERT_TRUE(e.abort("r", &last));
  EXPECT_TRUE(last.finished);
  EXPECT_EQ(last.finish_reason, FinishReason::Abort);
  EXPECT_TRUE(last.new_tokens.empty());
  EXPECT_FALSE(last.new_text.empty());
  EXPECT_EQ(text + last.new_text, demo().tok.decode(tokens, true));
  EXPECT_FALSE(e.abort("r", &last));
}

TEST(EngineTextOptions, EndingTokenTextKeptOrLeftOut) {
  const Outcome free_run = run_one(m3test::greedy(30), keep_special());
  ASSERT_GE(free_run.f.tokens.size(), 6u);
  const int32_t end = free_run.f.tokens[5];
  const size_t at = size_t(std::find(free_run.f.tokens.begin(), free_run.f.tokens.end(), end) - free_run.f.tokens.begin());
  m3::SamplingParams p = m3test::greedy(30);
  p.stop_token_ids = {end};
  const std::vector<int32_t> upto(free_run.f.tokens.begin(), free_run.f.tokens.begin() + at + 1);
  const Outcome with = run_one(p, keep_special());
  EXPECT_EQ(with.f.reason, FinishReason::Stop);
  EXPECT_EQ(with.f.tokens, upto);
  ASSERT_TRUE(with.stop_token);
  EXPECT_EQ(*with.stop_token, end);
  EXPECT_FALSE(with.stop_string);
  EXPECT_EQ(with.f.text, demo().tok.decode(upto, false));
  TextOptions t = keep_special();
  t.stop_token_text = false;
  const Outcome without = run_one(p, t);
  EXPECT_EQ(without.f.tokens, upto);
  EXPECT_EQ(without.f.text, demo().tok.decode(std::vector<int32_t>(upto.begin(), upto.end() - 1), false));
  EXPECT_EQ(without.stop_token, with.stop_token);
}

TEST(EngineTextOptions, SpeculativeDecodingStopsOnTheSameToken) {
  m3::SamplingParams p = m3test::greedy(40);
  p.stop = {"sea", "earth"};
  const Outcome plain = run_one(p, keep_special());
  ASSERT_EQ(plain.f.reason, FinishReason::Stop) << plain.f.text;
  EngineConfig c = config();
  c.num_pages = 32;
  c.spec = m3::SpeculativeConfig::parse(R"({"method":"dspark","num_speculative_tokens":3})");
  const Outcome spec = run_one(p, keep_special(), c);
  EXPECT_EQ(spec.f.tokens, plain.f.tokens);
  EXPECT_EQ(spec.f.text, plain.f.text);
  EXPECT_EQ(spec.stop_string, plain.stop_string);
}

}  // namespace
