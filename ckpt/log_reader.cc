#include "ckpt/log_reader.h"

#include "ckpt/h5.h"
#include "ckpt/layout.h"
#include "ckpt/segment.h"
#include "ckpt/snapshot.h"
#include "engine/base/error.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

namespace orpheus::ckpt {
namespace {

namespace fs = std::filesystem;

// Verifies every segment of one replica and follows its chain from clock 1.
// Verifies the segments of one replica that hold clocks in (after, upTo] (upTo 0:
// no end) and follows its chain from clock 1.
ReplicaInventory inspectReplica(int replica, const fs::path& dir, uint64_t after, uint64_t upTo) {
  ReplicaInventory r;
  r.replica = replica;
  bool started = false;
  bool chained = true;
  for (const SegmentFile& f : listSegments(dir)) {
    if (upTo > 0 && f.first > upTo) break;  // by first clock: none of the rest is needed
    if (f.last <= after) continue;
    SegmentInfo s;
    s.path = f.path;
    s.firstClock = f.first;
    s.lastClock = f.last;
    std::error_code ec;
    s.bytes = fs::file_size(f.path, ec);
    if (ec) s.bytes = 0;
    std::vector<ClockRange> lost;
    s.problem = loadSegment(f.path, r.replica, f.first, f.last, nullptr, &lost, &s.events, &s.uses, &s.ownBatches);
    if (s.problem.empty()) r.lost.insert(r.lost.end(), lost.begin(), lost.end());
    s.intact = s.problem.empty();
    if (!s.intact) {
      s.events.clear();
      s.uses.clear();
      s.ownBatches.clear();
    }
    if (chained && s.intact && continuesChain(r.lastIntactClock, started, f.first)) {
      r.lastIntactClock = std::max(r.lastIntactClock, f.last);
      started = true;
    } else {
      chained = false;
    }
    r.segments.push_back(std::move(s));
  }
  return r;
}

uint64_t totalBytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  // Never throws: what cannot be read is not counted.
  for (fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec)) {
    std::error_code sizeError;
    if (it->is_regular_file(sizeError)) {
      const uint64_t size = it->file_size(sizeError);
      if (!sizeError) total += size;
    }
  }
  return total;
}

}  // namespace

Inventory inspect(const std::string& dir, const InspectScope& scope) {
  silenceHdf5();
  std::error_code ec;
  ORPHEUS_CHECK_INPUT(fs::is_directory(dir, ec), "checkpoint directory '{}' does not exist", dir);
  Inventory inv;
  if (fs::exists(jobPath(dir), ec)) {
    inv.job = readJobInfo(dir);
  } else {
    spdlog::warn("checkpoint '{}' has no {}: the job is unknown", dir, jobPath(dir).filename().string());
  }
  // Snapshots first: with fromNewestSnapshot, the newest usable one at or before
  // upTo is where the segments that matter begin.
  std::vector<NumberedDir> snapshotDirs = listSnapshotDirs(dir);
  if (scope.upTo > 0) {
    std::erase_if(snapshotDirs, [&](const NumberedDir& d) { return d.number > scope.upTo; });
  }
  const bool newestOnly = scope.upTo > 0 && scope.fromNewestSnapshot;
  if (newestOnly) std::reverse(snapshotDirs.begin(), snapshotDirs.end());
  uint64_t after = 0;
  for (const NumberedDir& d : snapshotDirs) {
    std::string problem = snapshotProblem(dir, d.number, scope.shapes);
    if (problem.empty()) {
      inv.snapshots.push_back(d.number);
      if (newestOnly) {
        after = d.number;
        break;
      }
    } else {
      inv.damagedSnapshots.push_back({d.number, std::move(problem)});
    }
  }
  if (newestOnly) std::reverse(inv.damagedSnapshots.begin(), inv.damagedSnapshots.end());
  for (const NumberedDir& d : listReplicaDirs(dir)) {
    if (scope.replica >= 0 && d.number != static_cast<uint64_t>(scope.replica)) continue;
    inv.replicas.push_back(inspectReplica(static_cast<int>(d.number), d.path, after, scope.upTo));
  }
  inv.totalBytes = totalBytes(dir);
  inv.complete = scope.replica < 0 && scope.upTo == 0;
  return inv;
}

std::string Inventory::batchTrouble(uint32_t replica, uint64_t clock) const {
  const auto it = std::find_if(replicas.begin(), replicas.end(),
                               [&](const ReplicaInventory& r) { return r.replica == static_cast<int>(replica); });
  if (it == replicas.end()) return fmt::format("the log of replica {} is missing", replica);
  bool held = false;
  for (const SegmentInfo& s : it->segments) {
    if (clock < s.firstClock || clock > s.lastClock) continue;
    if (!s.intact) {
      return fmt::format("the batch replica {} computed at clock {} is in log segment '{}', which is damaged ({})",
                         replica, clock, s.path, s.problem);
    }
    held = held || std::binary_search(s.ownBatches.begin(), s.ownBatches.end(), clock);
  }
  return held ? std::string()
              : fmt::format("no log segment of replica {} holds the batch it computed at clock {} (missing)", replica,
                            clock);
}

