// The adaptive-consistency policy (engine/adapt/policy.h) fed a recorded metrics
// history: its decisions, their reasons, the budget and the SV log's knobs record.
#include "engine/adapt/controller.h"
#include "engine/adapt/policy.h"
#include "engine/base/error.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

namespace adapt = orpheus::engine::adapt;

namespace {

std::string dataPath(const std::string& name) {
  const char* root = std::getenv("ORPHEUS_TEST_DATA");
  return std::string(root != nullptr ? root : "tests/data") + "/adapt/" + name;
}

// A small MLP: W1 10x20 and its bias, B = 32.
adapt::ByteModel smallModel() { return adapt::byteModelFor({{10, 20}, {10, 1}}, 32); }

adapt::Bounds smallBounds() {
  adapt::Bounds b;
  b.select = {2, 32};
  b.fanout = {1, 3};
  b.staleness = {0, 4};
  b.averageEvery = {5, 80};
  return b;
}

// The window of clocks (from, to] of a recorded run, as the controller pools it.
adapt::Window windowOf(const adapt::Trace& trace, uint64_t from, uint64_t to) {
  adapt::Window w;
  for (uint64_t c = from + 1; c <= to; ++c) {
    w.computeSeconds += trace.at(c).computeSeconds;
    w.commSeconds += trace.at(c).commSeconds;
    w.waitSeconds += trace.at(c).waitSeconds;
  }
  w.clocks = static_cast<int64_t>(to - from);
  w.computeSeconds /= static_cast<double>(w.clocks);
  w.commSeconds /= static_cast<double>(w.clocks);
  w.waitSeconds /= static_cast<double>(w.clocks);
  return w;
}

struct Step {
  std::string rule;
  adapt::Knobs knobs;
};

std::vector<adapt::Decision> replay(const adapt::Trace& trace, adapt::Knobs knobs, const adapt::Bounds& bounds) {
  std::vector<adapt::Decision> out;
  for (uint64_t end = 10; end <= 90; end += 10) {
    out.push_back(adapt::decide(knobs, windowOf(trace, end - 10, end), bounds, smallModel(), /*ssp=*/true));
    knobs = out.back().knobs;
  }
  return out;
}

}  // namespace

TEST_CASE("the policy's decisions on a recorded history are exact", "[adapt]") {
  const adapt::Trace trace = adapt::Trace::read(dataPath("history.jsonl"));
  REQUIRE(trace.size() == 90);  // the decision and summary lines are not clocks
  const std::vector<adapt::Decision> got = replay(trace, {8, 2, 1, 20}, smallBounds());
  const std::vector<Step> want = {
      {"slack", {16, 2, 1, 20}},  // comm 0.2 of compute: more columns
      {"comm", {8, 2, 1, 20}},    // 0.8: fewer
      {"keep", {8, 2, 1, 20}},    // 0.4: inside [0.25, 0.5]
      {"waits", {8, 2, 2, 20}},   // waits 71% of compute+comm under SSP: run further ahead
      {"comm", {4, 2, 2, 20}},    // 0.9
      {"comm", {2, 2, 2, 20}},
      {"comm", {2, 1, 2, 20}},    // C at its minimum: fewer peers
      {"comm", {2, 1, 2, 40}},    // Q too: average less often
      {"slack", {4, 1, 2, 40}},   // 0.1
  };
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("decision " << i << ": " << got[i].reason);
    CHECK(got[i].rule == want[i].rule);
    CHECK(got[i].knobs == want[i].knobs);
  }
  CHECK(got[1].reason == "comm 0.80 of compute > 0.50: C=16 Q=2 s=1 R=20 -> C=8 Q=2 s=1 R=20");
  CHECK(got[2].reason == "comm 0.40 of compute within [0.25, 0.50]");
  // Deterministic: the same history gives the same lines.
  const std::vector<adapt::Decision> again = replay(trace, {8, 2, 1, 20}, smallBounds());
  for (size_t i = 0; i < got.size(); ++i) CHECK(again[i].reason == got[i].reason);
}

