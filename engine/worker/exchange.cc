#include "engine/worker/exchange.h"

#include <utility>

namespace orpheus::engine {
namespace {

double secondsSince(ClockExchange::Clock::time_point t) {
  return std::chrono::duration<double>(ClockExchange::Clock::now() - t).count();
}

}  // namespace

BroadcastExchange::BroadcastExchange(comm::Transport& transport, std::vector<std::pair<int64_t, int64_t>> paramShapes,
                                     ClockLog& log)
    : transport_(transport), shapes_(std::move(paramShapes)), log_(log) {}

// The allgather sends and receives in one call: receive() makes it.
void BroadcastExchange::send(uint64_t clock, std::shared_ptr<const SvBatch> sent, ClockStats& stats) {
  (void)clock, (void)stats;
  sent_ = std::move(sent);
}

// Every replica applies every batch, in rank order, so all add the same terms in the same order.
ClockGroup BroadcastExchange::receive(uint64_t clock, const std::shared_ptr<SvBatch>& local, const ApplyFn& apply,
                                      ClockStats& stats, MetricsSink& metrics) {
  (void)apply, (void)metrics;
  const auto t = Clock::now();
  // Sent from where the batch lies: the record's header and the batch's arrays.
  const std::shared_ptr<const SvBatch> sent = std::exchange(sent_, nullptr);
  ClockGroup group;
  if (transport_.size() == 1) {  // no one to send to: the own batch, neither encoded nor read
    group.add(viewOf(local), ckpt::Record::of(local));
    return group;
  }
  SvBatchPieces record = encodePieces(*sent, /*scanValues=*/true);
  record.seal();
  const auto all =
      std::make_shared<const comm::Gathered>(transport_.allgatherv(comm::Pieces{record.pieces, nullptr}, clock));
  SvBatchExpectation expect;
  expect.clock = static_cast<int64_t>(clock);
  expect.paramShapes = shapes_;
  // The own batch as it is, the others' as they arrived (decoded, so checked, and
  // read where they are in the gathered buffer).
  for (int r = 0; r < transport_.size(); ++r) {
    if (r == transport_.rank()) {
      group.add(viewOf(local), ckpt::Record::of(local));
      continue;
    }
    expect.sender = r;
    const std::span<const std::byte> part = all->part(static_cast<size_t>(r));
    SvBatchView batch = decodeView(all, part, expect);
    const SvBatchHeader header = batch.header;
    group.add(std::move(batch), log_.received(header, ckpt::Record::part(all, part, true)));
  }
  // Waiting for the slowest rank is wait, as it is on the point-to-point path.
  stats.waitSeconds += all->waitSeconds;
  stats.commSeconds = secondsSince(t) - all->waitSeconds;
  stats.exchangeSeconds = stats.commSeconds;
  return group;
}

MulticastExchange::MulticastExchange(Consistency consistency, const comm::MulticastSchedule& schedule,
                                     comm::Transport& transport, Inbox& inbox, ReplicaUpdater& updater,
                                     ParamSet& replica, ClockLog& log)
    : consistency_(consistency),
      schedule_(schedule),
      transport_(transport),
      inbox_(inbox),
      updater_(updater),
      replica_(replica),
      log_(log) {}

// Sent from where the batch lies (the local batch, or the selected one), which
// the sends keep alive until they complete.
void MulticastExchange::send(uint64_t clock, std::shared_ptr<const SvBatch> sent, ClockStats& stats) {
  (void)stats;
  sendStart_ = Clock::now();
  const std::vector<int> receivers = schedule_.receivers(clock, transport_.rank());
  if (receivers.empty()) return;  // the batch is neither encoded nor read
  auto record = std::make_shared<SvBatchPieces>(encodePieces(*sent, /*scanValues=*/true));
  record->seal();
  struct Owner {
    std::shared_ptr<const SvBatchPieces> record;
    std::shared_ptr<const SvBatch> batch;
  };
  auto pieces = std::make_shared<comm::Pieces>();
  pieces->pieces = record->pieces;
  pieces->owner = std::make_shared<const Owner>(Owner{std::move(record), std::move(sent)});
  for (int peer : receivers) {
    transport_.sendAsync(peer, comm::SharedPieces(pieces));
  }
}

// Under SSP T is applied as it arrives, so the group is the own batch; under BSP
// it is every batch of this clock, waited for, in rank order.
ClockGroup MulticastExchange::receive(uint64_t clock, const std::shared_ptr<SvBatch>& local, const ApplyFn& apply,
                                      ClockStats& stats, MetricsSink& metrics) {
  (void)apply;
  takeIn(clock, metrics);
  stats.commSeconds = secondsSince(sendStart_);
  stats.exchangeSeconds = stats.commSeconds;
  // The log keeps the whole batch the replica applies (encoded by the log's IO thread).
  ckpt::Record own = ckpt::Record::of(local);
  ClockGroup group;
  if (consistency_ == Consistency::kSsp) {
    group.add(viewOf(local), std::move(own));
    return group;
  }
  stats.waitSeconds += waitComplete(clock, clock, clock, metrics);
  group.received = inbox_.takeClock(clock);
  bool ownAdded = false;
  for (auto& [sender, r] : group.received) {
    if (!ownAdded && sender > transport_.rank()) {
      group.add(viewOf(local), own);
      ownAdded = true;
    }
    group.add(r.batch, log_.received(r.batch.header, r.record()));
  }
  if (!ownAdded) group.add(viewOf(local), std::move(own));
  return group;
}

void MulticastExchange::takeIn(uint64_t clock, MetricsSink& metrics) {
  inbox_.receive(metrics);
  applyReady(clock);
}

double MulticastExchange::waitComplete(uint64_t through, uint64_t clock, uint64_t at, MetricsSink& metrics) {
  const double waited = inbox_.waitComplete(through, at, metrics);
  applyReady(clock);
  return waited;
}

// SSP: each batch that arrived, applied alone in arrival order and logged at the
// local clock `clock`.
void MulticastExchange::applyReady(uint64_t clock) {
  for (ReceivedBatch& r : inbox_.takeReady()) {
    const SvBatchView* one[] = {&r.batch};
    updater_.applyGroup(clock, one, replica_);
    log_.appendGroup(clock, {log_.received(r.batch.header, r.record())});
  }
}

}  // namespace orpheus::engine
