#include "engine/coordinator/balance.h"

#include "ckpt/layout.h"
#include "engine/base/error.h"
#include "engine/failures.h"

#include <spdlog/spdlog.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

namespace orpheus::engine {
namespace {

// The chunk log, as a message names it: the records of DIR's logs (an earlier
// directory's DIR/chunks).
std::string chunkLogName(const std::string& dir) { return fmt::format("the chunk log of '{}'", dir); }

// Each rank's minibatch under `owners`: B everywhere until a chunk is away from
// its origin, then the rows' shares of P·B.
std::vector<int64_t> batchesOf(const data::ChunkOwnership& owners, int64_t batch, int ranks) {
  if (!owners.moved()) return std::vector<int64_t>(static_cast<size_t>(ranks), batch);
  const std::vector<int64_t> rows = owners.rowCounts();
  return data::batchShares(rows, batch * ranks);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(mid), v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  return (upper + *std::max_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(mid))) / 2.0;
}

}  // namespace

int64_t injectedDelayMs(const BalanceOptions& options, int rank, int64_t examples) {
  if (rank != options.delayRank || options.delayMs <= 0) return 0;
  if (!options.balance) return options.delayMs;
  return std::llround(static_cast<double>(options.delayMs) * static_cast<double>(examples) /
                      static_cast<double>(options.batch));
}

data::ChunkOwnership ownershipAt(const data::ChunkLayout& layout, const std::vector<Rebalance>& changes,
                                 uint64_t clock) {
  data::ChunkOwnership owners(layout);
  for (const Rebalance& c : changes) {
    if (c.clock <= clock) owners.apply(c.moves);
  }
  return owners;
}

std::optional<std::string> describeChunksAt(const std::string& dir, uint64_t clock) {
  const ChunkLog log = readChunkLog(dir);
  if (log.chunkRows == 0) return std::nullopt;
  const data::ChunkLayout layout(log.shardRows, log.chunkRows);
  data::ChunkOwnership owners(layout);
  try {
    owners = ownershipAt(layout, log.changes, clock);
  } catch (const Error& e) {
    throw InputError(fmt::format("{}: {}", chunkLogName(dir), e.what()));
  }
  const std::vector<int64_t> counts = owners.chunkCounts();
  const std::vector<int64_t> rows = owners.rowCounts();
  std::string out;
  for (int r = 0; r < layout.ranks(); ++r) {
    out += fmt::format("{}rank {}: {} chunks, {} rows", r == 0 ? "" : "; ", r, counts[static_cast<size_t>(r)],
                       rows[static_cast<size_t>(r)]);
  }
  return fmt::format("{} (owners {})", out, owners.digest());
}

