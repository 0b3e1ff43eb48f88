// Algorithm 1's "send S to the receivers, receive T": how one clock's SV batches
// travel between workers. One interface, three ways:
//
//  - BroadcastExchange: every rank gets every batch within the clock (BSP, or SSP
//    with staleness 0, Q = P - 1, no broken links): one allgather;
//  - OverlappedExchange (engine/worker/overlap.h, --overlap on): the same broadcast, each
//    layer sent from inside the backward pass and rebuilt as it arrives;
//  - MulticastExchange: point to point to the schedule's receivers over the Inbox
//    (engine/worker/consistency.h); under BSP T is this clock's group, waited for; under
//    SSP each batch is applied as it arrives.
//
// Every way hands the worker S ∪ T in rank order, so every replica adds the same
// terms in the same order, and the records the checkpoint log keeps.
#pragma once

#include "ckpt/clock_log.h"
#include "comm/schedule.h"
#include "comm/transport.h"
#include "engine/base/sv_batch.h"
#include "engine/worker/consistency.h"
#include "engine/metrics/metrics.h"
#include "engine/sync_modes.h"
#include "engine/worker/optimizer.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

namespace orpheus::engine {

using ckpt::ClockLog;

// The batches a clock applies together, S ∪ T, in rank order, with their records
// for the checkpoint log. Views: the own batch where it lies, the others' in the
// buffers they arrived in (kept alive by the views and by `received`).
struct ClockGroup {
  std::vector<SvBatchView> batches;          // still to apply (none when the exchange applied them)
  std::vector<ckpt::Record> records;         // every batch of the clock, applied or not
  std::map<int, ReceivedBatch> received;     // T, as it arrived (point to point, BSP)
  void add(SvBatchView batch, ckpt::Record record) {
    batches.push_back(std::move(batch));
    records.push_back(std::move(record));
  }
};

class ClockExchange {
 public:
  using Clock = std::chrono::steady_clock;
  // Applies a group of batches that touch disjoint parameters from any other group of the clock.
  using ApplyFn = std::function<void(std::span<const SvBatchView* const> group)>;

  virtual ~ClockExchange() = default;

  // Whether this clock's batch leaves site by site from inside the backward pass
  // (siteReady); `selects`: the clock sends a selection, which needs every site.
  virtual bool streams(bool selects) const {
    (void)selects;
    return false;
  }
  // A new clock, whose batch carries `header` and coefficients scaled by `scale`;
  // its compute began at `start`. `local` is where the backward pass's batch will
  // be: the sends keep it alive until they complete.
  virtual void begin(uint64_t clock, const SvBatchHeader& header, float scale, Clock::time_point start,
                     std::shared_ptr<const SvBatch> local) {
    (void)clock, (void)header, (void)scale, (void)start, (void)local;
  }
  // Streaming: the local batch's matrix `site` is final.
  virtual void siteReady(size_t site, const SvMatrix& matrix) { (void)site, (void)matrix; }
  // S leaves: `sent` is the selected batch, or the local batch whole.
  virtual void send(uint64_t clock, std::shared_ptr<const SvBatch> sent, ClockStats& stats) = 0;
  // Seconds spent sending inside the compute (streaming), which are not compute.
  virtual double sendSeconds() const { return 0.0; }
  // T: waits for the batches this clock applies and returns S ∪ T with the log's
  // records. An exchange that rebuilds as batches arrive applies them through
  // `apply` and leaves none in the group. Fills the stats' communication fields.
  virtual ClockGroup receive(uint64_t clock, const std::shared_ptr<SvBatch>& local, const ApplyFn& apply,
                             ClockStats& stats, MetricsSink& metrics) = 0;
};

// Broadcast: one allgather of the batches, in the clock.
class BroadcastExchange final : public ClockExchange {
 public:
  BroadcastExchange(comm::Transport& transport, std::vector<std::pair<int64_t, int64_t>> paramShapes, ClockLog& log);
  void send(uint64_t clock, std::shared_ptr<const SvBatch> sent, ClockStats& stats) override;
  ClockGroup receive(uint64_t clock, const std::shared_ptr<SvBatch>& local, const ApplyFn& apply, ClockStats& stats,
                     MetricsSink& metrics) override;

 private:
  comm::Transport& transport_;
  std::vector<std::pair<int64_t, int64_t>> shapes_;
  ClockLog& log_;
  std::shared_ptr<const SvBatch> sent_;
};

// Multicast: S to this clock's receivers of the schedule, point to point. Also
// what arrives between clocks: under SSP a batch is applied as soon as it is in,
// alone, and logged at the local clock; under BSP it waits for its clock's group.
class MulticastExchange final : public ClockExchange {
 public:
  // All references must outlive the exchange; `replica` is the one batches are
  // applied to. `consistency`: the job's, the inbox's (SSP applies on arrival).
  MulticastExchange(Consistency consistency, const comm::MulticastSchedule& schedule, comm::Transport& transport,
                    Inbox& inbox, ReplicaUpdater& updater, ParamSet& replica, ClockLog& log);
  void send(uint64_t clock, std::shared_ptr<const SvBatch> sent, ClockStats& stats) override;
  ClockGroup receive(uint64_t clock, const std::shared_ptr<SvBatch>& local, const ApplyFn& apply, ClockStats& stats,
                     MetricsSink& metrics) override;

  // Takes in what has arrived (SSP: applies it, logged at `clock`); never blocks.
  void takeIn(uint64_t clock, MetricsSink& metrics);
  // Waits, taking in, until every batch of the clocks <= `through` is in; returns
  // the seconds waited. `at`: the clock this rank is at, for a timeout's message.
  double waitComplete(uint64_t through, uint64_t clock, uint64_t at, MetricsSink& metrics);

 private:
  void applyReady(uint64_t clock);

  Consistency consistency_;
  const comm::MulticastSchedule& schedule_;
  comm::Transport& transport_;
  Inbox& inbox_;
  ReplicaUpdater& updater_;
  ParamSet& replica_;
  ClockLog& log_;
  Clock::time_point sendStart_;
};

}  // namespace orpheus::engine
