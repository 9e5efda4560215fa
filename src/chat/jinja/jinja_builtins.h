// Jinja built-ins: filters, tests, Python str/dict methods and the globals that transformers gives
// chat templates (raise_exception, strftime_now, namespace, range, dict).
#pragma once
#include <stdexcept>
#include <string>

#include "chat/jinja/jinja_value.h"

namespace m3::jinja {

// Raised by built-ins without a line number; the evaluator turns it into m3::Error with one.
struct RuntimeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Hooks for filters that call other filters/tests by name (map, select, selectattr, ...).
Value apply_filter(const std::string& name, const Value& v, const CallArgs& args);
bool apply_test(const std::string& name, const Value& v, const CallArgs& args);

// Python methods reachable by attribute access, e.g. `s.split(',')`, `d.items()`.
bool has_method(const Value& obj, const std::string& name);
Value call_method(const Value& obj, const std::string& name, const CallArgs& args);

// Container protocol shared with the evaluator (Python semantics).
Array iterate(const Value& v);  // list items, dict keys, string characters; Undefined -> empty
bool contains(const Value& container, const Value& item);
Value get_item(const Value& obj, const Value& key);  // Undefined when absent
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
int64_t length(const Value& v);

// Globals visible to every template.
void add_globals(Object& globals);

}  // namespace m3::jinja
