// The worker's clock loop run as threads over the loopback transport.
#include "comm/loopback/loopback_transport.h"
#include "ops/backends.h"
#include "engine/base/error.h"
#include "engine/data/sampler.h"
#include "engine/data/synthetic_data.h"
#include "engine/worker/part_options.h"
#include "engine/worker/worker.h"
#include "ops/mlr.h"
#include "tests/support/bitwise.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

using namespace orpheus;
using comm::loopback::LoopbackHub;
using comm::loopback::LoopbackTransport;
using orpheus::testing::bitwiseEqual;

namespace {

constexpr int64_t kFeatures = 40;
constexpr int64_t kClasses = 5;

// Flips one byte of `victim`'s record as seen by this rank at `clock`.
class CorruptingTransport final : public comm::Transport {
 public:
  CorruptingTransport(comm::Transport& inner, int victim, uint64_t clock)
      : inner_(inner), victim_(victim), clock_(clock) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return "corrupting"; }
  comm::ControlPlane& control() override { return inner_.control(); }

 protected:
  comm::Gathered doAllgatherv(std::span<const std::byte> local, uint64_t clock) override {
    comm::Gathered all = inner_.allgatherv(local, clock);
    if (clock == clock_) all.data[all.offsets[static_cast<size_t>(victim_)] + 100] ^= std::byte{0x40};
    return all;
  }
  void doAllreduceSum(std::span<float> d, uint64_t c) override { inner_.allreduceSum(d, c); }
  void doAllreduceSumIdentical(std::span<float> d, uint64_t c) override { inner_.allreduceSumIdentical(d, c); }
  void doShiftRing(std::span<float> d, uint64_t c) override { inner_.shiftRing(d, c); }
  void doSendAsync(int peer, comm::SharedBytes b) override { inner_.sendAsync(peer, std::move(b)); }
  std::optional<comm::Message> doTryReceive() override {
    // The overlapped exchange (--overlap on) sends point to point: the same byte
    // of the victim's record of that clock (its header's clock is at byte 24).
    std::optional<comm::Message> m = inner_.tryReceive();
    uint64_t clock = 0;
    if (m && m->peer == victim_ && m->bytes.size() > 100) std::memcpy(&clock, m->bytes.data() + 24, sizeof clock);
    if (clock == clock_) m->bytes[100] ^= std::byte{0x40};
    return m;
  }
  void doFlushSends() override { inner_.flushSends(); }

 private:
  comm::Transport& inner_;
  int victim_;
  uint64_t clock_;
};

// Runs `clocks` clocks on `ranks` threads and returns every rank's replica.
std::vector<ParamSet> train(engine::TrainConfig config, int ranks, int64_t clocks,
                            std::vector<std::vector<int64_t>>* gaps = nullptr, std::vector<uint64_t>* bytes = nullptr,
                            std::vector<double>* divergence = nullptr) {
  if (gaps) gaps->assign(static_cast<size_t>(ranks), {});
  if (bytes) bytes->assign(static_cast<size_t>(ranks), 0);
  auto hub = std::make_shared<LoopbackHub>(ranks);
  std::vector<ParamSet> out(static_cast<size_t>(ranks));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        LoopbackTransport t(hub, r);
        const data::Dataset shard = engine::makeSyntheticShard(
            fmt::format("synthetic:examples=2000,features={},classes={}", kFeatures, kClasses), config.seed, r, ranks);
        ops::MultinomialLogisticRegression model(kFeatures, kClasses);
        const auto backend = ops::makeBackend(config.device);
        engine::Worker worker(config, model, *backend, t, shard, nullptr);
        data::MinibatchSampler sampler(shard.size(), config.batch, config.seed, r);
        for (int64_t c = 1; c <= clocks; ++c) {
          const engine::ClockStats stats = worker.runClock(static_cast<uint64_t>(c), data::gather(shard, sampler.next()));
          if (gaps) (*gaps)[static_cast<size_t>(r)].push_back(stats.clockGap);
          if (bytes) (*bytes)[static_cast<size_t>(r)] += stats.bytesSent;
          const auto done = worker.coordinate(static_cast<uint64_t>(c));
          if (divergence && done.averaged && r == 0) divergence->push_back(done.divergenceMax);
        }
        worker.drain(static_cast<uint64_t>(clocks));
        out[static_cast<size_t>(r)] = worker.replica();
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

// A sync mode's training and dense training of the same job (B = 16 per rank,
// lr 0.5) from the same start: every rank's replica of each, and the start.
struct AgainstDense {
  std::vector<ParamSet> trained;
  std::vector<ParamSet> dense;
  ParamSet init;
};

AgainstDense trainAgainstDense(engine::SyncMode sync, int64_t svRank, int ranks, int64_t clocks) {
  engine::TrainConfig config;
  config.batch = 16;
  config.lr = 0.5;
  config.sync = sync;
  config.svRank = svRank;
  AgainstDense run;
  run.trained = train(config, ranks, clocks);
  config.sync = engine::SyncMode::kDense;
  config.svRank = 0;
  run.dense = train(config, ranks, clocks);
  run.init = ops::MultinomialLogisticRegression(kFeatures, kClasses).initParams(config.seed);
  return run;
}

}  // namespace

