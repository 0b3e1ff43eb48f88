// The replica resident on a device (engine/worker/device_replica.h), on the strict
// device: the same steps as the host's replica, bit for bit, for every first-order
// optimizer, and up to rounding for quasi-Newton (float there, double on the host);
// a mirror that falls behind is NaN and cannot be handed back.
#include "engine/worker/device_replica.h"
#include "engine/worker/optimizer.h"
#include "ops/backends.h"
#include "ops/graph_model.h"
#include "ops/loss_parser.h"
#include "tests/support/bitwise.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>

using namespace orpheus;
using orpheus::testing::bitwiseEqual;
using engine::OptimizerKind;
using engine::OptimizerSettings;
using engine::ReplicaUpdater;

namespace {

constexpr int64_t kFeatures = 20;
constexpr int64_t kClasses = 5;
constexpr int64_t kBatch = 6;

ops::GraphModel mlrModel() {
  return ops::GraphModel(ops::parseLossFile(std::string(ORPHEUS_SOURCE_DIR) + "/examples/mlr.loss",
                                            {kFeatures, kClasses}),
                         "mlr.loss", 5);
}

// One clock's batch of SVs from random data at `w`, scaled as the worker scales it.
SvBatch clockBatch(const ops::GraphModel& model, const ParamSet& w, std::mt19937& gen, float scale) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> label(0, static_cast<int>(kClasses) - 1);
  Matrix x(kFeatures, kBatch);
  for (int64_t i = 0; i < x.size(); ++i) x.data()[i] = d(gen);
  Eigen::VectorXi y(kBatch);
  for (int64_t j = 0; j < kBatch; ++j) y(j) = label(gen);
  ops::ExampleBatch batch;
  batch.dense = &x;
  batch.labels = &y;
  double loss = 0.0;
  SvBatch b = model.computeSvg(w, batch, &loss);
  ops::scaleCoefficients(b, scale);
  return b;
}

bool allNaN(const ParamSet& a) {
  for (const Param& p : a.params) {
    for (int64_t i = 0; i < p.value.size(); ++i) {
      if (!std::isnan(p.value.data()[i])) return false;
    }
  }
  return true;
}

// A host replica and a replica resident on the strict device, equal at the start.
struct Replicas {
  Replicas(const ops::GraphModel& model, const OptimizerSettings& s)
      : model(model), host(s, model, *cpu), device(s, model, *strict), hostW(model.initParams(5)), deviceW(hostW) {
    device.reside(deviceW);
  }
  // One clock on both: the same batch (computed from the host's replica), rebuilt and
  // stepped; the device's mirror is NaN until brought up to date, then current.
  void clock(uint64_t clock, std::mt19937& gen) {
    const SvBatch b = clockBatch(model, hostW, gen, host.coefficientScale(clock, 2.0 * kBatch));
    const SvBatch* one[] = {&b};
    host.applyGroup(clock, one, hostW);
    device.applyGroup(clock, one, deviceW);
    host.finishClock(hostW);
    device.finishClock(deviceW);
    CHECK(allNaN(deviceW));
    device.toHost(deviceW);
  }

  const ops::GraphModel& model;
  std::unique_ptr<ops::Backend> cpu = ops::makeBackend("cpu");
  std::unique_ptr<ops::Backend> strict = ops::makeBackend("strict");
  ReplicaUpdater host;
  ReplicaUpdater device;
  ParamSet hostW;
  ParamSet deviceW;
};

}  // namespace

TEST_CASE("a resident replica takes the host replica's steps, bitwise", "[device_replica][strict]") {
  const ops::GraphModel model = mlrModel();
  const auto kind = GENERATE(OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kNesterov,
                             OptimizerKind::kAdagrad, OptimizerKind::kAdam);
  const double wd = GENERATE(0.0, 0.01);
  OptimizerSettings s;
  s.kind = kind;
  s.lr = kind == OptimizerKind::kAdam ? 0.01 : 0.1;
  s.weightDecay = wd;
  CAPTURE(static_cast<int>(kind), wd);

  Replicas r(model, s);
  REQUIRE(engine::residencyRefusal(model, *r.strict).empty());
  REQUIRE(!engine::residencyRefusal(model, *r.cpu).empty());
  REQUIRE(r.device.resident());

  std::mt19937 gen(11);
  for (uint64_t clock = 1; clock <= 4; ++clock) {
    r.clock(clock, gen);
    REQUIRE(bitwiseEqual(r.hostW, r.deviceW));
    CHECK(bitwiseEqual(r.host.optimizer().exportState(), r.device.optimizer().exportState()));
  }
}

