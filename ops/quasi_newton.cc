#include "ops/quasi_newton.h"

#include "engine/base/error.h"
#include "ops/rebuild.h"

#include <cmath>
#include <type_traits>
#include <utility>

namespace orpheus::ops {

std::array<double, 4> qnSvCoefficients(QuasiNewtonMethod method, double ys, double gamma) {
  ORPHEUS_ENFORCE(ys > 0 && gamma > 0, "quasi-Newton SVs need y^T s > 0 and y^T W y > 0: got {} and {}", ys, gamma);
  const double root = std::sqrt(gamma);
  if (method == QuasiNewtonMethod::kDfp) return {1.0 / std::sqrt(ys), 0.0, 0.0, 1.0 / root};
  return {-(0.5 + gamma / ys) / root, 1.0 / root, -0.5 / root, 1.0 / root};
}

QnUpdate planQnUpdate(QuasiNewtonMethod method, double ys, double yy, double ss, double gamma, bool scaleFirst,
                      double curvatureEps) {
  ORPHEUS_ENFORCE(curvatureEps >= 0, "curvature eps {} is negative", curvatureEps);
  QnUpdate out;
  // Written as !(a > b) so that NaN also skips.
  if (!(ys > curvatureEps * std::sqrt(yy) * std::sqrt(ss))) return out;
  if (scaleFirst) out.scale = ys / yy;  // yy > 0: ys > 0 above
  if (!(out.scale * gamma > 0)) return out;
  out.skip = false;
  out.coefficients = qnSvCoefficients(method, ys, out.scale * gamma);
  out.coefficients[1] *= out.scale;  // h of the scaled W is scale * h
  out.coefficients[3] *= out.scale;
  return out;
}

template <typename S>
std::optional<QnSvs<S>> identifyQnSvs(QuasiNewtonMethod method, const QnMatrix<S>& w, const QnVector<S>& s,
                                      const QnVector<S>& y, S curvatureEps) {
  const int64_t n = s.size();
  ORPHEUS_ENFORCE(y.size() == n && w.rows() == n && w.cols() == n,
                  "quasi-Newton SVs need s, y of one length and a square W: got {}, {} and {}x{}", n, y.size(),
                  w.rows(), w.cols());
  const QnVector<S> h = w * y;
  const QnUpdate plan = planQnUpdate(method, static_cast<double>(y.dot(s)), static_cast<double>(y.squaredNorm()),
                                     static_cast<double>(s.squaredNorm()), static_cast<double>(y.dot(h)), false,
                                     static_cast<double>(curvatureEps));
  if (plan.skip) return std::nullopt;
  return qnSvsOf<S>(plan, s, h);
}

template <typename S>
QnSvs<S> qnSvsOf(const QnUpdate& update, const QnVector<S>& s, const QnVector<S>& h) {
  ORPHEUS_ENFORCE(!update.skip && s.size() == h.size(), "SVs of a skipped update, or of s and h of lengths {} and {}",
                  s.size(), h.size());
  const std::array<double, 4>& c = update.coefficients;
  QnSvs<S> out;
  out.u.resize(s.size(), 2);
  out.u.col(0) = static_cast<S>(c[0]) * s + static_cast<S>(c[1]) * h;
  out.u.col(1) = static_cast<S>(c[2]) * s + static_cast<S>(c[3]) * h;
  out.coeffs.resize(2);
  out.coeffs << S(1), S(-1);
  return out;
}

template <typename S>
std::optional<QnSvs<S>> identifyQnSvs(QuasiNewtonMethod method, const QnMatrix<S>& w, const QnVector<S>& x,
                                      const QnVector<S>& xNext,
                                      const std::function<QnVector<S>(const QnVector<S>&)>& gradient,
                                      S curvatureEps) {
  ORPHEUS_ENFORCE(x.size() == xNext.size(), "iterates have lengths {} and {}", x.size(), xNext.size());
  const QnVector<S> y = gradient(xNext) - gradient(x);
  return identifyQnSvs<S>(method, w, QnVector<S>(xNext - x), y, curvatureEps);
}

template <typename S>
void applySvUpdate(const QnSvs<S>& svs, QnMatrix<S>& w) {
  ORPHEUS_ENFORCE(svs.u.cols() == svs.coeffs.size() && w.rows() == svs.u.rows() && w.cols() == svs.u.rows(),
                  "SVs of shape {}x{} with {} coefficients do not fit W of shape {}x{}", svs.u.rows(), svs.u.cols(),
                  svs.coeffs.size(), w.rows(), w.cols());
  // Same association as the engine's rebuild: (U diag(c)) V^T with V = U.
  w.noalias() += (svs.u * svs.coeffs.asDiagonal()) * svs.u.transpose();
}

template <typename S>
SvBatch toSvBatch(const std::optional<QnSvs<S>>& svs, int64_t dim, uint32_t paramId) {
  ORPHEUS_ENFORCE(dim >= 0, "dimension {} is negative", dim);
  SvBatch batch;
  SvMatrix m;
  m.paramId = paramId;
  if (svs) {
    ORPHEUS_ENFORCE(svs->u.rows() == dim && svs->u.cols() == svs->coeffs.size(),
                    "SVs of shape {}x{} with {} coefficients do not fit dimension {}", svs->u.rows(), svs->u.cols(),
                    svs->coeffs.size(), dim);
    m.u = svs->u.template cast<float>();
    batch.coeffs = svs->coeffs.template cast<float>();
  } else {
    m.u.resize(dim, 0);
    batch.coeffs.resize(0);
  }
  m.vDense = m.u;
  batch.matrices.push_back(std::move(m));
  return batch;
}

template <typename S>
QuasiNewtonSolver<S>::QuasiNewtonSolver(GradientFn gradient, QnVector<S> x0, QuasiNewtonOptions options)
    : gradientFn_(std::move(gradient)), options_(options), x_(std::move(x0)) {
  ORPHEUS_ENFORCE(static_cast<bool>(gradientFn_), "quasi-Newton solver needs a gradient function");
  ORPHEUS_ENFORCE(options_.learningRate > 0, "learning rate {} is not positive", options_.learningRate);
  ORPHEUS_ENFORCE(options_.initialScale > 0, "initial scale {} is not positive", options_.initialScale);
  ORPHEUS_ENFORCE(options_.curvatureEps >= 0, "curvature eps {} is negative", options_.curvatureEps);
  const int64_t n = x_.size();
  g_ = gradientFn_(x_);
  ORPHEUS_ENFORCE(g_.size() == n, "gradient has length {}, parameters {}", g_.size(), n);
  w_ = QnMatrix<S>::Identity(n, n) * static_cast<S>(options_.initialScale);
}

template <typename S>
std::optional<QnSvs<S>> QuasiNewtonSolver<S>::step() {
  const QnVector<S> d = w_ * g_;
  QnVector<S> xNext = x_ - static_cast<S>(options_.learningRate) * d;
  QnVector<S> gNext = gradientFn_(xNext);
  ORPHEUS_ENFORCE(gNext.size() == x_.size(), "gradient has length {}, parameters {}", gNext.size(), x_.size());

  std::optional<QnSvs<S>> svs = identifyQnSvs<S>(options_.method, w_, QnVector<S>(xNext - x_),
                                                 QnVector<S>(gNext - g_), static_cast<S>(options_.curvatureEps));
  if (svs) applyUpdate(*svs);
  x_ = std::move(xNext);
  g_ = std::move(gNext);
  ++iteration_;
  return svs;
}

template <typename S>
void QuasiNewtonSolver<S>::applyUpdate(const QnSvs<S>& svs) {
  if constexpr (std::is_same_v<S, float>) {
    // Through the engine's rebuild path; moving W in and out of the ParamSet is O(1).
    const SvBatch batch = toSvBatch<S>(svs, w_.rows(), 0);
    ParamSet params;
    params.params.push_back({"W", std::move(w_)});
    const SvBatch* batches[] = {&batch};
    applySvBatches(batches, params);
    w_ = std::move(params.params[0].value);
  } else {
    applySvUpdate(svs, w_);
  }
}

#define ORPHEUS_QN_INSTANTIATE(S)                                                                         \
  template QnSvs<S> qnSvsOf<S>(const QnUpdate&, const QnVector<S>&, const QnVector<S>&);                  \
  template std::optional<QnSvs<S>> identifyQnSvs<S>(QuasiNewtonMethod, const QnMatrix<S>&,                \
                                                    const QnVector<S>&, const QnVector<S>&, S);           \
  template std::optional<QnSvs<S>> identifyQnSvs<S>(QuasiNewtonMethod, const QnMatrix<S>&,                \
                                                    const QnVector<S>&, const QnVector<S>&,               \
                                                    const std::function<QnVector<S>(const QnVector<S>&)>&, \
                                                    S);                                                   \
  template void applySvUpdate<S>(const QnSvs<S>&, QnMatrix<S>&);                                          \
  template SvBatch toSvBatch<S>(const std::optional<QnSvs<S>>&, int64_t, uint32_t);                       \
  template class QuasiNewtonSolver<S>;
ORPHEUS_QN_INSTANTIATE(float)
ORPHEUS_QN_INSTANTIATE(double)
#undef ORPHEUS_QN_INSTANTIATE

}  // namespace orpheus::ops
