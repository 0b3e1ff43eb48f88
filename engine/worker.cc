#include "engine/worker.h"

#include "engine/base/error.h"
#include "engine/data/sampler.h"
#include "engine/progress.h"
#include "ops/rebuild.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

namespace orpheus::engine {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr int64_t kEvalChunk = 2000;

}  // namespace

std::string toString(SyncMode mode) { return mode == SyncMode::kSv ? "sv" : "dense"; }

ops::ExampleBatch view(const data::Batch& batch) {
  ops::ExampleBatch x;
  if (batch.sparse) {
    x.sparse = &batch.sparseX;
  } else {
    x.dense = &batch.dense;
  }
  x.labels = &batch.labels;
  x.indices = &batch.indices;
  return x;
}

Worker::Worker(const TrainConfig& config, const ops::Model& model, comm::Transport& transport,
               const data::Dataset& train, const data::Dataset* test)
    : config_(config),
      model_(model),
      transport_(transport),
      train_(train),
      test_(test),
      replica_(model.initParams(config.seed)),
      stepScale_(static_cast<float>(-config.lr / static_cast<double>(config.batch * transport.size()))) {}

void Worker::svClock(uint64_t clock, const ops::ExampleBatch& examples, ClockStats& stats) {
  auto t = Clock::now();
  // compute_svg(W, x) for each x of the minibatch: S.
  SvBatch local = model_.computeSvg(replica_, examples, &stats.loss);
  if (!std::isfinite(stats.loss)) return;  // reported by runClock
  ops::scaleCoefficients(local, stepScale_);
  local.header.sender = static_cast<uint32_t>(transport_.rank());
  local.header.replica = static_cast<uint32_t>(transport_.rank());
  local.header.clock = clock;
  local.header.jobId = config_.seed;
  stats.computeSeconds = secondsSince(t);

  // Send S to the other workers; receive their SVG sets T.
  t = Clock::now();
  encoded_.clear();
  encode(local, encoded_);
  const comm::Gathered all = transport_.allgatherv(encoded_, clock);
  std::vector<SvBatch> remote = decodeRemote(all, clock);
  stats.commSeconds = secondsSince(t);

  // compute_update(s) for each s in S ∪ T, applied together in rank order so every
  // replica adds the same terms in the same order.
  t = Clock::now();
  std::vector<const SvBatch*> batches;
  batches.reserve(remote.size() + 1);
  for (int r = 0, next = 0; r < transport_.size(); ++r) {
    batches.push_back(r == transport_.rank() ? &local : &remote[static_cast<size_t>(next++)]);
  }
  model_.computeUpdate(batches, replica_);
  stats.updateSeconds = secondsSince(t);
}

std::vector<SvBatch> Worker::decodeRemote(const comm::Gathered& all, uint64_t clock) const {
  SvBatchExpectation expect;
  expect.clock = static_cast<int64_t>(clock);
  expect.paramShapes = model_.paramShapes();
  std::vector<SvBatch> out;
  out.reserve(all.count());
  for (size_t r = 0; r < all.count(); ++r) {
    if (static_cast<int>(r) == transport_.rank()) continue;
    expect.sender = static_cast<int64_t>(r);
    out.push_back(decode(all.part(r), expect));
  }
  return out;
}

void Worker::denseClock(uint64_t clock, const ops::ExampleBatch& examples, ClockStats& stats) {
  auto t = Clock::now();
  ParamSet grad = model_.denseGradient(replica_, examples, &stats.loss);
  stats.computeSeconds = secondsSince(t);

  t = Clock::now();
  for (auto& p : grad.params) transport_.allreduceSum({p.value.data(), static_cast<size_t>(p.value.size())}, clock);
  stats.commSeconds = secondsSince(t);

  t = Clock::now();
  for (size_t i = 0; i < grad.size(); ++i) replica_[i].noalias() += stepScale_ * grad[i];
  stats.updateSeconds = secondsSince(t);
}

ClockStats Worker::runClock(uint64_t clock, const data::Batch& batch) {
  ClockStats stats;
  const comm::TrafficCounters before = transport_.counters();
  const ops::ExampleBatch examples = view(batch);
  if (config_.sync == SyncMode::kSv) {
    svClock(clock, examples, stats);
  } else {
    denseClock(clock, examples, stats);
  }
  if (!std::isfinite(stats.loss)) {
    throw InputError(fmt::format("training diverged at clock {} on rank {}: the loss is not finite (lower --lr)", clock,
                                 transport_.rank()));
  }
  stats.bytesSent = transport_.counters().bytesSent - before.bytesSent;
  stats.messages = transport_.counters().messages - before.messages;
  clock_ = clock;
  return stats;
}

