// The adaptive-consistency policy (engine/adapt/policy.h) fed a recorded metrics
// history: its decisions, their reasons, the budget and the SV log's knobs record.
#include "engine/adapt/controller.h"
#include "engine/adapt/policy.h"
#include "engine/base/error.h"

#include <catch2/catch.hpp>

#include <array>
#include <cstdlib>
#include <iterator>
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

// e(c) of a small batch of B = 32: what the goodput rule reads from a window.
double smallError(int64_t c) {
  const double at[][2] = {{0, 1.0}, {2, 0.7}, {4, 0.5}, {8, 0.3}, {16, 0.1}, {32, 0.0}};
  for (size_t i = 1; i < std::size(at); ++i) {
    if (static_cast<double>(c) <= at[i][0]) {
      const double f = (static_cast<double>(c) - at[i - 1][0]) / (at[i][0] - at[i - 1][0]);
      return at[i - 1][1] + f * (at[i][1] - at[i - 1][1]);
    }
  }
  return 0.0;
}

// The errors a window holds under `knobs`, from `error`.
template <typename Error>
std::array<double, 3> errorsAt(const adapt::Knobs& knobs, const adapt::Bounds& bounds, int64_t batch, Error error) {
  const std::array<int64_t, 3> counts = adapt::errorCounts(knobs, bounds, batch);
  return {error(counts[0]), error(counts[1]), error(counts[2])};
}

// The window of clocks (from, to] of a recorded run, as the controller pools it.
adapt::Window windowOf(const adapt::Trace& trace, uint64_t from, uint64_t to) {
  adapt::Window w;
  for (uint64_t c = from + 1; c <= to; ++c) {
    w.computeSeconds += trace.at(c).computeSeconds;
    w.commSeconds += trace.at(c).commSeconds;
    w.waitSeconds += trace.at(c).waitSeconds;
    w.clockSeconds += trace.at(c).clockSeconds;
    w.selectSeconds += trace.at(c).selectSeconds;
  }
  w.clocks = static_cast<int64_t>(to - from);
  const auto n = static_cast<double>(w.clocks);
  w.computeSeconds /= n;
  w.commSeconds /= n;
  w.waitSeconds /= n;
  w.clockSeconds /= n;
  w.selectSeconds /= n;
  return w;
}

struct Step {
  std::string rule;
  adapt::Knobs knobs;
};

std::vector<adapt::Decision> replay(const adapt::Trace& trace, adapt::Knobs knobs, const adapt::Bounds& bounds) {
  std::vector<adapt::Decision> out;
  for (uint64_t end = 10; end <= 90; end += 10) {
    adapt::Window w = windowOf(trace, end - 10, end);
    w.errors = errorsAt(knobs, bounds, 32, smallError);
    out.push_back(adapt::decide(knobs, w, bounds, smallModel(), /*ssp=*/true));
    knobs = out.back().knobs;
  }
  return out;
}

// The adapt bench's job: the 784-2048-2048-10 MLP, B = 100, np 4, Q = 3.
adapt::ByteModel mlpModel() {
  return adapt::byteModelFor({{2048, 784}, {2048, 1}, {2048, 2048}, {2048, 1}, {10, 2048}, {10, 1}}, 100);
}

adapt::Bounds mlpBounds() {
  adapt::Bounds b;
  b.select = {1, 100};
  b.fanout = {3, 3};
  b.staleness = {0, 0};
  b.averageEvery = {0, 0};
  return b;
}

// e(c) of that MLP's updates (scripts/bench/results/selection_error.md: C = 5, 10,
// 25, 50), linear in between.
double mlpError(int64_t c) {
  const double at[][2] = {{0, 1.0}, {5, 0.65}, {10, 0.51}, {25, 0.23}, {50, 0.05}, {100, 0.0}};
  for (size_t i = 1; i < std::size(at); ++i) {
    if (static_cast<double>(c) <= at[i][0]) {
      const double f = (static_cast<double>(c) - at[i - 1][0]) / (at[i][0] - at[i - 1][0]);
      return at[i - 1][1] + f * (at[i][1] - at[i - 1][1]);
    }
  }
  return 0.0;
}

