#include "engine/recovery/checkpoint.h"
#include "engine/worker/device_replica.h"
#include "ops/model_factory.h"

#include "ckpt/layout.h"
#include "ckpt/model_file.h"
#include "engine/base/error.h"
#include "engine/base/sv_batch.h"
#include "ckpt/replay.h"
#include "engine/failures.h"
#include "engine/recovery/job_record.h"
#include "engine/worker/select.h"
#include "ops/graph_model.h"
#include "ops/mlr.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <set>

namespace orpheus::engine {

std::unique_ptr<ops::Model> modelOfJob(const ckpt::JobInfo& job) {
  ORPHEUS_CHECK_INPUT(job.modelName == "mlr" || !job.modelText.empty(),
                      "checkpoint: model '{}' has no stored definition", job.modelName);
  return ops::makeModel({job.modelName, job.modelText, job.modelSpec}, job.features, job.classes, job.seed);
}

namespace {

// What a snapshot of the job holds: the parameters, then the optimizer state (and
// the outer step's momentum).
ParamSet shapesOf(const ops::Model& model, uint64_t seed, const OptimizerSettings& settings) {
  return snapshotShapes(model.initParams(seed), settings);
}

OptimizerSettings settingsOfJob(const ckpt::JobInfo& job) {
  if (job.computation.empty()) return {};  // written before optimizers: sgd
  return recordedOptimizer(decodeRecord(job.computation, "job.h5"));
}

// What replica `replica` can restore up to `upTo` (0: all; `newest`: only what the
// replay of upTo from the newest usable snapshot needs), snapshots checked against
// `shapes`.
ckpt::ReplicaRestorability restorableOf(const std::string& dir, int replica, uint64_t upTo, const ParamSet& shapes,
                                        bool newest = false) {
  ckpt::InspectScope scope;
  scope.replica = replica;
  scope.upTo = upTo;
  scope.fromNewestSnapshot = newest;
  scope.shapes = &shapes;
  return ckpt::findRestorable(ckpt::inspect(dir, scope), replica);
}

// `clock` 0: the newest restorable clock was asked for, and there is none (the
// message says why clock 1 is not, the first any replay would reach).
[[noreturn]] void throwNotRestorable(const std::string& dir, int replica, uint64_t clock, const ParamSet& shapes,
                                     const std::string& replayError = "") {
  const std::string target = clock == 0 ? std::string("to its newest clock (none is restorable)")
                                        : fmt::format("to clock {}", clock);
  // Every replica's whole log, for the list of what is restorable: a replay may
  // need the batches other replicas logged.
  ckpt::InspectScope scope;
  scope.shapes = &shapes;
  const ckpt::ReplicaRestorability r = ckpt::findRestorable(ckpt::inspect(dir, scope), replica);
  if (r.pieces.empty() && ckpt::listSegments(ckpt::replicaDir(dir, replica)).empty()) {
    throw InputError(fmt::format("cannot restore replica {} {}: checkpoint '{}' holds no log of replica {}", replica,
                                 target, dir, replica));
  }
  const uint64_t first = std::max<uint64_t>(clock, 1);
  const std::string why = !r.covers(first)         ? r.whyNot(first)
                          : replayError.empty() ? std::string("its replay failed")
                                                : replayError;
  throw InputError(fmt::format("cannot restore replica {} {}: {}; restorable: clocks {}", replica, target, why,
                               r.describe()));
}

// A replica as replayed: its parameters and optimizer state (Optimizer::exportState()).
struct Replica {
  ParamSet params;
  ParamSet optimizerState;
  OuterState outer;
};

// Rebuilds one replica's states by the replays ckpt/restorable.h describes, from the
// stream ckpt/replay.h gives (LogReplay).
class Replayer {
 public:
  Replayer(const std::string& dir, const ops::Model& model, ops::Backend& backend, uint64_t seed,
           const OptimizerSettings& settings, int replica, const ckpt::ReplicaRestorability& restorable)
      : dir_(dir), model_(model), backend_(backend), seed_(seed), settings_(settings), replica_(replica),
        restorable_(restorable) {
    expect_.paramShapes = model.paramShapes();
  }

