// The device executor (ops/device_exec.h) against the host executor: on the cpu
// and strict backends, computeSvgOnDevice gives computeSvg's batch and
// denseGradientOnDevice denseGradient's gradient, bit for bit, for examples/mlp.loss
// and examples/mlr.loss with dense and sparse data; the strict device gives the
// CPU backend's bits; a second clock of the same shapes allocates no tensor; and
// graphs it cannot run are refused naming a node.
#include "device_test_support.h"
#include "engine/base/error.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/device_exec.h"
#include "ops/graph_exec.h"
#include "ops/graph_model.h"
#include "ops/loss_parser.h"
#include "ops/sequence_layout.h"
#include "ops/strict/strict_backend.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <tuple>

using namespace orpheus;
using namespace orpheus::ops;
using namespace orpheus::ops::testing;

namespace {

const std::string kExamples = std::string(ORPHEUS_SOURCE_DIR) + "/examples/";
constexpr int64_t kFeatures = 20;
constexpr int64_t kClasses = 5;
constexpr int64_t kBatch = 7;

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// examples/mlp.loss with hidden layers of 16 and 12.
Graph smallMlp() {
  std::string text = readFile(kExamples + "mlp.loss");
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"hidden1 = 1024", "hidden1 = 16"},
                                 std::pair<std::string, std::string>{"hidden2 = 1024", "hidden2 = 12"}}) {
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
  }
  return parseLoss(text, "mlp.loss", {kFeatures, kClasses});
}

Graph mlr() { return parseLossFile(kExamples + "mlr.loss", {kFeatures, kClasses}); }

// A hidden layer read by two products (its gradient gets two terms) and the input
// read by an elementwise chain (a sparse batch is densified for it).
Graph sharedHidden() {
  return parseLoss(
      "dim h = 9\nparam W1[h, features] init he\nparam b1[h]\nparam W2[classes, h] init glorot\n"
      "param W3[classes, h] init glorot\nparam W4[classes, features] init glorot\n"
      "input x[features]\nlabel y[classes]\nhx = relu(W1 * x + b1)\ns = relu(scale(x, 0.5))\n"
      "a = W2 * hx + W3 * hx + W4 * s\nloss cross_entropy(softmax(a), y)\npredict a\n",
      "shared.loss", {kFeatures, kClasses});
}

// Parameters with every entry random (biases too, so broadcasts are exercised).
ParamSet randomParams(const GraphModel& model, std::mt19937& gen) {
  std::normal_distribution<float> d(0.0f, 0.4f);
  ParamSet w = model.initParams(3);
  for (Param& p : w.params) {
    for (int64_t i = 0; i < p.value.size(); ++i) p.value.data()[i] = d(gen);
  }
  return w;
}

using Data = ExampleData;

Data randomData(std::mt19937& gen, int64_t batch = kBatch) {
  Data data;
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_real_distribution<double> keep(0.0, 1.0);
  std::uniform_int_distribution<int> label(0, static_cast<int>(kClasses) - 1);
  data.dense = Matrix::Zero(kFeatures, batch);
  for (int64_t j = 0; j < batch; ++j) {
    for (int64_t i = 0; i < kFeatures; ++i) {
      if (keep(gen) < 0.3) data.dense(i, j) = d(gen);
    }
  }
  data.sparse = data.dense.sparseView();
  data.sparse.makeCompressed();
  data.labels.resize(batch);
  for (int64_t j = 0; j < batch; ++j) data.labels(j) = label(gen);
  return data;
}

// Every operator that reduces or normalises a column (Backend::columnOp), forward
// and backward: softmax read twice (so not fused with the cross-entropy), each
// reduction, and log_softmax, summed into the loss.
Graph columnOps() {
  return parseLoss(
      "dim h = 8\nparam W1[h, features] init he\nparam b1[h]\nparam W2[classes, h] init glorot\n"
      "param W3[h, features] init glorot\ninput x[features]\nlabel y[classes]\n"
      "hx = tanh(W1 * x + b1)\ng = W3 * x\nz = W2 * hx\np = softmax(z)\n"
      "loss cross_entropy(p, y) + dot(p, y) + scale(sq_l2(hx), 0.1) + l2_norm(g) + scale(l1(hx), 0.1) + sum(g)"
      " + dot(hx, g) + scale(sq_dist(hx, g), 0.1) + scale(sum(log_softmax(z)), 0.01)\npredict z\n",
      "columns.loss", {kFeatures, kClasses});
}

// Runs of elementwise nodes past a GPU's chain limits (ops/elementwise_ops.h
// kDeviceChainLimits): ten products and a bias added (eleven inputs) and twenty
// nonlinearities.
Graph longChains() {
  std::string text = "dim h = 8\nparam W1[h, features] init he\nparam b1[h]\nparam W2[classes, h] init glorot\n";
  std::string sum = "W1 * x + b1";
  for (int k = 1; k <= 9; ++k) {
    text += "param P" + std::to_string(k) + "[h, features] init he\n";
    sum += " + P" + std::to_string(k) + " * x";
  }
  text += "input x[features]\nlabel y[classes]\nt0 = " + sum + "\n";
  for (int k = 1; k <= 10; ++k) {
    text += "t" + std::to_string(k) + " = tanh(scale(t" + std::to_string(k - 1) + ", 1.5))\n";
  }
  text += "z = W2 * t10\nloss cross_entropy(softmax(z), y)\npredict z\n";
  return parseLoss(text, "chains.loss", {kFeatures, kClasses});
}

