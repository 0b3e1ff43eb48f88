#include "ckpt/sv_log.h"
#include "engine/base/error.h"

#include <catch2/catch.hpp>
#include <hdf5.h>

#include "tests/support/temp_dir.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <unistd.h>

using namespace orpheus;
using namespace orpheus::ckpt;
namespace fs = std::filesystem;
using orpheus::testing::TempDir;

namespace {


// Deterministic record bytes, distinct for every (replica, clock, index).
SharedBytes record(int replica, uint64_t clock, int index, size_t size) {
  auto bytes = std::make_shared<std::vector<std::byte>>(size);
  uint32_t state = 0x9E3779B9u ^ static_cast<uint32_t>(replica * 7919 + clock * 104729 + index * 31);
  for (auto& b : *bytes) {
    state = state * 1664525u + 1013904223u;
    b = static_cast<std::byte>(state >> 24);
  }
  return bytes;
}

LogEntry expectedGroup(uint64_t clock, const std::vector<SharedBytes>& records) {
  LogEntry e;
  e.clock = clock;
  for (const auto& r : records) e.records.push_back(*r);
  return e;
}

LogEntry expectedEvent(uint64_t clock, EventKind kind) {
  LogEntry e;
  e.clock = clock;
  e.kind = kind;
  return e;
}

LogEntry expectedReset(uint64_t clock, uint64_t resetTo, uint64_t logEnd) {
  LogEntry e = expectedEvent(clock, EventKind::kReset);
  e.resetTo = resetTo;
  e.logEnd = logEnd;
  return e;
}

void requireSame(const std::vector<LogEntry>& got, const std::vector<LogEntry>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("entry " << i << " of clock " << want[i].clock);
    REQUIRE(got[i].clock == want[i].clock);
    REQUIRE(got[i].kind == want[i].kind);
    REQUIRE(got[i].records == want[i].records);  // bytes identical
    REQUIRE(got[i].resetTo == want[i].resetTo);
    REQUIRE(got[i].logEnd == want[i].logEnd);
  }
}

std::vector<LogEntry> between(const std::vector<LogEntry>& all, uint64_t after, uint64_t upTo) {
  std::vector<LogEntry> out;
  for (const auto& e : all) {
    if (e.clock > after && e.clock <= upTo) out.push_back(e);
  }
  return out;
}

std::string segmentName(int replica, uint64_t first, uint64_t last) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "seg-%012llu-%012llu.h5", static_cast<unsigned long long>(first),
                static_cast<unsigned long long>(last));
  return "replica-" + std::to_string(replica) + "/" + buf;
}

// One replica's log of clocks 1..clocks with two records a clock, `clocksPerSegment`
// clocks a segment; returns what was appended.
std::vector<LogEntry> writeSimpleLog(const std::string& dir, uint64_t clocks, int clocksPerSegment,
                                     size_t recordSize = 300) {
  std::vector<LogEntry> appended;
  SvLogWriter w(dir, 0, size_t{64} << 20, clocksPerSegment);
  for (uint64_t c = 1; c <= clocks; ++c) {
    std::vector<SharedBytes> records = {record(0, c, 0, recordSize), record(0, c, 1, recordSize / 2)};
    appended.push_back(expectedGroup(c, records));
    w.appendGroup(c, std::move(records));
    w.endClock(c);
  }
  w.flush();
  return appended;
}

std::vector<char> readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void writeFile(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

const ReplicaInventory& replicaOf(const Inventory& inv, int replica) {
  const auto it = std::find_if(inv.replicas.begin(), inv.replicas.end(),
                               [&](const ReplicaInventory& r) { return r.replica == replica; });
  REQUIRE(it != inv.replicas.end());
  return *it;
}

bool hasTempFiles(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().filename().string().starts_with(".")) return true;
  }
  return false;
}

ParamSet sampleParams() {
  ParamSet p;
  Matrix w(7, 5);  // 7 rows over 3 ranks: blocks of 2, 2 and 3 rows
  for (Eigen::Index i = 0; i < w.size(); ++i) w.data()[i] = 0.37f * static_cast<float>(i) - 3.1f;
  p.params.push_back({"W", w});
  Matrix b(7, 1);
  for (Eigen::Index i = 0; i < b.size(); ++i) b.data()[i] = 1.0f / static_cast<float>(i + 3);
  p.params.push_back({"b", b});
  Matrix small(2, 3);  // fewer rows than ranks: one block is empty
  small << 1.5f, -2.25f, 3.0f, 4.125f, -5.0f, 6.5f;
  p.params.push_back({"A", small});
  return p;
}

