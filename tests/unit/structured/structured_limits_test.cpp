// Structured outputs: the per-request memory bounds of a matcher (ConstraintSpec::max_mask_cache_bytes
// and max_state_bytes). The mask cache never holds more than its bound and its masks stay right
// after evictions; transition rows are dropped past the state bound and refilled; a grammar whose
// stacks keep growing ends with an error naming the limit, in the matcher and through the engine
// (finish reason error, the message in the output).
#include "structured_test_util.h"

#include <random>

#include "engine_test_util.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace m3::structured;

std::shared_ptr<ConstraintSpec> byte_spec(const Grammar& g) {
  auto s = std::make_shared<ConstraintSpec>();
  s->grammar = compile(g);
  s->vocab = m3test::byte_vocab();
  s->description = "test";
  return s;
}

bool bit(const uint64_t* m, int32_t t) { return (m[t >> 6] >> (t & 63)) & 1; }

}  // namespace

TEST(StructuredLimits, MaskCacheStaysWithinItsBoundAndRight) {
  auto bounded = byte_spec(json_schema_grammar(nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}},"b":{"type":"string"},
          "c":{"enum":["x","yy",null]}},"required":["a","b","c"]})")));
  const int64_t mask_bytes = m3test::byte_vocab()->mask_words() * 8;
  bounded->max_mask_cache_bytes = 3 * mask_bytes;  // three masks
  auto unbounded = std::make_shared<ConstraintSpec>(*bounded);
  unbounded->max_mask_cache_bytes = int64_t(1) << 30;
  const std::string text = R"({"a": [12, -3, 400], "b": "hello", "c": "yy"})";
  Matcher mm(bounded);
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    const uint64_t* got = mm.mask();
    Matcher fresh(unbounded);  // caches of its own, never evicted
    const std::string done = text.substr(0, i);
    ASSERT_TRUE(fresh.advance_bytes(done));
    const uint64_t* want = fresh.mask();
    for (int32_t t = 0; t < int32_t(m3test::byte_vocab()->size()); ++t)
      ASSERT_EQ(bit(got, t), bit(want, t)) << "token " << t << " after '" << done << "'";
    EXPECT_LE(mm.stats().mask_bytes, bounded->max_mask_cache_bytes);
    ASSERT_TRUE(mm.advance(int32_t(uint8_t(ch))));
  }
  EXPECT_TRUE(mm.accepting());
  EXPECT_GT(mm.stats().mask_evictions, 0) << "more distinct configurations than the cache holds";
  EXPECT_GT(mm.stats().mask_hits, 0) << "recurring configurations (inside the string, the numbers) still hit";
  EXPECT_TRUE(mm.check_limits().empty());
}

TEST(StructuredLimits, RowsEvictedThenStateOverTheBoundIsAnError) {
  // Every '(' opens a level: the stacks (and so the configurations) grow with the output.
  auto spec = byte_spec(gbnf_grammar(R"g(root ::= "(" root ")" | "x")g"));
  spec->max_state_bytes = 64 * 1024;
  Matcher m(spec);
  int depth = 0;
  std::string err;
  bool rows_dropped_while_fine = false;
  for (; depth < 10000 && err.empty(); ++depth) {
    ASSERT_TRUE(m.advance(int32_t('(')));
    (void)m.mask();  // fills rows for this configuration
    const int64_t evictions = m.stats().row_evictions;
    err = m.check_limits();
    if (err.empty()) {
      EXPECT_LE(m.stats().state_bytes + m.stats().row_bytes, spec->max_state_bytes);
      rows_dropped_while_fine = rows_dropped_while_fine || m.stats().row_evictions > evictions;
    }
  }
  ASSERT_FALSE(err.empty()) << "never over the bound";
  EXPECT_TRUE(rows_dropped_while_fine) << "the rows (a cache) go before the request fails";
  EXPECT_NE(err.find("max_state_bytes"), std::string::npos) << err;
  EXPECT_NE(err.find(std::to_string(spec->max_state_bytes)), std::string::npos) << err;
  EXPECT_GT(depth, 50);
  // A shallow output of the same grammar stays well within the default bound.
  auto dflt = byte_spec(gbnf_grammar(R"g(root ::= "(" root ")" | "x")g"));
  Matcher ok(dflt);
  for (char ch : std::string("((((x))))")) ASSERT_TRUE(ok.advance(int32_t(uint8_t(ch))));
  EXPECT_TRUE(ok.accepting());
  EXPECT_TRUE(ok.check_limits().empty());
}

TEST(StructuredLimits, EngineEndsTheRequestWithTheError) {
  const std::string dir = std::string(M3_TEST_DATA) + "/../../models/demo";
  m3::Model model(dir);
  m3::Tokenizer tok = m3::Tokenizer::from_dir(dir);
  auto spec = std::make_shared<ConstraintSpec>();
  // Only ever deeper: every token the grammar allows is a run of '(' opening new levels.
  spec->grammar = compile(gbnf_grammar(R"g(root ::= "(" root ")")g"));
  spec->vocab = TokenVocab::build(tok, model.config().vocab);
  spec->description = "grammar";
  spec->max_state_bytes = 24 * 1024;
  m3::EngineConfig cfg;
  cfg.num_pages = 16;
  m3::Engine e(model, &tok, cfg);
  m3::SamplingParams p = m3test::greedy(200);
  p.constraint = spec;
  e.add_request("deep", tok.encode("Hello"), p);
  e.add_request("free", tok.encode("Hello"), m3test::greedy(10));
  std::string error;
  std::map<std::string, m3test::Finished> out;
  while (e.has_work())
    for (auto& o : e.step()) {
      auto& f = out[o.request_id];
      f.tokens.insert(f.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      f.text += o.new_text;
      if (o.finished) f.reason = o.finish_reason;
      if (!o.error.empty()) error = o.error;
    }
  EXPECT_EQ(out["deep"].reason, m3::FinishReason::Error);
  EXPECT_NE(error.find("max_state_bytes"), std::string::npos) << error;
  EXPECT_LT(out["deep"].tokens.size(), 200u);
  EXPECT_EQ(out["deep"].text.find_first_not_of('('), std::string::npos) << out["deep"].text;
  EXPECT_EQ(out["free"].reason, m3::FinishReason::Length) << "the other request is unaffected";
  EXPECT_EQ(out["free"].tokens.size(), 10u);
}
