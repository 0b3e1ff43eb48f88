// Reading a checkpoint directory back: what it holds, and a replica's log (the
// layout and failure semantics are in ckpt/layout.h).
#pragma once

#include "ckpt/job_info.h"
#include "ckpt/log_entry.h"
#include "engine/base/params.h"

#include <cstdint>
#include <string>
#include <vector>

namespace orpheus::ckpt {

// What a checkpoint directory holds.
struct SegmentInfo {
  std::string path;
  uint64_t firstClock = 0;
  uint64_t lastClock = 0;
  uint64_t bytes = 0;
  bool intact = true;   // CRC and structure verified
  std::string problem;  // why not
  std::vector<LogEntry> events;  // intact: its entries but groups (averaged, rotated, reset), without records
};
struct ReplicaInventory {
  int replica = 0;
  std::vector<SegmentInfo> segments;  // by first clock
  uint64_t lastIntactClock = 0;       // the newest clock reachable through intact segments from clock 1
  std::vector<ClockRange> lost;       // clocks whose states failures lost (reset events), in order
};
struct UnusableSnapshot {
  uint64_t clock = 0;
  std::string problem;  // names the part and its file
};
struct Inventory {
  JobInfo job;
  std::vector<ReplicaInventory> replicas;
  std::vector<uint64_t> snapshots;  // complete snapshots, by clock
  std::vector<UnusableSnapshot> damagedSnapshots;  // incomplete or damaged ones, by clock
  uint64_t totalBytes = 0;
};

// What inspect looks at; by default everything. A scoped inventory leaves out what
// the scope does not need (its lastIntactClock then says nothing).
struct InspectScope {
  int replica = -1;     // only this replica's log (-1: every replica)
  uint64_t upTo = 0;    // only what restoring a clock <= upTo can need (0: everything)
  // With upTo: only what restoring upTo itself needs when its replay starts at the
  // newest usable snapshot at or before it: that snapshot (older ones are not
  // looked at) and the segments holding later clocks.
  bool fromNewestSnapshot = false;
  const ParamSet* shapes = nullptr;  // snapshots must also match these (the model's parameters)
};
Inventory inspect(const std::string& dir, const InspectScope& scope = {});

// The log entries of `replica` for local clocks in (after, upTo], in order. Only the
// segments holding those clocks are read: what lies before `after` may be damaged or
// missing. Throws InputError when a segment on the way is damaged or missing (naming
// the file and the last clock still reachable) or when upTo lies past the log
// (naming the latest clock). A damaged or incomplete segment that is the very last
// one is ignored with a warning.
std::vector<LogEntry> readLog(const std::string& dir, int replica, uint64_t after, uint64_t upTo);

}  // namespace orpheus::ckpt
