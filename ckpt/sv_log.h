// The incremental SV checkpoint (paper section 3.3): every SV batch applied to a
// replica is logged, so the replica can be rebuilt at any past clock by replaying
// the log from the last snapshot (or from W0, which the job seed determines).
//
// Layout of a checkpoint directory:
//   DIR/job.h5                     what the job was (model, seed, data shape, flags)
//   DIR/replica-<id>/seg-<first>-<last>.h5
//                                  the batches applied to replica <id> during its
//                                  local clocks first..last (inclusive), in order
//   DIR/snapshot-<clock>/part-<r>.h5
//                                  row block r of every parameter of the averaged
//                                  model after the averaging barrier of <clock>
// Logs follow replicas, not ranks: after a rotation the new holder of replica <id>
// continues its directory.
//
// A segment holds, in apply order, "groups": the batches applied together in one
// compute_update at a local clock (their encoded SV batch records, unchanged), and
// events (averaged, rotated in/out). Every segment is written under a temporary
// name, flushed (fsync) and renamed, and carries a CRC32C of its contents, so a
// crash leaves only whole segments; a segment that fails its CRC is damage.
#pragma once

#include "engine/base/params.h"

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace orpheus::ckpt {

using SharedBytes = std::shared_ptr<const std::vector<std::byte>>;

// What a job was, so a log can be replayed by a later process.
struct JobInfo {
  std::string modelName;   // "mlr" or the .loss path as given
  std::string modelText;   // the .loss file's text ("" for built-ins)
  std::string modelSpec;
  int64_t features = 0;
  int64_t classes = 0;
  uint64_t seed = 0;
  int ranks = 0;
  int64_t batch = 0;
  double lr = 0.0;
  std::string flags;       // the training command line, for humans
};

// Writes DIR/job.h5 atomically; reading it back gives the same JobInfo.
void writeJobInfo(const std::string& dir, const JobInfo& info);
JobInfo readJobInfo(const std::string& dir);

enum class EventKind : uint32_t { kGroup = 0, kAveraged = 1, kRotatedOut = 2, kRotatedIn = 3 };

// One entry of a replica's log, as read back.
struct LogEntry {
  uint64_t clock = 0;               // the replica's local clock when it happened
  EventKind kind = EventKind::kGroup;
  std::vector<std::vector<std::byte>> records;  // kGroup: encoded SV batches applied together
};

// Writes one replica's log through an IO thread. The compute thread hands over the
// already-encoded records (shared, not copied) and never waits for the disk unless
// the staging area is full; that wait is measured. Not thread-safe: one caller.
class SvLogWriter {
 public:
  // `stagingBytes`: how much may wait for the disk; `clocksPerSegment`: a segment is
  // closed (written and renamed) every that many clocks, and by flush().
  SvLogWriter(std::string dir, int replica, size_t stagingBytes = size_t{256} << 20, int clocksPerSegment = 50);
  // Writes what is staged and joins the IO thread; never throws.
  ~SvLogWriter();
  SvLogWriter(const SvLogWriter&) = delete;
  SvLogWriter& operator=(const SvLogWriter&) = delete;

  // Stages the batches applied together at local clock `clock`.
  void appendGroup(uint64_t clock, std::vector<SharedBytes> records);
  void appendEvent(uint64_t clock, EventKind kind);
  // Marks the end of `clock`: segments close on clock boundaries only.
  void endClock(uint64_t clock);
  // Closes the current segment and continues in replica `id`'s directory (rotation).
  void switchReplica(int id);
  // Waits until everything staged is durable. Throws IoError if the IO thread failed
  // (unwritable directory, full disk: the message names the file and the OS error).
  void flush();
  // Rethrows an IO failure of the thread, if any (cheap; call once per clock).
  void check();

  int replica() const;
  double waitSeconds() const { return waitSeconds_; }
  uint64_t bytesWritten() const;

 private:
  // One staged entry; the records are the caller's buffers, shared, not copied.
  struct Entry {
    uint64_t clock = 0;
    EventKind kind = EventKind::kGroup;
    std::vector<SharedBytes> records;
  };
  // One segment: everything staged between two closes, written by one file write.
  struct Item {
    int replica = 0;
    uint64_t firstClock = 0;
    uint64_t lastClock = 0;
    std::vector<Entry> entries;
    size_t bytes = 0;  // record bytes, as counted in staged_
  };
  void stage(Entry entry, size_t bytes);
  void startSegment(uint64_t clock);
  // Hands the open segment to the IO thread (a no-op when nothing is open).
  void closeSegment();
  // Closes a segment due at the last ended clock once a later clock begins.
  void closeIfDue(uint64_t clock);
  void waitForRoom(size_t bytes);
  void run();

  std::string dir_;
  int clocksPerSegment_;
  size_t stagingLimit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;  // closed segments, oldest first
  size_t staged_ = 0;       // record bytes of the open segment and the queue
  int replica_;
  bool stop_ = false;
  bool idle_ = true;
  std::exception_ptr error_;
  uint64_t bytesWritten_ = 0;
  double waitSeconds_ = 0.0;
  // Compute-thread state of the open segment.
  Item open_;
  bool openStarted_ = false;
  uint64_t lastClosed_ = 0;   // last clock of this writer's previous segment of replica_ (0: none)
  uint64_t lastEnded_ = 0;    // newest clock passed to endClock for replica_ (0: none)
  uint64_t lastEntry_ = 0;    // clock of the newest entry staged for replica_
  bool closeDue_ = false;     // the open segment ends at lastEnded_
  std::optional<uint64_t> handOver_;  // the clock at which replica_ arrived here by switchReplica
  std::thread thread_;
};

// A snapshot: the averaged parameters after the averaging barrier of `clock`, written
// by every rank in parallel as its row block (rows [r*R/P, (r+1)*R/P) of every
// parameter) from a copy. Atomic per part (temporary name, fsync, rename).
void writeSnapshotPart(const std::string& dir, uint64_t clock, int rank, int ranks, const ParamSet& params);
// Reassembles a snapshot; nullopt when a part is missing or damaged.
std::optional<ParamSet> readSnapshot(const std::string& dir, uint64_t clock, const ParamSet& shapes);

// What a checkpoint directory holds.
struct SegmentInfo {
  std::string path;
  uint64_t firstClock = 0;
  uint64_t lastClock = 0;
  uint64_t bytes = 0;
  bool intact = true;   // CRC and structure verified
  std::string problem;  // why not
};
struct ReplicaInventory {
  int replica = 0;
  std::vector<SegmentInfo> segments;  // by first clock
  uint64_t lastIntactClock = 0;       // the newest clock reachable through intact segments from clock 1
};
struct Inventory {
  JobInfo job;
  std::vector<ReplicaInventory> replicas;
  std::vector<uint64_t> snapshots;  // complete snapshots, by clock
  uint64_t totalBytes = 0;
};
Inventory inspect(const std::string& dir);

// The log entries of `replica` for local clocks in (after, upTo], in order. Throws
// InputError when a segment on the way is damaged (naming the file and the last
// clock still reachable) or when upTo lies past the log (naming the latest clock).
// A damaged or incomplete segment that is the very last one is ignored with a warning.
std::vector<LogEntry> readLog(const std::string& dir, int replica, uint64_t after, uint64_t upTo);

}  // namespace orpheus::ckpt
