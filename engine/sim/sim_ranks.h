// The simulated workers: each a thread running the real clock loop over the
// loopback transport, traced onto the virtual clock (engine/sim/rank_tracer.h), at
// most `threads` of them doing a clock's work at once (comm/run_gate.h).
//
// Membership changes (--sim-membership, engine/sim/membership_plan.h) go as in a
// live job (engine/job/job.cc), over the loopback live group comm/factory.h makes:
// at the planned clock C every worker's run() returns with clock C drained; the
// old group averages its replicas and optimizer states (Worker::averageReplicas:
// bitwise the same on every rank, in memory); rank 0 keeps the average for the
// ranks that join, recuts the data for the new number of ranks and moves the
// trace to it (Trace::regroup: the virtual clock goes on); the group splits
// (the highest-numbered ranks leave, their threads end) or grows (new threads);
// and every rank of the new epoch starts clock C+1 from the average.
#pragma once

#include "comm/run_gate.h"
#include "comm/schedule.h"
#include "engine/base/params.h"
#include "engine/config.h"
#include "engine/sim/sim_shards.h"
#include "engine/sim/simulation.h"
#include "engine/sim/trace.h"
#include "engine/worker/worker.h"
#include "ops/model.h"

#include <chrono>
#include <memory>
#include <vector>

namespace orpheus::engine::sim {

// What one worker of the final membership finished with.
struct Finished {
  ParamSet replica;
  int replicaId = 0;
  EvalResult eval;
  uint64_t lastClock = 0;
  bool reachedTarget = false;
};

struct RankRun {
  const TrainConfig& config;
  const SimConfig& sim;
  // Model r serves rank r of every epoch: as many as the most ranks of any epoch.
  const std::vector<std::unique_ptr<ops::Model>>& models;
  Trace& trace;
  std::shared_ptr<comm::RunGate> gate;  // the loopback group's
  ArrivalBook* book;  // SSP: virtual-time order (no membership changes then); else null
  const comm::MulticastSchedule* schedule;  // with `book`
  std::chrono::milliseconds timeout;
};

// Runs every worker from clock 1 on `shards` (sim.ranks of them) to the end of the
// job, through the planned membership changes; what the final group finished
// with, by rank. A failure inside a worker is reported once and ends the process.
std::vector<Finished> runRanks(const RankRun& run, Shards shards);

}  // namespace orpheus::engine::sim
