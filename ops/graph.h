// Expression graphs of loss functions: what a model is in Orpheus. A graph holds
// parameters (matrices and bias vectors), per-example terminals (the input x, the
// one-hot label, data-dependent variables), and operator nodes (ops/operators.h).
// Building a node infers its shape and refuses mismatches; `identifySvs()` finds,
// for every parameter, the sufficient vectors of its gradient (section 3.1.1):
//   - a matrix W used in a type-5 operator a = W v contributes the pair (df/da, v),
//     one pair per site where it is used;
//   - a bias vector b added to such an output (a = W v + b) is updated from the same
//     SVs: b += U c.
// A parameter used any other way has no SV form and is refused with the reason.
//
// Recurrence. A sequence model is written as its cell, once: a graph over a
// token input (`sequence`: the one-hot of the token at the current step), the
// next token's one-hot (the label), parameters and carried states (`state`: the
// value the cell gave its `next` at the previous step). `unroll(T)` copies the
// cell T times, sharing the parameters, feeding step t's next states to step t+1
// and summing the per-step losses: an ordinary graph, so its SV sites are per
// (matrix use, step): a matrix used at every step gets T sites of B columns, i.e.
// B*T SV pairs per clock. The first step's states are terminals holding the
// values carried from the stream's previous segment; no gradient flows into them
// (truncated backpropagation through time).
#pragma once

#include "ops/elementwise_ops.h"
#include "ops/operators.h"

#include <cstdint>
#include <string>
#include <vector>

namespace orpheus::ops {

// kToken: the one-hot of token row `step + tokenOffset` of a segment (see
// GraphInputs); kState: a carried state (a cell's state, or an unrolled graph's
// state before the first step).
enum class NodeKind { kParam, kInput, kLabel, kLocal, kOp, kToken, kState };

// How a parameter or data-dependent variable starts.
struct Init {
  enum class Kind { kZeros, kConstant, kNormal, kUniform, kGlorot, kHe } kind = Kind::kZeros;
  double value = 0.0;  // constant value, normal stddev, or uniform half-width
};

// Where a node came from in a .loss file (line 0: built with the C++ API).
struct SourceLoc {
  int line = 0;
  int column = 0;
};

struct Node {
  int id = 0;
  NodeKind kind = NodeKind::kOp;
  std::string name;  // declared name, or the expression text for operator nodes
  OpKind op = OpKind::kAdd;
  std::vector<int> inputs;
  int64_t rows = 0;          // per-example vector length, or a parameter's rows
  int64_t cols = 1;          // a parameter's columns; 1 for everything else
  bool perExample = false;   // one column per example (all but parameters)
  double attr = 1.0;         // kScale's factor; kSlice's first row
  int step = 0;              // kToken: the time step it feeds
  int tokenOffset = 0;       // kToken: 0 the step's token, 1 the next one (the label)
  Init init;                 // parameters and data-dependent variables
  int innerSteps = 0;        // data-dependent variables: gradient steps per clock
  double innerLr = 0.0;
  SourceLoc loc;
};

// One SV site: the parameter matrix of a type-5 node and what it is updated from.
struct SvSite {
  int param = 0;        // index among parameters (ParamSet order)
  int bias = -1;        // index among parameters of the bias added to the output, or -1
  int matvecNode = 0;   // node a = W v: U = df/da
  int vectorNode = 0;   // node v: V = v
};

// The nodes of one step of an LSTM cell, in the form examples/lstm.loss writes it
// (the four gates as row blocks of one pre-activation, in any order, and the
// operands of each product and sum in either order):
//   act_k = sigmoid | tanh (chunk(gates, k, 4))     input, forget, cell, output gate
//   cell  = f * cPrev + i * g
//   hidden = o * tanh(cell)
// Only `cell` and `hidden` may be used outside the step.
struct LstmCellRoles {
  enum Gate { kInput = 0, kForget = 1, kCandidate = 2, kOutput = 3 };
  int gates = -1;                // the 4H-row pre-activation
  int cPrev = -1;                // the previous cell state
  int act[4] = {-1, -1, -1, -1};  // by Gate: sigmoid, sigmoid, tanh, sigmoid
  int64_t offset[4] = {0, 0, 0, 0};  // by Gate: first row in `gates`
  int cell = -1;
  int tanhCell = -1;
  int hidden = -1;
};

// Nodes computed in one pass over memory: a chain of elementwise operators, a
// softmax followed by cross-entropy (whose gradient p - t needs no Jacobian), or
// an LSTM cell step (the gate nonlinearities, the cell and hidden state over the
// 4H x B gate block, and the matching backward).
struct FusedStep {
  enum class Kind { kElementwise, kSoftmaxCrossEntropy, kLstmCell } kind = Kind::kElementwise;
  std::vector<int> nodes;  // in evaluation order; the last one is the step's output
  LstmCellRoles lstm;      // kLstmCell
};

class Graph {
 public:
  // Gradient steps a data-dependent variable may take per clock: each one is a
  // forward and backward pass over the batch.
  static constexpr int kMaxInnerSteps = 10000;

