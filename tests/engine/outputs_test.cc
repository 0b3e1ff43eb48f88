#include "engine/outputs.h"

#include "engine/base/error.h"

#include <catch2/catch.hpp>

#include "tests/support/temp_dir.h"

#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace fs = std::filesystem;
using orpheus::testing::TempDir;
using orpheus::InputError;
using orpheus::engine::checkOutputs;
using orpheus::engine::InputPath;
using orpheus::engine::OutputPath;
using orpheus::engine::resolveOutput;
using Catch::Matchers::Contains;

namespace {


void touch(const std::string& path) { std::ofstream(path) << "x"; }

OutputPath file(const std::string& flag, const std::string& path) { return {flag, path, OutputPath::Kind::kFile}; }
OutputPath dir(const std::string& flag, const std::string& path) { return {flag, path, OutputPath::Kind::kDirectory}; }

}  // namespace

TEST_CASE("new files and existing regular files are fine outputs") {
  TempDir t;
  touch(t / "old.h5");
  REQUIRE_NOTHROW(checkOutputs({file("--save", t / "model.h5"), file("--metrics", t / "old.h5"),
                                dir("--ckpt-dir", t / "a/b/ckpt")},
                               {{"--train", t / "train.libsvm"}}));
  REQUIRE_NOTHROW(checkOutputs({file("--save", ""), file("--metrics", "")}, {}));
}

TEST_CASE("a device, a directory or a missing directory is never an output file") {
  TempDir t;
  REQUIRE_THROWS_WITH(checkOutputs({file("--save", "/dev/full")}, {}), Contains("--save '/dev/full' is not a regular file"));
  REQUIRE_THROWS_WITH(checkOutputs({file("--save", t.str())}, {}), Contains("is a directory"));
  REQUIRE_THROWS_WITH(checkOutputs({file("--save", t / "no/such/model.h5")}, {}), Contains("does not exist"));
  touch(t / "plain");
  REQUIRE_THROWS_WITH(checkOutputs({dir("--save-replicas", t / "plain")}, {}), Contains("is not a directory"));
}

TEST_CASE("a stream output may go to a character device") {
  OutputPath metrics = file("--metrics", "/dev/null");
  metrics.stream = true;
  REQUIRE_NOTHROW(checkOutputs({metrics}, {}));
  REQUIRE_THROWS_AS(checkOutputs({file("--save", "/dev/null")}, {}), InputError);
}

TEST_CASE("an output that cannot be created is found before training") {
  REQUIRE_THROWS_WITH(checkOutputs({file("--save", "/proc/x.h5")}, {}), Contains("cannot write to directory '/proc'"));
  REQUIRE_THROWS_WITH(checkOutputs({dir("--save-replicas", "/proc/replicas")}, {}), Contains("--save-replicas"));
}

TEST_CASE("an output is never an input or another output") {
  TempDir t;
  touch(t / "train.libsvm");
  REQUIRE_THROWS_WITH(checkOutputs({file("--save", t / "train.libsvm")}, {{"--train", t / "train.libsvm"}}),
                      Contains("is the same file as --train"));
  // The same file under another name: a hard link, and a path with a detour.
  fs::create_hard_link(t / "train.libsvm", t / "link.libsvm");
  REQUIRE_THROWS_WITH(checkOutputs({file("--save", t / "link.libsvm")}, {{"--train", t / "train.libsvm"}}),
                      Contains("same file"));
  fs::create_directory(t / "sub");
  REQUIRE_THROWS_AS(checkOutputs({file("--save", t / "sub/../train.libsvm")}, {{"--train", t / "train.libsvm"}}),
                    InputError);
  REQUIRE_THROWS_WITH(checkOutputs({file("--metrics", t / "out"), file("--save", t / "out")}, {}),
                      Contains("are the same path"));
  REQUIRE_THROWS_WITH(checkOutputs({dir("--ckpt-dir", t / "ckpt"), file("--save", t / "ckpt/job.h5")}, {}),
                      Contains("--save '" + (t / "ckpt/job.h5") + "' is inside --ckpt-dir"));
}

TEST_CASE("a symlink is followed: its target is the output, the link stays") {
  TempDir t;
  touch(t / "real.h5");
  fs::create_symlink(t / "real.h5", t / "latest.h5");
  REQUIRE(resolveOutput(t / "latest.h5") == fs::weakly_canonical(t / "real.h5").string());
  REQUIRE_NOTHROW(checkOutputs({file("--save", t / "latest.h5")}, {}));
  // A relative link, dangling until the output is written.
  fs::create_symlink("future.h5", t / "next.h5");
  REQUIRE(resolveOutput(t / "next.h5") == fs::weakly_canonical(t / "future.h5").string());
  // A link to the training file is the training file.
  touch(t / "train.csv");
  fs::create_symlink(t / "train.csv", t / "model.h5");
  REQUIRE_THROWS_WITH(checkOutputs({file("--save", t / "model.h5")}, {{"--train", t / "train.csv"}}),
                      Contains("same file as --train"));
}
