#include "engine/sim/rank_tracer.h"

#include "engine/base/error.h"
#include "engine/sim/trace.h"

#include <chrono>

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

// How long a waiting rank sleeps for a post before polling again.
constexpr std::chrono::microseconds kWaitingPoll{50000};

}  // namespace

RankTracer::RankTracer(Trace& trace, int rank, double computeSeconds, double slowdown)
    : trace_(trace), rank_(rank), computeSeconds_(computeSeconds), slowdown_(slowdown) {}

double RankTracer::computeTime() const { return threadCpuSeconds() - transportSeconds_; }

void RankTracer::enterTransport() {
  if (depth_++ == 0) enteredAt_ = threadCpuSeconds();
}

void RankTracer::leaveTransport() {
  if (--depth_ == 0) transportSeconds_ += threadCpuSeconds() - enteredAt_;
}

void RankTracer::phase(ClockPhase phase, uint64_t clock) {
  const double now = computeTime();
  const double spent = (now - phaseStart_) * slowdown_;
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
  current_.slowdown = slowdown_;
  if (computeSeconds_ > 0.0) {
    current_.compute = computeSeconds_ * slowdown_;
    current_.receive = 0.0;
    current_.update = 0.0;
  }
  trace_.add(rank_, clock_, std::move(current_), record);
  current_ = RankClock{};
}

TracingTransport::TracingTransport(std::unique_ptr<comm::Transport> inner, RankTracer& tracer, ArrivalBook* book,
                                   const comm::MulticastSchedule* schedule)
    : inner_(std::move(inner)),
      tracer_(tracer),
      book_(book),
      schedule_(schedule) {
  ORPHEUS_ENFORCE(book_ == nullptr || (schedule_ != nullptr && inner_->name() == "loopback"),
                  "virtual-time delivery needs the schedule and a loopback transport");
  if (book_ != nullptr) inbox_.emplace(inner_->rank(), *book_);
}

comm::Gathered TracingTransport::doAllgatherv(std::span<const std::byte> local, uint64_t clock) {
  RankClock& c = tracer_.current();
  c.toAllPeers = true;
  c.messageBytes = local.size();
  InTransport in(tracer_);
  return inner_->allgatherv(local, clock);
}

void TracingTransport::doAllreduceSum(std::span<float> chunk, uint64_t clock) {
  tracer_.current().reducedBytes += chunk.size_bytes();
  tracer_.current().reductions.push_back(chunk.size_bytes());
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
  if (inner_->name() != "loopback") return inner_->tryReceive();
  if (book_ != nullptr) return receiveInVirtualOrder();
  newCheckPoint();
  std::optional<comm::Message> m = inner_->receiveWithin(idle_ ? kWaitingPoll : std::chrono::microseconds(0));
  idle_ = !m.has_value();
  return m;
}

bool TracingTransport::newCheckPoint() {
  const uint64_t clock = tracer_.currentClock();
  const ClockPhase phase = tracer_.currentPhase();
  if (clock == pointClock_ && phase == pointPhase_) return false;
  if (clock != pointClock_) takenNow_.clear();
  pointClock_ = clock;
  pointPhase_ = phase;
  idle_ = false;
  return true;
}

void TracingTransport::holdPlacedThrough(uint64_t clock) {
  // On a timeout the inbox, missing what it waits for, reports the stall.
  if (clock >= 1) book_->waitPlaced(clock, timeout());
  while (std::optional<comm::Message> m = inner_->receiveWithin(std::chrono::microseconds(0))) {
    inbox_->hold(std::move(*m));
  }
}

// The worker polls at the start of clock t and once its batch is sent (check
// points), and in a loop where it waits (a coordinator barrier, the final drain).
std::optional<comm::Message> TracingTransport::receiveInVirtualOrder() {
  const uint64_t t = tracer_.currentClock();
  const ClockPhase phase = tracer_.currentPhase();
  const bool checkPoint = t >= 1 && (phase == ClockPhase::kStarted || phase == ClockPhase::kExchange);
  if (newCheckPoint()) {
    ready_.clear();
    if (checkPoint) {
      holdPlacedThrough(t - 1);
      const double start = book_->startOf(rank(), t);
      const double at = phase == ClockPhase::kStarted ? start : start + tracer_.computeSoFar();
      for (comm::Message& m : inbox_->due(t - 1, at)) ready_.push_back(std::move(m));
    }
  }
  if (!ready_.empty()) {
    comm::Message m = std::move(ready_.front());
    ready_.pop_front();
    return m;
  }
  if (checkPoint && !idle_) {
    idle_ = true;
    return std::nullopt;
  }
  return nextWhileWaiting();
}

// Waiting: what remains of the placed clocks by arrival, then the current clock's
// batches by sender (that clock is placed only once this rank has finished it).
std::optional<comm::Message> TracingTransport::nextWhileWaiting() {
  const uint64_t t = tracer_.currentClock();
  const bool finished = tracer_.currentPhase() == ClockPhase::kEnded;
  const uint64_t placed = finished || t == 0 ? t : t - 1;
  holdPlacedThrough(placed);
  if (std::optional<comm::Message> m = inbox_->first(placed)) return m;
  if (finished) return std::nullopt;
  for (int sender : schedule_->senders(t, rank())) {
    if (takenNow_.count(sender) > 0) continue;
    const auto deadline = std::chrono::steady_clock::now() + timeout();
    while (true) {
      if (std::optional<comm::Message> m = inbox_->take(t, sender)) {
        takenNow_.insert(sender);
        return m;
      }
      if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
      if (std::optional<comm::Message> m = inner_->receiveWithin(kWaitingPoll)) inbox_->hold(std::move(*m));
    }
  }
  return std::nullopt;
}

void TracingTransport::doFlushSends() {
  InTransport in(tracer_);
  inner_->flushSends();
}

}  // namespace orpheus::engine::sim
