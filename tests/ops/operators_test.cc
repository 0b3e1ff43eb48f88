#include "engine/base/error.h"
#include "ops/operators.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace orpheus;
using namespace orpheus::ops;

namespace {

using MatD = Mat<double>;
using MatF = Mat<float>;

const std::vector<OpKind> kAllOps = {
    OpKind::kSquaredL2, OpKind::kL2Norm,   OpKind::kL1,           OpKind::kSum,  OpKind::kSoftmax,
    OpKind::kLogSoftmax, OpKind::kSigmoid, OpKind::kTanh,         OpKind::kRelu, OpKind::kExp,
    OpKind::kLog,       OpKind::kScale,    OpKind::kCrossEntropy, OpKind::kDot,  OpKind::kSquaredDistance,
    OpKind::kAdd,       OpKind::kSubtract, OpKind::kMultiply,     OpKind::kMatVec,
};

// Where an operand's values are drawn from, so that finite differences never
// straddle a kink or leave an operator's domain.
enum class Domain {
  kNormal,
  kAwayFromZero,  // |x| >= 1e-3: relu and the norms have kinks at 0
  kPositive,      // [0.1, 3]: log
  kSimplex,       // each column a probability distribution
  kOneHot,        // each column a unit vector
};

MatD draw(Domain d, Eigen::Index rows, Eigen::Index cols, std::mt19937& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.1, 3.0);
  MatD m(rows, cols);
  for (Eigen::Index j = 0; j < cols; ++j) {
    for (Eigen::Index i = 0; i < rows; ++i) {
      switch (d) {
        case Domain::kNormal:
        case Domain::kSimplex:
          m(i, j) = normal(rng);
          break;
        case Domain::kAwayFromZero: {
          const double v = normal(rng);
          m(i, j) = std::copysign(1e-3 + std::abs(v), v);
          break;
        }
        case Domain::kPositive:
          m(i, j) = uniform(rng);
          break;
        case Domain::kOneHot:
          m(i, j) = 0.0;
          break;
      }
    }
  }
  if (d == Domain::kSimplex) {
    m = m.array().exp().matrix();
    m.array().rowwise() /= m.colwise().sum().array();
  }
  if (d == Domain::kOneHot) {
    std::uniform_int_distribution<Eigen::Index> pick(0, rows - 1);
    for (Eigen::Index j = 0; j < cols; ++j) m(pick(rng), j) = 1.0;
  }
  return m;
}

double relErr(const MatD& got, const MatD& want) {
  return (got - want).norm() / std::max(want.norm(), 1e-10);
}

std::string shapeStr(const MatD& m) { return std::to_string(m.rows()) + "x" + std::to_string(m.cols()); }

// Checks backward(op, which) for every operand against finite differences of
// L = sum(R .* forward(op, a, b)) with a fixed random R, so every output
// component contributes. The five-point central stencil has O(h^4) truncation
// error, which lets h be large enough (1e-4 relative) that rounding in L stays
// far below the 1e-6 tolerance.
void checkGradients(OpKind op, MatD a, std::optional<MatD> b, std::mt19937& rng, double attr = 1.0) {
  Operands<double> in;
  in.a = &a;
  in.b = b ? &*b : nullptr;
  in.attr = attr;
  const MatD out = forward(op, in);
  std::normal_distribution<double> normal(0.0, 1.0);
  MatD weights(out.rows(), out.cols());
  for (Eigen::Index k = 0; k < weights.size(); ++k) weights(k) = normal(rng);

  for (int which = 0; which < arity(op); ++which) {
    MatD& x = which == 0 ? a : *b;
    const MatD analytic = backward(op, which, in, out, weights);
    INFO(opName(op) << " operand " << which << ", a " << shapeStr(a) << (b ? ", b " + shapeStr(*b) : ""));
    REQUIRE(analytic.rows() == x.rows());
    REQUIRE(analytic.cols() == x.cols());

    MatD fd(x.rows(), x.cols());
    for (Eigen::Index k = 0; k < x.size(); ++k) {
      const double saved = x(k);
      const double h = 1e-4 * std::max(std::abs(saved), 0.1);
      const auto objective = [&](double v) {
        x(k) = v;
        return weights.cwiseProduct(forward(op, in)).sum();
      };
      fd(k) = (-objective(saved + 2 * h) + 8 * objective(saved + h) - 8 * objective(saved - h) +
               objective(saved - 2 * h)) /
              (12 * h);
      x(k) = saved;
    }
    // A softmax over one class is constant, so its gradient is zero up to rounding
    // and a relative error means nothing; require both sides to be negligible.
    const double negligible = 1e-9 * weights.norm();
    if (fd.norm() <= negligible) {
      INFO("|analytic| " << analytic.norm() << ", |fd| " << fd.norm());
      CHECK(analytic.norm() <= negligible);
      continue;
    }
    const double err = relErr(analytic, fd);
    INFO("relative error " << err << ", |fd| " << fd.norm());
    CHECK(err <= 1e-6);
  }
}