// A window of that job under broadcast BSP at C, from its measured facts: with all
// sent, `rest` seconds of forward/backward and rebuild and `commAll` of exposed comm
// per clock; a selection costs 0.36 ms per SVG; comm scales with the bytes.
adapt::Window mlpWindow(int64_t select, double rest, double commAll) {
  const adapt::ByteModel m = mlpModel();
  const int64_t c = select == 0 ? 100 : select;
  adapt::Window w;
  w.clocks = 25;
  w.selectSeconds = c < 100 ? 0.00036 * static_cast<double>(c) : 0.0;
  w.commSeconds = commAll * m.batchBytes(select) / m.batchBytes(0);
  w.computeSeconds = 0.032 + w.selectSeconds;
  w.clockSeconds = rest + w.selectSeconds + w.commSeconds;
  w.errors = errorsAt({select, 3, 0, 0}, mlpBounds(), 100, mlpError);
  w.measureSeconds = c < 100 ? 0.0 : 0.00036 * 50;  // the probe at B/2
  return w;
}

std::vector<int64_t> mlpSelections(double rest, double commAll, std::vector<std::string>* reasons = nullptr) {
  adapt::Knobs knobs{0, 3, 0, 0};
  std::vector<int64_t> out;
  for (int i = 0; i < 6; ++i) {
    const adapt::Decision d =
        adapt::decide(knobs, mlpWindow(knobs.select, rest, commAll), mlpBounds(), mlpModel(), false);
    if (reasons != nullptr) reasons->push_back(d.reason);
    knobs = d.knobs;
    out.push_back(knobs.select);
  }
  return out;
}

}  // namespace

TEST_CASE("goodput on the MLP's measured facts: 1 Gbit/s sends fewer SVGs, 10 Gbit/s all", "[adapt]") {
  // All sent: 242 ms a clock at 1 Gbit/s, 137 of them exposed comm; 145 ms at 10 Gbit/s, 27 of comm.
  std::vector<std::string> reasons;
  const std::vector<int64_t> slow = mlpSelections(0.105, 0.137, &reasons);
  INFO(reasons[0] << " | " << reasons[1] << " | " << reasons.back());
  CHECK(reasons[0] == "goodput C=50 0.95/193ms > C=all 1.00/242ms: C=all Q=3 s=0 R=0 -> C=50 Q=3 s=0 R=0");
  CHECK(slow == std::vector<int64_t>{50, 25, 25, 25, 25, 25});
  CHECK(reasons.back().rfind("comm", 0) == 0);
  CHECK(reasons.back().find("goodput holds C=25 0.77/149ms (C=12 0.53/126ms, C=50 0.89/193ms)") !=
        std::string::npos);

  reasons.clear();
  const std::vector<int64_t> fast = mlpSelections(0.118, 0.027, &reasons);
  INFO(reasons[0]);
  CHECK(fast == std::vector<int64_t>(6, 0));
  CHECK(reasons[0].find("goodput holds C=all 1.00/145ms (C=50 0.95/150ms)") != std::string::npos);
}

