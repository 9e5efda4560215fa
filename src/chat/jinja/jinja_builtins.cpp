// Jinja built-in filters, tests, str/dict methods and globals. Behaviour follows Python Jinja2 as
// transformers configures it: `tojson` is json.dumps (no HTML escaping, ", "/": " separators,
// ensure_ascii=False), strings are sequences of code points, `raise_exception` aborts rendering.
#include "chat/jinja/jinja_builtins.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <ctime>

#include "tokenizer/utf8.h"

namespace m3::jinja {
namespace {

[[noreturn]] void fail(const std::string& m) { throw RuntimeError(m); }

// Splits UTF-8 text into code points (each as its own string) so len/slicing/indexing match Python.
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp;
    size_t n = tok::decode_utf8(s, i, cp);
    if (n == 0) n = 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string strip_impl(const std::string& s, const Value* chars, bool left, bool right) {
  auto in_set = [&](char c) {
    if (!chars || chars->is_none() || chars->is_undefined()) return is_space(c);
    return chars->as_string().find(c) != std::string::npos;
  };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && in_set(s[b])) ++b;
  if (right)
    while (e > b && in_set(s[e - 1])) --e;
  return s.substr(b, e - b);
}

Array split_impl(const std::string& s, const Value* sep, const Value* maxsplit_v) {
  int64_t maxsplit = (maxsplit_v && maxsplit_v->is_int()) ? maxsplit_v->as_int() : -1;
  Array out;
  if (!sep || sep->is_none() || sep->is_undefined()) {
    size_t i = 0;
    while (true) {
      while (i < s.size() && is_space(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        std::string rest = s.substr(i);
        while (!rest.empty() && is_space(rest.back())) rest.pop_back();
        out.push_back(Value(rest));
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_space(s[j])) ++j;
      out.push_back(Value(s.substr(i, j - i)));
      i = j;
    }
    return out;
  }
  const std::string& d = sep->as_string();
  if (d.empty()) fail("empty separator");
  size_t start = 0;
  while (true) {
    size_t p = s.find(d, start);
    if (p == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) {
      out.push_back(Value(s.substr(start)));
      break;
    }
    out.push_back(Value(s.substr(start, p - start)));
    start = p + d.size();
  }
  return out;
}

std::string replace_impl(const std::string& s, const std::string& a, const std::string& b, int64_t count) {
  if (a.empty()) return s;
  std::string out;
  size_t start = 0;
  int64_t n = 0;
  while (true) {
    size_t p = s.find(a, start);
    if (p == std::string::npos || (count >= 0 && n == count)) break;
    out += s.substr(start, p - start) + b;
    start = p + a.size();
    ++n;
  }
  return out + s.substr(start);
}

std::string upper(std::string s) {
  for (auto& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string capitalize(const std::string& s) {
  std::string r = lower(s);
  if (!r.empty()) r[0] = char(std::toupper(static_cast<unsigned char>(r[0])));
  return r;
}
std::string title(const std::string& s) {
  std::string r = s;
  bool start = true;
  for (auto& c : r) {
    unsigned char u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = char(start ? std::toupper(u) : std::tolower(u));
      start = false;
    } else {
      start = !std::isalnum(u);
    }
  }
  return r;
}

const std::string& need_string(const Value& v, const char* what) {
  if (!v.is_string()) fail(std::string(what) + ": expected a string, got " + v.type_name());
  return v.as_string();
}

bool starts_or_ends(const std::string& s, const Value& arg, bool ends) {
  auto one = [&](const std::string& p) {
    if (p.size() > s.size()) return false;
    return ends ? s.compare(s.size() - p.size(), p.size(), p) == 0 : s.compare(0, p.size(), p) == 0;
  };
  if (arg.is_array()) {
    for (auto& p : arg.as_array())
      if (one(need_string(p, "startswith/endswith"))) return true;
    return false;
  }
  return one(need_string(arg, "startswith/endswith"));
}

// Attribute lookup used by map/selectattr/sort(attribute=...): "a.b" walks nested keys.
Value attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    cur = get_item(cur, digits ? Value(int64_t(std::stoll(part))) : Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

CallArgs shift_args(const CallArgs& a, size_t n) {
  CallArgs r;
  for (size_t i = n; i < a.positional.size(); ++i) r.positional.push_back(a.positional[i]);
  r.named = a.named;
  return r;
}

bool arg_bool(const CallArgs& a, size_t i, const char* name, bool def) {
  const Value* v = a.get(i, name);
  return v ? v->truthy() : def;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// printf-style formatting for the `format` filter and `%` on strings (%s, %d, %i, %f, %r, %%).
std::string percent_format(const std::string& fmt, const Array& args) {
  std::string out;
  size_t ai = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    std::string spec;
    while (i < fmt.size() && std::string("0123456789.-+ ").find(fmt[i]) != std::string::npos) spec += fmt[i++];
    char conv = fmt[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (ai >= args.size()) fail("not enough arguments for format string");
    const Value& a = args[ai++];
    char buf[128];
    if (conv == 's') out += a.str();
    else if (conv == 'r') out += a.repr();
    else if (conv == 'd' || conv == 'i') {
      std::snprintf(buf, sizeof buf, ("%" + spec + "lld").c_str(), (long long)(a.is_float() ? int64_t(a.as_double()) : a.is_int() ? a.as_int() : 0));
      out += buf;
    } else if (conv == 'f' || conv == 'g' || conv == 'e') {
      std::snprintf(buf, sizeof buf, ("%" + spec + conv).c_str(), a.as_double());
      out += buf;
    } else {
      fail(std::string("unsupported format character '") + conv + "'");
    }
  }
  return out;
}

Value to_int(const Value& v, int64_t def) {
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(int64_t(v.as_bool()));
  if (v.is_float()) return Value(int64_t(v.as_double()));
  if (v.is_string()) {
    try {
      size_t n;
      std::string s = strip_impl(v.as_string(), nullptr, true, true);
      int64_t r = std::stoll(s, &n);
      if (n == s.size()) return Value(r);
      double d = std::stod(s, &n);
      if (n == s.size()) return Value(int64_t(d));
    } catch (...) {
    }
  }
  return Value(def);
}

Value to_float(const Value& v, double def) {
  if (v.is_number() || v.is_bool()) return Value(v.as_double());
  if (v.is_string()) {
    try {
      size_t n;
      std::string s = strip_impl(v.as_string(), nullptr, true, true);
      double d = std::stod(s, &n);
      if (n == s.size()) return Value(d);
    } catch (...) {
    }
  }
  return Value(def);
}

Array sorted(const Value& v, const CallArgs& a) {
  Array items = iterate(v);
  bool reverse = arg_bool(a, 0, "reverse", false);
  bool case_sensitive = arg_bool(a, 1, "case_sensitive", false);
  const Value* attribute = a.get(2, "attribute");
  auto key = [&](const Value& x) {
    Value k = attribute && attribute->is_string() ? attr_path(x, attribute->as_string()) : x;
    if (!case_sensitive && k.is_string()) return Value(lower(k.as_string()));
    return k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? key(y).compare(key(x)) < 0 : key(x).compare(key(y)) < 0;
  });
  return items;
}

}  // namespace

Array iterate(const Value& v) {
  if (v.is_array()) return v.as_array();
  if (v.is_object()) {
    Array keys;
    for (auto& kv : v.as_object().items) keys.push_back(Value(kv.first));
    return keys;
  }
  if (v.is_string()) {
    Array a;
    for (auto& c : code_points(v.as_string())) a.push_back(Value(c));
    return a;
  }
  if (v.is_undefined()) return {};
  fail("'" + v.type_name() + "' object is not iterable");
}

int64_t length(const Value& v) {
  if (v.is_string()) return int64_t(code_points(v.as_string()).size());
  if (v.is_array()) return int64_t(v.as_array().size());
  if (v.is_object()) return int64_t(v.as_object().items.size());
  if (v.is_undefined()) return 0;
  fail("object of type '" + v.type_name() + "' has no len()");
}

bool contains(const Value& c, const Value& item) {
  if (c.is_string()) {
    if (!item.is_string()) fail("'in <string>' requires string as left operand, not " + item.type_name());
    return c.as_string().find(item.as_string()) != std::string::npos;
  }
  if (c.is_object()) return item.is_string() && c.as_object().find(item.as_string()) != nullptr;
  if (c.is_array()) {
    for (auto& x : c.as_array())
      if (x.equals(item)) return true;
    return false;
  }
  if (c.is_undefined()) return false;
  fail("argument of type '" + c.type_name() + "' is not iterable");
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_object()) {
    if (!key.is_string()) return Value();
    const Value* p = obj.as_object().find(key.as_string());
    return p ? *p : Value();
  }
  if ((obj.is_array() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.is_int() ? key.as_int() : int64_t(key.as_bool());
    if (obj.is_array()) {
      const Array& a = obj.as_array();
      if (i < 0) i += int64_t(a.size());
      if (i < 0 || i >= int64_t(a.size())) return Value();
      return a[size_t(i)];
    }
    auto cps = code_points(obj.as_string());
    if (i < 0) i += int64_t(cps.size());
    if (i < 0 || i >= int64_t(cps.size())) return Value();
    return Value(cps[size_t(i)]);
  }
  return Value();
}

Value slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  int64_t step = step_v.is_int() ? step_v.as_int() : 1;
  if (step == 0) fail("slice step cannot be zero");
  std::vector<Value> items;
  std::vector<std::string> cps;
  bool is_str = obj.is_string();
  int64_t n;
  if (is_str) {
    cps = code_points(obj.as_string());
    n = int64_t(cps.size());
  } else if (obj.is_array()) {
    n = int64_t(obj.as_array().size());
  } else {
    fail("cannot slice a " + obj.type_name());
  }
  auto norm = [&](const Value& v, int64_t def, bool is_start) {
    if (!v.is_int()) return def;
    int64_t x = v.as_int();
    if (x < 0) x += n;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  int64_t start = norm(start_v, step > 0 ? 0 : n - 1, true);
  int64_t stop = norm(stop_v, step > 0 ? n : -1, false);
  std::string s;
  Array a;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (is_str) s += cps[size_t(i)];
    else a.push_back(obj.as_array()[size_t(i)]);
  }
  return is_str ? Value(s) : Value(std::move(a));
}

bool has_method(const Value& obj, const std::string& name) {
  static const char* str_methods[] = {"split", "rsplit", "strip", "lstrip", "rstrip", "startswith", "endswith",
                                      "upper", "lower", "title", "capitalize", "replace", "find", "count",
                                      "splitlines", "join", "format", "isdigit", "isalpha", "isspace", "isalnum",
                                      "islower", "isupper", "removeprefix", "removesuffix"};
  static const char* dict_methods[] = {"items", "keys", "values", "get"};
  if (obj.is_string()) {
    for (auto* m : str_methods)
      if (name == m) return true;
  } else if (obj.is_object() && !obj.as_object().is_namespace) {
    for (auto* m : dict_methods)
      if (name == m) return true;
  }
  return false;
}

Value call_method(const Value& obj, const std::string& name, const CallArgs& a) {
  if (obj.is_object()) {
    const Object& o = obj.as_object();
    if (name == "items") {
      Array r;
      for (auto& kv : o.items) r.push_back(Value(Array{Value(kv.first), kv.second}));
      return Value(std::move(r));
    }
    if (name == "keys") return Value(iterate(obj));
    if (name == "values") {
      Array r;
      for (auto& kv : o.items) r.push_back(kv.second);
      return Value(std::move(r));
    }
    if (name == "get") {
      const Value* k = a.get(0, "key");
      if (!k) fail("get() needs a key");
      Value v = get_item(obj, *k);
      if (!v.is_undefined()) return v;
      const Value* d = a.get(1, "default");
      return d ? *d : Value::none();
    }
  }
  if (!obj.is_string()) fail("'" + obj.type_name() + "' object has no attribute '" + name + "'");
  const std::string& s = obj.as_string();
  if (name == "split") return Value(split_impl(s, a.get(0, "sep"), a.get(1, "maxsplit")));
  if (name == "rsplit") {
    const Value* mx = a.get(1, "maxsplit");
    if (mx && mx->is_int() && mx->as_int() >= 0) {  // split from the right, then keep the leftmost part joined
      Array all = split_impl(s, a.get(0, "sep"), nullptr);
      int64_t m = mx->as_int();
      if (int64_t(all.size()) <= m + 1) return Value(all);
      std::string sep = a.get(0, "sep") && a.get(0, "sep")->is_string() ? a.get(0, "sep")->as_string() : " ";
      std::string head;
      size_t keep = all.size() - size_t(m);
      for (size_t i = 0; i < keep; ++i) head += (i ? sep : "") + all[i].as_string();
      Array r{Value(head)};
      for (size_t i = keep; i < all.size(); ++i) r.push_back(all[i]);
      return Value(std::move(r));
    }
    return Value(split_impl(s, a.get(0, "sep"), nullptr));
  }
  if (name == "strip") return Value(strip_impl(s, a.get(0, "chars"), true, true));
  if (name == "lstrip") return Value(strip_impl(s, a.get(0, "chars"), true, false));
  if (name == "rstrip") return Value(strip_impl(s, a.get(0, "chars"), false, true));
  if (name == "startswith" || name == "endswith") {
    const Value* p = a.get(0, "prefix");
    if (!p) fail(name + "() takes an argument");
    return Value(starts_or_ends(s, *p, name == "endswith"));
  }
  if (name == "upper") return Value(upper(s));
  if (name == "lower") return Value(lower(s));
  if (name == "title") return Value(title(s));
  if (name == "capitalize") return Value(capitalize(s));
  if (name == "replace") {
    const Value* c = a.get(2, "count");
    return Value(replace_impl(s, need_string(a.positional.at(0), "replace"), need_string(a.positional.at(1), "replace"),
                              c && c->is_int() ? c->as_int() : -1));
  }
  if (name == "find") {
    size_t p = s.find(need_string(a.positional.at(0), "find"));
    return Value(p == std::string::npos ? int64_t(-1) : int64_t(p));
  }
  if (name == "count") {
    const std::string& n = need_string(a.positional.at(0), "count");
    if (n.empty()) return Value(length(obj) + 1);
    int64_t c = 0;
    for (size_t p = s.find(n); p != std::string::npos; p = s.find(n, p + n.size())) ++c;
    return Value(c);
  }
  if (name == "splitlines") {
    Array r;
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n' || s[i] == '\r') {
        r.push_back(Value(s.substr(start, i - start)));
        if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
        start = i + 1;
      }
    }
    if (start < s.size()) r.push_back(Value(s.substr(start)));
    return Value(std::move(r));
  }
  if (name == "join") {
    std::string r;
    Array items = iterate(a.positional.at(0));
    for (size_t i = 0; i < items.size(); ++i) r += (i ? s : "") + need_string(items[i], "join");
    return Value(r);
  }
  if (name == "format") {  // '{}'/'{0}'/'{name}' replacement fields
    std::string r;
    size_t auto_i = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '{' && i + 1 < s.size() && s[i + 1] == '{') { r += '{'; ++i; continue; }
      if (s[i] == '}' && i + 1 < s.size() && s[i + 1] == '}') { r += '}'; ++i; continue; }
      if (s[i] != '{') { r += s[i]; continue; }
      size_t e = s.find('}', i);
      if (e == std::string::npos) fail("unmatched '{' in format string");
      std::string field = s.substr(i + 1, e - i - 1);
      const Value* v = nullptr;
      if (field.empty()) v = a.get(auto_i++, nullptr);
      else if (std::isdigit(static_cast<unsigned char>(field[0]))) v = a.get(size_t(std::stoul(field)), nullptr);
      else v = a.get(size_t(-1), field.c_str());
      if (!v) fail("format: missing argument '" + field + "'");
      r += v->str();
      i = e;
    }
    return Value(r);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string& p = need_string(a.positional.at(0), name.c_str());
    if (name == "removeprefix" && s.compare(0, p.size(), p) == 0) return Value(s.substr(p.size()));
    if (name == "removesuffix" && p.size() <= s.size() && s.compare(s.size() - p.size(), p.size(), p) == 0)
      return Value(s.substr(0, s.size() - p.size()));
    return obj;
  }
  auto all = [&](auto pred) {
    if (s.empty()) return Value(false);
    for (char c : s)
      if (!pred(static_cast<unsigned char>(c))) return Value(false);
    return Value(true);
  };
  if (name == "isdigit") return all([](unsigned char c) { return std::isdigit(c) != 0; });
  if (name == "isalpha") return all([](unsigned char c) { return std::isalpha(c) != 0; });
  if (name == "isalnum") return all([](unsigned char c) { return std::isalnum(c) != 0; });
  if (name == "isspace") return all([](unsigned char c) { return is_space(char(c)); });
  if (name == "islower") return Value(s == lower(s) && s != upper(s));
  if (name == "isupper") return Value(s == upper(s) && s != lower(s));
  fail("'str' object has no attribute '" + name + "'");
}

