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
// events (averaged, rotated in/out, reset). Every segment is written under a
// temporary name, flushed (fsync) and renamed, and carries a CRC32C of its contents,
// so a crash leaves only whole segments; a segment that fails its CRC is damage.
//
// A failure loses what the log had only staged in memory. The holder then restores
// the replica from what is durable (the end of its log on disk, or a later snapshot)
// and logs a "reset" event: at clock T the replica went back to its state at clock
// R (E <= R <= T, R > E only for a snapshot). The log continues right after its
// durable end E (the next segment starts at E + 1, its first entry being the
// reset), so the clocks E+1..T-1 have no entries: their states are lost, and
// reading the log up to one of them is an error that says so.
#pragma once

#include "engine/base/params.h"
#include "engine/base/sv_batch.h"

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace orpheus::ckpt {

using SharedBytes = std::shared_ptr<const std::vector<std::byte>>;

// One record of a group as the writer takes it; nothing is copied. Either bytes
// already encoded (a batch as it travelled, kept alive by `owner`), or an SV batch
// the IO thread encodes straight into the segment (the worker's own batch: the
// compute thread does no encoding for the log).
struct Record {
  std::shared_ptr<const void> owner;
  std::span<const std::byte> bytes;
  std::shared_ptr<const SvBatch> batch;
  // `bytes` are an SV batch record whose header CRC is known to be right (it was
  // decoded or encoded here), so the segment's CRC needs no pass over them.
  bool checkedCrc = false;

  static Record encoded(SharedBytes bytes, bool checkedCrc = false);
  static Record part(std::shared_ptr<const void> owner, std::span<const std::byte> bytes, bool checkedCrc);
  static Record of(std::shared_ptr<const SvBatch> batch);
  size_t size() const { return batch ? encodedSize(*batch) : bytes.size(); }
};

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

enum class EventKind : uint32_t { kGroup = 0, kAveraged = 1, kRotatedOut = 2, kRotatedIn = 3, kReset = 4 };

// One entry of a replica's log, as read back.
struct LogEntry {
  uint64_t clock = 0;               // the replica's local clock when it happened
  EventKind kind = EventKind::kGroup;
  std::vector<std::vector<std::byte>> records;  // kGroup: encoded SV batches applied together
  // kReset: the replica became its state at clock resetTo; the log before this entry
  // ends at clock logEnd (logEnd <= resetTo <= clock, logEnd < clock). resetTo past
  // logEnd is a snapshot.
  uint64_t resetTo = 0;
  uint64_t logEnd = 0;
};

// Writes one replica's log through an IO thread. The compute thread only hands
// over the records (shared, never copied or encoded there) and never waits for the
// disk unless the staging area is full; that wait is measured. The IO thread copies
// each group into the segment being built as soon as it is staged (encoding the
// worker's own batch there, checksumming while the bytes are in cache) and releases
// it, then writes a closed segment from that one aligned buffer, bypassing the page
// cache where the file system allows. Not thread-safe: one caller.
class SvLogWriter {
 public:
  // `stagingBytes`: how much may wait for the disk; `clocksPerSegment`: a segment is
  // closed (written and renamed) every that many clocks, once it holds 64 MiB or half
  // the staging area, and by flush().
  SvLogWriter(std::string dir, int replica, size_t stagingBytes = size_t{256} << 20, int clocksPerSegment = 50);
  // Writes what is staged and joins the IO thread; never throws.
  ~SvLogWriter();
  SvLogWriter(const SvLogWriter&) = delete;
  SvLogWriter& operator=(const SvLogWriter&) = delete;

  // Stages the batches applied together at local clock `clock`.
  void appendGroup(uint64_t clock, std::vector<Record> records);
  void appendGroup(uint64_t clock, std::vector<SharedBytes> records);
  void appendEvent(uint64_t clock, EventKind kind);
  // Marks the end of `clock`: segments close on clock boundaries only.
  void endClock(uint64_t clock);
  // Closes the current segment and continues in replica `id`'s directory (rotation).
  // The previous holder's log of `id` must reach the hand-over clock on disk.
  void switchReplica(int id);
  // Continues replica `id`'s log, which is on disk up to `clock` (resume).
  void resumeAt(int id, uint64_t clock);
  // A failure: forgets what is staged for the current replica and not yet on disk
  // (the open segment and closed ones still queued), waits for a write in progress
  // to end, and returns the newest clock of the current replica's log on disk (0:
  // none). The log continues right after that clock. Staged segments of replicas
  // handed over earlier are still written. An IO failure stays for check().
  uint64_t discardStaged();
  // Logs that at `clock` the replica was reset to its state at clock `resetTo`
  // (after discardStaged returned a clock before `clock`; resetTo is that clock or a
  // later snapshot's, at most `clock`).
  void appendReset(uint64_t clock, uint64_t resetTo);
  // Waits until everything staged is durable. Throws IoError if the IO thread failed
  // (unwritable directory, full disk: the message names the file and the OS error).
  void flush();
  // Rethrows an IO failure of the thread, if any (cheap). After a failure nothing
  // more is written and appending never waits; the failure stays until reported.
  void check();
  // The job stops: drops everything staged, waits for a write in progress, and
  // writes nothing more (the destructor neither writes nor reports).
  void abandon();

  int replica() const;
  double waitSeconds() const { return waitSeconds_; }
  uint64_t bytesWritten() const;

 private:
  // One staged entry; the records are the caller's buffers, shared, not copied.
  struct Entry {
    uint64_t clock = 0;
    EventKind kind = EventKind::kGroup;
    std::vector<Record> records;
  };
  // What the compute thread hands the IO thread, in order: entries, which it copies
  // into the segment being built at once (the batches are released right away, while
  // still in cache), the close of a segment, which it then writes, or the drop of
  // the segment being built (never to be written).
  struct Command {
    enum class Type { kEntry, kClose, kDrop } type = Type::kEntry;
    int replica = 0;
    Entry entry;     // kEntry
    size_t bytes = 0;  // kEntry: record bytes, as counted in staged_
    uint64_t firstClock = 0;  // kClose: the segment's clocks
    uint64_t lastClock = 0;
  };
  struct Segment;  // a segment as the IO thread builds it: its records in one aligned buffer
  void stage(Entry entry, size_t bytes);
  void stageEvent(uint64_t clock, EventKind kind, std::vector<Record> records);
  void push(Command command);
  void startSegment(uint64_t clock);
  // Hands the open segment to the IO thread (a no-op when nothing is open).
  void closeSegment();
  // Closes a segment due at the last ended clock once a later clock begins.
  void closeIfDue(uint64_t clock);
  void waitForRoom(size_t bytes);
  // IO thread: the loop, one command, and the entries that can be taken in while a
  // segment is being written.
  void run();
  void consume(Command& command, bool skip);
  void takeEntries();

  std::string dir_;
  int clocksPerSegment_;
  size_t stagingLimit_;
  size_t segmentBytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> pending_;  // not yet taken by the IO thread
  size_t staged_ = 0;       // record bytes staged and not yet written (or dropped)
  int replica_;
  bool stop_ = false;
  bool abandoned_ = false;
  bool idle_ = true;
  std::exception_ptr error_;
  uint64_t bytesWritten_ = 0;
  double waitSeconds_ = 0.0;
  uint64_t durable_ = 0;    // newest clock of replica_'s log known to be on disk (0: none)
  // IO-thread state: the segment being built, and the one being written.
  std::unique_ptr<Segment> building_;
  std::unique_ptr<Segment> writing_;
  // Compute-thread state of the open segment.
  bool openStarted_ = false;
  uint64_t openFirst_ = 0;
  uint64_t openLast_ = 0;
  size_t openBytes_ = 0;    // record bytes staged in the open segment
  // Where the log of replica_ ends before the open segment: the next segment starts
  // right after it (none: at the first clock it sees).
  std::optional<uint64_t> chainEnd_;
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
// The clocks of the snapshot directories in `dir`, ascending, unverified (cheap).
std::vector<uint64_t> snapshotClocks(const std::string& dir);
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
struct ClockRange {
  uint64_t first = 0;
  uint64_t last = 0;  // inclusive
};
struct ReplicaInventory {
  int replica = 0;
  std::vector<SegmentInfo> segments;  // by first clock
  uint64_t lastIntactClock = 0;       // the newest clock reachable through intact segments from clock 1
  std::vector<ClockRange> lost;       // clocks whose states failures lost (reset events), in order
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
