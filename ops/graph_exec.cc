#include "ops/graph_exec.h"

#include "engine/base/error.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/elementwise_chain.h"
#include "ops/lstm_cell.h"
#include "ops/sequence_layout.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

namespace orpheus::ops {

namespace {

EwOp elementwiseOp(OpKind op) {
  switch (op) {
    case OpKind::kSigmoid: return EwOp::kSigmoid;
    case OpKind::kTanh: return EwOp::kTanh;
    case OpKind::kRelu: return EwOp::kRelu;
    case OpKind::kExp: return EwOp::kExp;
    case OpKind::kLog: return EwOp::kLog;
    case OpKind::kScale: return EwOp::kScale;
    case OpKind::kAdd: return EwOp::kAdd;
    case OpKind::kSubtract: return EwOp::kSubtract;
    case OpKind::kMultiply: return EwOp::kMultiply;
    default: break;
  }
  throw Error(fmt::format("{} is not an elementwise operator", opName(op)));
}


// Products grouped by their parameter matrix in node order; a group of one product
// is dropped (one product alone gains nothing from a GEMM over the steps).
class StepProductGroups {
 public:
  explicit StepProductGroups(size_t params) : groupOf_(params, -1) {}
  void add(int param, int product, int input) {
    int& g = groupOf_[static_cast<size_t>(param)];
    if (g < 0) {
      g = static_cast<int>(groups_.size());
      groups_.push_back({});
      groups_.back().param = param;
    }
    groups_[static_cast<size_t>(g)].products.push_back(product);
    groups_[static_cast<size_t>(g)].inputs.push_back(input);
  }
  std::vector<StepProducts> take() {
    std::erase_if(groups_, [](const StepProducts& g) { return g.products.size() < 2; });
    return std::move(groups_);
  }

 private:
  std::vector<int> groupOf_;
  std::vector<StepProducts> groups_;
};

}  // namespace

ChainPlan chainPlan(const Graph& graph, std::span<const int> nodes) {
  ChainPlan plan;
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = graph.node(nodes[k]);
    EwStep s;
    s.op = elementwiseOp(n.op);
    s.attr = n.attr;
    for (size_t o = 0; o < n.inputs.size(); ++o) {
      const int operand = n.inputs[o];
      const auto inChain = std::find(nodes.begin(), nodes.begin() + static_cast<long>(k), operand);
      if (inChain != nodes.begin() + static_cast<long>(k)) {
        s.operand[o] = {EwRef::Kind::kStep, static_cast<int>(inChain - nodes.begin())};
        continue;
      }
      const auto known = std::find(plan.inputNodes.begin(), plan.inputNodes.end(), operand);
      s.operand[o] = {EwRef::Kind::kInput, static_cast<int>(known - plan.inputNodes.begin())};
      if (known == plan.inputNodes.end()) plan.inputNodes.push_back(operand);
    }
    plan.chain.steps.push_back(s);
  }
  plan.chain.inputs = static_cast<int>(plan.inputNodes.size());
  return plan;
}

std::vector<bool> nodesNeedingGradients(const Graph& graph) {
  const size_t n = graph.nodes().size();
  std::vector<bool> variable(n, false);
  for (const Node& node : graph.nodes()) {
    if (node.kind == NodeKind::kParam || node.kind == NodeKind::kLocal) variable[static_cast<size_t>(node.id)] = true;
    for (int in : node.inputs) {
      if (variable[static_cast<size_t>(in)]) variable[static_cast<size_t>(node.id)] = true;
    }
  }
  std::vector<bool> feedsLoss(n, false);
  if (graph.loss() >= 0) feedsLoss[static_cast<size_t>(graph.loss())] = true;
  for (int id = graph.loss(); id >= 0; --id) {
    if (!feedsLoss[static_cast<size_t>(id)]) continue;
    for (int in : graph.node(id).inputs) feedsLoss[static_cast<size_t>(in)] = true;
  }
  std::vector<bool> needsGrad(n, false);
  for (const Node& node : graph.nodes()) {
    const size_t i = static_cast<size_t>(node.id);
    needsGrad[i] = feedsLoss[i] && variable[i] && node.kind != NodeKind::kParam;
  }
  return needsGrad;
}

