// Recurrence in the loss language: the cell unrolled over T steps, gradients of
// truncated BPTT against central differences in float64, states carried across
// segments, per-step SV sites, and misuse errors with file:line:col.
#include "engine/base/error.h"
#include "ops/graph_exec.h"
#include "ops/graph_model.h"
#include "ops/loss_parser.h"
#include "ops/sequence_layout.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

using namespace orpheus;
using namespace orpheus::ops;

namespace {

const std::string kExamples = std::string(ORPHEUS_SOURCE_DIR) + "/examples/";

// A small LSTM in the form of examples/lstm.loss, so every entry can be checked.
const char* kSmallLstm = R"(dim embed = 3
dim hidden = 4
param E[embed, classes] init uniform(0.1)
param W[4 * hidden, embed + hidden] init uniform(0.1)
param b[4 * hidden] init zeros
param V[classes, hidden] init uniform(0.1)
param bv[classes] init zeros
sequence x[classes]
label y[classes]
state h[hidden]
state c[hidden]
e = E * x
a = W * concat(e, h) + b
i = sigmoid(chunk(a, 0, 4))
f = sigmoid(chunk(a, 1, 4))
g = tanh(chunk(a, 2, 4))
o = sigmoid(chunk(a, 3, 4))
cell = f * c + i * g
out = o * tanh(cell)
next c = cell
next h = out
logits = V * out + bv
loss cross_entropy(softmax(logits), y)
predict logits
)";

Mat<double> randomMat(int64_t r, int64_t c, std::mt19937& gen, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  Mat<double> m(r, c);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = d(gen);
  return m;
}

// Segments of `steps` steps for `b` streams: stream j's tokens start at `first[j]`
// of `text`, the segment index is `segment`.
Mat<double> segments(const std::vector<int>& text, int64_t steps, int64_t b, int64_t segment, int64_t offset) {
  Mat<double> m(segmentRows(steps), b);
  for (int64_t j = 0; j < b; ++j) {
    m(kSegmentStreamRow, j) = static_cast<double>(j);
    m(kSegmentIndexRow, j) = static_cast<double>(segment);
    for (int64_t t = 0; t <= steps; ++t) {
      m(kSegmentTokenRow + t, j) = text[static_cast<size_t>((j * 29 + offset + t) % static_cast<int64_t>(text.size()))];
    }
  }
  return m;
}

std::vector<int> randomText(int vocabulary, std::mt19937& gen) {
  std::uniform_int_distribution<int> d(0, vocabulary - 1);
  std::vector<int> text(200);
  for (int& t : text) t = d(gen);
  return text;
}

// Every entry of every parameter: SV gradient against central differences.
void checkAllGradients(const Graph& g, const GraphInputs<double>& in, std::vector<Mat<double>> params) {
  auto ptrs = [&] {
    std::vector<const Mat<double>*> p;
    for (auto& m : params) p.push_back(&m);
    return p;
  };
  GraphExecutor<double> exec(g);
  exec.forward(ptrs(), in);
  exec.backward(ptrs(), in);
  const std::vector<Mat<double>> grads = exec.paramGradients(ptrs(), in);
  const auto lossAt = [&] {
    GraphExecutor<double> e(g);
    return e.forward(ptrs(), in);
  };
  for (size_t p = 0; p < params.size(); ++p) {
    double worst = 0;
    for (int64_t i = 0; i < params[p].size(); ++i) {
      const double x0 = params[p].data()[i];
      const double h = 1e-5;
      params[p].data()[i] = x0 + h;
      const double up = lossAt();
      params[p].data()[i] = x0 - h;
      const double down = lossAt();
      params[p].data()[i] = x0;
      worst = std::max(worst, std::abs((up - down) / (2 * h) - grads[p].data()[i]));
    }
    INFO("parameter " << g.node(g.params()[p]).name);
    CHECK(worst <= 1e-6);
  }
}

std::vector<Mat<double>> randomParams(const Graph& g, std::mt19937& gen, double scale) {
  std::vector<Mat<double>> p;
  for (int id : g.params()) p.push_back(randomMat(g.node(id).rows, g.node(id).cols, gen, scale));
  return p;
}

}  // namespace

