// The adaptive-consistency controller (engine/adapt/controller.h): the bounds and
// start knobs it takes from the flags, when the ranks decide, the windows it pools
// across ranks before the policy decides, the budget it refuses, and the recorded
// timing (--adapt-trace) it can replay.
#include "comm/factory.h"
#include "engine/adapt/controller.h"
#include "engine/base/error.h"

#include <catch2/catch.hpp>

#include <memory>
#include <thread>
#include <vector>

using namespace orpheus;
namespace adapt = orpheus::engine::adapt;

namespace {

const std::vector<std::pair<int64_t, int64_t>> kShapes{{10, 20}, {10, 1}};

// --adapt under SSP with s = 1, B = 32, 50 clocks, a decision every 10.
adapt::ControllerOptions adaptiveJob() {
  adapt::ControllerOptions c;
  c.enabled = true;
  c.every = 10;
  c.clocks = 50;
  c.batch = 32;
  c.consistency = engine::Consistency::kSsp;
  c.staleness = 1;
  return c;
}

adapt::ClockSample sample(double compute, double comm, double wait) {
  adapt::ClockSample s;
  s.computeSeconds = compute;
  s.commSeconds = comm;
  s.waitSeconds = wait;
  s.svBytes = 1000.0;
  return s;
}

// Each rank's controller observes `perRank[r]` for the clocks (from, to], then all
// decide after `to` together; returns every rank's decision.
std::vector<adapt::Decision> decideTogether(std::vector<adapt::Controller*> controllers,
                                            const std::vector<adapt::ClockSample>& perRank, uint64_t from,
                                            uint64_t to, const adapt::Knobs& current) {
  std::vector<adapt::Decision> decisions(controllers.size());
  std::vector<std::thread> ranks;
  for (size_t r = 0; r < controllers.size(); ++r) {
    ranks.emplace_back([&, r] {
      for (uint64_t c = from + 1; c <= to; ++c) controllers[r]->observe(c, perRank[r]);
      decisions[r] = controllers[r]->decide(to, current);
    });
  }
  for (auto& t : ranks) t.join();
  return decisions;
}

}  // namespace

TEST_CASE("bounds: defaults from the job's shape, --adapt-* ranges where given", "[adapt][controller]") {
  adapt::ControllerOptions c = adaptiveJob();
  c.averageEvery = 40;
  adapt::Bounds b = adapt::boundsFor(c, 4, 3);
  CHECK(b.select.min == 1);
  CHECK(b.select.max == 32);
  CHECK(b.fanout.min == 3);  // broadcast: Q does not move
  CHECK(b.fanout.max == 3);
  CHECK(b.staleness.min == 0);
  CHECK(b.staleness.max == 8);  // max(8, 2s)
  CHECK(b.averageEvery.min == 10);
  CHECK(b.averageEvery.max == 160);

  c.multicast = comm::MulticastKind::kRandom;
  c.selectRange = {4, 16};
  c.stalenessRange = {1, 3};
  b = adapt::boundsFor(c, 4, 2);
  CHECK(b.fanout.min == 1);
  CHECK(b.fanout.max == 3);
  CHECK(b.select.min == 4);
  CHECK(b.select.max == 16);
  CHECK(b.staleness.max == 3);

  c.consistency = engine::Consistency::kBsp;
  c.averageEvery = 0;
  b = adapt::boundsFor(c, 4, 2);
  CHECK(b.staleness.min == b.staleness.max);  // BSP: s does not move
  CHECK(b.averageEvery.max == 0);             // no averaging to tune

  const adapt::Knobs start = adapt::startKnobs(adaptiveJob(), 3);
  CHECK(start == adapt::Knobs{0, 3, 1, 0});
}

