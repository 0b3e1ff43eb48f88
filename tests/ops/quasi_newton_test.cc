#include "ops/quasi_newton.h"

#include "engine/base/error.h"
#include "engine/base/rng.h"
#include "engine/base/sv_batch.h"
#include "ops/rebuild.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <vector>

using namespace orpheus;
using ops::QnSvs;
using ops::QuasiNewtonMethod;
using ops::QuasiNewtonOptions;
using ops::QuasiNewtonSolver;

namespace {

using Mat = Eigen::MatrixXd;
using Vec = Eigen::VectorXd;
using GradientFn = std::function<Vec(const Vec&)>;

Mat randomMatrix(int64_t rows, int64_t cols, uint64_t key) {
  CounterRng rng(11, RngPurpose::kTest, key, 0);
  Mat m(rows, cols);
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t i = 0; i < rows; ++i) m(i, j) = rng.normal();
  return m;
}

// f(x) = 1/2 x^T A x - b^T x with A SPD (eigenvalues in about [0.5, 2]).
struct Quadratic {
  Mat a;
  Vec b;

  explicit Quadratic(int64_t n) {
    const Mat m = randomMatrix(n, n, 1);
    a = m.transpose() * m / (4.0 * n) + 0.5 * Mat::Identity(n, n);
    b = randomMatrix(n, 1, 2).col(0);
  }
  GradientFn gradient() const {
    return [a = a, b = b](const Vec& x) -> Vec { return a * x - b; };
  }
};

// Mean logistic loss of labels t in {-1, +1} on features A (m x n), plus l2 / 2 ||x||^2.
struct Logistic {
  Mat a;
  Vec t;
  double l2 = 0.1;

  Logistic(int64_t m, int64_t n) {
    a = randomMatrix(m, n, 3);
    const Vec truth = randomMatrix(n, 1, 4).col(0);
    const Vec noise = randomMatrix(m, 1, 5).col(0);
    t.resize(m);
    for (int64_t i = 0; i < m; ++i) t(i) = a.row(i).dot(truth) + noise(i) > 0 ? 1.0 : -1.0;
  }
  GradientFn gradient() const {
    return [a = a, t = t, l2 = l2](const Vec& x) -> Vec {
      const Vec margin = t.cwiseProduct(a * x);
      // d/dm log(1 + exp(-m)) = -sigmoid(-m)
      const Vec w = (-t).cwiseProduct((1.0 + margin.array().exp()).inverse().matrix());
      return a.transpose() * w / static_cast<double>(a.rows()) + l2 * x;
    };
  }
};

struct Trace {
  std::vector<Vec> x;  // x_0 .. x_K
  std::vector<Mat> w;  // W_0 .. W_K
};

// Dense textbook BFGS (on the Hessian, solving with it) / DFP (inverse Hessian) with
// the same step rule and skip rule; the solver keeps BFGS's inverse, so the trace
// records W^-1 for BFGS: the two agree in exact arithmetic.
Trace referenceRun(QuasiNewtonMethod method, const GradientFn& grad, Vec x, const QuasiNewtonOptions& opt,
                   int iterations) {
  const int64_t n = x.size();
  const bool bfgs = method == QuasiNewtonMethod::kBfgs;
  Mat w = (bfgs ? 1.0 / opt.initialScale : opt.initialScale) * Mat::Identity(n, n);
  Vec g = grad(x);
  Trace trace;
  trace.x.push_back(x);
  trace.w.push_back(bfgs ? Mat(w.inverse()) : w);
  for (int k = 0; k < iterations; ++k) {
    const Vec d = method == QuasiNewtonMethod::kBfgs ? Vec(w.ldlt().solve(g)) : Vec(w * g);
    const Vec xNext = x - opt.learningRate * d;
    const Vec gNext = grad(xNext);
    const Vec s = xNext - x;
    const Vec y = gNext - g;
    if (y.dot(s) > opt.curvatureEps * y.norm() * s.norm()) {
      if (method == QuasiNewtonMethod::kBfgs) {
        const Vec bs = w * s;
        w = w + y * y.transpose() / y.dot(s) - bs * bs.transpose() / s.dot(bs);
      } else {
        const Vec hy = w * y;
        w = w + s * s.transpose() / s.dot(y) - hy * hy.transpose() / y.dot(hy);
      }
    }
    x = xNext;
    g = gNext;
    trace.x.push_back(x);
    trace.w.push_back(bfgs ? Mat(w.inverse()) : w);
  }
  return trace;
}

double relDiff(const Mat& a, const Mat& b) { return (a - b).norm() / std::max(b.norm(), 1e-300); }

