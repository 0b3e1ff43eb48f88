#include "comm/loopback/loopback_hub.h"

#include <fmt/ranges.h>

namespace orpheus::comm::loopback {

Rendezvous::Rendezvous(int size, RunGate* gate)
    : size_(size), gate_(gate), present_(static_cast<size_t>(size), false), slots_(static_cast<size_t>(size)) {}

Deposits Rendezvous::exchange(int rank, std::vector<std::byte> bytes, std::chrono::milliseconds timeout,
                              const char* what, std::optional<uint64_t> clock) {
  std::unique_lock lock(mu_);
  const auto me = static_cast<size_t>(rank);
  ORPHEUS_ENFORCE(!present_[me], "rank {}: {} entered while its previous exchange is still open (it timed out)", rank,
                  what);
  slots_[me] = std::move(bytes);
  present_[me] = true;
  const uint64_t myRound = round_;
  if (++arrived_ == size_) {
    published_ = std::make_shared<const std::vector<std::vector<std::byte>>>(std::move(slots_));
    slots_.assign(static_cast<size_t>(size_), {});
    present_.assign(static_cast<size_t>(size_), false);
    arrived_ = 0;
    ++round_;
    cv_.notify_all();
    return published_;
  }
  bool done = false;
  {
    // Leaves the gate before blocking and re-enters it without holding mu_, so a
    // rank holding a place never waits on this lock for one without.
    if (gate_ != nullptr) gate_->leave();
    done = cv_.wait_for(lock, timeout, [&] { return round_ != myRound; });
    if (gate_ != nullptr) {
      lock.unlock();
      gate_->enter();
      lock.lock();
    }
  }
  if (!done) {
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r)
      if (!present_[static_cast<size_t>(r)]) missing.push_back(r);
    const std::string at = clock ? fmt::format(" at clock {}", *clock) : std::string();
    throw TimeoutError(fmt::format("rank {}: {}{} did not complete within {} s (waiting for rank {}; {} of {} ranks "
                                   "arrived)",
                                   rank, what, at, timeout.count() / 1000.0, fmt::join(missing, ", "), arrived_,
                                   size_));
  }
  // Rounds are strictly sequential per rank, so the published round is ours (no
  // rank can open round myRound + 2 before this one has deposited in myRound + 1).
  return published_;
}

void Mailboxes::post(int to, Message m) {
  std::lock_guard lock(mu_);
  boxes_[static_cast<size_t>(to)].push_back(std::move(m));
  if (gate_ != nullptr) posted_[static_cast<size_t>(to)].notify_one();
}

std::optional<Message> Mailboxes::take(int rank, std::chrono::microseconds wait) {
  std::unique_lock lock(mu_);
  auto& box = boxes_[static_cast<size_t>(rank)];
  if (box.empty() && gate_ != nullptr && wait.count() > 0) {
    gate_->leave();
    posted_[static_cast<size_t>(rank)].wait_for(lock, wait, [&] { return !box.empty(); });
    lock.unlock();
    gate_->enter();
    lock.lock();
  }
  if (box.empty()) return std::nullopt;
  Message m = std::move(box.front());
  box.pop_front();
  return m;
}

namespace {
int checkedSize(int size) {
  ORPHEUS_ENFORCE(size >= 1, "a loopback job needs at least one rank, got {}", size);
  return size;
}
}  // namespace

LoopbackHub::LoopbackHub(int size, std::shared_ptr<RunGate> gate)
    : size_(checkedSize(size)),
      gate_(std::move(gate)),
      dataRounds_(size, gate_.get()),
      controlRounds_(size, gate_.get()),
      dataMail_(size, gate_.get()),
      controlMail_(size, gate_.get()),
      noteMail_(size, gate_.get()) {}

}  // namespace orpheus::comm::loopback
