// How the simulated machine's cores are shared (orpheus simulate --sim-cores,
// --sim-hosts): a worker's measured CPU time is what it took with a core to
// itself; where W workers share C < W cores of a host, each gets C / W of a core
// and its computation takes W / C times as long.
//
// The model assumes every worker of a host wants its core all the time, which is
// what MPI ranks busy-polling for their peers do (the emulated cluster runs P
// processes on one machine). Workers are spread over hosts in contiguous blocks:
// rank r lives on host floor(r * H / P), as `mpirun --map-by slot` fills hosts.
#pragma once

#include <cstdint>
#include <vector>

namespace orpheus::engine::sim {

struct CpuShare {
  int cores = 0;  // per host; 0: every worker has a core of its own
  int hosts = 1;  // the workers are spread over this many hosts

  // Refuses a negative core count or a host count outside 1..ranks (InputError naming the flag).
  void validate(int ranks) const;
  // The host rank `rank` of `ranks` runs on.
  int hostOf(int rank, int ranks) const;
  // The workers on `host`.
  int workersOn(int host, int ranks) const;
  // How much longer than measured rank `rank`'s computation takes: >= 1.
  double slowdown(int rank, int ranks) const;
};

// Workers slower than the rest (--sim-slow FRACTION:FACTOR): round(FRACTION * P) of
// them, at least one when FRACTION > 0, drawn from the job's seed, compute FACTOR
// times as long every clock (on top of any core sharing). Under BSP every worker
// waits for them; under SSP they fall behind up to the staleness bound.
struct Stragglers {
  double fraction = 0.0;
  double factor = 1.0;

  // Refuses a fraction outside [0, 1] or a factor below 1 (InputError naming the flag).
  void validate() const;
  // Each rank's factor: `factor` for the chosen ranks, 1 for the others.
  std::vector<double> factors(int ranks, uint64_t seed) const;
};

}  // namespace orpheus::engine::sim
