// The forward and backward pass of a graph (feed-forward, or an unrolled sequence
// model) with every value and gradient in tensors of one backend (ops/backend.h):
// parameters, activations, gradients and the SVs stay on its device; only the
// minibatch goes in (dense data into a kept buffer, sparse data through
// copySparse, labels as a one-hot built on the host; or a clock ahead, prefetch) and only the loss row comes
// out. The executor never touches tensor memory from host code, so it runs on the
// strict device (ops/strict).
//
// What runs: parameters, one input (dense or sparse), a label, matrix-vector
// products (W v dense, or W x with x the sparse input or a token one-hot), the
// fusion plan's elementwise chains and lone elementwise nodes (each a chain of
// one), the fused softmax + cross-entropy, the other operators that reduce or
// normalise a column (Backend::columnOp: sq_l2, l2_norm, l1, sum, softmax,
// log_softmax, cross_entropy, dot, sq_dist), concats and slices (row blocks,
// Backend::copyRows) and fused LSTM cell steps (Backend::lstmCellForward).
// Unrolled sequence graphs (Graph::unroll) run as GraphExecutor runs them: each
// step's token one-hots built on the host from the segments (sparse where a
// product reads them, dense where the cross-entropy does) and copied in, the
// carried states at the first step copied in (zeros when none are given), the
// products over concat(a_t, b_t) hoisted (HoistPlan: W's first columns times
// all steps' a_t as one GEMM, then W's other columns times b_t per step: column
// blocks of W, Tensor::middleCols), the last step's states left on the device
// for finalState(); a matrix applied to every step's state-dependent b_t after the
// recurrence (LatePlan: an output layer) as one GEMM over [b_0 ... b_{T-1}], its
// operands' gradients as one GEMM before the recurrence's backward. Data-dependent variables (examples/tm.loss's theta) come in
// with their batch, take their inner steps on the device and go back to the
// caller. Refused by unsupported(): cells not unrolled, and data-dependent
// variables in a sequence model.
//
// Same values as GraphExecutor<float> (with fusion, its default): the backend
// runs the same operations on the same operands in the same order (the CPU
// backend's kernels are the host executor's expressions, the LSTM cell
// ops/lstm_cell.h's loops; a gradient's second term is computed apart and added,
// as there), so on the cpu and strict backends the loss, every U and every V are
// bitwise the host executor's for graphs whose elementwise nodes outside fused
// chains are add, subtract, multiply, relu or scale (the examples' `W x + b`,
// examples/lstm.loss included). Such a lone node runs as a chain of one, which the
// host runs through Eigen: a lone sigmoid, tanh, exp or log may differ in the last
// bits (the chain's math, ops/elementwise_math.h), and a zero gradient term may
// come out +0 where the host has -0 (or NaN where it has 0, for a non-finite
// upstream gradient).
//
// Buffers are allocated when the batch size changes and reused while it does not:
// a run allocates no tensor, and a sparse batch's and the tokens' copies reuse their
// storage unless a batch has more nonzeros than any before. Not thread-safe:
// one executor per thread, as its backend. Holds references to the graph and the
// backend; every tensor it owns dies with it, so it must die before the backend.
#pragma once

#include "engine/base/params.h"
#include "engine/base/sv_batch.h"
#include "ops/backend.h"
#include "ops/graph.h"
#include "ops/graph_exec.h"
#include "ops/staging.h"

#include <array>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace orpheus::ops {

class DeviceExecutor {
 public:
  // "" when the executor can run `graph`, else why not, naming the first node it
  // cannot run ("node 'concat(e, h)' (concat): ...").
  // fuseLstmCells false: an LSTM cell's nodes run one by one, not as a fused cell
  // step (Graph::fusionPlan), for tests and benchmarks that weigh the two.
  static std::string unsupported(const Graph& graph, bool fuseLstmCells = true);

  // `graph` must be supported (Error with unsupported()'s reason otherwise).
  DeviceExecutor(const Graph& graph, Backend& backend, bool fuseLstmCells = true);