EvalResult Worker::evaluate() {
  ops::EvalSums sums;
  if (test_ != nullptr) {
    for (int64_t begin = 0; begin < test_->size(); begin += kEvalChunk) {
      const data::Batch chunk = data::slice(*test_, begin, std::min(test_->size(), begin + kEvalChunk));
      const ops::EvalSums part = model_.evaluate(replica_, view(chunk));
      sums.lossSum += part.lossSum;
      sums.correct += part.correct;
      sums.count += part.count;
    }
  }
  double v[3] = {sums.lossSum, sums.correct, sums.count};
  transport_.controlSum(v);
  EvalResult r;
  r.examples = static_cast<int64_t>(v[2]);
  r.loss = v[2] > 0 ? v[0] / v[2] : 0.0;
  r.accuracy = v[2] > 0 ? v[1] / v[2] : 0.0;
  return r;
}

const ParamSet& Worker::run(MetricsWriter& metrics) {
  const bool leader = transport_.rank() == 0;
  data::PrefetchQueue queue(train_, data::MinibatchSampler(train_.size(), config_.batch, config_.seed, transport_.rank()),
                            2, std::chrono::milliseconds(static_cast<int64_t>(config_.timeoutSeconds * 1000)));
  ProgressLine progress(leader ? config_.progress : "off", static_cast<uint64_t>(config_.clocks));

  double trainSeconds = 0.0;
  uint64_t totalBytes = 0;
  uint64_t totalMessages = 0;
  EvalResult lastEval;
  bool evaluated = false;
  const int ranks = transport_.size();
  // The starting point, so a run's progress can be read as a ratio.
  EvalResult initialEval;
  if (test_ != nullptr) initialEval = evaluate();

  for (uint64_t clock = 1; clock <= static_cast<uint64_t>(config_.clocks); ++clock) {
    const auto start = Clock::now();
    const data::Batch batch = queue.next();
    ClockStats stats = runClock(clock, batch);
    const double clockSeconds = secondsSince(start);
    trainSeconds += clockSeconds;

    // One small control reduction per clock carries the metrics of every rank.
    double sums[7] = {stats.loss,          static_cast<double>(stats.bytesSent), static_cast<double>(stats.messages),
                      stats.computeSeconds, stats.commSeconds,                    stats.updateSeconds,
                      clockSeconds};
    transport_.controlSum(sums);
    totalBytes += static_cast<uint64_t>(sums[1]);
    totalMessages += static_cast<uint64_t>(sums[2]);

    const bool evalClock = clock == static_cast<uint64_t>(config_.clocks) ||
                           (config_.evalEvery > 0 && clock % static_cast<uint64_t>(config_.evalEvery) == 0);
    if (evalClock && test_ != nullptr) {
      lastEval = evaluate();
      evaluated = true;
    }
    if (leader) {
      JsonLine line;
      line.add("clock", clock)
          .add("seconds", trainSeconds)
          .add("clock_seconds", sums[6] / ranks)
          .add("train_loss", sums[0] / ranks)
          .add("bytes_sent", static_cast<uint64_t>(sums[1]))
          .add("messages", static_cast<uint64_t>(sums[2]))
          .add("compute_seconds", sums[3] / ranks)
          .add("comm_seconds", sums[4] / ranks)
          .add("update_seconds", sums[5] / ranks);
      if (evalClock && test_ != nullptr) {
        line.add("test_loss", lastEval.loss);
        if (model_.hasAccuracy()) line.add("test_accuracy", lastEval.accuracy);
      }
      metrics.write(line);
      progress.update(clock, sums[0] / ranks, evaluated && model_.hasAccuracy() ? lastEval.accuracy : -1.0, trainSeconds,
                      evalClock && test_ != nullptr);
    }
  }
  progress.finish();

  if (leader) {
    JsonLine summary;
    summary.add("summary", true)
        .add("clocks", config_.clocks)
        .add("ranks", ranks)
        .add("sync", toString(config_.sync))
        .add("model", model_.spec())
        .add("batch_per_rank", config_.batch)
        .add("seconds", trainSeconds)
        .add("bytes_sent", totalBytes)
        .add("messages", totalMessages)
        .add("bytes_per_clock", config_.clocks > 0 ? static_cast<double>(totalBytes) / config_.clocks : 0.0);
    if (test_ != nullptr) summary.add("initial_test_loss", initialEval.loss);
    if (evaluated) {
      summary.add("test_loss", lastEval.loss);
      if (model_.hasAccuracy()) summary.add("test_accuracy", lastEval.accuracy);
    }
    metrics.write(summary);
  }
  lastEval_ = lastEval;
  trainSeconds_ = trainSeconds;
  return replica_;
}

}  // namespace orpheus::engine
