// Jinja syntax tree: expression and statement nodes produced by jinja_parser and walked by
// jinja_eval. Every node keeps its template line so run-time errors can name it.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja/jinja_value.h"

namespace m3::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  Literal,   // value
  Name,      // name
  GetAttr,   // a.name
  GetItem,   // a[b]
  Slice,     // a[b:c:d]; absent parts are null
  Call,      // a(args)
  Filter,    // a | name(args)
  Test,      // a is [not] name(args)
  Unary,     // op a   (op: "-", "+", "not")
  Binary,    // a op b (arithmetic, comparison, "in", "not in", "~")
  And,
  Or,
  Cond,      // b if a else c  -> args = {cond, then, else}
  List,
  Tuple,
  Dict,      // args alternate key, value
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;                // Literal
  std::string name;           // Name/GetAttr/Filter/Test identifier, Unary/Binary operator
  bool negated = false;       // Test: `is not`
  std::vector<ExprPtr> args;  // operands and positional arguments (first is the subject where there is one)
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

// Variable that holds a filter block's rendered body while its filter chain is evaluated.
inline constexpr const char* kBlockBodyName = "__block_body__";

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind { Text, Output, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, Break, Continue, Scope };

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;                 // Text data; Set/SetBlock/Macro name
  ExprPtr expr;                     // Output/Set value; For iterable; CallBlock call; FilterBlock filter chain
  ExprPtr cond;                     // For filter (`for x in xs if cond`)
  std::vector<std::string> targets; // For/Set target names (several for tuple unpacking)
  std::string attr;                 // Set: `ns.attr` target attribute (targets[0] is the object)
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: (condition, body) pairs
  Body body;                        // For/SetBlock/Macro/CallBlock/FilterBlock/Scope body
  Body else_body;                   // If/For else
  std::vector<MacroParam> params;   // Macro
};

}  // namespace m3::jinja
