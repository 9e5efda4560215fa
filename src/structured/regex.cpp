// Regex -> grammar expression (see regex.h).
#include "structured/regex.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace m3::structured {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

ExprPtr json_chars(const Ranges& cps) {
  // Plain: everything but '"', '\\' and U+0000..U+001F.
  Ranges plain;
  std::vector<ExprPtr> alts;
  static const char* short_esc[32] = {nullptr};
  for (auto [lo, hi] : cps) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x1F); ++c) {
      std::string esc;
      switch (c) {
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default: {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          esc = buf;
        }
      }
      alts.push_back(e_lit(esc));
    }
    if (lo <= '"' && '"' <= hi) alts.push_back(e_lit("\\\""));
    if (lo <= '\\' && '\\' <= hi) alts.push_back(e_lit("\\\\"));
    const uint32_t a = std::max<uint32_t>(lo, 0x20);
    if (a > hi) continue;
    // split around '"' (0x22) and '\\' (0x5C)
    uint32_t s = a;
    for (uint32_t cut : {uint32_t('"'), uint32_t('\\')}) {
      if (cut < s || cut > hi) continue;
      if (cut > s) plain.push_back({s, cut - 1});
      s = cut + 1;
    }
    if (s <= hi) plain.push_back({s, hi});
  }
  (void)short_esc;
  if (!plain.empty()) alts.insert(alts.begin(), e_codepoints(plain));
  if (alts.empty()) return e_bytes({});
  return e_alt(std::move(alts));
}

namespace {

const Ranges kDigit{{'0', '9'}};
const Ranges kWord{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace{{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                    {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const Ranges kDot = cp_complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});

class Parser {
 public:
  Parser(std::string_view p, RegexMode mode, const Limits& lim, const std::string& what)
      : mode_(mode), lim_(lim), what_(what) {
    size_t i = 0;
    while (i < p.size()) {
      uint32_t cp;
      const size_t n = tok::decode_utf8(p, i, cp);
      if (n == 0) fail("is not valid UTF-8", i);
      cps_.push_back(cp);
      i += n;
    }
  }

  ExprPtr parse() {
    bool start_anchor = false, end_anchor = false;
    if (!cps_.empty() && cps_[0] == '^') {
      start_anchor = true;
      pos_ = 1;
    }
    size_t end = cps_.size();
    if (end > pos_ && cps_[end - 1] == '$' && !escaped_at(end - 1)) {
      end_anchor = true;
      --end;
    }
    end_ = end;
    ExprPtr e = alternation();
    if (pos_ != end_) fail("has an unmatched ')'", pos_);
    if (mode_ == RegexMode::JsonString) {
      std::vector<ExprPtr> seq;
      ExprPtr any = e_star(json_chars({{0, 0x10FFFF}}));
      if (!start_anchor) seq.push_back(any);
      seq.push_back(e);
      if (!end_anchor) seq.push_back(any);
      return e_seq(std::move(seq));
    }
    return e;
  }

 private:
  [[noreturn]] void fail(const std::string& why, size_t at) const {
    throw StructuredError("structured output: " + what_ + " " + why + " (at character " + std::to_string(at) + ")");
  }
  [[noreturn]] void refuse(const std::string& feature, size_t at) const {
    throw StructuredError("structured output: " + what_ + " uses " + feature + ", which is not supported (at character " +
                          std::to_string(at) + ")");
  }
  bool escaped_at(size_t i) const {
    size_t n = 0;
    while (i > n && cps_[i - n - 1] == '\\') ++n;
    return n % 2 == 1;
  }
  bool more() const { return pos_ < end_; }
  uint32_t peek() const { return cps_[pos_]; }

  ExprPtr chars(const Ranges& r) { return mode_ == RegexMode::JsonString ? json_chars(r) : e_codepoints(r); }

  ExprPtr alternation() {
    std::vector<ExprPtr> alts{sequence()};
    while (more() && peek() == '|') {
      ++pos_;
      alts.push_back(sequence());
    }
    return e_alt(std::move(alts));
  }

  ExprPtr sequence() {
    std::vector<ExprPtr> items;
    while (more() && peek() != '|' && peek() != ')') items.push_back(quantified());
    return e_seq(std::move(items));
  }

  int number() {
    int64_t v = 0;
    const size_t start = pos_;
    while (more() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > lim_.max_repeat) fail("has a repetition count over the limit of " + std::to_string(lim_.max_repeat), start);
      ++pos_;
    }
    if (pos_ == start) fail("has a malformed {m,n} repetition", start);
    return int(v);
  }

  ExprPtr quantified() {
    const size_t at = pos_;
    ExprPtr a = atom();
    while (more()) {
      const uint32_t c = peek();
      int mn, mx;
      if (c == '*') { mn = 0; mx = -1; ++pos_; }
      else if (c == '+') { mn = 1; mx = -1; ++pos_; }
      else if (c == '?') { mn = 0; mx = 1; ++pos_; }
      else if (c == '{' && pos_ + 1 < end_ && cps_[pos_ + 1] >= '0' && cps_[pos_ + 1] <= '9') {
        ++pos_;
        mn = number();
        mx = mn;
        if (more() && peek() == ',') {
          ++pos_;
          mx = more() && peek() == '}' ? -1 : number();
        }
        if (!more() || peek() != '}') fail("has a malformed {m,n} repetition", at);
        ++pos_;
        if (mx >= 0 && mx < mn) fail("has a repetition {m,n} with n < m", at);
      } else break;
      if (more() && peek() == '?') ++pos_;  // lazy: same language
      a = e_rep(a, mn, mx);
    }
    return a;
  }

  uint32_t hex(int n, size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      if (!more()) fail("has a malformed escape", at);
      const uint32_t c = peek();
      int d = c >= '0' && c <= '9' ? int(c - '0') : c >= 'a' && c <= 'f' ? int(c - 'a' + 10) : c >= 'A' && c <= 'F' ? int(c - 'A' + 10) : -1;
      if (d < 0) fail("has a malformed escape", at);
      v = v * 16 + uint32_t(d);
      ++pos_;
    }
    return v;
  }

  // After a backslash: a class (returns true, fills r) or a single code point (fills cp).
  bool escape(Ranges& r, uint32_t& cp, bool in_class) {
    const size_t at = pos_ - 1;
    if (!more()) fail("ends with a lone backslash", at);
    const uint32_t c = peek();
    ++pos_;
    switch (c) {
      case 'd': r = kDigit; return true;
      case 'D': r = cp_complement(kDigit); return true;
      case 'w': r = kWord; return true;
      case 'W': r = cp_complement(kWord); return true;
      case 's': r = kSpace; return true;
      case 'S': r = cp_complement(kSpace); return true;
      case 'n': cp = '\n'; return false;
      case 'r': cp = '\r'; return false;
      case 't': cp = '\t'; return false;
      case 'f': cp = '\f'; return false;
      case 'v': cp = '\v'; return false;
      case '0': cp = 0; return false;
      case 'x': cp = hex(2, at); return false;
      case 'u':
        if (more() && peek() == '{') {
          ++pos_;
          cp = 0;
          int n = 0;
          while (more() && peek() != '}') { cp = cp * 16 + hex(1, at); if (++n > 6) fail("has a malformed \\u{...} escape", at); }
          if (!more()) fail("has a malformed \\u{...} escape", at);
          ++pos_;
          return false;
        }
        cp = hex(4, at);
        return false;
      case 'b':
        if (in_class) { cp = '\b'; return false; }
        refuse("a word boundary (\\b)", at);
      case 'B': refuse("a word boundary (\\B)", at);
      case 'k': refuse("a named backreference (\\k)", at);
      case 'p': case 'P': refuse("a Unicode property escape (\\p)", at);
      case 'c': refuse("a control escape (\\c)", at);
      default:
        if (c >= '1' && c <= '9') refuse("a backreference (\\" + std::string(1, char(c)) + ")", at);
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) fail("has an unknown escape \\" + std::string(1, char(c)), at);
        cp = c;  // escaped punctuation
        return false;
    }
  }

