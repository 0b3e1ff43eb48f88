#include "ops/graph_exec.h"

#include "engine/base/error.h"

#include <algorithm>
#include <cmath>

namespace orpheus::ops {

template <typename S>
int64_t GraphInputs<S>::batch() const {
  if (dense) return dense->cols();
  if (sparse) return sparse->cols();
  if (labels) return labels->size();
  return locals && !locals->empty() ? locals->front().cols() : 0;
}

template <typename S>
GraphExecutor<S>::GraphExecutor(const Graph& graph, bool fuse) : graph_(graph) {
  sites_ = graph.identifySvs();
  if (fuse) plan_ = graph.fusionPlan();
  const size_t n = graph.nodes().size();
  stepEnding_.assign(n, -1);
  inStep_.assign(n, false);
  for (size_t s = 0; s < plan_.size(); ++s) {
    stepEnding_[static_cast<size_t>(plan_[s].nodes.back())] = static_cast<int>(s);
    for (int id : plan_[s].nodes) inStep_[static_cast<size_t>(id)] = true;
  }
  // A node needs a gradient when the loss depends on it and it depends on a
  // parameter or a data-dependent variable.
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
  needsGrad_.assign(n, false);
  for (const Node& node : graph.nodes()) {
    const size_t i = static_cast<size_t>(node.id);
    needsGrad_[i] = feedsLoss[i] && variable[i] && node.kind != NodeKind::kParam;
  }
  values_.resize(n);
  grads_.resize(n);
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
      return &values_[static_cast<size_t>(id)];
  }
  return nullptr;
}

