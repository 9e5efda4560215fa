// Jinja evaluator: walks the statement tree with Jinja2's scoping rules (for-loop bodies and macros
// get their own scope, `if` does not, namespace() objects are shared by reference) and writes output.
// Any error is reported as m3::Error("template line N: ...").
#include <cctype>
#include <cmath>
#include <unordered_map>

#include "chat/jinja/jinja.h"
#include "chat/jinja/jinja_builtins.h"
#include "chat/jinja/jinja_parser.h"
#include "base/error.h"

namespace m3::jinja {
namespace {

struct Frame {
  std::unordered_map<std::string, Value> vars;
  Frame* parent = nullptr;

  const Value* lookup(const std::string& name) const {
    for (const Frame* f = this; f; f = f->parent) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { Normal, Break, Continue };

constexpr int kMaxDepth = 512;  // macro recursion limit, so a runaway template cannot blow the stack

[[noreturn]] void fail_at(int line, const std::string& msg) {
  throw Error("template line " + std::to_string(line) + ": " + msg);
}

std::string describe_expr(const Expr& e) {
  if (e.kind == ExprKind::Name) return e.name;
  if (e.kind == ExprKind::GetAttr && !e.args.empty()) return describe_expr(*e.args[0]) + "." + e.name;
  if (e.kind == ExprKind::GetItem && !e.args.empty()) return describe_expr(*e.args[0]) + "[...]";
  return "value";
}

class Evaluator {
 public:
  int depth = 0;

  Flow exec(const Body& body, Frame& frame, std::string& out) {
    for (const auto& s : body) {
      Flow f = exec_stmt(*s, frame, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Value eval(const Expr& e, Frame& frame) {
    try {
      return eval_inner(e, frame);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& ex) {
      fail_at(e.line, ex.what());
    }
  }

 private:
  Flow exec_stmt(const Stmt& s, Frame& frame, std::string& out) {
    switch (s.kind) {
      case StmtKind::Text: out += s.text; return Flow::Normal;
      case StmtKind::Output: out += eval(*s.expr, frame).str(); return Flow::Normal;
      case StmtKind::If:
        for (const auto& [cond, body] : s.branches)
          if (eval(*cond, frame).truthy()) return exec(body, frame, out);
        return exec(s.else_body, frame, out);
      case StmtKind::For: return exec_for(s, frame, out);
      case StmtKind::Set: {
        Value v = eval(*s.expr, frame);
        assign(s, frame, std::move(v));
        return Flow::Normal;
      }
      case StmtKind::SetBlock: {
        std::string body;
        Frame inner{{}, &frame};
        exec(s.body, inner, body);
        Value v(body);
        if (s.expr) v = apply_block_filter(*s.expr, frame, std::move(body));
        frame.vars[s.text] = std::move(v);
        return Flow::Normal;
      }
      case StmtKind::FilterBlock: {
        std::string body;
        Frame inner{{}, &frame};
        exec(s.body, inner, body);
        out += apply_block_filter(*s.expr, frame, std::move(body)).str();
        return Flow::Normal;
      }
      case StmtKind::Macro: frame.vars[s.text] = make_macro(s, &frame); return Flow::Normal;
      case StmtKind::CallBlock: out += exec_call_block(s, frame).str(); return Flow::Normal;
      case StmtKind::Break: return Flow::Break;
      case StmtKind::Continue: return Flow::Continue;
      case StmtKind::Scope: {
        Frame inner{{}, &frame};
        return exec(s.body, inner, out);
      }
    }
    return Flow::Normal;
  }

  Value apply_block_filter(const Expr& chain, Frame& frame, std::string body) {
    Frame f{{}, &frame};
    f.vars[kBlockBodyName] = Value(std::move(body));
    return eval(chain, f);
  }

  void assign(const Stmt& s, Frame& frame, Value v) {
    if (!s.attr.empty()) {
      const Value* target = frame.lookup(s.targets[0]);
      if (!target || !target->is_object() || !target->as_object().is_namespace)
        fail_at(s.line, "cannot assign attribute on non-namespace object '" + s.targets[0] + "'");
      target->mutable_object().set(s.attr, std::move(v));
      return;
    }
    if (s.targets.size() == 1) {
      frame.vars[s.targets[0]] = std::move(v);
      return;
    }
    Array items = iterate(v);
    if (items.size() != s.targets.size())
      fail_at(s.line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                          std::to_string(s.targets.size()) + " names");
    for (size_t i = 0; i < items.size(); ++i) frame.vars[s.targets[i]] = items[i];
  }

  void bind_targets(const Stmt& s, Frame& f, const Value& item) {
    if (s.targets.size() == 1) {
      f.vars[s.targets[0]] = item;
      return;
    }
    Array parts = iterate(item);
    if (parts.size() != s.targets.size())
      fail_at(s.line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                          std::to_string(s.targets.size()) + " loop variables");
    for (size_t k = 0; k < parts.size(); ++k) f.vars[s.targets[k]] = parts[k];
  }

  Flow exec_for(const Stmt& s, Frame& frame, std::string& out) {
    Value iterable = eval(*s.expr, frame);
    Array all;
    try {
      all = iterate(iterable);
    } catch (const std::exception& ex) {
      fail_at(s.line, ex.what());
    }
    Array items;
    if (s.cond) {  // the filter sees the loop variables but not `loop`, as in Jinja
      for (auto& it : all) {
        Frame f{{}, &frame};
        bind_targets(s, f, it);
        if (eval(*s.cond, f).truthy()) items.push_back(it);
      }
    } else {
      items = std::move(all);
    }
    if (items.empty()) {
      Frame f{{}, &frame};
      exec(s.else_body, f, out);
      return Flow::Normal;
    }
    const int64_t n = int64_t(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Frame f{{}, &frame};
      bind_targets(s, f, items[size_t(i)]);
      auto loop = std::make_shared<Object>();
      loop->items = {{"index", Value(i + 1)},
                     {"index0", Value(i)},
                     {"revindex", Value(n - i)},
                     {"revindex0", Value(n - i - 1)},
                     {"first", Value(i == 0)},
                     {"last", Value(i == n - 1)},
                     {"length", Value(n)},
                     {"depth", Value(int64_t(1))},
                     {"depth0", Value(int64_t(0))},
                     {"previtem", i > 0 ? items[size_t(i - 1)] : Value()},
                     {"nextitem", i + 1 < n ? items[size_t(i + 1)] : Value()}};
      loop->items.emplace_back("cycle", Value::function("cycle", [i](const CallArgs& a) -> Value {
                                 if (a.positional.empty()) throw RuntimeError("loop.cycle needs arguments");
                                 return a.positional[size_t(i) % a.positional.size()];
                               }));
      f.vars["loop"] = Value(loop);
      Flow fl = exec(s.body, f, out);
      if (fl == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value make_macro(const Stmt& s, Frame* closure) {
    const Stmt* def = &s;
    return Value::function(s.text, [this, def, closure](const CallArgs& a) -> Value {
      if (++depth > kMaxDepth) {
        --depth;
        fail_at(def->line, "maximum macro recursion depth exceeded in '" + def->text + "'");
      }
      Frame f{{}, closure};
      Array varargs;
      for (size_t i = 0; i < a.positional.size(); ++i) {
        if (i < def->params.size()) f.vars[def->params[i].name] = a.positional[i];
        else varargs.push_back(a.positional[i]);
      }
      auto kwargs = std::make_shared<Object>();
      for (auto& [k, v] : a.named) {
        bool is_param = k == "caller";
        for (auto& p : def->params) is_param = is_param || p.name == k;
        if (is_param) f.vars[k] = v;
        else kwargs->set(k, v);
      }
      for (size_t i = a.positional.size(); i < def->params.size(); ++i) {
        const auto& p = def->params[i];
        if (f.vars.count(p.name)) continue;
        f.vars[p.name] = p.default_value ? eval(*p.default_value, f) : Value();
      }
      f.vars["varargs"] = Value(std::move(varargs));
      f.vars["kwargs"] = Value(kwargs);
      std::string out;
      try {
        exec(def->body, f, out);
      } catch (...) {
        --depth;
        throw;
      }
      --depth;
      return Value(out);
    });
  }

  Value exec_call_block(const Stmt& s, Frame& frame) {
    const Expr& call = *s.expr;
    Value callee = eval(*call.args[0], frame);
    if (!callee.is_function()) fail_at(s.line, "'" + describe_expr(*call.args[0]) + "' is not callable");
    CallArgs a = eval_args(call, frame, 1);
    const Stmt* def = &s;
    Frame* outer = &frame;
    a.named.emplace_back("caller", Value::function("caller", [this, def, outer](const CallArgs& ca) -> Value {
                           Frame f{{}, outer};
                           for (size_t i = 0; i < def->params.size(); ++i) {
                             const Value* v = ca.get(i, def->params[i].name.c_str());
                             f.vars[def->params[i].name] =
                                 v ? *v : (def->params[i].default_value ? eval(*def->params[i].default_value, f) : Value());
                           }
                           std::string out;
                           exec(def->body, f, out);
                           return Value(out);
                         }));
    try {
      return callee.as_function().fn(a);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& ex) {
      fail_at(s.line, ex.what());
    }
  }

  CallArgs eval_args(const Expr& e, Frame& frame, size_t first) {
    CallArgs a;
    for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i], frame));
    for (auto& [k, v] : e.kwargs) a.named.emplace_back(k, eval(*v, frame));
    return a;
  }

  Value get_attr(const Value& obj, const std::string& name, const Expr& e) {
    if (obj.is_undefined()) throw RuntimeError("'" + describe_expr(*e.args[0]) + "' is undefined");
    if (has_method(obj, name)) {
      Value self = obj;
      return Value::function(name, [self, name](const CallArgs& a) { return call_method(self, name, a); });
    }
    if (obj.is_object()) {
      const Value* p = obj.as_object().find(name);
      return p ? *p : Value();
    }
    if ((obj.is_array() || obj.is_string()) && !name.empty() && std::isdigit(static_cast<unsigned char>(name[0])))
      return get_item(obj, Value(int64_t(std::stoll(name))));
    return Value();
  }

  Value arith(const std::string& op, const Value& a, const Value& b) {
    if (op == "~") return Value(a.str() + b.str());
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
      if (a.is_array() && b.is_array()) {
        Array r = a.as_array();
        for (auto& x : b.as_array()) r.push_back(x);
        return Value(std::move(r));
      }
    }
    if (op == "*") {
      if ((a.is_string() || a.is_array()) && b.is_int()) {
        Value r = a.is_string() ? Value(std::string()) : Value(Array{});
        for (int64_t i = 0; i < b.as_int(); ++i) r = arith("+", r, a);
        return r;
      }
    }
    if (op == "%" && a.is_string()) {
      CallArgs ca;
      if (b.is_array()) ca.positional = b.as_array();
      else ca.positional.push_back(b);
      return apply_filter("format", a, ca);
    }
    bool nums = (a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool());
    if (!nums) throw RuntimeError("unsupported operand types for " + op + ": " + a.type_name() + " and " + b.type_name());
    bool ints = !a.is_float() && !b.is_float();
    auto ia = [&](const Value& v) { return v.is_int() ? v.as_int() : int64_t(v.as_bool()); };
    if (op == "+") return ints ? Value(ia(a) + ia(b)) : Value(a.as_double() + b.as_double());
    if (op == "-") return ints ? Value(ia(a) - ia(b)) : Value(a.as_double() - b.as_double());
    if (op == "*") return ints ? Value(ia(a) * ia(b)) : Value(a.as_double() * b.as_double());
    if (op == "/") {
      if (b.as_double() == 0) throw RuntimeError("division by zero");
      return Value(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
      if (b.as_double() == 0) throw RuntimeError(op == "//" ? "integer division by zero" : "modulo by zero");
      if (ints) {  // Python floors toward negative infinity
        int64_t x = ia(a), y = ia(b);
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return op == "//" ? Value(q) : Value(x - q * y);
      }
      double q = std::floor(a.as_double() / b.as_double());
      return op == "//" ? Value(q) : Value(a.as_double() - q * b.as_double());
    }
    if (op == "**") {
      if (ints && ia(b) >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < ia(b); ++i) r *= ia(a);
        return Value(r);
      }
      return Value(std::pow(a.as_double(), b.as_double()));
    }
    throw RuntimeError("unknown operator " + op);
  }

  Value eval_inner(const Expr& e, Frame& frame) {
    switch (e.kind) {
      case ExprKind::Literal: return e.value;
      case ExprKind::Name: {
        const Value* v = frame.lookup(e.name);
        return v ? *v : Value();
      }
      case ExprKind::GetAttr: return get_attr(eval(*e.args[0], frame), e.name, e);
      case ExprKind::GetItem: {
        Value obj = eval(*e.args[0], frame);
        Value key = eval(*e.args[1], frame);
        if (obj.is_undefined()) throw RuntimeError("'" + describe_expr(*e.args[0]) + "' is undefined");
        Value r = get_item(obj, key);
        if (r.is_undefined() && key.is_string()) return get_attr(obj, key.as_string(), e);
        return r;
      }
      case ExprKind::Slice: {
        Value obj = eval(*e.args[0], frame);
        auto part = [&](size_t i) { return e.args[i] ? eval(*e.args[i], frame) : Value::none(); };
        return slice(obj, part(1), part(2), part(3));
      }
      case ExprKind::Call: {
        Value callee = eval(*e.args[0], frame);
        if (!callee.is_function()) {
          if (callee.is_undefined()) throw RuntimeError("'" + describe_expr(*e.args[0]) + "' is undefined");
          throw RuntimeError("'" + describe_expr(*e.args[0]) + "' is not callable");
        }
        CallArgs a = eval_args(e, frame, 1);
        return callee.as_function().fn(a);
      }
      case ExprKind::Filter: {
        Value v = eval(*e.args[0], frame);
        return apply_filter(e.name, v, eval_args(e, frame, 1));
      }
      case ExprKind::Test: {
        Value v = eval(*e.args[0], frame);
        bool r = apply_test(e.name, v, eval_args(e, frame, 1));
        return Value(e.negated ? !r : r);
      }
      case ExprKind::Unary: {
        Value v = eval(*e.args[0], frame);
        if (e.name == "not") return Value(!v.truthy());
        if (v.is_int()) return Value(e.name == "-" ? -v.as_int() : v.as_int());
        if (v.is_number() || v.is_bool()) return Value(e.name == "-" ? -v.as_double() : v.as_double());
        throw RuntimeError("bad operand type for unary " + e.name + ": " + v.type_name());
      }
      case ExprKind::And: {
        Value a = eval(*e.args[0], frame);
        return a.truthy() ? eval(*e.args[1], frame) : a;
      }
      case ExprKind::Or: {
        Value a = eval(*e.args[0], frame);
        return a.truthy() ? a : eval(*e.args[1], frame);
      }
      case ExprKind::Cond:
        return eval(*e.args[0], frame).truthy() ? eval(*e.args[1], frame) : eval(*e.args[2], frame);
      case ExprKind::Binary: {
        Value a = eval(*e.args[0], frame);
        Value b = eval(*e.args[1], frame);
        const std::string& op = e.name;
        if (op == "==") return Value(a.equals(b));
        if (op == "!=") return Value(!a.equals(b));
        if (op == "<") return Value(a.compare(b) < 0);
        if (op == "<=") return Value(a.compare(b) <= 0);
        if (op == ">") return Value(a.compare(b) > 0);
        if (op == ">=") return Value(a.compare(b) >= 0);
        if (op == "in") return Value(contains(b, a));
        if (op == "not in") return Value(!contains(b, a));
        return arith(op, a, b);
      }
      case ExprKind::List:
      case ExprKind::Tuple: {
        Array items;
        for (auto& x : e.args) items.push_back(eval(*x, frame));
        return Value(std::move(items));
      }
      case ExprKind::Dict: {
        auto o = std::make_shared<Object>();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i], frame);
          o->set(k.str(), eval(*e.args[i + 1], frame));
        }
        return Value(o);
      }
    }
    return Value();
  }
};

}  // namespace

Template::Template(const std::string& source, const LexOptions& opt) : body_(parse(lex(source, opt))) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;

std::string Template::render(const Value& context) const {
  Frame globals;
  Object g;
  add_globals(g);
  for (auto& [k, v] : g.items) globals.vars[k] = v;
  Frame ctx{{}, &globals};
  if (context.is_object())
    for (auto& [k, v] : context.as_object().items) ctx.vars[k] = v;
  Frame root{{}, &ctx};
  Evaluator ev;
  std::string out;
  ev.exec(body_, root, out);
  return out;
}

}  // namespace m3::jinja
