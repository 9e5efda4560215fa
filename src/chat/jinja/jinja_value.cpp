// Value semantics for the Jinja engine: Python-compatible printing (str/repr), json.dumps output
// (what transformers' `tojson` filter produces), truthiness, equality and ordering.
#include "chat/jinja/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "base/error.h"
#include "tokenizer/utf8.h"

namespace m3::jinja {

const Value* Object::find(const std::string& key) const {
  for (auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}
Value* Object::find(const std::string& key) {
  for (auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}
void Object::set(const std::string& key, Value v) {
  if (Value* p = find(key)) {
    *p = std::move(v);
  } else {
    items.emplace_back(key, std::move(v));
  }
}

const Value* CallArgs::get(size_t i, const char* name) const {
  if (i < positional.size()) return &positional[i];
  if (name)
    for (auto& kv : named)
      if (kv.first == name) return &kv.second;
  return nullptr;
}

Value Value::function(std::string name, std::function<Value(const CallArgs&)> fn) {
  auto f = std::make_shared<Function>();
  f->name = std::move(name);
  f->fn = std::move(fn);
  return Value(std::move(f));
}

double Value::as_double() const {
  if (is_int()) return double(as_int());
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  return std::get<double>(v_);
}

bool Value::truthy() const {
  return std::visit(
      [](auto&& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined> || std::is_same_v<T, None>) return false;
        else if constexpr (std::is_same_v<T, bool>) return x;
        else if constexpr (std::is_same_v<T, int64_t>) return x != 0;
        else if constexpr (std::is_same_v<T, double>) return x != 0.0;
        else if constexpr (std::is_same_v<T, std::string>) return !x.empty();
        else if constexpr (std::is_same_v<T, std::shared_ptr<Array>>) return !x->empty();
        else if constexpr (std::is_same_v<T, std::shared_ptr<Object>>) return x->is_namespace || !x->items.empty();
        else return true;
      },
      v_);
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.2345e+02"
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  int exp = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (size_t i = 0; i < epos; ++i)
    if (sci[i] != '.') digits += sci[i];
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {  // Python's repr switches to exponent form outside [1e-4, 1e16)
    if (exp < 0) {
      out += "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
      out += digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char eb[16];
  std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + eb;
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; ++i; continue;
      case '\\': out += "\\\\"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      case '\b': out += "\\b"; ++i; continue;
      case '\f': out += "\\f"; ++i; continue;
      default: break;
    }
    char buf[16];
    if (c < 0x20) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      ++i;
      continue;
    }
    if (c < 0x80 || !ensure_ascii) {
      out += char(c);
      ++i;
      continue;
    }
    uint32_t cp = 0;
    size_t n = tok::decode_utf8(s, i, cp);
    if (n == 0) {  // invalid byte: Python strings cannot hold it; emit U+FFFD like a lossy decode would
      cp = 0xFFFD;
      n = 1;
    }
    if (cp >= 0x10000) {
      uint32_t v = cp - 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
    } else {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
    }
    out += buf;
    i += n;
  }
  out += '"';
}

void python_string_repr(std::string& out, const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  out += q;
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (char(c) == q) { out += '\\'; out += q; }
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else out += char(c);
  }
  out += q;
}

void dump(const Value& v, std::string& out, int indent, int depth, bool ensure_ascii, bool sort_keys,
          const std::string& item_sep, const std::string& key_sep) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(size_t(indent) * size_t(d), ' ');
  };
  if (v.is_undefined() || v.is_none()) out += "null";
  else if (v.is_bool()) out += v.as_bool() ? "true" : "false";
  else if (v.is_int()) out += std::to_string(v.as_int());
  else if (v.is_float()) {
    double d = v.as_double();
    if (std::isnan(d)) out += "NaN";
    else if (std::isinf(d)) out += d < 0 ? "-Infinity" : "Infinity";
    else out += python_float_repr(d);
  } else if (v.is_string()) json_string(out, v.as_string(), ensure_ascii);
  else if (v.is_array()) {
    const Array& a = v.as_array();
    if (a.empty()) { out += "[]"; return; }
    out += '[';
    for (size_t i = 0; i < a.size(); ++i) {
      if (i) out += item_sep;
      newline(depth + 1);
      dump(a[i], out, indent, depth + 1, ensure_ascii, sort_keys, item_sep, key_sep);
    }
    newline(depth);
    out += ']';
  } else if (v.is_object()) {
    const Object& o = v.as_object();
    if (o.items.empty()) { out += "{}"; return; }
    std::vector<const std::pair<std::string, Value>*> items;
    for (auto& kv : o.items) items.push_back(&kv);
    if (sort_keys)
      std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep;
      newline(depth + 1);
      json_string(out, items[i]->first, ensure_ascii);
      out += key_sep;
      dump(items[i]->second, out, indent, depth + 1, ensure_ascii, sort_keys, item_sep, key_sep);
    }
    newline(depth);
    out += '}';
  } else {
    throw Error("tojson: cannot serialise a " + v.type_name());
  }
}

}  // namespace

