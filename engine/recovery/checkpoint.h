// restore(T): any replica's parameters at any past clock, rebuilt from the
// incremental SV log (ckpt/sv_log.h) and the last snapshot at or before T.
#pragma once

#include "ckpt/restorable.h"
#include "ckpt/sv_log.h"
#include "engine/config.h"
#include "engine/worker/optimizer.h"
#include "ops/model.h"

#include <memory>
#include <string>

namespace orpheus::engine {

// The model a checkpoint was written for.
std::unique_ptr<ops::Model> modelOfJob(const ckpt::JobInfo& job);

// The outer step's state (--outer-lr) from the snapshot a replay started at: the
// anchor (its parameters) and the momentum; empty when it started from W0.
struct OuterState {
  ParamSet anchor;
  ParamSet momentum;
};

struct Restored {
  ParamSet params;
  ParamSet optimizerState;  // Optimizer::exportState(): empty for sgd
  OuterState outer;
  uint64_t clock = 0;
  int replica = 0;
  uint64_t fromSnapshot = 0;  // 0: replayed from W0
  size_t groupsReplayed = 0;
};

// A checkpoint directory as `orpheus inspect` shows it: what it holds, and what is
// restorable (ckpt/restorable.h; snapshots checked against the job's model).
// InputError "'DIR' is not a checkpoint directory (no job.h5)" for anything else.
struct CheckpointView {
  ckpt::Inventory inventory;
  ckpt::Restorability restorable;
};
CheckpointView inspectCheckpoint(const std::string& dir);

// Replica `replica` at the end of its local clock `clock` (0 means the newest
// restorable clock). Bitwise what the replica held: the same groups are applied in
// the same order with the same rebuild and the same optimizer steps (the job's
// optimizer, recorded in job.h5), and a reset event (a failure) puts back the
// state it names, as the failed holder did. Snapshots hold the optimizer state. Exactly the clocks ckpt/restorable.h
// calls restorable restore; any other is an InputError that says why (the damaged
// or missing segment, the unusable snapshot part, the failure, the end of the log)
// and lists the restorable clocks.
// The rebuilds run on `backend` (a job's own, or `restore --device`'s): bitwise
// what the replica held when it is the backend the job trained on.
Restored restore(const std::string& dir, int replica, uint64_t clock, ops::Backend& backend);
// The same for a model at hand (recovery inside a job): `seed` gives W0, `settings` the optimizer.
Restored restore(const std::string& dir, const ops::Model& model, uint64_t seed, const OptimizerSettings& settings,
                 int replica, uint64_t clock, ops::Backend& backend);

// The newest clock a killed job can resume from: one that every replica's log ends a
// segment at and that is restorable for every replica (ckpt/restorable.h); 0 when
// there is none. For a model that carries state (`carriedStateRanks` > 0 ranks), also
// one whose carried state every rank wrote (DIR/states-<clock>, ckpt/layout.h).
uint64_t resumableClock(const ckpt::Inventory& inventory);
// The same over the current members' replicas only, ids 0..members-1 (replicas an
// earlier membership epoch held end where it ended; engine/membership/elastic.h); -1: all.
uint64_t resumableClock(const std::string& dir, const ckpt::Inventory& inventory, int carriedStateRanks, int members);

// Rank `rank`'s carried state after `clock` (ops::Model::restoreCarriedState);
// InputError naming the file when it is missing or unreadable.
ParamSet loadCarriedState(const std::string& dir, uint64_t clock, int rank);

// Prepares `dir` for resuming at `clock`: sets aside damaged segments, and segments,
// snapshots and carried states past it (renamed *.discarded) so the resumed job's
// log continues cleanly.
void discardAfter(const std::string& dir, uint64_t clock);

// The replica rank `rank` holds after `clock` clocks of a job with rotation every
// `rotateEvery` clocks (0: never) on `ranks` ranks.
int replicaHeldAt(int rank, int ranks, uint64_t clock, int64_t rotateEvery);

}  // namespace orpheus::engine
