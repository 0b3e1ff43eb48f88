// Runs an expression graph on a minibatch: forward values, reverse-mode gradients
// of the summed loss, the inner steps of data-dependent variables, and the SVs of
// every parameter. Templated on the scalar: float for training, double for checks.
// Executes the graph's fusion plan: elementwise chains in one pass over memory,
// softmax + cross-entropy with the direct gradient p * sum(t) - t, and each LSTM
// cell step in one pass over its 4H x B gate block (ops/lstm_cell.h; on the host,
// where the executor's buffers are). A fused LSTM cell keeps the values of its
// gates, cell, tanh(cell) and hidden state, not those of its chunks and products.
// Elementwise chains run through the compute seam (ops/backend.h): a float
// executor hands them to its backend, a double one (gradient checks; backends
// are float-only) runs the same host interpreter directly.
// Unrolled sequence models (fuse = true): a matrix applied at every step to
// concat(input part, recurrent part), W * concat(a_t, b_t) with a_t independent of
// the carried states, runs as one GEMM W[:, :rows(a)] * [a_0 ... a_{T-1}] for all
// steps, computed before the recurrence, plus one GEMM W[:, rows(a):] * b_t per step;
// a matrix applied at every step after the recurrence (LatePlan: an output layer) runs
// as one GEMM over all steps, forward and backward.
// Not thread-safe; one executor per thread. Holds references to the graph.
#pragma once

#include "ops/backend.h"
#include "ops/graph.h"
#include "ops/lstm_cell.h"

#include <functional>
#include <memory>
#include <span>
#include <vector>

namespace orpheus::ops {

// A run of elementwise nodes as a backend sees it (ops/backend.h EwChain): the
// chain, and the graph nodes that are its external inputs (in the chain's input order).
struct ChainPlan {
  EwChain chain;
  std::vector<int> inputNodes;
};
// The chain of the elementwise nodes `nodes` of `graph`, in evaluation order (a
// fused step's nodes, or a single node). Throws Error for a node that is not elementwise.
ChainPlan chainPlan(const Graph& graph, std::span<const int> nodes);
// Per node: whether the reverse pass computes its gradient, i.e. the loss depends
// on it and it depends on a parameter or a data-dependent variable (parameters
// themselves excluded: their gradients are the SVs').
std::vector<bool> nodesNeedingGradients(const Graph& graph);

// Unrolled sequence graphs: the operator nodes computed before the recurrence
// (`early`: independent of the carried states, a fused step only as a whole) and
// the products W * concat(a_t, b_t) with an early a_t whose input parts run as one
// GEMM over all steps, grouped by matrix (groups of two products at least).
// The products of one parameter matrix, one a step, that run as one GEMM over the steps.
struct StepProducts {
  int param = 0;              // index among parameters
  std::vector<int> products;  // by step
  std::vector<int> inputs;    // each product's operand part over the steps (a_t, b_t)
};

struct HoistPlan {
  using Group = StepProducts;
  std::vector<bool> early;  // per node
  std::vector<Group> groups;
};
HoistPlan hoistPlan(const Graph& graph, const std::vector<FusedStep>& plan);

// Unrolled sequence graphs: the products W * b_t, one a step, whose b_t depends on the
// carried states while no carried state depends on the product (an output layer over
// the hidden states), grouped by matrix (two products at least). They run after the
// recurrence as one GEMM W * [b_0 ... b_{T-1}], and their operands' gradients as one
// GEMM W^T * [g_0 ... g_{T-1}] before the recurrence's backward. `late` marks them and
// every node that depends on them (the per-step losses, the loss), which run after
// the recurrence, in node order; a fused step is late as a whole or the plan is empty.
struct LatePlan {
  using Group = StepProducts;
  std::vector<bool> late;  // per node
  std::vector<Group> groups;
  std::vector<int> groupOf;  // per node: a product's group, or -1
};
LatePlan latePlan(const Graph& graph, const std::vector<FusedStep>& plan);

template <typename S>
struct GraphInputs {
  const Mat<S>* dense = nullptr;        // D x B, or
  const SparseMat<S>* sparse = nullptr; // D x B
  const Eigen::VectorXi* labels = nullptr;  // B class ids (needed when the graph has a label)
  // One r x B matrix per data-dependent variable, in graph.locals() order;
  // optimizeLocals() updates them in place.
  std::vector<Mat<S>>* locals = nullptr;
  // Unrolled sequence models: `dense` holds segments (ops/sequence_layout.h), and
  // `states` the carried states at the first step, one r x B matrix per
  // graph.states() entry; null: zeros.
  const std::vector<Mat<S>>* states = nullptr;

  int64_t batch() const;
};

template <typename S>
class GraphExecutor {
 public:
  // `backend` (host memory only, for now: the executor's buffers are Eigen
  // matrices) runs the fused chains of a float executor; nullptr: a CPU backend of
  // its own. Must outlive the executor.
  explicit GraphExecutor(const Graph& graph, bool fuse = true, Backend* backend = nullptr);

  // Forward pass over every node; returns the loss summed over the batch.
  S forward(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);
  // Gradients of the summed loss for every per-example node it depends on.
  // Requires forward() on the same arguments first. `siteReady` (may be empty) is
  // told the index of each SV site as soon as its U, grad(matvecNode), is final:
  // every node that reads the product has passed its backward, so the site's SVs
  // can leave while the nodes below it (lower layers, earlier steps) still run.
  // Sites come in decreasing node order, top layer first, each exactly once.
  using SiteReadyFn = std::function<void(size_t site)>;
  void backward(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in,
                const SiteReadyFn& siteReady = {});
  // `steps` rounds of forward, backward, local -= lr * d(loss)/d(local) for every
  // data-dependent variable (each with its own declared steps and rate).
  void optimizeLocals(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);

