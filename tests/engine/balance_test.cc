// Data chunks and --balance: the layout, ownership and its log, moved rows on the
// wire, rank 0's decision, and the feed's minibatches across a resume (ranks as
// threads over the loopback transport).
#include "comm/loopback/loopback_transport.h"
#include "ckpt/clock_log.h"
#include "engine/coordinator/balance.h"
#include "engine/recovery/checkpoint.h"
#include "engine/base/error.h"
#include "engine/data/chunks.h"
#include "engine/data/sampler.h"
#include "engine/data/synthetic_data.h"
#include "tests/support/temp_dir.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

using namespace orpheus;
namespace fs = std::filesystem;
using comm::loopback::LoopbackHub;
using comm::loopback::LoopbackTransport;

namespace {

data::Dataset denseRows(int64_t rows, int64_t features, float base) {
  data::Dataset d;
  d.source = "test";
  d.features = features;
  d.dense.resize(features, rows);
  for (int64_t j = 0; j < rows; ++j) {
    for (int64_t i = 0; i < features; ++i) d.dense(i, j) = base + static_cast<float>(j * 100 + i);
    d.labels.push_back(static_cast<int32_t>(j % 3));
  }
  return d;
}

data::Dataset sparseRows(int64_t rows, int64_t features) {
  data::Dataset d;
  d.source = "test";
  d.features = features;
  d.sparse = true;
  std::vector<Eigen::Triplet<float>> entries;
  for (int64_t j = 0; j < rows; ++j) {
    // Row j holds j % 3 nonzeros (some rows none at all).
    for (int64_t k = 0; k < j % 3; ++k) {
      entries.emplace_back(static_cast<int>((j + k * 5) % features), static_cast<int>(j), static_cast<float>(j + k));
    }
    d.labels.push_back(static_cast<int32_t>(j % 4));
  }
  d.sparseX.resize(features, rows);
  d.sparseX.setFromTriplets(entries.begin(), entries.end());
  d.sparseX.makeCompressed();
  return d;
}

Matrix toDense(const data::Dataset& d) { return d.sparse ? Matrix(d.sparseX.toDense()) : d.dense; }

}  // namespace

TEST_CASE("a chunk layout numbers each rank's chunks in rank order, the last of a shard shorter") {
  const std::vector<int64_t> shards = {10, 7};
  const data::ChunkLayout layout(shards, 4);
  REQUIRE(layout.chunks() == 5);  // 3 of rank 0, 2 of rank 1
  CHECK(layout.totalRows() == 17);
  CHECK(layout.origin(0) == 0);
  CHECK(layout.origin(2) == 0);
  CHECK(layout.origin(3) == 1);
  CHECK(layout.beginRow(2) == 8);
  CHECK(layout.rows(2) == 2);
  CHECK(layout.beginRow(4) == 4);
  CHECK(layout.rows(4) == 3);
  CHECK_THROWS_AS(data::ChunkLayout(shards, 0), InputError);
}

TEST_CASE("ownership follows the moves, checks them, and its digest tells owners apart") {
  const std::vector<int64_t> shards = {8, 8, 8};
  const data::ChunkLayout layout(shards, 4);
  data::ChunkOwnership owners(layout);
  CHECK_FALSE(owners.moved());
  const std::string home = owners.digest();
  const std::vector<data::ChunkMove> moves = {{2, 1, 0}, {3, 1, 2}};
  owners.apply(moves);
  CHECK(owners.moved());
  CHECK(owners.chunkCounts() == std::vector<int64_t>{3, 0, 3});
  CHECK(owners.rowCounts() == std::vector<int64_t>{12, 0, 12});
  CHECK(owners.chunksOf(0) == std::vector<int64_t>{0, 1, 2});
  CHECK(owners.digest() != home);
  const std::vector<data::ChunkMove> wrongFrom = {{0, 1, 2}};
  CHECK_THROWS(owners.apply(wrongFrom));
  const std::vector<data::ChunkMove> back = {{2, 0, 1}, {3, 2, 1}};
  owners.apply(back);
  CHECK_FALSE(owners.moved());
  CHECK(owners.digest() == home);
}

