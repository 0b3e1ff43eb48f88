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
#include <functional>
#include <utility>

namespace orpheus::engine {
ckpt::ClockLogOptions clockLogOptions(const TrainConfig& config, int rank, int ranks, int replicaId,
                                      const ops::Model& model) {
  ckpt::ClockLogOptions o;
  o.enabled = config.ckptSv;
  o.dir = config.ckptDir;
  o.replica = replicaId;
  o.rank = rank;
  o.ranks = ranks;
  o.format = config.ckptFormat;
  // A received batch is a reference into its sender's log where a replay can
  // recompute it from there: not after --fail-prob (staged batches are lost), nor
  // with --sv-rank (its batches are no selection a replay recomputes), nor with
  // --sv-dtype bf16 or --adapt-bf16 (a selection is rounded after it is made).
  o.references = config.ckptFormat >= ckpt::kSegmentVersion && config.failProb == 0.0 && config.svRank == 0 &&
                 config.svDtype == SvDtype::kF32 && !config.adaptBf16;
  o.writerIdle = config.ckptWriterIdle;
  o.snapshotEvery = config.snapshotEvery;
  o.selectMethod = static_cast<uint32_t>(config.selectMethod);
  o.modelSpec = model.spec();
  return o;
}

std::unique_ptr<ClockLog> makeClockLog(const TrainConfig& config, comm::Transport& transport, int replicaId,
                                       const adapt::Knobs& knobs, const ops::Model& model,
                                       std::function<ParamSet()> rankState) {
  ckpt::ClockLogHooks hooks;
  hooks.collectively = [&transport](const std::function<void()>& step) { collectively(transport, step); };
  hooks.select = [&knobs] { return static_cast<int32_t>(knobs.select); };  // C as it is when a batch is logged
  hooks.carriedState = std::move(rankState);
  return ckpt::makeClockLog(clockLogOptions(config, transport.rank(), transport.size(), replicaId, model),
                            std::move(hooks));
}

RecoveryOptions recoveryOptions(const TrainConfig& config) {
  RecoveryOptions o;
  o.dir = config.ckptDir;
  o.sv = config.ckptSv;
  o.matrix = config.ckptMatrix;
  o.matrixEvery = config.ckptEvery;
  o.failProb = config.failProb;
  o.seed = config.seed;
  return o;
}

void Recovery::checkpoint(uint64_t clock, ParamSet& replica, ReplicaUpdater& updater, int replicaId) {
  if (!options_.matrix || clock % static_cast<uint64_t>(options_.matrixEvery) != 0) return;
  updater.settle(replica);
  collectively(transport_, [&] {
    // The baseline of the paper: computation halts while the whole replica is written.
    ckpt::ModelFileInfo info;
    info.modelSpec = model_.spec();
    info.modelDigest = model_.textDigest();
    info.clock = static_cast<int64_t>(clock);
    info.seed = options_.seed;
    info.replica = replicaId;
    const std::filesystem::path dir = ckpt::matrixDir(options_.dir, clock);
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
  if (options_.failProb <= 0.0) return {};
  CounterRng rng(options_.seed, RngPurpose::kFailure, clock, static_cast<uint64_t>(transport_.rank()));
  if (rng.uniform() >= options_.failProb) return {};
  ++failures_;
  uint64_t recovered = 0;
  updater.discardPending();
  updater.toHost(replica);
  // A replica back at W0 has a fresh optimizer.
  const ParamSet freshState = Optimizer(updater.optimizer().settings(), model_.zeroParams()).exportState();
  if (options_.sv) {
    // The process is gone: its replica and what it had only staged of the log. What
    // is durable is the log on disk and the snapshots; the replica comes back at the
    // newest clock they reach, and the log records the reset.
    recovered = log.loseStaged();
    if (recovered == 0) {
      replica = model_.initParams(options_.seed);
      updater.optimizer().importState(freshState);
    } else {
      Restored r = restore(options_.dir, model_, options_.seed, updater.optimizer().settings(), replicaId, recovered,
                           updater.backend());
      replica = std::move(r.params);
      updater.optimizer().importState(r.optimizerState);
    }
    log.recordReset(clock, recovered);
  } else if (options_.matrix) {
    // Back to the last whole-matrix checkpoint: the clocks since are lost.
    replica = matrixCheckpointClock_ > 0 ? matrixCheckpoint_ : model_.initParams(options_.seed);
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
