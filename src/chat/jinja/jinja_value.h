// The value type the Jinja evaluator works on. It mirrors the Python objects that chat templates see
// under transformers (None, bool, int, float, str, list, dict with insertion order, callables), so
// that printing, truthiness, comparison and `tojson` give byte-identical results to HF rendering.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace m3::jinja {

class Value;
using Array = std::vector<Value>;

// Python dicts keep insertion order, and tool schemas are printed with `tojson`, so key order is
// part of the rendered prompt: a vector of pairs, not a sorted map.
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // only namespace() objects accept `{% set ns.attr = ... %}`
  const Value* find(const std::string& key) const;
  Value* find(const std::string& key);
  void set(const std::string& key, Value v);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
  // Positional argument `i`, else keyword `name`, else nullptr.
  const Value* get(size_t i, const char* name) const;
};

struct Function {
  std::string name;
  std::function<Value(const CallArgs&)> fn;
};

struct Undefined {};
struct None {};

class Value {
 public:
  using Storage = std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<Array>,
                               std::shared_ptr<Object>, std::shared_ptr<Function>>;

  Value() : v_(Undefined{}) {}
  Value(None) : v_(None{}) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(int64_t(i)) {}
  Value(int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(Array a) : v_(std::make_shared<Array>(std::move(a))) {}
  Value(std::shared_ptr<Array> a) : v_(std::move(a)) {}
  Value(std::shared_ptr<Object> o) : v_(std::move(o)) {}
  Value(std::shared_ptr<Function> f) : v_(std::move(f)) {}

  static Value none() { return Value(None{}); }
  static Value object() { return Value(std::make_shared<Object>()); }
  static Value function(std::string name, std::function<Value(const CallArgs&)> fn);

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float(); }  // bool is not a number here (Jinja's test)
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_array() const { return std::holds_alternative<std::shared_ptr<Array>>(v_); }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<Object>>(v_); }
  bool is_function() const { return std::holds_alternative<std::shared_ptr<Function>>(v_); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_double() const;  // int, float or bool
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const Array& as_array() const { return *std::get<std::shared_ptr<Array>>(v_); }
  const Object& as_object() const { return *std::get<std::shared_ptr<Object>>(v_); }
  Object& mutable_object() const { return *std::get<std::shared_ptr<Object>>(v_); }
  const Function& as_function() const { return *std::get<std::shared_ptr<Function>>(v_); }

  bool truthy() const;
  // Python str(): what `{{ x }}` prints. Undefined prints as "".
  std::string str() const;
  // Python repr(): used inside str() of containers ("['a', 1]").
  std::string repr() const;
  // Python's json.dumps with transformers' defaults. indent < 0 means None.
  std::string to_json(int indent = -1, bool ensure_ascii = false, bool sort_keys = false,
                      const std::string* item_sep = nullptr, const std::string* key_sep = nullptr) const;
  std::string type_name() const;

  // Throws m3::Error for values nested deeper than kMaxJsonDepth (the conversion recurses per level).
  static constexpr int kMaxJsonDepth = 256;
  static Value from_json(const nlohmann::ordered_json& j);
  static Value from_json(const nlohmann::json& j);

  // Python ==, and < for sort/compare (throws on unorderable types).
  bool equals(const Value& o) const;
  int compare(const Value& o) const;

  const Storage& storage() const { return v_; }

 private:
  Storage v_;
};

// Python's float repr (shortest round-trip digits, ".0" for integral values, 1e+16 style exponents).
std::string python_float_repr(double d);

}  // namespace m3::jinja
