// One function per subcommand of `orpheus` (engine/cli/main.cc parses the command
// line and calls it): each returns the process's exit code (engine/failures.h) or
// throws an exception the entry point turns into one line and that code.
#pragma once

#include "engine/config.h"
#include "engine/sim/simulation.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace orpheus::engine::cli {

// `orpheus train`, one rank of the job (launched by mpirun). `joinAfter`: this
// process was spawned to join a running job after that clock (engine/membership/live.h;
// `argv` carries the marker).
int trainMain(TrainConfig& config, const std::vector<std::string>& argv, std::optional<uint64_t> joinAfter);
// `orpheus simulate`: P workers in this process on a virtual clock.
int simulateMain(TrainConfig& config, sim::SimConfig& sim, double latencyUs);

struct RestoreArgs {
  std::string dir;
  std::string clock = "latest";
  int replica = 0;
  std::string out;
  std::string device = "cpu";
  std::string configFile;  // --config, if the flags came from one: never replaced by --out
};
// `orpheus restore`: a replica's parameters at a past clock, from a checkpoint.
int restoreMain(const RestoreArgs& a);
// `orpheus inspect DIR`: a checkpoint's replicas, clocks, snapshots, bytes and damage.
int inspectMain(const std::string& dir);
// `orpheus ctl DIR shrink R..` and `ctl DIR grow N`: requests to a running job.
int ctlShrinkMain(const std::string& dir, const std::vector<std::string>& ranks);
int ctlGrowMain(const std::string& dir, const std::string& ranks);

}  // namespace orpheus::engine::cli