  // The replica at the end of its local clock `clock`, which is restorable; `from`
  // gets the snapshot the replay started from (0: W0). Groups go through the same
  // optimizer steps as in training (ReplicaUpdater): a local clock's step is taken
  // at the next clock's first group, at any other event, and at the end.
  Replica at(uint64_t clock, uint64_t* from) {
    const uint64_t start = restorable_.startFor(clock);
    ParamSet params = model_.initParams(seed_);
    OuterState outer;  // the snapshot's; none from W0
    ReplicaUpdater updater(settings_, model_, backend_);
    if (start > 0) {
      auto snap = ckpt::readSnapshot(dir_, start, shapesOf(model_, seed_, settings_));
      if (!snap) {
        throw InputError(fmt::format("cannot restore replica {} to clock {}: the snapshot of clock {} became unusable",
                                     replica_, clock, start));
      }
      auto [snapParams, snapState] = splitState(std::move(*snap), params.size());
      params = std::move(snapParams);
      outer = outerStateOf(params, snapState);
      updater.optimizer().importState(snapState);
    }
    *from = start;
    if (clock == start) return {std::move(params), updater.optimizer().exportState(), std::move(outer)};
    // Where training keeps its replica on the device, the replay does too: the same
    // operations, so the same bits.
    if (residencyRefusal(model_, backend_).empty()) updater.reside(params);

    for (const ckpt::LogEntry& e : log_.entries(start, clock)) {
      switch (e.kind) {
        case ckpt::EventKind::kAveraged:
          // Unreachable for a restorable clock; kept as the contract's guard.
          throw InputError(fmt::format(
              "cannot restore replica {} to clock {}: the replicas were averaged at clock {} and no usable snapshot "
              "of it was kept (train with --snapshot-every 1)",
              replica_, clock, e.clock));
        case ckpt::EventKind::kReset: {
          updater.finishClock(params);
          // The replay stands where the log before the reset ends (or at the
          // snapshot it started from, if that is later).
          const uint64_t here = std::max(start, e.logEnd);
          if (e.resetTo > here) {
            throw InputError(fmt::format(
                "cannot restore replica {} to clock {}: a failure at clock {} reset it to the snapshot of clock {}, "
                "which is missing or damaged",
                replica_, clock, e.clock, e.resetTo));
          }
          if (e.resetTo < here) {
            uint64_t ignored = 0;
            Replica back = at(e.resetTo, &ignored);
            updater.toHost(params);
            params = std::move(back.params);
            updater.optimizer().importState(back.optimizerState);
            updater.hostChanged();
          }
          break;
        }
        case ckpt::EventKind::kGroup:
          applyGroup(e, params, updater);
          break;
        case ckpt::EventKind::kMembership:
        case ckpt::EventKind::kChunks:
          break;  // records of the job (ckpt/replay.h): nothing happened to the replica
        case ckpt::EventKind::kKnobs:
          // Taken at a barrier, after the clock's step; the batches carry what the knobs did.
          updater.finishClock(params);
          break;
        default:
          updater.finishClock(params);  // rotation: the clock's step was taken before the state moved
          break;
      }
    }
    updater.settle(params);
    return {std::move(params), updater.optimizer().exportState(), std::move(outer)};
  }

  size_t groups() const { return groups_; }

 private:
  // A snapshot's outer state (--outer-lr): its parameters are the anchor, and the
  // momentum ends its state (moved out of `state`, which the optimizer imports).
  OuterState outerStateOf(const ParamSet& params, ParamSet& state) const {
    OuterState out;
    if (!settings_.outerMomentumInSnapshots) return out;
    const size_t kept = state.size() - params.size();
    auto [optimizerState, momentum] = splitState(std::move(state), kept);
    state = std::move(optimizerState);
    out.anchor = params;
    out.momentum = std::move(momentum);
    return out;
  }

  // One clock's group, applied as the worker applied it: its batches (the
  // replica's own decoded, the others' recomputed from their senders' logs) rebuilt
  // together, in logged order, through the optimizer's step.
  void applyGroup(const ckpt::LogEntry& group, ParamSet& params, ReplicaUpdater& updater) {
    std::vector<SvBatch> batches;
    batches.reserve(group.records.size());
    for (const auto& r : group.records) {
      const auto ref = ckpt::parseBatchRef(r);
      batches.push_back(ref ? received(*ref) : decode(r, expect_));
    }
    std::vector<const SvBatch*> ptrs;
    for (const auto& b : batches) ptrs.push_back(&b);
    updater.applyGroup(group.clock, ptrs, params);
    ++groups_;
  }

  // What the replica applied for a reference: what the worker computed live, by the
  // same steps: the sender's whole batch as its log holds it (decoded, as the
  // sender's own replica had it), its selection (engine/worker/select.h: selectForPeers),
  // encoded by the sender and decoded by the receiver. Bitwise the batch the
  // receiver applied.
  SvBatch received(const ckpt::BatchRef& ref) {
    SvBatchExpectation expect = expect_;
    expect.clock = static_cast<int64_t>(ref.clock);
    expect.sender = static_cast<int64_t>(ref.sender);
    SvBatch local = decode(log_.batch(ref), expect);
    SelectionMethod method = SelectionMethod::kJmcss;
    try {
      method = selectionMethodFromLog(ref.method);
    } catch (const InputError& e) {
      throw InputError(fmt::format("the SV log in {}: sender {}'s batch of clock {}: {}", dir_, ref.sender, ref.clock,
                                   e.what()));
    }
    GramSource gramSource{&backend_, {}, &gramOperand_, &grams_};
    std::optional<SvBatch> selected =
        selectForPeers(local, ref.select, method, seed_, ref.clock, static_cast<int>(ref.sender), gramSource);
    if (!selected) return local;
    return decode(encode(*selected), expect);
  }

