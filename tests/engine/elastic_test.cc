#include "engine/membership/elastic.h"

#include "ckpt/job_info.h"
#include "ckpt/layout.h"
#include "engine/base/error.h"
#include "engine/recovery/checkpoint.h"

#include <catch2/catch.hpp>

#include "tests/support/temp_dir.h"

#include <fstream>

using orpheus::testing::TempDir;
using namespace orpheus::engine;
using Catch::Matchers::Contains;

namespace {

std::string jobDir(const TempDir& tmp, int ranks) {
  orpheus::ckpt::JobInfo info;
  info.modelName = "mlr";
  info.ranks = ranks;
  info.features = 4;
  info.classes = 2;
  orpheus::ckpt::writeJobInfo(tmp.path().string(), info);
  return tmp.path().string();
}

}  // namespace

TEST_CASE("membership epochs: epoch 0 from job.h5, changes appended, read back in order") {
  TempDir tmp;
  const std::string dir = jobDir(tmp, 4);
  auto epochs = readMembership(dir);
  REQUIRE(epochs.size() == 1);
  REQUIRE(epochs[0].ranks == 4);
  REQUIRE(epochs[0].clock == 0);
  appendEpoch(dir, {1, 150, 3});
  appendEpoch(dir, {2, 400, 6});
  epochs = readMembership(dir);
  REQUIRE(epochs.size() == 3);
  REQUIRE(epochs[1].ranks == 3);
  REQUIRE(epochs[2].clock == 400);
  REQUIRE(replicaCount(epochs) == 6);
  REQUIRE(epochAfter(epochs, 149).ranks == 4);
  REQUIRE(epochAfter(epochs, 150).ranks == 3);
  REQUIRE(epochAfter(epochs, 399).ranks == 3);
  REQUIRE(epochAfter(epochs, 1000).ranks == 6);
}

TEST_CASE("replicas held after a membership change rotate from replica r at rank r") {
  std::vector<Epoch> epochs = {{0, 0, 4}};
  for (int rank = 0; rank < 4; ++rank) {
    for (uint64_t clock : {0, 19, 20, 45, 100}) {
      REQUIRE(replicaHeldAt(rank, epochs, clock, 20) == replicaHeldAt(rank, 4, clock, 20));
    }
  }
  epochs.push_back({1, 50, 3});
  // Rotations at 20 and 40 were the old epoch's; after clock 50 rank r holds r until 60.
  REQUIRE(replicaHeldAt(1, epochs, 50, 20) == 1);
  REQUIRE(replicaHeldAt(1, epochs, 59, 20) == 1);
  REQUIRE(replicaHeldAt(1, epochs, 60, 20) == 0);
  REQUIRE(replicaHeldAt(0, epochs, 60, 20) == 2);
  REQUIRE(replicaHeldAt(0, epochs, 80, 20) == 1);
  REQUIRE(replicaHeldAt(2, epochs, 80, 0) == 2);
  // At a change clock that is also a rotation clock, the rotation came first.
  epochs.push_back({2, 100, 2});
  REQUIRE(replicaHeldAt(1, epochs, 100, 20) == 1);
}

TEST_CASE("a malformed membership file is bad input naming its line") {
  TempDir tmp;
  const std::string dir = jobDir(tmp, 2);
  appendEpoch(dir, {1, 10, 3});
  std::ofstream(orpheus::ckpt::membershipPath(dir), std::ios::app) << "epoch 3 clock 5 ranks 2\n";
  REQUIRE_THROWS_WITH(readMembership(dir), Contains("line 2") && Contains("expected 'epoch 2"));
}
