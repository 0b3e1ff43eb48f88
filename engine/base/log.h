// Logging through spdlog, one logger per process, prefixed with the rank.
#pragma once

#include <spdlog/spdlog.h>

namespace orpheus {

// Sets the process-wide log pattern "[rank R] level: message" on stderr, and the
// level from a name ("debug", "info", "warn", "error").
void setupLogging(int rank, const std::string& level);

// Limits BLAS to the given number of threads (a no-op without a BLAS).
void setBlasThreads(int threads);
// The threads BLAS runs now: what setBlasThreads asked for, or fewer where the
// library has a lower limit (OpenBLAS's is fixed when it is built); 1 without a BLAS.
int blasThreads();

}  // namespace orpheus