bool bitwiseEqual(const ParamSet& a, const ParamSet& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a.params[i].name != b.params[i].name || a[i].rows() != b[i].rows() || a[i].cols() != b[i].cols()) return false;
    if (std::memcmp(a[i].data(), b[i].data(), static_cast<size_t>(a[i].size()) * sizeof(float)) != 0) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("a job.h5 holding values no job writes is refused naming the attribute", "[ckpt][sv_log]") {
  using Catch::Matchers::Contains;
  const auto refused = [](JobInfo info, const std::string& what) {
    TempDir dir;
    writeJobInfo(dir.str(), info);
    CHECK_THROWS_WITH(readJobInfo(dir.str()), Contains("job.h5") && Contains(what));
  };
  JobInfo good;
  good.ranks = 4;
  good.batch = 8;
  good.features = 10;
  good.classes = 3;
  JobInfo v = good;
  v.ranks = -1;
  refused(v, "attribute 'ranks' is -1, outside 0..65536");
  v = good;
  v.ranks = 1 << 20;
  refused(v, "attribute 'ranks' is 1048576");
  v = good;
  v.batch = -5;
  refused(v, "attribute 'batch' is -5");
  v = good;
  v.features = int64_t{1} << 50;
  refused(v, "attribute 'features'");
  v = good;
  v.lr = std::numeric_limits<double>::quiet_NaN();
  refused(v, "attribute 'lr' is nan");
  TempDir dir;
  writeJobInfo(dir.str(), good);
  CHECK(readJobInfo(dir.str()).ranks == 4);
  // An attribute rewritten with another type is not converted (a seed of -5 read as 0,
  // classes of 2.5 as 2): it is refused naming the type it should have.
  const auto rewritten = [&](const char* name, hid_t type, const void* value, const std::string& what) {
    TempDir d;
    writeJobInfo(d.str(), good);
    const std::string path = d.str() + "/job.h5";
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(file >= 0);
    H5Adelete(file, name);
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attr = H5Acreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attr, type, value);
    H5Aclose(attr);
    H5Sclose(space);
    H5Fclose(file);
    CHECK_THROWS_WITH(readJobInfo(d.str()), Contains("lacks a readable attribute '" + std::string(name) + "'") &&
                                                Contains(what));
  };
  const int64_t minusFive = -5;
  const double twoAndAHalf = 2.5;
  rewritten("seed", H5T_NATIVE_INT64, &minusFive, "an unsigned 64-bit integer");
  rewritten("classes", H5T_NATIVE_DOUBLE, &twoAndAHalf, "a signed 64-bit integer");
}

TEST_CASE("job info round-trips through job.h5", "[ckpt][sv_log]") {
  TempDir dir;
  JobInfo info;
  info.modelName = "examples/mlp.loss";
  info.modelText = std::string(100000, 'x') + "\nloss = softmax_xent(W2 * relu(W1 * x), y)  # ünïcode\n";
  info.modelSpec = "graph W1=784x128 W2=128x10";
  info.features = 784;
  info.classes = 10;
  info.seed = 0xFEDCBA9876543210ull;
  info.ranks = 8;
  info.batch = 64;
  info.lr = 0.0123456789;
  info.flags = "orpheus train --model mlr --ckpt-dir /tmp/x";
  writeJobInfo(dir.str(), info);
  const JobInfo back = readJobInfo(dir.str());
  CHECK(back.modelName == info.modelName);
  CHECK(back.modelText == info.modelText);
  CHECK(back.modelSpec == info.modelSpec);
  CHECK(back.features == info.features);
  CHECK(back.classes == info.classes);
  CHECK(back.seed == info.seed);
  CHECK(back.ranks == info.ranks);
  CHECK(back.batch == info.batch);
  CHECK(back.lr == info.lr);
  CHECK(back.flags == info.flags);
  CHECK_FALSE(hasTempFiles(dir.path()));

  JobInfo empty;
  writeJobInfo(dir.str(), empty);  // replaces the previous one
  const JobInfo emptyBack = readJobInfo(dir.str());
  CHECK(emptyBack.modelName.empty());
  CHECK(emptyBack.modelText.empty());
  CHECK(emptyBack.seed == 0);

  TempDir none;
  CHECK_THROWS_AS(readJobInfo(none.str()), InputError);
}

TEST_CASE("groups and events round-trip across segments and rotations", "[ckpt][sv_log]") {
  TempDir dir;
  // Two ranks hold replicas 0 and 1 and swap them at clock 6 and again at clock 10,
  // the last clock. Each rank's writer follows the replica it holds.
  std::map<int, std::vector<LogEntry>> expected;
  {
    SvLogWriter a(dir.str(), 0, size_t{1} << 20, 3);
    SvLogWriter b(dir.str(), 1, size_t{1} << 20, 3);
    SvLogWriter* writers[2] = {&a, &b};
    int held[2] = {0, 1};
    for (uint64_t c = 1; c <= 10; ++c) {
      for (int rank = 0; rank < 2; ++rank) {
        SvLogWriter& w = *writers[rank];
        const int replica = held[rank];
        std::vector<SharedBytes> records;
        if (c != 5) {  // clock 5: an empty group
          records = {record(replica, c, 0, 100 + 37 * c), record(replica, c, 1, 0), record(replica, c, 2, 5000)};
        }
        expected[replica].push_back(expectedGroup(c, records));
        w.appendGroup(c, std::move(records));
        if (c == 4) {
          w.appendEvent(c, EventKind::kAveraged);
          expected[replica].push_back(expectedEvent(c, EventKind::kAveraged));
        }
      }
      if (c == 6 || c == 10) {
        for (int rank = 0; rank < 2; ++rank) {
          writers[rank]->appendEvent(c, EventKind::kRotatedOut);
          expected[held[rank]].push_back(expectedEvent(c, EventKind::kRotatedOut));
        }
        for (int rank = 0; rank < 2; ++rank) {
          held[rank] = 1 - held[rank];
          writers[rank]->switchReplica(held[rank]);
          CHECK(writers[rank]->replica() == held[rank]);
          writers[rank]->appendEvent(c, EventKind::kRotatedIn);
          // At the last clock the arrival is all that is left open: it is not written,
          // since the previous holder's segment ends that very clock.
          if (c != 10) expected[held[rank]].push_back(expectedEvent(c, EventKind::kRotatedIn));
        }
      }
      for (auto* w : writers) {
        w->endClock(c);
        w->check();
      }
    }
    a.flush();
    b.flush();
    CHECK(a.bytesWritten() > 0);
    CHECK(a.waitSeconds() == 0.0);
    CHECK(b.waitSeconds() == 0.0);
  }
  for (int replica = 0; replica < 2; ++replica) {
    INFO("replica " << replica);
    requireSame(readLog(dir.str(), replica, 0, 10), expected[replica]);
    requireSame(readLog(dir.str(), replica, 3, 7), between(expected[replica], 3, 7));
    requireSame(readLog(dir.str(), replica, 6, 6), {});
    requireSame(readLog(dir.str(), replica, 9, 10), between(expected[replica], 9, 10));
  }
  // Replica 0: rank 0 wrote 1..3, 4..6; rank 1 wrote 6..8 (arriving at 6), 9..10.
  const Inventory inv = inspect(dir.str());
  REQUIRE(inv.replicas.size() == 2);
  const ReplicaInventory& r0 = replicaOf(inv, 0);
  REQUIRE(r0.segments.size() == 4);
  CHECK(r0.segments[0].path == (dir.path() / segmentName(0, 1, 3)).string());
  CHECK(r0.segments[2].firstClock == 6);
  CHECK(r0.segments[2].lastClock == 8);
  CHECK(r0.lastIntactClock == 10);
  CHECK(replicaOf(inv, 1).lastIntactClock == 10);
  CHECK_FALSE(hasTempFiles(dir.path()));
}

