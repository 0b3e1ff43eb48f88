// The replay of a checkpoint directory (ckpt/replay.h): membership, chunk
// ownership and the knobs as they stood at a clock, from the records a job wrote,
// and from a directory as earlier jobs wrote it.
#include "ckpt/clock_log.h"
#include "ckpt/h5.h"
#include "ckpt/job_info.h"
#include "ckpt/layout.h"
#include "ckpt/replay.h"
#include "ckpt/segment.h"
#include "ckpt/sv_log_writer.h"
#include "engine/base/error.h"

#include <catch2/catch.hpp>

#include "tests/support/temp_dir.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>

using namespace orpheus;
using namespace orpheus::ckpt;
namespace fs = std::filesystem;
using orpheus::testing::TempDir;

namespace {

void writeJob(const std::string& dir, int ranks) {
  JobInfo info;
  info.modelName = "mlr";
  info.features = 4;
  info.classes = 2;
  info.ranks = ranks;
  info.batch = 8;
  info.lr = 0.1;
  writeJobInfo(dir, info);
}

std::array<std::byte, kKnobsRecordBytes> knobsRecord(int64_t first) {
  std::array<std::byte, kKnobsRecordBytes> out{};
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(first + static_cast<int64_t>(i));
  return out;
}

// The segment format version `path` records.
int64_t versionOf(const std::string& path) {
  H5Handle file = openH5ForReading(path);
  int64_t version = 0;
  REQUIRE(readI64Attr(file.get(), "version", &version));
  return version;
}

// Replica `replica`'s log for clocks 1..12 of a job on `ranks` ranks: the chunk
// layout at clock 1, chunk moves at 5 and 10, membership epoch 1 after clock 8, as
// every rank writes them (segments of 4 clocks).
void writeLogWithRecords(const std::string& dir, int replica, int ranks) {
  ClockLogOptions o;
  o.enabled = true;
  o.dir = dir;
  o.replica = replica;
  o.rank = replica;
  o.ranks = ranks;
  o.clocksPerSegment = 4;
  const auto log = makeClockLog(o);
  for (uint64_t c = 1; c <= 12; ++c) {
    if (c == 1) log->jobRecord(c, EventKind::kChunks, layoutRecord(4, std::vector<int64_t>{8, 8}));
    if (c == 5) log->jobRecord(c, EventKind::kChunks, movesRecord(c, std::vector<ChunkMove>{{1, 0, 1}}));
    if (c == 8) log->jobRecord(c, EventKind::kMembership, epochRecord({1, 8, 3}));
    if (c == 10) log->jobRecord(c, EventKind::kChunks, movesRecord(c, std::vector<ChunkMove>{{1, 1, 0}, {2, 1, 0}}));
    log->endClock(c);
  }
  log->flush();
}

}  // namespace

TEST_CASE("a new directory's membership and chunk records are read from its log, once, from any replica's") {
  TempDir dir("replay-stream");
  writeJob(dir.str(), 2);
  writeLogWithRecords(dir.str(), 0, 2);
  writeLogWithRecords(dir.str(), 1, 2);
  // No text log is written; the segments holding a record are format 4, the others as before.
  CHECK_FALSE(fs::exists(dir / "membership"));
  CHECK_FALSE(fs::exists(dir / "chunks"));
  const auto segments = listSegments(replicaDir(dir.str(), 0));
  REQUIRE(segments.size() == 3);
  CHECK(versionOf(segments[0].path) == kSegmentVersionJobRecords);
  CHECK(holdsJobRecords(segments[1].path));
  CHECK(versionOf(segments[1].path) == kSegmentVersionJobRecords);
  CHECK(versionOf(segments[2].path) == kSegmentVersionJobRecords);

  const auto check = [&] {
    const std::vector<Epoch> epochs = readMembership(dir.str());
    REQUIRE(epochs.size() == 2);
    CHECK(epochs[1].epoch == 1);
    CHECK(epochs[1].clock == 8);
    CHECK(epochs[1].ranks == 3);
    const ChunkLog chunks = readChunkLog(dir.str());
    CHECK(chunks.chunkRows == 4);
    CHECK(chunks.shardRows == std::vector<int64_t>{8, 8});
    REQUIRE(chunks.changes.size() == 2);
    CHECK(chunks.changes[0].clock == 5);
    CHECK(chunks.changes[1].moves == std::vector<ChunkMove>{{1, 1, 0}, {2, 1, 0}});
    CHECK(changesUpTo(chunks, 9).size() == 1);
  };
  check();
  // A replica's log that lost its segments: the other replica's holds the same records.
  for (const auto& s : segments) fs::remove(s.path);
  check();
}