template <typename S>
Operands<S> GraphExecutor<S>::operands(const Node& n, const std::vector<const Mat<S>*>& params,
                                       const GraphInputs<S>& in) {
  Operands<S> result;
  result.attr = static_cast<S>(n.attr);
  result.a = operandValue(n.inputs[0], params, in);
  if (n.inputs.size() > 1) {
    const Node& b = graph_.node(n.inputs[1]);
    if (n.op == OpKind::kMatVec && b.kind == NodeKind::kInput && in.sparse) {
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

namespace {

template <typename S>
S unaryForward(OpKind op, S x, S attr) {
  switch (op) {
    case OpKind::kSigmoid: return S(1) / (S(1) + std::exp(-x));
    case OpKind::kTanh: return std::tanh(x);
    case OpKind::kRelu: return x > S(0) ? x : S(0);
    case OpKind::kExp: return std::exp(x);
    case OpKind::kLog: return std::log(x);
    case OpKind::kScale: return attr * x;
    default: return x;
  }
}

template <typename S>
S binaryForward(OpKind op, S a, S b) {
  switch (op) {
    case OpKind::kAdd: return a + b;
    case OpKind::kSubtract: return a - b;
    default: return a * b;
  }
}

// d out / d x of a unary elementwise operator, from its input x and output y.
template <typename S>
S unaryDerivative(OpKind op, S x, S y, S attr) {
  switch (op) {
    case OpKind::kSigmoid: return y * (S(1) - y);
    case OpKind::kTanh: return S(1) - y * y;
    case OpKind::kRelu: return x > S(0) ? S(1) : S(0);
    case OpKind::kExp: return y;
    case OpKind::kLog: return S(1) / x;
    case OpKind::kScale: return attr;
    default: return S(1);
  }
}

}  // namespace

template <typename S>
void GraphExecutor<S>::forwardFused(const FusedStep& step, const std::vector<const Mat<S>*>& params,
                                    const GraphInputs<S>& in) {
  if (step.kind == FusedStep::Kind::kSoftmaxCrossEntropy) {
    for (int id : step.nodes) {
      const Node& n = graph_.node(id);
      values_[static_cast<size_t>(id)] = ops::forward<S>(n.op, operands(n, params, in));
    }
    return;
  }
  // One pass: every element of the chain's inputs is read once and each node's
  // value written once (they are kept for the backward pass).
  const size_t len = step.nodes.size();
  std::vector<const Node*> nodes(len);
  std::vector<std::array<const Mat<S>*, 2>> ext(len, {nullptr, nullptr});
  std::vector<std::array<int, 2>> prev(len, {-1, -1});  // position in the chain of an operand, or -1
  const int64_t rows = graph_.node(step.nodes.back()).rows;
  const int64_t cols = in.batch();
  for (size_t k = 0; k < len; ++k) {
    nodes[k] = &graph_.node(step.nodes[k]);
    for (size_t o = 0; o < nodes[k]->inputs.size(); ++o) {
      const int operand = nodes[k]->inputs[o];
      const auto it = std::find(step.nodes.begin(), step.nodes.begin() + static_cast<long>(k), operand);
      if (it != step.nodes.begin() + static_cast<long>(k)) {
        prev[k][o] = static_cast<int>(it - step.nodes.begin());
      } else {
        ext[k][o] = operandValue(operand, params, in);
      }
    }
    values_[static_cast<size_t>(step.nodes[k])].resize(rows, cols);
  }
  std::vector<S> reg(len);
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t i = 0; i < rows; ++i) {
      for (size_t k = 0; k < len; ++k) {
        const auto operand = [&](size_t o) -> S {
          if (prev[k][o] >= 0) return reg[static_cast<size_t>(prev[k][o])];
          const Mat<S>& m = *ext[k][o];
          return m.cols() == 1 ? m(i, 0) : m(i, j);
        };
        const Node& n = *nodes[k];
        reg[k] = n.inputs.size() == 1 ? unaryForward<S>(n.op, operand(0), static_cast<S>(n.attr))
                                      : binaryForward<S>(n.op, operand(0), operand(1));
        values_[static_cast<size_t>(n.id)](i, j) = reg[k];
      }
    }
  }
}

template <typename S>
S GraphExecutor<S>::forward(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in) {
  ORPHEUS_ENFORCE(params.size() == graph_.params().size(), "graph has {} parameters, got {}", graph_.params().size(),
                  params.size());
  for (const Node& n : graph_.nodes()) {
    if (n.kind != NodeKind::kOp) continue;
    // A fused step runs where its last node stands: by then every operand from
    // outside the step has been computed.
    const int s = stepEnding_[static_cast<size_t>(n.id)];
    if (s >= 0) {
      forwardFused(plan_[static_cast<size_t>(s)], params, in);
      continue;
    }
    if (inStep_[static_cast<size_t>(n.id)]) continue;
    values_[static_cast<size_t>(n.id)] = ops::forward<S>(n.op, operands(n, params, in));
  }
  ORPHEUS_ENFORCE(graph_.loss() >= 0, "the graph has no loss");
  return values_[static_cast<size_t>(graph_.loss())].sum();
}

template <typename S>
void GraphExecutor<S>::accumulate(int id, const Mat<S>& g) {
  Mat<S>& target = grads_[static_cast<size_t>(id)];
  if (target.size() == 0) {
    target = g;
  } else {
    target += g;
  }
}

template <typename S>
void GraphExecutor<S>::backwardFused(const FusedStep& step, const std::vector<const Mat<S>*>& params,
                                     const GraphInputs<S>& in) {
  const int last = step.nodes.back();
  const Mat<S>& upstream = grads_[static_cast<size_t>(last)];
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
    Mat<S> dz = (p.array().rowwise() * mass - t.array().rowwise() * g).matrix();
    accumulate(z, dz);
    return;
  }
  const size_t len = step.nodes.size();
  const int64_t rows = upstream.rows();
  const int64_t cols = upstream.cols();
  // Operands outside the chain that need gradients get zero-initialised buffers.
  for (int id : step.nodes) {
    for (int operand : graph_.node(id).inputs) {
      if (inStep_[static_cast<size_t>(operand)] &&
          std::find(step.nodes.begin(), step.nodes.end(), operand) != step.nodes.end()) {
        continue;
      }
      if (needsGrad_[static_cast<size_t>(operand)] && grads_[static_cast<size_t>(operand)].size() == 0) {
        grads_[static_cast<size_t>(operand)] = Mat<S>::Zero(graph_.node(operand).rows, cols);
      }
    }
  }
  std::vector<std::array<int, 2>> prev(len, {-1, -1});
  std::vector<std::array<const Mat<S>*, 2>> ext(len, {nullptr, nullptr});
  for (size_t k = 0; k < len; ++k) {
    const Node& n = graph_.node(step.nodes[k]);
    for (size_t o = 0; o < n.inputs.size(); ++o) {
      const auto it = std::find(step.nodes.begin(), step.nodes.end(), n.inputs[o]);
      if (it != step.nodes.end()) {
        prev[k][o] = static_cast<int>(it - step.nodes.begin());
      } else {
        ext[k][o] = operandValue(n.inputs[o], params, in);
      }
    }
  }
  std::vector<S> g(len);
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t i = 0; i < rows; ++i) {
      std::fill(g.begin(), g.end(), S(0));
      g[len - 1] = upstream(i, j);
      for (size_t k = len; k-- > 0;) {
        const Node& n = graph_.node(step.nodes[k]);
        const auto operand = [&](size_t o) -> S {
          if (prev[k][o] >= 0) return values_[static_cast<size_t>(step.nodes[static_cast<size_t>(prev[k][o])])](i, j);
          const Mat<S>& m = *ext[k][o];
          return m.cols() == 1 && cols != 1 ? m(i, 0) : m(i, j);
        };
        const auto send = [&](size_t o, S d) {
          if (prev[k][o] >= 0) {
            g[static_cast<size_t>(prev[k][o])] += d;
          } else if (needsGrad_[static_cast<size_t>(n.inputs[o])]) {
            grads_[static_cast<size_t>(n.inputs[o])](i, j) += d;
          }
        };
        const S gk = g[k];
        if (n.inputs.size() == 1) {
          const S y = values_[static_cast<size_t>(n.id)](i, j);
          send(0, gk * unaryDerivative<S>(n.op, operand(0), y, static_cast<S>(n.attr)));
        } else if (n.op == OpKind::kAdd) {
          send(0, gk);
          send(1, gk);
        } else if (n.op == OpKind::kSubtract) {
          send(0, gk);
          send(1, -gk);
        } else {
          const S a = operand(0);
          const S b = operand(1);
          send(0, gk * b);
          send(1, gk * a);
        }
      }
    }
  }
}