TEST_CASE("a full staging area makes appendGroup wait, and the wait is measured", "[ckpt][sv_log]") {
  TempDir dir;
  std::vector<LogEntry> appended;
  {
    // Every group is larger than the staging area: each one waits for the previous
    // clock's segment to reach the disk.
    SvLogWriter w(dir.str(), 0, 1000, 100);
    for (uint64_t c = 1; c <= 20; ++c) {
      std::vector<SharedBytes> records = {record(0, c, 0, 4000)};
      appended.push_back(expectedGroup(c, records));
      w.appendGroup(c, std::move(records));
      w.endClock(c);
    }
    w.flush();
    CHECK(w.waitSeconds() > 0.0);
  }
  requireSame(readLog(dir.str(), 0, 0, 20), appended);

  TempDir roomy;
  SvLogWriter w(roomy.str(), 0, size_t{64} << 20, 100);
  for (uint64_t c = 1; c <= 20; ++c) {
    w.appendGroup(c, {record(0, c, 0, 4000)});
    w.endClock(c);
  }
  w.flush();
  CHECK(w.waitSeconds() == 0.0);
}

TEST_CASE("entries that arrive after endClock still belong to that clock", "[ckpt][sv_log]") {
  TempDir dir;
  std::vector<LogEntry> appended;
  {
    SvLogWriter w(dir.str(), 0, size_t{1} << 20, 1);
    for (uint64_t c = 1; c <= 3; ++c) {
      std::vector<SharedBytes> records = {record(0, c, 0, 64)};
      appended.push_back(expectedGroup(c, records));
      w.appendGroup(c, std::move(records));
      w.endClock(c);
      // A late batch of the clock just ended (SSP, the final drain).
      std::vector<SharedBytes> late = {record(0, c, 1, 32)};
      appended.push_back(expectedGroup(c, late));
      w.appendGroup(c, std::move(late));
    }
  }  // the destructor writes what is staged
  requireSame(readLog(dir.str(), 0, 0, 3), appended);
  const Inventory inv = inspect(dir.str());
  CHECK(replicaOf(inv, 0).segments.size() == 3);
}

TEST_CASE("a torn last segment is ignored; the log ends before it", "[ckpt][sv_log]") {
  TempDir dir;
  const auto appended = writeSimpleLog(dir.str(), 9, 3);
  const fs::path last = dir.path() / segmentName(0, 7, 9);
  REQUIRE(fs::exists(last));
  fs::resize_file(last, fs::file_size(last) / 2);

  requireSame(readLog(dir.str(), 0, 0, 6), between(appended, 0, 6));
  requireSame(readLog(dir.str(), 0, 2, 5), between(appended, 2, 5));
  CHECK_THROWS_WITH(readLog(dir.str(), 0, 0, 8), Catch::Contains("clock 8 is past the log of replica 0 (latest: 6)"));

  const Inventory inv = inspect(dir.str());
  const ReplicaInventory& r = replicaOf(inv, 0);
  REQUIRE(r.segments.size() == 3);
  CHECK(r.segments[0].intact);
  CHECK(r.segments[1].intact);
  CHECK_FALSE(r.segments[2].intact);
  CHECK_FALSE(r.segments[2].problem.empty());
  CHECK(r.segments[2].path == last.string());
  CHECK(r.lastIntactClock == 6);
}

