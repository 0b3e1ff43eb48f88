#include "ckpt/replay.h"

#include "ckpt/durable.h"
#include "ckpt/job_info.h"
#include "ckpt/layout.h"
#include "ckpt/log_reader.h"
#include "engine/base/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace orpheus::ckpt {

namespace fs = std::filesystem;

std::vector<Epoch> readMembership(const std::string& dir) {
  std::vector<Epoch> epochs;
  Epoch first;
  first.ranks = std::max(readJobInfo(dir).ranks, 1);
  epochs.push_back(first);
  const fs::path path = membershipPath(dir);
  forEachTextLine(path, [&](int lineNo, const std::string& line) {
    std::istringstream words(line);
    std::string e, c, r;
    Epoch next;
    words >> e >> next.epoch >> c >> next.clock >> r >> next.ranks;
    ORPHEUS_CHECK_INPUT(words && e == "epoch" && c == "clock" && r == "ranks" && next.ranks >= 1 &&
                            next.epoch == epochs.back().epoch + 1 && next.clock >= epochs.back().clock,
                        "'{}' line {}: expected 'epoch {} clock C ranks P' (C >= {}), got '{}'", path.string(), lineNo,
                        epochs.back().epoch + 1, epochs.back().clock, line);
    epochs.push_back(next);
  });
  return epochs;
}

void appendEpoch(const std::string& dir, const Epoch& epoch) {
  const fs::path path = membershipPath(dir);
  std::string text;
  {
    std::ifstream in(path);
    std::stringstream old;
    old << in.rdbuf();
    text = old.str();
  }
  text += fmt::format("epoch {} clock {} ranks {}\n", epoch.epoch, epoch.clock, epoch.ranks);
  writeTextDurably(path, text);
}

const Epoch& epochAfter(const std::vector<Epoch>& epochs, uint64_t clock) {
  const Epoch* found = &epochs.front();
  for (const Epoch& e : epochs) {
    if (e.clock <= clock) found = &e;
  }
  return *found;
}

int replicaCount(const std::vector<Epoch>& epochs) {
  int n = 1;
  for (const Epoch& e : epochs) n = std::max(n, e.ranks);
  return n;
}

int replicaHeldAt(int rank, const std::vector<Epoch>& epochs, uint64_t clock, int64_t rotateEvery) {
  const Epoch& e = epochAfter(epochs, clock);
  if (rotateEvery <= 0 || e.ranks <= 1) return rank;
  // Rotations at the epoch's own clock happened before the change; replica r starts at rank r.
  const auto every = static_cast<uint64_t>(rotateEvery);
  const auto rotations = static_cast<int64_t>(clock / every - e.clock / every);
  return static_cast<int>(((rank - rotations) % e.ranks + e.ranks) % e.ranks);
}

std::string describeMoves(std::span<const ChunkMove> moves) {
  std::string out;
  for (const ChunkMove& m : moves) {
    if (!out.empty()) out += ' ';
    out += fmt::format("{}:{}>{}", m.chunk, m.from, m.to);
  }
  return out;
}

ChunkLog readChunkLog(const std::string& dir) {
  ChunkLog log;
  const fs::path path = chunksPath(dir);
  const int lines = forEachTextLine(path, [&](int lineNo, const std::string& line) {
    std::istringstream words(line);
    std::string head;
    words >> head;
    const auto bad = [&](const char* expected) {
      return InputError(fmt::format("'{}' line {}: expected '{}', got '{}'", path.string(), lineNo, expected, line));
    };
    if (lineNo == 1) {
      std::string rows, shards;
      words >> rows >> log.chunkRows >> shards;
      if (!words || head != "layout" || rows != "rows" || shards != "shards" || log.chunkRows < 1) {
        throw bad("layout rows R shards n0 n1 ...");
      }
      int64_t n = 0;
      while (words >> n) {
        if (n < 1) throw bad("layout rows R shards n0 n1 ...");
        log.shardRows.push_back(n);
      }
      if (log.shardRows.empty() || !words.eof()) throw bad("layout rows R shards n0 n1 ...");
      return;
    }
    Rebalance change;
    std::string moves;
    words >> change.clock >> moves;
    if (!words || head != "clock" || moves != "moves" ||
        (!log.changes.empty() && change.clock <= log.changes.back().clock)) {
      throw bad("clock K moves c:f>t ... (K increasing)");
    }
    std::string move;
    while (words >> move) {
      ChunkMove m;
      char colon = 0, arrow = 0;
      std::istringstream parts(move);
      parts >> m.chunk >> colon >> m.from >> arrow >> m.to;
      if (!parts || colon != ':' || arrow != '>' || !parts.eof() || m.chunk < 0 || m.from < 0 || m.to < 0) {
        throw bad("clock K moves c:f>t ... (K increasing)");
      }
      change.moves.push_back(m);
    }
    if (change.moves.empty()) throw bad("clock K moves c:f>t ... (K increasing)");
    log.changes.push_back(std::move(change));
  });
  if (lines > 0 && log.chunkRows == 0) {
    throw InputError(fmt::format("'{}' holds no layout line", path.string()));
  }
  return log;
}

void writeChunkLog(const std::string& dir, const ChunkLog& log) {
  std::string text = fmt::format("layout rows {} shards {}\n", log.chunkRows, fmt::join(log.shardRows, " "));
  for (const Rebalance& c : log.changes) text += fmt::format("clock {} moves {}\n", c.clock, describeMoves(c.moves));
  writeTextDurably(chunksPath(dir), text);
}

std::vector<Rebalance> changesUpTo(const ChunkLog& log, uint64_t clock) {
  std::vector<Rebalance> out;
  for (const Rebalance& c : log.changes) {
    if (c.clock <= clock) out.push_back(c);
  }
  return out;
}

std::optional<std::vector<std::byte>> knobsRecordAt(const std::string& dir, int replica, uint64_t clock) {
  InspectScope scope;
  scope.replica = replica;
  scope.upTo = clock;
  const Inventory inventory = inspect(dir, scope);
  std::optional<std::vector<std::byte>> found;
  for (const auto& r : inventory.replicas) {
    if (r.replica != replica) continue;
    for (const auto& s : r.segments) {
      for (const LogEntry& e : s.events) {
        if (e.kind != EventKind::kKnobs || e.clock > clock || e.records.size() != 1) continue;
        found = e.records.front();  // segments and their events come in clock order
      }
    }
  }
  return found;
}

}  // namespace orpheus::ckpt