struct Case {
  const char* name;
  Graph (*graph)();
};

const Case kCases[] = {{"mlp", smallMlp},
                       {"mlr", mlr},
                       {"shared hidden layer", sharedHidden},
                       {"column operators", columnOps},
                       {"chains past a GPU's limits", longChains}};

}  // namespace

TEST_CASE("device SVs and gradients are bitwise the host executor's on the cpu and strict backends",
          "[ops][device][strict]") {
  cpu::CpuBackend cpu;
  const auto strict = strict::makeStrictBackend();
  for (const Case& c : kCases) {
    for (bool useSparse : {false, true}) {
      INFO(c.name << (useSparse ? ", sparse" : ", dense"));
      GraphModel model(c.graph(), c.name, 1);
      REQUIRE(model.deviceRefusal().empty());
      std::mt19937 gen(17);
      const ParamSet w = randomParams(model, gen);
      const Data data = randomData(gen);
      const ExampleBatch x = data.batch(useSparse);

      double hostLoss = 0.0;
      const SvBatch host = model.computeSvg(w, x, &hostLoss);
      for (const SvMatrix& m : host.matrices) REQUIRE(m.u.norm() > 0.0f);  // the comparisons below see values
      double hostGradLoss = 0.0;
      const ParamSet hostGrad = model.denseGradient(w, x, &hostGradLoss);

      std::vector<SvBatch> batches;
      std::vector<ParamSet> grads;
      for (Backend* backend : {static_cast<Backend*>(&cpu), strict.get()}) {
        INFO("backend " << backend->name());
        const std::vector<Tensor> dw = upload(*backend, w);
        double loss = 0.0;
        batches.push_back(model.computeSvgOnDevice(dw, x, &loss, *backend));
        CHECK(loss == hostLoss);
        requireSameBatch(batches.back(), host);
        std::vector<Tensor> dg = allocateLike(*backend, w);
        double gradLoss = 0.0;
        model.denseGradientOnDevice(dw, x, &gradLoss, *backend, dg);
        CHECK(gradLoss == hostGradLoss);
        grads.push_back(download(*backend, w, dg));
        requireSameParams(grads.back(), hostGrad);
      }
      // The strict device against the CPU backend, directly.
      requireSameBatch(batches[1], batches[0]);
      requireSameParams(grads[1], grads[0]);
    }
  }
}

TEST_CASE("batches copied ahead (the data queue) give the passes of batches copied in, bitwise",
          "[ops][device][strict]") {
  const auto strict = strict::makeStrictBackend();
  std::mt19937 gen(23);
  GraphModel reference(smallMlp(), "mlp", 1);
  const ParamSet w = randomParams(reference, gen);
  std::vector<Data> data;
  for (int k = 0; k < 4; ++k) data.push_back(randomData(gen, k == 2 ? kBatch + 3 : kBatch));
  const std::vector<Tensor> dw = upload(*strict, w);
  std::vector<SvBatch> want;
  std::vector<double> wantLoss;
  for (const Data& d : data) {
    double loss = 0.0;
    want.push_back(reference.computeSvgOnDevice(dw, d.batch(false), &loss, *strict));
    wantLoss.push_back(loss);
  }
  // As the worker queues them: the next batch copied ahead before each pass. A
  // pass that read a batch before its copy landed would fail on the strict device.
  GraphModel queued(smallMlp(), "mlp", 1);
  REQUIRE(queued.prefetchOnDevice(data[0].batch(false), *strict));
  for (size_t k = 0; k < data.size(); ++k) {
    INFO("batch " << k);
    if (k + 1 < data.size()) REQUIRE(queued.prefetchOnDevice(data[k + 1].batch(false), *strict));
    double loss = 0.0;
    requireSameBatch(queued.computeSvgOnDevice(dw, data[k].batch(false), &loss, *strict), want[k]);
    CHECK(loss == wantLoss[k]);
  }
  CHECK(queued.takeDeviceDataWait() >= 0.0);
  // A batch that was not copied ahead is copied in by its pass, as before.
  double loss = 0.0;
  requireSameBatch(queued.computeSvgOnDevice(dw, data[1].batch(false), &loss, *strict), want[1]);
  // Sparse data is queued as well, its compressed arrays staged: each pass then
  // copies in what a pass of a batch copied in does, less the batch and labels.
  GraphModel sparseReference(smallMlp(), "mlp", 1);
  GraphModel sparseQueued(smallMlp(), "mlp", 1);
  const auto prefetched = [&](size_t k) {
    const uint64_t before = strict->transfers().toDevice;
    REQUIRE(sparseQueued.prefetchOnDevice(data[k].batch(true), *strict));
    return strict->transfers().toDevice - before;
  };
  uint64_t ahead = prefetched(0);
  for (size_t k = 0; k < data.size(); ++k) {
    INFO("sparse batch " << k);
    uint64_t before = strict->transfers().toDevice;
    double want = 0.0;
    const SvBatch expected = sparseReference.computeSvgOnDevice(dw, data[k].batch(true), &want, *strict);
    const uint64_t copiedIn = strict->transfers().toDevice - before;
    const uint64_t next = k + 1 < data.size() ? prefetched(k + 1) : 0;
    before = strict->transfers().toDevice;
    double got = 0.0;
    requireSameBatch(sparseQueued.computeSvgOnDevice(dw, data[k].batch(true), &got, *strict), expected);
    CHECK(ahead > 0);
    CHECK(strict->transfers().toDevice - before + ahead == copiedIn);
    CHECK(got == want);
    ahead = next;
  }
  // Also where a node reads the input densely: its dense copy is queued too.
  GraphModel denseReference(sharedHidden(), "shared", 1);
  GraphModel denseQueued(sharedHidden(), "shared", 1);
  const ParamSet ws = randomParams(denseReference, gen);
  const std::vector<Tensor> dws = upload(*strict, ws);
  REQUIRE(denseQueued.prefetchOnDevice(data[0].batch(true), *strict));
  for (size_t k = 0; k < data.size(); ++k) {
    INFO("sparse batch read densely " << k);
    if (k + 1 < data.size()) REQUIRE(denseQueued.prefetchOnDevice(data[k + 1].batch(true), *strict));
    double want = 0.0, got = 0.0;
    const SvBatch expected = denseReference.computeSvgOnDevice(dws, data[k].batch(true), &want, *strict);
    const uint64_t before = strict->transfers().toDevice;
    requireSameBatch(denseQueued.computeSvgOnDevice(dws, data[k].batch(true), &got, *strict), expected);
    CHECK(strict->transfers().toDevice - before < static_cast<uint64_t>(kFeatures * data[k].dense.cols()) * 4);
    CHECK(got == want);
  }
}

