// The clock loop's checkpoint log: the incremental SV checkpoint (paper, section
// 3.3) as the clock loop sees it, every group of batches applied to the replica and
// the events around them (averaging, rotation, failure, knobs, and the job's
// membership and chunk records). makeClockLog below makes one from plain options;
// the engine builds those from its flags in one place (engine/recovery/recovery.h).
// What it writes is read back by ckpt/replay.h and ckpt/log_reader.h.
#pragma once

#include "ckpt/log_entry.h"
#include "ckpt/segment.h"
#include "engine/base/params.h"
#include "engine/base/sv_batch.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace orpheus::ckpt {

// Calls marked collective are made by every rank after the same clock.
class ClockLog {
 public:
  virtual ~ClockLog() = default;

  // Whether the log keeps what it is handed; when not, received bytes need not be kept for it.
  virtual bool keepsRecords() const = 0;
  // The batches applied to the replica together at local clock `clock`.
  virtual void appendGroup(uint64_t clock, std::vector<Record> records) = 0;
  // The record of a batch another replica computed (`header`) and this one applied:
  // a reference into the sender's log, which holds the batch once (--ckpt-format
  // 3), or `copy` where a replay could not recompute it from there (--ckpt-format 2,
  // and --fail-prob: a failed sender loses the batches it had only staged, which
  // the receivers applied).
  virtual Record received(const SvBatchHeader& header, Record copy) const = 0;
  // The end of `clock`; every few clocks the ranks agree that every writer is
  // healthy, so a checkpoint that cannot be written (a full disk) stops the job
  // with one report (collective).
  virtual void endClock(uint64_t clock) = 0;
  // The coordinator set new knobs at the end of `clock` (--adapt): a kKnobs entry.
  virtual void knobs(uint64_t clock, std::span<const std::byte> record) = 0;
  // A record of the job itself at `clock` (kMembership or kChunks, one line of text
  // as ckpt/replay.h spells it: epochRecord, layoutRecord, movesRecord). Every rank
  // writes it into the log of the replica it holds, so any surviving replica's log
  // holds it; it is durable once the segment that holds it is (a membership
  // record's closes at the end of the next clock).
  virtual void jobRecord(uint64_t clock, EventKind kind, std::string_view line) = 0;
  // Every replica became the average at `clock`: a log event, and at every
  // --snapshot-every-th averaging a snapshot of `replica` (collective).
  virtual void averaged(uint64_t clock, const ParamSet& replica) = 0;
  // The replica leaves at `clock`: its log must be on disk up to there, since the
  // next holder continues it (collective).
  virtual void handOff(uint64_t clock) = 0;
  // Replica `id` arrived at `clock`: its log continues here.
  virtual void takeOver(uint64_t clock, int id) = 0;
  // Waits until everything is durable (collective).
  virtual void flush() = 0;
  // Continues replica `id`'s log, on disk up to `clock` (resume).
  virtual void resumeAt(int id, uint64_t clock) = 0;
  // After resumeAt: the membership changed at `clock` and the replica became the
  // average of the previous epoch's (engine/membership/elastic.h). The log marks it as an
  // averaging at `clock`, chained at that clock; `snapshot` (null: a usable one
  // exists) is written as this rank's part of the snapshot of `clock` (collective).
  virtual void rejoin(uint64_t clock, const ParamSet* snapshot) = 0;
  // The job stops: nothing more is written.
  virtual void abandon() = 0;
  // The process died: what was only staged is gone. Returns the newest clock the
  // log on disk and the snapshots reach (0: none).
  virtual uint64_t loseStaged() = 0;
  // After a failure at `clock` the replica was put back at `to`: the log says so,
  // unless what is on disk already reaches `clock`.
  virtual void recordReset(uint64_t clock, uint64_t to) = 0;
  // Seconds the compute thread has waited for the log, in all.
  virtual double waitSeconds() const = 0;
  // CPU seconds the log's IO thread has used, in all.
  virtual double writerCpuSeconds() const = 0;
};

// What a log is made from.
struct ClockLogOptions {
  bool enabled = false;  // --ckpt sv; otherwise the log does nothing
  std::string dir;       // the checkpoint directory
  int replica = 0;       // the replica the rank holds first
  int rank = 0;          // this rank and the number of ranks (snapshot parts, carried states)
  int ranks = 1;
  // The segment format (--ckpt-format); with references, received batches are
  // logged as references into their senders' logs (format 3; not where a replay
  // could not recompute them: --fail-prob, --sv-rank).
  int64_t format = kSegmentVersion;
  bool references = true;
  bool writerIdle = false;      // the IO thread under SCHED_IDLE
  int64_t snapshotEvery = 1;    // every that many averagings is a snapshot
  uint32_t selectMethod = 0;    // the selection method a reference names
  std::string modelSpec;        // named in the carried-state files
  size_t stagingBytes = size_t{256} << 20;
  int clocksPerSegment = 50;
};

// What the log needs from the job around it; each may be left empty.
struct ClockLogHooks {
  // Runs `step` on every rank at the same point and stops the whole job with one
  // report if it fails anywhere (the engine's collectively); empty: just runs it.
  std::function<void(const std::function<void()>& step)> collectively;
  // The selection C a received batch's reference names (the knobs now); empty: 0.
  std::function<int32_t()> select;
  // The state the rank's model carries from clock to clock beyond the parameters
  // (ops::Model::carriedState), written where a segment ends; empty: none.
  std::function<ParamSet()> carriedState;
};

// With options.enabled the log over SvLogWriter; otherwise one that does nothing.
std::unique_ptr<ClockLog> makeClockLog(const ClockLogOptions& options, ClockLogHooks hooks = {});

}  // namespace orpheus::ckpt