template <typename S>
int64_t GraphInputs<S>::batch() const {
  if (dense) return dense->cols();
  if (sparse) return sparse->cols();
  if (labels) return labels->size();
  return locals && !locals->empty() ? locals->front().cols() : 0;
}

template <typename S>
GraphExecutor<S>::GraphExecutor(const Graph& graph, bool fuse, Backend* backend)
    : graph_(graph),
      ownBackend_(backend ? nullptr : std::make_unique<cpu::CpuBackend>()),
      backend_(backend ? backend : ownBackend_.get()) {
  sites_ = graph.identifySvs();
  if (fuse) plan_ = graph.fusionPlan(true, backend_->chainLimits());
  for (const FusedStep& step : plan_) {
    chains_.push_back(step.kind == FusedStep::Kind::kElementwise ? chainPlan(graph, step.nodes) : ChainPlan{});
  }
  const size_t n = graph.nodes().size();
  stepEnding_.assign(n, -1);
  inStep_.assign(n, false);
  for (size_t s = 0; s < plan_.size(); ++s) {
    stepEnding_[static_cast<size_t>(plan_[s].nodes.back())] = static_cast<int>(s);
    for (int id : plan_[s].nodes) inStep_[static_cast<size_t>(id)] = true;
  }
  needsGrad_ = nodesNeedingGradients(graph);
  values_.resize(n);
  grads_.resize(n);
  live_.assign(n, 0);
  tokenSparse_.resize(n);
  tokenDense_.assign(n, false);
  hoistedAt_.assign(n, -1);
  early_.assign(n, false);
  if (fuse && graph.steps() > 0) planHoisting();
  for (const Node& node : graph.nodes()) {
    if (node.kind != NodeKind::kToken) continue;
    for (int u : graph.consumers(node.id)) {
      const Node& user = graph.node(u);
      if (!(user.op == OpKind::kMatVec && user.inputs[1] == node.id)) tokenDense_[static_cast<size_t>(node.id)] = true;
    }
  }
}

HoistPlan hoistPlan(const Graph& graph, const std::vector<FusedStep>& plan) {
  const auto& nodes = graph.nodes();
  const size_t n = nodes.size();
  HoistPlan out;
  out.early.assign(n, false);
  std::vector<bool> stateFree(n, true);
  for (const Node& node : nodes) {
    const size_t i = static_cast<size_t>(node.id);
    if (node.kind == NodeKind::kState) stateFree[i] = false;
    for (int in : node.inputs) stateFree[i] = stateFree[i] && stateFree[static_cast<size_t>(in)];
  }
  // A node in a fused step is computed with its step: early only when the whole step is.
  std::vector<int> stepOf(n, -1);
  for (size_t s = 0; s < plan.size(); ++s) {
    for (int id : plan[s].nodes) stepOf[static_cast<size_t>(id)] = static_cast<int>(s);
  }
  for (const Node& node : nodes) {
    const size_t i = static_cast<size_t>(node.id);
    if (node.kind != NodeKind::kOp || !stateFree[i]) continue;
    bool early = true;
    if (stepOf[i] >= 0) {
      for (int id : plan[static_cast<size_t>(stepOf[i])].nodes) early = early && stateFree[static_cast<size_t>(id)];
    }
    out.early[i] = early;
  }
  StepProductGroups groups(graph.params().size());
  for (const Node& node : nodes) {
    if (node.kind != NodeKind::kOp || node.op != OpKind::kMatVec) continue;
    const Node& v = graph.node(node.inputs[1]);
    if (v.kind != NodeKind::kOp || v.op != OpKind::kConcat) continue;
    const int a = v.inputs[0];
    if (!out.early[static_cast<size_t>(a)] || stateFree[static_cast<size_t>(v.id)]) continue;
    groups.add(graph.paramIndex(node.inputs[0]), node.id, a);
  }
  out.groups = groups.take();
  return out;
}

