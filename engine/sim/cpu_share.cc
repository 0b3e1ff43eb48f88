#include "engine/sim/cpu_share.h"

#include "engine/base/error.h"

#include <algorithm>
#include <cstdint>

namespace orpheus::engine::sim {

void CpuShare::validate(int ranks) const {
  ORPHEUS_CHECK_INPUT(cores >= 0, "--sim-cores {} must not be negative (0: a core per worker)", cores);
  ORPHEUS_CHECK_INPUT(hosts >= 1 && hosts <= ranks, "--sim-hosts {} must be between 1 and the {} workers", hosts,
                      ranks);
}

int CpuShare::hostOf(int rank, int ranks) const {
  return static_cast<int>(static_cast<int64_t>(rank) * hosts / ranks);
}

int CpuShare::workersOn(int host, int ranks) const {
  // Ranks r with floor(r * H / P) == host: r in [ceil(host * P / H), ceil((host + 1) * P / H)).
  const auto first = [&](int64_t h) { return (h * ranks + hosts - 1) / hosts; };
  return static_cast<int>(first(host + 1) - first(host));
}

double CpuShare::slowdown(int rank, int ranks) const {
  if (cores == 0) return 1.0;
  const int workers = workersOn(hostOf(rank, ranks), ranks);
  return std::max(1.0, static_cast<double>(workers) / cores);
}

}  // namespace orpheus::engine::sim
