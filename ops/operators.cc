#include "ops/operators.h"

#include "engine/base/error.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <utility>

namespace orpheus::ops {

namespace {

// Eigen 3.4 evaluates select() and sign() one scalar at a time, with a branch that
// mispredicts on mixed-sign data; these two functors give relu and l1 gradients a
// vectorized, branch-free path using comparison masks.

// g where x > 0, else 0.
template <typename S>
struct PassWherePositiveOp {
  S operator()(const S& x, const S& g) const { return x > S(0) ? g : S(0); }
  template <typename Packet>
  Packet packetOp(const Packet& x, const Packet& g) const {
    using namespace Eigen::internal;
    return pand(pcmp_lt(pzero(x), x), g);
  }
};

// sign(x): -1, 0 or 1.
template <typename S>
struct SignOp {
  S operator()(const S& x) const { return x > S(0) ? S(1) : (x < S(0) ? S(-1) : S(0)); }
  template <typename Packet>
  Packet packetOp(const Packet& x) const {
    using namespace Eigen::internal;
    const Packet zero = pzero(x);
    const Packet one = pset1<Packet>(S(1));
    return psub(pand(pcmp_lt(zero, x), one), pand(pcmp_lt(x, zero), one));
  }
};

}  // namespace

}  // namespace orpheus::ops

namespace Eigen::internal {

template <typename S>
struct functor_traits<orpheus::ops::PassWherePositiveOp<S>> {
  enum { Cost = 2 * NumTraits<S>::AddCost, PacketAccess = packet_traits<S>::HasCmp };
};

template <typename S>
struct functor_traits<orpheus::ops::SignOp<S>> {
  enum { Cost = 4 * NumTraits<S>::AddCost, PacketAccess = packet_traits<S>::HasCmp };
};

}  // namespace Eigen::internal

