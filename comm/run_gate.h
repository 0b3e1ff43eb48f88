// How many rank threads of one loopback job may run at once (part of comm's
// interface: comm/factory.h makes loopback groups that share a gate). A simulation puts
// hundreds of ranks in one process as threads; without a bound every woken rank
// would compute (and allocate its clock's buffers) at the same time. With a gate,
// a rank thread holds one of `capacity` places while it runs and gives it up
// while it waits for peers (a rendezvous, an empty mailbox), so at most `capacity`
// threads do work at any time and the waiting ones cost no CPU.
//
// Contract: a rank thread calls enter() before its first transport call and
// leave() after its last; the hub leaves and re-enters around every wait. Places
// are handed on in FIFO order, so no rank starves. Thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>

namespace orpheus::comm {

class RunGate {
 public:
  // capacity >= 1: the threads that may run at once.
  explicit RunGate(int capacity);

  void enter();
  void leave();
  // Gives the place to the longest waiting thread, if any, and queues for it again.
  void yield();
  int capacity() const { return capacity_; }

 private:
  struct Waiter {
    std::condition_variable cv;
    bool granted = false;
  };
  void enterLocked(std::unique_lock<std::mutex>& lock);
  void leaveLocked();

  std::mutex mu_;
  int capacity_;
  int running_ = 0;
  std::deque<Waiter*> waiting_;
};

// Leaves the gate (when there is one) for the scope: the wait inside costs no place.
class GateReleased {
 public:
  explicit GateReleased(RunGate* gate) : gate_(gate) {
    if (gate_ != nullptr) gate_->leave();
  }
  ~GateReleased() {
    if (gate_ != nullptr) gate_->enter();
  }
  GateReleased(const GateReleased&) = delete;
  GateReleased& operator=(const GateReleased&) = delete;

 private:
  RunGate* gate_;
};

}  // namespace orpheus::comm