TEST_CASE("truncated BPTT gradients of an LSTM match central differences in float64", "[ops][recurrent]") {
  std::mt19937 gen(7);
  const int64_t vocabulary = 6, b = 3;
  const std::vector<int> text = randomText(static_cast<int>(vocabulary), gen);
  for (const int64_t steps : {1, 3, 7}) {
    INFO("T = " << steps);
    const Graph g = parseLoss(kSmallLstm, "small.loss", {0, vocabulary, steps});
    REQUIRE(g.steps() == steps);
    const Mat<double> x = segments(text, steps, b, 0, 0);
    const std::vector<Mat<double>> params = randomParams(g, gen, 0.5);
    GraphInputs<double> in;
    in.dense = &x;
    SECTION("from zero states") { checkAllGradients(g, in, params); }
    SECTION("from states carried from a previous segment") {
      std::vector<Mat<double>> states;
      for (int id : g.states()) states.push_back(randomMat(g.node(id).rows, b, gen, 0.5));
      in.states = &states;
      checkAllGradients(g, in, params);
    }
  }
}

TEST_CASE("the example LSTM's gradients match central differences", "[ops][recurrent]") {
  std::mt19937 gen(11);
  const int64_t vocabulary = 9, b = 2, steps = 3;
  const Graph g = parseLossFile(kExamples + "lstm.loss", {0, vocabulary, steps});
  const Mat<double> x = segments(randomText(static_cast<int>(vocabulary), gen), steps, b, 0, 0);
  std::vector<Mat<double>> params = randomParams(g, gen, 0.1);
  auto ptrs = [&] {
    std::vector<const Mat<double>*> p;
    for (auto& m : params) p.push_back(&m);
    return p;
  };
  GraphInputs<double> in;
  in.dense = &x;
  GraphExecutor<double> exec(g);
  exec.forward(ptrs(), in);
  exec.backward(ptrs(), in);
  const std::vector<Mat<double>> grads = exec.paramGradients(ptrs(), in);
  std::uniform_int_distribution<int> pickParam(0, static_cast<int>(params.size()) - 1);
  double worst = 0;
  for (int s = 0; s < 100; ++s) {
    const auto p = static_cast<size_t>(pickParam(gen));
    std::uniform_int_distribution<int64_t> pick(0, params[p].size() - 1);
    const int64_t i = pick(gen);
    const double x0 = params[p].data()[i];
    params[p].data()[i] = x0 + 1e-5;
    const double up = GraphExecutor<double>(g).forward(ptrs(), in);
    params[p].data()[i] = x0 - 1e-5;
    const double down = GraphExecutor<double>(g).forward(ptrs(), in);
    params[p].data()[i] = x0;
    worst = std::max(worst, std::abs((up - down) / 2e-5 - grads[p].data()[i]));
  }
  CHECK(worst <= 1e-6);
}

TEST_CASE("two segments with carried states equal one segment twice as long", "[ops][recurrent]") {
  std::mt19937 gen(3);
  const int64_t vocabulary = 7, b = 4, steps = 5;
  const std::vector<int> text = randomText(static_cast<int>(vocabulary), gen);
  const Graph g = parseLoss(kSmallLstm, "small.loss", {0, vocabulary, steps});
  const Graph twice = parseLoss(kSmallLstm, "small.loss", {0, vocabulary, 2 * steps});
  std::vector<Mat<double>> params = randomParams(g, gen, 0.5);
  std::vector<const Mat<double>*> ptrs;
  for (auto& m : params) ptrs.push_back(&m);
  const Mat<double> first = segments(text, steps, b, 0, 0);
  const Mat<double> second = segments(text, steps, b, 1, steps);
  const Mat<double> whole = segments(text, 2 * steps, b, 0, 0);

  GraphExecutor<double> exec(g);
  GraphInputs<double> in;
  in.dense = &first;
  double loss = exec.forward(ptrs, in);
  std::vector<Mat<double>> carried;
  for (int id : g.finalStates()) carried.push_back(exec.value(id));
  in.dense = &second;
  in.states = &carried;
  loss += exec.forward(ptrs, in);

  GraphExecutor<double> all(twice);
  GraphInputs<double> wholeIn;
  wholeIn.dense = &whole;
  CHECK(std::abs(loss - all.forward(ptrs, wholeIn)) <= 1e-10 * std::abs(loss));

  SECTION("and without the carry they differ") {
    in.states = nullptr;
    GraphExecutor<double> fresh(g);
    in.dense = &first;
    double restarted = fresh.forward(ptrs, in);
    in.dense = &second;
    restarted += fresh.forward(ptrs, in);
    CHECK(std::abs(restarted - all.forward(ptrs, wholeIn)) > 1e-6);
  }
}

