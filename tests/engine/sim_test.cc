// The simulator's network model and virtual clock on cases computed by hand, and
// the loopback run gate that bounds the threads running at once.
#include "comm/run_gate.h"
#include "engine/base/error.h"
#include "engine/base/sv_batch.h"
#include "engine/sim/cpu_share.h"
#include "engine/sim/network_model.h"
#include "engine/sim/virtual_clock.h"
#include "engine/sim/virtual_delivery.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

using namespace orpheus::engine::sim;

namespace {

// 1 Gbit/s = 125e6 bytes/s; 1 MB then takes 8 ms on the wire.
NetworkModel gigabit() {
  NetworkModel m;
  m.linkGbps = 1.0;
  m.latencySeconds = 50e-6;
  return m;
}

constexpr double kMb = 1e6;
constexpr double kWire = 0.008;  // 1 MB at 1 Gbit/s
constexpr double kLat = 50e-6;

// A message from `sender` whose SV batch header names `clock`.
orpheus::comm::Message batchOf(int sender, uint64_t clock) {
  orpheus::comm::Message m;
  m.peer = sender;
  m.bytes.resize(orpheus::kSvBatchHeaderBytes + 8);
  std::memcpy(m.bytes.data() + 24, &clock, sizeof clock);
  return m;
}

std::vector<std::pair<int, uint64_t>> senderAndClock(const std::vector<orpheus::comm::Message>& ms) {
  std::vector<std::pair<int, uint64_t>> out;
  for (const auto& m : ms) out.emplace_back(m.peer, batchClock(m.bytes));
  return out;
}

}  // namespace

TEST_CASE("one message costs bytes over bandwidth plus latency", "[sim]") {
  Network net(gigabit(), 2);
  const std::vector<Transfer> t = {{0, 0.5, static_cast<uint64_t>(kMb), {1}}};
  const auto in = net.deliver(t);
  CHECK(in[0][0] == Approx(0.5 + kWire + kLat));
}

TEST_CASE("a sender's copies serialize on its NIC unless multicast", "[sim]") {
  const std::vector<Transfer> t = {{0, 0.0, static_cast<uint64_t>(kMb), {1, 2, 3}}};
  Network unicast(gigabit(), 4);
  const auto in = unicast.deliver(t);
  CHECK(in[0][0] == Approx(1 * kWire + kLat));
  CHECK(in[0][1] == Approx(2 * kWire + kLat));
  CHECK(in[0][2] == Approx(3 * kWire + kLat));
  NetworkModel m = gigabit();
  m.multicast = true;
  Network multicast(m, 4);
  const auto once = multicast.deliver(t);
  for (double arrival : once[0]) CHECK(arrival == Approx(kWire + kLat));
}

TEST_CASE("incast serializes on the receiver's NIC", "[sim]") {
  Network net(gigabit(), 4);
  const auto b = static_cast<uint64_t>(kMb);
  const std::vector<Transfer> t = {{1, 0.0, b, {0}}, {2, 0.0, b, {0}}, {3, 0.0, b, {0}}};
  const auto in = net.deliver(t);
  CHECK(in[0][0] == Approx(kWire + kLat));
  CHECK(in[1][0] == Approx(2 * kWire + kLat));
  CHECK(in[2][0] == Approx(3 * kWire + kLat));
}

TEST_CASE("a slower NIC limits both ends; NICs stay busy across calls", "[sim]") {
  NetworkModel m = gigabit();
  m.linkGbps = 10.0;
  m.nicGbps = 1.0;
  Network net(m, 2);
  const std::vector<Transfer> t = {{0, 0.0, static_cast<uint64_t>(kMb), {1}}};
  CHECK(net.deliver(t)[0][0] == Approx(kWire + kLat));
  // The next message is ready at once but the NIC is free only at kWire.
  CHECK(net.deliver(t)[0][0] == Approx(2 * kWire + kLat));
}

TEST_CASE("an oversubscribed core is shared by the senders", "[sim]") {
  NetworkModel m = gigabit();
  m.linkGbps = 10.0;
  m.coreGbps = 2.0;  // 4 senders: 0.5 Gbit/s each
  Network net(m, 8);
  const auto b = static_cast<uint64_t>(kMb);
  const std::vector<Transfer> t = {{0, 0.0, b, {4}}, {1, 0.0, b, {5}}, {2, 0.0, b, {6}}, {3, 0.0, b, {7}}};
  for (const auto& in : net.deliver(t)) CHECK(in[0] == Approx(2 * kWire + kLat));
}

