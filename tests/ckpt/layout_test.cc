#include "ckpt/durable.h"
#include "ckpt/layout.h"
#include "engine/base/error.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>

using namespace orpheus;
using namespace orpheus::ckpt;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("orpheus_layout_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
  fs::path path;
};

void touch(const fs::path& path) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << "x";
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

size_t entries(const fs::path& dir) { return static_cast<size_t>(std::distance(fs::directory_iterator(dir), {})); }

}  // namespace

TEST_CASE("layout builds the names of a checkpoint directory", "[ckpt][layout]") {
  const fs::path d("/c");
  CHECK(jobPath("/c") == d / "job.h5");
  CHECK(replicaDir("/c", 3) == d / "replica-3");
  CHECK(segmentPath("/c", 3, 1, 50) == d / "replica-3" / "seg-000000000001-000000000050.h5");
  CHECK(snapshotDir("/c", 30) == d / "snapshot-000000000030");
  CHECK(snapshotPartPath("/c", 30, 2) == d / "snapshot-000000000030" / "part-2.h5");
  CHECK(matrixDir("/c", 7) == d / "matrix-000000000007");
  CHECK(discardedPath(d / "snapshot-000000000030") == d / "snapshot-000000000030.discarded");
  CHECK(clockName(123456789012) == "123456789012");
}

TEST_CASE("layout parses what it builds and nothing else", "[ckpt][layout]") {
  const auto seg = parseSegmentName(segmentPath("/c", 0, 7, 12).filename().string());
  REQUIRE(seg);
  CHECK(seg->first == 7);
  CHECK(seg->last == 12);
  CHECK(parseReplicaDirName(replicaDir("/c", 4).filename().string()) == std::optional<uint64_t>(4));
  CHECK(parseSnapshotDirName(snapshotDir("/c", 30).filename().string()) == std::optional<uint64_t>(30));
  CHECK(parseMatrixDirName(matrixDir("/c", 9).filename().string()) == std::optional<uint64_t>(9));

  CHECK_FALSE(parseSegmentName(".seg-000000000001-000000000002.h5.1-0.tmp"));
  CHECK_FALSE(parseSegmentName("seg-000000000001-000000000002.h5.discarded"));
  CHECK_FALSE(parseSegmentName("seg-1.h5"));
  CHECK_FALSE(parseSegmentName("seg-x-2.h5"));
  CHECK_FALSE(parseSegmentName("seg--2.h5"));
  CHECK_FALSE(parseReplicaDirName("replica-"));
  CHECK_FALSE(parseReplicaDirName("replica-1x"));
  CHECK_FALSE(parseSnapshotDirName("snapshot-000000000030.discarded"));
  CHECK_FALSE(parseSnapshotDirName("snapshot-99999999999999999999"));  // past 64 bits
  CHECK_FALSE(parseMatrixDirName("snapshot-000000000030"));
}

TEST_CASE("layout lists segments and snapshots by clock, skipping the rest", "[ckpt][layout]") {
  TempDir dir("list");
  touch(segmentPath(dir.str(), 0, 11, 20));
  touch(segmentPath(dir.str(), 0, 1, 10));
  touch(segmentPath(dir.str(), 0, 1, 5));
  touch(replicaDir(dir.str(), 0) / ".seg-000000000021-000000000030.h5.1-0.tmp");
  touch(discardedPath(segmentPath(dir.str(), 0, 21, 30)));
  const auto segments = listSegments(replicaDir(dir.str(), 0));
  REQUIRE(segments.size() == 3);
  CHECK(segments[0].first == 1);
  CHECK(segments[0].last == 5);
  CHECK(segments[1].last == 10);
  CHECK(segments[2].first == 11);
  CHECK(segments[2].path == segmentPath(dir.str(), 0, 11, 20).string());
  CHECK(listSegments(replicaDir(dir.str(), 5)).empty());

  fs::create_directories(snapshotDir(dir.str(), 40));
  fs::create_directories(snapshotDir(dir.str(), 20));
  fs::create_directories(discardedPath(snapshotDir(dir.str(), 60)));
  touch(dir.path / "snapshot-000000000080");  // a file, not a directory
  fs::create_directories(replicaDir(dir.str(), 2));
  const auto snapshots = listSnapshotDirs(dir.str());
  REQUIRE(snapshots.size() == 2);
  CHECK(snapshots[0].number == 20);
  CHECK(snapshots[1].number == 40);
  CHECK(snapshots[1].path == snapshotDir(dir.str(), 40));
  const auto replicas = listReplicaDirs(dir.str());
  REQUIRE(replicas.size() == 2);
  CHECK(replicas[0].number == 0);
  CHECK(replicas[1].number == 2);
}

TEST_CASE("a durable write replaces the file whole and leaves no temporary", "[ckpt][durable]") {
  TempDir dir("durable");
  const fs::path path = dir.path / "sub" / "f.bin";
  const auto writeText = [&](const std::string& text) {
    return [text, &path](const fs::path& tmp) {
      CHECK(tmp.parent_path() == path.parent_path());
      CHECK(tmp.filename().string().front() == '.');
      std::ofstream(tmp) << text;
    };
  };
  CHECK(writeDurably(path, writeText("first"), /*createDirectory=*/true) == 5);
  CHECK(slurp(path) == "first");
  CHECK(entries(path.parent_path()) == 1);

  // A writer that fails: the old file stays, the temporary is gone.
  CHECK_THROWS_AS(writeDurably(
                      path,
                      [](const fs::path& tmp) {
                        std::ofstream(tmp) << "partial";
                        throw IoError("disk on fire");
                      },
                      true),
                  IoError);
  CHECK(slurp(path) == "first");
  CHECK(entries(path.parent_path()) == 1);

  CHECK(writeDurably(path, writeText("second!"), true) == 7);
  CHECK(slurp(path) == "second!");
  CHECK(entries(path.parent_path()) == 1);
}

TEST_CASE("a durable write names the path and the OS error", "[ckpt][durable]") {
  TempDir dir("durable_fail");
  const fs::path missing = dir.path / "missing" / "f.bin";
  // The directory is not made, so the file the writer was to make cannot be synced.
  const auto nothing = [](const fs::path&) {};
  CHECK_THROWS_WITH(writeDurably(missing, nothing, /*createDirectory=*/false),
                    Catch::Contains(missing.string()) && Catch::Contains("No such file or directory"));
  CHECK_FALSE(fs::exists(dir.path / "missing"));
  CHECK_THROWS_AS(syncPath(missing, missing.string(), false), IoError);
}
