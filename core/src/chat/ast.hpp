// Chat-template syntax tree and parser: Jinja2 source (trim_blocks and lstrip_blocks on, as transformers
// renders) to statements and expressions; syntax errors and unsupported constructs name the construct and the
// line.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "value.hpp"

namespace strata::chat {

enum class ExprKind {
  Literal,
  Name,
  ListLit,
  TupleLit,
  DictLit,
  Attr,
  Item,
  Slice,
  Call,
  Filter,
  Test,
  Not,
  Neg,
  Pos,
  Binary,
  Compare,
  And,
  Or,
  Cond,
  Concat,
  Placeholder
};

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::Literal;
  int line = 0;
  Value value;              // Literal
  std::string name;         // Name; Attr attribute; Filter/Test name; Binary operator
  std::vector<ExprP> args;  // items; call/filter/test arguments; Compare operands;
                            // Concat parts; DictLit keys and values alternating;
                            // Slice start, stop, step (each may be null)
  std::vector<std::pair<std::string, ExprP>> kwargs;  // keyword arguments
  std::vector<std::string> ops;                       // Compare operators (==, !=, <, <=, >, >=, in, not in)
  ExprP a, b, c;         // Attr/Item/Slice/Call/Filter/Test subject = a; Item index = b; Binary/And/Or a, b;
                         // Not/Neg/Pos a; Cond: a if b else c (c may be null)
  bool negated = false;  // `is not`
};

enum class StmtKind {
  Text,
  Output,
  If,
  For,
  Set,
  SetAttr,
  SetBlock,
  Macro,
  FilterBlock,
  With,
  Break,
  Continue,
  Generation
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  StmtKind kind = StmtKind::Text;
  int line = 0;
  std::string text;  // Text
  ExprP expr;        // Output; Set/SetAttr value; For iterable; FilterBlock/SetBlock filter
  std::vector<std::pair<ExprP, Body>> branches;  // If: (condition, body) for if and each elif
  Body body, else_body;              // For/Macro/SetBlock/FilterBlock/With/Generation body; If/For else
  std::vector<std::string> targets;  // For/Set names; SetAttr: {namespace, attribute}; SetBlock name
  ExprP cond;                        // For ... if cond
  std::string name;                  // Macro name
  std::vector<std::string> params;   // Macro parameters
  std::vector<ExprP> defaults;       // Macro defaults, aligned with params (null when none)
  std::vector<std::pair<std::string, ExprP>> assigns;  // With
};

// Parses a whole template. Throws strata::Error("chat_template", "line N: ...").
Body parse_template(const std::string& source);

// Filter and test names the interpreter implements (checked at parse time, like Jinja's compiler does).
bool known_filter(const std::string& name);
bool known_test(const std::string& name);

}  // namespace strata::chat
