// Runs an expression graph on a minibatch: forward values, reverse-mode gradients
// of the summed loss, the inner steps of data-dependent variables, and the SVs of
// every parameter. Templated on the scalar: float for training, double for checks.
// Executes the graph's fusion plan: elementwise chains in one pass over memory,
// softmax + cross-entropy with the direct gradient p * sum(t) - t.
// Not thread-safe; one executor per thread. Holds references to the graph.
#pragma once

#include "ops/graph.h"

#include <vector>

namespace orpheus::ops {

template <typename S>
struct GraphInputs {
  const Mat<S>* dense = nullptr;        // D x B, or
  const SparseMat<S>* sparse = nullptr; // D x B
  const Eigen::VectorXi* labels = nullptr;  // B class ids (needed when the graph has a label)
  // One r x B matrix per data-dependent variable, in graph.locals() order;
  // optimizeLocals() updates them in place.
  std::vector<Mat<S>>* locals = nullptr;

  int64_t batch() const;
};

template <typename S>
class GraphExecutor {
 public:
  explicit GraphExecutor(const Graph& graph, bool fuse = true);

  // Forward pass over every node; returns the loss summed over the batch.
  S forward(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);
  // Gradients of the summed loss for every per-example node it depends on.
  // Requires forward() on the same arguments first.
  void backward(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);
  // `steps` rounds of forward, backward, local -= lr * d(loss)/d(local) for every
  // data-dependent variable (each with its own declared steps and rate).
  void optimizeLocals(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);

  const Mat<S>& value(int node) const;
  // Empty when the loss does not depend on the node.
  const Mat<S>& grad(int node) const { return grads_[static_cast<size_t>(node)]; }
  const std::vector<SvSite>& sites() const { return sites_; }
  const std::vector<FusedStep>& plan() const { return plan_; }

  // Dense gradient of each parameter built from the SV sites (U V^T; bias: U 1):
  // the reference the SVs are checked against. Requires backward().
  std::vector<Mat<S>> paramGradients(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in) const;

 private:
  const Mat<S>* operandValue(int id, const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);
  Operands<S> operands(const Node& n, const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);
  void accumulate(int id, const Mat<S>& g);
  void forwardFused(const FusedStep& step, const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);
  void backwardFused(const FusedStep& step, const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in);

  const Graph& graph_;
  std::vector<SvSite> sites_;
  std::vector<FusedStep> plan_;
  std::vector<int> stepEnding_;    // per node: index of the fused step it ends, or -1
  std::vector<bool> inStep_;
  std::vector<bool> needsGrad_;
  std::vector<Mat<S>> values_;
  std::vector<Mat<S>> grads_;
  Mat<S> oneHot_;
  Mat<S> denseInput_;
  const SparseMat<S>* denseInputOf_ = nullptr;
};

}  // namespace orpheus::ops
