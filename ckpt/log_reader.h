// Reading a checkpoint directory back: what it holds, and a replica's log (the
// layout and failure semantics are in ckpt/layout.h).
#pragma once

#include "ckpt/job_info.h"
#include "ckpt/layout.h"
#include "ckpt/log_entry.h"
#include "engine/base/error.h"
#include "engine/base/params.h"

#include <cstdint>
#include <map>
#include <span>
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
  std::vector<LogEntry> events;  // intact: its entries but groups (averaged, rotated, reset, knobs), without records but a knobs entry's
  std::vector<BatchUse> uses;    // intact: the batch references of its groups, in order
  std::vector<uint64_t> ownBatches;  // intact: the clocks of the replica's own batches it holds
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
  // Every replica's whole log was looked at: whether a referenced batch is there
  // can be told (ckpt/restorable.h); a scoped inventory leaves that to the replay.
  bool complete = false;

  // Why the batch replica `replica` computed at clock `clock` cannot be read from its
  // log ("" when it can): a segment holding that clock is damaged, or no intact one
  // holds the batch. Meaningful only when `complete`.
  std::string batchTrouble(uint32_t replica, uint64_t clock) const;
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

// A batch a replica's replay needs from another replica's log cannot be read.
class BatchUnavailable : public InputError {
 public:
  using InputError::InputError;
};

// The whole local batches replicas logged, read from their logs on demand (what the
// batch references of ckpt/log_entry.h point to). Keeps the segments it read last of
// each replica, so a replay that moves forward in clocks reads each segment once.
// Not thread-safe.
class BatchStore {
 public:
  explicit BatchStore(std::string dir) : dir_(std::move(dir)) {}
  // The record of the batch replica `replica` computed at clock `clock`, valid until
  // the next call. Throws BatchUnavailable naming the segment file and the clock when
  // a segment holding that clock is damaged, or when no segment holds the batch (the
  // same rule as Inventory::batchTrouble).
  std::span<const std::byte> batch(uint32_t replica, uint64_t clock);

 private:
  struct Loaded {
    bool listed = false;
    std::vector<SegmentFile> files;
    uint64_t first = 1;
    uint64_t last = 0;  // the clocks the loaded segments hold (none: last < first)
    std::map<uint64_t, std::vector<std::byte>> batches;
  };
  std::string dir_;
  std::map<uint32_t, Loaded> loaded_;
};

}  // namespace orpheus::ckpt
