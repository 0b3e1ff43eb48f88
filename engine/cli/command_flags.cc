#include "engine/cli/command_flags.h"

#include "comm/factory.h"
#include "engine/base/memory.h"
#include "engine/cli/flags.h"
#include "ops/backends.h"

#include <fmt/format.h>

#include <charconv>
#include <limits>
#include <optional>

namespace orpheus::engine::cli {
namespace {

// An enum flag that takes the names of `names` (any case); --help shows them as
// {a,b,c} with the default.
template <typename E>
CLI::Option* addEnumOption(CLI::App& cmd, const std::string& flag, E& value, const NamedValues<E>& names,
                           const std::string& help) {
  std::string choices;
  std::string current;
  for (const auto& [name, v] : names) {
    choices += (choices.empty() ? "" : ",") + name;
    if (v == value) current = name;
  }
  CLI::Validator byName(
      [names, choices](std::string& s) -> std::string {
        const std::string lower = CLI::detail::to_lower(s);
        for (const auto& [name, v] : names) {
          if (lower == name) {
            s = std::to_string(static_cast<int>(v));
            return {};
          }
        }
        return fmt::format("expected one of {}, got '{}'", choices, s);
      },
      "");
  return cmd.add_option(flag, value, help)->transform(byName)->type_name("{" + choices + "}")->default_str(current);
}

// A switch: on or off (CLI11's other spellings of true and false too, any case).
const CLI::Validator& onOff() {
  static const CLI::Validator v(
      [](std::string& s) -> std::string {
        const std::string lower = CLI::detail::to_lower(s);
        for (const char* yes : {"on", "true", "yes", "1"}) {
          if (lower == yes) return {};
        }
        for (const char* no : {"off", "false", "no", "0"}) {
          if (lower == no) return {};
        }
        return fmt::format("expected on or off, got '{}'", s);
      },
      "");
  return v;
}

// A whole decimal integer in [min, max], or nothing.
std::optional<int64_t> parseInteger(const std::string& s, int64_t min, int64_t max) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < min || v > max) return std::nullopt;
  return v;
}

// --inject-delay RANK:MS, strictly: both whole numbers in range.
void parseInjectDelay(const std::string& v, TrainConfig& c) {
  constexpr int64_t kMaxDelayMs = 3'600'000;  // an hour per clock is surely a typo beyond
  const auto colon = v.find(':');
  if (colon == std::string::npos) throw CLI::ValidationError("--inject-delay", "expected RANK:MS, got '" + v + "'");
  const auto rank = parseInteger(v.substr(0, colon), 0, std::numeric_limits<int>::max());
  const auto ms = parseInteger(v.substr(colon + 1), 0, kMaxDelayMs);
  if (!rank) {
    throw CLI::ValidationError("--inject-delay",
                               fmt::format("RANK must be a whole number >= 0, got '{}'", v.substr(0, colon)));
  }
  if (!ms) {
    throw CLI::ValidationError("--inject-delay", fmt::format("MS must be a whole number of milliseconds in [0, {}], "
                                                             "got '{}'",
                                                             kMaxDelayMs, v.substr(colon + 1)));
  }
  c.delayRank = static_cast<int>(*rank);
  c.delayMs = static_cast<int>(*ms);
}

