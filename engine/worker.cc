#include "engine/worker.h"

#include "engine/base/error.h"
#include "ckpt/model_file.h"
#include "engine/checkpoint.h"
#include "engine/data/sampler.h"
#include "engine/job.h"
#include "engine/progress.h"
#include "engine/base/rng.h"
#include "engine/select.h"
#include "ops/rebuild.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <cmath>
#include <cstring>
#include <malloc.h>
#include <thread>

#include <fmt/ranges.h>

namespace orpheus::engine {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr int64_t kEvalChunk = 2000;
// Clocks between the ranks' agreements on the checkpoint writers' health.
constexpr uint64_t kLogCheckEvery = 50;

}  // namespace

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

namespace {

comm::ScheduleConfig scheduleConfig(const TrainConfig& c, int ranks) {
  comm::ScheduleConfig sc;
  sc.kind = c.multicast;
  sc.ranks = ranks;
  sc.fanout = c.multicast == comm::MulticastKind::kAll ? std::max(ranks - 1, 1) : std::max(c.fanout, 1);
  sc.seed = c.seed;
  sc.dropLinks = c.dropLinks;
  return sc;
}

}  // namespace

Worker::Worker(const TrainConfig& config, const ops::Model& model, comm::Transport& transport,
               const data::Dataset& train, const data::Dataset* test)
    : config_(config),
      model_(model),
      transport_(transport),
      train_(train),
      test_(test),
      replica_(model.initParams(config.seed)),
      stepScale_(0.0f),
      pointToPoint_(config.sync == SyncMode::kSv &&
                    (config.multicast != comm::MulticastKind::kAll || config.consistency == Consistency::kSsp ||
                     config.dropLinks > 0.0)),
      schedule_(scheduleConfig(config, transport.size())),
      shapes_(model.paramShapes()) {
  // Every update is a mean over the examples a replica hears about in a clock: its
  // own B and the B of each of the Q peers that send to it (Q = P - 1 for broadcast
  // and dense sync), so --lr means the same step whatever the fanout.
  const double heard = static_cast<double>(config.batch) * (schedule_.fanout() + 1);
  stepScale_ = static_cast<float>(-config.lr / heard);
  replicaId_ = transport.rank();
  if (config.ckptSv) {
    // The log's IO thread frees each clock's batches once it has copied them, a
    // little after the clock. Keep freed memory in the heap for the next clock's
    // batches rather than handing it back to the system and faulting it in again.
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    log_ = std::make_unique<ckpt::SvLogWriter>(config.ckptDir, replicaId_);
  }
}

void Worker::logGroup(std::vector<ckpt::Record> records) {
  if (log_) log_->appendGroup(current_, std::move(records));
}

void Worker::writeMatrixCheckpoint(uint64_t clock) {
  // The baseline of the paper: computation halts while the whole replica is written.
  ckpt::ModelFileInfo info;
  info.modelSpec = model_.spec();
  info.clock = static_cast<int64_t>(clock);
  info.seed = config_.seed;
  info.replica = replicaId_;
  const std::string dir = fmt::format("{}/matrix-{:012d}", config_.ckptDir, clock);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("cannot create '{}': {}", dir, ec.message()));
  ckpt::saveParams(fmt::format("{}/replica-{}.h5", dir, replicaId_), replica_, info);
  matrixCheckpoint_ = replica_;
  matrixCheckpointClock_ = clock;
}

