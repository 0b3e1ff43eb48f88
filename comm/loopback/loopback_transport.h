// In-process transport: every rank is a thread of one process, exchanging through
// a shared hub. Deterministic and fast; used by tests and for simulation. Counts
// traffic exactly as the MPI transport does, so the two agree on bytes and messages.
#pragma once

#include "comm/transport.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

namespace orpheus::comm::loopback {

// Shared by the `size` transports of one simulated job. Thread-safe.
class LoopbackHub {
 public:
  explicit LoopbackHub(int size);
  int size() const { return size_; }

  // Deposits `bytes` for `rank` in the current round and waits (up to `timeout`)
  // until every rank has deposited; returns all deposits in rank order.
  std::shared_ptr<const std::vector<std::vector<std::byte>>> exchange(int rank, std::vector<std::byte> bytes,
                                                                       std::chrono::milliseconds timeout,
                                                                       const char* what, uint64_t clock);

 // Point-to-point mailboxes, one per (receiver, channel).
  void post(int to, Channel channel, Message m);
  std::optional<Message> take(int rank, Channel channel);

 private:
  int size_;
  std::mutex mailMu_;
  std::map<std::pair<int, int>, std::deque<Message>> mail_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t round_ = 0;
  int arrived_ = 0;
  std::vector<std::vector<std::byte>> slots_;
  std::shared_ptr<const std::vector<std::vector<std::byte>>> published_;
};

class LoopbackTransport final : public Transport {
 public:
  LoopbackTransport(std::shared_ptr<LoopbackHub> hub, int rank);

  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  std::string name() const override { return "loopback"; }

  Gathered allgatherv(std::span<const std::byte> local, uint64_t clock) override;
  void allreduceSum(std::span<float> data, uint64_t clock) override;
  void allreduceSumIdentical(std::span<float> data, uint64_t clock) override;
  void shiftRing(std::span<float> data, uint64_t clock) override;
  void controlSum(std::span<double> data) override;
  void controlMax(std::span<double> data) override;
  void controlMin(std::span<double> data) override;
  void sendAsync(int peer, Channel channel, SharedBytes bytes) override;
  std::optional<Message> tryReceive(Channel channel) override;
  void flushSends() override {}
  [[noreturn]] void abortJob(int exitCode) override;

 private:
  template <typename T, typename Op>
  void reduce(std::span<T> data, Op op, const char* what, uint64_t clock);

  std::shared_ptr<LoopbackHub> hub_;
  int rank_;
};

}  // namespace orpheus::comm::loopback
