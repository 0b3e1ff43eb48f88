// Expression graphs: the .loss parser, reverse-mode gradients against finite
// differences (float64), automatic SV identification, and the fusion plan.
#include "engine/base/error.h"
#include "engine/base/rng.h"
#include "ops/graph_exec.h"
#include "ops/graph_model.h"
#include "ops/loss_parser.h"
#include "ops/mlr.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <random>

using namespace orpheus;
using namespace orpheus::ops;

namespace {

const std::string kExamples = std::string(ORPHEUS_SOURCE_DIR) + "/examples/";

Mat<double> randomMat(int64_t r, int64_t c, std::mt19937& gen, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  Mat<double> m(r, c);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = d(gen);
  return m;
}

// Checks d(sum loss)/d(param) from the SVs against central differences on a sample
// of entries, and d/d(local) for data-dependent variables.
void checkGradients(const Graph& g, const GraphInputs<double>& in, std::vector<Mat<double>> params, std::mt19937& gen,
                    int samplesPerParam = 40) {
  GraphExecutor<double> exec(g);
  auto ptrs = [&] {
    std::vector<const Mat<double>*> p;
    for (auto& m : params) p.push_back(&m);
    return p;
  };
  exec.forward(ptrs(), in);
  exec.backward(ptrs(), in);
  const std::vector<Mat<double>> grads = exec.paramGradients(ptrs(), in);
  std::vector<Mat<double>> localGrads;
  for (int id : g.locals()) localGrads.push_back(exec.grad(id));
  const auto lossAt = [&] {
    GraphExecutor<double> e(g);
    return e.forward(ptrs(), in);
  };
  for (size_t p = 0; p < params.size(); ++p) {
    std::uniform_int_distribution<int64_t> pick(0, params[p].size() - 1);
    double num = 0, den = 0;
    for (int s = 0; s < samplesPerParam; ++s) {
      const int64_t i = pick(gen);
      const double x0 = params[p].data()[i];
      const double h = 1e-5 * std::max(1.0, std::abs(x0));
      params[p].data()[i] = x0 + h;
      const double up = lossAt();
      params[p].data()[i] = x0 - h;
      const double down = lossAt();
      params[p].data()[i] = x0;
      const double fd = (up - down) / (2 * h);
      num += (fd - grads[p].data()[i]) * (fd - grads[p].data()[i]);
      den += fd * fd;
    }
    INFO("parameter " << g.node(g.params()[p]).name);
    CHECK(std::sqrt(num) <= 1e-6 * std::max(std::sqrt(den), 1e-12));
  }
  for (size_t k = 0; k < localGrads.size(); ++k) {
    Mat<double>& local = (*in.locals)[k];
    double num = 0, den = 0;
    for (int64_t i = 0; i < local.size(); ++i) {
      const double x0 = local.data()[i];
      const double h = 1e-5 * std::max(1.0, std::abs(x0));
      local.data()[i] = x0 + h;
      const double up = lossAt();
      local.data()[i] = x0 - h;
      const double down = lossAt();
      local.data()[i] = x0;
      const double fd = (up - down) / (2 * h);
      num += (fd - localGrads[k].data()[i]) * (fd - localGrads[k].data()[i]);
      den += fd * fd;
    }
    INFO("data-dependent variable " << g.node(g.locals()[k]).name);
    CHECK(std::sqrt(num) <= 1e-6 * std::max(std::sqrt(den), 1e-12));
  }
}

std::vector<Mat<double>> randomParams(const Graph& g, std::mt19937& gen, double scale) {
  std::vector<Mat<double>> p;
  for (int id : g.params()) p.push_back(randomMat(g.node(id).rows, g.node(id).cols, gen, scale));
  return p;
}

}  // namespace

