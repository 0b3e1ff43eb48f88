// The simulated time line of a job: each rank's clocks placed on a virtual clock
// from what the real clock loop did (its phases' CPU time, the messages it sent)
// and the network model (engine/sim/network_model.h).
//
// Per rank r and clock t, with S the clock's start:
//   sends at      S + compute + stack(out)        (SVs computed and selected, copies handed to the stack)
//   exchanged at  BSP: max(sends, last batch of clock t addressed to r is in)
//                 SSP: sends (nothing waited for inside the clock)
//                 dense: every rank's sends, then one all-reduce of the gradient
//                 powersgd: every rank's sends, then each of the clock's all-reduces
//                 in turn (the factors P, then Q), each at its own size
//   ends at       exchanged + stack(in) + receive + update    (taken off the stack, decoded, rebuilt, logged)
//   where stack(bytes) is the network stack's CPU time for the bytes the rank sends
//   or receives in the clock's batches, times the rank's CPU slowdown (NetworkModel).
//   next start    BSP: the end; SSP: max(end, every batch addressed to r from the
//                 clocks <= t+1-s-1 is in); after a coordinator barrier (averaging,
//                 rotation): the last rank's end (and every batch in), plus the
//                 all-reduce of the replica and/or the ring shift.
// All-reduces are the model's algorithm, ring or tree (allreduceSeconds).
// Clocks are placed in order: the network sees clock t's messages before clock
// t+1's, also where SSP lets a fast rank's later clock go out first.
#pragma once

#include "engine/sim/network_model.h"

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

namespace orpheus::engine::sim {

// What one rank did in one clock.
struct RankClock {
  double compute = 0.0;  // CPU seconds before the exchange
  double receive = 0.0;  // CPU seconds of the exchange itself (decoding what came)
  double update = 0.0;   // CPU seconds after it (rebuild, log, coordinator)
  double slowdown = 1.0;  // the rank's CPU share: how much longer CPU work takes than measured
  uint64_t messageBytes = 0;  // bytes of each message sent
  std::vector<int> receivers;  // point to point: each send's peer
  bool toAllPeers = false;     // an allgather: every other rank
  uint64_t reducedBytes = 0;   // dense: gradient bytes all-reduced in the exchange
  std::vector<uint64_t> reductions;  // the bytes of each all-reduce of the exchange, in order
  uint64_t averagedBytes = 0;  // coordinator: replica bytes averaged after the clock
  uint64_t shiftedBytes = 0;   // coordinator: replica bytes rotated after the clock
};

// Where one rank's clock fell on the virtual clock.
struct RankTiming {
  double start = 0.0;
  double sends = 0.0;
  double exchanged = 0.0;
  double end = 0.0;
  double nextStart = 0.0;
  int inDegree = 0;     // messages addressed to the rank in this clock
  int64_t staleness = 0;  // clock - 1 - the newest clock whose batches had all arrived at the start
  std::vector<std::pair<int, double>> arrivals;  // (sender, arrival) of each batch addressed here; when recorded
};

class VirtualClock {
 public:
  enum class Mode { kBsp, kSsp, kDense, kPowerSgd };
  VirtualClock(const NetworkModel& model, int ranks, Mode mode, int staleness);

  // Places clock `clock` (the next one) given every rank's record of it.
  std::vector<RankTiming> place(uint64_t clock, const std::vector<RankClock>& ranks);
  // A membership change after clock `after` (BSP): from clock after+1 on, `ranks`
  // ranks, all starting once the last old rank's clock ended and the old ranks
  // all-reduced `averagedBytes` (every replica of the new epoch is their average).
  void regroup(int ranks, uint64_t after, double averagedBytes);
  // Fill RankTiming::arrivals from now on.
  void recordArrivals(bool on) { recordArrivals_ = on; }

 private:
  // The time all batches addressed to r of clocks <= c were in (0 for c < first).
  double inThrough(int r, uint64_t c) const;
  // The phases of place(): each rank's sends (its transfers, out[r].start and
  // .sends), what arrived where (out[r].inDegree and .arrivals; the last arrival
  // and the bytes per rank), the exchange's end and the clock's, the staleness at
  // the clock's start, and the next clock's start.
  std::vector<Transfer> sendsOf(const std::vector<RankClock>& ranks, std::vector<RankTiming>& out) const;
  void deliver(const std::vector<Transfer>& transfers, std::vector<RankTiming>& out, std::vector<double>& lastIn,
               std::vector<double>& bytesIn);
  void exchange(const std::vector<RankClock>& ranks, const std::vector<double>& lastIn,
                const std::vector<double>& bytesIn, std::vector<RankTiming>& out) const;
  double reductionSeconds(const std::vector<RankClock>& ranks) const;
  void measureStaleness(uint64_t clock, std::vector<RankTiming>& out) const;
  void nextStarts(uint64_t clock, const std::vector<RankClock>& ranks, std::vector<RankTiming>& out);

  Network network_;
  int ranks_;
  Mode mode_;
  int staleness_;
  bool recordArrivals_ = false;
  std::vector<double> start_;
  // Per rank, the arrival of the last batch of each recent clock, oldest first.
  uint64_t firstKept_ = 1;
  std::deque<std::vector<double>> lastIn_;  // [clock - firstKept_][rank]
};

}  // namespace orpheus::engine::sim
