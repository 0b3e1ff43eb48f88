// restore(T): any replica's parameters at any past clock, rebuilt from the
// incremental SV log (ckpt/sv_log.h) and the last snapshot at or before T.
#pragma once

#include "ckpt/sv_log.h"
#include "engine/config.h"
#include "ops/model.h"

#include <memory>
#include <string>

namespace orpheus::engine {

// The model a checkpoint was written for.
std::unique_ptr<ops::Model> modelOfJob(const ckpt::JobInfo& job);

struct Restored {
  ParamSet params;
  uint64_t clock = 0;
  int replica = 0;
  uint64_t fromSnapshot = 0;  // 0: replayed from W0
  size_t groupsReplayed = 0;
};

// Replica `replica` at the end of its local clock `clock` (0 means the latest clock
// the log reaches). Bitwise what the replica held: the same groups are applied in
// the same order with the same rebuild, and a reset event (a failure) puts back the
// state it names, as the failed holder did. InputError naming the problem (clock
// past the log, a clock a failure lost, damaged segment, averaging without a snapshot).
Restored restore(const std::string& dir, int replica, uint64_t clock);
// The same for a model at hand (recovery inside a job): `seed` gives W0.
Restored restore(const std::string& dir, const ops::Model& model, uint64_t seed, int replica, uint64_t clock);

// The newest clock a killed job can resume from: the last clock all replicas'
// logs reach and end a segment at.
uint64_t resumableClock(const ckpt::Inventory& inventory);

// Prepares `dir` for resuming at `clock`: sets aside segments and snapshots past it
// (renamed *.discarded) so the resumed job's log continues cleanly.
void discardAfter(const std::string& dir, uint64_t clock);

// The replica rank `rank` holds after `clock` clocks of a job with rotation every
// `rotateEvery` clocks (0: never) on `ranks` ranks.
int replicaHeldAt(int rank, int ranks, uint64_t clock, int64_t rotateEvery);

}  // namespace orpheus::engine