// Runs the SV-based solver next to the reference, checking every iteration.
void checkAgainstReference(QuasiNewtonMethod method, const GradientFn& grad, const Vec& x0, int iterations) {
  QuasiNewtonOptions opt;
  opt.method = method;
  const Trace ref = referenceRun(method, grad, x0, opt, iterations);
  QuasiNewtonSolver<double> solver(grad, x0, opt);
  CHECK(relDiff(solver.w(), ref.w[0]) == 0.0);
  int updates = 0;
  int compared = 0;
  const double g0 = grad(x0).norm();
  for (int k = 0; k < iterations; ++k) {
    INFO("iteration " << k);
    const Vec x = solver.x();
    // Once the gradient is at rounding level the secant pairs are rounding noise:
    // two correct runs (say, BLAS kernels chosen for different CPUs) part ways
    // there, so the comparison ends at convergence.
    if (grad(x).norm() <= 1e-9 * g0) break;
    ++compared;
    const Mat wBefore = solver.w();
    const std::optional<QnSvs<double>> svs = solver.step();
    const Vec s = solver.x() - x;
    const Vec y = grad(solver.x()) - grad(x);

    CHECK(relDiff(solver.x(), ref.x[k + 1]) < 1e-6);
    CHECK(relDiff(solver.w(), ref.w[k + 1]) < 1e-6);
    CHECK(solver.gradient().isApprox(grad(solver.x())));
    if (!svs) {
      CHECK(solver.w() == wBefore);
      continue;
    }
    ++updates;

    // Shape: two columns, coefficients (+1, -1); V is U by construction.
    REQUIRE(svs->u.rows() == x0.size());
    REQUIRE(svs->u.cols() == 2);
    CHECK(svs->coeffs(0) == 1.0);
    CHECK(svs->coeffs(1) == -1.0);
    // The update of W is exactly U diag(c) U^T.
    const Mat expected = wBefore + svs->u * svs->coeffs.asDiagonal() * svs->u.transpose();
    CHECK(relDiff(solver.w(), expected) < 1e-14);

    // Secant equation of the inverse: W y = s.
    CHECK((solver.w() * y - s).norm() <= 1e-8 * s.norm());
  }
  CHECK(updates >= compared / 2);
  CHECK(compared >= 5);
}

}  // namespace

TEST_CASE("SV-based BFGS and DFP match the dense textbook updates on a quadratic", "[ops][quasi_newton]") {
  const Quadratic q(8);
  const Vec x0 = randomMatrix(8, 1, 6).col(0);
  SECTION("BFGS") { checkAgainstReference(QuasiNewtonMethod::kBfgs, q.gradient(), x0, 20); }
  SECTION("DFP") { checkAgainstReference(QuasiNewtonMethod::kDfp, q.gradient(), x0, 20); }
}

TEST_CASE("SV-based BFGS and DFP match the dense textbook updates on logistic regression",
          "[ops][quasi_newton]") {
  const Logistic lr(40, 6);
  const Vec x0 = Vec::Zero(6);
  SECTION("BFGS") { checkAgainstReference(QuasiNewtonMethod::kBfgs, lr.gradient(), x0, 20); }
  SECTION("DFP") { checkAgainstReference(QuasiNewtonMethod::kDfp, lr.gradient(), x0, 20); }
}

TEST_CASE("quasi-Newton with unit step converges on a strictly convex quadratic", "[ops][quasi_newton]") {
  const Quadratic q(8);
  const Vec xStar = q.a.ldlt().solve(q.b);
  for (QuasiNewtonMethod method : {QuasiNewtonMethod::kBfgs, QuasiNewtonMethod::kDfp}) {
    QuasiNewtonOptions opt;
    opt.method = method;
    opt.learningRate = 1.0;
    QuasiNewtonSolver<double> solver(q.gradient(), Vec::Zero(8), opt);
    int k = 0;
    while (k < 30 && solver.gradient().norm() >= 1e-8) {
      solver.step();
      ++k;
    }
    INFO("method " << static_cast<int>(method) << ", iterations " << k);
    CHECK(solver.gradient().norm() < 1e-8);
    CHECK((solver.x() - xStar).norm() < 1e-7 * xStar.norm());
  }
}

