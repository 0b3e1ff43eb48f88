// The floor every part of a job stands on when something goes wrong: the exit
// codes, a failure reported once and raised on every rank, the line a termination
// by the launcher prints, and the checks on paths a job reads and writes.
#pragma once

#include "comm/transport.h"

#include <cstdint>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>

namespace orpheus::engine {

// Thrown on every rank once a failure has been reported (by one rank, one line),
// so the caller only has to exit with `code`.
class JobFailed : public std::runtime_error {
 public:
  explicit JobFailed(int code) : std::runtime_error("job failed"), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// The CLI's exit codes (besides 0).
constexpr int kExitInternal = 1;  // a bug
constexpr int kExitBadInput = 2;  // bad input or usage
constexpr int kExitIoError = 3;   // the operating system refused a file operation (a full or failing disk)
constexpr int kExitTimeout = 4;   // a peer stalled or is gone: a wait ran past --timeout (--resume continues)

// Exit code for an exception: kExitIoError for IoError, kExitBadInput for other
// InputErrors, kExitTimeout for a TimeoutError, a JobFailed's own code,
// kExitInternal otherwise.
int exitCodeFor(const std::exception& e);

// Prints "orpheus: <message>" as one line on stderr.
void reportError(const std::string& message);

// When the launcher ends the job (SIGTERM: a peer died, or mpirun was signalled),
// rank 0 prints "orpheus: rank 0 stopped by the launcher at clock C (a peer died or
// the job was cancelled)" once, then dies of the signal as before; nothing when it
// reported an error already, or when it was itself stalled (no clock for longer
// than the timeout: it was stopped, and a peer has reported). Other ranks stay
// silent. Install once the rank is known; the handler is async-signal-safe.
void installTerminationReport(int rank, double timeoutSeconds);
// The clock this rank is at, for that line (each clock's start), and as noted last.
void noteClock(uint64_t clock);
uint64_t notedClock();
// Another rank reports the job's failure: this one prints nothing when it ends.
void leaveReportToPeer();

// Runs `step` on every rank (collective: every rank calls it at the same point). If
// it throws anywhere, the lowest failing rank prints its message and every rank
// throws JobFailed with the worst exit code, so a problem on one rank stops the
// whole job with one line and no hang.
void collectively(comm::Transport& transport, const std::function<void()>& step);

// Creates `dir` and its parents; `what` names it in the message ("cannot create
// <what>'<dir>': <reason>"). A path that cannot be a directory (a file in the way)
// or may not be written is the user's choice of path: InputError. Anything else the
// system refuses (a full or failing disk) is an IoError.
void createDirectories(const std::string& dir, const std::string& what);

// A named input file (not a synthetic: source) that does not exist, or is a
// directory, is bad input: InputError in the data readers' words, before a reader
// would report it as a failing file operation. Inputs are regular files: a device
// or a pipe may never end, or never open (`flag` names it in that message).
void checkInputExists(const std::string& flag, const std::string& path);

// A small input read whole (a config file, an --adapt-trace): a regular file of at
// most `maxBytes`, or InputError naming `flag`, the path and the bound.
void checkSmallInput(const std::string& flag, const std::string& path, uintmax_t maxBytes);

}  // namespace orpheus::engine