  const std::string& dir_;
  const ops::Model& model_;
  ops::Backend& backend_;
  uint64_t seed_;
  OptimizerSettings settings_;
  int replica_;
  const ckpt::ReplicaRestorability& restorable_;
  ckpt::LogReplay log_{dir_, replica_};  // the replica's stream, and the batches it references
  SvBatchExpectation expect_;
  size_t groups_ = 0;
  ops::Tensor gramOperand_, grams_;  // jmcss-gram's device buffers, reused reference after reference
};

Restored replay(const std::string& dir, const ops::Model& model, ops::Backend& backend, uint64_t seed,
                const OptimizerSettings& settings, int replica, uint64_t clock,
                const ckpt::ReplicaRestorability& restorable) {
  Restored out;
  out.replica = replica;
  out.clock = clock;
  Replayer replayer(dir, model, backend, seed, settings, replica, restorable);
  Replica r = replayer.at(clock, &out.fromSnapshot);
  out.params = std::move(r.params);
  out.optimizerState = std::move(r.optimizerState);
  out.outer = std::move(r.outer);
  out.groupsReplayed = replayer.groups();
  return out;
}

// A replay that finds a batch it references unreadable (a damaged sender log,
// which a scoped inventory does not look at) is refused like any clock that is
// not restorable.
Restored replayOrExplain(const std::string& dir, const ops::Model& model, ops::Backend& backend, uint64_t seed,
                         const OptimizerSettings& settings, int replica, uint64_t clock,
                         const ckpt::ReplicaRestorability& restorable, const ParamSet& shapes) {
  try {
    return replay(dir, model, backend, seed, settings, replica, clock, restorable);
  } catch (const ckpt::BatchUnavailable& e) {
    throwNotRestorable(dir, replica, clock, shapes, e.what());
  }
}

void requireCheckpointDir(const std::string& dir) {
  std::error_code ec;
  ORPHEUS_CHECK_INPUT(std::filesystem::is_regular_file(ckpt::jobPath(dir), ec),
                      "'{}' is not a checkpoint directory (no {}){}", dir, ckpt::jobPath(dir).filename().string(),
                      ckpt::jobFileHint(dir));
}

}  // namespace

CheckpointView inspectCheckpoint(const std::string& dir) {
  requireCheckpointDir(dir);
  const ckpt::JobInfo job = ckpt::readJobInfo(dir);
  const ParamSet shapes = shapesOf(*modelOfJob(job), job.seed, settingsOfJob(job));
  ckpt::InspectScope scope;
  scope.shapes = &shapes;
  CheckpointView view;
  view.inventory = ckpt::inspect(dir, scope);
  view.restorable = ckpt::findRestorable(view.inventory);
  return view;
}

Restored restore(const std::string& dir, const ops::Model& model, uint64_t seed, const OptimizerSettings& settings,
                 int replica, uint64_t clock, ops::Backend& backend) {
  ORPHEUS_CHECK_INPUT(clock > 0, "cannot restore replica {} to clock 0: that is W0", replica);
  const ParamSet shapes = shapesOf(model, seed, settings);
  // Usually all a restore needs to read is the newest usable snapshot and the log
  // after it; only a reset back past that snapshot needs what lies before it.
  ckpt::ReplicaRestorability restorable = restorableOf(dir, replica, clock, shapes, /*newest=*/true);
  if (!restorable.covers(clock)) restorable = restorableOf(dir, replica, clock, shapes);
  if (!restorable.covers(clock)) throwNotRestorable(dir, replica, clock, shapes);
  return replayOrExplain(dir, model, backend, seed, settings, replica, clock, restorable, shapes);
}

Restored restore(const std::string& dir, int replica, uint64_t clock, ops::Backend& backend) {
  requireCheckpointDir(dir);
  const ckpt::JobInfo job = ckpt::readJobInfo(dir);
  const std::vector<ckpt::Epoch> epochs = ckpt::readMembership(dir);
  const int replicas = ckpt::replicaCount(epochs);
  ORPHEUS_CHECK_INPUT(replica >= 0 && replica < replicas, "checkpoint '{}' has no replica {} (it has {})", dir,
                      replica, replicas);
  // A replica a grow added began as the average at the clock it joined after.
  const uint64_t joined = ckpt::replicaJoined(epochs, replica);
  ORPHEUS_CHECK_INPUT(clock == 0 || clock >= joined,
                      "replica {} of '{}' joined the job after clock {}: it has no clock {} (then the job ran on {} "
                      "rank{}; restore one of those replicas)",
                      replica, dir, joined, clock, ckpt::epochAfter(epochs, clock).ranks,
                      ckpt::epochAfter(epochs, clock).ranks == 1 ? "" : "s");
  const auto model = modelOfJob(job);
  const OptimizerSettings settings = settingsOfJob(job);
  if (clock > 0) return restore(dir, *model, job.seed, settings, replica, clock, backend);
  const ParamSet shapes = shapesOf(*model, job.seed, settings);
  // Every replica's whole log: the newest clock depends on the batches the replica
  // references too (a damaged sender log ends it sooner).
  ckpt::InspectScope scope;
  scope.shapes = &shapes;
  const ckpt::ReplicaRestorability restorable = ckpt::findRestorable(ckpt::inspect(dir, scope), replica);
  if (restorable.latest() == 0) throwNotRestorable(dir, replica, 0, shapes);
  return replayOrExplain(dir, *model, backend, job.seed, settings, replica, restorable.latest(), restorable, shapes);
}

uint64_t resumableClock(const ckpt::Inventory& inv) { return resumableClock("", inv, 0, -1); }

uint64_t resumableClock(const std::string& dir, const ckpt::Inventory& inv, int carriedStateRanks, int members) {
  if (inv.replicas.empty()) return 0;  // killed before its first segment: start over
  const ckpt::Restorability restorable = ckpt::findRestorable(inv);
  // Clocks at which every replica's log ends an intact segment and restores.
  std::set<uint64_t> common;
  bool firstReplica = true;
  for (const auto& r : inv.replicas) {
    if (members >= 0 && r.replica >= members) continue;
    const ckpt::ReplicaRestorability* view = restorable.replica(r.replica);
    std::set<uint64_t> ends = {0};
    for (const auto& s : r.segments) {
      if (s.intact && view->covers(s.lastClock)) ends.insert(s.lastClock);
    }
    std::erase_if(ends, [&](uint64_t clock) {
      for (int rank = 0; clock > 0 && rank < carriedStateRanks; ++rank) {
        std::error_code ec;
        if (!std::filesystem::is_regular_file(ckpt::statesPath(dir, clock, rank), ec)) return true;
      }
      return false;
    });
    if (firstReplica) {
      common = ends;
      firstReplica = false;
    } else {
      std::set<uint64_t> both;
      std::set_intersection(common.begin(), common.end(), ends.begin(), ends.end(), std::inserter(both, both.end()));
      common = std::move(both);
    }
  }
  return common.empty() ? 0 : *common.rbegin();
}

ParamSet loadCarriedState(const std::string& dir, uint64_t clock, int rank) {
  return ckpt::loadParams(ckpt::statesPath(dir, clock, rank).string());
}

void discardAfter(const std::string& dir, uint64_t clock) {
  namespace fs = std::filesystem;
  const ckpt::Inventory inv = ckpt::inspect(dir);
  for (const auto& r : inv.replicas) {
    for (const auto& s : r.segments) {
      if (s.lastClock > clock || !s.intact) {
        std::error_code ec;
        fs::rename(s.path, ckpt::discardedPath(s.path), ec);
        if (ec) throw IoError(fmt::format("cannot set aside '{}': {}", s.path, ec.message()));
        // Past the clock the job continues from is the expected; damage is said.
        if (!s.intact) {
          spdlog::warn("'{}' is damaged ({}): set aside as '{}'", s.path, s.problem,
                       ckpt::discardedPath(s.path).string());
        }
      }
    }
  }
  std::vector<uint64_t> snapshots = inv.snapshots;
  for (const auto& d : inv.damagedSnapshots) snapshots.push_back(d.clock);
  for (uint64_t snap : snapshots) {
    if (snap <= clock) continue;
    const fs::path path = ckpt::snapshotDir(dir, snap);
    std::error_code ec;
    fs::rename(path, ckpt::discardedPath(path), ec);
  }
  for (const auto& states : ckpt::listStatesDirs(dir)) {
    if (states.number <= clock) continue;
    std::error_code ec;
    fs::rename(states.path, ckpt::discardedPath(states.path), ec);
  }
  // A directory written before segment format 4 keeps its chunk changes in
  // DIR/chunks: those after `clock` go as the segments do.
  ckpt::cutChunkFile(dir, clock);
}

int replicaHeldAt(int rank, int ranks, uint64_t clock, int64_t rotateEvery) {
  if (rotateEvery <= 0 || ranks <= 1) return rank;
  const auto rotations = static_cast<int64_t>(clock / static_cast<uint64_t>(rotateEvery));
  return static_cast<int>(((rank - rotations) % ranks + ranks) % ranks);
}

}  // namespace orpheus::engine
