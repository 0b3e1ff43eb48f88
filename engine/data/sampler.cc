#include "engine/data/sampler.h"

#include "engine/base/error.h"
#include "engine/base/rng.h"

#include <algorithm>
#include <numeric>

namespace orpheus::data {

MinibatchSampler::MinibatchSampler(int64_t shardSize, int64_t batch, uint64_t seed, int rank, Order order,
                                   uint64_t stream)
    : shardSize_(shardSize),
      batch_(batch),
      seed_(seed),
      rank_(rank),
      inOrder_(order == Order::kInOrder),
      stream_(stream) {
  ORPHEUS_CHECK_INPUT(shardSize > 0, "cannot sample minibatches from an empty shard");
  ORPHEUS_CHECK_INPUT(batch > 0, "the minibatch size must be positive, got {}", batch);
  ORPHEUS_ENFORCE(stream < (uint64_t{1} << 31), "sampler stream {} is out of range", stream);
}

void MinibatchSampler::reshuffle() {
  ++epoch_;
  CounterRng rng(seed_, RngPurpose::kSample, (stream_ << 32) | static_cast<uint64_t>(epoch_),
                 static_cast<uint64_t>(rank_));
  order_.resize(static_cast<size_t>(shardSize_));
  std::iota(order_.begin(), order_.end(), int64_t{0});
  pos_ = 0;
  if (inOrder_) return;
  for (size_t i = order_.size() - 1; i > 0; --i) {
    std::swap(order_[i], order_[rng.uniformInt(i + 1)]);
  }
  pos_ = 0;
}

std::vector<int64_t> MinibatchSampler::next() {
  std::vector<int64_t> batch;
  batch.reserve(static_cast<size_t>(batch_));
  while (static_cast<int64_t>(batch.size()) < batch_) {
    if (pos_ == order_.size()) {
      reshuffle();
      // A batch that crosses into the new epoch takes the new epoch's first
      // indices that it does not already hold; the ones it holds move just past
      // them, so the epoch still visits every index once. Impossible (and skipped)
      // when the batch is larger than the shard.
      const auto need = static_cast<size_t>(batch_) - batch.size();
      if (!batch.empty() && batch_ <= shardSize_) {
        std::vector<char> held(static_cast<size_t>(shardSize_), 0);
        for (int64_t i : batch) held[static_cast<size_t>(i)] = 1;
        size_t spare = need;  // next candidate to swap in from beyond the first `need`
        for (size_t k = 0; k < need; ++k) {
          if (!held[static_cast<size_t>(order_[k])]) continue;
          while (held[static_cast<size_t>(order_[spare])]) ++spare;
          std::swap(order_[k], order_[spare]);
        }
      }
    }
    const size_t take = std::min(order_.size() - pos_, static_cast<size_t>(batch_) - batch.size());
    batch.insert(batch.end(), order_.begin() + static_cast<ptrdiff_t>(pos_),
                 order_.begin() + static_cast<ptrdiff_t>(pos_ + take));
    pos_ += take;
  }
  return batch;
}

PrefetchQueue::PrefetchQueue(const Dataset& data, MinibatchSampler sampler, size_t depth,
                             std::chrono::milliseconds timeout)
    : data_(data), sampler_(std::move(sampler)), depth_(std::max<size_t>(depth, 1)), timeout_(timeout) {
  thread_ = std::thread([this] { run(); });
}

PrefetchQueue::~PrefetchQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  try {
    if (thread_.joinable()) thread_.join();
  } catch (...) {
    // join only fails on a thread that cannot be joined; nothing is left to stop.
  }
}

void PrefetchQueue::run() {
  try {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || ready_.size() < depth_; });
        if (stop_) return;
      }
      // Only this thread touches the sampler after construction, and the data is
      // read-only, so the gather runs unlocked.
      Batch batch = gather(data_, sampler_.next());
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        ready_.push_back(std::move(batch));
      }
      cv_.notify_all();
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
    }
    cv_.notify_all();
  }
}

Batch PrefetchQueue::next() {
  std::unique_lock<std::mutex> lock(mu_);
  const bool ready =
      cv_.wait_for(lock, timeout_, [this] { return !ready_.empty() || error_ != nullptr; });
  if (!ready) {
    throw TimeoutError(fmt::format("no minibatch of {} was ready within {} ms", data_.source,
                                   timeout_.count()));
  }
  // Batches gathered before a failure are still handed out in order.
  if (ready_.empty()) std::rethrow_exception(error_);
  Batch batch = std::move(ready_.front());
  ready_.pop_front();
  lock.unlock();
  cv_.notify_all();
  return batch;
}

}  // namespace orpheus::data