TEST_CASE("under BSP the policy never touches staleness; waits lower the fanout", "[adapt]") {
  const adapt::Trace trace = adapt::Trace::read(dataPath("history.jsonl"));
  adapt::Bounds b = smallBounds();
  b.staleness = {0, 0};
  const adapt::Decision d = adapt::decide({8, 2, 0, 20}, windowOf(trace, 30, 40), b, smallModel(), /*ssp=*/false);
  CHECK(d.rule == "waits");
  CHECK(d.knobs == adapt::Knobs{8, 1, 0, 20});
}

TEST_CASE("replicas drifting apart between averagings raise C", "[adapt]") {
  adapt::Window w;
  w.clocks = 10;
  w.computeSeconds = 0.010;
  w.commSeconds = 0.004;  // inside the band: only divergence speaks
  w.previousDivergence = 0.01;
  w.divergence = 0.02;
  const adapt::Decision d = adapt::decide({8, 2, 0, 20}, w, smallBounds(), smallModel(), false);
  CHECK(d.rule == "diverge");
  CHECK(d.knobs == adapt::Knobs{16, 2, 0, 20});
  w.divergence = 0.012;  // grew, but by less than half
  CHECK(adapt::decide({8, 2, 0, 20}, w, smallBounds(), smallModel(), false).rule == "keep");
}

TEST_CASE("the budget bounds the start and every decision", "[adapt]") {
  const adapt::ByteModel m = smallModel();
  // 64 + 2*32 header bytes, per column 4 + 4*31 + 4*12, per C^2 8; averaging 2*4*210 over R.
  CHECK(m.batchBytes(8) == 128 + 8 * 176 + 64 * 8);
  CHECK(m.perClock({8, 2, 1, 20}) == 2 * 2048 + 1680.0 / 20);
  adapt::Bounds b = smallBounds();
  b.maxBytesPerClock = 3000;
  const adapt::Decision start = adapt::initialKnobs({8, 2, 1, 20}, b, m, true);
  CHECK(start.rule == "budget");
  CHECK(start.knobs == adapt::Knobs{5, 2, 1, 20});  // the largest C under 3000 bytes at Q = 2
  CHECK(start.predictedBytes <= 3000);

  const adapt::Trace trace = adapt::Trace::read(dataPath("history.jsonl"));
  adapt::Knobs knobs = start.knobs;
  for (uint64_t end = 10; end <= 90; end += 10) {
    const adapt::Decision d = adapt::decide(knobs, windowOf(trace, end - 10, end), b, m, true);
    INFO(d.reason);
    CHECK(d.predictedBytes <= 3000);
    CHECK(m.perClock(d.knobs) <= 3000);
    knobs = d.knobs;
  }
  // Slack at the budget: C and Q cannot grow, so s comes down instead.
  const adapt::Decision slack = adapt::decide(start.knobs, windowOf(trace, 0, 10), b, m, true);
  CHECK(slack.rule == "slack");
  CHECK(slack.knobs == adapt::Knobs{5, 2, 0, 20});

  // Measured bytes above the shape prediction correct the model, which then fits again.
  adapt::Window heavy = windowOf(trace, 20, 30);
  heavy.svBytes = 2.0 * 2 * m.batchBytes(5);
  const adapt::Decision corrected = adapt::decide(start.knobs, heavy, b, m, true);
  CHECK(corrected.rule == "budget");
  CHECK(corrected.predictedBytes <= 3000);
  CHECK((corrected.knobs.select > 0 && corrected.knobs.select < 5));
}

TEST_CASE("knobs round-trip through the SV log's record; a bad record is refused", "[adapt]") {
  const adapt::Knobs k{25, 3, 2, 50};
  const auto bytes = adapt::encodeKnobs(k);
  CHECK(adapt::decodeKnobs(bytes) == k);
  auto bad = bytes;
  bad[7] = std::byte{0x80};  // C < 0
  CHECK_THROWS_AS(adapt::decodeKnobs(bad), orpheus::CorruptRecordError);
  CHECK_THROWS_AS(adapt::decodeKnobs(std::span<const std::byte>(bytes).first(8)), orpheus::CorruptRecordError);
}