TEST_CASE("a segment without job records is written in the format before them") {
  TempDir dir("replay-version");
  writeJob(dir.str(), 1);
  {
    SvLogWriter w(dir.str(), 0, size_t{64} << 20, 4);
    for (uint64_t c = 1; c <= 8; ++c) {
      if (c == 6) w.appendJobRecord(c, EventKind::kMembership, epochRecord({1, 6, 2}));
      w.endClock(c);
    }
    w.flush();
  }
  const auto segments = listSegments(replicaDir(dir.str(), 0));
  REQUIRE(segments.size() == 2);
  CHECK(versionOf(segments[0].path) == kSegmentVersion);
  CHECK_FALSE(holdsJobRecords(segments[0].path));
  CHECK(versionOf(segments[1].path) == kSegmentVersionJobRecords);
  CHECK(readMembership(dir.str()).back().ranks == 2);
}

TEST_CASE("a job record in a segment that says it predates format 4 is damage, and is passed over") {
  TempDir dir("replay-old-version");
  writeJob(dir.str(), 1);
  {
    SvLogWriter w(dir.str(), 0, size_t{64} << 20, 4);
    w.appendJobRecord(1, EventKind::kMembership, epochRecord({1, 1, 2}));
    w.endClock(1);
    w.flush();
  }
  const auto segments = listSegments(replicaDir(dir.str(), 0));
  REQUIRE(segments.size() == 1);
  REQUIRE(readMembership(dir.str()).size() == 2);
  {
    // The version is an attribute outside the CRC: rewrite it as format 3.
    H5Handle file(H5Fopen(segments[0].path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    REQUIRE(file.valid());
    H5Handle attr(H5Aopen(file.get(), "version", H5P_DEFAULT), H5Aclose);
    const int64_t three = kSegmentVersion;
    REQUIRE(H5Awrite(attr.get(), H5T_NATIVE_INT64, &three) >= 0);
  }
  std::vector<LogEntry> entries;
  CHECK_THAT(loadSegment(segments[0].path, 0, segments[0].first, segments[0].last, &entries),
             Catch::Contains("unknown entry kind 6"));
  CHECK(readMembership(dir.str()).size() == 1);
}

TEST_CASE("a directory written before keeps its text logs, and a resumed job continues them in its log") {
  TempDir dir("replay-mixed");
  writeJob(dir.str(), 2);
  std::ofstream(dir / "membership") << "epoch 1 clock 4 ranks 3\n";
  std::ofstream(dir / "chunks") << "layout rows 4 shards 8 8\nclock 2 moves 0:0>1\nclock 9 moves 0:1>0\n";
  // A resume at clock 6 cuts the old chunk file there, as it sets aside the segments past it.
  cutChunkFile(dir.str(), 6);
  REQUIRE(readChunkLog(dir.str()).changes.size() == 1);
  {
    SvLogWriter w(dir.str(), 0, size_t{64} << 20, 4);
    w.resumeAt(0, 6);
    for (uint64_t c = 7; c <= 12; ++c) {
      if (c == 8) w.appendJobRecord(c, EventKind::kChunks, movesRecord(c, std::vector<ChunkMove>{{1, 0, 1}}));
      if (c == 10) w.appendJobRecord(c, EventKind::kMembership, epochRecord({2, 10, 2}));
      w.endClock(c);
    }
    w.flush();
  }
  const std::vector<Epoch> epochs = readMembership(dir.str());
  REQUIRE(epochs.size() == 3);
  CHECK(epochs[1].ranks == 3);
  CHECK(epochs[2].clock == 10);
  const ChunkLog chunks = readChunkLog(dir.str());
  REQUIRE(chunks.changes.size() == 2);
  CHECK(chunks.changes[0].clock == 2);
  CHECK(chunks.changes[1].moves == std::vector<ChunkMove>{{1, 0, 1}});
  // A record that does not follow the text's history is refused, naming the segment.
  {
    SvLogWriter w(dir.str(), 1, size_t{64} << 20, 4);
    w.appendJobRecord(1, EventKind::kMembership, epochRecord({5, 1, 2}));
    w.endClock(1);
    w.flush();
  }
  CHECK_THROWS_WITH(readMembership(dir.str()), Catch::Contains("replica-") && Catch::Contains("record at clock 1"));
}

TEST_CASE("membership replays the epoch and the replica a rank holds at a clock") {
  TempDir dir("replay-membership");
  writeJob(dir.str(), 4);
  CHECK(readMembership(dir.str()).size() == 1);
  appendEpoch(dir.str(), {1, 20, 2});
  appendEpoch(dir.str(), {2, 40, 3});
  const std::vector<Epoch> epochs = readMembership(dir.str());
  REQUIRE(epochs.size() == 3);
  CHECK(epochs[0].ranks == 4);
  CHECK(epochAfter(epochs, 19).epoch == 0);
  CHECK(epochAfter(epochs, 20).ranks == 2);
  CHECK(epochAfter(epochs, 99).ranks == 3);
  CHECK(replicaCount(epochs) == 4);
  CHECK(replicaHeldAt(1, epochs, 5, 0) == 1);
  CHECK(replicaHeldAt(0, epochs, 10, 10) == 3);  // one rotation among 4 ranks
  CHECK(replicaHeldAt(0, epochs, 30, 10) == 1);  // epoch 1 rotates from its own clock
}

TEST_CASE("chunk ownership replays the changes up to a clock") {
  TempDir dir("replay-chunks");
  CHECK(readChunkLog(dir.str()).chunkRows == 0);
  ChunkLog log;
  log.chunkRows = 4;
  log.shardRows = {8, 8};
  log.changes = {{5, {{1, 0, 1}}}, {10, {{1, 1, 0}, {2, 1, 0}}}};
  writeChunkLog(dir.str(), log);
  const ChunkLog read = readChunkLog(dir.str());
  CHECK(changesUpTo(read, 4).empty());
  REQUIRE(changesUpTo(read, 9).size() == 1);
  CHECK(changesUpTo(read, 9)[0].moves == log.changes[0].moves);
  CHECK(changesUpTo(read, 10).size() == 2);
  CHECK(describeMoves(log.changes[1].moves) == "1:1>0 2:1>0");
  // Moves that the layout cannot have made are refused, naming the move and clock.
  log.changes = {{5, {{4, 0, 1}}}};
  writeChunkLog(dir.str(), log);
  CHECK_THROWS_WITH(readChunkLog(dir.str()),
                    Catch::Contains("the chunk move 4:0>1 after clock 5 is outside the layout's 4 chunks on 2 ranks"));
  log.changes = {{5, {{1, 0, 2}}}};
  writeChunkLog(dir.str(), log);
  CHECK_THROWS_WITH(readChunkLog(dir.str()), Catch::Contains("is outside the layout's 4 chunks on 2 ranks"));
  log.changes = {{5, {{1, 0, 1}}}, {6, {{1, 0, 1}}}};
  writeChunkLog(dir.str(), log);
  CHECK_THROWS_WITH(readChunkLog(dir.str()),
                    Catch::Contains("the chunk move 1:0>1 after clock 6 moves chunk 1 from rank 0, but rank 1 owns it"));
}

TEST_CASE("the knobs replay as the newest record at or before a clock") {
  TempDir dir("replay-knobs");
  writeJob(dir.str(), 1);
  {
    SvLogWriter w(dir.str(), 0, size_t{64} << 20, 5);
    for (uint64_t c = 1; c <= 12; ++c) {
      if (c == 3) w.appendKnobs(c, knobsRecord(3));
      if (c == 8) w.appendKnobs(c, knobsRecord(8));
      w.endClock(c);
    }
    w.flush();
  }
  CHECK_FALSE(knobsRecordAt(dir.str(), 0, 2));
  const auto at3 = knobsRecordAt(dir.str(), 0, 7);
  REQUIRE(at3);
  const auto wrote3 = knobsRecord(3);
  CHECK(std::equal(at3->begin(), at3->end(), wrote3.begin(), wrote3.end()));
  const auto at8 = knobsRecordAt(dir.str(), 0, 10);
  REQUIRE(at8);
  const auto wrote8 = knobsRecord(8);
  CHECK(std::equal(at8->begin(), at8->end(), wrote8.begin(), wrote8.end()));
  CHECK_FALSE(knobsRecordAt(dir.str(), 1, 10));
}

TEST_CASE("a directory as earlier jobs wrote it replays: the text logs are read as they are") {
  TempDir dir("replay-old");
  writeJob(dir.str(), 2);
  std::ofstream(dir / "membership") << "epoch 1 clock 30 ranks 3\n";
  std::ofstream(dir / "chunks") << "layout rows 4 shards 8 8\nclock 5 moves 1:0>1\nclock 10 moves 1:1>0 2:1>0\n";
  const std::vector<Epoch> epochs = readMembership(dir.str());
  REQUIRE(epochs.size() == 2);
  CHECK(epochs[1].clock == 30);
  CHECK(replicaCount(epochs) == 3);
  const ChunkLog chunks = readChunkLog(dir.str());
  CHECK(chunks.chunkRows == 4);
  CHECK(chunks.shardRows == std::vector<int64_t>{8, 8});
  REQUIRE(chunks.changes.size() == 2);
  CHECK(chunks.changes[1].moves == std::vector<ChunkMove>{{1, 1, 0}, {2, 1, 0}});
  // Rewriting the chunk log keeps the earlier spelling byte for byte.
  writeChunkLog(dir.str(), chunks);
  std::ifstream in(dir / "chunks");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "layout rows 4 shards 8 8\nclock 5 moves 1:0>1\nclock 10 moves 1:1>0 2:1>0\n");
  std::ofstream(dir / "membership", std::ios::app) << "epoch 3 clock 40 ranks 2\n";  // epochs count up by one
  CHECK_THROWS_WITH(readMembership(dir.str()), Catch::Contains("line 2"));
  // A line with words past its ranks is not one a job wrote.
  std::ofstream(dir / "membership") << "epoch 1 clock 30 ranks 3 ranks 4\n";
  CHECK_THROWS_WITH(readMembership(dir.str()), Catch::Contains("line 1: expected 'epoch 1 clock C ranks P'"));
}