TEST_CASE("the ranks decide every --adapt-every clocks, never after the last", "[adapt][controller]") {
  auto transports = comm::makeLoopbackGroup(2);
  adapt::ControllerOptions c = adaptiveJob();
  adapt::Controller controller(c, *transports[0], kShapes, 1);
  CHECK(controller.enabled());
  CHECK(controller.decidesAfter(10));
  CHECK(controller.decidesAfter(40));
  CHECK_FALSE(controller.decidesAfter(15));
  CHECK_FALSE(controller.decidesAfter(50));  // the job's last clock
  CHECK(controller.measuresAt(20));          // JMCSS: e(c) measured before a decision
  CHECK_FALSE(controller.measuresAt(21));

  adapt::ControllerOptions uniform = c;
  uniform.jmcss = false;  // --select-method uniform
  adapt::Controller noMeasure(uniform, *transports[0], kShapes, 1);
  CHECK(noMeasure.decidesAfter(20));
  CHECK_FALSE(noMeasure.measuresAt(20));

  adapt::ControllerOptions off;
  off.clocks = 50;
  adapt::Controller disabled(off, *transports[0], kShapes, 1);
  CHECK_FALSE(disabled.decidesAfter(10));
  CHECK(disabled.initial().rule == "off");
  CHECK(disabled.initial().knobs == adapt::startKnobs(off, 1));

  auto alone = comm::makeLoopbackGroup(1);
  adapt::Controller oneRank(c, *alone[0], kShapes, 0);
  CHECK_FALSE(oneRank.decidesAfter(10));  // nobody to wait for
}

TEST_CASE("a decision pools every rank's window; every rank takes rank 0's knobs", "[adapt][controller]") {
  auto transports = comm::makeLoopbackGroup(2);
  const adapt::ControllerOptions c = adaptiveJob();
  adapt::Controller rank0(c, *transports[0], kShapes, 1);
  adapt::Controller rank1(c, *transports[1], kShapes, 1);
  const adapt::Knobs current = rank0.initial().knobs;
  REQUIRE(current.staleness == 1);

  // Rank 0 never waits; rank 1 waits as long as it computes. Pooled, the waits are
  // 0.5 s of 1.6 s (above a fifth): raise s.
  auto decisions = decideTogether({&rank0, &rank1}, {sample(1.0, 0.1, 0.0), sample(1.0, 0.1, 1.0)}, 0, 10, current);
  CHECK(decisions[0].rule == "waits");
  CHECK(decisions[0].knobs.staleness == 2);
  CHECK(decisions[1].knobs == decisions[0].knobs);

  // The next window starts empty: no waits now, and comm at its share: keep.
  const adapt::Knobs next = decisions[0].knobs;
  decisions = decideTogether({&rank0, &rank1}, {sample(1.0, 0.3, 0.0), sample(1.0, 0.3, 0.0)}, 10, 20, next);
  CHECK(decisions[0].rule == "keep");
  CHECK(decisions[0].knobs == next);
  CHECK(decisions[1].knobs == next);
}

TEST_CASE("a budget no setting within the bounds meets is refused, naming the flag", "[adapt][controller]") {
  adapt::ControllerOptions c = adaptiveJob();
  c.maxBytesPerClock = 1.0;
  CHECK_THROWS_WITH(adapt::Controller::checkBudget(c, 2, kShapes, 1),
                    Catch::Contains("--max-bytes-per-clock 1: even with every knob at its bound"));
  auto transports = comm::makeLoopbackGroup(2);
  CHECK_THROWS_AS(adapt::Controller(c, *transports[0], kShapes, 1), InputError);

  c.maxBytesPerClock = 1e9;
  CHECK_NOTHROW(adapt::Controller::checkBudget(c, 2, kShapes, 1));
  c.maxBytesPerClock = 1.0;
  c.enabled = false;  // no --adapt: no promise to check
  CHECK_NOTHROW(adapt::Controller::checkBudget(c, 2, kShapes, 1));
}