TEST_CASE("SV broadcast training equals dense allreduce training (loopback, 4 ranks, 50 clocks)", "[engine]") {
  const AgainstDense run = trainAgainstDense(engine::SyncMode::kSv, 0, 4, 50);
  const std::vector<ParamSet>& sv = run.trained;
  const std::vector<ParamSet>& dense = run.dense;
  const ParamSet& init = run.init;
  // Training moved the parameters, and both modes moved them the same way.
  CHECK(relativeDifference(sv[0], init) > 0.1);
  const double diff = relativeDifference(sv[0], dense[0]);
  INFO("relative difference " << diff);
  CHECK(diff <= 1e-5);
  // Every replica holds the same parameters.
  for (int r = 1; r < 4; ++r) CHECK(bitwiseEqual(sv[0], sv[static_cast<size_t>(r)]));
}

TEST_CASE("--sync powersgd keeps every replica equal and trains at rank 1 (loopback, 2 ranks)", "[engine]") {
  const AgainstDense run = trainAgainstDense(engine::SyncMode::kPowerSgd, 1, 2, 30);
  const std::vector<ParamSet>& compressed = run.trained;
  const std::vector<ParamSet>& dense = run.dense;
  const ParamSet& init = run.init;
  CHECK(bitwiseEqual(compressed[0], compressed[1]));
  CHECK(relativeDifference(compressed[0], init) > 0.1);
  // Rank 1 of a 5 x 40 gradient is not the gradient, but it moves the parameters
  // towards where dense training takes them.
  const double diff = relativeDifference(compressed[0], dense[0]);
  INFO("relative difference to dense " << diff << ", of the start " << relativeDifference(init, dense[0]));
  CHECK(diff > 1e-4);
  CHECK(diff < relativeDifference(init, dense[0]));
}

TEST_CASE("same seed and flags give bitwise the same parameters; another seed does not", "[engine]") {
  engine::TrainConfig config;
  config.batch = 8;
  const auto a = train(config, 3, 10);
  const auto b = train(config, 3, 10);
  CHECK(bitwiseEqual(a[0], b[0]));
  config.seed = 2;
  const auto c = train(config, 3, 10);
  CHECK_FALSE(bitwiseEqual(a[0], c[0]));
}