std::vector<data::ChunkMove> decideMoves(const data::ChunkLayout& layout, const data::ChunkOwnership& owners,
                                         std::span<const double> secondsPerExample, int64_t globalBatch) {
  const int ranks = layout.ranks();
  for (const double t : secondsPerExample) {
    if (!(std::isfinite(t) && t > 0.0)) return {};
  }
  std::vector<std::set<int64_t>> held(static_cast<size_t>(ranks));
  for (int64_t c = 0; c < layout.chunks(); ++c) held[static_cast<size_t>(owners.owner(c))].insert(c);
  std::vector<double> rows(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) rows[static_cast<size_t>(r)] = static_cast<double>(owners.rowCounts()[static_cast<size_t>(r)]);
  const double perRow = static_cast<double>(globalBatch) / static_cast<double>(layout.totalRows());
  const auto busy = [&](int r, double n) { return secondsPerExample[static_cast<size_t>(r)] * perRow * n; };

  // The chunk the slow rank gives up: one from the fast rank's own file (home, no
  // transfer), else one it took from a third rank, else its own last.
  const auto pick = [&](int slow, int fast) {
    const std::set<int64_t>& mine = held[static_cast<size_t>(slow)];
    auto home = mine.lower_bound(layout.firstChunk(fast));
    if (home != mine.end() && *home < layout.firstChunk(fast + 1)) return *home;
    if (*mine.rbegin() >= layout.firstChunk(slow + 1)) return *mine.rbegin();
    auto below = mine.lower_bound(layout.firstChunk(slow));
    if (below != mine.begin()) return *std::prev(below);
    return *mine.rbegin();
  };

  std::vector<data::ChunkMove> moves;
  for (int64_t step = 0; step < layout.chunks(); ++step) {
    int slow = 0, fast = 0;
    for (int r = 1; r < ranks; ++r) {
      if (busy(r, rows[static_cast<size_t>(r)]) > busy(slow, rows[static_cast<size_t>(slow)])) slow = r;
      if (busy(r, rows[static_cast<size_t>(r)]) < busy(fast, rows[static_cast<size_t>(fast)])) fast = r;
    }
    if (slow == fast || held[static_cast<size_t>(slow)].size() <= 1) break;
    const int64_t chunk = pick(slow, fast);
    const auto m = static_cast<double>(layout.rows(chunk));
    const double before = busy(slow, rows[static_cast<size_t>(slow)]);
    const double after =
        std::max(busy(slow, rows[static_cast<size_t>(slow)] - m), busy(fast, rows[static_cast<size_t>(fast)] + m));
    // The times differ by less than one chunk's worth: moving it would not help.
    if (!(after < before)) break;
    held[static_cast<size_t>(slow)].erase(chunk);
    held[static_cast<size_t>(fast)].insert(chunk);
    rows[static_cast<size_t>(slow)] -= m;
    rows[static_cast<size_t>(fast)] += m;
    moves.push_back({chunk, slow, fast});
  }
  // A chunk that moved twice in one decision moves once, from its first owner.
  std::map<int64_t, data::ChunkMove> net;
  for (const data::ChunkMove& m : moves) {
    auto [it, fresh] = net.emplace(m.chunk, m);
    if (!fresh) it->second.to = m.to;
  }
  std::vector<data::ChunkMove> out;
  for (const auto& [chunk, m] : net) {
    if (m.from != m.to) out.push_back(m);
  }
  return out;
}

DataFeed::DataFeed(const BalanceOptions& options, comm::Transport& transport, const data::Dataset& shard)
    : options_(options), transport_(transport), shard_(shard), batch_(options.batch) {}

DataFeed::~DataFeed() = default;

bool DataFeed::logs() const { return !options_.chunkLogDir.empty(); }

void DataFeed::start(uint64_t first) {
  if (!options_.balance) {
    // A token stream's minibatches are every stream's next segment, in order.
    data::MinibatchSampler sampler(shard_.size(), options_.batch, options_.seed, transport_.rank(),
                                   shard_.streams > 0 ? data::MinibatchSampler::Order::kInOrder
                                                      : data::MinibatchSampler::Order::kShuffled);
    for (uint64_t c = 1; c < first; ++c) sampler.next();  // the sampler where the resumed job left it
    queue_ = std::make_unique<data::PrefetchQueue>(
        shard_, std::move(sampler), 2,
        std::chrono::milliseconds(static_cast<int64_t>(options_.timeoutSeconds * 1000)));
    return;
  }
  agreeLayout();
  std::vector<Rebalance> changes;
  if (logs()) {
    collectively(transport_, [&] {
      bool recorded = false;  // the directory holds this job's layout already
      if (first > 1) {
        const ChunkLog old = readChunkLog(options_.chunkLogDir);
        recorded = old.chunkRows != 0;
        const std::vector<int64_t>& shardRows = layout_.shardRows();
        ORPHEUS_CHECK_INPUT(old.chunkRows == 0 || (old.chunkRows == layout_.chunkRows() && old.shardRows == shardRows),
                            "--resume --balance: the chunk layout {} records ({} rows per chunk over shards of {}) "
                            "is not this job's ({} over {})",
                            chunkLogName(options_.chunkLogDir), old.chunkRows, fmt::join(old.shardRows, ", "),
                            layout_.chunkRows(), fmt::join(shardRows, ", "));
        for (const Rebalance& c : old.changes) {
          if (c.clock < first) changes.push_back(c);
        }
      }
      try {
        for (const Rebalance& c : changes) owners_->apply(c.moves);
      } catch (const Error& e) {
        throw InputError(fmt::format("{}: {}", chunkLogName(options_.chunkLogDir), e.what()));
      }
      // Changes after the resume clock belong to clocks the killed job lost: the
      // resume set aside the segments that recorded them (and cut an old DIR/chunks).
      log_.chunkRows = layout_.chunkRows();
      log_.shardRows = layout_.shardRows();
      log_.changes = changes;
      if (!recorded && clockLog_ != nullptr) {
        clockLog_->jobRecord(first, ckpt::EventKind::kChunks, ckpt::layoutRecord(log_.chunkRows, log_.shardRows));
      }
    });
  }
  const uint64_t streamClock = changes.empty() ? 0 : changes.back().clock;
  std::vector<int64_t> away;
  for (int64_t c = 0; c < layout_.chunks(); ++c) {
    if (owners_->owner(c) != layout_.origin(c)) away.push_back(c);
  }
  fetchAndInstall(first - 1, away);
  restartSampler(streamClock, first - 1 - streamClock);
  if (first > 1 && first <= static_cast<uint64_t>(options_.clocks)) record(first - 1, {}, {}, true);
}