// The data, the model and its optimisation.
void addModelFlags(CLI::App& cmd, TrainConfig& c, std::string& format) {
  cmd.add_option("--model", c.model,
                 "Model to train: a .loss file (see examples/), or the built-in 'mlr' (multinomial logistic regression)")
      ->capture_default_str();
  cmd.add_option("--train", c.train,
                 "Training data: an IDX images file (.gz or raw; labels found by name), a LIBSVM file, a CSV file "
                 "(label first), an HDF5 file (X dense or CSR, y), or synthetic:examples=N,features=D,classes=K")
      ->required();
  cmd.add_option("--test", c.test, "Test data, same formats; evaluated on every rank's shard");
  cmd.add_option("--format", format, "Data format: auto, idx, libsvm, csv, hdf5, tokens")->capture_default_str();
  cmd.add_option("--features", c.features, "Fix the feature width (LIBSVM/CSV); default: from the data")
      ->check(integerIn(1));
  cmd.add_option("--classes", c.classes, "Number of classes; default: largest training label + 1")
      ->check(integerIn(1));
  cmd.add_option("--clocks", c.clocks, "Clocks (iterations) to run")->capture_default_str()->check(integerIn(1));
  cmd.add_option("--batch", c.batch, "Minibatch size per rank per clock")
      ->capture_default_str()
      ->check(integerIn(1));
  cmd.add_option("--lr", c.lr,
                 "Learning rate on the mean loss of the examples a replica hears of per clock; default per "
                 "--optimizer: sgd, momentum, nesterov and adagrad 0.1, adam 0.001, bfgs and dfp 1")
      ->default_str("per optimizer")
      ->check(numberIn(0, 1e6, true));
  cmd.add_option("--seed", c.seed, "Job seed: initialisation, sampling and every other random choice")
      ->capture_default_str()
      ->check(integerIn(0));
}

// The optimizer each replica runs on its rebuilt update, and the learning-rate schedule.
void addOptimizerFlags(CLI::App& cmd, TrainConfig& c) {
  const char* group = "Optimizer (PyTorch's formulas, per replica; state travels with the replica)";
  addEnumOption(cmd, "--optimizer", c.optimizer, orpheus::engine::optimizerNames(),
                "Optimizer on each replica's rebuilt update: sgd (lr folded into the SV coefficients), momentum, "
                "nesterov, adagrad, adam; bfgs, dfp (quasi-Newton on every parameter flattened, for models of at "
                "most 4096 entries such as MLR on a few hundred features; full broadcast and bsp; use --batch "
                "as large as the shard for full-batch steps)")
      ->group(group);
  cmd.add_option("--momentum", c.momentum, "momentum, nesterov: the momentum factor, in [0, 1); default 0.9")
      ->check(numberIn(0, 1, false, true))
      ->group(group);
  cmd.add_option("--beta1", c.beta1, "adam: decay of the first moment, in [0, 1); default 0.9")
      ->check(numberIn(0, 1, false, true))
      ->group(group);
  cmd.add_option("--beta2", c.beta2, "adam: decay of the second moment, in [0, 1); default 0.999")
      ->check(numberIn(0, 1, false, true))
      ->group(group);
  cmd.add_option("--eps", c.eps, "adam, adagrad: added to the denominator; default adam 1e-8, adagrad 1e-10")
      ->check(numberIn(0, 1, true))
      ->group(group);
  cmd.add_option("--weight-decay", c.weightDecay, "L2 penalty added to the gradient (wd * w); default 0")
      ->check(numberIn(0, 1e6))
      ->group(group);
  addEnumOption(cmd, "--lr-schedule", c.lrSchedule, orpheus::engine::lrScheduleNames(),
                "Learning rate per clock: constant; step (times --lr-gamma every --lr-step-every clocks); cosine "
                "(to 0 over --clocks, after the warmup)")
      ->group(group);
  cmd.add_option("--warmup", c.warmup, "Clocks of linear warmup (lr * clock / N), with any schedule")
      ->capture_default_str()
      ->check(integerIn(0))
      ->group(group);
  cmd.add_option("--lr-step-every", c.lrStepEvery, "step: clocks between decays")
      ->check(integerIn(1))
      ->group(group);
  cmd.add_option("--lr-gamma", c.lrGamma, "step: the decay factor, in (0, 1]; default 0.1")
      ->check(numberIn(0, 1, true))
      ->group(group);
}

