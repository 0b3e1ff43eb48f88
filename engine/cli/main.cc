// orpheus: the command-line entry point. `train` runs under mpirun (every rank is
// a symmetric worker); `eval` scores a saved model in one process.
// Exit codes: 0 success, 2 bad input or usage, 1 internal failure.
#include "comm/mpi/mpi_transport.h"
#include "engine/base/error.h"
#include "engine/base/log.h"
#include "ckpt/model_file.h"
#include "engine/checkpoint.h"
#include "engine/job.h"
#include "orpheus/config.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <mpi.h>

#include <cstdlib>
#include <map>

namespace {

using orpheus::engine::EvalConfig;
using orpheus::engine::SyncMode;
using orpheus::engine::TrainConfig;

// The launcher's rank before MPI is up, so only one copy of a usage error prints.
int launcherRank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return 0;
}

// Range checks whose messages read well: "--clocks: must be at least 1, got 0".
CLI::Validator atLeast(double min) {
  return CLI::Validator(
      [min](std::string& s) -> std::string {
        double v = 0;
        try {
          v = std::stod(s);
        } catch (...) {
          return "expected a number, got '" + s + "'";
        }
        if (!(v >= min)) return fmt::format("must be at least {}, got {}", min, s);
        return {};
      },
      fmt::format(">= {}", min));
}

CLI::Validator positive() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        try {
          v = std::stod(s);
        } catch (...) {
          return "expected a number, got '" + s + "'";
        }
        if (!(v > 0)) return "must be positive, got " + s;
        return {};
      },
      "> 0");
}