struct UnaryCase {
  OpKind op;
  Domain domain;
};

struct BinaryCase {
  OpKind op;
  Domain a;
  Domain b;
};

const std::vector<UnaryCase> kUnaryCases = {
    {OpKind::kSquaredL2, Domain::kNormal}, {OpKind::kL2Norm, Domain::kAwayFromZero},
    {OpKind::kL1, Domain::kAwayFromZero},  {OpKind::kSum, Domain::kNormal},
    {OpKind::kSoftmax, Domain::kNormal},   {OpKind::kLogSoftmax, Domain::kNormal},
    {OpKind::kSigmoid, Domain::kNormal},   {OpKind::kTanh, Domain::kNormal},
    {OpKind::kRelu, Domain::kAwayFromZero}, {OpKind::kExp, Domain::kNormal},
    {OpKind::kLog, Domain::kPositive},     {OpKind::kScale, Domain::kNormal},
};

const std::vector<BinaryCase> kBinaryCases = {
    {OpKind::kCrossEntropy, Domain::kSimplex, Domain::kOneHot},
    {OpKind::kCrossEntropy, Domain::kSimplex, Domain::kSimplex},
    {OpKind::kDot, Domain::kNormal, Domain::kNormal},
    {OpKind::kSquaredDistance, Domain::kNormal, Domain::kNormal},
    {OpKind::kAdd, Domain::kNormal, Domain::kNormal},
    {OpKind::kSubtract, Domain::kNormal, Domain::kNormal},
    {OpKind::kMultiply, Domain::kNormal, Domain::kNormal},
};

const std::vector<Eigen::Index> kRows = {1, 3, 17};
const std::vector<Eigen::Index> kBatches = {1, 5};

}  // namespace

TEST_CASE("unary operators: backward matches finite differences", "[operators]") {
  std::mt19937 rng(1234);
  for (const UnaryCase& c : kUnaryCases) {
    for (Eigen::Index r : kRows) {
      for (Eigen::Index batch : kBatches) {
        checkGradients(c.op, draw(c.domain, r, batch, rng), std::nullopt, rng, c.op == OpKind::kScale ? -1.7 : 1.0);
      }
    }
  }
}

TEST_CASE("binary operators: backward matches finite differences", "[operators]") {
  std::mt19937 rng(2345);
  for (const BinaryCase& c : kBinaryCases) {
    for (Eigen::Index r : kRows) {
      for (Eigen::Index batch : kBatches) {
        checkGradients(c.op, draw(c.a, r, batch, rng), draw(c.b, r, batch, rng), rng);
      }
    }
  }
}

