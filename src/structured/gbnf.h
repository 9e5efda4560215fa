// Structured outputs: grammars written in GBNF (llama.cpp's grammar format), for the `grammar`
// field. Chosen because users already write it and it maps one to one onto grammar.h: rules
// `name ::= alternatives`, "literals" and [character classes] (with ^ negation, ranges, escapes
// \n \r \t \\ \" \] \xHH \uHHHH \UHHHHHHHH), `.` (any character), rule references, ( ) groups,
// | alternation, * + ? and {m}, {m,}, {m,n} repetition, # comments. The root rule is `root`.
// A rule ends at a newline outside parentheses; a following line that starts with `|` continues
// it. Refused by name: token references <[id]> / <name>, left recursion, undefined rules.
// The Lark-style EBNF of xgrammar/guidance is not supported (refused with a message saying so
// when the text looks like it: `name: ...` rules or `start:`).
#pragma once
#include <string_view>

#include "structured/grammar.h"

namespace m3::structured {

Grammar gbnf_grammar(std::string_view text, const Limits& limits = Limits{});

// `choice`: the output is exactly one of the strings.
Grammar choice_grammar(const std::vector<std::string>& choices);
// `regex`: the whole output matches (regex.h subset).
Grammar regex_grammar(std::string_view pattern, const Limits& limits = Limits{});

}  // namespace m3::structured