TEST_CASE("the model carries states per stream across clocks and counts tokens", "[ops][recurrent]") {
  std::mt19937 gen(5);
  const int64_t vocabulary = 8, b = 3, steps = 4;
  const std::vector<int> text = randomText(static_cast<int>(vocabulary), gen);
  GraphModel model(parseLoss(kSmallLstm, "small.loss", {0, vocabulary, steps}), "lstm", 1);
  GraphModel longer(parseLoss(kSmallLstm, "small.loss", {0, vocabulary, 2 * steps}), "lstm", 1);
  const ParamSet w = model.initParams(9);
  const Matrix first = segments(text, steps, b, 0, 0).cast<float>();
  const Matrix second = segments(text, steps, b, 1, steps).cast<float>();
  const Matrix whole = segments(text, 2 * steps, b, 0, 0).cast<float>();
  const Eigen::VectorXi labels = Eigen::VectorXi::Zero(b);
  const auto batch = [&](const Matrix& m) {
    ExampleBatch x;
    x.dense = &m;
    x.labels = &labels;
    return x;
  };
  double l1 = 0, l2 = 0, lw = 0;
  const SvBatch svgs = model.computeSvg(w, batch(first), &l1);
  model.computeSvg(w, batch(second), &l2);
  longer.computeSvg(w, batch(whole), &lw);
  CHECK(std::abs((l1 + l2) / 2 - lw) <= 1e-5 * lw);  // mean losses per token
  // One entry per (matrix use, step); B columns each; the embedding's V is a one-hot.
  int eEntries = 0, wEntries = 0;
  for (const SvMatrix& m : svgs.matrices) {
    CHECK(m.u.cols() == b);
    if (m.paramId == 0) {
      ++eEntries;
      REQUIRE(m.sparseV);
      CHECK(m.vSparse.nonZeros() == b);
    }
    if (m.paramId == 1) {
      ++wEntries;
      CHECK(m.biasId == 2);
    }
  }
  CHECK(eEntries == steps);
  CHECK(wEntries == steps);

  SECTION("evaluation takes a chunk of segments as runs of distinct streams") {
    Matrix both(first.rows(), 2 * b);
    both << first, second;
    const EvalSums sums = model.evaluate(w, batch(both));
    CHECK(sums.count == 2 * b * steps);
    const EvalSums whole1 = longer.evaluate(w, batch(whole));
    CHECK(std::abs(sums.lossSum - whole1.lossSum) <= 1e-5 * whole1.lossSum);
    CHECK(model.reportsPerplexity());
  }
}

TEST_CASE("misused recurrence is refused with file:line:col", "[ops][recurrent]") {
  const LossDims dims{0, 5, 3};
  const auto refuses = [&](const std::string& text, const std::string& message) {
    INFO(text);
    CHECK_THROWS_WITH(parseLoss(text, "m.loss", dims), Catch::Contains(message));
  };
  const std::string head = "param W[4, 5]\nparam U[5, 9]\nsequence x[classes]\nlabel y[classes]\nstate h[4]\n";
  refuses(head + "next q = W * x\n", "m.loss:6:6: 'next' names 'q', which is not a state");
  refuses(head + "a = U * concat(x, h)\nloss cross_entropy(softmax(a), y)\n", "m.loss:5:7: state 'h' has no next value");
  refuses(head + "next h = W * x\nnext h = W * x\n", "m.loss:7:6: second 'next' for state 'h'");
  refuses(head + "next h = chunk(W * x, 0, 2)\n", "m.loss:6:6: shape mismatch: state 'h' has 4 rows");
  refuses(head + "a = chunk(W * x, 0, 3)\n", "m.loss:6:5: shape mismatch in 'chunk(W * x, 0, 3)'");
  refuses(head + "input z[3]\n", "m.loss:6:1: a sequence model takes its data from the sequence");
  refuses("input z[3]\nsequence x[classes]\n", "m.loss:2:10: only one input may be declared");
  refuses(head + "a = slice(h, 0, 2)\n", "m.loss:6:5: rows are taken with chunk(x, k, n)");
  CHECK_THROWS_WITH(parseLoss(head + "next h = W * x\nloss sum(h)\n", "m.loss", {0, 5, 0}),
                    Catch::Contains("a sequence model needs token-stream data"));
  // The new keywords remain usable as names.
  CHECK_NOTHROW(parseLoss("param W[5, 5]\ninput x[5]\nnext = W * x\nstate = next\nloss sum(state)\n", "m.loss", dims));
}

