// --optimizer bfgs and dfp (engine/worker/optimizer.h): iterates against a float64
// textbook BFGS / DFP with the same scaling and skip rule, the curvature safeguard on
// a non-convex function, and the state (W, x_prev, d_prev, skips) exported and
// imported mid-run without changing a bit of what follows.
#include "engine/worker/optimizer.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <random>

using namespace orpheus;
using engine::OptimizerKind;
using engine::OptimizerSettings;

namespace {

using MatrixD = Eigen::MatrixXd;
using VectorD = Eigen::VectorXd;

// Multiclass logistic regression in float64: W (classes x features) and b (classes),
// flattened as the optimizer flattens them (W column-major, then b); the mean
// softmax cross-entropy's gradient.
struct Logistic {
  MatrixD x;              // features x examples
  std::vector<int> y;     // labels
  int classes = 3;

  VectorD gradient(const VectorD& theta) const {
    const auto f = x.rows();
    const Eigen::Map<const MatrixD> w(theta.data(), classes, f);
    const VectorD b = theta.tail(classes);
    MatrixD a = w * x;
    a.colwise() += b;
    MatrixD gw = MatrixD::Zero(classes, f);
    VectorD gb = VectorD::Zero(classes);
    for (Eigen::Index e = 0; e < x.cols(); ++e) {
      VectorD p = (a.col(e).array() - a.col(e).maxCoeff()).exp();
      p /= p.sum();
      p(y[static_cast<size_t>(e)]) -= 1.0;
      gw += p * x.col(e).transpose();
      gb += p;
    }
    VectorD g(theta.size());
    g << Eigen::Map<const VectorD>(gw.data(), gw.size()) / double(x.cols()), gb / double(x.cols());
    return g;
  }
};

Logistic makeProblem() {
  std::mt19937 gen(11);
  std::normal_distribution<double> normal;
  Logistic p;
  p.x.resize(6, 60);
  for (Eigen::Index e = 0; e < p.x.cols(); ++e) {
    const int label = static_cast<int>(e % 3);
    p.y.push_back(label);
    for (Eigen::Index i = 0; i < p.x.rows(); ++i) p.x(i, e) = normal(gen) + (i == label ? 1.5 : 0.0);
  }
  return p;
}

// The textbook updates in float64, with the optimizer's first-pair scaling and skip
// rule; bfgs on the Hessian, solving with it (the engine keeps the inverse: the same
// iterates in exact arithmetic).
struct ReferenceQn {
  bool bfgs = true;
  double lr = 1.0;
  MatrixD w;
  VectorD xPrev, gPrev;
  int steps = 0, skips = 0;

  void step(VectorD& x, const VectorD& g) {
    ++steps;
    if (steps > 1) {
      const VectorD s = x - xPrev, y = g - gPrev;
      const double ys = y.dot(s);
      const bool first = steps - 2 == skips;
      if (ys > 1e-8 * y.norm() * s.norm()) {
        if (first) w *= bfgs ? y.squaredNorm() / ys : ys / y.squaredNorm();
        if (bfgs) {
          const VectorD ws = w * s;
          w += y * y.transpose() / ys - ws * ws.transpose() / s.dot(ws);
        } else {
          const VectorD wy = w * y;
          w += s * s.transpose() / ys - wy * wy.transpose() / y.dot(wy);
        }
      } else {
        ++skips;
      }
    }
    xPrev = x;
    gPrev = g;
    x -= lr * (bfgs ? VectorD(w.ldlt().solve(g)) : VectorD(w * g));
  }
};

ParamSet toParams(const VectorD& theta, int classes, Eigen::Index features) {
  ParamSet p;
  p.params.push_back({"W", Eigen::Map<const MatrixD>(theta.data(), classes, features).cast<float>()});
  p.params.push_back({"b", theta.tail(classes).cast<float>()});
  return p;
}

VectorD fromParams(const ParamSet& p) {
  VectorD theta(p[0].size() + p[1].size());
  theta << p[0].reshaped().cast<double>(), p[1].reshaped().cast<double>();
  return theta;
}

OptimizerSettings qnSettings(OptimizerKind kind) {
  OptimizerSettings s;
  s.kind = kind;
  s.lr = 1.0;
  return s;
}

}  // namespace

TEST_CASE("bfgs and dfp follow a float64 textbook reference for 20 steps", "[optimizer][quasi-newton]") {
  const Logistic problem = makeProblem();
  const Eigen::Index n = 3 * 6 + 3;
  for (const OptimizerKind kind : {OptimizerKind::kBfgs, OptimizerKind::kDfp}) {
    const bool bfgs = kind == OptimizerKind::kBfgs;
    INFO((bfgs ? "bfgs" : "dfp"));
    ParamSet params = toParams(VectorD::Zero(n), 3, 6);
    engine::Optimizer opt(qnSettings(kind), params);
    ReferenceQn ref{bfgs, 1.0, MatrixD::Identity(n, n), {}, {}};
    VectorD x = VectorD::Zero(n);
    double worst = 0.0;
    for (int c = 1; c <= 20; ++c) {
      // The engine sees the gradient in float, at its float iterate; the reference
      // in double at its own.
      const VectorD gEngine = problem.gradient(fromParams(params));
      ParamSet grad = toParams(gEngine, 3, 6);
      opt.step(static_cast<uint64_t>(c), grad, params);
      ref.step(x, problem.gradient(x));
      worst = std::max(worst, (fromParams(params) - x).norm() / x.norm());
    }
    CHECK(opt.steps() == 20);
    CHECK(opt.skips() == ref.skips);
    CHECK(worst <= 1e-6);
    // And it minimises: the gradient at the last iterate is small.
    CHECK(problem.gradient(fromParams(params)).norm() < 0.1 * problem.gradient(VectorD::Zero(n)).norm());
    UNSCOPED_INFO("worst relative difference over 20 steps: " << worst);
  }
}