TEST_CASE("the DDV swap queue: a batch queued ahead carries its data-dependent variables, unless kept again first",
          "[ops][device][strict]") {
  const Graph tm = parseLossFile(kExamples + "tm.loss", {kFeatures, kClasses});
  const auto strict = strict::makeStrictBackend();
  std::mt19937 gen(31);
  std::vector<Data> data;
  for (int k = 0; k < 4; ++k) {
    Data d = randomData(gen);
    d.dense = d.dense.cwiseAbs();  // word frequencies: each document's sum to 1
    for (int64_t j = 0; j < d.dense.cols(); ++j) d.dense.col(j) /= std::max(d.dense.col(j).sum(), 1e-3f);
    d.sparse = d.dense.sparseView();
    d.sparse.makeCompressed();
    data.push_back(std::move(d));
  }
  // Documents: 0 and 1 disjoint; 2 shares document 13 with 1 (kept by 1's pass after 2
  // was queued: its queued copy is stale); 3 is 0's documents again (kept values).
  const std::vector<std::vector<int64_t>> indices = {
      {0, 1, 2, 3, 4, 5, 6}, {10, 11, 12, 13, 14, 15, 16}, {20, 21, 13, 23, 24, 25, 26}, {6, 5, 4, 3, 2, 1, 0}};
  const auto batch = [&](size_t k) {
    ExampleBatch x = data[k].batch(true);
    x.indices = &indices[k];
    return x;
  };
  const GraphModel host(tm, "tm", 1);
  std::mt19937 paramGen(9);
  ParamSet w = randomParams(host, paramGen);
  for (Param& p : w.params) p.value = p.value.cwiseAbs() * 0.1f;  // topics: nonnegative, small
  std::vector<SvBatch> want;
  std::vector<double> wantLoss;
  for (size_t k = 0; k < data.size(); ++k) {
    double loss = 0.0;
    want.push_back(host.computeSvg(w, batch(k), &loss));
    wantLoss.push_back(loss);
  }
  const uint64_t localsBytes = 4 * static_cast<uint64_t>(kBatch) *
                               static_cast<uint64_t>(tm.node(tm.locals().at(0)).rows) * tm.locals().size();
  const GraphModel queued(tm, "tm", 1);
  const GraphModel unqueued(tm, "tm", 1);
  const std::vector<Tensor> dw = upload(*strict, w);
  REQUIRE(queued.prefetchOnDevice(batch(0), *strict));
  for (size_t k = 0; k < data.size(); ++k) {
    INFO("batch " << k);
    if (k + 1 < data.size()) REQUIRE(queued.prefetchOnDevice(batch(k + 1), *strict));
    uint64_t before = strict->transfers().toDevice;
    double loss = 0.0;
    requireSameBatch(unqueued.computeSvgOnDevice(dw, batch(k), &loss, *strict), want[k]);
    const uint64_t copiedIn = strict->transfers().toDevice - before;
    before = strict->transfers().toDevice;
    requireSameBatch(queued.computeSvgOnDevice(dw, batch(k), &loss, *strict), want[k]);
    CHECK(loss == wantLoss[k]);
    const uint64_t queuedIn = strict->transfers().toDevice - before;
    // Batch 2's variables were copied in by its pass (the queued ones stale); the others' came with the batch.
    if (k == 2) {
      CHECK(queuedIn >= localsBytes);
    } else {
      CHECK(queuedIn + localsBytes <= copiedIn);
    }
  }
}

