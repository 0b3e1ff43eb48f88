#include "engine/recovery/recovery.h"

#include "ckpt/layout.h"
#include "ckpt/model_file.h"
#include "engine/base/error.h"
#include "engine/base/rng.h"
#include "engine/recovery/checkpoint.h"
#include "engine/failures.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <malloc.h>

namespace orpheus::engine {
namespace {

// Clocks between the ranks' agreements on the checkpoint writers' health.
constexpr uint64_t kLogCheckEvery = 50;

class NullClockLog final : public ClockLog {
 public:
  bool keepsRecords() const override { return false; }
  void appendGroup(uint64_t, std::vector<ckpt::Record>) override {}
  ckpt::Record received(const SvBatchHeader&, ckpt::Record copy) const override { return copy; }
  void endClock(uint64_t) override {}
  void knobs(uint64_t, std::span<const std::byte>) override {}
  void averaged(uint64_t, const ParamSet&) override {}
  void handOff(uint64_t) override {}
  void takeOver(uint64_t, int) override {}
  void flush() override {}
  void resumeAt(int, uint64_t) override {}
  void rejoin(uint64_t, const ParamSet*) override {}
  void abandon() override {}
  uint64_t loseStaged() override { return 0; }
  void recordReset(uint64_t, uint64_t) override {}
  double waitSeconds() const override { return 0.0; }
  double writerCpuSeconds() const override { return 0.0; }
};

class SvClockLog final : public ClockLog {
 public:
  SvClockLog(const TrainConfig& config, comm::Transport& transport, int replicaId, const adapt::Knobs& knobs,
             const ops::Model& model)
      : config_(config),
        transport_(transport),
        knobs_(knobs),
        model_(model),
        // A received batch is a reference into its sender's log where a replay can
        // recompute it from there: not after --fail-prob (staged batches are lost), nor
        // with --sv-rank (its batches are no selection a replay recomputes), nor with
        // --sv-dtype bf16 (a selection is rounded after it is made).
        references_(config.ckptFormat >= ckpt::kSegmentVersion && config.failProb == 0.0 && config.svRank == 0 &&
                    config.svDtype == SvDtype::kF32),
        writer_(config.ckptDir, replicaId, size_t{256} << 20, 50, writerOptions(config, references_)) {}