TEST_CASE("a damaged segment before intact ones stops the log with its name", "[ckpt][sv_log]") {
  TempDir dir;
  const auto appended = writeSimpleLog(dir.str(), 9, 3);
  const fs::path middle = dir.path() / segmentName(0, 4, 6);
  // Flip one byte inside the records of clock 5.
  std::vector<char> bytes = readFile(middle);
  const SharedBytes target = record(0, 5, 0, 300);
  const char* needle = reinterpret_cast<const char*>(target->data());
  const auto at = std::search(bytes.begin(), bytes.end(), needle, needle + 64);
  REQUIRE(at != bytes.end());
  at[10] = static_cast<char>(at[10] ^ 0x40);
  writeFile(middle, bytes);

  CHECK_THROWS_AS(readLog(dir.str(), 0, 0, 9), InputError);
  CHECK_THROWS_WITH(readLog(dir.str(), 0, 0, 9), Catch::Contains(middle.string()) && Catch::Contains("up to clock 3"));
  requireSame(readLog(dir.str(), 0, 0, 3), between(appended, 0, 3));  // the damage is not on the way
  requireSame(readLog(dir.str(), 0, 6, 9), between(appended, 6, 9));  // nor here: clocks 4..6 are not read

  const Inventory inv = inspect(dir.str());
  const ReplicaInventory& r = replicaOf(inv, 0);
  REQUIRE(r.segments.size() == 3);
  CHECK_FALSE(r.segments[1].intact);
  CHECK_THAT(r.segments[1].problem, Catch::Contains("CRC"));
  CHECK(r.segments[2].intact);
  CHECK(r.lastIntactClock == 3);
}

TEST_CASE("a missing segment is a gap that stops the log", "[ckpt][sv_log]") {
  TempDir dir;
  writeSimpleLog(dir.str(), 9, 3);
  fs::remove(dir.path() / segmentName(0, 4, 6));
  CHECK_THROWS_WITH(readLog(dir.str(), 0, 0, 9), Catch::Contains("up to clock 3"));
  CHECK(replicaOf(inspect(dir.str()), 0).lastIntactClock == 3);
}

TEST_CASE("reading past the log names the latest clock", "[ckpt][sv_log]") {
  TempDir dir;
  writeSimpleLog(dir.str(), 9, 4);
  CHECK_THROWS_AS(readLog(dir.str(), 0, 0, 12), InputError);
  CHECK_THROWS_WITH(readLog(dir.str(), 0, 0, 12), "clock 12 is past the log of replica 0 (latest: 9)");
  CHECK_THROWS_AS(readLog(dir.str(), 3, 0, 1), InputError);  // no such replica
}

TEST_CASE("an unwritable directory surfaces as IoError and spares written segments", "[ckpt][sv_log]") {
  TempDir dir;
  // A path under a regular file cannot be created, even by root.
  const fs::path file = dir.path() / "afile";
  writeFile(file, {'x'});
  const std::string bad = (file / "sub").string();
  {
    SvLogWriter w(bad, 0, size_t{1} << 20, 2);
    w.appendGroup(1, {record(0, 1, 0, 100)});
    w.endClock(1);
    CHECK_THROWS_AS(w.flush(), IoError);
    CHECK_THROWS_WITH(w.flush(), Catch::Contains(bad) && Catch::Contains("Not a directory"));
    CHECK_THROWS_AS(w.check(), IoError);
  }  // the destructor reports, never throws

  // A good log, then a rotation into a replica directory that cannot be made.
  const fs::path good = dir.path() / "good";
  fs::create_directories(good);
  writeFile(good / "replica-1", {'x'});
  std::vector<LogEntry> appended;
  {
    SvLogWriter w(good.string(), 0, size_t{1} << 20, 2);
    for (uint64_t c = 1; c <= 4; ++c) {
      std::vector<SharedBytes> records = {record(0, c, 0, 200)};
      appended.push_back(expectedGroup(c, records));
      w.appendGroup(c, std::move(records));
      w.endClock(c);
    }
    w.flush();
    w.switchReplica(1);
    for (uint64_t c = 5; c <= 6; ++c) {
      w.appendGroup(c, {record(1, c, 0, 200)});
      w.endClock(c);
    }
    CHECK_THROWS_WITH(w.flush(), Catch::Contains((good / "replica-1").string()));
  }
  const Inventory inv = inspect(good.string());
  REQUIRE(inv.replicas.size() == 1);
  const ReplicaInventory& r = replicaOf(inv, 0);
  REQUIRE(r.segments.size() == 2);
  CHECK(r.segments[0].intact);
  CHECK(r.segments[1].intact);
  CHECK(r.lastIntactClock == 4);
  requireSame(readLog(good.string(), 0, 0, 4), appended);
  CHECK_FALSE(hasTempFiles(good));
}

// Whether any file under `dir` holds the bytes of `r`.
bool onDisk(const fs::path& dir, const SharedBytes& r) {
  const char* needle = reinterpret_cast<const char*>(r->data());
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::vector<char> bytes = readFile(e.path());
    if (std::search(bytes.begin(), bytes.end(), needle, needle + r->size()) != bytes.end()) return true;
  }
  return false;
}

