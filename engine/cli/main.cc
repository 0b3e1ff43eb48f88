// orpheus: the command-line entry point. `train` runs under mpirun (every rank is
// a symmetric worker); `eval` scores a saved model in one process. Each subcommand's
// flags are in engine/cli/command_flags.h, its body in engine/cli/*_command.cc.
// Exit codes (engine/failures.h): 0 success, 1 internal failure, 2 bad input or usage,
// 3 a file operation failed (a full or failing disk), 4 a peer stalled or is gone.
#include "comm/live_group.h"
#include "engine/base/error.h"
#include "engine/base/log.h"
#include "engine/cli/command_flags.h"
#include "engine/cli/commands.h"
#include "engine/cli/flags.h"
#include "engine/failures.h"
#include "engine/job/job.h"
#include "orpheus/config.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <set>
#include <thread>

namespace {

using orpheus::engine::EvalConfig;
using orpheus::engine::TrainConfig;
using namespace orpheus::engine::cli;

constexpr const char* kExitCodes =
    "Exit codes: 0 success, 1 internal failure, 2 bad input or usage, 3 a file operation failed (a full or failing "
    "disk), 4 a peer stalled or is gone (a wait ran past --timeout; --resume continues the job).";

// CLI11's TOML reader, stricter: a flag or a [section] given twice is an error (CLI11
// would keep the first value and drop the other without a word).
class StrictConfig : public CLI::ConfigTOML {
 public:
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    std::vector<CLI::ConfigItem> items = CLI::ConfigTOML::from_config(input);
    std::set<std::string> keys, sections;
    for (const CLI::ConfigItem& item : items) {
      if (item.name == "++") continue;  // CLI11's mark of a section's start
      if (item.name == "--") {          // ... and of its end
        const std::string section = CLI::detail::join(item.parents, ".");
        if (!sections.insert(section).second) {
          throw CLI::ConfigError(fmt::format("section [{}] is given twice: put its flags under one [{}]", section,
                                             section));
        }
        continue;
      }
      if (!keys.insert(item.fullname()).second) {
        throw CLI::ConfigError(fmt::format("'{}' is given twice", item.fullname()));
      }
    }
    return items;
  }
};

// CLI11 says "INI was not able to parse train.clokcs": name the key and the rule.
std::string configErrorLine(const CLI::ConfigError& e) {
  const std::string what = e.what();
  const std::string marker = "not able to parse ";
  const auto at = what.find(marker);
  if (at == std::string::npos) return "--config: " + what;
  const std::string key = what.substr(at + marker.size());
  if (key.ends_with(".++")) {  // a section no command has
    return fmt::format("--config: [{}] is not a command (flags of 'orpheus train' go under [train] as name = value; "
                       "see orpheus --help)",
                       key.substr(0, key.size() - 3));
  }
  return fmt::format("--config: '{}' is not a flag (flags of 'orpheus train' go under [train] as name = value; see "
                     "orpheus train --help)",
                     key);
}

// The launcher's rank before MPI is up, so only one copy of a usage error prints.
int launcherRank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return 0;
}

// An error every rank finds before MPI is up: rank 0 prints it. The others linger
// a moment before exiting, so the launcher does not end rank 0 (seeing another
// rank fail first) before its line is out.
int usageError(const std::string& message, int code) {
  if (launcherRank() == 0) {
    orpheus::engine::reportError(message);
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(2));
  }
  return code;
}

// Every subcommand's configuration, filled in by parsing, and its CLI11 node.
struct CommandLine {
  CLI::App app{"Orpheus: peer-to-peer training of matrix-parameterized models with sufficient vectors"};

  TrainConfig train;
  std::string trainFormat = "auto";
  std::optional<uint64_t> joinAfter;  // hidden: a process a running job spawned (engine/membership/live.h)
  CLI::App* trainCmd = nullptr;

  TrainConfig simTrain;
  std::string simFormat = "auto";
  orpheus::engine::sim::SimConfig sim;
  double simLatencyUs = sim.network.latencySeconds * 1e6;
  CLI::App* simulateCmd = nullptr;

  EvalConfig eval;
  std::string evalFormat = "auto";
  CLI::App* evalCmd = nullptr;

  RestoreArgs restore;
  CLI::App* restoreCmd = nullptr;

  std::string ctlDir;
  std::vector<std::string> shrinkRanks;  // read by ctl_command.cc, which names a bad one with its bounds
  std::string growRanks;
  CLI::App* ctlCmd = nullptr;
  CLI::App* growCmd = nullptr;