LatePlan latePlan(const Graph& graph, const std::vector<FusedStep>& plan) {
  const auto& nodes = graph.nodes();
  const size_t n = nodes.size();
  LatePlan out;
  out.late.assign(n, false);
  out.groupOf.assign(n, -1);
  if (graph.steps() == 0) return out;
  // carried: a state after the last step depends on the node; stateful: the node on a state.
  std::vector<bool> carried(n, false), stateful(n, false);
  for (int id : graph.finalStates()) carried[static_cast<size_t>(id)] = true;
  for (size_t i = n; i-- > 0;) {
    if (!carried[i]) continue;
    for (int in : nodes[i].inputs) carried[static_cast<size_t>(in)] = true;
  }
  for (const Node& node : nodes) {
    bool s = node.kind == NodeKind::kState;
    for (int in : node.inputs) s = s || stateful[static_cast<size_t>(in)];
    stateful[static_cast<size_t>(node.id)] = s;
  }
  std::vector<bool> inStep(n, false);
  for (const FusedStep& step : plan) {
    for (int id : step.nodes) inStep[static_cast<size_t>(id)] = true;
  }
  StepProductGroups groups(graph.params().size());
  for (const Node& node : nodes) {
    const size_t i = static_cast<size_t>(node.id);
    if (node.kind != NodeKind::kOp || node.op != OpKind::kMatVec || carried[i] || !stateful[i] || inStep[i]) continue;
    const int param = graph.paramIndex(node.inputs[0]);
    if (param < 0 || graph.node(node.inputs[1]).kind != NodeKind::kOp) continue;  // a dense value as b_t
    groups.add(param, node.id, node.inputs[1]);
  }
  out.groups = groups.take();
  for (size_t g = 0; g < out.groups.size(); ++g) {
    for (int id : out.groups[g].products) out.groupOf[static_cast<size_t>(id)] = static_cast<int>(g);
  }
  if (out.groups.empty()) return out;
  for (const Node& node : nodes) {
    const size_t i = static_cast<size_t>(node.id);
    bool late = out.groupOf[i] >= 0;
    for (int in : node.inputs) late = late || out.late[static_cast<size_t>(in)];
    out.late[i] = late && node.kind == NodeKind::kOp;
  }
  for (const FusedStep& step : plan) {
    const auto late = std::count_if(step.nodes.begin(), step.nodes.end(),
                                    [&](int id) { return out.late[static_cast<size_t>(id)]; });
    if (late == 0 || late == static_cast<std::ptrdiff_t>(step.nodes.size())) continue;
    out.groups.clear();
    out.late.assign(n, false);
    out.groupOf.assign(n, -1);
    break;
  }
  return out;
}

template <typename S>
void GraphExecutor<S>::planHoisting() {
  HoistPlan p = hoistPlan(graph_, plan_);
  early_ = std::move(p.early);
  for (HoistPlan::Group& g : p.groups) {
    hoisted_.push_back({});
    hoisted_.back().param = g.param;
    hoisted_.back().products = std::move(g.products);
    hoisted_.back().inputs = std::move(g.inputs);
  }
  for (size_t g = 0; g < hoisted_.size(); ++g) {
    for (int id : hoisted_[g].products) hoistedAt_[static_cast<size_t>(id)] = static_cast<int>(g);
  }
  late_ = latePlan(graph_, plan_);
  lateInputs_.resize(late_.groups.size());
  lateAll_.resize(late_.groups.size());
}