TEST_CASE("the curvature safeguard skips W's update where y^T s <= 0", "[optimizer][quasi-newton]") {
  // f(x) = (x1^2 - x2^2) / 2: from (0.5, 1) the first step has y^T s = lr^2 (x1^2 - x2^2) < 0.
  for (const OptimizerKind kind : {OptimizerKind::kBfgs, OptimizerKind::kDfp}) {
    ParamSet params;
    params.params.push_back({"x", Matrix(2, 1)});
    params[0] << 0.5f, 1.0f;
    OptimizerSettings s = qnSettings(kind);
    s.lr = 0.1;
    engine::Optimizer opt(s, params);
    for (int c = 1; c <= 2; ++c) {
      ParamSet grad;
      grad.params.push_back({"x", Matrix(2, 1)});
      grad[0] << params[0](0), -params[0](1);
      opt.step(static_cast<uint64_t>(c), grad, params);
    }
    CHECK(opt.skips() == 1);
    // W is still the identity it started as (no update, no scaling).
    const ParamSet state = opt.exportState();
    const int w = state.find("optimizer/quasi_newton/h");
    REQUIRE(w >= 0);
    CHECK(state[static_cast<size_t>(w)].isApprox(Matrix::Identity(2, 2), 0.0f));
  }
}

TEST_CASE("quasi-Newton state exported and imported mid-run changes nothing", "[optimizer][quasi-newton]") {
  const Logistic problem = makeProblem();
  const Eigen::Index n = 3 * 6 + 3;
  for (const OptimizerKind kind : {OptimizerKind::kBfgs, OptimizerKind::kDfp}) {
    ParamSet straight = toParams(VectorD::Zero(n), 3, 6);
    engine::Optimizer a(qnSettings(kind), straight);
    ParamSet resumed = straight;
    engine::Optimizer b(qnSettings(kind), resumed);
    for (int c = 1; c <= 12; ++c) {
      if (c == 6) {
        engine::Optimizer fresh(qnSettings(kind), resumed);
        fresh.importState(b.exportState());
        b = fresh;
      }
      for (auto [opt, params] : {std::pair{&a, &straight}, std::pair{&b, &resumed}}) {
        ParamSet grad = toParams(problem.gradient(fromParams(*params)), 3, 6);
        opt->step(static_cast<uint64_t>(c), grad, *params);
      }
    }
    for (size_t i = 0; i < straight.size(); ++i) CHECK(straight[i] == resumed[i]);
    const ParamSet sa = a.exportState(), sb = b.exportState();
    REQUIRE(sa.size() == sb.size());
    for (size_t i = 0; i < sa.size(); ++i) CHECK(sa[i] == sb[i]);
    CHECK(sa.find("optimizer/W/x_prev") >= 0);
    CHECK(sa.find("optimizer/b/d_prev") >= 0);
  }
}

TEST_CASE("bfgs state saved with the Hessian is read as its inverse", "[optimizer][quasi-newton]") {
  // A snapshot from before W approximated the inverse Hessian: "optimizer/quasi_newton/w".
  ParamSet params;
  params.params.push_back({"x", Matrix::Zero(2, 1)});
  for (const OptimizerKind kind : {OptimizerKind::kBfgs, OptimizerKind::kDfp}) {
    engine::Optimizer writer(qnSettings(kind), params);
    ParamSet state = writer.exportState();
    const int h = state.find("optimizer/quasi_newton/h");
    REQUIRE(h >= 0);
    state.params[static_cast<size_t>(h)].name = "optimizer/quasi_newton/w";
    state.params[static_cast<size_t>(h)].value << 4.0f, 0.0f, 0.0f, 2.0f;
    engine::Optimizer reader(qnSettings(kind), params);
    reader.importState(state);
    Matrix expected(2, 2);
    if (kind == OptimizerKind::kBfgs) {
      expected << 0.25f, 0.0f, 0.0f, 0.5f;
    } else {
      expected << 4.0f, 0.0f, 0.0f, 2.0f;
    }
    const ParamSet read = reader.exportState();
    CHECK(read[static_cast<size_t>(read.find("optimizer/quasi_newton/h"))] == expected);
    // Not positive definite: refused, naming the entry.
    state.params[static_cast<size_t>(h)].value << -1.0f, 0.0f, 0.0f, 1.0f;
    if (kind == OptimizerKind::kBfgs) {
      CHECK_THROWS_WITH(reader.importState(state), Catch::Contains("optimizer/quasi_newton/w"));
    }
  }
}
