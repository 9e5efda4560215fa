// Recursive-descent Jinja parser. The expression grammar follows jinja2/parser.py level by level so
// that templates written against Python Jinja group the same way here.
#include "chat/jinja/jinja_parser.h"

#include <set>

#include "base/error.h"

namespace m3::jinja {
namespace {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& t) : toks_(t) {}

  Body parse_template() {
    std::string end;
    Body b = parse_body({}, end);
    if (!end.empty()) fail("unexpected '" + end + "'");
    return b;
  }

 private:
  const std::vector<Token>& toks_;
  size_t i_ = 0;

  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  [[noreturn]] void fail(const std::string& msg) const {
    throw Error("template line " + std::to_string(cur().line) + ": " + msg);
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    ++i_;
    return true;
  }
  bool accept_name(const char* n) {
    if (!is_name(n)) return false;
    ++i_;
    return true;
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case Tok::Eof: return "end of template";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::VarEnd: return "end of print statement";
      case Tok::Text: return "template text";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail("expected a name, got " + describe(cur()));
    return toks_[i_++].text;
  }
  void expect(Tok t, const char* what) {
    if (cur().type != t) fail(std::string("expected ") + what + ", got " + describe(cur()));
    ++i_;
  }

  static ExprPtr node(ExprKind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }
  static StmtPtr stmt(StmtKind k, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = line;
    return s;
  }