TEST_CASE("every example graph's SV gradients match finite differences in float64", "[ops][graph]") {
  std::mt19937 gen(42);
  const int64_t d = 7, k = 4, b = 5;
  const Mat<double> x = randomMat(d, b, gen).cwiseAbs();
  Eigen::VectorXi labels(b);
  labels << 0, 3, 1, 2, 3;
  for (const char* file : {"mlr.loss", "mlp.loss", "tm.loss"}) {
    INFO(file);
    const Graph g = parseLossFile(kExamples + file, {d, k});
    std::vector<Mat<double>> locals;
    for (int id : g.locals()) locals.push_back(randomMat(g.node(id).rows, b, gen));
    GraphInputs<double> in;
    in.dense = &x;
    in.labels = &labels;
    in.locals = &locals;
    checkGradients(g, in, randomParams(g, gen, 0.05), gen);
  }
}

TEST_CASE("every operator inside a graph, fused and unfused, matches finite differences", "[ops][graph]") {
  std::mt19937 gen(7);
  const std::string text = R"(
param W[5, 6] init normal(0.1)
param V[5, 5] init normal(0.1)
param c[5]
input x[6]
label y[5]
a = W * x + c
h = tanh(a) * sigmoid(a) - 0.5 * exp(scale(a, 0.1))
g = log(exp(h) + exp(-h)) + relu(h)
z = V * g
loss = cross_entropy(softmax(z), y) + sq_l2(h) + 0.1 * l2_norm(g) + 0.01 * l1(z) + sum(log_softmax(z)) * 0.01 + dot(g, h) + sq_dist(g, h)
predict z
)";
  const Graph g = parseLoss(text, "ops.loss", {6, 5});
  const Mat<double> x = randomMat(6, 3, gen);
  Eigen::VectorXi labels(3);
  labels << 4, 0, 2;
  GraphInputs<double> in;
  in.dense = &x;
  in.labels = &labels;
  const auto params = randomParams(g, gen, 0.4);
  checkGradients(g, in, params, gen, 30);

  // The fused and the unfused executions agree.
  std::vector<const Mat<double>*> ptrs;
  for (auto& m : params) ptrs.push_back(&m);
  GraphExecutor<double> fused(g, true), plain(g, false);
  CHECK(!fused.plan().empty());
  CHECK(plain.plan().empty());
  CHECK(std::abs(fused.forward(ptrs, in) - plain.forward(ptrs, in)) < 1e-12);
  fused.backward(ptrs, in);
  plain.backward(ptrs, in);
  const auto gf = fused.paramGradients(ptrs, in);
  const auto gp = plain.paramGradients(ptrs, in);
  for (size_t i = 0; i < gf.size(); ++i) CHECK((gf[i] - gp[i]).norm() <= 1e-10 * (1 + gp[i].norm()));
}

TEST_CASE("the generated MLR gives the same SVs as the hand-written one", "[ops][graph]") {
  const int64_t d = 30, k = 6, b = 8;
  GraphModel generated(parseLossFile(kExamples + "mlr.loss", {d, k}), "mlr.loss", 1);
  MultinomialLogisticRegression manual(d, k);
  ParamSet w = manual.initParams(3);
  CounterRng rng(5, RngPurpose::kTest, 0, 0);
  for (int64_t i = 0; i < w[1].size(); ++i) w[1].data()[i] = static_cast<float>(rng.normal() * 0.1);
  Matrix x(d, b);
  for (int64_t i = 0; i < x.size(); ++i) x.data()[i] = static_cast<float>(rng.uniform());
  Eigen::VectorXi labels(b);
  for (int64_t i = 0; i < b; ++i) labels(i) = static_cast<int>(i % k);
  ExampleBatch batch{&x, nullptr, &labels};
  double lossA = 0, lossB = 0;
  const SvBatch a = generated.computeSvg(w, batch, &lossA);
  const SvBatch m = manual.computeSvg(w, batch, &lossB);
  REQUIRE(a.matrices.size() == 1);
  CHECK(a.matrices[0].paramId == 0);
  CHECK(a.matrices[0].biasId == 1);
  // The built-in runs the same graph (ops/mlr.h): the same bits.
  CHECK((a.matrices[0].u - m.matrices[0].u).cwiseAbs().maxCoeff() == 0.0f);
  CHECK(a.matrices[0].vDense == m.matrices[0].vDense);
  CHECK(lossA == lossB);
  // The C++ builder gives the same graph as the .loss file.
  Graph built;
  const int W = built.param("W", k, d, {Init::Kind::kNormal, 0.01});
  const int bias = built.param("b", k, 1, {});
  const int xin = built.input("x", d);
  const int y = built.label("y", k);
  const int prod = built.apply(OpKind::kMatVec, {W, xin}, "W * x");
  const int z = built.apply(OpKind::kAdd, {prod, bias}, "W * x + b");
  const int p = built.apply(OpKind::kSoftmax, {z}, "softmax(a)");
  built.setLoss(built.apply(OpKind::kCrossEntropy, {p, y}, "cross_entropy(softmax(a), y)"));
  built.setPrediction(z);
  GraphModel fromBuilder(std::move(built), "built", 1);
  const SvBatch c = fromBuilder.computeSvg(w, batch, nullptr);
  CHECK((c.matrices[0].u - a.matrices[0].u).cwiseAbs().maxCoeff() == 0.0f);
}

