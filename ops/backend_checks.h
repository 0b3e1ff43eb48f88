// Operand checks every backend runs before it computes: devices, shapes, chains.
// Failures are orpheus::Error (a caller's bug, not the user's).
#pragma once

#include "ops/backend.h"
#include "ops/operators.h"

#include <initializer_list>
#include <utility>

namespace orpheus::ops::checks {

inline void onDevice(const Backend& b, const char* op, const Tensor& t) {
  ORPHEUS_ENFORCE(t.device() == b.device(), "backend {}: an operand of {} lives in {} memory", b.name(), op,
                  deviceName(t.device()));
}

inline void sameShape(const char* op, const Tensor& a, const Tensor& b) {
  ORPHEUS_ENFORCE(a.rows() == b.rows() && a.cols() == b.cols(), "{}: shapes {}x{} and {}x{} differ", op, a.rows(),
                  a.cols(), b.rows(), b.cols());
}

// copyParts: each part on the backend's device with as many elements in as out, and
// no destination overlapping another part's source or destination.
inline void copyParts(const Backend& b, std::span<const CopyPart> parts) {
  const auto overlap = [](const Tensor& x, const Tensor& y) {
    return x.size() > 0 && y.size() > 0 && x.data() < y.data() + y.size() && y.data() < x.data() + x.size();
  };
  for (size_t i = 0; i < parts.size(); ++i) {
    onDevice(b, "copyParts", parts[i].src);
    onDevice(b, "copyParts", parts[i].dst);
    ORPHEUS_ENFORCE(parts[i].src.size() == parts[i].dst.size(), "copyParts: part {} copies {} elements into {}", i,
                    parts[i].src.size(), parts[i].dst.size());
    for (size_t j = 0; j < parts.size(); ++j) {
      ORPHEUS_ENFORCE(!overlap(parts[i].dst, parts[j].src) && (i == j || !overlap(parts[i].dst, parts[j].dst)),
                      "copyParts: the destination of part {} overlaps the {} of part {}", i,
                      overlap(parts[i].dst, parts[j].src) ? "source" : "destination", j);
    }
  }
}

// addInOrder: every term y's shape, all on the backend's device.
inline void addInOrder(const Backend& b, std::span<const Tensor* const> terms, const Tensor& y) {
  onDevice(b, "addInOrder", y);
  for (const Tensor* t : terms) {
    ORPHEUS_ENFORCE(t != nullptr, "addInOrder: a null term");
    onDevice(b, "addInOrder", *t);
    sameShape("addInOrder", *t, y);
  }
}

struct GemmShape {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
};

inline GemmShape gemm(Trans ta, Trans tb, const Tensor& a, const Tensor& b, const Tensor& c) {
  const GemmShape s{ta == Trans::kNo ? a.rows() : a.cols(), tb == Trans::kNo ? b.cols() : b.rows(),
                    ta == Trans::kNo ? a.cols() : a.rows()};
  const int64_t kb = tb == Trans::kNo ? b.rows() : b.cols();
  ORPHEUS_ENFORCE(s.k == kb && c.rows() == s.m && c.cols() == s.n, "gemm: {}x{}{} times {}x{}{} into {}x{}",
                  a.rows(), a.cols(), ta == Trans::kYes ? "^T" : "", b.rows(), b.cols(),
                  tb == Trans::kYes ? "^T" : "", c.rows(), c.cols());
  return s;
}

// A sparse operand as a CSC matrix (a CSR matrix is the CSC form of its
// transpose) and whether the product uses that CSC matrix transposed.
struct CscOperand {
  int64_t rows = 0;
  int64_t cols = 0;
  bool transposed = false;
};

inline CscOperand gemmSparse(const Tensor& a, const SparseTensor& s, Trans ts, const Tensor& c) {
  const bool csc = s.layout == SparseTensor::Layout::kCsc;
  CscOperand o{csc ? s.rows : s.cols, csc ? s.cols : s.rows, (ts == Trans::kYes) == csc};
  const int64_t k = o.transposed ? o.cols : o.rows;
  const int64_t n = o.transposed ? o.rows : o.cols;
  ORPHEUS_ENFORCE(a.cols() == k && c.rows() == a.rows() && c.cols() == n,
                  "gemmSparse: {}x{} times a {}x{} sparse{} into {}x{}", a.rows(), a.cols(), s.rows, s.cols,
                  ts == Trans::kYes ? "^T" : "", c.rows(), c.cols());
  return o;
}

struct ChainShape {
  int64_t rows = 0;
  int64_t cols = 0;
};

// `last` is the tensor that fixes the chain's shape (the last output, or the upstream gradient).
inline ChainShape chain(const Backend& b, const EwChain& chain, std::span<const Tensor* const> inputs,
                        const Tensor& last) {
  ORPHEUS_ENFORCE(!chain.steps.empty(), "elementwise: empty chain");
  // A plan made for another backend's limits (Graph::fusionPlan): said as unsupported, not as a broken invariant.
  const ChainLimits limits = b.chainLimits();
  if (static_cast<int64_t>(chain.steps.size()) > limits.steps || chain.inputs > limits.inputs) {
    throw Error(fmt::format("backend {} does not support elementwise chains of more than {} steps or {} inputs (this "
                            "one: {} steps, {} inputs)", b.name(), limits.steps, limits.inputs, chain.steps.size(),
                            chain.inputs));
  }
  ORPHEUS_ENFORCE(static_cast<int>(inputs.size()) == chain.inputs, "elementwise: chain has {} inputs, got {}",
                  chain.inputs, inputs.size());
  onDevice(b, "elementwise", last);
  const ChainShape shape{last.rows(), last.cols()};
  for (const Tensor* in : inputs) {
    ORPHEUS_ENFORCE(in != nullptr, "elementwise: missing input");
    onDevice(b, "elementwise", *in);
    ORPHEUS_ENFORCE(in->rows() == shape.rows && (in->cols() == shape.cols || in->cols() == 1),
                    "elementwise: input {}x{} does not fit a {}x{} chain", in->rows(), in->cols(), shape.rows,
                    shape.cols);
  }
  for (size_t k = 0; k < chain.steps.size(); ++k) {
    const EwStep& s = chain.steps[k];
    for (int o = 0; o < (isUnary(s.op) ? 1 : 2); ++o) {
      const EwRef r = s.operand[static_cast<size_t>(o)];
      ORPHEUS_ENFORCE(r.kind == EwRef::Kind::kInput ? r.index >= 0 && r.index < chain.inputs
                                                    : r.index >= 0 && static_cast<size_t>(r.index) < k,
                      "elementwise: step {} refers to a missing operand", k);
    }
  }
  return shape;
}

// Every tensor in `ts` (null entries allowed where `optional`) is rows x cols on b's device.
inline void all(const Backend& b, const char* op, std::span<const Tensor* const> ts, ChainShape shape,
                bool optional) {
  for (const Tensor* t : ts) {
    if (t == nullptr && optional) continue;
    ORPHEUS_ENFORCE(t != nullptr, "{}: missing operand", op);
    onDevice(b, op, *t);
    ORPHEUS_ENFORCE(t->rows() == shape.rows && t->cols() == shape.cols, "{}: an operand is {}x{}, expected {}x{}", op,
                    t->rows(), t->cols(), shape.rows, shape.cols);
  }
}

// The operands of optimizerStep(): gradient, param and the buffers s.kind uses,
// on b's device and of one shape. Returns those buffers (the others as null).
inline std::pair<Tensor*, Tensor*> optimizerStep(const Backend& b, const OptimizerStep& s, const Tensor& gradient,
                                                 const Tensor& param, Tensor* buffer0, Tensor* buffer1) {
  const int buffers = optimizerBuffers(s.kind);
  if (buffers < 1) buffer0 = nullptr;
  if (buffers < 2) buffer1 = nullptr;
  ORPHEUS_ENFORCE((buffers < 1 || buffer0 != nullptr) && (buffers < 2 || buffer1 != nullptr),
                  "optimizerStep: this kind needs {} state buffer(s)", buffers);
  onDevice(b, "optimizerStep", gradient);
  onDevice(b, "optimizerStep", param);
  sameShape("optimizerStep", gradient, param);
  for (const Tensor* t : {buffer0, buffer1}) {
    if (t == nullptr) continue;
    onDevice(b, "optimizerStep", *t);
    sameShape("optimizerStep", *t, param);
  }
  return {buffer0, buffer1};
}

// The checks every backend runs on elementwise() and elementwiseBackward()
// arguments; returns the chain's shape.
inline ChainShape forward(const Backend& b, const EwChain& c, std::span<const Tensor* const> inputs,
                          std::span<Tensor* const> outputs) {
  ORPHEUS_ENFORCE(outputs.size() == c.steps.size() && !outputs.empty() && outputs.back() != nullptr,
                  "elementwise: {} steps, {} outputs", c.steps.size(), outputs.size());
  const ChainShape shape = chain(b, c, inputs, *outputs.back());
  all(b, "elementwise", std::span<const Tensor* const>(outputs.data(), outputs.size()), shape, false);
  return shape;
}

inline ChainShape backward(const Backend& b, const EwChain& c, std::span<const Tensor* const> inputs,
                           std::span<const Tensor* const> values, const Tensor& upstream,
                           std::span<Tensor* const> inputGrads) {
  ORPHEUS_ENFORCE(values.size() == c.steps.size() && inputGrads.size() == inputs.size(),
                  "elementwiseBackward: {} steps, {} values; {} inputs, {} gradients", c.steps.size(), values.size(),
                  inputs.size(), inputGrads.size());
  const ChainShape shape = chain(b, c, inputs, upstream);
  all(b, "elementwiseBackward", values, shape, false);
  all(b, "elementwiseBackward", std::span<const Tensor* const>(inputGrads.data(), inputGrads.size()), shape, true);
  return shape;
}

// copyRows: both on b's device, the same columns, the row ranges inside.
// A column operator's operands (Backend::columnOp): the operator is one, b is given
// exactly for two-operand ones, in a's shape, and out is 1 x B or a's shape.
inline void columnOp(const Backend& b, const char* what, OpKind op, const Tensor& a, const Tensor* second,
                     const Tensor& out) {
  ORPHEUS_ENFORCE(isColumnOp(op), "{}: {} is not a column operator", what, opName(op));
  onDevice(b, what, a);
  onDevice(b, what, out);
  ORPHEUS_ENFORCE((second != nullptr) == (arity(op) == 2), "{}: {} takes {} operand(s)", what, opName(op), arity(op));
  if (second != nullptr) {
    onDevice(b, what, *second);
    sameShape(what, a, *second);
  }
  const bool reduces = op != OpKind::kSoftmax && op != OpKind::kLogSoftmax;
  ORPHEUS_ENFORCE(out.rows() == (reduces ? 1 : a.rows()) && out.cols() == a.cols(), "{}: {} of a {}x{} operand into {}x{}",
                  what, opName(op), a.rows(), a.cols(), out.rows(), out.cols());
}

inline void columnOpBackward(const Backend& b, OpKind op, int which, const Tensor& a, const Tensor* second,
                             const Tensor& out, const Tensor& upstream, const Tensor& dst) {
  columnOp(b, "columnOpBackward", op, a, second, out);
  onDevice(b, "columnOpBackward", upstream);
  onDevice(b, "columnOpBackward", dst);
  sameShape("columnOpBackward", out, upstream);
  ORPHEUS_ENFORCE(which == 0 || (which == 1 && second != nullptr), "columnOpBackward: no operand {} of {}", which,
                  opName(op));
  sameShape("columnOpBackward", a, dst);
}

inline void copyRows(const Backend& b, const Tensor& src, int64_t srcRow, const Tensor& dst, int64_t dstRow,
                     int64_t rows) {
  onDevice(b, "copyRows", src);
  onDevice(b, "copyRows", dst);
  ORPHEUS_ENFORCE(src.cols() == dst.cols() && rows >= 0 && srcRow >= 0 && dstRow >= 0 &&
                      srcRow + rows <= src.rows() && dstRow + rows <= dst.rows(),
                  "copyRows: rows {}+{} of a {}x{} tensor into rows {}+{} of a {}x{} one", srcRow, rows, src.rows(),
                  src.cols(), dstRow, rows, dst.rows(), dst.cols());
}

// An LSTM cell step's operands: H x B each (the gates 4H x B), on b's device;
// `forward`: cell and hidden given too. Returns H.
inline int64_t lstmCell(const Backend& b, const char* op, const LstmCellArgs& a, bool forward) {
  ORPHEUS_ENFORCE(a.gates && a.cPrev && a.tanhCell && (!forward || (a.cell && a.hidden)), "{}: operands missing", op);
  const int64_t h = a.cPrev->rows();
  const int64_t cols = a.cPrev->cols();
  const auto shaped = [&](const Tensor* t) {
    if (t == nullptr) return;
    onDevice(b, op, *t);
    ORPHEUS_ENFORCE(t->rows() == h && t->cols() == cols, "{}: a {}x{} operand, expected {}x{}", op, t->rows(),
                    t->cols(), h, cols);
  };
  onDevice(b, op, *a.gates);
  ORPHEUS_ENFORCE(a.gates->rows() == 4 * h && a.gates->cols() == cols, "{}: gates {}x{} for a {}x{} state", op,
                  a.gates->rows(), a.gates->cols(), h, cols);
  for (int k = 0; k < 4; ++k) {
    ORPHEUS_ENFORCE(a.act[k] != nullptr && a.offset[k] >= 0 && a.offset[k] + h <= 4 * h, "{}: gate {}", op, k);
    shaped(a.act[k]);
  }
  for (const Tensor* t : {a.cPrev, static_cast<const Tensor*>(a.cell), static_cast<const Tensor*>(a.tanhCell),
                          static_cast<const Tensor*>(a.hidden)}) {
    shaped(t);
  }
  return h;
}

// lstmCell's checks for the backward step, and its gradients: dHidden, dCell and
// dCPrev (each may be null) H x B, dGates 4H x B, all on b's device. Returns H.
inline int64_t lstmCellBackward(const Backend& b, const LstmCellArgs& a, const Tensor* dHidden, const Tensor* dCell,
                                const Tensor& dGates, const Tensor* dCPrev) {
  const int64_t h = lstmCell(b, "lstmCellBackward", a, false);
  for (const Tensor* t : {dHidden, dCell, dCPrev}) {
    if (t == nullptr) continue;
    onDevice(b, "lstmCellBackward", *t);
    sameShape("lstmCellBackward", *t, *a.cPrev);
  }
  onDevice(b, "lstmCellBackward", dGates);
  sameShape("lstmCellBackward", dGates, *a.gates);
  return h;
}

}  // namespace orpheus::ops::checks
