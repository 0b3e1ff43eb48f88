// Error types shared by every library. The CLI maps them to exit codes:
// IoError -> 3, InputError (and its other subclasses) -> 2, everything else -> 1.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace orpheus {

// `message` as one line a terminal shows as it is: bytes that are not printable
// UTF-8 (controls, invalid sequences, a file's binary contents quoted in a message)
// become \xNN, and a message longer than `maxBytes` is cut, ending in "...".
std::string printableMessage(const std::string& message, size_t maxBytes = 1000);

// An internal invariant failed: a bug, not the user's fault. The message is kept
// printable (printableMessage, uncut): what() is a C string, and a NUL that a file's
// bytes put in it would end the message there.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(printableMessage(message, std::string::npos)) {}
  explicit Error(const char* message) : Error(std::string(message)) {}
};

// Bad input from the user: flags, data files, model files, parameter files.
class InputError : public Error {
 public:
  using Error::Error;
};

// A record (SV batch, log segment) failed validation. The message names the
// sender and clock it claimed or was expected to have.
class CorruptRecordError : public InputError {
 public:
  using InputError::InputError;
};

// A wait ran past its deadline. The message names the peer and clock.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The operating system refused a file operation on a path that should work: a
// full or failing disk, an IO error (exit 3). A path that names nothing readable
// (missing, a directory, no permission) is the user's input: InputError.
class IoError : public Error {
 public:
  using Error::Error;
};

// Throws for a failed open or read of `path`: InputError when `err` says the path
// itself is wrong (ENOENT, EACCES, EISDIR, ENOTDIR, ELOOP, ENAMETOOLONG), IoError
// otherwise. The message is "<path>: <what>: <strerror(err)>".
[[noreturn]] void throwFileError(const std::string& path, const char* what, int err);

namespace detail {
[[noreturn]] void throwEnforce(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace orpheus

// Checks an internal invariant; on failure throws orpheus::Error naming file and line.
#define ORPHEUS_ENFORCE(cond, ...)                                                        \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      ::orpheus::detail::throwEnforce(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
    }                                                                                     \
  } while (0)

// Checks user input; on failure throws orpheus::InputError with the message only.
#define ORPHEUS_CHECK_INPUT(cond, ...)                              \
  do {                                                              \
    if (!(cond)) {                                                  \
      throw ::orpheus::InputError(fmt::format(__VA_ARGS__));        \
    }                                                               \
  } while (0)