std::span<const std::byte> BatchStore::batch(uint32_t replica, uint64_t clock) {
  Loaded& l = loaded_[replica];
  if (!l.listed) {
    l.files = listSegments(replicaDir(dir_, static_cast<int>(replica)));
    l.listed = true;
  }
  if (clock < l.first || clock > l.last) {
    // Every segment holding the clock (two at a rotation's hand-over clock).
    l.batches.clear();
    l.first = 1;
    l.last = 0;
    bool any = false;
    for (const SegmentFile& f : l.files) {
      if (clock < f.first || clock > f.last) continue;
      std::vector<LogEntry> entries;
      const std::string problem = loadSegment(f.path, static_cast<int>(replica), f.first, f.last, &entries);
      if (!problem.empty()) {
        l.batches.clear();
        throw BatchUnavailable(
            fmt::format("the batch replica {} computed at clock {} is in log segment '{}', which is damaged ({})",
                        replica, clock, f.path, problem));
      }
      l.first = any ? std::min(l.first, f.first) : f.first;
      l.last = any ? std::max(l.last, f.last) : f.last;
      any = true;
      for (LogEntry& e : entries) {
        if (e.kind != EventKind::kGroup) continue;
        for (auto& r : e.records) {
          const auto origin = peekBatchOrigin(r);
          if (origin && origin->replica == replica) {
            l.batches[origin->clock] = std::move(r);
          }
        }
      }
    }
  }
  const auto it = l.batches.find(clock);
  if (it == l.batches.end()) {
    throw BatchUnavailable(fmt::format(
        "no log segment of replica {} holds the batch it computed at clock {} (missing)", replica, clock));
  }
  return it->second;
}

std::vector<LogEntry> readLog(const std::string& dir, int replica, uint64_t after, uint64_t upTo) {
  silenceHdf5();
  ORPHEUS_CHECK_INPUT(after <= upTo, "cannot read the log of replica {} from clock {} back to {}", replica, after,
                      upTo);
  std::vector<LogEntry> out;
  if (after == upTo) return out;
  const std::vector<SegmentFile> segments = listSegments(replicaDir(dir, replica));
  ORPHEUS_CHECK_INPUT(!segments.empty(), "checkpoint '{}' holds no log of replica {}", dir, replica);

  // Follow the chain through the clocks after `after`: the segments that end by it
  // are not needed (they may be damaged or missing); the first one needed must hold
  // the clock right after it, each next one continue the previous.
  uint64_t reached = after;
  bool started = after > 0;
  bool first = true;
  for (size_t i = 0; i < segments.size() && reached < upTo; ++i) {
    const SegmentFile& s = segments[i];
    if (s.last <= after) continue;
    const bool chained = first && started ? s.first <= after + 1 : continuesChain(reached, started, s.first);
    if (!chained) {
      const std::string missing = started ? fmt::format("no segment holds clocks {}..{} (missing)", reached + 1,
                                                        s.first - 1)
                                          : std::string("no segment starts at clock 1 (missing)");
      throw InputError(
          fmt::format("log of replica {} is broken before '{}' (clocks {}..{}): {}; the log is intact "
                      "only up to clock {}",
                      replica, s.path, s.first, s.last, missing, reached));
    }
    first = false;
    {
      std::vector<LogEntry> entries;
      const std::string problem = loadSegment(s.path, replica, s.first, s.last, &entries);
      if (!problem.empty()) {
        if (i + 1 == segments.size()) {
          spdlog::warn("ignoring torn last segment '{}' of replica {}: {}", s.path, replica, problem);
          break;
        }
        throw InputError(
            fmt::format("log segment '{}' of replica {} is damaged ({}); the log is intact only up to clock {}", s.path,
                        replica, problem, reached));
      }
      for (LogEntry& e : entries) {
        // A reset after upTo whose log ended before it: the holder lost upTo.
        if (e.kind == EventKind::kReset && e.logEnd < upTo && upTo < e.clock) {
          throw InputError(fmt::format(
              "clock {} of replica {} is lost: a failure at clock {} reset the replica to clock {} before its log "
              "reached clock {}; clocks {} and {} are restorable",
              upTo, replica, e.clock, e.resetTo, upTo, e.logEnd, e.clock));
        }
        if (e.clock > after && e.clock <= upTo) out.push_back(std::move(e));
      }
    }
    reached = std::max(reached, s.last);
    started = true;
  }
  ORPHEUS_CHECK_INPUT(upTo <= reached, "clock {} is past the log of replica {} (latest: {})", upTo, replica, reached);
  return out;
}

}  // namespace orpheus::ckpt
