#include "comm/loopback/loopback_control.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace orpheus::comm::loopback {

void LoopbackControlPlane::sum(std::span<double> values) {
  reduceInRankOrder(hub_->controlRounds(), rank_, values, [](double a, double b) { return a + b; }, timeout(),
                    "control sum", std::nullopt);
}

void LoopbackControlPlane::max(std::span<double> values) {
  reduceInRankOrder(hub_->controlRounds(), rank_, values, [](double a, double b) { return std::max(a, b); },
                    timeout(), "control max", std::nullopt);
}

void LoopbackControlPlane::min(std::span<double> values) {
  reduceInRankOrder(hub_->controlRounds(), rank_, values, [](double a, double b) { return std::min(a, b); },
                    timeout(), "control min", std::nullopt);
}

void LoopbackControlPlane::send(int peer, SharedBytes bytes) {
  ORPHEUS_ENFORCE(peer >= 0 && peer < hub_->size() && peer != rank_, "rank {} cannot send to rank {}", rank_, peer);
  hub_->controlMail().post(peer, Message{rank_, *bytes});
}

std::optional<Message> LoopbackControlPlane::tryReceive() { return hub_->controlMail().take(rank_); }

void LoopbackControlPlane::sendNote(int peer, uint64_t value) {
  ORPHEUS_ENFORCE(peer >= 0 && peer < hub_->size() && peer != rank_, "rank {} cannot send to rank {}", rank_, peer);
  std::vector<std::byte> bytes(sizeof value);
  std::memcpy(bytes.data(), &value, sizeof value);
  hub_->noteMail().post(peer, Message{rank_, std::move(bytes)});
}

std::optional<Note> LoopbackControlPlane::tryReceiveNote() {
  auto m = hub_->noteMail().take(rank_);
  if (!m) return std::nullopt;
  Note note{m->peer, 0};
  std::memcpy(&note.value, m->bytes.data(), sizeof note.value);
  return note;
}

void LoopbackControlPlane::abortJob(int exitCode) { std::_Exit(exitCode); }

}  // namespace orpheus::comm::loopback
