// Membership that changes while a job runs (engine/membership/live.h): the
// agreement on a change and the group that follows it. A transport concern, like
// the data and control planes: each backend makes its own groups (comm/factory.h) —
// over MPI a communicator split or a spawn of new processes; over loopback a new
// hub for the ranks that stay, and new rank threads started by the caller.
//
// Contract:
//  - beginMax/finishMax: the elementwise max over the group's ranks of one value
//    per slot (the same length on every rank). beginMax never blocks; at most one
//    is under way; finishMax completes it or throws TimeoutError after `timeout`
//    (the group is then unusable: a late peer may still complete it).
//  - split/grow: collective over the group, right after an agreement every rank
//    completed (so no rank waits long). The group then spans the new ranks; the
//    transport returned is the new group's, with the given timeout. A rank that
//    leaves gets null and its group is spent.
//  - Not thread-safe: the thread that drives the rank's transport drives its group.
#pragma once

#include "comm/transport.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace orpheus::comm {

class LiveGroup {
 public:
  virtual ~LiveGroup() = default;
  virtual void beginMax(std::span<const double> values) = 0;
  virtual bool pending() const = 0;
  virtual std::vector<double> finishMax(std::chrono::milliseconds timeout) = 0;
  // The ranks that stay form the next group (in their old order).
  virtual std::unique_ptr<Transport> split(bool stays, std::chrono::milliseconds timeout) = 0;
  // `ranks` new ranks join, ranked after the group's, marked to join after `clock`.
  virtual std::unique_ptr<Transport> grow(int ranks, uint64_t clock, std::chrono::milliseconds timeout) = 0;
};

// The marker a process-spawning backend puts in a new rank's argv, followed by the
// clock it joins after (the command line takes it as a hidden flag).
inline constexpr const char* kLiveJoinFlag = "--live-join";

}  // namespace orpheus::comm
