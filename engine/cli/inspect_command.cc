#include "engine/cli/commands.h"

#include "ckpt/layout.h"
#include "ckpt/replay.h"
#include "engine/membership/elastic.h"
#include "engine/recovery/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace orpheus::engine::cli {

namespace {

// The membership epochs after the first and the chunk layout and moves, one record
// a line as ckpt/replay.h spells them.
void printJobRecords(const std::string& dir, const std::vector<Epoch>& epochs) {
  if (epochs.size() > 1) {
    std::printf("  membership:\n");
    for (size_t i = 1; i < epochs.size(); ++i) std::printf("    %s\n", ckpt::epochRecord(epochs[i]).c_str());
  }
  const ckpt::ChunkLog chunks = ckpt::readChunkLog(dir);
  if (chunks.chunkRows == 0) return;
  std::printf("  chunks:\n    %s\n", ckpt::layoutRecord(chunks.chunkRows, chunks.shardRows).c_str());
  for (const ckpt::Rebalance& c : chunks.changes) {
    std::printf("    %s\n", ckpt::movesRecord(c.clock, c.moves).c_str());
  }
}

}  // namespace

int inspectMain(const std::string& dir) {
  const auto view = inspectCheckpoint(dir);
  const auto& inv = view.inventory;
  const std::vector<Epoch> epochs = readMembership(dir);
  // The ranks it runs on now (its last epoch), and those it started on where they differ.
  const int ranks = epochs.back().ranks;
  std::printf("checkpoint %s: %s, %d rank%s%s, seed %llu, %.1f MB\n", dir.c_str(), inv.job.modelSpec.c_str(), ranks,
              ranks == 1 ? "" : "s",
              ranks == inv.job.ranks ? "" : fmt::format(" (started on {})", inv.job.ranks).c_str(),
              static_cast<unsigned long long>(inv.job.seed), inv.totalBytes / 1e6);
  for (const auto& r : inv.replicas) {
    // A replica a grow added has no clocks before it joined: none restorable, none missing.
    const uint64_t joined = ckpt::replicaJoined(epochs, r.replica);
    ckpt::ReplicaRestorability restorable = *view.restorable.replica(r.replica);
    restorable.startAt(joined);
    uint64_t bytes = 0;
    for (const auto& s : r.segments) bytes += s.bytes;
    std::string lost;
    uint64_t lostClocks = 0;
    for (const auto& l : r.lost) {
      lost += fmt::format("{}{}", lost.empty() ? "" : ", ", l.first == l.last ? fmt::format("{}", l.first)
                                                                             : fmt::format("{}..{}", l.first, l.last));
      lostClocks += l.last - l.first + 1;
    }
    std::printf("  replica %d: clocks %s restorable, %zu segment%s, %.1f MB%s\n", r.replica,
                restorable.describe().c_str(), r.segments.size(), r.segments.size() == 1 ? "" : "s", bytes / 1e6,
                joined > 0 ? fmt::format(" (joined after clock {})", joined).c_str() : "");
    size_t own = 0, references = 0;
    for (const auto& s : r.segments) {
      own += s.ownBatches.size();
      references += s.uses.size();
    }
    // Format 3 logs each batch once: the replica's own, and references to the others'.
    if (references > 0) {
      std::printf("    %zu batches of its own, %zu applied from other replicas' logs\n", own, references);
    }
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
  // Replicas the job had whose log is not there at all.
  const int replicas = replicaCount(epochs);
  for (int id = 0; id < replicas; ++id) {
    const bool listed = std::any_of(inv.replicas.begin(), inv.replicas.end(), [&](const auto& r) { return r.replica == id; });
    if (listed) continue;
    const std::string path = ckpt::replicaDir(dir, id).string();
    std::error_code ec;
    const bool exists = std::filesystem::exists(path, ec);
    std::printf("  replica %d: no log: '%s' %s (its clocks, and the other replicas' clocks that applied its batches, "
                "cannot be restored)\n",
                id, path.c_str(), exists ? "is not a directory" : "is missing");
  }
  std::printf("  snapshots:");
  for (auto s : inv.snapshots) std::printf(" %llu", static_cast<unsigned long long>(s));
  std::printf("%s\n", inv.snapshots.empty() ? " none" : "");
  for (const auto& u : inv.damagedSnapshots) {
    std::printf("    unusable snapshot of clock %llu: %s\n", static_cast<unsigned long long>(u.clock),
                u.problem.c_str());
  }
  printJobRecords(dir, epochs);
  return 0;
}

}  // namespace orpheus::engine::cli