  // Copies the minibatch (`dense` or `sparse`, D x B; `labels`, B class ids, when
  // the graph has a label) to the device and runs the forward and backward pass.
  // `params`: tensors on the backend's device in graph.params() order. Returns the
  // loss summed over the batch. `siteReady` as GraphExecutor::backward's: told
  // each site's index once its U is final, top layer first.
  // A graph with data-dependent variables takes their values for the batch in
  // `locals` (graph.locals() order, rows x B each): copied in, refined on the device
  // by their inner steps before the pass (as GraphExecutor::optimizeLocals), and
  // copied back into `locals`, for the caller to keep with the examples.
  double run(std::span<const Tensor> params, const Matrix* dense, const SparseMatrix* sparse,
             const Eigen::VectorXi& labels, const std::function<void(size_t)>& siteReady = {},
             std::vector<Matrix>* locals = nullptr);
  // The forward pass only (after the data-dependent variables' inner steps, as in
  // run): the summed loss, and when `prediction` is given the prediction node's
  // value (rows x B) copied into it.
  double evaluate(std::span<const Tensor> params, const Matrix* dense, const SparseMatrix* sparse,
                  const Eigen::VectorXi& labels, Matrix* prediction = nullptr, std::vector<Matrix>* locals = nullptr);
  // Unrolled sequence graphs: `segments` (ops/sequence_layout.h) and the carried
  // states at the first step (graph.states() order, rows x B each; null: zeros).
  // As run() and evaluate(); the loss is summed over examples and steps.
  double runSequence(std::span<const Tensor> params, const Matrix& segments, const std::vector<Matrix>* states,
                     const std::function<void(size_t)>& siteReady = {});
  double evaluateSequence(std::span<const Tensor> params, const Matrix& segments, const std::vector<Matrix>* states);
  // The data queue (device_exec_queue.cc): a dense minibatch (D x B) and its
  // labels' one-hot copied to the device ahead of the run() that uses them, on the
  // backend's copy queue (Backend::copyToDeviceAsync) while the passes queued before
  // this call compute, into buffers they do not use. The next run() whose `dense`
  // and `labels` are these same objects, alive and unchanged since, starts from the
  // copy (its operations ordered after it, the host not waiting); any other batch
  // is copied in as usual. Feed-forward graphs with an input only.
  // The DDV swap queue's way in: `locals`, when given, are the batch's
  // data-dependent variables as they will be at its run (graph.locals() order,
  // rows x B each), copied ahead with it; that run starts from them instead of
  // copying its `locals` in, unless forgetQueuedLocals() was called since (the
  // caller's kept values of some of the batch's examples changed meanwhile).
  void prefetch(const Matrix& dense, const Eigen::VectorXi& labels, const std::vector<Matrix>* locals = nullptr);
  // The same for a sparse minibatch (D x B), whose compressed arrays cross through
  // the page-locked staging buffer as copySparse lays them out on the device (on
  // CUDA with the compression by rows its products read); where a node reads the
  // input densely, its dense copy crosses too.
  void prefetch(const SparseMatrix& sparse, const Eigen::VectorXi& labels, const std::vector<Matrix>* locals = nullptr);
  bool queuesSparse() const { return graph_.steps() == 0 && graph_.inputNode() >= 0; }
  // The data-dependent variables queued with batches not yet run are not used: their runs copy theirs in.
  void forgetQueuedLocals();
  // The same for an unrolled sequence graph: the segments' token one-hots (sparse
  // where a product reads them, dense where the cross-entropy does), built on the
  // host now and copied ahead; the next runSequence on these same segments starts
  // from them. The carried states are not data: they come as runSequence says.
  void prefetchSequence(const Matrix& segments);
  // Seconds the compute queue waited for prefetched batches to land since the last
  // call (on the device's timer; on the strict device a copy lands when it, or a
  // later copy, is waited for: its host time when the pass's own wait landed it).
  double takeDataWait();
  // After a sequence pass: state k after the last step (graph.finalStates()[k]),
  // and node `id`'s value (a step's prediction), copied into `out`.
  void finalState(size_t k, Matrix& out) const { copyOut(graph_.finalStates().at(k), out); }
  // The next runSequence starts from the states the last one ended with, where
  // they lie on the device (its `states` are ignored; the batch size must be the same).
  void carryFinalStates() { carry_ = true; }
  void copyOut(int id, Matrix& out) const;

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
  // V of a site whose vector is a token one-hot: the host matrix its device copy
  // was made from (GraphExecutor::tokens' values); else null.
  const SparseMatrix* siteVTokens(size_t i) const;