TEST_CASE("batch shares split the global batch by rows, exactly") {
  const std::vector<int64_t> rows = {300, 100, 100, 100};
  const std::vector<int64_t> shares = data::batchShares(rows, 200);
  CHECK(std::accumulate(shares.begin(), shares.end(), int64_t{0}) == 200);
  CHECK(shares[0] > shares[1]);
  CHECK(shares[0] == 100);
  const std::vector<int64_t> tiny = {1, 1000};
  const std::vector<int64_t> atLeastOne = data::batchShares(tiny, 10);
  CHECK(atLeastOne[0] == 1);
  CHECK(atLeastOne[1] == 9);
}

TEST_CASE("moved rows survive the wire, dense and sparse, and a damaged record is refused") {
  for (const bool sparse : {false, true}) {
    const data::Dataset shard = sparse ? sparseRows(20, 9) : denseRows(20, 9, 0.5f);
    std::vector<std::byte> wire;
    data::encodeRows(shard, 7, 3, 8, wire);
    data::encodeRows(shard, 9, 15, 20, wire);
    const data::DecodedRows first = data::decodeRows(wire, 9, sparse);
    CHECK(first.chunk == 7);
    REQUIRE(first.rows.size() == 5);
    const data::DecodedRows second =
        data::decodeRows(std::span<const std::byte>(wire).subspan(first.bytes), 9, sparse);
    CHECK(second.chunk == 9);
    CHECK(first.bytes + second.bytes == wire.size());
    const Matrix all = toDense(shard);
    CHECK(toDense(first.rows) == all.middleCols(3, 5));
    CHECK(std::vector<int32_t>(first.rows.labels) == std::vector<int32_t>(shard.labels.begin() + 3, shard.labels.begin() + 8));
    // Pieces back together: the rows in order.
    const data::Dataset a = data::takeRows(shard, 0, 3);
    const data::Dataset* pieces[] = {&a, &first.rows, &second.rows};
    const data::Dataset joined = data::concatRows(shard, pieces);
    REQUIRE(joined.size() == 13);
    CHECK(toDense(joined).leftCols(8) == all.leftCols(8));
    CHECK(toDense(joined).rightCols(5) == all.rightCols(5));
    // Wrong width, cut short.
    CHECK_THROWS_AS(data::decodeRows(wire, 10, sparse), InputError);
    CHECK_THROWS_AS(data::decodeRows(std::span<const std::byte>(wire).first(first.bytes - 3), 9, sparse), InputError);
  }
}

TEST_CASE("the decision moves chunks from the slow rank to the fast ones until a chunk's worth") {
  const std::vector<int64_t> shards = {1000, 1000, 1000, 1000};
  const data::ChunkLayout layout(shards, 100);
  data::ChunkOwnership owners(layout);
  SECTION("equal times: nothing moves") {
    const std::vector<double> same = {1e-3, 1e-3, 1e-3, 1e-3};
    CHECK(engine::decideMoves(layout, owners, same, 400).empty());
  }
  SECTION("an unmeasured rank: nothing moves") {
    const std::vector<double> unknown = {1e-3, 0.0, 1e-3, 1e-3};
    CHECK(engine::decideMoves(layout, owners, unknown, 400).empty());
  }
  SECTION("rank 1 four times slower sheds chunks, and the busy times end within a chunk's worth") {
    const std::vector<double> t = {1e-3, 4e-3, 1e-3, 1e-3};
    const std::vector<data::ChunkMove> moves = engine::decideMoves(layout, owners, t, 400);
    REQUIRE_FALSE(moves.empty());
    for (const data::ChunkMove& m : moves) CHECK(m.from == 1);
    owners.apply(moves);
    const std::vector<int64_t> counts = owners.chunkCounts();
    // The ideal: rank 1 a quarter of the others' rows, 40000/13 = 3077 of them each.
    CHECK(counts[1] >= 2);
    CHECK(counts[1] <= 4);
    const std::vector<int64_t> rows = owners.rowCounts();
    double slowest = 0.0, fastest = 1e9;
    for (size_t r = 0; r < 4; ++r) {
      const double busy = t[r] * 400.0 * static_cast<double>(rows[r]) / 4000.0;
      slowest = std::max(slowest, busy);
      fastest = std::min(fastest, busy);
    }
    const double chunkWorth = 4e-3 * 400.0 * 100.0 / 4000.0;
    CHECK(slowest - fastest <= chunkWorth);
    // Deciding again on the same times moves nothing.
    CHECK(engine::decideMoves(layout, owners, t, 400).empty());
    // Once rank 1 is fast again, chunks go home first (no transfer).
    const std::vector<double> fast1 = {1e-3, 0.25e-3, 1e-3, 1e-3};
    const std::vector<data::ChunkMove> back = engine::decideMoves(layout, owners, fast1, 400);
    REQUIRE_FALSE(back.empty());
    data::ChunkOwnership after = owners;
    after.apply(back);
    for (int64_t chunk = layout.firstChunk(1); chunk < layout.firstChunk(2); ++chunk) CHECK(after.owner(chunk) == 1);
    CHECK(after.chunkCounts()[1] > 10);
  }
}

