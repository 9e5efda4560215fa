// Structured outputs: token masks over the real o200k vocabulary (200K tokens) equal a brute-force
// check (each token's bytes fed through a fresh byte automaton replaying the same history) on
// random states of several grammars; the reasoning gate; end tokens only when the grammar accepts.
#include "structured_test_util.h"

#include <random>

#include "base/error.h"
#include "structured/tool_grammar.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace m3::structured;

const m3::Tokenizer& o200k() {
  static m3::Tokenizer t = m3::Tokenizer::from_dir(std::string(M3_TEST_DATA) + "/tokenizer/o200k");
  return t;
}
std::shared_ptr<const TokenVocab> o200k_vocab() {
  static auto v = TokenVocab::build(o200k(), o200k().vocab_size());
  return v;
}

void random_walk(const Grammar& g, uint32_t seed, int steps) {
  auto spec = std::make_shared<ConstraintSpec>();
  spec->grammar = compile(g);
  spec->vocab = o200k_vocab();
  spec->description = "test";
  const TokenVocab& v = *spec->vocab;
  Matcher m(spec);
  std::mt19937 rng(seed);
  std::string history;
  int walked = 0;
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step) + " after: " + history);
    const uint64_t* mask = m.mask();
    ASSERT_NE(mask, nullptr);
    Matcher fresh(spec);  // its own caches: nothing shared with `m`
    ASSERT_TRUE(fresh.advance_bytes(history));
    std::vector<int32_t> allowed;
    int64_t mismatches = 0;
    for (int32_t t = 0; t < int32_t(v.size()); ++t) {
      bool want;
      if (t == v.eos()) want = fresh.accepting();
      else want = !v.is_special(t) && !v.bytes(t).empty() && fresh.accepts_bytes(v.bytes(t));
      const bool got = (mask[t >> 6] >> (t & 63)) & 1;
      if (want != got && ++mismatches < 5) ADD_FAILURE() << "token " << t << " '" << v.bytes(t) << "' mask " << got << " brute force " << want;
      if (got) allowed.push_back(t);
    }
    ASSERT_EQ(mismatches, 0);
    ASSERT_FALSE(allowed.empty());
    // Prefer short tokens half of the time, so structure (quotes, commas, closers) gets visited;
    // end only when nothing else is allowed.
    std::vector<int32_t> text;
    for (int32_t t : allowed)
      if (t != v.eos()) text.push_back(t);
    if (text.empty()) break;
    int32_t pick = text[rng() % text.size()];
    if (rng() % 2) {
      std::vector<int32_t> shorts;
      for (int32_t t : text)
        if (v.bytes(t).size() <= 1) shorts.push_back(t);
      if (!shorts.empty()) pick = shorts[rng() % shorts.size()];
    }
    ++walked;
    ASSERT_TRUE(m.accepts(pick));
    ASSERT_TRUE(m.advance(pick));
    history += v.bytes(pick);
  }
  EXPECT_TRUE(walked == steps || m.terminated()) << walked << " steps";
}

}  // namespace

TEST(StructuredMask, O200kSchemaMasksEqualBruteForce) {
  const char* schema = R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":12},
      "age":{"type":"integer","minimum":0,"maximum":150},
      "tags":{"type":"array","items":{"enum":["a","b","c d"]},"maxItems":3},
      "score":{"type":"number"},
      "ok":{"type":"boolean"}},"required":["name","age"]})";
  random_walk(json_schema_grammar(nlohmann::ordered_json::parse(schema)), 1, 40);
}