TEST_CASE("the MLP sends one SVG per example holding a pair for every matrix", "[ops][graph]") {
  const int64_t d = 12, k = 3, b = 4;
  GraphModel mlp(parseLoss("dim h = 8\nparam W1[h, features] init he\nparam b1[h]\nparam W2[classes, h] init glorot\n"
                           "param b2[classes]\ninput x[features]\nlabel y[classes]\n"
                           "loss cross_entropy(softmax(W2 * relu(W1 * x + b1) + b2), y)\n",
                           "mlp", {d, k}),
                 "mlp", 1);
  const ParamSet w = mlp.initParams(9);
  Matrix x = Matrix::Random(d, b);
  Eigen::VectorXi labels(b);
  labels << 0, 1, 2, 1;
  std::vector<int64_t> idx = {0, 1, 2, 3};
  ExampleBatch batch{&x, nullptr, &labels, &idx};
  const SvBatch svg = mlp.computeSvg(w, batch, nullptr);
  REQUIRE(svg.matrices.size() == 2);
  CHECK(svg.matrices[0].paramId == 0);
  CHECK(svg.matrices[0].biasId == 1);
  CHECK(svg.matrices[0].u.rows() == 8);
  CHECK(svg.matrices[0].vDense.rows() == d);
  CHECK(svg.matrices[1].paramId == 2);
  CHECK(svg.matrices[1].biasId == 3);
  CHECK(svg.matrices[1].vDense.rows() == 8);
  for (const auto& m : svg.matrices) CHECK(m.u.cols() == b);
  // The SVs rebuild the gradient: one step of the SV update equals one of the dense gradient.
  CHECK(mlp.paramShapes().size() == 4);
}

TEST_CASE("a matrix used at several sites gets a pair per site", "[ops][graph]") {
  std::mt19937 gen(3);
  const Graph g = parseLoss("param W[4, 4]\ninput x[4]\nh = tanh(W * x)\nloss sq_l2(W * h)\n", "twice", {4, 1});
  const auto sites = g.identifySvs();
  REQUIRE(sites.size() == 2);
  CHECK(sites[0].param == 0);
  CHECK(sites[1].param == 0);
  const Mat<double> x = randomMat(4, 3, gen);
  GraphInputs<double> in;
  in.dense = &x;
  checkGradients(g, in, randomParams(g, gen, 0.5), gen, 16);
}

TEST_CASE("sparse inputs give sparse V and the same gradients as dense ones", "[ops][graph]") {
  const int64_t d = 20, k = 3;
  GraphModel m(parseLossFile(kExamples + "mlr.loss", {d, k}), "mlr", 1);
  const ParamSet w = m.initParams(2);
  Matrix dense = Matrix::Zero(d, 3);
  dense(1, 0) = 1;
  dense(7, 1) = 0.5;
  dense(19, 2) = 2;
  const SparseMatrix sparse = dense.sparseView();
  Eigen::VectorXi labels(3);
  labels << 0, 1, 2;
  const SvBatch a = m.computeSvg(w, {nullptr, &sparse, &labels}, nullptr);
  const SvBatch b = m.computeSvg(w, {&dense, nullptr, &labels}, nullptr);
  CHECK(a.matrices[0].sparseV);
  CHECK((a.matrices[0].u - b.matrices[0].u).cwiseAbs().maxCoeff() < 1e-7);
}