bool Worker::maybeFail(uint64_t clock, uint64_t* lost) {
  *lost = 0;
  if (config_.failProb <= 0.0) return false;
  CounterRng rng(config_.seed, RngPurpose::kFailure, clock, static_cast<uint64_t>(transport_.rank()));
  if (rng.uniform() >= config_.failProb) return false;
  ++failures_;
  uint64_t recovered = 0;
  if (log_) {
    // The process is gone: its replica and what it had only staged of the log. What
    // is durable is the log on disk and the snapshots; the replica comes back at the
    // newest clock they reach, and the log records the reset.
    const uint64_t logEnd = log_->discardStaged();
    recovered = std::max(logEnd, lastSnapshot_);
    replica_ = recovered == 0 ? model_.initParams(config_.seed)
                              : restore(config_.ckptDir, model_, config_.seed, replicaId_, recovered).params;
    // Unless the log on disk reaches this very clock, its entries since its end
    // are gone: the reset says where the replica stands (a snapshot may cover it all).
    if (logEnd < clock) log_->appendReset(clock, recovered);
  } else if (config_.ckptMatrix) {
    // Back to the last whole-matrix checkpoint: the clocks since are lost.
    replica_ = matrixCheckpointClock_ > 0 ? matrixCheckpoint_ : model_.initParams(config_.seed);
    recovered = matrixCheckpointClock_;
  }
  *lost = clock - recovered;
  lostClocks_ += *lost;
  spdlog::debug("rank {} failed at clock {}: replica {} recovered at clock {} ({} clocks lost)", transport_.rank(),
                clock, replicaId_, recovered, *lost);
  return true;
}

void Worker::resumeFrom(uint64_t clock, ParamSet replica, int id) {
  replica_ = std::move(replica);
  replicaId_ = id;
  clock_ = clock;
  completeThrough_ = clock;
  sentThrough_ = clock;
  if (log_) log_->resumeAt(id, clock);
}

SvBatchHeader Worker::header(uint64_t clock) const {
  SvBatchHeader h;
  h.sender = static_cast<uint32_t>(transport_.rank());
  h.replica = static_cast<uint32_t>(replicaId_);
  h.clock = clock;
  h.jobId = config_.seed;
  return h;
}

void Worker::svClock(uint64_t clock, const ops::ExampleBatch& examples, ClockStats& stats) {
  auto t = Clock::now();
  // compute_svg(W, x) for each x of the minibatch: S. Shared, so the checkpoint
  // log can keep it as it is once applied.
  auto local = std::make_shared<SvBatch>(model_.computeSvg(replica_, examples, &stats.loss));
  if (!std::isfinite(stats.loss)) return;  // reported by runClock
  ops::scaleCoefficients(*local, stepScale_);
  local->header = header(clock);
  stats.computeSeconds = secondsSince(t);
  if (pointToPoint_) {
    svMulticastClock(clock, local, stats);
  } else {
    svBroadcastClock(clock, local, stats);
  }
}

// Selects C of the batch's SVGs to send (the whole batch when selection is off).
// The sender's own replica always gets the whole batch.
static SvBatch toSend(const TrainConfig& config, const SvBatch& local, uint64_t clock, int rank, ClockStats& stats) {
  if (config.select <= 0 || config.select >= local.numColumns()) return local;
  const auto t = Clock::now();
  CounterRng rng(config.seed, RngPurpose::kSelect, clock, static_cast<uint64_t>(rank));
  SvBatch sent = selectSvgs(local, config.select, config.selectMethod, rng);
  stats.selectSeconds = secondsSince(t);
  stats.computeSeconds += stats.selectSeconds;
  return sent;
}

void Worker::svBroadcastClock(uint64_t clock, const std::shared_ptr<SvBatch>& localBatch, ClockStats& stats) {
  const SvBatch& local = *localBatch;
  const bool selecting = config_.select > 0 && config_.select < local.numColumns();
  SvBatch selected;
  if (selecting) selected = toSend(config_, local, clock, transport_.rank(), stats);
  const SvBatch& sent = selecting ? selected : local;

  // Send S to the other workers; receive their SVG sets T.
  auto t = Clock::now();
  encoded_.clear();
  encode(sent, encoded_);
  const auto all = std::make_shared<const comm::Gathered>(transport_.allgatherv(encoded_, clock));
  std::vector<SvBatch> remote = decodeRemote(*all, clock);
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
  if (log_) {
    // The own batch as it is, the others' as they arrived (decoded, so checked).
    std::vector<ckpt::Record> records;
    for (int r = 0; r < transport_.size(); ++r) {
      records.push_back(r == transport_.rank() ? ckpt::Record::of(localBatch)
                                               : ckpt::Record::part(all, all->part(static_cast<size_t>(r)), true));
    }
    logGroup(std::move(records));
  }
}