TEST_CASE("on the recorded adapt run, goodput moves C first and waits then raise s", "[adapt]") {
  // The 1 Gbit/s --adapt run of the bench (SSP, s = 0, random multicast Q = 3,
  // averaging every 50), means of rank 0's clocks 1-25 (C = all) and 26-50 (C = 50).
  adapt::Bounds b = mlpBounds();
  b.staleness = {0, 8};
  b.averageEvery = {12, 200};
  adapt::Window first;
  first.clocks = 25;
  first.computeSeconds = 0.0402;
  first.commSeconds = 0.1382;
  first.waitSeconds = 0.0778;
  first.clockSeconds = 0.3371;
  first.errors = errorsAt({0, 3, 0, 50}, b, 100, mlpError);
  first.measureSeconds = 0.018;
  const adapt::Decision d1 = adapt::decide({0, 3, 0, 50}, first, b, mlpModel(), /*ssp=*/true);
  INFO(d1.reason);
  CHECK(d1.rule == "goodput");
  CHECK(d1.knobs == adapt::Knobs{50, 3, 0, 50});

  adapt::Window second;
  second.clocks = 25;
  second.computeSeconds = 0.0578;
  second.commSeconds = 0.0848;
  second.waitSeconds = 0.0432;  // 23% of compute + comm + wait
  second.clockSeconds = 0.2707;
  second.selectSeconds = 0.0179;
  second.errors = errorsAt(d1.knobs, b, 100, mlpError);
  const adapt::Decision d2 = adapt::decide(d1.knobs, second, b, mlpModel(), /*ssp=*/true);
  INFO(d2.reason);
  CHECK(d2.rule == "waits");
  CHECK(d2.knobs == adapt::Knobs{50, 3, 1, 50});
  CHECK(d2.reason == "waits 23% of compute+comm+wait, raise s: C=50 Q=3 s=0 R=50 -> C=50 Q=3 s=1 R=50");
  // Without the measured errors, waits speak at once.
  first.errors = {-1.0, -1.0, -1.0};
  const adapt::Decision unmeasured = adapt::decide({0, 3, 0, 50}, first, b, mlpModel(), /*ssp=*/true);
  CHECK(unmeasured.rule == "waits");
  CHECK(unmeasured.knobs == adapt::Knobs{0, 3, 1, 50});
  // Waits of a sixth (the hand-tuned s = 4 run waits 5%) are left alone.
  second.waitSeconds = 0.0285;
  CHECK(adapt::decide(d1.knobs, second, b, mlpModel(), true).rule == "keep");
}

TEST_CASE("goodput extrapolates e(2C), wants a 5% gain, and is silent unmeasured", "[adapt]") {
  const adapt::Bounds b = smallBounds();
  adapt::Window w;
  w.clocks = 10;
  w.computeSeconds = 0.020;
  w.commSeconds = 0.001;  // cheap: 2.4 times the bytes at C = 16 cost 1.4 ms more
  w.clockSeconds = 0.021;
  // e(4) 0.5, e(8) 0.3: e(16) is taken as 0.3 * max(1/2, 0.3/0.5) = 0.18.
  w.errors = {0.5, 0.5, 0.3};
  const adapt::Decision up = adapt::decide({8, 2, 1, 20}, w, b, smallModel(), true);
  INFO(up.reason);
  CHECK(up.rule == "goodput");
  CHECK(up.knobs == adapt::Knobs{16, 2, 1, 20});
  CHECK(up.reason == "goodput C=16 0.82/22ms > C=8 0.70/21ms: C=8 Q=2 s=1 R=20 -> C=16 Q=2 s=1 R=20");

  // Dear comm (0.4 of compute, no slack) and little left to gain: C stays.
  w.computeSeconds = 0.010;
  w.commSeconds = 0.004;
  w.clockSeconds = 0.014;
  w.errors = {0.3, 0.3, 0.02};
  const adapt::Decision held = adapt::decide({8, 2, 1, 20}, w, b, smallModel(), true);
  INFO(held.reason);
  CHECK(held.rule == "keep");
  CHECK(held.reason.find("goodput holds C=8 0.98/14ms (C=4 0.70/12ms, C=16 0.99/20ms)") != std::string::npos);
  // The same errors with a smaller C nearly as good: C halves.
  w.errors = {0.04, 0.04, 0.02};
  CHECK(adapt::decide({8, 2, 1, 20}, w, b, smallModel(), true).knobs == adapt::Knobs{4, 2, 1, 20});

  // A gain just under the margin does not move; just over it does.
  w.commSeconds = 0.0;
  w.clockSeconds = 0.010;
  w.errors = {0.5, 0.5, 0.0476};  // C=16 predicted 0.9762 against 0.9524: 2.5%
  CHECK(adapt::decide({8, 2, 1, 20}, w, b, smallModel(), true).rule != "goodput");
  w.errors = {0.5, 0.5, 0.1};  // 0.95 against 0.90: 5.6%
  CHECK(adapt::decide({8, 2, 1, 20}, w, b, smallModel(), true).rule == "goodput");

  // Nothing measured (uniform selection, dense sync): the rule says nothing.
  w.errors = {-1.0, -1.0, -1.0};
  CHECK(adapt::decide({8, 2, 1, 20}, w, b, smallModel(), true).rule != "goodput");

  // C = 1 keeps 1 - e(1) of the update; e(0) = 1 lets e(2) be extrapolated, and C grows.
  adapt::Bounds one = b;
  one.select = {1, 32};
  CHECK(adapt::errorCounts({1, 2, 1, 20}, one, 32) == std::array<int64_t, 3>{1, 0, 1});
  w.commSeconds = 0.004;
  w.clockSeconds = 0.014;
  w.errors = {0.9, 1.0, 0.9};
  const adapt::Decision grow = adapt::decide({1, 2, 1, 20}, w, one, smallModel(), true);
  INFO(grow.reason);
  CHECK(grow.knobs == adapt::Knobs{2, 2, 1, 20});
  // At the lower bound there is no smaller candidate; all B is the top one, e = 0.
  CHECK(adapt::errorCounts({2, 2, 1, 20}, b, 32) == std::array<int64_t, 3>{2, 1, 2});
  CHECK(adapt::errorCounts({0, 2, 1, 20}, b, 32) == std::array<int64_t, 3>{16, 16, 32});
}

