#include "engine/base/rng.h"

#include <cmath>
#include <numbers>

namespace orpheus {
namespace {

// SplitMix64 finaliser: a bijective mix with full avalanche.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

CounterRng::CounterRng(uint64_t seed, RngPurpose purpose, uint64_t clock, uint64_t rank)
    : key_(mix(mix(mix(mix(seed) ^ static_cast<uint64_t>(purpose)) ^ clock) ^ rank)) {}

uint64_t CounterRng::nextU64() { return mix(key_ ^ mix(counter_++)); }

double CounterRng::uniform() { return static_cast<double>(nextU64() >> 11) * 0x1.0p-53; }

uint64_t CounterRng::uniformInt(uint64_t n) {
  // Rejection sampling keeps the draw unbiased for any n.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = nextU64();
  } while (x >= limit);
  return x % n;
}

double CounterRng::normal() {
  double u1 = uniform();
  while (u1 <= 0.0) u1 = uniform();
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace orpheus