void Worker::svMulticastClock(uint64_t clock, const std::shared_ptr<SvBatch>& localBatch, ClockStats& stats) {
  const SvBatch& local = *localBatch;
  const SvBatch sent = toSend(config_, local, clock, transport_.rank(), stats);
  const bool selecting = sent.numColumns() != local.numColumns() ||
                         (!sent.matrices.empty() && sent.matrices[0].core.size() > 0);

  // Send S to this clock's peers of the schedule.
  auto t = Clock::now();
  auto bytes = std::make_shared<std::vector<std::byte>>();
  encode(sent, *bytes);
  // The log keeps the whole batch the replica applies: the bytes sent when they are
  // that, else the batch itself (encoded by the log's IO thread).
  ckpt::Record ownRecord;
  if (log_) ownRecord = selecting ? ckpt::Record::of(localBatch) : ckpt::Record::encoded(bytes, true);
  for (int peer : schedule_.receivers(clock, transport_.rank())) transport_.sendAsync(peer, bytes);
  sentThrough_ = clock;
  pump();
  stats.commSeconds = secondsSince(t);

  if (config_.consistency == Consistency::kSsp) {
    // SSP: the own batch at once; received batches are applied as they arrive.
    t = Clock::now();
    const SvBatch* one[] = {&local};
    model_.computeUpdate(one, replica_);
    stats.updateSeconds = secondsSince(t);
    if (log_) logGroup({ownRecord});
    return;
  }
  // BSP: every batch of this clock, applied together in rank order.
  waitComplete(clock, stats);
  t = Clock::now();
  std::map<int, Received>& received = pending_[clock];
  std::vector<const SvBatch*> batches;
  std::vector<ckpt::Record> records;
  bool ownAdded = false;
  for (auto& [sender, r] : received) {
    if (!ownAdded && sender > transport_.rank()) {
      batches.push_back(&local);
      if (log_) records.push_back(ownRecord);
      ownAdded = true;
    }
    batches.push_back(&r.batch);
    if (log_) records.push_back(ckpt::Record::encoded(r.bytes, true));
  }
  if (!ownAdded) {
    batches.push_back(&local);
    if (log_) records.push_back(ownRecord);
  }
  model_.computeUpdate(batches, replica_);
  pending_.erase(clock);
  if (log_) logGroup(std::move(records));
  stats.updateSeconds = secondsSince(t);
}

void Worker::pump() {
  while (auto message = transport_.tryReceive()) accept(std::move(*message));
  if (idle_) idle_();
}

void Worker::accept(comm::Message message) {
  SvBatchExpectation expect;
  expect.sender = message.peer;
  expect.paramShapes = shapes_;
  SvBatch batch = decode(message.bytes, expect);
  const uint64_t clock = batch.header.clock;
  const int sender = message.peer;
  const int me = transport_.rank();
  const auto receivers = clock >= 1 && clock <= static_cast<uint64_t>(config_.clocks)
                             ? schedule_.receivers(clock, sender)
                             : std::vector<int>{};
  if (clock <= completeThrough_ || std::find(receivers.begin(), receivers.end(), me) == receivers.end() ||
      arrived_[clock].count(sender) > 0) {
    throw CorruptRecordError(fmt::format(
        "unexpected SV batch from rank {} at clock {}: the schedule does not send it to rank {} (or it came twice)",
        sender, clock, me));
  }
  arrived_[clock].insert(sender);
  ckpt::SharedBytes bytes;
  if (log_) bytes = std::make_shared<const std::vector<std::byte>>(std::move(message.bytes));
  if (config_.consistency == Consistency::kSsp) {
    const SvBatch* one[] = {&batch};
    model_.computeUpdate(one, replica_);
    if (log_) logGroup({ckpt::Record::encoded(bytes, true)});
  } else {
    pending_[clock].emplace(sender, Received{std::move(batch), bytes});
  }
  advanceComplete();
}

void Worker::advanceComplete() {
  while (completeThrough_ < static_cast<uint64_t>(config_.clocks)) {
    const uint64_t next = completeThrough_ + 1;
    const size_t expected = schedule_.senders(next, transport_.rank()).size();
    const auto it = arrived_.find(next);
    const size_t got = it == arrived_.end() ? 0 : it->second.size();
    if (got < expected) return;
    if (it != arrived_.end()) arrived_.erase(it);
    completeThrough_ = next;
  }
}

