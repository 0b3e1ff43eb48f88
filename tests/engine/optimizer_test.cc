// Optimizers on rebuilt updates (engine/worker/optimizer.h): iterates against a float64
// reference of the same formulas, schedules, state import/export, SV == dense for
// every optimizer, and the state travelling with its replica (rotation, averaging).
#include "comm/loopback/loopback_transport.h"
#include "ops/backends.h"
#include "ops/cpu/cpu_backend.h"
#include "engine/config.h"
#include "engine/data/sampler.h"
#include "engine/recovery/job_record.h"
#include "engine/worker/optimizer.h"
#include "engine/data/synthetic_data.h"
#include "engine/worker/worker.h"
#include "ops/mlr.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <numbers>
#include <random>
#include <thread>

using namespace orpheus;
using engine::LrScheduleKind;
using engine::OptimizerKind;
using engine::OptimizerSettings;

namespace {

using MatrixD = Eigen::MatrixXd;

// The schedule, written out independently of learningRate().
double referenceLr(const OptimizerSettings& s, uint64_t c) {
  double lr = s.lr;
  if (s.schedule == LrScheduleKind::kStep) lr *= std::pow(s.gamma, static_cast<double>((c - 1) / s.stepEvery));
  if (s.schedule == LrScheduleKind::kCosine && c > static_cast<uint64_t>(s.warmup)) {
    const double t = static_cast<double>(c - 1 - s.warmup), span = static_cast<double>(s.clocks - s.warmup);
    lr *= 0.5 * (1.0 + std::cos(std::numbers::pi * t / span));
  }
  if (s.warmup > 0 && c <= static_cast<uint64_t>(s.warmup)) lr *= static_cast<double>(c) / static_cast<double>(s.warmup);
  return lr;
}

// torch.optim's formulas in float64, one parameter matrix.
struct Reference {
  OptimizerSettings s;
  MatrixD w, a, b;  // a: momentum buffer, adagrad sum or adam m; b: adam v
  int t = 0;

  void step(uint64_t clock, const MatrixD& g) {
    ++t;
    const double lr = referenceLr(s, clock);
    const MatrixD d = g + s.weightDecay * w;
    switch (s.kind) {
      case OptimizerKind::kSgd:
        w -= lr * d;
        break;
      case OptimizerKind::kMomentum:
        a = s.momentum * a + d;
        w -= lr * a;
        break;
      case OptimizerKind::kNesterov:
        a = s.momentum * a + d;
        w -= lr * (d + s.momentum * a);
        break;
      case OptimizerKind::kAdagrad:
        a += d.cwiseProduct(d);
        w -= lr * d.cwiseQuotient((a.array().sqrt() + s.eps).matrix());
        break;
      case OptimizerKind::kAdam: {
        a = s.beta1 * a + (1 - s.beta1) * d;
        b = s.beta2 * b + (1 - s.beta2) * d.cwiseProduct(d);
        const double bc1 = 1 - std::pow(s.beta1, t), bc2 = 1 - std::pow(s.beta2, t);
        const MatrixD denom = ((b.array().sqrt() / std::sqrt(bc2)) + s.eps).matrix();
        w -= (lr / bc1) * a.cwiseQuotient(denom);
        break;
      }
      case OptimizerKind::kBfgs:
      case OptimizerKind::kDfp:
        break;  // quasi_newton_optimizer_test.cc
    }
  }
};

double relative(const Matrix& got, const MatrixD& want) {
  return (got.cast<double>() - want).norm() / want.norm();
}

// The relative difference of `steps` optimizer steps from the float64 reference,
// on a 6x5 matrix from a fixed start with fixed gradients.
double iterateError(const OptimizerSettings& s, int steps) {
  std::mt19937 gen(7);
  std::normal_distribution<double> normal;
  MatrixD w0(6, 5);
  for (Eigen::Index i = 0; i < w0.size(); ++i) w0(i) = normal(gen);
  // Start and gradients exactly representable in float, so both see the same inputs.
  w0 = w0.cast<float>().cast<double>();
  ParamSet params;
  params.params.push_back({"W", w0.cast<float>()});
  engine::Optimizer opt(s, params);
  Reference ref{s, w0, MatrixD::Zero(6, 5), MatrixD::Zero(6, 5)};
  for (int c = 1; c <= steps; ++c) {
    MatrixD g(6, 5);
    for (Eigen::Index i = 0; i < g.size(); ++i) g(i) = normal(gen);
    g = g.cast<float>().cast<double>();
    ParamSet grad;
    grad.params.push_back({"W", g.cast<float>()});
    opt.step(static_cast<uint64_t>(c), grad, params);
    ref.step(static_cast<uint64_t>(c), g);
  }
  CHECK(opt.steps() == steps);
  return relative(params[0], ref.w);
}

const std::vector<OptimizerKind> kAllKinds = {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kNesterov,
                                              OptimizerKind::kAdagrad, OptimizerKind::kAdam};

}  // namespace

