// Backend::optimizerStep: the CPU backend takes the engine's steps (Optimizer::step)
// bit for bit, the strict device the CPU backend's, for every first-order optimizer,
// with and without weight decay, over consecutive steps that carry the state.
#include "backend_harness.h"

#include "engine/base/error.h"
#include "engine/worker/optimizer.h"
#include "ops/strict/strict_backend.h"

#include <catch2/catch.hpp>

#include <cstring>

using namespace orpheus;
using namespace orpheus::ops;
using namespace orpheus::ops::test;

namespace {

constexpr int kSteps = 3;

const std::vector<engine::OptimizerKind>& kinds() {
  static const std::vector<engine::OptimizerKind> k{engine::OptimizerKind::kSgd, engine::OptimizerKind::kMomentum,
                                                    engine::OptimizerKind::kNesterov, engine::OptimizerKind::kAdagrad,
                                                    engine::OptimizerKind::kAdam};
  return k;
}

const std::vector<OptimizerStep::Kind>& stepKinds() {
  static const std::vector<OptimizerStep::Kind> k{OptimizerStep::Kind::kSgd, OptimizerStep::Kind::kMomentum,
                                                  OptimizerStep::Kind::kNesterov, OptimizerStep::Kind::kAdagrad,
                                                  OptimizerStep::Kind::kAdam};
  return k;
}

const std::vector<std::pair<int64_t, int64_t>>& optimizerShapes() {
  static const std::vector<std::pair<int64_t, int64_t>> s{{1, 1}, {7, 1}, {1, 9}, {13, 5}, {300, 77}};
  return s;
}

// A schedule whose learning rate changes every clock (warmup, then cosine).
engine::OptimizerSettings settingsFor(engine::OptimizerKind kind, double weightDecay) {
  engine::OptimizerSettings s;
  s.kind = kind;
  s.lr = engine::defaultLearningRate(kind);
  s.weightDecay = weightDecay;
  s.schedule = engine::LrScheduleKind::kCosine;
  s.warmup = 1;
  s.clocks = 6;
  return s;
}

}  // namespace

TEST_CASE("cpu optimizerStep takes the engine's optimizer steps bitwise", "[backend][optimizer]") {
  cpu::CpuBackend cpu;
  std::mt19937 rng(31);
  for (const engine::OptimizerKind kind : kinds()) {
    for (const double wd : {0.0, 0.01}) {
      const engine::OptimizerSettings settings = settingsFor(kind, wd);
      ParamSet params;
      for (const auto& [rows, cols] : optimizerShapes()) {
        params.params.push_back({fmt::format("p{}x{}", rows, cols), randomMatrix(rng, rows, cols)});
      }
      const size_t count = params.size();
      // The backend's side: each matrix with its buffers, stepped on its own.
      std::vector<OptimizerState> states;
      for (const Param& p : params.params) states.push_back({p.value, MatF(), MatF()});
      engine::Optimizer optimizer(settings, params);
      for (uint64_t clock = 1; clock <= kSteps; ++clock) {
        ParamSet gradient = params;
        for (Param& g : gradient.params) g.value = randomMatrix(rng, g.value.rows(), g.value.cols());
        optimizer.step(clock, gradient, params);
        const OptimizerStep step = engine::stepSettings(settings, clock, optimizer.steps());
        for (size_t i = 0; i < count; ++i) states[i] = runOptimizerSteps(cpu, {step}, {gradient[i]}, states[i]);
        const std::vector<Matrix*> buffers = optimizer.buffers();
        REQUIRE(buffers.size() == count * static_cast<size_t>(optimizerBuffers(step.kind)));
        for (size_t i = 0; i < count; ++i) {
          INFO("kind " << static_cast<int>(kind) << " wd " << wd << " clock " << clock << " " << params.params[i].name);
          CHECK(same(states[i].param, params[i]));
          if (buffers.size() >= count) CHECK(same(states[i].buffer0, *buffers[i]));
          if (buffers.size() >= 2 * count) CHECK(same(states[i].buffer1, *buffers[count + i]));
        }
      }
    }
  }
}

