// Seeded minibatch sampling and a prefetching data queue.
#pragma once

#include "engine/data/dataset.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace orpheus::data {

// Draws minibatches of indices into a shard without replacement within an epoch:
// each epoch is a fresh permutation from the stream keyed by (seed, kSample,
// epoch, rank). A batch never spans two epochs' duplicates: when fewer than
// `batch` indices remain, the rest come from the next epoch's permutation.
// Deterministic: the k-th call returns the same indices on every run.
//
// `stream` > 0 draws from a stream of its own, (seed, kSample, stream << 32 |
// epoch, rank): a rank whose examples changed (engine/coordinator/balance.h) starts a fresh
// one, keyed by the clock of the change. Stream 0 is the job's first.
//
// Order::kInOrder skips the permutation: batch k is examples [kB, (k+1)B) (mod
// the shard), as token streams need: their example s*B + b is segment s of stream b.
class MinibatchSampler {
 public:
  enum class Order { kShuffled, kInOrder };
  MinibatchSampler(int64_t shardSize, int64_t batch, uint64_t seed, int rank, Order order = Order::kShuffled,
                   uint64_t stream = 0);

  std::vector<int64_t> next();
  int64_t epoch() const { return epoch_; }

 private:
  void reshuffle();

  int64_t shardSize_;
  int64_t batch_;
  uint64_t seed_;
  int rank_;
  bool inOrder_;
  uint64_t stream_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
  size_t pos_ = 0;
};

// A background thread gathers the next `depth` minibatches while the caller
// trains on the current one. next() returns batches in sampler order; it waits at
// most `timeout` and then throws TimeoutError. An exception in the thread is
// rethrown by next(). The destructor stops and joins the thread; it never throws.
// Not thread-safe: one consumer.
class PrefetchQueue {
 public:
  PrefetchQueue(const Dataset& data, MinibatchSampler sampler, size_t depth = 2,
                std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~PrefetchQueue();
  PrefetchQueue(const PrefetchQueue&) = delete;
  PrefetchQueue& operator=(const PrefetchQueue&) = delete;

  Batch next();

 private:
  void run();

  const Dataset& data_;
  MinibatchSampler sampler_;
  size_t depth_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> ready_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace orpheus::data
