#include "comm/run_gate.h"

#include "engine/base/error.h"

namespace orpheus::comm {

RunGate::RunGate(int capacity) : capacity_(capacity) {
  ORPHEUS_ENFORCE(capacity >= 1, "a run gate needs room for at least one thread, got {}", capacity);
}

void RunGate::enter() {
  std::unique_lock lock(mu_);
  enterLocked(lock);
}

void RunGate::enterLocked(std::unique_lock<std::mutex>& lock) {
  if (running_ < capacity_ && waiting_.empty()) {
    ++running_;
    return;
  }
  Waiter me;
  waiting_.push_back(&me);
  me.cv.wait(lock, [&] { return me.granted; });
  // The leaving thread handed its place on: running_ already counts this one.
}

void RunGate::leaveLocked() {
  if (!waiting_.empty()) {
    Waiter* next = waiting_.front();
    waiting_.pop_front();
    next->granted = true;
    next->cv.notify_one();
    return;
  }
  --running_;
}

void RunGate::leave() {
  std::lock_guard lock(mu_);
  leaveLocked();
}

void RunGate::yield() {
  std::unique_lock lock(mu_);
  if (waiting_.empty()) return;
  leaveLocked();
  enterLocked(lock);
}

}  // namespace orpheus::comm
