// `orpheus simulate --sim-membership`: a small simulated job through a shrink and a
// grow (engine/sim/sim_ranks.h), and the plan's refusals (engine/sim/membership_plan.h).
#include "engine/base/error.h"
#include "engine/sim/membership_plan.h"
#include "engine/sim/simulation.h"
#include "tests/support/bitwise.h"
#include "tests/support/temp_dir.h"

#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <vector>

using namespace orpheus;
using namespace orpheus::engine;
using orpheus::testing::bitwiseEqual;

namespace {

const char* kTrain = "synthetic:examples=800,features=20,classes=4";
const char* kTest = "synthetic:examples=200,features=20,classes=4";

TrainConfig smallJob(const std::string& metrics) {
  TrainConfig config;
  config.train = kTrain;
  config.test = kTest;
  config.batch = 10;
  config.clocks = 20;
  config.evalEvery = 5;
  config.progress = "off";
  config.metrics = metrics;
  // One peer per clock: the replicas differ, so their average is none of them.
  config.multicast = comm::MulticastKind::kRandom;
  config.fanout = 1;
  return config;
}

sim::SimConfig smallSim(const std::string& plan) {
  sim::SimConfig s;
  s.ranks = 4;
  s.threads = 2;
  s.computeMs = 1.0;
  if (!plan.empty()) s.membership = sim::parseMembershipPlan(plan);
  return s;
}

// The value of a number field of a JSON line; -1 where the line has none.
double field(const std::string& line, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(line, m, std::regex("\"" + name + "\": ([-0-9.e]+)"))) return -1.0;
  return std::stod(m[1]);
}

// The replicas each rank reported at each change: before (the old group's) and after.
struct Changes {
  std::mutex mu;
  std::map<uint64_t, std::map<int, ParamSet>> before;
  std::map<uint64_t, std::map<int, ParamSet>> after;
};