  // Terminals. Names must be unique; shapes positive; inner steps at most kMaxInnerSteps.
  int param(const std::string& name, int64_t rows, int64_t cols, Init init, SourceLoc loc = {});
  int input(const std::string& name, int64_t rows, SourceLoc loc = {});
  int label(const std::string& name, int64_t rows, SourceLoc loc = {});
  int local(const std::string& name, int64_t rows, Init init, int innerSteps, double innerLr, SourceLoc loc = {});
  // Recurrent cells (see the top of this file). `sequence`: the token input over a
  // vocabulary of `rows`; at most one, and not with input(). `state`: a carried
  // state; `setNext`: the expression giving its value at the next step (same rows).
  int sequence(const std::string& name, int64_t rows, SourceLoc loc = {});
  int state(const std::string& name, int64_t rows, SourceLoc loc = {});
  void setNext(int state, int node, SourceLoc loc = {});
  // A token one-hot of an unrolled graph.
  int token(const std::string& name, int64_t rows, int step, int offset, SourceLoc loc = {});
  // Rows [first, first + rows) of a per-example node.
  int slice(int input, int64_t first, int64_t rows, const std::string& text, SourceLoc loc = {});

  // An operator node. Throws InputError naming both shapes and `text` (the
  // expression, for messages) when the operand shapes do not fit `op`.
  int apply(OpKind op, std::vector<int> inputs, const std::string& text, double attr = 1.0, SourceLoc loc = {});

  // The loss: a per-example scalar (1 row). The engine minimises its sum over examples.
  void setLoss(int node);
  // Optional: a per-example vector whose argmax is the predicted class.
  void setPrediction(int node);

  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(int id) const { return nodes_.at(static_cast<size_t>(id)); }
  int loss() const { return loss_; }
  int prediction() const { return prediction_; }
  // Parameter node ids in declaration order (the ParamSet order).
  const std::vector<int>& params() const { return params_; }
  int paramIndex(int node) const;  // -1 if not a parameter
  int inputNode() const { return input_; }
  int labelNode() const { return label_; }
  const std::vector<int>& locals() const { return locals_; }
  int find(const std::string& name) const;  // node id of a declared name, or -1
  // Nodes that use `id` as an operand.
  std::vector<int> consumers(int id) const;

  // Throws InputError naming the parameter and why it has no SV form; also when the
  // loss is missing, the model has no parameters, or some parameter does not
  // influence the loss.
  std::vector<SvSite> identifySvs() const;
  // lstmCells false: no kLstmCell steps, and the cells' nodes in no chain either:
  // each gate nonlinearity and each product and sum of the c and h updates runs
  // alone, as an LSTM without a fused cell would (tests and benchmarks weigh the
  // fused cell against it).
  // Chains stop at `limits` (a backend's Backend::chainLimits): a longer run of
  // elementwise nodes becomes several chains, each within them.
  std::vector<FusedStep> fusionPlan(bool lstmCells = true, ChainLimits limits = {}) const;
  // The LSTM cell step whose hidden state is node `hidden` (LstmCellRoles), if it
  // has that form.
  bool matchLstmCell(int hidden, FusedStep* step) const;

  // A cell: has a sequence input. unroll(T) returns the graph of T steps; throws
  // InputError for a state without `next` (naming its declaration), T < 1, or a
  // cell without a loss.
  bool isCell() const { return sequence_ >= 0; }
  Graph unroll(int steps) const;
  // Unrolled graphs: T (0 for graphs without recurrence), the carried states at
  // the first step (terminals, in declaration order) and their values after the
  // last step, and each step's prediction (empty without `predict`).
  int steps() const { return steps_; }
  const std::vector<int>& states() const { return states_; }
  const std::vector<int>& finalStates() const { return finalStates_; }
  const std::vector<int>& stepPredictions() const { return stepPredictions_; }

  // "file:line:col: " for messages about node `id` (or a place in the source), or "" for
  // C++-built nodes.
  std::string where(int id) const;
  std::string where(SourceLoc loc) const;
  void setSourceName(const std::string& name) { source_ = name; }
  const std::string& sourceName() const { return source_; }

 private:
  int add(Node n);

  std::vector<Node> nodes_;
  std::vector<int> params_;
  std::vector<int> locals_;
  int input_ = -1;
  int label_ = -1;
  int loss_ = -1;
  int prediction_ = -1;
  std::string source_;
  int sequence_ = -1;             // a cell's token input
  std::vector<int> states_;
  std::vector<int> next_;         // a cell's: per state, the node of its next value (-1: not yet given)
  std::vector<int> finalStates_;
  std::vector<int> stepPredictions_;
  int steps_ = 0;
};

}  // namespace orpheus::ops
