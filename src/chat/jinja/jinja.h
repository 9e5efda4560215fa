// Public entry point of the Jinja engine: compile a template once, render it with a context of
// variables. Used by chat_template.cpp to render the checkpoint's chat template.
#pragma once
#include <memory>
#include <string>

#include "chat/jinja/jinja_ast.h"
#include "chat/jinja/jinja_lexer.h"
#include "chat/jinja/jinja_value.h"

namespace m3::jinja {

class Template {
 public:
  // Throws m3::Error("template line N: ...") on a syntax error.
  explicit Template(const std::string& source, const LexOptions& opt = {});
  ~Template();
  Template(Template&&) noexcept;

  // `context` is an object of top-level variables. Throws m3::Error("template line N: ...") on a
  // run-time error, including raise_exception().
  std::string render(const Value& context) const;

 private:
  Body body_;
};

}  // namespace m3::jinja
