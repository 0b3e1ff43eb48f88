#include "engine/sim/rank_tracer.h"

#include "engine/sim/trace.h"

#include <time.h>

namespace orpheus::engine::sim {
namespace {

double threadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Brackets a transport call.
class InTransport {
 public:
  explicit InTransport(RankTracer& tracer) : tracer_(tracer) { tracer_.enterTransport(); }
  ~InTransport() { tracer_.leaveTransport(); }
  InTransport(const InTransport&) = delete;
  InTransport& operator=(const InTransport&) = delete;

 private:
  RankTracer& tracer_;
};

}  // namespace

RankTracer::RankTracer(Trace& trace, int rank, double computeSeconds)
    : trace_(trace), rank_(rank), computeSeconds_(computeSeconds) {}

double RankTracer::computeTime() const { return threadCpuSeconds() - transportSeconds_; }

void RankTracer::enterTransport() {
  if (depth_++ == 0) enteredAt_ = threadCpuSeconds();
}

void RankTracer::leaveTransport() {
  if (--depth_ == 0) transportSeconds_ += threadCpuSeconds() - enteredAt_;
}

void RankTracer::phase(ClockPhase phase, uint64_t clock) {
  const double now = computeTime();
  const double spent = now - phaseStart_;
  if (phase == ClockPhase::kStarted) {
    current_ = RankClock{};
    clock_ = clock;
  } else if (clock == clock_) {
    // The phase that just ended.
    switch (phase_) {
      case ClockPhase::kStarted: current_.compute += spent; break;
      case ClockPhase::kExchange: current_.receive += spent; break;
      case ClockPhase::kRebuild: current_.update += spent; break;
      case ClockPhase::kEnded: break;
    }
  }
  phase_ = phase;
  phaseStart_ = now;
}

void RankTracer::reported(const ClockRecord& record) {
  if (computeSeconds_ > 0.0) {
    current_.compute = computeSeconds_;
    current_.receive = 0.0;
    current_.update = 0.0;
  }
  trace_.add(rank_, clock_, std::move(current_), record);
  current_ = RankClock{};
}

TracingTransport::TracingTransport(std::unique_ptr<comm::Transport> inner, RankTracer& tracer)
    : inner_(std::move(inner)), tracer_(tracer) {}

comm::Gathered TracingTransport::doAllgatherv(std::span<const std::byte> local, uint64_t clock) {
  RankClock& c = tracer_.current();
  c.toAllPeers = true;
  c.messageBytes = local.size();
  InTransport in(tracer_);
  return inner_->allgatherv(local, clock);
}

void TracingTransport::doAllreduceSum(std::span<float> chunk, uint64_t clock) {
  tracer_.current().reducedBytes += chunk.size_bytes();
  InTransport in(tracer_);
  inner_->allreduceSum(chunk, clock);
}

void TracingTransport::doAllreduceSumIdentical(std::span<float> chunk, uint64_t clock) {
  tracer_.current().averagedBytes += chunk.size_bytes();
  InTransport in(tracer_);
  inner_->allreduceSumIdentical(chunk, clock);
}

void TracingTransport::doShiftRing(std::span<float> chunk, uint64_t clock) {
  tracer_.current().shiftedBytes += chunk.size_bytes();
  InTransport in(tracer_);
  inner_->shiftRing(chunk, clock);
}

void TracingTransport::doSendAsync(int peer, comm::SharedBytes bytes) {
  RankClock& c = tracer_.current();
  c.receivers.push_back(peer);
  c.messageBytes = bytes->size();
  InTransport in(tracer_);
  inner_->sendAsync(peer, std::move(bytes));
}

std::optional<comm::Message> TracingTransport::doTryReceive() {
  InTransport in(tracer_);
  return inner_->tryReceive();
}

void TracingTransport::doFlushSends() {
  InTransport in(tracer_);
  inner_->flushSends();
}

}  // namespace orpheus::engine::sim