TEST_CASE("ring collectives follow their closed forms", "[sim]") {
  const NetworkModel m = gigabit();
  // 4 ranks, 4 MB: 6 steps of 1 MB.
  CHECK(ringAllreduceSeconds(m, 4, 4 * kMb) == Approx(6 * (kLat + kWire)));
  CHECK(ringShiftSeconds(m, 4, kMb) == Approx(kLat + kWire));
  CHECK(ringAllreduceSeconds(m, 1, kMb) == 0.0);
}

TEST_CASE("a tree all-reduce moves the whole buffer 2 ceil(log2 P) times, each step paying the latency", "[sim]") {
  NetworkModel m = gigabit();
  // 4 ranks: 4 steps of 1 MB; 1000 ranks: 20 steps.
  CHECK(treeAllreduceSeconds(m, 4, kMb) == Approx(4 * (kLat + kWire)));
  CHECK(treeAllreduceSeconds(m, 1000, kMb) == Approx(20 * (kLat + kWire)));
  CHECK(treeAllreduceSeconds(m, 5, kMb) == Approx(6 * (kLat + kWire)));
  CHECK(treeAllreduceSeconds(m, 1, kMb) == 0.0);
  // The ring pays the latency 2(P-1) times: at P = 1000 a small buffer costs it far more.
  CHECK(ringAllreduceSeconds(m, 1000, 1000.0) == Approx(1998 * (kLat + 1.0 / 125e6)));
  CHECK(allreduceSeconds(m, 4, 4 * kMb) == Approx(ringAllreduceSeconds(m, 4, 4 * kMb)));
  m.allreduce = AllreduceAlgorithm::kTree;
  CHECK(allreduceSeconds(m, 4, 4 * kMb) == Approx(treeAllreduceSeconds(m, 4, 4 * kMb)));
}

TEST_CASE("PowerSGD: the all-reduces after the last rank's sends, one after the other", "[sim]") {
  NetworkModel m = gigabit();
  m.allreduce = AllreduceAlgorithm::kTree;
  VirtualClock clock(m, 4, VirtualClock::Mode::kPowerSgd, 0);
  std::vector<RankClock> ranks(4);
  for (size_t r = 0; r < ranks.size(); ++r) {
    ranks[r].compute = 0.010 * static_cast<double>(r + 1);  // rank 3, the straggler, sends at 40 ms
    ranks[r].update = 0.001;
    ranks[r].reductions = {static_cast<uint64_t>(kMb), static_cast<uint64_t>(2 * kMb)};
  }
  const auto t = clock.place(1, ranks);
  // Tree over 4 ranks: 4 steps each, of 1 MB then of 2 MB.
  const double reduced = 0.040 + 4 * (kLat + kWire) + 4 * (kLat + 2 * kWire);
  for (const auto& r : t) {
    CHECK(r.exchanged == Approx(reduced));
    CHECK(r.nextStart == Approx(reduced + 0.001));
  }
}

TEST_CASE("BSP: a clock ends when its last batch is in, then the rebuild", "[sim]") {
  VirtualClock clock(gigabit(), 2, VirtualClock::Mode::kBsp, 0);
  std::vector<RankClock> ranks(2);
  ranks[0].compute = 0.010;
  ranks[0].update = 0.001;
  ranks[0].messageBytes = static_cast<uint64_t>(kMb);
  ranks[0].receivers = {1};
  ranks[1].compute = 0.002;
  ranks[1].update = 0.001;
  ranks[1].messageBytes = static_cast<uint64_t>(kMb);
  ranks[1].receivers = {0};
  const auto t = clock.place(1, ranks);
  // Rank 0 hears from rank 1 at 0.002 + 8 ms + 50 us, just after its own compute ends.
  CHECK(t[0].exchanged == Approx(0.002 + kWire + kLat));
  CHECK(t[0].end == Approx(0.002 + kWire + kLat + 0.001));
  // Rank 1 waits for rank 0's batch: 0.010 + 8 ms + 50 us.
  CHECK(t[1].exchanged == Approx(0.010 + kWire + kLat));
  CHECK(t[1].end == Approx(0.010 + kWire + kLat + 0.001));
  CHECK(t[1].nextStart == t[1].end);
  CHECK(t[0].inDegree == 1);
  CHECK(t[1].staleness == 0);
  // The next clock starts where this one ended.
  const auto u = clock.place(2, ranks);
  CHECK(u[1].start == Approx(t[1].end));
}

