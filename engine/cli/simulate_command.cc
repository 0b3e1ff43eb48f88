#include "engine/cli/commands.h"

#include "engine/base/log.h"
#include "engine/failures.h"

namespace orpheus::engine::cli {

int simulateMain(TrainConfig& config, sim::SimConfig& sim, double latencyUs) {
  orpheus::setupLogging(0, config.logLevel);
  orpheus::setBlasThreads(config.blasThreads);
  sim.network.latencySeconds = latencyUs * 1e-6;
  try {
    return sim::runSimulation(config, sim);
  } catch (const std::exception& e) {
    reportError(e.what());
    return exitCodeFor(e);
  }
}

}  // namespace orpheus::engine::cli