void DataFeed::agreeLayout() {
  const int ranks = transport_.size();
  std::vector<double> rows(static_cast<size_t>(ranks), 0.0);
  rows[static_cast<size_t>(transport_.rank())] = static_cast<double>(shard_.size());
  transport_.control().sum(rows);
  std::vector<int64_t> shardRows;
  for (const double n : rows) shardRows.push_back(static_cast<int64_t>(n));
  layout_ = data::ChunkLayout(shardRows, options_.chunkRows);
  owners_ = std::make_unique<data::ChunkOwnership>(layout_);
}

// The rows of `incoming` (chunks whose owner is not their origin) from their
// origins, in one allgatherv; then this rank's owned rows, in chunk order.
void DataFeed::fetchAndInstall(uint64_t clock, std::span<const int64_t> incoming) {
  const int rank = transport_.rank();
  if (!incoming.empty()) {
    std::vector<std::byte> mine;
    for (const int64_t c : incoming) {
      if (layout_.origin(c) == rank) encodeRows(shard_, c, layout_.beginRow(c), layout_.endRow(c), mine);
    }
    const comm::Gathered all = transport_.allgatherv(mine, clock);
    for (size_t r = 0; r < all.count(); ++r) {
      std::span<const std::byte> part = all.part(r);
      while (!part.empty()) {
        data::DecodedRows d = data::decodeRows(part, shard_.features, shard_.sparse);
        ORPHEUS_CHECK_INPUT(d.chunk >= 0 && d.chunk < layout_.chunks() && layout_.origin(d.chunk) == static_cast<int>(r),
                            "rank {} sent rows of chunk {}, which it did not read", r, d.chunk);
        if (owners_->owner(d.chunk) == rank) {
          d.rows.source = shard_.source;
          foreign_[d.chunk] = std::move(d.rows);
        }
        part = part.subspan(d.bytes);
      }
    }
  }
  for (auto it = foreign_.begin(); it != foreign_.end();) {
    it = owners_->owner(it->first) == rank ? std::next(it) : foreign_.erase(it);
  }
  batch_ = batchesOf(*owners_, options_.batch, layout_.ranks())[static_cast<size_t>(rank)];
  if (!owners_->moved()) {
    owned_ = data::Dataset();
    return;
  }
  // Runs of this rank's own chunks are taken whole; the others' chunks in between.
  std::vector<data::Dataset> runs;
  std::vector<const data::Dataset*> pieces;
  const std::vector<int64_t> held = owners_->chunksOf(rank);
  runs.reserve(held.size());
  for (size_t k = 0; k < held.size();) {
    const int64_t c = held[k];
    if (layout_.origin(c) != rank) {
      ORPHEUS_ENFORCE(foreign_.count(c) == 1, "rank {} owns chunk {} but holds none of its rows", rank, c);
      pieces.push_back(&foreign_.at(c));
      ++k;
      continue;
    }
    size_t end = k + 1;
    while (end < held.size() && held[end] == held[end - 1] + 1 && layout_.origin(held[end]) == rank) ++end;
    runs.push_back(data::takeRows(shard_, layout_.beginRow(c), layout_.endRow(held[end - 1])));
    pieces.push_back(&runs.back());
    k = end;
  }
  owned_ = data::concatRows(shard_, pieces);
}