TEST_CASE("learning-rate schedules are pure functions of the clock", "[optimizer]") {
  OptimizerSettings s;
  s.lr = 0.4;
  CHECK(engine::learningRate(s, 1) == 0.4);
  CHECK(engine::learningRate(s, 1000) == 0.4);
  s.schedule = LrScheduleKind::kStep;
  s.stepEvery = 5;
  s.gamma = 0.5;
  CHECK(engine::learningRate(s, 5) == Approx(0.4));
  CHECK(engine::learningRate(s, 6) == Approx(0.2));
  CHECK(engine::learningRate(s, 11) == Approx(0.1));
  s.schedule = LrScheduleKind::kCosine;
  s.warmup = 4;
  s.clocks = 20;
  CHECK(engine::learningRate(s, 1) == Approx(0.1));  // warmup: lr * 1/4
  CHECK(engine::learningRate(s, 4) == Approx(0.4));
  CHECK(engine::learningRate(s, 5) == Approx(0.4));  // the cosine starts at lr
  CHECK(engine::learningRate(s, 20) == Approx(0.4 * 0.5 * (1 + std::cos(std::numbers::pi * 15 / 16))));
  CHECK(engine::learningRate(s, 20) < 0.01);
  for (uint64_t c = 1; c <= 20; ++c) CHECK(engine::learningRate(s, c) == Approx(referenceLr(s, c)).epsilon(1e-12));
}

TEST_CASE("every optimizer's iterates match a float64 reference of PyTorch's formulas", "[optimizer]") {
  for (const OptimizerKind kind : kAllKinds) {
    for (const double wd : {0.0, 0.05}) {
      for (const LrScheduleKind schedule : {LrScheduleKind::kConstant, LrScheduleKind::kStep, LrScheduleKind::kCosine}) {
        OptimizerSettings s;
        s.kind = kind;
        s.lr = kind == OptimizerKind::kAdam ? 0.01 : 0.05;
        s.eps = kind == OptimizerKind::kAdagrad ? 1e-10 : 1e-8;
        s.weightDecay = wd;
        s.schedule = schedule;
        s.warmup = schedule == LrScheduleKind::kCosine ? 3 : 0;
        s.stepEvery = 6;
        s.gamma = 0.5;
        s.clocks = 20;
        const double err = iterateError(s, 20);
        INFO(engine::toString(kind) << " wd " << wd << " " << engine::toString(schedule) << ": relative error "
                                    << err);
        CHECK(err <= 1e-6);
      }
    }
  }
}

TEST_CASE("optimizer state exports into its own group and imports back", "[optimizer]") {
  ParamSet shapes;
  shapes.params.push_back({"W", Matrix::Zero(3, 2)});
  shapes.params.push_back({"b", Matrix::Zero(3, 1)});
  OptimizerSettings s;
  s.kind = OptimizerKind::kAdam;
  engine::Optimizer opt(s, shapes);
  ParamSet params = shapes;
  ParamSet grad = shapes;
  grad[0].setConstant(1.0f);
  grad[1].setConstant(-2.0f);
  opt.step(1, grad, params);
  opt.step(2, grad, params);
  const ParamSet state = opt.exportState();
  REQUIRE(state.size() == 5);
  CHECK(state.find("optimizer/W/m") >= 0);
  CHECK(state.find("optimizer/b/v") >= 0);
  CHECK(state[static_cast<size_t>(state.find("optimizer/steps"))](0, 0) == 2.0f);
  engine::Optimizer back(s, shapes);
  back.importState(state);
  CHECK(back.steps() == 2);
  ParamSet p1 = params, p2 = params;
  opt.step(3, grad, p1);
  back.step(3, grad, p2);
  CHECK(p1[0] == p2[0]);
  CHECK(p1[1] == p2[1]);
  // sgd has no state.
  CHECK(engine::Optimizer(OptimizerSettings{}, shapes).exportState().size() == 0);
  ParamSet missing = state;
  missing.params.erase(missing.params.begin());
  CHECK_THROWS_AS(back.importState(missing), InputError);
  // A step count that is no count (negative, fractional, past what a float holds) is refused, named.
  for (const float bad : {-1.0f, 2.5f, 1e30f}) {
    ParamSet odd = state;
    odd[static_cast<size_t>(odd.find("optimizer/steps"))](0, 0) = bad;
    CHECK_THROWS_WITH(back.importState(odd), Catch::Contains("optimizer state 'optimizer/steps' is") &&
                                                 Catch::Contains("not a count"));
  }
}

