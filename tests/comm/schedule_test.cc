#include "comm/schedule.h"
#include "engine/base/error.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

using namespace orpheus;
using comm::MulticastKind;
using comm::MulticastSchedule;
using comm::ScheduleConfig;
using Catch::Matchers::Contains;

namespace {

const std::vector<int> kRankCounts = {2, 3, 4, 8, 16};
const std::vector<MulticastKind> kKinds = {MulticastKind::kAll, MulticastKind::kRandom,
                                           MulticastKind::kFixed, MulticastKind::kRing};
constexpr uint64_t kSeed = 20180901;

MulticastSchedule make(MulticastKind kind, int p, int q, uint64_t seed = kSeed, double f = 0.0) {
  return MulticastSchedule(ScheduleConfig{kind, p, q, seed, f});
}

// Every valid fanout for P ranks (kAll ignores it; one value suffices there).
std::vector<int> fanouts(MulticastKind kind, int p) {
  if (kind == MulticastKind::kAll) return {p - 1};
  std::vector<int> out;
  for (int q = 1; q <= p - 1; ++q) out.push_back(q);
  return out;
}

// A spread of fanouts (1, 2, P/2, P-1) for the heavier checks.
std::vector<int> someFanouts(MulticastKind kind, int p) {
  if (kind == MulticastKind::kAll) return {p - 1};
  std::set<int> out{1, std::min(2, p - 1), std::max(1, p / 2), p - 1};
  return {out.begin(), out.end()};
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

bool sortedDistinct(const std::vector<int>& v) {
  return std::adjacent_find(v.begin(), v.end(), [](int a, int b) { return a >= b; }) == v.end();
}

std::vector<int> inDegrees(const std::vector<std::vector<int>>& graph) {
  std::vector<int> in(graph.size(), 0);
  for (const auto& to : graph)
    for (int r : to) ++in[static_cast<size_t>(r)];
  return in;
}

}  // namespace

TEST_CASE("parseMulticast reads the four kinds and refuses anything else", "[comm][schedule]") {
  CHECK(comm::parseMulticast("all") == MulticastKind::kAll);
  CHECK(comm::parseMulticast("random") == MulticastKind::kRandom);
  CHECK(comm::parseMulticast("fixed") == MulticastKind::kFixed);
  CHECK(comm::parseMulticast("ring") == MulticastKind::kRing);
  for (MulticastKind kind : kKinds) CHECK(comm::parseMulticast(comm::multicastName(kind)) == kind);

  CHECK_THROWS_AS(comm::parseMulticast("gossip"), InputError);
  CHECK_THROWS_WITH(comm::parseMulticast("gossip"), Contains("'gossip'") && Contains("all, random, fixed, ring"));
  CHECK_THROWS_AS(comm::parseMulticast("Random"), InputError);
  CHECK_THROWS_AS(comm::parseMulticast(""), InputError);
}

TEST_CASE("without failures every sender reaches exactly Q distinct peers other than itself",
          "[comm][schedule]") {
  for (MulticastKind kind : kKinds) {
    for (int p : kRankCounts) {
      for (int q : fanouts(kind, p)) {
        const MulticastSchedule s = make(kind, p, q);
        CHECK(s.fanout() == q);
        CHECK(s.brokenLinksPerClock() == 0);
        for (uint64_t clock = 0; clock < 40; ++clock) {
          for (int r = 0; r < p; ++r) {
            const std::vector<int> to = s.receivers(clock, r);
            INFO(comm::multicastName(kind) << " P=" << p << " Q=" << q << " clock " << clock << " sender " << r);
            REQUIRE(to.size() == static_cast<size_t>(q));
            CHECK(sortedDistinct(to));
            CHECK_FALSE(contains(to, r));
            for (int x : to) CHECK((x >= 0 && x < p));
            CHECK_FALSE(s.linkBroken(clock, r, (r + 1) % p));
          }
        }
      }
    }
  }
}

TEST_CASE("senders() is the exact inverse of receivers(), with and without failures",
          "[comm][schedule]") {
  for (double f : {0.0, 0.1, 0.5, 0.9}) {
    for (MulticastKind kind : kKinds) {
      for (int p : kRankCounts) {
        for (int q : someFanouts(kind, p)) {
          const MulticastSchedule s = make(kind, p, q, kSeed, f);
          for (uint64_t clock = 0; clock < 12; ++clock) {
            INFO(comm::multicastName(kind) << " P=" << p << " Q=" << q << " F=" << f << " clock " << clock);
            const auto graph = s.graph(clock);
            REQUIRE(graph.size() == static_cast<size_t>(p));
            for (int r = 0; r < p; ++r) REQUIRE(graph[static_cast<size_t>(r)] == s.receivers(clock, r));
            for (int r = 0; r < p; ++r) {
              std::vector<int> expected;
              for (int from = 0; from < p; ++from)
                if (contains(graph[static_cast<size_t>(from)], r)) expected.push_back(from);
              const std::vector<int> from = s.senders(clock, r);
              CHECK(from == expected);
              CHECK(sortedDistinct(from));
              CHECK_FALSE(contains(from, r));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("random multicast draws a new graph each clock", "[comm][schedule]") {
  for (int p : kRankCounts) {
    for (int q = 1; q < p - 1; ++q) {  // Q = P-1 leaves no choice
      const MulticastSchedule s = make(MulticastKind::kRandom, p, q);
      std::set<std::vector<std::vector<int>>> seen;
      for (uint64_t clock = 0; clock < 20; ++clock) seen.insert(s.graph(clock));
      INFO("P=" << p << " Q=" << q);
      CHECK(seen.size() >= 5);
    }
  }
}

TEST_CASE("random multicast lets every ordered pair meet within a few P/Q clocks",
          "[comm][schedule]") {
  for (int p : kRankCounts) {
    for (int q = 1; q <= p - 1; ++q) {
      const MulticastSchedule s = make(MulticastKind::kRandom, p, q);
      const uint64_t window = static_cast<uint64_t>(std::ceil(10.0 * p / q));
      std::vector<std::vector<bool>> met(static_cast<size_t>(p), std::vector<bool>(static_cast<size_t>(p)));
      for (uint64_t clock = 0; clock < window; ++clock)
        for (int r = 0; r < p; ++r)
          for (int to : s.receivers(clock, r)) met[static_cast<size_t>(r)][static_cast<size_t>(to)] = true;
      for (int r = 0; r < p; ++r)
        for (int to = 0; to < p; ++to)
          if (to != r) {
            INFO("P=" << p << " Q=" << q << ": " << r << " -> " << to << " within " << window << " clocks");
            CHECK(met[static_cast<size_t>(r)][static_cast<size_t>(to)]);
          }
    }
  }
}

TEST_CASE("random multicast picks every peer with probability Q/(P-1)", "[comm][schedule]") {
  const int p = 8;
  const int q = 3;
  const uint64_t clocks = 4000;
  const MulticastSchedule s = make(MulticastKind::kRandom, p, q);
  std::vector<std::vector<int>> count(p, std::vector<int>(p, 0));
  std::vector<double> inDegreeSum(p, 0.0);
  for (uint64_t clock = 0; clock < clocks; ++clock) {
    const auto graph = s.graph(clock);
    const auto in = inDegrees(graph);
    for (int r = 0; r < p; ++r) {
      inDegreeSum[static_cast<size_t>(r)] += in[static_cast<size_t>(r)];
      for (int to : graph[static_cast<size_t>(r)]) ++count[static_cast<size_t>(r)][static_cast<size_t>(to)];
    }
  }
  // Expected count per pair 4000 * 3/7 ~ 1714 with a standard deviation ~ 31.
  const double expected = static_cast<double>(clocks) * q / (p - 1);
  for (int r = 0; r < p; ++r) {
    CHECK(inDegreeSum[static_cast<size_t>(r)] / clocks == Approx(q).epsilon(0.05));
    for (int to = 0; to < p; ++to)
      if (to != r) CHECK(count[static_cast<size_t>(r)][static_cast<size_t>(to)] == Approx(expected).epsilon(0.1));
  }
}

TEST_CASE("fixed multicast sends to the same balanced peers every clock", "[comm][schedule]") {
  for (int p : kRankCounts) {
    for (int q = 1; q <= p - 1; ++q) {
      const MulticastSchedule s = make(MulticastKind::kFixed, p, q);
      const auto first = s.graph(0);
      for (int r = 0; r < p; ++r) {
        std::vector<int> expected;
        for (int d = 1; d <= q; ++d) expected.push_back((r + d) % p);
        std::sort(expected.begin(), expected.end());
        CHECK(first[static_cast<size_t>(r)] == expected);
      }
      for (uint64_t clock : {uint64_t{1}, uint64_t{2}, uint64_t{17}, uint64_t{1000003},
                             std::numeric_limits<uint64_t>::max()}) {
        const auto graph = s.graph(clock);
        CHECK(graph == first);
        for (int in : inDegrees(graph)) CHECK(in == q);
      }
      // The topology is a function of P and Q only.
      CHECK(make(MulticastKind::kFixed, p, q, kSeed + 1).graph(0) == first);
    }
  }
}

TEST_CASE("ring multicast is balanced each clock and reaches every peer in ceil((P-1)/Q) clocks",
          "[comm][schedule]") {
  for (int p : kRankCounts) {
    for (int q = 1; q <= p - 1; ++q) {
      const MulticastSchedule s = make(MulticastKind::kRing, p, q);
      const uint64_t period = static_cast<uint64_t>((p - 1 + q - 1) / q);
      const uint64_t huge = std::numeric_limits<uint64_t>::max() - period;
      for (uint64_t start : {uint64_t{0}, uint64_t{1}, uint64_t{5}, uint64_t{977}, huge}) {
        std::vector<std::vector<int>> met(static_cast<size_t>(p), std::vector<int>(static_cast<size_t>(p), 0));
        for (uint64_t clock = start; clock < start + period; ++clock) {
          const auto graph = s.graph(clock);
          for (int in : inDegrees(graph)) CHECK(in == q);
          for (int r = 0; r < p; ++r)
            for (int to : graph[static_cast<size_t>(r)]) ++met[static_cast<size_t>(r)][static_cast<size_t>(to)];
        }
        for (int r = 0; r < p; ++r)
          for (int to = 0; to < p; ++to) {
            if (to == r) continue;
            INFO("P=" << p << " Q=" << q << " start " << start << ": " << r << " -> " << to);
            CHECK(met[static_cast<size_t>(r)][static_cast<size_t>(to)] >= 1);
            // When Q divides P-1 the windows tile the peers: each pair exactly once.
            if ((p - 1) % q == 0) CHECK(met[static_cast<size_t>(r)][static_cast<size_t>(to)] == 1);
          }
      }
      CHECK(make(MulticastKind::kRing, p, q, kSeed + 1).graph(3) == s.graph(3));
    }
  }
}

TEST_CASE("schedules are deterministic in their config; random ones depend on the seed",
          "[comm][schedule]") {
  for (double f : {0.0, 0.25}) {
    for (MulticastKind kind : kKinds) {
      for (int p : kRankCounts) {
        for (int q : fanouts(kind, p)) {
          const MulticastSchedule a = make(kind, p, q, kSeed, f);
          const MulticastSchedule b = make(kind, p, q, kSeed, f);
          for (uint64_t clock : {uint64_t{0}, uint64_t{1}, uint64_t{42}, uint64_t{1} << 40}) {
            CHECK(a.graph(clock) == b.graph(clock));
            CHECK(a.brokenLinks(clock) == b.brokenLinks(clock));
          }
        }
      }
    }
  }
  for (int p : kRankCounts) {
    for (int q = 1; q < p - 1; ++q) {
      const MulticastSchedule a = make(MulticastKind::kRandom, p, q, 1);
      const MulticastSchedule b = make(MulticastKind::kRandom, p, q, 2);
      bool differ = false;
      for (uint64_t clock = 0; clock < 20 && !differ; ++clock) differ = a.graph(clock) != b.graph(clock);
      INFO("P=" << p << " Q=" << q);
      CHECK(differ);
    }
  }
}

TEST_CASE("link failures break round(F*P(P-1)) seeded links per clock", "[comm][schedule]") {
  for (double f : {0.0, 0.01, 0.1, 0.3, 0.5, 0.9, 0.99}) {
    for (int p : kRankCounts) {
      const MulticastSchedule s = make(MulticastKind::kRandom, p, 1, kSeed, f);
      const uint64_t pairs = static_cast<uint64_t>(p) * static_cast<uint64_t>(p - 1);
      const uint64_t expected = static_cast<uint64_t>(std::llround(f * static_cast<double>(pairs)));
      INFO("P=" << p << " F=" << f);
      CHECK(s.brokenLinksPerClock() == expected);
      std::set<std::vector<std::pair<int, int>>> seen;
      for (uint64_t clock = 0; clock < 10; ++clock) {
        const auto broken = s.brokenLinks(clock);
        CHECK(broken.size() == expected);
        CHECK(std::is_sorted(broken.begin(), broken.end()));
        CHECK(std::adjacent_find(broken.begin(), broken.end()) == broken.end());
        uint64_t scanned = 0;
        for (int from = 0; from < p; ++from)
          for (int to = 0; to < p; ++to)
            if (from != to && s.linkBroken(clock, from, to)) {
              ++scanned;
              CHECK(std::binary_search(broken.begin(), broken.end(), std::make_pair(from, to)));
            }
        CHECK(scanned == expected);
        for (const auto& [from, to] : broken) CHECK((from != to && from >= 0 && to >= 0 && from < p && to < p));
        seen.insert(broken);
      }
      // A fresh set each clock, unless there is only one way to choose it.
      if (expected > 0 && expected < pairs) CHECK(seen.size() > 1);
    }
  }
  // The failures are shared by the job: independent of the multicast kind and fanout.
  const auto reference = make(MulticastKind::kRandom, 8, 3, kSeed, 0.2).brokenLinks(7);
  CHECK(make(MulticastKind::kRing, 8, 1, kSeed, 0.2).brokenLinks(7) == reference);
  CHECK(make(MulticastKind::kAll, 8, 0, kSeed, 0.2).brokenLinks(7) == reference);
  CHECK(make(MulticastKind::kAll, 8, 0, kSeed + 1, 0.2).brokenLinks(7) != reference);
}

TEST_CASE("no message crosses a broken link; random substitutes, the others lose the message",
          "[comm][schedule]") {
  for (double f : {0.1, 0.3, 0.6, 0.95}) {
    for (MulticastKind kind : kKinds) {
      for (int p : kRankCounts) {
        for (int q : fanouts(kind, p)) {
          const MulticastSchedule failing = make(kind, p, q, kSeed, f);
          const MulticastSchedule intact = make(kind, p, q, kSeed, 0.0);
          for (uint64_t clock = 0; clock < 15; ++clock) {
            const auto brokenList = failing.brokenLinks(clock);
            const std::set<std::pair<int, int>> broken(brokenList.begin(), brokenList.end());
            const auto graph = failing.graph(clock);
            const auto nominalGraph = intact.graph(clock);
            for (int r = 0; r < p; ++r) {
              INFO(comm::multicastName(kind) << " P=" << p << " Q=" << q << " F=" << f << " clock " << clock
                                             << " sender " << r);
              const auto isBroken = [&](int x) { return broken.count({r, x}) > 0; };
              const std::vector<int>& to = graph[static_cast<size_t>(r)];
              const std::vector<int>& nominal = nominalGraph[static_cast<size_t>(r)];
              CHECK(sortedDistinct(to));
              CHECK_FALSE(contains(to, r));
              for (int x : to) CHECK_FALSE(isBroken(x));
              std::vector<int> kept;  // the nominal peers whose links survive
              for (int x : nominal)
                if (!isBroken(x)) kept.push_back(x);
              if (kind == MulticastKind::kRandom) {
                int reachable = 0;
                for (int x = 0; x < p; ++x)
                  if (x != r && !isBroken(x)) ++reachable;
                CHECK(to.size() == static_cast<size_t>(std::min(q, reachable)));
                // Intact first choices stay; only the broken ones are replaced.
                CHECK(std::includes(to.begin(), to.end(), kept.begin(), kept.end()));
              } else {
                CHECK(to == kept);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("invalid schedules are refused with a message naming the problem", "[comm][schedule]") {
  for (MulticastKind kind : {MulticastKind::kRandom, MulticastKind::kFixed, MulticastKind::kRing}) {
    CHECK_THROWS_AS(make(kind, 4, 4), InputError);
    CHECK_THROWS_WITH(make(kind, 4, 4), Contains("--fanout 4 needs at most P-1 = 3 peers"));
    CHECK_THROWS_WITH(make(kind, 4, 9), Contains("--fanout 9 needs at most P-1 = 3 peers"));
    CHECK_THROWS_WITH(make(kind, 2, 2), Contains("--fanout 2 needs at most P-1 = 1 peers"));
    CHECK_THROWS_AS(make(kind, 4, 0), InputError);
    CHECK_THROWS_WITH(make(kind, 4, 0), Contains("--fanout 0 must be at least 1"));
    CHECK_THROWS_WITH(make(kind, 4, -2), Contains("--fanout -2 must be at least 1"));
    CHECK_THROWS_AS(make(kind, 1, 0), InputError);
  }
  CHECK_NOTHROW(make(MulticastKind::kAll, 4, 0));  // kAll ignores the fanout
  CHECK_NOTHROW(make(MulticastKind::kAll, 4, 99));

  for (double f : {-0.1, 1.0, 1.5, std::numeric_limits<double>::quiet_NaN(),
                   std::numeric_limits<double>::infinity()}) {
    INFO("F=" << f);
    CHECK_THROWS_AS(make(MulticastKind::kRandom, 4, 2, kSeed, f), InputError);
    CHECK_THROWS_WITH(make(MulticastKind::kRandom, 4, 2, kSeed, f), Contains("--drop-links") && Contains("[0, 1)"));
  }
  CHECK_NOTHROW(make(MulticastKind::kRandom, 4, 2, kSeed, 0.999));

  CHECK_THROWS_AS(make(MulticastKind::kAll, 0, 0), InputError);
  CHECK_THROWS_WITH(make(MulticastKind::kAll, 0, 0), Contains("at least 1 rank"));
  CHECK_THROWS_AS(make(MulticastKind::kRandom, -3, 1), InputError);

  // Out-of-range ranks are the caller's bug, not bad input.
  const MulticastSchedule s = make(MulticastKind::kRandom, 4, 2);
  CHECK_THROWS_AS(s.receivers(0, 4), Error);
  CHECK_THROWS_AS(s.senders(0, -1), Error);
  CHECK_THROWS_AS(s.linkBroken(0, 2, 2), Error);
}

TEST_CASE("a single rank has no peers under every kind", "[comm][schedule]") {
  for (MulticastKind kind : kKinds) {
    for (int q : {1, 4}) {
      for (double f : {0.0, 0.5}) {
        const MulticastSchedule s = make(kind, 1, q, kSeed, f);
        CHECK(s.fanout() == 0);
        CHECK(s.brokenLinksPerClock() == 0);
        for (uint64_t clock = 0; clock < 5; ++clock) {
          CHECK(s.receivers(clock, 0).empty());
          CHECK(s.senders(clock, 0).empty());
          CHECK(s.graph(clock) == std::vector<std::vector<int>>(1));
          CHECK(s.brokenLinks(clock).empty());
        }
        CHECK_FALSE(s.describe().empty());
      }
    }
  }
}

TEST_CASE("describe() gives one line for logs", "[comm][schedule]") {
  CHECK(make(MulticastKind::kRandom, 8, 3, kSeed, 0.1).describe() ==
        "random multicast, Q=3 of P=8, 10% of links broken per clock (6 of 56)");
  CHECK(make(MulticastKind::kAll, 8, 0).describe() == "all-to-all broadcast, Q=P-1=7 of P=8, no links broken");
  CHECK(make(MulticastKind::kFixed, 16, 4).describe() == "fixed multicast, Q=4 of P=16, no links broken");
  CHECK(make(MulticastKind::kRing, 4, 2, kSeed, 0.25).describe() ==
        "round-robin (ring) multicast, Q=2 of P=4, 25% of links broken per clock (3 of 12)");
  for (MulticastKind kind : kKinds)
    CHECK(make(kind, 5, 2).describe().find('\n') == std::string::npos);
}
