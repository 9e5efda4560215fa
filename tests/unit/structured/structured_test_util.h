// Helpers for the structured-output tests: a byte vocabulary and whole-string matching.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "structured/gbnf.h"
#include "structured/json_schema.h"
#include "structured/matcher.h"
#include "structured/regex.h"

namespace m3test {

// 256 single-byte tokens, an end token (id 256), then `specials` as special tokens (ids 257, ...).
inline std::shared_ptr<const m3::structured::TokenVocab> make_byte_vocab(const std::vector<std::string>& specials) {
  std::vector<std::string> b;
  std::vector<bool> sp;
  for (int i = 0; i < 256; ++i) {
    b.push_back(std::string(1, char(i)));
    sp.push_back(false);
  }
  b.push_back("<eos>");
  sp.push_back(true);
  for (const auto& s : specials) {
    b.push_back(s);
    sp.push_back(true);
  }
  return m3::structured::TokenVocab::from_tokens(b, sp, 256);
}
inline std::shared_ptr<const m3::structured::TokenVocab> byte_vocab() {
  static auto v = make_byte_vocab({});
  return v;
}

inline std::shared_ptr<const m3::structured::ConstraintSpec> spec_for(const m3::structured::Grammar& g,
                                                                      std::shared_ptr<const m3::structured::TokenVocab> v = byte_vocab()) {
  auto s = std::make_shared<m3::structured::ConstraintSpec>();
  s->grammar = m3::structured::compile(g);
  s->vocab = std::move(v);
  s->description = "test";
  return s;
}

// Whole-string match of `text` against the grammar.
struct GrammarProbe {
  std::shared_ptr<const m3::structured::ConstraintSpec> spec;
  explicit GrammarProbe(const m3::structured::Grammar& g) : spec(spec_for(g)) {}
  bool full(const std::string& text) const {
    m3::structured::Matcher m(spec);
    return m.advance_bytes(text) && m.accepting();
  }
};

inline GrammarProbe schema_probe(const std::string& schema_json, int ws = 16) {
  m3::structured::JsonOptions o;
  o.max_whitespace = ws;
  return GrammarProbe(m3::structured::json_schema_grammar(nlohmann::ordered_json::parse(schema_json), o));
}

// Runs the independent validator (ajv + ajv-formats from tests/tools/ajv, installed by `make test`;
// python3-jsonschema when node or the install is missing) on a cases file
// ([{"schema": .., "outputs": [text, ..]}, ..]); returns its report, sets ok.
inline std::string validate_cases(const std::string& cases_path, bool& ok) {
  const std::string ajv = std::string(M3_TEST_DATA) + "/../tools/ajv";
  std::string cmd;
  if (std::system("node --version >/dev/null 2>&1") == 0 && std::filesystem::exists(ajv + "/node_modules/ajv"))
    cmd = "node " + ajv + "/validate.js " + cases_path;
  else
    cmd = "python3 " + ajv + "/validate.py " + cases_path;
  cmd += " > " + cases_path + ".out 2>&1";
  ok = std::system(cmd.c_str()) == 0;
  std::ifstream f(cases_path + ".out");
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace m3test
