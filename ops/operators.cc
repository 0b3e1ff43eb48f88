#include "ops/operators.h"

#include "engine/base/error.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <utility>

namespace orpheus::ops {

namespace {

struct OpInfo {
  OpKind op;
  const char* name;
  int type;
  bool elementwise;
};

// Indexed by the enum's value, so lookups by kind are a single array access.
constexpr std::array<OpInfo, 19> kOps{{
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
}};

constexpr bool tableMatchesEnum() {
  for (std::size_t i = 0; i < kOps.size(); ++i) {
    if (static_cast<std::size_t>(kOps[i].op) != i) return false;
  }
  return static_cast<std::size_t>(OpKind::kMatVec) + 1 == kOps.size();
}
static_assert(tableMatchesEnum(), "kOps must list every OpKind in declaration order");

const OpInfo& info(OpKind op) {
  const auto i = static_cast<std::size_t>(op);
  if (i >= kOps.size()) throw Error(fmt::format("unknown operator kind {}", i));
  return kOps[i];
}

template <typename S>
using RowVec = Eigen::Matrix<S, 1, Eigen::Dynamic>;

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

// Column-wise softmax. Subtracting each column's max first keeps exp from
// overflowing without changing the result.
template <typename S>
Mat<S> softmaxForward(const Mat<S>& x) {
  if (x.size() == 0) return Mat<S>(x.rows(), x.cols());  // maxCoeff is undefined on empty columns
  const RowVec<S> colMax = x.colwise().maxCoeff();
  Mat<S> p = (x.rowwise() - colMax).array().exp().matrix();
  const RowVec<S> inv = p.colwise().sum().cwiseInverse();
  p.array().rowwise() *= inv.array();
  return p;
}

template <typename S>
Mat<S> logSoftmaxForward(const Mat<S>& x) {
  if (x.size() == 0) return Mat<S>(x.rows(), x.cols());
  const RowVec<S> colMax = x.colwise().maxCoeff();
  Mat<S> out = x.rowwise() - colMax;
  const RowVec<S> logSum = out.array().exp().colwise().sum().log().matrix();
  out.rowwise() -= logSum;
  return out;
}

template <typename S>
Mat<S> typeFourForward(OpKind op, const Mat<S>& a, const Mat<S>& b) {
  const Broadcast bc = broadcastOf(a, b);
  switch (op) {
    case OpKind::kAdd:
      if (bc == Broadcast::kB) return a.colwise() + b.col(0);
      if (bc == Broadcast::kA) return b.colwise() + a.col(0);
      return a + b;
    case OpKind::kSubtract:
      if (bc == Broadcast::kB) return a.colwise() - b.col(0);
      if (bc == Broadcast::kA) return a.col(0).replicate(1, b.cols()) - b;
      return a - b;
    case OpKind::kMultiply:
      if (bc == Broadcast::kB) return (a.array().colwise() * b.col(0).array()).matrix();
      if (bc == Broadcast::kA) return (b.array().colwise() * a.col(0).array()).matrix();
      return a.cwiseProduct(b);
    default:
      throw Error(fmt::format("{} is not a type 4 operator", opName(op)));
  }
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
      if (selfBroadcast) return grad.rowwise().sum();
      return grad;
    case OpKind::kSubtract:
      if (which == 0) {
        if (selfBroadcast) return grad.rowwise().sum();
        return grad;
      }
      if (selfBroadcast) return -grad.rowwise().sum();
      return -grad;
    case OpKind::kMultiply: {
      const Mat<S>& other = which == 0 ? b : a;
      if (selfBroadcast) return (grad.array() * other.array()).rowwise().sum().matrix();
      if (otherBroadcast) return (grad.array().colwise() * other.col(0).array()).matrix();
      return grad.cwiseProduct(other);
    }
    default:
      throw Error(fmt::format("{} is not a type 4 operator", opName(op)));
  }
}

}  // namespace

int operatorType(OpKind op) { return info(op).type; }

int arity(OpKind op) { return info(op).type <= 2 ? 1 : 2; }

const char* opName(OpKind op) { return info(op).name; }

std::optional<OpKind> opFromName(const std::string& name) {
  for (const OpInfo& oi : kOps) {
    if (name == oi.name) return oi.op;
  }
  return std::nullopt;
}

bool isElementwise(OpKind op) { return info(op).elementwise; }

