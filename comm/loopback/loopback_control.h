// The control plane of a loopback rank: its own rendezvous and mailboxes in the hub.
#pragma once

#include "comm/control.h"
#include "comm/loopback/loopback_hub.h"

#include <memory>

namespace orpheus::comm::loopback {

class LoopbackControlPlane final : public ControlPlane {
 public:
  LoopbackControlPlane(std::shared_ptr<LoopbackHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

  void sum(std::span<double> values) override;
  void max(std::span<double> values) override;
  void min(std::span<double> values) override;
  void send(int peer, SharedBytes bytes) override;
  std::optional<Message> tryReceive() override;
  void flush() override {}  // a post is delivered at once
  void sendNote(int peer, uint64_t value) override;
  std::optional<Note> tryReceiveNote() override;
  // Ends the process: every rank of a loopback job lives in it.
  [[noreturn]] void abortJob(int exitCode) override;

 private:
  std::shared_ptr<LoopbackHub> hub_;
  int rank_;
};

}  // namespace orpheus::comm::loopback
