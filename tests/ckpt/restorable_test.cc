// What is restorable (ckpt/restorable.h) against what restore() actually does: on a
// real log of a real model, damaged, with segments deleted or snapshot parts broken,
// every clock restores (bitwise) exactly when inspect says it is restorable, and a
// clock that is not names why.
#include "ckpt/layout.h"
#include "ckpt/restorable.h"
#include "ckpt/sv_log.h"
#include "ops/backends.h"
#include "engine/base/error.h"
#include "engine/recovery/checkpoint.h"

#include <catch2/catch.hpp>

#include "tests/support/bitwise.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tiny_clock.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <unistd.h>

using namespace orpheus;
using orpheus::testing::bitwiseEqual;
using namespace orpheus::ckpt;
namespace fs = std::filesystem;
using orpheus::testing::TempDir;

namespace {


constexpr uint64_t kClocks = 100;
constexpr int kClocksPerSegment = 10;
constexpr uint64_t kAverageEvery = 20;
constexpr int kSnapshotParts = 2;

// A one-replica MLR job of kClocks clocks: every clock one real SV batch, logged and
// applied; every kAverageEvery clocks an averaging (a snapshot in kSnapshotParts
// parts); with `failAt`, a failure at that clock after a flush at failAt - 3 (the
// two clocks between are lost). Returns the replica after every clock.
std::map<uint64_t, ParamSet> writeJob(const std::string& dir, uint64_t failAt = 0) {
  JobInfo job;
  job.modelName = "mlr";
  job.modelSpec = "mlr features=4 classes=3";
  job.features = 4;
  job.classes = 3;
  job.seed = 11;
  job.ranks = 1;
  job.batch = 3;
  writeJobInfo(dir, job);
  const auto model = engine::modelOfJob(job);
  ParamSet params = model->initParams(job.seed);
  std::map<uint64_t, ParamSet> states;
  SvLogWriter log(dir, 0, size_t{16} << 20, kClocksPerSegment);
  for (uint64_t c = 1; c <= kClocks; ++c) {
    if (c == failAt) {
      const uint64_t end = log.discardStaged();
      REQUIRE(end == failAt - 3);
      log.appendReset(c, end);
      params = states.at(end);
    }
    auto svb = testing::tinyClock(*model, params, c);
    log.appendGroup(c, std::vector<Record>{Record::of(svb)});
    if (c % kAverageEvery == 0) {
      log.appendEvent(c, EventKind::kAveraged);
      for (int part = 0; part < kSnapshotParts; ++part) writeSnapshotPart(dir, c, part, kSnapshotParts, params);
    }
    log.endClock(c);
    if (failAt > 0 && c == failAt - 3) log.flush();
    states[c] = params;
  }
  log.flush();
  return states;
}

fs::path segmentOf(const std::string& dir, uint64_t first, uint64_t last) { return segmentPath(dir, 0, first, last); }

// Flips a byte inside the first occurrence of `needle` in the file (data a CRC covers).
void corruptAt(const fs::path& path, const std::vector<char>& needle) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const auto at = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  REQUIRE(at != bytes.end());
  at[static_cast<long>(needle.size() / 2)] ^= 0x5a;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A segment: inside the header of its first SV batch record ("ORSV" and what follows).
void corruptSegment(const fs::path& path) { corruptAt(path, {'O', 'R', 'S', 'V', 1}); }

// A snapshot part of `rank`: inside its block of the first parameter, as stored.
void corruptPart(const std::string& dir, uint64_t clock, int rank, const ParamSet& params) {
  using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const int64_t rows = params[0].rows();
  const int64_t begin = rows * rank / kSnapshotParts, end = rows * (rank + 1) / kSnapshotParts;
  const RowMajor block = params[0].middleRows(begin, end - begin);
  const char* data = reinterpret_cast<const char*>(block.data());
  corruptAt(snapshotPartPath(dir, clock, rank), std::vector<char>(data, data + block.size() * sizeof(float)));
}

std::string rangesOf(const ReplicaRestorability& r) {
  std::string out;
  for (const ClockRange& c : r.ranges()) out += fmt::format("{}{}..{}", out.empty() ? "" : ",", c.first, c.last);
  return out;
}

// The heart of it: inspect's ranges and restore agree on every clock, and every
// restored clock is bitwise the replica's state.
void requireAgreement(const std::string& dir, const std::map<uint64_t, ParamSet>& states) {
  const engine::CheckpointView view = engine::inspectCheckpoint(dir);
  const ReplicaRestorability* r = view.restorable.replica(0);
  REQUIRE(r != nullptr);
  for (uint64_t t = 1; t <= kClocks + 2; ++t) {
    INFO("clock " << t << ", restorable " << rangesOf(*r));
    if (r->covers(t)) {
      const engine::Restored got = engine::restore(dir, 0, t, *ops::makeBackend("cpu"));
      CHECK(got.clock == t);
      CHECK(got.fromSnapshot == r->startFor(t));
      CHECK(bitwiseEqual(got.params, states.at(t)));
    } else {
      CHECK_FALSE(r->whyNot(t).empty());
      CHECK_THROWS_AS(engine::restore(dir, 0, t, *ops::makeBackend("cpu")), InputError);
    }
  }
  // latest is the newest restorable clock.
  if (r->latest() > 0) {
    const engine::Restored latest = engine::restore(dir, 0, 0, *ops::makeBackend("cpu"));
    CHECK(latest.clock == r->latest());
    CHECK(bitwiseEqual(latest.params, states.at(r->latest())));
  }
}

std::string restoreError(const std::string& dir, uint64_t clock) {
  try {
    engine::restore(dir, 0, clock, *ops::makeBackend("cpu"));
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("an intact log restores every clock", "[ckpt][restorable]") {
  TempDir dir;
  const auto states = writeJob(dir.str());
  const auto view = engine::inspectCheckpoint(dir.str());
  CHECK(rangesOf(*view.restorable.replica(0)) == "1..100");
  CHECK(view.restorable.replica(0)->latest() == 100);
  requireAgreement(dir.str(), states);
  CHECK_THAT(restoreError(dir.str(), 101), Catch::Contains("latest: 100") && Catch::Contains("1..100"));
}

TEST_CASE("a corrupted middle segment is a gap a later snapshot bridges", "[ckpt][restorable]") {
  TempDir dir;
  const auto states = writeJob(dir.str());
  const fs::path middle = segmentOf(dir.str(), 41, 50);
  corruptSegment(middle);
  const auto view = engine::inspectCheckpoint(dir.str());
  const ReplicaRestorability& r = *view.restorable.replica(0);
  CHECK(rangesOf(r) == "1..40,60..100");
  CHECK(r.latest() == 100);  // not 40: latest is the newest restorable clock
  CHECK_THAT(r.describe(), Catch::Contains("1..40, 60..100") && Catch::Contains("via snapshot 60"));
  requireAgreement(dir.str(), states);
  const std::string why = restoreError(dir.str(), 45);
  CHECK_THAT(why, Catch::Contains(middle.filename().string()) && Catch::Contains("damaged") &&
                      Catch::Contains("1..40, 60..100"));
}

TEST_CASE("a deleted middle segment is the same gap as a corrupted one", "[ckpt][restorable]") {
  TempDir dir;
  const auto states = writeJob(dir.str());
  fs::remove(segmentOf(dir.str(), 41, 50));
  const auto view = engine::inspectCheckpoint(dir.str());
  const ReplicaRestorability& r = *view.restorable.replica(0);
  CHECK(rangesOf(r) == "1..40,60..100");
  REQUIRE(r.missing.size() == 1);
  CHECK(r.missing[0].first == 41);
  CHECK(r.missing[0].last == 50);
  requireAgreement(dir.str(), states);
  CHECK_THAT(restoreError(dir.str(), 55), Catch::Contains("41..50") && Catch::Contains("missing"));
  // The log itself reads past the gap from a start after it.
  CHECK(readLog(dir.str(), 0, 60, 70).size() == 10);
  CHECK_THROWS_AS(readLog(dir.str(), 0, 0, 70), InputError);
}

TEST_CASE("a damaged snapshot part makes the clocks it alone reaches unrestorable", "[ckpt][restorable]") {
  TempDir dir;
  const auto states = writeJob(dir.str());
  corruptPart(dir.str(), 60, 1, states.at(60));
  const auto view = engine::inspectCheckpoint(dir.str());
  const ReplicaRestorability& r = *view.restorable.replica(0);
  // The averaging at 60 cannot be replayed without its snapshot: 60..79 are lost to it.
  CHECK(rangesOf(r) == "1..59,80..100");
  REQUIRE(view.inventory.damagedSnapshots.size() == 1);
  CHECK(view.inventory.damagedSnapshots[0].clock == 60);
  CHECK_THAT(view.inventory.damagedSnapshots[0].problem, Catch::Contains("part 1"));
  CHECK(view.restorable.snapshots == std::vector<uint64_t>{20, 40, 80, 100});
  requireAgreement(dir.str(), states);
  CHECK_THAT(restoreError(dir.str(), 70), Catch::Contains("snapshot of clock 60") && Catch::Contains("part 1"));
}

TEST_CASE("a missing snapshot part is the same as a damaged one", "[ckpt][restorable]") {
  TempDir dir;
  const auto states = writeJob(dir.str());
  fs::remove(snapshotPartPath(dir.str(), 60, 0));
  CHECK(rangesOf(*engine::inspectCheckpoint(dir.str()).restorable.replica(0)) == "1..59,80..100");
  requireAgreement(dir.str(), states);
  CHECK_THAT(restoreError(dir.str(), 60), Catch::Contains("part 0") && Catch::Contains("missing"));
}

TEST_CASE("a refusal names every damage on the way: segment and snapshot part", "[ckpt][restorable]") {
  TempDir dir;
  const auto states = writeJob(dir.str());
  const fs::path middle = segmentOf(dir.str(), 41, 50);
  corruptSegment(middle);
  fs::remove(snapshotPartPath(dir.str(), 60, 1));
  const auto view = engine::inspectCheckpoint(dir.str());
  CHECK(rangesOf(*view.restorable.replica(0)) == "1..40,80..100");
  requireAgreement(dir.str(), states);
  CHECK_THAT(restoreError(dir.str(), 65), Catch::Contains(middle.filename().string()) &&
                                              Catch::Contains("snapshot of clock 60 is unusable too: part 1"));
}

TEST_CASE("a torn last segment ends the log; a snapshot after it still restores", "[ckpt][restorable]") {
  TempDir dir;
  const auto states = writeJob(dir.str());
  const fs::path last = segmentOf(dir.str(), 91, 100);
  fs::resize_file(last, fs::file_size(last) / 2);
  CHECK(rangesOf(*engine::inspectCheckpoint(dir.str()).restorable.replica(0)) == "1..90,100..100");
  requireAgreement(dir.str(), states);
}

TEST_CASE("clocks a failure lost are not restorable, and say so", "[ckpt][restorable]") {
  TempDir dir;
  const auto states = writeJob(dir.str(), 33);  // 31 and 32 lost
  const auto view = engine::inspectCheckpoint(dir.str());
  const ReplicaRestorability& r = *view.restorable.replica(0);
  CHECK(rangesOf(r) == "1..30,33..100");
  REQUIRE(r.lost.size() == 1);
  CHECK(r.lost[0].first == 31);
  CHECK(r.lost[0].last == 32);
  std::map<uint64_t, ParamSet> reachable = states;
  reachable.erase(31);
  reachable.erase(32);
  requireAgreement(dir.str(), reachable);
  CHECK_THAT(restoreError(dir.str(), 32), Catch::Contains("lost") && Catch::Contains("failure at clock 33"));
}

TEST_CASE("resume picks the newest clock every replica restores at a segment end", "[ckpt][restorable]") {
  TempDir dir;
  const auto states = writeJob(dir.str());
  CHECK(engine::resumableClock(inspect(dir.str())) == 100);
  corruptSegment(segmentOf(dir.str(), 41, 50));
  CHECK(engine::resumableClock(inspect(dir.str())) == 100);  // through the snapshot of clock 60
  corruptPart(dir.str(), 100, 0, states.at(100));
  corruptPart(dir.str(), 80, 0, states.at(80));
  // 80..100 need the averaging at 80; 60..79 remain (60 and 70 end segments).
  CHECK(engine::resumableClock(inspect(dir.str())) == 70);
}

TEST_CASE("a directory without job.h5 is not a checkpoint directory", "[ckpt][restorable]") {
  TempDir dir;
  std::ofstream(dir.path() / "afile") << "x";
  CHECK_THROWS_WITH(engine::inspectCheckpoint((dir.path() / "afile").string()),
                    Catch::Contains("is not a checkpoint directory (no job.h5)"));
  CHECK_THROWS_WITH(engine::inspectCheckpoint(dir.str()), Catch::Contains("is not a checkpoint directory (no job.h5)"));
  CHECK_THROWS_AS(engine::restore(dir.str(), 0, 0, *ops::makeBackend("cpu")), InputError);
}
