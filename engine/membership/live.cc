#include "engine/membership/live.h"

#include "ckpt/durable.h"
#include "ckpt/layout.h"
#include "comm/stall.h"
#include "engine/base/error.h"
#include "engine/membership/elastic.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <fstream>
#include <map>
#include <sstream>

#include <signal.h>
#include <time.h>
#include <unistd.h>

namespace orpheus::engine {

namespace fs = std::filesystem;

namespace {

std::atomic<int64_t> gLeaveNoticeNs{0};
static_assert(std::atomic<int64_t>::is_always_lock_free);

int64_t realtimeNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);  // async-signal-safe
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void onLeaveNotice(int) {
  const int savedErrno = errno;
  int64_t none = 0;
  gLeaveNoticeNs.compare_exchange_strong(none, realtimeNs());
  errno = savedErrno;
}

// DIR's pending request: lines "leave R T" (rank R, told at wall seconds T) and
// "grow N T".
struct Request {
  std::map<int, double> leave;
  int grow = 0;
  double growAt = 0.0;
};

Request readRequest(const fs::path& path) {
  Request out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string verb;
    int n = -1;
    double at = 0.0;
    words >> verb >> n >> at;
    if (!words || (verb != "leave" && verb != "grow") || at <= 0) {
      spdlog::warn("'{}': ignoring the line '{}' (expected 'leave RANK SECONDS' or 'grow N SECONDS')", path.string(),
                   line);
      continue;
    }
    if (verb == "leave") {
      out.leave.emplace(n, at);
    } else {
      out.grow = n;
      out.growAt = at;
    }
  }
  return out;
}

void writeRequest(const fs::path& path, const Request& request) {
  std::string text;
  for (const auto& [r, at] : request.leave) text += fmt::format("leave {} {:.6f}\n", r, at);
  if (request.grow > 0) text += fmt::format("grow {} {:.6f}\n", request.grow, request.growAt);
  ckpt::writeTextDurably(path, text);
}

fs::path livePath(const std::string& dir) { return fs::path(dir) / "live"; }

std::string hostName() {
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  return name;
}

void checkJobDir(const std::string& dir) {
  std::error_code ec;
  ORPHEUS_CHECK_INPUT(fs::exists(ckpt::jobPath(dir), ec),
                      "ctl: '{}' holds no job checkpoint (no job.h5): give the running job's --ckpt-dir{}", dir,
                      ckpt::jobFileHint(dir));
}

// A job runs in `dir` and reads membership requests (checked last: a request that
// is wrong in itself says so first).
void checkRunning(const std::string& dir) {
  std::ifstream in(livePath(dir));
  ORPHEUS_CHECK_INPUT(static_cast<bool>(in),
                      "ctl: no job is running in '{}' (it finished, or it takes no membership requests: that needs "
                      "--ckpt sv, --sync sv, bsp, 2 or more ranks and no --balance); nothing requested",
                      dir);
  long pid = 0;
  std::string host;
  in >> pid >> host;
  ORPHEUS_CHECK_INPUT(host != hostName() || pid <= 0 || kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM,
                      "ctl: no job is running in '{}' (its rank 0, pid {} on this host, is gone); nothing requested",
                      dir, pid);
}

}  // namespace

void installLeaveNotice() {
  struct sigaction action {};
  action.sa_handler = onLeaveNotice;
  action.sa_flags = SA_RESTART;  // the rank goes on to the clock boundary: no call fails with EINTR
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
}

double leaveNoticeTime() { return static_cast<double>(gLeaveNoticeNs.load()) * 1e-9; }

double wallSeconds() { return static_cast<double>(realtimeNs()) * 1e-9; }

fs::path membershipRequestPath(const std::string& dir) { return fs::path(dir) / "membership-request"; }

void markLive(const std::string& dir) {
  ckpt::writeTextDurably(livePath(dir), fmt::format("{} {}\n", static_cast<long>(getpid()), hostName()));
}

void dropLive(const std::string& dir) {
  std::error_code ec;
  fs::remove(livePath(dir), ec);
}

void endLive(const std::string& dir) {
  std::error_code ec;
  fs::remove(livePath(dir), ec);
  if (fs::remove(membershipRequestPath(dir), ec)) {
    spdlog::warn("a membership request for '{}' came after the job's last clock: dropped", dir);
  }
}