TEST_CASE("the chunk log round-trips, replays ownership at any clock and names a malformed line") {
  testing::TempDir dir("chunks");
  engine::ChunkLog log;
  log.chunkRows = 4;
  log.shardRows = {8, 8};
  log.changes = {{5, {{1, 0, 1}}}, {10, {{1, 1, 0}, {2, 1, 0}}}};
  engine::writeChunkLog(dir.str(), log);
  const engine::ChunkLog read = engine::readChunkLog(dir.str());
  CHECK(read.chunkRows == 4);
  CHECK(read.shardRows == log.shardRows);
  REQUIRE(read.changes.size() == 2);
  CHECK(read.changes[1].moves == log.changes[1].moves);
  const data::ChunkLayout layout(read.shardRows, read.chunkRows);
  CHECK(engine::ownershipAt(layout, read.changes, 4).owners() == std::vector<int>{0, 0, 1, 1});
  CHECK(engine::ownershipAt(layout, read.changes, 5).owners() == std::vector<int>{0, 1, 1, 1});
  CHECK(engine::ownershipAt(layout, read.changes, 99).owners() == std::vector<int>{0, 0, 0, 1});
  const auto described = engine::describeChunksAt(dir.str(), 7);
  REQUIRE(described);
  CHECK(described->find("rank 0: 1 chunks, 4 rows; rank 1: 3 chunks, 12 rows") == 0);
  CHECK_FALSE(engine::describeChunksAt(dir / "none", 7));
  std::ofstream(dir / "chunks", std::ios::app) << "clock 3 moves 1:0>1\n";  // clocks must increase
  CHECK_THROWS_WITH(engine::readChunkLog(dir.str()), Catch::Contains("line 4"));
}

TEST_CASE("a sampler's stream 0 is the job's first; another stream draws other batches") {
  data::MinibatchSampler plain(100, 10, 7, 1);
  data::MinibatchSampler zero(100, 10, 7, 1, data::MinibatchSampler::Order::kShuffled, 0);
  data::MinibatchSampler other(100, 10, 7, 1, data::MinibatchSampler::Order::kShuffled, 40);
  bool differs = false;
  for (int k = 0; k < 30; ++k) {
    const auto a = plain.next();
    CHECK(a == zero.next());
    differs = differs || a != other.next();
  }
  CHECK(differs);
}

TEST_CASE("--inject-delay under --balance is per B examples; without it per clock") {
  engine::BalanceOptions c;
  c.batch = 50;
  c.delayRank = 1;
  c.delayMs = 20;
  CHECK(engine::injectedDelayMs(c, 1, 10) == 20);
  CHECK(engine::injectedDelayMs(c, 0, 50) == 0);
  c.balance = true;
  CHECK(engine::injectedDelayMs(c, 1, 10) == 4);
  CHECK(engine::injectedDelayMs(c, 1, 50) == 20);
}

