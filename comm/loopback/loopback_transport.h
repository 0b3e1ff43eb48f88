// In-process transport: every rank is a thread of one process, exchanging
// through a shared hub (comm/loopback/loopback_hub.h). Deterministic and fast;
// used by tests and for simulation. Traffic is counted by the base, so it agrees
// with every other transport on bytes and messages. A rank that does not call a
// collective is named in the others' TimeoutError.
#pragma once

#include "comm/loopback/loopback_control.h"
#include "comm/loopback/loopback_hub.h"
#include "comm/transport.h"

#include <memory>

namespace orpheus::comm::loopback {

class LoopbackTransport final : public Transport {
 public:
  LoopbackTransport(std::shared_ptr<LoopbackHub> hub, int rank);

  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  std::string name() const override { return "loopback"; }
  ControlPlane& control() override { return control_; }
 protected:
  Gathered doAllgatherv(std::span<const std::byte> local, uint64_t clock) override;
  void doAllreduceSum(std::span<float> chunk, uint64_t clock) override;
  void doAllreduceSumIdentical(std::span<float> chunk, uint64_t clock) override;
  void doShiftRing(std::span<float> chunk, uint64_t clock) override;
  void doSendAsync(int peer, SharedBytes bytes) override;
  // In-process delivery copies once, into the receiver's message, straight from the pieces.
  void doSendPiecesAsync(int peer, SharedPieces pieces) override;
  Gathered doAllgathervPieces(const Pieces& local, uint64_t clock) override;
  std::optional<Message> doTryReceive() override;
  // With a run gate, waits up to `wait` (outside the gate) for a message: a
  // simulated rank that knows it is waiting sleeps until a peer posts.
  std::optional<Message> doReceiveWithin(std::chrono::microseconds wait) override {
    return hub_->dataMail().take(rank_, wait);
  }
  void doFlushSends() override {}  // a post is delivered at once

 private:
  std::shared_ptr<LoopbackHub> hub_;
  int rank_;
  LoopbackControlPlane control_;
};

}  // namespace orpheus::comm::loopback
