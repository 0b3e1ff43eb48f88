// What a rank keeps so that a lost replica can come back, and the failures that
// lose it.
//
// ClockLog is the incremental SV checkpoint (paper, section 3.3) as the clock loop
// sees it: every group of batches applied to the replica, and the events around
// them (averaging, rotation, failure). With --ckpt sv off it is a log that does
// nothing, so the clock loop never asks whether there is one.
//
// Recovery is the rest: --ckpt matrix, the baseline that halts computation while
// every replica is written whole, and --fail-prob, which makes a rank lose its
// replica and bring it back from whichever checkpoint the job keeps.
#pragma once

#include "ckpt/sv_log.h"
#include "comm/transport.h"
#include "engine/adapt/knobs.h"
#include "engine/base/params.h"
#include "engine/config.h"
#include "engine/worker/optimizer.h"
#include "ops/model.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace orpheus::engine {

// Calls marked collective are made by every rank after the same clock.
class ClockLog {
 public:
  virtual ~ClockLog() = default;

  // Whether the log keeps what it is handed; when not, received bytes need not be kept for it.
  virtual bool keepsRecords() const = 0;
  // The batches applied to the replica together at local clock `clock`.
  virtual void appendGroup(uint64_t clock, std::vector<ckpt::Record> records) = 0;
  // The record of a batch another replica computed (`header`) and this one applied:
  // a reference into the sender's log, which holds the batch once (--ckpt-format
  // 3), or `copy` where a replay could not recompute it from there (--ckpt-format 2,
  // and --fail-prob: a failed sender loses the batches it had only staged, which
  // the receivers applied).
  virtual ckpt::Record received(const SvBatchHeader& header, ckpt::Record copy) const = 0;
  // The end of `clock`; every few clocks the ranks agree that every writer is
  // healthy, so a checkpoint that cannot be written (a full disk) stops the job
  // with one report (collective).
  virtual void endClock(uint64_t clock) = 0;
  // The coordinator set new knobs at the end of `clock` (--adapt): a kKnobs entry.
  virtual void knobs(uint64_t clock, std::span<const std::byte> record) = 0;
  // Every replica became the average at `clock`: a log event, and at every
  // --snapshot-every-th averaging a snapshot of `replica` (collective).
  virtual void averaged(uint64_t clock, const ParamSet& replica) = 0;
  // The replica leaves at `clock`: its log must be on disk up to there, since the
  // next holder continues it (collective).
  virtual void handOff(uint64_t clock) = 0;
  // Replica `id` arrived at `clock`: its log continues here.
  virtual void takeOver(uint64_t clock, int id) = 0;
  // Waits until everything is durable (collective).
  virtual void flush() = 0;
  // Continues replica `id`'s log, on disk up to `clock` (resume).
  virtual void resumeAt(int id, uint64_t clock) = 0;
  // After resumeAt: the membership changed at `clock` and the replica became the
  // average of the previous epoch's (engine/membership/elastic.h). The log marks it as an
  // averaging at `clock`, chained at that clock; `snapshot` (null: a usable one
  // exists) is written as this rank's part of the snapshot of `clock` (collective).
  virtual void rejoin(uint64_t clock, const ParamSet* snapshot) = 0;
  // The job stops: nothing more is written.
  virtual void abandon() = 0;
  // The process died: what was only staged is gone. Returns the newest clock the
  // log on disk and the snapshots reach (0: none).
  virtual uint64_t loseStaged() = 0;
  // After a failure at `clock` the replica was put back at `to`: the log says so,
  // unless what is on disk already reaches `clock`.
  virtual void recordReset(uint64_t clock, uint64_t to) = 0;
  // Seconds the compute thread has waited for the log, in all.
  virtual double waitSeconds() const = 0;
  // CPU seconds the log's IO thread has used, in all.
  virtual double writerCpuSeconds() const = 0;
};

// --ckpt sv: the log over ckpt::SvLogWriter; otherwise a log that does nothing.
// A received batch's reference names the selection C of `knobs` when it is logged.
// For a model that carries state (ops::Model::carriesState), the log also writes
// the rank's carried state at every clock a segment of its log ends at (the clocks
// a resume may start from: ckpt/layout.h, states-<clock>).
std::unique_ptr<ClockLog> makeClockLog(const TrainConfig& config, comm::Transport& transport, int replicaId,
                                       const adapt::Knobs& knobs, const ops::Model& model);

class Recovery {
 public:
  // All references must outlive the recovery.
  Recovery(const TrainConfig& config, const ops::Model& model, comm::Transport& transport)
      : config_(config), model_(model), transport_(transport) {}

  // --ckpt matrix: every --ckpt-every clocks, `replica` (its pending optimizer step
  // taken first) is written whole with its optimizer state and kept as what
  // recovery restores (collective).
  void checkpoint(uint64_t clock, ParamSet& replica, ReplicaUpdater& updater, int replicaId);

  struct Failure {
    bool failed = false;
    uint64_t lostClocks = 0;  // clocks of updates the replica lost
  };
  // --fail-prob: whether this rank fails at the end of `clock` (seeded by clock and
  // rank). A failed rank's replica comes back from the checkpoint: the SV log on
  // disk and the snapshots (--ckpt sv), or the last matrix (--ckpt matrix), with
  // its optimizer state; a pending optimizer step is lost with the process.
  Failure maybeFail(uint64_t clock, ParamSet& replica, ReplicaUpdater& updater, int replicaId, ClockLog& log);

  int64_t failures() const { return failures_; }
  uint64_t lostClocks() const { return lostClocks_; }

 private:
  const TrainConfig& config_;
  const ops::Model& model_;
  comm::Transport& transport_;
  ParamSet matrixCheckpoint_;  // --ckpt matrix: the last one written
  ParamSet matrixCheckpointState_;  // its optimizer state (Optimizer::exportState())
  uint64_t matrixCheckpointClock_ = 0;
  int64_t failures_ = 0;
  uint64_t lostClocks_ = 0;
};

}  // namespace orpheus::engine
