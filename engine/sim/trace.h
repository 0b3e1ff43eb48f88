// The clocks of a simulated job as the ranks finish them: once every rank has
// reported a clock, the clock is placed on the virtual clock (in clock order) and
// its metrics line is written with simulated times, through the same aggregator as
// `train` writes its lines with. Thread-safe: every rank's thread adds to it.
#pragma once

#include "engine/metrics/metrics.h"
#include "engine/sim/virtual_clock.h"
#include "engine/sim/virtual_delivery.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace orpheus::engine::sim {

// What the placed clocks add up to, for the summary.
struct TraceTotals {
  uint64_t clocks = 0;
  double seconds = 0.0;  // rank 0's simulated time at the end of the last clock placed
  double lastClockEnd = 0.0;  // the latest rank's
  uint64_t messagesMin = UINT64_MAX;
  uint64_t messagesMax = 0;
  double messages = 0.0;
  double bytes = 0.0;
  double computeSeconds = 0.0;  // summed over ranks and clocks
  double rankClocks = 0.0;      // the ranks of each clock placed, summed (clocks * P without membership changes)
  std::map<int, uint64_t> inDegree;   // messages addressed to a rank in a clock -> (rank, clock) count
  std::map<int64_t, uint64_t> staleness;
};

class Trace {
 public:
  // `aggregator` writes the lines; it must outlive the trace.
  Trace(int ranks, VirtualClock clock, MetricsAggregator& aggregator);
  // Tells `book` (it must outlive the trace) of every clock placed, with its arrivals.
  void informs(ArrivalBook* book);

  // Rank `rank`'s clock `clock`: what it did and the record it reported.
  void add(int rank, uint64_t clock, RankClock&& work, const ClockRecord& record);

  // A membership change after clock `after` (every clock <= after placed, none
  // after it reported yet): the clocks from after+1 on are `ranks` ranks'
  // (VirtualClock::regroup), and `note` is written after clock after's line.
  void regroup(int ranks, uint64_t after, double averagedBytes, const JsonLine& note);

  TraceTotals totals() const;

 private:
  struct Pending {
    std::vector<RankClock> work;
    std::vector<ClockRecord> records;
    int count = 0;
  };
  void place(uint64_t clock, Pending& pending);

  int ranks_;
  VirtualClock clock_;
  ArrivalBook* book_ = nullptr;
  MetricsAggregator& aggregator_;
  mutable std::mutex mu_;
  uint64_t next_ = 1;
  std::map<uint64_t, Pending> pending_;
  TraceTotals totals_;
};

}  // namespace orpheus::engine::sim
