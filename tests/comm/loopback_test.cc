#include "comm/loopback/loopback_transport.h"
#include "engine/base/error.h"
#include "tests/support/rank_threads.h"

#include <catch2/catch.hpp>

#include <thread>

using namespace orpheus;
using comm::loopback::LoopbackHub;
using comm::loopback::LoopbackTransport;

namespace {

template <typename Fn>
void runRanks(int size, Fn&& fn) {
  auto hub = std::make_shared<LoopbackHub>(size);
  testing::onRankThreads(size, [&](int r) {
    LoopbackTransport t(hub, r);
    fn(t);
  });
}

}  // namespace

TEST_CASE("loopback allgatherv delivers every rank's record in rank order", "[comm][loopback]") {
  for (int size : {1, 2, 4}) {
    runRanks(size, [size](comm::Transport& t) {
      for (uint64_t clock = 1; clock <= 20; ++clock) {
        // Rank r sends r + clock bytes of value r.
        std::vector<std::byte> mine(static_cast<size_t>(t.rank()) + clock, std::byte(t.rank()));
        const comm::Gathered all = t.allgatherv(mine, clock);
        REQUIRE(all.count() == static_cast<size_t>(size));
        for (int r = 0; r < size; ++r) {
          const auto part = all.part(static_cast<size_t>(r));
          REQUIRE(part.size() == static_cast<size_t>(r) + clock);
          for (auto b : part) REQUIRE(b == std::byte(r));
        }
      }
      const uint64_t sent = 20 * (static_cast<uint64_t>(t.rank())) + 210;  // sum over clocks of (rank + clock)
      CHECK(t.counters().bytesSent == sent * static_cast<uint64_t>(size - 1));
      CHECK(t.counters().messages == 20u * static_cast<uint64_t>(size - 1));
    });
  }
}

TEST_CASE("loopback reductions agree on every rank", "[comm][loopback]") {
  runRanks(4, [](comm::Transport& t) {
    std::vector<float> v = {1.0f * static_cast<float>(t.rank()), 2.0f};
    t.allreduceSum(v, 1);
    CHECK(v[0] == 6.0f);
    CHECK(v[1] == 8.0f);
    CHECK(t.counters().bytesSent == 2 * 8 * 3 / 4);
    std::vector<double> d = {static_cast<double>(t.rank())};
    t.control().max(d);
    CHECK(d[0] == 3.0);
    d[0] = static_cast<double>(t.rank());
    t.control().min(d);
    CHECK(d[0] == 0.0);
  });
}

TEST_CASE("a missing rank ends a loopback wait with a timeout naming the clock", "[comm][loopback]") {
  auto hub = std::make_shared<LoopbackHub>(2);
  LoopbackTransport t(hub, 0);
  t.setTimeout(std::chrono::milliseconds(100));
  std::vector<std::byte> mine(4);
  CHECK_THROWS_AS(t.allgatherv(mine, 42), TimeoutError);
  auto hub2 = std::make_shared<LoopbackHub>(2);
  LoopbackTransport t2(hub2, 0);
  t2.setTimeout(std::chrono::milliseconds(100));
  CHECK_THROWS_WITH(t2.allgatherv(mine, 42), Catch::Contains("clock 42") && Catch::Contains("1 of 2"));
}

TEST_CASE("loopback ring shift hands every rank its left neighbour's data", "[comm][loopback]") {
  runRanks(4, [](comm::Transport& t) {
    std::vector<float> v(5, static_cast<float>(t.rank()));
    t.shiftRing(v, 1);
    for (float x : v) CHECK(x == static_cast<float>((t.rank() + 3) % 4));
    CHECK(t.counters().bytesSent == 20u);
  });
}
