// Quasi-Newton SVs for models parameterized by a vector x of length n.
//
// At clock k, with iterates x_k, x_{k+1} and gradient g, let
//     s = x_{k+1} - x_k,    y = g(x_{k+1}) - g(x_k),
// and W the current n x n approximation. The rank-2 update of W is expressed by
// two sufficient vectors with coefficients (+1, -1), U = V = [a, v]:
//     W += a a^T - v v^T = U diag(+1, -1) U^T
//   BFGS (W approximates the Hessian):          a = y / sqrt(y^T s),  v = W s / sqrt(s^T W s)
//   DFP  (W approximates the inverse Hessian):  a = s / sqrt(y^T s),  v = W y / sqrt(y^T W y)
// which are the textbook updates B + y y^T/(y^T s) - B s s^T B/(s^T B s) and
// H + s s^T/(s^T y) - H y y^T H/(y^T H y).
//
// An update is skipped (W stays as it is) when the curvature condition fails,
//     y^T s <= eps * ||y|| * ||s||,
// or when the quadratic form s^T W s (BFGS) / y^T W y (DFP) is not positive (W has
// lost definiteness to rounding). Skipping keeps W symmetric positive definite, so
// the next search direction is a descent direction; it is also what happens when
// s = 0. A skipped update is an empty optional here and a batch with 0 columns on
// the wire (see toSvBatch), which every receiver applies as a no-op.
//
// The SVs and the update are templated on the scalar S: float (the engine's
// parameter type) and double (reference checks) are instantiated.
#pragma once

#include "engine/base/sv_batch.h"

#include <Eigen/Dense>

#include <cstdint>
#include <functional>
#include <optional>

namespace orpheus::ops {

enum class QuasiNewtonMethod { kBfgs, kDfp };

template <typename S>
using QnMatrix = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
template <typename S>
using QnVector = Eigen::Matrix<S, Eigen::Dynamic, 1>;

inline constexpr double kDefaultCurvatureEps = 1e-8;

// The SVs of one update of W (n x n): W += u * diag(coeffs) * u^T. V equals U.
template <typename S>
struct QnSvs {
  QnMatrix<S> u;       // n x 2: [y, v] (BFGS) or [s, v] (DFP), scaled as above
  QnVector<S> coeffs;  // (+1, -1)
};

// Identifies the SVs of the update of w from the step s and gradient change y.
// w must be n x n, symmetric positive definite; s and y have length n (checked:
// Error on mismatch). Returns nullopt when the update is skipped (see above).
// curvatureEps >= 0.
template <typename S>
std::optional<QnSvs<S>> identifyQnSvs(QuasiNewtonMethod method, const QnMatrix<S>& w, const QnVector<S>& s,
                                      const QnVector<S>& y, S curvatureEps = S(kDefaultCurvatureEps));

// The same, from the iterates of clock k and k+1: s = xNext - x, y = g(xNext) - g(x).
template <typename S>
std::optional<QnSvs<S>> identifyQnSvs(QuasiNewtonMethod method, const QnMatrix<S>& w, const QnVector<S>& x,
                                      const QnVector<S>& xNext,
                                      const std::function<QnVector<S>(const QnVector<S>&)>& gradient,
                                      S curvatureEps = S(kDefaultCurvatureEps));

// W += U diag(coeffs) U^T as one GEMM: the rebuild that ops::applySvBatches performs
// for a batch from toSvBatch, in precision S (applySvBatches is float only).
template <typename S>
void applySvUpdate(const QnSvs<S>& svs, QnMatrix<S>& w);

// The update as an engine SV batch (float, one dense SvMatrix with paramId, no bias,
// no core, U = V = svs.u, coeffs = svs.coeffs) for the wire, the log, and
// ops::applySvBatches. The header is left default; the caller fills it in.
// A skipped update (nullopt) gives a batch with 0 columns whose matrix is dim x dim,
// so a clock still has its record. dim must equal svs->u.rows() when given SVs.
template <typename S>
SvBatch toSvBatch(const std::optional<QnSvs<S>>& svs, int64_t dim, uint32_t paramId = 0);

struct QuasiNewtonOptions {
  QuasiNewtonMethod method = QuasiNewtonMethod::kBfgs;
  double learningRate = 1.0;  // fixed step size lr > 0; there is no line search
  double initialScale = 1.0;  // W_0 = initialScale * I, > 0
  double curvatureEps = kDefaultCurvatureEps;
};

// Minimizes a smooth function given its gradient, with
//     x_{k+1} = x_k - lr * d_k,   d_k = W_k^{-1} g(x_k) (BFGS, by LDLT of W_k)
//                                 d_k = W_k g(x_k)      (DFP)
// and W_{k+1} obtained from W_k ONLY through the SVs of clock k: for S = float by
// ops::applySvBatches on a ParamSet holding W (the engine's rebuild path), for other
// S by applySvUpdate (the same rebuild in precision S).
// The solver owns x and W; it calls gradient once per step (plus once at
// construction) and requires it to return a vector of length n.
template <typename S>
class QuasiNewtonSolver {
 public:
  using GradientFn = std::function<QnVector<S>(const QnVector<S>&)>;

  QuasiNewtonSolver(GradientFn gradient, QnVector<S> x0, QuasiNewtonOptions options = {});

  // One iteration: moves x, then updates W. Returns the SVs applied to W, or nullopt
  // when the update was skipped (W unchanged). Throws Error if the BFGS W cannot be
  // factored as positive semidefinite.
  std::optional<QnSvs<S>> step();

  const QnVector<S>& x() const { return x_; }
  const QnVector<S>& gradient() const { return g_; }  // g(x())
  const QnMatrix<S>& w() const { return w_; }
  int64_t iteration() const { return iteration_; }  // steps taken
  const QuasiNewtonOptions& options() const { return options_; }

 private:
  void applyUpdate(const QnSvs<S>& svs);

  GradientFn gradientFn_;
  QuasiNewtonOptions options_;
  QnVector<S> x_;
  QnVector<S> g_;
  QnMatrix<S> w_;
  int64_t iteration_ = 0;
};

#define ORPHEUS_QN_DECLARE(S)                                                                                      \
  extern template std::optional<QnSvs<S>> identifyQnSvs<S>(QuasiNewtonMethod, const QnMatrix<S>&,                \
                                                           const QnVector<S>&, const QnVector<S>&, S);           \
  extern template std::optional<QnSvs<S>> identifyQnSvs<S>(                                                      \
      QuasiNewtonMethod, const QnMatrix<S>&, const QnVector<S>&, const QnVector<S>&,                             \
      const std::function<QnVector<S>(const QnVector<S>&)>&, S);                                                 \
  extern template void applySvUpdate<S>(const QnSvs<S>&, QnMatrix<S>&);                                          \
  extern template SvBatch toSvBatch<S>(const std::optional<QnSvs<S>>&, int64_t, uint32_t);                       \
  extern template class QuasiNewtonSolver<S>;
ORPHEUS_QN_DECLARE(float)
ORPHEUS_QN_DECLARE(double)
#undef ORPHEUS_QN_DECLARE

}  // namespace orpheus::ops