TEST_CASE("the fusion plan marks elementwise chains and softmax with cross-entropy", "[ops][graph]") {
  const Graph g = parseLossFile(kExamples + "mlp.loss", {784, 10});
  const auto plan = g.fusionPlan();
  int chains = 0, softmaxCe = 0;
  for (const auto& step : plan) {
    if (step.kind == FusedStep::Kind::kElementwise) {
      ++chains;
      CHECK(step.nodes.size() == 2);  // add bias, relu
      CHECK(g.node(step.nodes[0]).op == OpKind::kAdd);
      CHECK(g.node(step.nodes[1]).op == OpKind::kRelu);
    } else {
      ++softmaxCe;
    }
  }
  CHECK(chains == 2);
  CHECK(softmaxCe == 1);
}

TEST_CASE("data-dependent variables are kept per example and refined each time", "[ops][graph]") {
  const int64_t d = 10;
  GraphModel tm(parseLoss("dim topics = 3\nparam B[features, topics] init uniform(0.5)\ninput x[features]\n"
                          "local theta[topics] init normal(1) steps 5 lr 0.5\nloss sq_dist(B * softmax(theta), x)\n",
                          "tm", {d, 1}),
                "tm", 1);
  CHECK_FALSE(tm.hasAccuracy());
  const ParamSet w = tm.initParams(4);
  Matrix x = Matrix::Random(d, 2).cwiseAbs();
  Eigen::VectorXi labels = Eigen::VectorXi::Zero(2);
  std::vector<int64_t> idx = {5, 9};
  ExampleBatch batch{&x, nullptr, &labels, &idx};
  double first = 0, second = 0, third = 0;
  tm.computeSvg(w, batch, &first);
  tm.computeSvg(w, batch, &second);
  tm.computeSvg(w, batch, &third);
  // Kept theta keeps improving the fit with B fixed.
  CHECK(second < first);
  CHECK(third < second);
  // Evaluation infers theta afresh: the same as the first visit.
  const EvalSums e = tm.evaluate(w, batch);
  CHECK(std::abs(e.lossSum / 2 - first) < 1e-6);
}

TEST_CASE(".loss errors name line:column and what was expected", "[ops][parser]") {
  const LossDims dims{4, 3};
  CHECK_THROWS_WITH(parseLoss("param W[classes, features]\ninput x[features]\nloss = softmax(W * x\n", "m.loss", dims),
                    Catch::Contains("m.loss:3:") && Catch::Contains("expected ')'"));
  CHECK_THROWS_WITH(parseLoss("param W[classes features]\n", "m.loss", dims),
                    Catch::Contains("m.loss:1:17") && Catch::Contains("expected ']'"));
  CHECK_THROWS_WITH(parseLoss("param W[3, 5]\ninput x[features]\nloss sq_l2(W * x)\n", "m.loss", dims),
                    Catch::Contains("m.loss:3:12") && Catch::Contains("'W * x'") && Catch::Contains("3x5") &&
                        Catch::Contains("4 rows"));
  CHECK_THROWS_WITH(parseLoss("input x[features]\nloss sq_l2(y)\n", "m.loss", dims),
                    Catch::Contains("m.loss:2:12") && Catch::Contains("unknown name 'y'"));
  CHECK_THROWS_WITH(parseLoss("input x[hidden]\n", "m.loss", dims), Catch::Contains("unknown dimension 'hidden'"));
  CHECK_THROWS_WITH(parseLoss("input x[features]\nloss frobnicate(x)\n", "m.loss", dims),
                    Catch::Contains("unknown operator 'frobnicate'"));
  CHECK_THROWS_WITH(parseLoss("input x[features]\n", "m.loss", dims), Catch::Contains("no loss"));
  CHECK_THROWS_AS(parseLoss("input x[features]\nloss sq_l2(x) $\n", "m.loss", dims), InputError);
}

