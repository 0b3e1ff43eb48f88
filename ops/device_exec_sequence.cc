// DeviceExecutor's unrolled sequence graphs: token one-hots and carried states in,
// hoisted products, concats and slices as row blocks, fused LSTM cell steps.
#include "engine/base/error.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/device_exec.h"
#include "ops/sequence_layout.h"

#include <algorithm>

namespace orpheus::ops {

namespace {

Tensor hostView(const Matrix& m) { return Tensor::host(m.data(), m.rows(), m.cols()); }

}  // namespace

void DeviceExecutor::planSequence() {
  const size_t n = graph_.nodes().size();
  hoistedAt_.assign(n, -1);
  tokenSparse_.assign(n, false);
  tokenDense_.assign(n, false);
  hostTokens_.resize(n);
  deviceTokens_.resize(n);
  if (graph_.steps() == 0) return;
  hoist_ = hoistPlan(graph_, plan_);
  for (size_t g = 0; g < hoist_.groups.size(); ++g) {
    for (int id : hoist_.groups[g].products) hoistedAt_[static_cast<size_t>(id)] = static_cast<int>(g);
  }
  late_ = latePlan(graph_, plan_);
  for (const Node& node : graph_.nodes()) {
    if (node.kind != NodeKind::kToken) continue;
    for (int u : graph_.consumers(node.id)) {
      const Node& user = graph_.node(u);
      const bool product = user.op == OpKind::kMatVec && user.inputs[1] == node.id;
      (product ? tokenSparse_ : tokenDense_)[static_cast<size_t>(node.id)] = true;
    }
  }
}

void DeviceExecutor::reserveSequence(int64_t batch) {
  if (graph_.steps() == 0) return;
  for (const Node& n : graph_.nodes()) {
    const size_t i = static_cast<size_t>(n.id);
    if (n.kind == NodeKind::kState || (n.kind == NodeKind::kToken && tokenDense_[i])) {
      values_[i] = backend_.allocate(n.rows, batch);
    }
  }
  allInputs_.clear();
  inputPart_.clear();
  for (const HoistPlan::Group& g : hoist_.groups) {
    const int64_t steps = static_cast<int64_t>(g.inputs.size());
    allInputs_.push_back(backend_.allocate(graph_.node(g.inputs[0]).rows, batch * steps));
    inputPart_.push_back(backend_.allocate(graph_.node(g.products[0]).rows, batch * steps));
  }
  lateInputs_.clear();
  lateAll_.clear();
  lateGrads_.clear();
  for (const LatePlan::Group& g : late_.groups) {
    const int64_t steps = static_cast<int64_t>(g.inputs.size());
    const int64_t rows = graph_.node(g.products[0]).rows;
    lateInputs_.push_back(backend_.allocate(graph_.node(g.inputs[0]).rows, batch * steps));
    lateAll_.push_back(backend_.allocate(rows, batch * steps));
    lateGrads_.push_back(backend_.allocate(rows, batch * steps));
    // Each step's product and its gradient are its block of the group's: the GEMM writes
    // the values in place, and the gradients' terms land where the GEMM back reads them.
    for (size_t t = 0; t < g.products.size(); ++t) {
      const size_t product = static_cast<size_t>(g.products[t]);
      values_[product] = lateAll_.back().middleCols(static_cast<int64_t>(t) * batch, batch);
      if (needsGrad_[product]) grads_[product] = lateGrads_.back().middleCols(static_cast<int64_t>(t) * batch, batch);
    }
  }
}

// As GraphExecutor's prepareSequence, with every one-hot and state copied to the device.
void DeviceExecutor::uploadSequence(const Matrix& segments, const std::vector<Matrix>* states) {
  ORPHEUS_ENFORCE(graph_.steps() > 0, "uploadSequence: the graph is not an unrolled sequence model");
  ORPHEUS_CHECK_INPUT(segments.rows() == segmentRows(graph_.steps()),
                      "the model unrolls {} steps, so a segment needs {} rows, but the data has {}", graph_.steps(),
                      segmentRows(graph_.steps()), segments.rows());
  const int64_t b = segments.cols();
  const bool carry = carry_;
  carry_ = false;
  ORPHEUS_ENFORCE(!carry || b == batch_, "carried states of {} examples for a batch of {}", batch_, b);
  reserve(b);
  sparseBatch_ = false;
  // The one-hots prefetchSequence copied ahead, or built and copied in now.
  const bool queued = takePrefetchedSequence(segments);
  for (const Node& n : graph_.nodes()) {
    const size_t i = static_cast<size_t>(n.id);
    if (queued || n.kind != NodeKind::kToken) continue;
    SparseMatrix& m = hostTokens_[i];
    buildTokens(segments, n, m);
    if (tokenSparse_[i]) backend_.copySparse(cpu::view(m), deviceTokens_[i]);
    if (tokenDense_[i]) {
      hostStep_ = m;
      backend_.copy(hostView(hostStep_), values_[i]);
    }
  }
  const auto& ids = graph_.states();
  if (carry) {
    for (size_t k = 0; k < ids.size(); ++k) {
      backend_.copy(values_[static_cast<size_t>(graph_.finalStates()[k])], values_[static_cast<size_t>(ids[k])]);
    }
    return;
  }
  ORPHEUS_ENFORCE(states == nullptr || states->size() == ids.size(), "the graph has {} states, got {}", ids.size(),
                  states ? states->size() : 0);
  for (size_t k = 0; k < ids.size(); ++k) {
    const Node& n = graph_.node(ids[k]);
    if (states == nullptr) hostStep_.setZero(n.rows, b);
    const Matrix& given = states ? (*states)[k] : hostStep_;
    ORPHEUS_ENFORCE(given.rows() == n.rows && given.cols() == b, "state '{}' is {}x{}, expected {}x{}", n.name,
                    given.rows(), given.cols(), n.rows, b);
    backend_.copy(hostView(given), values_[static_cast<size_t>(n.id)]);
  }
}

void DeviceExecutor::buildTokens(const Matrix& segments, const Node& n, SparseMatrix& m) const {
  const int64_t b = segments.cols();
  m.resize(n.rows, b);
  m.reserve(Eigen::VectorXi::Constant(b, 1));
  for (int64_t j = 0; j < b; ++j) {
    const float value = segments(kSegmentTokenRow + n.step + n.tokenOffset, j);
    const auto id = static_cast<int64_t>(value);
    ORPHEUS_CHECK_INPUT(static_cast<float>(id) == value && id >= 0 && id < n.rows,
                        "token {} out of range: the vocabulary has {} words", value, n.rows);
    m.insert(id, j) = 1.0f;
  }
  m.makeCompressed();
}

double DeviceExecutor::runSequence(std::span<const Tensor> params, const Matrix& segments,
                                   const std::vector<Matrix>* states, const std::function<void(size_t)>& siteReady) {
  uploadSequence(segments, states);
  const double loss = forward(params);
  backward(params, siteReady);
  return loss;
}

double DeviceExecutor::evaluateSequence(std::span<const Tensor> params, const Matrix& segments,
                                        const std::vector<Matrix>* states) {
  uploadSequence(segments, states);
  return forward(params);
}

// As GraphExecutor::forwardHoisted: the early nodes, then per matrix its first
// columns times every step's a_t, one GEMM over [a_0 ... a_{T-1}].
void DeviceExecutor::forwardHoisted(std::span<const Tensor> params) {
  for (const Node& n : graph_.nodes()) {
    if (n.kind == NodeKind::kOp && hoist_.early[static_cast<size_t>(n.id)]) forwardNode(n, params);
  }
  for (size_t g = 0; g < hoist_.groups.size(); ++g) {
    const HoistPlan::Group& h = hoist_.groups[g];
    Tensor& all = allInputs_[g];
    const int64_t b = batch_;
    for (size_t t = 0; t < h.inputs.size(); ++t) {
      Tensor block = all.middleCols(static_cast<int64_t>(t) * b, b);
      backend_.copy(values_[static_cast<size_t>(h.inputs[t])], block);
    }
    const Tensor& w = params[static_cast<size_t>(h.param)];
    backend_.gemm(Trans::kNo, Trans::kNo, 1.0f, w.middleCols(0, all.rows()), all, 0.0f, inputPart_[g]);
  }
}

// As GraphExecutor::forwardLate: per late group one GEMM over every step's b_t (its
// products' values are the blocks of its output), then the other late nodes in node order.
void DeviceExecutor::forwardLate(std::span<const Tensor> params) {
  const int64_t b = batch_;
  for (size_t g = 0; g < late_.groups.size(); ++g) {
    const LatePlan::Group& l = late_.groups[g];
    for (size_t t = 0; t < l.inputs.size(); ++t) {
      Tensor block = lateInputs_[g].middleCols(static_cast<int64_t>(t) * b, b);
      backend_.copy(values_[static_cast<size_t>(l.inputs[t])], block);
    }
    backend_.gemm(Trans::kNo, Trans::kNo, 1.0f, params[static_cast<size_t>(l.param)], lateInputs_[g], 0.0f,
                  lateAll_[g]);
  }
  for (const Node& n : graph_.nodes()) {
    const size_t i = static_cast<size_t>(n.id);
    if (late_.late[i] && late_.groupOf[i] < 0) forwardNode(n, params);
  }
}

// As GraphExecutor::backwardLate: the late nodes but the products, in reverse node
// order; then per group W^T times every step's product gradient (zeros where no term
// reached it) as one GEMM, each step's block a term of its b_t.
void DeviceExecutor::backwardLate(std::span<const Tensor> params) {
  for (int id = graph_.loss(); id >= 0; --id) {
    const size_t i = static_cast<size_t>(id);
    if (late_.late[i] && late_.groupOf[i] < 0) backwardNode(graph_.node(id), params);
  }
  const int64_t b = batch_;
  for (size_t g = 0; g < late_.groups.size(); ++g) {
    const LatePlan::Group& l = late_.groups[g];
    if (std::none_of(l.inputs.begin(), l.inputs.end(), [&](int v) { return needsGrad_[static_cast<size_t>(v)]; })) {
      continue;
    }
    // The blocks no term reached are zeros, as there.
    for (size_t t = 0; t < l.products.size(); ++t) {
      const int product = l.products[t];
      if (needsGrad_[static_cast<size_t>(product)]) {
        zeroedGrad(product);
      } else {
        Tensor block = lateGrads_[g].middleCols(static_cast<int64_t>(t) * b, b);
        setZero(block);
      }
    }
    backend_.gemm(Trans::kYes, Trans::kNo, 1.0f, params[static_cast<size_t>(l.param)], lateGrads_[g], 0.0f,
                  lateInputs_[g]);
    for (size_t t = 0; t < l.inputs.size(); ++t) {
      const int operand = l.inputs[t];
      if (!needsGrad_[static_cast<size_t>(operand)]) continue;
      addTerm(operand, [&](Tensor& d) {
        backend_.copy(lateInputs_[g].middleCols(static_cast<int64_t>(t) * b, b), d);
      });
    }
  }
}

const SparseTensor* DeviceExecutor::sparseOperand(const Node& n) const {
  const int v = n.inputs[1];
  if (graph_.node(v).kind == NodeKind::kToken) return &deviceTokens_[static_cast<size_t>(v)].view;
  if (v == graph_.inputNode() && sparseBatch_) return &sparse_.view;
  return nullptr;
}

// W v; a hoisted product is its step's block of the input part plus W's other
// columns times the recurrent part (beta 1: GraphExecutor's `+=`).
void DeviceExecutor::forwardProduct(const Node& n, std::span<const Tensor> params) {
  Tensor& out = values_[static_cast<size_t>(n.id)];
  const Tensor& w = value(n.inputs[0], params);
  const int g = hoistedAt_[static_cast<size_t>(n.id)];
  if (g >= 0) {
    const HoistPlan::Group& h = hoist_.groups[static_cast<size_t>(g)];
    const auto t = static_cast<int64_t>(std::find(h.products.begin(), h.products.end(), n.id) - h.products.begin());
    backend_.copy(inputPart_[static_cast<size_t>(g)].middleCols(t * batch_, batch_), out);
    const Node& concat = graph_.node(n.inputs[1]);
    const int64_t inputRows = graph_.node(concat.inputs[0]).rows;
    backend_.gemm(Trans::kNo, Trans::kNo, 1.0f, w.middleCols(inputRows, w.cols() - inputRows),
                  value(concat.inputs[1], params), 1.0f, out);
    return;
  }
  if (const SparseTensor* s = sparseOperand(n)) {
    backend_.gemmSparse(1.0f, w, *s, Trans::kNo, 0.0f, out);
  } else {
    backend_.gemm(Trans::kNo, Trans::kNo, 1.0f, w, value(n.inputs[1], params), 0.0f, out);
  }
}

void DeviceExecutor::forwardRows(const Node& n, std::span<const Tensor> params) {
  Tensor& out = values_[static_cast<size_t>(n.id)];
  const Tensor& a = value(n.inputs[0], params);
  if (n.op == OpKind::kSlice) {
    backend_.copyRows(a, static_cast<int64_t>(n.attr), out, 0, n.rows);
    return;
  }
  backend_.copyRows(a, 0, out, 0, a.rows());
  const Tensor& b = value(n.inputs[1], params);
  backend_.copyRows(b, 0, out, a.rows(), b.rows());
}

// As GraphExecutor's backward of a concat (each operand's rows of the gradient)
// and a slice (zeros but for the sliced rows).
void DeviceExecutor::backwardRows(const Node& n) {
  const Tensor& g = grads_[static_cast<size_t>(n.id)];
  if (n.op == OpKind::kSlice) {
    const int a = n.inputs[0];
    if (!needsGrad_[static_cast<size_t>(a)]) return;
    addTerm(a, [&](Tensor& da) {
      setZero(da);
      backend_.copyRows(g, 0, da, static_cast<int64_t>(n.attr), n.rows);
    });
    return;
  }
  int64_t first = 0;
  for (int operand : n.inputs) {
    const int64_t rows = graph_.node(operand).rows;
    if (needsGrad_[static_cast<size_t>(operand)]) {
      addTerm(operand, [&](Tensor& d) { backend_.copyRows(g, first, d, 0, rows); });
    }
    first += rows;
  }
}

// The cell's operands: its gate block and previous cell state, and the values of
// its outputs (written forward, read backward).
LstmCellArgs DeviceExecutor::cellArgs(const LstmCellRoles& roles, std::span<const Tensor> params) {
  LstmCellArgs a;
  a.gates = &value(roles.gates, params);
  a.cPrev = &value(roles.cPrev, params);
  for (size_t k = 0; k < 4; ++k) {
    a.offset[k] = roles.offset[k];
    a.act[k] = &values_[static_cast<size_t>(roles.act[k])];
  }
  a.cell = &values_[static_cast<size_t>(roles.cell)];
  a.tanhCell = &values_[static_cast<size_t>(roles.tanhCell)];
  a.hidden = &values_[static_cast<size_t>(roles.hidden)];
  return a;
}

void DeviceExecutor::forwardLstmCell(const LstmCellRoles& roles, std::span<const Tensor> params) {
  backend_.lstmCellForward(cellArgs(roles, params));
}

// As GraphExecutor::backwardLstmCell: nothing without a gradient of the hidden
// state or the cell; operands needing gradients get zeroed buffers first.
void DeviceExecutor::backwardLstmCell(const LstmCellRoles& roles, std::span<const Tensor> params) {
  const bool dHidden = live_[static_cast<size_t>(roles.hidden)] != 0;
  const bool dCell = live_[static_cast<size_t>(roles.cell)] != 0;
  if (!dHidden && !dCell) return;
  if (!needsGrad_[static_cast<size_t>(roles.gates)]) return;
  const LstmCellArgs a = cellArgs(roles, params);
  Tensor& dGates = zeroedGrad(roles.gates);
  Tensor* dCPrev = needsGrad_[static_cast<size_t>(roles.cPrev)] ? &zeroedGrad(roles.cPrev) : nullptr;
  backend_.lstmCellBackward(a, dHidden ? &grads_[static_cast<size_t>(roles.hidden)] : nullptr,
                            dCell ? &grads_[static_cast<size_t>(roles.cell)] : nullptr, dGates, dCPrev);
}

}  // namespace orpheus::ops
