#include "engine/cli/flags.h"

#include <catch2/catch.hpp>

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
  REQUIRE_THAT(error, Contains("must be an integer >= 1"));
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

// The line CLI11 refuses `flag value` with when the flag carries `check`, as
// `orpheus train` declares it (engine/cli/command_flags.cc); "" when accepted.
template <typename T>
std::string refusal(const std::string& flag, const CLI::Validator& check, const std::string& value) {
  CLI::App app;
  T v{};
  app.add_option(flag, v)->check(check);
  try {
    app.parse(std::vector<std::string>{value, flag});  // parse() takes the arguments reversed
  } catch (const CLI::ValidationError& e) {
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
  // --staleness: integerIn(0, 1000000).
  CHECK(refusal<int>("--staleness", integerIn(0, 1000000), "3").empty());
  requireMatch(refusal<int>("--staleness", integerIn(0, 1000000), "-1"), "--staleness: must be an integer.*got -1");
  // --drop-links: numberIn(0, 1).
  CHECK(refusal<double>("--drop-links", numberIn(0, 1), "0.5").empty());
  requireMatch(refusal<double>("--drop-links", numberIn(0, 1), "1.5"), "--drop-links: must be a number.*got 1.5");
  // --beta1: numberIn(0, 1, false, true): 1 itself is out.
  CHECK(refusal<double>("--beta1", numberIn(0, 1, false, true), "0.99").empty());
  requireMatch(refusal<double>("--beta1", numberIn(0, 1, false, true), "1"),
               "--beta1: must be a number >= 0 and < 1, got 1");
  // --average-every, --rotate-every, --chunk-rows: integerIn(1).
  requireMatch(refusal<int64_t>("--average-every", integerIn(1), "0"), "--average-every: must be an integer >= 1, got 0");
  requireMatch(refusal<int64_t>("--rotate-every", integerIn(1), "-2"), "--rotate-every: must be an integer >= 1, got -2");
  requireMatch(refusal<int64_t>("--chunk-rows", integerIn(1), "0"), "--chunk-rows");
  CHECK(refusal<int64_t>("--chunk-rows", integerIn(1), "256").empty());
}
