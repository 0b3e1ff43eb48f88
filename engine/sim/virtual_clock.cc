#include "engine/sim/virtual_clock.h"

#include <algorithm>

namespace orpheus::engine::sim {

VirtualClock::VirtualClock(const NetworkModel& model, int ranks, Mode mode, int staleness)
    : network_(model, ranks), ranks_(ranks), mode_(mode), staleness_(staleness),
      start_(static_cast<size_t>(ranks), 0.0) {}

double VirtualClock::inThrough(int r, uint64_t c) const {
  double t = 0.0;
  for (uint64_t k = firstKept_; k <= c && k - firstKept_ < lastIn_.size(); ++k) {
    t = std::max(t, lastIn_[k - firstKept_][static_cast<size_t>(r)]);
  }
  return t;
}

void VirtualClock::regroup(int ranks, uint64_t after, double averagedBytes) {
  double start = 0.0;
  for (const double s : start_) start = std::max(start, s);
  start += allreduceSeconds(network_.model(), ranks_, averagedBytes);
  network_ = Network(network_.model(), ranks);
  ranks_ = ranks;
  start_.assign(static_cast<size_t>(ranks), start);
  lastIn_.clear();
  firstKept_ = after + 1;
}

std::vector<RankTiming> VirtualClock::place(uint64_t clock, const std::vector<RankClock>& ranks) {
  const auto p = static_cast<size_t>(ranks_);
  std::vector<RankTiming> out(p);
  const std::vector<Transfer> transfers = sendsOf(ranks, out);
  std::vector<double> lastIn(p, 0.0);
  std::vector<double> bytesIn(p, 0.0);
  deliver(transfers, out, lastIn, bytesIn);
  exchange(ranks, lastIn, bytesIn, out);
  lastIn_.push_back(std::move(lastIn));
  measureStaleness(clock, out);
  nextStarts(clock, ranks, out);

  // Keep the clocks SSP may still wait on (s + 1 back) and the staleness window.
  const uint64_t s = static_cast<uint64_t>(std::max(0, staleness_));
  const size_t keep = static_cast<size_t>(std::min<uint64_t>(s + 2, 64));
  while (lastIn_.size() > keep) {
    lastIn_.pop_front();
    ++firstKept_;
  }
  return out;
}

std::vector<Transfer> VirtualClock::sendsOf(const std::vector<RankClock>& ranks, std::vector<RankTiming>& out) const {
  const auto p = static_cast<size_t>(ranks_);
  std::vector<Transfer> transfers;
  const NetworkModel& model = network_.model();
  for (size_t r = 0; r < p; ++r) {
    out[r].start = start_[r];
    out[r].sends = start_[r] + ranks[r].compute;
    Transfer t;
    t.sender = static_cast<int>(r);
    t.bytes = ranks[r].messageBytes;
    if (ranks[r].toAllPeers) {
      for (int q = 0; q < ranks_; ++q)
        if (q != static_cast<int>(r)) t.receivers.push_back(q);
    } else {
      t.receivers = ranks[r].receivers;
    }
    // Every copy passes through the sender's stack before it can leave (multicast: one).
    const size_t copies = model.multicast ? std::min<size_t>(1, t.receivers.size()) : t.receivers.size();
    out[r].sends += ranks[r].slowdown * model.stackSeconds(static_cast<double>(t.bytes) * static_cast<double>(copies));
    t.ready = out[r].sends;
    if (!t.receivers.empty()) transfers.push_back(std::move(t));
  }
  return transfers;
}

void VirtualClock::deliver(const std::vector<Transfer>& transfers, std::vector<RankTiming>& out,
                           std::vector<double>& lastIn, std::vector<double>& bytesIn) {
  const std::vector<std::vector<double>> in = network_.deliver(transfers);
  for (size_t i = 0; i < transfers.size(); ++i) {
    for (size_t k = 0; k < transfers[i].receivers.size(); ++k) {
      const auto to = static_cast<size_t>(transfers[i].receivers[k]);
      bytesIn[to] += static_cast<double>(transfers[i].bytes);
      lastIn[to] = std::max(lastIn[to], in[i][k]);
      ++out[to].inDegree;
      if (recordArrivals_) out[to].arrivals.emplace_back(transfers[i].sender, in[i][k]);
    }
  }
}

// The exchange's all-reduces after the last rank's sends: dense sync's gradient
// as one collective (its parameters bucketed together), PowerSGD's one after the
// other (each waits for the one before). Every rank makes the same calls.
double VirtualClock::reductionSeconds(const std::vector<RankClock>& ranks) const {
  const NetworkModel& model = network_.model();
  if (mode_ == Mode::kDense) {
    double reduced = 0.0;
    for (const RankClock& c : ranks) reduced = std::max(reduced, static_cast<double>(c.reducedBytes));
    return allreduceSeconds(model, ranks_, reduced);
  }
  double seconds = 0.0;
  for (const uint64_t bytes : ranks.front().reductions) {
    seconds += allreduceSeconds(model, ranks_, static_cast<double>(bytes));
  }
  return seconds;
}

void VirtualClock::exchange(const std::vector<RankClock>& ranks, const std::vector<double>& lastIn,
                            const std::vector<double>& bytesIn, std::vector<RankTiming>& out) const {
  const auto p = static_cast<size_t>(ranks_);
  double denseDone = 0.0;
  if (mode_ == Mode::kDense || mode_ == Mode::kPowerSgd) {
    for (size_t r = 0; r < p; ++r) denseDone = std::max(denseDone, out[r].sends);
    denseDone += reductionSeconds(ranks);
  }
  for (size_t r = 0; r < p; ++r) {
    RankTiming& t = out[r];
    switch (mode_) {
      case Mode::kBsp: t.exchanged = std::max(t.sends, lastIn[r]); break;
      case Mode::kSsp: t.exchanged = t.sends; break;
      case Mode::kDense:
      case Mode::kPowerSgd: t.exchanged = denseDone; break;
    }
    t.end = t.exchanged + ranks[r].slowdown * network_.model().stackSeconds(bytesIn[r]) + ranks[r].receive +
            ranks[r].update;
  }
}

// Staleness at this clock's start, from the clocks placed before it.
void VirtualClock::measureStaleness(uint64_t clock, std::vector<RankTiming>& out) const {
  for (size_t r = 0; r < static_cast<size_t>(ranks_); ++r) {
    uint64_t complete = clock - 1;
    while (complete >= firstKept_ && complete - firstKept_ < lastIn_.size() &&
           lastIn_[complete - firstKept_][r] > out[r].start) {
      --complete;
    }
    // Clocks older than the window were complete long ago.
    out[r].staleness = static_cast<int64_t>(clock - 1) - static_cast<int64_t>(complete);
  }
}

// The next start: the consistency model, then the coordinator's barrier.
void VirtualClock::nextStarts(uint64_t clock, const std::vector<RankClock>& ranks, std::vector<RankTiming>& out) {
  const auto p = static_cast<size_t>(ranks_);
  double averaged = 0.0;
  double shifted = 0.0;
  for (size_t r = 0; r < p; ++r) {
    averaged = std::max(averaged, static_cast<double>(ranks[r].averagedBytes));
    shifted = std::max(shifted, static_cast<double>(ranks[r].shiftedBytes));
  }
  const uint64_t s = static_cast<uint64_t>(std::max(0, staleness_));
  for (size_t r = 0; r < p; ++r) {
    double next = out[r].end;
    if (mode_ == Mode::kSsp && clock + 1 > s + 1) next = std::max(next, inThrough(static_cast<int>(r), clock - s));
    out[r].nextStart = next;
  }
  if (averaged > 0.0 || shifted > 0.0) {
    double barrier = 0.0;
    for (size_t r = 0; r < p; ++r) barrier = std::max({barrier, out[r].end, inThrough(static_cast<int>(r), clock)});
    barrier += allreduceSeconds(network_.model(), ranks_, averaged) +
               (shifted > 0.0 ? ringShiftSeconds(network_.model(), ranks_, shifted) : 0.0);
    for (size_t r = 0; r < p; ++r) out[r].nextStart = barrier;
  }
  for (size_t r = 0; r < p; ++r) start_[r] = out[r].nextStart;
}

}  // namespace orpheus::engine::sim