void DataFeed::restartSampler(uint64_t streamClock, uint64_t skip) {
  queue_.reset();  // its thread reads the rows about to change
  const data::Dataset& rows = owners_->moved() ? owned_ : shard_;
  data::MinibatchSampler sampler(rows.size(), batch_, options_.seed, transport_.rank(),
                                 data::MinibatchSampler::Order::kShuffled, streamClock);
  for (uint64_t c = 0; c < skip; ++c) sampler.next();
  queue_ = std::make_unique<data::PrefetchQueue>(
      rows, std::move(sampler), 2, std::chrono::milliseconds(static_cast<int64_t>(options_.timeoutSeconds * 1000)));
}

data::Batch DataFeed::next() { return queue_->next(); }

bool DataFeed::decidesAfter(uint64_t clock) const {
  return options_.balance && transport_.size() > 1 && clock % static_cast<uint64_t>(options_.balanceEvery) == 0 &&
         clock < static_cast<uint64_t>(options_.clocks);
}

bool DataFeed::afterClock(uint64_t clock, double busySeconds) {
  if (!options_.balance) return false;
  window_.push_back(busySeconds / static_cast<double>(std::max<int64_t>(batch_, 1)));
  if (!decidesAfter(clock)) return false;
  const int ranks = transport_.size();
  const int rank = transport_.rank();
  std::vector<double> times(static_cast<size_t>(ranks), 0.0);
  times[static_cast<size_t>(rank)] = median(window_);
  window_.clear();
  transport_.control().sum(times);
  // Rank 0 decides; the others take its owners (a sum of small integers with zeros: exact).
  std::vector<double> owners(static_cast<size_t>(layout_.chunks()), 0.0);
  if (rank == 0) {
    data::ChunkOwnership next = *owners_;
    next.apply(decideMoves(layout_, *owners_, times, options_.batch * ranks));
    for (size_t c = 0; c < owners.size(); ++c) owners[c] = static_cast<double>(next.owners()[c]);
  }
  transport_.control().sum(owners);
  std::vector<data::ChunkMove> moves;
  for (int64_t c = 0; c < layout_.chunks(); ++c) {
    const int to = static_cast<int>(owners[static_cast<size_t>(c)]);
    if (to != owners_->owner(c)) moves.push_back({c, owners_->owner(c), to});
  }
  if (!moves.empty() && logs()) {
    log_.changes.push_back({clock, moves});
    if (clockLog_ != nullptr) clockLog_->jobRecord(clock, ckpt::EventKind::kChunks, ckpt::movesRecord(clock, moves));
  }
  owners_->apply(moves);
  record(clock, moves, times, false);
  if (moves.empty()) return false;
  std::vector<int64_t> incoming;
  for (const data::ChunkMove& m : moves) {
    if (m.to != layout_.origin(m.chunk)) incoming.push_back(m.chunk);
  }
  queue_.reset();
  fetchAndInstall(clock, incoming);
  restartSampler(clock, 0);
  return true;
}

// Rank 0's metrics line and log line for a decision (or, `resumed`, the ownership
// a resumed job starts from).
void DataFeed::record(uint64_t clock, const std::vector<data::ChunkMove>& moves,
                      std::span<const double> secondsPerExample, bool resumed) {
  if (transport_.rank() != 0) return;
  const std::vector<int64_t> counts = owners_->chunkCounts();
  const std::vector<int64_t> batches = batchesOf(*owners_, options_.batch, layout_.ranks());
  if (!moves.empty()) {
    spdlog::info("rebalance after clock {}: {} chunk{} moved; chunks per rank {}, batch per rank {}", clock,
                 moves.size(), moves.size() == 1 ? "" : "s", fmt::join(counts, " "), fmt::join(batches, " "));
  }
  if (aggregator_ == nullptr) return;
  JsonLine line;
  line.add("rebalance", true).add("clock", clock);
  if (resumed) line.add("resumed", true);
  line.add("moves", static_cast<int64_t>(moves.size()))
      .add("moved", ckpt::describeMoves(moves))
      .add("chunks", counts)
      .add("batch", batches);
  if (!secondsPerExample.empty()) {
    line.add("seconds_per_example", std::vector<double>(secondsPerExample.begin(), secondsPerExample.end()));
  }
  line.add("owners", owners_->digest());
  // A resumed job's line follows its first clock's: its own clock is written already.
  aggregator_->addAfter(resumed ? clock + 1 : clock, std::move(line));
}

}  // namespace orpheus::engine