namespace {

// Every rank's minibatches (features and labels side by side) for clocks
// first..last, rank 1 reporting `slowdown` times rank 0's busy seconds per example.
struct FeedRun {
  std::vector<std::vector<Matrix>> batches;  // [rank][clock - first]
  std::vector<std::vector<int64_t>> sizes;
  std::vector<std::string> owners;           // digest after `last`
};

FeedRun runFeeds(const engine::BalanceOptions& config, int ranks, uint64_t first, uint64_t last, double slowdown) {
  auto hub = std::make_shared<LoopbackHub>(ranks);
  FeedRun out;
  out.batches.resize(static_cast<size_t>(ranks));
  out.sizes.resize(static_cast<size_t>(ranks));
  out.owners.resize(static_cast<size_t>(ranks));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        LoopbackTransport t(hub, r);
        const data::Dataset shard =
            engine::makeSyntheticShard("synthetic:examples=3000,features=6,classes=3", config.seed, r, ranks);
        engine::DataFeed feed(config, t, shard);
        // Each rank's log, as the worker's: the chunk records go there.
        ckpt::ClockLogOptions logOptions;
        logOptions.enabled = !config.chunkLogDir.empty();
        logOptions.dir = config.chunkLogDir;
        logOptions.replica = r;
        logOptions.rank = r;
        logOptions.ranks = ranks;
        logOptions.clocksPerSegment = 4;
        const auto log = ckpt::makeClockLog(logOptions);
        if (first > 1) log->resumeAt(r, first - 1);
        feed.recordTo(log.get());
        feed.start(first);
        for (uint64_t c = first; c <= last; ++c) {
          const data::Batch b = feed.next();
          Matrix m(b.dense.rows() + 1, b.size());
          m.topRows(b.dense.rows()) = b.dense;
          m.bottomRows(1) = b.labels.cast<float>().transpose();
          out.batches[static_cast<size_t>(r)].push_back(m);
          out.sizes[static_cast<size_t>(r)].push_back(b.size());
          const double perExample = r == 1 ? slowdown * 1e-4 : 1e-4;
          feed.afterClock(c, perExample * static_cast<double>(b.size()));
          log->endClock(c);
        }
        log->flush();
        out.owners[static_cast<size_t>(r)] = feed.ownership()->digest();
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

}  // namespace

TEST_CASE("a feed moves rows off a slow rank, keeps P*B, and a resumed feed takes up the same chunks and batches") {
  testing::TempDir dir("balance");
  engine::BalanceOptions c;
  c.seed = 11;
  c.batch = 20;
  c.clocks = 40;
  c.balance = true;
  c.balanceEvery = 5;
  c.chunkRows = 50;
  c.chunkLogDir = dir.str();  // --ckpt sv --ckpt-dir DIR
  constexpr int kRanks = 3;
  const FeedRun whole = runFeeds(c, kRanks, 1, 20, 5.0);
  // Until the first decision every rank samples B; after it rank 1 samples fewer, all P*B.
  for (int r = 0; r < kRanks; ++r) CHECK(whole.sizes[static_cast<size_t>(r)][4] == 20);
  CHECK(whole.sizes[1][5] < 20);
  for (size_t k = 0; k < 20; ++k) {
    int64_t sum = 0;
    for (int r = 0; r < kRanks; ++r) sum += whole.sizes[static_cast<size_t>(r)][k];
    CHECK(sum == kRanks * 20);
  }
  const engine::ChunkLog log = engine::readChunkLog(dir.str());
  REQUIRE_FALSE(log.changes.empty());
  CHECK(log.changes.front().clock == 5);
  CHECK(log.chunkRows == 50);
  // The records are the logs' (segment format 4), not a text file.
  CHECK_FALSE(fs::exists(dir / "chunks"));

  // Resume after clock 12: the log's changes up to 12 (those after are dropped with
  // the segments past it, as a resume sets them aside), the sampler where the whole
  // run had it, so clocks 13..15 get the same rows.
  engine::discardAfter(dir.str(), 12);
  for (const engine::Rebalance& change : engine::readChunkLog(dir.str()).changes) CHECK(change.clock <= 12);
  const FeedRun resumed = runFeeds(c, kRanks, 13, 15, 5.0);
  for (int r = 0; r < kRanks; ++r) {
    for (size_t k = 0; k < 3; ++k) {
      CHECK(resumed.batches[static_cast<size_t>(r)][k] == whole.batches[static_cast<size_t>(r)][12 + k]);
    }
  }
  for (const engine::Rebalance& change : engine::readChunkLog(dir.str()).changes) CHECK(change.clock <= 15);
}

TEST_CASE("without --balance the feed is the plain sampler over the shard") {
  engine::BalanceOptions c;
  c.seed = 3;
  c.batch = 7;
  auto hub = std::make_shared<LoopbackHub>(1);
  LoopbackTransport t(hub, 0);
  const data::Dataset shard = engine::makeSyntheticShard("synthetic:examples=100,features=4,classes=2", c.seed, 0, 1);
  engine::DataFeed feed(c, t, shard);
  feed.start(4);
  data::MinibatchSampler sampler(shard.size(), c.batch, c.seed, 0);
  for (int k = 0; k < 3; ++k) sampler.next();
  for (int k = 0; k < 10; ++k) CHECK(feed.next().indices == sampler.next());
  CHECK_FALSE(feed.afterClock(5, 1.0));
}