TEST_CASE("a parameter with no SV form is refused naming it and why", "[ops][graph]") {
  const LossDims dims{4, 3};
  // Used only elementwise.
  const Graph elementwise = parseLoss("param c[features]\ninput x[features]\nloss sq_l2(c * x)\n", "e.loss", dims);
  CHECK_THROWS_WITH(elementwise.identifySvs(),
                    Catch::Contains("'c'") && Catch::Contains("no SV form") && Catch::Contains("mul"));
  // A bias subtracted rather than added.
  const Graph sub = parseLoss("param W[3, features]\nparam b[3]\ninput x[features]\nloss sq_l2(W * x - b)\n", "s.loss",
                              dims);
  CHECK_THROWS_WITH(sub.identifySvs(), Catch::Contains("'b'") && Catch::Contains("no SV form"));
  // Not used by the loss at all.
  const Graph unused = parseLoss("param W[3, features]\nparam V[3, 3]\ninput x[features]\nloss sq_l2(W * x)\n",
                                 "u.loss", dims);
  CHECK_THROWS_WITH(unused.identifySvs(), Catch::Contains("'V'") && Catch::Contains("does not influence the loss"));
  CHECK_THROWS_AS(GraphModel(parseLoss("param c[features]\ninput x[features]\nloss sq_l2(c * x)\n", "e.loss", dims),
                             "e", 1),
                  InputError);
}

TEST_CASE("an executor keeps its buffers from one minibatch to the next, with fresh results", "[ops][graph]") {
  // Every clock runs the same shapes: after the first, forward and backward write
  // into the memory they had (no allocation per clock), and what they compute is
  // what a new executor computes on the same minibatch.
  std::mt19937 gen(11);
  const int64_t d = 9, k = 4, b = 6;
  for (const char* file : {"mlr.loss", "mlp.loss", "tm.loss"}) {
    INFO(file);
    const Graph g = parseLossFile(kExamples + file, {d, k});
    std::vector<Mat<float>> params;
    for (const Mat<double>& p : randomParams(g, gen, 0.1)) params.push_back(p.cast<float>());
    std::vector<const Mat<float>*> ptrs;
    for (const auto& p : params) ptrs.push_back(&p);
    GraphExecutor<float> exec(g);
    std::vector<const float*> values;
    std::vector<const float*> grads;
    for (int clock = 0; clock < 3; ++clock) {
      const Mat<float> x = randomMat(d, b, gen).cwiseAbs().cast<float>();
      Eigen::VectorXi labels(b);
      for (int64_t j = 0; j < b; ++j) labels(j) = static_cast<int>((j * 7 + clock) % k);
      std::vector<Mat<float>> locals;
      for (int id : g.locals()) locals.push_back(randomMat(g.node(id).rows, b, gen).cast<float>());
      std::vector<Mat<float>> freshLocals = locals;
      GraphInputs<float> in;
      in.dense = &x;
      in.labels = &labels;
      in.locals = &locals;
      if (!g.locals().empty()) exec.optimizeLocals(ptrs, in);
      const float loss = exec.forward(ptrs, in);
      exec.backward(ptrs, in);

      std::vector<const float*> nowValues;
      std::vector<const float*> nowGrads;
      for (const Node& n : g.nodes()) {
        if (n.kind != NodeKind::kOp) continue;
        nowValues.push_back(exec.value(n.id).data());
        nowGrads.push_back(exec.grad(n.id).data());
      }
      if (clock == 0) {
        values = nowValues;
        grads = nowGrads;
      } else {
        CHECK(nowValues == values);
        CHECK(nowGrads == grads);
      }

      GraphExecutor<float> fresh(g);
      GraphInputs<float> freshIn = in;
      freshIn.locals = &freshLocals;
      if (!g.locals().empty()) fresh.optimizeLocals(ptrs, freshIn);
      CHECK(fresh.forward(ptrs, freshIn) == loss);
      fresh.backward(ptrs, freshIn);
      for (const Node& n : g.nodes()) {
        if (n.kind != NodeKind::kOp) continue;
        CHECK(fresh.value(n.id) == exec.value(n.id));
        CHECK(fresh.grad(n.id) == exec.grad(n.id));
      }
    }
  }
}