// Synchronization: SV or dense, the communication co-designs, consistency, the coordinator.
void addSyncFlags(CLI::App& cmd, TrainConfig& c) {
  addEnumOption(cmd, "--sync", c.sync, orpheus::engine::syncModeNames(),
                "sv: broadcast sufficient vectors and rebuild updates; dense: allreduce dense gradients; powersgd: "
                "allreduce PowerSGD's factors of rank --sv-rank, with error feedback (BSP)");
  cmd.add_option("--select", c.select,
                 "SV selection: send C of the B SVGs of each clock, chosen jointly across matrices (0: send all)")
      ->capture_default_str()
      ->check(integerIn(0));
  cmd.add_option("--sv-rank", c.svRank,
                 "Send and apply each matrix's update at rank R (R + 1 SVGs, one power iteration a clock) with "
                 "error feedback: what a clock leaves out is sent later; replaces --select, and --adapt moves "
                 "it (engine/worker/low_rank.h; 0: off). With --sync powersgd: the rank of its factors")
      ->capture_default_str()
      ->check(integerIn(0));
  addEnumOption(cmd, "--sv-dtype", c.svDtype, orpheus::engine::svDtypeNames(),
                "f32, or bf16: U and V rounded to bf16 before they are sent (half the bytes on the wire and in the "
                "log); every replica applies the rounded values, and --sv-rank carries the rounding error forward");
  addEnumOption(cmd, "--select-method", c.selectMethod, orpheus::engine::selectionMethodNames(),
                "jmcss: joint matrix column subset selection with a least-squares core; jmcss-gram: the same draw "
                "from the Gram matrices X^T X, formed on the job's device (where a resident pass left U and V), "
                "so the host's share is O(C B^2) per matrix; uniform: C at random, rescaled by B/C");
  cmd.add_option("--overlap", c.overlap,
                 "on: send each matrix's SVs (sv, broadcast, BSP) or all-reduce each gradient (dense) as soon as the "
                 "backward pass produces it, overlapping communication with compute; off: after the whole pass. The "
                 "parameters are bitwise the same. Off by default: on the emulated 1 Gbit/s cluster the per-peer sends "
                 "were slower than one collective")
      ->check(onOff())
      ->type_name("on|off")
      ->default_str("off");
  addEnumOption(cmd, "--select-unit", c.selectUnit, orpheus::engine::svgUnitNames(),
                "What one SVG of a sequence model is: example (all its T steps) or step (one (example, step) pair; "
                "a batch then has B*T SVGs, and --select counts pairs)");
  addEnumOption(cmd, "--multicast", c.multicast, orpheus::engine::multicastNames(),
                "Who gets a worker's SV batch each clock: all (broadcast), random (Q peers drawn per clock), fixed "
                "(the same Q peers), ring (Q peers in circular order over clocks)");
  cmd.add_option("--fanout", c.fanout, "Q: peers per clock for random, fixed and ring multicast (at most P-1)")
      ->check(integerIn(1));
  addEnumOption(cmd, "--consistency", c.consistency, orpheus::engine::consistencyNames(),
                "bsp: a clock starts once every batch of the previous one is applied; ssp: once every batch from "
                "clocks <= t-s-1 is");
  cmd.add_option("--staleness", c.staleness, "s: how many clocks a worker may run ahead under SSP")
      ->capture_default_str()
      ->check(integerIn(0, 1000000));
  cmd.add_option("--drop-links", c.dropLinks,
                 "Failure injection: fraction F in [0,1) of directed links broken each clock (seeded)")
      ->capture_default_str()
      ->check(numberIn(0, 1));
  cmd.add_option("--average-every", c.averageEvery,
                 "Periodic centralized synchronization: every R clocks the coordinator averages all replicas")
      ->check(integerIn(1));
  cmd.add_option("--rotate-every", c.rotateEvery,
                 "Parameter-replica rotation: every S clocks each replica moves to the next rank of the ring")
      ->check(integerIn(1));
  cmd.add_option("--outer-lr", c.outerLr,
                 "With --average-every: DiLoCo's outer Nesterov step at each averaging, learning rate L (0: off, "
                 "plain averaging; DiLoCo uses 0.7)")
      ->check(numberIn(0, 1e6));
  cmd.add_option("--outer-momentum", c.outerMomentum,
                 "With --outer-lr: the outer step's Nesterov momentum M, in [0, 1) (DiLoCo uses 0.9; default 0)")
      ->check(numberIn(0, 1, false, true));
}