TEST_CASE("the float SV batch survives the wire and rebuilds W like the double path", "[ops][quasi_newton]") {
  const Logistic lr(40, 6);
  for (QuasiNewtonMethod method : {QuasiNewtonMethod::kBfgs, QuasiNewtonMethod::kDfp}) {
    INFO("method " << static_cast<int>(method));
    QuasiNewtonOptions opt;
    opt.method = method;
    QuasiNewtonSolver<double> solver(lr.gradient(), Vec::Zero(6), opt);
    for (int k = 0; k < 8; ++k) {
      const Mat wBefore = solver.w();
      const std::optional<QnSvs<double>> svs = solver.step();
      REQUIRE(svs);

      SvBatch batch = ops::toSvBatch<double>(svs, 6, 1);
      batch.header.clock = static_cast<uint64_t>(k);
      batch.header.sender = 3;
      REQUIRE(batch.numColumns() == 2);
      REQUIRE(batch.matrices.size() == 1);
      const SvMatrix& m = batch.matrices[0];
      CHECK(m.paramId == 1);
      CHECK(m.biasId == -1);
      CHECK_FALSE(m.sparseV);
      CHECK(m.core.size() == 0);
      CHECK(m.u == m.vDense);
      CHECK(batch.coeffs(0) == 1.0f);
      CHECK(batch.coeffs(1) == -1.0f);

      SvBatchExpectation expect;
      expect.sender = 3;
      expect.clock = k;
      expect.paramShapes = {{2, 2}, {6, 6}};
      const SvBatch decoded = decode(encode(batch), expect);
      REQUIRE(decoded.matrices.size() == 1);
      CHECK(decoded.coeffs == batch.coeffs);
      CHECK(decoded.matrices[0].u == m.u);
      CHECK(decoded.matrices[0].vDense == m.vDense);
      CHECK(decoded.matrices[0].paramId == 1);

      ParamSet params;
      params.params.push_back({"other", Matrix::Zero(2, 2)});
      params.params.push_back({"W", wBefore.cast<float>()});
      const SvBatch* batches[] = {&decoded};
      ops::applySvBatches(batches, params);
      CHECK(relDiff(params[1].cast<double>(), solver.w()) < 1e-5);
      CHECK(params[0].isZero(0));
    }
  }
}

TEST_CASE("the float solver updates W through the engine rebuild and tracks the double solver",
          "[ops][quasi_newton]") {
  const Logistic lr(40, 6);
  const GradientFn gradD = lr.gradient();
  const ops::QuasiNewtonSolver<float>::GradientFn gradF = [gradD](const Eigen::VectorXf& x) -> Eigen::VectorXf {
    return gradD(x.cast<double>()).cast<float>();
  };
  for (QuasiNewtonMethod method : {QuasiNewtonMethod::kBfgs, QuasiNewtonMethod::kDfp}) {
    INFO("method " << static_cast<int>(method));
    QuasiNewtonOptions opt;
    opt.method = method;
    QuasiNewtonSolver<double> d(gradD, Vec::Zero(6), opt);
    QuasiNewtonSolver<float> f(gradF, Eigen::VectorXf::Zero(6), opt);
    for (int k = 0; k < 4; ++k) {
      d.step();
      f.step();
      CHECK(relDiff(f.x().cast<double>(), d.x()) < 1e-3);
      CHECK(relDiff(f.w().cast<double>(), d.w()) < 1e-3);
    }
    for (int k = 0; k < 16; ++k) f.step();
    CHECK(f.gradient().norm() < 1e-4f);
  }
}

TEST_CASE("quasi-Newton updates are skipped when the curvature condition fails", "[ops][quasi_newton]") {
  const int64_t n = 5;
  const Mat w = Mat::Identity(n, n) * 2.0;
  const Vec s = randomMatrix(n, 1, 7).col(0);
  for (QuasiNewtonMethod method : {QuasiNewtonMethod::kBfgs, QuasiNewtonMethod::kDfp}) {
    INFO("method " << static_cast<int>(method));
    // Negative curvature.
    CHECK_FALSE(ops::identifyQnSvs<double>(method, w, s, Vec(-s)));
    // y orthogonal to s.
    Vec y = randomMatrix(n, 1, 8).col(0);
    y -= y.dot(s) / s.squaredNorm() * s;
    CHECK_FALSE(ops::identifyQnSvs<double>(method, w, s, y));
    // Curvature positive but below eps * ||y|| ||s||.
    const Vec small = y + 1e-10 * s;
    CHECK_FALSE(ops::identifyQnSvs<double>(method, w, s, small, 1e-6));
    CHECK(ops::identifyQnSvs<double>(method, w, s, small, 0.0));
    // No step at all.
    CHECK_FALSE(ops::identifyQnSvs<double>(method, w, Vec::Zero(n), Vec::Zero(n)));
    // Positive curvature is accepted.
    CHECK(ops::identifyQnSvs<double>(method, w, s, Vec(3.0 * s)));

    // The iterate form computes s and y from the gradient.
    const GradientFn concave = [](const Vec& x) -> Vec { return -x; };
    CHECK_FALSE(ops::identifyQnSvs<double>(method, w, Vec::Zero(n), s, concave));

    // In the solver W stays as it was while x keeps moving.
    QuasiNewtonOptions opt;
    opt.method = method;
    opt.initialScale = 2.0;
    opt.learningRate = 0.1;
    QuasiNewtonSolver<double> solver(concave, s, opt);
    for (int k = 0; k < 3; ++k) {
      const Vec before = solver.x();
      CHECK_FALSE(solver.step());
      CHECK(solver.w() == w);
      CHECK((solver.x() - before).norm() > 0);
    }
    CHECK(solver.iteration() == 3);

    // On the wire a skipped update is a 0-column batch that rebuilds to nothing.
    const SvBatch empty = ops::toSvBatch<double>(std::nullopt, n, 0);
    CHECK(empty.numColumns() == 0);
    const SvBatch decoded = decode(encode(empty));
    REQUIRE(decoded.matrices.size() == 1);
    CHECK(decoded.matrices[0].u.rows() == n);
    CHECK(decoded.matrices[0].u.cols() == 0);
    ParamSet params;
    params.params.push_back({"W", w.cast<float>()});
    const SvBatch* batches[] = {&decoded};
    ops::applySvBatches(batches, params);
    CHECK(params[0] == w.cast<float>());
  }
}