TEST_CASE("type 4 operators broadcast an r x 1 operand in either position", "[operators]") {
  std::mt19937 rng(3456);
  for (OpKind op : {OpKind::kAdd, OpKind::kSubtract, OpKind::kMultiply}) {
    for (Eigen::Index r : kRows) {
      for (Eigen::Index batch : kBatches) {
        checkGradients(op, draw(Domain::kNormal, r, batch, rng), draw(Domain::kNormal, r, 1, rng), rng);
        checkGradients(op, draw(Domain::kNormal, r, 1, rng), draw(Domain::kNormal, r, batch, rng), rng);
      }
    }

    // Forward against an explicitly repeated operand; backward of the column is the row sum.
    const MatD full = draw(Domain::kNormal, 4, 6, rng);
    const MatD column = draw(Domain::kNormal, 4, 1, rng);
    const MatD repeated = column.replicate(1, 6);
    const MatD grad = draw(Domain::kNormal, 4, 6, rng);
    for (int columnPos = 0; columnPos < 2; ++columnPos) {
      INFO(opName(op) << " column operand at position " << columnPos);
      Operands<double> bc;
      Operands<double> dense;
      bc.a = columnPos == 0 ? &column : &full;
      bc.b = columnPos == 0 ? &full : &column;
      dense.a = columnPos == 0 ? &repeated : &full;
      dense.b = columnPos == 0 ? &full : &repeated;
      const MatD out = forward(op, bc);
      REQUIRE(out.rows() == 4);
      REQUIRE(out.cols() == 6);
      CHECK(relErr(out, forward(op, dense)) <= 1e-15);
      const MatD gColumn = backward(op, columnPos, bc, out, grad);
      REQUIRE(gColumn.rows() == 4);
      REQUIRE(gColumn.cols() == 1);
      CHECK(relErr(gColumn, backward(op, columnPos, dense, out, grad).rowwise().sum()) <= 1e-14);
      const MatD gFull = backward(op, 1 - columnPos, bc, out, grad);
      CHECK(relErr(gFull, backward(op, 1 - columnPos, dense, out, grad)) <= 1e-15);
    }
  }
}

TEST_CASE("matvec: dense gradients and sparse data", "[operators]") {
  std::mt19937 rng(4567);
  for (Eigen::Index j : {1, 4}) {
    for (Eigen::Index k : kRows) {
      for (Eigen::Index batch : kBatches) {
        checkGradients(OpKind::kMatVec, draw(Domain::kNormal, j, k, rng), draw(Domain::kNormal, k, batch, rng), rng);
      }
    }
  }

  SECTION("sparse data agrees with its dense copy") {
    const MatD w = draw(Domain::kNormal, 5, 17, rng);
    MatD x = draw(Domain::kNormal, 17, 6, rng);
    std::bernoulli_distribution keep(0.3);
    for (Eigen::Index k = 0; k < x.size(); ++k) {
      if (!keep(rng)) x(k) = 0.0;
    }
    const SparseMat<double> xs = x.sparseView();
    Operands<double> dense;
    dense.a = &w;
    dense.b = &x;
    Operands<double> sparse;
    sparse.a = &w;
    sparse.bSparse = &xs;
    const MatD out = forward(OpKind::kMatVec, sparse);
    CHECK(relErr(out, forward(OpKind::kMatVec, dense)) <= 1e-14);
    const MatD grad = draw(Domain::kNormal, 5, 6, rng);
    const MatD gw = backward(OpKind::kMatVec, 0, sparse, out, grad);
    REQUIRE(gw.rows() == 5);
    REQUIRE(gw.cols() == 17);
    CHECK(relErr(gw, backward(OpKind::kMatVec, 0, dense, out, grad)) <= 1e-14);
    CHECK_THROWS_AS(backward(OpKind::kMatVec, 1, sparse, out, grad), Error);
    CHECK_THROWS_WITH(backward(OpKind::kMatVec, 1, sparse, out, grad),
                      Catch::Contains("matvec: no gradient for sparse data"));
  }
}

TEST_CASE("float instantiations agree with double", "[operators]") {
  std::mt19937 rng(5678);
  std::vector<BinaryCase> cases;
  for (const UnaryCase& c : kUnaryCases) cases.push_back({c.op, c.domain, c.domain});
  cases.insert(cases.end(), kBinaryCases.begin(), kBinaryCases.end());
  cases.push_back({OpKind::kMatVec, Domain::kNormal, Domain::kNormal});

  for (const BinaryCase& c : cases) {
    const bool binary = arity(c.op) == 2;
    const Eigen::Index rows = 17;
    const Eigen::Index batch = 5;
    // Inputs rounded to float first, so both precisions see the same values.
    const bool matvec = c.op == OpKind::kMatVec;
    const MatF af = draw(c.a, matvec ? 4 : rows, matvec ? rows : batch, rng).cast<float>();
    const MatF bf = draw(c.b, rows, batch, rng).cast<float>();
    const MatD ad = af.cast<double>();
    const MatD bd = bf.cast<double>();
    Operands<float> inF;
    inF.a = &af;
    inF.b = binary ? &bf : nullptr;
    inF.attr = 0.75f;
    Operands<double> inD;
    inD.a = &ad;
    inD.b = binary ? &bd : nullptr;
    inD.attr = 0.75;
    INFO(opName(c.op));
    const MatF outF = forward(c.op, inF);
    const MatD outD = forward(c.op, inD);
    CHECK(relErr(outF.cast<double>(), outD) <= 1e-5);
    const MatD gradD = draw(Domain::kNormal, outD.rows(), outD.cols(), rng).cast<float>().cast<double>();
    const MatF gradF = gradD.cast<float>();
    for (int which = 0; which < arity(c.op); ++which) {
      INFO("operand " << which);
      const MatF gF = backward(c.op, which, inF, outF, gradF);
      const MatD gD = backward(c.op, which, inD, outD, gradD);
      CHECK(relErr(gF.cast<double>(), gD) <= 1e-5);
    }
  }
}

