#include "engine/worker/consistency.h"

#include "comm/stall.h"
#include "engine/base/error.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace orpheus::engine {

Inbox::Inbox(const ConsistencyOptions& options, const comm::MulticastSchedule& schedule, comm::Transport& transport,
             std::vector<std::pair<int64_t, int64_t>> paramShapes, bool keepBytes)
    : options_(options), schedule_(schedule), transport_(transport), shapes_(std::move(paramShapes)),
      keepBytes_(keepBytes) {}

void Inbox::receive(MetricsSink& metrics) {
  while (auto message = transport_.tryReceive()) accept(std::move(*message));
  metrics.collect();
}

void Inbox::accept(comm::Message message) {
  SvBatchExpectation expect;
  expect.sender = message.peer;
  expect.paramShapes = shapes_;
  auto received = std::make_shared<const std::vector<std::byte>>(std::move(message.bytes));
  const std::span<const std::byte> record(*received);
  SvBatchView batch = decodeView(received, record, expect);
  const uint64_t clock = batch.header.clock;
  const int sender = message.peer;
  const int me = transport_.rank();
  const auto receivers = clock >= 1 && clock <= static_cast<uint64_t>(options_.clocks)
                             ? schedule_.receivers(clock, sender)
                             : std::vector<int>{};
  if (clock <= completeThrough_ || std::find(receivers.begin(), receivers.end(), me) == receivers.end() ||
      arrived_[clock].count(sender) > 0) {
    throw CorruptRecordError(fmt::format(
        "unexpected SV batch from rank {} at clock {}: the schedule does not send it to rank {} (or it came twice)",
        sender, clock, me));
  }
  arrived_[clock].insert(sender);
  ReceivedBatch arrived{std::move(batch), keepBytes_ ? std::move(received) : nullptr};
  if (options_.consistency == Consistency::kSsp) {
    ready_.push_back(std::move(arrived));
  } else {
    pending_[clock].emplace(sender, std::move(arrived));
  }
  advanceComplete();
}

void Inbox::advanceComplete() {
  while (completeThrough_ < static_cast<uint64_t>(options_.clocks)) {
    const uint64_t next = completeThrough_ + 1;
    const size_t expected = expectedAt(next);
    const auto it = arrived_.find(next);
    const size_t got = it == arrived_.end() ? 0 : it->second.size();
    if (got < expected) return;
    if (it != arrived_.end()) arrived_.erase(it);
    completeThrough_ = next;
  }
}

size_t Inbox::expectedAt(uint64_t clock) {
  if (expected_.first != clock) expected_ = {clock, schedule_.senders(clock, transport_.rank()).size()};
  return expected_.second;
}

std::vector<int> Inbox::missingSenders(uint64_t clock) const {
  std::vector<int> missing;
  const auto it = arrived_.find(clock);
  for (int s : schedule_.senders(clock, transport_.rank())) {
    if (it == arrived_.end() || it->second.count(s) == 0) missing.push_back(s);
  }
  return missing;
}

double Inbox::waitComplete(uint64_t clock, uint64_t at, MetricsSink& metrics) {
  using Clock = std::chrono::steady_clock;
  advanceComplete();
  if (completeThrough_ >= clock) return 0.0;
  const auto start = Clock::now();
  comm::Deadline deadline(std::chrono::milliseconds(static_cast<int64_t>(options_.timeoutSeconds * 1000)));
  while (completeThrough_ < clock) {
    receive(metrics);
    if (completeThrough_ >= clock) break;
    if (deadline.passed()) throw timedOut(at);
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

comm::StallError Inbox::timedOut(uint64_t at) const {
  const uint64_t stuck = completeThrough_ + 1;
  const std::vector<int> missing = missingSenders(stuck);
  std::string message = fmt::format("rank {} waited {} s at clock {} for the SV batches of clock {} from ranks {}",
                                    transport_.rank(), options_.timeoutSeconds, at, stuck, fmt::join(missing, ", "));
  // The missing senders may be waiting themselves, on a rank that stalled.
  const comm::StallVerdict v = comm::findStalled(transport_.control(), transport_.rank(), transport_.size(), at);
  // Where the silent ranks are the missing senders, the line has named them already.
  comm::StallVerdict named = v;
  if (named.silent == missing) named.silent.clear();
  return comm::StallError(message + comm::stallSuffix(named, false), v.reports);
}

std::map<int, ReceivedBatch> Inbox::takeClock(uint64_t clock) {
  std::map<int, ReceivedBatch> out;
  const auto it = pending_.find(clock);
  if (it == pending_.end()) return out;
  out = std::move(it->second);
  pending_.erase(it);
  return out;
}

std::vector<ReceivedBatch> Inbox::takeReady() { return std::exchange(ready_, {}); }

}  // namespace orpheus::engine