template <typename S>
Mat<S> forward(OpKind op, const Operands<S>& in) {
  const Checked<S> c = check(op, in);
  const Mat<S>& x = *c.a;
  // The smallest normal number: clamping p there keeps log finite for p = 0.
  constexpr S tiny = std::numeric_limits<S>::min();
  switch (op) {
    case OpKind::kSquaredL2:
      return x.colwise().squaredNorm();
    case OpKind::kL2Norm:
      return x.colwise().norm();
    case OpKind::kL1:
      return x.cwiseAbs().colwise().sum();
    case OpKind::kSum:
      return x.colwise().sum();
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
    case OpKind::kCrossEntropy:
      return -(c.b->array() * x.array().max(tiny).log()).colwise().sum().matrix();
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
  }
  throw Error(fmt::format("unknown operator kind {}", static_cast<int>(op)));
}

template <typename S>
Mat<S> backward(OpKind op, int which, const Operands<S>& in, const Mat<S>& out, const Mat<S>& grad) {
  const Checked<S> c = check(op, in);
  ORPHEUS_ENFORCE(which >= 0 && which < arity(op), "{}: no operand {}", opName(op), which);
  checkShape(op, "gradient", grad, c.out);
  const Mat<S>& x = *c.a;
  constexpr S tiny = std::numeric_limits<S>::min();
  // Type 1 and 3 gradients are 1 x B: one factor per column, broadcast down the rows.
  const auto g = [&grad] { return grad.row(0).array(); };
  switch (op) {
    case OpKind::kSquaredL2:
      return (x.array().rowwise() * (S(2) * g())).matrix();
    case OpKind::kL2Norm: {
      checkShape(op, "forward output", out, c.out);
      // d||x||/dx = x / ||x||, taken as 0 at x = 0 where the norm has no gradient.
      const RowVec<S> coef = (out.array() > S(0)).select(grad.array() / out.array(), S(0)).matrix();
      return (x.array().rowwise() * coef.array()).matrix();
    }
    case OpKind::kL1:
      return (x.array().sign().rowwise() * g()).matrix();
    case OpKind::kSum:
      return grad.replicate(x.rows(), 1);
    case OpKind::kSoftmax: {
      checkShape(op, "forward output", out, c.out);
      const RowVec<S> pg = out.cwiseProduct(grad).colwise().sum();
      return (out.array() * (grad.array().rowwise() - pg.array())).matrix();
    }
    case OpKind::kLogSoftmax: {
      checkShape(op, "forward output", out, c.out);
      // softmax(x) is exp of the output, so it need not be recomputed from x.
      const RowVec<S> gSum = grad.colwise().sum();
      return (grad.array() - out.array().exp().rowwise() * gSum.array()).matrix();
    }
    case OpKind::kSigmoid:
      checkShape(op, "forward output", out, c.out);
      return (grad.array() * out.array() * (S(1) - out.array())).matrix();
    case OpKind::kTanh:
      checkShape(op, "forward output", out, c.out);
      return (grad.array() * (S(1) - out.array().square())).matrix();
    case OpKind::kRelu:
      return (x.array() > S(0)).select(grad.array(), S(0)).matrix();
    case OpKind::kExp:
      checkShape(op, "forward output", out, c.out);
      return grad.cwiseProduct(out);
    case OpKind::kLog:
      return grad.cwiseQuotient(x);
    case OpKind::kScale:
      return in.attr * grad;
    case OpKind::kCrossEntropy:
      if (which == 0) return ((c.b->array() / x.array().max(tiny)).rowwise() * -g()).matrix();
      return (x.array().max(tiny).log().rowwise() * -g()).matrix();
    case OpKind::kDot:
      return ((which == 0 ? *c.b : x).array().rowwise() * g()).matrix();
    case OpKind::kSquaredDistance:
      return ((x - *c.b).array().rowwise() * ((which == 0 ? S(2) : S(-2)) * g())).matrix();
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
      // Data enters as a sparse operand and is never trained, so its gradient is
      // not defined rather than densified at J x B cost.
      ORPHEUS_ENFORCE(c.b != nullptr, "matvec: no gradient for sparse data");
      Mat<S> dx(x.cols(), grad.cols());
      dx.noalias() = x.transpose() * grad;
      return dx;
    }
  }
  throw Error(fmt::format("unknown operator kind {}", static_cast<int>(op)));
}

template Mat<float> forward<float>(OpKind op, const Operands<float>& in);
template Mat<double> forward<double>(OpKind op, const Operands<double>& in);
template Mat<float> backward<float>(OpKind op, int which, const Operands<float>& in, const Mat<float>& out,
                                    const Mat<float>& grad);
template Mat<double> backward<double>(OpKind op, int which, const Operands<double>& in, const Mat<double>& out,
                                      const Mat<double>& grad);

}  // namespace orpheus::ops