  std::string inspectDir;
  CLI::App* inspectCmd = nullptr;
};

void addRestoreCommand(CommandLine& cl) {
  RestoreArgs& r = cl.restore;
  CLI::App* cmd = cl.app.add_subcommand("restore", "Rebuild a replica's parameters at any past clock from a checkpoint");
  cmd->add_option("--ckpt-dir", r.dir, "Checkpoint directory written by train --ckpt sv")->required();
  cmd->add_option("--clock", r.clock, "Clock number, or 'latest'")->capture_default_str();
  cmd->add_option("--replica", r.replica, "Replica id")->capture_default_str()->check(integerIn(0, 1 << 30));
  cmd->add_option("--out", r.out, "HDF5 file to write the parameters to")->required();
  cmd->add_option("--device", r.device, "Where the replay's rebuilds run (the training job's device restores bitwise)")
      ->capture_default_str()
      ->check(deviceName);
  cl.restoreCmd = cmd;
}

// orpheus ctl DIR shrink R [R...] | grow N: asks a running job to change its membership (engine/membership/live.h).
void addCtlCommand(CommandLine& cl) {
  CLI::App* cmd = cl.app.add_subcommand("ctl", "Change a running job's membership: ranks leave at the next clock");
  cmd->add_option("dir", cl.ctlDir, "The running job's --ckpt-dir")->required();
  cmd->require_subcommand(1);
  CLI::App* shrink =
      cmd->add_subcommand("shrink", "Ranks (of the current membership, not 0) leave the job at the next clock");
  shrink->add_option("ranks", cl.shrinkRanks, "Ranks to let go")->required();
  cl.growCmd = cmd->add_subcommand("grow", "N new ranks (spawned processes) join the job at the next clock");
  cl.growCmd->add_option("n", cl.growRanks, "How many ranks to add")->required();
  cl.ctlCmd = cmd;
}

void addCommands(CommandLine& cl) {
  CLI::App& app = cl.app;
  app.set_version_flag("--version", std::string(ORPHEUS_VERSION));
  app.require_subcommand(1);
  app.set_config("--config", "", "Read flags from a TOML/INI file: flags of 'train' under [train], as name = value");
  app.config_formatter(std::make_shared<StrictConfig>());
  // Before the subcommands exist, so they inherit it: a key no flag takes (a typo,
  // a key outside its [section], a line that is not 'name = value') is an error.
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.footer(kExitCodes);

  cl.trainCmd = app.add_subcommand("train", "Train a model; launch with mpirun, one rank per worker");
  addTrainFlags(*cl.trainCmd, cl.train, cl.trainFormat);
  cl.trainCmd->add_option(orpheus::comm::kLiveJoinFlag, cl.joinAfter)->group("");

  cl.simulateCmd = app.add_subcommand(
      "simulate", "Simulate P workers in this process: the real clock loop on a virtual clock and a network model");
  addTrainFlags(*cl.simulateCmd, cl.simTrain, cl.simFormat);
  addSimulateFlags(*cl.simulateCmd, cl.sim, cl.simLatencyUs);

  cl.evalCmd = app.add_subcommand("eval", "Evaluate saved parameters on test data; prints one JSON line");
  addEvalFlags(*cl.evalCmd, cl.eval, cl.evalFormat);

  addRestoreCommand(cl);
  addCtlCommand(cl);
  cl.inspectCmd = app.add_subcommand("inspect", "List a checkpoint's replicas, clocks, snapshots, bytes and damage");
  cl.inspectCmd->add_option("dir", cl.inspectDir, "Checkpoint directory")->required();
}

// CLI11 says "A subcommand is required" both for a word that is no command
// (`orpheus frob`, `orpheus ctl DIR frob`) and for none at all: name the word and
// the commands there are.
std::string missingCommandLine(const CommandLine& cl, int argc, char** argv) {
  const bool inCtl = cl.ctlCmd->parsed();
  std::vector<std::string> names;
  for (const CLI::App* sub : (inCtl ? *cl.ctlCmd : cl.app).get_subcommands([](const CLI::App*) { return true; })) {
    names.push_back(sub->get_name());
  }
  // The word where the command belongs: after `ctl DIR`, or the first one.
  int at = 1;
  if (inCtl) {
    while (at < argc && std::string(argv[at]) != "ctl") ++at;
    at += 2;
  }
  const std::string where = inCtl ? "ctl: " : "";
  const std::string tail = fmt::format("{} (see orpheus {}--help)", fmt::join(names, ", "), inCtl ? "ctl " : "");
  if (at >= argc || argv[at][0] == '-') return fmt::format("{}give a command: {}", where, tail);
  return fmt::format("{}'{}' is not a command: {}", where, argv[at], tail);
}

