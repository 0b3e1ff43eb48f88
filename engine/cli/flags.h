// Strict parsing of numeric flags: a value is taken whole or refused with a line
// that names the flag, the range and what was given ("1e2" is not a clock, "75abc"
// is not 75, "inf" is not a learning rate, "-1" is not a count).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <limits>
#include <string>

namespace orpheus::engine::cli {

// Parses all of `text` as a decimal integer in [min, max]; nullopt-style error text
// in `error` otherwise.
bool parseInteger(const std::string& text, int64_t min, int64_t max, int64_t* out, std::string* error);
// Parses all of `text` as a finite number in [min, max] (`min` excluded when
// `minExclusive`).
bool parseNumber(const std::string& text, double min, double max, bool minExclusive, double* out, std::string* error,
                 bool maxExclusive = false);

// CLI11 validators over the parsers above.
CLI::Validator integerIn(int64_t min, int64_t max = std::numeric_limits<int64_t>::max());
CLI::Validator numberIn(double min, double max, bool minExclusive = false, bool maxExclusive = false);

// The longest any wait may be told to last (--timeout): a week, so deadlines never
// overflow a clock's range.
constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600.0;
// The shortest: a job's start-up and any clock take longer than a few milliseconds,
// so a shorter --timeout runs out while every rank is healthy and each names the
// others as stalled. Below a second a wait only measures how fast the ranks start.
constexpr double kMinTimeoutSeconds = 1.0;

}  // namespace orpheus::engine::cli