  ExprPtr atom() {
    const size_t at = pos_;
    const uint32_t c = peek();
    ++pos_;
    switch (c) {
      case '(': {
        if (more() && peek() == '?') {
          ++pos_;
          if (more() && peek() == ':') ++pos_;
          else if (more() && (peek() == '=' || peek() == '!')) refuse("a lookahead", at);
          else if (more() && peek() == '<' && pos_ + 1 < end_ && (cps_[pos_ + 1] == '=' || cps_[pos_ + 1] == '!')) refuse("a lookbehind", at);
          else if (more() && peek() == '<') {
            while (more() && peek() != '>') ++pos_;
            if (!more()) fail("has a malformed group name", at);
            ++pos_;
          } else refuse("a group modifier (?...)", at);
        }
        ExprPtr e = alternation();
        if (!more() || peek() != ')') fail("has an unclosed '('", at);
        ++pos_;
        return e;
      }
      case ')': fail("has an unmatched ')'", at);
      case '[': return klass(at);
      case '.': return chars(kDot);
      case '^': refuse("'^' other than at the start", at);
      case '$': refuse("'$' other than at the end", at);
      case '*': case '+': case '?': fail("has a quantifier with nothing to repeat", at);
      case '\\': {
        Ranges r;
        uint32_t cp = 0;
        if (escape(r, cp, false)) return chars(r);
        return chars({{cp, cp}});
      }
      default:
        return chars({{c, c}});
    }
  }

  ExprPtr klass(size_t at) {
    bool neg = false;
    if (more() && peek() == '^') {
      neg = true;
      ++pos_;
    }
    Ranges r;
    bool first = true;
    while (true) {
      if (!more()) fail("has an unclosed '['", at);
      uint32_t c = peek();
      if (c == ']' && !first) { ++pos_; break; }
      if (c == ']' && first) {  // ECMAScript: [] matches nothing, [^] anything
        ++pos_;
        break;
      }
      first = false;
      ++pos_;
      uint32_t lo;
      if (c == '\\') {
        Ranges cr;
        if (escape(cr, lo, true)) {
          r.insert(r.end(), cr.begin(), cr.end());
          continue;
        }
      } else lo = c;
      if (more() && peek() == '-' && pos_ + 1 < end_ && cps_[pos_ + 1] != ']') {
        ++pos_;
        uint32_t hi = peek();
        ++pos_;
        if (hi == '\\') {
          Ranges cr;
          if (escape(cr, hi, true)) fail("has a class escape as a range end", at);
        }
        if (hi < lo) fail("has a range out of order", at);
        r.push_back({lo, hi});
      } else {
        r.push_back({lo, lo});
      }
    }
    if (neg) r = cp_complement(r);
    return chars(r);
  }

  std::vector<uint32_t> cps_;
  size_t pos_ = 0, end_ = 0;
  RegexMode mode_;
  const Limits& lim_;
  std::string what_;
};

}  // namespace

ExprPtr regex_expr(std::string_view pattern, RegexMode mode, const Limits& limits, const std::string& what) {
  Parser p(pattern, mode, limits, what);
  return p.parse();
}

}  // namespace m3::structured
