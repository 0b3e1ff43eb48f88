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
// Sizes are integers, names, or sums and products of them (4 * hidden, embed + hidden):
// `features` and `classes` come from the data.
//
// Recurrence: a sequence model is written as its cell, for one time step.
//   sequence NAME[SIZE]      the token input: at each step the one-hot of the
//                            current token over a vocabulary of SIZE (`classes`);
//                            in place of `input`
//   label NAME[SIZE]         in a sequence model: the one-hot of the next token
//   state NAME[SIZE]         a carried state: its value at the previous step (at a
//                            stream's start zeros; at a segment's start the value
//                            the previous segment of the same stream ended with)
//   next NAME = EXPR         the state's value for the next step; once per state
//   loss, predict            per step; the model's loss is the sum over the steps
// The engine unrolls the cell over the T steps of a segment (T from the data's
// header: scripts/data/make_tokens.sh --steps), shares the parameters across the steps and backpropagates within the
// segment only. chunk(x, k, n) is the k-th (from 0) of n equal row blocks of x, and
// concat(a, b) stacks a over b: a gate pre-activation W * concat(e, h) + b splits
// into its gates with chunk(a, 0, 4) ... chunk(a, 3, 4). A matrix times the token
// input (E * x) is an embedding lookup: its SVs have one-hot, sparse V.
// See examples/lstm.loss.
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
  // Time steps a sequence model is unrolled over; 0: those of token-stream data
  // whose `features` are its segments' rows (ops/sequence_layout.h).
  int64_t steps = 0;
};

// Parses `text` (named `source` in messages). Throws InputError with
// "source:line:column: ..." for syntax errors (saying what was expected), unknown
// names and shape mismatches (naming both shapes and the expression). A sequence
// model comes back unrolled over dims.steps steps (Graph::unroll).
Graph parseLoss(const std::string& text, const std::string& source, const LossDims& dims);
// A .loss file's text; InputError naming it when it cannot be read or is too large.
std::string readLossFile(const std::string& path);
Graph parseLossFile(const std::string& path, const LossDims& dims);

}  // namespace orpheus::ops
