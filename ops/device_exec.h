// The forward and backward pass of a feed-forward graph with every value and
// gradient in tensors of one backend (ops/backend.h): parameters, activations,
// gradients and the SVs stay on its device; only the minibatch goes in (dense
// data into a kept buffer, sparse data through copySparse, labels as a one-hot
// built on the host) and only the loss row comes out. The executor never touches
// tensor memory from host code, so it runs on the strict device (ops/strict).
//
// What runs: parameters, one input (dense or sparse), a label, matrix-vector
// products (W v dense, or W x with x the sparse input), the fusion plan's
// elementwise chains and lone elementwise nodes (each a chain of one), and the
// fused softmax + cross-entropy. Everything else (LSTM cells, slices, concats,
// carried states, tokens, data-dependent variables, any other operator) is
// refused by unsupported().
//
// Same values as GraphExecutor<float>: the backend runs the same operations on
// the same operands in the same order (the CPU backend's kernels are the host
// executor's expressions; a gradient's second term is computed apart and added,
// as there), so on the cpu and strict backends the loss, every U and every V are
// bitwise the host executor's for graphs whose elementwise nodes outside fused
// chains are add, subtract, multiply, relu or scale (the examples' `W x + b`).
// Such a lone node runs as a chain of one, which the host runs through Eigen: a
// lone sigmoid, tanh, exp or log may differ in the last bits (the chain's math,
// ops/elementwise_math.h), and a zero gradient term may come out +0 where the
// host has -0 (or NaN where it has 0, for a non-finite upstream gradient).
//
// Buffers are allocated when the batch size changes and reused while it does not:
// a run allocates no tensor (a sparse batch's copySparse aside). Not thread-safe:
// one executor per thread, as its backend. Holds references to the graph and the
// backend; every tensor it owns dies with it, so it must die before the backend.
#pragma once

#include "engine/base/params.h"
#include "engine/base/sv_batch.h"
#include "ops/backend.h"
#include "ops/graph.h"
#include "ops/graph_exec.h"

#include <functional>
#include <span>
#include <string>
#include <vector>

namespace orpheus::ops {

class DeviceExecutor {
 public:
  // "" when the executor can run `graph`, else why not, naming the first node it
  // cannot run ("node 'concat(e, h)' (concat): ...").
  static std::string unsupported(const Graph& graph);

  // `graph` must be supported (Error with unsupported()'s reason otherwise).
  DeviceExecutor(const Graph& graph, Backend& backend);

  // Copies the minibatch (`dense` or `sparse`, D x B; `labels`, B class ids, when
  // the graph has a label) to the device and runs the forward and backward pass.
  // `params`: tensors on the backend's device in graph.params() order. Returns the
  // loss summed over the batch. `siteReady` as GraphExecutor::backward's: told
  // each site's index once its U is final, top layer first.
  double run(std::span<const Tensor> params, const Matrix* dense, const SparseMatrix* sparse,
             const Eigen::VectorXi& labels, const std::function<void(size_t)>& siteReady = {});
  // The forward pass only: the summed loss, and when `prediction` is given the
  // prediction node's value (rows x B) copied into it.
  double evaluate(std::span<const Tensor> params, const Matrix* dense, const SparseMatrix* sparse,
                  const Eigen::VectorXi& labels, Matrix* prediction = nullptr);

  const Graph& graph() const { return graph_; }
  Backend& backend() const { return backend_; }
  const std::vector<SvSite>& sites() const { return sites_; }
  // After run(): site i's U, J x B on the device (zeros when the loss does not
  // depend on the product), and its V: a dense device tensor, or the sparse
  // input's device copy. Valid until the next run.
  const Tensor& siteU(size_t i) const;
  const Tensor* siteVDense(size_t i) const;     // null when V is the sparse input
  const SparseTensor* siteVSparse(size_t i) const;  // null when V is dense
  // True when V of site i is the input node: its host copy is the batch itself.
  bool siteVIsInput(size_t i) const;

 private:
  // The batch's data and labels on the device; buffers (re)made when B changes.
  void upload(const Matrix* dense, const SparseMatrix* sparse, const Eigen::VectorXi& labels);
  void reserve(int64_t batch);
  const Tensor& value(int id, std::span<const Tensor> params) const;
  double forward(std::span<const Tensor> params);
  void backward(std::span<const Tensor> params, const std::function<void(size_t)>& siteReady);
  void forwardChain(const ChainPlan& plan, std::span<const int> nodes, std::span<const Tensor> params);
  void backwardChain(const ChainPlan& plan, std::span<const int> nodes, std::span<const Tensor> params);
  void backwardSoftmaxCrossEntropy(const FusedStep& step, std::span<const Tensor> params);
  void backwardMatVec(const Node& n, std::span<const Tensor> params);
  // The node's gradient buffer, zeroed first unless it holds a term already.
  Tensor& zeroedGrad(int id);
  // `t` = 0 on the device (a copy of the kept zero buffer).
  void setZero(Tensor& t);
  // The scratch buffer viewed in t's shape.
  Tensor scratchLike(const Tensor& t);

  const Graph& graph_;
  Backend& backend_;
  std::vector<SvSite> sites_;
  std::vector<FusedStep> plan_;
  std::vector<ChainPlan> chains_;  // per plan step; empty for softmax + cross-entropy
  std::vector<int> stepEnding_;    // per node: index of the fused step it ends, or -1
  std::vector<bool> inStep_;
  std::vector<int> paramOf_;       // per node: its index among the parameters, or -1
  std::vector<ChainPlan> lone_;    // per node: the chain of one of a lone elementwise node
  std::vector<bool> needsGrad_;
  bool inputReadDensely_ = false;  // some node other than a product's vector operand reads the input

  int64_t batch_ = -1;
  bool sparseBatch_ = false;
  std::vector<Tensor> values_;  // per operator node, rows x B
  std::vector<Tensor> grads_;   // per node needing a gradient, rows x B; the loss's: ones
  std::vector<char> live_;      // per node: its gradient holds a term of this pass
  Tensor input_;                // the dense input (or a sparse batch's dense copy), D x B
  SparseCopy sparse_;           // the sparse input's device copy
  Tensor oneHot_;               // the label's one-hot, C x B
  Tensor zeros_;                // flat zeros, as long as the largest gradient
  Tensor scratch_;              // flat, a gradient term added to one already there
  Matrix hostOneHot_;
  Matrix hostDense_;            // a sparse batch densified, where the input is read densely
  Matrix hostLoss_;             // the loss row, 1 x B
  // Operand lists of the backend's chain calls, kept so a run allocates none.
  std::vector<const Tensor*> chainIn_, chainValConst_;
  std::vector<Tensor*> chainVal_, chainGrad_;
  std::vector<std::pair<int, size_t>> pendingSites_;
};

}  // namespace orpheus::ops
