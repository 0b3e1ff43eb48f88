#include "ckpt/replay.h"

#include "ckpt/durable.h"
#include "ckpt/job_info.h"
#include "ckpt/layout.h"
#include "ckpt/log_reader.h"
#include "ckpt/segment.h"
#include "engine/base/error.h"
#include "engine/base/memory.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

namespace orpheus::ckpt {

namespace fs = std::filesystem;

namespace {

// A membership or chunk record of the log, and where it is (for messages).
struct JobRecord {
  uint64_t clock = 0;
  EventKind kind = EventKind::kMembership;
  std::string line;
  std::string where;
};

// Every replica's job records, by clock (a clock's records in the order one log
// holds them), each once: every rank writes them into the log of the replica it
// holds. A damaged segment is passed over; the other replicas' logs hold its records.
std::vector<JobRecord> readJobRecords(const std::string& dir) {
  std::vector<JobRecord> all;
  for (const NumberedDir& replica : listReplicaDirs(dir)) {
    for (const SegmentFile& f : listSegments(replica.path)) {
      if (!holdsJobRecords(f.path)) continue;
      std::vector<LogEntry> events;
      if (!loadSegment(f.path, static_cast<int>(replica.number), f.first, f.last, nullptr, nullptr, &events).empty()) {
        continue;
      }
      for (const LogEntry& e : events) {
        if (!isJobRecord(e.kind) || e.records.size() != 1) continue;
        const auto* text = reinterpret_cast<const char*>(e.records.front().data());
        all.push_back({e.clock, e.kind, std::string(text, e.records.front().size()),
                       fmt::format("'{}' record at clock {}", f.path, e.clock)});
      }
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const JobRecord& a, const JobRecord& b) { return a.clock < b.clock; });
  std::vector<JobRecord> once;
  for (JobRecord& r : all) {
    const bool seen = std::any_of(once.begin(), once.end(), [&](const JobRecord& o) {
      return o.kind == r.kind && o.line == r.line;
    });
    if (!seen) once.push_back(std::move(r));
  }
  return once;
}

// One membership line or record after `epochs`; `where` names it.
void addEpoch(std::vector<Epoch>& epochs, const std::string& line, const std::string& where) {
  std::istringstream words(line);
  std::string e, c, r;
  Epoch next;
  words >> e >> next.epoch >> c >> next.clock >> r >> next.ranks;
  std::string more;  // nothing may follow: a line with more words is not one this engine wrote
  const bool ended = words && !(words >> more);
  ORPHEUS_CHECK_INPUT(ended && e == "epoch" && c == "clock" && r == "ranks" && next.ranks >= 1 &&
                          next.ranks <= kMaxRanks &&
                          next.epoch == epochs.back().epoch + 1 && next.clock >= epochs.back().clock,
                      "{}: expected 'epoch {} clock C ranks P' (C >= {}, P of 1 to {}), got '{}'", where,
                      epochs.back().epoch + 1, epochs.back().clock, kMaxRanks, line);
  epochs.push_back(next);
}

}  // namespace

std::vector<Epoch> readMembership(const std::string& dir) {
  std::vector<Epoch> epochs;
  Epoch first;
  first.ranks = std::max(readJobInfo(dir).ranks, 1);
  epochs.push_back(first);
  const fs::path path = membershipPath(dir);
  forEachTextLine(path, [&](int lineNo, const std::string& line) {
    addEpoch(epochs, line, fmt::format("'{}' line {}", path.string(), lineNo));
  });
  for (const JobRecord& r : readJobRecords(dir)) {
    if (r.kind == EventKind::kMembership) addEpoch(epochs, r.line, r.where);
  }
  return epochs;
}

std::string epochRecord(const Epoch& epoch) {
  return fmt::format("epoch {} clock {} ranks {}", epoch.epoch, epoch.clock, epoch.ranks);
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
  text += epochRecord(epoch) + "\n";
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

uint64_t replicaJoined(const std::vector<Epoch>& epochs, int replica) {
  for (const Epoch& e : epochs) {
    if (e.ranks > replica) return e.clock;
  }
  return epochs.empty() ? 0 : epochs.back().clock;
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

namespace {

// A layout line or record into `log`; a second one must repeat the first.
void addLayout(ChunkLog& log, std::istringstream& words, const std::function<InputError(const char*)>& bad) {
  constexpr const char* kExpected = "layout rows R shards n0 n1 ...";
  std::string rows, shards;
  ChunkLog read;
  words >> rows >> read.chunkRows >> shards;
  if (!words || rows != "rows" || shards != "shards" || read.chunkRows < 1) throw bad(kExpected);
  int64_t n = 0;
  while (words >> n) {
    if (n < 1) throw bad(kExpected);
    read.shardRows.push_back(n);
  }
  if (read.shardRows.empty() || !words.eof()) throw bad(kExpected);
  if (log.chunkRows != 0 && (log.chunkRows != read.chunkRows || log.shardRows != read.shardRows)) {
    throw bad("the layout recorded before it");
  }
  log.chunkRows = read.chunkRows;
  log.shardRows = std::move(read.shardRows);
}

// A change line or record ("clock K moves c:f>t ...") into `log`.
void addChange(ChunkLog& log, std::istringstream& words, const std::function<InputError(const char*)>& bad) {
  constexpr const char* kExpected = "clock K moves c:f>t ... (K increasing)";
  Rebalance change;
  std::string moves;
  words >> change.clock >> moves;
  if (!words || moves != "moves" || (!log.changes.empty() && change.clock <= log.changes.back().clock)) {
    throw bad(kExpected);
  }
  std::string move;
  while (words >> move) {
    ChunkMove m;
    char colon = 0, arrow = 0;
    std::istringstream parts(move);
    parts >> m.chunk >> colon >> m.from >> arrow >> m.to;
    if (!parts || colon != ':' || arrow != '>' || !parts.eof() || m.chunk < 0 || m.from < 0 || m.to < 0) {
      throw bad(kExpected);
    }
    change.moves.push_back(m);
  }
  if (change.moves.empty()) throw bad(kExpected);
  log.changes.push_back(std::move(change));
}

// What a line of DIR/chunks or a kChunks record may be.
enum class ChunkLine { kLayout, kChange, kEither };

// One line of DIR/chunks (its first is the layout, the others changes) or one
// kChunks record (either); `where` names it.
void addChunkLine(ChunkLog& log, const std::string& line, ChunkLine expect, const std::string& where) {
  std::istringstream words(line);
  std::string head;
  words >> head;
  const auto bad = [&](const char* expected) {
    return InputError(fmt::format("{}: expected '{}', got '{}'", where, expected, line));
  };
  if (expect == ChunkLine::kLayout || (expect == ChunkLine::kEither && head == "layout")) {
    if (head != "layout") throw bad("layout rows R shards n0 n1 ...");
    addLayout(log, words, bad);
    return;
  }
  if (head != "clock") throw bad("clock K moves c:f>t ... (K increasing)");
  addChange(log, words, bad);
}

// Every move of `log` played on its layout: a chunk that exists, moved from the rank
// that owns it then to one of the layout's ranks.
void checkChunkMoves(const ChunkLog& log, const std::string& dir) {
  if (log.chunkRows == 0) return;
  const auto ranks = static_cast<int64_t>(log.shardRows.size());
  ORPHEUS_CHECK_INPUT(ranks <= kMaxRanks, "'{}': the chunk layout has {} shards, more than {} ranks", dir, ranks,
                      kMaxRanks);
  std::vector<int> owner;
  for (int64_t r = 0; r < ranks; ++r) {
    const int64_t n = log.shardRows[static_cast<size_t>(r)];
    ORPHEUS_CHECK_INPUT(n <= kMaxSize, "'{}': the chunk layout's shard {} has {} rows", dir, r, n);
    const int64_t chunks = (n + log.chunkRows - 1) / log.chunkRows;
    ORPHEUS_CHECK_INPUT(static_cast<int64_t>(owner.size()) + chunks <= int64_t{1} << 30,
                        "'{}': the chunk layout has more than 2^30 chunks", dir);
    owner.insert(owner.end(), static_cast<size_t>(chunks), static_cast<int>(r));
  }
  for (const Rebalance& c : log.changes) {
    for (const ChunkMove& m : c.moves) {
      ORPHEUS_CHECK_INPUT(m.chunk < static_cast<int64_t>(owner.size()) && m.to < ranks,
                          "'{}': the chunk move {}:{}>{} after clock {} is outside the layout's {} chunks on {} ranks",
                          dir, m.chunk, m.from, m.to, c.clock, owner.size(), ranks);
      int& at = owner[static_cast<size_t>(m.chunk)];
      ORPHEUS_CHECK_INPUT(at == m.from, "'{}': the chunk move {}:{}>{} after clock {} moves chunk {} from rank {}, "
                          "but rank {} owns it then", dir, m.chunk, m.from, m.to, c.clock, m.chunk, m.from, at);
      at = m.to;
    }
  }
}

// An old DIR/chunks; an empty log when there is none.
ChunkLog readChunkFile(const std::string& dir) {
  ChunkLog log;
  const fs::path path = chunksPath(dir);
  const int lines = forEachTextLine(path, [&](int lineNo, const std::string& line) {
    addChunkLine(log, line, lineNo == 1 ? ChunkLine::kLayout : ChunkLine::kChange,
                 fmt::format("'{}' line {}", path.string(), lineNo));
  });
  if (lines > 0 && log.chunkRows == 0) {
    throw InputError(fmt::format("'{}' holds no layout line", path.string()));
  }
  return log;
}

}  // namespace

ChunkLog readChunkLog(const std::string& dir) {
  ChunkLog log = readChunkFile(dir);
  for (const JobRecord& r : readJobRecords(dir)) {
    if (r.kind == EventKind::kChunks) addChunkLine(log, r.line, ChunkLine::kEither, r.where);
  }
  if (!log.changes.empty() && log.chunkRows == 0) {
    throw InputError(fmt::format("'{}': chunk moves are recorded without a chunk layout", dir));
  }
  checkChunkMoves(log, dir);
  return log;
}

std::string layoutRecord(int64_t chunkRows, std::span<const int64_t> shardRows) {
  return fmt::format("layout rows {} shards {}", chunkRows, fmt::join(shardRows, " "));
}

std::string movesRecord(uint64_t clock, std::span<const ChunkMove> moves) {
  return fmt::format("clock {} moves {}", clock, describeMoves(moves));
}

void writeChunkLog(const std::string& dir, const ChunkLog& log) {
  std::string text = layoutRecord(log.chunkRows, log.shardRows) + "\n";
  for (const Rebalance& c : log.changes) text += movesRecord(c.clock, c.moves) + "\n";
  writeTextDurably(chunksPath(dir), text);
}

void cutChunkFile(const std::string& dir, uint64_t clock) {
  std::error_code ec;
  if (!fs::exists(chunksPath(dir), ec)) return;
  ChunkLog log = readChunkFile(dir);
  std::erase_if(log.changes, [&](const Rebalance& c) { return c.clock > clock; });
  writeChunkLog(dir, log);
}

std::vector<Rebalance> changesUpTo(const ChunkLog& log, uint64_t clock) {
  std::vector<Rebalance> out;
  for (const Rebalance& c : log.changes) {
    if (c.clock <= clock) out.push_back(c);
  }
  return out;
}

std::vector<LogEntry> LogReplay::entries(uint64_t after, uint64_t upTo) const {
  return readLog(dir_, replica_, after, upTo);
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
