#include "engine/cli/flags.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace orpheus::engine::cli {

bool parseInteger(const std::string& text, int64_t min, int64_t max, int64_t* out, std::string* error) {
  const auto range = [&] {
    return max == std::numeric_limits<int64_t>::max() ? fmt::format("an integer >= {}", min)
                                                       : fmt::format("an integer in [{}, {}]", min, max);
  };
  size_t digits = text.size() > 0 && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  bool ok = digits < text.size();
  for (size_t i = digits; i < text.size(); ++i) ok = ok && text[i] >= '0' && text[i] <= '9';
  if (!ok) {
    *error = fmt::format("expected {}, got '{}'", range(), text);
    return false;
  }
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno == ERANGE || v < min || v > max) {
    // A number past int64 is said to be too large, not to be no integer.
    *error = errno == ERANGE || max == std::numeric_limits<int64_t>::max()
                 ? fmt::format("must be {}, got {}{}", range(), text,
                               errno == ERANGE || v > max ? fmt::format(" (more than {})", max) : "")
                 : fmt::format("must be {}, got {}", range(), text);
    return false;
  }
  *out = v;
  return true;
}

bool parseNumber(const std::string& text, double min, double max, bool minExclusive, double* out, std::string* error,
                 bool maxExclusive) {
  const auto range = [&] {
    const std::string low = minExclusive ? fmt::format("> {}", min) : fmt::format(">= {}", min);
    return std::isinf(max) ? "a number " + low : fmt::format("a number {} and {} {}", low, maxExclusive ? "<" : "<=", max);
  };
  char* end = nullptr;
  errno = 0;
  const double v = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || errno == ERANGE) {
    *error = fmt::format("expected {}, got '{}'", range(), text);
    return false;
  }
  if (v < min || (minExclusive && v == min) || v > max || (maxExclusive && v == max)) {
    *error = fmt::format("must be {}, got {}", range(), text);
    return false;
  }
  *out = v;
  return true;
}

CLI::Validator integerIn(int64_t min, int64_t max) {
  return CLI::Validator(
      [min, max](std::string& s) -> std::string {
        int64_t v = 0;
        std::string error;
        return parseInteger(s, min, max, &v, &error) ? std::string() : error;
      },
      // The range shows in the error; help shows the type alone.
      "");
}

CLI::Validator numberIn(double min, double max, bool minExclusive, bool maxExclusive) {
  return CLI::Validator(
      [min, max, minExclusive, maxExclusive](std::string& s) -> std::string {
        double v = 0;
        std::string error;
        return parseNumber(s, min, max, minExclusive, &v, &error, maxExclusive) ? std::string() : error;
      },
      "");
}

}  // namespace orpheus::engine::cli