TEST_CASE("a failure drops what is only staged; the log continues after its end on disk", "[ckpt][sv_log]") {
  TempDir dir;
  std::vector<LogEntry> expected;
  std::vector<SharedBytes> dropped;
  {
    SvLogWriter w(dir.str(), 0, size_t{1} << 20, 3);
    for (uint64_t c = 1; c <= 8; ++c) {
      std::vector<SharedBytes> records = {record(0, c, 0, 400), record(0, c, 1, 100)};
      if (c <= 6) {
        expected.push_back(expectedGroup(c, records));
      } else {
        dropped.insert(dropped.end(), records.begin(), records.end());
      }
      w.appendGroup(c, std::move(records));
      w.endClock(c);
      if (c == 6) w.flush();  // 1..3 and 4..6 are on disk; 7 and 8 only staged
    }
    CHECK(w.discardStaged() == 6);
    w.appendReset(8, 6);
    expected.push_back(expectedReset(8, 6, 6));
    for (uint64_t c = 9; c <= 10; ++c) {
      std::vector<SharedBytes> records = {record(0, c, 0, 400)};
      expected.push_back(expectedGroup(c, records));
      w.appendGroup(c, std::move(records));
      w.endClock(c);
    }
    w.flush();
  }
  requireSame(readLog(dir.str(), 0, 0, 10), expected);
  requireSame(readLog(dir.str(), 0, 6, 8), between(expected, 6, 8));
  requireSame(readLog(dir.str(), 0, 8, 10), between(expected, 8, 10));
  CHECK_THROWS_WITH(readLog(dir.str(), 0, 0, 7),
                    Catch::Contains("clock 7 of replica 0 is lost") && Catch::Contains("failure at clock 8"));
  for (const auto& r : dropped) CHECK_FALSE(onDisk(dir.path(), r));

  const Inventory inv = inspect(dir.str());
  const ReplicaInventory& r = replicaOf(inv, 0);
  REQUIRE(r.segments.size() == 4);  // 1..3, 4..6, 7..9 (the reset at 8 first), 10..10
  CHECK(r.segments[2].path == (dir.path() / segmentName(0, 7, 9)).string());
  for (const auto& s : r.segments) CHECK(s.intact);
  CHECK(r.lastIntactClock == 10);
  REQUIRE(r.lost.size() == 1);
  CHECK(r.lost[0].first == 7);
  CHECK(r.lost[0].last == 7);
  CHECK_FALSE(hasTempFiles(dir.path()));
}

TEST_CASE("a failure before the first segment restarts the log at clock 1; a reset to a snapshot",
          "[ckpt][sv_log]") {
  TempDir dir;
  std::vector<LogEntry> expected;
  {
    SvLogWriter w(dir.str(), 0, size_t{1} << 20, 5);
    for (uint64_t c = 1; c <= 4; ++c) {
      w.appendGroup(c, {record(0, c, 0, 100)});
      w.endClock(c);
    }
    CHECK(w.discardStaged() == 0);
    w.appendReset(4, 2);  // a snapshot of clock 2
    expected.push_back(expectedReset(4, 2, 0));
    for (uint64_t c = 5; c <= 6; ++c) {
      std::vector<SharedBytes> records = {record(0, c, 0, 100)};
      expected.push_back(expectedGroup(c, records));
      w.appendGroup(c, std::move(records));
      w.endClock(c);
    }
  }
  requireSame(readLog(dir.str(), 0, 0, 6), expected);
  requireSame(readLog(dir.str(), 0, 2, 6), expected);
  CHECK_THROWS_WITH(readLog(dir.str(), 0, 0, 3), Catch::Contains("clock 3 of replica 0 is lost"));
  const Inventory inv = inspect(dir.str());
  const ReplicaInventory& r = replicaOf(inv, 0);
  REQUIRE(r.segments.size() == 2);  // 1..5, 6..6
  CHECK(r.segments[0].firstClock == 1);
  CHECK(r.lastIntactClock == 6);
  REQUIRE(r.lost.size() == 2);  // 1 and 3: clock 2 is the snapshot's
  CHECK(r.lost[0].first == 1);
  CHECK(r.lost[0].last == 1);
  CHECK(r.lost[1].first == 3);
  CHECK(r.lost[1].last == 3);
}

TEST_CASE("a failure while segments wait for the disk leaves a consistent log", "[ckpt][sv_log]") {
  // Which queued segments the IO thread has written when the failure comes is a
  // matter of timing; whatever it is, the log on disk must chain and replay.
  for (int attempt = 0; attempt < 5; ++attempt) {
    TempDir dir;
    std::vector<LogEntry> appended;
    uint64_t durable = 0;
    {
      SvLogWriter w(dir.str(), 0, size_t{64} << 20, 1);
      for (uint64_t c = 1; c <= 30; ++c) {
        std::vector<SharedBytes> records = {record(0, c, 0, 20000 + 1000 * attempt)};
        appended.push_back(expectedGroup(c, records));
        w.appendGroup(c, std::move(records));
        w.endClock(c);
      }
      durable = w.discardStaged();
      REQUIRE(durable < 30);  // the segment of clock 30 was still open
      w.appendReset(30, durable);
      for (uint64_t c = 31; c <= 32; ++c) {
        w.appendGroup(c, {record(0, c, 0, 500)});
        w.endClock(c);
      }
      w.flush();
    }
    INFO("durable up to clock " << durable);
    std::vector<LogEntry> expected = between(appended, 0, durable);
    expected.push_back(expectedReset(30, durable, durable));
    const auto got = readLog(dir.str(), 0, 0, 32);
    REQUIRE(got.size() == expected.size() + 2);
    requireSame(std::vector<LogEntry>(got.begin(), got.begin() + static_cast<long>(expected.size())), expected);
    CHECK(replicaOf(inspect(dir.str()), 0).lastIntactClock == 32);
    CHECK_FALSE(hasTempFiles(dir.path()));
  }
}

