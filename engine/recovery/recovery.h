// What a rank keeps so that a lost replica can come back, and the failures that
// lose it.
//
// makeClockLog binds the clock loop's log (ckpt/clock_log.h) to the job's flags:
// with --ckpt sv off it is a log that does nothing, so the clock loop never asks
// whether there is one.
//
// Recovery is the rest: --ckpt matrix, the baseline that halts computation while
// every replica is written whole, and --fail-prob, which makes a rank lose its
// replica and bring it back from whichever checkpoint the job keeps.
#pragma once

#include "ckpt/clock_log.h"
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

using ckpt::ClockLog;

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
