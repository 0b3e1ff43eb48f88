// BSP and SSP when SV batches travel point to point (multicast, SSP, link
// failures): which batches addressed to this rank have arrived, and the waits the
// consistency model imposes (paper, section 3.2.3).
//
// Every rank can compute who sends to it at each clock (comm/schedule.h), so the
// inbox knows exactly which batches it still waits for and names the missing
// senders when a wait times out. A batch from a sender the schedule does not name,
// or one that comes twice, is a CorruptRecordError.
//
// BSP keeps each batch until its clock's group is complete; SSP hands batches on
// as they arrive (takeReady), to be applied at once. Not thread-safe: the compute
// thread owns it.
#pragma once

#include "ckpt/sv_log.h"
#include "comm/schedule.h"
#include "comm/stall.h"
#include "comm/transport.h"
#include "engine/base/sv_batch.h"
#include "engine/metrics/metrics.h"
#include "engine/sync_modes.h"

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace orpheus::engine {

// A batch from a peer: decoded (so checked) as views into the bytes it came in,
// which the view keeps; `bytes` are those bytes too when the checkpoint log keeps
// them (null otherwise).
struct ReceivedBatch {
  SvBatchView batch;
  ckpt::SharedBytes bytes;
  // The bytes as a record for the checkpoint log; an empty record when not kept.
  ckpt::Record record() const { return bytes ? ckpt::Record::encoded(bytes, true) : ckpt::Record{}; }
};

// What the inbox reads of the job (engine/worker/part_options.h makes it from the flags).
struct ConsistencyOptions {
  int64_t clocks = 1000;  // the job's last clock: no batch of a later one is expected
  Consistency consistency = Consistency::kBsp;
  double timeoutSeconds = 300.0;  // --timeout: how long a wait lasts before it names the missing senders
};

class Inbox {
 public:
  // All references must outlive the inbox. `keepBytes`: keep each batch's bytes for the log.
  Inbox(const ConsistencyOptions& options, const comm::MulticastSchedule& schedule, comm::Transport& transport,
        std::vector<std::pair<int64_t, int64_t>> paramShapes, bool keepBytes);

  // Takes in every batch that has arrived, then lets `metrics` collect; never blocks.
  void receive(MetricsSink& metrics);
  // Blocks (receiving) until every batch of clocks <= `clock` addressed here has
  // arrived; returns the seconds it waited. After --timeout (of running time,
  // comm::Deadline) a comm::StallError names the missing senders and, when they
  // are not the ones that stalled, the ranks that did (comm/stall.h); `at` is the
  // clock this rank is at, for that message.
  double waitComplete(uint64_t clock, uint64_t at, MetricsSink& metrics);

  // The clocks whose every expected batch has arrived.
  uint64_t completeThrough() const { return completeThrough_; }
  // BSP: the batches of `clock`, by sender, taken out of the inbox.
  std::map<int, ReceivedBatch> takeClock(uint64_t clock);
  // SSP: the batches that arrived since the last call, in arrival order.
  std::vector<ReceivedBatch> takeReady();
  // Resume: the clocks up to `clock` are done. Also after the schedule changed.
  void resumeAt(uint64_t clock) {
    completeThrough_ = clock;
    expected_ = {0, 0};
  }

 private:
  void accept(comm::Message message);
  void advanceComplete();
  // How many senders address this rank at `clock`: schedule_.senders() costs O(P)
  // receivers() calls, so it is taken once per clock, not once per arrival.
  size_t expectedAt(uint64_t clock);
  std::vector<int> missingSenders(uint64_t clock) const;
  comm::StallError timedOut(uint64_t at) const;

  ConsistencyOptions options_;
  const comm::MulticastSchedule& schedule_;
  comm::Transport& transport_;
  std::vector<std::pair<int64_t, int64_t>> shapes_;
  bool keepBytes_;
  std::map<uint64_t, std::map<int, ReceivedBatch>> pending_;  // BSP: by clock, then sender
  std::vector<ReceivedBatch> ready_;                          // SSP: to apply now
  std::map<uint64_t, std::set<int>> arrived_;                 // senders heard from, by clock
  uint64_t completeThrough_ = 0;
  std::pair<uint64_t, size_t> expected_{0, 0};  // (clock, senders); clock 0: none yet
};

}  // namespace orpheus::engine
