// The built-in MLR (ops/mlr.h) on a device: its device form is examples/mlr.loss's
// graph run by the device executor, so on the cpu and strict backends its SVs,
// loss, dense gradient and test sums are bitwise the host path's, for dense and
// sparse batches; and its host path is the .loss model's, bit for bit.
#include "device_test_support.h"
#include "ops/graph_model.h"
#include "ops/loss_parser.h"
#include "ops/mlr.h"
#include "ops/strict/strict_backend.h"

#include <catch2/catch.hpp>

#include <random>

using namespace orpheus;
using namespace orpheus::ops;
using namespace orpheus::ops::testing;

namespace {

constexpr int64_t kFeatures = 30;
constexpr int64_t kClasses = 6;
constexpr int64_t kBatch = 9;

using Batch = ExampleData;

Batch randomBatch(std::mt19937& gen) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_real_distribution<double> keep(0.0, 1.0);
  Batch b;
  b.dense = Matrix::Zero(kFeatures, kBatch);
  for (int64_t i = 0; i < b.dense.size(); ++i) {
    if (keep(gen) < 0.4) b.dense.data()[i] = d(gen);
  }
  b.sparse = b.dense.sparseView();
  b.sparse.makeCompressed();
  b.labels.resize(kBatch);
  for (int64_t j = 0; j < kBatch; ++j) b.labels(j) = static_cast<int>(j % kClasses);
  return b;
}

// The built-in's initial W, and a bias that is not zero.
ParamSet someParams(const MultinomialLogisticRegression& model, std::mt19937& gen) {
  ParamSet w = model.initParams(3);
  std::normal_distribution<float> d(0.0f, 0.3f);
  for (int64_t i = 0; i < w[1].size(); ++i) w[1].data()[i] = d(gen);
  w[0] *= 40.0f;  // confident predictions: the softmax's rounding shows
  return w;
}

}  // namespace

TEST_CASE("the built-in MLR's device SVs, loss and gradient are bitwise its host path's on cpu and strict",
          "[ops][device][strict][mlr]") {
  cpu::CpuBackend cpu;
  const auto strict = strict::makeStrictBackend();
  const MultinomialLogisticRegression model(kFeatures, kClasses);
  REQUIRE(model.deviceRefusal().empty());
  std::mt19937 gen(29);
  const ParamSet w = someParams(model, gen);
  const Batch data = randomBatch(gen);
  for (bool useSparse : {false, true}) {
    INFO((useSparse ? "sparse" : "dense"));
    const ExampleBatch x = data.batch(useSparse);
    double hostLoss = 0.0;
    const SvBatch host = model.computeSvg(w, x, &hostLoss);
    REQUIRE(host.matrices.size() == 1);
    CHECK(host.matrices[0].sparseV == useSparse);
    const ParamSet hostGrad = model.denseGradient(w, x, nullptr);
    const EvalSums hostSums = model.evaluate(w, x);
    for (Backend* backend : {static_cast<Backend*>(&cpu), strict.get()}) {
      const std::vector<Tensor> dw = requireDevicePassBitwise(model, w, x, *backend, host, hostLoss, hostGrad);
      const EvalSums sums = model.evaluateOnDevice(dw, x, *backend);
      CHECK(sums.lossSum == hostSums.lossSum);
      CHECK(sums.correct == hostSums.correct);
      CHECK(sums.count == hostSums.count);
    }
    model.releaseDevice();
  }
}

TEST_CASE("the built-in MLR computes what examples/mlr.loss computes, bit for bit", "[ops][mlr]") {
  const MultinomialLogisticRegression builtIn(kFeatures, kClasses);
  const GraphModel file(parseLossFile(std::string(ORPHEUS_SOURCE_DIR) + "/examples/mlr.loss", {kFeatures, kClasses}),
                        "mlr.loss", 1);
  CHECK(builtIn.paramSpecs().size() == file.paramSpecs().size());
  std::mt19937 gen(31);
  const ParamSet w = someParams(builtIn, gen);
  const Batch data = randomBatch(gen);
  for (bool useSparse : {false, true}) {
    const ExampleBatch x = data.batch(useSparse);
    double a = 0.0, b = 0.0;
    requireSameBatch(builtIn.computeSvg(w, x, &a), file.computeSvg(w, x, &b));
    CHECK(a == b);
    CHECK(builtIn.evaluate(w, x).lossSum == file.evaluate(w, x).lossSum);
  }
}

TEST_CASE("the built-in MLR refuses a label out of range on the device too", "[ops][device][mlr]") {
  cpu::CpuBackend cpu;
  const MultinomialLogisticRegression model(kFeatures, kClasses);
  std::mt19937 gen(37);
  const ParamSet w = model.initParams(1);
  Batch data = randomBatch(gen);
  data.labels(2) = static_cast<int>(kClasses);
  const std::vector<Tensor> dw = upload(cpu, w);
  CHECK_THROWS_WITH(model.computeSvgOnDevice(dw, data.batch(false), nullptr, cpu), Catch::Contains("label 6"));
  model.releaseDevice();
}

TEST_CASE("a rebuild reads the local batch's SVs where the device pass left them: fewer bytes in, the same bits",
          "[ops][device][strict][rebuild]") {
  const auto strict = strict::makeStrictBackend();
  const MultinomialLogisticRegression model(kFeatures, kClasses);
  std::mt19937 gen(41);
  const ParamSet w = someParams(model, gen);
  const Batch mine = randomBatch(gen);
  const Batch theirs = randomBatch(gen);
  for (bool uniform : {true, false}) {
    INFO((uniform ? "one coefficient" : "coefficients per column"));
    const std::vector<Tensor> dw = upload(*strict, w);
    SvBatch local = model.computeSvgOnDevice(dw, mine.batch(false), nullptr, *strict);
    std::vector<DeviceSvs> onDevice = model.lastDeviceSvs();
    REQUIRE(onDevice.size() == 1);
    onDevice[0].hostU = local.matrices[0].u.data();
    scaleCoefficients(local, -0.25f);
    if (!uniform) local.coeffs(1) = 0.5f;
    SvBatch peer = model.computeSvg(w, theirs.batch(false), nullptr);
    scaleCoefficients(peer, -0.25f);
    const SvBatchView views[] = {viewOf(local), viewOf(peer)};
    const SvBatchView* group[] = {&views[0], &views[1]};
    ParamSet results[2];
    uint64_t bytesIn[2] = {0, 0};
    for (int reads = 0; reads < 2; ++reads) {
      std::vector<Tensor> target = upload(*strict, w);
      RebuildBuffers buffers;
      const uint64_t before = strict->transfers().toDevice;
      applySvBatches(group, target, *strict, buffers,
                     reads ? std::span<const DeviceSvs>(onDevice) : std::span<const DeviceSvs>());
      bytesIn[reads] = strict->transfers().toDevice - before;
      results[reads] = download(*strict, w, target);
    }
    requireSameParams(results[1], results[0]);
    // V (K x B) stays on the device, and U C with it when C is one value, and then
    // the bias update (U C 1) is formed there too.
    const uint64_t saved =
        ((kFeatures + (uniform ? kClasses : 0)) * kBatch + (uniform ? kClasses : 0)) * sizeof(float);
    CHECK(bytesIn[0] - bytesIn[1] == saved);
    model.releaseDevice();
  }
}