 private:
  // The batch's data and labels on the device; buffers (re)made when B changes.
  void upload(const Matrix* dense, const SparseMatrix* sparse, const Eigen::VectorXi& labels);
  // upload() of the batch prefetch() copied ahead: true when it was that batch.
  bool takePrefetched(const Matrix* dense, const SparseMatrix* sparse, const Eigen::VectorXi& labels);
  // uploadSequence()'s token one-hots from prefetchSequence(): true when these segments were queued.
  bool takePrefetchedSequence(const Matrix& segments);
  // The one-hots of token node `n` of the segments into `m` (tokens checked).
  void buildTokens(const Matrix& segments, const Node& n, SparseMatrix& m) const;
  // The label's one-hot of `labels` into `out` (C x B), labels checked.
  void oneHot(const Eigen::VectorXi& labels, Eigen::Map<Matrix> out) const;
  void reserve(int64_t batch);
  // The data-dependent variables in and their inner steps; their way back out is
  // queued on the copy queue (the DDV swap queue: the pass is queued behind it, not
  // after the host has them) and landed in `locals` by landLocals().
  void optimizeLocals(std::span<const Tensor> params, std::vector<Matrix>* locals);
  void landLocals(std::vector<Matrix>* locals);
  const Tensor& value(int id, std::span<const Tensor> params) const;
  // Every node's value; forward() also brings the loss row to the host and sums it.
  void forwardValues(std::span<const Tensor> params);
  double forward(std::span<const Tensor> params);
  void backward(std::span<const Tensor> params, const std::function<void(size_t)>& siteReady);
  void forwardNode(const Node& n, std::span<const Tensor> params);
  void forwardChain(const ChainPlan& plan, std::span<const int> nodes, std::span<const Tensor> params);
  void backwardChain(const ChainPlan& plan, std::span<const int> nodes, std::span<const Tensor> params);
  void backwardSoftmaxCrossEntropy(const FusedStep& step, std::span<const Tensor> params);
  void backwardMatVec(const Node& n, std::span<const Tensor> params);
  void backwardColumnOp(const Node& n, std::span<const Tensor> params);
  // Sequences and row blocks (device_exec_sequence.cc).
  void planSequence();
  void reserveSequence(int64_t batch);
  void uploadSequence(const Matrix& segments, const std::vector<Matrix>* states);
  void forwardHoisted(std::span<const Tensor> params);
  void forwardLate(std::span<const Tensor> params);
  void backwardLate(std::span<const Tensor> params);
  // One node's terms of its operands' gradients (a fused step's where it ends).
  void backwardNode(const Node& n, std::span<const Tensor> params);
  void forwardProduct(const Node& n, std::span<const Tensor> params);
  void forwardRows(const Node& n, std::span<const Tensor> params);
  LstmCellArgs cellArgs(const LstmCellRoles& roles, std::span<const Tensor> params);
  void forwardLstmCell(const LstmCellRoles& roles, std::span<const Tensor> params);
  void backwardLstmCell(const LstmCellRoles& roles, std::span<const Tensor> params);
  void backwardRows(const Node& n);
  // The sparse operand of product `n` (its vector is the sparse input or a token), or null.
  const SparseTensor* sparseOperand(const Node& n) const;
  // Adds a gradient term: `write` computes it into the tensor given (the operand's
  // buffer when it holds no term yet, else scratch, then added).
  template <typename Write>
  void addTerm(int operand, const Write& write);
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
  std::vector<int> localOf_;       // per node: its index among the data-dependent variables, or -1
  std::vector<ChainPlan> lone_;    // per node: the chain of one of a lone elementwise node
  std::vector<bool> needsGrad_;
  bool inputReadDensely_ = false;  // some node other than a product's vector operand reads the input