void addTrainFlags(CLI::App& cmd, TrainConfig& c, std::string& format) {
  cmd.add_option("--model", c.model,
                 "Model to train: a .loss file (see examples/), or the built-in 'mlr' (multinomial logistic regression)")
      ->capture_default_str();
  cmd.add_option("--train", c.train,
                 "Training data: an IDX images file (.gz or raw; labels found by name), a LIBSVM file, a CSV file "
                 "(label first), or synthetic:examples=N,features=D,classes=K")
      ->required();
  cmd.add_option("--test", c.test, "Test data, same formats; evaluated on every rank's shard");
  cmd.add_option("--format", format, "Data format: auto, idx, libsvm, csv")->capture_default_str();
  cmd.add_option("--features", c.features, "Fix the feature width (LIBSVM/CSV); default: from the data")
      ->check(atLeast(1));
  cmd.add_option("--classes", c.classes, "Number of classes; default: largest training label + 1")
      ->check(atLeast(1));
  cmd.add_option("--clocks", c.clocks, "Clocks (iterations) to run")->capture_default_str()->check(atLeast(1));
  cmd.add_option("--batch", c.batch, "Minibatch size per rank per clock")
      ->capture_default_str()
      ->check(atLeast(1));
  cmd.add_option("--lr", c.lr, "Learning rate of SGD on the mean loss of the examples a replica hears of per clock")
      ->capture_default_str()
      ->check(positive());
  cmd.add_option("--seed", c.seed, "Job seed: initialisation, sampling and every other random choice")
      ->capture_default_str();
  const std::map<std::string, SyncMode> syncModes{{"sv", SyncMode::kSv}, {"dense", SyncMode::kDense}};
  cmd.add_option("--sync", c.sync,
                 "sv: broadcast sufficient vectors and rebuild updates; dense: allreduce dense gradients")
      ->transform(CLI::CheckedTransformer(syncModes, CLI::ignore_case))
      ->default_str("sv");
  cmd.add_option("--select", c.select,
                 "SV selection: send C of the B SVGs of each clock, chosen jointly across matrices (0: send all)")
      ->capture_default_str()
      ->check(atLeast(0));
  const std::map<std::string, orpheus::engine::SelectionMethod> selectMethods{
      {"jmcss", orpheus::engine::SelectionMethod::kJmcss}, {"uniform", orpheus::engine::SelectionMethod::kUniform}};
  cmd.add_option("--select-method", c.selectMethod,
                 "jmcss: joint matrix column subset selection with a least-squares core; uniform: C at random, "
                 "rescaled by B/C")
      ->transform(CLI::CheckedTransformer(selectMethods, CLI::ignore_case))
      ->default_str("jmcss");
  const std::map<std::string, orpheus::comm::MulticastKind> multicasts{
      {"all", orpheus::comm::MulticastKind::kAll},
      {"random", orpheus::comm::MulticastKind::kRandom},
      {"fixed", orpheus::comm::MulticastKind::kFixed},
      {"ring", orpheus::comm::MulticastKind::kRing}};
  cmd.add_option("--multicast", c.multicast,
                 "Who gets a worker's SV batch each clock: all (broadcast), random (Q peers drawn per clock), fixed "
                 "(the same Q peers), ring (Q peers in circular order over clocks)")
      ->transform(CLI::CheckedTransformer(multicasts, CLI::ignore_case))
      ->default_str("all");
  cmd.add_option("--fanout", c.fanout, "Q: peers per clock for random, fixed and ring multicast (at most P-1)")
      ->check(atLeast(1));
  const std::map<std::string, orpheus::engine::Consistency> consistencies{
      {"bsp", orpheus::engine::Consistency::kBsp}, {"ssp", orpheus::engine::Consistency::kSsp}};
  cmd.add_option("--consistency", c.consistency,
                 "bsp: a clock starts once every batch of the previous one is applied; ssp: once every batch from "
                 "clocks <= t-s-1 is")
      ->transform(CLI::CheckedTransformer(consistencies, CLI::ignore_case))
      ->default_str("bsp");
  cmd.add_option("--staleness", c.staleness, "s: how many clocks a worker may run ahead under SSP")
      ->capture_default_str();
  cmd.add_option("--drop-links", c.dropLinks,
                 "Failure injection: fraction F in [0,1) of directed links broken each clock (seeded)")
      ->capture_default_str();
  cmd.add_option("--average-every", c.averageEvery,
                 "Periodic centralized synchronization: every R clocks the coordinator averages all replicas")
      ->check(atLeast(1));
  cmd.add_option("--rotate-every", c.rotateEvery,
                 "Parameter-replica rotation: every S clocks each replica moves to the next rank of the ring")
      ->check(atLeast(1));
  cmd.add_option("--save-replicas", c.saveReplicas,
                 "Directory where every rank saves the replica it holds at the end as replica-<id>.h5");
  cmd.add_option("--ckpt-dir", c.ckptDir, "Checkpoint directory (with --ckpt sv, or to --resume from)");
  cmd.add_option_function<std::string>(
         "--ckpt",
         [&c](const std::string& v) {
           if (v == "sv") {
             c.ckptSv = true;
           } else if (v == "matrix") {
             c.ckptMatrix = true;
           } else if (v != "none") {
             throw CLI::ValidationError("--ckpt", "expected sv, matrix or none, got '" + v + "'");
           }
         },
         "sv: log every SV batch applied to each replica (restore any clock with 'orpheus restore'); matrix: the "
         "baseline, computation halts every --ckpt-every clocks while every replica is written whole; none")
      ->default_str("none");
  cmd.add_option("--snapshot-every", c.snapshotEvery,
                 "With --ckpt sv and --average-every: write a snapshot at every K-th averaging barrier")
      ->capture_default_str()
      ->check(atLeast(1));
  cmd.add_option("--ckpt-every", c.ckptEvery, "With --ckpt matrix: clocks between whole-matrix checkpoints")
      ->capture_default_str()
      ->check(atLeast(1));
  cmd.add_option("--fail-prob", c.failProb,
                 "Failure injection: each clock each rank loses its replica with this probability and recovers it "
                 "from the checkpoint, losing the clocks since (--ckpt sv: snapshot + the log on disk, what was "
                 "staged in memory is lost; --ckpt matrix: the last matrix)")
      ->capture_default_str();
  cmd.add_flag_function(
      "--resume", [&c](int64_t) { c.resume = c.ckptSv = true; },
      "Continue a killed job from the newest clock its --ckpt-dir reaches (same flags, BSP)");
  cmd.add_option_function<std::string>(
         "--inject-delay",
         [&c](const std::string& v) {
           const auto colon = v.find(':');
           if (colon == std::string::npos) throw CLI::ValidationError("--inject-delay", "expected RANK:MS");
           c.delayRank = std::stoi(v.substr(0, colon));
           c.delayMs = std::stoi(v.substr(colon + 1));
         },
         "Testing aid: RANK:MS makes that rank sleep MS milliseconds every clock")
      ->group("Testing");
  cmd.add_option("--eval-every", c.evalEvery, "Evaluate on the test data every N clocks (0: only at the end)")
      ->capture_default_str()
      ->check(atLeast(0));
  cmd.add_option("--target-accuracy", c.targetAccuracy,
                 "Stop at the first eval clock whose test accuracy (all ranks' shards) reaches this; "
                 "that eval is then a collective")
      ->check(atLeast(0));
  cmd.add_option("--metrics", c.metrics, "Write per-clock metrics as JSON lines to this file (rank 0)");
  cmd.add_option("--save", c.save, "Save the final parameters to this HDF5 file (rank 0)");
  cmd.add_option("--timeout", c.timeoutSeconds, "Seconds any wait for a peer may take before the job fails")
      ->capture_default_str()
      ->check(positive());
  cmd.add_option("--blas-threads", c.blasThreads, "Threads for BLAS in each rank")
      ->capture_default_str()
      ->check(atLeast(1));
  cmd.add_option("--log-level", c.logLevel, "Log level: debug, info, warn, error")
      ->capture_default_str()
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}));
  cmd.add_option("--progress", c.progress, "Live progress line: auto (on a terminal), on, off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
}

