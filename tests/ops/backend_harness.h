// Runs each backend operation on host matrices: inputs are copied to the backend's
// device, the operation runs there, results come back. The same runners feed the
// CPU-against-float64 tests and the CUDA-against-CPU tests.
#pragma once

#include "ops/backend.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/operators.h"

#include <Eigen/Dense>
#include <Eigen/SparseCore>

#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

namespace orpheus::ops::test {

using MatF = Eigen::MatrixXf;
using MatD = Eigen::MatrixXd;
using SparseF = Eigen::SparseMatrix<float, Eigen::ColMajor, int32_t>;
using SparseRowF = Eigen::SparseMatrix<float, Eigen::RowMajor, int32_t>;

// Shapes worth trying: single elements, batch 1, single rows, odd sizes, one
// larger than a CUDA block.
inline const std::vector<std::pair<int64_t, int64_t>>& shapes() {
  static const std::vector<std::pair<int64_t, int64_t>> s{{1, 1}, {7, 1}, {1, 9}, {13, 5}, {64, 33}, {300, 3}};
  return s;
}

inline MatF randomMatrix(std::mt19937& rng, int64_t rows, int64_t cols, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  MatF m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
  return m;
}

// About `density` of the entries nonzero; column 0 is left empty when there are several columns.
inline SparseF randomSparse(std::mt19937& rng, int64_t rows, int64_t cols, double density) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::normal_distribution<float> normal;
  std::vector<Eigen::Triplet<float, int32_t>> t;
  for (int64_t j = cols > 1 ? 1 : 0; j < cols; ++j)
    for (int64_t i = 0; i < rows; ++i)
      if (u(rng) < density) t.emplace_back(static_cast<int32_t>(i), static_cast<int32_t>(j), normal(rng));
  SparseF s(rows, cols);
  s.setFromTriplets(t.begin(), t.end());
  s.makeCompressed();
  return s;
}

// Bit for bit the same matrix.
inline bool same(const MatF& a, const MatF& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         (a.size() == 0 || std::memcmp(a.data(), b.data(), static_cast<size_t>(a.size()) * sizeof(float)) == 0);
}

inline double relativeError(const MatF& got, const MatD& want) {
  if (got.rows() != want.rows() || got.cols() != want.cols()) return 1e300;
  const double scale = std::max(1.0, want.norm());
  return (got.cast<double>() - want).norm() / scale;
}

inline Tensor upload(Backend& b, const MatF& m) {
  Tensor t = b.allocate(m.rows(), m.cols());
  b.copy(cpu::view(m), t);
  return t;
}

inline MatF download(Backend& b, const Tensor& t) {
  MatF m(t.rows(), t.cols());
  Tensor host = cpu::view(m);
  b.copy(t, host);
  return m;
}

inline MatF runGemm(Backend& b, Trans ta, Trans tb, float alpha, const MatF& x, const MatF& y, float beta,
                    const MatF& c) {
  Tensor tc = upload(b, c);
  b.gemm(ta, tb, alpha, upload(b, x), upload(b, y), beta, tc);
  return download(b, tc);
}

inline MatF runGemmSparse(Backend& b, float alpha, const MatF& x, const SparseF& s, bool asCsr, Trans ts, float beta,
                          const MatF& c) {
  SparseRowF rowMajor(s);
  rowMajor.makeCompressed();
  SparseTensor host = cpu::view(s);
  if (asCsr) {
    host.layout = SparseTensor::Layout::kCsr;
    host.outer = rowMajor.outerIndexPtr();
    host.inner = rowMajor.innerIndexPtr();
    host.values = rowMajor.valuePtr();
  }
  const SparseCopy onDevice = b.copySparse(host);
  Tensor tc = upload(b, c);
  b.gemmSparse(alpha, upload(b, x), onDevice.view, ts, beta, tc);
  return download(b, tc);
}