  int64_t batch_ = -1;
  bool sparseBatch_ = false;
  std::vector<Tensor> values_;  // per operator node, rows x B
  std::vector<Tensor> grads_;   // per node needing a gradient, rows x B; the loss's: ones
  std::vector<Tensor> locals_;  // per data-dependent variable, rows x B: the batch's values
  Staging localsOut_;           // their refined values on their way back, back to back
  std::vector<size_t> localsAt_;  // this pass's copies: where each lands in localsOut_, read by landLocals()
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

  // The data queue: two slots used in turn, so that the batch after next can be
  // on its way while the next one waits for its run. A slot owns the device
  // buffers its batch lands in (input_, oneHot_ and sparse_.view view them while
  // it is the batch being run; a sequence's dense one-hots are swapped with the
  // executor's) and a page-locked staging buffer (reused once the copy that read
  // it is done). A buffer is written again two batches later, by a copy that
  // starts after everything queued before it: the passes that read it included.
  struct Ahead {
    // The batch copied ahead, until a run takes it: dense data or a sequence's segments, or sparse data.
    const Matrix* dense = nullptr;
    const SparseMatrix* sparse = nullptr;
    const void* data = nullptr;
    int64_t cols = 0;
    const Eigen::VectorXi* labels = nullptr;
    Tensor input, oneHot;
    StagedSparse sparseInput;
    std::vector<SparseMatrix> tokens;        // per token node: its one-hots on the host
    std::vector<StagedSparse> sparseTokens;  // per token node a product reads
    std::vector<Tensor> denseTokens;         // per token node read densely
    std::vector<Tensor> locals;              // the batch's data-dependent variables (swapped with the executor's)
    bool withLocals = false;                 // `locals` hold the batch's, still current
    Staging staging;  // its last copy is the slot's last (copies land in order)
  };
  // The next slot, its staging buffer free and at least `bytes` long.
  Ahead& nextAhead(size_t bytes);
  // The labels' one-hot (C x B) staged and queued to the slot's oneHot.
  void stageLabels(Ahead& a, const Eigen::VectorXi& labels, int64_t batch);
  // The batch's data-dependent variables staged and queued to the slot's locals.
  void stageLocals(Ahead& a, const std::vector<Matrix>& locals, int64_t batch);
  // The batch's compute waits on the device for the slot's copies; the wait is timed.
  void orderAfter(const Ahead& a);
  std::array<Ahead, 2> ahead_;
  size_t aheadNext_ = 0;                            // the slot the next prefetch fills
  Ahead* localsTaken_ = nullptr;                    // the slot whose locals the batch being run starts from
  std::vector<std::pair<Event, Event>> dataWaits_;  // (compute queue reached the batch, its copy landed)

  // Unrolled sequence graphs.
  HoistPlan hoist_;
  std::vector<int> hoistedAt_;                // per node: its group in hoist_.groups, or -1
  std::vector<Tensor> allInputs_, inputPart_;  // per group: [a_0 ... a_{T-1}], W[:, :rows(a)] times them
  LatePlan late_;
  // Per late group: [b_0 ... b_{T-1}] (backward: W^T times the products' gradients), W
  // times them (the products' values), the products' gradients side by side.
  std::vector<Tensor> lateInputs_, lateAll_, lateGrads_;
  std::vector<bool> tokenSparse_, tokenDense_;  // per token node: read by a product / densely
  std::vector<SparseMatrix> hostTokens_;        // per token node read by a product
  std::vector<SparseCopy> deviceTokens_;
  Matrix hostStep_;                             // a dense token one-hot or a zero state, built on the host
  bool carry_ = false;                          // carryFinalStates() was called
};

template <typename Write>
void DeviceExecutor::addTerm(int operand, const Write& write) {
  const size_t i = static_cast<size_t>(operand);
  Tensor& g = grads_[i];
  if (!live_[i]) {
    write(g);
    live_[i] = 1;
    return;
  }
  Tensor term = scratchLike(g);
  write(term);
  backend_.axpy(1.0f, term, g);
}

}  // namespace orpheus::ops