std::vector<int> requestShrink(const std::string& dir, const std::vector<int>& ranks) {
  checkJobDir(dir);
  const int members = readMembership(dir).back().ranks;
  const fs::path path = membershipRequestPath(dir);
  Request all = readRequest(path);
  std::map<int, double>& request = all.leave;
  const double now = wallSeconds();
  for (int r : ranks) {
    ORPHEUS_CHECK_INPUT(r >= 0 && r < members, "ctl shrink: rank {} is not a rank of the job (ranks 0..{})", r,
                        members - 1);
    request.emplace(r, now);
  }
  // Rank 0 stays, so at least one rank does.
  ORPHEUS_CHECK_INPUT(!request.contains(0), "ctl shrink: rank 0 writes the job's outputs and cannot leave");
  checkRunning(dir);
  writeRequest(path, all);
  std::vector<int> out;
  for (const auto& [r, at] : request) out.push_back(r);
  return out;
}

void requestGrow(const std::string& dir, int ranks) {
  checkJobDir(dir);
  ORPHEUS_CHECK_INPUT(ranks >= 1 && ranks <= kMaxJoining, "ctl grow: expected 1 to {} new ranks, got {}", kMaxJoining,
                      ranks);
  const fs::path path = membershipRequestPath(dir);
  Request all = readRequest(path);
  all.grow = ranks;
  all.growAt = wallSeconds();
  checkRunning(dir);
  writeRequest(path, all);
}

std::unique_ptr<comm::Transport> regroup(comm::Transport& group, LiveGroup& live, const Change& change, uint64_t clock,
                                         double* growSeconds) {
  if (growSeconds != nullptr) *growSeconds = 0.0;
  std::unique_ptr<comm::Transport> next;
  if (!change.leaving.empty()) {
    const bool stays = !change.leaves(group.rank());
    next = live.split(stays, group.timeout());
    if (!stays) return nullptr;
  }
  if (change.joining > 0) {
    const auto start = std::chrono::steady_clock::now();
    next = live.grow(change.joining, clock, group.timeout());
    if (growSeconds != nullptr) {
      *growSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  }
  return next;
}

MembershipWatch::MembershipWatch(LiveGroup& group, comm::Transport& transport, std::string dir,
                                 std::chrono::milliseconds timeout)
    : group_(group),
      transport_(transport),
      rank_(transport.rank()),
      size_(transport.size()),
      dir_(std::move(dir)),
      timeout_(timeout),
      notices_(static_cast<size_t>(transport.size()) + 1, 0.0) {}

std::vector<double> MembershipWatch::finish(uint64_t clock) {
  try {
    return group_.finishMax(timeout_);
  } catch (const TimeoutError&) {
    // As a collective of the data plane: the peers that timed out too stay silent.
    const comm::StallVerdict v = comm::findStalled(transport_.control(), rank_, size_, clock);
    std::string message = fmt::format("rank {}: the membership agreement at clock {} did not complete within {} s",
                                      rank_, clock, timeout_.count() / 1000.0);
    throw comm::StallError(message + comm::stallSuffix(v, false), v.reports);
  }
}

bool MembershipWatch::changesAfter(uint64_t clock) {
  if (group_.pending()) {
    const std::vector<double> agreed = finish(clock);
    if (std::any_of(agreed.begin(), agreed.end(), [](double t) { return t > 0; })) {
      change_.noticeAt.assign(agreed.begin(), agreed.begin() + size_);
      for (int r = 0; r < size_; ++r) {
        if (agreed[static_cast<size_t>(r)] > 0) change_.leaving.push_back(r);
      }
      change_.joining = static_cast<int>(agreed.back());
      return true;
    }
  }
  if (rank_ == 0) {
    pollRequest();
  } else if (const double t = leaveNoticeTime(); t > 0) {
    notices_[static_cast<size_t>(rank_)] = t;
  }
  group_.beginMax(notices_);
  return false;
}

void MembershipWatch::settle() {
  if (group_.pending()) group_.finishMax(timeout_);
}

void MembershipWatch::pollRequest() {
  const fs::path path = membershipRequestPath(dir_);
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  Request request = readRequest(path);
  // The bound ctl keeps, for a request written by other means.
  if (request.grow > kMaxJoining) {
    spdlog::warn("membership request: {} ranks to join, more than {} at once; ignored", request.grow, kMaxJoining);
    request.grow = 0;
  }
  notices_.back() = std::max(notices_.back(), static_cast<double>(request.grow));
  for (const auto& [r, at] : request.leave) {
    if (r <= 0 || r >= size_) {
      spdlog::warn("membership request: rank {} cannot leave a job of {} ranks (rank 0 stays); ignored", r, size_);
      continue;
    }
    double& notice = notices_[static_cast<size_t>(r)];
    notice = notice > 0 ? std::min(notice, at) : at;
  }
  fs::remove(path, ec);
}

}  // namespace orpheus::engine