TEST_CASE("SSP lets a rank run ahead by s clocks, no further", "[sim]") {
  // Rank 0 is slow (100 ms per clock), rank 1 fast (1 ms); batches tiny.
  VirtualClock clock(gigabit(), 2, VirtualClock::Mode::kSsp, 1);
  std::vector<RankClock> ranks(2);
  ranks[0].compute = 0.100;
  ranks[0].receivers = {1};
  ranks[0].messageBytes = 1;
  ranks[1].compute = 0.001;
  ranks[1].receivers = {0};
  ranks[1].messageBytes = 1;
  const auto c1 = clock.place(1, ranks);
  // Clock 2 of rank 1 needs clocks <= 0: starts at once.
  CHECK(c1[1].nextStart == Approx(0.001));
  const auto c2 = clock.place(2, ranks);
  // Clock 3 of rank 1 needs rank 0's clock-1 batch, sent at 0.100.
  const double bytes1 = 1.0 / 125e6;
  CHECK(c2[1].nextStart == Approx(0.100 + bytes1 + kLat));
  CHECK(c2[1].staleness == 1);
}

TEST_CASE("a coordinator barrier waits for the last rank, then the collective", "[sim]") {
  VirtualClock clock(gigabit(), 2, VirtualClock::Mode::kBsp, 0);
  std::vector<RankClock> ranks(2);
  ranks[0].compute = 0.010;
  ranks[1].compute = 0.020;
  ranks[0].averagedBytes = ranks[1].averagedBytes = static_cast<uint64_t>(2 * kMb);
  const auto t = clock.place(1, ranks);
  // Ring all-reduce of 2 MB over 2 ranks: 2 steps of 1 MB.
  for (const auto& r : t) CHECK(r.nextStart == Approx(0.020 + 2 * (kLat + kWire)));
}

TEST_CASE("the network stack's CPU per byte delays the sends and the end, times the CPU share", "[sim]") {
  NetworkModel m = gigabit();
  m.stackGbps = 8.0;  // 1e9 bytes/s of a core: 1 MB costs 1 ms
  VirtualClock clock(m, 3, VirtualClock::Mode::kBsp, 0);
  std::vector<RankClock> ranks(3);
  for (auto& r : ranks) {
    r.compute = 0.010;
    r.messageBytes = static_cast<uint64_t>(kMb);
  }
  ranks[0].receivers = {1, 2};  // two copies through rank 0's stack: 2 ms
  ranks[0].slowdown = 2.0;      // on a shared core: 4 ms
  const auto t = clock.place(1, ranks);
  CHECK(t[0].sends == Approx(0.010 + 0.004));
  CHECK(t[1].sends == Approx(0.010));  // sends nothing
  // Rank 1's copy leaves at 14 ms, is on the wire 8 ms; taking it off the stack costs 1 ms.
  CHECK(t[1].exchanged == Approx(0.014 + kWire + kLat));
  CHECK(t[1].end == Approx(0.014 + kWire + kLat + 0.001));
  // Rank 2 gets the second copy, after the first on rank 0's NIC.
  CHECK(t[2].end == Approx(0.014 + 2 * kWire + kLat + 0.001));
  // Rank 0 receives nothing: no stack time on its way in.
  CHECK(t[0].end == Approx(t[0].exchanged));
  // Free by default.
  CHECK(NetworkModel{}.stackSeconds(kMb) == 0.0);
  NetworkModel bad;
  bad.stackGbps = -1.0;
  CHECK_THROWS_AS(bad.validate(), orpheus::InputError);
}

TEST_CASE("the network model refuses impossible settings", "[sim]") {
  NetworkModel m;
  m.linkGbps = 0.0;
  CHECK_THROWS_AS(m.validate(), orpheus::InputError);
}

