#include "ops/device_exec.h"

#include "engine/base/error.h"
#include "ops/cpu/cpu_backend.h"

#include <algorithm>
#include <cstring>

namespace orpheus::ops {

namespace {

const char* terminalName(NodeKind kind) {
  switch (kind) {
    case NodeKind::kParam: return "param";
    case NodeKind::kInput: return "input";
    case NodeKind::kLabel: return "label";
    case NodeKind::kLocal: return "local";
    case NodeKind::kOp: return "op";
    case NodeKind::kToken: return "token";
    case NodeKind::kState: return "state";
  }
  return "unknown";
}

Tensor hostView(Matrix& m) { return Tensor::host(m.data(), m.rows(), m.cols()); }
Tensor hostView(const Matrix& m) { return Tensor::host(m.data(), m.rows(), m.cols()); }

}  // namespace

std::string DeviceExecutor::unsupported(const Graph& graph, bool fuseLstmCells) {
  if (graph.isCell()) return "a recurrent cell runs on a device only unrolled (Graph::unroll)";
  if (graph.loss() < 0) return "the graph has no loss";
  const std::vector<FusedStep> plan = graph.fusionPlan(fuseLstmCells);
  std::vector<bool> inStep(graph.nodes().size(), false);
  for (const FusedStep& step : plan) {
    for (int id : step.nodes) inStep[static_cast<size_t>(id)] = true;
  }
  for (const Node& n : graph.nodes()) {
    const auto refused = [&](const char* what, const char* why) {
      return fmt::format("{}node '{}' ({}): {} not supported on a device", graph.where(n.id), n.name, what, why);
    };
    if (n.kind == NodeKind::kLocal && graph.steps() > 0) {
      return refused(terminalName(n.kind), "data-dependent variables of a sequence model are");
    }
    if (n.kind != NodeKind::kOp || inStep[static_cast<size_t>(n.id)]) continue;
    if (n.op == OpKind::kMatVec || n.op == OpKind::kConcat || n.op == OpKind::kSlice || isElementwise(n.op) ||
        isColumnOp(n.op)) {
      continue;
    }
    return refused(opName(n.op), "this operator is");
  }
  return "";
}

DeviceExecutor::DeviceExecutor(const Graph& graph, Backend& backend, bool fuseLstmCells)
    : graph_(graph), backend_(backend) {
  const std::string refusal = unsupported(graph, fuseLstmCells);
  ORPHEUS_ENFORCE(refusal.empty(), "DeviceExecutor: {}", refusal);
  sites_ = graph.identifySvs();
  plan_ = graph.fusionPlan(fuseLstmCells, backend.chainLimits());
  const size_t n = graph.nodes().size();
  stepEnding_.assign(n, -1);
  inStep_.assign(n, false);
  for (size_t s = 0; s < plan_.size(); ++s) {
    const FusedStep& step = plan_[s];
    chains_.push_back(step.kind == FusedStep::Kind::kElementwise ? chainPlan(graph, step.nodes) : ChainPlan{});
    stepEnding_[static_cast<size_t>(step.nodes.back())] = static_cast<int>(s);
    for (int id : step.nodes) inStep_[static_cast<size_t>(id)] = true;
  }
  lone_.resize(n);
  paramOf_.assign(n, -1);
  localOf_.assign(n, -1);
  for (size_t k = 0; k < graph.locals().size(); ++k) localOf_[static_cast<size_t>(graph.locals()[k])] = static_cast<int>(k);
  locals_.resize(graph.locals().size());
  for (const Node& node : graph.nodes()) {
    const size_t i = static_cast<size_t>(node.id);
    if (node.kind == NodeKind::kParam) paramOf_[i] = graph.paramIndex(node.id);
    if (node.kind == NodeKind::kOp && !inStep_[i] && isElementwise(node.op)) {
      lone_[i] = chainPlan(graph, std::span<const int>(&node.id, 1));
    }
  }
  needsGrad_ = nodesNeedingGradients(graph);
  if (graph.inputNode() >= 0) {
    for (int u : graph.consumers(graph.inputNode())) {
      const Node& user = graph.node(u);
      const bool product = user.op == OpKind::kMatVec && user.inputs[1] == graph.inputNode();
      if (!product || user.inputs[0] == graph.inputNode()) inputReadDensely_ = true;
    }
  }
  values_.resize(n);
  grads_.resize(n);
  live_.assign(n, 0);
  planSequence();
}

void DeviceExecutor::reserve(int64_t batch) {
  if (batch == batch_) return;
  batch_ = batch;
  int64_t largest = 0;
  for (const Node& n : graph_.nodes()) {
    const size_t i = static_cast<size_t>(n.id);
    if (n.kind == NodeKind::kOp) values_[i] = backend_.allocate(n.rows, batch);
    if (needsGrad_[i]) {
      grads_[i] = backend_.allocate(n.rows, batch);
      largest = std::max(largest, n.rows * batch);
    }
  }
  for (size_t k = 0; k < locals_.size(); ++k) locals_[k] = backend_.allocate(graph_.node(graph_.locals()[k]).rows, batch);
  if (graph_.labelNode() >= 0) {
    const int64_t classes = graph_.node(graph_.labelNode()).rows;
    oneHot_ = backend_.allocate(classes, batch);
    hostOneHot_.resize(classes, batch);
  }
  // The backward pass starts from d(sum of the loss row)/d(loss) = 1; nothing writes it.
  const int loss = graph_.loss();
  const Matrix ones = Matrix::Ones(1, batch);
  backend_.copy(hostView(ones), grads_[static_cast<size_t>(loss)]);
  const Matrix zeros = Matrix::Zero(largest, 1);
  zeros_ = backend_.allocate(largest, 1);
  backend_.copy(hostView(zeros), zeros_);
  scratch_ = backend_.allocate(largest, 1);
  hostLoss_.resize(1, batch);
  reserveSequence(batch);
}

void DeviceExecutor::upload(const Matrix* dense, const SparseMatrix* sparse, const Eigen::VectorXi& labels) {
  ORPHEUS_ENFORCE(graph_.steps() == 0, "a sequence model runs through runSequence and evaluateSequence");
  localsTaken_ = nullptr;
  if ((dense != nullptr || sparse != nullptr) && takePrefetched(dense, sparse, labels)) return;
  const int input = graph_.inputNode();
  int64_t batch = labels.size();
  if (input >= 0) {
    ORPHEUS_ENFORCE((dense != nullptr) != (sparse != nullptr), "a batch is either dense or sparse");
    const int64_t features = graph_.node(input).rows;
    const int64_t rows = dense ? dense->rows() : sparse->rows();
    ORPHEUS_CHECK_INPUT(rows == features, "the model has {} features, the data {}", features, rows);
    batch = dense ? dense->cols() : sparse->cols();
  }
  reserve(batch);
  sparseBatch_ = sparse != nullptr;
  // input_ and oneHot_ may view a data queue slot's buffers (takePrefetched): a
  // batch copied in here gets buffers of its own.
  const auto uploadDense = [&](const Matrix& m) {
    if (!input_.owning() || input_.rows() != m.rows() || input_.cols() != m.cols()) {
      input_ = backend_.allocate(m.rows(), m.cols());
    }
    backend_.copy(hostView(m), input_);
  };
  if (dense != nullptr) uploadDense(*dense);
  if (sparse != nullptr) {
    if (sparse->isCompressed()) {
      backend_.copySparse(cpu::view(*sparse), sparse_);
    } else {
      SparseMatrix compressed = *sparse;
      compressed.makeCompressed();
      backend_.copySparse(cpu::view(compressed), sparse_);
    }
    if (inputReadDensely_) {
      hostDense_ = *sparse;
      uploadDense(hostDense_);
    }
  }
  const int label = graph_.labelNode();
  if (label < 0) return;
  ORPHEUS_CHECK_INPUT(labels.size() == batch, "the batch has {} examples but {} labels", batch, labels.size());
  oneHot(labels, Eigen::Map<Matrix>(hostOneHot_.data(), hostOneHot_.rows(), hostOneHot_.cols()));
  if (!oneHot_.owning()) oneHot_ = backend_.allocate(hostOneHot_.rows(), hostOneHot_.cols());
  backend_.copy(hostView(hostOneHot_), oneHot_);
}

const Tensor& DeviceExecutor::value(int id, std::span<const Tensor> params) const {
  const size_t i = static_cast<size_t>(id);
  switch (graph_.node(id).kind) {
    case NodeKind::kParam:
      return params[static_cast<size_t>(paramOf_[i])];
    case NodeKind::kInput:
      ORPHEUS_ENFORCE(!sparseBatch_ || inputReadDensely_, "the sparse input is read only by products");
      return input_;
    case NodeKind::kLabel:
      return oneHot_;
    case NodeKind::kLocal:
      return locals_[static_cast<size_t>(localOf_[i])];
    default:
      return values_[i];
  }
}

void DeviceExecutor::forwardChain(const ChainPlan& plan, std::span<const int> nodes, std::span<const Tensor> params) {
  chainIn_.clear();
  chainVal_.clear();
  for (int id : plan.inputNodes) chainIn_.push_back(&value(id, params));
  for (int id : nodes) chainVal_.push_back(&values_[static_cast<size_t>(id)]);
  backend_.elementwise(plan.chain, chainIn_, chainVal_);
}

void DeviceExecutor::forwardNode(const Node& n, std::span<const Tensor> params) {
  const size_t i = static_cast<size_t>(n.id);
  // A fused step runs where its last node stands, when all its outside operands exist.
  const int s = stepEnding_[i];
  if (s >= 0) {
    const FusedStep& step = plan_[static_cast<size_t>(s)];
    if (step.kind == FusedStep::Kind::kSoftmaxCrossEntropy) {
      const Node& softmax = graph_.node(step.nodes[0]);
      const Node& ce = graph_.node(step.nodes[1]);
      backend_.softmaxCrossEntropy(value(softmax.inputs[0], params), value(ce.inputs[1], params),
                                   values_[static_cast<size_t>(softmax.id)], values_[i]);
    } else if (step.kind == FusedStep::Kind::kLstmCell) {
      forwardLstmCell(step.lstm, params);
    } else {
      forwardChain(chains_[static_cast<size_t>(s)], step.nodes, params);
    }
    return;
  }
  if (inStep_[i]) return;
  if (n.op == OpKind::kMatVec) {
    forwardProduct(n, params);
  } else if (n.op == OpKind::kConcat || n.op == OpKind::kSlice) {
    forwardRows(n, params);
  } else if (isColumnOp(n.op)) {
    const Tensor* b = n.inputs.size() > 1 ? &value(n.inputs[1], params) : nullptr;
    backend_.columnOp(n.op, value(n.inputs[0], params), b, values_[i]);
  } else {
    forwardChain(lone_[i], std::span<const int>(&n.id, 1), params);
  }
}

void DeviceExecutor::forwardValues(std::span<const Tensor> params) {
  ORPHEUS_ENFORCE(params.size() == graph_.params().size(), "the graph has {} parameters, got {}",
                  graph_.params().size(), params.size());
  // As GraphExecutor::forward: with hoisted products, the nodes independent of the
  // carried states first, then the rest in node order.
  const bool hoisting = !hoist_.groups.empty();
  if (hoisting) forwardHoisted(params);
  const bool late = !late_.groups.empty();
  for (const Node& n : graph_.nodes()) {
    if (n.kind != NodeKind::kOp || (hoisting && hoist_.early[static_cast<size_t>(n.id)])) continue;
    if (late && late_.late[static_cast<size_t>(n.id)]) continue;  // after the recurrence
    forwardNode(n, params);
  }
  if (late) forwardLate(params);
}

double DeviceExecutor::forward(std::span<const Tensor> params) {
  forwardValues(params);
  Tensor lossRow = hostView(hostLoss_);
  backend_.copy(values_[static_cast<size_t>(graph_.loss())], lossRow);
  return hostLoss_.sum();  // as GraphExecutor::forward sums it
}

void DeviceExecutor::setZero(Tensor& t) {
  ORPHEUS_ENFORCE(t.size() <= zeros_.size(), "no zeros for a {}x{} tensor", t.rows(), t.cols());
  backend_.copy(Tensor::view(zeros_.device(), zeros_.data(), t.rows(), t.cols()), t);
}

Tensor& DeviceExecutor::zeroedGrad(int id) {
  Tensor& g = grads_[static_cast<size_t>(id)];
  char& live = live_[static_cast<size_t>(id)];
  if (!live) {
    setZero(g);
    live = 1;
  }
  return g;
}

Tensor DeviceExecutor::scratchLike(const Tensor& t) {
  return Tensor::view(scratch_.device(), scratch_.data(), t.rows(), t.cols());
}

void DeviceExecutor::backwardChain(const ChainPlan& plan, std::span<const int> nodes, std::span<const Tensor> params) {
  chainIn_.clear();
  chainGrad_.clear();
  chainValConst_.clear();
  for (int operand : plan.inputNodes) {
    chainIn_.push_back(&value(operand, params));
    chainGrad_.push_back(needsGrad_[static_cast<size_t>(operand)] ? &zeroedGrad(operand) : nullptr);
  }
  for (int id : nodes) chainValConst_.push_back(&values_[static_cast<size_t>(id)]);
  backend_.elementwiseBackward(plan.chain, chainIn_, chainValConst_, grads_[static_cast<size_t>(nodes.back())],
                               chainGrad_);
}

// A second term of a gradient is computed apart and added, as the host executor
// does (its sums in the same order).
void DeviceExecutor::backwardSoftmaxCrossEntropy(const FusedStep& step, std::span<const Tensor> params) {
  const Node& softmax = graph_.node(step.nodes[0]);
  const Node& ce = graph_.node(step.nodes[1]);
  const int z = softmax.inputs[0];
  if (!needsGrad_[static_cast<size_t>(z)]) return;
  const Tensor& p = values_[static_cast<size_t>(softmax.id)];
  const Tensor& t = value(ce.inputs[1], params);
  const Tensor& upstream = grads_[static_cast<size_t>(ce.id)];
  addTerm(z, [&](Tensor& dz) { backend_.softmaxCrossEntropyBackward(p, t, upstream, 0.0f, dz); });
}

void DeviceExecutor::backwardMatVec(const Node& n, std::span<const Tensor> params) {
  const int v = n.inputs[1];
  if (!needsGrad_[static_cast<size_t>(v)]) return;
  const Tensor& w = value(n.inputs[0], params);
  const Tensor& upstream = grads_[static_cast<size_t>(n.id)];
  addTerm(v, [&](Tensor& dv) { backend_.gemm(Trans::kYes, Trans::kNo, 1.0f, w, upstream, 0.0f, dv); });
}

// Each operand's term in turn, as the host executor adds them.
void DeviceExecutor::backwardColumnOp(const Node& n, std::span<const Tensor> params) {
  const Tensor& a = value(n.inputs[0], params);
  const Tensor* b = n.inputs.size() > 1 ? &value(n.inputs[1], params) : nullptr;
  const Tensor& out = values_[static_cast<size_t>(n.id)];
  const Tensor& upstream = grads_[static_cast<size_t>(n.id)];
  for (size_t o = 0; o < n.inputs.size(); ++o) {
    const int operand = n.inputs[o];
    if (!needsGrad_[static_cast<size_t>(operand)]) continue;
    addTerm(operand, [&](Tensor& d) {
      backend_.columnOpBackward(n.op, static_cast<int>(o), a, b, out, upstream, d);
    });
  }
}

void DeviceExecutor::backward(std::span<const Tensor> params, const std::function<void(size_t)>& siteReady) {
  std::fill(live_.begin(), live_.end(), 0);
  const int loss = graph_.loss();
  live_[static_cast<size_t>(loss)] = 1;
  // Sites by decreasing product node: a product's readers all have larger ids, so
  // its gradient is final when the loop passes it.
  pendingSites_.clear();
  for (size_t i = 0; i < sites_.size(); ++i) pendingSites_.emplace_back(sites_[i].matvecNode, i);
  std::sort(pendingSites_.begin(), pendingSites_.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  const auto ready = [&](size_t site) {
    const int product = sites_[site].matvecNode;
    if (!live_[static_cast<size_t>(product)]) setZero(grads_[static_cast<size_t>(product)]);  // no term reached it
    if (siteReady) siteReady(site);
  };
  // As GraphExecutor::backward: the nodes after the recurrence first.
  const bool late = !late_.groups.empty();
  if (late) backwardLate(params);
  auto next = pendingSites_.begin();
  for (int id = loss; id >= 0; --id) {
    for (; next != pendingSites_.end() && next->first >= id; ++next) ready(next->second);
    const Node& n = graph_.node(id);
    if (n.kind != NodeKind::kOp || (late && late_.late[static_cast<size_t>(id)])) continue;
    backwardNode(n, params);
  }
  for (; next != pendingSites_.end(); ++next) ready(next->second);
}

void DeviceExecutor::backwardNode(const Node& n, std::span<const Tensor> params) {
  const size_t i = static_cast<size_t>(n.id);
  const int s = stepEnding_[i];
  // An LSTM cell step has two outputs, the cell and the hidden state: it decides itself.
  if (s >= 0 && plan_[static_cast<size_t>(s)].kind == FusedStep::Kind::kLstmCell) {
    backwardLstmCell(plan_[static_cast<size_t>(s)].lstm, params);
    return;
  }
  if (!live_[i]) return;
  if (s >= 0) {
    const FusedStep& step = plan_[static_cast<size_t>(s)];
    if (step.kind == FusedStep::Kind::kSoftmaxCrossEntropy) {
      backwardSoftmaxCrossEntropy(step, params);
    } else {
      backwardChain(chains_[static_cast<size_t>(s)], step.nodes, params);
    }
    return;
  }
  if (inStep_[i]) return;  // handled with its step
  if (n.op == OpKind::kMatVec) {
    backwardMatVec(n, params);
  } else if (n.op == OpKind::kConcat || n.op == OpKind::kSlice) {
    backwardRows(n);
  } else if (isColumnOp(n.op)) {
    backwardColumnOp(n, params);
  } else {
    backwardChain(lone_[i], std::span<const int>(&n.id, 1), params);
  }
}

void DeviceExecutor::optimizeLocals(std::span<const Tensor> params, std::vector<Matrix>* locals) {
  if (locals_.empty()) return;
  // A pass that threw left its copies out queued: they land before locals_ is refilled.
  localsOut_.wait();
  localsAt_.clear();
  ORPHEUS_ENFORCE(locals != nullptr && locals->size() == locals_.size(), "the graph has {} data-dependent variables",
                  locals_.size());
  const auto& ids = graph_.locals();
  for (size_t k = 0; k < locals_.size(); ++k) {
    const Matrix& m = (*locals)[k];
    ORPHEUS_ENFORCE(m.rows() == locals_[k].rows() && m.cols() == locals_[k].cols(),
                    "data-dependent variable '{}' is {}x{}, the batch needs {}x{}", graph_.node(ids[k]).name, m.rows(),
                    m.cols(), locals_[k].rows(), locals_[k].cols());
    // Queued with the batch (prefetch): they are on the device already, the pass ordered after them.
    if (localsTaken_ != nullptr) {
      std::swap(locals_[k], localsTaken_->locals[k]);
    } else {
      backend_.copy(hostView(m), locals_[k]);
    }
  }
  localsTaken_ = nullptr;
  // As GraphExecutor::optimizeLocals: each step a pass, then every variable that
  // still has steps to take moves against its gradient (none when no term reached it).
  int steps = 0;
  for (int id : ids) steps = std::max(steps, graph_.node(id).innerSteps);
  for (int s = 0; s < steps; ++s) {
    forwardValues(params);  // the inner steps need no loss on the host
    backward(params, {});
    for (size_t k = 0; k < locals_.size(); ++k) {
      const Node& n = graph_.node(ids[k]);
      if (s < n.innerSteps && live_[static_cast<size_t>(n.id)]) {
        backend_.axpy(-static_cast<float>(n.innerLr), grads_[static_cast<size_t>(n.id)], locals_[k]);
      }
    }
  }
  size_t bytes = 0;
  for (const Tensor& t : locals_) bytes += static_cast<size_t>(t.size()) * sizeof(float);
  localsOut_.begin(backend_, bytes);
  localsAt_.clear();
  for (const Tensor& t : locals_) localsAt_.push_back(localsOut_.down(t));
}

void DeviceExecutor::landLocals(std::vector<Matrix>* locals) {
  if (localsAt_.empty()) return;
  localsOut_.wait();
  for (size_t k = 0; k < localsAt_.size(); ++k) {
    Matrix& m = (*locals)[k];
    if (m.size() > 0) std::memcpy(m.data(), localsOut_.data(localsAt_[k]), static_cast<size_t>(m.size()) * sizeof(float));
  }
  localsAt_.clear();
}

double DeviceExecutor::run(std::span<const Tensor> params, const Matrix* dense, const SparseMatrix* sparse,
                           const Eigen::VectorXi& labels, const std::function<void(size_t)>& siteReady,
                           std::vector<Matrix>* locals) {
  upload(dense, sparse, labels);
  optimizeLocals(params, locals);
  const double loss = forward(params);
  backward(params, siteReady);
  landLocals(locals);
  return loss;
}

double DeviceExecutor::evaluate(std::span<const Tensor> params, const Matrix* dense, const SparseMatrix* sparse,
                                const Eigen::VectorXi& labels, Matrix* prediction, std::vector<Matrix>* locals) {
  upload(dense, sparse, labels);
  optimizeLocals(params, locals);
  const double loss = forward(params);
  if (prediction != nullptr) {
    const int id = graph_.prediction();
    ORPHEUS_ENFORCE(id >= 0, "the graph has no prediction");
    const Tensor& p = value(id, params);
    prediction->resize(p.rows(), p.cols());
    Tensor out = hostView(*prediction);
    backend_.copy(p, out);
  }
  landLocals(locals);
  return loss;
}

const Tensor& DeviceExecutor::siteU(size_t i) const {
  return grads_[static_cast<size_t>(sites_.at(i).matvecNode)];
}

bool DeviceExecutor::siteVIsInput(size_t i) const { return sites_.at(i).vectorNode == graph_.inputNode(); }

const Tensor* DeviceExecutor::siteVDense(size_t i) const {
  const int v = sites_.at(i).vectorNode;
  if (graph_.node(v).kind == NodeKind::kToken) return nullptr;
  if (graph_.node(v).kind == NodeKind::kLocal) return &locals_[static_cast<size_t>(localOf_[static_cast<size_t>(v)])];
  if (!siteVIsInput(i)) return &values_[static_cast<size_t>(v)];
  return sparseBatch_ ? nullptr : &input_;
}

const SparseTensor* DeviceExecutor::siteVSparse(size_t i) const {
  const int v = sites_.at(i).vectorNode;
  if (graph_.node(v).kind == NodeKind::kToken) return &deviceTokens_[static_cast<size_t>(v)].view;
  return siteVIsInput(i) && sparseBatch_ ? &sparse_.view : nullptr;
}

const SparseMatrix* DeviceExecutor::siteVTokens(size_t i) const {
  const int v = sites_.at(i).vectorNode;
  return graph_.node(v).kind == NodeKind::kToken ? &hostTokens_[static_cast<size_t>(v)] : nullptr;
}

void DeviceExecutor::copyOut(int id, Matrix& out) const {
  const Tensor& t = values_.at(static_cast<size_t>(id));
  out.resize(t.rows(), t.cols());
  Tensor view = hostView(out);
  backend_.copy(t, view);
}

}  // namespace orpheus::ops
