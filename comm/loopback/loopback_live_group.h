// The live group of an in-process job (comm/live_group.h): every rank a thread.
// The agreement is a round of deposits in state the group's ranks share; split
// makes a new hub for the ranks that stay; grow makes a hub with room for the new
// ranks and hands each new rank's transport and group to JoinRank, which starts
// its thread (there is no process to spawn). Waits give up the rank's place in the
// run gate (comm/run_gate.h), as the hub's do.
#pragma once

#include "comm/live_group.h"
#include "comm/run_gate.h"

#include <functional>
#include <memory>

namespace orpheus::comm::loopback {

// Starts one rank of a grown group (called by the group's rank 0, on its thread,
// once per new rank, in rank order): the new rank's transport and live group, and
// the clock it joins after.
using JoinRank =
    std::function<void(std::unique_ptr<Transport> transport, std::unique_ptr<LiveGroup> live, uint64_t clock)>;

struct LiveEpoch;  // what the ranks of one group share

class LoopbackLiveGroup final : public LiveGroup {
 public:
  LoopbackLiveGroup(std::shared_ptr<LiveEpoch> epoch, int rank) : epoch_(std::move(epoch)), rank_(rank) {}
  // `ranks` groups, element r being rank r, spanning the ranks of one loopback job
  // (made with the same gate). `join` may be empty: grow() then throws.
  static std::vector<std::unique_ptr<LiveGroup>> make(int ranks, std::shared_ptr<RunGate> gate, JoinRank join);

  void beginMax(std::span<const double> values) override;
  bool pending() const override { return pending_; }
  std::vector<double> finishMax(std::chrono::milliseconds timeout) override;
  std::unique_ptr<Transport> split(bool stays, std::chrono::milliseconds timeout) override;
  std::unique_ptr<Transport> grow(int ranks, uint64_t clock, std::chrono::milliseconds timeout) override;

 private:
  std::shared_ptr<LiveEpoch> epoch_;
  int rank_;
  uint64_t round_ = 0;  // the agreement this rank begins next
  bool pending_ = false;
};

}  // namespace orpheus::comm::loopback