TEST_CASE("workers sharing a host's cores compute W/C times as long", "[sim]") {
  CpuShare own;  // the default: a core per worker
  CHECK(own.slowdown(0, 8) == 1.0);
  CpuShare twoCores{2, 1};  // the emulated cluster: 8 processes on one 2-core machine
  for (int r = 0; r < 8; ++r) CHECK(twoCores.slowdown(r, 8) == 4.0);
  CHECK(twoCores.slowdown(0, 4) == 2.0);
  CHECK(twoCores.slowdown(0, 3) == 1.5);
  CHECK(twoCores.slowdown(0, 2) == 1.0);
  CHECK(twoCores.slowdown(0, 1) == 1.0);  // an idle core does not speed a worker up
  // 8 workers on 2 hosts of 2 cores: 4 per host, twice as long.
  CpuShare twoHosts{2, 2};
  CHECK(twoHosts.hostOf(3, 8) == 0);
  CHECK(twoHosts.hostOf(4, 8) == 1);
  CHECK(twoHosts.slowdown(7, 8) == 2.0);
  // 5 workers on 2 hosts: ranks 0-2 on host 0 (3 on 2 cores), ranks 3-4 on host 1.
  CHECK(twoHosts.workersOn(0, 5) == 3);
  CHECK(twoHosts.workersOn(1, 5) == 2);
  CHECK(twoHosts.hostOf(2, 5) == 0);
  CHECK(twoHosts.hostOf(3, 5) == 1);
  CHECK(twoHosts.slowdown(2, 5) == 1.5);
  CHECK(twoHosts.slowdown(3, 5) == 1.0);
  // 1000 workers on 3 hosts: 334, 333, 333.
  CpuShare three{1, 3};
  CHECK(three.workersOn(0, 1000) + three.workersOn(1, 1000) + three.workersOn(2, 1000) == 1000);
  CHECK(three.slowdown(0, 1000) == 334.0);
  CHECK(three.slowdown(999, 1000) == 333.0);
  CHECK_THROWS_AS((CpuShare{-1, 1}.validate(4)), orpheus::InputError);
  CHECK_THROWS_AS((CpuShare{2, 5}.validate(4)), orpheus::InputError);
  CHECK_NOTHROW((CpuShare{2, 4}.validate(4)));
}

TEST_CASE("stragglers: round(fraction * P) ranks, at least one, drawn from the seed", "[sim]") {
  const auto slowed = [](const std::vector<double>& f) {
    return std::count_if(f.begin(), f.end(), [](double x) { return x == 2.0; });
  };
  const Stragglers onePercent{0.01, 2.0};
  const std::vector<double> a = onePercent.factors(1000, 7);
  CHECK(slowed(a) == 10);
  CHECK(std::count(a.begin(), a.end(), 1.0) == 990);
  CHECK(a == onePercent.factors(1000, 7));  // repeatable
  CHECK(a != onePercent.factors(1000, 8));  // and the seed's
  CHECK(slowed(onePercent.factors(100, 7)) == 1);
  CHECK(slowed(onePercent.factors(8, 7)) == 1);  // at least one
  const std::vector<double> none = Stragglers{}.factors(8, 7);
  CHECK(std::count(none.begin(), none.end(), 1.0) == 8);
  CHECK_THROWS_AS((Stragglers{1.5, 2.0}.validate()), orpheus::InputError);
  CHECK_THROWS_AS((Stragglers{0.1, 0.5}.validate()), orpheus::InputError);
  CHECK_NOTHROW((Stragglers{0.01, 2.0}.validate()));
}

