// `orpheus simulate`: P workers of a training job in one process, running the real
// clock loop (engine::Worker: selection, multicast schedules, BSP/SSP, the
// coordinator, the rebuild) as threads over the loopback transport, placed on a
// virtual clock whose communication times come from a network model
// (engine/sim/network_model.h) and whose computation times are measured per
// clock as thread CPU time (or given), stretched where workers share a host's
// cores (engine/sim/cpu_share.h). Writes the same metrics lines as `train`,
// with simulated seconds, and a summary with the simulation's own measures.
//
// Memory: one copy of the data in all (each rank's shard is its part of it, read
// once for IDX files), a replica, a model and two small-stack threads per worker
// (the worker's and its prefetcher's), and at most --sim-threads workers doing a
// clock's work at any time (comm/run_gate.h), so the buffers of a clock
// (an allgather's P batches, their decoded copies) exist for those few only.
//
// Under SSP the replicas apply batches in the order of their virtual arrival
// (engine/sim/virtual_delivery.h), so with --sim-compute-ms a run is repeatable.
// Checkpoints and failure injection are refused. Membership changes
// (--sim-membership) are planned: engine/sim/membership_plan.h, sim_ranks.h.
#pragma once

#include "engine/base/params.h"
#include "engine/config.h"
#include "engine/sim/cpu_share.h"
#include "engine/sim/membership_plan.h"
#include "engine/sim/network_model.h"

#include <functional>

namespace orpheus::engine::sim {

struct SimConfig {
  int ranks = 4;
  NetworkModel network;
  double computeMs = 0.0;  // > 0: every clock computes this long (on a core of its own); 0: as measured
  CpuShare cpu;            // the simulated hosts' cores, shared by their workers
  Stragglers slow;         // workers that compute longer than the rest
  int threads = 0;         // workers running at once; 0: the machine's cores
  MembershipPlan membership;  // --sim-membership: changes at clock boundaries (none: empty)
  // Tests: told on each rank's thread at a membership change after `clock`, the
  // replica old rank `rank` held there (`before`), then the replica each rank of
  // the new epoch starts from (!before).
  std::function<void(uint64_t clock, int rank, bool before, const ParamSet& replica)> onChange;
};

// Stack of each thread the simulation starts (the workers and their prefetchers).
inline constexpr size_t kSimThreadStack = size_t{1} << 20;

// Runs the job; returns the exit code. Bad input throws InputError before any
// worker starts; a failure inside a worker is reported once and ends the process.
int runSimulation(const TrainConfig& config, const SimConfig& sim);

}  // namespace orpheus::engine::sim
