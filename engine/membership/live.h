// Live elasticity: ranks leave (or join) a running job at a clock boundary, as a
// membership epoch change (engine/membership/elastic.h) made without a restart.
//
// Notices. A rank other than 0 is told to leave by SIGTERM (a preemption notice:
// the handler only records the time), or rank 0 finds `orpheus ctl DIR shrink R..`'s
// request file in --ckpt-dir (written atomically, tmp + rename; rank 0 looks for it
// once per clock, one stat). Rank 0 writes the job's outputs and never leaves.
// `orpheus ctl DIR grow N` asks for N new ranks: the group spawns them (MPI_Comm_spawn
// of this program) at the change, and they start from the new epoch's average as
// the P' > P restart does.
//
// Agreement, without a blocking collective per clock. At the end of every clock c
// each rank begins a nonblocking max over the group of one value per rank (slot r:
// the wall time of rank r's notice, 0: none) and completes the one it began at the
// end of clock c-1. Under BSP every rank ended clock c-1 before any rank could end
// clock c, so that completion does not wait; it is bounded by the timeout all the
// same. Every rank gets the same maxima, so when any slot is set, every rank takes
// the change at the same clock C = c (the end of the job, config.clocks or the
// target, goes first: the job simply ends).
//
// The change at C, one step at the clock boundary (engine/job/job.cc, runTrain): every
// rank drains clock C and makes its log durable up to C (Worker::run returns); the
// leaving ranks free their replica, data and buffers; one agreement over the old
// group then carries each leaver's release latency (notice -> freed) to rank 0 and
// tells every rank the logs are on disk; the ranks that stay form a new group (a
// new transport over a split communicator) and continue exactly as `train --resume
// --elastic` does on that many ranks: redistribute() (every replica of the new
// epoch the average of the old ones at C, read from the log, so bitwise what
// restore gives), the data resharded (reread), rank 0 appends the membership line.
// Live elasticity needs --ckpt sv, --consistency bsp and more than one rank; other
// jobs never begin an agreement and run as before.
#pragma once

#include "comm/live_group.h"
#include "comm/transport.h"
#include "engine/worker/membership_check.h"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace orpheus::engine {

// The backend's part of a live change, the agreement and the new group, is the
// transport's (comm/live_group.h; comm/factory.h makes it).
using comm::LiveGroup;

// SIGTERM on this rank becomes a leave notice (the handler stores the time only).
void installLeaveNotice();
// Wall time (seconds since the epoch) of this rank's SIGTERM notice; 0: none.
double leaveNoticeTime();
double wallSeconds();

// DIR's request file of `orpheus ctl`.
std::filesystem::path membershipRequestPath(const std::string& dir);

// A job that takes membership requests marks DIR while it runs (rank 0's pid and
// host in DIR/live), so `ctl` can refuse a request no job will read. markLive at
// the start; endLive at the end, which also drops a request that came too late
// (said on the console); dropLive when the job fails (the request, if any, stays
// beside the checkpoint for the resumed job to drop with a warning).
void markLive(const std::string& dir);
void endLive(const std::string& dir);
void dropLive(const std::string& dir);

// `orpheus ctl DIR shrink R [R...]`: checks the request against the job's current
// membership (InputError: no checkpoint, no job running there, an unknown rank,
// rank 0, no rank left) and writes it, merged with one still pending. Returns the ranks requested to leave.
std::vector<int> requestShrink(const std::string& dir, const std::vector<int>& ranks);
// `orpheus ctl DIR grow N`: N new ranks join the job at its next clock (InputError:
// no checkpoint, no job running there, N < 1 or more than kMaxJoining).
inline constexpr int kMaxJoining = 64;
void requestGrow(const std::string& dir, int ranks);

// A change: the ranks that leave, when each was told (wall seconds), and how many
// new ranks join (after the leavers are gone).
struct Change {
  std::vector<int> leaving;
  std::vector<double> noticeAt;  // per rank of the group; 0: stays
  int joining = 0;
  bool leaves(int rank) const { return noticeAt[static_cast<size_t>(rank)] > 0; }
};

// The group after `change` at `clock` (collective over `group`, right after every
// rank agreed on the change): the ranks that stay split off in their order, then
// `change.joining` new ranks join, ranked after them (the live job spawns them, the
// simulator starts them as threads). Null on a rank that leaves. `growSeconds`,
// where given: how long the grow took (0: none).
std::unique_ptr<comm::Transport> regroup(comm::Transport& group, LiveGroup& live, const Change& change, uint64_t clock,
                                         double* growSeconds = nullptr);

// One rank's side of the agreement, driven by the worker at each clock's end.
class MembershipWatch final : public MembershipCheck {
 public:
  // `group` spans the ranks of `transport`; `dir`: the job's --ckpt-dir.
  MembershipWatch(LiveGroup& group, comm::Transport& transport, std::string dir,
                  std::chrono::milliseconds timeout);
  // Completes the previous clock's agreement and begins this one's. True when the
  // membership changes after `clock` (the same on every rank); then none is under way.
  // comm::StallError when a peer does not take part within the timeout.
  bool changesAfter(uint64_t clock) override;
  // The job ends: completes the agreement under way, if any (collective).
  void settle();
  const Change& change() const { return change_; }

 private:
  void pollRequest();
  std::vector<double> finish(uint64_t clock);

  LiveGroup& group_;
  comm::Transport& transport_;
  int rank_;
  int size_;
  std::string dir_;
  std::chrono::milliseconds timeout_;
  std::vector<double> notices_;  // this rank's contribution: a notice time per rank, then the ranks to add
  Change change_;
};

}  // namespace orpheus::engine
