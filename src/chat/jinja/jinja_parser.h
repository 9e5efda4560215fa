// Jinja parser: tokens -> statement tree, with Jinja2's operator precedence (tests and filters bind
// tighter than arithmetic, `~` between + and *, conditional expressions lowest).
#pragma once
#include <vector>

#include "chat/jinja/jinja_ast.h"
#include "chat/jinja/jinja_lexer.h"

namespace m3::jinja {

// Throws m3::Error("template line N: ...") on a syntax error.
Body parse(const std::vector<Token>& tokens);

}  // namespace m3::jinja
