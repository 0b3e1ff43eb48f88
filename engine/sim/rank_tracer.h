// What a simulation measures of one rank: the thread CPU time of each phase of
// each clock (engine::ClockObserver) less the time spent inside the transport, and
// the traffic of each clock (TracingTransport, a decorator of the rank's loopback
// transport). Both run on the rank's own thread; a finished clock goes to the
// shared Trace (engine/sim/trace.h).
#pragma once

#include "comm/transport.h"
#include "engine/sim/virtual_clock.h"
#include "engine/worker.h"

#include <cstdint>
#include <memory>

namespace orpheus::engine::sim {

class Trace;

class RankTracer final : public ClockObserver {
 public:
  // `computeSeconds` > 0: every clock computes for that long instead of what it measured.
  RankTracer(Trace& trace, int rank, double computeSeconds);

  void phase(ClockPhase phase, uint64_t clock) override;
  void reported(const ClockRecord& record) override;

  // The transport's calls, bracketing time that is not computation.
  void enterTransport();
  void leaveTransport();
  // The traffic of the clock under way.
  RankClock& current() { return current_; }
  ClockPhase currentPhase() const { return phase_; }

 private:
  double computeTime() const;

  Trace& trace_;
  int rank_;
  double computeSeconds_;
  uint64_t clock_ = 0;
  ClockPhase phase_ = ClockPhase::kEnded;
  double phaseStart_ = 0.0;
  double transportSeconds_ = 0.0;
  double enteredAt_ = 0.0;
  int depth_ = 0;
  RankClock current_;
};

// Forwards every call to `inner`, telling `tracer` what goes on the wire.
class TracingTransport final : public comm::Transport {
 public:
  TracingTransport(std::unique_ptr<comm::Transport> inner, RankTracer& tracer);

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
  std::unique_ptr<comm::Transport> inner_;
  RankTracer& tracer_;
};

}  // namespace orpheus::engine::sim