void addEvalFlags(CLI::App& cmd, EvalConfig& c, std::string& format) {
  cmd.add_option("--params", c.params, "HDF5 parameter file written by 'orpheus train --save'")->required();
  cmd.add_option("--model", c.model, "Model the parameters belong to: a .loss file or 'mlr'")->capture_default_str();
  cmd.add_option("--test", c.test, "Test data (IDX, LIBSVM or CSV)")->required();
  cmd.add_option("--format", format, "Data format: auto, idx, libsvm, csv")->capture_default_str();
  cmd.add_option("--features", c.features, "Fix the feature width (LIBSVM/CSV); default: the model's")
      ->check(atLeast(1));
}

struct RestoreArgs {
  std::string dir;
  std::string clock = "latest";
  int replica = 0;
  std::string out;
};

int restoreMain(const RestoreArgs& a) {
  uint64_t clock = 0;
  if (a.clock != "latest") {
    try {
      clock = std::stoull(a.clock);
    } catch (...) {
      throw orpheus::InputError("--clock expects a clock number or 'latest', got '" + a.clock + "'");
    }
    if (clock == 0) throw orpheus::InputError("--clock 0 is the initial state; give a clock >= 1");
  }
  const auto r = orpheus::engine::restore(a.dir, a.replica, clock);
  const auto job = orpheus::ckpt::readJobInfo(a.dir);
  orpheus::ckpt::ModelFileInfo info;
  info.modelSpec = job.modelSpec;
  info.clock = static_cast<int64_t>(r.clock);
  info.seed = job.seed;
  info.replica = r.replica;
  info.features = job.features;
  info.classes = job.classes;
  orpheus::ckpt::saveParams(a.out, r.params, info);
  std::printf("restored replica %d at clock %llu%s (%s, %zu groups replayed) to %s\n", r.replica,
              static_cast<unsigned long long>(r.clock), clock == 0 ? ", the newest restorable clock" : "",
              r.fromSnapshot ? fmt::format("from the snapshot of clock {}", r.fromSnapshot).c_str() : "from W0",
              r.groupsReplayed, a.out.c_str());
  return 0;
}

