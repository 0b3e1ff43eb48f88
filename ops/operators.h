// The operators a loss expression is built from, grouped as in Table 1 of the
// Orpheus paper. Every operator works on a whole minibatch at once: a "vector"
// variable is an r x B matrix holding one r-vector per example (column), a
// "scalar" is 1 x B, and a matrix parameter is J x K. So a clock runs as matrix
// operations, never a loop over examples.
//
// Each operator has a forward and a backward (vector-Jacobian product). Templated
// on the scalar type: float for training, double for gradient checks.
#pragma once

#include <Eigen/Dense>
#include <Eigen/SparseCore>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <string>

namespace orpheus::ops {

enum class OpKind {
  // Type 1: vector -> scalar.
  kSquaredL2,  // sum_i x_i^2
  kL2Norm,     // sqrt(sum_i x_i^2)
  kL1,         // sum_i |x_i|
  kSum,        // sum_i x_i
  // Type 2: vector -> vector.
  kSoftmax,
  kLogSoftmax,
  kSigmoid,
  kTanh,
  kRelu,
  kExp,
  kLog,
  kScale,  // attr * x
  // Type 3: (vector, vector) -> scalar.
  kCrossEntropy,      // -sum_i t_i log p_i   (inputs: p, t)
  kDot,               // sum_i a_i b_i
  kSquaredDistance,   // sum_i (a_i - b_i)^2
  // Type 4: (vector, vector) -> vector, elementwise.
  kAdd,
  kSubtract,
  kMultiply,
  // Type 5: (matrix, vector) -> vector.
  kMatVec,  // W x
  // Type 6 (structural; not in Table 1): rows moved, not computed. Neither is a
  // type-5 site, so they change no SV: a matrix times concat(e, h) keeps one pair.
  kSlice,   // rows [first, first + rows) of x
  kConcat,  // [a; b]: a's rows, then b's
};

// 1..5 as in Table 1; 6 for the structural kSlice and kConcat.
int operatorType(OpKind op);
// Number of inputs (1 or 2).
int arity(OpKind op);
// Name in the .loss language: "sq_l2", "l2_norm", "l1", "sum", "softmax", "log_softmax",
// "sigmoid", "tanh", "relu", "exp", "log", "scale", "cross_entropy", "dot", "sq_dist",
// "add", "sub", "mul", "matvec", "slice", "concat". The language spells slices as
// chunk(x, k, n): the k-th of n equal row blocks (the gates of an LSTM's pre-activation).
const char* opName(OpKind op);
std::optional<OpKind> opFromName(const std::string& name);
// True for operators applied independently per element (sigmoid, tanh, relu, exp,
// log, scale, add, subtract, multiply): these can be fused into one pass.
bool isElementwise(OpKind op);
// True for the operators that reduce or normalise each column on its own (types 1 and
// 3, softmax and log_softmax): Backend::columnOp runs them.
bool isColumnOp(OpKind op);

template <typename S>
using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;

// The sum of m's columns, added one after another to zero: the order every backend's
// sumColumns keeps (the CUDA kernel's one thread a row too), so a bias update formed
// on the host has the bits of one formed on a device, and a replay that forms it on
// the other side still gives the live replica. (Eigen's rowwise().sum() pairs the
// columns up first.)
template <typename Derived>
Eigen::Matrix<typename Derived::Scalar, Eigen::Dynamic, 1> sumColumnsInOrder(const Eigen::MatrixBase<Derived>& m) {
  Eigen::Matrix<typename Derived::Scalar, Eigen::Dynamic, 1> sum =
      Eigen::Matrix<typename Derived::Scalar, Eigen::Dynamic, 1>::Zero(m.rows());
  for (Eigen::Index j = 0; j < m.cols(); ++j) sum += m.col(j);
  return sum;
}

// -sum_i t_i log(max(p_i, tiny)) of each column of p against t, into the row `loss`:
// the terms of nonzero t_i only, added in row order, so a one-hot t (a label over a
// vocabulary) costs one log a column instead of one a row. Every host form of the
// cross-entropy (the operator, the fused softmax + cross-entropy) computes it here.
template <typename P, typename T, typename L>
void crossEntropyColumns(const Eigen::MatrixBase<P>& p, const Eigen::MatrixBase<T>& t, Eigen::MatrixBase<L>& loss) {
  using S = typename P::Scalar;
  // The smallest normal number: clamping p there keeps log finite for p = 0.
  constexpr S tiny = std::numeric_limits<S>::min();
  for (Eigen::Index j = 0; j < p.cols(); ++j) {
    S sum = S(0);
    for (Eigen::Index i = 0; i < p.rows(); ++i) {
      const S ti = t(i, j);
      if (ti != S(0)) sum += ti * std::log(std::max(p(i, j), tiny));
    }
    loss(0, j) = -sum;
  }
}

template <typename S>
using SparseMat = Eigen::SparseMatrix<S, Eigen::ColMajor, int32_t>;

// The operands of one operator application. For every operator but kMatVec each
// operand is dense, r x B. Type 4 operators also accept an r x 1 operand (a bias
// vector) broadcast across the other operand's B columns. kMatVec: `a` is the J x K
// matrix, the vector operand is `b` (K x B dense) or `bSparse` (K x B sparse; data).
template <typename S>
struct Operands {
  const Mat<S>* a = nullptr;
  const Mat<S>* b = nullptr;
  const SparseMat<S>* bSparse = nullptr;
  S attr = S(1);  // kScale's factor
  Eigen::Index first = 0;  // kSlice: the first row taken
  Eigen::Index rows = 0;   // kSlice: how many rows
};

// The column reductions (sq_l2, l2_norm, l1, sum) of `x`, any Eigen matrix or map,
// written into `out` (1 x B): forward's values bit for bit, read where `x` lies.
// False, with `out` untouched, for any other operator.
template <class X, class Out>
bool reduceColumns(OpKind op, const X& x, Out& out) {
  switch (op) {
    case OpKind::kSquaredL2: out = x.colwise().squaredNorm(); return true;
    case OpKind::kL2Norm: out = x.colwise().norm(); return true;
    case OpKind::kL1: out = x.cwiseAbs().colwise().sum(); return true;
    case OpKind::kSum: out = x.colwise().sum(); return true;
    default: return false;
  }
}

// Output of `op` on the operands (shape: 1 x B for types 1 and 3, r x B otherwise,
// J x B for kMatVec). Log of a non-positive number and the like follow IEEE rules;
// kCrossEntropy clamps p at the smallest normal number before the log.
template <typename S>
Mat<S> forward(OpKind op, const Operands<S>& in);

// forward(op, in) written into `out`, whose memory is reused when it has the
// output's shape already (a buffer kept across minibatches): bitwise the same values.
template <typename S>
void forwardInto(OpKind op, const Operands<S>& in, Mat<S>& out);

// Vector-Jacobian product: given the upstream gradient `grad` (the output's shape)
// and the forward output `out`, returns d(sum of grad . output)/d(operand `which`),
// 0 for a/the first operand, 1 for b. The result has that operand's shape: an r x 1
// broadcast operand gets the column sum; for kMatVec, which = 0 gives grad * x^T
// (J x K) and which = 1 gives W^T grad (K x B; dense operands only). kSlice gives
// zeros but for `grad` in the sliced rows; kConcat gives its operand's rows of `grad`.
template <typename S>
Mat<S> backward(OpKind op, int which, const Operands<S>& in, const Mat<S>& out, const Mat<S>& grad);
// backward(...) written into `dst`, reusing its memory as forwardInto does.
template <typename S>
void backwardInto(OpKind op, int which, const Operands<S>& in, const Mat<S>& out, const Mat<S>& grad, Mat<S>& dst);

}  // namespace orpheus::ops