std::string refusal(const TrainConfig& config, const sim::SimConfig& s) {
  try {
    sim::runSimulation(config, s);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

std::string parseRefusal(const std::string& plan) {
  try {
    sim::parseMembershipPlan(plan);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a simulated job shrinks 4 -> 2 after clock 5 and grows to 5 after clock 12", "[sim]") {
  orpheus::testing::TempDir dir("sim_membership");
  const std::string metrics = dir / "m.jsonl";
  const TrainConfig config = smallJob(metrics);
  sim::SimConfig s = smallSim("5:-2,12:+3");
  Changes changes;
  s.onChange = [&](uint64_t clock, int rank, bool before, const ParamSet& replica) {
    std::lock_guard lock(changes.mu);
    (before ? changes.before : changes.after)[clock][rank] = replica;
  };
  REQUIRE(sim::runSimulation(config, s) == 0);  // the job finishes

  // Every replica right after a change is the old replicas' average, bitwise the
  // same on every rank of the new epoch (the ranks that joined too).
  const std::map<uint64_t, std::pair<size_t, size_t>> sizes = {{5, {4, 2}}, {12, {2, 5}}};
  for (const auto& [clock, size] : sizes) {
    INFO("change after clock " << clock);
    const auto& before = changes.before[clock];
    const auto& after = changes.after[clock];
    REQUIRE(before.size() == size.first);
    REQUIRE(after.size() == size.second);
    ParamSet mean = before.at(0);
    for (int r = 1; r < static_cast<int>(before.size()); ++r) {
      for (size_t k = 0; k < mean.size(); ++k) mean[k] += before.at(r)[k];
    }
    for (auto& p : mean.params) p.value /= static_cast<float>(before.size());
    for (const auto& [rank, replica] : after) {
      INFO("rank " << rank);
      CHECK(bitwiseEqual(replica, after.at(0)));
      CHECK(relativeDifference(replica, mean) < 1e-6);
    }
  }
  // The replicas differed before the shrink: the average is none of them.
  CHECK(relativeDifference(changes.before[5].at(0), changes.before[5].at(1)) > 1e-4);
  CHECK(relativeDifference(changes.after[5].at(0), changes.before[5].at(0)) > 1e-6);

  // The clocks go on across the changes, on the same virtual clock; each line says its ranks.
  std::ifstream in(metrics);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::vector<std::string> clocks;
  std::vector<std::string> notes;
  for (const std::string& line : lines) {
    if (line.starts_with("{\"clock\"")) clocks.push_back(line);
    if (line.starts_with("{\"membership\"")) notes.push_back(line);
  }
  REQUIRE(clocks.size() == 20);
  double seconds = 0.0;
  for (size_t i = 0; i < clocks.size(); ++i) {
    INFO(clocks[i]);
    const int clock = static_cast<int>(i) + 1;
    CHECK(field(clocks[i], "clock") == clock);
    CHECK(field(clocks[i], "seconds") > seconds);
    seconds = field(clocks[i], "seconds");
    CHECK(field(clocks[i], "ranks") == (clock <= 5 ? 4 : clock <= 12 ? 2 : 5));
  }
  REQUIRE(notes.size() == 2);
  CHECK_THAT(notes[0], Catch::Contains("\"clock\": 5, \"ranks\": 2, \"left\": 2"));
  CHECK_THAT(notes[1], Catch::Contains("\"clock\": 12, \"ranks\": 5, \"joined\": 3"));
  CHECK(lines[5] == notes[0]);  // right after clock 5's line
  // The summary names the epochs and counts the whole run.
  const std::string& summary = lines.back();
  CHECK_THAT(summary, Catch::Contains("\"membership\": \"4 → 2 at clock 5 → 5 at clock 12\""));
  CHECK(field(summary, "clocks") == 20);
  CHECK(field(summary, "ranks") == 5);
  CHECK(field(summary, "ranks_initial") == 4);
  CHECK(field(summary, "messages") == 5 * 4 + 7 * 2 + 8 * 5);  // one peer each clock
}

TEST_CASE("--sim-membership's syntax: CLOCK:-N or CLOCK:+N, comma-separated", "[sim]") {
  const sim::MembershipPlan plan = sim::parseMembershipPlan("50:-100,120:+40");
  REQUIRE(plan.steps.size() == 2);
  CHECK(plan.steps[0].clock == 50);
  CHECK(plan.steps[0].change == -100);
  CHECK(plan.steps[1].change == 40);
  CHECK(plan.sizes(1000) == std::vector<int>{1000, 900, 940});
  CHECK(plan.describe(1000, 200) == "1000 → 900 at clock 50 → 940 at clock 120");
  CHECK(plan.describe(1000, 100) == "1000 → 900 at clock 50");
  CHECK_THAT(parseRefusal(""), Catch::StartsWith("--sim-membership: expected CLOCK:-N"));
  CHECK_THAT(parseRefusal("50"), Catch::StartsWith("--sim-membership: expected CLOCK:-N"));
  CHECK_THAT(parseRefusal("50:10"), Catch::StartsWith("--sim-membership: the change of '50:10' must be -N"));
  CHECK_THAT(parseRefusal("50:+0"), Catch::Contains("must be -N"));
  CHECK_THAT(parseRefusal("50:-x"), Catch::Contains("must be -N"));
  CHECK_THAT(parseRefusal("0:-1"), Catch::StartsWith("--sim-membership: the clock of '0:-1' must be a whole number >= 1"));
  CHECK_THAT(parseRefusal("5:-1,,9:+1"), Catch::StartsWith("--sim-membership: expected CLOCK:-N"));
  CHECK_THAT(parseRefusal("5:-1,"), Catch::StartsWith("--sim-membership: expected CLOCK:-N"));
}

TEST_CASE("--sim-membership refuses what the job cannot do, before any worker starts", "[sim]") {
  const TrainConfig config = smallJob("");
  CHECK_THAT(refusal(config, smallSim("20:-1")),
             Catch::Equals("--sim-membership: clock 20 must be before the job's last clock (1..19 with --clocks 20)"));
  CHECK_THAT(refusal(config, smallSim("9:-1,5:+1")),
             Catch::Equals("--sim-membership: clock 5 comes after clock 9: give the changes in increasing order"));
  CHECK_THAT(refusal(config, smallSim("5:-1,5:+1")), Catch::Contains("clock 5 is given twice: give one change per clock"));
  CHECK_THAT(refusal(config, smallSim("5:-4")),
             Catch::Equals("--sim-membership: 4 ranks cannot leave after clock 5: only 4 are left (rank 0 stays)"));
  CHECK_THAT(refusal(config, smallSim("5:-2,9:-2")), Catch::Contains("2 ranks cannot leave after clock 9"));
  TrainConfig ssp = config;
  ssp.consistency = Consistency::kSsp;
  CHECK_THAT(refusal(ssp, smallSim("5:-1")), Catch::Contains("it needs --sync sv and --consistency bsp"));
  TrainConfig dense = config;
  dense.sync = SyncMode::kDense;
  dense.multicast = comm::MulticastKind::kAll;
  dense.fanout = 0;
  CHECK_THAT(refusal(dense, smallSim("5:-1")), Catch::Contains("it needs --sync sv and --consistency bsp"));
  TrainConfig balance = config;
  balance.balance = true;
  CHECK_THAT(refusal(balance, smallSim("5:-1")), Catch::StartsWith("--sim-membership: --balance"));
  // Every epoch's size is a job the flags allow.
  CHECK_THAT(refusal(config, smallSim("5:-3")),
             Catch::StartsWith("--sim-membership: one rank left has no peer for --multicast random"));
  TrainConfig wide = config;
  wide.fanout = 3;
  CHECK_THAT(refusal(wide, smallSim("5:-2")), Catch::StartsWith("--sim-membership: on 2 ranks, --fanout 3"));
  // --elastic still names what simulate does instead.
  TrainConfig elastic = config;
  elastic.elastic = true;
  CHECK_THAT(refusal(elastic, smallSim("")), Catch::Contains("--sim-membership"));
}
