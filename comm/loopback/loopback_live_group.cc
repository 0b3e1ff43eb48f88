#include "comm/loopback/loopback_live_group.h"

#include "comm/loopback/loopback_hub.h"
#include "comm/loopback/loopback_transport.h"
#include "engine/base/error.h"

#include <fmt/ranges.h>

#include <condition_variable>
#include <map>
#include <mutex>

namespace orpheus::comm::loopback {

struct LiveEpoch {
  LiveEpoch(int size, std::shared_ptr<RunGate> gate, JoinRank join)
      : size(size), gate(std::move(gate)), join(std::move(join)), changeVotes(static_cast<size_t>(size), -1) {}

  struct Round {
    std::vector<std::vector<double>> values;  // per rank; empty until it deposits
    int deposited = 0;
    int collected = 0;
  };

  const int size;
  const std::shared_ptr<RunGate> gate;
  const JoinRank join;
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, Round> rounds;
  // The change that ends this group (a split or a grow): each rank's vote (-1: not
  // yet; 1 stays, 0 leaves), then the next group, once the last rank voted.
  std::vector<int> changeVotes;
  int voted = 0;
  std::shared_ptr<LoopbackHub> nextHub;
  std::shared_ptr<LiveEpoch> next;

  // Waits on cv (outside the gate) until `done`; false after `timeout`.
  template <typename Pred>
  bool waitFor(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout, Pred done) {
    if (gate != nullptr) gate->leave();
    const bool ok = cv.wait_for(lock, timeout, done);
    if (gate != nullptr) {
      lock.unlock();
      gate->enter();
      lock.lock();
    }
    return ok;
  }
  std::string missing(const std::vector<int>& present) const {
    std::vector<int> out;
    for (int r = 0; r < size; ++r)
      if (!present[static_cast<size_t>(r)]) out.push_back(r);
    return fmt::format("{}", fmt::join(out, ", "));
  }
};

std::vector<std::unique_ptr<LiveGroup>> LoopbackLiveGroup::make(int ranks, std::shared_ptr<RunGate> gate,
                                                                JoinRank join) {
  ORPHEUS_ENFORCE(ranks >= 1, "a loopback live group needs at least one rank, got {}", ranks);
  auto epoch = std::make_shared<LiveEpoch>(ranks, std::move(gate), std::move(join));
  std::vector<std::unique_ptr<LiveGroup>> groups;
  for (int r = 0; r < ranks; ++r) groups.push_back(std::make_unique<LoopbackLiveGroup>(epoch, r));
  return groups;
}

void LoopbackLiveGroup::beginMax(std::span<const double> values) {
  ORPHEUS_ENFORCE(epoch_ != nullptr, "rank {} left its live group", rank_);
  ORPHEUS_ENFORCE(!pending_, "rank {}: an agreement is already under way", rank_);
  std::lock_guard lock(epoch_->mu);
  auto& round = epoch_->rounds[round_];
  round.values.resize(static_cast<size_t>(epoch_->size));
  round.values[static_cast<size_t>(rank_)].assign(values.begin(), values.end());
  if (++round.deposited == epoch_->size) epoch_->cv.notify_all();
  pending_ = true;
}

std::vector<double> LoopbackLiveGroup::finishMax(std::chrono::milliseconds timeout) {
  ORPHEUS_ENFORCE(pending_, "rank {}: no agreement under way", rank_);
  std::unique_lock lock(epoch_->mu);
  auto& round = epoch_->rounds[round_];
  if (!epoch_->waitFor(lock, timeout, [&] { return round.deposited == epoch_->size; })) {
    std::vector<int> present;
    for (const auto& v : round.values) present.push_back(!v.empty());
    throw TimeoutError(fmt::format("the membership agreement did not complete within {} s (waiting for rank {})",
                                   timeout.count() / 1000.0, epoch_->missing(present)));
  }
  const auto& mine = round.values[static_cast<size_t>(rank_)];
  std::vector<double> result(mine.size());
  for (size_t r = 0; r < round.values.size(); ++r) {
    const auto& theirs = round.values[r];
    ORPHEUS_ENFORCE(theirs.size() == mine.size(), "the membership agreement: rank {} gave {} values, rank {} {}", r,
                    theirs.size(), rank_, mine.size());
    for (size_t i = 0; i < mine.size(); ++i) result[i] = r == 0 ? theirs[i] : std::max(result[i], theirs[i]);
  }
  if (++round.collected == epoch_->size) epoch_->rounds.erase(round_);
  ++round_;
  pending_ = false;
  return result;
}

namespace {

// Casts this rank's vote in the change that ends `epoch` and waits for the next
// group; `make` (called once, by the last rank to vote, under the lock) builds it.
template <typename Make>
void voteForChange(LiveEpoch& epoch, int rank, int vote, std::chrono::milliseconds timeout, const char* what,
                   Make make) {
  std::unique_lock lock(epoch.mu);
  ORPHEUS_ENFORCE(epoch.changeVotes[static_cast<size_t>(rank)] < 0, "rank {} already took part in this {}", rank,
                  what);
  epoch.changeVotes[static_cast<size_t>(rank)] = vote;
  if (++epoch.voted == epoch.size) {
    make();
    epoch.cv.notify_all();
    return;
  }
  if (!epoch.waitFor(lock, timeout, [&] { return epoch.next != nullptr; })) {
    std::vector<int> present;
    for (int v : epoch.changeVotes) present.push_back(v >= 0);
    throw TimeoutError(fmt::format("the membership {} did not complete within {} s (waiting for rank {})", what,
                                   timeout.count() / 1000.0, epoch.missing(present)));
  }
}

std::unique_ptr<Transport> rankOf(const std::shared_ptr<LoopbackHub>& hub, int rank,
                                  std::chrono::milliseconds timeout) {
  auto transport = std::make_unique<LoopbackTransport>(hub, rank);
  transport->setTimeout(timeout);
  return transport;
}

}  // namespace

std::unique_ptr<Transport> LoopbackLiveGroup::split(bool stays, std::chrono::milliseconds timeout) {
  ORPHEUS_ENFORCE(epoch_ != nullptr && !pending_, "rank {}: split outside a completed agreement", rank_);
  LiveEpoch& epoch = *epoch_;
  voteForChange(epoch, rank_, stays ? 1 : 0, timeout, "split", [&] {
    int staying = 0;
    for (int v : epoch.changeVotes) staying += v;
    ORPHEUS_ENFORCE(staying >= 1, "a live group split leaves no rank");
    epoch.nextHub = std::make_shared<LoopbackHub>(staying, epoch.gate);
    epoch.next = std::make_shared<LiveEpoch>(staying, epoch.gate, epoch.join);
  });
  std::shared_ptr<LiveEpoch> old = std::move(epoch_);
  if (!stays) return nullptr;
  int newRank = 0;
  for (int r = 0; r < rank_; ++r) newRank += old->changeVotes[static_cast<size_t>(r)];
  epoch_ = old->next;
  round_ = 0;
  rank_ = newRank;
  return rankOf(old->nextHub, newRank, timeout);
}

std::unique_ptr<Transport> LoopbackLiveGroup::grow(int ranks, uint64_t clock, std::chrono::milliseconds timeout) {
  ORPHEUS_ENFORCE(epoch_ != nullptr && !pending_, "rank {}: grow outside a completed agreement", rank_);
  ORPHEUS_ENFORCE(ranks >= 1, "a live group grows by at least one rank, got {}", ranks);
  // Every rank has the same JoinRank, so all refuse alike, before anyone waits.
  if (!epoch_->join) throw Error("this loopback job cannot grow: it has no way to start a new rank");
  LiveEpoch& epoch = *epoch_;
  const int size = epoch.size + ranks;
  voteForChange(epoch, rank_, 1, timeout, "grow", [&] {
    epoch.nextHub = std::make_shared<LoopbackHub>(size, epoch.gate);
    epoch.next = std::make_shared<LiveEpoch>(size, epoch.gate, epoch.join);
  });
  std::shared_ptr<LiveEpoch> old = std::move(epoch_);
  epoch_ = old->next;
  round_ = 0;
  if (rank_ == 0) {
    for (int r = old->size; r < size; ++r)
      old->join(rankOf(old->nextHub, r, timeout), std::make_unique<LoopbackLiveGroup>(epoch_, r), clock);
  }
  return rankOf(old->nextHub, rank_, timeout);
}

}  // namespace orpheus::comm::loopback
