// Sizes read from input (a file header, a feature index, a dimension in a model
// file) are checked against the machine's memory before anything is allocated, so
// a size that cannot fit ends in one InputError that names it, not in
// std::bad_alloc (or the kernel's OOM killer) half-way through a run.
#pragma once

#include "engine/base/error.h"

#include <unistd.h>

#include <cstdint>
#include <string>

namespace orpheus {

// The largest size any input may name (a dimension, a batch, a bound on a knob):
// 2^40, far past any machine's memory, and small enough that a sum or product of two
// such sizes fits int64.
constexpr int64_t kMaxSize = int64_t{1} << 40;

// Physical memory of this machine in bytes; 0 when the system cannot tell.
inline double physicalMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long pageSize = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || pageSize <= 0) return 0.0;
  return static_cast<double>(pages) * static_cast<double>(pageSize);
}

// "3.2 GiB": sizes for messages.
inline std::string formatBytes(double bytes) {
  static const char* const kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 6) {
    bytes /= 1024.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} bytes", bytes) : fmt::format("{:.1f} {}", bytes, kUnits[unit]);
}

// Throws InputError "<what> needs <bytes>, more than <budget> (<why>)" when `bytes`
// exceeds `fraction` of physical memory. Callers compute `bytes` in double so that
// sizes whose product overflows int64 are still refused, not wrapped.
inline void checkFitsInMemory(double bytes, const std::string& what, double fraction = 1.0) {
  const double memory = physicalMemoryBytes();
  if (memory <= 0.0) return;
  const double budget = memory * fraction;
  if (bytes <= budget) return;
  throw InputError(fmt::format("{} needs {}, more than {} ({})", what, formatBytes(bytes), formatBytes(budget),
                               fraction >= 1.0 ? "this machine's memory"
                                               : fmt::format("{:.0f}% of this machine's {} of memory", fraction * 100,
                                                             formatBytes(memory))));
}

}  // namespace orpheus