TEST_CASE("the fusion plan splits runs of elementwise nodes at a backend's chain limits", "[ops][device]") {
  const Graph g = longChains();
  const auto longest = [&](const std::vector<FusedStep>& plan) {
    std::pair<size_t, int> most{0, 0};  // steps, inputs
    int chains = 0;
    for (const FusedStep& step : plan) {
      if (step.kind != FusedStep::Kind::kElementwise) continue;
      ++chains;
      const ChainPlan c = chainPlan(g, step.nodes);
      most = {std::max(most.first, c.chain.steps.size()), std::max(most.second, c.chain.inputs)};
    }
    return std::make_tuple(most.first, most.second, chains);
  };
  const auto [steps, inputs, chains] = longest(g.fusionPlan());
  CHECK(steps == 30);  // unlimited: the whole run is one chain
  CHECK(inputs == 11);
  CHECK(chains == 1);
  const auto [dSteps, dInputs, dChains] = longest(g.fusionPlan(true, kDeviceChainLimits));
  CHECK(dSteps <= static_cast<size_t>(kDeviceChainLimits.steps));
  CHECK(dInputs <= kDeviceChainLimits.inputs);
  CHECK(dChains >= 3);
  // Every node of the run is still in some chain (split, not dropped).
  size_t inChains = 0;
  for (const FusedStep& step : g.fusionPlan(true, kDeviceChainLimits)) {
    if (step.kind == FusedStep::Kind::kElementwise) inChains += step.nodes.size();
  }
  CHECK(inChains == 30);
}

TEST_CASE("at examples/mlp.loss's own sizes the device SVs are still bitwise the host's", "[ops][device][strict]") {
  // Products large enough for BLAS and Eigen's blocked GEMM (784 features, 1024 hidden).
  const int64_t features = 784;
  const int64_t batch = 32;
  cpu::CpuBackend cpu;
  const auto strict = strict::makeStrictBackend();
  GraphModel model(parseLossFile(kExamples + "mlp.loss", {features, 10}), "mlp", 1);
  std::mt19937 gen(23);
  const ParamSet w = randomParams(model, gen);
  Matrix dense = Matrix::Random(features, batch);
  Eigen::VectorXi labels(batch);
  for (int64_t j = 0; j < batch; ++j) labels(j) = static_cast<int>(j % 10);
  ExampleBatch x;
  x.dense = &dense;
  x.labels = &labels;
  double hostLoss = 0.0;
  const SvBatch host = model.computeSvg(w, x, &hostLoss);
  const ParamSet hostGrad = model.denseGradient(w, x, &hostLoss);
  for (Backend* backend : {static_cast<Backend*>(&cpu), strict.get()}) {
    requireDevicePassBitwise(model, w, x, *backend, host, hostLoss, hostGrad);
  }
}

TEST_CASE("the device executor's evaluation gives the host's prediction and loss", "[ops][device]") {
  cpu::CpuBackend cpu;
  const Graph g = smallMlp();
  GraphModel model(g, "mlp", 1);
  std::mt19937 gen(5);
  const ParamSet w = randomParams(model, gen);
  const Data data = randomData(gen);
  GraphExecutor<float> host(g);
  std::vector<const Matrix*> ptrs;
  for (const Param& p : w.params) ptrs.push_back(&p.value);
  GraphInputs<float> in;
  in.dense = &data.dense;
  in.labels = &data.labels;
  const float hostLoss = host.forward(ptrs, in);
  DeviceExecutor exec(g, cpu);
  const std::vector<Tensor> dw = upload(cpu, w);
  Matrix prediction;
  CHECK(exec.evaluate(dw, &data.dense, nullptr, data.labels, &prediction) == static_cast<double>(hostLoss));
  CHECK(bitwise(prediction, host.value(g.prediction())));
}

TEST_CASE("a second clock of the same shapes allocates no tensor", "[ops][device]") {
  CountingBackend backend;
  GraphModel model(smallMlp(), "mlp", 1);
  std::mt19937 gen(9);
  const ParamSet w = randomParams(model, gen);
  const std::vector<Tensor> dw = upload(backend, w);
  std::vector<Tensor> dg = allocateLike(backend, w);
  for (bool useSparse : {false, true}) {
    INFO((useSparse ? "sparse" : "dense"));
    const Data first = randomData(gen);
    const Data second = randomData(gen);
    double loss = 0.0;
    model.computeSvgOnDevice(dw, first.batch(useSparse), &loss, backend);
    const int allocated = backend.allocations;
    const int copies = backend.sparseCopies;
    const int storages = backend.sparseStorages;
    const SvBatch b = model.computeSvgOnDevice(dw, second.batch(useSparse), &loss, backend);
    model.denseGradientOnDevice(dw, second.batch(useSparse), &loss, backend, dg);
    CHECK(backend.allocations == allocated);
    // A sparse batch's arrays are copied to the device once per pass.
    CHECK(backend.sparseCopies == copies + (useSparse ? 2 : 0));
    CHECK(backend.sparseStorages == storages);  // into the first pass's storage
    double hostLoss = 0.0;
    requireSameBatch(b, model.computeSvg(w, second.batch(useSparse), &hostLoss));
  }
  // Another batch size: new buffers, the right results.
  const Data small = randomData(gen, 3);
  double loss = 0.0;
  double hostLoss = 0.0;
  const int allocated = backend.allocations;
  requireSameBatch(model.computeSvgOnDevice(dw, small.batch(false), &loss, backend),
                   model.computeSvg(w, small.batch(false), &hostLoss));
  CHECK(loss == hostLoss);
  CHECK(backend.allocations > allocated);
}