TEST_CASE("the policy's decisions on a recorded history are exact", "[adapt]") {
  const adapt::Trace trace = adapt::Trace::read(dataPath("history.jsonl"));
  REQUIRE(trace.size() == 90);  // the decision and summary lines are not clocks
  CHECK(trace.at(1).clockSeconds == 0.012);
  const std::vector<adapt::Decision> got = replay(trace, {8, 2, 1, 20}, smallBounds());
  const std::vector<Step> want = {
      {"slack", {8, 3, 1, 20}},  // comm 0.2 of compute: one more peer
      {"keep", {8, 3, 1, 20}},   // comm 0.8: goodput holds C = 8 (C = 4 loses more than it saves)
      {"keep", {8, 3, 1, 20}},   // 0.4
      {"waits", {8, 3, 2, 20}},  // waits 42% of compute+comm+wait under SSP: run further ahead
      {"keep", {8, 3, 2, 20}},   // 0.9: C = 4 at 0.50/14ms against 0.70/19ms
      {"keep", {8, 3, 2, 20}},
      {"keep", {8, 3, 2, 20}},
      {"keep", {8, 3, 2, 20}},
      {"slack", {8, 3, 2, 10}},  // 0.1, Q at its bound: average sooner; C = 16 gains 3.6%, under the margin
  };
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("decision " << i << ": " << got[i].reason);
    CHECK(got[i].rule == want[i].rule);
    CHECK(got[i].knobs == want[i].knobs);
  }
  CHECK(got[1].reason ==
        "comm 0.80 of compute, waits 0% of compute+comm+wait; goodput holds C=8 0.70/18ms "
        "(C=4 0.50/14ms, C=16 0.82/30ms)");
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