inline std::vector<MatF> runChain(Backend& b, const EwChain& chain, const std::vector<MatF>& inputs, int64_t rows,
                                  int64_t cols) {
  std::vector<Tensor> in;
  for (const MatF& m : inputs) in.push_back(upload(b, m));
  std::vector<Tensor> out;
  for (size_t k = 0; k < chain.steps.size(); ++k) out.push_back(b.allocate(rows, cols));
  std::vector<const Tensor*> inPtr;
  for (const Tensor& t : in) inPtr.push_back(&t);
  std::vector<Tensor*> outPtr;
  for (Tensor& t : out) outPtr.push_back(&t);
  b.elementwise(chain, inPtr, outPtr);
  std::vector<MatF> result;
  for (const Tensor& t : out) result.push_back(download(b, t));
  return result;
}

// Returns the input gradients after accumulation (entries without a start value stay empty).
inline std::vector<MatF> runChainBackward(Backend& b, const EwChain& chain, const std::vector<MatF>& inputs,
                                          const std::vector<MatF>& values, const MatF& upstream,
                                          const std::vector<std::optional<MatF>>& gradStart) {
  std::vector<Tensor> in;
  std::vector<Tensor> val;
  std::vector<std::optional<Tensor>> grads;
  for (const MatF& m : inputs) in.push_back(upload(b, m));
  for (const MatF& m : values) val.push_back(upload(b, m));
  for (const auto& g : gradStart) grads.push_back(g ? std::optional<Tensor>(upload(b, *g)) : std::nullopt);
  std::vector<const Tensor*> inPtr;
  std::vector<const Tensor*> valPtr;
  std::vector<Tensor*> gradPtr;
  for (const Tensor& t : in) inPtr.push_back(&t);
  for (const Tensor& t : val) valPtr.push_back(&t);
  for (auto& g : grads) gradPtr.push_back(g ? &*g : nullptr);
  b.elementwiseBackward(chain, inPtr, valPtr, upload(b, upstream), gradPtr);
  std::vector<MatF> result;
  for (auto& g : grads) result.push_back(g ? download(b, *g) : MatF());
  return result;
}

inline std::pair<MatF, MatF> runSoftmaxCrossEntropy(Backend& b, const MatF& z, const MatF& t) {
  Tensor p = b.allocate(z.rows(), z.cols());
  Tensor loss = b.allocate(1, z.cols());
  b.softmaxCrossEntropy(upload(b, z), upload(b, t), p, loss);
  return {download(b, p), download(b, loss)};
}

inline MatF runSoftmaxCrossEntropyBackward(Backend& b, const MatF& p, const MatF& t, const MatF& g, float beta,
                                           const MatF& dz) {
  Tensor d = upload(b, dz);
  b.softmaxCrossEntropyBackward(upload(b, p), upload(b, t), upload(b, g), beta, d);
  return download(b, d);
}

// Backend::columnOp of a (and b, for two-operand operators); its output's shape.
inline MatF runColumnOp(Backend& b, OpKind op, const MatF& a, const MatF* second) {
  const bool reduces = op != OpKind::kSoftmax && op != OpKind::kLogSoftmax;
  Tensor out = b.allocate(reduces ? 1 : a.rows(), a.cols());
  const Tensor tb = second ? upload(b, *second) : Tensor();
  b.columnOp(op, upload(b, a), second ? &tb : nullptr, out);
  return download(b, out);
}

inline MatF runColumnOpBackward(Backend& b, OpKind op, int which, const MatF& a, const MatF* second, const MatF& out,
                                const MatF& g) {
  Tensor d = b.allocate(a.rows(), a.cols());
  const Tensor tb = second ? upload(b, *second) : Tensor();
  b.columnOpBackward(op, which, upload(b, a), second ? &tb : nullptr, upload(b, out), upload(b, g), d);
  return download(b, d);
}

inline MatF runSumColumns(Backend& b, const MatF& a, float beta, const MatF& out) {
  Tensor o = upload(b, out);
  b.sumColumns(upload(b, a), beta, o);
  return download(b, o);
}

