// The .loss language: a model as declarations and a loss expression.
//
//   # multinomial logistic regression
//   param W[classes, features] init normal(0.01)
//   param b[classes] init zeros
//   input x[features]
//   label y[classes]
//   a = W * x + b
//   loss cross_entropy(softmax(a), y)
//   predict a
//
// Statements, one per line ('#' starts a comment):
//   dim NAME = INT                        a named size
//   param NAME[ROWS, COLS] [init SPEC]    a parameter matrix; [ROWS] alone is a (bias) vector
//   input NAME[SIZE]                      the example's features (dense or sparse)
//   label NAME[SIZE]                      the one-hot of the example's class id
//   local NAME[SIZE] [init SPEC] [steps N] [lr R]
//                                         a data-dependent variable, kept per example and
//                                         optimised by N gradient steps of rate R each clock
//   NAME = EXPR                           a named intermediate
//   loss [=] EXPR                         the per-example loss (summed over examples)
//   predict EXPR                          optional: argmax is the predicted class
// Sizes are integers or names: `features` and `classes` come from the data.
// Init SPEC: zeros | constant(C) | normal(STD) | uniform(A) | glorot | he.
// EXPR: `+`, `-`, unary `-`, `*` (matrix times vector when the left operand is a
// parameter matrix, scaling by a number, otherwise elementwise), parentheses, and the
// operators of ops/operators.h by name, e.g. relu(W1 * x + b1), sq_dist(B * s, x),
// scale(x, 0.5).
#pragma once

#include "ops/graph.h"

#include <string>

namespace orpheus::ops {

struct LossDims {
  int64_t features = 0;
  int64_t classes = 0;
};

// Parses `text` (named `source` in messages). Throws InputError with
// "source:line:column: ..." for syntax errors (saying what was expected), unknown
// names and shape mismatches (naming both shapes and the expression).
Graph parseLoss(const std::string& text, const std::string& source, const LossDims& dims);
Graph parseLossFile(const std::string& path, const LossDims& dims);

}  // namespace orpheus::ops
