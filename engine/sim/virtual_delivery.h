// Under SSP a replica applies each batch addressed to it as the batch arrives. In
// a simulation the threads' real interleaving says nothing about that order, so
// the simulator hands the batches to each rank in the order of their arrival on
// the virtual clock (engine/sim/virtual_clock.h). Where the virtual times are
// deterministic (--sim-compute-ms), a simulated SSP run then gives the same
// replicas on every run.
//
// A receiver applies batches at its check points, each a time on its virtual clock:
//   the start of clock t, and the moment it has sent clock t's batch.
// At each it gets, by (arrival, clock, sender), the batches that have arrived by
// then among those of clocks <= t-1: every rank has finished those clocks, so they
// are placed and their arrival times known. A batch of clock t or later waits for
// the receiver's next clock even where it arrived sooner in virtual time: a peer
// running ahead reaches a receiver no sooner than the receiver's own next clock,
// which stays inside SSP's staleness bound (the virtual clock starts clock t only
// once every batch of clocks <= t-s-1 is in, so the start's check point has them).
// Where the receiver waits for more (a coordinator barrier, the final drain), what
// remains of placed clocks comes by arrival, then the current clock's by sender.
#pragma once

#include "comm/run_gate.h"
#include "comm/message.h"
#include "engine/sim/virtual_clock.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace orpheus::engine::sim {

// What the virtual clock has placed, for the receivers: each rank's start of each
// clock and the arrival of each batch. Thread-safe.
class ArrivalBook {
 public:
  // `gate` (may be null): left while a rank waits for a clock to be placed.
  ArrivalBook(int ranks, comm::RunGate* gate);

  // Clock `clock` was placed (clocks are placed in order).
  void placed(uint64_t clock, const std::vector<RankTiming>& timing);
  // Blocks until clock `clock` is placed; false after `timeout`.
  bool waitPlaced(uint64_t clock, std::chrono::milliseconds timeout);
  // Rank `rank`'s start of clock `clock` (0 for clock 1); clock - 1 must be placed.
  double startOf(int rank, uint64_t clock) const;
  // The arrival at `receiver` of `sender`'s batch of the placed clock `clock`,
  // taken out of the book (each is asked for once).
  std::optional<double> takeArrival(int receiver, uint64_t clock, int sender);

 private:
  int ranks_;
  comm::RunGate* gate_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t placed_ = 0;
  std::map<uint64_t, std::vector<double>> starts_;  // recent clocks only
  std::vector<std::map<std::pair<uint64_t, int>, double>> arrivals_;  // per receiver, (clock, sender)
};

// The batches that came to one rank and are not yet handed on. Not thread-safe:
// the rank's own thread owns it.
class VirtualInbox {
 public:
  VirtualInbox(int rank, ArrivalBook& book) : rank_(rank), book_(book) {}

  // A batch as the transport delivered it (the clock is read from its header).
  void hold(comm::Message message);
  // The held batches of clocks <= `through` that arrived by `at`, by (arrival,
  // clock, sender), taken out. Clocks <= `through` must be placed.
  std::vector<comm::Message> due(uint64_t through, double at);
  // The held batch of clocks <= `through` that arrived first, taken out.
  std::optional<comm::Message> first(uint64_t through);
  // The held batch of `sender` at `clock`, taken out.
  std::optional<comm::Message> take(uint64_t clock, int sender);
  size_t size() const { return held_.size(); }

 private:
  struct Held {
    uint64_t clock = 0;
    int sender = 0;
    std::optional<double> arrival;
    comm::Message message;
  };
  // Looks up the arrival of every held batch of clocks <= through.
  void resolve(uint64_t through);

  int rank_;
  ArrivalBook& book_;
  std::vector<Held> held_;
};

// The clock an SV batch's header names (0 when the bytes are too short for one).
uint64_t batchClock(const std::vector<std::byte>& bytes);

}  // namespace orpheus::engine::sim