TEST_CASE("mismatched shapes throw naming both shapes", "[operators]") {
  const MatD a(10, 100);
  const MatD b(9, 100);
  Operands<double> in;
  in.a = &a;
  in.b = &b;
  CHECK_THROWS_AS(forward(OpKind::kAdd, in), Error);
  CHECK_THROWS_WITH(forward(OpKind::kAdd, in), Catch::Contains("add: operands of shape 10x100 and 9x100 do not match"));

  const MatD c(3, 5);
  const MatD d(3, 4);
  in.a = &c;
  in.b = &d;
  CHECK_THROWS_WITH(forward(OpKind::kSubtract, in), Catch::Contains("sub: operands of shape 3x5 and 3x4"));
  CHECK_THROWS_WITH(forward(OpKind::kMultiply, in), Catch::Contains("mul: operands of shape 3x5 and 3x4"));

  // Only type 4 operators broadcast.
  const MatD column(3, 1);
  in.b = &column;
  CHECK_THROWS_WITH(forward(OpKind::kDot, in), Catch::Contains("dot: operands of shape 3x5 and 3x1"));
  CHECK_THROWS_WITH(forward(OpKind::kSquaredDistance, in), Catch::Contains("3x5 and 3x1"));
  CHECK_THROWS_WITH(forward(OpKind::kCrossEntropy, in), Catch::Contains("3x5 and 3x1"));
  CHECK_NOTHROW(forward(OpKind::kAdd, in));

  const MatD w(4, 3);
  const MatD x(5, 2);
  in.a = &w;
  in.b = &x;
  CHECK_THROWS_AS(forward(OpKind::kMatVec, in), Error);
  CHECK_THROWS_WITH(forward(OpKind::kMatVec, in), Catch::Contains("matvec: operands of shape 4x3 and 5x2"));
  const SparseMat<double> xs(5, 2);
  in.b = nullptr;
  in.bSparse = &xs;
  CHECK_THROWS_WITH(forward(OpKind::kMatVec, in), Catch::Contains("4x3 and 5x2"));
  const MatD grad(4, 2);
  CHECK_THROWS_WITH(backward(OpKind::kMatVec, 0, in, grad, grad), Catch::Contains("4x3 and 5x2"));

  // A gradient of the wrong shape is caught too.
  in.a = &c;
  in.b = nullptr;
  in.bSparse = nullptr;
  const MatD out = MatD::Zero(1, 5);
  const MatD wrongGrad = MatD::Zero(1, 4);
  CHECK_THROWS_AS(backward(OpKind::kSum, 0, in, out, wrongGrad), Error);
  // So is an operand index the operator does not have.
  CHECK_THROWS_AS(backward(OpKind::kSum, 1, in, out, out), Error);
}

