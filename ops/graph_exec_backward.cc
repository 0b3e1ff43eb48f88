// The executor's backward pass: gradients node by node from the loss down (fused
// steps and LSTM cells as one), the local variables' inner optimisation and the
// dense parameter gradients the SV sites are checked against.
#include "ops/graph_exec.h"

#include "engine/base/error.h"
#include "ops/lstm_cell.h"

#include <algorithm>

namespace orpheus::ops {

template <typename S>
void GraphExecutor<S>::backwardLstmCell(const LstmCellRoles& roles, const std::vector<const Mat<S>*>& params,
                                        const GraphInputs<S>& in) {
  const Mat<S>& dHidden = grad(roles.hidden);
  const Mat<S>& dCell = grad(roles.cell);
  if (dHidden.size() == 0 && dCell.size() == 0) return;
  LstmCellBuffers<S> b = lstmBuffers(roles, params, in);
  for (int k = 0; k < 4; ++k) b.act[k] = values_[static_cast<size_t>(roles.act[k])].data();
  b.tanhCell = values_[static_cast<size_t>(roles.tanhCell)].data();
  // Operands outside the step that need gradients get zero-initialised buffers.
  const auto gradOf = [&](int node) -> S* {
    if (!needsGrad_[static_cast<size_t>(node)]) return nullptr;
    return zeroedGrad(node, graph_.node(node).rows, b.cols).data();
  };
  S* dGates = gradOf(roles.gates);
  if (dGates == nullptr) return;
  lstmCellBackward(b, dHidden.size() ? dHidden.data() : nullptr, dCell.size() ? dCell.data() : nullptr, dGates,
                   gradOf(roles.cPrev));
}

template <typename S>
void GraphExecutor<S>::backwardFused(const FusedStep& step, const std::vector<const Mat<S>*>& params,
                                     const GraphInputs<S>& in) {
  if (step.kind == FusedStep::Kind::kLstmCell) {
    backwardLstmCell(step.lstm, params, in);
    return;
  }
  const int last = step.nodes.back();
  const Mat<S>& upstream = grad(last);
  if (upstream.size() == 0) return;
  if (step.kind == FusedStep::Kind::kSoftmaxCrossEntropy) {
    // d/dz [-sum_i t_i log softmax(z)_i] = softmax(z) * sum(t) - t, scaled per column.
    const Node& softmax = graph_.node(step.nodes[0]);
    const Node& ce = graph_.node(last);
    const int z = softmax.inputs[0];
    if (!needsGrad_[static_cast<size_t>(z)]) return;
    const Mat<S>& p = values_[static_cast<size_t>(softmax.id)];
    const Mat<S>& t = *operandValue(ce.inputs[1], params, in);
    const Eigen::Array<S, 1, Eigen::Dynamic> g = upstream.row(0).array();
    const Eigen::Array<S, 1, Eigen::Dynamic> mass = t.colwise().sum().array() * g;
    // The first term straight into z's buffer, a later one through scratch_ (as accumulate).
    const bool first = !live_[static_cast<size_t>(z)];
    Mat<S>& dst = first ? grads_[static_cast<size_t>(z)] : scratch_;
    dst = (p.array().rowwise() * mass - t.array().rowwise() * g).matrix();
    if (first) {
      live_[static_cast<size_t>(z)] = 1;
    } else {
      grads_[static_cast<size_t>(z)] += scratch_;
    }
    return;
  }
  const int64_t cols = upstream.cols();
  const ChainPlan& plan = chains_[static_cast<size_t>(stepEnding_[static_cast<size_t>(last)])];
  std::vector<const Mat<S>*>& inputs = stepInputs_;
  std::vector<Mat<S>*>& inputGrads = stepGrads_;
  inputs.clear();
  inputGrads.clear();
  for (int operand : plan.inputNodes) {
    inputs.push_back(operandValue(operand, params, in));
    if (!needsGrad_[static_cast<size_t>(operand)]) {
      inputGrads.push_back(nullptr);
      continue;
    }
    // Operands outside the chain that need gradients get zero-initialised buffers.
    inputGrads.push_back(&zeroedGrad(operand, graph_.node(operand).rows, cols));
  }
  std::vector<Mat<S>*>& values = stepValues_;
  values.clear();
  for (int id : step.nodes) values.push_back(&values_[static_cast<size_t>(id)]);
  runChain(plan, inputs, values, &upstream, inputGrads);
}

template <typename S>
void GraphExecutor<S>::backward(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in,
                                const SiteReadyFn& siteReady) {
  std::fill(live_.begin(), live_.end(), 0);
  const int loss = graph_.loss();
  grads_[static_cast<size_t>(loss)].setOnes(1, in.batch());
  live_[static_cast<size_t>(loss)] = 1;
  // Sites by decreasing matvec node: a product's readers all have larger ids, so
  // its gradient is final when the loop reaches it.
  std::vector<std::pair<int, size_t>>& pending = pendingSites_;
  pending.clear();
  if (siteReady) {
    for (size_t i = 0; i < sites_.size(); ++i) pending.emplace_back(sites_[i].matvecNode, i);
    std::sort(pending.begin(), pending.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
  }
  // The nodes after the recurrence first: they read its states, nothing in it reads them.
  const bool late = !late_.groups.empty();
  if (late) backwardLate(params, in);
  auto next = pending.begin();
  for (int id = loss; id >= 0; --id) {
    for (; next != pending.end() && next->first >= id; ++next) siteReady(next->second);
    const Node& n = graph_.node(id);
    if (n.kind != NodeKind::kOp || (late && late_.late[static_cast<size_t>(id)])) continue;
    backwardNode(n, params, in);
  }
  for (; next != pending.end(); ++next) siteReady(next->second);
}

template <typename S>
void GraphExecutor<S>::backwardNode(const Node& n, const std::vector<const Mat<S>*>& params,
                                    const GraphInputs<S>& in) {
  const size_t id = static_cast<size_t>(n.id);
  // A fused step decides itself whether it has gradients to pass on: an LSTM cell
  // has two outputs, the cell and the hidden state.
  const int s = stepEnding_[id];
  if (s >= 0) {
    backwardFused(plan_[static_cast<size_t>(s)], params, in);
    return;
  }
  if (!live_[id]) return;
  if (inStep_[id]) return;  // handled with its step
  const Operands<S> operandsOfNode = operands(n, params, in);
  for (size_t o = 0; o < n.inputs.size(); ++o) {
    const int operand = n.inputs[o];
    if (!needsGrad_[static_cast<size_t>(operand)]) continue;
    if (n.op == OpKind::kMatVec && o == 0) continue;  // the matrix: its SVs are (grad, v)
    // The first term straight into the operand's buffer, later ones through scratch_.
    const bool first = !live_[static_cast<size_t>(operand)];
    Mat<S>& dst = first ? grads_[static_cast<size_t>(operand)] : scratch_;
    ops::backwardInto<S>(n.op, static_cast<int>(o), operandsOfNode, values_[id], grads_[id], dst);
    if (first) {
      live_[static_cast<size_t>(operand)] = 1;
    } else {
      grads_[static_cast<size_t>(operand)] += scratch_;
    }
  }
}

// The late nodes' backward, in reverse node order, but for the late products' vector
// operands: those of each group as one GEMM W^T * [g_0 ... g_{T-1}] (a product no term
// reached counts as zeros), each step's block then added as a term of its b_t.
template <typename S>
void GraphExecutor<S>::backwardLate(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in) {
  for (int id = graph_.loss(); id >= 0; --id) {
    const size_t i = static_cast<size_t>(id);
    if (late_.late[i] && late_.groupOf[i] < 0) backwardNode(graph_.node(id), params, in);
  }
  for (size_t g = 0; g < late_.groups.size(); ++g) {
    const LatePlan::Group& l = late_.groups[g];
    if (std::none_of(l.inputs.begin(), l.inputs.end(), [&](int v) { return needsGrad_[static_cast<size_t>(v)]; })) continue;
    const Mat<S>& w = *params[static_cast<size_t>(l.param)];
    const Eigen::Index b = in.batch();
    Mat<S>& upstream = lateAll_[g];
    upstream.resize(w.rows(), b * static_cast<Eigen::Index>(l.products.size()));
    for (size_t t = 0; t < l.products.size(); ++t) {
      const size_t product = static_cast<size_t>(l.products[t]);
      auto block = upstream.middleCols(static_cast<Eigen::Index>(t) * b, b);
      if (live_[product]) {
        block = grads_[product];
      } else {
        block.setZero();
      }
    }
    Mat<S>& down = lateInputs_[g];
    down.resize(w.cols(), upstream.cols());
    down.noalias() = w.transpose() * upstream;
    for (size_t t = 0; t < l.inputs.size(); ++t) {
      const int operand = l.inputs[t];
      if (!needsGrad_[static_cast<size_t>(operand)]) continue;
      scratch_ = down.middleCols(static_cast<Eigen::Index>(t) * b, b);
      accumulate(operand, scratch_);
    }
  }
}

template <typename S>
void GraphExecutor<S>::optimizeLocals(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in) {
  const auto& locals = graph_.locals();
  int steps = 0;
  for (int id : locals) steps = std::max(steps, graph_.node(id).innerSteps);
  // The inner passes all read one batch: its dense copy (if sparse) is made once.
  denseInputOf_ = nullptr;
  holdDenseInput_ = true;
  struct Release {
    bool& hold;
    ~Release() { hold = false; }
  } release{holdDenseInput_};
  for (int s = 0; s < steps; ++s) {
    forward(params, in);
    backward(params, in);
    for (size_t k = 0; k < locals.size(); ++k) {
      const Node& n = graph_.node(locals[k]);
      const Mat<S>& g = grad(n.id);
      if (s < n.innerSteps && g.size() > 0) (*in.locals)[k] -= static_cast<S>(n.innerLr) * g;
    }
  }
}

template <typename S>
std::vector<Mat<S>> GraphExecutor<S>::paramGradients(const std::vector<const Mat<S>*>& params,
                                                     const GraphInputs<S>& in) const {
  std::vector<Mat<S>> grads;
  for (const Mat<S>* p : params) grads.push_back(Mat<S>::Zero(p->rows(), p->cols()));
  for (const SvSite& site : sites_) {
    const Mat<S>& u = grad(site.matvecNode);
    if (u.size() == 0) continue;
    const Node& v = graph_.node(site.vectorNode);
    if (v.kind == NodeKind::kToken) {
      grads[static_cast<size_t>(site.param)] += u * tokenSparse_[static_cast<size_t>(v.id)].transpose();
    } else if (v.kind == NodeKind::kInput && in.sparse) {
      grads[static_cast<size_t>(site.param)] += u * in.sparse->transpose();
    } else if (v.kind == NodeKind::kInput) {
      grads[static_cast<size_t>(site.param)] += u * in.dense->transpose();
    } else {
      const Mat<S>& vv = v.kind == NodeKind::kLocal
                             ? (*in.locals)[static_cast<size_t>(
                                   std::find(graph_.locals().begin(), graph_.locals().end(), v.id) -
                                   graph_.locals().begin())]
                             : values_[static_cast<size_t>(site.vectorNode)];
      grads[static_cast<size_t>(site.param)] += u * vv.transpose();
    }
    if (site.bias >= 0) grads[static_cast<size_t>(site.bias)].col(0) += u.rowwise().sum();
  }
  return grads;
}

// graph_exec.cc instantiates the class; these are the public members defined here.
template void GraphExecutor<float>::backward(const std::vector<const Mat<float>*>&, const GraphInputs<float>&,
                                             const SiteReadyFn&);
template void GraphExecutor<float>::optimizeLocals(const std::vector<const Mat<float>*>&, const GraphInputs<float>&);
template std::vector<Mat<float>> GraphExecutor<float>::paramGradients(const std::vector<const Mat<float>*>&,
                                                                       const GraphInputs<float>&) const;
template void GraphExecutor<double>::backward(const std::vector<const Mat<double>*>&, const GraphInputs<double>&,
                                              const SiteReadyFn&);
template void GraphExecutor<double>::optimizeLocals(const std::vector<const Mat<double>*>&,
                                                    const GraphInputs<double>&);
template std::vector<Mat<double>> GraphExecutor<double>::paramGradients(const std::vector<const Mat<double>*>&,
                                                                         const GraphInputs<double>&) const;

}  // namespace orpheus::ops
