// Jinja lexer: splits template source into text and tag tokens, applying whitespace control
// (`{%-`, `-%}`, trim_blocks, lstrip_blocks) here so the parser and evaluator never see it.
#pragma once
#include <string>
#include <vector>

namespace m3::jinja {

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string text;  // text data, name, decoded string literal, number spelling or operator
  int line;
};

struct LexOptions {
  // transformers renders chat templates with trim_blocks=True and lstrip_blocks=True.
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Throws m3::Error("template line N: ...") on malformed input.
std::vector<Token> lex(const std::string& src, const LexOptions& opt);

}  // namespace m3::jinja
