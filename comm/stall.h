// Telling a stalled peer from a waiting one once a wait has timed out, so a job
// that stops on a timeout reports one line naming the rank that held it up.
//
// Why it needs its own step: an MPI collective that does not complete does not
// say which rank is missing, and a rank stopped (SIGSTOP) and later woken by the
// launcher finds its own deadline long past and would blame the peers that were
// waiting for it. So (a) deadlines count only the time this process ran (Deadline),
// and (b) a rank whose wait timed out tells every peer so on the control plane's
// note channel and listens for a short grace: the peers it hears from are alive
// and waiting too; the silent ones are stalled or gone (findStalled). The lowest
// rank that timed out reports; the others stay silent and let it end the job.
// Nothing is sent while waits complete: the cost is on the timeout path only.
#pragma once

#include "comm/control.h"
#include "engine/base/error.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace orpheus::comm {

// A gap between two checks of a Deadline longer than this is time the process did
// not run (stopped, suspended): it does not count against the deadline.
inline constexpr std::chrono::milliseconds kSelfStallGap{500};

// A deadline `timeout` of running time away. Check passed() often (at least every
// few milliseconds): the gaps between checks are how it sees this process stalled.
class Deadline {
 public:
  explicit Deadline(std::chrono::milliseconds timeout);
  bool passed();

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point deadline_;
  Clock::time_point last_;
};

// What a rank whose wait timed out found out about its peers.
struct StallVerdict {
  std::vector<int> waiting;  // peers that timed out too: alive
  std::vector<int> silent;   // peers not heard from within the grace: stalled or gone
  bool reports = true;       // no lower rank timed out: this rank reports for the job
};

// How long findStalled listens: a quarter of the timeout, at most 1 s. The peers
// waiting on the same stalled rank time out within this of each other.
std::chrono::milliseconds stallGrace(std::chrono::milliseconds timeout);

// Tells every peer this rank timed out at `clock`, then collects the same note
// from the others until all are heard or stallGrace(control.timeout()) passes.
// A peer that cannot be sent to counts as silent. Call once, after a timeout.
StallVerdict findStalled(ControlPlane& control, int rank, int size, uint64_t clock);

// "rank 1" or "ranks 1, 3".
std::string rankList(const std::vector<int>& ranks);

// The end of a timed-out wait's line: "; stalled or gone: rank 2", or "; every peer
// timed out too" where `sayEveryPeer` (the line then names no rank).
std::string stallSuffix(const StallVerdict& v, bool sayEveryPeer = true);

// A timeout after findStalled: the message names the stalled ranks where any were
// found. reports(): this rank prints the job's line; the others end quietly.
class StallError : public TimeoutError {
 public:
  StallError(const std::string& message, bool reports) : TimeoutError(message), reports_(reports) {}
  bool reports() const { return reports_; }

 private:
  bool reports_;
};

}  // namespace orpheus::comm