TEST_CASE("graphs the device executor cannot run are refused naming a node", "[ops][device]") {
  CHECK(DeviceExecutor::unsupported(smallMlp()).empty());
  CHECK(DeviceExecutor::unsupported(mlr()).empty());
  // The unrolled LSTM runs; its cell alone does not.
  CHECK(DeviceExecutor::unsupported(parseLossFile(kExamples + "lstm.loss", {0, 9, 3})).empty());
  Graph cell;
  const int token = cell.sequence("x", 4);
  const int state = cell.state("h", 4);
  cell.setNext(state, token);
  cell.setLoss(cell.apply(OpKind::kSum, {state}, "sum(h)"));
  CHECK_THAT(DeviceExecutor::unsupported(cell), Catch::Contains("unrolled"));
  CHECK(DeviceExecutor::unsupported(columnOps()).empty());
  CHECK(DeviceExecutor::unsupported(parseLossFile(kExamples + "tm.loss", {kFeatures, kClasses})).empty());
}

TEST_CASE("the topic model's data-dependent variables take their inner steps on the device, bitwise the host's",
          "[ops][device][strict]") {
  const Graph tm = parseLossFile(kExamples + "tm.loss", {kFeatures, kClasses});
  cpu::CpuBackend cpu;
  const auto strict = strict::makeStrictBackend();
  std::mt19937 gen(5);
  Data data = randomData(gen);
  data.dense = data.dense.cwiseAbs();  // word frequencies: each document's sum to 1
  for (int64_t j = 0; j < data.dense.cols(); ++j) data.dense.col(j) /= std::max(data.dense.col(j).sum(), 1e-3f);
  data.sparse = data.dense.sparseView();
  data.sparse.makeCompressed();
  const std::vector<int64_t> indices = {3, 0, 9, 4, 1, 7, 2};
  REQUIRE(static_cast<int64_t>(indices.size()) == kBatch);
  for (bool useSparse : {false, true}) {
    INFO((useSparse ? "sparse" : "dense"));
    ExampleBatch x = data.batch(useSparse);
    x.indices = &indices;
    const GraphModel host(tm, "tm", 1);
    REQUIRE(host.deviceRefusal().empty());
    std::mt19937 paramGen(9);
    ParamSet w = randomParams(host, paramGen);
    for (Param& p : w.params) p.value = p.value.cwiseAbs() * 0.1f;  // topics: nonnegative, small
    // Two clocks on the same examples: the second starts from the values the first kept.
    std::vector<SvBatch> hostBatches;
    std::vector<double> hostLosses;
    for (int clock = 0; clock < 2; ++clock) {
      double loss = 0.0;
      hostBatches.push_back(host.computeSvg(w, x, &loss));
      hostLosses.push_back(loss);
    }
    // The kept values were refined further: a lower loss, another V (s = softmax(theta)).
    REQUIRE(hostLosses[1] < hostLosses[0]);
    REQUIRE((hostBatches[0].matrices[0].vDense - hostBatches[1].matrices[0].vDense).norm() > 0.01f);
    const EvalSums hostEval = host.evaluate(w, x);
    for (Backend* backend : {static_cast<Backend*>(&cpu), strict.get()}) {
      INFO("backend " << backend->name());
      const GraphModel model(tm, "tm", 1);
      const std::vector<Tensor> dw = upload(*backend, w);
      for (int clock = 0; clock < 2; ++clock) {
        double loss = 0.0;
        const SvBatch batch = model.computeSvgOnDevice(dw, x, &loss, *backend);
        CHECK(loss == hostLosses[static_cast<size_t>(clock)]);
        requireSameBatch(batch, hostBatches[static_cast<size_t>(clock)]);
      }
      CHECK(model.evaluateOnDevice(dw, x, *backend).lossSum == hostEval.lossSum);
    }
  }
}

namespace {

constexpr int64_t kVocabulary = 9;
constexpr int64_t kSteps = 4;

// examples/lstm.loss with an embedding of 5 and a hidden state of 6, unrolled over `steps`.
Graph smallLstm(int steps = kSteps) {
  std::string text = readFile(kExamples + "lstm.loss");
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"embed = 128", "embed = 5"},
                                 std::pair<std::string, std::string>{"hidden = 128", "hidden = 6"}}) {
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
  }
  return parseLoss(text, "lstm.loss", {0, kVocabulary, steps});
}

// Segment `index` of streams 0 .. batch-1 (ops/sequence_layout.h), random tokens.
Matrix randomSegments(std::mt19937& gen, int64_t batch, int64_t index, int steps = kSteps) {
  std::uniform_int_distribution<int> token(0, static_cast<int>(kVocabulary) - 1);
  Matrix s(segmentRows(steps), batch);
  for (int64_t j = 0; j < batch; ++j) {
    s(kSegmentStreamRow, j) = static_cast<float>(j);
    s(kSegmentIndexRow, j) = static_cast<float>(index);
    for (int64_t t = 0; t <= steps; ++t) s(kSegmentTokenRow + t, j) = static_cast<float>(token(gen));
  }
  return s;
}

}  // namespace