TEST_CASE("a failure keeps the log of a replica handed over before it", "[ckpt][sv_log]") {
  TempDir dir;
  std::vector<LogEntry> log0, log1;
  {
    // Rank b held replica 1 up to clock 3 and wrote it; rank a held replica 0, hands
    // it over at clock 3 without waiting, takes replica 1 and fails at clock 5.
    SvLogWriter b(dir.str(), 1, size_t{1} << 20, 10);
    for (uint64_t c = 1; c <= 3; ++c) {
      std::vector<SharedBytes> records = {record(1, c, 0, 300)};
      log1.push_back(expectedGroup(c, records));
      b.appendGroup(c, std::move(records));
    }
    b.appendEvent(3, EventKind::kRotatedOut);
    log1.push_back(expectedEvent(3, EventKind::kRotatedOut));
    b.flush();

    SvLogWriter a(dir.str(), 0, size_t{1} << 20, 10);
    for (uint64_t c = 1; c <= 3; ++c) {
      std::vector<SharedBytes> records = {record(0, c, 0, 300)};
      log0.push_back(expectedGroup(c, records));
      a.appendGroup(c, std::move(records));
      if (c < 3) a.endClock(c);
    }
    a.appendEvent(3, EventKind::kRotatedOut);
    log0.push_back(expectedEvent(3, EventKind::kRotatedOut));
    a.switchReplica(1);
    a.appendEvent(3, EventKind::kRotatedIn);
    a.endClock(3);
    for (uint64_t c = 4; c <= 5; ++c) {
      a.appendGroup(c, {record(1, c, 1, 300)});
      a.endClock(c);
    }
    CHECK(a.discardStaged() == 3);
    a.appendReset(5, 3);
    log1.push_back(expectedReset(5, 3, 3));
    std::vector<SharedBytes> records = {record(1, 6, 1, 300)};
    log1.push_back(expectedGroup(6, records));
    a.appendGroup(6, std::move(records));
    a.endClock(6);
    a.flush();
  }
  requireSame(readLog(dir.str(), 0, 0, 3), log0);
  requireSame(readLog(dir.str(), 1, 0, 6), log1);
  CHECK_THROWS_WITH(readLog(dir.str(), 1, 0, 4), Catch::Contains("clock 4 of replica 1 is lost"));
}

// A small SV batch: a 3x4 matrix with a bias, dense V, and a 2x5 one with sparse V.
std::shared_ptr<SvBatch> sampleBatch(uint64_t clock) {
  auto b = std::make_shared<SvBatch>();
  b->header.clock = clock;
  b->header.sender = 1;
  b->coeffs = Vector::LinSpaced(2, -0.5f, 0.25f * static_cast<float>(clock));
  SvMatrix dense;
  dense.paramId = 0;
  dense.biasId = 1;
  dense.u = Matrix::Constant(3, 2, 0.5f * static_cast<float>(clock));
  dense.vDense = Matrix::Identity(4, 2);
  b->matrices.push_back(dense);
  SvMatrix sparse;
  sparse.paramId = 2;
  sparse.u = Matrix::Constant(2, 2, -1.0f);
  sparse.sparseV = true;
  sparse.vSparse = SparseMatrix(5, 2);
  sparse.vSparse.insert(3, 0) = 2.0f;
  sparse.vSparse.insert(1, 1) = -3.0f;
  sparse.vSparse.makeCompressed();
  b->matrices.push_back(sparse);
  return b;
}

TEST_CASE("batches logged as they are read back as their encoding", "[ckpt][sv_log]") {
  TempDir dir;
  std::vector<LogEntry> expected;
  {
    SvLogWriter w(dir.str(), 0, size_t{1} << 20, 2);
    for (uint64_t c = 1; c <= 5; ++c) {
      auto own = sampleBatch(c);
      auto received = std::make_shared<const std::vector<std::byte>>(encode(*sampleBatch(100 + c)));
      // A part of a larger buffer, as an allgatherv delivers it.
      auto gathered = std::make_shared<std::vector<std::byte>>(7, std::byte{0x5a});
      const std::vector<std::byte> third = encode(*sampleBatch(200 + c));
      gathered->insert(gathered->end(), third.begin(), third.end());
      const std::span<const std::byte> part(gathered->data() + 7, third.size());
      LogEntry e;
      e.clock = c;
      e.records = {encode(*own), *received, third, *received};
      expected.push_back(e);
      w.appendGroup(c, {Record::of(own), Record::encoded(received, true), Record::part(gathered, part, true),
                        Record::encoded(received, false)});
      w.endClock(c);
    }
  }
  requireSame(readLog(dir.str(), 0, 0, 5), expected);
  const Inventory inv = inspect(dir.str());
  for (const auto& seg : replicaOf(inv, 0).segments) CHECK(seg.intact);
  CHECK(replicaOf(inv, 0).lastIntactClock == 5);
}

