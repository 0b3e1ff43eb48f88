#include "engine/cli/command_flags.h"
#include "engine/cli/flags.h"
#include "engine/config.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <regex>
#include <string>
#include <vector>

using namespace orpheus::engine::cli;
using Catch::Matchers::Contains;

TEST_CASE("integers are taken whole, in range, or refused") {
  int64_t v = 0;
  std::string error;
  REQUIRE(parseInteger("75", 1, 100, &v, &error));
  REQUIRE(v == 75);
  REQUIRE(parseInteger("-3", -5, 5, &v, &error));
  REQUIRE(v == -3);
  for (const char* bad : {"1e2", "75abc", "", "-", "1.0", " 7", "0x10", "inf"}) {
    INFO(bad);
    REQUIRE_FALSE(parseInteger(bad, 0, 1000, &v, &error));
    REQUIRE_THAT(error, Contains("expected an integer"));
  }
  REQUIRE_FALSE(parseInteger("-1", 1, std::numeric_limits<int64_t>::max(), &v, &error));
  REQUIRE_THAT(error, Contains("must be an integer >= 1, got -1"));
  REQUIRE_FALSE(parseInteger("100000000000000000000", 1, std::numeric_limits<int64_t>::max(), &v, &error));
  REQUIRE_THAT(error, Contains("must be an integer >= 1, got 100000000000000000000 (more than 9223372036854775807)"));
  REQUIRE_FALSE(parseInteger("-1", 1, std::numeric_limits<int64_t>::max(), &v, &error));
  REQUIRE_THAT(error, !Contains("more than"));
}

TEST_CASE("numbers are finite, taken whole, in range, or refused") {
  double v = 0;
  std::string error;
  REQUIRE(parseNumber("0.25", 0, 1, false, &v, &error));
  REQUIRE(v == 0.25);
  REQUIRE(parseNumber("1e-3", 0, 1, true, &v, &error));
  for (const char* bad : {"inf", "nan", "-inf", "1e400", "0.1x", "", "abc"}) {
    INFO(bad);
    REQUIRE_FALSE(parseNumber(bad, 0, 1e9, true, &v, &error));
    REQUIRE_THAT(error, Contains("expected a number"));
  }
  REQUIRE_FALSE(parseNumber("0", 0, 1, true, &v, &error));
  REQUIRE_THAT(error, Contains("must be a number > 0"));
  REQUIRE_FALSE(parseNumber("1e10", 0, kMaxTimeoutSeconds, true, &v, &error));
  REQUIRE_THAT(error, Contains("<= 604800"));
}

TEST_CASE("the validators report through CLI11 with the flag's name") {
  CLI::App app;
  int64_t clocks = 0;
  double lr = 0;
  app.add_option("--clocks", clocks)->check(integerIn(1));
  app.add_option("--lr", lr)->check(numberIn(0, 1e6, true));
  REQUIRE_THROWS_AS(app.parse(std::vector<std::string>{"1e20", "--clocks"}), CLI::ValidationError);
  app.clear();
  REQUIRE_THROWS_AS(app.parse(std::vector<std::string>{"inf", "--lr"}), CLI::ValidationError);
  app.clear();
  app.parse(std::vector<std::string>{"0.5", "--lr", "12", "--clocks"});
  REQUIRE(clocks == 12);
  REQUIRE(lr == 0.5);
}

