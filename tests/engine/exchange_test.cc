// --overlap on (engine/worker/overlap.h): per-layer sends from inside the backward pass
// and bucketed dense all-reduces give the parameters of --overlap off bit for bit,
// and the top layer leaves before the backward pass ends. Ranks are threads over
// the loopback transport.
#include "comm/loopback/loopback_transport.h"
#include "ops/backends.h"
#include "engine/data/sampler.h"
#include "engine/worker/overlap.h"
#include "engine/data/synthetic_data.h"
#include "engine/worker/worker.h"
#include "ops/graph_model.h"

#include <catch2/catch.hpp>

#include <thread>

using namespace orpheus;
using comm::loopback::LoopbackHub;
using comm::loopback::LoopbackTransport;

namespace {

constexpr int64_t kFeatures = 20;
constexpr int64_t kClasses = 4;

// Three layers, so a send can leave while two layers below still compute.
std::unique_ptr<ops::GraphModel> mlp() {
  const std::string text =
      "dim h = 16\nparam W1[h, features] init he\nparam b1[h]\nparam W2[h, h] init he\nparam b2[h]\n"
      "param W3[classes, h] init glorot\nparam b3[classes]\ninput x[features]\nlabel y[classes]\n"
      "loss cross_entropy(softmax(W3 * relu(W2 * relu(W1 * x + b1) + b2) + b3), y)\n";
  return std::make_unique<ops::GraphModel>(ops::parseLoss(text, "mlp3", {kFeatures, kClasses}), "mlp3", 1);
}

struct Run {
  std::vector<ParamSet> replicas;
  std::vector<std::vector<engine::ClockStats>> stats;  // per rank, per clock
};

Run train(engine::TrainConfig config, int ranks, int64_t clocks) {
  auto hub = std::make_shared<LoopbackHub>(ranks);
  Run run;
  run.replicas.resize(static_cast<size_t>(ranks));
  run.stats.resize(static_cast<size_t>(ranks));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        LoopbackTransport t(hub, r);
        const data::Dataset shard = engine::makeSyntheticShard(
            fmt::format("synthetic:examples=600,features={},classes={}", kFeatures, kClasses), config.seed, r, ranks);
        const auto model = mlp();
        const auto backend = ops::makeBackend(config.device);
        engine::Worker worker(config, *model, *backend, t, shard, nullptr);
        data::MinibatchSampler sampler(shard.size(), config.batch, config.seed, r);
        for (int64_t c = 1; c <= clocks; ++c) {
          run.stats[static_cast<size_t>(r)].push_back(
              worker.runClock(static_cast<uint64_t>(c), data::gather(shard, sampler.next())));
          worker.coordinate(static_cast<uint64_t>(c));
        }
        worker.drain(static_cast<uint64_t>(clocks));
        run.replicas[static_cast<size_t>(r)] = worker.replica();
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return run;
}

bool bitwiseEqual(const ParamSet& a, const ParamSet& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return false;
  return true;
}

}  // namespace

TEST_CASE("a weight and its bias form one unit; units follow the sites", "[engine][overlap]") {
  const engine::SvUnits units({{0, 1}, {2, 3}, {4, 5}});
  REQUIRE(units.count() == 3);
  CHECK(units.params(1) == std::vector<uint32_t>{2, 3});
  CHECK(units.unitOfParam(4) == 2u);
  // A matrix used at two sites (a recurrence): one unit holding both.
  const engine::SvUnits shared({{0, -1}, {1, 2}, {0, -1}});
  REQUIRE(shared.count() == 2);
  CHECK(shared.members(0) == std::vector<size_t>{0, 2});
}

TEST_CASE("per-layer SV sends: the same parameters bit for bit, and equal to dense training", "[engine][overlap]") {
  engine::TrainConfig config;
  config.batch = 12;
  config.lr = 0.2;
  config.overlap = false;
  const Run off = train(config, 3, 20);
  config.overlap = true;
  const Run on = train(config, 3, 20);
  const ParamSet init = mlp()->initParams(config.seed);
  CHECK(relativeDifference(on.replicas[0], init) > 0.01);
  for (int r = 0; r < 3; ++r) CHECK(bitwiseEqual(on.replicas[static_cast<size_t>(r)], off.replicas[0]));
  // SV == dense (BSP, broadcast, no selection) still holds with the sends overlapped.
  config.sync = engine::SyncMode::kDense;
  const Run dense = train(config, 3, 20);
  const double diff = relativeDifference(on.replicas[0], dense.replicas[0]);
  INFO("relative difference " << diff);
  CHECK(diff <= 1e-5);
}

TEST_CASE("per-layer SV sends: the top layer leaves before the backward pass ends", "[engine][overlap]") {
  engine::TrainConfig config;
  config.batch = 12;
  config.overlap = true;
  const Run on = train(config, 2, 3);
  for (const auto& clocks : on.stats) {
    for (const engine::ClockStats& s : clocks) {
      REQUIRE(s.firstSendAt >= 0.0);
      CHECK(s.firstSendAt < s.backwardEndAt);
      CHECK(s.exchangeSeconds >= 0.0);
    }
  }
  config.overlap = false;
  const Run off = train(config, 2, 1);
  CHECK(off.stats[0][0].firstSendAt < 0.0);  // not measured without overlap
}

TEST_CASE("selection with overlap: the same parameters bit for bit", "[engine][overlap]") {
  engine::TrainConfig config;
  config.batch = 12;
  config.select = 5;
  config.lr = 0.2;
  config.overlap = false;
  const Run off = train(config, 3, 8);
  config.overlap = true;
  const Run on = train(config, 3, 8);
  for (int r = 0; r < 3; ++r) CHECK(bitwiseEqual(on.replicas[static_cast<size_t>(r)], off.replicas[static_cast<size_t>(r)]));
}

TEST_CASE("dense all-reduce overlapped in buckets equals the plain one bit for bit", "[engine][overlap]") {
  engine::TrainConfig config;
  config.batch = 12;
  config.lr = 0.2;
  config.sync = engine::SyncMode::kDense;
  config.overlap = false;
  const Run off = train(config, 3, 20);
  config.overlap = true;
  const Run on = train(config, 3, 20);
  for (int r = 0; r < 3; ++r) CHECK(bitwiseEqual(on.replicas[static_cast<size_t>(r)], off.replicas[static_cast<size_t>(r)]));
  for (const engine::ClockStats& s : on.stats[0]) CHECK(s.firstSendAt < s.backwardEndAt);
}