TEST_CASE("optimizer flags: defaults per optimizer, and combinations that do nothing are refused", "[optimizer]") {
  engine::TrainConfig c;
  CHECK(engine::optimizerSettings(c).lr == 0.1);
  c.optimizer = OptimizerKind::kAdam;
  CHECK(engine::optimizerSettings(c).lr == 1e-3);
  CHECK(engine::optimizerSettings(c).eps == 1e-8);
  c.lr = 0.5;
  CHECK(engine::optimizerSettings(c).lr == 0.5);  // the user's --lr wins
  CHECK_NOTHROW(engine::validate(c, 2));
  const auto refused = [](const std::function<void(engine::TrainConfig&)>& change, const std::string& flag) {
    engine::TrainConfig d;
    change(d);
    try {
      engine::validate(d, 2);
      FAIL("accepted: " << flag);
    } catch (const InputError& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(flag) != std::string::npos);
    }
  };
  refused([](engine::TrainConfig& d) { d.momentum = 0.5; }, "--momentum");
  refused([](engine::TrainConfig& d) { d.beta1 = 0.5; }, "--beta1");
  refused([](engine::TrainConfig& d) {
    d.optimizer = OptimizerKind::kAdam;
    d.beta1 = 1.0;
  }, "--beta1 1 must be in [0, 1)");
  refused([](engine::TrainConfig& d) {
    d.optimizer = OptimizerKind::kAdam;
    d.beta2 = 1.0;
  }, "--beta2");
  // The optimizers step in float: 1 - 1e-8 is 1 there.
  refused([](engine::TrainConfig& d) {
    d.optimizer = OptimizerKind::kAdam;
    d.beta2 = 0.99999999;
  }, "--beta2 0.99999999 must be in [0, 1) (it rounds to 1 in float)");
  refused([](engine::TrainConfig& d) {
    d.optimizer = OptimizerKind::kMomentum;
    d.momentum = 0.99999999999;
  }, "(it rounds to 1 in float)");
  {
    engine::TrainConfig d;
    d.optimizer = OptimizerKind::kAdam;
    d.beta2 = 0.99999997;  // below 1 in float
    CHECK_NOTHROW(engine::validate(d, 2));
  }
  refused([](engine::TrainConfig& d) { d.eps = 1e-6; }, "--eps");
  refused([](engine::TrainConfig& d) {
    d.optimizer = OptimizerKind::kNesterov;
    d.momentum = 0.0;
  }, "nesterov");
  refused([](engine::TrainConfig& d) { d.lrSchedule = LrScheduleKind::kStep; }, "--lr-step-every");
  refused([](engine::TrainConfig& d) { d.lrGamma = 0.5; }, "--lr-gamma");
  refused([](engine::TrainConfig& d) {
    d.lrSchedule = LrScheduleKind::kCosine;
    d.warmup = d.clocks;
  }, "--warmup");
  // Whatever the schedule: a warmup as long as the job never reaches --lr.
  refused([](engine::TrainConfig& d) { d.warmup = 2000000000; }, "--warmup");
  refused([](engine::TrainConfig& d) {
    d.lrSchedule = LrScheduleKind::kStep;
    d.lrStepEvery = 10;
    d.warmup = d.clocks;
  }, "--warmup");
}

