// GBNF parser, choice and regex grammars (see gbnf.h).
#include "structured/gbnf.h"

#include <map>

#include "structured/regex.h"
#include "tokenizer/utf8.h"

namespace m3::structured {

namespace {

class GbnfParser {
 public:
  GbnfParser(std::string_view t, const Limits& lim) : t_(t), lim_(lim) {}

  Grammar parse() {
    skip_all();
    while (pos_ < t_.size()) {
      const size_t at = pos_;
      std::string name = ident();
      if (name.empty()) fail("expected a rule name", at);
      skip_line_space();
      if (t_.substr(pos_, 3) != "::=") {
        if (pos_ < t_.size() && t_[pos_] == ':')
          fail("expected '::=' (this looks like Lark/EBNF `name: ...`, which is not supported; write GBNF)", pos_);
        fail("expected '::=' after rule name '" + name + "'", pos_);
      }
      pos_ += 3;
      skip_all();
      const int r = rule(name);
      if (defined_.count(r)) fail("rule '" + name + "' is defined twice", at);
      defined_[r] = true;
      g_.set_body(r, alternates(0));
      skip_all();
    }
    const int root = g_.find("root");
    if (root < 0 || !defined_.count(root)) fail("has no 'root' rule", 0);
    for (int r = 0; r < g_.size(); ++r)
      if (!defined_.count(r)) fail("uses the rule '" + g_.name(r) + "', which is not defined", 0);
    g_.root = root;
    return std::move(g_);
  }

