// What the `size` loopback ranks of one in-process job share: a rendezvous per
// plane (every collective is one round of it) and mailboxes per plane. The data
// and control planes never share a round or a mailbox, as on MPI. Thread-safe.
//
// With a RunGate (simulation, comm/run_gate.h) every wait gives up the
// waiting rank's place: a rendezvous while the others arrive, and an empty
// mailbox, which then waits up to kIdleWait (or the wait its caller gives) for a
// post before it answers nothing (tryReceive is polled in a loop by a rank waiting
// on peers; the pause lets the ranks with work run instead of the pollers).
#pragma once

#include "comm/run_gate.h"
#include "comm/message.h"
#include "engine/base/error.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

namespace orpheus::comm::loopback {

using Deposits = std::shared_ptr<const std::vector<std::vector<std::byte>>>;

class Rendezvous {
 public:
  // `gate` may be null (no bound on running threads); it must outlive the rendezvous.
  explicit Rendezvous(int size, RunGate* gate = nullptr);

  // Deposits `bytes` for `rank` in the current round and waits (up to `timeout`)
  // until every rank has deposited; returns all deposits in rank order. On timeout
  // the deposit stays in the round (a late rank still completes it) and the
  // TimeoutError names `what`, the clock (if any) and the ranks missing.
  Deposits exchange(int rank, std::vector<std::byte> bytes, std::chrono::milliseconds timeout, const char* what,
                    std::optional<uint64_t> clock);

 private:
  int size_;
  RunGate* gate_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t round_ = 0;
  int arrived_ = 0;
  std::vector<bool> present_;
  std::vector<std::vector<std::byte>> slots_;
  Deposits published_;
};

// How long an empty mailbox of a gated hub waits for a post before answering nothing.
inline constexpr std::chrono::microseconds kIdleWait{1000};

// One FIFO per receiver: messages from one sender keep their order. A box holds
// nothing until a message comes (P receivers, never P^2 sender-receiver pairs).
class Mailboxes {
 public:
  explicit Mailboxes(int size, RunGate* gate = nullptr)
      : gate_(gate), boxes_(static_cast<size_t>(size)), posted_(gate != nullptr ? static_cast<size_t>(size) : 0) {}
  void post(int to, Message m);
  // The oldest message for `rank`; with a gate, an empty box first waits up to `wait`
  // for a post, outside the gate.
  std::optional<Message> take(int rank, std::chrono::microseconds wait = kIdleWait);

 private:
  RunGate* gate_;
  std::mutex mu_;
  std::vector<std::deque<Message>> boxes_;
  std::vector<std::condition_variable> posted_;  // per receiver, with a gate only
};

class LoopbackHub {
 public:
  // `gate`: bounds the rank threads running at once (null: no bound).
  explicit LoopbackHub(int size, std::shared_ptr<RunGate> gate = nullptr);
  int size() const { return size_; }
  RunGate* gate() const { return gate_.get(); }

  Rendezvous& dataRounds() { return dataRounds_; }
  Rendezvous& controlRounds() { return controlRounds_; }
  Mailboxes& dataMail() { return dataMail_; }
  Mailboxes& controlMail() { return controlMail_; }
  Mailboxes& noteMail() { return noteMail_; }

 private:
  int size_;
  std::shared_ptr<RunGate> gate_;
  Rendezvous dataRounds_;
  Rendezvous controlRounds_;
  Mailboxes dataMail_;
  Mailboxes controlMail_;
  Mailboxes noteMail_;
};

// Exchanges `values` and combines every rank's, in rank order, with `op` into
// `values`: every rank computes the same sequence, so all get bitwise identical results.
template <typename T, typename Op>
void reduceInRankOrder(Rendezvous& rounds, int rank, std::span<T> values, Op op, std::chrono::milliseconds timeout,
                       const char* what, std::optional<uint64_t> clock) {
  const auto* raw = reinterpret_cast<const std::byte*>(values.data());
  const Deposits all = rounds.exchange(rank, {raw, raw + values.size_bytes()}, timeout, what, clock);
  std::vector<T> acc(values.size());
  for (size_t r = 0; r < all->size(); ++r) {
    const auto& part = (*all)[r];
    ORPHEUS_ENFORCE(part.size() == values.size_bytes(), "{}: rank {} contributed {} bytes, expected {}", what, r,
                    part.size(), values.size_bytes());
    const T* theirs = reinterpret_cast<const T*>(part.data());
    for (size_t i = 0; i < values.size(); ++i) acc[i] = r == 0 ? theirs[i] : op(acc[i], theirs[i]);
  }
  std::copy(acc.begin(), acc.end(), values.begin());
}

}  // namespace orpheus::comm::loopback