namespace {

constexpr int64_t kFeatures = 30;
constexpr int64_t kClasses = 4;

struct RankResult {
  ParamSet replica;
  ParamSet state;
};

// `clocks` clocks of `config` on `ranks` threads over loopback; every rank's replica and state.
std::vector<RankResult> train(const engine::TrainConfig& config, int ranks, int64_t clocks) {
  auto hub = std::make_shared<comm::loopback::LoopbackHub>(ranks);
  std::vector<RankResult> out(static_cast<size_t>(ranks));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::loopback::LoopbackTransport t(hub, r);
        const data::Dataset shard = engine::makeSyntheticShard(
            fmt::format("synthetic:examples=1000,features={},classes={}", kFeatures, kClasses), config.seed, r, ranks);
        ops::MultinomialLogisticRegression model(kFeatures, kClasses);
        const auto backend = ops::makeBackend(config.device);
        engine::Worker worker(config, model, *backend, t, shard, nullptr);
        data::MinibatchSampler sampler(shard.size(), config.batch, config.seed, r);
        for (int64_t c = 1; c <= clocks; ++c) {
          worker.runClock(static_cast<uint64_t>(c), data::gather(shard, sampler.next()));
          worker.coordinate(static_cast<uint64_t>(c));
        }
        worker.drain(static_cast<uint64_t>(clocks));
        out[static_cast<size_t>(r)] = {worker.replica(), worker.optimizer().exportState()};
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

bool bitwiseEqual(const ParamSet& a, const ParamSet& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a.params[i].name != b.params[i].name || a[i] != b[i]) return false;
  return true;
}

}  // namespace

TEST_CASE("SV training equals dense training for every optimizer (loopback, 3 ranks, 30 clocks)", "[optimizer]") {
  for (const OptimizerKind kind : kAllKinds) {
    engine::TrainConfig config;
    config.batch = 12;
    config.optimizer = kind;
    config.weightDecay = kind == OptimizerKind::kMomentum ? 1e-3 : 0.0;
    config.lrSchedule = LrScheduleKind::kCosine;
    config.warmup = 5;
    config.clocks = 30;
    config.sync = engine::SyncMode::kSv;
    const auto sv = train(config, 3, 30);
    config.sync = engine::SyncMode::kDense;
    const auto dense = train(config, 3, 30);
    const ParamSet init = ops::MultinomialLogisticRegression(kFeatures, kClasses).initParams(config.seed);
    const double moved = relativeDifference(sv[0].replica, init);
    const double diff = relativeDifference(sv[0].replica, dense[0].replica);
    INFO(engine::toString(kind) << ": moved " << moved << ", SV vs dense " << diff);
    CHECK(moved > 0.01);
    // Adam divides by sqrt(v): where v is tiny, rounding differences in the
    // gradient are amplified, hence a looser bound than the 1e-5 of the others.
    CHECK(diff <= (kind == OptimizerKind::kAdam ? 1e-4 : 1e-5));
    for (size_t r = 1; r < sv.size(); ++r) CHECK(bitwiseEqual(sv[0].replica, sv[r].replica));
  }
}

TEST_CASE("optimizer state travels with its replica: rotation moves it, averaging averages it", "[optimizer]") {
  const int ranks = 3;
  auto hub = std::make_shared<comm::loopback::LoopbackHub>(ranks);
  std::vector<ParamSet> beforeRotation(ranks), afterRotation(ranks), beforeAverage(ranks), afterAverage(ranks);
  std::vector<int64_t> stepsAfterRotation(ranks);
  std::vector<std::exception_ptr> errors(ranks);
  std::vector<std::thread> threads;
  engine::TrainConfig config;
  config.batch = 10;
  config.optimizer = OptimizerKind::kAdam;
  config.multicast = comm::MulticastKind::kRandom;  // replicas differ: a rotation shows
  config.fanout = 1;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::loopback::LoopbackTransport t(hub, r);
        const data::Dataset shard = engine::makeSyntheticShard(
            fmt::format("synthetic:examples=600,features={},classes={}", kFeatures, kClasses), config.seed, r, ranks);
        ops::MultinomialLogisticRegression model(kFeatures, kClasses);
        const auto backend = ops::makeBackend(config.device);
        engine::Worker worker(config, model, *backend, t, shard, nullptr);
        data::MinibatchSampler sampler(shard.size(), config.batch, config.seed, r);
        // Each rank hears one peer per clock: the replicas and their states differ.
        for (uint64_t c = 1; c <= 4; ++c) worker.runClock(c, data::gather(shard, sampler.next()));
        worker.drain(4);
        beforeRotation[r] = worker.optimizer().exportState();
        worker.rotateReplica(4);
        afterRotation[r] = worker.optimizer().exportState();
        stepsAfterRotation[r] = worker.optimizer().steps();
        beforeAverage[r] = afterRotation[r];
        worker.averageReplicas(4);
        afterAverage[r] = worker.optimizer().exportState();
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  REQUIRE(beforeRotation[0].size() == 5);  // W/m, b/m, W/v, b/v, steps
  CHECK_FALSE(bitwiseEqual(beforeRotation[0], beforeRotation[1]));
  for (int r = 0; r < ranks; ++r) {
    // The state rank r-1 held is here now, with its step count.
    CHECK(bitwiseEqual(afterRotation[r], beforeRotation[(r + ranks - 1) % ranks]));
    CHECK(stepsAfterRotation[r] == 4);
    // Averaged elementwise, the same on every rank.
    CHECK(bitwiseEqual(afterAverage[r], afterAverage[0]));
  }
  for (size_t i = 0; i + 1 < afterAverage[0].size(); ++i) {
    Matrix mean = Matrix::Zero(afterAverage[0][i].rows(), afterAverage[0][i].cols());
    for (int r = 0; r < ranks; ++r) mean += beforeAverage[r][i];
    mean /= static_cast<float>(ranks);
    CHECK((afterAverage[0][i] - mean).norm() <= 1e-6 * (mean.norm() + 1e-30));
  }
  CHECK(afterAverage[0].params.back().value(0, 0) == 4.0f);
}