TEST_CASE("the unrolled LSTM's device SVs, loss and carried states are bitwise the host executor's",
          "[ops][device][strict]") {
  cpu::CpuBackend cpu;
  const auto strict = strict::makeStrictBackend();
  const Graph g = smallLstm();
  REQUIRE(DeviceExecutor::unsupported(g).empty());
  REQUIRE(GraphExecutor<float>(g).hoistedMatrices() == 1);  // W over concat(e, h) is hoisted
  std::mt19937 gen(31);
  GraphModel hostModel(g, "lstm", 1);
  const ParamSet w = randomParams(hostModel, gen);
  // Three segments of each stream: each starts from the states the one before ended with.
  const std::vector<Matrix> segments = {randomSegments(gen, kBatch, 0), randomSegments(gen, kBatch, 1),
                                        randomSegments(gen, kBatch, 2)};
  for (Model::SvgUnit unit : {Model::SvgUnit::kExample, Model::SvgUnit::kStep}) {
    GraphModel host(g, "lstm", 1);
    host.setSvgUnit(unit);
    std::vector<std::unique_ptr<GraphModel>> devices;
    std::vector<std::vector<Tensor>> dw;
    for (Backend* backend : {static_cast<Backend*>(&cpu), strict.get()}) {
      devices.push_back(std::make_unique<GraphModel>(g, "lstm", 1));
      devices.back()->setSvgUnit(unit);
      dw.push_back(upload(*backend, w));
    }
    const Eigen::VectorXi labels = Eigen::VectorXi::Zero(kBatch);  // a batch's size (token data has none)
    for (const Matrix& s : segments) {
      ExampleBatch x;
      x.dense = &s;
      x.labels = &labels;
      double hostLoss = 0.0;
      const SvBatch expected = host.computeSvg(w, x, &hostLoss);
      // Every site (each matrix at each step) has a U to compare.
      for (const SvMatrix& m : expected.matrices) REQUIRE(m.u.norm() > 0.0f);
      CHECK(expected.matrices.size() == (unit == Model::SvgUnit::kStep ? 3u : 3u * kSteps));
      for (size_t d = 0; d < devices.size(); ++d) {
        Backend& backend = d == 0 ? static_cast<Backend&>(cpu) : *strict;
        INFO("backend " << backend.name() << ", segment " << s(kSegmentIndexRow, 0));
        double loss = 0.0;
        requireSameBatch(devices[d]->computeSvgOnDevice(dw[d], x, &loss, backend), expected);
        CHECK(loss == hostLoss);
      }
    }
    for (const auto& device : devices) requireSameParams(device->carriedState(), host.carriedState());
    // Test batches: the host's sums, states carried apart from training's.
    for (const Matrix& s : segments) {
      ExampleBatch x;
      x.dense = &s;
      x.labels = &labels;
      const EvalSums expected = host.evaluate(w, x);
      for (size_t d = 0; d < devices.size(); ++d) {
        Backend& backend = d == 0 ? static_cast<Backend&>(cpu) : *strict;
        const EvalSums got = devices[d]->evaluateOnDevice(dw[d], x, backend);
        CHECK(got.lossSum == expected.lossSum);
        CHECK(got.correct == expected.correct);
        CHECK(got.count == expected.count);
      }
    }
  }
}

TEST_CASE("the unrolled LSTM's device executor gives the host executor's U and V at every site from given states",
          "[ops][device][strict]") {
  cpu::CpuBackend cpu;
  const auto strict = strict::makeStrictBackend();
  const Graph g = smallLstm();
  GraphModel model(g, "lstm", 1);
  std::mt19937 gen(41);
  const ParamSet w = randomParams(model, gen);
  const Matrix s = randomSegments(gen, kBatch, 3);
  std::vector<Matrix> states;
  std::normal_distribution<float> d(0.0f, 0.5f);
  for (int id : g.states()) states.push_back(Matrix::NullaryExpr(g.node(id).rows, kBatch, [&] { return d(gen); }));
  GraphExecutor<float> host(g);
  std::vector<const Matrix*> ptrs;
  for (const Param& p : w.params) ptrs.push_back(&p.value);
  GraphInputs<float> in;
  in.dense = &s;
  in.states = &states;
  const float hostLoss = host.forward(ptrs, in);
  host.backward(ptrs, in);
  for (Backend* backend : {static_cast<Backend*>(&cpu), strict.get()}) {
    INFO("backend " << backend->name());
    DeviceExecutor exec(g, *backend);
    const std::vector<Tensor> dw = upload(*backend, w);
    std::vector<size_t> order;
    CHECK(exec.runSequence(dw, s, &states, [&](size_t site) { order.push_back(site); }) ==
          static_cast<double>(hostLoss));
    CHECK(order.size() == exec.sites().size());
    for (size_t i = 0; i < exec.sites().size(); ++i) {
      const SvSite& site = exec.sites()[i];
      INFO("site " << i);
      Matrix u(exec.siteU(i).rows(), exec.siteU(i).cols());
      Tensor hu = cpu::view(u);
      backend->copy(exec.siteU(i), hu);
      CHECK(bitwise(u, host.grad(site.matvecNode)));
      if (const SparseMatrix* tokens = exec.siteVTokens(i)) {
        CHECK(bitwise(*tokens, host.tokens(site.vectorNode)));
        REQUIRE(exec.siteVSparse(i) != nullptr);
      } else {
        Matrix v;
        exec.copyOut(site.vectorNode, v);
        CHECK(bitwise(v, host.value(site.vectorNode)));
      }
    }
    for (size_t k = 0; k < g.finalStates().size(); ++k) {
      Matrix final;
      exec.finalState(k, final);
      CHECK(bitwise(final, host.value(g.finalStates()[k])));
    }
  }
}