// The one-hots of every step's tokens and the carried states, for the batch's segments.
template <typename S>
void GraphExecutor<S>::prepareSequence(const GraphInputs<S>& in) {
  if (graph_.steps() == 0) return;
  ORPHEUS_ENFORCE(in.dense != nullptr, "a sequence model needs dense segments");
  const int64_t b = in.dense->cols();
  ORPHEUS_CHECK_INPUT(in.dense->rows() == segmentRows(graph_.steps()),
                      "the model unrolls {} steps, so a segment needs {} rows, but the data has {}", graph_.steps(),
                      segmentRows(graph_.steps()), in.dense->rows());
  for (const Node& n : graph_.nodes()) {
    const size_t i = static_cast<size_t>(n.id);
    if (n.kind != NodeKind::kToken) continue;
    SparseMat<S>& m = tokenSparse_[i];
    m.resize(n.rows, b);
    m.reserve(Eigen::VectorXi::Constant(b, 1));
    for (int64_t j = 0; j < b; ++j) {
      const S value = (*in.dense)(kSegmentTokenRow + n.step + n.tokenOffset, j);
      const auto id = static_cast<int64_t>(value);
      ORPHEUS_CHECK_INPUT(static_cast<S>(id) == value && id >= 0 && id < n.rows,
                          "token {} out of range: the vocabulary has {} words", value, n.rows);
      m.insert(id, j) = S(1);
    }
    m.makeCompressed();
    if (tokenDense_[i]) values_[i] = m;
  }
  const auto& states = graph_.states();
  ORPHEUS_ENFORCE(in.states == nullptr || in.states->size() == states.size(), "the graph has {} states, got {}",
                  states.size(), in.states ? in.states->size() : 0);
  for (size_t k = 0; k < states.size(); ++k) {
    const Node& n = graph_.node(states[k]);
    Mat<S>& v = values_[static_cast<size_t>(n.id)];
    if (in.states) {
      const Mat<S>& given = (*in.states)[k];
      ORPHEUS_ENFORCE(given.rows() == n.rows && given.cols() == b, "state '{}' is {}x{}, expected {}x{}", n.name,
                      given.rows(), given.cols(), n.rows, b);
      v = given;
    } else {
      v.setZero(n.rows, b);
    }
  }
}

template <typename S>
const Mat<S>* GraphExecutor<S>::operandValue(int id, const std::vector<const Mat<S>*>& params,
                                             const GraphInputs<S>& in) {
  const Node& n = graph_.node(id);
  switch (n.kind) {
    case NodeKind::kParam:
      return params[static_cast<size_t>(graph_.paramIndex(id))];
    case NodeKind::kInput:
      if (in.dense) return in.dense;
      // Only matrix-vector products read sparse data directly; others get a dense copy.
      if (denseInputOf_ != in.sparse || denseInput_.cols() != in.sparse->cols()) {
        denseInput_ = Mat<S>(*in.sparse);
        denseInputOf_ = in.sparse;
      }
      return &denseInput_;
    case NodeKind::kLabel: {
      ORPHEUS_ENFORCE(in.labels != nullptr, "the graph has a label but the batch has none");
      const int64_t b = in.labels->size();
      if (oneHot_.rows() != n.rows || oneHot_.cols() != b) oneHot_.resize(n.rows, b);
      oneHot_.setZero();
      for (int64_t j = 0; j < b; ++j) {
        const int t = (*in.labels)(j);
        ORPHEUS_CHECK_INPUT(t >= 0 && t < n.rows, "label {} out of range: the model has {} classes", t, n.rows);
        oneHot_(t, j) = S(1);
      }
      return &oneHot_;
    }
    case NodeKind::kLocal: {
      const auto& locals = graph_.locals();
      const size_t k = static_cast<size_t>(std::find(locals.begin(), locals.end(), id) - locals.begin());
      ORPHEUS_ENFORCE(in.locals != nullptr && k < in.locals->size(), "no values for data-dependent variable '{}'",
                      n.name);
      return &(*in.locals)[k];
    }
    case NodeKind::kOp:
    case NodeKind::kToken:
    case NodeKind::kState:
      return &values_[static_cast<size_t>(id)];
  }
  return nullptr;
}

template <typename S>
Operands<S> GraphExecutor<S>::operands(const Node& n, const std::vector<const Mat<S>*>& params,
                                       const GraphInputs<S>& in) {
  Operands<S> result;
  result.attr = static_cast<S>(n.attr);
  if (n.op == OpKind::kSlice) {
    result.first = static_cast<Eigen::Index>(n.attr);
    result.rows = n.rows;
  }
  result.a = operandValue(n.inputs[0], params, in);
  if (n.inputs.size() > 1) {
    const Node& b = graph_.node(n.inputs[1]);
    if (n.op == OpKind::kMatVec && b.kind == NodeKind::kToken) {
      result.bSparse = &tokenSparse_[static_cast<size_t>(b.id)];
    } else if (n.op == OpKind::kMatVec && b.kind == NodeKind::kInput && in.sparse) {
      result.bSparse = in.sparse;
    } else {
      result.b = operandValue(n.inputs[1], params, in);
    }
  }
  return result;
}

