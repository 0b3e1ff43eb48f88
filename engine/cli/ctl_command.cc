#include "engine/cli/commands.h"

#include "engine/base/error.h"
#include "engine/cli/flags.h"
#include "engine/membership/live.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <limits>

namespace orpheus::engine::cli {

int ctlShrinkMain(const std::string& dir, const std::vector<std::string>& words) {
  std::vector<int> ranks;
  for (const std::string& word : words) {
    int64_t rank = 0;
    std::string error;
    if (!parseInteger(word, 0, std::numeric_limits<int>::max(), &rank, &error)) {
      const bool digits = !word.empty() && word.find_first_not_of("0123456789") == std::string::npos;
      throw InputError(digits ? fmt::format("ctl shrink: '{}' is not a rank of the job (more than any job has)", word)
                              : fmt::format("ctl shrink: '{}' is not a rank of the job (a whole number)", word));
    }
    ranks.push_back(static_cast<int>(rank));
  }
  const std::vector<int> leaving = requestShrink(dir, ranks);
  std::printf("requested: rank%s %s leave%s the job in %s at its next clock\n", leaving.size() > 1 ? "s" : "",
              fmt::format("{}", fmt::join(leaving, ", ")).c_str(), leaving.size() > 1 ? "" : "s", dir.c_str());
  return 0;
}

int ctlGrowMain(const std::string& dir, const std::string& word) {
  int64_t ranks = 0;
  std::string error;
  if (!parseInteger(word, 1, kMaxJoining, &ranks, &error)) {
    throw InputError(fmt::format("ctl grow: expected 1 to {} new ranks, got {}", kMaxJoining, word));
  }
  requestGrow(dir, static_cast<int>(ranks));
  std::printf("requested: %d new rank%s join%s the job in %s at its next clock\n", static_cast<int>(ranks),
              ranks > 1 ? "s" : "", ranks > 1 ? "" : "s", dir.c_str());
  return 0;
}

}  // namespace orpheus::engine::cli
