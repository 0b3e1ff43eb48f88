// What a checkpoint directory can restore: decided here once, from an Inventory
// (ckpt/log_reader.h), for `orpheus restore`, `orpheus inspect` and --resume alike.
//
// A replica's state at its local clock T is rebuilt by a replay: it starts at the
// newest usable snapshot at or before T (every part present, readable, CRC- and
// shape-checked), or at W0 when there is none, and applies the log from there to T.
// So T is restorable when, from that start,
//   - every clock after the start up to T is held by an intact segment, in a chain
//     (a deleted segment and a damaged one are the same: a gap in the chain; the
//     segments before the start are not needed, so a later snapshot bridges a gap);
//   - the replay crosses no averaging (a replay cannot average: it needs the
//     averaging's snapshot, which would have been the start, so it is unusable);
//   - it crosses no reset to a snapshot that is unusable, or to an earlier clock
//     that is not restorable itself;
//   - T is not a clock a failure lost (between a reset's log end and the reset);
//   - every batch the replay applies by reference (ckpt/log_entry.h, BatchRef) can
//     be read from the log of the replica that computed it (the segment holding
//     that clock is intact and holds it). A damaged sender log stops the replay at
//     the first clock that needs it. Told only from a complete inventory; a scoped
//     one leaves it to the replay.
// A snapshot's own clock is restorable from the snapshot alone.
#pragma once

#include "ckpt/log_reader.h"

#include <cstdint>
#include <string>
#include <vector>

namespace orpheus::ckpt {

// Clocks first..last, each replayed from `from` (0: W0, else a snapshot's clock).
struct RestorableRange {
  uint64_t first = 0;
  uint64_t last = 0;
  uint64_t from = 0;
};

// Where the replay from `from` stops: clock `at` and every later one before the
// next start cannot be reached from it, because of `why` (which names the segment
// file or snapshot part).
struct ReplayStop {
  uint64_t from = 0;
  uint64_t at = 0;
  std::string why;
};

// Clocks first..last a failure lost: at clock `failedAt` the replica went back to
// clock `resetTo`, and its log had reached only first - 1.
struct LostClocks {
  uint64_t first = 0;
  uint64_t last = 0;
  uint64_t failedAt = 0;
  uint64_t resetTo = 0;
};

struct ReplicaRestorability {
  int replica = 0;
  std::vector<RestorableRange> pieces;  // by clock, disjoint
  std::vector<ReplayStop> stops;        // by start
  std::vector<LostClocks> lost;         // by clock
  std::vector<ClockRange> missing;      // clocks no segment file holds, before the last one
  std::vector<uint64_t> starts;         // 0 and the usable snapshots
  std::vector<UnusableSnapshot> unusableSnapshots;  // by clock

  bool covers(uint64_t clock) const;
  // The newest restorable clock (0: none).
  uint64_t latest() const;
  // Where the replay of a restorable `clock` starts (0: W0).
  uint64_t startFor(uint64_t clock) const;
  // The restorable clocks as maximal ranges.
  std::vector<ClockRange> ranges() const;
  // "1..40, 60..100 (via snapshot 60)": the ranges, each one after a gap with the
  // snapshot that reaches it; "none" when nothing is restorable.
  std::string describe() const;
  // Why `clock` is not restorable, naming the damaged or missing segment, the
  // unusable snapshot part or the failure; "" when it is.
  std::string whyNot(uint64_t clock) const;
  // Only the clocks from `first` on: a replica a grow added at `first` had none
  // before (a snapshot before it is the other replicas' state).
  void startAt(uint64_t first);
};

struct Restorability {
  std::vector<ReplicaRestorability> replicas;  // as in the inventory
  std::vector<uint64_t> snapshots;             // usable ones

  const ReplicaRestorability* replica(int id) const;
};

Restorability findRestorable(const Inventory& inventory);
// The same for one replica, which may have no log at all (then only the snapshots'
// clocks are restorable).
ReplicaRestorability findRestorable(const Inventory& inventory, int replica);

}  // namespace orpheus::ckpt