inline MatF runSumRows(Backend& b, const MatF& a, float beta, const MatF& out) {
  Tensor o = upload(b, out);
  b.sumRows(upload(b, a), beta, o);
  return download(b, o);
}

inline MatF runAxpy(Backend& b, float alpha, const MatF& x, const MatF& y) {
  Tensor ty = upload(b, y);
  b.axpy(alpha, upload(b, x), ty);
  return download(b, ty);
}

inline MatF runCopyRows(Backend& b, const MatF& src, int64_t srcRow, const MatF& dst, int64_t dstRow, int64_t rows) {
  Tensor d = upload(b, dst);
  b.copyRows(upload(b, src), srcRow, d, dstRow, rows);
  return download(b, d);
}

// One LSTM cell step on `b` (gates in the order output, input, candidate, forget by
// row block, as a model may write them), forward then backward from dHidden and
// dCell onto dGates0 and dCPrev0: {act0..3, cell, tanhCell, hidden, dGates, dCPrev}.
inline std::vector<MatF> runLstmCell(Backend& b, const MatF& gates, const MatF& cPrev, const MatF& dHidden,
                                     const MatF& dCell, const MatF& dGates0, const MatF& dCPrev0) {
  const int64_t h = cPrev.rows();
  const int64_t n = cPrev.cols();
  const Tensor tg = upload(b, gates);
  const Tensor tc = upload(b, cPrev);
  std::vector<Tensor> out;
  for (int k = 0; k < 7; ++k) out.push_back(b.allocate(h, n));
  LstmCellArgs a;
  a.gates = &tg;
  a.offset = {h, 3 * h, 2 * h, 0};
  a.cPrev = &tc;
  for (size_t k = 0; k < 4; ++k) a.act[k] = &out[k];
  a.cell = &out[4];
  a.tanhCell = &out[5];
  a.hidden = &out[6];
  b.lstmCellForward(a);
  const Tensor dh = upload(b, dHidden);
  const Tensor dc = upload(b, dCell);
  Tensor dg = upload(b, dGates0);
  Tensor dp = upload(b, dCPrev0);
  b.lstmCellBackward(a, &dh, &dc, dg, &dp);
  std::vector<MatF> result;
  for (const Tensor& t : out) result.push_back(download(b, t));
  result.push_back(download(b, dg));
  result.push_back(download(b, dp));
  return result;
}

inline MatF runScale(Backend& b, float alpha, const MatF& x) {
  Tensor t = upload(b, x);
  b.scale(alpha, t);
  return download(b, t);
}

// copyParts gathering `srcs` (each of the same rows) into consecutive columns of
// one matrix: part k scaled by scales[k] where it has a value, else copied.
inline MatF runCopyParts(Backend& b, const std::vector<MatF>& srcs, const std::vector<std::optional<float>>& scales) {
  int64_t cols = 0;
  for (const MatF& s : srcs) cols += s.cols();
  std::vector<Tensor> in;
  for (const MatF& s : srcs) in.push_back(upload(b, s));
  Tensor out = b.allocate(srcs.empty() ? 0 : srcs[0].rows(), cols);
  std::vector<CopyPart> parts;
  int64_t at = 0;
  for (size_t k = 0; k < srcs.size(); ++k) {
    const Tensor& t = in[k];
    parts.push_back(CopyPart{Tensor::view(t.device(), t.data(), t.rows(), t.cols()), out.middleCols(at, t.cols()),
                             scales[k].has_value(), scales[k].value_or(1.0f)});
    at += t.cols();
  }
  b.copyParts(parts);
  return download(b, out);
}

// y + terms[0] + terms[1] + ... by addInOrder.
inline MatF runAddInOrder(Backend& b, const std::vector<MatF>& terms, const MatF& y) {
  std::vector<Tensor> in;
  for (const MatF& t : terms) in.push_back(upload(b, t));
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : in) ptrs.push_back(&t);
  Tensor ty = upload(b, y);
  b.addInOrder(ptrs, ty);
  return download(b, ty);
}

