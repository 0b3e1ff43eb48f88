// What a simulation measures of one rank: the thread CPU time of each phase of
// each clock (engine::ClockObserver) less the time spent inside the transport, and
// the traffic of each clock (TracingTransport, a decorator of the rank's loopback
// transport). Both run on the rank's own thread; a finished clock goes to the
// shared Trace (engine/sim/trace.h).
#pragma once

#include "comm/schedule.h"
#include "comm/transport.h"
#include "engine/sim/virtual_clock.h"
#include "engine/sim/virtual_delivery.h"
#include "engine/worker/worker.h"

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <set>

namespace orpheus::engine::sim {

class Trace;

class RankTracer final : public ClockObserver {
 public:
  // `computeSeconds` > 0: every clock computes for that long instead of what it
  // measured. `slowdown` >= 1 stretches either (engine/sim/cpu_share.h).
  RankTracer(Trace& trace, int rank, double computeSeconds, double slowdown = 1.0);

  void phase(ClockPhase phase, uint64_t clock) override;
  void reported(const ClockRecord& record) override;

  // The transport's calls, bracketing time that is not computation.
  void enterTransport();
  void leaveTransport();
  // The traffic of the clock under way.
  RankClock& current() { return current_; }
  ClockPhase currentPhase() const { return phase_; }
  uint64_t currentClock() const { return clock_; }
  // The computation of the clock under way so far, as the virtual clock will charge it.
  double computeSoFar() const { return computeSeconds_ > 0.0 ? computeSeconds_ * slowdown_ : current_.compute; }

 private:
  double computeTime() const;

  Trace& trace_;
  int rank_;
  double computeSeconds_;
  double slowdown_;
  uint64_t clock_ = 0;
  ClockPhase phase_ = ClockPhase::kEnded;
  double phaseStart_ = 0.0;
  double transportSeconds_ = 0.0;
  double enteredAt_ = 0.0;
  int depth_ = 0;
  RankClock current_;
};

// Forwards every call to `inner`, telling `tracer` what goes on the wire.
//
// Receiving over a gated loopback transport (comm/run_gate.h): an empty
// mailbox answers at once, but a second empty poll within one phase of a clock
// means the rank is waiting for peers, and it then sleeps until a peer posts (no
// poll storm of hundreds of waiting ranks). With an ArrivalBook (SSP), batches are
// handed on in virtual-time order instead of as the threads posted them
// (engine/sim/virtual_delivery.h).
class TracingTransport final : public comm::Transport {
 public:
  // `book` and `schedule`: both or neither; they must outlive the transport.
  TracingTransport(std::unique_ptr<comm::Transport> inner, RankTracer& tracer, ArrivalBook* book = nullptr,
                   const comm::MulticastSchedule* schedule = nullptr);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return "simulated " + inner_->name(); }
  comm::ControlPlane& control() override { return inner_->control(); }

 protected:
  comm::Gathered doAllgatherv(std::span<const std::byte> local, uint64_t clock) override;
  void doAllreduceSum(std::span<float> chunk, uint64_t clock) override;
  void doAllreduceSumIdentical(std::span<float> chunk, uint64_t clock) override;
  void doShiftRing(std::span<float> chunk, uint64_t clock) override;
  void doSendAsync(int peer, comm::SharedBytes bytes) override;
  std::optional<comm::Message> doTryReceive() override;
  void doFlushSends() override;

 private:
  // Resets the idle state where the clock or its phase changed; true where it did.
  bool newCheckPoint();
  std::optional<comm::Message> receiveInVirtualOrder();
  // Waits until clocks <= `clock` are placed, then holds every batch posted so far.
  void holdPlacedThrough(uint64_t clock);
  std::optional<comm::Message> nextWhileWaiting();

  std::unique_ptr<comm::Transport> inner_;
  RankTracer& tracer_;
  uint64_t pointClock_ = UINT64_MAX;
  ClockPhase pointPhase_ = ClockPhase::kEnded;
  bool idle_ = false;  // the last poll at this point found nothing
  // SSP in virtual-time order.
  ArrivalBook* book_;
  const comm::MulticastSchedule* schedule_;
  std::optional<VirtualInbox> inbox_;
  std::deque<comm::Message> ready_;  // due at this check point, in order
  std::set<int> takenNow_;           // senders of the current clock handed on while waiting
};

}  // namespace orpheus::engine::sim