TEST_CASE("BSP waits for a straggler; SSP lets the others run up to s clocks ahead of it", "[sim]") {
  for (const auto mode : {VirtualClock::Mode::kBsp, VirtualClock::Mode::kSsp}) {
    VirtualClock clock(gigabit(), 2, mode, 2);
    std::vector<RankClock> ranks(2);
    ranks[0].compute = 0.010;
    ranks[1].compute = 0.020;  // slowed 2x
    for (auto& r : ranks) {
      r.messageBytes = 1000;
      r.toAllPeers = true;
    }
    std::vector<RankTiming> t;
    for (uint64_t c = 1; c <= 6; ++c) t = clock.place(c, ranks);
    if (mode == VirtualClock::Mode::kBsp) {
      // Everyone at the straggler's pace: clock 7 starts after 6 of its clocks.
      CHECK(t[0].nextStart == Approx(t[1].nextStart).epsilon(0.01));
      CHECK(t[0].nextStart > 6 * 0.020);
    } else {
      // The fast rank waits only for batches s + 1 clocks old: it stays s clocks ahead.
      CHECK(t[0].nextStart < t[1].nextStart);
      CHECK(t[0].nextStart >= 4 * 0.020);
    }
  }
}

TEST_CASE("SSP: batches are handed on by virtual arrival, not as the threads posted them", "[sim]") {
  // Rank 0 hears from ranks 1 and 2 at clocks 1 and 2. Rank 2's batch of clock 1
  // arrives first although rank 1's was posted first.
  ArrivalBook book(3, nullptr);
  std::vector<RankTiming> one(3);
  one[0].nextStart = 0.010;
  one[0].arrivals = {{1, 0.005}, {2, 0.002}};
  std::vector<RankTiming> two(3);
  two[0].nextStart = 0.030;
  two[0].arrivals = {{1, 0.012}, {2, 0.020}};
  book.placed(1, one);
  CHECK(book.startOf(0, 1) == 0.0);
  CHECK(book.startOf(0, 2) == 0.010);

  VirtualInbox inbox(0, book);
  // The threads' order: clock 2 of rank 1 even before clock 1 of rank 2.
  inbox.hold(batchOf(1, 1));
  inbox.hold(batchOf(1, 2));
  inbox.hold(batchOf(2, 1));
  inbox.hold(batchOf(2, 2));
  // The start of clock 2 (at 0.010): clock 1's batches by arrival; clock 2 is not placed.
  CHECK(senderAndClock(inbox.due(1, 0.010)) == std::vector<std::pair<int, uint64_t>>{{2, 1}, {1, 1}});
  CHECK(inbox.size() == 2);
  book.placed(2, two);
  CHECK(book.startOf(0, 3) == 0.030);
  // At 0.015 only rank 1's batch of clock 2 is in; rank 2's (0.020) waits.
  CHECK(senderAndClock(inbox.due(2, 0.015)) == std::vector<std::pair<int, uint64_t>>{{1, 2}});
  CHECK(inbox.due(2, 0.019).empty());
  CHECK(senderAndClock(inbox.due(2, 0.020)) == std::vector<std::pair<int, uint64_t>>{{2, 2}});
  CHECK(inbox.size() == 0);
}

TEST_CASE("SSP: ties in arrival go by clock then sender; waiting takes the earliest", "[sim]") {
  ArrivalBook book(4, nullptr);
  std::vector<RankTiming> one(4);
  one[3].arrivals = {{2, 0.004}, {0, 0.004}, {1, 0.001}};
  book.placed(1, one);
  VirtualInbox inbox(3, book);
  inbox.hold(batchOf(2, 1));
  inbox.hold(batchOf(0, 1));
  inbox.hold(batchOf(1, 1));
  inbox.hold(batchOf(0, 2));  // not placed: only take() hands it on
  CHECK(inbox.first(1)->peer == 1);
  CHECK(senderAndClock(inbox.due(1, 1.0)) == std::vector<std::pair<int, uint64_t>>{{0, 1}, {2, 1}});
  CHECK_FALSE(inbox.first(1).has_value());
  CHECK_FALSE(inbox.take(2, 1).has_value());
  CHECK(inbox.take(2, 0)->peer == 0);
  CHECK(batchClock(std::vector<std::byte>(10)) == 0);
}

TEST_CASE("a run gate lets at most its capacity of threads run at once", "[sim]") {
  orpheus::comm::RunGate gate(2);
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&] {
      gate.enter();
      for (int k = 0; k < 50; ++k) {
        const int now = ++running;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::yield();
        --running;
        gate.yield();
      }
      gate.leave();
    });
  }
  for (auto& t : threads) t.join();
  CHECK(most.load() <= 2);
  CHECK(most.load() >= 1);
}