template <typename S>
const Mat<S>& GraphExecutor<S>::value(int id) const {
  return values_[static_cast<size_t>(id)];
}

// Forward when `upstream` is null, else backward (values read, inputGrads accumulated).
template <typename S>
void GraphExecutor<S>::runChain(const ChainPlan& plan, const std::vector<const Mat<S>*>& inputs,
                                const std::vector<Mat<S>*>& values, const Mat<S>* upstream,
                                const std::vector<Mat<S>*>& inputGrads) {
  if constexpr (std::is_same_v<S, float>) {
    ChainArgs& a = chainArgs_;
    a.in.clear();
    a.val.clear();
    a.grad.clear();
    a.inPtr.clear();
    a.valPtr.clear();
    a.valConst.clear();
    a.gradPtr.clear();
    a.in.reserve(inputs.size());
    a.val.reserve(values.size());
    a.grad.reserve(inputGrads.size());  // pointers into these stay valid
    for (const Mat<S>* m : inputs) a.in.push_back(cpu::view(*m));
    for (Mat<S>* m : values) a.val.push_back(cpu::view(*m));
    for (const Tensor& t : a.in) a.inPtr.push_back(&t);
    for (Tensor& t : a.val) a.valPtr.push_back(&t);
    if (!upstream) {
      backend_->elementwise(plan.chain, a.inPtr, a.valPtr);
      return;
    }
    for (Mat<S>* m : inputGrads) {
      a.grad.push_back(m ? cpu::view(*m) : Tensor());
      a.gradPtr.push_back(m ? &a.grad.back() : nullptr);
    }
    a.valConst.assign(a.valPtr.begin(), a.valPtr.end());
    backend_->elementwiseBackward(plan.chain, a.inPtr, a.valConst, cpu::view(*upstream), a.gradPtr);
  } else {
    const Mat<S>& shape = upstream ? *upstream : *values.back();
    cpu::ChainBuffers<S> b;
    b.rows = shape.rows();
    b.cols = shape.cols();
    for (const Mat<S>* m : inputs) {
      b.inputs.push_back(m->data());
      b.broadcast.push_back(m->cols() == 1 && b.cols != 1);
    }
    for (Mat<S>* m : values) b.values.push_back(m->data());
    if (!upstream) {
      cpu::runChainForward<S>(plan.chain, b);
      return;
    }
    b.upstream = upstream->data();
    for (Mat<S>* m : inputGrads) b.inputGrads.push_back(m ? m->data() : nullptr);
    cpu::runChainBackward<S>(plan.chain, b);
  }
}

template <typename S>
void GraphExecutor<S>::forwardFused(const FusedStep& step, const std::vector<const Mat<S>*>& params,
                                    const GraphInputs<S>& in) {
  if (step.kind == FusedStep::Kind::kSoftmaxCrossEntropy) {
    for (int id : step.nodes) {
      const Node& n = graph_.node(id);
      ops::forwardInto<S>(n.op, operands(n, params, in), values_[static_cast<size_t>(id)]);
    }
    return;
  }
  if (step.kind == FusedStep::Kind::kLstmCell) {
    // The chunks and the two products inside the cell are never materialised.
    LstmCellBuffers<S> b = lstmBuffers(step.lstm, params, in);
    for (int k = 0; k < 4; ++k) b.act[k] = resized(step.lstm.act[k], b.rows, b.cols);
    b.cell = resized(step.lstm.cell, b.rows, b.cols);
    b.tanhCell = resized(step.lstm.tanhCell, b.rows, b.cols);
    b.hidden = resized(step.lstm.hidden, b.rows, b.cols);
    lstmCellForward(b);
    return;
  }
  // One pass: every element of the chain's inputs is read once and each node's
  // value written once (they are kept for the backward pass).
  const ChainPlan& plan = chains_[static_cast<size_t>(stepEnding_[static_cast<size_t>(step.nodes.back())])];
  const int64_t rows = graph_.node(step.nodes.back()).rows;
  const int64_t cols = in.batch();
  std::vector<const Mat<S>*>& inputs = stepInputs_;
  inputs.clear();
  for (int id : plan.inputNodes) inputs.push_back(operandValue(id, params, in));
  std::vector<Mat<S>*>& values = stepValues_;
  values.clear();
  for (int id : step.nodes) {
    values_[static_cast<size_t>(id)].resize(rows, cols);
    values.push_back(&values_[static_cast<size_t>(id)]);
  }
  stepGrads_.clear();
  runChain(plan, inputs, values, nullptr, stepGrads_);
}

