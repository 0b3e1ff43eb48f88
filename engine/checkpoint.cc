#include "engine/checkpoint.h"

#include "ckpt/layout.h"
#include "engine/base/error.h"
#include "engine/base/sv_batch.h"
#include "engine/job.h"
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
  return makeModel({job.modelName, job.modelText, job.modelSpec}, job.features, job.classes, job.seed);
}

namespace {

// Rebuilds one replica's states from the newest usable snapshot and its log.
class Replayer {
 public:
  Replayer(const std::string& dir, const ops::Model& model, uint64_t seed, int replica)
      : dir_(dir), model_(model), seed_(seed), replica_(replica), snapshots_(ckpt::snapshotClocks(dir)) {
    expect_.paramShapes = model.paramShapes();
  }

  // The replica at the end of its local clock `clock`; `from` gets the snapshot the
  // replay started from (0: W0).
  ParamSet at(uint64_t clock, uint64_t* from) {
    ParamSet params = model_.initParams(seed_);
    uint64_t start = 0;
    for (auto s = snapshots_.rbegin(); s != snapshots_.rend(); ++s) {
      if (*s > clock) continue;
      if (auto snap = ckpt::readSnapshot(dir_, *s, params)) {
        params = std::move(*snap);
        start = *s;
        break;
      }
    }
    *from = start;
    if (clock == start) return params;

    for (const ckpt::LogEntry& e : ckpt::readLog(dir_, replica_, start, clock)) {
      switch (e.kind) {
        case ckpt::EventKind::kAveraged:
          throw InputError(fmt::format(
              "cannot restore replica {} to clock {}: the replicas were averaged at clock {} and no snapshot of it "
              "was kept (train with --snapshot-every 1)",
              replica_, clock, e.clock));
        case ckpt::EventKind::kReset: {
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
            params = at(e.resetTo, &ignored);
          }
          break;
        }
        case ckpt::EventKind::kGroup: {
          std::vector<SvBatch> batches;
          batches.reserve(e.records.size());
          for (const auto& r : e.records) batches.push_back(decode(r, expect_));
          std::vector<const SvBatch*> ptrs;
          for (const auto& b : batches) ptrs.push_back(&b);
          model_.computeUpdate(ptrs, params);
          ++groups_;
          break;
        }
        default:
          break;
      }
    }
    return params;
  }

  size_t groups() const { return groups_; }

 private:
  const std::string& dir_;
  const ops::Model& model_;
  uint64_t seed_;
  int replica_;
  std::vector<uint64_t> snapshots_;
  SvBatchExpectation expect_;
  size_t groups_ = 0;
};

}  // namespace

Restored restore(const std::string& dir, const ops::Model& model, uint64_t seed, int replica, uint64_t clock) {
  ORPHEUS_CHECK_INPUT(clock > 0, "cannot restore replica {} to clock 0: that is W0", replica);
  Restored out;
  out.replica = replica;
  out.clock = clock;
  Replayer replay(dir, model, seed, replica);
  out.params = replay.at(clock, &out.fromSnapshot);
  out.groupsReplayed = replay.groups();
  return out;
}

Restored restore(const std::string& dir, int replica, uint64_t clock) {
  const ckpt::JobInfo job = ckpt::readJobInfo(dir);
  ORPHEUS_CHECK_INPUT(replica >= 0 && replica < std::max(job.ranks, 1), "checkpoint '{}' has no replica {} (it has {})",
                      dir, replica, job.ranks);
  if (clock == 0) {
    const ckpt::Inventory inv = ckpt::inspect(dir);
    const auto it = std::find_if(inv.replicas.begin(), inv.replicas.end(),
                                 [&](const ckpt::ReplicaInventory& r) { return r.replica == replica; });
    ORPHEUS_CHECK_INPUT(it != inv.replicas.end() && it->lastIntactClock > 0,
                        "checkpoint '{}' has no log for replica {} (it has {} replicas)", dir, replica,
                        inv.replicas.size());
    clock = it->lastIntactClock;
  }
  const auto model = modelOfJob(job);
  return restore(dir, *model, job.seed, replica, clock);
}

uint64_t resumableClock(const ckpt::Inventory& inv) {
  if (inv.replicas.empty()) return 0;  // killed before its first segment: start over
  // Clocks at which every replica's intact log chain ends a segment.
  std::set<uint64_t> common;
  bool firstReplica = true;
  for (const auto& r : inv.replicas) {
    std::set<uint64_t> ends = {0};
    for (const auto& s : r.segments) {
      if (s.intact && s.lastClock <= r.lastIntactClock) ends.insert(s.lastClock);
    }
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

void discardAfter(const std::string& dir, uint64_t clock) {
  namespace fs = std::filesystem;
  const ckpt::Inventory inv = ckpt::inspect(dir);
  for (const auto& r : inv.replicas) {
    for (const auto& s : r.segments) {
      if (s.lastClock > clock || !s.intact) {
        std::error_code ec;
        fs::rename(s.path, ckpt::discardedPath(s.path), ec);
        if (ec) throw IoError(fmt::format("cannot set aside '{}': {}", s.path, ec.message()));
      }
    }
  }
  for (uint64_t snap : inv.snapshots) {
    if (snap <= clock) continue;
    const fs::path path = ckpt::snapshotDir(dir, snap);
    std::error_code ec;
    fs::rename(path, ckpt::discardedPath(path), ec);
  }
}

int replicaHeldAt(int rank, int ranks, uint64_t clock, int64_t rotateEvery) {
  if (rotateEvery <= 0 || ranks <= 1) return rank;
  const auto rotations = static_cast<int64_t>(clock / static_cast<uint64_t>(rotateEvery));
  return static_cast<int>(((rank - rotations) % ranks + ranks) % ranks);
}

}  // namespace orpheus::engine