TEST_CASE("the host hands a resident replica back only from a current mirror", "[device_replica][strict]") {
  const ops::GraphModel model = mlrModel();
  OptimizerSettings s;
  s.kind = OptimizerKind::kMomentum;
  const auto cpu = ops::makeBackend("cpu");
  const auto strict = ops::makeBackend("strict");
  ReplicaUpdater host(s, model, *cpu);
  ReplicaUpdater device(s, model, *strict);
  ParamSet hostW = model.initParams(5);
  ParamSet deviceW = hostW;
  device.reside(deviceW);
  std::mt19937 gen(3);

  const SvBatch first = clockBatch(model, hostW, gen, host.coefficientScale(1, kBatch));
  const SvBatch* one[] = {&first};
  host.applyGroup(1, one, hostW);
  device.applyGroup(1, one, deviceW);
  host.settle(hostW);
  device.finishClock(deviceW);
  // Changing a mirror that is behind would send old values back: refused.
  CHECK_THROWS_WITH(device.hostChanged(), Catch::Contains("behind its device"));
  device.settle(deviceW);
  REQUIRE(bitwiseEqual(hostW, deviceW));

  // The host changes the replica (as averaging does) and hands it back: the next
  // clock starts from the change on both.
  for (ParamSet* w : {&hostW, &deviceW}) (*w)[0] *= 0.5f;
  device.hostChanged();
  const SvBatch second = clockBatch(model, hostW, gen, host.coefficientScale(2, kBatch));
  const SvBatch* two[] = {&second};
  host.applyGroup(2, two, hostW);
  device.applyGroup(2, two, deviceW);
  host.settle(hostW);
  device.settle(deviceW);
  CHECK(bitwiseEqual(hostW, deviceW));
  CHECK(bitwiseEqual(host.optimizer().exportState(), device.optimizer().exportState()));
}

TEST_CASE("a resident quasi-Newton replica tracks the host's double-precision steps", "[device_replica][strict]") {
  const ops::GraphModel model = mlrModel();
  const auto kind = GENERATE(OptimizerKind::kBfgs, OptimizerKind::kDfp);
  const double wd = GENERATE(0.0, 0.01);
  OptimizerSettings s;
  s.kind = kind;
  s.lr = 0.5;
  s.weightDecay = wd;
  CAPTURE(static_cast<int>(kind), wd);

  Replicas r(model, s);
  REQUIRE(r.device.resident());

  // The same batches on both (from the host's replica), so that only the step's
  // arithmetic differs: rounding, not a different trajectory.
  std::mt19937 gen(17);
  const auto relative = [](const Matrix& a, const Matrix& b) {
    return static_cast<double>((a - b).norm()) / std::max(1e-30, static_cast<double>(b.norm()));
  };
  double worst = 0.0;
  for (uint64_t clock = 1; clock <= 8; ++clock) {
    r.clock(clock, gen);
    for (size_t i = 0; i < r.hostW.size(); ++i) CHECK(relative(r.deviceW[i], r.hostW[i]) <= 1e-4);
    CHECK(r.device.optimizer().steps() == r.host.optimizer().steps());
    CHECK(r.device.optimizer().skips() == r.host.optimizer().skips());
    const ParamSet hs = r.host.optimizer().exportState(), ds = r.device.optimizer().exportState();
    const int h = hs.find("optimizer/quasi_newton/h");
    REQUIRE(h >= 0);
    CHECK(relative(ds[static_cast<size_t>(h)], hs[static_cast<size_t>(h)]) <= 1e-4);
    worst = std::max(worst, relative(r.deviceW[0], r.hostW[0]));
  }
  UNSCOPED_INFO("worst relative difference of the weights: " << worst);
  // W moved away from the identity it started as: the updates ran on the device.
  const ParamSet ds = r.device.optimizer().exportState();
  const Matrix& w = ds[static_cast<size_t>(ds.find("optimizer/quasi_newton/h"))];
  CHECK(!w.isApprox(Matrix::Identity(w.rows(), w.cols()), 1e-3f));
  CHECK(r.host.optimizer().skips() < 7);
  CHECK(worst <= 1e-5);
}
