// Quasi-Newton SVs for models parameterized by a vector x of length n.
//
// At clock k, with iterates x_k, x_{k+1} and gradient g, let
//     s = x_{k+1} - x_k,    y = g(x_{k+1}) - g(x_k),
// and W the current n x n approximation of the INVERSE Hessian, for both methods
// (the step is d = W g: no solve). With h = W y, gamma = y^T h and rho = 1 / y^T s,
// the rank-2 update of W is expressed by two sufficient vectors with coefficients
// (+1, -1), U = V = [a, v]:
//     W += a a^T - v v^T = U diag(+1, -1) U^T
//   DFP:   a = s / sqrt(y^T s),                          v = h / sqrt(gamma)
//   BFGS:  a = (h - (1/2 + rho gamma) s) / sqrt(gamma),  v = (h - s / 2) / sqrt(gamma)
// which are the textbook updates H + s s^T/(s^T y) - H y y^T H/(y^T H y) and the
// inverse BFGS update (Nocedal and Wright, eq. 6.17)
//     (I - rho s y^T) H (I - rho y s^T) + rho s s^T
//     = H + (rho + rho^2 gamma) s s^T - rho (s h^T + h s^T),
// whose symmetric 2 x 2 core in the basis [s, h] is written as a difference of two
// squares: a a^T - v v^T has s s^T coefficient (1/2 + rho gamma)^2/gamma - 1/(4 gamma)
// = rho + rho^2 gamma, cross coefficient -rho and no h h^T term. (Paper section
// 3.1.1 writes BFGS on the Hessian B, whose SVs are y and B s; the inverse form has
// the same rank and SVs in the span of s and W y, and spares a Cholesky solve with
// W every step: O(n^2) a step instead of O(n^3).)
//
// An update is skipped (W stays as it is) when the curvature condition fails,
//     y^T s <= eps * ||y|| * ||s||,
// or when the quadratic form y^T W y is not positive (W has lost definiteness to
// rounding). Skipping keeps W symmetric positive definite, so the next search
// direction is a descent direction; it is also what happens when s = 0. A skipped
// update is an empty optional here and a batch with 0 columns on the wire (see
// toSvBatch), which every receiver applies as a no-op.
//
// The SVs and the update are templated on the scalar S: float (the engine's
// parameter type) and double (reference checks) are instantiated.
#pragma once

#include "engine/base/sv_batch.h"

#include <Eigen/Dense>

#include <array>
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
  QnMatrix<S> u;       // n x 2: [a, v] as above
  QnVector<S> coeffs;  // (+1, -1)
};

// Identifies the SVs of the update of w (the inverse Hessian approximation) from
// the step s and gradient change y. w must be n x n, symmetric positive definite; s and y have length n (checked:
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
  double initialScale = 1.0;  // W_0 = initialScale * I (the inverse Hessian's guess), > 0
  double curvatureEps = kDefaultCurvatureEps;
};

// The coefficients of the SVs of one update in the basis [s, h = W y], from the
// scalars y^T s and gamma = y^T W y: a = c[0] s + c[1] h, v = c[2] s + c[3] h (the
// formulas above). Requires y^T s > 0 and gamma > 0.
std::array<double, 4> qnSvCoefficients(QuasiNewtonMethod method, double ys, double gamma);

// One update of W decided from scalars alone, so that a host in double and a device
// in float (which reads back only the products of s, y and h) take the same
// decisions: skipped (the rules above), or W = scale * W + a a^T - v v^T with a, v
// from `coefficients` in the basis [s, h] of the UNSCALED W's h = W y. `scaleFirst`:
// before its first update W is scaled to the pair's curvature, y^T s / y^T y
// (Nocedal and Wright, eq. 6.20). Inputs: y^T s, y^T y, s^T s, gamma = y^T W y.
struct QnUpdate {
  bool skip = true;
  double scale = 1.0;
  std::array<double, 4> coefficients{};
};
QnUpdate planQnUpdate(QuasiNewtonMethod method, double ys, double yy, double ss, double gamma, bool scaleFirst,
                      double curvatureEps = kDefaultCurvatureEps);

// The SVs of an update that is not skipped, from s and h = W y (W before the scaling).
template <typename S>
QnSvs<S> qnSvsOf(const QnUpdate& update, const QnVector<S>& s, const QnVector<S>& h);

// Minimizes a smooth function given its gradient, with
//     x_{k+1} = x_k - lr * d_k,   d_k = W_k g(x_k)  (W approximates the inverse Hessian)
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
  // when the update was skipped (W unchanged).
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
  extern template QnSvs<S> qnSvsOf<S>(const QnUpdate&, const QnVector<S>&, const QnVector<S>&);                  \
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