namespace {

// tests/data/lstm/reference.txt: "NAME ROWS COLS" then the values, column-major.
std::map<std::string, Mat<double>> readReference(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::map<std::string, Mat<double>> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream head(line);
    std::string name;
    int64_t rows = 0, cols = 0;
    head >> name >> rows >> cols;
    Mat<double> m(rows, cols);
    for (int64_t i = 0; i < m.size(); ++i) in >> m.data()[i];
    std::getline(in, line);  // the rest of the values' line
    out[name] = m;
  }
  return out;
}

double maxAbsDiff(const Mat<double>& a, const Mat<double>& b) {
  REQUIRE(a.rows() == b.rows());
  REQUIRE(a.cols() == b.cols());
  return (a - b).cwiseAbs().maxCoeff();
}

}  // namespace

TEST_CASE("one step of the LSTM equals PyTorch's nn.LSTM from the same weights", "[ops][recurrent]") {
  auto ref = readReference(std::string(ORPHEUS_SOURCE_DIR) + "/tests/data/lstm/reference.txt");
  const Mat<double>& dims = ref.at("dims");
  const auto vocabulary = static_cast<int64_t>(dims(0)), steps = static_cast<int64_t>(dims(3)),
             b = static_cast<int64_t>(dims(4));
  REQUIRE(dims(1) == 3);  // kSmallLstm's embed and hidden
  REQUIRE(dims(2) == 4);
  const Graph g = parseLoss(kSmallLstm, "small.loss", {0, vocabulary, steps});
  Mat<double> x(segmentRows(steps), b);
  x.row(kSegmentStreamRow).setLinSpaced(0, static_cast<double>(b - 1));
  x.row(kSegmentIndexRow).setZero();
  x.bottomRows(steps + 1) = ref.at("tokens");
  std::vector<Mat<double>> states = {ref.at("h0"), ref.at("c0")};
  std::vector<const Mat<double>*> params;
  for (const char* name : {"E", "W", "b", "V", "bv"}) params.push_back(&ref.at(name));
  GraphInputs<double> in;
  in.dense = &x;
  in.states = &states;
  GraphExecutor<double> exec(g);
  const double loss = exec.forward(params, in);
  exec.backward(params, in);
  const std::vector<Mat<double>> grads = exec.paramGradients(params, in);
  CHECK(std::abs(loss - ref.at("loss")(0, 0)) <= 1e-5);
  const char* names[] = {"dE", "dW", "db", "dV", "dbv"};
  for (size_t p = 0; p < grads.size(); ++p) {
    INFO(names[p]);
    CHECK(maxAbsDiff(grads[p], ref.at(names[p])) <= 1e-5);
  }
}

namespace {

// A float64 executor's operands for `g`, drawn in this order: a text of the first
// parameter's columns (the vocabulary) as B segments, the parameters, the start states.
struct RandomOperands {
  Mat<double> x;
  std::vector<Mat<double>> params;
  std::vector<const Mat<double>*> ptrs;
  std::vector<Mat<double>> states;
  GraphInputs<double> in;
  RandomOperands(const Graph& g, int64_t b, std::mt19937& gen)
      : x(segments(randomText(static_cast<int>(g.node(g.params()[0]).cols), gen), g.steps(), b, 0, 0)),
        params(randomParams(g, gen, 0.5)) {
    for (auto& m : params) ptrs.push_back(&m);
    for (int id : g.states()) states.push_back(randomMat(g.node(id).rows, b, gen, 0.5));
    in.dense = &x;
    in.states = &states;
  }
  RandomOperands(const RandomOperands&) = delete;
  RandomOperands& operator=(const RandomOperands&) = delete;
};

}  // namespace