// One parameter matrix and the optimizer state buffers its kind uses (the others empty).
struct OptimizerState {
  MatF param;
  MatF buffer0;
  MatF buffer1;
};

// The settings of step `t` (1-based) of `kind` with PyTorch's defaults and a
// learning rate that changes from step to step; Adam's corrections in double,
// rounded once, as the engine computes them.
inline OptimizerStep optimizerSettings(OptimizerStep::Kind kind, float weightDecay, int t) {
  OptimizerStep s;
  s.kind = kind;
  const double lr = (kind == OptimizerStep::Kind::kAdam ? 1e-3 : 0.1) / t;
  s.lr = static_cast<float>(lr);
  s.weightDecay = weightDecay;
  s.momentum = 0.9f;
  s.eps = 1e-8f;
  s.beta1 = 0.9f;
  s.beta2 = 0.999f;
  s.adamStepSize = static_cast<float>(lr / (1.0 - std::pow(0.9, t)));
  s.adamBc2Sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(0.999, t)));
  return s;
}

// Runs the steps on b, gradients[k] for steps[k], from `state` (empty buffers
// start at zero); returns the state after the last step.
inline OptimizerState runOptimizerSteps(Backend& b, const std::vector<OptimizerStep>& steps,
                                        const std::vector<MatF>& gradients, OptimizerState state) {
  const int buffers = steps.empty() ? 0 : optimizerBuffers(steps.front().kind);
  const MatF zero = MatF::Zero(state.param.rows(), state.param.cols());
  Tensor w = upload(b, state.param);
  std::optional<Tensor> b0, b1;
  if (buffers >= 1) b0 = upload(b, state.buffer0.size() > 0 ? state.buffer0 : zero);
  if (buffers >= 2) b1 = upload(b, state.buffer1.size() > 0 ? state.buffer1 : zero);
  for (size_t k = 0; k < steps.size(); ++k) {
    b.optimizerStep(steps[k], upload(b, gradients[k]), w, b0 ? &*b0 : nullptr, b1 ? &*b1 : nullptr);
  }
  OptimizerState out{download(b, w), MatF(), MatF()};
  if (b0) out.buffer0 = download(b, *b0);
  if (b1) out.buffer1 = download(b, *b1);
  return out;
}

// A chain using every elementwise operator, over inputs x (r x B), bias (r x 1) and y (r x B):
//   s0 = x + bias, s1 = sigmoid(s0), s2 = s1 * y, s3 = tanh(s2), s4 = 0.5 s3, s5 = s4 - x,
//   s6 = relu(s5), s7 = exp(s6), s8 = log(s7), s9 = s8 * s1
inline EwChain everyOpChain() {
  const auto in = [](int i) { return EwRef{EwRef::Kind::kInput, i}; };
  const auto st = [](int i) { return EwRef{EwRef::Kind::kStep, i}; };
  EwChain c;
  c.inputs = 3;
  c.steps = {
      {EwOp::kAdd, {in(0), in(1)}, 1.0f},    {EwOp::kSigmoid, {st(0), {}}, 1.0f}, {EwOp::kMultiply, {st(1), in(2)}, 1.0f},
      {EwOp::kTanh, {st(2), {}}, 1.0f},      {EwOp::kScale, {st(3), {}}, 0.5f},   {EwOp::kSubtract, {st(4), in(0)}, 1.0f},
      {EwOp::kRelu, {st(5), {}}, 1.0f},      {EwOp::kExp, {st(6), {}}, 1.0f},     {EwOp::kLog, {st(7), {}}, 1.0f},
      {EwOp::kMultiply, {st(8), st(1)}, 1.0f},
  };
  return c;
}

}  // namespace orpheus::ops::test
