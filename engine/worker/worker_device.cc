// The worker's traffic with its device: what the SVs moved each clock
// (engine/worker/sv_transfer.h), and the data queue that copies the next
// minibatch to the device while the current clock computes.
#include "engine/worker/worker.h"

namespace orpheus::engine {

void Worker::noteTransfer(const TransferMark& before, ClockAround& around) const {
  if (updater_.backend().device() == ops::Device::kCpu || config_.sync != SyncMode::kSv) return;
  const TransferMark now = transferMark();
  around.transfer = updater_.resident() && transfer_.mode() == TransferMode::kStaged ? TransferKind::kStaged
                                                                                      : TransferKind::kSync;
  around.toHostBytes = now.transfer.toHostBytes - before.transfer.toHostBytes;
  around.toDeviceBytes = now.rebuildToDevice - before.rebuildToDevice;
  around.transferSeconds = now.transfer.copySeconds - before.transfer.copySeconds;
  around.transferHiddenSeconds = now.transfer.hiddenSeconds - before.transfer.hiddenSeconds;
}

// The queue fetches a minibatch one clock early: the feed hands out the same
// batches in the same order as long as nothing between two clocks changes what it
// holds, which --balance (chunk moves) does; there, and on the last clock, it stays
// off. A change of membership (a new shard) ends this worker, and with it the batch
// fetched ahead and the model's queue (releaseDevice); the next epoch's worker
// starts its feed where the job left the sampler (DataFeed::start), so the batch
// taken early never counts.
bool Worker::queuesData(uint64_t clock) const {
  return updater_.resident() && config_.transfer == TransferMode::kStaged && !feed_.options().balance &&
         clock < static_cast<uint64_t>(config_.clocks);
}

std::unique_ptr<data::Batch> Worker::takeBatch(uint64_t clock) {
  std::unique_ptr<data::Batch> batch = std::move(aheadBatch_);
  if (batch == nullptr) batch = std::make_unique<data::Batch>(feed_.next());
  if (queuesData(clock)) {
    aheadBatch_ = std::make_unique<data::Batch>(feed_.next());
    model_.prefetchOnDevice(view(*aheadBatch_), updater_.backend());
  }
  return batch;
}

}  // namespace orpheus::engine