TEST_CASE("a corrupted SV batch is an error naming its sender and clock", "[engine]") {
  const int ranks = 3;
  auto hub = std::make_shared<LoopbackHub>(ranks);
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  engine::TrainConfig config;
  config.batch = 8;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      LoopbackTransport inner(hub, r);
      CorruptingTransport t(inner, /*victim=*/2, /*clock=*/3);
      const data::Dataset shard =
          engine::makeSyntheticShard("synthetic:examples=300,features=40,classes=5", config.seed, r, ranks);
      ops::MultinomialLogisticRegression model(kFeatures, kClasses);
      const auto backend = ops::makeBackend(config.device);
      engine::Worker worker(config, model, *backend, t, shard, nullptr);
      data::MinibatchSampler sampler(shard.size(), config.batch, config.seed, r);
      try {
        for (uint64_t c = 1; c <= 3; ++c) worker.runClock(c, data::gather(shard, sampler.next()));
      } catch (const CorruptRecordError& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK_THAT(errors[0], Catch::Contains("rank 2") && Catch::Contains("clock 3"));
  CHECK_THAT(errors[1], Catch::Contains("rank 2") && Catch::Contains("clock 3"));
  CHECK(errors[2].empty());  // its own batch is never decoded
}

TEST_CASE("run() writes a metrics line per clock and a summary with traffic totals", "[engine]") {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("orpheus_worker_{}", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "metrics.jsonl").string();
  const int ranks = 2;
  auto hub = std::make_shared<LoopbackHub>(ranks);
  engine::TrainConfig config;
  config.batch = 10;
  config.clocks = 12;
  config.evalEvery = 5;
  config.progress = "off";
  std::vector<std::thread> threads;
  std::vector<uint64_t> bytes(ranks);
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      LoopbackTransport t(hub, r);
      const std::string spec = "synthetic:examples=400,features=40,classes=5";
      const data::Dataset shard = engine::makeSyntheticShard(spec, config.seed, r, ranks);
      const data::Dataset test = engine::makeSyntheticShard(spec, config.seed + 1, r, ranks);
      ops::MultinomialLogisticRegression model(kFeatures, kClasses);
      const auto backend = ops::makeBackend(config.device);
      engine::Worker worker(config, model, *backend, t, shard, &test);
      engine::MetricsWriter metrics(r == 0 ? path : std::string());
      worker.run(metrics);
      bytes[static_cast<size_t>(r)] = t.counters().bytesSent;
    });
  }
  for (auto& t : threads) t.join();
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 13);
  CHECK_THAT(lines[0], Catch::StartsWith("{\"clock\": 1,") && !Catch::Contains("test_accuracy"));
  CHECK_THAT(lines[4], Catch::Contains("\"test_accuracy\""));
  CHECK_THAT(lines[11], Catch::Contains("\"test_accuracy\""));  // the last clock is always evaluated
  CHECK_THAT(lines[12], Catch::Contains("\"summary\": true"));
  // Totals are counted at the transport: every rank sends its batch to the one peer.
  CHECK_THAT(lines[12], Catch::Contains(fmt::format("\"bytes_sent\": {}", bytes[0] + bytes[1])));
  CHECK_THAT(lines[12], Catch::Contains("\"messages\": 24"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("with C = B, Q = P-1 and BSP, multicast equals the broadcast bit for bit, on either path", "[engine]") {
  engine::TrainConfig config;
  config.batch = 12;
  config.clocks = 15;
  const auto broadcast = train(config, 4, 15);
  config.multicast = comm::MulticastKind::kRandom;
  config.fanout = 3;
  config.select = 12;  // C = B
  // Every peer, within the clock: through the allgather.
  const auto collective = train(config, 4, 15);
  // A link-failure rate that breaks none of the 12 links keeps the point-to-point path.
  config.dropLinks = 0.01;
  REQUIRE(engine::sendsPointToPoint(config, comm::MulticastSchedule(engine::scheduleConfig(config, 4)), {0, 3, 0, 0}));
  REQUIRE(comm::MulticastSchedule(engine::scheduleConfig(config, 4)).brokenLinksPerClock() == 0);
  const auto pointToPoint = train(config, 4, 15);
  for (int r = 0; r < 4; ++r) {
    CHECK(bitwiseEqual(broadcast[static_cast<size_t>(r)], collective[static_cast<size_t>(r)]));
    CHECK(bitwiseEqual(broadcast[static_cast<size_t>(r)], pointToPoint[static_cast<size_t>(r)]));
  }
}

TEST_CASE("a clock goes point to point unless every rank gets every batch within it", "[engine]") {
  engine::TrainConfig config;
  config.multicast = comm::MulticastKind::kRandom;
  config.fanout = 3;
  const auto pointToPoint = [&](int ranks, int64_t fanout, int64_t staleness) {
    config.fanout = static_cast<int>(fanout);
    return engine::sendsPointToPoint(config, comm::MulticastSchedule(engine::scheduleConfig(config, ranks)),
                                     {0, fanout, staleness, 0});
  };
  CHECK_FALSE(pointToPoint(4, 3, 0));  // Q = P - 1, BSP: the collective
  CHECK(pointToPoint(4, 2, 0));
  CHECK(pointToPoint(8, 3, 0));
  config.consistency = engine::Consistency::kSsp;
  CHECK_FALSE(pointToPoint(4, 3, 0));  // SSP with s = 0 waits for the whole clock anyway
  CHECK(pointToPoint(4, 3, 1));
  config.consistency = engine::Consistency::kBsp;
  config.dropLinks = 0.2;
  CHECK(pointToPoint(4, 3, 0));  // a broken link drops one message, not a collective
  config.dropLinks = 0.0;
  config.multicast = comm::MulticastKind::kAll;
  config.fanout = 0;
  CHECK_FALSE(engine::sendsPointToPoint(config, comm::MulticastSchedule(engine::scheduleConfig(config, 4)), {}));
  config.sync = engine::SyncMode::kDense;
  config.multicast = comm::MulticastKind::kRandom;
  CHECK_FALSE(pointToPoint(4, 2, 0));
}

TEST_CASE("random multicast with selection sends C SVGs to Q peers: bytes match the analytic count", "[engine]") {
  engine::TrainConfig config;
  config.batch = 20;
  config.clocks = 10;
  config.select = 5;
  config.multicast = comm::MulticastKind::kRandom;
  config.fanout = 2;
  std::vector<uint64_t> bytes;
  const auto replicas = train(config, 4, 10, nullptr, &bytes);
  // Per batch: header 64 + one matrix entry 32 + coeffs 4C + U 4JC + V 4KC + core 4C^2 + bias coefficients 4C.
  const uint64_t c = 5, j = kClasses, k = kFeatures;
  const uint64_t record = 64 + 32 + 4 * c + 4 * j * c + 4 * k * c + 4 * c * c + 4 * c;
  for (int r = 0; r < 4; ++r) CHECK(bytes[static_cast<size_t>(r)] == record * 2 * 10);
  // Replicas diverge under multicast but stay finite.
  CHECK_FALSE(bitwiseEqual(replicas[0], replicas[1]));
  for (const auto& p : replicas) CHECK(p[0].allFinite());
}

TEST_CASE("SSP: a slowed rank never lets another run more than s clocks ahead", "[engine]") {
  engine::TrainConfig config;
  config.batch = 8;
  config.clocks = 30;
  config.multicast = comm::MulticastKind::kRandom;
  config.fanout = 2;
  config.consistency = engine::Consistency::kSsp;
  config.staleness = 2;
  config.delayRank = 1;
  config.delayMs = 3;
  std::vector<std::vector<int64_t>> gaps;
  train(config, 4, 30, &gaps);
  int64_t worst = 0;
  for (const auto& g : gaps)
    for (int64_t x : g) worst = std::max(worst, x);
  CHECK(worst <= 2);
  CHECK(worst >= 1);  // the fast ranks did run ahead of the slow one
}

TEST_CASE("broken links: nobody waits for a message that cannot come", "[engine]") {
  engine::TrainConfig config;
  config.batch = 8;
  config.clocks = 20;
  config.dropLinks = 0.3;
  for (auto kind : {comm::MulticastKind::kRandom, comm::MulticastKind::kFixed, comm::MulticastKind::kRing}) {
    config.multicast = kind;
    config.fanout = 2;
    config.timeoutSeconds = 20;
    const auto replicas = train(config, 5, 20);
    for (const auto& p : replicas) CHECK(p[0].allFinite());
  }
}

TEST_CASE("inconsistent flags are refused with one clear message", "[engine]") {
  engine::TrainConfig c;
  c.batch = 10;
  c.select = 11;
  CHECK_THROWS_WITH(engine::validate(c, 4), Catch::Contains("--select 11"));
  c.select = 0;
  c.multicast = comm::MulticastKind::kRandom;
  c.fanout = 4;
  CHECK_THROWS_WITH(engine::validate(c, 4), Catch::Contains("--fanout 4") && Catch::Contains("P-1 = 3"));
  c.fanout = 2;
  c.staleness = -1;
  CHECK_THROWS_WITH(engine::validate(c, 4), Catch::Contains("--staleness -1"));
  c.staleness = 0;
  c.dropLinks = 1.0;
  CHECK_THROWS_WITH(engine::validate(c, 4), Catch::Contains("--drop-links"));
  c.dropLinks = 0.0;
  c.sync = engine::SyncMode::kDense;
  CHECK_THROWS_WITH(engine::validate(c, 4), Catch::Contains("--sync dense"));
}

// SSP with random multicast to one peer, averaging every 5 clocks: replicas that
// drift apart between barriers.
static engine::TrainConfig driftingReplicas() {
  engine::TrainConfig config;
  config.batch = 10;
  config.multicast = comm::MulticastKind::kRandom;
  config.fanout = 1;
  config.consistency = engine::Consistency::kSsp;
  config.staleness = 2;
  config.averageEvery = 5;
  return config;
}

TEST_CASE("after an averaging barrier every replica is bitwise the average", "[engine][coordinator]") {
  engine::TrainConfig config = driftingReplicas();
  std::vector<double> divergence;
  const auto replicas = train(config, 4, 20, nullptr, nullptr, &divergence);
  for (int r = 1; r < 4; ++r) CHECK(bitwiseEqual(replicas[0], replicas[static_cast<size_t>(r)]));
  REQUIRE(divergence.size() == 4);
  for (double d : divergence) CHECK(d > 0.0);
  // Without averaging the same run leaves different replicas.
  config.averageEvery = 0;
  const auto drifting = train(config, 4, 20);
  CHECK_FALSE(bitwiseEqual(drifting[0], drifting[1]));
}

TEST_CASE("with --outer-lr every replica is bitwise W after the barrier, resident or not", "[engine][coordinator]") {
  engine::TrainConfig config = driftingReplicas();
  config.optimizer = engine::OptimizerKind::kNesterov;
  const auto plain = train(config, 4, 20);
  config.outerLr = 0.7;
  config.outerMomentum = 0.9;
  const auto outer = train(config, 4, 20);
  for (int r = 1; r < 4; ++r) CHECK(bitwiseEqual(outer[0], outer[static_cast<size_t>(r)]));
  CHECK_FALSE(bitwiseEqual(outer[0], plain[0]));  // the outer step moved W off the mean
  // The replica resident on a device is averaged on the host around the barrier
  // (ReplicaUpdater::toHost, hostChanged): there too every rank ends with the same W,
  // and not the plain average.
  config.device = "strict";
  const auto resident = train(config, 4, 20);
  for (int r = 1; r < 4; ++r) CHECK(bitwiseEqual(resident[0], resident[static_cast<size_t>(r)]));
  config.outerLr = 0.0;
  config.outerMomentum = 0.0;
  CHECK_FALSE(bitwiseEqual(resident[0], train(config, 4, 20)[0]));
}

TEST_CASE("rotation moves each replica and its id one rank along the ring; P rotations bring it home",
          "[engine][coordinator]") {
  const int ranks = 4;
  auto hub = std::make_shared<LoopbackHub>(ranks);
  std::vector<std::thread> threads;
  std::vector<std::string> failures(ranks);
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      LoopbackTransport t(hub, r);
      engine::TrainConfig config;
      const data::Dataset shard =
          engine::makeSyntheticShard("synthetic:examples=40,features=40,classes=5", config.seed, r, ranks);
      ops::MultinomialLogisticRegression model(kFeatures, kClasses);
      const auto backend = ops::makeBackend(config.device);
      engine::Worker worker(config, model, *backend, t, shard, nullptr);
      for (auto& p : worker.mutableReplica().params) p.value.setConstant(static_cast<float>(r) + 0.25f);
      const ParamSet mine = worker.replica();
      worker.rotateReplica(1);
      const int from = (r + ranks - 1) % ranks;
      if (worker.replicaId() != from) failures[r] += "id after one rotation; ";
      if (worker.replica()[0](0, 0) != static_cast<float>(from) + 0.25f) failures[r] += "content after one rotation; ";
      for (int k = 1; k < ranks; ++k) worker.rotateReplica(1 + k);
      if (worker.replicaId() != r) failures[r] += "id after P rotations; ";
      if (!bitwiseEqual(worker.replica(), mine)) failures[r] += "content after P rotations; ";
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) CHECK(failures[r].empty());
}

TEST_CASE("averaging and rotation are no-ops on one rank", "[engine][coordinator]") {
  engine::TrainConfig config;
  config.batch = 5;
  config.averageEvery = 2;
  config.rotateEvery = 3;
  const auto one = train(config, 1, 6);
  config.averageEvery = 0;
  config.rotateEvery = 0;
  const auto plain = train(config, 1, 6);
  CHECK(bitwiseEqual(one[0], plain[0]));
}

TEST_CASE("each part's options say what the flags say", "[engine][options]") {
  engine::TrainConfig config;
  config.ckptDir = "run/ckpt";
  CHECK(engine::balanceOptions(config).chunkLogDir.empty());  // --ckpt-dir alone logs no chunk moves
  config.ckptSv = true;
  CHECK(engine::balanceOptions(config).chunkLogDir == "run/ckpt");
  CHECK(engine::controllerOptions(config, 0).jmcss);
  config.selectMethod = engine::SelectionMethod::kUniform;
  CHECK_FALSE(engine::controllerOptions(config, 0).jmcss);  // e(c) is measured under JMCSS only
  config.sync = engine::SyncMode::kDense;
  config.consistency = engine::Consistency::kSsp;
  config.multicast = comm::MulticastKind::kRandom;
  const engine::MetricsOptions named = engine::metricsOptions(config);
  CHECK(named.sync == "dense");  // the summary line names values as the flags do
  CHECK(named.consistency == "ssp");
  CHECK(named.multicast == "random");
  config.rotateEvery = 7;
  CHECK(engine::coordinatorOptions(config).rotateEvery == 7);
  config.outerLr = 0.7;
  config.outerMomentum = 0.9;
  CHECK(engine::coordinatorOptions(config).outer.lr == 0.7);
  CHECK(engine::coordinatorOptions(config).outer.momentum == 0.9);
  config.timeoutSeconds = 12.5;
  CHECK(engine::consistencyOptions(config).timeoutSeconds == 12.5);
  CHECK(engine::overlapOptions(config).timeoutSeconds == 12.5);
}
