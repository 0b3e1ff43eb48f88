// The clock loop's checkpoint log: the incremental SV checkpoint (paper, section
// 3.3) as the clock loop sees it, every group of batches applied to the replica and
// the events around them (averaging, rotation, failure, knobs). The engine makes
// one for its flags (engine/recovery/recovery.h, makeClockLog); what it writes is
// read back by ckpt/replay.h and ckpt/log_reader.h.
#pragma once

#include "ckpt/log_entry.h"
#include "engine/base/params.h"
#include "engine/base/sv_batch.h"

#include <cstddef>
#include <cstdint>
#include <span>
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

}  // namespace orpheus::ckpt
