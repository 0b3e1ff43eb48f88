#include "engine/sim/cpu_share.h"

#include "engine/base/error.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>

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

void Stragglers::validate() const {
  ORPHEUS_CHECK_INPUT(fraction >= 0.0 && fraction <= 1.0 && factor >= 1.0,
                      "--sim-slow {}:{} must be FRACTION:FACTOR with FRACTION in [0, 1] and FACTOR >= 1", fraction,
                      factor);
}

std::vector<double> Stragglers::factors(int ranks, uint64_t seed) const {
  std::vector<double> out(static_cast<size_t>(ranks), 1.0);
  if (fraction <= 0.0 || ranks < 1) return out;
  const auto count = std::clamp<int64_t>(std::llround(fraction * ranks), 1, ranks);
  std::vector<int> order(static_cast<size_t>(ranks));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 gen(seed ^ 0x5107c0ffee5eedULL);
  // A partial Fisher-Yates shuffle: the first `count` are the chosen.
  for (int64_t i = 0; i < count; ++i) {
    std::uniform_int_distribution<int64_t> pick(i, ranks - 1);
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(pick(gen))]);
    out[static_cast<size_t>(order[static_cast<size_t>(i)])] = factor;
  }
  return out;
}

}  // namespace orpheus::engine::sim