TEST_CASE("a recorded trace gives each clock the timing of the newest line at or before it", "[adapt][controller]") {
  const std::string text =
      "{\"clock\":1,\"compute_seconds\":0.5,\"comm_seconds\":0.1,\"wait_seconds\":0.2}\n"
      "{\"clock\":3,\"compute_seconds\":0.7,\"clock_seconds\":1.5}\n"
      "{\"decision\":true,\"clock\":3,\"compute_seconds\":9}\n"
      "{\"summary\":true,\"clock\":3,\"compute_seconds\":9}\n"
      "{\"clock\":4}\n";
  const adapt::Trace trace = adapt::Trace::parse(text, "run.jsonl");
  CHECK(trace.size() == 2);  // decision, summary and lines without compute are skipped
  CHECK(trace.at(1).computeSeconds == 0.5);
  CHECK(trace.at(1).waitSeconds == 0.2);
  CHECK(trace.at(2).computeSeconds == 0.5);
  CHECK(trace.at(3).computeSeconds == 0.7);
  CHECK(trace.at(3).clockSeconds == 1.5);
  CHECK(trace.at(100).computeSeconds == 0.7);
  CHECK(trace.lastClock() == 3);
  CHECK_THROWS_WITH(adapt::Trace::parse("{\"summary\":true}\n", "empty.jsonl"),
                    Catch::Contains("--adapt-trace 'empty.jsonl' holds no per-clock metrics line"));
}

TEST_CASE("a trace's clocks and times are checked, naming the file and line", "[adapt][controller]") {
  const auto refused = [](const std::string& line, const std::string& why) {
    CHECK_THROWS_WITH(adapt::Trace::parse("{\"clock\":1,\"compute_seconds\":0.1}\n" + line + "\n", "t.jsonl"),
                      Catch::Contains("--adapt-trace 't.jsonl' line 2: " + why));
  };
  refused("{\"clock\":1e300,\"compute_seconds\":0.1}", "clock 1e+300 is not a whole number");
  refused("{\"clock\":-5,\"compute_seconds\":0.1}", "clock -5 is not a whole number");
  refused("{\"clock\":2.5,\"compute_seconds\":0.1}", "clock 2.5 is not a whole number");
  refused("{\"clock\":2,\"compute_seconds\":nan}", "compute_seconds nan is not a time");
  refused("{\"clock\":2,\"compute_seconds\":0.1,\"wait_seconds\":-1}", "wait_seconds -1 is not a time");
  refused("{\"clock\":2,\"compute_seconds\":0.1,\"comm_seconds\":inf}", "comm_seconds inf is not a time");
  refused("{\"clock\":2,\"compute_seconds\":\"x\"}", "compute_seconds is not a number");
  // JSON numbers only: no hex, no leading '+', nothing glued on.
  refused("{\"clock\":2,\"compute_seconds\":0x1p-3}", "compute_seconds is not a number");
  refused("{\"clock\":0x2,\"compute_seconds\":0.1}", "clock is not a number");
  refused("{\"clock\":2,\"compute_seconds\":+0.1}", "compute_seconds is not a number");
  refused("{\"clock\":2,\"compute_seconds\":0.1s}", "compute_seconds is not a number");
  // Each clock once: a second line for it (another job's metrics pasted on) is named.
  refused("{\"clock\":1,\"compute_seconds\":0.2}", "clock 1 is there already, on line 1");
  // A line cut off (a killed job's last) or one that is no JSON object drops no clock unsaid.
  CHECK_THROWS_WITH(adapt::Trace::parse("{\"clock\":1,\"compute_seconds\":0.1}\n{\"clock\": 2, \"comp\n", "t.jsonl"),
                    Catch::Contains("--adapt-trace 't.jsonl' line 2 is not one JSON object (cut off?)"));
  CHECK_THROWS_WITH(adapt::Trace::parse("{\"clock\":1,\"compute_seconds\":0.1}\nclock 2\n", "t.jsonl"),
                    Catch::Contains("--adapt-trace 't.jsonl' line 2 is not one JSON object: a trace is a metrics"));
}

TEST_CASE("a trace line may space its JSON as any writer does", "[adapt][controller]") {
  const adapt::Trace trace =
      adapt::Trace::parse("\n  {\"note\": \"clock\", \"clock\" : 2 , \"compute_seconds\":\t0.25}\r\n\n", "t.jsonl");
  REQUIRE(trace.size() == 1);
  CHECK(trace.at(2).computeSeconds == 0.25);
}
