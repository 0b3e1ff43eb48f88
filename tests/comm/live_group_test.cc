// The loopback live group (comm/loopback/loopback_live_group.h): the agreement,
// split and grow of an in-process job, each rank a thread.
#include "comm/factory.h"
#include "engine/base/error.h"
#include "tests/support/rank_threads.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

using namespace orpheus;
using namespace std::chrono_literals;

namespace {

// Runs fn(rank, transport, live) on one thread per rank of a loopback job.
template <typename Fn>
void runGroup(int size, comm::loopback::JoinRank join, Fn&& fn) {
  auto transports = comm::makeLoopbackGroup(size);
  auto groups = comm::makeLoopbackLiveGroup(size, nullptr, std::move(join));
  testing::onRankThreads(size, [&](int r) {
    fn(r, std::move(transports[static_cast<size_t>(r)]), std::move(groups[static_cast<size_t>(r)]));
  });
}

}  // namespace

TEST_CASE("the loopback agreement is the elementwise max over the ranks, clock after clock", "[comm][live]") {
  runGroup(4, {}, [](int rank, std::unique_ptr<comm::Transport>, std::unique_ptr<comm::LiveGroup> live) {
    for (int clock = 0; clock < 50; ++clock) {
      // Slot r is set by rank r at clocks that are multiples of r + 1.
      std::vector<double> mine(4, 0.0);
      if (clock % (rank + 1) == 0) mine[static_cast<size_t>(rank)] = clock;
      REQUIRE_FALSE(live->pending());
      live->beginMax(mine);
      REQUIRE(live->pending());
      const std::vector<double> all = live->finishMax(5s);
      REQUIRE_FALSE(live->pending());
      for (int r = 0; r < 4; ++r) CHECK(all[static_cast<size_t>(r)] == (clock % (r + 1) == 0 ? clock : 0.0));
    }
  });
}

TEST_CASE("a loopback agreement a rank never joins times out naming that rank", "[comm][live]") {
  runGroup(3, {}, [](int rank, std::unique_ptr<comm::Transport>, std::unique_ptr<comm::LiveGroup> live) {
    if (rank == 2) return;  // never takes part
    const std::vector<double> mine = {1.0};
    live->beginMax(mine);
    try {
      live->finishMax(100ms);
      FAIL("finishMax returned without rank 2");
    } catch (const TimeoutError& e) {
      CHECK_THAT(e.what(), Catch::Contains("membership agreement did not complete within 0.1 s"));
      CHECK_THAT(e.what(), Catch::Contains("waiting for rank 2"));
    }
  });
}

TEST_CASE("a loopback split leaves the staying ranks a group of their own, in their old order", "[comm][live]") {
  std::mutex mu;
  std::vector<std::pair<int, int>> newRanks;  // (old rank, new rank)
  runGroup(5, {}, [&](int rank, std::unique_ptr<comm::Transport> transport, std::unique_ptr<comm::LiveGroup> live) {
    const std::vector<double> notice = {rank == 1 || rank == 3 ? 1.0 : 0.0};
    live->beginMax(notice);
    live->finishMax(5s);
    const bool stays = rank != 1 && rank != 3;
    transport.reset();  // the old group's transport is done with
    auto next = live->split(stays, 5s);
    if (!stays) {
      CHECK(next == nullptr);
      return;
    }
    REQUIRE(next != nullptr);
    CHECK(next->size() == 3);
    {
      std::lock_guard lock(mu);
      newRanks.emplace_back(rank, next->rank());
    }
    // The new group talks (data plane) and agrees again (live group), among its 3.
    std::vector<float> v = {1.0f};
    next->allreduceSum(v, 7);
    CHECK(v[0] == 3.0f);
    const std::vector<double> mine = {static_cast<double>(next->rank())};
    live->beginMax(mine);
    CHECK(live->finishMax(5s) == std::vector<double>{2.0});
  });
  std::sort(newRanks.begin(), newRanks.end());
  CHECK(newRanks == std::vector<std::pair<int, int>>{{0, 0}, {2, 1}, {4, 2}});
}

TEST_CASE("a loopback group grows by ranks that JoinRank starts, ranked after the old ones", "[comm][live]") {
  std::vector<std::thread> joiners;  // started by rank 0's grow(), joined below
  std::mutex mu;
  std::vector<int> ranksSeen;
  std::atomic<uint64_t> joinedAfter{0};
  // Every rank of the grown group (2 old, 2 new): one agreement, one sum on the data plane.
  auto afterGrow = [&](comm::Transport& transport, comm::LiveGroup& live) {
    const std::vector<double> mine = {static_cast<double>(transport.rank())};
    live.beginMax(mine);
    const double top = live.finishMax(5s)[0];
    std::vector<float> v = {1.0f};
    transport.allreduceSum(v, 1);
    std::lock_guard lock(mu);
    ranksSeen.push_back(transport.rank());
    CHECK(transport.size() == 4);
    CHECK(top == 3.0);
    CHECK(v[0] == 4.0f);
  };
  std::vector<std::exception_ptr> joinerErrors(2);
  comm::loopback::JoinRank join = [&](std::unique_ptr<comm::Transport> transport,
                                      std::unique_ptr<comm::LiveGroup> live, uint64_t clock) {
    joinedAfter = clock;
    const size_t slot = joiners.size();
    joiners.emplace_back(
        [&, slot](std::unique_ptr<comm::Transport> t, std::unique_ptr<comm::LiveGroup> l) {
          try {
            afterGrow(*t, *l);
          } catch (...) {
            joinerErrors[slot] = std::current_exception();
          }
        },
        std::move(transport), std::move(live));
  };
  runGroup(2, join, [&](int, std::unique_ptr<comm::Transport> transport, std::unique_ptr<comm::LiveGroup> live) {
    const std::vector<double> request = {2.0};
    live->beginMax(request);
    REQUIRE(live->finishMax(5s)[0] == 2.0);
    transport.reset();
    auto grown = live->grow(2, 17, 5s);
    REQUIRE(grown != nullptr);
    afterGrow(*grown, *live);
  });
  for (auto& t : joiners) t.join();
  for (auto& e : joinerErrors)
    if (e) std::rethrow_exception(e);
  CHECK(joinedAfter == 17u);
  std::sort(ranksSeen.begin(), ranksSeen.end());
  CHECK(ranksSeen == std::vector<int>{0, 1, 2, 3});
}

TEST_CASE("a loopback group with no way to start ranks refuses to grow on every rank", "[comm][live]") {
  runGroup(2, {}, [](int, std::unique_ptr<comm::Transport>, std::unique_ptr<comm::LiveGroup> live) {
    CHECK_THROWS_WITH(live->grow(1, 3, 1s), Catch::Contains("cannot grow"));
  });
}
