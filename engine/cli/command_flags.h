// The flags of each subcommand: what `orpheus train`, `simulate` and `eval` accept,
// parsed strictly into their configurations (engine/cli/flags.h for the numbers).
#pragma once

#include "engine/config.h"
#include "engine/job/job.h"
#include "engine/sim/simulation.h"

#include <CLI/CLI.hpp>

#include <string>

namespace orpheus::engine::cli {

// `format` takes --format's name (data::parseFormat turns it into c.format).
void addTrainFlags(CLI::App& cmd, TrainConfig& c, std::string& format);
void addEvalFlags(CLI::App& cmd, EvalConfig& c, std::string& format);
// The simulated machine; --sim-latency-us goes to `latencyUs`.
void addSimulateFlags(CLI::App& cmd, sim::SimConfig& s, double& latencyUs);
// CLI11's check for --device: empty when ops::makeBackend knows the name.
std::string deviceName(const std::string& device);

}  // namespace orpheus::engine::cli