 private:
  [[noreturn]] void fail(const std::string& why, size_t at) const {
    throw StructuredError("structured output: grammar " + why + " (at byte " + std::to_string(at) + ")");
  }
  int rule(const std::string& name) {
    int r = g_.find(name);
    if (r < 0) {
      r = g_.add_rule(name);
      if (g_.size() > lim_.max_rules) fail("has more than " + std::to_string(lim_.max_rules) + " rules", pos_);
    }
    return r;
  }
  static bool word(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'; }
  std::string ident() {
    const size_t s = pos_;
    while (pos_ < t_.size() && word(t_[pos_])) ++pos_;
    return std::string(t_.substr(s, pos_ - s));
  }
  void skip_comment() {
    while (pos_ < t_.size() && t_[pos_] != '\n') ++pos_;
  }
  void skip_all() {
    while (pos_ < t_.size()) {
      if (t_[pos_] == '#') skip_comment();
      else if (t_[pos_] == ' ' || t_[pos_] == '\t' || t_[pos_] == '\n' || t_[pos_] == '\r') ++pos_;
      else break;
    }
  }
  void skip_line_space() {
    while (pos_ < t_.size()) {
      if (t_[pos_] == '#') skip_comment();
      else if (t_[pos_] == ' ' || t_[pos_] == '\t' || t_[pos_] == '\r') ++pos_;
      else break;
    }
  }
  void skip(int depth) { depth > 0 ? skip_all() : skip_line_space(); }
  // At top level: a newline then optional space then '|' continues the rule.
  bool continuation() {
    size_t p = pos_;
    while (p < t_.size()) {
      if (t_[p] == '#') { while (p < t_.size() && t_[p] != '\n') ++p; }
      else if (t_[p] == ' ' || t_[p] == '\t' || t_[p] == '\n' || t_[p] == '\r') ++p;
      else break;
    }
    if (p < t_.size() && t_[p] == '|') {
      pos_ = p;
      return true;
    }
    return false;
  }

  ExprPtr alternates(int depth) {
    std::vector<ExprPtr> alts{sequence(depth)};
    while (true) {
      skip(depth);
      if (pos_ < t_.size() && t_[pos_] == '|') {
        ++pos_;
        skip_all();
        alts.push_back(sequence(depth));
      } else if (depth == 0 && continuation()) {
        continue;
      } else break;
    }
    return e_alt(std::move(alts));
  }

  uint32_t next_cp() {
    uint32_t cp;
    const size_t n = tok::decode_utf8(t_, pos_, cp);
    if (n == 0) fail("is not valid UTF-8", pos_);
    pos_ += n;
    return cp;
  }
  uint32_t hexn(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      if (pos_ >= t_.size()) fail("has a malformed escape", pos_);
      const char c = t_[pos_++];
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) fail("has a malformed escape", pos_ - 1);
      v = v * 16 + uint32_t(d);
    }
    return v;
  }
  uint32_t char_cp() {
    if (pos_ >= t_.size()) fail("ends inside a literal or class", pos_);
    if (t_[pos_] != '\\') return next_cp();
    ++pos_;
    if (pos_ >= t_.size()) fail("ends with a backslash", pos_);
    const char c = t_[pos_++];
    switch (c) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case 'x': return hexn(2);
      case 'u': return hexn(4);
      case 'U': return hexn(8);
      case '\\': case '"': case '[': case ']': case '-': case '^': case '.': case '/': return uint32_t(c);
      default: fail("has an unknown escape \\" + std::string(1, c), pos_ - 2);
    }
  }
  int count() {
    const size_t s = pos_;
    int64_t v = 0;
    while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') {
      v = v * 10 + (t_[pos_++] - '0');
      if (v > lim_.max_repeat) fail("has a repetition count over the limit of " + std::to_string(lim_.max_repeat), s);
    }
    if (pos_ == s) fail("has a malformed {m,n}", s);
    return int(v);
  }

  ExprPtr sequence(int depth) {
    std::vector<ExprPtr> items;
    while (true) {
      skip(depth);
      if (pos_ >= t_.size()) break;
      const char c = t_[pos_];
      const size_t at = pos_;
      ExprPtr e;
      if (c == '"') {
        ++pos_;
        std::string lit;
        while (pos_ < t_.size() && t_[pos_] != '"') tok::append_utf8(lit, char_cp());
        if (pos_ >= t_.size()) fail("has an unterminated literal", at);
        ++pos_;
        e = e_lit(lit);
      } else if (c == '[') {
        ++pos_;
        bool neg = false;
        if (pos_ < t_.size() && t_[pos_] == '^') { neg = true; ++pos_; }
        std::vector<std::pair<uint32_t, uint32_t>> r;
        while (pos_ < t_.size() && t_[pos_] != ']') {
          const uint32_t lo = char_cp();
          uint32_t hi = lo;
          if (pos_ + 1 < t_.size() && t_[pos_] == '-' && t_[pos_ + 1] != ']') {
            ++pos_;
            hi = char_cp();
            if (hi < lo) fail("has a range out of order", at);
          }
          r.push_back({lo, hi});
        }
        if (pos_ >= t_.size()) fail("has an unterminated character class", at);
        ++pos_;
        e = e_codepoints(neg ? cp_complement(r) : r);
      } else if (c == '.') {
        ++pos_;
        e = e_codepoints({{0, 0x10FFFF}});
      } else if (c == '(') {
        ++pos_;
        skip_all();
        e = alternates(depth + 1);
        skip_all();
        if (pos_ >= t_.size() || t_[pos_] != ')') fail("has an unclosed '('", at);
        ++pos_;
      } else if (c == '<') {
        fail("uses a token reference (<...>), which is not supported", at);
      } else if (word(c)) {
        // A rule reference, unless this is the next rule's `name ::=`.
        const size_t save = pos_;
        const std::string name = ident();
        size_t p = pos_;
        while (p < t_.size() && (t_[p] == ' ' || t_[p] == '\t')) ++p;
        if (t_.substr(p, 3) == "::=") {
          pos_ = save;
          break;
        }
        e = e_ref(rule(name));
      } else {
        break;
      }
      // postfix operators
      while (pos_ < t_.size()) {
        const char q = t_[pos_];
        if (q == '*') { e = e_star(e); ++pos_; }
        else if (q == '+') { e = e_plus(e); ++pos_; }
        else if (q == '?') { e = e_opt(e); ++pos_; }
        else if (q == '{') {
          ++pos_;
          skip_line_space();
          const int mn = count();
          int mx = mn;
          skip_line_space();
          if (pos_ < t_.size() && t_[pos_] == ',') {
            ++pos_;
            skip_line_space();
            mx = pos_ < t_.size() && t_[pos_] == '}' ? -1 : count();
            skip_line_space();
          }
          if (pos_ >= t_.size() || t_[pos_] != '}') fail("has a malformed {m,n}", at);
          ++pos_;
          if (mx >= 0 && mx < mn) fail("has {m,n} with n < m", at);
          e = e_rep(e, mn, mx);
        } else break;
      }
      items.push_back(e);
    }
    return e_seq(std::move(items));
  }

  std::string_view t_;
  size_t pos_ = 0;
  const Limits& lim_;
  Grammar g_;
  std::map<int, bool> defined_;
};

}  // namespace

Grammar gbnf_grammar(std::string_view text, const Limits& limits) {
  if (text.size() > size_t(limits.max_schema_bytes))
    throw StructuredError("structured output: grammar is " + std::to_string(text.size()) + " bytes, over the limit of " +
                          std::to_string(limits.max_schema_bytes));
  GbnfParser p(text, limits);
  return p.parse();
}

Grammar choice_grammar(const std::vector<std::string>& choices) {
  if (choices.empty()) throw StructuredError("structured output: 'choice' must list at least one string");
  Grammar g;
  const int r = g.add_rule("root");
  std::vector<ExprPtr> alts;
  for (auto& c : choices) alts.push_back(e_lit(c));
  g.set_body(r, e_alt(std::move(alts)));
  return g;
}

Grammar regex_grammar(std::string_view pattern, const Limits& limits) {
  if (pattern.size() > size_t(limits.max_schema_bytes))
    throw StructuredError("structured output: regex is over the limit of " + std::to_string(limits.max_schema_bytes) + " bytes");
  Grammar g;
  const int r = g.add_rule("root");
  g.set_body(r, regex_expr(pattern, RegexMode::Raw, limits, "regex"));
  return g;
}

}  // namespace m3::structured