// A config file is read whole by CLI11, before anything checks it: a device or a
// pipe there would be read without end, or block on open. The file named after
// --config (either form), if any.
constexpr uintmax_t kMaxConfigBytes = uintmax_t{1} << 20;

std::string configFileIn(int argc, char** argv) {
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") break;
    if (word == "--config" && i + 1 < argc) path = argv[++i];
    if (word.starts_with("--config=")) path = word.substr(9);
  }
  return path;
}

// A flag's error names the config file where the value came from there: the
// flag the message starts with ("--clocks: ...") is not on the command line.
std::string withConfigSource(const std::string& message, int argc, char** argv) {
  const std::string config = configFileIn(argc, argv);
  // The flag the message names: its first --name ("--lr: ...", "Could not convert: --resume = maybe").
  const size_t start = message.find("--");
  if (config.empty() || start == std::string::npos) return message;
  size_t end = start + 2;
  while (end < message.size() && (std::isalnum(static_cast<unsigned char>(message[end])) || message[end] == '-')) ++end;
  if (end == start + 2) return message;
  const std::string flag = message.substr(start, end - start);
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == flag || word.starts_with(flag + "=")) return message;
  }
  return fmt::format("{} (from --config '{}')", message, config);
}

// Runs the subcommand that was parsed.
int dispatch(CommandLine& cl, int argc, char** argv) {
  // An input like the others: no output of the job replaces it (engine/outputs.h).
  cl.train.configFile = cl.simTrain.configFile = cl.restore.configFile = configFileIn(argc, argv);
  if (cl.trainCmd->parsed()) {
    cl.train.format = orpheus::data::parseFormat(cl.trainFormat);
    return trainMain(cl.train, std::vector<std::string>(argv, argv + argc), cl.joinAfter);
  }
  if (cl.simulateCmd->parsed()) {
    cl.simTrain.format = orpheus::data::parseFormat(cl.simFormat);
    return simulateMain(cl.simTrain, cl.sim, cl.simLatencyUs);
  }
  orpheus::setupLogging(0, "warn");
  if (cl.restoreCmd->parsed()) return restoreMain(cl.restore);
  if (cl.inspectCmd->parsed()) return inspectMain(cl.inspectDir);
  if (cl.growCmd->parsed()) return ctlGrowMain(cl.ctlDir, cl.growRanks);
  if (cl.ctlCmd->parsed()) return ctlShrinkMain(cl.ctlDir, cl.shrinkRanks);
  cl.eval.format = orpheus::data::parseFormat(cl.evalFormat);
  return orpheus::engine::runEval(cl.eval);
}

}  // namespace

int main(int argc, char** argv) {
  CommandLine cl;
  addCommands(cl);
  try {
    const std::string config = configFileIn(argc, argv);
    if (!config.empty()) orpheus::engine::checkSmallInput("--config", config, kMaxConfigBytes);
  } catch (const std::exception& e) {
    return usageError(e.what(), orpheus::engine::kExitBadInput);
  }
  try {
    cl.app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return cl.app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return cl.app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return cl.app.exit(e);
  } catch (const CLI::ConfigError& e) {
    return usageError(configErrorLine(e), orpheus::engine::kExitBadInput);
  } catch (const CLI::RequiredError& e) {
    if (std::string(e.what()).starts_with("A subcommand is required")) {
      return usageError(missingCommandLine(cl, argc, argv), orpheus::engine::kExitBadInput);
    }
    return usageError(std::string(e.what()) + " (see orpheus --help)", orpheus::engine::kExitBadInput);
  } catch (const CLI::ParseError& e) {
    return usageError(withConfigSource(e.what(), argc, argv) + " (see orpheus --help)",
                      orpheus::engine::kExitBadInput);
  } catch (const std::logic_error& e) {  // a conversion CLI11 lets out (std::invalid_argument)
    return usageError(fmt::format("a flag's value cannot be read ({}) (see orpheus --help)", e.what()),
                      orpheus::engine::kExitBadInput);
  }
  try {
    return dispatch(cl, argc, argv);
  } catch (const std::exception& e) {
    return usageError(e.what(), orpheus::engine::exitCodeFor(e));
  }
}
