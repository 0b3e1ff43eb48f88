#include "engine/sim/trace.h"

#include "engine/base/error.h"

#include <algorithm>

namespace orpheus::engine::sim {

Trace::Trace(int ranks, VirtualClock clock, MetricsAggregator& aggregator)
    : ranks_(ranks), clock_(std::move(clock)), aggregator_(aggregator) {}

void Trace::informs(ArrivalBook* book) {
  std::lock_guard lock(mu_);
  book_ = book;
  clock_.recordArrivals(book != nullptr);
}

void Trace::add(int rank, uint64_t clock, RankClock&& work, const ClockRecord& record) {
  std::lock_guard lock(mu_);
  Pending& p = pending_[clock];
  if (p.work.empty()) {
    p.work.resize(static_cast<size_t>(ranks_));
    p.records.resize(static_cast<size_t>(ranks_));
  }
  p.work[static_cast<size_t>(rank)] = std::move(work);
  p.records[static_cast<size_t>(rank)] = record;
  ++p.count;
  for (auto it = pending_.find(next_); it != pending_.end() && it->second.count == ranks_;
       it = pending_.find(next_)) {
    place(next_, it->second);
    pending_.erase(it);
    ++next_;
  }
}

void Trace::place(uint64_t clock, Pending& pending) {
  const std::vector<RankTiming> timing = clock_.place(clock, pending.work);
  if (book_ != nullptr) book_->placed(clock, timing);
  uint64_t messages = 0;
  for (int r = 0; r < ranks_; ++r) {
    const RankTiming& t = timing[static_cast<size_t>(r)];
    const RankClock& w = pending.work[static_cast<size_t>(r)];
    ClockRecord rec = pending.records[static_cast<size_t>(r)];
    // The measured fields become simulated ones; the rest (loss, traffic, evaluation) stay.
    rec[kSeconds] = r == 0 ? std::max(t.nextStart, 1e-12) : 0.0;
    rec[kClockSeconds] = t.nextStart - t.start;
    rec[kCompute] = w.compute;
    rec[kComm] = t.exchanged - t.sends;
    rec[kUpdate] = w.receive + w.update;
    rec[kWait] = (t.nextStart - t.end) + std::max(0.0, t.exchanged - t.sends);
    messages += static_cast<uint64_t>(rec[kMessages]);
    totals_.bytes += rec[kBytes];
    totals_.computeSeconds += w.compute + w.receive + w.update;
    ++totals_.inDegree[t.inDegree];
    ++totals_.staleness[t.staleness];
    totals_.lastClockEnd = std::max(totals_.lastClockEnd, t.nextStart);
    if (r == 0) totals_.seconds = t.nextStart;
    aggregator_.add(rec);
  }
  totals_.messages += static_cast<double>(messages);
  totals_.messagesMin = std::min(totals_.messagesMin, messages);
  totals_.messagesMax = std::max(totals_.messagesMax, messages);
  ++totals_.clocks;
  totals_.rankClocks += ranks_;
}

void Trace::regroup(int ranks, uint64_t after, double averagedBytes, const JsonLine& note) {
  std::lock_guard lock(mu_);
  ORPHEUS_ENFORCE(next_ == after + 1 && pending_.empty(), "membership change after clock {} with clock {} next", after,
                  next_);
  ranks_ = ranks;
  clock_.regroup(ranks, after, averagedBytes);
  aggregator_.regroup(ranks, note);
}

TraceTotals Trace::totals() const {
  std::lock_guard lock(mu_);
  return totals_;
}

}  // namespace orpheus::engine::sim