  const Mat<S>& value(int node) const;
  // Empty when the loss does not depend on the node.
  const Mat<S>& grad(int node) const {
    return live_[static_cast<size_t>(node)] ? grads_[static_cast<size_t>(node)] : none_;
  }
  const std::vector<SvSite>& sites() const { return sites_; }
  const std::vector<FusedStep>& plan() const { return plan_; }
  // Matrices whose input part runs as one GEMM over all steps.
  size_t hoistedMatrices() const { return hoisted_.size(); }
  // A token node's one-hot (classes x B, sparse) from the last forward().
  const SparseMat<S>& tokens(int node) const { return tokenSparse_[static_cast<size_t>(node)]; }

  // Dense gradient of each parameter built from the SV sites (U V^T; bias: U 1):
  // the reference the SVs are checked against. Requires backward().
  std::vector<Mat<S>> paramGradients(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in) const;

 private:
  const Mat<S>* operandValue(int id, const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);
  Operands<S> operands(const Node& n, const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);
  void accumulate(int id, const Mat<S>& g);
  // The node's gradient buffer, zeros of rows x cols unless it is live already.
  Mat<S>& zeroedGrad(int id, int64_t rows, int64_t cols);
  void prepareSequence(const GraphInputs<S>& in);
  void planHoisting();
  void runNode(const Node& n, const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);
  void forwardHoisted(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);
  void forwardLate(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);
  void backwardLate(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);
  // One node's terms of its operands' gradients (a fused step's where it ends).
  void backwardNode(const Node& n, const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);
  void forwardFused(const FusedStep& step, const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);
  void backwardFused(const FusedStep& step, const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);
  void backwardLstmCell(const LstmCellRoles& roles, const std::vector<const Mat<S>*>& params,
                        const GraphInputs<S>& in);
  LstmCellBuffers<S> lstmBuffers(const LstmCellRoles& roles, const std::vector<const Mat<S>*>& params,
                                 const GraphInputs<S>& in);
  S* resized(int node, int64_t rows, int64_t cols);  // values_[node], resized

  void runChain(const ChainPlan& plan, const std::vector<const Mat<S>*>& inputs, const std::vector<Mat<S>*>& values,
                const Mat<S>* upstream, const std::vector<Mat<S>*>& inputGrads);

  const Graph& graph_;
  std::unique_ptr<Backend> ownBackend_;
  Backend* backend_ = nullptr;
  std::vector<SvSite> sites_;
  std::vector<FusedStep> plan_;
  std::vector<ChainPlan> chains_;  // per plan step; empty chains for softmax + cross-entropy
  std::vector<int> stepEnding_;    // per node: index of the fused step it ends, or -1
  std::vector<bool> inStep_;
  std::vector<bool> needsGrad_;
  // Values and gradients keep their memory from one minibatch to the next (same
  // shapes, no allocation); live_ says which gradients the current backward pass has.
  std::vector<Mat<S>> values_;
  std::vector<Mat<S>> grads_;
  std::vector<char> live_;
  const Mat<S> none_;
  Mat<S> scratch_;  // a gradient term added to one that is live
  // runChain's operand lists, kept so a clock allocates none.
  struct ChainArgs {
    std::vector<Tensor> in, val, grad;
    std::vector<const Tensor*> inPtr, valConst;
    std::vector<Tensor*> valPtr, gradPtr;
  };
  ChainArgs chainArgs_;
  std::vector<const Mat<S>*> stepInputs_;
  std::vector<Mat<S>*> stepValues_;
  std::vector<Mat<S>*> stepGrads_;
  std::vector<std::pair<int, size_t>> pendingSites_;
  // W * concat(a_t, b_t) at every step: the products, their a_t, and the input
  // part of all steps, W[:, :rows(a)] * [a_0 ... a_{T-1}].
  struct HoistedProduct {
    int param = 0;  // index among parameters
    std::vector<int> products;
    std::vector<int> inputs;
    Mat<S> allInputs;  // [a_0 ... a_{T-1}]
    Mat<S> inputPart;
  };
  std::vector<HoistedProduct> hoisted_;
  std::vector<int> hoistedAt_;  // per node: its group in hoisted_, or -1
  std::vector<bool> early_;     // per node: computed before the recurrence (independent of the states)
  LatePlan late_;               // the products after the recurrence, and the nodes that follow them
  std::vector<Mat<S>> lateInputs_, lateAll_;  // per group: [b_0 ... b_{T-1}] and W times them (backward:
                                              // the products' gradients, and W^T times those)
  std::vector<SparseMat<S>> tokenSparse_;  // per token node
  std::vector<bool> tokenDense_;           // per token node: also needed dense (values_)
  Mat<S> oneHot_;
  Mat<S> denseInput_;                          // a sparse batch's dense copy, for operands read densely
  const SparseMat<S>* denseInputOf_ = nullptr;  // the batch it was made from in this pass, or null
  bool holdDenseInput_ = false;                 // optimizeLocals: its passes keep the copy
};

}  // namespace orpheus::ops
