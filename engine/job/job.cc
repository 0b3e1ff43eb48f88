#include "engine/job/job.h"
#include "ops/model_factory.h"

#include "ckpt/layout.h"
#include "ckpt/model_file.h"
#include "comm/stall.h"
#include "engine/base/error.h"
#include "engine/base/memory.h"
#include "engine/recovery/checkpoint.h"
#include "ops/backends.h"
#include "engine/membership/elastic.h"
#include "engine/recovery/job_record.h"
#include "engine/membership/live.h"
#include "engine/metrics/metrics.h"
#include "engine/job/job_data.h"
#include "engine/job/job_resume.h"
#include "engine/outputs.h"
#include "engine/data/synthetic_data.h"
#include "engine/worker/part_options.h"
#include "engine/worker/power_sgd.h"
#include "engine/worker/worker.h"
#include "ops/graph_model.h"
#include "ops/loss_parser.h"
#include "ops/mlr.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cmath>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <filesystem>
#include <sstream>
#include <thread>

#include <time.h>
#include <unistd.h>

namespace orpheus::engine {

namespace {

// The paths this rank writes: rank 0 the model and the metrics, every rank its
// replica's files (ranks may sit on hosts of their own).
std::vector<OutputPath> outputsOf(const TrainConfig& config, bool leader) {
  std::vector<OutputPath> out;
  if (leader) {
    out.push_back({"--save", config.save, OutputPath::Kind::kFile});
    OutputPath metrics{"--metrics", config.metrics, OutputPath::Kind::kFile};
    metrics.stream = true;
    out.push_back(metrics);
  }
  out.push_back(replicasOutput(config.saveReplicas));
  if (config.ckptSv || config.ckptMatrix) out.push_back({"--ckpt-dir", config.ckptDir, OutputPath::Kind::kDirectory});
  return out;
}

void validateJob(const TrainConfig& config, comm::Transport& transport) {
  collectively(transport, [&] {
    validate(config, transport.size());
    if (config.ckptSv || config.resume) {
      ORPHEUS_CHECK_INPUT(!config.ckptDir.empty(), "--ckpt sv and --resume need --ckpt-dir DIR");
      ORPHEUS_CHECK_INPUT(config.sync == SyncMode::kSv, "--ckpt sv logs SV batches: it needs --sync sv");
    }
    ORPHEUS_CHECK_INPUT(!config.elastic || config.resume,
                        "--elastic continues a killed job on a different number of ranks: it needs --resume");
    ORPHEUS_CHECK_INPUT(!(config.resume && config.overwrite),
                        "--resume continues the job in --ckpt-dir and --overwrite replaces it: give one");
    if (config.resume) {
      ORPHEUS_CHECK_INPUT(std::filesystem::exists(std::filesystem::path(config.ckptDir) / "job.h5"),
                          "--resume: '{}' holds no checkpoint (no job.h5){}", config.ckptDir,
                          ckpt::jobFileHint(config.ckptDir));
      // Under SSP a batch may be in flight at any clock, so no clock holds a state
      // an uninterrupted run passes through: the job can continue from the log
      // (--elastic: the batches not yet applied at the resumed clock are dropped, as
      // a straggler's would be), but not exactly.
      ORPHEUS_CHECK_INPUT(config.consistency == Consistency::kBsp || config.elastic,
                          "--resume continues a job exactly only under --consistency bsp; under ssp, --resume "
                          "--elastic continues it from the log, without the batches in flight at the resumed clock");
    }
    checkInputExists("--train", config.train);
    checkInputExists("--test", config.test);
    if (config.adapt && !config.adaptTrace.empty()) {
      const adapt::Trace trace = adapt::Trace::read(config.adaptTrace);
      if (transport.rank() == 0 && trace.lastClock() < static_cast<uint64_t>(config.clocks)) {
        spdlog::warn("--adapt-trace '{}' ends at clock {}: the {} clocks after it take its last line's times",
                     config.adaptTrace, trace.lastClock(), static_cast<uint64_t>(config.clocks) - trace.lastClock());
      }
    }
    checkOutputs(outputsOf(config, transport.rank() == 0), inputsOf(config));
    if (transport.rank() == 0 && !config.resume && (config.ckptSv || config.ckptMatrix)) {
      claimCheckpointDir(config.ckptDir, config.overwrite);
    }
  });
}


// The job's ranks on this host, as mpirun says (1 where it does not).
int ranksOnThisHost() {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  return local != nullptr && std::atoi(local) > 0 ? std::atoi(local) : 1;
}

// --sync powersgd: which parameters its rank compresses, and what a clock all-reduces.
// A rank at which none is compressed is plain dense all-reduce: said as a warning.
void announcePowerSgd(const TrainConfig& config, const ops::Model& model) {
  int64_t compressed = 0, floats = 0, dense = 0;
  const auto shapes = model.paramShapes();
  for (const auto& [rows, cols] : shapes) {
    const int64_t r = PowerSgdReducer::compressedRank(rows, cols, config.svRank);
    compressed += r > 0 ? 1 : 0;
    floats += r > 0 ? (rows + cols) * r : rows * cols;
    dense += rows * cols;
  }
  if (compressed == 0) {
    spdlog::warn("--sync powersgd --sv-rank {}: no parameter of this model is compressed at that rank (a J x K matrix "
                 "is where 2 (J + K) r < J K), so every gradient is all-reduced whole, as with --sync dense",
                 config.svRank);
    return;
  }
  spdlog::info("PowerSGD at rank {} with error feedback and warm start: {} of {} parameters compressed, the rest "
               "all-reduced whole; {} floats a clock where --sync dense all-reduces {} ({:.1f}x fewer), after {} "
               "clocks that all-reduce every gradient whole",
               config.svRank, compressed, shapes.size(), floats, dense,
               static_cast<double>(dense) / static_cast<double>(std::max<int64_t>(1, floats)),
               PowerSgdReducer::kPlainClocks);
}

// --sv-rank R sends R + 1 SVGs of J + K floats a J x K matrix: where that is no
// fewer than the matrix's J K floats, the rank saves nothing on it, said as a warning.
void announceSvRankPastMatrices(const TrainConfig& config, const ops::Model& model) {
  std::vector<std::string> whole;
  for (const ops::ParamSpec& p : model.paramSpecs()) {
    if (p.cols > 1 && (config.svRank + 1) * (p.rows + p.cols) >= p.rows * p.cols) {
      whole.push_back(fmt::format("'{}' ({}x{})", p.name, p.rows, p.cols));
    }
  }
  if (whole.empty()) return;
  spdlog::warn("--sv-rank {}: its {} SVGs of J + K floats are no fewer than the J K floats of {}{}: the rank saves "
               "nothing there (a J x K update has rank at most min(J, K); give a lower --sv-rank, or --sync dense)",
               config.svRank, config.svRank + 1, fmt::join(whole.begin(), whole.begin() + std::min<size_t>(3, whole.size()), ", "),
               whole.size() > 3 ? fmt::format(" and {} more", whole.size() - 3) : "");
}

// Rank 0's log lines about the job (the example counts are a collective).
void announce(const TrainConfig& config, comm::Transport& transport, const ops::Model& model, const Shards& shards,
              const ops::Backend& backend) {
  const bool leader = transport.rank() == 0;
  double counts[2] = {static_cast<double>(shards.train.size()), static_cast<double>(shards.test.size())};
  transport.control().sum(counts);
  if (!leader) return;
  spdlog::info("{} rank{}, {} over {} ({} training examples, {} test), sync {}, {} clock{} of {} per rank",
               transport.size(), transport.size() == 1 ? "" : "s", model.spec(), transport.name(), static_cast<int64_t>(counts[0]),
               static_cast<int64_t>(counts[1]), toString(config.sync), config.clocks, config.clocks == 1 ? "" : "s",
               config.batch);
  if (backend.device() == ops::Device::kCpu) {
    spdlog::info("device {}", backend.describe());
  } else if (const std::string why = deviceResidency(config, model, backend); why.empty()) {
    spdlog::info("device {} (rank 0; resident: parameters, gradients and optimizer state stay there, SV batches "
                 "cross to the host for the wire and the log)",
                 backend.describe());
  } else {
    spdlog::info("device {} (rank 0; the rebuild and the dense gradient run there, the rest of a clock on the host: "
                 "{})",
                 backend.describe(), why);
  }
  if (backend.device() != ops::Device::kCpu && transport.size() > 1) {
    // Device buffers are never handed to the transport yet, even where it could take them.
    const bool staged = config.transfer == TransferMode::kStaged && config.sync == SyncMode::kSv &&
                        deviceResidency(config, model, backend).empty();
    spdlog::info("transfer: {} (SV batches and gradients cross host memory{}; transport {} {} device memory)",
                 staged ? "staged" : "sync",
                 staged ? ", each site copied on the device's copy queue during the pass" : "", transport.name(),
                 transport.deviceMemoryAware() ? "could take" : "cannot take");
  }
  if (config.sync == SyncMode::kSv && transport.size() > 1) {
    spdlog::info("{}; {} consistency{}; {}", comm::MulticastSchedule(scheduleConfig(config, transport.size())).describe(),
                 toString(config.consistency),
                 config.consistency == Consistency::kSsp ? fmt::format(" (staleness {})", config.staleness) : "",
                 config.select > 0 ? fmt::format("{} of {} SVGs sent per clock", config.select,
                                                 svgsPerClock(config, shards.train.steps))
                                   : "every SVG sent");
  }
  if (config.adapt && !config.resume && config.sync == SyncMode::kSv && transport.size() > 1) {
    // Knobs outside their bounds, or over the budget, move before the first clock.
    const adapt::ControllerOptions options = controllerOptions(config, shards.train.steps);
    const int fanout = comm::MulticastSchedule(scheduleConfig(config, transport.size())).fanout();
    const adapt::Decision d = adapt::Controller::start(options, transport.size(), model.paramShapes(), fanout);
    if (!(d.knobs == adapt::startKnobs(options, fanout))) {
      spdlog::warn("--adapt starts at {}, not at the flags' knobs: {}", adapt::toString(d.knobs), d.reason);
    }
  }
  if (const std::string why = threadsWarning(config.blasThreads, ranksOnThisHost()); !why.empty()) {
    spdlog::warn("{}", why);
  }
  const OptimizerSettings optimizer = optimizerSettings(config);
  spdlog::info("optimizer {}, lr {} ({} schedule{}){}", toString(optimizer.kind), optimizer.lr,
               toString(optimizer.schedule),
               optimizer.warmup > 0 ? fmt::format(", {} clocks of warmup", optimizer.warmup) : "",
               optimizer.weightDecay > 0 ? fmt::format(", weight decay {}", optimizer.weightDecay) : "");
  if (config.svRank > 0 && config.sync == SyncMode::kPowerSgd) {
    announcePowerSgd(config, model);
  } else if (config.svRank > 0) {
    spdlog::info("every replica applies each matrix's update at rank {} ({} SVGs), with error feedback{}", config.svRank,
                 config.svRank + 1, config.adapt ? "; --adapt moves the rank" : "");
    announceSvRankPastMatrices(config, model);
  }
  if (config.svDtype == SvDtype::kBf16) {
    spdlog::info("SVs sent as bf16: U and V rounded before they leave, half their bytes{}",
                 config.svRank > 0 ? "; the rounding error is carried forward with the rank's" : "");
  }
  if (shards.train.sparse && optimizer.touchesEveryEntry()) {
    spdlog::info("note: --optimizer {}{} updates every parameter entry each clock, so a clock costs the whole model, "
                 "not only the features the sparse input touches (sgd and adagrad without weight decay keep that cost)",
                 toString(optimizer.kind), optimizer.weightDecay > 0 ? " with --weight-decay" : "");
  }
  if (transport.size() == 1 && config.sync == SyncMode::kSv) {
    spdlog::info("note: one rank: no SV leaves it, so --sync sv only rebuilds each clock's update from its own SVs; "
                 "{}",
                 config.select > 0 || config.svRank > 0 || config.adapt
                     ? "the selection or rank shapes the update as it would on more ranks"
                     : "--sync dense computes the same update without the SV bookkeeping");
  }
  if (transport.size() == 1 && (config.averageEvery > 0 || config.rotateEvery > 0)) {
    spdlog::warn("one rank: --average-every and --rotate-every have nothing to do");
  } else if (config.sync != SyncMode::kSv) {
    // An all-reduce a clock keeps every replica the same.
    if (config.averageEvery > 0 && config.outerLr == 0.0) {
      spdlog::warn("--average-every {}: --sync {} keeps every replica the same, so averaging them changes nothing "
                   "(it only costs the all-reduce; --outer-lr makes it an outer step)",
                   config.averageEvery, toString(config.sync));
    }
    if (config.rotateEvery > 0) {
      spdlog::warn("--rotate-every {}: --sync {} keeps every replica the same, so rotating them changes nothing (it "
                   "only costs the transfers)",
                   config.rotateEvery, toString(config.sync));
    }
  }
  // Flags that were given (not their defaults) but shape nothing in this job. Warned,
  // not refused: a resumed job must repeat the flags its record holds.
  if (config.select == 0 && !config.adapt && config.selectMethod != SelectionMethod::kJmcssGram) {
    spdlog::warn("--select-method {} has nothing to select: every SVG is sent (give --select C or --adapt)",
                 toString(config.selectMethod));
  }
  // Every replica rebuilds the same gradient, so the pairs agree; but a compressed one
  // (error feedback catches up over later clocks) bends the curvature they estimate.
  if (isQuasiNewton(config.optimizer) && config.svRank > 0 && config.sync != SyncMode::kDense) {
    spdlog::warn("--optimizer {} with --sv-rank {}: its curvature pairs (s, y) are taken from rank-{} gradients, which "
                 "error feedback corrects only over later clocks; expect it to converge slower than without "
                 "--sv-rank",
                 toString(config.optimizer), config.svRank, config.svRank);
  }
  if (config.selectUnit == ops::Model::SvgUnit::kStep && config.sync != SyncMode::kSv) {
    spdlog::warn("--select-unit step shapes the SVGs --sync sv sends: --sync {} sends gradients, so it has nothing to do",
                 toString(config.sync));
  } else if (config.selectUnit == ops::Model::SvgUnit::kStep && config.svRank > 0) {
    spdlog::warn("--select-unit step picks the (example, step) pairs a selection sends: --sv-rank {} compresses each "
                 "matrix's whole update, so it has nothing to do",
                 config.svRank);
  }
  if (transport.size() == 1 && (config.adapt || config.balance)) {
    spdlog::warn("one rank: {} nothing to do (no bytes to budget, no rows to move between ranks)",
                 config.adapt && config.balance ? "--adapt and --balance have" : config.adapt ? "--adapt has"
                                                                                               : "--balance has");
  }
  if (config.test.empty() && config.evalEvery != TrainConfig{}.evalEvery) {
    spdlog::warn("--eval-every {} evaluates on the test data: without --test it has nothing to do",
                 config.evalEvery);
  }
  // A period longer than the job never comes round.
  const auto pastTheJob = [&](const char* flag, int64_t every, const char* what) {
    if (every > config.clocks) {
      spdlog::warn("{} {} is longer than the job's {} clocks: it never {}", flag, every, config.clocks, what);
    }
  };
  if (transport.size() > 1) {
    pastTheJob("--average-every", config.averageEvery, "averages the replicas");
    pastTheJob("--rotate-every", config.rotateEvery, "rotates the replicas");
  }
  if (config.lrSchedule == LrScheduleKind::kStep) pastTheJob("--lr-step-every", config.lrStepEvery, "decays --lr");
  if (transport.size() > 1 && config.balance) {
    pastTheJob("--balance-every", config.balanceEvery, "moves data between ranks");
    // A rank keeps at least one chunk: one chunk a rank leaves nothing to move.
    if (config.chunkRows >= static_cast<int64_t>(shards.train.size())) {
      spdlog::warn("--chunk-rows {}: rank 0's shard of {} rows is one chunk, and a rank keeps at least one, so "
                   "--balance can move none (give a chunk fewer rows)",
                   config.chunkRows, static_cast<int64_t>(shards.train.size()));
    }
  }
  if (transport.size() == 1 && config.dropLinks > 0.0) {
    spdlog::warn("one rank: --drop-links {} has no links to drop", config.dropLinks);
  }
  if (transport.size() == 1 && config.fanout > 0) {
    spdlog::warn("one rank: --fanout {} has no peers to send to", config.fanout);
  }
  // Every replica applies the same SVs in the same clock: they stay one replica (under
  // --ckpt sv, averaging still writes the snapshots restore and --resume start from).
  if (transport.size() > 1 && config.sync == SyncMode::kSv && config.averageEvery > 0 && config.outerLr == 0.0 &&
      !config.ckptSv &&
      config.consistency == Consistency::kBsp && config.multicast == comm::MulticastKind::kAll &&
      config.select == 0 && config.svRank == 0 && !config.adapt && config.dropLinks == 0.0 &&
      config.svDtype == SvDtype::kF32) {
    spdlog::warn("--average-every {}: under BSP, with every SVG sent to every rank, every replica applies the same "
                 "updates, so averaging them changes nothing (it only costs the all-reduce; --select, --multicast or "
                 "--consistency ssp let replicas differ)",
                 config.averageEvery);
  }
  // --overlap streams each layer's SVs to every peer within the clock; a batch that may
  // go point to point (SSP, multicast, broken links) or per (example, step) waits for
  // the backward pass to end.
  if (config.overlap && config.sync == SyncMode::kSv && transport.size() > 1) {
    const comm::MulticastSchedule schedule(scheduleConfig(config, transport.size()));
    const char* why = config.consistency == Consistency::kSsp              ? "--consistency ssp"
                      : schedule.fanout() < transport.size() - 1           ? "a multicast to fewer than every peer"
                      : config.dropLinks > 0.0                             ? "--drop-links"
                      : config.selectUnit == ops::Model::SvgUnit::kStep    ? "--select-unit step"
                      : model.svSites().empty()                            ? "a model without SV sites"
                                                                           : nullptr;
    if (why != nullptr) {
      spdlog::warn("--overlap: under {} a clock's SVs are sent once the backward pass ends, so it has nothing to "
                   "overlap",
                   why);
    }
  }
  if (config.paramDigests && config.metrics.empty()) {
    spdlog::warn("--param-digests adds each clock's digest to the metrics: without --metrics it has nothing to do");
  }
  if (config.device == "cpu" && (!config.resident || config.transfer != TransferMode::kStaged)) {
    spdlog::warn("--resident and --transfer shape a replica on a device: on --device {} they have nothing to do",
                 config.device);
  }
}

// This rank's backend, the job's one (--device), made once and handed down
// (collective: a rank that cannot make it reports, none hangs).
std::unique_ptr<ops::Backend> makeJobBackend(const TrainConfig& config, comm::Transport& transport) {
  std::unique_ptr<ops::Backend> backend;
  collectively(transport, [&] { backend = ops::makeBackend(config.device); });
  return backend;
}

struct Outputs {
  std::unique_ptr<ops::Model> model;
  std::unique_ptr<MetricsWriter> metrics;  // rank 0's file; a sink that discards elsewhere
};

// The model and the metrics file (the outputs were checked by validateJob).
Outputs makeModelAndOutputs(const TrainConfig& config, bool leader, const Shards& shards) {
  Outputs out;
  out.model = ops::makeModel({config.model, "", ""}, shards.features, shards.classes, config.seed);
  configureModel(config, *out.model, shards.train.steps);
  checkLabelsFit("--train", config.train, shards.train, *out.model, config.model);
  if (shards.haveTest) checkLabelsFit("--test", config.test, shards.test, *out.model, config.model);
  out.metrics = std::make_unique<MetricsWriter>(leader ? config.metrics : std::string());
  return out;
}

Outputs buildModelAndOutputs(const TrainConfig& config, comm::Transport& transport, const Shards& shards) {
  Outputs out;
  collectively(transport, [&] { out = makeModelAndOutputs(config, transport.rank() == 0, shards); });
  return out;
}

void runWorker(Worker& worker, MetricsWriter& metrics, comm::Transport& transport) {
  try {
    worker.run(metrics);
  } catch (const JobFailed&) {
    throw;  // reported once, every rank stops
  } catch (const comm::StallError& e) {
    if (e.reports()) {
      // A control-plane agreement does not know the clock; the loop does.
      const std::string what = e.what();
      reportError(what.find("clock") != std::string::npos ? what
                                                           : fmt::format("{} (at clock {})", what, notedClock()));
    } else {
      // A lower rank timed out too and reports for the job: give it the time to
      // print and end the job, then end it anyway.
      leaveReportToPeer();
      std::this_thread::sleep_for(comm::stallGrace(transport.timeout()) + std::chrono::seconds(2));
    }
    transport.control().abortJob(exitCodeFor(e));
  } catch (const Diverged& e) {
    // Peers whose loss went the same way at this clock say so too: the lowest such
    // rank reports for all of them, once (a note each, as comm/stall.h does).
    const comm::StallVerdict v =
        comm::findStalled(transport.control(), transport.rank(), transport.size(), e.clock());
    if (v.reports) {
      std::vector<int> ranks = v.waiting;
      ranks.insert(ranks.begin(), transport.rank());
      reportError(fmt::format("training diverged at clock {}: the loss is not finite on {} ({})", e.clock(),
                              comm::rankList(ranks), e.hint()));
    } else {
      leaveReportToPeer();
      std::this_thread::sleep_for(comm::stallGrace(transport.timeout()) + std::chrono::seconds(2));
    }
    transport.control().abortJob(exitCodeFor(e));
  } catch (const std::exception& e) {
    // Peers cannot know about this rank's failure: report it and end the job.
    reportError(e.what());
    transport.control().abortJob(exitCodeFor(e));
  }
}

// Every rank's replica (--save-replicas), rank 0's model (--save) and its one-line result.
void saveAndReport(const TrainConfig& config, const comm::Transport& transport, const Worker& worker,
                   const ops::Model& model, const Shards& shards) {
  ckpt::ModelFileInfo info;
  info.modelSpec = model.spec();
  info.modelDigest = model.textDigest();
  info.clock = static_cast<int64_t>(worker.lastClock());
  info.seed = config.seed;
  info.features = shards.features;
  info.classes = shards.classes;
  info.replica = worker.replicaId();
  // The parameters at the file's root, the optimizer state in its own group (/optimizer).
  const auto save = [&](const std::string& path) {
    if (worker.optimizer().hasState()) {
      ckpt::saveParams(path, withState(worker.replica(), worker.optimizer().exportState()), info);
    } else {
      ckpt::saveParams(path, worker.replica(), info);
    }
  };
  if (!config.saveReplicas.empty()) {
    createDirectories(config.saveReplicas, "--save-replicas ");  // checked at start: it may be new
    save(fmt::format("{}/replica-{}.h5", config.saveReplicas, worker.replicaId()));
  }
  if (transport.rank() != 0) return;
  // Through a symlink to the file it names: the link stays (engine/outputs.h).
  if (!config.save.empty()) save(resolveOutput(config.save));
  const EvalResult& eval = worker.lastEval();
  std::printf("trained %s on %d rank%s: %lld clock%s in %.2f s", model.spec().c_str(), transport.size(),
              transport.size() == 1 ? "" : "s", static_cast<long long>(worker.lastClock()),
              worker.lastClock() == 1 ? "" : "s", worker.trainSeconds());
  if (shards.haveTest && model.hasAccuracy()) std::printf(", test accuracy %.4f", eval.accuracy);
  if (shards.haveTest) std::printf(", test loss %.4f", eval.loss);
  std::printf("%s\n", targetOutcome(config.targetAccuracy, worker.reachedTarget(), worker.lastClock()).c_str());
  if (!config.metrics.empty()) std::printf("metrics: %s\n", config.metrics.c_str());
  if (!config.save.empty()) std::printf("model: %s\n", config.save.c_str());
  std::fflush(stdout);
}

// Whether ranks may leave this job while it runs (engine/membership/live.h); if so, SIGTERM on
// a rank other than 0 is its notice, and a request left over from an earlier run of
// the job is dropped.
bool enableLive(const TrainConfig& config, comm::Transport& transport, const LiveGroup* live) {
  // --balance lays its chunk ownership out over a fixed set of ranks (engine/coordinator/balance.h):
  // such a job keeps its membership.
  if (live == nullptr || !config.ckptSv || config.sync != SyncMode::kSv || config.consistency != Consistency::kBsp ||
      transport.size() < 2 || config.balance) {
    return false;
  }
  if (transport.rank() != 0) {
    installLeaveNotice();
  } else {
    std::error_code ec;
    if (std::filesystem::remove(membershipRequestPath(config.ckptDir), ec)) {
      spdlog::warn("dropped a membership request left in '{}' before the job started", config.ckptDir);
    }
    markLive(config.ckptDir);
  }
  return true;
}

// The live membership change after `clock` (engine/membership/live.h), once every rank of
// `group` has drained the clock and made its log durable, and the leaving ranks
// have freed their replica, data and buffers. One agreement over the old group
// tells every rank the logs are on disk and carries each leaver's release latency
// to rank 0, which records it (a `left` line in the metrics); then the ranks that
// stay form the next group, and the new ranks join it (a `joined` line). Returns
// its transport; null on a leaving rank.
std::unique_ptr<comm::Transport> changeMembership(comm::Transport& group, LiveGroup& live, const Change& change,
                                                  uint64_t clock, MetricsWriter& metrics) {
  const bool stays = !change.leaves(group.rank());
  const double released = stays ? 0.0 : wallSeconds() - change.noticeAt[static_cast<size_t>(group.rank())];
  std::vector<double> latency(static_cast<size_t>(group.size()), 0.0);
  latency[static_cast<size_t>(group.rank())] = released;
  group.control().sum(latency);
  const int remaining = group.size() - static_cast<int>(change.leaving.size());
  if (group.rank() == 0) {
    for (int r : change.leaving) {
      JsonLine line;
      line.add("left", true)
          .add("rank", r)
          .add("clock", clock)
          .add("ranks", remaining)
          .add("release_seconds", latency[static_cast<size_t>(r)]);
      metrics.write(line);
    }
    if (!change.leaving.empty()) {
      spdlog::info("after clock {}: rank{} {} left ({} ranks remain)", clock, change.leaving.size() > 1 ? "s" : "",
                   fmt::format("{}", fmt::join(change.leaving, ", ")), remaining);
    }
  }
  double seconds = 0.0;
  std::unique_ptr<comm::Transport> next = regroup(group, live, change, clock, &seconds);
  if (next == nullptr) {
    spdlog::info("left after clock {}: replica, data and buffers freed {:.3f} s after the notice", clock, released);
    return nullptr;
  }
  if (change.joining > 0 && next->rank() == 0) {
    JsonLine line;
    line.add("joined", change.joining).add("clock", clock).add("ranks", next->size()).add("spawn_seconds", seconds);
    metrics.write(line);
    spdlog::info("after clock {}: {} ranks joined in {:.2f} s ({} ranks)", clock, change.joining, seconds,
                 next->size());
  }
  return next;
}

// The job's clocks from its worker on, one membership epoch per pass: from
// `resumeClock` (a fresh or resumed job), or as a new epoch after `changedAfter`
// (a rank that joined a running job). Returns 0, also on a rank that left.
int trainEpochs(const TrainConfig& config, const Outputs& out, ops::Backend& backend, comm::Transport& first,
                LiveGroup* live, std::unique_ptr<Shards> shards, uint64_t resumeClock, uint64_t changedAfter) {
  comm::Transport* group = &first;
  std::unique_ptr<comm::Transport> regrouped;  // after a live change
  // A job that fails takes no more requests: its marker goes with it (endLive on success).
  struct LiveMarker {
    const std::string* dir = nullptr;
    ~LiveMarker() {
      if (dir != nullptr && std::uncaught_exceptions() > 0) dropLive(*dir);
    }
  } marker{live != nullptr && first.rank() == 0 ? &config.ckptDir : nullptr};
  Worker::RunTotals totals;  // the earlier epochs'
  for (;;) {
    std::optional<MembershipWatch> watch;
    if (live != nullptr) watch.emplace(*live, *group, config.ckptDir, group->timeout());
    {
      Worker worker(config, *out.model, backend, *group, shards->train, shards->haveTest ? &shards->test : nullptr);
      if (changedAfter == 0) {
        resume(worker, config, *group, *out.model, resumeClock);
      } else {
        std::vector<Epoch> epochs;
        collectively(*group, [&] { epochs = readMembership(config.ckptDir); });
        resumeElastic(worker, config, *group, *out.model, epochs, changedAfter, true);
      }
      worker.continueRun(totals);
      worker.watchMembership(watch ? &*watch : nullptr);
      runWorker(worker, *out.metrics, *group);
      if (worker.changesAfter() == 0) {
        if (watch) watch->settle();
        if (live != nullptr && group->rank() == 0) endLive(config.ckptDir);
        saveAndReport(config, *group, worker, *out.model, *shards);
        out.metrics->complete();
        return 0;
      }
      changedAfter = worker.changesAfter();
      totals = worker.runTotals();
    }
    // The membership changes after `changedAfter`: the worker is gone; the data goes too.
    const int64_t features = shards->features;
    const int64_t classes = shards->classes;
    shards.reset();
    std::unique_ptr<comm::Transport> next = changeMembership(*group, *live, watch->change(), changedAfter, *out.metrics);
    if (next == nullptr) return 0;  // this rank left
    regrouped = std::move(next);
    group = regrouped.get();
    shards = reshard(config, *group, features, classes);
  }
}

}  // namespace

int runTrain(const TrainConfig& config, comm::Transport& transport, LiveGroup* live) {
  transport.setTimeout(std::chrono::milliseconds(static_cast<int64_t>(config.timeoutSeconds * 1000)));
  validateJob(config, transport);
  auto shards = std::make_unique<Shards>();
  loadTrainShard(config, transport, *shards);
  loadTestShard(config, transport, *shards);
  const Outputs out = buildModelAndOutputs(config, transport, *shards);
  collectively(transport, [&] {
    // Ranks of one host share its memory.
    const int onHost = ranksOnThisHost();
    checkJobMemory(config, *out.model,
                   {shards->features, shards->classes, shards->train.steps, shards->train.sparse}, onHost, onHost);
    const int fanout = comm::MulticastSchedule(scheduleConfig(config, transport.size())).fanout();
    adapt::Controller::checkBudget(controllerOptions(config, shards->train.steps), transport.size(), out.model->paramShapes(), fanout);
  });
  const std::unique_ptr<ops::Backend> backend = makeJobBackend(config, transport);
  announce(config, transport, *out.model, *shards, *backend);
  const uint64_t resumeClock = prepareCheckpointDir(config, transport, *out.model, *shards);
  if (!enableLive(config, transport, live)) live = nullptr;
  return trainEpochs(config, out, *backend, transport, live, std::move(shards), resumeClock, 0);
}

int joinTrain(const TrainConfig& config, comm::Transport& transport, LiveGroup& live, uint64_t clock) {
  transport.setTimeout(std::chrono::milliseconds(static_cast<int64_t>(config.timeoutSeconds * 1000)));
  // As the group's ranks do after their grow(): the data over the grown group.
  std::unique_ptr<Shards> shards = reshard(config, transport, -1, -1);
  const Outputs out = makeModelAndOutputs(config, false, *shards);
  // Not collectively: the running ranks made theirs at the start, and a collective
  // here would be one they do not take part in.
  const std::unique_ptr<ops::Backend> backend = ops::makeBackend(config.device);
  installLeaveNotice();
  return trainEpochs(config, out, *backend, transport, &live, std::move(shards), 0, clock);
}

}  // namespace orpheus::engine