TEST_CASE("snapshot parts reassemble bitwise; a missing part leaves no snapshot", "[ckpt][sv_log]") {
  TempDir dir;
  const ParamSet params = sampleParams();
  for (int rank = 0; rank < 3; ++rank) writeSnapshotPart(dir.str(), 20, rank, 3, params);
  ParamSet shapes = params;
  for (auto& p : shapes.params) p.value.setZero();

  const auto back = readSnapshot(dir.str(), 20, shapes);
  REQUIRE(back.has_value());
  CHECK(bitwiseEqual(*back, params));

  // The order of the model, not of the file.
  ParamSet reordered;
  reordered.params = {shapes.params[2], shapes.params[0], shapes.params[1]};
  const auto backReordered = readSnapshot(dir.str(), 20, reordered);
  REQUIRE(backReordered.has_value());
  CHECK(backReordered->params[0].name == "A");
  CHECK((backReordered->params[1].value.array() == params[0].array()).all());

  ParamSet wrongShape = shapes;
  wrongShape.params[1].value = Matrix::Zero(8, 1);
  CHECK_FALSE(readSnapshot(dir.str(), 20, wrongShape).has_value());
  CHECK_FALSE(readSnapshot(dir.str(), 21, shapes).has_value());

  for (int rank = 0; rank < 3; ++rank) writeSnapshotPart(dir.str(), 30, rank, 3, params);
  fs::remove(dir.path() / "snapshot-000000000030" / "part-1.h5");
  CHECK_FALSE(readSnapshot(dir.str(), 30, shapes).has_value());

  const Inventory inv = inspect(dir.str());
  CHECK(inv.snapshots == std::vector<uint64_t>{20});
}

TEST_CASE("a snapshot part that declares more rows than its block is unusable, not allocated", "[ckpt][sv_log]") {
  TempDir dir;
  const ParamSet params = sampleParams();
  for (int rank = 0; rank < 2; ++rank) writeSnapshotPart(dir.str(), 20, rank, 2, params);
  ParamSet shapes = params;
  for (auto& p : shapes.params) p.value.setZero();
  REQUIRE(readSnapshot(dir.str(), 20, shapes).has_value());
  // Part 0's first dataset replaced by a chunked one of 2^40 rows: a few bytes on disk.
  const std::string part = (dir.path() / "snapshot-000000000020" / "part-0.h5").string();
  const std::string name = params.params[0].name;
  hid_t file = H5Fopen(part.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(file >= 0);
  int64_t rows = 0;
  {
    const hid_t old = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
    const hid_t attr = H5Aopen(old, "rows", H5P_DEFAULT);
    H5Aread(attr, H5T_NATIVE_INT64, &rows);
    H5Aclose(attr);
    H5Dclose(old);
  }
  REQUIRE(H5Ldelete(file, name.c_str(), H5P_DEFAULT) >= 0);
  const hsize_t dims[2] = {hsize_t{1} << 40, static_cast<hsize_t>(params.params[0].value.cols())};
  const hsize_t chunk[2] = {1024, dims[1]};
  const hid_t space = H5Screate_simple(2, dims, nullptr);
  const hid_t plist = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(plist, 2, chunk);
  const hid_t set = H5Dcreate2(file, name.c_str(), H5T_NATIVE_FLOAT, space, H5P_DEFAULT, plist, H5P_DEFAULT);
  REQUIRE(set >= 0);
  const hid_t scalar = H5Screate(H5S_SCALAR);
  const uint32_t crc = 0;
  hid_t attr = H5Acreate2(set, "rows", H5T_NATIVE_INT64, scalar, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attr, H5T_NATIVE_INT64, &rows);
  H5Aclose(attr);
  attr = H5Acreate2(set, "crc32c", H5T_NATIVE_UINT32, scalar, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attr, H5T_NATIVE_UINT32, &crc);
  H5Aclose(attr);
  H5Sclose(scalar);
  H5Dclose(set);
  H5Pclose(plist);
  H5Sclose(space);
  H5Fclose(file);
  CHECK_FALSE(readSnapshot(dir.str(), 20, shapes).has_value());
  const Inventory inv = inspect(dir.str());
  CHECK(inv.snapshots.empty());
}

TEST_CASE("inspect reports the job, replicas, segments, snapshots and bytes", "[ckpt][sv_log]") {
  TempDir dir;
  JobInfo job;
  job.modelName = "mlr";
  job.modelSpec = "mlr features=4 classes=3";
  job.seed = 7;
  job.ranks = 2;
  writeJobInfo(dir.str(), job);
  for (int replica = 0; replica < 2; ++replica) {
    SvLogWriter w(dir.str(), replica, size_t{1} << 20, 5);
    for (uint64_t c = 1; c <= 12; ++c) {
      w.appendGroup(c, {record(replica, c, 0, 500)});
      w.endClock(c);
    }
  }
  const ParamSet params = sampleParams();
  writeSnapshotPart(dir.str(), 10, 0, 2, params);
  writeSnapshotPart(dir.str(), 10, 1, 2, params);
  // A temporary file a crash left behind is not part of the log.
  writeFile(dir.path() / "replica-0" / ".seg-000000000013-000000000015.h5.1-0.tmp", {'x', 'y'});

  const Inventory inv = inspect(dir.str());
  CHECK(inv.job.modelSpec == job.modelSpec);
  CHECK(inv.job.seed == 7);
  CHECK(inv.job.ranks == 2);
  REQUIRE(inv.replicas.size() == 2);
  uint64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir.path())) {
    if (e.is_regular_file()) total += e.file_size();
  }
  CHECK(inv.totalBytes == total);
  for (int replica = 0; replica < 2; ++replica) {
    const ReplicaInventory& r = replicaOf(inv, replica);
    CHECK(r.replica == replica);
    REQUIRE(r.segments.size() == 3);  // 1..5, 6..10, 11..12
    CHECK(r.segments[0].firstClock == 1);
    CHECK(r.segments[0].lastClock == 5);
    CHECK(r.segments[2].firstClock == 11);
    CHECK(r.segments[2].lastClock == 12);
    for (const auto& s : r.segments) {
      CHECK(s.intact);
      CHECK(s.problem.empty());
      CHECK(s.bytes == fs::file_size(s.path));
    }
    CHECK(r.lastIntactClock == 12);
  }
  CHECK(inv.snapshots == std::vector<uint64_t>{10});
  CHECK_THROWS_AS(inspect((dir.path() / "nope").string()), InputError);
}