  // Parses statements until a block tag whose keyword is in `ends`; leaves the stream after that
  // keyword and reports it in `end` (empty at end of input).
  Body parse_body(const std::set<std::string>& ends, std::string& end) {
    Body body;
    end.clear();
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (!ends.empty()) fail("unexpected end of template, expected one of: " + join(ends));
        return body;
      }
      if (t.type == Tok::Text) {
        auto s = stmt(StmtKind::Text, t.line);
        s->text = t.text;
        body.push_back(std::move(s));
        ++i_;
        continue;
      }
      if (t.type == Tok::VarBegin) {
        ++i_;
        auto s = stmt(StmtKind::Output, t.line);
        s->expr = parse_expr();
        expect(Tok::VarEnd, "'}}'");
        body.push_back(std::move(s));
        continue;
      }
      if (t.type != Tok::BlockBegin) fail("unexpected " + describe(t));
      ++i_;
      if (cur().type != Tok::Name) fail("expected a statement keyword, got " + describe(cur()));
      std::string kw = cur().text;
      if (ends.count(kw)) {
        ++i_;
        end = kw;
        return body;
      }
      if (kw == "generation") {  // transformers' assistant-mask extension: renders its body inline
        ++i_;
        expect(Tok::BlockEnd, "'%}'");
        std::string e;
        Body inner = parse_body({"endgeneration"}, e);
        expect(Tok::BlockEnd, "'%}'");
        for (auto& s : inner) body.push_back(std::move(s));
        continue;
      }
      body.push_back(parse_statement());
    }
  }

  static std::string join(const std::set<std::string>& s) {
    std::string r;
    for (auto& x : s) r += (r.empty() ? "" : ", ") + x;
    return r;
  }

  StmtPtr parse_statement() {
    const Token& t = cur();
    int line = t.line;
    std::string kw = expect_name();
    if (kw == "if") return parse_if(line);
    if (kw == "for") return parse_for(line);
    if (kw == "set") return parse_set(line);
    if (kw == "macro") return parse_macro(line);
    if (kw == "call") return parse_call_block(line);
    if (kw == "filter") {
      auto s = stmt(StmtKind::FilterBlock, line);
      s->expr = parse_block_filter(line);
      expect(Tok::BlockEnd, "'%}'");
      std::string e;
      s->body = parse_body({"endfilter"}, e);
      expect(Tok::BlockEnd, "'%}'");
      return s;
    }
    if (kw == "break" || kw == "continue") {
      expect(Tok::BlockEnd, "'%}'");
      return stmt(kw == "break" ? StmtKind::Break : StmtKind::Continue, line);
    }
    if (kw == "with") {
      auto s = stmt(StmtKind::Scope, line);
      while (cur().type == Tok::Name) {
        auto set = stmt(StmtKind::Set, cur().line);
        set->targets.push_back(expect_name());
        expect_op("=");
        set->expr = parse_expr();
        s->body.push_back(std::move(set));
        if (!accept_op(",")) break;
      }
      expect(Tok::BlockEnd, "'%}'");
      std::string e;
      Body inner = parse_body({"endwith"}, e);
      expect(Tok::BlockEnd, "'%}'");
      for (auto& x : inner) s->body.push_back(std::move(x));
      return s;
    }
    i_--;
    fail("unknown statement '" + kw + "'");
  }

  StmtPtr parse_if(int line) {
    auto s = stmt(StmtKind::If, line);
    ExprPtr cond = parse_expr();
    while (true) {
      expect(Tok::BlockEnd, "'%}'");
      std::string end;
      Body b = parse_body({"elif", "else", "endif"}, end);
      s->branches.emplace_back(std::move(cond), std::move(b));
      if (end == "elif") {
        cond = parse_expr();
        continue;
      }
      if (end == "else") {
        expect(Tok::BlockEnd, "'%}'");
        s->else_body = parse_body({"endif"}, end);
      }
      expect(Tok::BlockEnd, "'%}'");
      return s;
    }
  }

  StmtPtr parse_for(int line) {
    auto s = stmt(StmtKind::For, line);
    bool paren = accept_op("(");
    s->targets.push_back(expect_name());
    while (accept_op(",")) s->targets.push_back(expect_name());
    if (paren) expect_op(")");
    if (!accept_name("in")) fail("expected 'in' in for loop, got " + describe(cur()));
    s->expr = parse_expr(/*allow_cond=*/false);
    if (accept_name("if")) s->cond = parse_expr(false);
    accept_name("recursive");
    expect(Tok::BlockEnd, "'%}'");
    std::string end;
    s->body = parse_body({"else", "endfor"}, end);
    if (end == "else") {
      expect(Tok::BlockEnd, "'%}'");
      s->else_body = parse_body({"endfor"}, end);
    }
    expect(Tok::BlockEnd, "'%}'");
    return s;
  }

  StmtPtr parse_set(int line) {
    std::string first = expect_name();
    std::string attr;
    std::vector<std::string> targets{first};
    if (accept_op(".")) attr = expect_name();
    while (attr.empty() && accept_op(",")) targets.push_back(expect_name());
    if (accept_op("=")) {
      auto s = stmt(StmtKind::Set, line);
      s->targets = targets;
      s->attr = attr;
      s->expr = parse_expr();
      if (is_op(",")) {  // `set a, b = x, y`: the value is a tuple
        auto tup = node(ExprKind::Tuple, line);
        tup->args.push_back(std::move(s->expr));
        while (accept_op(",")) tup->args.push_back(parse_expr());
        s->expr = std::move(tup);
      }
      expect(Tok::BlockEnd, "'%}'");
      return s;
    }
    if (!attr.empty() || targets.size() != 1) fail("block set takes a single name");
    auto s = stmt(StmtKind::SetBlock, line);
    s->text = first;
    if (accept_op("|")) s->expr = parse_block_filter(line);
    expect(Tok::BlockEnd, "'%}'");
    std::string end;
    s->body = parse_body({"endset"}, end);
    expect(Tok::BlockEnd, "'%}'");
    return s;
  }

  void parse_params(std::vector<MacroParam>& params) {
    expect_op("(");
    while (!is_op(")")) {
      MacroParam p;
      p.name = expect_name();
      if (accept_op("=")) p.default_value = parse_expr();
      params.push_back(std::move(p));
      if (!accept_op(",")) break;
    }
    expect_op(")");
  }

  StmtPtr parse_macro(int line) {
    auto s = stmt(StmtKind::Macro, line);
    s->text = expect_name();
    parse_params(s->params);
    expect(Tok::BlockEnd, "'%}'");
    std::string end;
    s->body = parse_body({"endmacro"}, end);
    if (cur().type == Tok::Name) ++i_;  // `{% endmacro name %}`
    expect(Tok::BlockEnd, "'%}'");
    return s;
  }

  // `{% call(args) macro(...) %}body{% endcall %}`: body becomes `caller(args)` inside the macro.
  StmtPtr parse_call_block(int line) {
    auto s = stmt(StmtKind::CallBlock, line);
    if (is_op("(")) parse_params(s->params);
    s->expr = parse_expr();
    if (s->expr->kind != ExprKind::Call) fail("expected a macro call in call block");
    expect(Tok::BlockEnd, "'%}'");
    std::string end;
    s->body = parse_body({"endcall"}, end);
    expect(Tok::BlockEnd, "'%}'");
    return s;
  }

  // `{% filter f(args) | g %}` and `{% set x | f %}`: a filter chain applied to the rendered body,
  // which the evaluator binds to the placeholder name below.
  ExprPtr parse_block_filter(int line) {
    auto body = node(ExprKind::Name, line);
    body->name = kBlockBodyName;
    auto f = node(ExprKind::Filter, line);
    f->name = expect_name();
    f->args.push_back(std::move(body));
    if (is_op("(")) parse_args(*f);
    return parse_filter_chain(std::move(f));
  }

  // ---- expressions ----

  ExprPtr parse_expr(bool allow_cond = true) {
    ExprPtr e = parse_or();
    while (allow_cond && is_name("if")) {
      int line = cur().line;
      ++i_;
      auto c = node(ExprKind::Cond, line);
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (accept_name("else")) other = parse_expr();
      else other = node(ExprKind::Literal, line);  // undefined, as Jinja does
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(ExprKind k, const std::string& op, ExprPtr a, ExprPtr b, int line) {
    auto e = node(k, line);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      int line = cur().line;
      ++i_;
      e = binary(ExprKind::Or, "or", std::move(e), parse_and(), line);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      int line = cur().line;
      ++i_;
      e = binary(ExprKind::And, "and", std::move(e), parse_not(), line);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      int line = cur().line;
      ++i_;
      auto e = node(ExprKind::Unary, line);
      e->name = "not";
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    while (true) {
      int line = cur().line;
      std::string op;
      if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        op = "not in";
        i_ += 2;
      } else {
        return e;
      }
      e = binary(ExprKind::Binary, op, std::move(e), parse_math1(), line);
    }
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      int line = cur().line;
      ++i_;
      e = binary(ExprKind::Binary, op, std::move(e), parse_concat(), line);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      int line = cur().line;
      ++i_;
      e = binary(ExprKind::Binary, "~", std::move(e), parse_math2(), line);
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      int line = cur().line;
      ++i_;
      e = binary(ExprKind::Binary, op, std::move(e), parse_pow(), line);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary();
    while (is_op("**")) {
      int line = cur().line;
      ++i_;
      e = binary(ExprKind::Binary, "**", std::move(e), parse_unary(), line);
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter = true) {
    int line = cur().line;
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      std::string op = cur().text;
      ++i_;
      e = node(ExprKind::Unary, line);
      e->name = op;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_chain(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    if (t.type == Tok::Name) {
      ++i_;
      if (t.text == "true" || t.text == "True") return literal(Value(true), line);
      if (t.text == "false" || t.text == "False") return literal(Value(false), line);
      if (t.text == "none" || t.text == "None") return literal(Value::none(), line);
      auto e = node(ExprKind::Name, line);
      e->name = t.text;
      return e;
    }
    if (t.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) s += toks_[i_++].text;  // adjacent literals concatenate
      return literal(Value(s), line);
    }
    if (t.type == Tok::Int) {
      ++i_;
      return literal(Value(int64_t(std::stoll(t.text))), line);
    }
    if (t.type == Tok::Float) {
      ++i_;
      return literal(Value(std::stod(t.text)), line);
    }
    if (accept_op("(")) {
      if (accept_op(")")) return node(ExprKind::Tuple, line);
      ExprPtr e = parse_expr();
      if (is_op(",")) {
        auto tup = node(ExprKind::Tuple, line);
        tup->args.push_back(std::move(e));
        while (accept_op(",")) {
          if (is_op(")")) break;
          tup->args.push_back(parse_expr());
        }
        e = std::move(tup);
      }
      expect_op(")");
      return e;
    }
    if (accept_op("[")) {
      auto e = node(ExprKind::List, line);
      while (!is_op("]")) {
        e->args.push_back(parse_expr());
        if (!accept_op(",")) break;
      }
      expect_op("]");
      return e;
    }
    if (accept_op("{")) {
      auto e = node(ExprKind::Dict, line);
      while (!is_op("}")) {
        e->args.push_back(parse_expr());
        expect_op(":");
        e->args.push_back(parse_expr());
        if (!accept_op(",")) break;
      }
      expect_op("}");
      return e;
    }
    fail("unexpected " + describe(t));
  }

  ExprPtr literal(Value v, int line) {
    auto e = node(ExprKind::Literal, line);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      int line = cur().line;
      if (accept_op(".")) {
        auto g = node(ExprKind::GetAttr, line);
        if (cur().type == Tok::Int) g->name = toks_[i_++].text;  // `x.0` is item access in Jinja
        else g->name = expect_name();
        g->args.push_back(std::move(e));
        e = std::move(g);
      } else if (accept_op("[")) {
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, int line) {
    ExprPtr parts[3];
    bool slice = false;
    if (!is_op(":")) parts[0] = parse_expr();
    if (accept_op(":")) {
      slice = true;
      if (!is_op("]") && !is_op(":")) parts[1] = parse_expr();
      if (accept_op(":") && !is_op("]")) parts[2] = parse_expr();
    }
    expect_op("]");
    auto e = node(slice ? ExprKind::Slice : ExprKind::GetItem, line);
    e->args.push_back(std::move(obj));
    if (slice) {
      for (auto& p : parts) e->args.push_back(std::move(p));
    } else {
      if (!parts[0]) fail("empty subscript");
      e->args.push_back(std::move(parts[0]));
    }
    return e;
  }

  void parse_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string k = expect_name();
        ++i_;
        e.kwargs.emplace_back(k, parse_expr());
      } else {
        if (!e.kwargs.empty()) fail("positional argument after keyword argument");
        e.args.push_back(parse_expr());
      }
      if (!accept_op(",")) break;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(ExprKind::Call, cur().line);
    e->args.push_back(std::move(callee));
    parse_args(*e);
    return e;
  }

  ExprPtr parse_filter_chain(ExprPtr e) {
    while (true) {
      int line = cur().line;
      if (accept_op("|")) {
        auto f = node(ExprKind::Filter, line);
        f->name = expect_name();
        while (accept_op(".")) f->name += "." + expect_name();
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_args(*f);
        e = std::move(f);
      } else if (accept_name("is")) {
        auto t = node(ExprKind::Test, line);
        t->negated = accept_name("not");
        t->name = expect_name();
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(*t);
        } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                    cur().type == Tok::Float || is_op("[") || is_op("{") || is_op("(")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }
};

}  // namespace

Body parse(const std::vector<Token>& tokens) { return Parser(tokens).parse_template(); }

}  // namespace m3::jinja
