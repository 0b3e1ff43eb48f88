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

}  // namespace orpheus::engine::sim
