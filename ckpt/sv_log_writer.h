// The writer of a replica's log (the layout and failure semantics are in
// ckpt/layout.h, the segment format in ckpt/segment.h).
#pragma once

#include "ckpt/log_entry.h"
#include "ckpt/segment.h"

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace orpheus::ckpt {

// How the IO thread runs.
struct WriterOptions {
  // The segment format version written: kSegmentVersion, or kSegmentVersionCopies
  // (then no group may hold a batch reference).
  int64_t version = kSegmentVersion;
  // Run the IO thread under SCHED_IDLE: it then only takes CPU time no other thread
  // of the machine wants, for machines whose cores the ranks fill. It may lag behind
  // then, holding more staged memory (up to the staging limit, then the compute
  // thread waits, measured as ever).
  bool idle = false;
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
  SvLogWriter(std::string dir, int replica, size_t stagingBytes = size_t{256} << 20, int clocksPerSegment = 50,
              WriterOptions options = {});
  // Writes what is staged and joins the IO thread; never throws.
  ~SvLogWriter();
  SvLogWriter(const SvLogWriter&) = delete;
  SvLogWriter& operator=(const SvLogWriter&) = delete;

  // Stages the batches applied together at local clock `clock`.
  void appendGroup(uint64_t clock, std::vector<Record> records);
  void appendGroup(uint64_t clock, std::vector<SharedBytes> records);
  void appendEvent(uint64_t clock, EventKind kind);
  // The knobs set at `clock` (a kKnobs entry; `record` is kKnobsRecordBytes).
  void appendKnobs(uint64_t clock, std::span<const std::byte> record);
  // A membership or chunk record of the job at `clock` (kMembership or kChunks:
  // one line of text, ckpt/log_entry.h).
  void appendJobRecord(uint64_t clock, EventKind kind, std::string_view line);
  // Marks the end of `clock`: segments close on clock boundaries only.
  void endClock(uint64_t clock);
  // After endClock: the open segment closes as a due one does (when the next clock
  // begins, or at flush), so what it holds is durable soon.
  void closeSoon() { closeDue_ = true; }
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
  // Whether the open segment ends at the clock endClock was last given (it closes
  // when a later clock begins, or at flush()).
  bool segmentEndsAtLastClock() const { return closeDue_; }
  double waitSeconds() const { return waitSeconds_; }
  uint64_t bytesWritten() const;
  // CPU time the IO thread has used, in all (its thread CPU clock; read after each
  // command it finishes, so it trails a command in progress).
  double cpuSeconds() const;

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
  WriterOptions options_;
  bool stop_ = false;
  bool abandoned_ = false;
  bool idle_ = true;
  std::exception_ptr error_;
  uint64_t bytesWritten_ = 0;
  double cpuSeconds_ = 0.0;
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

}  // namespace orpheus::ckpt