TEST_CASE("the input part of all steps as one GEMM gives the per-step products", "[ops][recurrent]") {
  std::mt19937 gen(13);
  const int64_t vocabulary = 6, b = 3, steps = 4;
  const Graph g = parseLoss(kSmallLstm, "small.loss", {0, vocabulary, steps});
  RandomOperands r(g, b, gen);
  const auto& ptrs = r.ptrs;
  const auto& in = r.in;
  GraphExecutor<double> hoisted(g, true), plain(g, false);
  CHECK(hoisted.hoistedMatrices() == 1);  // W; E's products have no recurrent part
  CHECK(plain.hoistedMatrices() == 0);
  CHECK(std::abs(hoisted.forward(ptrs, in) - plain.forward(ptrs, in)) <= 1e-12);
  hoisted.backward(ptrs, in);
  plain.backward(ptrs, in);
  const auto gh = hoisted.paramGradients(ptrs, in), gp = plain.paramGradients(ptrs, in);
  for (size_t p = 0; p < gh.size(); ++p) CHECK((gh[p] - gp[p]).cwiseAbs().maxCoeff() <= 1e-12);
  for (int id : g.finalStates()) CHECK((hoisted.value(id) - plain.value(id)).cwiseAbs().maxCoeff() <= 1e-12);
}

TEST_CASE("the output layer of all steps as one GEMM after the recurrence gives the per-step products",
          "[ops][recurrent]") {
  std::mt19937 gen(29);
  const int64_t vocabulary = 6, b = 3, steps = 5;
  const Graph g = parseLoss(kSmallLstm, "small.loss", {0, vocabulary, steps});
  const LatePlan late = latePlan(g, g.fusionPlan());
  REQUIRE(late.groups.size() == 1);
  CHECK(g.node(g.params()[static_cast<size_t>(late.groups[0].param)]).name == "V");
  CHECK(late.groups[0].products.size() == static_cast<size_t>(steps));
  CHECK(late.late[static_cast<size_t>(g.loss())]);
  for (int id : g.stepPredictions()) CHECK(late.late[static_cast<size_t>(id)]);
  // Nothing the recurrence carries runs late: not the states, not W's products over concat(e, h).
  for (int id : g.finalStates()) CHECK_FALSE(late.late[static_cast<size_t>(id)]);
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::kMatVec && n.kind == NodeKind::kOp && g.node(n.inputs[0]).name == "W") {
      CHECK_FALSE(late.late[static_cast<size_t>(n.id)]);
    }
  }
  CHECK(latePlan(parseLoss(kSmallLstm, "small.loss", {0, vocabulary, 1}), {}).groups.empty());  // one step

  RandomOperands r(g, b, gen);
  const auto& ptrs = r.ptrs;
  const auto& in = r.in;
  GraphExecutor<double> batched(g, true), plain(g, false);
  CHECK(std::abs(batched.forward(ptrs, in) - plain.forward(ptrs, in)) <= 1e-12);
  for (int id : g.stepPredictions()) CHECK((batched.value(id) - plain.value(id)).cwiseAbs().maxCoeff() <= 1e-12);
  batched.backward(ptrs, in);
  plain.backward(ptrs, in);
  // Every step's U of V (the products' gradients) and the gradients the recurrence got back.
  for (int id : late.groups[0].products) CHECK((batched.grad(id) - plain.grad(id)).cwiseAbs().maxCoeff() <= 1e-12);
  const auto gb = batched.paramGradients(ptrs, in), gp = plain.paramGradients(ptrs, in);
  for (size_t p = 0; p < gb.size(); ++p) {
    INFO(g.node(g.params()[p]).name);
    CHECK(gp[p].cwiseAbs().maxCoeff() > 0.0);
    CHECK((gb[p] - gp[p]).cwiseAbs().maxCoeff() <= 1e-12);
  }
}