TEST(StructuredMask, O200kRecursiveAndAnyJson) {
  random_walk(json_object_grammar(), 2, 40);
  random_walk(json_schema_grammar(nlohmann::ordered_json::parse(
                  R"({"$defs":{"n":{"type":"object","properties":{"k":{"type":"array","items":{"$ref":"#/$defs/n"}}}}},"$ref":"#/$defs/n"})")),
              3, 30);
}

TEST(StructuredMask, O200kRegexAndGbnf) {
  random_walk(regex_grammar("(\\w+@[a-z]+\\.(com|org)|\\d{3}-\\d{4})"), 4, 20);
  random_walk(gbnf_grammar("root ::= \"SELECT \" cols \" FROM \" [a-z]+\ncols ::= [a-z]+ (\", \" [a-z]+)*"), 5, 25);
}

TEST(StructuredMask, EndTokenOnlyWhenAcceptingAndReasoningGate) {
  auto spec = std::make_shared<ConstraintSpec>();
  spec->grammar = compile(choice_grammar({"yes", "no"}));
  spec->vocab = o200k_vocab();
  spec->start_after = "</think>";
  const TokenVocab& v = *spec->vocab;
  Matcher m(spec);
  EXPECT_EQ(m.mask(), nullptr);  // reasoning: unconstrained
  for (int32_t t : o200k().encode("I think so.</think>", false)) {
    EXPECT_TRUE(m.accepts(t));
    m.advance(t);
  }
  ASSERT_TRUE(m.active());
  const uint64_t* mask = m.mask();
  ASSERT_NE(mask, nullptr);
  auto bit = [&](int32_t t) { return (m.mask()[t >> 6] >> (t & 63)) & 1; };
  EXPECT_FALSE(bit(v.eos()));
  const int32_t yes = o200k().encode("yes", false).at(0);
  EXPECT_TRUE(bit(yes));
  const Matcher::State before = m.save();
  Matcher f = m.fork();
  ASSERT_TRUE(m.advance(yes));
  EXPECT_TRUE(m.accepting());
  EXPECT_TRUE(m.terminated());
  EXPECT_TRUE(bit(v.eos()));
  EXPECT_FALSE(bit(yes));
  EXPECT_FALSE(f.accepting());  // the fork did not move
  m.restore(before);
  EXPECT_FALSE(m.accepting());
  EXPECT_TRUE(bit(yes));
}

// thinking_token_budget: at most N tokens before the end tag, then the tag alone; with a grammar the
// grammar applies after it, without one nothing is constrained after it. Forks and saved states carry
// the count (speculation, preemption).
TEST(StructuredMask, ReasoningBudgetForcesTheEndTag) {
  // A vocabulary of single bytes plus an end token (256) and "</t>" as one token (257).
  auto vocab = m3test::make_byte_vocab({"</t>"});
  const int32_t close = 257;
  auto budget_only = std::make_shared<ConstraintSpec>();
  budget_only->vocab = vocab;
  budget_only->start_after = "</t>";
  budget_only->start_after_budget = 3;
  budget_only->start_after_token = close;
  Matcher m(budget_only);
  auto only_close = [&](Matcher& x) {
    const uint64_t* mask = x.mask();
    if (!mask) return false;
    for (int32_t t = 0; t < vocab->size(); ++t)
      if (((mask[t >> 6] >> (t & 63)) & 1) != (t == close)) return false;
    return true;
  };
  for (char c : std::string("abc")) {
    EXPECT_EQ(m.mask(), nullptr);
    ASSERT_TRUE(m.advance(int32_t(uint8_t(c))));
  }
  EXPECT_TRUE(only_close(m));  // three tokens: the budget is spent
  EXPECT_FALSE(m.accepts('d'));
  EXPECT_FALSE(m.advance('d'));
  Matcher f = m.fork();
  const Matcher::State spent = m.save();
  ASSERT_TRUE(m.advance(close));
  EXPECT_TRUE(m.active());
  EXPECT_EQ(m.mask(), nullptr);  // no grammar: free after the tag
  EXPECT_TRUE(m.advance('z'));
  EXPECT_TRUE(only_close(f));  // the fork is still at the budget
  m.restore(spent);
  EXPECT_TRUE(only_close(m));
  // Closing early needs no forcing.
  Matcher early(budget_only);
  ASSERT_TRUE(early.advance('a'));
  ASSERT_TRUE(early.advance(close));
  EXPECT_EQ(early.mask(), nullptr);
  // Budget 0: the tag first.
  auto zero = std::make_shared<ConstraintSpec>(*budget_only);
  zero->start_after_budget = 0;
  Matcher z(zero);
  EXPECT_TRUE(only_close(z));
  // With a grammar: the grammar constrains what follows the forced tag.
  auto with_grammar = std::make_shared<ConstraintSpec>(*budget_only);
  with_grammar->grammar = compile(choice_grammar({"yes", "no"}));
  Matcher g(with_grammar);
  for (char c : std::string("abc")) ASSERT_TRUE(g.advance(int32_t(uint8_t(c))));
  EXPECT_TRUE(only_close(g));
  ASSERT_TRUE(g.advance(close));
  ASSERT_NE(g.mask(), nullptr);
  EXPECT_TRUE(g.accepts('y'));
  EXPECT_FALSE(g.accepts('q'));
  // A budget without the tag as one token is refused.
  auto bad = std::make_shared<ConstraintSpec>(*budget_only);
  bad->start_after_token = -1;
  EXPECT_THROW(Matcher{bad}, m3::Error);
}