namespace orpheus::ops {

namespace {

struct OpInfo {
  OpKind op;
  const char* name;
  int type;
  bool elementwise;
};

// Indexed by the enum's value, so lookups by kind are a single array access.
constexpr std::array<OpInfo, 21> kOps{{
    {OpKind::kSquaredL2, "sq_l2", 1, false},
    {OpKind::kL2Norm, "l2_norm", 1, false},
    {OpKind::kL1, "l1", 1, false},
    {OpKind::kSum, "sum", 1, false},
    {OpKind::kSoftmax, "softmax", 2, false},
    {OpKind::kLogSoftmax, "log_softmax", 2, false},
    {OpKind::kSigmoid, "sigmoid", 2, true},
    {OpKind::kTanh, "tanh", 2, true},
    {OpKind::kRelu, "relu", 2, true},
    {OpKind::kExp, "exp", 2, true},
    {OpKind::kLog, "log", 2, true},
    {OpKind::kScale, "scale", 2, true},
    {OpKind::kCrossEntropy, "cross_entropy", 3, false},
    {OpKind::kDot, "dot", 3, false},
    {OpKind::kSquaredDistance, "sq_dist", 3, false},
    {OpKind::kAdd, "add", 4, true},
    {OpKind::kSubtract, "sub", 4, true},
    {OpKind::kMultiply, "mul", 4, true},
    {OpKind::kMatVec, "matvec", 5, false},
    {OpKind::kSlice, "slice", 6, false},
    {OpKind::kConcat, "concat", 6, false},
}};

constexpr bool tableMatchesEnum() {
  for (std::size_t i = 0; i < kOps.size(); ++i) {
    if (static_cast<std::size_t>(kOps[i].op) != i) return false;
  }
  return static_cast<std::size_t>(OpKind::kConcat) + 1 == kOps.size();
}
static_assert(tableMatchesEnum(), "kOps must list every OpKind in declaration order");

const OpInfo& info(OpKind op) {
  const auto i = static_cast<std::size_t>(op);
  if (i >= kOps.size()) throw Error(fmt::format("unknown operator kind {}", i));
  return kOps[i];
}

struct Shape {
  Eigen::Index rows;
  Eigen::Index cols;
};

template <typename M>
std::string shapeStr(const M& m) {
  return fmt::format("{}x{}", m.rows(), m.cols());
}

// Which operand of a type 4 operator is an r x 1 column repeated across the batch.
enum class Broadcast { kNone, kA, kB };

template <typename S>
Broadcast broadcastOf(const Mat<S>& a, const Mat<S>& b) {
  if (a.cols() == b.cols()) return Broadcast::kNone;
  return a.cols() == 1 ? Broadcast::kA : Broadcast::kB;
}

// The operands `op` reads, checked for presence and compatible shapes.
template <typename S>
struct Checked {
  const Mat<S>* a = nullptr;
  const Mat<S>* b = nullptr;
  const SparseMat<S>* bSparse = nullptr;
  Shape out{0, 0};
};

template <typename S>
Checked<S> check(OpKind op, const Operands<S>& in) {
  const OpInfo& oi = info(op);
  ORPHEUS_ENFORCE(in.a != nullptr, "{}: missing first operand", oi.name);
  Checked<S> c;
  c.a = in.a;
  const Mat<S>& a = *in.a;
  if (oi.type == 5) {
    ORPHEUS_ENFORCE((in.b != nullptr) != (in.bSparse != nullptr),
                    "matvec: needs exactly one vector operand, dense or sparse");
    const Eigen::Index k = in.b ? in.b->rows() : in.bSparse->rows();
    const Eigen::Index batch = in.b ? in.b->cols() : in.bSparse->cols();
    ORPHEUS_ENFORCE(a.cols() == k, "matvec: operands of shape {} and {} do not match", shapeStr(a),
                    in.b ? shapeStr(*in.b) : shapeStr(*in.bSparse));
    c.b = in.b;
    c.bSparse = in.bSparse;
    c.out = {a.rows(), batch};
    return c;
  }
  ORPHEUS_ENFORCE(in.bSparse == nullptr, "{}: takes no sparse operand", oi.name);
  if (op == OpKind::kSlice) {
    ORPHEUS_ENFORCE(in.first >= 0 && in.rows > 0 && in.first + in.rows <= a.rows(),
                    "slice: rows [{}, {}) of an operand of shape {}", in.first, in.first + in.rows, shapeStr(a));
    c.out = {in.rows, a.cols()};
    return c;
  }
  if (op == OpKind::kConcat) {
    ORPHEUS_ENFORCE(in.b != nullptr && in.b->cols() == a.cols(), "concat: operands of shape {} and {} do not match",
                    shapeStr(a), in.b ? shapeStr(*in.b) : std::string("none"));
    c.b = in.b;
    c.out = {a.rows() + in.b->rows(), a.cols()};
    return c;
  }
  const Eigen::Index scalarRows = (oi.type == 1 || oi.type == 3) ? 1 : a.rows();
  if (oi.type <= 2) {
    c.out = {scalarRows, a.cols()};
    return c;
  }
  ORPHEUS_ENFORCE(in.b != nullptr, "{}: missing second operand", oi.name);
  const Mat<S>& b = *in.b;
  const bool sameShape = a.rows() == b.rows() && a.cols() == b.cols();
  const bool broadcastable = oi.type == 4 && a.rows() == b.rows() && (a.cols() == 1 || b.cols() == 1);
  ORPHEUS_ENFORCE(sameShape || broadcastable, "{}: operands of shape {} and {} do not match", oi.name, shapeStr(a),
                  shapeStr(b));
  c.b = in.b;
  c.out = {scalarRows, std::max(a.cols(), b.cols())};
  return c;
}

template <typename S>
void checkShape(OpKind op, const char* what, const Mat<S>& m, Shape want) {
  ORPHEUS_ENFORCE(m.rows() == want.rows && m.cols() == want.cols, "{}: {} has shape {}, the output is {}x{}",
                  opName(op), what, shapeStr(m), want.rows, want.cols);
}

// The operators below work one column (one example) at a time where a row
// vector would otherwise be broadcast across the batch: in column-major storage
// Eigen evaluates such rowwise() broadcasts one scalar at a time, while each
// column pass here is a single vectorized, cache-resident expression.

// Builds a rows x cols matrix column by column: fill(column j, j).
template <typename S, typename Fill>
Mat<S> byColumn(Eigen::Index rows, Eigen::Index cols, Fill&& fill) {
  Mat<S> out(rows, cols);
  for (Eigen::Index j = 0; j < cols; ++j) fill(out.col(j), j);
  return out;
}

// m with column j multiplied by factor(j): the vector-Jacobian product of a
// type 1 or 3 operator whose per-column derivative is m, under a 1 x B gradient.
template <typename S, typename Derived, typename Factor>
Mat<S> scaleColumns(const Eigen::MatrixBase<Derived>& m, Factor&& factor) {
  return byColumn<S>(m.rows(), m.cols(), [&](auto col, Eigen::Index j) { col = m.col(j) * factor(j); });
}

// Sum over the columns of m, as the r x 1 gradient of a broadcast operand.
template <typename S, typename Derived>
Mat<S> sumColumns(const Eigen::MatrixBase<Derived>& m) {
  return sumColumnsInOrder(m);
}

// Column-wise softmax. Subtracting each column's max first keeps exp from
// overflowing without changing the result.
// Into p's memory (resized; p must not be x).
template <typename S>
void softmaxInto(const Mat<S>& x, Mat<S>& p) {
  p.resize(x.rows(), x.cols());
  if (x.rows() == 0) return;  // maxCoeff is undefined on empty columns
  for (Eigen::Index j = 0; j < x.cols(); ++j) {
    p.col(j) = (x.col(j).array() - x.col(j).maxCoeff()).exp().matrix();
    p.col(j) *= S(1) / p.col(j).sum();
  }
}

template <typename S>
Mat<S> softmaxForward(const Mat<S>& x) {
  Mat<S> p;
  softmaxInto(x, p);
  return p;
}

template <typename S>
Mat<S> logSoftmaxForward(const Mat<S>& x) {
  if (x.rows() == 0) return Mat<S>(x.rows(), x.cols());
  return byColumn<S>(x.rows(), x.cols(), [&](auto out, Eigen::Index j) {
    out = x.col(j).array() - x.col(j).maxCoeff();
    out.array() -= std::log(out.array().exp().sum());
  });
}

template <typename S>
Mat<S> typeFourForward(OpKind op, const Mat<S>& a, const Mat<S>& b) {
  const Broadcast bc = broadcastOf(a, b);
  if (bc == Broadcast::kNone) {
    switch (op) {
      case OpKind::kAdd:
        return a + b;
      case OpKind::kSubtract:
        return a - b;
      case OpKind::kMultiply:
        return a.cwiseProduct(b);
      default:
        break;
    }
  } else {
    const Mat<S>& full = bc == Broadcast::kA ? b : a;
    const auto column = (bc == Broadcast::kA ? a : b).col(0);
    switch (op) {
      case OpKind::kAdd:
        return byColumn<S>(full.rows(), full.cols(), [&](auto o, Eigen::Index j) { o = full.col(j) + column; });
      case OpKind::kSubtract:
        if (bc == Broadcast::kA) {
          return byColumn<S>(full.rows(), full.cols(), [&](auto o, Eigen::Index j) { o = column - full.col(j); });
        }
        return byColumn<S>(full.rows(), full.cols(), [&](auto o, Eigen::Index j) { o = full.col(j) - column; });
      case OpKind::kMultiply:
        return byColumn<S>(full.rows(), full.cols(),
                           [&](auto o, Eigen::Index j) { o = full.col(j).cwiseProduct(column); });
      default:
        break;
    }
  }
  throw Error(fmt::format("{} is not a type 4 operator", opName(op)));
}

// d/d(operand which) of a type 4 operator. `grad` is r x B; a broadcast operand's
// gradient is summed over the columns it was repeated into.
template <typename S>
Mat<S> typeFourBackward(OpKind op, int which, const Mat<S>& a, const Mat<S>& b, const Mat<S>& grad) {
  const Broadcast bc = broadcastOf(a, b);
  const bool selfBroadcast = (which == 0 && bc == Broadcast::kA) || (which == 1 && bc == Broadcast::kB);
  const bool otherBroadcast = (which == 0 && bc == Broadcast::kB) || (which == 1 && bc == Broadcast::kA);
  switch (op) {
    case OpKind::kAdd:
      return selfBroadcast ? sumColumns<S>(grad) : grad;
    case OpKind::kSubtract:
      if (which == 0) return selfBroadcast ? sumColumns<S>(grad) : grad;
      return selfBroadcast ? sumColumns<S>(-grad) : Mat<S>(-grad);
    case OpKind::kMultiply: {
      const Mat<S>& other = which == 0 ? b : a;
      if (selfBroadcast) return sumColumns<S>(grad.cwiseProduct(other));
      if (otherBroadcast) {
        const auto column = other.col(0);
        return byColumn<S>(grad.rows(), grad.cols(),
                           [&](auto o, Eigen::Index j) { o = grad.col(j).cwiseProduct(column); });
      }
      return grad.cwiseProduct(other);
    }
    default:
      throw Error(fmt::format("{} is not a type 4 operator", opName(op)));
  }
}

}  // namespace

int operatorType(OpKind op) { return info(op).type; }

int arity(OpKind op) {
  if (op == OpKind::kSlice) return 1;
  return info(op).type <= 2 ? 1 : 2;
}

const char* opName(OpKind op) { return info(op).name; }

std::optional<OpKind> opFromName(const std::string& name) {
  for (const OpInfo& oi : kOps) {
    if (name == oi.name) return oi.op;
  }
  return std::nullopt;
}

bool isElementwise(OpKind op) { return info(op).elementwise; }

bool isColumnOp(OpKind op) {
  return info(op).type == 1 || info(op).type == 3 || op == OpKind::kSoftmax || op == OpKind::kLogSoftmax;
}

template <typename S>
Mat<S> forward(OpKind op, const Operands<S>& in) {
  const Checked<S> c = check(op, in);
  const Mat<S>& x = *c.a;
  switch (op) {
    case OpKind::kSquaredL2:
    case OpKind::kL2Norm:
    case OpKind::kL1:
    case OpKind::kSum: {
      Mat<S> reduced;
      reduceColumns(op, x, reduced);
      return reduced;
    }
    case OpKind::kSoftmax:
      return softmaxForward(x);
    case OpKind::kLogSoftmax:
      return logSoftmaxForward(x);
    case OpKind::kSigmoid:
      // 1 / (1 + e^-x) saturates to exactly 0 or 1 for large |x| instead of
      // producing inf / inf.
      return (S(1) + (-x.array()).exp()).inverse().matrix();
    case OpKind::kTanh:
      return x.array().tanh().matrix();
    case OpKind::kRelu:
      return x.cwiseMax(S(0));
    case OpKind::kExp:
      return x.array().exp().matrix();
    case OpKind::kLog:
      return x.array().log().matrix();
    case OpKind::kScale:
      return in.attr * x;
    case OpKind::kCrossEntropy: {
      Mat<S> loss(1, x.cols());
      crossEntropyColumns(x, *c.b, loss);
      return loss;
    }
    case OpKind::kDot:
      return x.cwiseProduct(*c.b).colwise().sum();
    case OpKind::kSquaredDistance:
      return (x - *c.b).colwise().squaredNorm();
    case OpKind::kAdd:
    case OpKind::kSubtract:
    case OpKind::kMultiply:
      return typeFourForward(op, x, *c.b);
    case OpKind::kMatVec: {
      Mat<S> out(c.out.rows, c.out.cols);
      if (c.b) {
        out.noalias() = x * *c.b;
      } else {
        out.noalias() = x * *c.bSparse;
      }
      return out;
    }
    case OpKind::kSlice:
      return x.middleRows(in.first, in.rows);
    case OpKind::kConcat: {
      Mat<S> out(c.out.rows, c.out.cols);
      out.topRows(x.rows()) = x;
      out.bottomRows(c.b->rows()) = *c.b;
      return out;
    }
  }
  throw Error(fmt::format("unknown operator kind {}", static_cast<int>(op)));
}

// The gradient of a one-operand operator (types 1 and 2, and slices).
template <typename S>
Mat<S> unaryBackward(OpKind op, const Operands<S>& in, const Checked<S>& c, const Mat<S>& out, const Mat<S>& grad) {
  const Mat<S>& x = *c.a;
  // Type 1 gradients are 1 x B: one factor per column.
  const auto g = [&grad](Eigen::Index j) { return grad(0, j); };
  switch (op) {
    case OpKind::kSquaredL2:
      return scaleColumns<S>(x, [&](Eigen::Index j) { return S(2) * g(j); });
    case OpKind::kL2Norm:
      checkShape(op, "forward output", out, c.out);
      // d||x||/dx = x / ||x||, taken as 0 at x = 0 where the norm has no gradient.
      return scaleColumns<S>(x, [&](Eigen::Index j) { return out(0, j) > S(0) ? g(j) / out(0, j) : S(0); });
    case OpKind::kL1:
      return scaleColumns<S>(x.unaryExpr(SignOp<S>()), g);
    case OpKind::kSum:
      return byColumn<S>(x.rows(), x.cols(), [&](auto col, Eigen::Index j) { col.setConstant(g(j)); });
    case OpKind::kSoftmax:
      checkShape(op, "forward output", out, c.out);
      return byColumn<S>(x.rows(), x.cols(), [&](auto col, Eigen::Index j) {
        const auto p = out.col(j);
        col = p.cwiseProduct((grad.col(j).array() - p.dot(grad.col(j))).matrix());
      });
    case OpKind::kLogSoftmax:
      checkShape(op, "forward output", out, c.out);
      // softmax(x) is exp of the output, so it need not be recomputed from x.
      return byColumn<S>(x.rows(), x.cols(), [&](auto col, Eigen::Index j) {
        col = grad.col(j) - (out.col(j).array().exp() * grad.col(j).sum()).matrix();
      });
    case OpKind::kSigmoid:
      checkShape(op, "forward output", out, c.out);
      return (grad.array() * out.array() * (S(1) - out.array())).matrix();
    case OpKind::kTanh:
      checkShape(op, "forward output", out, c.out);
      return (grad.array() * (S(1) - out.array().square())).matrix();
    case OpKind::kRelu:
      return x.binaryExpr(grad, PassWherePositiveOp<S>());
    case OpKind::kExp:
      checkShape(op, "forward output", out, c.out);
      return grad.cwiseProduct(out);
    case OpKind::kLog:
      return grad.cwiseQuotient(x);
    case OpKind::kScale:
      return in.attr * grad;
    case OpKind::kSlice: {
      Mat<S> dx = Mat<S>::Zero(x.rows(), x.cols());
      dx.middleRows(in.first, in.rows) = grad;
      return dx;
    }
    default:
      break;
  }
  throw Error(fmt::format("unknown operator kind {}", static_cast<int>(op)));
}

// The gradient of a two-operand operator (types 3 to 6) with respect to operand `which`.
template <typename S>
Mat<S> binaryBackward(OpKind op, int which, const Checked<S>& c, const Mat<S>& grad) {
  const Mat<S>& x = *c.a;
  constexpr S tiny = std::numeric_limits<S>::min();
  // Type 3 gradients are 1 x B: one factor per column.
  const auto g = [&grad](Eigen::Index j) { return grad(0, j); };
  switch (op) {
    case OpKind::kCrossEntropy: {
      const auto minusG = [&](Eigen::Index j) { return -g(j); };
      if (which == 0) return scaleColumns<S>(c.b->cwiseQuotient(x.cwiseMax(tiny)), minusG);
      return scaleColumns<S>(x.cwiseMax(tiny).array().log().matrix(), minusG);
    }
    case OpKind::kDot:
      return scaleColumns<S>(which == 0 ? *c.b : x, g);
    case OpKind::kSquaredDistance: {
      const S sign = which == 0 ? S(2) : S(-2);
      return scaleColumns<S>(x - *c.b, [&](Eigen::Index j) { return sign * g(j); });
    }
    case OpKind::kAdd:
    case OpKind::kSubtract:
    case OpKind::kMultiply:
      return typeFourBackward(op, which, x, *c.b, grad);
    case OpKind::kMatVec: {
      if (which == 0) {
        Mat<S> dw(x.rows(), x.cols());
        if (c.b) {
          dw.noalias() = grad * c.b->transpose();
        } else {
          dw.noalias() = grad * c.bSparse->transpose();
        }
        return dw;
      }
      // A sparse operand is data, which is never trained: refusing beats silently
      // producing a dense K x B gradient nobody reads.
      ORPHEUS_ENFORCE(c.b != nullptr, "matvec: no gradient for sparse data");
      Mat<S> dx(x.cols(), grad.cols());
      dx.noalias() = x.transpose() * grad;
      return dx;
    }
    case OpKind::kConcat:
      if (which == 0) return grad.topRows(x.rows());
      return grad.bottomRows(c.b->rows());
    default:
      break;
  }
  throw Error(fmt::format("unknown operator kind {}", static_cast<int>(op)));
}

template <typename S>
Mat<S> backward(OpKind op, int which, const Operands<S>& in, const Mat<S>& out, const Mat<S>& grad) {
  const Checked<S> c = check(op, in);
  ORPHEUS_ENFORCE(which >= 0 && which < arity(op), "{}: no operand {}", opName(op), which);
  checkShape(op, "gradient", grad, c.out);
  if (arity(op) == 1) return unaryBackward(op, in, c, out, grad);
  return binaryBackward(op, which, c, grad);
}

template <typename S>
void forwardInto(OpKind op, const Operands<S>& in, Mat<S>& out) {
  if (op == OpKind::kSoftmax && in.a != &out) {
    // Straight into the caller's buffer: a softmax over a vocabulary is the pass's largest value.
    softmaxInto(*check(op, in).a, out);
    return;
  }
  if (op != OpKind::kMatVec) {
    const Mat<S> result = forward(op, in);
    out = result;  // copied: `out` keeps its memory
    return;
  }
  // As forward's kMatVec, into the caller's buffer.
  const Checked<S> c = check(op, in);
  out.resize(c.out.rows, c.out.cols);
  if (c.b) {
    out.noalias() = *c.a * *c.b;
  } else {
    out.noalias() = *c.a * *c.bSparse;
  }
}

template <typename S>
void backwardInto(OpKind op, int which, const Operands<S>& in, const Mat<S>& out, const Mat<S>& grad, Mat<S>& dst) {
  if (op != OpKind::kMatVec) {
    const Mat<S> result = backward(op, which, in, out, grad);
    dst = result;  // copied: `dst` keeps its memory
    return;
  }
  // As backward's kMatVec, into the caller's buffer.
  const Checked<S> c = check(op, in);
  ORPHEUS_ENFORCE(which >= 0 && which < arity(op), "{}: no operand {}", opName(op), which);
  checkShape(op, "gradient", grad, c.out);
  const Mat<S>& x = *c.a;
  if (which == 0) {
    dst.resize(x.rows(), x.cols());
    if (c.b) {
      dst.noalias() = grad * c.b->transpose();
    } else {
      dst.noalias() = grad * c.bSparse->transpose();
    }
    return;
  }
  ORPHEUS_ENFORCE(c.b != nullptr, "matvec: no gradient for sparse data");
  dst.resize(x.cols(), grad.cols());
  dst.noalias() = x.transpose() * grad;
}

template void forwardInto<float>(OpKind op, const Operands<float>& in, Mat<float>& out);
template void forwardInto<double>(OpKind op, const Operands<double>& in, Mat<double>& out);
template void backwardInto<float>(OpKind op, int which, const Operands<float>& in, const Mat<float>& out,
                                  const Mat<float>& grad, Mat<float>& dst);
template void backwardInto<double>(OpKind op, int which, const Operands<double>& in, const Mat<double>& out,
                                   const Mat<double>& grad, Mat<double>& dst);
template Mat<float> forward<float>(OpKind op, const Operands<float>& in);
template Mat<double> forward<double>(OpKind op, const Operands<double>& in);
template Mat<float> backward<float>(OpKind op, int which, const Operands<float>& in, const Mat<float>& out,
                                    const Mat<float>& grad);
template Mat<double> backward<double>(OpKind op, int which, const Operands<double>& in, const Mat<double>& out,
                                      const Mat<double>& grad);

}  // namespace orpheus::ops
