// What a rank keeps so that a lost replica can come back, and the failures that
// lose it.
//
// The clock loop's log (ckpt/clock_log.h) is made in ckpt from plain options;
// clockLogOptions and makeClockLog here bind it to the job's flags, in one place:
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
#include <utility>
#include <string>
#include <vector>

namespace orpheus::engine {

using ckpt::ClockLog;

// The log's options for the job's flags, at rank `rank` of `ranks` holding replica `replicaId` first.
ckpt::ClockLogOptions clockLogOptions(const TrainConfig& config, int rank, int ranks, int replicaId,
                                      const ops::Model& model);
// --ckpt sv: the log over ckpt::SvLogWriter; otherwise a log that does nothing.
// A received batch's reference names the selection C of `knobs` when it is logged.
// With `rankState` (what the rank carries beyond its replica: a sequence model's
// recurrent states, --sv-rank's error feedback; Worker::rankState), the log also
// writes it at every clock a segment of its log ends at (the clocks a resume may
// start from: ckpt/layout.h, states-<clock>). Its collectives run over `transport`.
std::unique_ptr<ClockLog> makeClockLog(const TrainConfig& config, comm::Transport& transport, int replicaId,
                                       const adapt::Knobs& knobs, const ops::Model& model,
                                       std::function<ParamSet()> rankState = {});

// What recovery does, from the job's flags (recoveryOptions).
struct RecoveryOptions {
  std::string dir;             // --ckpt-dir
  bool sv = false;             // --ckpt sv: recover from the SV log and the snapshots
  bool matrix = false;         // --ckpt matrix
  int64_t matrixEvery = 1;     // --ckpt-every
  double failProb = 0.0;       // --fail-prob
  uint64_t seed = 0;           // the job seed (W0, the failures' draws)
};
RecoveryOptions recoveryOptions(const TrainConfig& config);

class Recovery {
 public:
  // All references must outlive the recovery.
  Recovery(RecoveryOptions options, const ops::Model& model, comm::Transport& transport)
      : options_(std::move(options)), model_(model), transport_(transport) {}

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
  RecoveryOptions options_;
  const ops::Model& model_;
  comm::Transport& transport_;
  ParamSet matrixCheckpoint_;  // --ckpt matrix: the last one written
  ParamSet matrixCheckpointState_;  // its optimizer state (Optimizer::exportState())
  uint64_t matrixCheckpointClock_ = 0;
  int64_t failures_ = 0;
  uint64_t lostClocks_ = 0;
};

}  // namespace orpheus::engine
