#include "engine/failures.h"

#include "engine/base/error.h"
#include "engine/data/synthetic_data.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <time.h>
#include <unistd.h>

namespace orpheus::engine {

// The CLI's exit codes: 0 success, 1 internal failure (a bug, a lost peer),
// 2 bad input or usage, 3 the operating system refused a file operation (a full or
// failing disk). IoError is tested before InputError, its base.
int exitCodeFor(const std::exception& e) {
  if (const auto* failed = dynamic_cast<const JobFailed*>(&e)) return failed->code();
  if (dynamic_cast<const IoError*>(&e) != nullptr) return kExitIoError;
  if (dynamic_cast<const TimeoutError*>(&e) != nullptr) return kExitTimeout;
  return dynamic_cast<const InputError*>(&e) != nullptr ? kExitBadInput : kExitInternal;
}

namespace {

// What the termination handler reads: lock-free atomics, safe in a signal handler.
std::atomic<int> gReportingRank{-1};
std::atomic<uint64_t> gClock{0};
std::atomic<bool> gReported{false};
std::atomic<int64_t> gLastClockNs{0};
std::atomic<int64_t> gStalledAfterNs{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free &&
              std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free);

int64_t monotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

size_t appendText(char* out, size_t n, size_t cap, const char* text) {
  while (*text != '\0' && n < cap) out[n++] = *text++;
  return n;
}

size_t appendDecimal(char* out, size_t n, size_t cap, uint64_t v) {
  char digits[20];
  size_t k = 0;
  do {
    digits[k++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0);
  while (k > 0 && n < cap) out[n++] = digits[--k];
  return n;
}

void onTermination(int sig) {
  const int savedErrno = errno;
  const uint64_t clock = gClock.load();
  const bool stalledItself = clock > 0 && monotonicNs() - gLastClockNs.load() > gStalledAfterNs.load();
  if (gReportingRank.load() == 0 && !stalledItself && !gReported.exchange(true)) {
    char line[160];
    constexpr size_t kCap = sizeof line;
    size_t n = appendText(line, 0, kCap, "orpheus: rank 0 stopped by the launcher at clock ");
    n = appendDecimal(line, n, kCap, clock);
    n = appendText(line, n, kCap, " (a peer died or the job was cancelled)\n");
    static_cast<void>(write(STDERR_FILENO, line, n));
  }
  errno = savedErrno;
  // Die of the signal, as without the handler: the launcher reads the status.
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

void installTerminationReport(int rank, double timeoutSeconds) {
  gStalledAfterNs.store(static_cast<int64_t>(timeoutSeconds * 1e9));
  gLastClockNs.store(monotonicNs());
  gReportingRank.store(rank);
  struct sigaction action {};
  action.sa_handler = onTermination;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
}

void noteClock(uint64_t clock) {
  gLastClockNs.store(monotonicNs());
  gClock.store(clock);
}

uint64_t notedClock() { return gClock.load(); }

void leaveReportToPeer() { gReported.store(true); }

void reportError(const std::string& message) {
  gReported.store(true);
  std::fflush(stdout);
  std::fprintf(stderr, "orpheus: %s\n", printableMessage(message).c_str());
  std::fflush(stderr);
}

void collectively(comm::Transport& transport, const std::function<void()>& step) {
  std::string message;
  int code = 0;
  try {
    step();
  } catch (const std::exception& e) {
    message = e.what();
    code = exitCodeFor(e);
  }
  // One agreement: the lowest failing rank, and the worst code (as the least negative).
  const int size = transport.size();
  double agree[2] = {code != 0 ? static_cast<double>(transport.rank()) : static_cast<double>(size),
                     -static_cast<double>(code)};
  transport.control().min(agree);
  if (agree[0] < size) {
    // One rank reports for the job; the others stay silent from here on, even if the
    // launcher signals them while they exit.
    gReported.store(true);
    if (static_cast<int>(agree[0]) == transport.rank()) reportError(message);
    throw JobFailed(static_cast<int>(-agree[1]));
  }
}

void createDirectories(const std::string& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!ec) return;
  const std::string message = fmt::format("cannot create {}'{}': {}", what, dir, ec.message());
  if (ec == std::errc::not_a_directory || ec == std::errc::file_exists || ec == std::errc::permission_denied ||
      ec == std::errc::read_only_file_system) {
    throw InputError(message);
  }
  throw IoError(message);
}

void checkInputExists(const std::string& flag, const std::string& path) {
  if (path.empty() || isSyntheticSource(path)) return;
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) {
    throw InputError(fmt::format("{}: cannot open: {} (given as {})", path, std::strerror(ENOENT), flag));
  }
  if (std::filesystem::is_directory(status)) {
    throw InputError(fmt::format("{}: cannot read: {} (given as {})", path, std::strerror(EISDIR), flag));
  }
  if (!std::filesystem::is_regular_file(status)) {
    throw InputError(fmt::format("{} '{}' is not a regular file (a device, pipe or socket): inputs are read only "
                                 "from regular files",
                                 flag, path));
  }
}

void checkSmallInput(const std::string& flag, const std::string& path, uintmax_t maxBytes) {
  checkInputExists(flag, path);
  std::error_code ec;
  const uintmax_t bytes = std::filesystem::file_size(path, ec);
  if (!ec && bytes > maxBytes) {
    throw InputError(fmt::format("{} '{}' holds {} bytes, more than the {} MiB such a file may hold", flag, path,
                                 bytes, maxBytes >> 20));
  }
}

}  // namespace orpheus::engine
