// Structured outputs (constrained decoding), part 1: grammars and their compiled byte automata.
//
// Design. A constraint is a context-free grammar whose rule bodies are regular expressions over
// bytes and rule references (an "extended" CFG: each rule is a regex, terminals are byte classes).
// Every rule body is compiled once per request into a DFA over the alphabet {byte ranges} U {rule
// references}; together they form a recursive transition network, run as a pushdown automaton
// over BYTES (matcher.h): a stack frame is a DFA state, a reference pushes the callee's start
// state on top of the caller's continuation state, an accepting state may pop. The few places
// where a JSON grammar is ambiguous (a referenced rule may end or go on) are followed in parallel,
// so a matcher state is a small set of stacks (a GLR-style graph-structured stack, hash-consed).
// Why this design: regex-heavy content (strings, numbers, keys, formats, patterns, min/max length
// repetitions) becomes plain DFA transitions with no stack traffic, so the per-byte cost is a table
// lookup in the common case; recursion ($ref, nested arrays/objects, GBNF) still works; and the
// matcher's states are exact, small and comparable, so token masks can be cached per state and the
// state graph can be walked lazily together with a vocabulary trie (matcher.h).
// Left recursion is refused at compile time (it would push forever); all other CFGs work.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"

namespace m3::structured {

// Raised for anything a constraint cannot express or exceeds a limit: the message names the
// keyword (or construct) and where it is (a JSON pointer for schemas, an offset for regexes and
// grammars). Never raised for a well-formed, supported input.
class StructuredError : public Error {
 public:
  explicit StructuredError(const std::string& what) : Error(what) {}
};

// ---- regular expressions over bytes and rule references ----
struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;
struct Expr {
  enum class Kind { Empty, Bytes, Seq, Alt, Repeat, Ref };
  Kind kind = Kind::Empty;
  std::vector<std::pair<uint8_t, uint8_t>> ranges;  // Bytes: one byte in any range (inclusive)
  std::vector<ExprPtr> items;                         // Seq / Alt / Repeat (one item)
  int min = 0, max = -1;                              // Repeat: max -1 = unbounded
  int rule = -1;                                      // Ref
};

ExprPtr e_empty();
ExprPtr e_bytes(std::vector<std::pair<uint8_t, uint8_t>> ranges);
ExprPtr e_byte(uint8_t b);
ExprPtr e_lit(std::string_view s);  // the exact bytes
ExprPtr e_seq(std::vector<ExprPtr> items);
ExprPtr e_alt(std::vector<ExprPtr> items);
ExprPtr e_rep(ExprPtr item, int min, int max);
ExprPtr e_opt(ExprPtr item);
ExprPtr e_star(ExprPtr item);
ExprPtr e_plus(ExprPtr item);
ExprPtr e_ref(int rule);
// One UTF-8 encoded code point from a set of code point ranges (inclusive; surrogates excluded).
ExprPtr e_codepoints(std::vector<std::pair<uint32_t, uint32_t>> ranges);
// Complement within U+0000..U+10FFFF of a set of code point ranges.
std::vector<std::pair<uint32_t, uint32_t>> cp_complement(std::vector<std::pair<uint32_t, uint32_t>> ranges);

// Limits on what one request may compile (each error names the limit).
struct Limits {
  int max_rules = 10000;
  int max_dfa_states = 200000;   // all rules' DFA states together
  int max_nfa_states = 400000;   // per rule, before determinisation
  int max_repeat = 10000;        // {m,n} bounds, minLength/maxLength, minItems/maxItems
  int max_schema_depth = 64;     // nested schemas (not $ref recursion, which is a rule)
  int max_schema_bytes = 1 << 20;
  double max_compile_seconds = 5.0;
};

// A grammar: rules with regex bodies; rule 0 is the root unless `root` says otherwise.
class Grammar {
 public:
  int add_rule(std::string name);                       // a rule with an empty body, filled later
  void set_body(int rule, ExprPtr body) { rules_[size_t(rule)].body = std::move(body); }
  int find(const std::string& name) const;              // -1 when absent
  int size() const { return int(rules_.size()); }
  const std::string& name(int r) const { return rules_[size_t(r)].name; }
  const ExprPtr& body(int r) const { return rules_[size_t(r)].body; }
  int root = 0;

 private:
  struct Rule {
    std::string name;
    ExprPtr body;
  };
  std::vector<Rule> rules_;
};

// The compiled form: every rule's DFA, states numbered globally.
struct CompiledGrammar {
  struct Range {
    uint8_t lo, hi;
    int32_t to;
  };
  struct State {
    uint32_t range_begin = 0, range_end = 0;  // byte transitions in `ranges`
    uint32_t ref_begin = 0, ref_end = 0;      // rule calls in `refs`: (rule, continuation state)
    bool accepting = false;
  };
  std::vector<State> states;
  std::vector<Range> ranges;
  std::vector<std::pair<int32_t, int32_t>> refs;
  std::vector<int32_t> rule_start;  // per rule
  std::vector<std::string> rule_names;
  int32_t root_rule = 0;
  double compile_seconds = 0;

  int32_t step(int32_t s, uint8_t b) const {
    const State& st = states[size_t(s)];
    for (uint32_t i = st.range_begin; i < st.range_end; ++i) {
      const Range& r = ranges[i];
      if (b < r.lo) return -1;
      if (b <= r.hi) return r.to;
    }
    return -1;
  }
};

// Determinises every rule; throws StructuredError on left recursion or a limit.
std::shared_ptr<const CompiledGrammar> compile(const Grammar& g, const Limits& limits = Limits{});

// Deadline for the front ends (schema walk, regex parse): throws naming the limit once past it.
class CompileClock {
 public:
  explicit CompileClock(double seconds)
      : end_(std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                     std::chrono::duration<double>(seconds))),
        seconds_(seconds) {}
  void check() const;

 private:
  std::chrono::steady_clock::time_point end_;
  double seconds_;
};

}  // namespace m3::structured