TEST_CASE("adagrad on touched columns only is bitwise a whole step where the gradient is zero elsewhere",
          "[optimizer]") {
  OptimizerSettings s;
  s.kind = OptimizerKind::kAdagrad;
  s.eps = 1e-10;
  REQUIRE(s.stepsTouchedColumns());
  ParamSet params;
  params.params.push_back({"W", Matrix::Random(4, 9)});
  params.params.push_back({"b", Matrix::Random(4, 1)});
  ParamSet sparseParams = params;
  engine::Optimizer whole(s, params), touched(s, params);
  for (uint64_t c = 1; c <= 5; ++c) {
    ParamSet grad = params;
    grad[0].setZero();
    const std::vector<int64_t> cols = {static_cast<int64_t>(c % 9), 7};
    for (int64_t j : cols) grad[0].col(j).setRandom();
    grad[1].setRandom();
    std::vector<engine::Optimizer::Columns> which = {{false, cols}, {true, {}}};
    whole.step(c, grad, params);
    touched.step(c, grad, sparseParams, &which);
    CHECK(params[0] == sparseParams[0]);
    CHECK(params[1] == sparseParams[1]);
  }
  CHECK(relativeDifference(params, sparseParams) == 0.0);
  // Momentum has no such step.
  OptimizerSettings m;
  m.kind = OptimizerKind::kMomentum;
  CHECK_FALSE(m.stepsTouchedColumns());
  CHECK(m.touchesEveryEntry());
  s.weightDecay = 0.1;  // decay reaches every entry
  CHECK(s.touchesEveryEntry());
}

TEST_CASE("the job record keeps the optimizer: replay reads it back, --resume refuses a change", "[optimizer]") {
  engine::TrainConfig c;
  c.optimizer = OptimizerKind::kAdam;
  c.beta2 = 0.99;
  c.weightDecay = 1e-4;
  c.lrSchedule = LrScheduleKind::kCosine;
  c.warmup = 10;
  c.clocks = 500;
  const engine::ComputationRecord record = engine::computationRecord(c, 2, 784, 10, "", "1:2");
  const OptimizerSettings back = engine::recordedOptimizer(engine::decodeRecord(engine::encodeRecord(record), "job.h5"));
  const OptimizerSettings want = engine::optimizerSettings(c);
  CHECK(back.kind == want.kind);
  CHECK(back.lr == want.lr);
  CHECK(back.beta1 == want.beta1);
  CHECK(back.beta2 == want.beta2);
  CHECK(back.eps == want.eps);
  CHECK(back.weightDecay == want.weightDecay);
  CHECK(back.schedule == want.schedule);
  CHECK(back.warmup == want.warmup);
  CHECK(back.clocks == 500);
  // A record written before optimizers were recorded: sgd.
  CHECK(engine::recordedOptimizer({{"--lr", "0.25"}}).kind == OptimizerKind::kSgd);
  CHECK(engine::recordedOptimizer({{"--lr", "0.25"}}).lr == 0.25);
  const auto refused = [&](const std::function<void(engine::TrainConfig&)>& change, const std::string& flag) {
    engine::TrainConfig d = c;
    change(d);
    CHECK_THROWS_WITH(engine::checkResume(record, engine::computationRecord(d, 2, 784, 10, "", "1:2"), "ck"),
                      Catch::Contains(flag + " differs"));
  };
  refused([](engine::TrainConfig& d) { d.optimizer = OptimizerKind::kAdagrad; }, "--optimizer");
  refused([](engine::TrainConfig& d) { d.beta2 = 0.9; }, "--beta2");
  refused([](engine::TrainConfig& d) { d.warmup = 5; }, "--warmup");
  refused([](engine::TrainConfig& d) { d.clocks = 600; }, "--clocks");  // the cosine's horizon
  refused([](engine::TrainConfig& d) { d.lr = 0.01; }, "--lr");
}