TEST_CASE("strict optimizerStep equals the cpu backend's bitwise", "[backend][optimizer]") {
  cpu::CpuBackend cpu;
  const auto strict = strict::makeStrictBackend();
  std::mt19937 rng(32);
  for (const OptimizerStep::Kind kind : stepKinds()) {
    for (const float wd : {0.0f, 0.01f}) {
      std::vector<OptimizerStep> steps;
      for (int t = 1; t <= kSteps; ++t) steps.push_back(optimizerSettings(kind, wd, t));
      for (const auto& [rows, cols] : optimizerShapes()) {
        std::vector<MatF> gradients;
        for (int t = 0; t < kSteps; ++t) gradients.push_back(randomMatrix(rng, rows, cols));
        const OptimizerState start{randomMatrix(rng, rows, cols), MatF(), MatF()};
        const OptimizerState want = runOptimizerSteps(cpu, steps, gradients, start);
        const OptimizerState got = runOptimizerSteps(*strict, steps, gradients, start);
        INFO("kind " << static_cast<int>(kind) << " wd " << wd << " " << rows << "x" << cols);
        CHECK(same(got.param, want.param));
        CHECK(same(got.buffer0, want.buffer0));
        CHECK(same(got.buffer1, want.buffer1));
        CHECK(!same(got.param, start.param));
      }
    }
  }
}

TEST_CASE("cpu optimizerStep on views inside an allocation gives the same bits", "[backend][optimizer]") {
  cpu::CpuBackend cpu;
  std::mt19937 rng(33);
  for (const OptimizerStep::Kind kind : stepKinds()) {
    const OptimizerStep step = optimizerSettings(kind, 0.01f, 2);
    const MatF g = randomMatrix(rng, 13, 5);
    // Parameters at zero, so that every bit of the step shows in them.
    OptimizerState start{MatF::Zero(13, 5), randomMatrix(rng, 13, 5).cwiseAbs(), randomMatrix(rng, 13, 5).cwiseAbs()};
    if (optimizerBuffers(kind) < 2) start.buffer1 = MatF();
    if (optimizerBuffers(kind) < 1) start.buffer0 = MatF();
    const OptimizerState want = runOptimizerSteps(cpu, {step}, {g}, start);
    // Column 1 on of a 13 x 6 allocation: 52 bytes in, not on a packet boundary.
    MatF w(13, 6), b0(13, 6), b1(13, 6);
    w.rightCols(5) = start.param;
    if (start.buffer0.size() > 0) b0.rightCols(5) = start.buffer0;
    if (start.buffer1.size() > 0) b1.rightCols(5) = start.buffer1;
    Tensor tw = cpu::view(w).middleCols(1, 5), tb0 = cpu::view(b0).middleCols(1, 5), tb1 = cpu::view(b1).middleCols(1, 5);
    cpu.optimizerStep(step, cpu::view(g), tw, &tb0, &tb1);
    INFO("kind " << static_cast<int>(kind));
    CHECK(same(MatF(w.rightCols(5)), want.param));
    if (want.buffer0.size() > 0) CHECK(same(MatF(b0.rightCols(5)), want.buffer0));
    if (want.buffer1.size() > 0) CHECK(same(MatF(b1.rightCols(5)), want.buffer1));
  }
}

TEST_CASE("optimizerStep refuses missing buffers, mismatched shapes and other devices' memory",
          "[backend][optimizer]") {
  cpu::CpuBackend cpu;
  const auto strict = strict::makeStrictBackend();
  MatF w = MatF::Ones(3, 2), g = MatF::Ones(3, 2), b = MatF::Zero(3, 2), wrong = MatF::Zero(2, 3);
  Tensor tw = cpu::view(w), tb = cpu::view(b), twrong = cpu::view(wrong);
  const Tensor tg = cpu::view(g);
  const OptimizerStep momentum = optimizerSettings(OptimizerStep::Kind::kMomentum, 0.0f, 1);
  const OptimizerStep adam = optimizerSettings(OptimizerStep::Kind::kAdam, 0.0f, 1);
  CHECK_THROWS_AS(cpu.optimizerStep(momentum, tg, tw, nullptr, nullptr), Error);
  CHECK_THROWS_AS(cpu.optimizerStep(adam, tg, tw, &tb, nullptr), Error);
  CHECK_THROWS_AS(cpu.optimizerStep(momentum, tg, tw, &twrong, nullptr), Error);
  CHECK_THROWS_AS(cpu.optimizerStep(momentum, tg, twrong, &tb, nullptr), Error);
  CHECK_THROWS_AS(strict->optimizerStep(momentum, tg, tw, &tb, nullptr), Error);
  Tensor sw = upload(*strict, w);
  CHECK_THROWS_AS(strict->optimizerStep(momentum, upload(*strict, g), sw, &tb, nullptr), Error);
  CHECK(same(w, MatF::Ones(3, 2)));
  // Buffers a kind does not use are ignored.
  const OptimizerStep sgd = optimizerSettings(OptimizerStep::Kind::kSgd, 0.0f, 1);
  strict->optimizerStep(sgd, upload(*strict, g), sw, &tb, &twrong);
  CHECK(same(download(*strict, sw), MatF::Constant(3, 2, 1.0f - 0.1f * 1.0f)));
}
