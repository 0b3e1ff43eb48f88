#include "comm/loopback/loopback_hub.h"

#include <fmt/ranges.h>

namespace orpheus::comm::loopback {

Rendezvous::Rendezvous(int size)
    : size_(size), present_(static_cast<size_t>(size), false), slots_(static_cast<size_t>(size)) {}

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
  if (!cv_.wait_for(lock, timeout, [&] { return round_ != myRound; })) {
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r)
      if (!present_[static_cast<size_t>(r)]) missing.push_back(r);
    const std::string at = clock ? fmt::format(" at clock {}", *clock) : std::string();
    throw TimeoutError(fmt::format("rank {}: {}{} did not complete within {} s (waiting for rank {}; {} of {} ranks "
                                   "arrived)",
                                   rank, what, at, timeout.count() / 1000.0, fmt::join(missing, ", "), arrived_,
                                   size_));
  }
  // Rounds are strictly sequential per rank, so the published round is ours.
  return published_;
}

void Mailboxes::post(int to, Message m) {
  std::lock_guard lock(mu_);
  boxes_[static_cast<size_t>(to)].push_back(std::move(m));
}

std::optional<Message> Mailboxes::take(int rank) {
  std::lock_guard lock(mu_);
  auto& box = boxes_[static_cast<size_t>(rank)];
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

LoopbackHub::LoopbackHub(int size)
    : size_(checkedSize(size)),
      dataRounds_(size),
      controlRounds_(size),
      dataMail_(size),
      controlMail_(size),
      noteMail_(size) {}

}  // namespace orpheus::comm::loopback