namespace {

// A minimal SV batch record of `replica` at `clock` (header only, as the log reads it).
SharedBytes ownBatch(uint32_t replica, uint64_t clock) {
  auto bytes = record(static_cast<int>(replica), clock, 0, 200);
  auto* b = const_cast<std::byte*>(bytes->data());
  std::memcpy(b, &kSvBatchMagic, 4);
  std::memcpy(b + 20, &replica, 4);
  std::memcpy(b + 24, &clock, 8);
  return bytes;
}

}  // namespace

TEST_CASE("batch references: stored in 32 bytes, indexed by the reader, the referenced batches read back",
          "[ckpt][sv_log]") {
  TempDir dir("orpheus-svlog-refs");
  BatchRef ref;
  ref.replica = 1;
  ref.sender = 3;
  ref.clock = 2;
  ref.select = 25;
  ref.method = 1;
  {
    SvLogWriter w(dir.str(), 0, size_t{1} << 20, 2);
    SvLogWriter other(dir.str(), 1, size_t{1} << 20, 2);
    for (uint64_t c = 1; c <= 3; ++c) {
      BatchRef r = ref;
      r.clock = c;
      w.appendGroup(c, {Record::encoded(ownBatch(0, c)), Record::reference(r)});
      w.endClock(c);
      other.appendGroup(c, {Record::encoded(ownBatch(1, c))});
      other.endClock(c);
    }
    w.flush();
    other.flush();
    CHECK(w.cpuSeconds() > 0.0);  // the IO thread's own CPU clock, read after each command
  }
  const std::vector<LogEntry> log = readLog(dir.str(), 0, 0, 3);
  REQUIRE(log.size() == 3);
  REQUIRE(log[1].records.size() == 2);
  REQUIRE(log[1].records[1].size() == kBatchRefBytes);
  const auto back = parseBatchRef(log[1].records[1]);
  REQUIRE(back.has_value());
  CHECK(back->replica == 1);
  CHECK(back->sender == 3);
  CHECK(back->clock == 2);
  CHECK(back->select == 25);
  CHECK(back->method == 1);
  CHECK_FALSE(parseBatchRef(log[1].records[0]).has_value());

  const Inventory inv = inspect(dir.str());
  REQUIRE(inv.complete);
  REQUIRE(inv.replicas.size() == 2);
  const SegmentInfo& first = inv.replicas[0].segments.at(0);
  REQUIRE(first.uses.size() == 2);
  CHECK(first.uses[1].at == 2);
  CHECK(first.uses[1].replica == 1);
  CHECK(first.uses[1].clock == 2);
  CHECK(first.ownBatches == std::vector<uint64_t>{1, 2});
  CHECK(inv.batchTrouble(1, 3).empty());
  CHECK_THAT(inv.batchTrouble(1, 4), Catch::Contains("no log segment of replica 1 holds the batch it computed at clock 4"));

  BatchStore store(dir.str());
  const auto b2 = store.batch(1, 2);
  CHECK(std::vector<std::byte>(b2.begin(), b2.end()) == *ownBatch(1, 2));
  CHECK_THROWS_AS(store.batch(1, 9), BatchUnavailable);

  // A damaged segment of replica 1: the batches it holds are unavailable, named.
  const std::string seg = (fs::path(dir.str()) / "replica-1" / "seg-000000000001-000000000002.h5").string();
  fs::resize_file(seg, fs::file_size(seg) / 2);
  const Inventory damaged = inspect(dir.str());
  CHECK_THAT(damaged.batchTrouble(1, 2), Catch::Contains("seg-000000000001-000000000002.h5"));
  const ReplicaRestorability r0 = findRestorable(damaged, 0);
  CHECK(r0.latest() == 0);
  CHECK_THAT(r0.whyNot(1), Catch::Contains("replica 1 computed at clock 1"));
  BatchStore fresh(dir.str());
  CHECK_THROWS_WITH(fresh.batch(1, 1), Catch::Contains("seg-000000000001-000000000002.h5") &&
                                           Catch::Contains("clock 1"));
}

TEST_CASE("a writer of the previous format writes version 2 and refuses references", "[ckpt][sv_log]") {
  TempDir dir("orpheus-svlog-v2");
  WriterOptions options;
  options.version = kSegmentVersionCopies;
  SvLogWriter w(dir.str(), 0, size_t{1} << 20, 1, options);
  CHECK_THROWS(w.appendGroup(1, {Record::reference(BatchRef{})}));
  w.appendGroup(1, {Record::encoded(ownBatch(0, 1))});
  w.endClock(1);
  w.flush();
  REQUIRE(readLog(dir.str(), 0, 0, 1).size() == 1);
  WriterOptions bad;
  bad.version = 1;
  CHECK_THROWS_AS(SvLogWriter(dir.str(), 0, size_t{1} << 20, 1, bad), InputError);
}
