#include "engine/checkpoint.h"

#include "engine/base/error.h"
#include "engine/base/sv_batch.h"
#include "ops/graph_model.h"
#include "ops/mlr.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <set>

namespace orpheus::engine {

std::unique_ptr<ops::Model> modelOfJob(const ckpt::JobInfo& job) {
  if (job.modelName == "mlr") return std::make_unique<ops::MultinomialLogisticRegression>(job.features, job.classes);
  ORPHEUS_CHECK_INPUT(!job.modelText.empty(), "checkpoint: model '{}' has no stored definition", job.modelName);
  ops::Graph graph = ops::parseLoss(job.modelText, job.modelName, ops::LossDims{job.features, job.classes});
  return std::make_unique<ops::GraphModel>(std::move(graph), job.modelSpec, job.seed);
}

Restored restore(const std::string& dir, int replica, uint64_t clock) {
  const ckpt::Inventory inv = ckpt::inspect(dir);
  const auto it = std::find_if(inv.replicas.begin(), inv.replicas.end(),
                               [&](const ckpt::ReplicaInventory& r) { return r.replica == replica; });
  ORPHEUS_CHECK_INPUT(it != inv.replicas.end(), "checkpoint '{}' has no log for replica {} (it has {} replicas)", dir,
                      replica, inv.replicas.size());
  Restored out;
  out.replica = replica;
  out.clock = clock == 0 ? it->lastIntactClock : clock;
  auto model = modelOfJob(inv.job);

  // Start from the newest complete snapshot at or before the clock, else from W0.
  ParamSet params = model->initParams(inv.job.seed);
  uint64_t from = 0;
  for (auto s = inv.snapshots.rbegin(); s != inv.snapshots.rend(); ++s) {
    if (*s > out.clock) continue;
    if (auto snap = ckpt::readSnapshot(dir, *s, params)) {
      params = std::move(*snap);
      from = *s;
      break;
    }
  }
  out.fromSnapshot = from;
  if (out.clock == from) {
    out.params = std::move(params);
    return out;
  }

  SvBatchExpectation expect;
  expect.paramShapes = model->paramShapes();
  for (const ckpt::LogEntry& e : ckpt::readLog(dir, replica, from, out.clock)) {
    if (e.kind == ckpt::EventKind::kAveraged) {
      throw InputError(fmt::format(
          "cannot restore replica {} to clock {}: the replicas were averaged at clock {} and no snapshot of it was "
          "kept (train with --snapshot-every 1)",
          replica, out.clock, e.clock));
    }
    if (e.kind != ckpt::EventKind::kGroup) continue;
    std::vector<SvBatch> batches;
    batches.reserve(e.records.size());
    for (const auto& r : e.records) batches.push_back(decode(r, expect));
    std::vector<const SvBatch*> ptrs;
    for (const auto& b : batches) ptrs.push_back(&b);
    model->computeUpdate(ptrs, params);
    ++out.groupsReplayed;
  }
  out.params = std::move(params);
  return out;
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
        fs::rename(s.path, s.path + ".discarded", ec);
        if (ec) throw IoError(fmt::format("cannot set aside '{}': {}", s.path, ec.message()));
      }
    }
  }
  for (uint64_t snap : inv.snapshots) {
    if (snap <= clock) continue;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("snapshot-", 0) == 0 && std::stoull(name.substr(9)) == snap) {
        std::error_code ec;
        fs::rename(e.path(), e.path().string() + ".discarded", ec);
      }
    }
  }
}

int replicaHeldAt(int rank, int ranks, uint64_t clock, int64_t rotateEvery) {
  if (rotateEvery <= 0 || ranks <= 1) return rank;
  const auto rotations = static_cast<int64_t>(clock / static_cast<uint64_t>(rotateEvery));
  return static_cast<int>(((rank - rotations) % ranks + ranks) % ranks);
}

}  // namespace orpheus::engine
