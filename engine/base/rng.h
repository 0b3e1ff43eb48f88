// Counter-based random streams. Every random choice in a job (initialisation,
// minibatch sampling, selection, multicast peers, failure injection) draws from a
// stream keyed by (job seed, purpose, clock, rank), so any rank can recompute any
// other rank's choices and a run is reproducible whatever the thread timing.
#pragma once

#include <cstdint>

namespace orpheus {

enum class RngPurpose : uint64_t {
  kInit = 1,
  kSample = 2,
  kSelect = 3,
  kMulticast = 4,
  kFailure = 5,
  kLinks = 6,
  kData = 7,
  kTest = 99,
};

class CounterRng {
 public:
  CounterRng(uint64_t seed, RngPurpose purpose, uint64_t clock, uint64_t rank);

  uint64_t nextU64();
  // Uniform in [0, 1).
  double uniform();
  // Uniform integer in [0, n); n > 0.
  uint64_t uniformInt(uint64_t n);
  // Standard normal (Box-Muller on two uniforms).
  double normal();

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace orpheus