template <typename S>
S GraphExecutor<S>::forward(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in) {
  ORPHEUS_ENFORCE(params.size() == graph_.params().size(), "graph has {} parameters, got {}", graph_.params().size(),
                  params.size());
  // A sparse batch's dense copy is made anew for every pass (a feed may hand the
  // next batch in the same object), except between the inner steps' passes.
  if (!holdDenseInput_) denseInputOf_ = nullptr;
  prepareSequence(in);
  if (!hoisted_.empty()) forwardHoisted(params, in);
  for (const Node& n : graph_.nodes()) {
    if (n.kind != NodeKind::kOp || (!hoisted_.empty() && early_[static_cast<size_t>(n.id)])) continue;
    if (!late_.groups.empty() && late_.late[static_cast<size_t>(n.id)]) continue;  // after the recurrence
    const int g = hoistedAt_[static_cast<size_t>(n.id)];
    if (g < 0) {
      runNode(n, params, in);
      continue;
    }
    // The step's input part was computed for all steps at once; add the recurrent part.
    const HoistedProduct& h = hoisted_[static_cast<size_t>(g)];
    const auto t = static_cast<Eigen::Index>(std::find(h.products.begin(), h.products.end(), n.id) - h.products.begin());
    const Node& concat = graph_.node(n.inputs[1]);
    const Mat<S>& w = *params[static_cast<size_t>(h.param)];
    const Mat<S>& recurrent = *operandValue(concat.inputs[1], params, in);
    const Eigen::Index b = recurrent.cols();
    const Eigen::Index inputRows = graph_.node(concat.inputs[0]).rows;
    Mat<S>& out = values_[static_cast<size_t>(n.id)];
    out = h.inputPart.middleCols(t * b, b);
    out.noalias() += w.rightCols(w.cols() - inputRows) * recurrent;
  }
  if (!late_.groups.empty()) forwardLate(params, in);
  ORPHEUS_ENFORCE(graph_.loss() >= 0, "the graph has no loss");
  return values_[static_cast<size_t>(graph_.loss())].sum();
}

// After the recurrence: each late group's products for all steps as one GEMM, then
// every late node in node order (a product takes its step's block).
template <typename S>
void GraphExecutor<S>::forwardLate(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in) {
  for (size_t g = 0; g < late_.groups.size(); ++g) {
    const LatePlan::Group& l = late_.groups[g];
    const Mat<S>& first = values_[static_cast<size_t>(l.inputs[0])];
    const Eigen::Index b = first.cols();
    Mat<S>& all = lateInputs_[g];
    all.resize(first.rows(), b * static_cast<Eigen::Index>(l.inputs.size()));
    for (size_t t = 0; t < l.inputs.size(); ++t) {
      all.middleCols(static_cast<Eigen::Index>(t) * b, b) = values_[static_cast<size_t>(l.inputs[t])];
    }
    const Mat<S>& w = *params[static_cast<size_t>(l.param)];
    lateAll_[g].resize(w.rows(), all.cols());
    lateAll_[g].noalias() = w * all;
  }
  for (const Node& n : graph_.nodes()) {
    const size_t i = static_cast<size_t>(n.id);
    if (!late_.late[i]) continue;
    const int g = late_.groupOf[i];
    if (g < 0) {
      runNode(n, params, in);
      continue;
    }
    const LatePlan::Group& l = late_.groups[static_cast<size_t>(g)];
    const auto t = static_cast<Eigen::Index>(std::find(l.products.begin(), l.products.end(), n.id) - l.products.begin());
    const Eigen::Index b = values_[static_cast<size_t>(l.inputs[0])].cols();
    values_[i] = lateAll_[static_cast<size_t>(g)].middleCols(t * b, b);
  }
}