// Checkpoints, recovery and failure injection.
void addCheckpointFlags(CLI::App& cmd, TrainConfig& c) {
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
           } else if (v == "none") {
             c.ckptNone = true;
           } else {
             throw CLI::ValidationError("--ckpt", "expected sv, matrix or none, got '" + v + "'");
           }
         },
         "sv: log every SV batch applied to each replica (restore any clock with 'orpheus restore'); matrix: the "
         "baseline, computation halts every --ckpt-every clocks while every replica is written whole; none")
      ->type_name("{sv,matrix,none}")
      ->default_str("none");
  cmd.add_option("--snapshot-every", c.snapshotEvery,
                 "With --ckpt sv and --average-every: write a snapshot at every K-th averaging barrier")
      ->capture_default_str()
      ->check(integerIn(1));
  cmd.add_option("--ckpt-format", c.ckptFormat,
                 "With --ckpt sv: 3 writes each SV batch once (the replica that computed it; receivers log "
                 "references), 2 the previous format (every replica logs a copy of every batch it applied)")
      ->capture_default_str()
      ->check(integerIn(2, 3));
  cmd.add_flag("--ckpt-writer-idle", c.ckptWriterIdle,
               "With --ckpt sv: run the log's IO thread under SCHED_IDLE, for machines whose cores the ranks fill");
  cmd.add_option("--ckpt-every", c.ckptEvery, "With --ckpt matrix: clocks between whole-matrix checkpoints")
      ->capture_default_str()
      ->check(integerIn(1));
  cmd.add_option("--fail-prob", c.failProb,
                 "Failure injection: each clock each rank loses its replica with this probability and recovers it "
                 "from the checkpoint, losing the clocks since (--ckpt sv: snapshot + the log on disk, what was "
                 "staged in memory is lost; --ckpt matrix: the last matrix)")
      ->capture_default_str()
      ->check(numberIn(0, 1));
  // A callback reads the value as a bool: --resume=maybe is a usage error, not an abort.
  cmd.add_flag_callback(
      "--resume", [&c] { c.resume = c.ckptSv = true; },
      "Continue a killed job from the newest clock its --ckpt-dir reaches (same flags, BSP)");
  cmd.add_flag("--elastic", c.elastic,
               "With --resume: continue on however many ranks this launch has; every replica restarts from the "
               "average of the killed job's (engine/README.md: elastic runs)");
  cmd.add_flag("--overwrite", c.overwrite,
               "Let a new job replace the checkpoint an earlier job left in --ckpt-dir (only the engine's own files "
               "are removed)");
  cmd.add_option_function<std::string>(
         "--inject-delay",
         [&c](const std::string& v) { parseInjectDelay(v, c); },
         "Testing aid: RANK:MS makes that rank sleep MS milliseconds every clock (with --balance: per B "
         "examples of its minibatch)")
      ->type_name("RANK:MS")
      ->group("Testing");
}