TEST_CASE("the rebuild of a clock's last group fused with its step is bitwise the rebuild and then the step",
          "[optimizer]") {
  // W is 48 x 1500: tiles of 682 columns, and a narrower last one.
  const int64_t features = 1500, classes = 48;
  const ops::MultinomialLogisticRegression model(features, classes);
  std::mt19937 gen(41);
  std::normal_distribution<float> normal;
  const auto random = [&](int64_t rows, int64_t cols) {
    Matrix m(rows, cols);
    for (Eigen::Index k = 0; k < m.size(); ++k) m.data()[k] = normal(gen);
    return m;
  };
  // A batch of n SVGs of W with its bias; sparse: V as a sparse matrix (rebuilt whole, stepped after).
  const auto batch = [&](int64_t n, bool sparse) {
    SvBatch b;
    b.coeffs = random(n, 1).col(0) * 0.01f;
    SvMatrix m;
    m.paramId = 0;
    m.biasId = 1;
    m.u = random(classes, n);
    const Matrix v = random(features, n);
    if (sparse) {
      m.sparseV = true;
      m.vSparse = v.sparseView(1.0f, 1.0f);  // the entries above 1 in magnitude
    } else {
      m.vDense = v;
    }
    b.matrices.push_back(std::move(m));
    return b;
  };
  const auto views = [](const std::vector<SvBatch>& batches, std::vector<SvBatchView>& store) {
    store.clear();
    for (const SvBatch& b : batches) store.push_back(viewOf(b));
    std::vector<const SvBatchView*> out;
    for (const SvBatchView& v : store) out.push_back(&v);
    return out;
  };
  const auto kinds = {OptimizerKind::kMomentum, OptimizerKind::kNesterov, OptimizerKind::kAdam,
                      OptimizerKind::kAdagrad, OptimizerKind::kSgd};
  for (const OptimizerKind kind : kinds) {
    OptimizerSettings s;
    s.kind = kind;
    s.lr = 0.05;
    // adagrad and sgd step this way only with weight decay (else they visit touched columns, or fold lr).
    if (kind == OptimizerKind::kAdagrad || kind == OptimizerKind::kSgd) s.weightDecay = 0.01;
    INFO("optimizer " << static_cast<int>(kind));
    ops::cpu::CpuBackend cpu;
    engine::ReplicaUpdater fused(s, model, cpu), plain(s, model, cpu);
    ParamSet pf = model.zeroParams(), pp;
    for (Param& p : pf.params) p.value = random(p.value.rows(), p.value.cols());
    pp = pf;
    std::vector<SvBatchView> store;
    for (uint64_t clock = 1; clock <= 4; ++clock) {
      // Clock 2 has a group before its last (overlapped receives), clock 3 a sparse V.
      const std::vector<SvBatch> early = {batch(6, false)};
      const std::vector<SvBatch> last = {batch(5, false), batch(7, clock == 3)};
      if (clock == 2) {
        fused.applyGroup(clock, views(early, store), pf);
        plain.applyGroup(clock, views(early, store), pp);
      }
      fused.applyLastGroup(clock, views(last, store), pf);
      CHECK_FALSE(fused.pending());
      plain.applyGroup(clock, views(last, store), pp);
      plain.finishClock(pp);
      for (size_t i = 0; i < pf.size(); ++i) REQUIRE(pf[i] == pp[i]);
    }
    CHECK(relativeDifference(pf, model.zeroParams()) > 0.0);
    const ParamSet sf = fused.optimizer().exportState(), sp = plain.optimizer().exportState();
    REQUIRE(sf.size() == sp.size());
    for (size_t i = 0; i < sf.size(); ++i) CHECK(sf[i] == sp[i]);
    CHECK(fused.optimizer().steps() == 4);
  }
}
