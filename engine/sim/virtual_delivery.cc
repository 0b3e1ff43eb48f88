#include "engine/sim/virtual_delivery.h"

#include "engine/base/sv_batch.h"

#include <algorithm>
#include <cstring>
#include <tuple>

namespace orpheus::engine::sim {

uint64_t batchClock(const std::vector<std::byte>& bytes) {
  constexpr size_t kClockOffset = 24;  // engine/base/sv_batch.h: the header's clock, u64 little-endian
  if (bytes.size() < kSvBatchHeaderBytes) return 0;
  uint64_t clock = 0;
  std::memcpy(&clock, bytes.data() + kClockOffset, sizeof clock);
  return clock;
}

ArrivalBook::ArrivalBook(int ranks, comm::RunGate* gate)
    : ranks_(ranks), gate_(gate), arrivals_(static_cast<size_t>(ranks)) {}

void ArrivalBook::placed(uint64_t clock, const std::vector<RankTiming>& timing) {
  std::lock_guard lock(mu_);
  std::vector<double>& next = starts_[clock + 1];
  next.resize(static_cast<size_t>(ranks_));
  for (size_t r = 0; r < timing.size(); ++r) {
    next[r] = timing[r].nextStart;
    for (const auto& [sender, at] : timing[r].arrivals) arrivals_[r][{clock, sender}] = at;
  }
  placed_ = clock;
  // A rank asks for the start of a clock at most two past the last placed one.
  while (!starts_.empty() && starts_.begin()->first + 4 < clock) starts_.erase(starts_.begin());
  cv_.notify_all();
}

bool ArrivalBook::waitPlaced(uint64_t clock, std::chrono::milliseconds timeout) {
  {
    std::lock_guard lock(mu_);
    if (placed_ >= clock) return true;
  }
  // The place in the gate is given up first and taken again after the lock: a rank
  // holding a place never waits on this lock for one without.
  comm::GateReleased away(gate_);
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return placed_ >= clock; });
}

double ArrivalBook::startOf(int rank, uint64_t clock) const {
  if (clock <= 1) return 0.0;
  std::lock_guard lock(mu_);
  const auto it = starts_.find(clock);
  return it == starts_.end() ? 0.0 : it->second[static_cast<size_t>(rank)];
}

std::optional<double> ArrivalBook::takeArrival(int receiver, uint64_t clock, int sender) {
  std::lock_guard lock(mu_);
  auto& mine = arrivals_[static_cast<size_t>(receiver)];
  const auto it = mine.find({clock, sender});
  if (it == mine.end()) return std::nullopt;
  const double at = it->second;
  mine.erase(it);
  return at;
}

void VirtualInbox::hold(comm::Message message) {
  Held h;
  h.clock = batchClock(message.bytes);
  h.sender = message.peer;
  h.message = std::move(message);
  held_.push_back(std::move(h));
}

void VirtualInbox::resolve(uint64_t through) {
  for (Held& h : held_) {
    if (h.clock <= through && !h.arrival) h.arrival = book_.takeArrival(rank_, h.clock, h.sender);
    // A batch the virtual clock never saw (not an SV batch): due at once.
    if (h.clock <= through && !h.arrival) h.arrival = 0.0;
  }
}

std::vector<comm::Message> VirtualInbox::due(uint64_t through, double at) {
  resolve(through);
  std::vector<Held> now;
  std::vector<Held> later;
  for (Held& h : held_) (h.clock <= through && *h.arrival <= at ? now : later).push_back(std::move(h));
  held_ = std::move(later);
  std::sort(now.begin(), now.end(), [](const Held& a, const Held& b) {
    return std::tie(*a.arrival, a.clock, a.sender) < std::tie(*b.arrival, b.clock, b.sender);
  });
  std::vector<comm::Message> out;
  out.reserve(now.size());
  for (Held& h : now) out.push_back(std::move(h.message));
  return out;
}

std::optional<comm::Message> VirtualInbox::first(uint64_t through) {
  resolve(through);
  auto best = held_.end();
  for (auto it = held_.begin(); it != held_.end(); ++it) {
    if (it->clock > through) continue;
    if (best == held_.end() ||
        std::tie(*it->arrival, it->clock, it->sender) < std::tie(*best->arrival, best->clock, best->sender)) {
      best = it;
    }
  }
  if (best == held_.end()) return std::nullopt;
  comm::Message m = std::move(best->message);
  held_.erase(best);
  return m;
}

std::optional<comm::Message> VirtualInbox::take(uint64_t clock, int sender) {
  const auto it = std::find_if(held_.begin(), held_.end(),
                               [&](const Held& h) { return h.clock == clock && h.sender == sender; });
  if (it == held_.end()) return std::nullopt;
  comm::Message m = std::move(it->message);
  held_.erase(it);
  return m;
}

}  // namespace orpheus::engine::sim