  bool keepsRecords() const override { return !references_; }
  void appendGroup(uint64_t clock, std::vector<ckpt::Record> records) override {
    writer_.appendGroup(clock, std::move(records));
  }
  ckpt::Record received(const SvBatchHeader& header, ckpt::Record copy) const override {
    if (!references_) return copy;
    ckpt::BatchRef ref;
    ref.replica = header.replica;
    ref.sender = header.sender;
    ref.clock = header.clock;
    ref.select = static_cast<int32_t>(knobs_.select);
    ref.method = static_cast<uint32_t>(config_.selectMethod);
    return ckpt::Record::reference(ref);
  }
  void endClock(uint64_t clock) override {
    writer_.endClock(clock);
    lastEnded_ = clock;
    if (writer_.segmentEndsAtLastClock()) writeCarriedState(clock);
    if (clock % kLogCheckEvery == 0) collectively(transport_, [&] { writer_.check(); });
  }
  void knobs(uint64_t clock, std::span<const std::byte> record) override { writer_.appendKnobs(clock, record); }
  void averaged(uint64_t clock, const ParamSet& replica) override {
    ++averagings_;
    writer_.appendEvent(clock, ckpt::EventKind::kAveraged);
    if (averagings_ % std::max<int64_t>(config_.snapshotEvery, 1) != 0) return;
    // Every part is on disk once all ranks pass here: the snapshot is complete.
    collectively(transport_, [&] {
      ckpt::writeSnapshotPart(config_.ckptDir, clock, transport_.rank(), transport_.size(), replica);
    });
    lastSnapshot_ = clock;
  }
  void handOff(uint64_t clock) override {
    writeCarriedState(clock);
    writer_.appendEvent(clock, ckpt::EventKind::kRotatedOut);
    const auto start = std::chrono::steady_clock::now();
    collectively(transport_, [&] { writer_.flush(); });
    handOffSeconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  void takeOver(uint64_t clock, int id) override {
    writer_.switchReplica(id);
    writer_.appendEvent(clock, ckpt::EventKind::kRotatedIn);
  }
  void flush() override {
    if (lastEnded_ > 0) writeCarriedState(lastEnded_);
    collectively(transport_, [&] { writer_.flush(); });
  }
  void resumeAt(int id, uint64_t clock) override {
    writer_.resumeAt(id, clock);
    lastEnded_ = clock;
    statesWritten_ = clock;  // the resumed job read them
  }
  void rejoin(uint64_t clock, const ParamSet* snapshot) override {
    // As a rotation's new holder does: a segment that starts at the change clock.
    writer_.switchReplica(writer_.replica());
    writer_.appendEvent(clock, ckpt::EventKind::kAveraged);
    collectively(transport_, [&] {
      if (snapshot != nullptr) {
        ckpt::writeSnapshotPart(config_.ckptDir, clock, transport_.rank(), transport_.size(), *snapshot);
      }
    });
    lastSnapshot_ = clock;
  }
  void abandon() override { writer_.abandon(); }
  uint64_t loseStaged() override {
    logEnd_ = writer_.discardStaged();
    return std::max(logEnd_, lastSnapshot_);
  }
  void recordReset(uint64_t clock, uint64_t to) override {
    // Unless the log on disk reaches this very clock, its entries since its end
    // are gone: the reset says where the replica stands.
    if (logEnd_ < clock) writer_.appendReset(clock, to);
  }
  double waitSeconds() const override { return writer_.waitSeconds() + handOffSeconds_; }
  double writerCpuSeconds() const override { return writer_.cpuSeconds(); }

 private:
  static ckpt::WriterOptions writerOptions(const TrainConfig& config, bool references) {
    ckpt::WriterOptions o;
    o.version = references ? ckpt::kSegmentVersion : std::min<int64_t>(config.ckptFormat, ckpt::kSegmentVersion);
    o.idle = config.ckptWriterIdle;
    return o;
  }

  // Before the segment that ends at `clock` can be durable (it closes when a later
  // clock begins, or in handOff or flush after this), so a resumable clock has its
  // states on disk unless the write failed, which stops the job.
  void writeCarriedState(uint64_t clock) {
    if (!model_.carriesState() || clock == statesWritten_) return;
    const std::string path = ckpt::statesPath(config_.ckptDir, clock, transport_.rank()).string();
    std::error_code ec;
    std::filesystem::create_directories(ckpt::statesDir(config_.ckptDir, clock), ec);
    if (ec) throw IoError(fmt::format("cannot create '{}': {}", ckpt::statesDir(config_.ckptDir, clock).string(),
                                      ec.message()));
    ckpt::ModelFileInfo info;
    info.modelSpec = model_.spec();
    info.clock = static_cast<int64_t>(clock);
    info.replica = transport_.rank();
    ckpt::saveParams(path, model_.carriedState(), info);
    statesWritten_ = clock;
  }

  const TrainConfig& config_;
  comm::Transport& transport_;
  const adapt::Knobs& knobs_;  // C as it is when a received batch is logged
  const ops::Model& model_;
  // Received batches are logged as references to their senders' logs (else as copies).
  bool references_;
  ckpt::SvLogWriter writer_;
  int64_t averagings_ = 0;
  uint64_t lastSnapshot_ = 0;  // the newest snapshot known complete on disk
  uint64_t logEnd_ = 0;        // where the log on disk ended at the last failure
  double handOffSeconds_ = 0.0;
  uint64_t lastEnded_ = 0;      // the clock endClock was last given
  uint64_t statesWritten_ = 0;  // the newest clock whose carried state is on disk
};

}  // namespace

std::unique_ptr<ClockLog> makeClockLog(const TrainConfig& config, comm::Transport& transport, int replicaId,
                                       const adapt::Knobs& knobs, const ops::Model& model) {
  if (!config.ckptSv) return std::make_unique<NullClockLog>();
  // The log's IO thread frees each clock's batches once it has copied them, a
  // little after the clock. Keep freed memory in the heap for the next clock's
  // batches rather than handing it back to the system and faulting it in again.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  return std::make_unique<SvClockLog>(config, transport, replicaId, knobs, model);
}

void Recovery::checkpoint(uint64_t clock, ParamSet& replica, ReplicaUpdater& updater, int replicaId) {
  if (!config_.ckptMatrix || clock % static_cast<uint64_t>(config_.ckptEvery) != 0) return;
  updater.settle(replica);
  collectively(transport_, [&] {
    // The baseline of the paper: computation halts while the whole replica is written.
    ckpt::ModelFileInfo info;
    info.modelSpec = model_.spec();
    info.clock = static_cast<int64_t>(clock);
    info.seed = config_.seed;
    info.replica = replicaId;
    const std::filesystem::path dir = ckpt::matrixDir(config_.ckptDir, clock);
    createDirectories(dir.string(), "");
    matrixCheckpointState_ = updater.optimizer().exportState();
    ckpt::saveParams((dir / fmt::format("replica-{}.h5", replicaId)).string(),
                     withState(replica, matrixCheckpointState_), info);
    matrixCheckpoint_ = replica;
    matrixCheckpointClock_ = clock;
  });
}

Recovery::Failure Recovery::maybeFail(uint64_t clock, ParamSet& replica, ReplicaUpdater& updater, int replicaId,
                                      ClockLog& log) {
  if (config_.failProb <= 0.0) return {};
  CounterRng rng(config_.seed, RngPurpose::kFailure, clock, static_cast<uint64_t>(transport_.rank()));
  if (rng.uniform() >= config_.failProb) return {};
  ++failures_;
  uint64_t recovered = 0;
  updater.discardPending();
  updater.toHost(replica);
  // A replica back at W0 has a fresh optimizer.
  const ParamSet freshState = Optimizer(updater.optimizer().settings(), model_.zeroParams()).exportState();
  if (config_.ckptSv) {
    // The process is gone: its replica and what it had only staged of the log. What
    // is durable is the log on disk and the snapshots; the replica comes back at the
    // newest clock they reach, and the log records the reset.
    recovered = log.loseStaged();
    if (recovered == 0) {
      replica = model_.initParams(config_.seed);
      updater.optimizer().importState(freshState);
    } else {
      Restored r = restore(config_.ckptDir, model_, config_.seed, updater.optimizer().settings(), replicaId, recovered,
                           updater.backend());
      replica = std::move(r.params);
      updater.optimizer().importState(r.optimizerState);
    }
    log.recordReset(clock, recovered);
  } else if (config_.ckptMatrix) {
    // Back to the last whole-matrix checkpoint: the clocks since are lost.
    replica = matrixCheckpointClock_ > 0 ? matrixCheckpoint_ : model_.initParams(config_.seed);
    updater.optimizer().importState(matrixCheckpointClock_ > 0 ? matrixCheckpointState_ : freshState);
    recovered = matrixCheckpointClock_;
  }
  updater.hostChanged();
  Failure failure{true, clock - recovered};
  lostClocks_ += failure.lostClocks;
  spdlog::debug("rank {} failed at clock {}: replica {} recovered at clock {} ({} clocks lost)", transport_.rank(),
                clock, replicaId, recovered, failure.lostClocks);
  return failure;
}

}  // namespace orpheus::engine