// Evaluation, outputs and the run's environment.
void addRunFlags(CLI::App& cmd, TrainConfig& c) {
  cmd.add_option("--eval-every", c.evalEvery, "Evaluate on the test data every N clocks (0: only at the end)")
      ->capture_default_str()
      ->check(integerIn(0));
  cmd.add_option("--target-accuracy", c.targetAccuracy,
                 "Stop at the first eval clock whose test accuracy (all ranks' shards) reaches this; "
                 "that eval is then a collective (0, the default: no target)")
      ->check(numberIn(0, 1));
  cmd.add_option("--metrics", c.metrics, "Write per-clock metrics as JSON lines to this file (rank 0)");
  cmd.add_flag("--param-digests", c.paramDigests,
               "Each clock's metrics line carries the CRC32C of rank 0's replica (param_crc32c, with 'replica'); "
               "'orpheus restore' prints the same digest, so a restore can be checked against the live run");
  cmd.add_option("--save", c.save, "Save the final parameters to this HDF5 file (rank 0)");
  cmd.add_option("--timeout", c.timeoutSeconds, "Seconds any wait for a peer may take before the job fails")
      ->capture_default_str()
      ->check(numberIn(orpheus::engine::cli::kMinTimeoutSeconds, orpheus::engine::cli::kMaxTimeoutSeconds));
  cmd.add_option("--transport", c.transport,
                 fmt::format("How ranks talk: {} (launch with mpirun)", fmt::join(orpheus::comm::availableTransports(), ", ")))
      ->capture_default_str();
  cmd.add_option("--device", c.device,
                 "Where a clock runs: cpu, cuda (GPU = local rank modulo the GPUs; ranks may share one), cuda:N, or "
                 "strict (the CPU behind memory host code cannot touch; for tests). Feed-forward and sequence (LSTM) "
                 ".loss models keep their replica there; other models run their rebuild and dense gradient there")
      ->capture_default_str()
      ->check(deviceName);
  cmd.add_option("--resident", c.resident,
                 "on: the replica (parameters, gradient, optimizer state) stays on --device where the model and "
                 "optimizer can run there; off: only the rebuild and the dense gradient run there, W copied in and "
                 "out (to measure what residency gives; restore replays resident, so on a GPU such a job restores to "
                 "float rounding, not bitwise)")
      ->check(onOff())
      ->type_name("on|off")
      ->default_str("on");
  addEnumOption(cmd, "--transfer", c.transfer, orpheus::engine::transferModeNames(),
                "How a replica on --device brings each clock's SVs to host memory for the wire: staged (each site's U "
                "and V copied on the device's copy queue while the backward pass goes on) or sync (blocking copies "
                "after it); the same bits either way");
  // One knob for a rank's compute threads: the GEMMs run in OpenBLAS, everything
  // else in one thread. --blas-threads is its earlier name.
  cmd.add_option("--threads,--blas-threads", c.blasThreads,
                 "Compute threads per rank (OpenBLAS); give each rank as many cores as it has to itself")
      ->capture_default_str()
      ->check(integerIn(1, 1024));  // OpenBLAS builds cap threads well below this
  cmd.add_option("--log-level", c.logLevel, "Log level: debug, info, warn, error")
      ->capture_default_str()
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}));
  cmd.add_option("--progress", c.progress, "Live progress line: auto (on a terminal), on, off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
}

// --adapt and its bounds, each MIN:MAX.
void addRangeOption(CLI::App& cmd, const std::string& flag, std::pair<int64_t, int64_t>& range,
                    const std::string& help) {
  cmd.add_option_function<std::string>(
         flag,
         [&range, flag](const std::string& v) {
           const size_t colon = v.find(':');
           int64_t lo = 0, hi = 0;
           std::string error;
           // A bound past 2^40 is no setting of any knob: named as too large, not as a wrong form.
           if (colon == std::string::npos ||
               !orpheus::engine::cli::parseInteger(v.substr(0, colon), 0, orpheus::kMaxSize, &lo, &error) ||
               !orpheus::engine::cli::parseInteger(v.substr(colon + 1), 0, orpheus::kMaxSize, &hi, &error)) {
             const bool digits = colon != std::string::npos && !v.substr(0, colon).empty() &&
                                 !v.substr(colon + 1).empty() &&
                                 v.find_first_not_of("0123456789", 0) == colon &&
                                 v.find_first_not_of("0123456789", colon + 1) == std::string::npos;
             throw CLI::ValidationError(flag, digits ? fmt::format("MIN and MAX must be at most 2^40, got '{}'", v)
                                                     : "expected MIN:MAX (integers >= 0), got '" + v + "'");
           }
           range = {lo, hi};
         },
         help)
      ->type_name("MIN:MAX");
}