template <typename S>
void GraphExecutor<S>::runNode(const Node& n, const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in) {
  // A fused step runs where its last node stands: by then every operand from
  // outside the step has been computed.
  const int s = stepEnding_[static_cast<size_t>(n.id)];
  if (s >= 0) {
    forwardFused(plan_[static_cast<size_t>(s)], params, in);
    return;
  }
  if (inStep_[static_cast<size_t>(n.id)]) return;
  ops::forwardInto<S>(n.op, operands(n, params, in), values_[static_cast<size_t>(n.id)]);
}

// Every node independent of the carried states, then each hoisted product's input
// part for all steps as one GEMM.
template <typename S>
void GraphExecutor<S>::forwardHoisted(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in) {
  for (const Node& n : graph_.nodes()) {
    if (n.kind == NodeKind::kOp && early_[static_cast<size_t>(n.id)]) runNode(n, params, in);
  }
  for (HoistedProduct& h : hoisted_) {
    const Mat<S>& first = values_[static_cast<size_t>(h.inputs[0])];
    const Eigen::Index rows = first.rows();
    const Eigen::Index b = first.cols();
    Mat<S>& all = h.allInputs;
    all.resize(rows, b * static_cast<Eigen::Index>(h.inputs.size()));
    for (size_t t = 0; t < h.inputs.size(); ++t) {
      all.middleCols(static_cast<Eigen::Index>(t) * b, b) = values_[static_cast<size_t>(h.inputs[t])];
    }
    const Mat<S>& w = *params[static_cast<size_t>(h.param)];
    h.inputPart.resize(w.rows(), all.cols());
    h.inputPart.noalias() = w.leftCols(rows) * all;
  }
}

template <typename S>
void GraphExecutor<S>::accumulate(int id, const Mat<S>& g) {
  Mat<S>& target = grads_[static_cast<size_t>(id)];
  char& live = live_[static_cast<size_t>(id)];
  if (!live) {
    target = g;  // into the buffer's memory when the shape is the last clock's
    live = 1;
  } else {
    target += g;
  }
}

template <typename S>
Mat<S>& GraphExecutor<S>::zeroedGrad(int id, int64_t rows, int64_t cols) {
  Mat<S>& g = grads_[static_cast<size_t>(id)];
  char& live = live_[static_cast<size_t>(id)];
  if (!live) {
    g.setZero(rows, cols);
    live = 1;
  }
  return g;
}

template <typename S>
S* GraphExecutor<S>::resized(int node, int64_t rows, int64_t cols) {
  Mat<S>& m = values_[static_cast<size_t>(node)];
  m.resize(rows, cols);
  return m.data();
}

template <typename S>
LstmCellBuffers<S> GraphExecutor<S>::lstmBuffers(const LstmCellRoles& roles, const std::vector<const Mat<S>*>& params,
                                                 const GraphInputs<S>& in) {
  const Mat<S>& gates = *operandValue(roles.gates, params, in);
  const Mat<S>& cPrev = *operandValue(roles.cPrev, params, in);
  LstmCellBuffers<S> b;
  b.rows = graph_.node(roles.hidden).rows;
  b.cols = gates.cols();
  ORPHEUS_ENFORCE(gates.rows() == 4 * b.rows && cPrev.rows() == b.rows && cPrev.cols() == b.cols,
                  "LSTM cell: gates {}x{}, previous cell {}x{}", gates.rows(), gates.cols(), cPrev.rows(),
                  cPrev.cols());
  b.gates = gates.data();
  b.cPrev = cPrev.data();
  for (int k = 0; k < 4; ++k) b.offset[k] = roles.offset[k];
  return b;
}

template struct GraphInputs<float>;
template struct GraphInputs<double>;
template class GraphExecutor<float>;
template class GraphExecutor<double>;

}  // namespace orpheus::ops