std::vector<int> Worker::missingSenders(uint64_t clock) const {
  std::vector<int> missing;
  const auto it = arrived_.find(clock);
  for (int s : schedule_.senders(clock, transport_.rank())) {
    if (it == arrived_.end() || it->second.count(s) == 0) missing.push_back(s);
  }
  return missing;
}

void Worker::waitComplete(uint64_t clock, ClockStats& stats) {
  advanceComplete();
  if (completeThrough_ >= clock) return;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(static_cast<int64_t>(config_.timeoutSeconds * 1000));
  while (completeThrough_ < clock) {
    pump();
    if (completeThrough_ >= clock) break;
    if (Clock::now() > deadline) {
      const uint64_t stuck = completeThrough_ + 1;
      throw TimeoutError(fmt::format("rank {} waited {} s at clock {} for the SV batches of clock {} from ranks {}",
                                     transport_.rank(), config_.timeoutSeconds, clock_ + 1, stuck,
                                     fmt::join(missingSenders(stuck), ", ")));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  stats.waitSeconds += secondsSince(start);
}

void Worker::drain(uint64_t lastClock) {
  if (!pointToPoint_) return;
  ClockStats ignored;
  waitComplete(lastClock, ignored);
  transport_.flushSends();
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
  current_ = clock;
  const comm::TrafficCounters before = transport_.counters();
  const ops::ExampleBatch examples = view(batch);
  if (transport_.rank() == config_.delayRank && config_.delayMs > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(config_.delayMs));
  }
  if (pointToPoint_) {
    pump();
    // SSP: start clock t only once every batch addressed here from clocks <= t-s-1 is in.
    if (config_.consistency == Consistency::kSsp && clock > static_cast<uint64_t>(config_.staleness) + 1) {
      waitComplete(clock - static_cast<uint64_t>(config_.staleness) - 1, stats);
    }
    stats.clockGap = static_cast<int64_t>(clock - 1) - static_cast<int64_t>(std::min(completeThrough_, clock - 1));
  }
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

Worker::Coordination Worker::coordinate(uint64_t clock) {
  Coordination done;
  const bool average = config_.averageEvery > 0 && clock % static_cast<uint64_t>(config_.averageEvery) == 0;
  const bool rotate = config_.rotateEvery > 0 && clock % static_cast<uint64_t>(config_.rotateEvery) == 0;
  if ((!average && !rotate) || transport_.size() == 1) return done;
  // A consistent cut: every batch of every clock <= `clock` is applied everywhere.
  // Nobody has sent anything newer, since every rank stops here after `clock`.
  if (pointToPoint_) {
    ClockStats ignored;
    waitComplete(clock, ignored);
  }
  if (average) {
    done = averageReplicas(clock);
    if (log_) {
      // Every replica is now the average: a snapshot point, the log's record of it.
      ++averagings_;
      log_->appendEvent(clock, ckpt::EventKind::kAveraged);
      if (averagings_ % std::max<int64_t>(config_.snapshotEvery, 1) == 0) {
        // Every part is on disk once all ranks pass here: the snapshot is complete.
        collectively(transport_, [&] {
          ckpt::writeSnapshotPart(config_.ckptDir, clock, transport_.rank(), transport_.size(), replica_);
        });
        lastSnapshot_ = clock;
      }
    }
  }
  if (rotate) {
    if (log_) {
      // The log moves with the replica: the next holder continues it from the
      // hand-over clock, so it must be on disk up to there before the replica leaves.
      log_->appendEvent(clock, ckpt::EventKind::kRotatedOut);
      const auto start = Clock::now();
      collectively(transport_, [&] { log_->flush(); });
      handOffSeconds_ += secondsSince(start);
    }
    rotateReplica(clock);
    if (log_) {
      log_->switchReplica(replicaId_);
      log_->appendEvent(clock, ckpt::EventKind::kRotatedIn);
    }
    done.rotated = true;
  }
  return done;
}

Worker::Coordination Worker::averageReplicas(uint64_t clock) {
  Coordination done;
  done.averaged = true;
  const double p = transport_.size();
  ParamSet mean = replica_;
  for (auto& param : mean.params) {
    transport_.allreduceSumIdentical({param.value.data(), static_cast<size_t>(param.value.size())}, clock);
    param.value /= static_cast<float>(p);
  }
  double stats[2] = {relativeDifference(replica_, mean), 0.0};
  stats[1] = stats[0];
  double maxStat[1] = {stats[0]};
  transport_.control().max(maxStat);
  double sumStat[1] = {stats[1]};
  transport_.control().sum(sumStat);
  done.divergenceMax = maxStat[0];
  done.divergenceMean = sumStat[0] / p;
  replica_ = std::move(mean);  // bitwise the same on every rank (Transport::allreduceSumIdentical)
  return done;
}

void Worker::rotateReplica(uint64_t clock) {
  for (auto& param : replica_.params) {
    transport_.shiftRing({param.value.data(), static_cast<size_t>(param.value.size())}, clock);
  }
  // The replica now here is the one rank-1 held; its id travels with it.
  std::vector<float> carried = {static_cast<float>(replicaId_)};
  transport_.shiftRing(carried, clock);
  replicaId_ = static_cast<int>(carried[0]);
}

ops::EvalSums Worker::evaluateLocal() const {
  ops::EvalSums sums;
  if (test_ == nullptr) return sums;
  for (int64_t begin = 0; begin < test_->size(); begin += kEvalChunk) {
    const data::Batch chunk = data::slice(*test_, begin, std::min(test_->size(), begin + kEvalChunk));
    const ops::EvalSums part = model_.evaluate(replica_, view(chunk));
    sums.lossSum += part.lossSum;
    sums.correct += part.correct;
    sums.count += part.count;
  }
  return sums;
}

EvalResult Worker::evaluate() {
  const ops::EvalSums sums = evaluateLocal();
  double v[3] = {sums.lossSum, sums.correct, sums.count};
  transport_.control().sum(v);
  EvalResult r;
  r.examples = static_cast<int64_t>(v[2]);
  r.loss = v[2] > 0 ? v[0] / v[2] : 0.0;
  r.accuracy = v[2] > 0 ? v[1] / v[2] : 0.0;
  return r;
}

namespace {

// One rank's report of one clock, sent to rank 0 on the control channel so metrics
// never synchronise the workers.
enum Field : size_t {
  kClock, kSeconds, kLoss, kBytes, kMessages, kCompute, kComm, kUpdate, kWait, kSelect, kClockSeconds, kGap,
  kHasEval, kEvalLoss, kEvalCorrect, kEvalCount,
  // Set by rank 0 only, so the sum over ranks is rank 0's value.
  kReplica, kAveraged, kRotated, kDivergenceMax, kDivergenceMean,
  kCkptWait, kFailed, kLostClocks, kFieldCount
};
using ClockRecord = std::array<double, kFieldCount>;

comm::SharedBytes encodeRecord(const ClockRecord& r) {
  auto bytes = std::make_shared<std::vector<std::byte>>(sizeof(ClockRecord));
  std::memcpy(bytes->data(), r.data(), sizeof(ClockRecord));
  return bytes;
}

// Rank 0 adds up the records of every rank and writes a clock's line once all
// have arrived, in clock order.
class MetricsAggregator {
 public:
  MetricsAggregator(int ranks, MetricsWriter& out, ProgressLine& progress, const ops::Model& model, uint64_t first,
                    uint64_t clocks)
      : ranks_(ranks), out_(out), progress_(progress), model_(model), clocks_(clocks), next_(first) {}

  void add(const ClockRecord& r) {
    const auto clock = static_cast<uint64_t>(r[kClock]);
    ORPHEUS_ENFORCE(clock >= next_ && clock <= clocks_, "metrics record for clock {} arrived out of order", clock);
    Entry& e = entries_[clock];
    if (e.count == 0) e.sum.fill(0.0);
    for (size_t f = 0; f < kFieldCount; ++f) e.sum[f] += r[f];
    e.maxGap = std::max(e.maxGap, r[kGap]);
    e.maxWait = std::max(e.maxWait, r[kWait]);
    if (r[kSeconds] > 0 && e.leaderSeconds == 0) e.leaderSeconds = r[kSeconds];
    ++e.count;
    flush();
  }
  bool done() const { return next_ > clocks_; }
  // The job stops early at `clock`: no records come after it.
  void endAt(uint64_t clock) { clocks_ = clock; }
  uint64_t totalBytes() const { return totalBytes_; }
  uint64_t totalMessages() const { return totalMessages_; }
  int64_t totalFailures() const { return totalFailures_; }
  int64_t totalLostClocks() const { return totalLost_; }
  double maxGap() const { return maxGapSeen_; }
  double bestAccuracy() const { return bestAccuracy_; }

 private:
  struct Entry {
    int count = 0;
    ClockRecord sum{};
    double maxGap = 0;
    double maxWait = 0;
    double leaderSeconds = 0;
  };

  void flush() {
    for (auto it = entries_.find(next_); it != entries_.end() && it->second.count == ranks_;
         it = entries_.find(next_)) {
      const Entry& e = it->second;
      const double p = ranks_;
      JsonLine line;
      line.add("clock", next_)
          .add("seconds", e.leaderSeconds)
          .add("clock_seconds", e.sum[kClockSeconds] / p)
          .add("train_loss", e.sum[kLoss] / p)
          .add("bytes_sent", static_cast<uint64_t>(e.sum[kBytes]))
          .add("messages", static_cast<uint64_t>(e.sum[kMessages]))
          .add("compute_seconds", e.sum[kCompute] / p)
          .add("comm_seconds", e.sum[kComm] / p)
          .add("update_seconds", e.sum[kUpdate] / p)
          .add("wait_seconds", e.sum[kWait] / p)
          .add("max_wait_seconds", e.maxWait)
          .add("select_seconds", e.sum[kSelect] / p)
          .add("clock_gap", static_cast<int64_t>(e.maxGap))
          .add("replica", static_cast<int64_t>(e.sum[kReplica]))
          .add("ckpt_wait_seconds", e.sum[kCkptWait] / p)
          .add("failures", static_cast<int64_t>(e.sum[kFailed]))
          .add("lost_clocks", static_cast<int64_t>(e.sum[kLostClocks]));
      if (e.sum[kAveraged] > 0) {
        line.add("averaged", true)
            .add("divergence_max", e.sum[kDivergenceMax])
            .add("divergence_mean", e.sum[kDivergenceMean]);
      }
      if (e.sum[kRotated] > 0) line.add("rotated", true);
      double accuracy = -1.0;
      if (e.sum[kHasEval] > 0 && e.sum[kEvalCount] > 0) {
        line.add("test_loss", e.sum[kEvalLoss] / e.sum[kEvalCount]);
        if (model_.hasAccuracy()) {
          accuracy = e.sum[kEvalCorrect] / e.sum[kEvalCount];
          line.add("test_accuracy", accuracy);
        }
      }
      out_.write(line);
      if (accuracy >= 0) {
        lastAccuracy_ = accuracy;
        bestAccuracy_ = std::max(bestAccuracy_, accuracy);
      }
      progress_.update(next_, e.sum[kLoss] / p, lastAccuracy_, e.leaderSeconds, e.sum[kHasEval] > 0);
      totalBytes_ += static_cast<uint64_t>(e.sum[kBytes]);
      totalMessages_ += static_cast<uint64_t>(e.sum[kMessages]);
      totalFailures_ += static_cast<int64_t>(e.sum[kFailed]);
      totalLost_ += static_cast<int64_t>(e.sum[kLostClocks]);
      maxGapSeen_ = std::max(maxGapSeen_, e.maxGap);
      entries_.erase(it);
      ++next_;
    }
  }

  int ranks_;
  MetricsWriter& out_;
  ProgressLine& progress_;
  const ops::Model& model_;
  uint64_t clocks_;
  uint64_t next_;
  std::map<uint64_t, Entry> entries_;
  uint64_t totalBytes_ = 0;
  uint64_t totalMessages_ = 0;
  int64_t totalFailures_ = 0;
  int64_t totalLost_ = 0;
  double maxGapSeen_ = 0;
  double lastAccuracy_ = -1.0;
  double bestAccuracy_ = -1.0;
};

}  // namespace

const ParamSet& Worker::run(MetricsWriter& metrics) {
  try {
    return runClocks(metrics);
  } catch (const JobFailed&) {
    // Every rank stops here together, the problem reported once: finish the traffic
    // already under way so the processes end cleanly, and write no more checkpoint.
    idle_ = nullptr;
    try {
      drain(clock_);
    } catch (const std::exception&) {
      // Stopping anyway.
    }
    if (log_) log_->abandon();
    throw;
  }
}

const ParamSet& Worker::runClocks(MetricsWriter& metrics) {
  const bool leader = transport_.rank() == 0;
  const uint64_t clocks = static_cast<uint64_t>(config_.clocks);
  // A resumed job continues at clock_ + 1 with the sampler where it was.
  const uint64_t first = clock_ + 1;
  data::MinibatchSampler sampler(train_.size(), config_.batch, config_.seed, transport_.rank());
  for (uint64_t c = 1; c < first; ++c) sampler.next();
  data::PrefetchQueue queue(train_, std::move(sampler), 2,
                            std::chrono::milliseconds(static_cast<int64_t>(config_.timeoutSeconds * 1000)));
  ProgressLine progress(leader ? config_.progress : "off", clocks);
  MetricsAggregator aggregator(transport_.size(), metrics, progress, model_, first, clocks);
  const auto collect = [&] {
    while (auto m = transport_.control().tryReceive()) {
      ORPHEUS_ENFORCE(m->bytes.size() == sizeof(ClockRecord), "metrics record of {} bytes from rank {}",
                      m->bytes.size(), m->peer);
      ClockRecord r;
      std::memcpy(r.data(), m->bytes.data(), sizeof(ClockRecord));
      aggregator.add(r);
    }
  };
  if (leader) idle_ = collect;

  // The starting point, so a run's progress can be read as a ratio.
  EvalResult initialEval;
  if (test_ != nullptr) initialEval = evaluate();

  double trainSeconds = 0.0;
  uint64_t last = clocks;
  bool stoppedAtTarget = false;
  for (uint64_t clock = first; clock <= clocks; ++clock) {
    const auto start = Clock::now();
    const double ckptWaitBefore = checkpointWaitSeconds();
    const data::Batch batch = queue.next();
    const ClockStats stats = runClock(clock, batch);
    const uint64_t bytesBefore = transport_.counters().bytesSent;
    const Coordination coordination = coordinate(clock);
    const uint64_t coordinationBytes = transport_.counters().bytesSent - bytesBefore;  // averaging, rotation
    if (log_) log_->endClock(clock);
    if (config_.ckptMatrix && clock % static_cast<uint64_t>(config_.ckptEvery) == 0) {
      collectively(transport_, [&] { writeMatrixCheckpoint(clock); });
    }
    // A checkpoint that cannot be written (a full disk) stops the job: the ranks
    // agree on it every kLogCheckEvery clocks, so it is reported once.
    if (log_ && clock % kLogCheckEvery == 0) collectively(transport_, [&] { log_->check(); });
    uint64_t lost = 0;
    const bool failed = maybeFail(clock, &lost);
    const double clockSeconds = secondsSince(start);
    trainSeconds += clockSeconds;

    ClockRecord r{};
    r[kClock] = static_cast<double>(clock);
    r[kSeconds] = leader ? trainSeconds : 0.0;
    r[kLoss] = stats.loss;
    r[kBytes] = static_cast<double>(stats.bytesSent + coordinationBytes);
    r[kMessages] = static_cast<double>(stats.messages);
    r[kCompute] = stats.computeSeconds;
    r[kComm] = stats.commSeconds;
    r[kUpdate] = stats.updateSeconds;
    r[kWait] = stats.waitSeconds;
    r[kSelect] = stats.selectSeconds;
    r[kClockSeconds] = clockSeconds;
    r[kGap] = static_cast<double>(stats.clockGap);
    r[kCkptWait] = checkpointWaitSeconds() - ckptWaitBefore;
    r[kFailed] = failed ? 1.0 : 0.0;
    r[kLostClocks] = static_cast<double>(lost);
    if (leader) {
      r[kReplica] = replicaId_;
      r[kAveraged] = coordination.averaged ? 1.0 : 0.0;
      r[kRotated] = coordination.rotated ? 1.0 : 0.0;
      r[kDivergenceMax] = coordination.divergenceMax;
      r[kDivergenceMean] = coordination.divergenceMean;
    }
    const bool evalClock =
        clock == clocks || (config_.evalEvery > 0 && clock % static_cast<uint64_t>(config_.evalEvery) == 0);
    bool reachedTarget = false;
    if (evalClock && test_ != nullptr) {
      // Each rank scores its own replica on its own test shard: no collective here,
      // unless the job stops at a target accuracy, which all ranks must agree on.
      const ops::EvalSums sums = evaluateLocal();
      r[kHasEval] = 1.0;
      r[kEvalLoss] = sums.lossSum;
      r[kEvalCorrect] = sums.correct;
      r[kEvalCount] = sums.count;
      if (config_.targetAccuracy > 0.0) {
        double v[2] = {sums.correct, sums.count};
        transport_.control().sum(v);
        reachedTarget = v[1] > 0 && v[0] / v[1] >= config_.targetAccuracy;
      }
    }
    if (reachedTarget) {
      last = clock;
      stoppedAtTarget = true;
      if (leader) aggregator.endAt(clock);
    }
    if (leader) {
      aggregator.add(r);
      collect();
    } else {
      transport_.control().send(0, encodeRecord(r));
    }
    if (reachedTarget) break;
  }

  // Every batch addressed here applied, every send and metrics record delivered.
  lastClock_ = last;
  current_ = last;
  drain(last);
  if (log_) collectively(transport_, [&] { log_->flush(); });
  if (leader) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(config_.timeoutSeconds * 1000));
    while (!aggregator.done()) {
      collect();
      if (Clock::now() > deadline) throw TimeoutError("rank 0 timed out collecting the last clocks' metrics");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  } else {
    transport_.control().flush();
  }
  idle_ = nullptr;
  progress.finish();

  if (test_ != nullptr) lastEval_ = evaluate();
  trainSeconds_ = trainSeconds;
  if (leader) {
    JsonLine summary;
    summary.add("summary", true)
        .add("clocks", last)
        .add("clocks_planned", config_.clocks)
        .add("reached_target", stoppedAtTarget)
        .add("ranks", transport_.size())
        .add("sync", toString(config_.sync))
        .add("model", model_.spec())
        .add("batch_per_rank", config_.batch)
        .add("select", config_.select)
        .add("multicast", comm::multicastName(config_.multicast))
        .add("fanout", schedule_.fanout())
        .add("consistency", toString(config_.consistency))
        .add("staleness", config_.staleness)
        .add("drop_links", config_.dropLinks)
        .add("seconds", trainSeconds)
        .add("bytes_sent", aggregator.totalBytes())
        .add("messages", aggregator.totalMessages())
        .add("bytes_per_clock", static_cast<double>(aggregator.totalBytes()) / static_cast<double>(std::max<uint64_t>(1, last + 1 - first)))
        .add("max_clock_gap", static_cast<int64_t>(aggregator.maxGap()))
        .add("average_every", config_.averageEvery)
        .add("rotate_every", config_.rotateEvery)
        .add("failures", aggregator.totalFailures())
        .add("lost_clocks", aggregator.totalLostClocks())
        .add("replica", static_cast<int64_t>(replicaId_));
    if (test_ != nullptr) {
      summary.add("initial_test_loss", initialEval.loss);
      summary.add("test_loss", lastEval_.loss);
      if (model_.hasAccuracy()) {
        summary.add("test_accuracy", lastEval_.accuracy);
        summary.add("best_test_accuracy", std::max(aggregator.bestAccuracy(), lastEval_.accuracy));
      }
    }
    metrics.write(summary);
  }
  return replica_;
}

}  // namespace orpheus::engine