namespace {

size_t lstmCells(const std::vector<FusedStep>& plan) {
  return static_cast<size_t>(std::count_if(plan.begin(), plan.end(), [](const FusedStep& s) {
    return s.kind == FusedStep::Kind::kLstmCell;
  }));
}

// Fused against unfused execution in float64: loss, every parameter's gradient,
// the states after the last step, and the gradients of float executors (a rounding apart).
void checkFusedCell(const Graph& g, size_t expectedCells) {
  std::mt19937 gen(17);
  const int64_t b = 3;
  RandomOperands r(g, b, gen);
  const auto& ptrs = r.ptrs;
  const auto& in = r.in;
  GraphExecutor<double> fused(g, true), plain(g, false);
  CHECK(lstmCells(fused.plan()) == expectedCells);
  CHECK(lstmCells(plain.plan()) == 0);
  CHECK(std::abs(fused.forward(ptrs, in) - plain.forward(ptrs, in)) <= 1e-12);
  fused.backward(ptrs, in);
  plain.backward(ptrs, in);
  const auto gf = fused.paramGradients(ptrs, in), gp = plain.paramGradients(ptrs, in);
  for (size_t p = 0; p < gf.size(); ++p) {
    INFO(g.node(g.params()[p]).name);
    CHECK((gf[p] - gp[p]).cwiseAbs().maxCoeff() <= 1e-12);
  }
  for (int id : g.finalStates()) CHECK((fused.value(id) - plain.value(id)).cwiseAbs().maxCoeff() <= 1e-12);

  // Float: the unfused executor also skips hoisting and the other fusions, so the
  // loss and the gradients agree to rounding.
  std::vector<Mat<float>> pf;
  for (const auto& m : r.params) pf.push_back(m.cast<float>());
  std::vector<const Mat<float>*> pfp;
  for (auto& m : pf) pfp.push_back(&m);
  const Mat<float> xf = r.x.cast<float>();
  std::vector<Mat<float>> sf;
  for (const auto& m : r.states) sf.push_back(m.cast<float>());
  GraphInputs<float> inf;
  inf.dense = &xf;
  inf.states = &sf;
  GraphExecutor<float> ff(g, true), fp(g, false);
  const float lf = ff.forward(pfp, inf), lp = fp.forward(pfp, inf);
  CHECK(std::abs(lf - lp) <= 1e-5f * std::abs(lp));
  ff.backward(pfp, inf);
  fp.backward(pfp, inf);
  const auto gff = ff.paramGradients(pfp, inf), gfp = fp.paramGradients(pfp, inf);
  for (size_t p = 0; p < gff.size(); ++p) {
    const float scale = std::max(1.0f, gfp[p].cwiseAbs().maxCoeff());
    CHECK((gff[p] - gfp[p]).cwiseAbs().maxCoeff() <= 1e-5f * scale);
  }
}

}  // namespace

TEST_CASE("each LSTM cell step runs fused and gives the unfused values and gradients", "[ops][recurrent]") {
  const int64_t vocabulary = 6;
  SECTION("the small LSTM, T = 4") { checkFusedCell(parseLoss(kSmallLstm, "small.loss", {0, vocabulary, 4}), 4); }
  SECTION("examples/lstm.loss, T = 2") {
    checkFusedCell(parseLossFile(kExamples + "lstm.loss", {0, vocabulary, 2}), 2);
  }
  SECTION("gates in another order, operands swapped") {
    std::string text = kSmallLstm;
    const auto replace = [&](const std::string& from, const std::string& to) {
      const size_t at = text.find(from);
      REQUIRE(at != std::string::npos);
      text.replace(at, from.size(), to);
    };
    replace("i = sigmoid(chunk(a, 0, 4))", "i = sigmoid(chunk(a, 3, 4))");
    replace("o = sigmoid(chunk(a, 3, 4))", "o = sigmoid(chunk(a, 0, 4))");
    replace("cell = f * c + i * g", "cell = g * i + c * f");
    replace("out = o * tanh(cell)", "out = tanh(cell) * o");
    checkFusedCell(parseLoss(text, "swapped.loss", {0, vocabulary, 3}), 3);
  }
  SECTION("a gate used outside the cell is not fused, and still right") {
    std::string text = kSmallLstm;
    const std::string from = "logits = V * out + bv";
    text.replace(text.find(from), from.size(), "logits = V * (out + i) + bv");
    checkFusedCell(parseLoss(text, "leaky.loss", {0, vocabulary, 3}), 0);
  }
}

