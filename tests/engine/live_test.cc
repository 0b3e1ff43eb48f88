#include "engine/membership/live.h"

#include "ckpt/job_info.h"
#include "comm/factory.h"
#include "engine/base/error.h"
#include "engine/membership/elastic.h"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <fstream>

#include "tests/support/temp_dir.h"

#include <filesystem>
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
  markLive(tmp.path().string());  // a job runs there (this process stands for its rank 0)
  return tmp.path().string();
}

// One rank's view of the agreement: the max over the group is what `others` add to
// this rank's values.
class FakeGroup final : public LiveGroup {
 public:
  explicit FakeGroup(size_t ranks) : others(ranks, 0.0) {}
  void beginMax(std::span<const double> values) override {
    REQUIRE(!pending_);
    posted.assign(values.begin(), values.end());
    pending_ = true;
    ++begun;
  }
  bool pending() const override { return pending_; }
  std::vector<double> finishMax(std::chrono::milliseconds) override {
    REQUIRE(pending_);
    pending_ = false;
    std::vector<double> out = posted;
    for (size_t i = 0; i < out.size(); ++i) out[i] = std::max(out[i], others[i]);
    return out;
  }
  std::unique_ptr<orpheus::comm::Transport> split(bool, std::chrono::milliseconds) override { return nullptr; }
  std::unique_ptr<orpheus::comm::Transport> grow(int, uint64_t, std::chrono::milliseconds) override { return nullptr; }

  std::vector<double> others;
  std::vector<double> posted;
  int begun = 0;

 private:
  bool pending_ = false;
};

}  // namespace

TEST_CASE("ctl shrink writes a request, merged with one pending; bad requests are refused") {
  TempDir tmp;
  const std::string dir = jobDir(tmp, 4);
  REQUIRE(requestShrink(dir, {2}) == std::vector<int>{2});
  REQUIRE(std::filesystem::exists(membershipRequestPath(dir)));
  REQUIRE(requestShrink(dir, {3, 2}) == std::vector<int>({2, 3}));
  REQUIRE_THROWS_WITH(requestShrink(dir, {4}), Contains("rank 4 is not a rank of the job (ranks 0..3)"));
  REQUIRE_THROWS_WITH(requestShrink(dir, {-1}), Contains("is not a rank of the job"));
  REQUIRE_THROWS_WITH(requestShrink(dir, {0, 1}), Contains("rank 0 writes the job's outputs"));
  REQUIRE_THROWS_WITH(requestShrink(dir, {0}), Contains("rank 0 writes the job's outputs"));
  REQUIRE_THROWS_AS(requestShrink((tmp.path() / "missing").string(), {1}), orpheus::InputError);
  REQUIRE_THROWS_WITH(requestGrow(dir, 0), Contains("expected 1 to 64 new ranks, got 0"));
  REQUIRE_THROWS_AS(requestGrow((tmp.path() / "missing").string(), 1), orpheus::InputError);
  requestGrow(dir, 2);
  REQUIRE(requestShrink(dir, {1}) == std::vector<int>({1, 2, 3}));  // a pending grow stays
  // The current membership counts: after a change to 3 ranks, rank 3 is unknown.
  TempDir other;
  const std::string shrunk = jobDir(other, 4);
  appendEpoch(shrunk, {1, 10, 3});
  REQUIRE_THROWS_WITH(requestShrink(shrunk, {3}), Contains("ranks 0..2"));
}

TEST_CASE("ctl refuses a request no job will read, and a job's end drops a late one") {
  TempDir tmp;
  const std::string dir = jobDir(tmp, 4);
  requestGrow(dir, 1);
  endLive(dir);  // the job ends: its marker goes, and the request that came too late
  CHECK_FALSE(std::filesystem::exists(membershipRequestPath(dir)));
  CHECK_THROWS_WITH(requestShrink(dir, {1}), Contains("no job is running in") && Contains("(it finished"));
  CHECK_THROWS_WITH(requestGrow(dir, 1), Contains("no job is running in"));
  // A marker whose rank 0 (a pid on this host) is gone is a job that died.
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::ofstream(tmp.path() / "live") << 999999999 << " " << host << "\n";
  CHECK_THROWS_WITH(requestShrink(dir, {1}), Contains("its rank 0, pid 999999999 on this host, is gone"));
  CHECK_FALSE(std::filesystem::exists(membershipRequestPath(dir)));
}

TEST_CASE("the membership changes one clock after a notice, at the same clock on every rank") {
  TempDir tmp;
  const std::string dir = jobDir(tmp, 4);
  auto group = orpheus::comm::makeLoopbackGroup(1);  // only rank() and size() are read
  SECTION("rank 0 reads ctl's request once and drops it") {
    FakeGroup fake(2);
    // A one-rank job cannot shrink: rank 0 stays, other ranks of the request are ignored.
    MembershipWatch watch(fake, *group[0], dir, std::chrono::seconds(1));
    REQUIRE_FALSE(watch.changesAfter(1));
    requestShrink(dir, {1});
    REQUIRE_FALSE(watch.changesAfter(2));
    REQUIRE_FALSE(std::filesystem::exists(membershipRequestPath(dir)));
    REQUIRE_FALSE(watch.changesAfter(3));
    watch.settle();
    REQUIRE_FALSE(fake.pending());
  }
  SECTION("a peer's notice, seen in the agreement begun a clock earlier") {
    FakeGroup fake(2);
    MembershipWatch watch(fake, *group[0], dir, std::chrono::seconds(1));
    REQUIRE_FALSE(watch.changesAfter(1));
    REQUIRE(fake.begun == 1);
    fake.others[0] = 123.5;  // what the max over the group brings in
    REQUIRE(watch.changesAfter(2));
    REQUIRE(watch.change().leaving == std::vector<int>{0});
    REQUIRE(watch.change().leaves(0));
    REQUIRE(watch.change().noticeAt[0] == 123.5);
    REQUIRE(watch.change().joining == 0);
    REQUIRE_FALSE(fake.pending());  // nothing under way at the change
  }
  SECTION("ctl grow: rank 0 asks for new ranks in the agreement's last slot") {
    FakeGroup fake(2);
    MembershipWatch watch(fake, *group[0], dir, std::chrono::seconds(1));
    requestGrow(dir, 2);
    REQUIRE_FALSE(watch.changesAfter(1));
    REQUIRE(fake.posted == std::vector<double>({0.0, 2.0}));
    REQUIRE(watch.changesAfter(2));
    REQUIRE(watch.change().leaving.empty());
    REQUIRE(watch.change().joining == 2);
  }
}