std::string Value::to_json(int indent, bool ensure_ascii, bool sort_keys, const std::string* item_sep,
                           const std::string* key_sep) const {
  // json.dumps defaults: (", ", ": ") without indent, ("," , ": ") with one.
  std::string is = item_sep ? *item_sep : (indent < 0 ? ", " : ",");
  std::string ks = key_sep ? *key_sep : ": ";
  std::string out;
  dump(*this, out, indent, 0, ensure_ascii, sort_keys, is, ks);
  return out;
}

std::string Value::repr() const {
  if (is_string()) {
    std::string out;
    python_string_repr(out, as_string());
    return out;
  }
  if (is_array()) {
    std::string out = "[";
    const Array& a = as_array();
    for (size_t i = 0; i < a.size(); ++i) {
      if (i) out += ", ";
      out += a[i].repr();
    }
    return out + "]";
  }
  if (is_object()) {
    const Object& o = as_object();
    if (o.is_namespace) return "<Namespace>";
    std::string out = "{";
    for (size_t i = 0; i < o.items.size(); ++i) {
      if (i) out += ", ";
      python_string_repr(out, o.items[i].first);
      out += ": " + o.items[i].second.repr();
    }
    return out + "}";
  }
  return str();
}

std::string Value::str() const {
  if (is_undefined()) return "";
  if (is_none()) return "None";
  if (is_bool()) return as_bool() ? "True" : "False";
  if (is_int()) return std::to_string(as_int());
  if (is_float()) return python_float_repr(as_double());
  if (is_string()) return as_string();
  if (is_function()) return "<function " + as_function().name + ">";
  return repr();
}

std::string Value::type_name() const {
  if (is_undefined()) return "undefined";
  if (is_none()) return "none";
  if (is_bool()) return "boolean";
  if (is_int()) return "integer";
  if (is_float()) return "float";
  if (is_string()) return "string";
  if (is_array()) return "list";
  if (is_object()) return "dict";
  return "function";
}

namespace {
template <class J>
Value from_json_impl(const J& j, int depth) {
  // One C++ frame per level: a limit, so that a deeply nested request is an error, not a stack overflow.
  if (depth > Value::kMaxJsonDepth)
    throw Error("a JSON value nests deeper than " + std::to_string(Value::kMaxJsonDepth) +
                " levels (objects and arrays); templates see at most that");
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) return Value(double(u));
      return Value(int64_t(u));
    }
    case nlohmann::json::value_t::number_float: return Value(j.template get<double>());
    case nlohmann::json::value_t::string: return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (auto& e : j) a.push_back(from_json_impl(e, depth + 1));
      return Value(std::move(a));
    }
    case nlohmann::json::value_t::object: {
      auto o = std::make_shared<Object>();
      for (auto it = j.begin(); it != j.end(); ++it) o->items.emplace_back(it.key(), from_json_impl(it.value(), depth + 1));
      return Value(o);
    }
    default: return Value::none();
  }
}
}  // namespace

Value Value::from_json(const nlohmann::ordered_json& j) { return from_json_impl(j, 0); }
Value Value::from_json(const nlohmann::json& j) { return from_json_impl(j, 0); }

bool Value::equals(const Value& o) const {
  bool num_a = is_number() || is_bool(), num_b = o.is_number() || o.is_bool();
  if (num_a && num_b) {
    if ((is_int() || is_bool()) && (o.is_int() || o.is_bool())) return as_double() == o.as_double();
    return as_double() == o.as_double();
  }
  if (v_.index() != o.v_.index()) return false;
  if (is_undefined() || is_none()) return true;
  if (is_string()) return as_string() == o.as_string();
  if (is_array()) {
    const Array &a = as_array(), &b = o.as_array();
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!a[i].equals(b[i])) return false;
    return true;
  }
  if (is_object()) {
    const Object &a = as_object(), &b = o.as_object();
    if (&a == &b) return true;
    if (a.items.size() != b.items.size()) return false;
    for (auto& kv : a.items) {
      const Value* other = b.find(kv.first);
      if (!other || !kv.second.equals(*other)) return false;
    }
    return true;
  }
  return &as_function() == &o.as_function();
}

int Value::compare(const Value& o) const {
  if ((is_number() || is_bool()) && (o.is_number() || o.is_bool())) {
    double a = as_double(), b = o.as_double();
    if (is_int() && o.is_int()) return as_int() < o.as_int() ? -1 : as_int() > o.as_int() ? 1 : 0;
    return a < b ? -1 : a > b ? 1 : 0;
  }
  if (is_string() && o.is_string()) {
    int c = as_string().compare(o.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (is_array() && o.is_array()) {
    const Array &a = as_array(), &b = o.as_array();
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      int c = a[i].compare(b[i]);
      if (c) return c;
    }
    return a.size() < b.size() ? -1 : a.size() > b.size() ? 1 : 0;
  }
  throw Error("cannot compare " + type_name() + " with " + o.type_name());
}

}  // namespace m3::jinja