TEST_CASE("replicas drifting apart between averagings average sooner, then raise C", "[adapt]") {
  adapt::Window w;
  w.clocks = 10;
  w.computeSeconds = 0.010;
  w.commSeconds = 0.004;  // no slack: only divergence speaks
  w.previousDivergence = 0.01;
  w.divergence = 0.02;
  const adapt::Decision d = adapt::decide({8, 2, 0, 20}, w, smallBounds(), smallModel(), false);
  CHECK(d.rule == "diverge");
  CHECK(d.knobs == adapt::Knobs{8, 2, 0, 10});
  const adapt::Decision atMin = adapt::decide({8, 2, 0, 5}, w, smallBounds(), smallModel(), false);
  CHECK(atMin.rule == "diverge");
  CHECK(atMin.knobs == adapt::Knobs{16, 2, 0, 5});
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

  // Knobs outside the bounds move in before the budget does, and the reason says so.
  const adapt::Decision below = adapt::initialKnobs({1, 2, 1, 20}, smallBounds(), m, true);
  CHECK(below.rule == "start");
  CHECK(below.knobs == adapt::Knobs{2, 2, 1, 20});
  CHECK(below.reason == "C=1 Q=2 s=1 R=20 lies outside the --adapt-* bounds: C=2 Q=2 s=1 R=20");
  const adapt::Decision above = adapt::initialKnobs({8, 2, 1, 200}, b, m, true);
  CHECK(above.rule == "budget");
  CHECK(above.knobs.averageEvery == 80);
  CHECK_THAT(above.reason, Catch::StartsWith("C=8 Q=2 s=1 R=200 outside the --adapt-* bounds, then predicted"));
  CHECK(adapt::initialKnobs({8, 2, 1, 20}, smallBounds(), m, true).reason ==
        "C=8 Q=2 s=1 R=20 within the bounds and the budget");

  const adapt::Trace trace = adapt::Trace::read(dataPath("history.jsonl"));
  adapt::Knobs knobs = start.knobs;
  for (uint64_t end = 10; end <= 90; end += 10) {
    adapt::Window w = windowOf(trace, end - 10, end);
    w.errors = errorsAt(knobs, b, 32, smallError);
    const adapt::Decision d = adapt::decide(knobs, w, b, m, true);
    INFO(d.reason);
    CHECK(d.predictedBytes <= 3000);
    CHECK(m.perClock(d.knobs) <= 3000);
    knobs = d.knobs;
  }
  // Slack at the budget: C and Q cannot grow, so averaging comes sooner instead.
  const adapt::Decision slack = adapt::decide(start.knobs, windowOf(trace, 0, 10), b, m, true);
  CHECK(slack.rule == "slack");
  CHECK(slack.knobs == adapt::Knobs{5, 2, 1, 10});
  // Goodput's larger C must fit too: with cheap comm it would double C, but 10 does not fit.
  adapt::Window cheap = windowOf(trace, 0, 10);
  cheap.errors = errorsAt(start.knobs, b, 32, smallError);
  const adapt::Decision bounded = adapt::decide(start.knobs, cheap, b, m, true);
  INFO(bounded.reason);
  CHECK(bounded.rule != "goodput");
  CHECK(m.perClock(bounded.knobs) <= 3000);

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

TEST_CASE("with --adapt-bf16 the budget is met by bf16 values before C is lowered", "[adapt]") {
  const adapt::ByteModel m = smallModel();
  // Per column: 12 bytes of f32 coefficients, then 41 U and V values at 2 bytes instead of 4.
  CHECK(m.batchBytes(8, true) == 128 + 8 * (12 + 2 * 41) + 64 * 8);
  CHECK(m.batchBytes(8, false) == m.batchBytes(8));
  adapt::Knobs wide{8, 2, 1, 20};
  wide.bf16 = true;
  CHECK(m.perClock(wide) == 2 * 1392 + 1680.0 / 20);

  adapt::Bounds b = smallBounds();
  b.maxBytesPerClock = 3000;
  b.bf16 = true;
  const adapt::Decision start = adapt::initialKnobs({8, 2, 1, 20}, b, m, true);
  CHECK(start.rule == "budget");
  CHECK(start.knobs == wide);  // C = 8 in bf16, where f32 needed C = 5
  CHECK(start.reason == "predicted 4.2 kB per clock > budget 3.0 kB: C=8 Q=2 s=1 R=20 -> C=8 Q=2 s=1 R=20 bf16 "
                        "(2.9 kB)");
  // A tighter budget then lowers C as well, still in bf16.
  b.maxBytesPerClock = 2000;
  const adapt::Decision tight = adapt::initialKnobs({8, 2, 1, 20}, b, m, true);
  CHECK(tight.knobs.bf16);
  CHECK(tight.knobs.select < 8);
  CHECK(tight.predictedBytes <= 2000);
  // Without the flag the budget never switches the values.
  b.bf16 = false;
  CHECK_FALSE(adapt::initialKnobs({8, 2, 1, 20}, b, m, true).knobs.bf16);
  // A window in bf16 predicts the next one in bf16: decisions keep it.
  b.bf16 = true;
  b.maxBytesPerClock = 3000;
  const adapt::Trace trace = adapt::Trace::read(dataPath("history.jsonl"));
  const adapt::Decision next = adapt::decide(wide, windowOf(trace, 0, 10), b, m, true);
  INFO(next.reason);
  CHECK(next.knobs.bf16);
  CHECK(next.predictedBytes <= 3000);
}

TEST_CASE("the bf16 knob round-trips in the wide record; the short record is f32", "[adapt]") {
  adapt::Knobs k{25, 3, 2, 50};
  CHECK(adapt::encodeKnobs(k).size() == adapt::kKnobsRecordBytes);  // the form older logs hold
  k.bf16 = true;
  const auto bytes = adapt::encodeKnobs(k);
  REQUIRE(bytes.size() == adapt::kKnobsRecordBytesWide);
  CHECK(adapt::decodeKnobs(bytes) == k);
  CHECK_FALSE(adapt::decodeKnobs(std::span<const std::byte>(bytes).first(adapt::kKnobsRecordBytes)).bf16);
  auto bad = bytes;
  bad[32] = std::byte{2};  // no such width
  CHECK_THROWS_AS(adapt::decodeKnobs(bad), orpheus::CorruptRecordError);
  CHECK(adapt::toString(k) == "C=25 Q=3 s=2 R=50 bf16");
}

namespace {

// --sv-rank on the MLP: r in 1..8, C fixed at all, Q = 3.
adapt::Bounds rankBounds() {
  adapt::Bounds b = mlpBounds();
  b.select = {100, 100};
  b.rank = {1, 8};
  return b;
}

// e(r) of a rank-r batch with error feedback: what rank r leaves for later clocks.
double rankError(int64_t r) {
  const double at[][2] = {{0, 1.0}, {1, 0.6}, {2, 0.45}, {4, 0.3}, {8, 0.2}};
  for (size_t i = 1; i < std::size(at); ++i) {
    if (static_cast<double>(r) <= at[i][0]) {
      const double f = (static_cast<double>(r) - at[i - 1][0]) / (at[i][0] - at[i - 1][0]);
      return at[i - 1][1] + f * (at[i][1] - at[i - 1][1]);
    }
  }
  return 0.2;
}

// A window at rank r: `rest` seconds of compute and rebuild, exposed comm of
// `perByte` seconds a byte of the Q batches.
adapt::Window rankWindow(const adapt::Knobs& k, double rest, double perByte) {
  adapt::Window w;
  w.clocks = 25;
  w.commSeconds = perByte * mlpModel().perClock(k);
  w.computeSeconds = rest;
  w.clockSeconds = rest + w.commSeconds;
  w.selectSeconds = 0.002;  // the compression: taken as fixed
  w.errors = errorsAt(k, rankBounds(), 100, rankError);
  return w;
}

std::vector<int64_t> rankSteps(double perByte, std::vector<std::string>* reasons = nullptr) {
  adapt::Knobs k{0, 3, 0, 0};
  k.rank = 2;
  std::vector<int64_t> out;
  for (int i = 0; i < 4; ++i) {
    const adapt::Decision d = adapt::decide(k, rankWindow(k, 0.1, perByte), rankBounds(), mlpModel(), false);
    if (reasons != nullptr) reasons->push_back(d.reason);
    CHECK(d.knobs.select == 0);  // C never moves under --sv-rank
    k = d.knobs;
    out.push_back(k.rank);
  }
  return out;
}

}  // namespace

TEST_CASE("under --sv-rank the knob is r: a batch of r + 1 columns with a core", "[adapt][low-rank]") {
  const adapt::ByteModel m = mlpModel();
  adapt::Knobs k{0, 3, 0, 0};
  k.rank = 2;
  CHECK(m.svBytes(k) == m.batchBytes(3));
  CHECK(m.perClock(k) == 3 * m.batchBytes(3));
  CHECK(adapt::errorCounts(k, rankBounds(), 100) == std::array<int64_t, 3>{1, 1, 2});
  k.rank = 1;
  CHECK(adapt::errorCounts(k, rankBounds(), 100) == std::array<int64_t, 3>{1, 0, 1});
  CHECK(adapt::toString(k) == "C=all Q=3 s=0 R=0 r=1");
}

TEST_CASE("goodput moves r: cheap comm raises it to its bound, dear comm lowers it", "[adapt][low-rank]") {
  std::vector<std::string> reasons;
  // 10 Gbit/s-like: a few ms of comm against 100 ms of compute.
  const std::vector<int64_t> cheap = rankSteps(8e-9, &reasons);
  INFO(reasons[0] << " | " << reasons.back());
  CHECK(cheap == std::vector<int64_t>{4, 8, 8, 8});
  CHECK(reasons[0].rfind("goodput r=4", 0) == 0);
  // A slow link: the Q batches' comm is several times the compute.
  reasons.clear();
  const std::vector<int64_t> dear = rankSteps(1e-5, &reasons);
  INFO(reasons[0] << " | " << reasons.back());
  CHECK(dear.front() == 1);
  CHECK(dear.back() == 1);
  // Unmeasured errors: goodput is silent, r stays.
  adapt::Knobs k{0, 3, 0, 0};
  k.rank = 2;
  adapt::Window w = rankWindow(k, 0.1, 8e-9);
  w.errors = {-1.0, -1.0, -1.0};
  CHECK(adapt::decide(k, w, rankBounds(), mlpModel(), false).knobs.rank == 2);
}

TEST_CASE("under --sv-rank the budget takes bf16, then lowers r, never C", "[adapt][low-rank]") {
  const adapt::ByteModel m = mlpModel();
  adapt::Knobs k{0, 3, 0, 0};
  k.rank = 4;
  adapt::Bounds b = rankBounds();
  adapt::Knobs two = k;
  two.rank = 2;
  b.maxBytesPerClock = m.perClock(two) + 1.0;  // f32 fits r = 2 at most
  const adapt::Decision f32 = adapt::initialKnobs(k, b, m, false);
  CHECK(f32.rule == "budget");
  CHECK(f32.knobs == two);
  b.bf16 = true;  // bf16 halves the values: r = 4 fits in bf16
  const adapt::Decision bf16 = adapt::initialKnobs(k, b, m, false);
  INFO(bf16.reason);
  CHECK(bf16.knobs.bf16);
  CHECK(bf16.knobs.rank == 4);
  CHECK(bf16.knobs.select == 0);
  CHECK(bf16.predictedBytes <= b.maxBytesPerClock);
}

TEST_CASE("the rank knob round-trips in its record; a malformed one is refused", "[adapt][low-rank]") {
  adapt::Knobs k{0, 3, 2, 50};
  k.rank = 3;
  const auto bytes = adapt::encodeKnobs(k);
  REQUIRE(bytes.size() == adapt::kKnobsRecordBytesRank);
  CHECK(adapt::decodeKnobs(bytes) == k);
  k.bf16 = true;
  CHECK(adapt::decodeKnobs(adapt::encodeKnobs(k)) == k);
  auto bad = bytes;
  bad[40] = std::byte{0};  // rank 0 in a rank record
  CHECK_THROWS_AS(adapt::decodeKnobs(bad), orpheus::CorruptRecordError);
  bad = bytes;
  bad[32] = std::byte{2};  // no such width
  CHECK_THROWS_AS(adapt::decodeKnobs(bad), orpheus::CorruptRecordError);
  bad = bytes;
  bad[0] = std::byte{5};  // C beside a rank
  CHECK_THROWS_AS(adapt::decodeKnobs(bad), orpheus::CorruptRecordError);
}
