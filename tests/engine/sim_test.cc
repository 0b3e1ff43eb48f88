// The simulator's network model and virtual clock on cases computed by hand, and
// the loopback run gate that bounds the threads running at once.
#include "comm/loopback/run_gate.h"
#include "engine/base/error.h"
#include "engine/sim/network_model.h"
#include "engine/sim/virtual_clock.h"

#include <catch2/catch.hpp>

#include <atomic>
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

TEST_CASE("the network model refuses impossible settings", "[sim]") {
  NetworkModel m;
  m.linkGbps = 0.0;
  CHECK_THROWS_AS(m.validate(), orpheus::InputError);
}

TEST_CASE("a run gate lets at most its capacity of threads run at once", "[sim]") {
  orpheus::comm::loopback::RunGate gate(2);
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