TEST_CASE("quasi-Newton inputs are checked", "[ops][quasi_newton]") {
  const Mat w = Mat::Identity(3, 3);
  CHECK_THROWS_AS(ops::identifyQnSvs<double>(QuasiNewtonMethod::kBfgs, w, Vec::Ones(4), Vec::Ones(4)), Error);
  CHECK_THROWS_AS(ops::identifyQnSvs<double>(QuasiNewtonMethod::kBfgs, w, Vec::Ones(3), Vec::Ones(2)), Error);
  QnSvs<double> svs;
  svs.u = Mat::Ones(3, 2);
  svs.coeffs = Vec::Ones(2);
  CHECK_THROWS_AS(ops::toSvBatch<double>(svs, 4), Error);
  Mat w4 = Mat::Identity(4, 4);
  CHECK_THROWS_AS(ops::applySvUpdate(svs, w4), Error);
  QuasiNewtonOptions opt;
  opt.learningRate = 0;
  const GradientFn grad = [](const Vec& x) -> Vec { return x; };
  CHECK_THROWS_AS(QuasiNewtonSolver<double>(grad, Vec::Ones(3), opt), Error);
  const GradientFn wrong = [](const Vec&) -> Vec { return Vec::Ones(2); };
  CHECK_THROWS_AS(QuasiNewtonSolver<double>(wrong, Vec::Ones(3)), Error);
}

TEST_CASE("the BFGS SVs are the textbook inverse update, the DFP SVs the textbook DFP", "[ops][quasi_newton]") {
  const int64_t n = 7;
  const Mat m = randomMatrix(n, n, 9);
  const Mat w = m * m.transpose() / double(n) + 0.3 * Mat::Identity(n, n);
  const Vec s = randomMatrix(n, 1, 10).col(0);
  const Vec y = 0.7 * s + 0.2 * randomMatrix(n, 1, 11).col(0);
  REQUIRE(y.dot(s) > 0);
  const double rho = 1.0 / y.dot(s);
  const Mat eye = Mat::Identity(n, n);
  const Mat bfgs = (eye - rho * s * y.transpose()) * w * (eye - rho * y * s.transpose()) + rho * s * s.transpose();
  const Vec h = w * y;
  const Mat dfp = w + rho * s * s.transpose() - h * h.transpose() / y.dot(h);
  for (auto [method, expected] : {std::pair{QuasiNewtonMethod::kBfgs, bfgs}, std::pair{QuasiNewtonMethod::kDfp, dfp}}) {
    INFO("method " << static_cast<int>(method));
    const std::optional<QnSvs<double>> svs = ops::identifyQnSvs<double>(method, w, s, y);
    REQUIRE(svs);
    Mat updated = w;
    ops::applySvUpdate(*svs, updated);
    CHECK(relDiff(updated, expected) < 1e-13);
    CHECK((updated * y - s).norm() <= 1e-12 * s.norm());
    // The coefficients in the basis [s, W y] give the same columns.
    const std::array<double, 4> c = ops::qnSvCoefficients(method, y.dot(s), y.dot(h));
    CHECK((svs->u.col(0) - (c[0] * s + c[1] * h)).norm() == 0.0);
    CHECK((svs->u.col(1) - (c[2] * s + c[3] * h)).norm() == 0.0);
  }
}