bool apply_test(const std::string& name, const Value& v, const CallArgs& a) {
  auto arg = [&]() -> const Value& {
    if (a.positional.empty()) fail("test '" + name + "' needs an argument");
    return a.positional[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number() || v.is_bool();  // Python: bool is a Number
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_object() && !v.as_object().is_namespace;
  if (name == "iterable") return v.is_string() || v.is_array() || v.is_object() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_array() || v.is_object();
  if (name == "callable") return v.is_function();
  if (name == "equalto" || name == "eq" || name == "==") return v.equals(arg());
  if (name == "ne" || name == "!=") return !v.equals(arg());
  if (name == "lt" || name == "lessthan" || name == "<") return v.compare(arg()) < 0;
  if (name == "le" || name == "<=") return v.compare(arg()) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return v.compare(arg()) > 0;
  if (name == "ge" || name == ">=") return v.compare(arg()) >= 0;
  if (name == "in") return contains(arg(), v);
  if (name == "sameas") return v.equals(arg()) && v.storage().index() == arg().storage().index();
  if (name == "odd" || name == "even") {
    if (!v.is_int()) fail("test '" + name + "' needs an integer");
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") return v.is_int() && arg().is_int() && arg().as_int() != 0 && v.as_int() % arg().as_int() == 0;
  if (name == "lower") return v.is_string() && v.as_string() == lower(v.as_string());
  if (name == "upper") return v.is_string() && v.as_string() == upper(v.as_string());
  fail("no test named '" + name + "'");
}

Value apply_filter(const std::string& name, const Value& v, const CallArgs& a) {
  if (name == "tojson") {
    const Value* indent = a.get(1, "indent");
    const Value* seps = a.get(2, "separators");
    std::string item_sep, key_sep;
    bool has_seps = seps && seps->is_array() && seps->as_array().size() == 2;
    if (has_seps) {
      item_sep = seps->as_array()[0].str();
      key_sep = seps->as_array()[1].str();
    }
    return Value(v.to_json(indent && indent->is_int() ? int(indent->as_int()) : -1, arg_bool(a, 0, "ensure_ascii", false),
                           arg_bool(a, 3, "sort_keys", false), has_seps ? &item_sep : nullptr,
                           has_seps ? &key_sep : nullptr));
  }
  if (name == "string") return Value(v.str());
  if (name == "safe") return v;
  if (name == "e" || name == "escape" || name == "forceescape") return Value(html_escape(v.str()));
  if (name == "trim") return Value(strip_impl(v.str(), a.get(0, "chars"), true, true));
  if (name == "length" || name == "count") return Value(length(v));
  if (name == "upper") return Value(upper(v.str()));
  if (name == "lower") return Value(lower(v.str()));
  if (name == "capitalize") return Value(capitalize(v.str()));
  if (name == "title") return Value(title(v.str()));
  if (name == "replace") {
    const Value* c = a.get(2, "count");
    if (a.positional.size() < 2) fail("replace needs two arguments");
    return Value(replace_impl(v.str(), a.positional[0].str(), a.positional[1].str(), c && c->is_int() ? c->as_int() : -1));
  }
  if (name == "join") {
    const Value* sep = a.get(0, "d");
    const Value* attribute = a.get(1, "attribute");
    std::string r;
    Array items = iterate(v);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i && sep) r += sep->str();
      r += (attribute ? attr_path(items[i], attribute->str()) : items[i]).str();
    }
    return Value(r);
  }
  if (name == "default" || name == "d") {
    const Value* def = a.get(0, "default_value");
    bool boolean = arg_bool(a, 1, "boolean", false);
    if (v.is_undefined() || (boolean && !v.truthy())) return def ? *def : Value(std::string());
    return v;
  }
  if (name == "first" || name == "last") {
    Array items = iterate(v);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value(iterate(v));
  if (name == "reverse") {
    if (v.is_string()) {
      auto cps = code_points(v.as_string());
      std::string r;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) r += *it;
      return Value(r);
    }
    Array items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "sort") return Value(sorted(v, a));
  if (name == "unique") {
    Array out;
    for (auto& x : iterate(v)) {
      bool seen = false;
      for (auto& y : out) seen = seen || y.equals(x);
      if (!seen) out.push_back(x);
    }
    return Value(std::move(out));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value(Array{});
    return call_method(v, "items", {});
  }
  if (name == "dictsort") {
    Array items = call_method(v, "items", {}).as_array();
    bool case_sensitive = arg_bool(a, 0, "case_sensitive", false);
    const Value* by = a.get(1, "by");
    bool by_value = by && by->is_string() && by->as_string() == "value";
    bool reverse = arg_bool(a, 2, "reverse", false);
    auto key = [&](const Value& p) {
      Value k = p.as_array()[by_value ? 1 : 0];
      return (!case_sensitive && k.is_string()) ? Value(lower(k.as_string())) : k;
    };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return reverse ? key(y).compare(key(x)) < 0 : key(x).compare(key(y)) < 0;
    });
    return Value(std::move(items));
  }
  if (name == "map") {
    Array out;
    const Value* attribute = a.get(size_t(-1), "attribute");
    for (auto& x : iterate(v)) {
      if (attribute) {
        Value r = attr_path(x, attribute->str());
        const Value* def = a.get(size_t(-1), "default");
        out.push_back(r.is_undefined() && def ? *def : r);
      } else {
        if (a.positional.empty()) fail("map needs a filter name or attribute=");
        out.push_back(apply_filter(a.positional[0].str(), x, shift_args(a, 1)));
      }
    }
    return Value(std::move(out));
  }
  if (name == "select" || name == "reject") {
    Array out;
    for (auto& x : iterate(v)) {
      bool ok = a.positional.empty() ? x.truthy() : apply_test(a.positional[0].str(), x, shift_args(a, 1));
      if (ok == (name == "select")) out.push_back(x);
    }
    return Value(std::move(out));
  }
  if (name == "selectattr" || name == "rejectattr") {
    if (a.positional.empty()) fail(name + " needs an attribute name");
    Array out;
    for (auto& x : iterate(v)) {
      Value at = attr_path(x, a.positional[0].str());
      bool ok = a.positional.size() < 2 ? at.truthy() : apply_test(a.positional[1].str(), at, shift_args(a, 2));
      if (ok == (name == "selectattr")) out.push_back(x);
    }
    return Value(std::move(out));
  }
  if (name == "attr") return attr_path(v, a.positional.at(0).str());
  if (name == "int") {
    const Value* d = a.get(0, "default");
    return to_int(v, d && d->is_int() ? d->as_int() : 0);
  }
  if (name == "float") {
    const Value* d = a.get(0, "default");
    return to_float(v, d ? d->as_double() : 0.0);
  }
  if (name == "abs") {
    if (v.is_int()) return Value(int64_t(std::llabs(v.as_int())));
    return Value(std::fabs(v.as_double()));
  }
  if (name == "round") {
    const Value* p = a.get(0, "precision");
    const Value* m = a.get(1, "method");
    double scale = std::pow(10.0, p && p->is_int() ? double(p->as_int()) : 0.0);
    double x = v.as_double() * scale;
    std::string method = m ? m->str() : "common";
    x = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::round(x);
    return Value(x / scale);
  }
  if (name == "sum") {
    const Value* attribute = a.get(size_t(-1), "attribute");
    const Value* start = a.get(size_t(-1), "start");
    Value acc = start ? *start : Value(int64_t(0));
    for (auto& x : iterate(v)) {
      Value y = attribute ? attr_path(x, attribute->str()) : x;
      if (acc.is_int() && y.is_int()) acc = Value(acc.as_int() + y.as_int());
      else acc = Value(acc.as_double() + y.as_double());
    }
    return acc;
  }
  if (name == "min" || name == "max") {
    Array items = iterate(v);
    if (items.empty()) return Value();
    Value best = items[0];
    for (auto& x : items)
      if ((name == "min") ? x.compare(best) < 0 : x.compare(best) > 0) best = x;
    return best;
  }
  if (name == "indent") {
    const Value* w = a.get(0, "width");
    std::string pad = w && w->is_string() ? w->as_string() : std::string(size_t(w && w->is_int() ? w->as_int() : 4), ' ');
    bool first = arg_bool(a, 1, "first", false);
    bool blank = arg_bool(a, 2, "blank", false);
    std::string s = v.str(), out;
    size_t start = 0;
    bool first_line = true;
    while (true) {
      size_t nl = s.find('\n', start);
      std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
      bool add = first_line ? first : (blank || !line.empty());
      out += (add ? pad : "") + line;
      if (nl == std::string::npos) break;
      out += '\n';
      start = nl + 1;
      first_line = false;
    }
    return Value(out);
  }
  if (name == "format") return Value(percent_format(v.str(), a.positional));
  if (name == "wordcount") return Value(int64_t(split_impl(v.str(), nullptr, nullptr).size()));
  if (name == "center") {
    const Value* w = a.get(0, "width");
    std::string s = v.str();
    int64_t width = w && w->is_int() ? w->as_int() : 80;
    int64_t n = length(Value(s));
    if (n >= width) return Value(s);
    int64_t left = (width - n) / 2;
    return Value(std::string(size_t(left), ' ') + s + std::string(size_t(width - n - left), ' '));
  }
  fail("no filter named '" + name + "'");
}