void addAdaptFlags(CLI::App& cmd, TrainConfig& c) {
  cmd.add_flag("--adapt", c.adapt,
               "Adaptive consistency: every --adapt-every clocks the coordinator sets C (the rank under "
               "--sv-rank), Q, s and R from what it measured, within the --adapt-* bounds (starting from "
               "--select or --sv-rank, --fanout, --staleness, --average-every); see engine/adapt/README.md");
  cmd.add_option("--adapt-every", c.adaptEvery, "With --adapt: clocks between decisions")
      ->capture_default_str()
      ->check(integerIn(1));
  addRangeOption(cmd, "--adapt-select", c.adaptSelect, "With --adapt: bounds of C (default 1:B)");
  addRangeOption(cmd, "--adapt-rank", c.adaptRank,
                 "With --adapt and --sv-rank R: bounds of the rank (default 1:min(4R, B-2), at least R)");
  addRangeOption(cmd, "--adapt-fanout", c.adaptFanout, "With --adapt: bounds of Q (default 1:P-1)");
  addRangeOption(cmd, "--adapt-staleness", c.adaptStaleness, "With --adapt under SSP: bounds of s (default 0:max(8,2s))");
  addRangeOption(cmd, "--adapt-average-every", c.adaptAverageEvery,
                 "With --adapt and --average-every R: bounds of R (default R/4:4R)");
  cmd.add_option("--adapt-comm-share", c.adaptCommShare,
                 "With --adapt: exposed communication under half this share of compute is slack (more peers, "
                 "averaging sooner)")
      ->capture_default_str()
      ->check(numberIn(0, std::numeric_limits<double>::infinity(), true));
  cmd.add_option("--max-bytes-per-clock", c.maxBytesPerClock,
                 "With --adapt: bytes a rank may send per clock (SV batches and averaging, amortized); the "
                 "controller never picks C, Q, R predicted to exceed it")
      ->check(numberIn(0, std::numeric_limits<double>::infinity(), true));
  cmd.add_flag("--adapt-bf16", c.adaptBf16,
               "With --adapt and --max-bytes-per-clock: the controller meets the budget by sending U and V as bf16 "
               "(as --sv-dtype bf16) before it lowers C, Q or R");
  cmd.add_option("--adapt-trace", c.adaptTrace,
                 "Testing aid, with --adapt: take compute, comm and wait seconds from this recorded metrics file "
                 "instead of measuring them, so decisions repeat");
}

void addBalanceFlags(CLI::App& cmd, TrainConfig& c) {
  cmd.add_flag("--balance", c.balance,
               "Load balancing (BSP): every --balance-every clocks the coordinator moves chunks of training rows from "
               "slow ranks to fast ones, and each rank's minibatch follows the rows it owns (the global batch stays "
               "P*B); see engine/README.md");
  cmd.add_option("--balance-every", c.balanceEvery,
                 "With --balance: clocks between decisions (each on the median time per example since the last)")
      ->capture_default_str()
      ->check(integerIn(1));
  cmd.add_option("--chunk-rows", c.chunkRows, "With --balance: training rows per chunk, the unit that moves")
      ->capture_default_str()
      ->check(integerIn(1));
}

}  // namespace

void addTrainFlags(CLI::App& cmd, TrainConfig& c, std::string& format) {
  addModelFlags(cmd, c, format);
  addOptimizerFlags(cmd, c);
  addSyncFlags(cmd, c);
  addAdaptFlags(cmd, c);
  addBalanceFlags(cmd, c);
  addCheckpointFlags(cmd, c);
  addRunFlags(cmd, c);
}

void addEvalFlags(CLI::App& cmd, EvalConfig& c, std::string& format) {
  cmd.add_option("--params", c.params, "HDF5 parameter file written by 'orpheus train --save'")->required();
  cmd.add_option("--model", c.model, "Model the parameters belong to: a .loss file or 'mlr'")->capture_default_str();
  cmd.add_option("--test", c.test, "Test data (IDX, LIBSVM, CSV or HDF5)")->required();
  cmd.add_option("--format", format, "Data format: auto, idx, libsvm, csv, hdf5, tokens")->capture_default_str();
  cmd.add_option("--features", c.features, "Fix the feature width (LIBSVM/CSV); default: the model's")
      ->check(integerIn(1));
}

namespace {

// --sim-slow FRACTION:FACTOR, strictly: a fraction in [0, 1] and a factor >= 1.
void parseSimSlow(const std::string& v, sim::Stragglers& s) {
  const auto colon = v.find(':');
  if (colon == std::string::npos) throw CLI::ValidationError("--sim-slow", "expected FRACTION:FACTOR, got '" + v + "'");
  std::string error;
  // A fraction of 0 or a factor of 1 would slow no worker: the flag would do nothing.
  if (!parseNumber(v.substr(0, colon), 0.0, 1.0, true, &s.fraction, &error) ||
      !parseNumber(v.substr(colon + 1), 1.0, 1e6, true, &s.factor, &error)) {
    throw CLI::ValidationError("--sim-slow", fmt::format("FRACTION in (0, 1] and FACTOR > 1 (else no worker is "
                                                         "slowed): {}", error));
  }
}

}  // namespace