TEST_CASE("the unrolled LSTM's second clock of the same shapes allocates no tensor", "[ops][device]") {
  CountingBackend backend;
  GraphModel model(smallLstm(), "lstm", 1);
  std::mt19937 gen(43);
  const ParamSet w = randomParams(model, gen);
  const std::vector<Tensor> dw = upload(backend, w);
  const Eigen::VectorXi labels = Eigen::VectorXi::Zero(kBatch);
  double loss = 0.0;
  const Matrix first = randomSegments(gen, kBatch, 0);
  ExampleBatch x;
  x.dense = &first;
  x.labels = &labels;
  model.computeSvgOnDevice(dw, x, &loss, backend);
  const int allocated = backend.allocations;
  const int copies = backend.sparseCopies;
  const Matrix second = randomSegments(gen, kBatch, 1);
  x.dense = &second;
  model.computeSvgOnDevice(dw, x, &loss, backend);
  CHECK(backend.allocations == allocated);
  // One sparse copy per step: the tokens E reads.
  CHECK(backend.sparseCopies == copies + static_cast<int>(kSteps));
}

TEST_CASE("the unrolled LSTM's states stay on the device while segments continue their streams",
          "[ops][device][strict]") {
  const auto strict = strict::makeStrictBackend();
  const Graph g = smallLstm();
  GraphModel host(g, "lstm", 1);
  GraphModel device(g, "lstm", 1);
  std::mt19937 gen(47);
  const ParamSet w = randomParams(host, gen);
  const std::vector<Tensor> dw = upload(*strict, w);
  const Eigen::VectorXi labels = Eigen::VectorXi::Zero(kBatch);
  std::vector<uint64_t> uploaded;
  for (int64_t index = 0; index < 3; ++index) {
    const Matrix s = randomSegments(gen, kBatch, index);
    ExampleBatch x;
    x.dense = &s;
    x.labels = &labels;
    double loss = 0.0;
    const SvBatch expected = host.computeSvg(w, x, &loss);
    const uint64_t before = strict->transfers().toDevice;
    requireSameBatch(device.computeSvgOnDevice(dw, x, &loss, *strict), expected);
    uploaded.push_back(strict->transfers().toDevice - before);
    // The states come to the host when asked for (a checkpoint's carriedState).
    if (index == 1) requireSameParams(device.carriedState(), host.carriedState());
  }
  // Segment 1 started from the device's states; segment 2, after they were
  // fetched, from the host's: h and c (6 x B each) copied in once more.
  CHECK(uploaded[2] == uploaded[1] + 2 * 6 * kBatch * sizeof(float));
  requireSameParams(device.carriedState(), host.carriedState());
}

// A feed may hand the next batch in the object that held the last: the host
// executor's dense copy of a sparse batch (for operands that read it densely, as
// the topic model's sq_dist(B s, x) does) is made anew for each batch.
TEST_CASE("a sparse batch in the object of the last one is read anew", "[ops][device]") {
  const std::vector<int64_t> firstIndices = {0, 1, 2, 3, 4, 5, 6};
  const std::vector<int64_t> secondIndices = {10, 11, 12, 13, 14, 15, 16};
  for (const auto& [name, graph] : {std::pair<const char*, Graph (*)()>{"shared hidden layer", sharedHidden},
                                    {"topic model", [] {
                                       return parseLossFile(kExamples + "tm.loss", {kFeatures, kClasses});
                                     }}}) {
    INFO(name);
    std::mt19937 gen(8);
    const Data first = randomData(gen);
    const Data second = randomData(gen);
    const GraphModel model(graph(), name, 1);
    const GraphModel fresh(graph(), name, 1);
    std::mt19937 paramGen(4);
    const ParamSet w = randomParams(model, paramGen);
    SparseMatrix feed = first.sparse;  // the feed's one batch object
    ExampleBatch x;
    x.sparse = &feed;
    x.labels = &first.labels;
    x.indices = &firstIndices;
    double loss = 0.0;
    model.computeSvg(w, x, &loss);
    feed = second.sparse;
    x.labels = &second.labels;
    x.indices = &secondIndices;
    double again = 0.0;
    model.computeSvg(w, x, &again);
    ExampleBatch y = second.batch(true);
    y.indices = &secondIndices;
    double want = 0.0;
    fresh.computeSvg(w, y, &want);
    CHECK(again == want);
    CHECK(model.evaluate(w, x).lossSum == fresh.evaluate(w, y).lossSum);
  }
}

namespace {

// One --sync dense clock of the LSTM on `backend`: the dense gradient of the
// segment, then an SGD step on every parameter. Returns the operations it queued.
uint64_t lstmClock(const GraphModel& model, Backend& backend, std::vector<Tensor>& w, std::vector<Tensor>& grad,
                   const Matrix& segments) {
  const Eigen::VectorXi labels = Eigen::VectorXi::Zero(segments.cols());
  ExampleBatch x;
  x.dense = &segments;
  x.labels = &labels;
  const uint64_t before = backend.launches();
  double loss = 0.0;
  model.denseGradientOnDevice(w, x, &loss, backend, grad);
  OptimizerStep sgd;
  sgd.lr = 0.5f;
  for (size_t k = 0; k < w.size(); ++k) backend.optimizerStep(sgd, grad[k], w[k], nullptr, nullptr);
  return backend.launches() - before;
}

}  // namespace