void add_globals(Object& g) {
  g.set("raise_exception", Value::function("raise_exception", [](const CallArgs& a) -> Value {
          fail(a.positional.empty() ? std::string("raise_exception called") : a.positional[0].str());
        }));
  g.set("range", Value::function("range", [](const CallArgs& a) -> Value {
          int64_t start = 0, stop = 0, step = 1;
          auto num = [](const Value& v) {
            if (!v.is_int()) fail("range() needs integers");
            return v.as_int();
          };
          if (a.positional.size() == 1) stop = num(a.positional[0]);
          else if (a.positional.size() >= 2) {
            start = num(a.positional[0]);
            stop = num(a.positional[1]);
            if (a.positional.size() >= 3) step = num(a.positional[2]);
          }
          if (step == 0) fail("range() step must not be zero");
          Array r;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            r.push_back(Value(i));
            if (r.size() > 1000000) fail("range() too large");
          }
          return Value(std::move(r));
        }));
  auto make_dict = [](const CallArgs& a, bool ns) {
    auto o = std::make_shared<Object>();
    o->is_namespace = ns;
    if (!a.positional.empty() && a.positional[0].is_object())
      for (auto& kv : a.positional[0].as_object().items) o->set(kv.first, kv.second);
    for (auto& kv : a.named) o->set(kv.first, kv.second);
    return Value(o);
  };
  g.set("namespace", Value::function("namespace", [make_dict](const CallArgs& a) { return make_dict(a, true); }));
  g.set("dict", Value::function("dict", [make_dict](const CallArgs& a) { return make_dict(a, false); }));
  g.set("strftime_now", Value::function("strftime_now", [](const CallArgs& a) -> Value {
          std::time_t t = std::time(nullptr);
          std::tm tm{};
          localtime_r(&t, &tm);
          char buf[256];
          std::string fmt = a.positional.empty() ? std::string("%Y-%m-%d") : a.positional[0].str();
          size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
          return Value(std::string(buf, n));
        }));
}

}  // namespace m3::jinja