int inspectMain(const std::string& dir) {
  const auto view = orpheus::engine::inspectCheckpoint(dir);
  const auto& inv = view.inventory;
  std::printf("checkpoint %s: %s, %d ranks, seed %llu, %.1f MB\n", dir.c_str(), inv.job.modelSpec.c_str(),
              inv.job.ranks, static_cast<unsigned long long>(inv.job.seed), inv.totalBytes / 1e6);
  for (const auto& r : inv.replicas) {
    const orpheus::ckpt::ReplicaRestorability& restorable = *view.restorable.replica(r.replica);
    uint64_t bytes = 0;
    for (const auto& s : r.segments) bytes += s.bytes;
    std::string lost;
    uint64_t lostClocks = 0;
    for (const auto& l : r.lost) {
      lost += fmt::format("{}{}", lost.empty() ? "" : ", ", l.first == l.last ? fmt::format("{}", l.first)
                                                                             : fmt::format("{}..{}", l.first, l.last));
      lostClocks += l.last - l.first + 1;
    }
    std::printf("  replica %d: clocks %s restorable, %zu segments, %.1f MB\n", r.replica,
                restorable.describe().c_str(), r.segments.size(), bytes / 1e6);
    if (!r.lost.empty()) {
      std::printf("    lost in failures: %llu clocks (%s)\n", static_cast<unsigned long long>(lostClocks),
                  lost.c_str());
    }
    for (const auto& s : r.segments) {
      if (!s.intact) std::printf("    damaged: %s (%s)\n", s.path.c_str(), s.problem.c_str());
    }
    for (const auto& m : restorable.missing) {
      std::printf("    missing: clocks %llu..%llu (no segment holds them)\n", static_cast<unsigned long long>(m.first),
                  static_cast<unsigned long long>(m.last));
    }
  }
  std::printf("  snapshots:");
  for (auto s : inv.snapshots) std::printf(" %llu", static_cast<unsigned long long>(s));
  std::printf("%s\n", inv.snapshots.empty() ? " none" : "");
  for (const auto& u : inv.damagedSnapshots) {
    std::printf("    unusable snapshot of clock %llu: %s\n", static_cast<unsigned long long>(u.clock),
                u.problem.c_str());
  }
  return 0;
}

int trainMain(TrainConfig& config) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  int code = 0;
  {
    orpheus::comm::mpi::MpiTransport transport(MPI_COMM_WORLD);
    orpheus::setupLogging(transport.rank(), config.logLevel);
    orpheus::setBlasThreads(config.blasThreads);
    try {
      code = orpheus::engine::runTrain(config, transport);
    } catch (const orpheus::engine::JobFailed& e) {
      code = e.code();
    } catch (const std::exception& e) {
      orpheus::engine::reportError(e.what());
      code = orpheus::engine::exitCodeFor(e);
    }
  }
  MPI_Finalize();
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Orpheus: peer-to-peer training of matrix-parameterized models with sufficient vectors"};
  app.set_version_flag("--version", std::string(ORPHEUS_VERSION));
  app.require_subcommand(1);
  app.set_config("--config", "", "Read flags from a TOML/INI file");

  TrainConfig train;
  std::string trainFormat = "auto";
  CLI::App* trainCmd = app.add_subcommand("train", "Train a model; launch with mpirun, one rank per worker");
  addTrainFlags(*trainCmd, train, trainFormat);

  EvalConfig eval;
  std::string evalFormat = "auto";
  CLI::App* evalCmd = app.add_subcommand("eval", "Evaluate saved parameters on test data; prints one JSON line");
  addEvalFlags(*evalCmd, eval, evalFormat);

  RestoreArgs restoreArgs;
  CLI::App* restoreCmd = app.add_subcommand("restore", "Rebuild a replica's parameters at any past clock from a checkpoint");
  restoreCmd->add_option("--ckpt-dir", restoreArgs.dir, "Checkpoint directory written by train --ckpt sv")->required();
  restoreCmd->add_option("--clock", restoreArgs.clock, "Clock number, or 'latest'")->capture_default_str();
  restoreCmd->add_option("--replica", restoreArgs.replica, "Replica id")->capture_default_str()->check(atLeast(0));
  restoreCmd->add_option("--out", restoreArgs.out, "HDF5 file to write the parameters to")->required();
  std::string inspectDir;
  CLI::App* inspectCmd = app.add_subcommand("inspect", "List a checkpoint's replicas, clocks, snapshots, bytes and damage");
  inspectCmd->add_option("dir", inspectDir, "Checkpoint directory")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (launcherRank() == 0) orpheus::engine::reportError(std::string(e.what()) + " (see orpheus --help)");
    return 2;
  }

  try {
    if (trainCmd->parsed()) {
      train.format = orpheus::data::parseFormat(trainFormat);
      return trainMain(train);
    }
    orpheus::setupLogging(0, "warn");
    if (restoreCmd->parsed()) return restoreMain(restoreArgs);
    if (inspectCmd->parsed()) return inspectMain(inspectDir);
    eval.format = orpheus::data::parseFormat(evalFormat);
    return orpheus::engine::runEval(eval);
  } catch (const std::exception& e) {
    if (launcherRank() == 0) orpheus::engine::reportError(e.what());
    return orpheus::engine::exitCodeFor(e);
  }
}
