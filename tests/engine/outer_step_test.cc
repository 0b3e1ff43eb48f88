// DiLoCo's outer step at the averaging barrier (engine/coordinator/outer_step.h):
// the arithmetic against a hand computation, and the coordinator's barrier over
// the loopback transport leaving every rank the same W.
#include "comm/loopback/loopback_transport.h"
#include "engine/coordinator/coordinator.h"
#include "engine/coordinator/outer_step.h"
#include "tests/support/bitwise.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace orpheus;
using orpheus::testing::bitwiseEqual;

namespace {

// One 1 x n parameter holding `values`.
ParamSet row(const std::vector<float>& values) {
  ParamSet set;
  set.params.push_back({"w", Matrix(1, static_cast<Eigen::Index>(values.size()))});
  for (size_t k = 0; k < values.size(); ++k) set[0](0, static_cast<Eigen::Index>(k)) = values[k];
  return set;
}

std::vector<float> valuesOf(const ParamSet& set) { return {set[0].data(), set[0].data() + set[0].size()}; }

}  // namespace

TEST_CASE("the outer step follows the hand computation over three barriers", "[coordinator][outer]") {
  // L = M = 0.5 and dyadic values: every product and sum is exact in float, so the
  // hand computation is the bits, however the compiler contracts.
  engine::OuterStep outer({0.5, 0.5});
  REQUIRE(outer.active());
  outer.start(row({1.0f, -2.0f}));
  CHECK(valuesOf(outer.momentum()) == std::vector<float>{0.0f, 0.0f});

  // delta = (2, 1), m = (2, 1), W = a + L (delta + M m) = (1 + 0.5*3, -2 + 0.5*1.5).
  ParamSet w = row({3.0f, -1.0f});
  outer.apply(w);
  CHECK(valuesOf(w) == std::vector<float>{2.5f, -1.25f});
  CHECK(valuesOf(outer.anchor()) == std::vector<float>{2.5f, -1.25f});
  CHECK(valuesOf(outer.momentum()) == std::vector<float>{2.0f, 1.0f});

  // delta = (0, 2), m = 0.5 (2, 1) + (0, 2) = (1, 2.5), W = (2.5 + 0.5*0.5, -1.25 + 0.5*3.25).
  w = row({2.5f, 0.75f});
  outer.apply(w);
  CHECK(valuesOf(w) == std::vector<float>{2.75f, 0.375f});
  CHECK(valuesOf(outer.anchor()) == std::vector<float>{2.75f, 0.375f});
  CHECK(valuesOf(outer.momentum()) == std::vector<float>{1.0f, 2.5f});

  // delta = (-1, 0), m = (-0.5, 1.25), W = (2.75 + 0.5*(-1.25), 0.375 + 0.5*0.625).
  w = row({1.75f, 0.375f});
  outer.apply(w);
  CHECK(valuesOf(w) == std::vector<float>{2.125f, 0.6875f});
  CHECK(valuesOf(outer.anchor()) == std::vector<float>{2.125f, 0.6875f});
  CHECK(valuesOf(outer.momentum()) == std::vector<float>{-0.5f, 1.25f});
}

TEST_CASE("the outer step is torch's Nesterov SGD on the outer gradient anchor - mean", "[coordinator][outer]") {
  // scripts/bench/peers.py's DiLoCo: g = outer - mean, buf = mu buf + g (g at first),
  // outer -= lr (g + mu buf); here in double, against the engine's float.
  const double lr = 0.7, mu = 0.9;
  engine::OuterStep outer({lr, mu});
  double anchor = 0.3, buf = 0.0;
  outer.start(row({0.3f}));
  for (float mean : {0.5f, 0.45f, 0.2f, 0.9f}) {
    const double g = anchor - mean;
    buf = mu * buf + g;
    anchor -= lr * (g + mu * buf);
    ParamSet w = row({mean});
    outer.apply(w);
    CHECK(w[0](0, 0) == Approx(anchor).epsilon(1e-5));
  }
}

TEST_CASE("without --outer-lr, or at L = 1 without momentum, the mean is left as it is", "[coordinator][outer]") {
  for (const engine::OuterStepOptions options :
       {engine::OuterStepOptions{}, engine::OuterStepOptions{1.0, 0.0}}) {
    engine::OuterStep outer(options);
    CHECK_FALSE(outer.active());
    outer.start(row({1.0f, 2.0f}));
    ParamSet w = row({0.1f, 0.7f});
    outer.apply(w);
    CHECK(bitwiseEqual(w, row({0.1f, 0.7f})));
  }
  CHECK(engine::OuterStepOptions{1.0, 0.5}.active());
}

TEST_CASE("the coordinator's barrier leaves every rank the outer step's W (loopback, 4 ranks)",
          "[coordinator][outer]") {
  const int ranks = 4;
  auto hub = std::make_shared<comm::loopback::LoopbackHub>(ranks);
  std::vector<ParamSet> first(ranks), second(ranks);
  std::vector<std::string> failures(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::loopback::LoopbackTransport t(hub, r);
        engine::adapt::Knobs knobs;
        knobs.averageEvery = 1;
        engine::CoordinatorOptions options;
        options.outer = {0.5, 0.5};
        engine::Coordinator coordinator(options, t, knobs);
        coordinator.startFrom(row({1.0f, 1.0f}));
        engine::Optimizer sgd(engine::OptimizerSettings{}, row({0.0f, 0.0f}));
        // Replicas 1..4: mean 2.5, delta 1.5, m 1.5, W = 1 + 0.5 (1.5 + 0.75) = 2.125.
        ParamSet replica = row({static_cast<float>(r + 1), static_cast<float>(r + 1)});
        if (!coordinator.averagesAfter(1)) throw std::runtime_error("no averaging after clock 1");
        coordinator.average(replica, sgd, 1);
        first[static_cast<size_t>(r)] = replica;
        // W + 0..3: mean W + 1.5, delta 1.5, m 0.75 + 1.5, W = 2.125 + 0.5 (1.5 + 1.125) = 3.4375.
        for (float& v : replica[0].reshaped()) v += static_cast<float>(r);
        coordinator.average(replica, sgd, 2);
        second[static_cast<size_t>(r)] = replica;
      } catch (const std::exception& e) {
        failures[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r << ": " << failures[static_cast<size_t>(r)]);
    CHECK(failures[static_cast<size_t>(r)].empty());
    CHECK(valuesOf(first[static_cast<size_t>(r)]) == std::vector<float>{2.125f, 2.125f});
    CHECK(valuesOf(second[static_cast<size_t>(r)]) == std::vector<float>{3.4375f, 3.4375f});
  }
}
