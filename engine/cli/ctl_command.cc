#include "engine/cli/commands.h"

#include "engine/membership/live.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>

namespace orpheus::engine::cli {

int ctlShrinkMain(const std::string& dir, const std::vector<int>& ranks) {
  const std::vector<int> leaving = requestShrink(dir, ranks);
  std::printf("requested: rank%s %s leave%s the job in %s at its next clock\n", leaving.size() > 1 ? "s" : "",
              fmt::format("{}", fmt::join(leaving, ", ")).c_str(), leaving.size() > 1 ? "" : "s", dir.c_str());
  return 0;
}

int ctlGrowMain(const std::string& dir, int ranks) {
  requestGrow(dir, ranks);
  std::printf("requested: %d new ranks join the job in %s at its next clock\n", ranks, dir.c_str());
  return 0;
}

}  // namespace orpheus::engine::cli
