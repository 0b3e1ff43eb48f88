#include "engine/cli/flags.h"

#include <catch2/catch.hpp>

#include <cmath>

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
