// The building blocks of the .loss parser (ops/loss_parser.cc): the limits that
// keep a hostile model file from exhausting the stack, memory or time, a line's
// tokens, what an expression evaluates to, and what a file has declared so far.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace orpheus::ops::loss_syntax {

// Limits that keep hostile model files from exhausting the stack, memory or time:
// recursive descent recurses once per nesting level; an operator node keeps (a
// prefix of) its expression's text; graph passes are quadratic in the node count.
constexpr int kMaxNestingDepth = 256;
constexpr size_t kMaxLineBytes = size_t{1} << 16;
constexpr size_t kMaxFileBytes = size_t{1} << 24;
constexpr size_t kMaxNodes = 10000;
// Operator nodes are named by their expression's text, for messages; longer texts
// are cut to this many bytes.
constexpr size_t kMaxNodeTextBytes = 200;
// The parameters are held at least twice while training (the replica and its
// rebuilt update), so together they may take at most this share of memory.
constexpr double kParamMemoryShare = 0.5;

struct Token {
  enum class Kind { kIdent, kNumber, kPunct, kEnd } kind = Kind::kEnd;
  std::string text;
  size_t begin = 0;  // byte offset in the line
  size_t end = 0;
  int column = 0;    // 1-based
};

inline std::string describe(const Token& t) {
  if (t.kind == Token::Kind::kEnd) return "end of line";
  return "'" + t.text + "'";
}

// What an expression evaluates to while parsing: a graph node or a number.
struct Value {
  int node = -1;
  double number = 0.0;
  bool isNumber() const { return node < 0; }
};

// What the statements of a file have declared so far.
struct FileState {
  std::map<std::string, int64_t> dims;
  std::map<std::string, int> names;
  int lossLine = 0;     // line of the 'loss' statement, 0 before it
  int predictLine = 0;  // line of the 'predict' statement, 0 before it
  double paramFloats = 0;
};

}  // namespace orpheus::ops::loss_syntax