// The simulated machine: workers, the network model, the computation.
void addSimulateFlags(CLI::App& cmd, sim::SimConfig& s, double& latencyUs) {
  cmd.add_option("--ranks", s.ranks, "P: workers to simulate, each a thread of this process")
      ->required()
      ->check(integerIn(1, 100000));
  cmd.add_option("--sim-link-gbps", s.network.linkGbps, "Network model: bandwidth of each link, Gbit/s each way")
      ->capture_default_str()
      ->check(numberIn(0, 1e6, true));
  cmd.add_option("--sim-latency-us", latencyUs, "Network model: latency of each message, microseconds")
      ->capture_default_str()
      ->check(numberIn(0, 1e9));
  cmd.add_option("--sim-nic-gbps", s.network.nicGbps,
                 "Network model: each NIC's limit, Gbit/s each way; messages serialize on it (0: the link's)")
      ->capture_default_str()
      ->check(numberIn(0, 1e6));
  cmd.add_option("--sim-core-gbps", s.network.coreGbps,
                 "Network model: the fabric's aggregate bandwidth, shared by the senders of an exchange (0: full "
                 "bisection)")
      ->capture_default_str()
      ->check(numberIn(0, 1e9));
  cmd.add_option("--sim-stack-gbps", s.network.stackGbps,
                 "Network model: the host's network stack, Gbit/s of a core it copies per byte sent or received "
                 "(kernel TCP; 0: free)")
      ->capture_default_str()
      ->check(numberIn(0, 1e9));
  static const NamedValues<sim::AllreduceAlgorithm> allreduceNames{{"ring", sim::AllreduceAlgorithm::kRing},
                                                                   {"tree", sim::AllreduceAlgorithm::kTree}};
  addEnumOption(cmd, "--sim-allreduce", s.network.allreduce, allreduceNames,
                "Network model: how an all-reduce (dense, PowerSGD's factors, averaging) is timed: ring, 2(P-1) steps "
                "of bytes/P; tree, 2 ceil(log2 P) steps of the whole buffer; each step pays the latency");
  cmd.add_option_function<std::string>(
         "--sim-slow", [&s](const std::string& v) { parseSimSlow(v, s.slow); },
         "Stragglers: FRACTION:FACTOR makes that fraction of the workers (at least one; chosen by --seed) compute "
         "FACTOR times as long every clock")
      ->type_name("FRACTION:FACTOR");
  cmd.add_option_function<std::string>(
         "--sim-membership",
         [&s](const std::string& v) {
           try {
             s.membership = sim::parseMembershipPlan(v);
           } catch (const InputError& e) {
             throw CLI::ValidationError(e.what());
           }
         },
         "Membership changes at clock boundaries, as a live job's: CLOCK:-N (the N highest-numbered ranks leave after "
         "CLOCK) or CLOCK:+N (N ranks join), comma-separated in clock order; every replica then starts from the "
         "average and the data is recut")
      ->type_name("CLOCK:±N,...");
  cmd.add_flag("--sim-multicast", s.network.multicast,
               "Network model: IP/IB multicast, one send reaches all of a message's receivers");
  cmd.add_option("--sim-compute-ms", s.computeMs,
                 "Computation per clock in milliseconds (0: measured, the thread CPU time of each worker's clock)")
      ->capture_default_str()
      ->check(numberIn(0, 1e9));
  cmd.add_option("--sim-cores", s.cpu.cores,
                 "Cores per simulated host, shared by its workers: with W workers on C < W cores each computes W/C "
                 "times as long as measured (0: a core per worker)")
      ->capture_default_str()
      ->check(integerIn(0, 1000000));
  cmd.add_option("--sim-hosts", s.cpu.hosts, "Simulated hosts the workers are spread over, in contiguous blocks")
      ->capture_default_str()
      ->check(integerIn(1, 100000));
  cmd.add_option("--sim-threads", s.threads, "Workers doing a clock's work at once (0: the machine's cores)")
      ->capture_default_str()
      ->check(integerIn(0, 4096));
}

std::string deviceName(const std::string& device) { return ops::deviceNameProblem(device); }

}  // namespace orpheus::engine::cli