TEST_CASE("the fused LSTM cell queues at most half the operations of its nodes run one by one, to the same parameters",
          "[ops][device][strict]") {
  const auto strict = strict::makeStrictBackend();
  for (const int steps : {static_cast<int>(kSteps), 20}) {
    const Graph g = smallLstm(steps);
    const auto cells = [](const std::vector<FusedStep>& plan) {
      return std::count_if(plan.begin(), plan.end(),
                           [](const FusedStep& s) { return s.kind == FusedStep::Kind::kLstmCell; });
    };
    REQUIRE(cells(g.fusionPlan()) == steps);
    REQUIRE(cells(g.fusionPlan(false)) == 0);
    REQUIRE(DeviceExecutor::unsupported(g, false).empty());
    GraphModel fused(g, "lstm", 1);
    GraphModel unfused(g, "lstm", 1);
    unfused.setLstmCellFusion(false);
    std::mt19937 gen(53);
    const ParamSet w0 = randomParams(fused, gen);
    std::vector<Tensor> wFused = upload(*strict, w0);
    std::vector<Tensor> wUnfused = upload(*strict, w0);
    std::vector<Tensor> gFused = allocateLike(*strict, w0);
    std::vector<Tensor> gUnfused = allocateLike(*strict, w0);
    double moved = 0.0;
    for (int64_t clock = 0; clock < 4; ++clock) {
      const Matrix s = randomSegments(gen, kBatch, clock, steps);
      const uint64_t launchesFused = lstmClock(fused, *strict, wFused, gFused, s);
      const uint64_t launchesUnfused = lstmClock(unfused, *strict, wUnfused, gUnfused, s);
      INFO("T " << steps << ", clock " << clock << ": " << launchesFused << " operations fused, " << launchesUnfused
                << " unfused");
      CHECK(2 * launchesFused <= launchesUnfused);
      if (clock > 0) continue;
      // The same terms in the same order: after a clock, equal to float rounding. (The
      // fused cell's sigmoid and tanh are Eigen's vectorised ones, the unfused chain's
      // libm's, a few ulp apart; at lr 0.5 later clocks amplify that.)
      const ParamSet a = download(*strict, w0, wFused);
      const ParamSet b = download(*strict, w0, wUnfused);
      for (size_t k = 0; k < a.params.size(); ++k) {
        INFO("T " << steps << ", " << a.params[k].name);
        const double scale = std::max(1e-30, static_cast<double>(a[k].norm()));
        CHECK(static_cast<double>((a[k] - b[k]).norm()) / scale < 1e-6);
        moved += static_cast<double>((a[k] - w0[k]).norm());
      }
    }
    CHECK(moved > 0.1);  // the clock trained: the comparison is not of the initial values
  }
}

TEST_CASE("the unrolled LSTM's token one-hots copied ahead give the passes of segments copied in, bitwise",
          "[ops][device][strict]") {
  const auto strict = strict::makeStrictBackend();
  const Graph g = smallLstm();
  std::mt19937 gen(53);
  GraphModel reference(g, "lstm", 1);
  const ParamSet w = randomParams(reference, gen);
  const std::vector<Tensor> dw = upload(*strict, w);
  const Eigen::VectorXi labels = Eigen::VectorXi::Zero(kBatch);
  // Four segments of each stream, then a smaller batch of new streams.
  std::vector<Matrix> segments;
  for (int64_t index = 0; index < 4; ++index) segments.push_back(randomSegments(gen, kBatch, index));
  segments.push_back(randomSegments(gen, kBatch - 2, 0));
  const auto batchOf = [&](const Matrix& s) {
    ExampleBatch x;
    x.dense = &s;
    x.labels = &labels;
    return x;
  };
  std::vector<SvBatch> want;
  std::vector<double> wantLoss;
  std::vector<uint64_t> copiedIn;
  for (const Matrix& s : segments) {
    const uint64_t before = strict->transfers().toDevice;
    double loss = 0.0;
    want.push_back(reference.computeSvgOnDevice(dw, batchOf(s), &loss, *strict));
    wantLoss.push_back(loss);
    copiedIn.push_back(strict->transfers().toDevice - before);
  }
  // As the worker queues them: the next segments' one-hots copied ahead before
  // each pass. A pass that read them before their copies landed would fail here.
  GraphModel queued(g, "lstm", 1);
  const auto prefetched = [&](size_t k) {
    const uint64_t before = strict->transfers().toDevice;
    REQUIRE(queued.prefetchOnDevice(batchOf(segments[k]), *strict));
    return strict->transfers().toDevice - before;
  };
  uint64_t ahead = prefetched(0);
  for (size_t k = 0; k < segments.size(); ++k) {
    INFO("segments " << k);
    const uint64_t next = k + 1 < segments.size() ? prefetched(k + 1) : 0;
    const uint64_t before = strict->transfers().toDevice;
    double loss = 0.0;
    requireSameBatch(queued.computeSvgOnDevice(dw, batchOf(segments[k]), &loss, *strict), want[k]);
    CHECK(loss == wantLoss[k]);
    // The pass copies in no token (the segments' one-hots came ahead), only what
    // a pass of segments copied in does besides: new streams' states, the zeros
    // of a new batch size.
    CHECK(ahead > 0);
    CHECK(strict->transfers().toDevice - before + ahead == copiedIn[k]);
    if (k >= 1 && k <= 3) CHECK(strict->transfers().toDevice == before);
    ahead = next;
  }
  CHECK(queued.takeDeviceDataWait() >= 0.0);
  requireSameParams(queued.carriedState(), reference.carriedState());
}