TEST_CASE("the fused LSTM cell's BPTT gradients match central differences in float64", "[ops][recurrent]") {
  std::mt19937 gen(19);
  const int64_t vocabulary = 5, b = 2, steps = 3;
  const Graph g = parseLoss(kSmallLstm, "small.loss", {0, vocabulary, steps});
  REQUIRE(lstmCells(GraphExecutor<double>(g).plan()) == steps);
  const Mat<double> x = segments(randomText(static_cast<int>(vocabulary), gen), steps, b, 0, 0);
  std::vector<Mat<double>> states;
  for (int id : g.states()) states.push_back(randomMat(g.node(id).rows, b, gen, 0.5));
  GraphInputs<double> in;
  in.dense = &x;
  in.states = &states;
  checkAllGradients(g, in, randomParams(g, gen, 0.5));
}

namespace {

// sum over columns of U diag(c) V^T per parameter, from a batch's entries.
std::map<uint32_t, Matrix> updates(const SvBatch& batch) {
  std::map<uint32_t, Matrix> out;
  for (const SvMatrix& m : batch.matrices) {
    const Matrix v = m.sparseV ? Matrix(m.vSparse) : m.vDense;
    const Matrix term = m.u * batch.coeffs.asDiagonal() * v.transpose();
    auto [it, fresh] = out.try_emplace(m.paramId, term);
    if (!fresh) it->second += term;
  }
  return out;
}

}  // namespace

TEST_CASE("SVGs per (example, step): each matrix one entry of B*T columns, the same update", "[ops][recurrent]") {
  std::mt19937 gen(23);
  const int64_t vocabulary = 7, b = 3, steps = 4;
  const std::vector<int> text = randomText(static_cast<int>(vocabulary), gen);
  GraphModel examples(parseLoss(kSmallLstm, "small.loss", {0, vocabulary, steps}), "lstm", 1);
  GraphModel pairs(parseLoss(kSmallLstm, "small.loss", {0, vocabulary, steps}), "lstm", 1);
  pairs.setSvgUnit(Model::SvgUnit::kStep);
  const ParamSet w = examples.initParams(3);
  const Matrix x = segments(text, steps, b, 0, 0).cast<float>();
  const Eigen::VectorXi labels = Eigen::VectorXi::Zero(b);
  ExampleBatch batch;
  batch.dense = &x;
  batch.labels = &labels;
  double le = 0, lp = 0;
  const SvBatch byExample = examples.computeSvg(w, batch, &le);
  const SvBatch byStep = pairs.computeSvg(w, batch, &lp);
  CHECK(le == lp);
  CHECK(byExample.numColumns() == b);
  CHECK(byStep.numColumns() == b * steps);
  CHECK(byStep.matrices.size() * steps == byExample.matrices.size());
  for (const SvMatrix& m : byStep.matrices) {
    CHECK(m.u.cols() == b * steps);
    CHECK(m.vCols() == b * steps);
    if (m.sparseV) CHECK(m.vSparse.nonZeros() == b * steps);
  }
  // Step t of example j is column t * B + j: W's V there is [e_t; h_{t-1}] of example j.
  const SvMatrix& w1 = *std::find_if(byStep.matrices.begin(), byStep.matrices.end(),
                                     [](const SvMatrix& m) { return m.paramId == 1; });
  int seen = 0;
  for (const SvMatrix& m : byExample.matrices) {
    if (m.paramId != 1) continue;
    CHECK(m.vDense == w1.vDense.middleCols(seen * b, b));
    CHECK(m.u == w1.u.middleCols(seen * b, b));
    ++seen;
  }
  const auto ue = updates(byExample), us = updates(byStep);
  for (const auto& [param, update] : ue) {
    CHECK((update - us.at(param)).cwiseAbs().maxCoeff() <= 1e-5f * std::max(1.0f, update.cwiseAbs().maxCoeff()));
  }
}
