#include "engine/base/rng.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

namespace orpheus {
namespace {

std::vector<uint64_t> draw(CounterRng rng, int n) {
  std::vector<uint64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(rng.nextU64());
  return out;
}

}  // namespace

TEST_CASE("CounterRng is deterministic in its key", "[rng]") {
  const auto a = draw(CounterRng(42, RngPurpose::kSample, 7, 3), 64);
  const auto b = draw(CounterRng(42, RngPurpose::kSample, 7, 3), 64);
  CHECK(a == b);

  CounterRng x(42, RngPurpose::kInit, 1, 0);
  CounterRng y(42, RngPurpose::kInit, 1, 0);
  for (int i = 0; i < 100; ++i) {
    CHECK(x.uniform() == y.uniform());
    CHECK(x.normal() == y.normal());
    CHECK(x.uniformInt(1000) == y.uniformInt(1000));
  }
}

TEST_CASE("CounterRng streams differ by seed, purpose, clock and rank", "[rng]") {
  const auto base = draw(CounterRng(42, RngPurpose::kSample, 7, 3), 16);
  CHECK(draw(CounterRng(43, RngPurpose::kSample, 7, 3), 16) != base);
  CHECK(draw(CounterRng(42, RngPurpose::kSelect, 7, 3), 16) != base);
  CHECK(draw(CounterRng(42, RngPurpose::kSample, 8, 3), 16) != base);
  CHECK(draw(CounterRng(42, RngPurpose::kSample, 7, 4), 16) != base);
  // Swapping clock and rank must not give the same stream.
  CHECK(draw(CounterRng(42, RngPurpose::kSample, 3, 7), 16) != base);

  // Successive draws within a stream are distinct.
  std::vector<uint64_t> sorted = base;
  std::sort(sorted.begin(), sorted.end());
  CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
}

TEST_CASE("CounterRng uniform values are in range", "[rng]") {
  CounterRng rng(5, RngPurpose::kTest, 0, 0);
  for (int i = 0; i < 10000; ++i) {
    const double u = rng.uniform();
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    REQUIRE(rng.uniformInt(1) == 0);
    REQUIRE(rng.uniformInt(7) < 7);
    REQUIRE(rng.uniformInt((uint64_t{1} << 63) + 1) <= (uint64_t{1} << 63));
  }
}

TEST_CASE("CounterRng uniformInt is roughly uniform", "[rng]") {
  constexpr uint64_t kBins = 10;
  constexpr int kDraws = 100000;
  CounterRng rng(11, RngPurpose::kTest, 2, 1);
  std::array<int, kBins> counts{};
  for (int i = 0; i < kDraws; ++i) {
    const uint64_t k = rng.uniformInt(kBins);
    REQUIRE(k < kBins);
    ++counts[k];
  }
  const double expected = static_cast<double>(kDraws) / kBins;
  double chi2 = 0.0;
  for (int c : counts) chi2 += (c - expected) * (c - expected) / expected;
  INFO("chi-square " << chi2 << " with " << kBins - 1 << " degrees of freedom");
  // P(chi2_9 > 40) is about 1e-5: loose enough never to flake, tight enough to catch bias.
  CHECK(chi2 < 40.0);
}

TEST_CASE("CounterRng normal has mean 0 and variance 1", "[rng]") {
  constexpr int kDraws = 100000;
  CounterRng rng(13, RngPurpose::kTest, 0, 5);
  double sum = 0.0;
  double sumSq = 0.0;
  for (int i = 0; i < kDraws; ++i) {
    const double x = rng.normal();
    REQUIRE(std::isfinite(x));
    sum += x;
    sumSq += x * x;
  }
  const double mean = sum / kDraws;
  const double variance = sumSq / kDraws - mean * mean;
  // Standard errors are about 0.003 for the mean and 0.0045 for the variance.
  CHECK(std::abs(mean) < 0.02);
  CHECK(std::abs(variance - 1.0) < 0.03);
}

}  // namespace orpheus