TEST_CASE("operator names, types and elementwise flags", "[operators]") {
  const std::vector<std::string> names = {"sq_l2", "l2_norm", "l1",  "sum",           "softmax", "log_softmax", "sigmoid",
                                          "tanh",  "relu",    "exp", "log",           "scale",   "cross_entropy", "dot",
                                          "sq_dist", "add",   "sub", "mul",           "matvec"};
  REQUIRE(names.size() == kAllOps.size());
  for (std::size_t i = 0; i < kAllOps.size(); ++i) {
    CHECK(std::string(opName(kAllOps[i])) == names[i]);
    const auto back = opFromName(opName(kAllOps[i]));
    REQUIRE(back.has_value());
    CHECK(*back == kAllOps[i]);
  }
  CHECK_FALSE(opFromName("nope").has_value());
  CHECK_FALSE(opFromName("").has_value());
  CHECK_FALSE(opFromName("Add").has_value());

  const std::vector<std::pair<int, std::vector<OpKind>>> table = {
      {1, {OpKind::kSquaredL2, OpKind::kL2Norm, OpKind::kL1, OpKind::kSum}},
      {2,
       {OpKind::kSoftmax, OpKind::kLogSoftmax, OpKind::kSigmoid, OpKind::kTanh, OpKind::kRelu, OpKind::kExp,
        OpKind::kLog, OpKind::kScale}},
      {3, {OpKind::kCrossEntropy, OpKind::kDot, OpKind::kSquaredDistance}},
      {4, {OpKind::kAdd, OpKind::kSubtract, OpKind::kMultiply}},
      {5, {OpKind::kMatVec}},
  };
  std::size_t listed = 0;
  for (const auto& [type, ops] : table) {
    for (OpKind op : ops) {
      INFO(opName(op));
      CHECK(operatorType(op) == type);
      CHECK(arity(op) == (type <= 2 ? 1 : 2));
      ++listed;
    }
  }
  CHECK(listed == kAllOps.size());

  const std::set<OpKind> elementwise = {OpKind::kSigmoid, OpKind::kTanh,     OpKind::kRelu,    OpKind::kExp,
                                        OpKind::kLog,     OpKind::kScale,    OpKind::kAdd,     OpKind::kSubtract,
                                        OpKind::kMultiply};
  for (OpKind op : kAllOps) {
    INFO(opName(op));
    CHECK(isElementwise(op) == (elementwise.count(op) == 1));
  }
}

TEST_CASE("operators stay finite at extreme and degenerate inputs", "[operators]") {
  Operands<double> in;

  SECTION("softmax and log_softmax of large logits") {
    MatD x(3, 2);
    x << 1000, -1000, 1001, -1001, 999, -999;
    in.a = &x;
    const MatD p = forward(OpKind::kSoftmax, in);
    CHECK(p.allFinite());
    CHECK((p.colwise().sum().array() - 1.0).abs().maxCoeff() <= 1e-15);
    const MatD lp = forward(OpKind::kLogSoftmax, in);
    CHECK(lp.allFinite());
    CHECK(relErr(lp, p.array().log().matrix()) <= 1e-14);
  }

  SECTION("sigmoid saturates without NaN") {
    MatD x(1, 4);
    x << -1000, -40, 40, 1000;
    in.a = &x;
    const MatD s = forward(OpKind::kSigmoid, in);
    CHECK(s.allFinite());
    CHECK(s(0, 0) == 0.0);
    CHECK(s(0, 3) == 1.0);
  }

  SECTION("cross_entropy clamps p = 0 where the target is 0") {
    MatD p(3, 1);
    p << 0.0, 0.25, 0.75;
    MatD t(3, 1);
    t << 0.0, 0.0, 1.0;
    in.a = &p;
    in.b = &t;
    const MatD out = forward(OpKind::kCrossEntropy, in);
    CHECK(out(0, 0) == Approx(-std::log(0.75)));
    const MatD grad = MatD::Ones(1, 1);
    CHECK(backward(OpKind::kCrossEntropy, 0, in, out, grad).allFinite());
    CHECK(backward(OpKind::kCrossEntropy, 1, in, out, grad).allFinite());
  }

  SECTION("relu passes no gradient at zero") {
    MatD x(1, 3);
    x << -0.0, 0.0, 2.0;
    in.a = &x;
    const MatD out = forward(OpKind::kRelu, in);
    const MatD g = backward(OpKind::kRelu, 0, in, out, MatD(MatD::Ones(1, 3)));
    CHECK(g(0, 0) == 0.0);
    CHECK(g(0, 1) == 0.0);
    CHECK(g(0, 2) == 1.0);
  }

  SECTION("norms have zero gradient at zero") {
    const MatD x = MatD::Zero(4, 2);
    in.a = &x;
    const MatD grad = MatD::Ones(1, 2);
    for (OpKind op : {OpKind::kL2Norm, OpKind::kL1}) {
      INFO(opName(op));
      const MatD out = forward(op, in);
      CHECK(out.isZero());
      const MatD g = backward(op, 0, in, out, grad);
      CHECK(g.allFinite());
      CHECK(g.isZero());
    }
  }
}