template <typename S>
void GraphExecutor<S>::backward(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in) {
  for (auto& g : grads_) g.resize(0, 0);
  const int loss = graph_.loss();
  grads_[static_cast<size_t>(loss)] = Mat<S>::Ones(1, in.batch());
  for (int id = loss; id >= 0; --id) {
    const Node& n = graph_.node(id);
    if (n.kind != NodeKind::kOp || grads_[static_cast<size_t>(id)].size() == 0) continue;
    const int s = stepEnding_[static_cast<size_t>(id)];
    if (s >= 0) {
      backwardFused(plan_[static_cast<size_t>(s)], params, in);
      continue;
    }
    if (inStep_[static_cast<size_t>(id)]) continue;  // handled with its step
    const Operands<S> operandsOfNode = operands(n, params, in);
    for (size_t o = 0; o < n.inputs.size(); ++o) {
      const int operand = n.inputs[o];
      if (!needsGrad_[static_cast<size_t>(operand)]) continue;
      if (n.op == OpKind::kMatVec && o == 0) continue;  // the matrix: its SVs are (grad, v)
      Mat<S> g = ops::backward<S>(n.op, static_cast<int>(o), operandsOfNode, values_[static_cast<size_t>(id)],
                             grads_[static_cast<size_t>(id)]);
      accumulate(operand, g);
    }
  }
}

template <typename S>
void GraphExecutor<S>::optimizeLocals(const std::vector<const Mat<S>*>& params, const GraphInputs<S>& in) {
  const auto& locals = graph_.locals();
  int steps = 0;
  for (int id : locals) steps = std::max(steps, graph_.node(id).innerSteps);
  for (int s = 0; s < steps; ++s) {
    forward(params, in);
    backward(params, in);
    for (size_t k = 0; k < locals.size(); ++k) {
      const Node& n = graph_.node(locals[k]);
      const Mat<S>& g = grads_[static_cast<size_t>(n.id)];
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
    const Mat<S>& u = grads_[static_cast<size_t>(site.matvecNode)];
    if (u.size() == 0) continue;
    const Node& v = graph_.node(site.vectorNode);
    if (v.kind == NodeKind::kInput && in.sparse) {
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

template struct GraphInputs<float>;
template struct GraphInputs<double>;
template class GraphExecutor<float>;
template class GraphExecutor<double>;

}  // namespace orpheus::ops