namespace {

// The line `orpheus train ARGS...` is refused with by its flags (engine/cli/
// command_flags.h, the table orpheus parses with), before any job starts; "" when
// the flags are accepted.
std::string trainRefusal(std::vector<std::string> args) {
  CLI::App app;
  orpheus::engine::TrainConfig config;
  std::string format;
  addTrainFlags(app, config, format);
  args.insert(args.begin(), {"--train", "small.libsvm"});
  std::reverse(args.begin(), args.end());  // parse() takes the arguments reversed
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

// The same for `orpheus simulate --ranks 4 ARGS...` (its train flags and its own).
std::string simulateRefusal(std::vector<std::string> args) {
  CLI::App app;
  orpheus::engine::TrainConfig config;
  orpheus::engine::sim::SimConfig sim;
  std::string format;
  double latencyUs = 5;
  addTrainFlags(app, config, format);
  addSimulateFlags(app, sim, latencyUs);
  args.insert(args.begin(), {"--train", "small.libsvm", "--ranks", "4"});
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

void requireMatch(const std::string& message, const std::string& pattern) {
  INFO("message: " << message);
  CHECK(std::regex_search(message, std::regex(pattern, std::regex::extended)));
}

}  // namespace

TEST_CASE("train's numeric flags refuse out-of-range values naming the flag") {
  CHECK(trainRefusal({"--staleness", "3", "--drop-links", "0.5", "--beta1", "0.99", "--chunk-rows", "256"}).empty());
  requireMatch(trainRefusal({"--staleness", "-1"}), "--staleness: must be an integer.*got -1");
  requireMatch(trainRefusal({"--drop-links", "1.5"}), "--drop-links: must be a number.*got 1.5");
  requireMatch(trainRefusal({"--beta1", "1"}), "--beta1: must be a number >= 0 and < 1, got 1");
  requireMatch(trainRefusal({"--average-every", "0"}), "--average-every: must be an integer >= 1, got 0");
  requireMatch(trainRefusal({"--rotate-every", "-2"}), "--rotate-every: must be an integer >= 1, got -2");
  requireMatch(trainRefusal({"--chunk-rows", "0"}), "--chunk-rows");
  CHECK(trainRefusal({"--average-every", "10", "--outer-lr", "0.7", "--outer-momentum", "0.9"}).empty());
  requireMatch(trainRefusal({"--outer-lr", "-0.5"}), "--outer-lr: must be a number >= 0.*got -0.5");
  requireMatch(trainRefusal({"--outer-momentum", "1"}), "--outer-momentum: must be a number >= 0 and < 1, got 1");
  requireMatch(trainRefusal({"--outer-momentum", "-0.1"}), "--outer-momentum: must be a number >= 0 and < 1");
  requireMatch(trainRefusal({"--ckpt-format", "x"}), "--ckpt-format: expected an integer in .2, 3., got 'x'");
  requireMatch(trainRefusal({"--ckpt-format", "4"}), "--ckpt-format: must be an integer in .2, 3., got 4");
}

TEST_CASE("train's other flags: names, --inject-delay and unknown flags") {
  requireMatch(trainRefusal({"--optimizer", "lbfgs"}), "--optimizer");
  requireMatch(trainRefusal({"--sync", "gossip"}), "--sync");
  requireMatch(trainRefusal({"--inject-delay", "0:xyz"}), "--inject-delay: MS must be a whole number.*'xyz'");
  requireMatch(trainRefusal({"--inject-delay", "0:99999999999"}), "--inject-delay: MS must be a whole number.*'99999999999'");
  requireMatch(trainRefusal({"--inject-delay", "x:5"}), "--inject-delay: RANK must be a whole number.*'x'");
  requireMatch(trainRefusal({"--bogus", "3"}), "--bogus");
  requireMatch(trainRefusal({"--resident", "maybe"}), "--resident: expected on or off, got 'maybe'");
  requireMatch(trainRefusal({"--overlap", "2"}), "--overlap: expected on or off, got '2'");
  CHECK(trainRefusal({"--resident", "off", "--overlap", "ON"}).empty());
  requireMatch(trainRefusal({"--transfer", "async"}), "--transfer: expected one of staged,sync, got 'async'");
  CHECK(trainRefusal({"--transfer", "sync"}).empty());
  CHECK(trainRefusal({"--transfer", "STAGED"}).empty());
  CHECK(trainRefusal({"--inject-delay", "1:10", "--optimizer", "adam", "--sync", "dense"}).empty());
}

TEST_CASE("simulate's --sim-membership: CLOCK:-N or CLOCK:+N, refused naming the flag") {
  CHECK(simulateRefusal({"--sim-membership", "50:-2,120:+40"}).empty());
  requireMatch(simulateRefusal({"--sim-membership", "50:2"}), "--sim-membership: the change of '50:2' must be -N");
  requireMatch(simulateRefusal({"--sim-membership", "x:-2"}), "--sim-membership: the clock of 'x:-2' must be");
  requireMatch(simulateRefusal({"--sim-membership", "50"}), "--sim-membership: expected CLOCK:-N");
  requireMatch(simulateRefusal({"--sim-membership", "50:-0"}), "--sim-membership: the change of '50:-0'");
}
